//! Seeing every request, through the real server: TF Serving's request
//! logging (read back by TensorFlow's own `tf.data.TFRecordDataset`),
//! replaying a log with `sluice bench --requests-from`, turning it into a
//! warmup file with `sluice warmup make`, a log directory that vanishes,
//! and OpenTelemetry traces received by an OTLP collector started here.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::fixtures::example_model_table;
use common::otlp::Collector;
use common::*;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::Value;

const WRITTEN: &str = "sluice_request_log_records_total{model=\"mlp\",outcome=\"written\"}";

fn mlp_request(seed: u64, rows: i64) -> sluice::proto::tensorflow::serving::PredictRequest {
    predict_request("mlp", vec![("x", f32_content(&[rows, 64], &values(seed, rows as usize * 64)))])
}

/// A TF Serving model config file (text format) logging every request of
/// the MLP under `prefix`.
fn text_config(dir: &Path, prefix: &Path, rate: f64) -> std::path::PathBuf {
    let path = dir.join("models.config");
    let text = format!(
        r#"model_config_list {{
  config {{
    name: "mlp"
    base_path: "{base}"
    model_platform: "tensorflow"
    logging_config {{
      log_collector_config {{ type: "" filename_prefix: "{prefix}" }}
      sampling_config {{ sampling_rate: {rate} }}
    }}
  }}
}}
"#,
        base = root().join("examples/models/mlp").display(),
        prefix = prefix.display(),
    );
    std::fs::write(&path, text).expect("write the model config");
    path
}

/// What TensorFlow reads from the log files starting with `prefix`: one
/// JSON object per record.
fn read_with_tensorflow(prefix: &Path) -> Vec<Value> {
    let python = root().join(".cache/tf-venv/bin/python");
    assert!(python.exists(), "TensorFlow is needed: run scripts/setup");
    let script = r#"
import glob, json, sys
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2
files = sorted(glob.glob(sys.argv[1] + "-*.tfrecord"))
out = []
for raw in tf.data.TFRecordDataset(files):
    log = prediction_log_pb2.PredictionLog.FromString(raw.numpy())
    request, response = log.predict_log.request, log.predict_log.response
    x = tf.make_ndarray(request.inputs["x"])
    logits = tf.make_ndarray(response.outputs["logits"])
    out.append({
        "model": request.model_spec.name,
        "version": request.model_spec.version.value,
        "x_shape": list(x.shape),
        "x": [float(v) for v in x.flatten()[:3]],
        "logits": [float(v) for v in logits.flatten()],
        "tags": list(log.log_metadata.saved_model_tags),
        "rate": log.log_metadata.sampling_config.sampling_rate,
        "timestamp": log.log_metadata.timestamp_secs,
    })
print(json.dumps(out))
"#;
    let output = Command::new(python)
        .args(["-c", script])
        .arg(prefix)
        .env("TF_CPP_MIN_LOG_LEVEL", "3")
        .output()
        .expect("run python");
    assert!(output.status.success(), "TensorFlow could not read the log: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("the script prints JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logged_requests_of_every_api_are_prediction_logs_tensorflow_reads() {
    let dir = tempfile::tempdir().expect("temp dir");
    let prefix = dir.path().join("logs/mlp");
    let config = text_config(dir.path(), &prefix, 1.0);
    let server = Server::start(&["--model_config_file", config.to_str().expect("utf-8")]);
    let mut client = server.predict_client().await;
    let mut sent = Vec::new();
    for (seed, rows) in [(1u64, 1i64), (2, 3), (3, 2)] {
        let response = client.predict(mlp_request(seed, rows)).await.expect("predict").into_inner();
        sent.push((rows, values(seed, rows as usize * 64), f32_values(&response.outputs["logits"])));
    }
    // REST (TF Serving's and KServe v2's) are logged in the same form.
    let x: Vec<f32> = values(4, 64);
    let body = serde_json::json!({ "instances": [x] }).to_string();
    let rest = http_post(server.http, "/v1/models/mlp:predict", &body).await;
    assert!(rest.contains("predictions"), "{rest}");
    let v2 = serde_json::json!({
        "inputs": [{ "name": "x", "datatype": "FP32", "shape": [1, 64], "data": values(5, 64) }]
    })
    .to_string();
    let answer = http_post(server.http, "/v2/models/mlp/infer", &v2).await;
    assert!(answer.contains("\"outputs\""), "{answer}");
    server.wait_for_metric(WRITTEN, 5.0).await;

    let records = read_with_tensorflow(&prefix);
    assert_eq!(records.len(), 5, "{records:?}");
    for (record, (rows, x, logits)) in records.iter().zip(&sent) {
        assert_eq!(record["model"], "mlp");
        assert_eq!(record["version"], 2, "the version that answered is recorded");
        assert_eq!(record["x_shape"], serde_json::json!([rows, 64]));
        let logged_x: Vec<f32> = serde_json::from_value(record["x"].clone()).expect("x");
        assert_eq!(&logged_x[..], &x[..3]);
        let logged_logits: Vec<f32> = serde_json::from_value(record["logits"].clone()).expect("logits");
        assert_close(&logged_logits, logits, 0.0, "the logged answer is the answer sent");
        assert_eq!(record["tags"], serde_json::json!(["serve"]));
        assert_eq!(record["rate"], 1.0);
        assert!(record["timestamp"].as_i64().expect("timestamp") > 1_700_000_000);
    }
    let logged_x: Vec<f32> = serde_json::from_value(records[3]["x"].clone()).expect("x");
    assert_eq!(&logged_x[..], &x[..3], "the REST request is logged");
    let logged_x: Vec<f32> = serde_json::from_value(records[4]["x"].clone()).expect("x");
    assert_eq!(&logged_x[..], &values(5, 64)[..3], "the KServe v2 request is logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_sampling_rate_logs_a_share_of_requests() {
    let dir = tempfile::tempdir().expect("temp dir");
    let prefix = dir.path().join("logs/mlp");
    let server = Server::with_config(&format!(
        r#"
[[models]]
name = "mlp"
base_path = "$ROOT/examples/models/mlp"
logging = {{ filename_prefix = "{}", sampling_rate = 0.25 }}
"#,
        prefix.display()
    ));
    let mut client = server.predict_client().await;
    for seed in 0..400 {
        client.predict(mlp_request(seed, 1)).await.expect("predict");
    }
    // Every sampled record was queued before its answer went out; the log
    // has drained once the files hold as many records as the writer
    // counted, the same at two reads 100 ms apart.
    let records_on_disk = || -> usize {
        let files = sluice::pipeline::request_log::log_files(&prefix).expect("log files");
        files
            .iter()
            .map(|f| sluice::models::tfrecord::records(&std::fs::read(f).expect("read")).expect("TFRecord").len())
            .sum()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut last = None;
    let count = loop {
        let counted = server.metric(WRITTEN).await;
        let seen = (counted, records_on_disk());
        if counted > 0.0 && seen.1 as f64 == counted && last == Some(seen) {
            break counted;
        }
        assert!(std::time::Instant::now() < deadline, "the log did not settle: {seen:?}");
        last = Some(seen);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // 100 expected; 4 standard deviations (8.7 each) either way.
    assert!((65.0..=135.0).contains(&count), "{count} of 400 requests logged at a rate of 0.25");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanishing_log_directory_stops_logging_and_serving_goes_on() {
    let dir = tempfile::tempdir().expect("temp dir");
    let logs = dir.path().join("logs");
    let config = text_config(dir.path(), &logs.join("mlp"), 1.0);
    let server = Server::start(&["--model_config_file", config.to_str().expect("utf-8")]);
    let mut client = server.predict_client().await;
    client.predict(mlp_request(1, 1)).await.expect("predict");
    server.wait_for_metric(WRITTEN, 1.0).await;
    std::fs::remove_dir_all(&logs).expect("remove the log directory");
    for seed in 0..20 {
        client.predict(mlp_request(seed, 1)).await.expect("serving goes on without its log");
    }
    server.wait_for_metric("sluice_request_log_failures_total{model=\"mlp\"}", 1.0).await;
    server.wait_for_log("the request log stopped").await;
    let dropped = server.metric("sluice_request_log_records_total{model=\"mlp\",outcome=\"dropped_failing\"}").await;
    assert!(dropped >= 1.0, "records dropped while the log fails are counted");
    // Back once the directory is: the log tries again a few seconds on.
    std::fs::create_dir_all(&logs).expect("make the log directory again");
    let written = server.metric(WRITTEN).await;
    eventually("logging to resume", || {
        let runtime = tokio::runtime::Handle::current();
        let (grpc, metrics) = tokio::task::block_in_place(|| {
            runtime.block_on(async {
                let mut client = server.predict_client().await;
                let ok = client.predict(mlp_request(99, 1)).await.is_ok();
                (ok, server.metric(WRITTEN).await)
            })
        });
        std::thread::sleep(Duration::from_millis(250));
        if grpc && metrics > written {
            Ok(())
        } else {
            Err(format!("written {metrics}"))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_replays_as_load_and_becomes_a_checked_warmup_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let prefix = dir.path().join("logs/mlp");
    let config = text_config(dir.path(), &prefix, 1.0);
    let server = Server::start(&["--model_config_file", config.to_str().expect("utf-8")]);
    let mut client = server.predict_client().await;
    for seed in 0..12u64 {
        client.predict(mlp_request(seed, 1 + (seed % 3) as i64)).await.expect("predict");
    }
    server.wait_for_metric(WRITTEN, 12.0).await;
    let prefix_arg = prefix.to_str().expect("utf-8");

    // A warmup file for a copy of version 2, checked and run before it is written.
    let version = dir.path().join("mlp/2");
    std::fs::create_dir_all(&version).expect("version dir");
    std::fs::copy(example_model("mlp", 2), version.join("model.onnx")).expect("copy the model");
    let version_arg = version.to_str().expect("utf-8");
    let (code, stdout, stderr) =
        run_sluice(&["warmup", "make", prefix_arg, "--model", version_arg, "--max-records", "5"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("5 of 12 logged requests"), "{stdout}");
    let file = version.join("assets.extra/tf_serving_warmup_requests");
    let bytes = std::fs::read(&file).expect("the warmup file");
    assert_eq!(sluice::models::tfrecord::records(&bytes).expect("TFRecord").len(), 5);
    let (code, _, stderr) = run_sluice(&["warmup", "make", prefix_arg, "--model", version_arg]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("exists; give --force"), "{stderr}");
    // The server warms the version up with it.
    let copy =
        Server::start(&["--model_name", "mlp", "--model_base_path", dir.path().join("mlp").to_str().expect("utf-8")]);
    let line = copy.wait_for_log("warmed up").await;
    assert!(line.contains("requests=5") && line.contains("tf_serving_warmup_requests"), "{line}");

    // Replay (logged again as it is served): every request answered.
    let url = server.grpc_url();
    let (code, stdout, stderr) = run_sluice(&[
        "bench",
        "--target",
        &url,
        "--requests-from",
        prefix_arg,
        "--duration",
        "1s",
        "--warmup",
        "0s",
        "--concurrency",
        "2",
        "--connections",
        "1",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let summary: Value = serde_json::from_str(&stdout).expect("bench prints JSON");
    assert!(summary["requests"].as_u64().unwrap_or(0) >= 12, "{summary}");
    assert_eq!(summary["ok"], summary["requests"], "every replayed request is answered: {summary}");
    assert_eq!(summary["errors"], serde_json::json!({}), "{summary}");

    // A model the log does not fit is refused, naming the request.
    let cnn = dir.path().join("cnn/1");
    std::fs::create_dir_all(&cnn).expect("cnn dir");
    std::fs::copy(example_model("cnn", 1), cnn.join("model.onnx")).expect("copy the cnn");
    let (code, _, stderr) = run_sluice(&["warmup", "make", prefix_arg, "--model", cnn.to_str().expect("utf-8")]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("logged request 0 does not fit"), "{stderr}");

    // A damaged log is refused by both, naming the file and the record.
    let files = sluice::pipeline::request_log::log_files(&prefix).expect("log files");
    let mut damaged = std::fs::read(&files[0]).expect("read the log");
    let at = damaged.len() / 2;
    damaged[at] ^= 0xff;
    let bad = dir.path().join("bad.tfrecord");
    std::fs::write(&bad, &damaged).expect("write the damaged log");
    let bad_arg = bad.to_str().expect("utf-8");
    let (code, _, stderr) = run_sluice(&["bench", "--target", &url, "--requests-from", bad_arg, "--duration", "1s"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("bad.tfrecord") && stderr.contains("record "), "{stderr}");
    let (code, _, stderr) = run_sluice(&["warmup", "make", bad_arg, "--model", version_arg, "--force"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("record ") && stderr.contains("checksum"), "{stderr}");
    let (code, _, stderr) = run_sluice(&["warmup", "make", "/nonexistent/log", "--model", version_arg, "--force"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("no such log file"), "{stderr}");
}

#[test]
fn bad_logging_configs_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cases = [
        (
            "log_collector_config { filename_prefix: \"logs/mlp\" } sampling_config { sampling_rate: 2 }",
            "sampling_rate = 2: must be between 0 and 1",
        ),
        ("log_collector_config { type: \"kafka\" filename_prefix: \"x\" }", "type = \"kafka\": no such log collector"),
        ("log_collector_config { type: \"\" } sampling_config { sampling_rate: 1 }", "filename_prefix is missing"),
    ];
    for (logging, expected) in cases {
        let path = dir.path().join("bad.config");
        std::fs::write(
            &path,
            format!("model_config_list {{ config {{ name: 'mlp' base_path: 'x' logging_config {{ {logging} }} }} }}"),
        )
        .expect("write");
        let (code, _, stderr) = run_sluice(&["config", "check", path.to_str().expect("utf-8")]);
        assert_eq!(code, Some(1), "{logging}");
        assert!(stderr.contains(expected), "{logging}: {stderr}");
    }
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes.iter().find(|kv| kv.key == key).and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
        AnyValue::StringValue(s) => Some(s.clone()),
        AnyValue::IntValue(i) => Some(i.to_string()),
        other => Some(format!("{other:?}")),
    })
}

fn traceparent(trace: u8, sampled: bool) -> (String, Vec<u8>, Vec<u8>) {
    let trace_id = vec![trace; 16];
    let parent = vec![0xab; 8];
    let header = format!("00-{}-{}-{}", hex(&trace_id), hex(&parent), if sampled { "01" } else { "00" });
    (header, trace_id, parent)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn within(child: &Span, parent: &Span) -> bool {
    child.start_time_unix_nano >= parent.start_time_unix_nano
        && child.end_time_unix_nano <= parent.end_time_unix_nano
        && child.end_time_unix_nano >= child.start_time_unix_nano
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_reach_an_otlp_collector_as_a_tree_of_stages() {
    let plugins = root().join("target/plugins");
    assert!(plugins.join("scale.wasm").is_file(), "the plugins are not built: run scripts/build-plugins");
    let (collector, endpoint) = Collector::start(true).await;
    let server = Server::with_config(&format!(
        r#"
[tracing]
otlp_endpoint = "{endpoint}"
sampling_ratio = 0.0
export_interval_ms = 100

[plugins]
dir = "{plugins}"

{mlp_table}
batching = {{ max_batch_size = 2, batch_timeout_micros = 200000 }}

[[pipelines]]
name = "scale"
model = "mlp"
preprocess = {{ plugin = "scale", workers = 1 }}
"#,
        mlp_table = example_model_table("mlp"),
        plugins = plugins.display()
    ));

    // Two traced requests at once share a batch; then one the caller did
    // not sample and one without a traceparent (ratio 0), not traced.
    let (sampled_a, trace_a, parent_a) = traceparent(0x11, true);
    let (sampled_b, trace_b, _) = traceparent(0x22, true);
    let (unsampled, trace_c, _) = traceparent(0x33, false);
    let call = |header: Option<String>, seed: u64| {
        let url = server.grpc_url();
        async move {
            let mut client =
                sluice::proto::tensorflow::serving::prediction_service_client::PredictionServiceClient::connect(url)
                    .await
                    .expect("connect");
            let mut request =
                tonic::Request::new(predict_request("scale", vec![("x", f32_content(&[1, 64], &values(seed, 64)))]));
            if let Some(header) = header {
                request.metadata_mut().insert("traceparent", header.parse().expect("ascii"));
            }
            client.predict(request).await.expect("predict")
        }
    };
    let (a, b) = tokio::join!(call(Some(sampled_a), 1), call(Some(sampled_b), 2));
    let (c, d) = tokio::join!(call(Some(unsampled), 3), call(None, 4));
    drop((a, b, c, d));
    // A traced REST request, and one that fails.
    let (rest_header, trace_r, _) = traceparent(0x44, true);
    let body = serde_json::json!({ "instances": [values(5, 64)] }).to_string();
    let answer = http_post_with(server.http, "/v1/models/mlp:predict", &body, &[("traceparent", &rest_header)]).await;
    assert!(answer.contains("predictions"), "{answer}");
    let (bad_header, trace_e, _) = traceparent(0x55, true);
    let bad = serde_json::json!({ "instances": [[1.0, 2.0]] }).to_string();
    let answer = http_post_with(server.http, "/v1/models/mlp:predict", &bad, &[("traceparent", &bad_header)]).await;
    assert!(answer.contains("error"), "{answer}");

    let spans = eventually("the spans of both traced gRPC requests", || {
        std::thread::sleep(Duration::from_millis(100));
        let (a, b) = (collector.of_trace(&trace_a), collector.of_trace(&trace_b));
        let done = |spans: &[Span]| spans.iter().any(|s| s.name == "predict");
        if done(&a) && done(&b) && !collector.of_trace(&trace_r).is_empty() && !collector.of_trace(&trace_e).is_empty()
        {
            Ok((a, b))
        } else {
            Err(format!("{} and {} spans so far", a.len(), b.len()))
        }
    })
    .await;
    let (a, b) = spans;
    assert!(collector.of_trace(&trace_c).is_empty(), "a request its caller did not sample is not traced");
    let all = collector.spans();
    let traces: std::collections::HashSet<&Vec<u8>> = all.iter().map(|s| &s.trace_id).collect();
    assert_eq!(traces.len(), 4, "only the four sampled requests are traced (ratio 0)");

    // The tree of request A: its root is the caller's span's child.
    let by_name =
        |spans: &[Span], name: &str| -> Vec<Span> { spans.iter().filter(|s| s.name == name).cloned().collect() };
    let root = by_name(&a, "predict").pop().expect("the request span");
    assert_eq!(root.parent_span_id, parent_a, "the request span continues the caller's trace");
    assert_eq!(attribute(&root, "sluice.model").as_deref(), Some("scale"));
    assert_eq!(attribute(&root, "sluice.version").as_deref(), Some("2"));
    let children: HashMap<String, Span> =
        a.iter().filter(|s| s.parent_span_id == root.span_id).map(|s| (s.name.clone(), s.clone())).collect();
    for step in ["admission", "preprocess", "inference", "encode"] {
        let span = children.get(step).unwrap_or_else(|| panic!("no {step} span under the request: {children:?}"));
        assert!(within(span, &root), "{step} lies within the request");
    }
    let preprocess = &children["preprocess"];
    let under_preprocess: Vec<&Span> = a.iter().filter(|s| s.parent_span_id == preprocess.span_id).collect();
    let names: Vec<&str> = under_preprocess.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&"queue_wait"), "{names:?}");
    assert!(names.contains(&"plugin scale"), "the plugin's run is a span named after it: {names:?}");
    for span in under_preprocess {
        assert!(within(span, preprocess), "{} lies within preprocess", span.name);
    }
    let inference = &children["inference"];
    let queue = a.iter().find(|s| s.name == "batch_queue").expect("the batch queue wait");
    assert_eq!(queue.parent_span_id, inference.span_id);
    assert!(within(queue, inference));
    // The two requests ran in one batch: one batch span, linked to both.
    let batches: Vec<Span> = a.iter().chain(b.iter()).filter(|s| s.name == "batch").cloned().collect();
    assert_eq!(batches.len(), 1, "one batch for both requests: {batches:?}");
    let batch = &batches[0];
    assert_eq!(attribute(batch, "sluice.rows").as_deref(), Some("2"));
    let linked: Vec<&Vec<u8>> = batch.links.iter().map(|l| &l.trace_id).collect();
    assert!(linked.contains(&&trace_a) && linked.contains(&&trace_b), "the batch links both requests");
    let root_b = by_name(&b, "predict").pop().expect("request B");
    assert!(
        root_b.end_time_unix_nano >= batch.end_time_unix_nano || root.end_time_unix_nano >= batch.end_time_unix_nano
    );

    let rest = collector.of_trace(&trace_r);
    let rest_root = rest.iter().find(|s| s.name == "predict").expect("the REST request span");
    assert_eq!(attribute(rest_root, "sluice.entrypoint").as_deref(), Some("rest"));
    let failed = collector.of_trace(&trace_e);
    let failed_root = failed.iter().find(|s| s.name == "predict").expect("the failed request span");
    let status = failed_root.status.as_ref().expect("a status");
    assert_eq!(status.code, 2, "the failed request's span is an error: {status:?}");
    assert!(status.message.contains("INVALID_ARGUMENT"), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_reload_turns_the_request_log_on_moves_it_and_turns_it_off() {
    use sluice::proto::tensorflow::serving::{
        model_server_config, LogCollectorConfig, LoggingConfig, ModelConfig, ModelConfigList, ModelServerConfig,
        ReloadConfigRequest, SamplingConfig,
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let server = Server::start(&["--model_name", "mlp", "--model_base_path", "examples/models/mlp"]);
    let reload = |prefix: Option<&Path>| ReloadConfigRequest {
        config: Some(ModelServerConfig {
            config: Some(model_server_config::Config::ModelConfigList(ModelConfigList {
                config: vec![ModelConfig {
                    name: "mlp".into(),
                    base_path: root().join("examples/models/mlp").display().to_string(),
                    logging_config: prefix.map(|prefix| LoggingConfig {
                        log_collector_config: Some(LogCollectorConfig {
                            r#type: String::new(),
                            filename_prefix: prefix.display().to_string(),
                        }),
                        sampling_config: Some(SamplingConfig { sampling_rate: 1.0 }),
                    }),
                    ..ModelConfig::default()
                }],
            })),
        }),
    };
    let mut models = server.model_client().await;
    let mut client = server.predict_client().await;
    client.predict(mlp_request(1, 1)).await.expect("predict");
    assert_eq!(server.metric(WRITTEN).await, 0.0, "no log before the reload");
    let (first, second) = (dir.path().join("a/mlp"), dir.path().join("b/mlp"));
    models.handle_reload_config_request(reload(Some(&first))).await.expect("reload with a log");
    client.predict(mlp_request(2, 1)).await.expect("predict");
    server.wait_for_metric(WRITTEN, 1.0).await;
    models.handle_reload_config_request(reload(Some(&second))).await.expect("reload moving the log");
    client.predict(mlp_request(3, 2)).await.expect("predict");
    server.wait_for_metric(WRITTEN, 2.0).await;
    models.handle_reload_config_request(reload(None)).await.expect("reload without a log");
    client.predict(mlp_request(4, 1)).await.expect("predict");
    // A third log and one more request: the writer writes in order, so
    // once that request's record is written, a record of the one before
    // would have been too, had it been logged.
    let third = dir.path().join("c/mlp");
    models.handle_reload_config_request(reload(Some(&third))).await.expect("reload with a third log");
    client.predict(mlp_request(5, 1)).await.expect("predict");
    server.wait_for_metric(WRITTEN, 3.0).await;
    let count = |prefix: &Path| -> usize {
        let files = sluice::pipeline::request_log::log_files(prefix).expect("log files");
        files
            .iter()
            .map(|f| sluice::models::tfrecord::records(&std::fs::read(f).expect("read")).expect("TFRecord").len())
            .sum()
    };
    assert_eq!(
        (count(&first), count(&second), count(&third)),
        (1, 1, 1),
        "each log holds the requests of its time, and none the request made while the log was off"
    );
}
