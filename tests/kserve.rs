//! The Open Inference Protocol (KServe v2) against the real server, with
//! the official Python clients (`tritonclient`, gRPC and HTTP;
//! `tests/kserve/clients.py` calls, this file checks): liveness,
//! readiness, server and model metadata, and inference on every example
//! model and pipeline four ways (gRPC raw and typed contents, HTTP JSON
//! and binary) — each answer equal to TF Serving's Predict for the same
//! input on the same server — then output selection, versions, and bad
//! requests with their codes and messages, the server serving throughout.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use base64::Engine;
use bytes::Bytes;
use common::fixtures::{example_model_table, EXAMPLE_FEATURE_TABLES, RECOMMEND_PIPELINE};
use common::*;
use http::Method;
use prost::Message;
use serde_json::{json, Value};
use sluice::cli::bench::client::RestClient;
use sluice::proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use sluice::proto::inference::model_infer_request::InferInputTensor;
use sluice::proto::inference::{InferTensorContents, ModelInferRequest};
use sluice::proto::tensorflow::serving::{GetModelMetadataRequest, PredictRequest, SignatureDefMap};
use sluice::proto::tensorflow::TensorProto;
use sluice::tensor::{DType, Tensor, TensorData};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

fn python() -> std::path::PathBuf {
    let python = root().join(".cache/kserve-venv/bin/python");
    assert!(python.is_file(), "the KServe v2 test clients are not installed: run scripts/setup");
    python
}

fn config() -> String {
    let plugins = root().join("target/plugins");
    assert!(plugins.join("image_normalize.wasm").is_file(), "the plugins are not built: run scripts/build-plugins");
    format!(
        r#"
[plugins]
dir = "{plugins}"

[[models]]
name = "mlp"
base_path = "$ROOT/examples/models/mlp"
version_policy = "all"
version_labels = {{ stable = 1, canary = 2 }}
onnx = {{ sessions = 1, intra_op_threads = 1 }}

{cnn_table}

{recommender_table}

[[models]]
name = "dtypes"
base_path = "$ROOT/tests/fixtures/models/dtypes"
onnx = {{ sessions = 1, intra_op_threads = 1 }}

[[models]]
name = "tfjson"
base_path = "$ROOT/tests/fixtures/models/tfjson"
onnx = {{ sessions = 1, intra_op_threads = 1 }}

[[pipelines]]
name = "classify"
model = "cnn"
[pipelines.preprocess]
image_normalize = {{ input = "pixels", mean = [0.485, 0.456, 0.406], std = [0.229, 0.224, 0.225] }}
[pipelines.postprocess]
top_k = {{ k = 3, softmax = true, labels = "$ROOT/examples/cnn-labels.txt" }}

[[pipelines]]
name = "classify-wasm"
model = "cnn"
preprocess = {{ plugin = "image_normalize" }}
postprocess = {{ plugin = "topk_labels" }}

{RECOMMEND_PIPELINE}
{EXAMPLE_FEATURE_TABLES}
"#,
        recommender_table = example_model_table("recommender"),
        cnn_table = example_model_table("cnn"),
        plugins = plugins.display()
    )
}

/// Every name served, with what its inputs are called, typed and shaped.
const ENDPOINTS: &[&str] = &["mlp", "cnn", "recommender", "dtypes", "tfjson", "classify", "classify-wasm", "recommend"];

/// One input of a case: the v2 form the Python clients send.
#[derive(Clone)]
struct Input {
    name: String,
    dtype: DType,
    shape: Vec<i64>,
    /// JSON values (numbers, booleans; BYTES as base64).
    data: Vec<Value>,
}

impl Input {
    fn json(&self) -> Value {
        json!({
            "name": self.name,
            "datatype": sluice::tensor::v2::datatype(self.dtype),
            "shape": self.shape,
            "data": self.data,
        })
    }

    /// The same values as a TF Serving TensorProto.
    fn proto(&self) -> TensorProto {
        let tensor = match self.dtype {
            DType::String => Tensor::from_strings(
                self.shape.clone(),
                self.data.iter().map(|v| Bytes::from(B64.decode(v.as_str().expect("b64")).expect("b64"))).collect(),
            )
            .expect("strings"),
            dtype => sluice::tensor::v2::decode_json(
                dtype,
                self.shape.clone(),
                &Value::Array(self.data.clone()),
                1 << 30,
                "case",
            )
            .expect("a case's own data"),
        };
        sluice::tensor::proto::encode(&tensor, sluice::config::OutputEncoding::TensorContent)
    }
}

/// Values for input `name` of `dtype`, `count` of them, that every model
/// and pipeline here accepts.
fn data(name: &str, dtype: DType, count: usize, seed: usize) -> Vec<Value> {
    (0..count)
        .map(|i| {
            let n = i + seed;
            match dtype {
                DType::String => {
                    let text = match name {
                        "user_id" => format!("u{}", n % 200),
                        "item_id" => format!("i{}", (n * 37) % 500),
                        _ => format!("s{n}-é"),
                    };
                    json!(B64.encode(text))
                }
                DType::Bool => json!(n.is_multiple_of(3)),
                DType::F32 | DType::F64 | DType::F16 => json!(((n * 37 % 101) as f64 - 50.0) / 8.0),
                DType::I8 | DType::I16 | DType::I32 | DType::I64 => json!((n % 11) as i64 - 5),
                _ => json!(n % 200),
            }
        })
        .collect()
}

/// Inputs for every input of `endpoint`, from its TF Serving signature.
async fn inputs_of(server: &Server, endpoint: &str, seed: usize) -> Vec<Input> {
    let mut client = server.predict_client().await;
    let metadata = client
        .get_model_metadata(GetModelMetadataRequest {
            model_spec: spec(endpoint, None),
            metadata_field: vec!["signature_def".into()],
        })
        .await
        .unwrap_or_else(|e| panic!("{endpoint} metadata: {e}"))
        .into_inner();
    let defs = SignatureDefMap::decode(metadata.metadata["signature_def"].value.as_slice()).expect("SignatureDefMap");
    let mut inputs: Vec<Input> = defs.signature_def["serving_default"]
        .inputs
        .iter()
        .map(|(name, info)| {
            let dtype = DType::from_tf(info.dtype).expect("a served dtype");
            let dims: Vec<i64> =
                info.tensor_shape.as_ref().map(|s| s.dim.iter().map(|d| d.size).collect()).unwrap_or_default();
            let shape: Vec<i64> = dims.iter().map(|&d| if d < 0 { 2 } else { d }).collect();
            let count = shape.iter().product::<i64>() as usize;
            Input { name: name.clone(), dtype, data: data(name, dtype, count, seed), shape }
        })
        .collect();
    inputs.sort_by(|a, b| a.name.cmp(&b.name));
    inputs
}

/// An output as the Python report gives it: datatype, shape, flat values.
fn output_json(tensor: &Tensor) -> Value {
    let data: Vec<Value> = match tensor.data() {
        TensorData::Strings(strings) => strings.iter().map(|s| json!(B64.encode(s))).collect(),
        TensorData::Fixed(_) => {
            let text = serde_json::to_value(sluice::tensor::json::JsonView::whole(&sluice::tensor::v2::flat(tensor)))
                .expect("json");
            text.as_array().expect("flat").clone()
        }
    };
    json!({ "datatype": sluice::tensor::v2::datatype(tensor.dtype()), "shape": tensor.shape(), "data": data })
}

/// What Predict answers for `inputs`, outputs as the report writes them.
async fn predict(server: &Server, endpoint: &str, version: Option<i64>, inputs: &[Input]) -> BTreeMap<String, Value> {
    let mut client = server.predict_client().await;
    let request = PredictRequest {
        model_spec: spec(endpoint, version),
        inputs: inputs.iter().map(|i| (i.name.clone(), i.proto())).collect(),
        output_filter: vec![],
    };
    let response = client.predict(request).await.unwrap_or_else(|e| panic!("{endpoint} Predict: {e}")).into_inner();
    response
        .outputs
        .into_iter()
        .map(|(name, proto)| {
            let tensor = sluice::tensor::proto::decode(&name, proto, 1 << 30).expect("decode");
            (name, output_json(&tensor))
        })
        .collect()
}

/// Asserts two outputs agree: datatype and shape exactly, values within
/// float rounding.
fn assert_same(got: &Value, want: &Value, what: &str) {
    assert_eq!(got["datatype"], want["datatype"], "{what}: datatype");
    assert_eq!(got["shape"], want["shape"], "{what}: shape");
    let (got, want) = (got["data"].as_array().expect("data"), want["data"].as_array().expect("data"));
    assert_eq!(got.len(), want.len(), "{what}: value count");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        match (g.as_f64(), w.as_f64()) {
            (Some(g), Some(w)) => assert!((g - w).abs() <= 1e-6 * w.abs().max(1.0), "{what}: value {i}: {g} vs {w}"),
            _ => assert_eq!(g, w, "{what}: value {i}"),
        }
    }
}

/// A failed call as the report gives it: its code contains `code`, its
/// message every part.
fn assert_failed(entry: &Value, code: &str, parts: &[&str], what: &str) {
    assert_eq!(entry["ok"], json!(false), "{what}: succeeded: {entry}");
    let got = entry["code"].as_str().unwrap_or("");
    assert!(got.contains(code), "{what}: code {got}, expected {code}: {entry}");
    let message = entry["message"].as_str().unwrap_or("");
    for part in parts {
        assert!(message.contains(part), "{what}: {part:?} not in {message:?}");
    }
}

fn case(model: &str, version: &str, inputs: &[Input], outputs: &[&str]) -> Value {
    json!({
        "model": model,
        "version": version,
        "inputs": inputs.iter().map(Input::json).collect::<Vec<_>>(),
        "outputs": outputs,
    })
}

#[tokio::test]
async fn the_official_kserve_clients_get_what_predict_answers_for_every_model_and_pipeline() {
    let python = python();
    let server = Server::with_config(&config());
    let mut cases = Vec::new();
    let mut expected = Vec::new();
    for (seed, endpoint) in ENDPOINTS.iter().enumerate() {
        let inputs = inputs_of(&server, endpoint, seed * 13).await;
        expected.push(predict(&server, endpoint, None, &inputs).await);
        cases.push(case(endpoint, "", &inputs, &[]));
    }
    // A version by number, and outputs selected (and ordered) by name.
    let mlp = inputs_of(&server, "mlp", 5).await;
    expected.push(predict(&server, "mlp", Some(1), &mlp).await);
    cases.push(case("mlp", "1", &mlp, &[]));
    let dtypes = inputs_of(&server, "dtypes", 7).await;
    let mut selected = predict(&server, "dtypes", None, &dtypes).await;
    selected.retain(|name, _| name == "out_u16" || name == "out_s");
    expected.push(selected);
    cases.push(case("dtypes", "", &dtypes, &["out_u16", "out_s"]));
    let good = cases.len();

    // Bad requests: (case, gRPC code, HTTP status, message parts).
    let mut wrong_type = mlp.clone();
    wrong_type[0].dtype = DType::F64;
    let mut wrong_shape = mlp.clone();
    wrong_shape[0].shape = vec![2, 63];
    wrong_shape[0].data.truncate(126);
    let mut wrong_name = mlp.clone();
    wrong_name[0].name = "y".into();
    let bad: Vec<(Value, &str, &str, Vec<&str>)> = vec![
        (case("mlp", "", &wrong_type, &[]), "INVALID_ARGUMENT", "400", vec!["'x'", "FP64", "FP32"]),
        (case("mlp", "", &wrong_shape, &[]), "INVALID_ARGUMENT", "400", vec!["'x'", "63", "64"]),
        (case("mlp", "", &wrong_name, &[]), "INVALID_ARGUMENT", "400", vec!["unexpected input 'y'", "[x]"]),
        (case("nope", "", &mlp, &[]), "NOT_FOUND", "404", vec!["'nope'", "served"]),
        (case("mlp", "9", &mlp, &[]), "NOT_FOUND", "404", vec!["9"]),
        (case("mlp", "x", &mlp, &[]), "INVALID_ARGUMENT", "400", vec!["\"x\"", "version"]),
        (case("mlp", "", &mlp, &["scores"]), "INVALID_ARGUMENT", "400", vec!["'scores'", "logits"]),
    ];
    for (c, ..) in &bad {
        cases.push(c.clone());
    }

    let dir = tempfile::tempdir().expect("temp dir");
    let cases_path = dir.path().join("cases.json");
    let models: Vec<&str> = ENDPOINTS.iter().copied().chain(["nope"]).collect();
    std::fs::write(&cases_path, json!({ "models": models, "infer": cases }).to_string()).expect("write cases");
    let output = Command::new(python)
        .arg(root().join("tests/kserve/clients.py"))
        .arg(&cases_path)
        .arg(server.grpc.to_string())
        .arg(server.http.to_string())
        .output()
        .expect("run the Python clients");
    assert!(output.status.success(), "clients.py failed:\n{}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).expect("the report is JSON");

    for transport in ["grpc", "http"] {
        let server_report = &report[transport];
        assert_eq!(server_report["live"], json!(true), "{transport} live");
        assert_eq!(server_report["ready"], json!(true), "{transport} ready");
        assert_eq!(server_report["metadata"]["name"], json!("sluice"), "{transport} metadata");
        assert!(server_report["metadata"]["extensions"].to_string().contains("binary_tensor_data"));
    }
    for endpoint in ENDPOINTS {
        let model = &report["models"][endpoint];
        assert_eq!(model["grpc_ready"], json!(true), "{endpoint} ready over gRPC");
        assert_eq!(model["http_ready"], json!(true), "{endpoint} ready over HTTP");
        let inputs = inputs_of(&server, endpoint, 0).await;
        for transport in ["grpc", "http"] {
            let metadata = &model[transport];
            assert_eq!(metadata["name"], json!(endpoint), "{endpoint} {transport} metadata: {metadata}");
            let names: Vec<&str> = metadata["inputs"]
                .as_array()
                .expect("inputs")
                .iter()
                .map(|i| i["name"].as_str().unwrap_or(""))
                .collect();
            for input in &inputs {
                assert!(
                    names.contains(&input.name.as_str()),
                    "{endpoint} {transport}: {} not in {names:?}",
                    input.name
                );
            }
        }
    }
    assert_eq!(report["models"]["nope"]["grpc_ready"], json!(false));
    assert_eq!(report["models"]["nope"]["http_ready"], json!(false));
    assert_failed(&report["models"]["nope"]["grpc"], "NOT_FOUND", &["'nope'"], "metadata of an unknown model");

    let results = report["infer"].as_array().expect("infer");
    for (i, want) in expected.iter().enumerate() {
        let model = cases[i]["model"].as_str().unwrap_or("?");
        for (transport, entry) in results[i].as_object().expect("entry") {
            let what = format!("{model} (case {i}) over {transport}");
            if model == "dtypes" && transport == "grpc_typed" {
                // FP16 has no typed contents: the one input that cannot be
                // sent this way is named.
                assert_failed(entry, "INVALID_ARGUMENT", &["in_f16", "FP16", "raw_input_contents"], &what);
                continue;
            }
            assert_eq!(entry["ok"], json!(true), "{what}: {entry}");
            let outputs = entry["outputs"].as_object().expect("outputs");
            let names: Vec<&String> = outputs.keys().collect();
            assert_eq!(names, want.keys().collect::<Vec<_>>(), "{what}: outputs");
            for (name, got) in outputs {
                assert_same(got, &want[name], &format!("{what}, output {name}"));
            }
        }
    }
    for (j, (_, grpc_code, http_status, parts)) in bad.iter().enumerate() {
        let entry = &results[good + j];
        for transport in ["grpc_raw", "grpc_typed"] {
            assert_failed(&entry[transport], grpc_code, parts, &format!("bad case {j} over {transport}"));
        }
        for transport in ["http_json", "http_binary"] {
            assert_failed(&entry[transport], http_status, parts, &format!("bad case {j} over {transport}"));
        }
    }
    // Still serving, and counted under the v2 API's own label.
    let inputs = inputs_of(&server, "mlp", 1).await;
    predict(&server, "mlp", None, &inputs).await;
    let series = "sluice_serving_request_count_total{model_name=\"mlp\",pipeline=\"mlp\",api=\"model_infer\",entrypoint=\"grpc\",status=\"OK\"}";
    assert!(server.metric(series).await >= 2.0, "{series}");
}

/// A malformed HTTP request: what it is, its body, its
/// Inference-Header-Content-Length, the status and message parts expected.
type HttpCase<'a> = (&'a str, Bytes, Option<String>, u16, Vec<&'a str>);

/// A ModelInfer request for the MLP with `x` given as `raw` bytes.
fn raw_mlp(shape: Vec<i64>, raw: Vec<u8>) -> ModelInferRequest {
    ModelInferRequest {
        model_name: "mlp".into(),
        inputs: vec![InferInputTensor { name: "x".into(), datatype: "FP32".into(), shape, ..Default::default() }],
        raw_input_contents: vec![Bytes::from(raw)],
        ..Default::default()
    }
}

#[tokio::test]
async fn malformed_v2_requests_get_their_codes_and_messages_and_the_server_keeps_serving() {
    let server = Server::examples();
    let mut grpc = GrpcInferenceServiceClient::connect(server.grpc_url()).await.expect("connect");
    let x: Vec<u8> = bytemuck::cast_slice(&values(3, 64)).to_vec();
    let mut typed_and_raw = raw_mlp(vec![1, 64], x.clone());
    typed_and_raw.inputs[0].contents = Some(InferTensorContents { fp32_contents: vec![0.0; 64], ..Default::default() });
    let mut two_raw = raw_mlp(vec![1, 64], x.clone());
    two_raw.raw_input_contents.push(Bytes::from_static(b"extra"));
    let mut unknown_type = raw_mlp(vec![1, 64], x.clone());
    unknown_type.inputs[0].datatype = "FLOAT32".into();
    let cases: Vec<(&str, ModelInferRequest, tonic::Code, Vec<&str>)> = vec![
        ("short raw", raw_mlp(vec![1, 64], x[..255].to_vec()), tonic::Code::InvalidArgument, vec!["255 bytes", "256"]),
        ("typed and raw", typed_and_raw, tonic::Code::InvalidArgument, vec!["'x'", "one or the other"]),
        ("raw count", two_raw, tonic::Code::InvalidArgument, vec!["2 entries for 1 inputs"]),
        ("unknown datatype", unknown_type, tonic::Code::InvalidArgument, vec!["FLOAT32"]),
        (
            "a shape too large to build",
            raw_mlp(vec![1 << 40, 64], vec![]),
            tonic::Code::ResourceExhausted,
            vec!["max_tensor_bytes"],
        ),
        ("a negative dimension", raw_mlp(vec![-1, 64], vec![]), tonic::Code::InvalidArgument, vec!["-1"]),
    ];
    for (what, request, code, parts) in cases {
        let err = grpc.model_infer(request).await.expect_err(what);
        assert_eq!(err.code(), code, "{what}: {err:?}");
        for part in parts {
            assert!(err.message().contains(part), "{what}: {part:?} not in {}", err.message());
        }
    }
    let answer = grpc.model_infer(raw_mlp(vec![1, 64], x.clone())).await.expect("still serving").into_inner();
    assert_eq!(answer.outputs[0].shape, vec![1, 10]);
    assert_eq!(answer.raw_output_contents[0].len(), 40);

    // HTTP: the binary extension's framing, checked before anything runs.
    let mut rest = RestClient::new(&server.http.to_string()).expect("REST client");
    let head = |size: usize| {
        json!({"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "parameters": {"binary_data_size": size}}]})
            .to_string()
    };
    let binary = |head: String, tail: &[u8], length: &str| {
        let mut body = head.into_bytes();
        body.extend_from_slice(tail);
        (Bytes::from(body), length.to_string())
    };
    let h = head(256);
    let cases: Vec<HttpCase<'_>> = vec![
        {
            let (body, len) = binary(head(300), &x, &head(300).len().to_string());
            ("size past the data", body, Some(len), 400, vec!["binary_data_size is 300", "256 bytes"])
        },
        {
            let mut tail = x.clone();
            tail.extend_from_slice(b"more");
            let (body, len) = binary(h.clone(), &tail, &h.len().to_string());
            ("bytes left over", body, Some(len), 400, vec!["4 bytes of binary data"])
        },
        {
            let (body, _) = binary(h.clone(), &x, "");
            ("header length too long", body, Some("999999".into()), 400, vec!["999999"])
        },
        {
            let (body, _) = binary(h.clone(), &x, "");
            ("header length not a number", body, Some("ten".into()), 400, vec!["\"ten\""])
        },
        ("not JSON", Bytes::from_static(b"{\"inputs\": ["), None, 400, vec!["not valid v2 JSON"]),
        (
            "no data",
            Bytes::from(json!({"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32"}]}).to_string()),
            None,
            400,
            vec!["no data"],
        ),
        (
            "data of the wrong length",
            Bytes::from(
                json!({"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [1, 2]}]}).to_string(),
            ),
            None,
            400,
            vec!["2 values", "64"],
        ),
    ];
    for (what, body, length, status, parts) in cases {
        let headers: Vec<(&str, &str)> =
            length.as_deref().map(|l| vec![("inference-header-content-length", l)]).unwrap_or_default();
        let answer = rest.call(Method::POST, "/v2/models/mlp/infer", &headers, body).await.expect("REST call");
        assert_eq!(answer.status.as_u16(), status, "{what}: {}", answer.text());
        let json: Value = serde_json::from_slice(&answer.body).expect("a JSON error body");
        let message = json["error"].as_str().unwrap_or("");
        for part in parts {
            assert!(message.contains(part), "{what}: {part:?} not in {message}");
        }
    }
    for (method, path, status) in [
        (Method::GET, "/v2/models/mlp/infer", 405),
        (Method::POST, "/v2/models/mlp", 405),
        (Method::GET, "/v2/models/mlp/explain", 404),
        (Method::GET, "/v2/repository/index", 501),
        (Method::GET, "/v2/models/mlp/versions/7/ready", 400),
        (Method::GET, "/v2/models/mlp/versions/2/ready", 200),
    ] {
        let answer = rest.call(method.clone(), path, &[], Bytes::new()).await.expect("REST call");
        assert_eq!(answer.status.as_u16(), status, "{method} {path}: {}", answer.text());
    }
    // A JSON answer writes f32 values in their shortest form (0.1, not
    // 0.10000000149011612), as TF Serving's REST API does.
    let data: Vec<f32> = values(3, 64);
    let body = json!({"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": data}]}).to_string();
    let answer = rest.call(Method::POST, "/v2/models/mlp/infer", &[], Bytes::from(body)).await.expect("infer");
    let text = answer.text();
    let numbers = text.split("\"data\":[").nth(1).and_then(|rest| rest.split(']').next()).expect("data");
    for number in numbers.split(',') {
        let parsed: f32 = number.parse().expect("a number");
        assert_eq!(number, format!("{parsed}").as_str(), "{number} is not the shortest form of an f32");
    }
    // A binary answer: the JSON header, then the raw output.
    let mut with_output = serde_json::from_str::<Value>(&h).expect("head");
    with_output["outputs"] = json!([{"name": "logits", "parameters": {"binary_data": true}}]);
    let head_text = with_output.to_string();
    let (body, len2) = binary(head_text.clone(), &x, &head_text.len().to_string());
    let answer = rest
        .call(Method::POST, "/v2/models/mlp/infer", &[("inference-header-content-length", &len2)], body)
        .await
        .expect("binary infer");
    assert_eq!(answer.status.as_u16(), 200, "{}", answer.text());
    let json_length: usize =
        answer.headers["inference-header-content-length"].to_str().expect("ascii").parse().expect("length");
    let head: Value = serde_json::from_slice(&answer.body[..json_length]).expect("answer head");
    assert_eq!(head["outputs"][0]["parameters"]["binary_data_size"], json!(40));
    assert_eq!(answer.body.len(), json_length + 40);
}
