//! SavedModels served in process by TensorFlow (`infer::tensorflow`),
//! against what TensorFlow's own Python API answers for the same
//! SavedModels: a Keras MLP in two versions, a lookup-table vocabulary with
//! string input and output, a module with several signatures, every dtype
//! TF Serving serves (complex64/128 too: over gRPC, refused by name over
//! JSON and KServe v2), and a signature that returns a resource handle.
//! `scripts/setup` builds them, and the answers TensorFlow computed, into
//! `.cache/tf-backend-savedmodels/` (tests/tensorflow/make_savedmodels.py).

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use bytes::Bytes;
use common::fixtures::*;
use common::*;
use http::{Method, StatusCode};
use prost::Message;
use serde_json::Value;
use sluice::cli::bench::client::RestClient;
use sluice::proto::tensorflow::serving::{model_spec, PredictRequest};
use sluice::proto::tensorflow::{tensor_info, DataType, TensorProto};

fn models() -> PathBuf {
    root().join(".cache/tf-backend-savedmodels")
}

fn expected() -> Value {
    let path = models().join("expected.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (scripts/setup builds the TensorFlow test models)", path.display()));
    serde_json::from_str(&text).expect("expected.json")
}

/// Every test model, with batching on `keras_mlp` (auto: requests of
/// several clients run as one TensorFlow batch), both its versions loaded.
fn server() -> Server {
    let mut config = String::new();
    config.push_str(&model_table(
        "keras_mlp",
        &models().join("keras_mlp"),
        "version_policy = \"all\"\nbatching = { mode = \"auto\" }\ntensorflow = { run_threads = 2 }",
    ));
    for name in ["vocab", "multi", "dtypes", "complex"] {
        config.push_str(&model_table(name, &models().join(name), ""));
    }
    Server::with_config(&config)
}

/// A JSON-described tensor (dtype name, shape, values) as TF Serving's
/// clients send it: typed fields, 16-bit floats as their bits.
fn tensor_proto(tensor: &Value) -> TensorProto {
    let dtype = tensor["dtype"].as_str().expect("dtype");
    let dims: Vec<i64> = tensor["shape"].as_array().expect("shape").iter().map(|d| d.as_i64().expect("dim")).collect();
    let values = tensor["values"].as_array().expect("values");
    let f = || values.iter().map(|v| v.as_f64().expect("number"));
    let i = || values.iter().map(|v| v.as_i64().expect("integer"));
    let mut proto = TensorProto { tensor_shape: shape(&dims), ..TensorProto::default() };
    let (data_type, ()) = match dtype {
        "float32" => (DataType::DtFloat, proto.float_val = f().map(|v| v as f32).collect()),
        "float64" => (DataType::DtDouble, proto.double_val = f().collect()),
        "float16" => {
            (DataType::DtHalf, proto.half_val = f().map(|v| half::f16::from_f64(v).to_bits() as i32).collect())
        }
        "bfloat16" => {
            (DataType::DtBfloat16, proto.half_val = f().map(|v| half::bf16::from_f64(v).to_bits() as i32).collect())
        }
        "int8" => (DataType::DtInt8, proto.int_val = i().map(|v| v as i32).collect()),
        "int16" => (DataType::DtInt16, proto.int_val = i().map(|v| v as i32).collect()),
        "int32" => (DataType::DtInt32, proto.int_val = i().map(|v| v as i32).collect()),
        "uint8" => (DataType::DtUint8, proto.int_val = i().map(|v| v as i32).collect()),
        "uint16" => (DataType::DtUint16, proto.int_val = i().map(|v| v as i32).collect()),
        "int64" => (DataType::DtInt64, proto.int64_val = i().collect()),
        "uint32" => (DataType::DtUint32, proto.uint32_val = i().map(|v| v as u32).collect()),
        "uint64" => (DataType::DtUint64, proto.uint64_val = i().map(|v| v as u64).collect()),
        "bool" => (DataType::DtBool, proto.bool_val = values.iter().map(|v| v.as_bool().expect("bool")).collect()),
        // (real, imaginary) pairs, flattened.
        "complex64" => (DataType::DtComplex64, proto.scomplex_val = f().map(|v| v as f32).collect()),
        "complex128" => (DataType::DtComplex128, proto.dcomplex_val = f().collect()),
        "string" => (
            DataType::DtString,
            proto.string_val = values.iter().map(|v| v.as_str().expect("text").as_bytes().to_vec().into()).collect(),
        ),
        other => panic!("dtype {other} in expected.json"),
    };
    proto.dtype = data_type as i32;
    proto
}

/// A value of an answer, comparable with expected.json's.
#[derive(Debug, PartialEq)]
enum Scalar {
    Number(f64),
    Bool(bool),
    Text(String),
}

/// The values of an answered tensor (typed fields, TF Serving's default
/// encoding), whatever its dtype.
fn answered(proto: &TensorProto) -> Vec<Scalar> {
    use Scalar::*;
    let n = |v: f64| Number(v);
    match DataType::try_from(proto.dtype).expect("dtype") {
        DataType::DtFloat => proto.float_val.iter().map(|&v| n(v as f64)).collect(),
        DataType::DtDouble => proto.double_val.iter().map(|&v| n(v)).collect(),
        DataType::DtHalf => proto.half_val.iter().map(|&b| n(half::f16::from_bits(b as u16).to_f64())).collect(),
        DataType::DtBfloat16 => proto.half_val.iter().map(|&b| n(half::bf16::from_bits(b as u16).to_f64())).collect(),
        DataType::DtInt8 | DataType::DtInt16 | DataType::DtInt32 | DataType::DtUint8 | DataType::DtUint16 => {
            proto.int_val.iter().map(|&v| n(v as f64)).collect()
        }
        DataType::DtInt64 => proto.int64_val.iter().map(|&v| n(v as f64)).collect(),
        DataType::DtUint32 => proto.uint32_val.iter().map(|&v| n(v as f64)).collect(),
        DataType::DtUint64 => proto.uint64_val.iter().map(|&v| n(v as f64)).collect(),
        DataType::DtBool => proto.bool_val.iter().map(|&v| Bool(v)).collect(),
        DataType::DtComplex64 => proto.scomplex_val.iter().map(|&v| n(v as f64)).collect(),
        DataType::DtComplex128 => proto.dcomplex_val.iter().map(|&v| n(v)).collect(),
        DataType::DtString => proto.string_val.iter().map(|v| Text(String::from_utf8_lossy(v).into_owned())).collect(),
        other => panic!("answered dtype {other:?}"),
    }
}

fn wanted(tensor: &Value) -> Vec<Scalar> {
    tensor["values"]
        .as_array()
        .expect("values")
        .iter()
        .map(|v| match v {
            Value::Bool(b) => Scalar::Bool(*b),
            Value::String(s) => Scalar::Text(s.clone()),
            other => Scalar::Number(other.as_f64().expect("number")),
        })
        .collect()
}

/// Equal: exactly for integers, booleans and strings; floats to a
/// relative 1e-6 (TensorFlow in Python and in sluice run the same kernels
/// on the same rows).
fn assert_equal(got: &[Scalar], want: &[Scalar], what: &str) {
    assert_close_to(got, want, 1e-6, 1e-7, what);
}

/// Equal, floats within `atol + rtol × |want|` (numpy's `allclose`).
fn assert_close_to(got: &[Scalar], want: &[Scalar], rtol: f64, atol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        match (g, w) {
            (Scalar::Number(g), Scalar::Number(w)) => {
                assert!((g - w).abs() <= atol + rtol * w.abs(), "{what}: {got:?} vs {want:?}")
            }
            _ => assert_eq!(g, w, "{what}"),
        }
    }
}

fn request(model: &str, version: Option<i64>, signature: &str, inputs: &Value) -> PredictRequest {
    let mut spec = spec(model, version).expect("spec");
    spec.signature_name = signature.to_string();
    PredictRequest {
        model_spec: Some(spec),
        inputs: inputs.as_object().expect("inputs").iter().map(|(k, v)| (k.clone(), tensor_proto(v))).collect(),
        output_filter: Vec::new(),
    }
}

#[tokio::test]
async fn every_savedmodel_answers_predict_as_tensorflow_does() {
    let expected = expected();
    let server = server();
    let mut client = server.predict_client().await;
    for model in ["keras_mlp", "vocab", "multi", "dtypes", "complex"] {
        for case in expected[model]["cases"].as_array().expect("cases") {
            let signature = case["signature"].as_str().expect("signature");
            let version = case["version"].as_i64();
            let what = format!("{model} v{version:?} {signature}");
            let answer = client
                .predict(request(model, version, signature, &case["inputs"]))
                .await
                .unwrap_or_else(|e| panic!("{what}: {e:?}"))
                .into_inner();
            let outputs = case["outputs"].as_object().expect("outputs");
            let names: Vec<&String> = answer.outputs.keys().collect();
            assert_eq!(answer.outputs.len(), outputs.len(), "{what}: answered {names:?}");
            for (name, want) in outputs {
                let got = answer.outputs.get(name).unwrap_or_else(|| panic!("{what}: no output {name} in {names:?}"));
                let want_dims: Vec<i64> =
                    want["shape"].as_array().expect("shape").iter().map(|d| d.as_i64().expect("dim")).collect();
                assert_eq!(dims(got), want_dims, "{what}: {name}'s shape");
                let want_dtype = sluice::tensor::DType::parse(want["dtype"].as_str().expect("dtype")).expect("dtype");
                assert_eq!(got.dtype, want_dtype.to_tf(), "{what}: {name}'s dtype");
                assert_equal(&answered(got), &wanted(want), &format!("{what}: {name}"));
            }
            if let Some(v) = version {
                let answered_by = answer.model_spec.and_then(|s| s.version_choice);
                assert_eq!(answered_by, Some(model_spec::VersionChoice::Version(v)), "{what}: answered by its version");
            }
        }
    }
}

/// The same cases through TF Serving's official Python client: its
/// tensors are `tf.make_tensor_proto`'s (packed `tensor_content`, not the
/// typed fields above), its answers read by `tf.make_ndarray`, every dtype
/// complex64/128 included.
#[test]
fn the_official_python_client_gets_what_tensorflow_computes_for_every_savedmodel() {
    let server = server();
    let output = std::process::Command::new(root().join(".cache/tf-venv/bin/python"))
        .arg(root().join("tests/tensorflow/predict_client.py"))
        .arg(server.grpc.to_string())
        .arg(models().join("expected.json"))
        .args(["keras_mlp", "vocab", "multi", "dtypes", "complex"])
        .output()
        .expect("run tests/tensorflow/predict_client.py (scripts/setup installs its TensorFlow)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap_or("")).expect("the client's summary");
    assert_eq!(summary["failures"], serde_json::json!([]), "{summary}");
    let cases = summary["cases"].as_u64().expect("cases");
    assert!(cases >= 10 && summary["passed"] == cases, "{summary}");
}

#[tokio::test]
async fn batched_requests_of_many_clients_get_their_own_rows() {
    let expected = expected();
    let server = server();
    let cases: Vec<Value> = expected["keras_mlp"]["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .filter(|c| c["version"] == 2)
        .cloned()
        .collect();
    let mut tasks = Vec::new();
    for i in 0..64 {
        let case = cases[i % cases.len()].clone();
        let mut client = server.predict_client().await;
        tasks.push(tokio::spawn(async move {
            let answer =
                client.predict(request("keras_mlp", Some(2), "", &case["inputs"])).await.expect("predict").into_inner();
            let want = &case["outputs"]["output_0"];
            // Joined with other clients' rows, the matmul runs on another
            // batch size than TensorFlow's reference, so its sums may add
            // in another order: equal as numpy's allclose has it.
            assert_close_to(&answered(&answer.outputs["output_0"]), &wanted(want), 1e-5, 1e-6, "batched keras_mlp");
        }));
    }
    for task in tasks {
        task.await.expect("client");
    }
    let metrics = server.metrics().await;
    assert!(metric_value(&metrics, "sluice_model_runs_total{model=\"keras_mlp\",version=\"2\"}") > 0.0, "{metrics}");
}

#[tokio::test]
async fn metadata_lists_every_signature_as_the_savedmodel_declares_it() {
    let expected = expected();
    let server = server();
    for model in ["multi", "keras_mlp", "dtypes", "complex"] {
        let map = server.signature_def_map(model).await;
        let want = expected[model]["signatures"].as_object().expect("signatures");
        let keys: BTreeMap<&String, ()> = map.signature_def.keys().map(|k| (k, ())).collect();
        assert_eq!(keys.len(), want.len(), "{model}: {keys:?}");
        for (key, signature) in want {
            let def = map.signature_def.get(key).unwrap_or_else(|| panic!("{model}: no signature {key}: {keys:?}"));
            assert_eq!(def.method_name, signature["method_name"].as_str().expect("method"), "{model} {key}");
            for (role, infos) in [("inputs", &def.inputs), ("outputs", &def.outputs)] {
                let want = signature[role].as_object().expect("role");
                assert_eq!(infos.len(), want.len(), "{model} {key} {role}");
                for (alias, info) in want {
                    let got = &infos[alias];
                    let name = match &got.encoding {
                        Some(tensor_info::Encoding::Name(name)) => name.as_str(),
                        _ => "",
                    };
                    assert_eq!(name, info["name"].as_str().expect("name"), "{model} {key} {alias}");
                    assert_eq!(got.dtype as i64, info["dtype"].as_i64().expect("dtype"), "{model} {key} {alias}");
                    let shape = got.tensor_shape.clone().unwrap_or_default();
                    match info["shape"].as_array() {
                        None => assert!(shape.unknown_rank, "{model} {key} {alias}"),
                        Some(dims) => {
                            let dims: Vec<i64> = dims.iter().map(|d| d.as_i64().expect("dim")).collect();
                            let got: Vec<i64> = shape.dim.iter().map(|d| d.size).collect();
                            assert_eq!(got, dims, "{model} {key} {alias}");
                        }
                    }
                }
            }
        }
    }
    // REST answers the same signatures.
    let body = http_get(server.http, "/v1/models/multi/metadata").await;
    let json: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let defs = &json["metadata"]["signature_def"]["signature_def"];
    assert_eq!(defs["total"]["outputs"]["sum"]["dtype"], "DT_FLOAT", "{body}");
    assert_eq!(defs["scaled"]["inputs"]["x"]["name"], "scaled_x:0", "{body}");
}

#[tokio::test]
async fn bad_feeds_are_refused_by_name_and_the_model_keeps_serving() {
    let expected = expected();
    let server = server();
    let mut client = server.predict_client().await;
    let refused = |result: Result<tonic::Response<_>, tonic::Status>| match result {
        Ok(_) => panic!("a bad request was answered"),
        Err(status) => status,
    };
    // A dtype the signature does not take.
    let status =
        refused(client.predict(predict_request("multi", vec![("x", i64_content(&[1, 4], &[1, 2, 3, 4]))])).await);
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("'x'") && status.message().contains("DT_FLOAT"), "{}", status.message());
    // A shape it does not take.
    let status = refused(client.predict(predict_request("multi", vec![("x", f32_content(&[2, 5], &[0.0; 10]))])).await);
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("'x'") && status.message().contains("[2, 5]"), "{}", status.message());
    // An input it does not have.
    let status = refused(client.predict(predict_request("multi", vec![("y", f32_content(&[1, 4], &[0.0; 4]))])).await);
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("'y'"), "{}", status.message());
    // A signature it does not serve for Predict names those it does.
    let mut request = predict_request("multi", vec![("x", f32_content(&[1, 4], &[0.0; 4]))]);
    if let Some(spec) = request.model_spec.as_mut() {
        spec.signature_name = "nope".into();
    }
    let status = refused(client.predict(request).await);
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(
        status.message().contains("'nope'") && status.message().contains("[serving_default, scaled, total]"),
        "{}",
        status.message()
    );
    // Another signature's inputs are checked against that signature.
    let mut request = predict_request("multi", vec![("x", f32_content(&[1, 4], &[0.0; 4]))]);
    if let Some(spec) = request.model_spec.as_mut() {
        spec.signature_name = "scaled".into();
    }
    let status = refused(client.predict(request).await);
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("factor"), "the missing input is named: {}", status.message());
    // Still serving.
    let case = &expected["multi"]["cases"][0];
    let answer = client.predict(request_of("multi", &case["inputs"])).await.expect("still serving").into_inner();
    assert_equal(&answered(&answer.outputs["doubled"]), &wanted(&case["outputs"]["doubled"]), "multi after refusals");
}

/// The error of `model`'s failed load, as GetModelStatus reports it.
async fn load_error(server: &Server, model: &str) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let statuses = server.model_status(model).await;
        if let Some(message) =
            statuses.iter().filter_map(|s| s.status.as_ref()).map(|s| &s.error_message).find(|m| !m.is_empty())
        {
            return message.clone();
        }
        assert!(std::time::Instant::now() < deadline, "{model} did not fail to load: {statuses:?}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

fn request_of(model: &str, inputs: &Value) -> PredictRequest {
    request(model, None, "", inputs)
}

#[tokio::test]
async fn rest_predicts_strings_in_and_out() {
    let expected = expected();
    let server = server();
    let case = &expected["vocab"]["cases"][0];
    let words = &case["inputs"]["words"]["values"];
    let body = http_post(
        server.http,
        "/v1/models/vocab:predict",
        &serde_json::json!({ "inputs": { "words": words } }).to_string(),
    )
    .await;
    let json: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(json["outputs"]["upper"], case["outputs"]["upper"]["values"], "{body}");
    assert_eq!(json["outputs"]["ids"], case["outputs"]["ids"]["values"], "{body}");
}

/// Complex values travel as TF Serving carries them, over gRPC (the
/// predict test above checks the answers); JSON and KServe v2 have no
/// form for them, so REST and v2 refuse them by name, as TF Serving's REST
/// API does, and the model keeps serving.
#[tokio::test]
async fn complex_values_are_refused_by_name_over_json_and_kserve_v2() {
    let server = server();
    let call = |path: &'static str, body: Value| {
        let mut rest = RestClient::new(&server.http.to_string()).expect("client");
        async move {
            let response = rest.call(Method::POST, path, &[], Bytes::from(body.to_string())).await.expect("call");
            (response.status, response.text())
        }
    };
    // A complex input: TF Serving's REST API cannot convert JSON to it.
    let (status, text) = call(
        "/v1/models/complex:predict",
        serde_json::json!({ "inputs": { "c64": [[1.0, 2.0]], "c128": [[1.0, 2.0]] } }),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_IMPLEMENTED, "{text}");
    assert!(text.contains("'c128'") || text.contains("'c64'"), "{text}");
    assert!(text.contains("DT_COMPLEX") && text.contains("gRPC"), "{text}");
    // A complex output: nor can it write one.
    let (status, text) = call(
        "/v1/models/complex:predict",
        serde_json::json!({ "signature_name": "from_parts", "inputs": { "re": [1.0], "im": [2.0] } }),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.contains("output 'z' is DT_COMPLEX64"), "{text}");
    // KServe v2: its metadata names the datatype, and an infer is refused.
    let metadata: Value = serde_json::from_str(&http_get(server.http, "/v2/models/complex").await).expect("metadata");
    let datatypes: Vec<&str> =
        metadata["inputs"].as_array().expect("inputs").iter().filter_map(|i| i["datatype"].as_str()).collect();
    assert!(datatypes.contains(&"COMPLEX64") && datatypes.contains(&"COMPLEX128"), "{metadata}");
    let (status, text) = call(
        "/v2/models/complex/infer",
        serde_json::json!({ "inputs": [
            { "name": "c64", "shape": [1, 2], "datatype": "COMPLEX64", "data": [1.0, 2.0, 3.0, 4.0] },
            { "name": "c128", "shape": [1, 2], "datatype": "COMPLEX128", "data": [1.0, 2.0, 3.0, 4.0] }
        ] }),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_IMPLEMENTED, "{text}");
    assert!(text.contains("KServe v2 has no complex datatype"), "{text}");
    // A pair cut in half over gRPC is named too; and the model serves on.
    let mut client = server.predict_client().await;
    let odd = TensorProto {
        dtype: DataType::DtComplex64 as i32,
        tensor_shape: shape(&[1, 2]),
        scomplex_val: vec![1.0, 2.0, 3.0],
        ..TensorProto::default()
    };
    let whole = TensorProto { scomplex_val: vec![1.0, 2.0, 3.0, 4.0], ..odd.clone() };
    let c128 = TensorProto {
        dtype: DataType::DtComplex128 as i32,
        tensor_shape: shape(&[1, 2]),
        dcomplex_val: vec![1.0, 2.0, 3.0, 4.0],
        ..TensorProto::default()
    };
    let status = client
        .predict(predict_request("complex", vec![("c64", odd), ("c128", c128.clone())]))
        .await
        .expect_err("half a pair");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("scomplex_val holds 3 numbers"), "{}", status.message());
    let answer =
        client.predict(predict_request("complex", vec![("c64", whole), ("c128", c128)])).await.expect("serves");
    // (1 + 2i) × i = -2 + i; (3 + 4i) × i = -4 + 3i.
    assert_eq!(answer.into_inner().outputs["times_i"].scomplex_val, vec![-2.0, 1.0, -4.0, 3.0]);
}

#[test]
fn a_savedmodel_signature_of_resource_handles_is_refused_at_start_by_name() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("sluice.toml");
    std::fs::write(&config, model_table("resource", &models().join("resource"), "")).expect("config");
    let stderr = serve_refused(&config);
    assert!(
        stderr
            .contains("model 'resource' version 1: signature 'serving_default': output 'handle' has dtype DT_RESOURCE"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_savedmodel_version_without_tensorflow_says_how_to_get_it_and_the_last_version_serves() {
    // Version 1 is ONNX; version 2, a SavedModel, arrives while serving,
    // and TensorFlow's library is not where the server is told it is.
    let dir = tempfile::tempdir().expect("temp dir");
    let base = dir.path().join("m");
    std::fs::create_dir_all(base.join("1")).expect("mkdir");
    std::fs::copy(example_dir("mlp").join("1/model.onnx"), base.join("1/model.onnx")).expect("copy");
    let config = dir.path().join("sluice.toml");
    std::fs::write(&config, model_table("m", &base, "")).expect("config");
    let server = Server::start(&[
        "--model_config_file",
        config.to_str().expect("utf-8"),
        "--tensorflow_library",
        "/nonexistent/libtensorflow_cc.so.2",
    ]);
    let staged = dir.path().join(".staged");
    let copied =
        std::process::Command::new("cp").arg("-r").arg(models().join("vocab/1")).arg(&staged).status().expect("cp");
    assert!(copied.success());
    std::fs::rename(&staged, base.join("2")).expect("publish version 2");
    let status = load_error(&server, "m").await;
    assert!(status.contains("TensorFlow's library") && status.contains("scripts/setup"), "{status}");
    assert!(status.contains("/nonexistent/libtensorflow_cc.so.2"), "names where it looked: {status}");
    let x = values(3, 64);
    let answer = server
        .predict_client()
        .await
        .predict(predict_request("m", vec![("x", f32_content(&[1, 64], &x))]))
        .await
        .expect("version 1 serves")
        .into_inner();
    assert_eq!(
        answer.model_spec.and_then(|s| s.version_choice),
        Some(model_spec::VersionChoice::Version(1)),
        "answered by version 1"
    );
}

#[test]
fn classify_regress_and_multi_inference_run_the_savedmodels_own_signatures() {
    // The census SavedModel parses tf.Examples in its graph and declares
    // TensorFlow's classification and regression signatures: served with
    // no `examples` config, the official client gets what TensorFlow's
    // Python API answers for the same SavedModel.
    let census = root().join(".cache/tf-savedmodels/census");
    let server = Server::with_config(&model_table("census", &census, ""));
    let cases = "classify_list,classify_context,regress,multi,error_age_bytes,error_extra_length,error_empty_list,\
                 error_unknown_model";
    assert_examples_client(&server, "census", &census.join("1"), Some(cases), 8);
}

#[tokio::test]
async fn kserve_v2_infers_on_a_savedmodel_with_strings_in_and_out() {
    let expected = expected();
    let server = server();
    let case = &expected["vocab"]["cases"][0];
    let words = case["inputs"]["words"]["values"].as_array().expect("words").clone();
    let body = serde_json::json!({
        "inputs": [{ "name": "words", "shape": [words.len()], "datatype": "BYTES", "data": words }]
    });
    let answer = http_post(server.http, "/v2/models/vocab/infer", &body.to_string()).await;
    let json: Value = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer}"));
    let outputs = json["outputs"].as_array().unwrap_or_else(|| panic!("no outputs: {answer}"));
    let output = |name: &str| {
        outputs.iter().find(|o| o["name"] == name).unwrap_or_else(|| panic!("no output {name}: {answer}")).clone()
    };
    let (ids, upper) = (output("ids"), output("upper"));
    assert_eq!(ids["datatype"], "INT64", "{answer}");
    assert_eq!(ids["data"], case["outputs"]["ids"]["values"], "{answer}");
    assert_eq!(upper["datatype"], "BYTES", "{answer}");
    assert_eq!(upper["data"], case["outputs"]["upper"]["values"], "{answer}");
    // The model's metadata in KServe's words.
    let metadata: Value = serde_json::from_str(&http_get(server.http, "/v2/models/vocab").await).expect("metadata");
    assert_eq!(metadata["inputs"][0]["name"], "words", "{metadata}");
    assert_eq!(metadata["inputs"][0]["datatype"], "BYTES", "{metadata}");
}

#[tokio::test]
async fn rest_classify_and_regress_read_the_json_kinds_as_tf_serving_does() {
    use sluice::proto::tensorflow::serving::{input, ClassificationRequest, ExampleList, Input, RegressionRequest};
    use sluice::tensor::example::{example, float_feature, int64_feature};
    let census = root().join(".cache/tf-savedmodels/census");
    let server = Server::with_config(&model_table("census", &census, ""));
    let rows = serde_json::json!([
        {"age": 41.5, "hours": 38.5, "extra": [0.1, -0.2, 0.3], "country": 2},
        {"age": 63.0, "country": 1},
        {"age": 27.25, "extra": [-1.0, 0.5, 0.25]},
    ]);
    // The same examples over gRPC, whose answers equal TensorFlow's (the
    // official client's test above).
    let examples: Vec<bytes::Bytes> = [
        example([
            ("age".to_string(), float_feature(vec![41.5])),
            ("hours".to_string(), float_feature(vec![38.5])),
            ("extra".to_string(), float_feature(vec![0.1, -0.2, 0.3])),
            ("country".to_string(), int64_feature(vec![2])),
        ]),
        example([("age".to_string(), float_feature(vec![63.0])), ("country".to_string(), int64_feature(vec![1]))]),
        example([
            ("age".to_string(), float_feature(vec![27.25])),
            ("extra".to_string(), float_feature(vec![-1.0, 0.5, 0.25])),
        ]),
    ]
    .iter()
    .map(|e| bytes::Bytes::from(e.encode_to_vec()))
    .collect();
    let list = || Some(Input { kind: Some(input::Kind::ExampleList(ExampleList { examples: examples.clone() })) });
    let mut client = server.predict_client().await;
    let classified = client
        .classify(ClassificationRequest { model_spec: spec("census", None), input: list() })
        .await
        .expect("gRPC classify")
        .into_inner();
    let regressed = client
        .regress(RegressionRequest {
            model_spec: spec("census", None).map(|mut s| {
                s.signature_name = "regression".into();
                s
            }),
            input: list(),
        })
        .await
        .expect("gRPC regress")
        .into_inner();

    let body = serde_json::json!({ "examples": rows }).to_string();
    let answer = http_post(server.http, "/v1/models/census:classify", &body).await;
    let json: Value = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer}"));
    let result = json["result"].as_array().unwrap_or_else(|| panic!("{answer}"));
    let want = classified.result.expect("result").classifications;
    assert_eq!(result.len(), want.len(), "{answer}");
    for (got, want) in result.iter().zip(&want) {
        for (pair, class) in got.as_array().expect("row").iter().zip(&want.classes) {
            assert_eq!(pair[0], class.label.as_str(), "{answer}");
            let score = pair[1].as_f64().expect("score");
            assert!((score - class.score as f64).abs() <= 1e-6, "{answer}");
        }
    }
    let body = serde_json::json!({ "signature_name": "regression", "examples": rows }).to_string();
    let answer = http_post(server.http, "/v1/models/census:regress", &body).await;
    let json: Value = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer}"));
    let values: Vec<f64> = json["result"].as_array().expect("result").iter().filter_map(Value::as_f64).collect();
    let want: Vec<f64> = regressed.result.expect("result").regressions.iter().map(|r| r.value as f64).collect();
    assert_eq!(values.len(), want.len(), "{answer}");
    for (g, w) in values.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-6 * w.abs().max(1.0), "{answer}");
    }
    // A whole number is an int64_list, as TF Serving reads it: the graph
    // wants floats for age, and says so.
    let answer = http_post(server.http, "/v1/models/census:classify", r#"{"examples": [{"age": 41}]}"#).await;
    assert!(answer.contains("\"error\"") && answer.contains("age"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_savedmodel_version_switch_under_load_fails_no_request() {
    let expected = expected();
    let dir = tempfile::tempdir().expect("temp dir");
    let base = dir.path().join("keras_mlp");
    std::fs::create_dir_all(&base).expect("mkdir");
    let copy = |version: &str, to: &std::path::Path| {
        let copied = std::process::Command::new("cp")
            .arg("-r")
            .arg(models().join("keras_mlp").join(version))
            .arg(to)
            .status()
            .expect("cp");
        assert!(copied.success());
    };
    copy("1", &base.join("1"));
    let server = Server::with_config(&model_table("keras_mlp", &base, "tensorflow = { run_threads = 2 }"));
    let case = expected["keras_mlp"]["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|c| c["version"] == 2 && c["inputs"]["features"]["shape"][0] == 1)
        .expect("a one-row case")
        .clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut loops = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (mut client, stop, inputs) = (server.predict_client().await, stop.clone(), case["inputs"].clone());
        loops.spawn(async move {
            let (mut answered, mut by_two) = (0u64, 0u64);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let answer = client.predict(request("keras_mlp", None, "", &inputs)).await.expect("no request fails");
                answered += 1;
                if answer.into_inner().model_spec.and_then(|s| s.version_choice)
                    == Some(model_spec::VersionChoice::Version(2))
                {
                    by_two += 1;
                }
            }
            (answered, by_two)
        });
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // Published whole: copied aside, then renamed into place.
    let staged = dir.path().join(".staged");
    copy("2", &staged);
    std::fs::rename(&staged, base.join("2")).expect("publish version 2");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let statuses = server.model_status("keras_mlp").await;
        let two_serves = statuses.iter().any(|s| s.version == 2 && s.state == 30);
        let one_gone = statuses.iter().all(|s| s.version != 1 || s.state == 50);
        if two_serves && one_gone {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "version 2 did not take over: {statuses:?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut answered, mut by_two) = (0, 0);
    while let Some(done) = loops.join_next().await {
        let (a, b) = done.expect("a load loop failed a request");
        answered += a;
        by_two += b;
    }
    assert!(answered > 20 && by_two > 0, "{answered} answered, {by_two} by version 2");
    // Version 2 answers as TensorFlow computes it.
    let answer =
        server.predict_client().await.predict(request("keras_mlp", None, "", &case["inputs"])).await.expect("v2");
    assert_equal(&answered_values(&answer.into_inner()), &wanted(&case["outputs"]["output_0"]), "keras_mlp v2");
}

fn answered_values(answer: &sluice::proto::tensorflow::serving::PredictResponse) -> Vec<Scalar> {
    answered(&answer.outputs["output_0"])
}

#[tokio::test]
async fn a_context_copied_into_every_example_is_bounded_before_it_is_made() {
    use sluice::proto::tensorflow::serving::{input, ClassificationRequest, ExampleListWithContext, Input};
    use sluice::tensor::example::{bytes_feature, example, float_feature};
    let census = root().join(".cache/tf-savedmodels/census");
    let server =
        Server::with_config(&format!("[server]\nmax_tensor_bytes = 65536\n{}", model_table("census", &census, "")));
    let person = example([("age".to_string(), float_feature(vec![40.0]))]).encode_to_vec();
    // 8 KiB of context, copied in front of each of 64 examples: 512 KiB.
    let context = example([("note".to_string(), bytes_feature(vec![vec![b'x'; 8192].into()]))]).encode_to_vec();
    let request = |examples: usize| ClassificationRequest {
        model_spec: spec("census", None),
        input: Some(Input {
            kind: Some(input::Kind::ExampleListWithContext(ExampleListWithContext {
                examples: vec![person.clone().into(); examples],
                context: context.clone().into(),
            })),
        }),
    };
    let mut client = server.predict_client().await;
    let status = client.classify(request(64)).await.expect_err("over the bound");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("server.max_tensor_bytes"), "{}", status.message());
    // Within it, the same context is served.
    let answer = client.classify(request(4)).await.expect("within the bound").into_inner();
    assert_eq!(answer.result.expect("result").classifications.len(), 4);
}

/// A version directory of the census SavedModel (its files linked) with a
/// TF Serving warmup file written by TensorFlow's own Python modules
/// (`tests/tfserving/make_warmup.py`: Classify, Regress and
/// MultiInference records; `signature` renames the Classify record's).
fn census_with_warmup(base: &std::path::Path, onnx: bool, signature: Option<&str>) {
    let version = base.join("1");
    std::fs::create_dir_all(&version).expect("mkdir");
    if onnx {
        std::fs::copy(root().join("tests/fixtures/models/census/1/model.onnx"), version.join("model.onnx"))
            .expect("copy");
    } else {
        let census = root().join(".cache/tf-savedmodels/census/1");
        for file in ["saved_model.pb", "variables"] {
            std::os::unix::fs::symlink(census.join(file), version.join(file)).expect("link");
        }
    }
    let mut command = std::process::Command::new(root().join(".cache/tf-venv/bin/python"));
    command
        .arg(root().join("tests/tfserving/make_warmup.py"))
        .arg(version.join("assets.extra/tf_serving_warmup_requests"));
    if let Some(signature) = signature {
        command.args(["--signature", signature]);
    }
    let output = command.output().expect("run make_warmup.py");
    assert!(output.status.success(), "make_warmup.py: {}", String::from_utf8_lossy(&output.stderr));
}

#[tokio::test]
async fn warmup_files_of_classify_regress_and_multi_inference_records_run_as_those_calls_do() {
    // On the SavedModel's own signatures: each task runs its signature,
    // so the three records make four runs.
    let dir = tempfile::tempdir().expect("temp dir");
    let savedmodel = dir.path().join("census_tf");
    census_with_warmup(&savedmodel, false, None);
    // Through an ONNX model's examples table: one run serves every task.
    let onnx = dir.path().join("census_onnx");
    census_with_warmup(&onnx, true, None);
    let examples = "[models.examples]\nfeatures = [ { name = \"age\" }, { name = \"hours\", default = 40.0 }, \
                    { name = \"extra\", default = [0.0, 0.0, 0.0] }, { name = \"country\", default = 0 } ]\n\
                    classify = { scores = \"probabilities\" }\nregress = { output = \"value\" }";
    let config =
        format!("{}{}", model_table("census_tf", &savedmodel, ""), model_table("census_onnx", &onnx, examples));
    let server = Server::with_config(&config);
    // Both versions were warmed up before the server said it was ready.
    let log = server.log_through("ready: serving").await;
    let mut warmed: Vec<String> = log.into_iter().filter(|line| line.contains("warmed up")).collect();
    warmed.sort_by_key(|line| line.contains("census_tf"));
    assert_eq!(warmed.len(), 2, "{warmed:?}");
    let file = |base: &std::path::Path| base.join("1/assets.extra/tf_serving_warmup_requests").display().to_string();
    assert!(warmed[0].contains("census_onnx") && warmed[0].contains("requests=3"), "{warmed:?}");
    assert!(warmed[0].contains(&file(&onnx)), "{warmed:?}");
    assert!(warmed[1].contains("census_tf") && warmed[1].contains("requests=4"), "{warmed:?}");
    assert!(warmed[1].contains(&file(&savedmodel)), "{warmed:?}");

    // A record naming a signature the model lacks fails the version, named.
    let bad = dir.path().join("census_bad");
    census_with_warmup(&bad, false, Some("nope"));
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, model_table("census_bad", &bad, "")).expect("config");
    let stderr = serve_refused(&config);
    assert!(stderr.contains("warmup") && stderr.contains("record 0"), "{stderr}");
    assert!(stderr.contains("No signature was found with the name: \"nope\""), "{stderr}");
}

#[tokio::test]
async fn a_savedmodel_whose_variables_arrive_after_its_graph_loads_on_a_retry() {
    // TF Serving's failure mode with object storage: saved_model.pb lands
    // first, variables/ later. The first load fails; saved_model.pb never
    // changes again, so only a retry on a timer brings the version in.
    let dir = tempfile::tempdir().expect("temp dir");
    let base = dir.path().join("m");
    std::fs::create_dir_all(&base).expect("mkdir");
    let cp = |from: &std::path::Path, to: &std::path::Path| {
        let copied = std::process::Command::new("cp").arg("-r").arg(from).arg(to).status();
        assert!(copied.expect("cp").success(), "cp {} {}", from.display(), to.display());
    };
    cp(&models().join("keras_mlp/1"), &base.join("1"));
    let config = dir.path().join("sluice.toml");
    let lifecycle =
        "[lifecycle]\nfile_system_poll_wait_seconds = 1\nmax_load_retries = 3\nload_retry_interval_ms = 200\n";
    std::fs::write(&config, format!("{lifecycle}{}", model_table("m", &base, ""))).expect("config");
    let server = Server::start(&["--model_config_file", config.to_str().expect("utf-8")]);
    // Version 2 is published without its variables.
    let staged = dir.path().join("staged");
    std::fs::create_dir_all(&staged).expect("mkdir");
    let source = models().join("keras_mlp/2");
    for entry in std::fs::read_dir(&source).expect("read the SavedModel") {
        let entry = entry.expect("entry");
        if entry.file_name() != "variables" {
            cp(&entry.path(), &staged);
        }
    }
    std::fs::rename(&staged, base.join("2")).expect("publish version 2");
    let retrying = server.wait_for_log("to be tried again").await;
    assert!(retrying.contains("version 2"), "{retrying}");
    cp(&source.join("variables"), &base.join("2"));
    let case = expected()["keras_mlp"]["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|case| case["version"] == 2)
        .expect("a version 2 case")
        .clone();
    let client = server.predict_client().await;
    let answer = eventually_async(|| {
        let mut client = client.clone();
        let request = request("m", Some(2), "", &case["inputs"]);
        async move { client.predict(request).await.map_err(|e| e.to_string()) }
    })
    .await;
    let got = answered(&answer.into_inner().outputs["output_0"]);
    assert_close_to(&got, &wanted(&case["outputs"]["output_0"]), 1e-5, 1e-6, "version 2 after the retry");
}

/// Polls `call` until it answers Ok, for 30 s.
async fn eventually_async<T, F, Fut>(mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match call().await {
            Ok(value) => return value,
            Err(last) if std::time::Instant::now() >= deadline => panic!("waited 30 s; last: {last}"),
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    }
}

#[test]
fn config_check_reads_a_savedmodel_as_a_load_would_without_starting_tensorflow() {
    let dir = tempfile::tempdir().expect("temp dir");
    let check = |name: &str, text: String| {
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, text).expect("config");
        run_sluice(&["config", "check", path.to_str().expect("utf-8")])
    };
    let table = |model: &str, keys: &str| model_table(model, &models().join(model), keys);
    // Served as is: the signatures each version serves are listed.
    let (code, stdout, stderr) =
        check("ok", format!("{}{}", table("keras_mlp", "version_policy = \"all\""), table("multi", "")));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("model 'keras_mlp': versions 1, 2; SavedModel signatures serve, serving_default"),
        "{stdout}"
    );
    assert!(
        stdout.contains("model 'multi': versions 1; SavedModel signatures scaled, serving_default, total"),
        "{stdout}"
    );
    // What would fail the load is named before a deploy.
    let (code, _, stderr) = check("resource", table("resource", ""));
    assert_eq!(code, Some(1));
    assert!(
        stderr
            .contains("model 'resource' version 1: signature 'serving_default': output 'handle' has dtype DT_RESOURCE"),
        "{stderr}"
    );
    let (code, _, stderr) = check("tags", table("vocab", "tensorflow = { tags = [\"serve\", \"gpu\"] }"));
    assert_eq!(code, Some(1));
    assert!(stderr.contains("no MetaGraph has exactly the tags {\"gpu\", \"serve\"}"), "{stderr}");
    assert!(stderr.contains("it has {\"serve\"}"), "{stderr}");
    let (code, _, stderr) = check(
        "library",
        format!("[tensorflow]\nlibrary = \"/nonexistent/libtensorflow_cc.so.2\"\n{}", table("vocab", "")),
    );
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("TensorFlow's library") && stderr.contains("/nonexistent/libtensorflow_cc.so.2"),
        "{stderr}"
    );
}
