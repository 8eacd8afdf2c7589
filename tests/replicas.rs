//! Uploaded plugins shared by every replica through a real Redis: two (and
//! then three) real servers, each with its own plugin store; what one
//! replica uploads, activates and rolls back, every replica serves; a
//! replica that missed notifications catches up; a new replica starts with
//! the active plugin; Redis down stops changes, not serving; a change made
//! against a stale revision is refused.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use common::fixtures::*;
use common::redis::RedisServer;
use common::*;
use http::{Method, StatusCode};
use serde_json::Value;
use sluice::cli::bench::client::RestClient;

const OPS: &str = "ops-secret";

/// One replica's own directory (plugin store included) and config, all
/// pointing at the same Redis.
struct Replica {
    dir: ConfigDir,
}

impl Replica {
    fn new(redis: &RedisServer) -> Replica {
        let config = format!(
            "[plugins]\ndir = \"$PLUGINS\"\n[plugins.shared]\nredis_url = \"{}\"\nkey_prefix = \"test:\"\n\
             reconcile_seconds = 1\n[admin]\nenabled = true\n{}{}{}",
            redis.url(),
            admin_token("ops", None, OPS),
            example_model_table("mlp"),
            pipeline_table("scored", "mlp", "preprocess = { plugin = \"features\", workers = 2 }"),
        );
        Replica { dir: ConfigDir::new(&[("features", "identity")], &config) }
    }

    fn config(&self) -> PathBuf {
        self.dir.config()
    }

    fn start(&self) -> Server {
        Server::serving(&self.dir)
    }
}

async fn admin(server: &Server, method: Method, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
    server.admin(method, path, Some(OPS), body).await
}

/// (registry revision, version the `scored` stage runs, its sha256).
async fn running(server: &Server) -> (u64, u64, String) {
    let (status, answer) = admin(server, Method::GET, "/admin/v1/pipelines", Vec::new()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let stage = &answer["pipelines"][0];
    (
        answer["registry_revision"].as_u64().expect("revision"),
        stage["version"].as_u64().expect("version"),
        stage["sha256"].as_str().expect("sha256").to_string(),
    )
}

/// Waits until `server` runs `version` (`sha256`) at the revision `from`
/// (the replica that made the change) committed: a replica swaps the
/// stage first and records the revision it applied after, so the version
/// alone can show before the revision does. Returns the revision.
async fn wait_running(server: &Server, from: &Server, version: u64, sha256: &str) -> u64 {
    let revision = running(from).await.0;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = running(server).await;
        if now == (revision, version, sha256.to_string()) {
            return revision;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "waited 30 s for version {version} ({sha256}) at revision {revision}; the replica is at {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn logits(server: &Server, model: &str, x: &[f32]) -> Vec<f32> {
    let mut client = server.predict_client().await;
    let response = client.predict(predict_request(model, vec![("x", f32_content(&[1, 64], x))])).await.expect(model);
    f32_values(&response.into_inner().outputs["logits"])
}

#[tokio::test]
async fn what_one_replica_uploads_and_activates_every_replica_serves() {
    let redis = RedisServer::start();
    let (one, two) = (Replica::new(&redis), Replica::new(&redis));
    let (a, b) = (one.start(), two.start());
    let x = values(5, 64);
    let doubled: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
    let (identity, scaled) = (logits(&a, "mlp", &x).await, logits(&a, "mlp", &doubled).await);
    let identity_sha = sha256_hex(&plugin_bytes("identity"));
    let scale_sha = sha256_hex(&plugin_bytes("scale"));

    // Uploaded and activated on A: B serves it too.
    let (status, answer) =
        admin(&a, Method::PUT, "/admin/v1/plugins/features?activate=true", plugin_bytes("scale")).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let revision = wait_running(&b, &a, 1, &scale_sha).await;
    assert_eq!(running(&a).await.0, revision, "both replicas at the same revision");
    assert_eq!(logits(&b, "scored", &x).await, scaled, "B runs the plugin uploaded on A");
    assert_eq!(logits(&a, "scored", &x).await, scaled);
    // B's own store now holds the blob, so it serves it without Redis.
    let blob = two.dir.path().join(format!("plugins/store/blobs/{scale_sha}.wasm"));
    assert_eq!(std::fs::read(&blob).expect("blob in B's store"), plugin_bytes("scale"));

    // Rolled back on B: A follows.
    let (status, answer) = admin(&b, Method::POST, "/admin/v1/plugins/features/rollback", Vec::new()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    wait_running(&a, &b, 0, &identity_sha).await;
    assert_eq!(logits(&a, "scored", &x).await, identity);

    // A replica started now starts with what is active, at once.
    let (status, answer) = admin(&a, Method::POST, "/admin/v1/plugins/features/versions/1/activate", Vec::new()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let revision = wait_running(&b, &a, 1, &scale_sha).await;
    let three = Replica::new(&redis);
    let c = three.start();
    assert_eq!(running(&c).await, (revision, 1, scale_sha.clone()), "a new replica starts in step");
    assert_eq!(logits(&c, "scored", &x).await, scaled);

    // The audit list says who did what, where.
    let audit = redis.command(&[b"LRANGE", b"test:plugins:audit", b"0", b"-1"]).expect("audit list");
    for action in ["upload", "activate", "rollback"] {
        assert!(audit.contains(&format!("\"action\":\"{action}\"")), "{audit}");
    }
    assert!(audit.contains("\"token_id\":\"ops\"") && !audit.contains(OPS), "{audit}");
}

#[tokio::test]
async fn a_replica_that_missed_notifications_catches_up_and_redis_down_stops_changes_not_serving() {
    let mut redis = RedisServer::start();
    let (one, two) = (Replica::new(&redis), Replica::new(&redis));
    let (a, b) = (one.start(), two.start());
    let scale_sha = sha256_hex(&plugin_bytes("scale"));
    let x = values(6, 64);

    // B's subscription is cut; the change is published while it is gone.
    let killed = redis.command(&[b"CLIENT", b"KILL", b"TYPE", b"pubsub"]).expect("CLIENT KILL");
    assert!(killed.starts_with(':'), "{killed}");
    let (status, answer) =
        admin(&a, Method::PUT, "/admin/v1/plugins/features?activate=true", plugin_bytes("scale")).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    wait_running(&b, &a, 1, &scale_sha).await;

    // Redis down: changes are refused with the reason; serving goes on.
    redis.kill();
    let (status, answer) = admin(&a, Method::POST, "/admin/v1/plugins/features/rollback", Vec::new()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert!(answer["error"].as_str().is_some_and(|e| e.contains("shared plugin registry")), "{answer}");
    let doubled: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
    let scaled = logits(&a, "mlp", &doubled).await;
    assert_eq!(logits(&a, "scored", &x).await, scaled, "A still serves the active plugin");
    assert_eq!(logits(&b, "scored", &x).await, scaled, "B still serves the active plugin");
    assert_eq!(running(&a).await.1, 1, "nothing changed on A");
    assert!(a.metric("sluice_plugin_registry_sync_failures_total").await >= 1.0);
}

#[tokio::test]
async fn a_change_against_a_stale_revision_is_refused_and_a_corrupted_blob_is_not_served() {
    use sluice::plugin::registry::Manifest;
    use sluice::plugin::shared::SharedRegistry;
    let redis = RedisServer::start();
    let config = sluice::config::plugins::SharedRegistryConfig {
        redis_url: redis.url(),
        key_prefix: "unit:".into(),
        ..Default::default()
    };
    let runtime = tokio::runtime::Handle::current();
    let (config_again, runtime_again) = (config.clone(), runtime.clone());
    let (first, stale) = tokio::task::spawn_blocking(move || {
        let shared = SharedRegistry::new(&config, runtime).expect("client");
        let manifest = Manifest {
            name: "p".into(),
            team: None,
            active: None,
            history: Vec::new(),
            versions: Vec::new(),
            canary: None,
        };
        let first = shared.commit(0, &manifest, &serde_json::json!({"action": "test"})).expect("first commit");
        let stale = shared.commit(0, &manifest, &serde_json::json!({"action": "test"})).expect_err("stale");
        let snapshot = shared.snapshot().expect("snapshot");
        assert_eq!(snapshot.revision, 1);
        assert_eq!(snapshot.manifests["p"], manifest);
        // A blob whose bytes do not hash to its name is refused.
        shared.put_blob(&"0".repeat(64), b"tampered").expect("put");
        let tampered = shared.blob(&"0".repeat(64)).expect_err("tampered blob");
        assert!(tampered.message().contains("corrupted"), "{tampered}");
        // One larger than plugins.shared.max_blob_mib is refused unread.
        let small = SharedRegistry::new(
            &sluice::config::plugins::SharedRegistryConfig { max_blob_mib: 1, ..config_again },
            runtime_again,
        )
        .expect("client");
        small.put_blob(&"1".repeat(64), &vec![7u8; (1 << 20) + 1]).expect("put");
        let huge = small.blob(&"1".repeat(64)).expect_err("an oversized blob");
        assert!(huge.message().contains("more than plugins.shared.max_blob_mib"), "{huge}");
        (first, stale)
    })
    .await
    .expect("blocking task");
    assert_eq!(first, 1);
    assert_eq!(stale.code().grpc(), tonic::Code::Aborted, "{stale}");
    assert_eq!(stale.code().http(), StatusCode::CONFLICT);
    assert!(stale.message().contains("another replica") && stale.message().contains("retry"), "{stale}");
}

#[tokio::test]
async fn manifests_grown_past_the_bound_are_refused_unread() {
    use sluice::plugin::shared::SharedRegistry;
    let redis = RedisServer::start();
    let config = sluice::config::plugins::SharedRegistryConfig {
        redis_url: redis.url(),
        key_prefix: "bound:".into(),
        max_blob_mib: 1,
        ..Default::default()
    };
    let huge = vec![b'x'; (1 << 20) + 1];
    let reply = redis.command(&[b"HSET", b"bound:plugins:manifests", b"p", &huge]);
    assert_eq!(reply.as_deref(), Some(":1\r\n"), "HSET of an oversized manifest");
    let runtime = tokio::runtime::Handle::current();
    let err = tokio::task::spawn_blocking(move || {
        SharedRegistry::new(&config, runtime).expect("client").snapshot().expect_err("oversized manifests")
    })
    .await
    .expect("blocking task");
    assert!(err.message().contains("manifests hold") && err.message().contains("not read"), "{err}");
}

#[tokio::test]
async fn a_replica_is_not_ready_until_it_has_the_shared_plugins() {
    let mut redis = RedisServer::start();
    let (one, two) = (Replica::new(&redis), Replica::new(&redis));
    let a = one.start();
    let (status, answer) =
        admin(&a, Method::PUT, "/admin/v1/plugins/features?activate=true", plugin_bytes("scale")).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    // Redis loses everything and is down while B starts: B waits, not ready.
    redis.kill();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"));
    command
        .args(["serve", "--host", "127.0.0.1", "--port", "0", "--rest_api_port", "0", "--model_config_file"])
        .arg(two.config())
        .current_dir(root());
    let mut b = ServerProcess::spawn(command, "sluice-b", "sluice: serving HTTP on ", Duration::from_secs(60), true)
        .unwrap_or_else(|e| panic!("{e}"));
    // The address of the line `spawn` waited for.
    let http = b.addr;
    eventually("B waiting for the shared registry", || {
        let log = b.log();
        log.iter().find(|l| l.contains("waiting for the shared plugin registry")).cloned().ok_or(format!("{log:?}"))
    })
    .await;
    let mut client = RestClient::new(&http.to_string()).expect("client");
    let readiness = client.call(Method::GET, "/readyz", &[], Bytes::new()).await.expect("readyz");
    assert_eq!(readiness.status, StatusCode::SERVICE_UNAVAILABLE, "{}", readiness.text());
    // Redis is back (empty, as after a loss without persistence): A's next
    // change records the registry again, and B starts with it.
    redis.restart();
    let (status, answer) =
        admin(&a, Method::PUT, "/admin/v1/plugins/features?activate=true", plugin_bytes("scale")).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    b.wait_stdout("sluice: serving gRPC on ", Duration::from_secs(30)).expect("B ready once the registry answers");
    let readiness = client.call(Method::GET, "/readyz", &[], Bytes::new()).await.expect("readyz");
    assert_eq!(readiness.status, StatusCode::OK, "{}", readiness.text());
    // B may have read the registry in the moment between Redis coming
    // back empty and A's change; it follows the change either way.
    let want = sha256_hex(&plugin_bytes("scale"));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let pipelines = client
            .call(Method::GET, "/admin/v1/pipelines", &[("authorization", &format!("Bearer {OPS}"))], Bytes::new())
            .await
            .expect("pipelines");
        let answer: Value = serde_json::from_slice(&pipelines.body).expect("JSON");
        if answer["pipelines"][0]["sha256"] == want.as_str() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "B never ran the shared plugin: {answer}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `server`'s `sluice_canary_percent` for the plugin is `percent`.
async fn wait_canary_percent(server: &Server, percent: f64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = server.metric(r#"sluice_canary_percent{plugin="features"}"#).await;
        if now == percent {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "waited 30 s for a canary at {percent}%; it is at {now}%");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_canary_started_on_one_replica_runs_on_all_and_a_rollback_on_one_ends_it_everywhere() {
    let redis = RedisServer::start();
    let (one, two) = (Replica::new(&redis), Replica::new(&redis));
    let (a, b) = (one.start(), two.start());
    let mut x = values(8, 64);
    x[0] = 0.5;
    let doubled: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
    let (identity, scaled) = (logits(&a, "mlp", &x).await, logits(&a, "mlp", &doubled).await);

    // Started on A: B deals half its calls to the canary too.
    let (status, answer) = admin(&a, Method::PUT, "/admin/v1/plugins/features", plugin_bytes("scale")).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let (status, answer) =
        admin(&a, Method::POST, "/admin/v1/plugins/features/versions/1/activate?canary=50", Vec::new()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    wait_canary_percent(&b, 50.0).await;
    let mut seen = [0; 2];
    for _ in 0..200 {
        let got = logits(&b, "scored", &x).await;
        seen[usize::from(got == scaled)] += 1;
        assert!(got == identity || got == scaled);
    }
    assert!(seen[0] > 40 && seen[1] > 40, "B's answers, identity / canary: {seen:?}");

    // A bad release as the canary, judged on B: B rolls it back, and A's
    // canary ends with it.
    let (status, answer) = admin(&a, Method::PUT, "/admin/v1/plugins/features", plugin_bytes("scale_flaky")).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let (status, answer) =
        admin(&a, Method::POST, "/admin/v1/plugins/features/versions/2/activate?canary=50", Vec::new()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while b
        .metric(
            r#"sluice_canary_calls_total{pipeline="scored",plugin="features",version="2",side="canary",outcome="ok"}"#,
        )
        .await
        == 0.0
    {
        assert!(std::time::Instant::now() < deadline, "B never ran canary version 2");
        let _ = logits(&b, "mlp", &x).await;
        let mut client = b.predict_client().await;
        let _ = client.predict(predict_request("scored", vec![("x", f32_content(&[1, 64], &x))])).await;
    }
    let mut bad = x.clone();
    bad[0] = 2.0;
    let mut client = b.predict_client().await;
    let mut failed = 0;
    for _ in 0..200 {
        if client.predict(predict_request("scored", vec![("x", f32_content(&[1, 64], &bad))])).await.is_err() {
            failed += 1;
        }
    }
    assert!((1..=8).contains(&failed), "{failed} requests failed on B before the rollback");
    wait_canary_percent(&a, 0.0).await;
    wait_canary_percent(&b, 0.0).await;
    assert_eq!(b.metric(r#"sluice_canary_rollbacks_total{plugin="features"}"#).await, 1.0);
    for _ in 0..50 {
        assert_eq!(logits(&a, "scored", &x).await, identity, "A serves the active version alone");
    }
    let audit = redis.command(&[b"LRANGE", b"test:plugins:audit", b"0", b"-1"]).expect("audit list");
    assert!(audit.contains("\"action\":\"canary\"") && audit.contains("canary_rollback: "), "{audit}");
}
