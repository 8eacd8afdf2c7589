//! Object-store emulators for the tests: moto's S3 server, Azurite
//! (Microsoft's Azure Storage emulator), fake-gcs-server (a Google Cloud
//! Storage emulator) and WsgiDAV (a WebDAV server, for `http(s)://` base
//! paths), each a real implementation of its protocol, installed by
//! `scripts/setup` into `.cache/` and started on a free port; objects are
//! put with each cloud's own SDK or API (`tests/storage/store.py`), as a
//! team publishing models would, or written into the WebDAV server's
//! directory, as a web server's files are published.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::fixtures::root;

/// Which cloud's protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// moto's standalone S3 server.
    S3,
    /// Azurite's blob service.
    Azure,
    /// WsgiDAV serving a directory over HTTP with WebDAV listings.
    WebDav,
    /// fake-gcs-server, which sluice is pointed at by the given route.
    Gcs(GcsRoute),
}

/// The ways a GCS client is pointed at an emulator, each read by sluice:
/// the variable Google's own client libraries read, and object_store's own
/// two (a base URL with unsigned requests, or a service-account key that
/// names the base URL and turns OAuth off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GcsRoute {
    /// `STORAGE_EMULATOR_HOST=127.0.0.1:PORT`.
    EmulatorHost,
    /// `GOOGLE_BASE_URL=http://127.0.0.1:PORT` and `GOOGLE_SKIP_SIGNATURE=true`.
    BaseUrl,
    /// `GOOGLE_SERVICE_ACCOUNT_KEY` with `gcs_base_url` and `disable_oauth`.
    ServiceAccountKey,
}

/// The private key in the GCS service-account key the tests hand sluice:
/// never used (OAuth is off), and never to appear in its output.
pub const GCS_TEST_PRIVATE_KEY: &str = "sluice-test-gcs-private-key-never-logged";

/// A running emulator.
pub struct ObjectStoreServer {
    kind: Kind,
    /// Its port on 127.0.0.1.
    pub port: u16,
    child: Option<Child>,
    /// Where a persistent emulator keeps its objects across restarts.
    dir: Option<tempfile::TempDir>,
}

impl ObjectStoreServer {
    /// Starts one on a free port and waits until it accepts connections.
    pub fn start(kind: Kind) -> ObjectStoreServer {
        let port = super::fleet::free_port();
        // WsgiDAV serves a directory of its own.
        let dir = (kind == Kind::WebDav).then(|| tempfile::tempdir().expect("temp dir"));
        let mut server = ObjectStoreServer { kind, port, child: None, dir };
        server.restart();
        server
    }

    /// Starts Azurite keeping its objects on disk, so that a restart finds
    /// them again (moto keeps them in memory only).
    pub fn start_persistent() -> ObjectStoreServer {
        let port = super::fleet::free_port();
        let dir = Some(tempfile::tempdir().expect("temp dir"));
        let mut server = ObjectStoreServer { kind: Kind::Azure, port, child: None, dir };
        server.restart();
        server
    }

    /// Kills it at once: the store is unreachable, and (both keep objects
    /// in memory) empty when it comes back.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops it as an operator would (SIGTERM, then SIGKILL after 10 s): a
    /// persistent emulator keeps its objects for the restart.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling the test's own child process.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes it (SIGSTOP): connections open, nothing answered, as a hung
    /// store; `thaw` lets it go on.
    pub fn freeze(&self) {
        if let Some(child) = &self.child {
            // SAFETY: signalling the test's own child process.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGSTOP) };
        }
    }

    /// Lets a frozen store go on (SIGCONT).
    pub fn thaw(&self) {
        if let Some(child) = &self.child {
            // SAFETY: signalling the test's own child process.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGCONT) };
        }
    }

    /// Starts it (again) on its port and waits until it accepts.
    pub fn restart(&mut self) {
        self.kill();
        let port = self.port.to_string();
        let mut command = match self.kind {
            Kind::S3 => {
                let mut command = Command::new(root().join(".cache/storage-venv/bin/moto_server"));
                command.args(["-H", "127.0.0.1", "-p", &port]);
                command
            }
            Kind::Azure => {
                let mut command = Command::new(root().join(".cache/azurite/node_modules/.bin/azurite-blob"));
                command.args(["--blobHost", "127.0.0.1", "--blobPort", &port]).args([
                    "--skipApiVersionCheck",
                    "--disableTelemetry",
                    "--silent",
                ]);
                match &self.dir {
                    Some(dir) => command.arg("--location").arg(dir.path()),
                    None => command.arg("--inMemoryPersistence"),
                };
                command
            }
            Kind::WebDav => {
                let mut command = Command::new(root().join(".cache/storage-venv/bin/wsgidav"));
                command.args(["--host", "127.0.0.1", "--port", &port, "--auth", "anonymous", "--no-config", "--root"]);
                command.arg(self.dir.as_ref().expect("a WebDAV root").path());
                command
            }
            Kind::Gcs(_) => {
                // Its XML API (which object_store lists and reads with)
                // answers only requests whose Host is the public host: the
                // address and port the clients are given.
                let address = format!("127.0.0.1:{port}");
                let mut command = Command::new(root().join(".cache/storage-venv/bin/fake-gcs-server"));
                command.args(["-scheme", "http", "-host", "127.0.0.1", "-port", &port, "-backend", "memory"]).args([
                    "-public-host",
                    &address,
                    "-external-url",
                    &format!("http://{address}"),
                    "-log-level",
                    "warn",
                ]);
                command
            }
        };
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the {:?} emulator ({e}): run scripts/setup", self.kind));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "the {:?} emulator did not listen on {} in 60 s", self.kind, self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The base-path URL of `path` in `bucket`.
    pub fn url(&self, bucket: &str, path: &str) -> String {
        match self.kind {
            Kind::S3 => format!("s3://{bucket}/{path}"),
            Kind::Azure => format!("az://{bucket}/{path}"),
            Kind::WebDav => format!("http://127.0.0.1:{}/{bucket}/{path}", self.port),
            Kind::Gcs(_) => format!("gs://{bucket}/{path}"),
        }
    }

    /// The environment a sluice process reads this store with: TF
    /// Serving's S3 variables, Azure's emulator ones, or GCS's by its route.
    pub fn env(&self) -> Vec<(String, String)> {
        let pairs: Vec<(&str, String)> = match self.kind {
            Kind::S3 => vec![
                ("AWS_ACCESS_KEY_ID", "reader".into()),
                ("AWS_SECRET_ACCESS_KEY", "reader-secret-value".into()),
                ("AWS_REGION", "us-east-1".into()),
                ("S3_ENDPOINT", format!("127.0.0.1:{}", self.port)),
                ("S3_USE_HTTPS", "0".into()),
            ],
            Kind::Azure => vec![
                ("AZURE_STORAGE_USE_EMULATOR", "true".into()),
                ("AZURITE_BLOB_STORAGE_URL", format!("http://127.0.0.1:{}", self.port)),
            ],
            Kind::WebDav => Vec::new(),
            Kind::Gcs(GcsRoute::EmulatorHost) => vec![("STORAGE_EMULATOR_HOST", format!("127.0.0.1:{}", self.port))],
            Kind::Gcs(GcsRoute::BaseUrl) => vec![
                ("GOOGLE_BASE_URL", format!("http://127.0.0.1:{}", self.port)),
                ("GOOGLE_SKIP_SIGNATURE", "true".into()),
            ],
            Kind::Gcs(GcsRoute::ServiceAccountKey) => {
                let key = format!(
                    r#"{{"private_key": "{GCS_TEST_PRIVATE_KEY}", "private_key_id": "test", "client_email": "reader@test.iam.gserviceaccount.com", "disable_oauth": true, "gcs_base_url": "http://127.0.0.1:{}"}}"#,
                    self.port
                );
                vec![("GOOGLE_SERVICE_ACCOUNT_KEY", key)]
            }
        };
        pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }

    fn sdk(&self, args: &[&str]) {
        let kind = match self.kind {
            Kind::S3 => "s3",
            Kind::Azure => "azure",
            Kind::Gcs(_) => "gcs",
            Kind::WebDav => return self.webdav(args),
        };
        let output = Command::new(root().join(".cache/storage-venv/bin/python"))
            .arg(root().join("tests/storage/store.py"))
            .args([kind, &self.port.to_string()])
            .args(args)
            .output()
            .expect("run tests/storage/store.py: run scripts/setup");
        assert!(output.status.success(), "store.py {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    }

    /// What the SDK calls do, on the WebDAV server's directory.
    fn webdav(&self, args: &[&str]) {
        let root = self.dir.as_ref().expect("a WebDAV root").path();
        match args {
            ["bucket", name] => std::fs::create_dir_all(root.join(name)).expect("bucket dir"),
            ["put", bucket, key, file] => {
                let to = root.join(bucket).join(key);
                std::fs::create_dir_all(to.parent().expect("a parent")).expect("dirs");
                std::fs::copy(file, &to).expect("copy");
            }
            ["delete", bucket, key] => std::fs::remove_file(root.join(bucket).join(key)).expect("delete"),
            other => panic!("no such WebDAV step {other:?}"),
        }
    }

    /// Makes bucket (container) `name`.
    pub fn bucket(&self, name: &str) {
        self.sdk(&["bucket", name]);
    }

    /// Uploads `file` as `key`.
    pub fn put(&self, bucket: &str, key: &str, file: &Path) {
        self.sdk(&["put", bucket, key, file.to_str().expect("utf-8 path")]);
    }

    /// Deletes `key`.
    pub fn delete(&self, bucket: &str, key: &str) {
        self.sdk(&["delete", bucket, key]);
    }

    /// Uploads every file under `dir` as `prefix/RELATIVE`, in name order.
    pub fn publish(&self, bucket: &str, prefix: &str, dir: &Path) {
        for file in files(dir) {
            let relative = file.strip_prefix(dir).expect("under dir").to_str().expect("utf-8").to_string();
            self.put(bucket, &format!("{prefix}/{relative}"), &file);
        }
    }
}

impl Drop for ObjectStoreServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Every file under `dir`, in name order.
pub fn files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).expect("read dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}
