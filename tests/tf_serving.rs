//! TF Serving compatibility where sluice once answered wrongly: models
//! whose inputs share no batch dimension (run exactly as sent, never
//! padded to another input's rows, batching on or off), and inputs of
//! unknown rank (any rank accepted, `unknown_rank: true` in metadata).

mod common;

use bytes::Bytes;
use common::*;
use http::{Method, StatusCode};
use prost::Message;
use serde_json::{json, Value};
use sluice::cli::bench::client::RestClient;
use sluice::proto::tensorflow::serving::{GetModelMetadataRequest, SignatureDefMap};

fn config(batching: bool) -> String {
    let batching = if batching { "batching = { max_batch_size = 8, batch_timeout_micros = 100 }" } else { "" };
    format!(
        r#"
[[models]]
name = "unshared"
base_path = "$ROOT/tests/fixtures/models/unshared"
{batching}

[[models]]
name = "anyrank"
base_path = "$ROOT/tests/fixtures/models/anyrank"

[[models]]
name = "tfjson"
base_path = "$ROOT/tests/fixtures/models/tfjson"
"#
    )
}

async fn rest_post(server: &Server, path: &str, body: Value) -> (StatusCode, Value) {
    let mut client = RestClient::new(&server.http.to_string()).expect("REST client");
    let response = client.call(Method::POST, path, &[], Bytes::from(body.to_string())).await.expect("REST call");
    (response.status, serde_json::from_slice(&response.body).unwrap_or(Value::Null))
}

#[tokio::test]
async fn inputs_without_a_shared_batch_dimension_run_exactly_as_sent() {
    for batching in [false, true] {
        let server = Server::with_config(&config(batching));
        let mut client = server.predict_client().await;
        // b with fewer, equal and more rows than a: its mean must be its
        // own, never padded with zeros to a's two rows.
        for b in [vec![5.0f32], vec![1.5, 2.5], vec![1.0, 2.0, 3.0]] {
            let response = client
                .predict(predict_request(
                    "unshared",
                    vec![("a", f32_content(&[2], &[1.0, 2.0])), ("b", f32_content(&[b.len() as i64], &b))],
                ))
                .await
                .unwrap_or_else(|e| panic!("batching {batching}, b = {b:?}: {e}"))
                .into_inner();
            assert_eq!(f32_values(&response.outputs["a_twice"]), vec![2.0, 4.0], "batching {batching}");
            let mean = b.iter().sum::<f32>() / b.len() as f32;
            assert_eq!(f32_values(&response.outputs["b_mean"]), vec![mean], "batching {batching}");
        }
        // REST, columnar, with tensors of different first dimensions.
        let (status, answer) = rest_post(
            &server,
            "/v1/models/unshared:predict",
            json!({ "inputs": { "a": [1.0, 2.0], "b": [1.0, 2.0, 3.0] } }),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "batching {batching}: {answer}");
        assert_eq!(answer["outputs"]["a_twice"], json!([2.0, 4.0]), "{answer}");
        assert_eq!(answer["outputs"]["b_mean"], json!([2.0]), "{answer}");
    }
}

#[tokio::test]
async fn an_input_of_unknown_rank_takes_any_rank_and_says_so_in_metadata() {
    let server = Server::with_config(&config(false));
    let mut client = server.predict_client().await;
    for dims in [vec![], vec![3], vec![2, 3], vec![1, 2, 2]] {
        let n: i64 = dims.iter().product();
        let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let response = client
            .predict(predict_request("anyrank", vec![("x", f32_content(&dims, &x))]))
            .await
            .unwrap_or_else(|e| panic!("shape {dims:?}: {e}"))
            .into_inner();
        let want: Vec<f32> = x.iter().map(|v| v + 1.0).collect();
        assert_eq!(f32_values(&response.outputs["y"]), want, "shape {dims:?}");
        assert_eq!(dims_of(&response.outputs["y"]), dims, "shape {dims:?}");
    }
    let metadata = client
        .get_model_metadata(GetModelMetadataRequest {
            model_spec: spec("anyrank", None),
            metadata_field: vec!["signature_def".into()],
        })
        .await
        .expect("metadata")
        .into_inner();
    let defs = SignatureDefMap::decode(metadata.metadata["signature_def"].value.as_slice()).expect("SignatureDefMap");
    let x = &defs.signature_def["serving_default"].inputs["x"];
    assert!(x.tensor_shape.as_ref().is_some_and(|s| s.unknown_rank && s.dim.is_empty()), "{x:?}");
    let mut rest = RestClient::new(&server.http.to_string()).expect("REST client");
    let response = rest.call(Method::GET, "/v1/models/anyrank/metadata", &[], Bytes::new()).await.expect("metadata");
    let json: Value = serde_json::from_slice(&response.body).expect("JSON");
    let shape = &json["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]["x"]["tensor_shape"];
    assert_eq!(shape["unknown_rank"], json!(true), "{json}");
}

fn dims_of(tensor: &sluice::proto::tensorflow::TensorProto) -> Vec<i64> {
    tensor.tensor_shape.as_ref().map(|s| s.dim.iter().map(|d| d.size).collect()).unwrap_or_default()
}

#[tokio::test]
async fn rest_ignores_top_level_keys_tf_serving_ignores_and_metadata_echoes_the_signature_name() {
    let server = Server::with_config(&config(false));
    let (status, answer) = rest_post(
        &server,
        "/v1/models/unshared:predict",
        json!({ "inputs": { "a": [1.0, 2.0], "b": [4.0] }, "extra": 1, "request_id": "x" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["outputs"]["b_mean"], json!([4.0]), "{answer}");

    let mut client = server.predict_client().await;
    for signature_name in ["", "serving_default"] {
        let mut model_spec = spec("unshared", None).expect("spec");
        model_spec.signature_name = signature_name.to_string();
        let metadata = client
            .get_model_metadata(GetModelMetadataRequest {
                model_spec: Some(model_spec),
                metadata_field: vec!["signature_def".into()],
            })
            .await
            .expect("metadata")
            .into_inner();
        assert_eq!(metadata.model_spec.expect("model_spec").signature_name, signature_name);
    }
    let mut rest = RestClient::new(&server.http.to_string()).expect("REST client");
    let response = rest.call(Method::GET, "/v1/models/unshared/metadata", &[], Bytes::new()).await.expect("metadata");
    let json: Value = serde_json::from_slice(&response.body).expect("JSON");
    assert_eq!(json["metadata"]["signature_def"]["signature_def"]["serving_default"]["defaults"], json!({}), "{json}");
}

#[tokio::test]
async fn rest_json_writes_bytes_outputs_as_b64_and_non_finite_floats_as_tf_serving_does() {
    let server = Server::with_config(&config(false));
    let mut rest = RestClient::new(&server.http.to_string()).expect("REST client");
    // What Python's json.dumps writes for float("nan") and float("inf").
    for (body, form) in [
        (r#"{"inputs": {"x": [[NaN, Infinity, -Infinity, 1.5]], "s": ["hi"]}}"#, "outputs"),
        (r#"{"instances": [{"x": [NaN, Infinity, -Infinity, 1.5], "s": "hi"}]}"#, "predictions"),
    ] {
        let response =
            rest.call(Method::POST, "/v1/models/tfjson:predict", &[], Bytes::from(body)).await.expect("predict");
        let text = response.text();
        assert_eq!(response.status, StatusCode::OK, "{body}: {text}");
        assert!(text.contains("[NaN,Infinity,-Infinity,1.5]"), "{form}: {text}");
        assert!(text.contains(r#"{"b64":"aGk="}"#), "{form}: {text}");
        assert!(text.contains(form), "{text}");
    }
    // Inside strings the words are text, not numbers.
    let response = rest
        .call(
            Method::POST,
            "/v1/models/tfjson:predict",
            &[],
            Bytes::from(r#"{"inputs": {"x": [[1, 2, 3, 4]], "s": ["NaN, Infinity"]}}"#),
        )
        .await
        .expect("predict");
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    assert!(response.text().contains("TmFOLCBJbmZpbml0eQ=="), "{}", response.text());
}

#[tokio::test]
async fn tf_servings_command_line_and_config_files_start_sluice_unchanged() {
    let dir = tempfile::tempdir().expect("temp dir");
    let models = dir.path().join("models.config");
    std::fs::write(
        &models,
        format!(
            "model_config_list {{\n  config {{\n    name: 'mlp'\n    base_path: '{}'\n    model_platform: 'tensorflow'\n    \
             model_version_policy {{ specific {{ versions: 1 versions: 2 }} }}\n    version_labels {{ key: 'stable' value: 1 }}\n  }}\n}}\n",
            root().join("examples/models/mlp").display()
        ),
    )
    .expect("write model config");
    let monitoring = dir.path().join("monitoring.config");
    std::fs::write(&monitoring, "prometheus_config { enable: true, path: \"/monitoring/tf\" }\n").expect("write");
    let socket = dir.path().join("grpc.sock");
    let flag = |name: &str, value: &std::path::Path| format!("--{name}={}", value.display());
    let server = Server::start(&[
        &flag("model_config_file", &models),
        &flag("grpc_socket_path", &socket),
        &flag("monitoring_config_file", &monitoring),
        "--grpc_channel_arguments=grpc.max_send_message_length=1048576,grpc.keepalive_time_ms=1000",
        "--rest_api_timeout_in_ms=30000",
        "--rest_api_num_threads=4",
        "--tensorflow_session_parallelism=1",
        "--tensorflow_intra_op_parallelism=1",
        "--tensorflow_inter_op_parallelism=1",
        "--enable_model_warmup=true",
        "--file_system_poll_wait_seconds=1",
        "--model_config_file_poll_wait_seconds=0",
        "--enable_batching=true",
        // Every other flag of TF Serving's main.cc: those sluice implements
        // and those it accepts without effect, named in one warning.
        "--allow_version_labels_for_unavailable_models=false",
        "--max_num_load_retries=3",
        "--load_retry_interval_micros=30000000",
        "--num_request_iterations_for_warmup=2",
        "--flush_filesystem_caches=true",
        "--enable_grpc_healthcheck_service",
        "--enable_signature_method_name_check=false",
        "--enable_per_model_batching_parameters=false",
        "--enable_profiler=true",
        "--grpc_max_threads=8",
        "--mixed_precision=",
        "--num_tflite_interpreters_per_pool=1",
        "--num_tflite_pools=1",
        "--num_unload_threads=0",
        "--per_process_gpu_memory_fraction=0",
        "--platform_config_file=",
        "--prefer_tflite_model=false",
        "--remove_unused_fields_from_bundle_metagraph=true",
        "--rest_api_enable_cors_support=false",
        "--skip_initialize_tpu=true",
        "--tensorflow_session_config_file=",
        "--thread_pool_factory_config_file=",
        "--use_alts_credentials=false",
        "--xla_cpu_compilation_enabled=false",
        "--xla_gpu_compilation_enabled=false",
    ]);
    let warned = server.wait_for_log("TF Serving flags with no effect in sluice").await;
    for flag in ["--grpc_max_threads=8", "--use_alts_credentials=false", "--enable_signature_method_name_check=false"] {
        assert!(warned.contains(flag), "{flag} is named: {warned}");
    }
    let x = values(3, 64);
    let request = || {
        let mut request = predict_request("mlp", vec![("x", f32_content(&[1, 64], &x))]);
        request.model_spec.as_mut().expect("spec").version_choice =
            Some(sluice::proto::tensorflow::serving::model_spec::VersionChoice::VersionLabel("stable".into()));
        request
    };
    let over_tcp = server.predict_client().await.predict(request()).await.expect("predict over TCP").into_inner();
    assert_eq!(dims_of(&over_tcp.outputs["logits"]), vec![1, 10]);

    // The same services on the Unix socket.
    let path = socket.clone();
    let channel = tonic::transport::Endpoint::try_from("http://[::]:1")
        .expect("endpoint")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
        .expect("connect to the Unix socket");
    let mut unix = sluice::proto::tensorflow::serving::prediction_service_client::PredictionServiceClient::new(channel);
    let over_unix = unix.predict(request()).await.expect("predict over the Unix socket").into_inner();
    assert_eq!(f32_values(&over_unix.outputs["logits"]), f32_values(&over_tcp.outputs["logits"]));

    // A request TF Serving refuses, over gRPC, and one over REST.
    let mut bad = request();
    bad.inputs.insert("nope".into(), f32_content(&[1, 1], &[0.0]));
    server.predict_client().await.predict(bad).await.expect_err("an input the model lacks");
    let body = format!("{{\"instances\": [{:?}]}}", x);
    let answer = http_post(server.http, "/v1/models/mlp/labels/stable:predict", &body).await;
    assert!(answer.contains("predictions"), "{answer}");

    // Metrics on the path the monitoring config names.
    let scraped = http_get(server.http, "/monitoring/tf").await;
    assert!(scraped.contains("sluice_serving_request_count"), "{scraped}");
    // TF Serving's own families, as its exporter writes them: the series a
    // dashboard or alert written for TF Serving selects exist with these
    // exact label sets (a Prometheus selector matches them all).
    let sample = |selector: &str| -> f64 {
        let line = scraped
            .lines()
            .find(|line| line.starts_with(selector) && line[selector.len()..].starts_with(' '))
            .unwrap_or_else(|| panic!("no series {selector} in {scraped}"));
        line[selector.len()..].trim().parse().expect("a number")
    };
    assert_eq!(sample(r#":tensorflow:serving:request_count{model_name="mlp",status="OK"}"#), 3.0);
    assert_eq!(sample(r#":tensorflow:serving:request_count{model_name="mlp",status="INVALID_ARGUMENT"}"#), 1.0);
    // Latency of successful calls only, TF Serving's API and entry point
    // names, in microseconds.
    let grpc = r#"{model_name="mlp",API="Predict",entrypoint="GRPC"}"#;
    assert_eq!(sample(&format!(":tensorflow:serving:request_latency_count{grpc}")), 2.0);
    let rest = r#"{model_name="mlp",API="predict",entrypoint="REST"}"#;
    assert_eq!(sample(&format!(":tensorflow:serving:request_latency_count{rest}")), 1.0);
    let micros = sample(&format!(":tensorflow:serving:request_latency_sum{grpc}"));
    assert!(micros > 1.0 && micros < 60e6, "two calls took {micros} µs in all");
    let buckets = scraped
        .lines()
        .filter(|line| {
            line.starts_with(":tensorflow:serving:request_latency_bucket{") && line.contains(&grpc[1..grpc.len() - 1])
        })
        .count();
    assert_eq!(buckets, 34, "TF Serving's 33 bounds and +Inf");
    // Every wait in a batch queue, as sluice's own batch queues count them.
    let batch_waits: f64 = scraped
        .lines()
        .filter(|line| line.starts_with("sluice_queue_wait_seconds_count{queue=\"mlp/") && line.contains("/batch\"}"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    let tf_waits = sample(r#":tensorflow:serving:batching_session:queuing_latency_count{thread_pool_name=""}"#);
    assert_eq!(tf_waits, batch_waits, "batch queue waits under TF Serving's name and sluice's");
    // Loads and warmups by the version's directory, as TensorFlow's loader
    // and TF Serving's warmup label them.
    let version_dir = root().join("examples/models/mlp/1").display().to_string();
    let path = format!("model_path=\"{version_dir}\"");
    assert_eq!(sample(&format!(":tensorflow:cc:saved_model:load_attempt_count{{{path},status=\"success\"}}")), 1.0);
    assert!(sample(&format!(":tensorflow:cc:saved_model:load_latency{{{path}}}")) > 0.0);
    assert_eq!(sample(&format!(":tensorflow:serving:model_warmup_latency_count{{{path},status=\"OK\"}}")), 1.0);
    assert!(scraped.ends_with("# EOF\n"), "the exposition still ends with # EOF");
}
