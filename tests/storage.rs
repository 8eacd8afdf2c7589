//! Model repositories in object storage, driven against real protocol
//! implementations (moto's S3 server, Azurite, fake-gcs-server, WsgiDAV for
//! `http://` base paths) started by the tests:
//! serving from a bucket as from a directory, a version published object
//! by object never loaded before it is complete, an object changed under
//! its download refused and fetched again, the store going away under
//! load with no failed request, and wrong credentials (or an unknown
//! bucket) named at start without the secret.
//!
//! fake-gcs-server does not stand in for GCS everywhere: it takes no
//! object_store PUT (XML-API uploads answer 400), so nothing here writes
//! to `gs://` (warmup files, request logs); it ignores `If-Match`, so the
//! refused-changed-object case is S3's only; it lists in one page.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::object_stores::{GcsRoute, Kind, ObjectStoreServer, GCS_TEST_PRIVATE_KEY};
use common::*;

/// The example model's versions on disk, the reference for answers.
fn mlp(version: i64) -> std::path::PathBuf {
    fixtures::root().join(format!("examples/models/mlp/{version}"))
}

/// A config serving `mlp` from `url`, its cache in `cache`, with `extra`
/// keys added to `[storage]` and the model table.
fn config(dir: &Path, url: &str, storage: &str, model: &str) -> std::path::PathBuf {
    let text = format!(
        "[lifecycle]\nfile_system_poll_wait_seconds = 1\n\n[storage]\ncache_dir = \"{}\"\n{storage}\n\n\
         [[models]]\nname = \"mlp\"\nbase_path = \"{url}\"\n{model}\n",
        dir.join("cache").display()
    );
    let path = dir.join("sluice.toml");
    std::fs::write(&path, text).expect("write config");
    path
}

fn serve(config: &Path, store: &ObjectStoreServer) -> Server {
    Server::start_with_env(
        &["--model_config_file", config.to_str().expect("utf-8")],
        &store.env(),
        Duration::from_secs(120),
    )
}

/// What `version` of the example model answers for `x`, run directly.
fn expected(version: i64, x: &[f32]) -> Vec<f32> {
    reference(&mlp(version).join("model.onnx"), vec![("x", RefInput::F32(vec![1, 64], x.to_vec()))], "logits").1
}

/// Waits up to 30 s until calls to `version` (None: the latest) get what
/// the example model's version `example` answers.
async fn answers_as(server: &Server, version: Option<i64>, example: i64, what: &str) {
    let x = values(17, 64);
    let want = expected(example, &x);
    for _ in 0..300 {
        if predict(server, version, &x).await.ok() == Some(want.clone()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}: not within 30 s");
}

/// The error GetModelStatus gives `version` of `mlp` once it has one
/// (a failed download is reported at the poll after it), within 10 s.
async fn failure_of(server: &Server, version: i64) -> String {
    for _ in 0..100 {
        let status = server.model_status("mlp").await;
        let message = status
            .iter()
            .find(|s| s.version == version)
            .and_then(|s| s.status.as_ref())
            .map(|s| s.error_message.clone())
            .unwrap_or_default();
        if !message.is_empty() {
            return message;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    String::new()
}

async fn predict(server: &Server, version: Option<i64>, x: &[f32]) -> Result<Vec<f32>, tonic::Status> {
    let mut request = predict_request("mlp", vec![("x", f32_content(&[1, 64], x))]);
    request.model_spec = spec("mlp", version);
    let response = server.predict_client().await.predict(request).await?;
    Ok(f32_values(&response.into_inner().outputs["logits"]))
}

/// Clients calling `mlp` in a loop until dropped; counts answers and
/// failures (with the first failure's status).
struct Load {
    ok: Arc<AtomicU64>,
    failed: Arc<std::sync::Mutex<Vec<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    async fn start(server: &Server) -> Load {
        let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(std::sync::Mutex::new(Vec::new())));
        let mut tasks = Vec::new();
        for seed in 0..4 {
            let mut client = server.predict_client().await;
            let (ok, failed) = (ok.clone(), failed.clone());
            tasks.push(tokio::spawn(async move {
                let x = values(seed, 64);
                loop {
                    match client.predict(predict_request("mlp", vec![("x", f32_content(&[1, 64], &x))])).await {
                        Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                        Err(status) => {
                            failed.lock().expect("lock").push(format!("{status:?}"));
                            0
                        }
                    };
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }));
        }
        Load { ok, failed, tasks }
    }

    /// Stops the clients; asserts that none failed and that they were served.
    fn finish(self, what: &str) -> u64 {
        for task in &self.tasks {
            task.abort();
        }
        let failed = self.failed.lock().expect("lock").clone();
        assert!(failed.is_empty(), "{what}: {} requests failed, the first: {}", failed.len(), failed[0]);
        let ok = self.ok.load(Ordering::Relaxed);
        assert!(ok > 0, "{what}: no request was answered");
        ok
    }
}

/// Every store, and each way GCS clients are pointed at an emulator.
#[tokio::test]
async fn models_serve_from_s3_azure_gcs_and_webdav_as_from_a_directory() {
    let gcs = [GcsRoute::EmulatorHost, GcsRoute::BaseUrl, GcsRoute::ServiceAccountKey].map(Kind::Gcs);
    for kind in [Kind::S3, Kind::Azure, Kind::WebDav].into_iter().chain(gcs) {
        let store = ObjectStoreServer::start(kind);
        store.bucket("models");
        for version in [1, 2] {
            store.publish("models", &format!("repo/mlp/{version}"), &mlp(version));
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let url = store.url("models", "repo/mlp");
        let server = serve(&config(dir.path(), &url, "", "version_policy = \"all\""), &store);
        let x = values(7, 64);
        for version in [1, 2] {
            let got =
                predict(&server, Some(version), &x).await.unwrap_or_else(|e| panic!("{kind:?} v{version}: {e:?}"));
            assert_close(&got, &expected(version, &x), 1e-5, &format!("{kind:?} version {version}"));
        }
        let states: Vec<(i64, i32)> = server.model_status("mlp").await.iter().map(|s| (s.version, s.state)).collect();
        assert_eq!(states, [(1, 30), (2, 30)], "{kind:?}: both AVAILABLE");
        // The cache is the server's own, and holds whole versions only.
        let cache = dir.path().join("cache");
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&cache).expect("cache").permissions());
        assert_eq!(mode & 0o077, 0, "{kind:?}: the cache is owner-only");
        let mirrored = common::object_stores::files(&cache);
        assert!(
            mirrored.iter().filter(|f| f.ends_with("model.onnx")).count() == 2,
            "{kind:?}: both versions' model files in the cache: {mirrored:?}"
        );
        assert!(server.metric(r#"sluice_storage_downloads_total{model="mlp",outcome="ok"}"#).await >= 2.0);
        // The credentials it was given appear nowhere in its log.
        let log = server.log().join("\n");
        for (name, value) in store.env() {
            assert!(!name.contains("SECRET") || !log.contains(&value), "{kind:?}: {name}'s value is in the log");
        }
        assert!(!log.contains(GCS_TEST_PRIVATE_KEY), "{kind:?}: the service-account key's private key is in the log");
    }
}

/// On GCS the objects are uploaded through Cloud Storage's JSON API (a
/// media upload, as `gsutil cp` does).
#[tokio::test]
async fn a_version_published_object_by_object_serves_only_once_marked_complete_with_no_failed_request() {
    for kind in [Kind::S3, Kind::Gcs(GcsRoute::EmulatorHost)] {
        published_object_by_object(kind).await;
    }
}

async fn published_object_by_object(kind: Kind) {
    let store = ObjectStoreServer::start(kind);
    store.bucket("models");
    store.publish("models", "repo/mlp/1", &mlp(1));
    store.put("models", "repo/mlp/1/_SUCCESS", &mlp(1).join("model.onnx"));
    let dir = tempfile::tempdir().expect("temp dir");
    let url = store.url("models", "repo/mlp");
    let server = serve(&config(dir.path(), &url, "completion_marker = \"_SUCCESS\"", ""), &store);
    let load = Load::start(&server).await;
    let x = values(3, 64);
    assert_close(
        &predict(&server, None, &x).await.expect("v1"),
        &expected(1, &x),
        1e-5,
        &format!("{kind:?}: version 1 serves"),
    );

    // Version 2 arrives one object at a time, slowly, the model first:
    // through several polls it is in the store, incomplete.
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "vocabulary and notes that come after the model").expect("notes");
    store.put("models", "repo/mlp/2/model.onnx", &mlp(2).join("model.onnx"));
    for name in ["a", "b", "c"] {
        tokio::time::sleep(Duration::from_millis(1200)).await;
        store.put("models", &format!("repo/mlp/2/assets/{name}.txt"), &notes);
        let served = predict(&server, None, &x)
            .await
            .unwrap_or_else(|e| panic!("{kind:?}: serves while version 2 uploads: {e:?}"));
        assert_close(
            &served,
            &expected(1, &x),
            1e-5,
            &format!("{kind:?}: version 1 serves until version 2 is marked complete"),
        );
        assert!(
            !server.model_status("mlp").await.iter().any(|s| s.version == 2),
            "{kind:?}: version 2 was seen before its marker"
        );
    }
    store.put("models", "repo/mlp/2/_SUCCESS", &notes);
    answers_as(&server, None, 2, &format!("{kind:?}: version 2 after its marker")).await;
    // It was downloaded whole: every object, the last included.
    let mirrored = common::object_stores::files(&dir.path().join("cache"));
    assert!(mirrored.iter().any(|f| f.ends_with("2/assets/c.txt")), "{kind:?}: {mirrored:?}");
    // Version 1 left once version 2 served (its files stay in the cache
    // while it is in the store and the cache has room: a rollback target).
    let mut waited = 0;
    while server.model_status("mlp").await.iter().any(|s| s.version == 1 && s.state != 50) {
        waited += 1;
        assert!(waited < 300, "{kind:?}: version 1 was not unloaded");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let served = load.finish(&format!("{kind:?}: publishing version 2 through the store"));
    eprintln!("{kind:?}: {served} requests served while version 2 was published object by object");
}

#[tokio::test]
async fn without_a_marker_a_version_serves_once_its_listing_stops_changing() {
    let store = ObjectStoreServer::start(Kind::S3);
    store.bucket("models");
    store.publish("models", "repo/mlp/1", &mlp(1));
    let dir = tempfile::tempdir().expect("temp dir");
    let url = store.url("models", "repo/mlp");
    // Polls 3 s apart; an object lands about every second: no two polls
    // see the same listing of version 2 while its upload runs.
    let path = config(dir.path(), &url, "", "");
    let text =
        std::fs::read_to_string(&path).expect("config").replace("poll_wait_seconds = 1", "poll_wait_seconds = 3");
    std::fs::write(&path, text).expect("config");
    let server = serve(&path, &store);
    let x = values(5, 64);
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "more").expect("notes");
    store.put("models", "repo/mlp/2/model.onnx", &mlp(2).join("model.onnx"));
    for i in 0..8 {
        store.put("models", &format!("repo/mlp/2/assets/{i}.txt"), &notes);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_close(&predict(&server, None, &x).await.expect("serves"), &expected(1, &x), 1e-5, "still version 1");
    }
    answers_as(&server, None, 2, "version 2 after its last object").await;
    let mirrored = common::object_stores::files(&dir.path().join("cache"));
    assert!(mirrored.iter().any(|f| f.ends_with("2/assets/7.txt")), "downloaded whole: {mirrored:?}");
}

#[tokio::test]
async fn an_object_changed_during_its_download_is_refused_and_the_version_fetched_again() {
    let store = ObjectStoreServer::start(Kind::S3);
    store.bucket("models");
    store.publish("models", "repo/mlp/1", &mlp(1));
    let dir = tempfile::tempdir().expect("temp dir");
    // 64 KiB of assets, read first (one object at a time, in name order)
    // at 32 KiB/s: two seconds in which the model is replaced.
    let big = dir.path().join("big.bin");
    std::fs::write(&big, vec![7u8; 64 << 10]).expect("big");
    let url = store.url("models", "repo/mlp");
    let storage = "max_concurrent_downloads = 1\nmax_download_mib_per_sec = 0.03125";
    let server = serve(&config(dir.path(), &url, storage, ""), &store);
    store.put("models", "repo/mlp/2/assets/big.bin", &big);
    store.put("models", "repo/mlp/2/model.onnx", &mlp(2).join("model.onnx"));
    // The download starts once two polls agree; then the model changes.
    eventually("version 2's download under way", || {
        let partial = std::fs::read_dir(dir.path().join("cache"))
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
            .any(|e| e.file_name().to_string_lossy().starts_with(".partial-2-"));
        partial.then_some(()).ok_or("no partial download yet".to_string())
    })
    .await;
    store.put("models", "repo/mlp/2/model.onnx", &mlp(1).join("model.onnx"));
    server.wait_for_metric(r#"sluice_storage_downloads_total{model="mlp",outcome="failed"}"#, 1.0).await;
    // The next poll names it in the version's status, as a failed load.
    let message = failure_of(&server, 2).await;
    assert!(message.contains("repo/mlp/2/model.onnx") && message.contains("downloading"), "{message}");
    assert!(
        message.contains("pre-condition") || message.contains("412") || message.contains("Precondition"),
        "{message}"
    );
    // Fetched again once its listing is stable: the model now there serves.
    answers_as(&server, Some(2), 1, "version 2 fetched again").await;
}

#[tokio::test]
async fn the_store_going_away_under_load_fails_no_request_and_is_logged_once() {
    let mut store = ObjectStoreServer::start_persistent();
    store.bucket("models");
    store.publish("models", "repo/mlp/1", &mlp(1));
    let dir = tempfile::tempdir().expect("temp dir");
    let url = store.url("models", "repo/mlp");
    let server = serve(&config(dir.path(), &url, "request_timeout_secs = 2", ""), &store);
    let load = Load::start(&server).await;
    let down = r#"sluice_storage_unreachable{model="mlp"}"#;
    let list_errors = r#"sluice_storage_errors_total{model="mlp",outcome="list"}"#;
    // Hung (connections open, no answer), then gone (connections
    // refused): each outage of several polls is one line when it starts
    // and one when it ends.
    for outage in ["hung", "stopped"] {
        let _ = server.log();
        let errors = server.metric(list_errors).await;
        match outage {
            "hung" => store.freeze(),
            _ => store.stop(),
        }
        server.wait_for_metric(down, 1.0).await;
        server.wait_for_metric(list_errors, errors + 3.0).await;
        match outage {
            "hung" => store.thaw(),
            _ => store.restart(),
        }
        let lines = server.log_through("can be listed again").await;
        assert_eq!(server.metric(down).await, 0.0, "{outage}: the gauge says the store is back");
        let warnings: Vec<&String> = lines.iter().filter(|l| l.contains("cannot be listed")).collect();
        assert_eq!(warnings.len(), 1, "{outage}: one line per outage: {lines:#?}");
        assert!(lines.len() < 6, "{outage}: an outage of many polls writes two lines: {lines:#?}");
    }
    let served = load.finish("the store killed and restarted");
    // Version 1 served throughout, and a version published after serves.
    store.publish("models", "repo/mlp/2", &mlp(2));
    answers_as(&server, None, 2, "version 2 after the store came back").await;
    eprintln!("{served} requests served while the store was away");
}

#[test]
fn wrong_credentials_are_named_at_start_without_the_secret() {
    let store = ObjectStoreServer::start(Kind::Azure);
    store.bucket("models");
    store.publish("models", "repo/mlp/1", &mlp(1));
    let dir = tempfile::tempdir().expect("temp dir");
    let config = config(dir.path(), &store.url("models", "repo/mlp"), "", "");
    // A well-formed key that is not the account's.
    let secret = "c2x1aWNlLXdyb25nLWtleS1mb3ItdGhlLWVtdWxhdG9y";
    for (command, stderr) in refused_at_start(&store, &config, &[("AZURE_STORAGE_ACCOUNT_KEY", secret)]) {
        assert!(stderr.contains("listing az://models/repo/mlp") && stderr.contains("403"), "{command:?}: {stderr}");
        assert!(!stderr.contains(secret), "{command:?}: the key reached the output");
    }
}

/// `sluice serve` and `sluice config check` of `config`, against `store`
/// with `env` besides its own: each must fail; answers each command and
/// its stderr.
fn refused_at_start(store: &ObjectStoreServer, config: &Path, env: &[(&str, &str)]) -> Vec<(String, String)> {
    let path = config.to_str().expect("utf-8");
    let serve = ["serve", "--port", "0", "--rest_api_port", "0", "--model_config_file", path];
    let mut refused = Vec::new();
    for command in [&serve[..], &["config", "check", path][..]] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(command)
            .envs(store.env())
            .envs(env.iter().copied())
            .current_dir(fixtures::root())
            .output()
            .expect("run sluice");
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(!output.status.success(), "{command:?} started: {stderr}");
        refused.push((command.join(" "), stderr));
    }
    refused
}

/// A `gs://` base path in a bucket the store does not have fails start-up
/// and `sluice config check`, naming the URL and the store's answer.
/// (fake-gcs-server checks no credentials, so GCS's wrong-key case cannot
/// be driven here; it answers an unknown bucket 500, GCS itself 404.)
#[test]
fn an_unknown_gcs_bucket_is_named_at_start() {
    let store = ObjectStoreServer::start(Kind::Gcs(GcsRoute::EmulatorHost));
    store.bucket("models");
    store.publish("models", "repo/mlp/1", &mlp(1));
    let dir = tempfile::tempdir().expect("temp dir");
    let config = config(dir.path(), &store.url("no-such-bucket", "repo/mlp"), "", "");
    for (command, stderr) in refused_at_start(&store, &config, &[]) {
        assert!(
            stderr.contains("listing gs://no-such-bucket/repo/mlp")
                && stderr.contains("no bucket named no-such-bucket"),
            "{command:?}: {stderr}"
        );
    }
}

/// `sluice warmup make` on a version in a bucket, from a request log in
/// the bucket (its `filename_prefix` form): the log and the model read
/// from the store, the warmup file written back beside the model (one
/// atomic put), and a server serving the bucket warms the version up with
/// it.
#[tokio::test]
async fn a_warmup_file_is_made_for_a_version_in_a_bucket_and_warms_it_up() {
    use prost::Message;
    use sluice::proto::tensorflow::serving::{prediction_log, PredictLog, PredictionLog};
    let store = ObjectStoreServer::start(Kind::S3);
    store.bucket("models");
    store.publish("models", "repo/mlp/1", &mlp(1));
    let dir = tempfile::tempdir().expect("temp dir");
    // A request log of 7 logged Predict calls, as the server writes one.
    let records: Vec<Vec<u8>> = (0..7)
        .map(|seed| {
            let request = predict_request("mlp", vec![("x", f32_content(&[1, 64], &values(seed, 64)))]);
            let log = PredictLog { request: Some(request), response: None };
            PredictionLog { log_metadata: None, log_type: Some(prediction_log::LogType::PredictLog(log)) }
                .encode_to_vec()
        })
        .collect();
    let file = dir.path().join("requests.tfrecord");
    let (first, second) = records.split_at(4);
    std::fs::write(&file, sluice::models::tfrecord::write(first)).expect("log");
    store.put("models", "logs/mlp-20261207-000001.tfrecord", &file);
    std::fs::write(&file, sluice::models::tfrecord::write(second)).expect("log");
    store.put("models", "logs/mlp-20261207-000002.tfrecord", &file);
    let log = store.url("models", "logs/mlp");
    let version = store.url("models", "repo/mlp/1");
    let make = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["warmup", "make", &log, "--model", &version])
            .args(extra)
            .envs(store.env())
            .current_dir(fixtures::root())
            .output()
            .expect("run sluice warmup make")
    };
    let made = make(&[]);
    let stdout = String::from_utf8_lossy(&made.stdout);
    assert!(made.status.success(), "{stdout}{}", String::from_utf8_lossy(&made.stderr));
    assert!(
        stdout.contains("7 of 7 logged requests") && stdout.contains("s3://models/repo/mlp/1/assets.extra"),
        "{stdout}"
    );
    let again = make(&[]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success() && stderr.contains("exists; give --force"), "{stderr}");
    let bounded = make(&["--force", "--max-log-mib", "0"]);
    let stderr = String::from_utf8_lossy(&bounded.stderr);
    assert!(!bounded.status.success() && stderr.contains("more than the 0 allowed"), "{stderr}");
    let missing = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["warmup", "make", &log, "--model", &store.url("models", "repo/mlp/9")])
        .envs(store.env())
        .output()
        .expect("run sluice warmup make");
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success() && stderr.contains("repo/mlp/9 has no model.onnx"), "{stderr}");
    // The server serving the bucket warms version 1 up with the file.
    let server = serve(&config(dir.path(), &store.url("models", "repo/mlp"), "", ""), &store);
    let line = server.log_through("warmed up").await.into_iter().find(|l| l.contains("warmed up")).expect("line");
    assert!(line.contains("requests=7") && line.contains("tf_serving_warmup_requests"), "{line}");
}

/// A request log whose `filename_prefix` is in a bucket, as TF Serving
/// writes one to `gs://`: each file uploaded when it closes (here at its
/// 1 s interval), and the open one when the server stops; what lands there
/// is a log `warmup make` reads back, every request in it.
#[tokio::test]
async fn request_logs_are_uploaded_to_a_bucket_as_their_files_close_and_at_shutdown() {
    let store = ObjectStoreServer::start(Kind::S3);
    store.bucket("models");
    store.publish("models", "repo/mlp/1", &mlp(1));
    let dir = tempfile::tempdir().expect("temp dir");
    let version = dir.path().join("mlp/1");
    std::fs::create_dir_all(&version).expect("version dir");
    std::fs::copy(mlp(1).join("model.onnx"), version.join("model.onnx")).expect("model");
    // The log in the bucket, read back as a warmup file would be made.
    let logged = |prefix: &str| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["warmup", "make", &store.url("models", prefix), "--model", version.to_str().expect("utf-8")])
            .args(["--output", dir.path().join("warmup").to_str().expect("utf-8"), "--force"])
            .envs(store.env())
            .current_dir(fixtures::root())
            .output()
            .expect("run sluice warmup make");
        String::from_utf8_lossy(&output.stdout).to_string() + &String::from_utf8_lossy(&output.stderr)
    };
    let url = store.url("models", "repo/mlp");
    for (prefix, interval, requests) in [("logs/mlp", 1, 6), ("logs-at-stop/mlp", 3600, 3)] {
        let logging = format!(
            "logging = {{ filename_prefix = \"{}\", sampling_rate = 1.0, upload_interval_secs = {interval} }}",
            store.url("models", prefix)
        );
        let sub = dir.path().join(prefix.replace('/', "-"));
        std::fs::create_dir_all(&sub).expect("dir");
        let mut server = serve(&config(&sub, &url, "", &logging), &store);
        for seed in 0..requests {
            predict(&server, None, &values(seed, 64)).await.expect("served");
        }
        let want = format!("{requests} of {requests} logged requests");
        if interval == 1 {
            // Closed and uploaded within about a second, the server serving on.
            let mut waited = 0;
            loop {
                let said = logged(prefix);
                if said.contains(&want) {
                    break;
                }
                waited += 1;
                assert!(waited < 60, "the log never reached the bucket whole: {said}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        } else {
            // Nothing is uploaded before the file closes: at the stop.
            assert!(!logged(prefix).contains(&want), "uploaded before the file closed");
            // SAFETY: signalling the test's own child process.
            assert_eq!(unsafe { libc::kill(server.pid() as libc::pid_t, libc::SIGTERM) }, 0);
            let status = tokio::task::spawn_blocking(move || server.wait(Duration::from_secs(60)))
                .await
                .expect("wait")
                .expect("the server stops");
            assert!(status.success(), "{status:?}");
            let said = logged(prefix);
            assert!(said.contains(&want), "the open file was not uploaded at the stop: {said}");
        }
    }
}

/// The cache holds at most `cache_max_gib`: a new version that does not
/// fit evicts a version neither served nor wanted; one that cannot fit
/// beside what serves is refused, named in its status, and what serves
/// goes on serving.
#[tokio::test]
async fn the_cache_evicts_what_nothing_needs_and_refuses_what_cannot_fit() {
    let model_bytes = std::fs::metadata(mlp(1).join("model.onnx")).expect("model").len() as f64;
    let gib = |bytes: f64| bytes / f64::from(1u32 << 30);
    let publish = |store: &ObjectStoreServer, version: i64| {
        let file = mlp(if version % 2 == 1 { 1 } else { 2 }).join("model.onnx");
        store.put("models", &format!("repo/mlp/{version}/model.onnx"), &file);
        store.put("models", &format!("repo/mlp/{version}/_SUCCESS"), &fixtures::root().join("Cargo.toml"));
    };
    let marker_bytes = std::fs::metadata(fixtures::root().join("Cargo.toml")).expect("marker").len() as f64;
    let version_bytes = model_bytes + marker_bytes;

    // Room for two versions: the third evicts the first (not served, not wanted).
    let store = ObjectStoreServer::start(Kind::S3);
    store.bucket("models");
    publish(&store, 1);
    let dir = tempfile::tempdir().expect("temp dir");
    let storage = format!("completion_marker = \"_SUCCESS\"\ncache_max_gib = {}", gib(version_bytes * 2.5));
    let server = serve(&config(dir.path(), &store.url("models", "repo/mlp"), &storage, ""), &store);
    publish(&store, 2);
    answers_as(&server, None, 2, "version 2 serving").await;
    publish(&store, 3);
    answers_as(&server, None, 1, "version 3 (version 1's model) serving").await;
    server.wait_for_log("evicted from the model cache").await;
    let files = common::object_stores::files(&dir.path().join("cache"));
    assert!(!files.iter().any(|f| f.to_string_lossy().contains("/1/")), "version 1 evicted: {files:?}");
    assert!(server.metric("sluice_storage_cache_bytes").await <= version_bytes * 2.5);
    drop(server);

    // Room for one: the next version cannot fit beside the one serving.
    let store = ObjectStoreServer::start(Kind::S3);
    store.bucket("models");
    publish(&store, 1);
    let dir = tempfile::tempdir().expect("temp dir");
    let storage = format!("completion_marker = \"_SUCCESS\"\ncache_max_gib = {}", gib(version_bytes * 1.5));
    let server = serve(&config(dir.path(), &store.url("models", "repo/mlp"), &storage, ""), &store);
    publish(&store, 2);
    server.wait_for_metric(r#"sluice_storage_downloads_total{model="mlp",outcome="refused"}"#, 1.0).await;
    let message = failure_of(&server, 2).await;
    assert!(message.contains("storage.cache_max_gib"), "{message}");
    let x = values(2, 64);
    assert_close(&predict(&server, None, &x).await.expect("v1 serves"), &expected(1, &x), 1e-5, "version 1 serves on");
}

/// A restart with a model renamed (or removed) removes the mirror the old
/// name left in the cache; the new one is downloaded and served.
#[tokio::test]
async fn mirrors_of_models_no_longer_configured_are_removed_at_start() {
    let store = ObjectStoreServer::start(Kind::S3);
    store.bucket("models");
    store.publish("models", "repo/mlp/1", &mlp(1));
    let dir = tempfile::tempdir().expect("temp dir");
    let path = config(dir.path(), &store.url("models", "repo/mlp"), "", "");
    let mirrors = || -> Vec<String> {
        std::fs::read_dir(dir.path().join("cache"))
            .expect("cache")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    };
    drop(serve(&path, &store));
    assert!(mirrors().iter().any(|m| m.starts_with("mlp-")), "{:?}", mirrors());
    let text = std::fs::read_to_string(&path).expect("config").replace("name = \"mlp\"", "name = \"renamed\"");
    std::fs::write(&path, text).expect("config");
    let server = serve(&path, &store);
    let mut request = predict_request("renamed", vec![("x", f32_content(&[1, 64], &values(4, 64)))]);
    request.model_spec = spec("renamed", None);
    server.predict_client().await.predict(request).await.expect("the renamed model serves");
    let left = mirrors();
    assert!(left.iter().all(|m| m.starts_with("renamed-")) && left.len() == 1, "{left:?}");
}
