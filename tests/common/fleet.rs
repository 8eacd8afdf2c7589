//! A fleet of sluice replicas behind HAProxy (Debian's package, which
//! `scripts/setup` installs): each replica on ports of its own, kept
//! across restarts, and a balancer with gRPC over HTTP/2 and REST over
//! HTTP/1.1 to them, health-checking `/readyz` every 200 ms, retrying
//! calls refused before they started. `tests/fleet.rs` and
//! `benches/fleet.rs` run it.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::fixtures::root;
use super::process::ServerProcess;

/// HAProxy's binary: on the PATH, or where Debian puts it (/usr/sbin is
/// not on every user's PATH).
pub fn haproxy() -> PathBuf {
    let sbin = PathBuf::from("/usr/sbin/haproxy");
    if sbin.exists() {
        sbin
    } else {
        PathBuf::from("haproxy")
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// One replica: its ports (kept across restarts) and its process.
pub struct Replica {
    /// Its gRPC port.
    pub grpc: u16,
    /// Its REST port.
    pub http: u16,
    process: Option<ServerProcess>,
}

impl Replica {
    /// A replica on two free ports, not started.
    pub fn new() -> Replica {
        Replica { grpc: free_port(), http: free_port(), process: None }
    }

    /// Starts it serving `config` on its ports; waits until it is ready.
    pub fn start(&mut self, config: &Path) {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
        command
            .arg("serve")
            .args(["--host", "127.0.0.1"])
            .args(["--port", &self.grpc.to_string(), "--rest_api_port", &self.http.to_string()])
            .arg("--model_config_file")
            .arg(config)
            .current_dir(root());
        let process =
            ServerProcess::spawn(command, "replica", "sluice: serving gRPC on ", Duration::from_secs(120), true)
                .unwrap_or_else(|e| panic!("{e}"));
        self.process = Some(process);
    }

    /// Sends it `signal`.
    pub fn signal(&self, signal: libc::c_int) {
        let pid = self.process.as_ref().expect("running").pid();
        // SAFETY: kill(2) on this test's own child.
        assert_eq!(unsafe { libc::kill(pid as libc::pid_t, signal) }, 0);
    }

    /// Waits for it to exit (after a signal); its status.
    pub fn exited(&mut self) -> std::process::ExitStatus {
        let mut process = self.process.take().expect("running");
        process.wait(Duration::from_secs(60)).expect("the replica exits")
    }
}

/// HAProxy in front of the replicas, killed when dropped.
pub struct Balancer {
    child: Child,
    /// Its gRPC port (HTTP/2, to the replicas' gRPC ports).
    pub grpc: u16,
    /// Its REST port (to the replicas' REST ports).
    pub http: u16,
    stats: PathBuf,
    _dir: tempfile::TempDir,
}

impl Balancer {
    /// Starts HAProxy in front of `replicas`.
    pub fn start(replicas: &[Replica]) -> Balancer {
        let dir = tempfile::tempdir().expect("temp dir");
        let (grpc, http) = (free_port(), free_port());
        let stats = dir.path().join("stats.sock");
        let servers = |port: fn(&Replica) -> u16, proto: &str| -> String {
            replicas
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    format!("    server r{i} 127.0.0.1:{} {proto} check port {} check-proto h1\n", port(r), r.http)
                })
                .collect()
        };
        let config = format!(
            "global\n    stats socket {stats} mode 600 level admin\n\
             defaults\n    mode http\n    timeout connect 1s\n    timeout client 30s\n    timeout server 30s\n\
             \x20   retries 3\n    option redispatch 1\n    retry-on all-retryable-errors\n\
             \x20   option httpchk GET /readyz\n    http-check expect status 200\n\
             \x20   default-server inter 200 fall 1 rise 1\n\
             frontend grpc\n    bind 127.0.0.1:{grpc} proto h2\n    default_backend grpc\n\
             frontend rest\n    bind 127.0.0.1:{http}\n    default_backend rest\n\
             backend grpc\n    balance roundrobin\n{}\
             backend rest\n    balance roundrobin\n{}",
            servers(|r| r.grpc, "proto h2"),
            servers(|r| r.http, ""),
            stats = stats.display(),
        );
        let path = dir.path().join("haproxy.cfg");
        std::fs::write(&path, config).expect("write haproxy.cfg");
        let check = Command::new(haproxy()).arg("-c").arg("-f").arg(&path).output();
        let check = check.expect("haproxy is not installed: run scripts/setup");
        assert!(check.status.success(), "haproxy.cfg: {}", String::from_utf8_lossy(&check.stderr));
        let child = Command::new(haproxy())
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start haproxy");
        Balancer { child, grpc, http, stats, _dir: dir }
    }

    /// The servers of `backend` HAProxy counts as up.
    pub fn up(&self, backend: &str) -> usize {
        use std::io::{Read, Write};
        let Ok(mut socket) = std::os::unix::net::UnixStream::connect(&self.stats) else { return 0 };
        if socket.write_all(b"show stat\n").is_err() {
            return 0;
        }
        let mut stat = String::new();
        let _ = socket.read_to_string(&mut stat);
        stat.lines()
            .filter(|l| l.starts_with(&format!("{backend},r")))
            .filter(|l| l.split(',').nth(17) == Some("UP"))
            .count()
    }

    /// Waits until HAProxy counts `count` replicas up in both backends.
    pub async fn wait_up(&self, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (grpc, rest) = (self.up("grpc"), self.up("rest"));
            if grpc == count && rest == count {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "waited 60 s for {count} replicas up in HAProxy: grpc {grpc}, rest {rest}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
