//! TF Serving's Classify, Regress, MultiInference and Predict over
//! `tf.Example`s, against the real server serving the census ONNX fixture
//! (`tests/fixtures/models/census`): the official Python client's answers
//! equal a TensorFlow SavedModel's of the same weights
//! (`tests/tfserving/examples_client.py`), GetModelMetadata lists the
//! classification and regression signatures, and every bad request gets
//! INVALID_ARGUMENT (or 400) naming the example and the feature — with the
//! server serving on afterwards.

mod common;

use bytes::Bytes;
use common::*;
use http::{Method, StatusCode};
use serde_json::{json, Value};
use sluice::cli::bench::client::RestClient;
use sluice::proto::tensorflow::serving::prediction_service_client::PredictionServiceClient;
use sluice::proto::tensorflow::serving::{
    input, ClassificationRequest, ExampleList, ExampleListWithContext, GetModelMetadataRequest, InferenceTask, Input,
    ModelSpec, MultiInferenceRequest, PredictRequest, RegressionRequest, SignatureDefMap,
};
use sluice::proto::tensorflow::Example;
use sluice::tensor::example::{bytes_feature, example, float_feature, int64_feature};
use tonic::transport::Channel;
use tonic::Code;

const CENSUS: &str = r#"
[[models]]
name = "census"
base_path = "$ROOT/tests/fixtures/models/census"
[models.batching]
max_batch_size = 64
batch_timeout_micros = 2000
[models.examples]
max_examples = 64
features = [
  { name = "age" },
  { name = "hours", default = 40.0 },
  { name = "extra", default = [0.0, 0.0, 0.0] },
  { name = "country", default = 0 },
]
classify = { scores = "probabilities", labels = ["low", "mid", "high"] }
regress = { output = "value" }

[[models]]
name = "mlp"
base_path = "$ROOT/examples/models/mlp"
"#;

fn census() -> Server {
    Server::with_config(CENSUS)
}

fn person(age: f32) -> Example {
    example([("age".to_string(), float_feature(vec![age]))])
}

/// Examples as the wire carries them (sluice's `ExampleList` keeps them
/// serialized, as TF Serving's lazy fields).
fn wire(examples: &[Example]) -> Vec<Bytes> {
    examples.iter().map(|e| Bytes::from(prost::Message::encode_to_vec(e))).collect()
}

fn list(examples: Vec<Example>) -> Option<Input> {
    Some(Input { kind: Some(input::Kind::ExampleList(ExampleList { examples: wire(&examples) })) })
}

fn model(name: &str, signature: &str) -> Option<ModelSpec> {
    Some(ModelSpec { name: name.to_string(), version_choice: None, signature_name: signature.to_string() })
}

fn classify(name: &str, signature: &str, input: Option<Input>) -> ClassificationRequest {
    ClassificationRequest { model_spec: model(name, signature), input }
}

async fn refused(client: &mut PredictionServiceClient<Channel>, request: ClassificationRequest) -> tonic::Status {
    client.classify(request).await.expect_err("refused")
}

#[test]
fn the_official_client_gets_what_a_tensorflow_savedmodel_of_the_same_weights_answers() {
    let server = census();
    assert_examples_client(&server, "census", &root().join(".cache/tf-savedmodels/census/1"), None, 12);
}

#[tokio::test]
async fn classify_regress_and_multi_inference_share_one_parse_and_agree_with_predict() {
    let server = census();
    let mut client = server.predict_client().await;
    let examples: Vec<Example> = (0..20)
        .map(|i| {
            example([
                ("age".to_string(), float_feature(vec![20.0 + i as f32 * 3.0])),
                ("extra".to_string(), float_feature(vec![0.1 * i as f32, -0.5, 0.25])),
                ("country".to_string(), int64_feature(vec![i % 5])),
            ])
        })
        .collect();
    let classified = client.classify(classify("census", "", list(examples.clone()))).await.expect("classify");
    let classified = classified.into_inner();
    assert_eq!(classified.model_spec.as_ref().map(|s| s.signature_name.as_str()), Some("serving_default"));
    let rows = classified.result.expect("result").classifications;
    assert_eq!(rows.len(), 20);
    for row in &rows {
        let labels: Vec<&str> = row.classes.iter().map(|c| c.label.as_str()).collect();
        assert_eq!(labels, ["low", "mid", "high"]);
        let total: f32 = row.classes.iter().map(|c| c.score).sum();
        assert!((total - 1.0).abs() < 1e-5, "softmax scores sum to {total}");
    }
    // The same rows as plain tensors through Predict: the parse fills
    // `hours` with its default.
    let ages: Vec<f32> = (0..20).map(|i| 20.0 + i as f32 * 3.0).collect();
    let extra: Vec<f32> = (0..20).flat_map(|i| [0.1 * i as f32, -0.5, 0.25]).collect();
    let predicted = client
        .predict(predict_request(
            "census",
            vec![
                ("age", f32_content(&[20, 1], &ages)),
                ("hours", f32_content(&[20, 1], &[40.0; 20])),
                ("extra", f32_content(&[20, 3], &extra)),
                ("country", i64_content(&[20, 1], &(0..20).map(|i| i % 5).collect::<Vec<_>>())),
            ],
        ))
        .await
        .expect("predict")
        .into_inner();
    let scores: Vec<f32> = rows.iter().flat_map(|r| r.classes.iter().map(|c| c.score)).collect();
    assert_close(&scores, &f32_values(&predicted.outputs["probabilities"]), 1e-6, "classify vs predict");
    let regressed = client
        .regress(RegressionRequest { model_spec: model("census", "regression"), input: list(examples.clone()) })
        .await
        .expect("regress")
        .into_inner();
    assert_eq!(regressed.model_spec.as_ref().map(|s| s.signature_name.as_str()), Some("regression"));
    let values: Vec<f32> = regressed.result.expect("result").regressions.iter().map(|r| r.value).collect();
    assert_close(&values, &f32_values(&predicted.outputs["value"]), 1e-6, "regress vs predict");
    let runs = "sluice_model_runs_total{model=\"census\",version=\"1\"}";
    let runs_before = server.metric(runs).await;
    let multi = client
        .multi_inference(MultiInferenceRequest {
            tasks: vec![
                InferenceTask { model_spec: model("census", "classification"), method_name: CLASSIFY.into() },
                InferenceTask { model_spec: model("census", "regression"), method_name: REGRESS.into() },
            ],
            input: list(examples),
        })
        .await
        .expect("multi inference")
        .into_inner();
    assert_eq!(multi.results.len(), 2);
    let signatures: Vec<&str> =
        multi.results.iter().filter_map(|r| r.model_spec.as_ref()).map(|s| s.signature_name.as_str()).collect();
    assert_eq!(signatures, ["classification", "regression"]);
    // Both tasks came from one run of the model.
    assert_eq!(server.metric(runs).await - runs_before, 1.0, "model runs for one MultiInference");
}

const CLASSIFY: &str = "tensorflow/serving/classify";
const REGRESS: &str = "tensorflow/serving/regress";

#[tokio::test]
async fn bad_examples_are_refused_naming_the_example_and_the_feature() {
    let server = census();
    let mut client = server.predict_client().await;
    let with = |extra: (&str, sluice::proto::tensorflow::Feature)| {
        let mut e = person(30.0);
        e.features.as_mut().expect("features").feature.insert(extra.0.to_string(), extra.1);
        e
    };
    let no_age = example([("hours".to_string(), float_feature(vec![1.0]))]);
    let cases: Vec<(Vec<Example>, &str)> = vec![
        (vec![person(1.0), person(2.0), no_age, person(3.0)], "example 2: feature 'age' is missing and has no default"),
        (
            vec![person(1.0), example([("age".to_string(), bytes_feature(vec![Bytes::from_static(b"41")]))])],
            "example 1: feature 'age' is a bytes_list, but input 'age' (DT_FLOAT) takes a float_list",
        ),
        (
            vec![with(("extra", float_feature(vec![1.0, 2.0])))],
            "example 0: feature 'extra' has 2 values, but it takes 3",
        ),
        (
            vec![with(("extra", float_feature(vec![0.5; 1_000_000])))],
            "example 0: feature 'extra' has 1000000 values, but it takes 3",
        ),
        (vec![with(("country", float_feature(vec![1.0])))], "feature 'country' is a float_list"),
        (vec![person(1.0); 65], "65 examples given, more than the 64 one request may carry (examples.max_examples)"),
        (vec![], "input is empty"),
    ];
    for (examples, expected) in cases {
        let status = refused(&mut client, classify("census", "", list(examples))).await;
        assert_eq!(status.code(), Code::InvalidArgument, "{expected}: {status:?}");
        assert!(status.message().contains(expected), "expected '{expected}' in: {}", status.message());
    }
    let status = refused(&mut client, classify("census", "", None)).await;
    assert!(status.message().contains("input is empty: set input.example_list"), "{status:?}");

    // Signatures, methods and models that cannot answer.
    let one = || list(vec![person(30.0)]);
    let status = refused(&mut client, classify("census", "regression", one())).await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("No signature was found with the name: \"regression\" for Classify"),
        "{status:?}"
    );
    let status = refused(&mut client, classify("mlp", "", one())).await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("takes no tf.Examples, so it cannot answer Classify"), "{status:?}");
    let status = refused(&mut client, classify("nope", "", one())).await;
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    let status = client
        .regress(RegressionRequest { model_spec: model("census", "classification"), input: one() })
        .await
        .expect_err("refused");
    assert!(status.message().contains("No signature was found with the name: \"classification\" for Regress"));

    let status = client
        .predict(PredictRequest { model_spec: model("census", "classification"), ..Default::default() })
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(
        status
            .message()
            .contains("signatures: [serving_default, classification (call Classify), regression (call Regress)]"),
        "{status:?}"
    );

    // MultiInference's own rules.
    let task = |name: &str, signature: &str, method: &str| InferenceTask {
        model_spec: model(name, signature),
        method_name: method.to_string(),
    };
    let multi_cases = [
        (vec![], "must specify at least one task"),
        (vec![task("census", "classification", CLASSIFY), task("mlp", "", CLASSIFY)], "same model name"),
        (vec![task("census", "", CLASSIFY), task("census", "classification", CLASSIFY)], "Duplicate evaluation"),
        (vec![task("census", "", "tensorflow/serving/predict")], "Unsupported signature method_name"),
    ];
    for (tasks, expected) in multi_cases {
        let status = client.multi_inference(MultiInferenceRequest { tasks, input: one() }).await.expect_err(expected);
        assert_eq!(status.code(), Code::InvalidArgument, "{expected}: {status:?}");
        assert!(status.message().contains(expected), "expected '{expected}' in: {}", status.message());
    }

    // Predict's examples input: strings only, each a tf.Example.
    let status = client
        .predict(predict_request("census", vec![("examples", f32_content(&[1], &[1.0]))]))
        .await
        .expect_err("refused");
    assert!(status.message().contains("it takes serialized tf.Examples: DT_STRING [examples]"), "{status:?}");
    let status = client
        .predict(predict_request("census", vec![("examples", string_tensor(&[2], &["", "\u{ff}garbage"]))]))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("input 'examples': example 1 is not a valid serialized tf.Example"),
        "{status:?}"
    );

    // Still serving, with context.
    let context = example([("country".to_string(), int64_feature(vec![4]))]);
    let input = Some(Input {
        kind: Some(input::Kind::ExampleListWithContext(ExampleListWithContext {
            examples: wire(&[person(33.0), person(44.0)]),
            context: Bytes::from(prost::Message::encode_to_vec(&context)),
        })),
    });
    let answer = client.classify(classify("census", "classification", input)).await.expect("still serving");
    assert_eq!(answer.into_inner().result.expect("result").classifications.len(), 2);
}

#[tokio::test]
async fn metadata_lists_the_classification_and_regression_signatures() {
    let server = census();
    let mut client = server.predict_client().await;
    let response = client
        .get_model_metadata(GetModelMetadataRequest {
            model_spec: model("census", ""),
            metadata_field: vec!["signature_def".to_string()],
        })
        .await
        .expect("metadata")
        .into_inner();
    let any = &response.metadata["signature_def"];
    let map: SignatureDefMap = prost::Message::decode(any.value.as_ref()).expect("SignatureDefMap");
    let method = |key: &str| map.signature_def.get(key).map(|def| def.method_name.as_str());
    assert_eq!(method("serving_default"), Some("tensorflow/serving/predict"));
    assert_eq!(method("classification"), Some(CLASSIFY));
    assert_eq!(method("regression"), Some(REGRESS));
    let classification = &map.signature_def["classification"];
    let mut outputs: Vec<&str> = classification.outputs.keys().map(String::as_str).collect();
    outputs.sort();
    assert_eq!(outputs, ["classes", "scores"]);
    assert_eq!(classification.inputs["inputs"].dtype, 7, "inputs is DT_STRING");
    let dims: Vec<i64> = classification.outputs["scores"]
        .tensor_shape
        .as_ref()
        .map(|s| s.dim.iter().map(|d| d.size).collect())
        .unwrap_or_default();
    assert_eq!(dims, [-1, 3]);

    let mut rest = RestClient::new(&server.http.to_string()).expect("REST client");
    let answer = rest.call(Method::GET, "/v1/models/census/metadata", &[], Bytes::new()).await.expect("REST metadata");
    let body: Value = serde_json::from_slice(&answer.body).expect("JSON");
    let defs = &body["metadata"]["signature_def"]["signature_def"];
    assert_eq!(defs["regression"]["method_name"], json!(REGRESS));
    assert_eq!(defs["classification"]["outputs"]["scores"]["dtype"], json!("DT_FLOAT"));
    // A model without examples has only its predict signature.
    let mlp = client
        .get_model_metadata(GetModelMetadataRequest {
            model_spec: model("mlp", ""),
            metadata_field: vec!["signature_def".to_string()],
        })
        .await
        .expect("metadata")
        .into_inner();
    let map: SignatureDefMap = prost::Message::decode(mlp.metadata["signature_def"].value.as_ref()).expect("map");
    assert_eq!(map.signature_def.keys().collect::<Vec<_>>(), ["serving_default"]);
}

#[tokio::test]
async fn rest_classify_and_regress_refuse_bad_bodies_with_400_naming_the_field() {
    let server = census();
    let mut rest = RestClient::new(&server.http.to_string()).expect("REST client");
    let mut post = async |path: &str, body: &str| {
        let response = rest.call(Method::POST, path, &[], Bytes::from(body.to_string())).await.expect("call");
        (response.status, response.text())
    };
    let (status, text) = post("/v1/models/census:regress", r#"{"examples": [{"age": 40}, {"age": 50.5}]}"#).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let body: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(body["result"].as_array().map(Vec::len), Some(2));
    let cases = [
        ("/v1/models/census:classify", r#"{"instances": []}"#, "no \\\"examples\\\" list"),
        ("/v1/models/census:classify", r#"{"examples": [{"age": 1}, 7]}"#, "examples[1] is not an object"),
        ("/v1/models/census:classify", r#"{"examples": [{"age": "old"}]}"#, "examples[0].age: value 0 is \\\"old\\\""),
        ("/v1/models/census:classify", r#"{"examples": [{"age": 1, "country": 1.5}]}"#, "whole numbers"),
        ("/v1/models/census:classify", r#"{"examples": [{"hours": 1}]}"#, "example 0: feature 'age' is missing"),
        ("/v1/models/census:classify", r#"{"examples": [{"age": 1}], "signature_name": "x"}"#, "No signature"),
        ("/v1/models/mlp:classify", r#"{"examples": [{"age": 1}]}"#, "takes no tf.Examples"),
        ("/v1/models/census:regress", r#"{"examples": [], "context": {"age": 1}}"#, "input is empty"),
        ("/v1/models/census:classify", r#"[1]"#, "not a JSON object"),
    ];
    for (path, body, expected) in cases {
        let (status, text) = post(path, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {body}: {text}");
        assert!(text.contains(expected), "{path} {body}: expected '{expected}' in {text}");
    }
    let (status, text) = post("/v1/models/nope:classify", r#"{"examples": [{"age": 1}]}"#).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    let response = rest.call(Method::GET, "/v1/models/census:classify", &[], Bytes::new()).await.expect("call");
    assert_eq!(response.status, StatusCode::BAD_REQUEST, "{}", response.text());
    assert!(response.text().contains("Malformed request"), "{}", response.text());
}

#[test]
fn an_examples_config_that_does_not_fit_the_model_stops_the_start_naming_the_feature() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (table, expected) in [
        ("features = [{ name = \"age\" }]\nregress = { output = \"value\" }", "no feature fills input 'hours'"),
        (
            "features = [{ name = \"age\" }, { name = \"hours\" }, { name = \"extra\", shape = [4] }, \
             { name = \"country\" }]",
            "feature 'extra' (input 'extra'",
        ),
        (
            "features = [{ name = \"age\" }, { name = \"hours\" }, { name = \"extra\" }, { name = \"country\" }]\n\
             classify = { classes = \"probabilities\" }",
            "Classify needs DT_STRING [batch, classes]",
        ),
        (
            "features = [{ name = \"age\" }, { name = \"hours\" }, { name = \"extra\" }, { name = \"country\" }]\n\
             classify = { scores = \"probabilities\", labels = [\"a\", \"b\"] }",
            "labels has 2 names, but the scores",
        ),
    ] {
        let path = dir.path().join("bad.toml");
        let text = format!(
            "[[models]]\nname = \"census\"\nbase_path = \"{}\"\n[models.examples]\n{table}\n",
            root().join("tests/fixtures/models/census").display()
        );
        std::fs::write(&path, text).expect("write");
        let (code, stdout, stderr) = run_sluice(&["config", "check", path.to_str().expect("utf-8")]);
        assert_ne!(code, Some(0), "{table}: accepted\n{stdout}");
        assert!(stderr.contains(expected), "{table}: expected '{expected}' in {stderr}");
    }
}
