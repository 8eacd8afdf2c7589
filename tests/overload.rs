//! Overload: what a saturated server does with the excess, seen from
//! outside. A flood far over what the example CNN can serve: the answers
//! it gives never waited in the batch queue past the configured bound,
//! the excess is refused (on its HTTP/2 stream, or at admission), a
//! request whose deadline the queue cannot meet is refused at admission
//! saying so, and gRPC's own client sees a refused stream as UNAVAILABLE
//! and retries it on another server with no failure. Behaviour only:
//! the figures are `benches/goodput.rs`'s.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::fixtures::{example_dir, model_table};
use common::*;
use serde_json::Value;
use tonic::Code;

/// The CNN batched to its latency target, with a bound of 20 ms of
/// queueing, and half the places kept for high-priority requests.
fn bounded_cnn(keys: &str) -> String {
    let table = model_table(
        "cnn",
        &example_dir("cnn"),
        &format!("onnx = {{ sessions = 1, intra_op_threads = 1 }}\nbatching = {{ mode = \"auto\" }}\n{keys}"),
    );
    format!("[traffic]\nhigh_priority_reserve = 0.5\n\n{table}")
}

/// The MLP behind an admission so wide that it never refuses: the queue
/// in front of the handlers is the only one.
fn mlp_that_never_refuses() -> Server {
    Server::with_config(&model_table(
        "mlp",
        &example_dir("mlp"),
        "onnx = { sessions = 1, intra_op_threads = 1 }\nmax_in_flight = 1048576\nmax_queue_wait_ms = 60000",
    ))
}

const PREDICT: &str = "/tensorflow.serving.PredictionService/Predict";
const RESOURCE_EXHAUSTED: i32 = 8;

fn image(seed: u64) -> sluice::proto::tensorflow::serving::PredictRequest {
    predict_request("cnn", vec![("image", f32_content(&[1, 3, 32, 32], &values(seed, 3 * 32 * 32)))])
}

/// `(le, count)` of each bucket of the histogram `name` whose other
/// labels are `labels` (the exposition writes `le` first).
fn buckets(text: &str, name: &str, labels: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{le=\"");
    let suffix = format!("\",{labels}}}");
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(&prefix)?;
            let (le, count) = rest.split_once(&suffix)?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, count.trim().parse().ok()?))
        })
        .collect()
}

#[tokio::test]
async fn a_flood_is_refused_and_what_is_served_never_waited_past_the_bound() {
    let server = Server::with_config(&bounded_cnn("max_queue_wait_ms = 20"));
    let codes: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let until = Instant::now() + Duration::from_secs(4);
    let mut flood = tokio::task::JoinSet::new();
    let clients: Vec<_> = futures::future::join_all((0..4).map(|_| server.predict_client())).await;
    // 600 closed loops: far more than the 512 places normal requests may
    // take, so admission refuses, learns the rate, and bounds by time.
    for worker in 0..600u64 {
        let mut client = clients[worker as usize % clients.len()].clone();
        let codes = codes.clone();
        flood.spawn(async move {
            let mut seed = worker;
            while Instant::now() < until {
                seed += 600;
                let outcome = client.predict(with_timeout(image(seed), Duration::from_secs(1))).await;
                let code = outcome.as_ref().map_or_else(|s| s.code(), |_| Code::Ok);
                if code == Code::Unknown || code == Code::Internal {
                    panic!("a flood request failed: {:?}", outcome.err());
                }
                *codes.lock().expect("codes").entry(format!("{code:?}")).or_default() += 1;
                if code != Code::Ok {
                    // A refused client backs off a little, as clients do.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
        });
    }
    // Meanwhile, high-priority requests (they may take every place) due
    // in 10 ms: the queue holds more than that (its bound, 20 ms, and a
    // batch's run).
    // Sent bare, so that no client-side timer (the test's own runtime is
    // busy with the flood) cuts the answer off: what comes back is what
    // the server said.
    let probe = prost::Message::encode_to_vec(&image(7));
    let headers = [("grpc-timeout", "10m"), ("x-sluice-priority", "high")];
    let mut deadline_refusals = Vec::new();
    let mut probes = BTreeMap::<i32, u64>::new();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let early = server.metrics().await;
    while Instant::now() < until - Duration::from_millis(500) {
        let (code, message) = raw_grpc_call(server.grpc, PREDICT, &probe, &headers).await;
        *probes.entry(code).or_default() += 1;
        if message.contains("cannot be answered before its deadline") {
            assert_eq!(code, RESOURCE_EXHAUSTED, "{message}");
            deadline_refusals.push(message);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while let Some(done) = flood.join_next().await {
        done.expect("a flood worker panicked");
    }
    let codes = codes.lock().expect("codes").clone();
    eprintln!("flood: {codes:?}; high-priority 10 ms probes by grpc-status: {probes:?}");
    for code in codes.keys() {
        assert!(["Ok", "ResourceExhausted", "Unavailable"].contains(&code.as_str()), "refused as {code}: {codes:?}");
    }
    assert!(codes.get("Ok").copied().unwrap_or(0) > 100, "the flood was served too: {codes:?}");
    let refused = codes.get("ResourceExhausted").copied().unwrap_or(0) + codes.get("Unavailable").copied().unwrap_or(0);
    assert!(refused > 0, "a flood over the places is refused: {codes:?}");
    let first = deadline_refusals
        .first()
        .unwrap_or_else(|| panic!("no 10 ms request was refused for its deadline: {probes:?}"));
    assert!(first.contains("ms left, and the request queue of model 'cnn' expects"), "{first}");

    // Once the overload stood (the first scrape came 1.5 s in, past the
    // 100 ms a burst may take), every answer left the batch queue within
    // the 20 ms bound and one batch's run (the check is made as its batch
    // leaves); what waited longer was refused.
    let text = server.metrics().await;
    let series = "queue=\"cnn/1/batch\"";
    let (early, late) =
        (buckets(&early, "sluice_queue_wait_seconds", series), buckets(&text, "sluice_queue_wait_seconds", series));
    let waits: Vec<(f64, f64)> =
        late.iter().map(|&(le, n)| (le, n - early.iter().find(|(l, _)| *l == le).map_or(0.0, |(_, m)| *m))).collect();
    let total = waits.iter().find(|(le, _)| le.is_infinite()).map_or(0.0, |(_, n)| *n);
    assert!(total > 0.0, "no batch-queue waits in the metrics after the first 1.5 s:\n{text}");
    let longest_batch = text
        .lines()
        .filter(|line| line.starts_with("sluice_batch_latency_estimate_seconds{model=\"cnn\""))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, f64::max);
    let bound = 0.020 + longest_batch;
    let within = waits.iter().find(|(le, _)| *le >= bound).map_or(total, |(_, n)| *n);
    assert_eq!(within, total, "answers that waited past {bound} s: {waits:?}");
    // Refusals are counted by where they were made.
    let admission = metric_value(&text, "sluice_rejections_total{queue=\"cnn/admission\",reason=\"queue_full\"}");
    let pushed_back = metric_value(&text, "sluice_rejections_total{queue=\"cnn/admission\",reason=\"refused_stream\"}");
    assert!(admission + pushed_back > 0.0, "{text}");

    // And it serves at once afterwards.
    let answer = server.predict_client().await.predict(image(9)).await.expect("served after the flood");
    assert_eq!(dims(&answer.into_inner().outputs["logits"]), vec![1, 10]);
}

/// gRPC's own Python client, `refused.py MODE TARGET WAVES WAVE`: the
/// codes its calls ended with, and a message for each.
fn python_calls(mode: &str, target: &str, waves: usize, wave: usize) -> (BTreeMap<String, u64>, Value) {
    let python = root().join(".cache/kserve-venv/bin/python");
    assert!(python.is_file(), "the gRPC Python client is not installed: run scripts/setup");
    let output = std::process::Command::new(python)
        .arg(root().join("tests/overload/refused.py"))
        .args([mode, target, &waves.to_string(), &wave.to_string()])
        .output()
        .expect("python");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "refused.py failed: {}\n{stdout}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"));
    let codes = report["codes"]
        .as_object()
        .expect("codes")
        .iter()
        .map(|(code, n)| (code.clone(), n.as_u64().unwrap_or(0)))
        .collect();
    (codes, report["messages"].clone())
}

#[tokio::test]
async fn a_refused_stream_is_unavailable_to_grpc_and_retried_on_another_server() {
    // A holds 8 requests at once; B as many as it likes.
    let small = Server::with_config(&bounded_cnn("max_in_flight = 8"));
    let large = Server::with_config(&bounded_cnn(""));
    let refused_streams = "sluice_rejections_total{queue=\"cnn/admission\",reason=\"refused_stream\"}";

    // Alone, with retries off: calls past A's places are refused, and a
    // refused stream reaches the client as UNAVAILABLE.
    // Push-back starts once refusals have gone on for 100 ms without a
    // pause; a loaded machine may pause the client between its waves for
    // longer, so a run without a refused stream is tried again, up to 5.
    let mut attempts = 0;
    let (codes, messages) = loop {
        attempts += 1;
        let (codes, messages) = python_calls("plain", &small.grpc.to_string(), 6, 64);
        eprintln!("A alone, attempt {attempts}: {codes:?} {messages}");
        for code in codes.keys() {
            assert!(["OK", "UNAVAILABLE", "RESOURCE_EXHAUSTED"].contains(&code.as_str()), "{codes:?} {messages}");
        }
        if codes.get("UNAVAILABLE").copied().unwrap_or(0) > 0 || attempts == 5 {
            break (codes, messages);
        }
    };
    assert!(codes.get("UNAVAILABLE").copied().unwrap_or(0) > 0, "no stream was refused: {codes:?} {messages}");
    assert!(small.metric(refused_streams).await > 0.0);

    // Both behind one channel, balanced round robin with a retry policy:
    // every call is answered.
    let before = small.metric(refused_streams).await;
    let read_before = small.metric("sluice_rejections_total{queue=\"cnn/admission\",reason=\"queue_full\"}").await;
    let both = format!("ipv4:{},{}", small.grpc, large.grpc);
    let (codes, messages) = python_calls("retry", &both, 10, 48);
    eprintln!("A and B with retries: {codes:?} {messages}");
    assert_eq!(codes, BTreeMap::from([("OK".to_string(), 480)]), "{messages}");
    let refused_calls = "sluice_rejections_total{queue=\"cnn/admission\",reason=\"queue_full\"}";
    let during = small.metric(refused_streams).await - before + small.metric(refused_calls).await - read_before;
    assert!(during > 0.0, "A refused nothing: the retries were not exercised");
    eprintln!("calls A refused while the retries ran (each retried): {during}");
}

/// A model cheap enough to run on the network thread (the MLP, inline,
/// unbatched) forms no admission queue: its excess
/// queues in front of every handler. A flood of calls sent all at once
/// meets that queue; once it has stood for CoDel's interval, the calls
/// that waited past the target are refused unread with
/// RESOURCE_EXHAUSTED saying so, counted as `late_read`, and the server
/// serves on at once afterwards.
#[tokio::test]
async fn calls_that_waited_too_long_to_be_read_are_refused_unread() {
    let server = mlp_that_never_refuses();
    let x = values(1, 64);
    let request = predict_request("mlp", vec![("x", f32_content(&[1, 64], &x))]);
    // Warm: the cost of a run is learned, so runs are inline.
    for _ in 0..20 {
        server.predict_client().await.predict(request.clone()).await.expect("warm-up");
    }
    let clients: Vec<_> = futures::future::join_all((0..8).map(|_| server.predict_client())).await;
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..8000usize {
        let mut client = clients[i % clients.len()].clone();
        let request = request.clone();
        calls.spawn(async move { client.predict(request).await.map(|_| ()) });
    }
    let mut codes = BTreeMap::<String, u64>::new();
    let mut late = None;
    while let Some(done) = calls.join_next().await {
        let outcome = done.expect("a call panicked");
        let code = outcome.as_ref().map_or_else(|s| s.code(), |_| Code::Ok);
        *codes.entry(format!("{code:?}")).or_default() += 1;
        if let Err(status) = outcome {
            // Refused unread, or (once admission is pressed too) on the
            // stream: never failed otherwise.
            assert!(matches!(status.code(), Code::ResourceExhausted | Code::Unavailable), "{status:?}");
            if status.message().contains("before the server could read it") {
                late.get_or_insert(status.message().to_string());
            }
        }
    }
    eprintln!("8000 calls at once: {codes:?}");
    let message = late.unwrap_or_else(|| panic!("no call was refused for waiting to be read: {codes:?}"));
    assert!(message.contains("the server is overloaded: this call waited"), "{message}");
    assert!(codes.get("Ok").copied().unwrap_or(0) > 0, "{codes:?}");
    let text = server.metrics().await;
    let counted = metric_value(&text, "sluice_rejections_total{queue=\"mlp/admission\",reason=\"late_read\"}");
    assert!(counted > 0.0, "late reads are counted: {text}");
    // Serving at once afterwards.
    server.predict_client().await.predict(request).await.expect("served after the flood");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_calls_that_waited_too_long_to_be_read_are_refused_unread() {
    // As above, over REST: HTTP/1.1 reads a call inside its connection's
    // task, so the wait is the runtime's own, which a probe measures.
    let server = mlp_that_never_refuses();
    let body = serde_json::json!({ "instances": [values(1, 64)] }).to_string();
    let path = "/v1/models/mlp:predict";
    let until = Instant::now() + Duration::from_secs(3);
    let codes: Arc<Mutex<BTreeMap<u16, u64>>> = Arc::default();
    let late: Arc<Mutex<Option<String>>> = Arc::default();
    let mut flood = tokio::task::JoinSet::new();
    // 512 connections, each sending again as soon as it is answered.
    for _ in 0..512 {
        let (codes, late, body) = (codes.clone(), late.clone(), body.clone());
        let mut client = sluice::cli::bench::client::RestClient::new(&server.http.to_string()).expect("client");
        flood.spawn(async move {
            while Instant::now() < until {
                let answer = client.call(http::Method::POST, path, &[], body.clone().into()).await.expect("answered");
                let status = answer.status.as_u16();
                *codes.lock().expect("codes").entry(status).or_default() += 1;
                match status {
                    200 => {}
                    429 if answer.text().contains("before the server could read it") => {
                        late.lock().expect("late").get_or_insert(answer.text());
                    }
                    _ => panic!("a flood call failed with {status}: {}", answer.text()),
                }
            }
        });
    }
    // High-priority calls meanwhile are never refused for the wait.
    let mut high = sluice::cli::bench::client::RestClient::new(&server.http.to_string()).expect("client");
    let mut high_codes = BTreeMap::<u16, u64>::new();
    while Instant::now() < until {
        let answer = high
            .call(http::Method::POST, path, &[("x-sluice-priority", "high")], body.clone().into())
            .await
            .expect("answered");
        *high_codes.entry(answer.status.as_u16()).or_default() += 1;
        assert!(!answer.text().contains("before the server could read it"), "{}", answer.text());
    }
    while let Some(done) = flood.join_next().await {
        done.expect("a flood connection panicked");
    }
    let codes = codes.lock().expect("codes").clone();
    eprintln!("512 REST connections for 3 s: {codes:?}; high priority: {high_codes:?}");
    let message = late.lock().expect("late").clone();
    let message = message.unwrap_or_else(|| panic!("no REST call was refused for waiting to be read: {codes:?}"));
    assert!(message.contains("the server is overloaded: this call waited"), "{message}");
    assert!(codes.get(&200).copied().unwrap_or(0) > 0, "{codes:?}");
    assert!(high_codes.get(&200).copied().unwrap_or(0) > 0, "{high_codes:?}");
    let text = server.metrics().await;
    let counted = metric_value(&text, "sluice_rejections_total{queue=\"mlp/admission\",reason=\"late_read\"}");
    assert!(counted > 0.0, "late reads are counted: {text}");
    // Serving at once afterwards.
    let answer = high.call(http::Method::POST, path, &[], body.into()).await.expect("answered");
    assert_eq!(answer.status.as_u16(), 200, "served after the flood: {}", answer.text());
}
