//! Dynamic batching, backpressure and deadlines, through the real server:
//! every request gets exactly its own rows, padding never leaks, full
//! queues refuse at once, and expired or cancelled requests never reach
//! the model (the model's run counter says so).

mod common;

use std::time::{Duration, Instant};

use common::fixtures::example_model_table;
use common::*;
use tonic::Code;

const TOLERANCE: f32 = 1e-5;

fn mlp_config(batching: &str) -> String {
    format!("{}batching = {{ {batching} }}\n", example_model_table("mlp"))
}

async fn mlp_answer(server: &Server, rows: i64, seed: u64) -> Result<Vec<f32>, tonic::Status> {
    let mut client = server.predict_client().await;
    let x = values(seed, rows as usize * 64);
    let response = client.predict(predict_request("mlp", vec![("x", f32_content(&[rows, 64], &x))])).await?;
    let logits = &response.into_inner().outputs["logits"];
    assert_eq!(dims(logits), vec![rows, 10], "each request gets exactly its own rows");
    let (_, want) = reference(&example_model("mlp", 2), vec![("x", RefInput::F32(vec![rows, 64], x))], "logits");
    assert_close(&f32_values(logits), &want, TOLERANCE, &format!("request of {rows} rows (seed {seed})"));
    Ok(f32_values(logits))
}

#[tokio::test]
async fn concurrent_mixed_batch_sizes_each_get_their_own_rows_and_padding_never_leaks() {
    let server = Server::with_config(&mlp_config(
        "max_batch_size = 16, batch_timeout_micros = 5000, allowed_batch_sizes = [4, 8, 16], num_batch_threads = 1",
    ));
    // A lone request of 3 rows is padded to 4.
    mlp_answer(&server, 3, 999).await.expect("lone request");
    let server = std::sync::Arc::new(server);
    let mut tasks = Vec::new();
    let mut total_rows = 3.0;
    for i in 0..48u64 {
        let rows = 1 + (i % 5) as i64;
        total_rows += rows as f64;
        let server = server.clone();
        tasks.push(tokio::spawn(async move { mlp_answer(&server, rows, i).await }));
    }
    for task in tasks {
        task.await.expect("task").expect("predict");
    }
    let metrics = server.metrics().await;
    let series = r#"{model="mlp",version="2"}"#;
    let batches = metric_value(&metrics, &format!("sluice_batch_rows_count{series}"));
    let rows = metric_value(&metrics, &format!("sluice_batch_rows_sum{series}"));
    assert_eq!(rows, total_rows, "every row went through the batcher once");
    assert!(batches < 49.0, "49 requests ran in {batches} batches: requests were batched together");
    assert!(metric_value(&metrics, &format!("sluice_padding_rows_total{series}")) >= 1.0, "{metrics}");
}

#[tokio::test]
async fn a_lone_request_is_flushed_after_batch_timeout_micros() {
    let server = Server::with_config(&mlp_config("max_batch_size = 32, batch_timeout_micros = 300000"));
    let started = Instant::now();
    mlp_answer(&server, 2, 5).await.expect("the lone request is answered");
    assert!(started.elapsed() >= Duration::from_millis(300), "it waited for company for the whole timeout");
    let batches = server.metric(r#"sluice_batch_rows_count{model="mlp",version="2"}"#).await;
    assert_eq!(batches, 1.0);
}

#[tokio::test]
async fn a_request_larger_than_max_batch_size_is_split_and_reassembled_in_order() {
    let server = Server::with_config(&mlp_config("max_batch_size = 8, batch_timeout_micros = 0"));
    mlp_answer(&server, 21, 77).await.expect("split request");
    let metrics = server.metrics().await;
    let batches = metric_value(&metrics, r#"sluice_batch_rows_count{model="mlp",version="2"}"#);
    assert!(batches >= 3.0, "21 rows at most 8 per batch need 3 batches, ran {batches}");
    // A request larger than the whole queue can never fit: refused, clearly.
    let status = mlp_answer(&server, 8 * 16 + 1, 78).await.expect_err("larger than the queue");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("129 rows"), "{}", status.message());
}

/// A server that always reads a call before refusing it, so that every
/// refusal carries its message (the transport's refusals carry none).
const NO_PUSH_BACK: &str = "[server]\npush_back = false\n";

fn cnn_config(batching: &str, max_in_flight: usize) -> String {
    format!(
        r#"
[[models]]
name = "cnn"
base_path = "$ROOT/examples/models/cnn"
max_in_flight = {max_in_flight}
onnx = {{ sessions = 1, intra_op_threads = 1 }}
batching = {{ {batching} }}
"#
    )
}

fn cnn_request(rows: i64, seed: u64) -> (sluice::proto::tensorflow::serving::PredictRequest, Vec<f32>) {
    let image = values(seed, rows as usize * 3 * 32 * 32);
    (predict_request("cnn", vec![("image", f32_content(&[rows, 3, 32, 32], &image))]), image)
}

fn check_cnn(rows: i64, image: Vec<f32>, response: &sluice::proto::tensorflow::serving::PredictResponse) {
    let (_, want) =
        reference(&example_model("cnn", 1), vec![("image", RefInput::F32(vec![rows, 3, 32, 32], image))], "logits");
    assert_close(&f32_values(&response.outputs["logits"]), &want, TOLERANCE, "accepted request");
}

async fn burst(server: &Server, requests: u64, rows: i64) -> (usize, Vec<tonic::Status>) {
    let mut tasks = Vec::new();
    for i in 0..requests {
        let mut client = server.predict_client().await;
        tasks.push(tokio::spawn(async move {
            let (request, image) = cnn_request(rows, i);
            (client.predict(request).await, image)
        }));
    }
    let mut answered = 0;
    let mut refused = Vec::new();
    for task in tasks {
        match task.await.expect("task") {
            (Ok(response), image) => {
                check_cnn(rows, image, response.get_ref());
                answered += 1;
            }
            (Err(status), _) => refused.push(status),
        }
    }
    (answered, refused)
}

#[tokio::test]
async fn a_burst_against_a_tiny_batch_queue_gets_resource_exhausted_for_the_excess() {
    let server = Server::with_config(&cnn_config(
        "max_batch_size = 128, max_enqueued_batches = 1, num_batch_threads = 1, batch_timeout_micros = 0",
        1024,
    ));
    let (answered, refused) = burst(&server, 12, 128).await;
    assert!(answered >= 1, "some requests are answered");
    assert!(!refused.is_empty(), "a queue of one batch cannot hold 12 batches");
    for status in &refused {
        assert_eq!(status.code(), Code::ResourceExhausted, "{}", status.message());
        assert!(status.message().contains("the batch queue of model 'cnn' version 1 is full"), "{}", status.message());
    }
    let counted = server.metric(r#"sluice_rejections_total{queue="cnn/1/batch",reason="queue_full"}"#).await;
    assert_eq!(counted, refused.len() as f64);
    // And it keeps serving.
    let (request, image) = cnn_request(2, 500);
    let response = server.predict_client().await.predict(request).await.expect("after the burst");
    check_cnn(2, image, response.get_ref());
}

#[tokio::test]
async fn a_burst_beyond_max_in_flight_is_refused_at_admission() {
    // Refused with the message, never at the transport, however long
    // the burst takes to send.
    let server = Server::with_config(&format!(
        "{NO_PUSH_BACK}{}",
        cnn_config("max_batch_size = 256, batch_timeout_micros = 0", 2)
    ));
    let (answered, refused) = burst(&server, 12, 256).await;
    assert!(answered >= 1);
    assert!(!refused.is_empty());
    for status in &refused {
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(status.message().contains("the request queue of model 'cnn' is full"), "{}", status.message());
    }
    let counted = server.metric(r#"sluice_rejections_total{queue="cnn/admission",reason="queue_full"}"#).await;
    assert_eq!(counted, refused.len() as f64);
}

/// Starts a request that keeps the only session busy for a while, and
/// returns once the model is running it.
async fn occupy(server: &Server) -> tokio::task::JoinHandle<()> {
    let mut client = server.predict_client().await;
    let (request, _) = cnn_request(2048, 1);
    let handle = tokio::spawn(async move {
        client.predict(request).await.expect("the blocker is answered");
    });
    let batches = r#"sluice_batch_rows_count{model="cnn",version="1"}"#;
    server.wait_for_metric(batches, 1.0).await;
    handle
}

const RUNS: &str = r#"sluice_model_runs_total{model="cnn",version="1"}"#;
const PREDICT: &str = "/tensorflow.serving.PredictionService/Predict";
const DEADLINE_EXCEEDED: i32 = 4;

fn encoded_cnn_request(rows: i64, seed: u64) -> Vec<u8> {
    use prost::Message;
    cnn_request(rows, seed).0.encode_to_vec()
}

#[tokio::test]
async fn expired_deadlines_get_deadline_exceeded_and_never_reach_the_model() {
    let server = Server::with_config(&cnn_config("max_batch_size = 4096, batch_timeout_micros = 0", 64));
    let runs_before = server.metric(RUNS).await;

    // Expired by the time the server looks at it.
    let (code, message) =
        raw_grpc_call(server.grpc, PREDICT, &encoded_cnn_request(1, 2), &[("grpc-timeout", "1u")]).await;
    assert_eq!(code, DEADLINE_EXCEEDED, "{message}");
    assert!(message.contains("deadline exceeded"), "{message}");

    // Expiring while queued behind a long batch.
    let blocker = occupy(&server).await;
    let mut waiting = Vec::new();
    for i in 0..5u64 {
        let addr = server.grpc;
        waiting.push(tokio::spawn(async move {
            raw_grpc_call(addr, PREDICT, &encoded_cnn_request(1, 10 + i), &[("grpc-timeout", "40m")]).await
        }));
    }
    for task in waiting {
        let (code, message) = task.await.expect("task");
        assert_eq!(code, DEADLINE_EXCEEDED, "{message}");
        assert!(message.contains("deadline exceeded"), "{message}");
    }
    blocker.await.expect("blocker");
    // The batcher drops the expired entries as it reaches them.
    server.wait_for_metric(r#"sluice_rejections_total{queue="cnn/1/batch",reason="cancelled"}"#, 5.0).await;
    let runs_after = server.metric(RUNS).await;
    assert_eq!(runs_after - runs_before, 1.0, "only the blocker ran; the expired requests never reached the model");
    let dropped = server.metric(r#"sluice_rejections_total{queue="cnn/1/batch",reason="cancelled"}"#).await;
    assert_eq!(dropped, 5.0, "the five expired requests were dropped from the batch queue");
}

#[tokio::test]
async fn a_cancelled_request_is_dropped_before_it_runs() {
    let server = Server::with_config(&cnn_config("max_batch_size = 4096, batch_timeout_micros = 0", 64));
    let runs_before = server.metric(RUNS).await;
    let blocker = occupy(&server).await;
    let mut client = server.predict_client().await;
    let cancelled = tokio::spawn(async move {
        let (request, _) = cnn_request(1, 3);
        let _ = client.predict(request).await;
    });
    let queued = r#"sluice_queue_depth{queue="cnn/1/batch"}"#;
    server.wait_for_metric(queued, 1.0).await;
    cancelled.abort();
    let _ = cancelled.await;
    blocker.await.expect("blocker");
    server.wait_for_metric(r#"sluice_rejections_total{queue="cnn/1/batch",reason="cancelled"}"#, 1.0).await;
    assert_eq!(server.metric(RUNS).await - runs_before, 1.0, "the cancelled request never ran");
    let dropped = server.metric(r#"sluice_rejections_total{queue="cnn/1/batch",reason="cancelled"}"#).await;
    assert_eq!(dropped, 1.0);
}

#[tokio::test]
async fn tf_serving_batching_parameters_file_is_read() {
    let server = Server::start(&[
        "--model_name",
        "mlp",
        "--model_base_path",
        "examples/models/mlp",
        "--enable_batching",
        "--batching_parameters_file",
        "tests/fixtures/batching_parameters.txt",
    ]);
    mlp_answer(&server, 3, 1).await.expect("predict");
    let metrics = server.metrics().await;
    // allowed_batch_sizes 4, 8 in the file: 3 rows are padded to 4.
    assert_eq!(metric_value(&metrics, r#"sluice_padding_rows_total{model="mlp",version="2"}"#), 1.0, "{metrics}");
    mlp_answer(&server, 8, 2).await.expect("predict");
    let status = mlp_answer(&server, 8 * 2 + 1, 3).await.expect_err("more rows than 2 batches of 8");
    assert_eq!(status.code(), Code::ResourceExhausted);
}

#[test]
fn a_bad_batching_parameters_file_is_refused_with_the_key_and_allowed_keys_named() {
    let dir = tempfile::tempdir().expect("dir");
    let cases = [
        ("max_batch_sise { value: 8 }\n", vec!["max_batch_sise", "allowed keys", "max_batch_size"]),
        ("max_batch_size { value: -1 }\n", vec!["max_batch_size", "positive integer"]),
        ("max_batch_size { value: 8 }\nallowed_batch_sizes: 4\n", vec!["allowed_batch_sizes", "max_batch_size (8)"]),
    ];
    for (i, (text, says)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad-{i}.txt"));
        std::fs::write(&path, text).expect("write");
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["serve", "--port", "0", "--rest_api_port", "0", "--model_name", "mlp"])
            .args(["--model_base_path", "examples/models/mlp", "--enable_batching", "--batching_parameters_file"])
            .arg(&path)
            .current_dir(root())
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "case {i} started");
        assert!(stderr.contains(&format!("bad-{i}.txt")), "case {i}: {stderr}");
        for fragment in says {
            assert!(stderr.contains(fragment), "case {i}: {fragment:?} not in {stderr}");
        }
    }
}

#[tokio::test]
async fn enable_batching_without_a_file_batches_in_auto_mode_row_for_row() {
    let server = std::sync::Arc::new(Server::start(&[
        "--model_name",
        "mlp",
        "--model_base_path",
        "examples/models/mlp",
        "--enable_batching",
    ]));
    let mut total_rows = 0.0;
    for wave in 0..4u64 {
        let mut tasks = Vec::new();
        for i in 0..48u64 {
            let rows = 1 + (i % 5) as i64;
            total_rows += rows as f64;
            let server = server.clone();
            // Each answer is compared with ONNX Runtime's on the request alone.
            tasks.push(tokio::spawn(async move { mlp_answer(&server, rows, wave * 100 + i).await }));
        }
        for task in tasks {
            task.await.expect("task").expect("predict");
        }
    }
    let metrics = server.metrics().await;
    let series = r#"{model="mlp",version="2"}"#;
    assert_eq!(metric_value(&metrics, &format!("sluice_batch_rows_sum{series}")), total_rows, "{metrics}");
    // The plan and the learned curve are exported: warmup measured the
    // model at 1, 2, 4, … 32 rows (auto mode's default largest batch).
    assert!(metric_value(&metrics, &format!("sluice_batch_auto_cap_rows{series}")) >= 1.0, "{metrics}");
    assert!(metrics.contains(&format!("sluice_batch_arrival_rows_per_second{series}")), "{metrics}");
    for size in [1, 2, 4, 8, 16, 32] {
        let point = format!(r#"sluice_batch_latency_estimate_seconds{{model="mlp",version="2",batch_size="{size}"}}"#);
        assert!(metric_value(&metrics, &point) > 0.0, "{point} missing: {metrics}");
    }
}

#[tokio::test]
async fn a_full_pipeline_refuses_before_decoding_what_it_would_refuse() {
    let server = Server::with_config(&format!(
        "{NO_PUSH_BACK}{}",
        cnn_config("max_batch_size = 4096, batch_timeout_micros = 0", 1)
    ));
    let blocker = occupy(&server).await;
    // REST names the model in the URL: a full pipeline refuses before the
    // body is read. This body is announced and never sent; the answer
    // comes anyway.
    let rest = tokio::time::timeout(Duration::from_secs(10), async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(server.http).await.expect("connect");
        let head = "POST /v1/models/cnn:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                    Content-Length: 50000000\r\n\r\n";
        stream.write_all(head.as_bytes()).await.expect("write the head");
        let mut answer = vec![0u8; 4096];
        let n = stream.read(&mut answer).await.expect("read");
        String::from_utf8_lossy(&answer[..n]).into_owned()
    })
    .await
    .expect("a full pipeline answers without waiting for the body");
    assert!(rest.starts_with("HTTP/1.1 429"), "{rest}");
    assert!(rest.contains("the request queue of model 'cnn' is full"), "{rest}");
    let mut client = server.predict_client().await;
    // A tensor whose bytes do not match its shape: a decoding error, had
    // it been decoded. The full pipeline refuses it first.
    let mut bad = f32_content(&[1, 3, 32, 32], &values(1, 3 * 32 * 32));
    bad.tensor_content = bad.tensor_content.slice(..100);
    let refused = client.predict(predict_request("cnn", vec![("image", bad.clone())])).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("the request queue of model 'cnn' is full"), "{}", refused.message());
    // A request that names an input the model does not have is the
    // client's mistake whatever the load: named before admission.
    let misnamed = client.predict(predict_request("cnn", vec![("pixels", bad.clone())])).await.unwrap_err();
    assert_eq!(misnamed.code(), Code::InvalidArgument, "{misnamed:?}");
    blocker.await.expect("the blocker");
    // With room again, the same bad tensor is decoded and its fault named.
    let invalid = client.predict(predict_request("cnn", vec![("image", bad)])).await.unwrap_err();
    assert_eq!(invalid.code(), Code::InvalidArgument, "{invalid:?}");
    assert!(invalid.message().contains("image"), "{}", invalid.message());
}

#[test]
fn sluice_bench_shows_what_the_auto_batcher_chose() {
    let server =
        Server::start(&["--model_name", "mlp", "--model_base_path", "examples/models/mlp", "--enable_batching"]);
    let bench = |extra: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["bench", "--model", "mlp", "--duration", "1s", "--warmup", "0s", "--concurrency", "8"])
            .args(["--target", &format!("http://{}", server.grpc)])
            .args(["--metrics", &format!("http://{}/metrics", server.http)])
            .args(extra)
            .current_dir(root())
            .output()
            .expect("run sluice bench");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let text = bench(&[]);
    assert!(text.contains("auto batching of mlp/2: waits for"), "{text}");
    assert!(text.contains("learned ms per batch by size: 1: "), "{text}");
    let json: serde_json::Value = serde_json::from_str(&bench(&["--json"])).expect("JSON");
    let batchers = json["auto_batching"].as_array().expect("auto_batching");
    assert_eq!(batchers[0]["version"], "mlp/2", "{json}");
    assert!(batchers[0]["cap_rows"].as_f64().unwrap_or(0.0) >= 1.0, "{json}");
    assert!(json["requests"].as_u64().unwrap_or(0) > 0, "{json}");
}
