//! Traffic control, from outside, on a real server: plugin canaries (their
//! share over 10 000 requests, stickiness by a key, promotion, ending, and
//! the automatic rollback of a bad release with no more failures than the
//! judgement window allows), the response cache (hits, misses, never a
//! stale answer after a swap, bypassed during a canary), priorities at
//! admission, per-pipeline and per-team quotas, and every malformed
//! priority refused naming what was wrong.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::fixtures::*;
use common::*;
use http::{Method, StatusCode};
use serde_json::Value;

const OPS: &str = "ops-secret";

/// A plugin directory whose `features.wasm` is the identity plugin and
/// whose `hostile.wasm` is the hostile one, an admin token, and `extra`
/// config (models and pipelines) after the common part.
struct Fixture {
    dir: ConfigDir,
}

impl Fixture {
    fn new(extra: &str) -> Fixture {
        let config = format!(
            "[plugins]\ndir = \"$PLUGINS\"\nmax_calls_per_team = 8\n[plugins.limits.hostile]\ntimeout_ms = 10000\n\
             [admin]\nenabled = true\nmax_upload_bytes = 4194304\n{}{}{extra}\n",
            admin_token("ops", None, OPS),
            example_model_table("mlp"),
        );
        Fixture { dir: ConfigDir::new(&[("features", "identity"), ("hostile", "hostile")], &config) }
    }

    fn start(&self) -> Server {
        Server::serving(&self.dir)
    }
}

async fn ok(server: &Server, method: Method, path: &str, body: Vec<u8>) -> Value {
    let (status, answer) = server.admin(method.clone(), path, Some(OPS), body).await;
    assert_eq!(status, StatusCode::OK, "{method} {path}: {answer}");
    answer
}

/// `sluice plugin ARGS… --server URL` with the admin token.
fn sluice_plugin(server: &Server, args: &[&str]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("plugin")
        .args(args)
        .args(["--server", &format!("http://{}", server.http)])
        .env("SLUICE_TOKEN", OPS)
        .output()
        .expect("run sluice plugin");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(output.status.success(), "sluice plugin {args:?}: {}{stdout}", String::from_utf8_lossy(&output.stderr));
    stdout
}

fn row(first: f32, seed: u64) -> Vec<f32> {
    let mut x = values(seed, 64);
    x[0] = first;
    x
}

/// A REST POST: the status and the body.
async fn rest(server: &Server, path: &str, body: String, headers: &[(&str, &str)]) -> (u16, String) {
    let mut client = sluice::cli::bench::client::RestClient::new(&format!("http://{}", server.http)).expect("client");
    let response = client.call(Method::POST, path, headers, bytes::Bytes::from(body)).await.expect("REST call");
    (response.status.as_u16(), String::from_utf8_lossy(&response.body).to_string())
}

async fn logits(server: &Server, pipeline: &str, x: &[f32]) -> Result<Vec<f32>, tonic::Status> {
    let mut client = server.predict_client().await;
    let response = client.predict(predict_request(pipeline, vec![("x", f32_content(&[1, 64], x))])).await?;
    Ok(f32_values(&response.into_inner().outputs["logits"]))
}

/// What `n` requests of `x` (from `clients` connections) to `pipeline`
/// were answered: by the identity version, by the doubling one, failed.
async fn count_answers(
    server: &Server,
    pipeline: &str,
    x: &[f32],
    n: usize,
    clients: usize,
) -> (usize, usize, Vec<String>) {
    let identity = logits(server, "mlp", x).await.expect("mlp");
    let doubled = logits(server, "mlp", &x.iter().map(|v| v * 2.0).collect::<Vec<_>>()).await.expect("mlp");
    let (left, known) = (Arc::new(AtomicUsize::new(n)), Arc::new([identity, doubled]));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let mut client = server.predict_client().await;
        let (left, known, pipeline, x) = (left.clone(), known.clone(), pipeline.to_string(), x.to_vec());
        tasks.push(tokio::spawn(async move {
            let (mut seen, mut failed) = ([0usize; 2], Vec::new());
            while left.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok() {
                let request = predict_request(&pipeline, vec![("x", f32_content(&[1, 64], &x))]);
                match client.predict(request).await {
                    Ok(answer) => {
                        let got = f32_values(&answer.into_inner().outputs["logits"]);
                        let at = known.iter().position(|k| *k == got).expect("an answer of one version or the other");
                        seen[at] += 1;
                    }
                    Err(status) => failed.push(format!("{:?}: {}", status.code(), status.message())),
                }
            }
            (seen, failed)
        }));
    }
    let (mut identity, mut doubled, mut failures) = (0, 0, Vec::new());
    for task in tasks {
        let (seen, failed) = task.await.expect("client");
        identity += seen[0];
        doubled += seen[1];
        failures.extend(failed);
    }
    (identity, doubled, failures)
}

const CANARY_PIPELINES: &str = r#"
[[pipelines]]
name = "scored"
model = "mlp"
preprocess = { plugin = "features", workers = 2 }
[[pipelines]]
name = "sticky"
model = "mlp"
canary_key = "x"
preprocess = { plugin = "features", workers = 2 }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_canary_takes_its_share_sticks_by_key_and_is_promoted_or_ended_by_command() {
    let fixture = Fixture::new(CANARY_PIPELINES);
    let server = fixture.start();
    ok(&server, Method::PUT, "/admin/v1/plugins/features", plugin_bytes("scale")).await;
    let started = sluice_plugin(&server, &["activate", "features", "1", "--canary", "10"]);
    assert!(started.contains("\"canary\"") && started.contains("\"percent\": 10.0"), "{started}");
    assert!(started.contains("\"active\": 0"), "the file stays active beside the canary: {started}");

    // 10 000 requests dealt at random: the canary's share within 2 points.
    let (identity, doubled, failures) = count_answers(&server, "scored", &row(0.5, 1), 10_000, 8).await;
    assert!(failures.is_empty(), "{failures:?}");
    let share = doubled as f64 / (identity + doubled) as f64 * 100.0;
    assert!((8.0..=12.0).contains(&share), "the canary served {share:.2}% of 10000 requests, not 10% ± 2");
    let metrics = server.metrics().await;
    let canary_ok = metric_value(
        &metrics,
        r#"sluice_canary_calls_total{pipeline="scored",plugin="features",version="1",side="canary",outcome="ok"}"#,
    );
    assert_eq!(canary_ok as usize, doubled, "the canary's calls are counted as such");
    assert_eq!(metric_value(&metrics, r#"sluice_canary_percent{plugin="features"}"#), 10.0);

    // By key: each key always lands on the same side.
    let mut canary_keys = 0;
    for seed in 0..200 {
        let x = row(0.5, 1000 + seed);
        let first = logits(&server, "sticky", &x).await.expect("sticky");
        for _ in 0..3 {
            assert_eq!(logits(&server, "sticky", &x).await.expect("sticky"), first, "key {seed} changed sides");
        }
        if first != logits(&server, "mlp", &x).await.expect("mlp") {
            canary_keys += 1;
        }
    }
    assert!((4..=40).contains(&canary_keys), "{canary_keys} of 200 keys on the canary at 10%");

    // Ended by command: the active version alone serves again.
    let ended = sluice_plugin(&server, &["end-canary", "features"]);
    assert!(!ended.contains("\"canary\""), "{ended}");
    let (identity, doubled, failures) = count_answers(&server, "scored", &row(0.5, 1), 300, 4).await;
    assert_eq!((identity, doubled, failures.len()), (300, 0, 0));

    // Promoted by command: the canary becomes the active version.
    sluice_plugin(&server, &["activate", "features", "1", "--canary", "50"]);
    let promoted = sluice_plugin(&server, &["promote", "features"]);
    assert!(promoted.contains("\"active\": 1") && !promoted.contains("\"canary\""), "{promoted}");
    let (identity, doubled, failures) = count_answers(&server, "scored", &row(0.5, 1), 300, 4).await;
    assert_eq!((identity, doubled, failures.len()), (0, 300, 0));

    // Refusals name what was wrong and change nothing.
    for (path, status, needle) in [
        ("/admin/v1/plugins/features/versions/1/activate?canary=5", StatusCode::BAD_REQUEST, "is the active one"),
        (
            "/admin/v1/plugins/features/versions/0/activate?canary=0",
            StatusCode::BAD_REQUEST,
            "more than 0 and less than 100",
        ),
        ("/admin/v1/plugins/features/versions/0/activate?canary=100", StatusCode::BAD_REQUEST, "100 is an activation"),
        ("/admin/v1/plugins/features/versions/0/activate?canary=lots", StatusCode::BAD_REQUEST, "expected a percent"),
        ("/admin/v1/plugins/features/versions/7/activate?canary=5", StatusCode::NOT_FOUND, "has no version 7"),
        ("/admin/v1/plugins/features/promote", StatusCode::BAD_REQUEST, "runs no canary"),
    ] {
        let (got, answer) = server.admin(Method::POST, path, Some(OPS), Vec::new()).await;
        assert_eq!(got, status, "{path}: {answer}");
        assert!(answer.to_string().contains(needle), "{path}: {answer}");
    }
    let (got, answer) = server.admin(Method::DELETE, "/admin/v1/plugins/features/canary", Some(OPS), Vec::new()).await;
    assert_eq!(got, StatusCode::BAD_REQUEST, "{answer}");
    let (got, _) = server.admin(Method::POST, "/admin/v1/plugins/features/promote", None, Vec::new()).await;
    assert_eq!(got, StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_canary_is_rolled_back_on_its_own_within_the_window() {
    let fixture = Fixture::new(&format!(
        "{CANARY_PIPELINES}\n[traffic.canary]\nwindow_requests = 100\nmax_error_rate_increase = 0.05\n"
    ));
    let server = fixture.start();
    ok(&server, Method::PUT, "/admin/v1/plugins/features", plugin_bytes("scale_flaky")).await;
    sluice_plugin(&server, &["activate", "features", "1", "--canary", "50"]);
    // Rows the bad release fails on, from 4 clients at once.
    let (identity, doubled, failures) = count_answers(&server, "scored", &row(2.0, 7), 2000, 4).await;
    assert_eq!(doubled, 0, "the flaky release answers nothing on these rows");
    assert_eq!(identity + failures.len(), 2000);
    // 5% of a window of 100 are allowed, the 6th fails it; calls already
    // running on the stage's two workers may fail too.
    assert!((6..=8).contains(&failures.len()), "{} failed: {failures:?}", failures.len());
    assert!(failures.iter().all(|f| f.contains("Internal: plugin 'scale' 1.0.1-flaky failed")), "{failures:?}");
    // The log line and the audit entry (lines are read once: gather them).
    let mut seen = Vec::new();
    let (line, audit) = eventually("the rollback's log line and audit entry", || {
        seen.extend(server.log());
        let find = |needle: &str| seen.iter().find(|l| l.contains(needle)).cloned();
        match (find("canary rolled back"), find("plugin canary_rollback")) {
            (Some(line), Some(audit)) => Ok((line, audit)),
            _ => Err(format!("{} lines", seen.len())),
        }
    })
    .await;
    assert!(line.contains("6 of its last 6 calls failed"), "{line}");
    assert!(audit.contains("sluice::audit") && audit.contains("automatic rollback"), "{audit}");
    let shown = eventually("the manifest without its canary", || {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["plugin", "show", "features", "--server", &format!("http://{}", server.http)])
            .env("SLUICE_TOKEN", OPS)
            .output()
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&output.stdout).to_string();
        if text.contains("\"canary\"") {
            Err(text)
        } else {
            Ok(text)
        }
    })
    .await;
    assert!(shown.contains("\"active\": 0"), "{shown}");
    let metrics = server.metrics().await;
    assert_eq!(metric_value(&metrics, r#"sluice_canary_rollbacks_total{plugin="features"}"#), 1.0);
    assert_eq!(metric_value(&metrics, r#"sluice_canary_percent{plugin="features"}"#), 0.0);
    let (identity, _, failures) = count_answers(&server, "scored", &row(2.0, 7), 200, 4).await;
    assert_eq!((identity, failures.len()), (200, 0), "{failures:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cache_answers_repeats_never_serves_a_stale_answer_and_steps_aside_for_a_canary() {
    let fixture = Fixture::new(
        r#"
cache = { max_mib = 8, ttl_secs = 300 }
[[pipelines]]
name = "scored"
model = "mlp"
cache = { max_mib = 8, ttl_secs = 300 }
preprocess = { plugin = "features", workers = 2 }
"#,
    );
    let server = fixture.start();
    let (x, y) = (row(0.5, 3), row(0.5, 4));
    let first = logits(&server, "scored", &x).await.expect("scored");
    assert_eq!(logits(&server, "scored", &x).await.expect("scored"), first);
    assert_ne!(logits(&server, "scored", &y).await.expect("scored"), first, "another input, another answer");
    let series =
        |outcome: &str| format!(r#"sluice_response_cache_requests_total{{pipeline="scored",outcome="{outcome}"}}"#);
    let metrics = server.metrics().await;
    assert_eq!((metric_value(&metrics, &series("hit")), metric_value(&metrics, &series("miss"))), (1.0, 2.0));
    assert!(metric_value(&metrics, r#"sluice_response_cache_bytes{pipeline="scored"}"#) > 0.0);

    // The model served under its own name has its own cache: never the
    // pipeline's entries.
    logits(&server, "mlp", &x).await.expect("mlp");
    let metrics = server.metrics().await;
    assert_eq!(metric_value(&metrics, r#"sluice_response_cache_requests_total{pipeline="mlp",outcome="miss"}"#), 1.0);

    // A swap empties it: the same request gets the new version's answer.
    ok(&server, Method::PUT, "/admin/v1/plugins/features?activate=true", plugin_bytes("scale")).await;
    let doubled = logits(&server, "mlp", &x.iter().map(|v| v * 2.0).collect::<Vec<_>>()).await.expect("mlp");
    assert_eq!(logits(&server, "scored", &x).await.expect("scored"), doubled, "no stale answer after the swap");
    assert_eq!(logits(&server, "scored", &x).await.expect("scored"), doubled);

    // While a canary runs the same input may get either answer: no cache.
    sluice_plugin(&server, &["activate", "features", "0", "--canary", "50"]);
    let (identity, twice, failures) = count_answers(&server, "scored", &x, 200, 2).await;
    assert!(failures.is_empty() && identity > 0 && twice > 0, "{identity} / {twice} / {failures:?}");
    let metrics = server.metrics().await;
    assert!(metric_value(&metrics, &series("bypass")) >= 200.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn low_priority_fills_only_its_share_and_quotas_refuse_naming_themselves() {
    let fixture = Fixture::new(
        r#"
[[pipelines]]
name = "slow"
model = "mlp"
max_in_flight = 4
preprocess = { plugin = "hostile", workers = 4 }
[[pipelines]]
name = "limited"
model = "mlp"
team = "search"
quota = { requests_per_second = 1, burst = 3 }
[[pipelines]]
name = "also-search"
model = "mlp"
team = "search"
[traffic]
low_priority_share = 0.5
[traffic.teams.search]
requests_per_second = 1
burst = 5
"#,
    );
    let server = fixture.start();
    let slow = |priority: &'static str| {
        let server_url = server.grpc_url();
        async move {
            let mut client =
                sluice::proto::tensorflow::serving::prediction_service_client::PredictionServiceClient::connect(
                    server_url,
                )
                .await
                .expect("connect");
            let inputs =
                vec![("attack", string_tensor(&[1], &["sleep"])), ("x", f32_content(&[1, 64], &values(1, 64)))];
            let mut request = tonic::Request::new(predict_request("slow", inputs));
            request.metadata_mut().insert("x-sluice-priority", priority.parse().expect("metadata"));
            client.predict(request).await
        }
    };
    // Two low-priority requests (3 s each) fill the low share of 4 places.
    let held: Vec<_> = (0..2).map(|_| tokio::spawn(slow("low"))).collect();
    server.wait_for_metric(r#"sluice_queue_depth{queue="slow/admission"}"#, 2.0).await;
    let refused = slow("low").await.expect_err("a third low-priority request is refused");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert!(
        refused.message().contains("full for low-priority requests: they may take 2 of its 4 places"),
        "{}",
        refused.message()
    );
    // High and normal ones still get in while the low ones wait.
    let (high, normal) = tokio::join!(slow("high"), slow("2"));
    assert!(high.is_ok() && normal.is_ok(), "{high:?} {normal:?}");
    for request in held {
        assert!(request.await.expect("join").is_ok());
    }

    // The pipeline's own quota: a burst of 3, then refused naming it.
    let x = values(2, 64);
    for _ in 0..3 {
        logits(&server, "limited", &x).await.expect("within the burst");
    }
    let refused = logits(&server, "limited", &x).await.expect_err("over the quota");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert!(
        refused.message().contains("pipeline 'limited' is over its quota of 1 requests per second, burst 3 (pipelines.limited.quota.requests_per_second)"),
        "{}",
        refused.message()
    );
    // The team's quota covers both its pipelines: 5 in all, 3 spent.
    logits(&server, "also-search", &x).await.expect("the team's 4th");
    logits(&server, "also-search", &x).await.expect("the team's 5th");
    let refused = logits(&server, "also-search", &x).await.expect_err("over the team's quota");
    assert!(
        refused
            .message()
            .contains("team 'search' is over its quota of 1 requests per second, burst 5 (traffic.teams.search"),
        "{}",
        refused.message()
    );
    // REST answers 429 with the same words; other pipelines are untouched.
    let (status, answer) =
        rest(&server, "/v1/models/also-search:predict", format!("{{\"instances\": [{x:?}]}}"), &[]).await;
    assert_eq!(status, 429, "{answer}");
    assert!(answer.contains("team 'search' is over its quota"), "{answer}");
    logits(&server, "mlp", &x).await.expect("another pipeline serves");
    let metrics = server.metrics().await;
    assert!(metric_value(&metrics, r#"sluice_rejections_total{queue="quota/team/search",reason="quota_rate"}"#) >= 2.0);
}

#[tokio::test]
async fn a_malformed_priority_is_refused_naming_it_everywhere() {
    let fixture = Fixture::new("");
    let server = fixture.start();
    let x = values(3, 64);
    let mut client = server.predict_client().await;
    let mut request = tonic::Request::new(predict_request("mlp", vec![("x", f32_content(&[1, 64], &x))]));
    request.metadata_mut().insert("x-sluice-priority", "urgent".parse().expect("metadata"));
    let refused = client.predict(request).await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("x-sluice-priority = \"urgent\": expected high, normal, low"),
        "{}",
        refused.message()
    );
    let body = format!("{{\"instances\": [{x:?}]}}");
    let (status, answer) = rest(&server, "/v1/models/mlp:predict", body, &[("x-sluice-priority", "-1")]).await;
    assert_eq!(status, 400, "{answer}");
    let error = serde_json::from_str::<Value>(&answer).expect("JSON")["error"].to_string();
    assert!(error.contains(r#"x-sluice-priority = \"-1\": expected high, normal, low"#), "{answer}");
    let v2 = |priority: &str| {
        format!(
            r#"{{"parameters": {{"priority": {priority}}}, "inputs": [{{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": {x:?}}}]}}"#
        )
    };
    let (status, answer) = rest(&server, "/v2/models/mlp/infer", v2("\"top\""), &[]).await;
    assert_eq!(status, 400, "{answer}");
    let error = serde_json::from_str::<Value>(&answer).expect("JSON")["error"].to_string();
    assert!(error.contains(r#"parameters.priority is \"top\"; expected an unsigned integer"#), "{answer}");
    let (status, answer) = rest(&server, "/v2/models/mlp/infer", v2("1"), &[]).await;
    assert_eq!(status, 200, "{answer}");
    // The server goes on serving, at every priority.
    for priority in ["high", "normal", "low", "1", "3", "0"] {
        let mut request = tonic::Request::new(predict_request("mlp", vec![("x", f32_content(&[1, 64], &x))]));
        request.metadata_mut().insert("x-sluice-priority", priority.parse().expect("metadata"));
        client.predict(request).await.unwrap_or_else(|e| panic!("priority {priority}: {e}"));
    }
}

/// Serves `count` versionless requests to `model` and counts each version
/// the answers name.
async fn versions_served(server: &Server, model: &str, count: usize) -> [usize; 3] {
    let mut client = server.predict_client().await;
    let x = values(9, 64);
    let mut served = [0usize; 3];
    for _ in 0..count {
        let answer = client.predict(predict_request(model, vec![("x", f32_content(&[1, 64], &x))])).await.expect(model);
        let spec = answer.into_inner().model_spec.expect("model_spec");
        match spec.version_choice {
            Some(sluice::proto::tensorflow::serving::model_spec::VersionChoice::Version(v)) => served[v as usize] += 1,
            other => panic!("no version in the answer: {other:?}"),
        }
    }
    served
}

/// Model `ab`, both example MLP versions, with `labels` (a TOML inline
/// table) and the model-version canary `canary`.
fn canary_of_mlp(labels: &str, canary: &str) -> Fixture {
    Fixture::new(&format!(
        "[[models]]\nname = \"ab\"\nbase_path = \"{}\"\nversion_policy = \"all\"\nversion_labels = {labels}\ncanary = {canary}\n",
        root().join("examples/models/mlp").display()
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_model_version_canary_takes_its_share_of_versionless_requests_and_stable_the_rest() {
    // Both orders: the canary older than stable, and the usual one, the
    // canary newer (where "the rest to the highest version" sent
    // everything to the canary).
    for (stable, canary) in [(2usize, 1usize), (1, 2)] {
        let fixture = canary_of_mlp(
            &format!("{{ stable = {stable}, canary = {canary} }}"),
            "{ label = \"canary\", percent = 20 }",
        );
        let server = fixture.start();
        let served = versions_served(&server, "ab", 3000).await;
        let share = served[canary] as f64 / 3000.0 * 100.0;
        assert!(
            (16.0..=24.0).contains(&share),
            "canary version {canary} served {share:.1}% of versionless requests, not 20% ± 4 ({served:?})"
        );
        assert_eq!(served[stable] + served[canary], 3000, "only the two labelled versions serve: {served:?}");
        // A request that names a version or a label gets exactly that one.
        let mut client = server.predict_client().await;
        let x = values(9, 64);
        for _ in 0..50 {
            let mut request = predict_request("ab", vec![("x", f32_content(&[1, 64], &x))]);
            request.model_spec = spec("ab", Some(stable as i64));
            let answer = client.predict(request).await.expect("ab stable").into_inner();
            assert_eq!(
                answer.model_spec.and_then(|s| s.version_choice),
                Some(sluice::proto::tensorflow::serving::model_spec::VersionChoice::Version(stable as i64))
            );
        }
    }
    // `stable` names another label when the stable one is called otherwise.
    let fixture =
        canary_of_mlp("{ current = 1, next = 2 }", "{ label = \"next\", percent = 10, stable = \"current\" }");
    let server = fixture.start();
    let served = versions_served(&server, "ab", 1000).await;
    assert!(served[1] > served[2] && served[1] + served[2] == 1000, "{served:?}");
    // A canary without a stable label is refused, named, at start: the
    // rest of the traffic must go somewhere said, not to the newest.
    let no_stable = Fixture::new(&format!(
        "[[models]]\nname = \"ab\"\nbase_path = \"{}\"\nversion_policy = \"all\"\n\
         version_labels = {{ canary = 2 }}\ncanary = {{ label = \"canary\", percent = 5 }}\n",
        root().join("examples/models/mlp").display()
    ));
    let text = config_check_fails(&no_stable);
    assert!(text.contains("canary.stable = \"stable\": not among version_labels [\"canary\"]"), "{text}");
    // A canary label that is not a label is refused, named, at start.
    let bad = Fixture::new(&format!(
        "[[models]]\nname = \"ab\"\nbase_path = \"{}\"\ncanary = {{ label = \"nope\", percent = 5 }}\n",
        root().join("examples/models/mlp").display()
    ));
    let text = config_check_fails(&bad);
    assert!(text.contains("canary.label = \"nope\": not among version_labels"), "{text}");
}

/// `sluice config check` on the fixture's config, which must fail; its
/// output.
fn config_check_fails(fixture: &Fixture) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["config", "check", fixture.dir.path().join("sluice.toml").to_str().expect("utf-8")])
        .output()
        .expect("sluice config check");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(!output.status.success(), "config check passed: {text}");
    text
}
