//! TF Serving's REST API against the real server: predictions in row and
//! columnar form must equal the gRPC answer for the same input, status and
//! metadata answer in TF Serving's JSON, and each bad request gets its
//! HTTP status and a message naming what was wrong — with the server still
//! serving afterwards.

mod common;

use bytes::Bytes;
use common::fixtures::example_model_table;
use common::*;
use http::{Method, StatusCode};
use serde_json::{json, Value};
use sluice::cli::bench::client::{RestClient, RestResponse};

fn client(server: &Server) -> RestClient {
    RestClient::new(&server.http.to_string()).expect("REST client")
}

async fn call(client: &mut RestClient, method: Method, path: &str, body: &str) -> RestResponse {
    client.call(method, path, &[], Bytes::from(body.to_string())).await.expect("REST call")
}

async fn post(client: &mut RestClient, path: &str, body: &Value) -> Value {
    let response = call(client, Method::POST, path, &body.to_string()).await;
    assert_eq!(response.status, StatusCode::OK, "POST {path}: {}", response.text());
    serde_json::from_slice(&response.body).expect("JSON answer")
}

/// Every number in a JSON tree, in order, as f32.
fn numbers(value: &Value) -> Vec<f32> {
    match value {
        Value::Number(n) => vec![n.as_f64().expect("number") as f32],
        Value::Array(items) => items.iter().flat_map(numbers).collect(),
        other => panic!("expected numbers, found {other}"),
    }
}

/// `values` as nested JSON rows of `width`.
fn rows(values: &[f32], width: usize) -> Value {
    Value::Array(values.chunks(width).map(|row| json!(row)).collect())
}

fn image_rows(values: &[f32], rows: usize) -> Vec<Value> {
    let per_row = values.len() / rows;
    values
        .chunks(per_row)
        .map(|image| {
            Value::Array(
                image
                    .chunks(32 * 32)
                    .map(|plane| Value::Array(plane.chunks(32).map(|line| json!(line)).collect()))
                    .collect(),
            )
        })
        .collect()
}

#[tokio::test]
async fn rest_predictions_in_both_forms_equal_the_grpc_answer_on_every_example_model() {
    let server = Server::examples();
    let mut grpc = server.predict_client().await;
    let mut rest = client(&server);
    let batch = 3usize;

    // MLP: one input, bare rows.
    let x = values(1, batch * 64);
    let want = f32_values(
        &grpc
            .predict(predict_request("mlp", vec![("x", f32_content(&[3, 64], &x))]))
            .await
            .expect("grpc")
            .into_inner()
            .outputs["logits"],
    );
    let row = post(&mut rest, "/v1/models/mlp:predict", &json!({ "instances": rows(&x, 64) })).await;
    assert_eq!(numbers(&row["predictions"]), want, "mlp, row form");
    assert_eq!(row["predictions"].as_array().map(Vec::len), Some(batch), "one prediction per instance");
    let columnar = post(&mut rest, "/v1/models/mlp:predict", &json!({ "inputs": rows(&x, 64) })).await;
    assert_eq!(numbers(&columnar["outputs"]), want, "mlp, columnar form");

    // CNN: one named input, rank 4.
    let image = values(2, batch * 3 * 32 * 32);
    let want = f32_values(
        &grpc
            .predict(predict_request("cnn", vec![("image", f32_content(&[3, 3, 32, 32], &image))]))
            .await
            .expect("grpc")
            .into_inner()
            .outputs["logits"],
    );
    let instances: Vec<Value> = image_rows(&image, batch).into_iter().map(|i| json!({ "image": i })).collect();
    let row = post(&mut rest, "/v1/models/cnn:predict", &json!({ "instances": instances })).await;
    assert_eq!(numbers(&row["predictions"]), want, "cnn, row form");
    let columnar =
        post(&mut rest, "/v1/models/cnn:predict", &json!({ "inputs": { "image": image_rows(&image, batch) } })).await;
    assert_eq!(numbers(&columnar["outputs"]), want, "cnn, columnar form");

    // Recommender: two inputs of two dtypes.
    let dense = values(3, batch * 13);
    let id_values = ids(4, batch * 4, 1000);
    let want = f32_values(
        &grpc
            .predict(predict_request(
                "recommender",
                vec![("dense", f32_content(&[3, 13], &dense)), ("ids", i64_content(&[3, 4], &id_values))],
            ))
            .await
            .expect("grpc")
            .into_inner()
            .outputs["score"],
    );
    let instances: Vec<Value> = (0..batch)
        .map(|r| json!({ "dense": &dense[r * 13..(r + 1) * 13], "ids": &id_values[r * 4..(r + 1) * 4] }))
        .collect();
    let row = post(&mut rest, "/v1/models/recommender:predict", &json!({ "instances": instances })).await;
    assert_eq!(numbers(&row["predictions"]), want, "recommender, row form");
    let id_rows: Vec<&[i64]> = id_values.chunks(4).collect();
    let columnar = post(
        &mut rest,
        "/v1/models/recommender:predict",
        &json!({ "signature_name": "serving_default", "inputs": { "dense": rows(&dense, 13), "ids": id_rows } }),
    )
    .await;
    assert_eq!(numbers(&columnar["outputs"]), want, "recommender, columnar form");

    // Versions and labels select what serves, as on gRPC.
    for (path, version) in [("mlp/versions/1", 1), ("mlp/labels/canary", 2), ("mlp/labels/stable", 1)] {
        let mut request = predict_request("mlp", vec![("x", f32_content(&[3, 64], &x))]);
        request.model_spec = spec("mlp", Some(version));
        let want = f32_values(&grpc.predict(request).await.expect("grpc").into_inner().outputs["logits"]);
        let got = post(&mut rest, &format!("/v1/models/{path}:predict"), &json!({ "instances": rows(&x, 64) })).await;
        assert_eq!(numbers(&got["predictions"]), want, "{path}");
    }
}

#[tokio::test]
async fn every_dtype_and_several_outputs_round_trip_through_json() {
    let server = Server::examples();
    let mut rest = client(&server);
    let inputs = json!({
        "in_f32": [[1.5, -2.25, 3.0]],
        "in_f64": [[1e300, -1e-300, 0.5]],
        "in_f16": [[1.5, -2.0, 65504.0]],
        "in_i8": [[-128, 0, 127]],
        "in_i16": [[-32768, 1, 32767]],
        "in_i32": [[i32::MIN, 0, i32::MAX]],
        "in_i64": [[i64::MIN, 0, i64::MAX]],
        "in_u8": [[0, 128, 255]],
        "in_u16": [[0, 1, 65535]],
        "in_u32": [[0, 1, u32::MAX]],
        "in_u64": [[0, 1, u64::MAX]],
        "in_b": [[true, false, true]],
        // ONNX Runtime strings are UTF-8, so bytes sent as base64 must
        // decode to text; they come back as that text.
        "in_s": [["a", "é∑", { "b64": "aGk=" }]],
    });
    let answer = post(&mut rest, "/v1/models/dtypes:predict", &json!({ "inputs": inputs })).await;
    let outputs = answer["outputs"].as_object().expect("one entry per output");
    assert_eq!(outputs.len(), 13);
    for (name, sent) in inputs.as_object().expect("object") {
        let got = &outputs[&name.replace("in_", "out_")];
        let sent = if name == "in_s" { &json!([["a", "é∑", "hi"]]) } else { sent };
        assert_eq!(got, sent, "{name}: what went in comes back");
    }
    // Row form with several outputs: one object per instance.
    let instance: serde_json::Map<String, Value> =
        inputs.as_object().expect("object").iter().map(|(k, v)| (k.clone(), v[0].clone())).collect();
    let answer =
        post(&mut rest, "/v1/models/dtypes:predict", &json!({ "instances": [instance.clone(), instance] })).await;
    let predictions = answer["predictions"].as_array().expect("predictions");
    assert_eq!(predictions.len(), 2);
    assert_eq!(predictions[1]["out_i64"], json!([i64::MIN, 0, i64::MAX]));
    assert_eq!(predictions[0]["out_s"], json!(["a", "é∑", "hi"]));
}

#[tokio::test]
async fn status_and_metadata_answer_as_tf_serving_does() {
    let server = Server::examples();
    let mut rest = client(&server);
    let status = call(&mut rest, Method::GET, "/v1/models/mlp", "").await;
    assert_eq!(status.status, StatusCode::OK, "{}", status.text());
    let status: Value = serde_json::from_slice(&status.body).expect("JSON");
    let versions: Vec<&str> = status["model_version_status"]
        .as_array()
        .expect("model_version_status")
        .iter()
        .map(|v| {
            assert_eq!(v["state"], "AVAILABLE");
            assert_eq!(v["status"]["error_code"], "OK");
            v["version"].as_str().expect("int64 as a string, as proto3 JSON writes it")
        })
        .collect();
    assert_eq!(versions, vec!["1", "2"]);
    let one = call(&mut rest, Method::GET, "/v1/models/mlp/versions/1", "").await;
    let one: Value = serde_json::from_slice(&one.body).expect("JSON");
    assert_eq!(one["model_version_status"].as_array().map(Vec::len), Some(1));

    let metadata = call(&mut rest, Method::GET, "/v1/models/recommender/metadata", "").await;
    assert_eq!(metadata.status, StatusCode::OK, "{}", metadata.text());
    let metadata: Value = serde_json::from_slice(&metadata.body).expect("JSON");
    assert_eq!(metadata["model_spec"]["name"], "recommender");
    assert_eq!(metadata["model_spec"]["version"], "1");
    let signature = &metadata["metadata"]["signature_def"]["signature_def"]["serving_default"];
    assert_eq!(signature["method_name"], "tensorflow/serving/predict");
    assert_eq!(signature["inputs"]["ids"]["dtype"], "DT_INT64");
    assert_eq!(signature["inputs"]["dense"]["dtype"], "DT_FLOAT");
    assert_eq!(
        signature["inputs"]["dense"]["tensor_shape"]["dim"],
        json!([{ "size": "-1", "name": "" }, { "size": "13", "name": "" }])
    );
    assert!(signature["outputs"]["score"].is_object(), "{signature}");
}

#[tokio::test]
async fn each_bad_rest_request_gets_its_status_and_a_message_and_the_server_keeps_serving() {
    let server = Server::examples();
    let mut rest = client(&server);
    let good = json!({ "instances": [vec![0.5f32; 64]] }).to_string();
    let cases: Vec<(Method, &str, String, StatusCode, &str)> = vec![
        (
            Method::POST,
            "/v1/models/mlp:predict",
            "{\"instances\": [1, 2".into(),
            StatusCode::BAD_REQUEST,
            "not valid JSON",
        ),
        (Method::POST, "/v1/models/mlp:predict", "[1, 2]".into(), StatusCode::BAD_REQUEST, "expected a JSON object"),
        (
            Method::POST,
            "/v1/models/mlp:predict",
            "{}".into(),
            StatusCode::BAD_REQUEST,
            "neither \"instances\" nor \"inputs\"",
        ),
        (
            Method::POST,
            "/v1/models/mlp:predict",
            json!({ "instances": [[1.0]], "inputs": [[1.0]] }).to_string(),
            StatusCode::BAD_REQUEST,
            "both \"instances\" and \"inputs\"",
        ),
        (
            Method::POST,
            "/v1/models/mlp:predict",
            json!({ "instances": [vec![0.5f32; 63]] }).to_string(),
            StatusCode::BAD_REQUEST,
            "64",
        ),
        (
            Method::POST,
            "/v1/models/mlp:predict",
            json!({ "instances": [vec![0.5f32; 64], vec![0.5f32; 32]] }).to_string(),
            StatusCode::BAD_REQUEST,
            "instance 1, input 'x' has shape [32], but instance 0 has [64]",
        ),
        (
            Method::POST,
            "/v1/models/mlp:predict",
            json!({ "instances": [[0.5, "one", 0.5]] }).to_string(),
            StatusCode::BAD_REQUEST,
            "value 1 is \"one\", but DT_FLOAT needs a number",
        ),
        (
            Method::POST,
            "/v1/models/recommender:predict",
            json!({ "inputs": { "dense": [vec![0.0f32; 13]], "ids": [[1.5, 2, 3, 4]] } }).to_string(),
            StatusCode::BAD_REQUEST,
            "input 'ids': value 0 is 1.5, but DT_INT64 needs an integer",
        ),
        (
            Method::POST,
            "/v1/models/recommender:predict",
            json!({ "inputs": { "dense": [vec![0.0f32; 13]] } }).to_string(),
            StatusCode::BAD_REQUEST,
            "missing input 'ids'",
        ),
        (
            Method::POST,
            "/v1/models/recommender:predict",
            json!({ "instances": [vec![0.0f32; 13]] }).to_string(),
            StatusCode::BAD_REQUEST,
            "the model has 2 inputs",
        ),
        (
            Method::POST,
            "/v1/models/mlp:predict",
            json!({ "instances": [] }).to_string(),
            StatusCode::BAD_REQUEST,
            "empty list",
        ),
        (
            Method::POST,
            "/v1/models/mlp:predict",
            json!({ "signature_name": "other", "instances": [vec![0.5f32; 64]] }).to_string(),
            StatusCode::BAD_REQUEST,
            "no signature 'other'",
        ),
        (Method::POST, "/v1/models/nope:predict", good.clone(), StatusCode::NOT_FOUND, "nope"),
        (Method::POST, "/v1/models/mlp/versions/9:predict", good.clone(), StatusCode::NOT_FOUND, "version 9"),
        // TF Serving: an unknown label is INVALID_ARGUMENT, 400.
        (Method::POST, "/v1/models/mlp/labels/beta:predict", good.clone(), StatusCode::BAD_REQUEST, "beta"),
        (
            Method::POST,
            "/v1/models/mlp/versions/two:predict",
            good.clone(),
            StatusCode::BAD_REQUEST,
            "the version in the URL is 'two'",
        ),
        // TF Serving answers a wrong method or a path it cannot parse 400
        // "Malformed request".
        (Method::GET, "/v1/models/mlp:predict", String::new(), StatusCode::BAD_REQUEST, "Malformed request"),
        (Method::GET, "/v1/models/mlp/versions", String::new(), StatusCode::BAD_REQUEST, "Malformed request"),
        (
            Method::POST,
            "/v1/models/mlp:classify",
            good.clone(),
            StatusCode::BAD_REQUEST,
            "takes no tf.Examples, so it cannot answer Classify",
        ),
        (Method::POST, "/v1/models/mlp:explain", good.clone(), StatusCode::NOT_IMPLEMENTED, "':explain' is not served"),
        (Method::GET, "/v1/models/nope", String::new(), StatusCode::NOT_FOUND, "nope"),
        // As TF Serving: a path under /v1 that is no API is a malformed
        // request (400), and a name is split on the path's raw '/' and ':'
        // before it is decoded, so reserved characters make an unknown
        // model (404), not a malformed path.
        (Method::GET, "/v1/foo", String::new(), StatusCode::BAD_REQUEST, "Malformed request: GET /v1/foo"),
        (Method::POST, "/v1/foo", good.clone(), StatusCode::BAD_REQUEST, "Malformed request: POST /v1/foo"),
        (Method::GET, "/v1/models", String::new(), StatusCode::BAD_REQUEST, "Malformed request: GET /v1/models"),
        (Method::GET, "/v1/models/a%2Fb", String::new(), StatusCode::NOT_FOUND, "model 'a/b' is not served"),
        (Method::POST, "/v1/models/a%3Ab:predict", good.clone(), StatusCode::NOT_FOUND, "model 'a:b' is not served"),
        (Method::GET, "/v1/models/a!$&'()*+,;=@[]b", String::new(), StatusCode::NOT_FOUND, "is not served"),
        (Method::GET, "/v1/models/mlp/versions/7/metadata", String::new(), StatusCode::NOT_FOUND, "version 7"),
        (Method::GET, "/v2/models", String::new(), StatusCode::NOT_FOUND, "no such endpoint"),
    ];
    let mut failures = Vec::new();
    for (method, path, body, status, fragment) in cases {
        let response = call(&mut rest, method.clone(), path, &body).await;
        let answer: Value = serde_json::from_slice(&response.body).unwrap_or(Value::Null);
        let message = answer["error"].as_str().unwrap_or_default();
        if response.status != status || !message.contains(fragment) {
            failures.push(format!(
                "{method} {path} {body:.80}: got {} {:?}; expected {status} with {fragment:?}",
                response.status,
                response.text()
            ));
        }
        // And the server still answers a good request on the same connection.
        let after = call(&mut rest, Method::POST, "/v1/models/mlp:predict", &good).await;
        assert_eq!(after.status, StatusCode::OK, "after {method} {path}: {}", after.text());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Bytes that are not UTF-8 between the JSON's values are named as such.
    let mut body = br#"{"instances": [1, "#.to_vec();
    body.push(0xff);
    let answer = rest.call(Method::POST, "/v1/models/mlp:predict", &[], Bytes::from(body)).await.expect("call");
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{}", answer.text());
    assert!(answer.text().contains("invalid UTF-8 at byte 18"), "{}", answer.text());
}

#[tokio::test]
async fn an_oversized_body_is_refused_with_413_and_the_request_id_comes_back() {
    let server = Server::with_config(&format!("[server]\nmax_message_bytes = 65536\n{}", example_model_table("mlp")));
    let mut rest = client(&server);
    let big = json!({ "instances": vec![vec![0.5f32; 64]; 400] }).to_string();
    assert!(big.len() > 65536);
    let response = call(&mut rest, Method::POST, "/v1/models/mlp:predict", &big).await;
    assert_eq!(response.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", response.text());
    assert!(response.text().contains("the limit is 65536 bytes"), "{}", response.text());

    let good = json!({ "instances": [vec![0.5f32; 64]] }).to_string();
    let mut rest = client(&server);
    let response = rest
        .call(Method::POST, "/v1/models/mlp:predict", &[("x-request-id", "trace-42")], Bytes::from(good))
        .await
        .expect("call");
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    assert_eq!(response.headers.get("x-request-id").and_then(|v| v.to_str().ok()), Some("trace-42"));
}

#[tokio::test]
async fn a_json_body_with_more_values_than_the_limit_is_refused_before_it_is_parsed() {
    let server = Server::with_config(&format!("[server]\nmax_json_values = 1000\n{}", example_model_table("mlp")));
    let mut rest = client(&server);
    // 20 rows of 64 values: 1280 numbers, a few KB of text.
    let rows = json!({ "instances": vec![vec![0.5f32; 64]; 20] }).to_string();
    let v2 = json!({"inputs": [{"name": "x", "shape": [20, 64], "datatype": "FP32", "data": vec![0.5f32; 1280]}]})
        .to_string();
    for (path, body) in [("/v1/models/mlp:predict", rows), ("/v2/models/mlp/infer", v2)] {
        let response = call(&mut rest, Method::POST, path, &body).await;
        assert_eq!(response.status, StatusCode::TOO_MANY_REQUESTS, "{path}: {}", response.text());
        assert!(response.text().contains("more than 1000 values (server.max_json_values)"), "{}", response.text());
    }
    let good = json!({ "instances": vec![vec![0.5f32; 64]; 10] }).to_string();
    let response = call(&mut rest, Method::POST, "/v1/models/mlp:predict", &good).await;
    assert_eq!(response.status, StatusCode::OK, "640 values pass: {}", response.text());
}

#[tokio::test]
async fn high_rank_json_tensors_parse_past_serde_json_s_limit_and_absurd_nesting_is_refused_before_parsing() {
    let server = Server::examples();
    let mut client = client(&server);
    let nested = |rank: usize| format!("{}0.5{}", "[".repeat(rank), "]".repeat(rank));
    // Rank 130 is past serde_json's own recursion limit (128): TF Serving
    // parses it, and so does sluice, then refuses it for the model's rank.
    let body = format!("{{\"inputs\": {{\"x\": {}}}}}", nested(130));
    let response = call(&mut client, Method::POST, "/v1/models/mlp:predict", &body).await;
    assert_eq!(response.status, StatusCode::BAD_REQUEST, "{}", response.text());
    assert!(response.text().contains("(rank 130), but model 'mlp'"), "{}", response.text());
    let body = format!("{{\"inputs\": {{\"x\": {}}}}}", nested(255));
    let response = call(&mut client, Method::POST, "/v1/models/mlp:predict", &body).await;
    assert!(response.text().contains("input 'x' has more than 254 dimensions"), "{}", response.text());
    for path in ["/v1/models/mlp:predict", "/v1/models/mlp:classify", "/v2/models/mlp/infer"] {
        let response = call(&mut client, Method::POST, path, &nested(100_000)).await;
        assert_eq!(response.status, StatusCode::BAD_REQUEST, "{path}: {}", response.text());
        assert!(response.text().contains("nests more than 260 lists and objects deep"), "{path}: {}", response.text());
    }
    let x: Vec<f32> = values(3, 64);
    let answer = post(&mut client, "/v1/models/mlp:predict", &json!({ "instances": [x] })).await;
    assert!(answer["predictions"].is_array(), "still serving: {answer}");
}
