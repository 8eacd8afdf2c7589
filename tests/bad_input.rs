//! Bad requests get the right gRPC code and a message that says what was
//! wrong, and the server answers a good request right after each one.

mod common;

use bytes::Bytes;
use common::*;
use sluice::proto::tensorflow::serving::prediction_service_client::PredictionServiceClient;
use sluice::proto::tensorflow::serving::{
    model_spec, GetModelMetadataRequest, GetModelStatusRequest, ModelSpec, PredictRequest,
};
use sluice::proto::tensorflow::{DataType, TensorProto};
use tonic::transport::Channel;
use tonic::Code;

fn good_mlp() -> PredictRequest {
    predict_request("mlp", vec![("x", f32_content(&[2, 64], &values(1, 128)))])
}

async fn assert_still_serving(client: &mut PredictionServiceClient<Channel>, after: &str) {
    let response = client
        .predict(good_mlp())
        .await
        .unwrap_or_else(|e| panic!("a good request after '{after}' failed: {e}"))
        .into_inner();
    assert_eq!(dims(&response.outputs["logits"]), vec![2, 10], "after '{after}'");
}

struct Case {
    what: &'static str,
    request: PredictRequest,
    code: Code,
    /// Every one of these must appear in the message.
    says: Vec<&'static str>,
}

fn with_spec(mut request: PredictRequest, spec: ModelSpec) -> PredictRequest {
    request.model_spec = Some(spec);
    request
}

fn cases() -> Vec<Case> {
    let x_ok = f32_content(&[2, 64], &values(2, 128));
    vec![
        Case {
            what: "unknown model",
            request: predict_request("nope", vec![("x", x_ok.clone())]),
            code: Code::NotFound,
            says: vec!["model 'nope' is not served"],
        },
        Case {
            what: "unknown version",
            request: with_spec(
                good_mlp(),
                ModelSpec {
                    name: "mlp".into(),
                    version_choice: Some(model_spec::VersionChoice::Version(9)),
                    signature_name: String::new(),
                },
            ),
            code: Code::NotFound,
            says: vec!["version 9", "1, 2"],
        },
        Case {
            what: "unknown version label",
            request: with_spec(
                good_mlp(),
                ModelSpec {
                    name: "mlp".into(),
                    version_choice: Some(model_spec::VersionChoice::VersionLabel("beta".into())),
                    signature_name: String::new(),
                },
            ),
            // TF Serving: "Unrecognized servable version label".
            code: Code::InvalidArgument,
            says: vec!["label 'beta'", "canary", "stable"],
        },
        Case {
            what: "unknown signature",
            request: with_spec(
                good_mlp(),
                ModelSpec { name: "mlp".into(), version_choice: None, signature_name: "classify".into() },
            ),
            code: Code::FailedPrecondition,
            says: vec!["signature 'classify'", "serving_default"],
        },
        Case {
            what: "missing model_spec",
            request: PredictRequest { model_spec: None, ..good_mlp() },
            code: Code::InvalidArgument,
            says: vec!["model_spec"],
        },
        Case {
            what: "empty request",
            request: predict_request("mlp", vec![]),
            code: Code::InvalidArgument,
            says: vec!["no inputs", "[x]"],
        },
        Case {
            what: "missing input",
            request: predict_request("recommender", vec![("dense", f32_content(&[1, 13], &values(3, 13)))]),
            code: Code::InvalidArgument,
            says: vec!["missing input 'ids'", "DT_INT64"],
        },
        Case {
            what: "unexpected input",
            request: predict_request("mlp", vec![("x", x_ok.clone()), ("y", x_ok.clone())]),
            code: Code::InvalidArgument,
            says: vec!["unexpected input 'y'", "[x]"],
        },
        Case {
            what: "wrong dtype",
            request: predict_request("mlp", vec![("x", i64_content(&[2, 64], &[0; 128]))]),
            code: Code::InvalidArgument,
            says: vec!["input 'x'", "DT_INT64", "expects DT_FLOAT"],
        },
        Case {
            what: "wrong rank",
            request: predict_request("mlp", vec![("x", f32_content(&[2, 8, 8], &values(4, 128)))]),
            code: Code::InvalidArgument,
            says: vec!["input 'x'", "rank 3", "expects rank 2", "[-1, 64]"],
        },
        Case {
            what: "wrong fixed dim",
            request: predict_request("mlp", vec![("x", f32_content(&[2, 63], &values(5, 126)))]),
            code: Code::InvalidArgument,
            says: vec!["input 'x'", "dimension 1 = 63", "expects 64"],
        },
        Case {
            what: "tensor_content length mismatch",
            request: predict_request(
                "mlp",
                vec![("x", TensorProto { tensor_content: Bytes::from(vec![0u8; 100]), ..f32_content(&[2, 64], &[]) })],
            ),
            code: Code::InvalidArgument,
            says: vec!["input 'x'", "100 bytes", "512 bytes"],
        },
        Case {
            what: "dims whose product overflows",
            request: predict_request("mlp", vec![("x", f32_content(&[i64::MAX / 2, 64], &[]))]),
            code: Code::InvalidArgument,
            says: vec!["input 'x'", "overflows"],
        },
        Case {
            what: "negative dim",
            request: predict_request("mlp", vec![("x", f32_content(&[-2, 64], &[]))]),
            code: Code::InvalidArgument,
            says: vec!["input 'x'", "dimension 0 is -2"],
        },
        Case {
            what: "string where float expected",
            request: predict_request(
                "mlp",
                vec![(
                    "x",
                    TensorProto {
                        dtype: DataType::DtString as i32,
                        tensor_shape: shape(&[1, 64]),
                        string_val: vec![Bytes::from_static(b"1.0"); 64],
                        ..Default::default()
                    },
                )],
            ),
            code: Code::InvalidArgument,
            says: vec!["input 'x'", "DT_STRING", "expects DT_FLOAT"],
        },
        Case {
            what: "strings in a float tensor",
            request: predict_request(
                "mlp",
                vec![(
                    "x",
                    TensorProto {
                        dtype: DataType::DtFloat as i32,
                        tensor_shape: shape(&[1, 64]),
                        string_val: vec![Bytes::from_static(b"1.0"); 64],
                        ..Default::default()
                    },
                )],
            ),
            code: Code::InvalidArgument,
            says: vec!["input 'x'", "string_val", "float_val or tensor_content"],
        },
        Case {
            what: "too few typed values",
            request: predict_request("mlp", vec![("x", f32_typed(&[2, 64], &[1.0, 2.0, 3.0]))]),
            code: Code::InvalidArgument,
            says: vec!["input 'x'", "float_val has 3 values", "128"],
        },
        Case {
            what: "unset dtype",
            request: predict_request(
                "mlp",
                vec![("x", TensorProto { dtype: 0, ..f32_content(&[2, 64], &values(6, 128)) })],
            ),
            code: Code::InvalidArgument,
            says: vec!["input 'x'", "DT_INVALID"],
        },
        Case {
            what: "unsupported dtype",
            request: predict_request(
                "mlp",
                vec![("x", TensorProto { dtype: DataType::DtQint8 as i32, ..f32_content(&[2, 64], &values(6, 128)) })],
            ),
            code: Code::InvalidArgument,
            says: vec!["input 'x'", "DT_QINT8"],
        },
        Case {
            what: "a served dtype the model does not take",
            request: predict_request(
                "mlp",
                vec![(
                    "x",
                    // 128 complex values: 256 floats, (real, imaginary) pairs.
                    TensorProto { dtype: DataType::DtComplex64 as i32, ..f32_content(&[2, 64], &values(6, 256)) },
                )],
            ),
            code: Code::InvalidArgument,
            says: vec!["input 'x'", "DT_COMPLEX64", "DT_FLOAT"],
        },
        Case {
            what: "rows disagree between inputs",
            request: predict_request(
                "recommender",
                vec![("dense", f32_content(&[2, 13], &values(7, 26))), ("ids", i64_content(&[3, 4], &[1; 12]))],
            ),
            code: Code::InvalidArgument,
            says: vec!["3 rows", "2", "dimension 0"],
        },
        Case {
            what: "embedding id out of range",
            request: predict_request(
                "recommender",
                vec![("dense", f32_content(&[1, 13], &values(8, 13))), ("ids", i64_content(&[1, 4], &[1, 2, 3, 5000]))],
            ),
            code: Code::InvalidArgument,
            says: vec!["model rejected the input"],
        },
        Case {
            what: "unknown output in output_filter",
            request: PredictRequest { output_filter: vec!["probabilities".into()], ..good_mlp() },
            code: Code::InvalidArgument,
            says: vec!["output_filter", "'probabilities'", "[logits]"],
        },
        Case {
            what: "zero rows",
            request: predict_request("mlp", vec![("x", f32_content(&[0, 64], &[]))]),
            code: Code::InvalidArgument,
            says: vec!["0 rows"],
        },
    ]
}

#[tokio::test]
async fn each_bad_predict_gets_its_code_and_a_message_and_the_server_keeps_serving() {
    let server = Server::examples();
    let mut client = server.predict_client().await;
    assert_still_serving(&mut client, "start").await;
    for case in cases() {
        let status = client.predict(case.request).await.err().unwrap_or_else(|| panic!("'{}' was accepted", case.what));
        assert_eq!(status.code(), case.code, "'{}': {}", case.what, status.message());
        for fragment in &case.says {
            assert!(
                status.message().contains(fragment),
                "'{}': message {:?} does not mention {fragment:?}",
                case.what,
                status.message()
            );
        }
        assert_still_serving(&mut client, case.what).await;
    }
}

#[tokio::test]
async fn bad_metadata_and_status_requests_are_refused_with_reasons() {
    let server = Server::examples();
    let mut client = server.predict_client().await;
    let status = client
        .get_model_metadata(GetModelMetadataRequest { model_spec: spec("mlp", None), metadata_field: vec![] })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("signature_def"), "{}", status.message());

    let status = client
        .get_model_metadata(GetModelMetadataRequest {
            model_spec: spec("mlp", None),
            metadata_field: vec!["graph".into()],
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("\"graph\""), "{}", status.message());

    let status = client
        .get_model_metadata(GetModelMetadataRequest {
            model_spec: spec("nope", None),
            metadata_field: vec!["signature_def".into()],
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);

    let mut models = server.model_client().await;
    let status = models.get_model_status(GetModelStatusRequest { model_spec: spec("mlp", Some(5)) }).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    assert!(status.message().contains("version 5"), "{}", status.message());
    let status = models.get_model_status(GetModelStatusRequest { model_spec: None }).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_still_serving(&mut client, "metadata and status errors").await;
}

#[tokio::test]
async fn a_message_over_the_size_limit_is_refused_and_the_server_keeps_serving() {
    let config = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(
        config.path(),
        format!(
            "[server]\nmax_message_bytes = 65536\n[[models]]\nname = \"mlp\"\nbase_path = \"{}\"\n",
            root().join("examples/models/mlp").display()
        ),
    )
    .expect("write config");
    let server = Server::start(&["--model_config_file", config.path().to_str().unwrap()]);
    let mut client = server.predict_client().await;
    let big = predict_request("mlp", vec![("x", f32_content(&[512, 64], &values(9, 512 * 64)))]);
    let status = client.predict(big).await.unwrap_err();
    // Refused before sluice decodes it, with RESOURCE_EXHAUSTED as TF
    // Serving (gRPC C++) answers, not tonic's OUT_OF_RANGE.
    assert_eq!(status.code(), Code::ResourceExhausted, "{}", status.message());
    assert!(status.message().contains("65536"), "{}", status.message());
    assert!(status.message().contains("server.max_message_bytes"), "{}", status.message());
    assert_still_serving(&mut client, "oversized message").await;
}

#[tokio::test]
async fn an_unknown_model_is_refused_without_the_served_names_unless_the_operator_lists_them() {
    let models = |server_keys: &str| {
        format!(
            "[server]\n{server_keys}\n[[models]]\nname = \"secret-ranker\"\nbase_path = \"$ROOT/examples/models/mlp\"\n"
        )
    };
    // As TF Serving: the names served are not told to whoever asks.
    let server = Server::with_config(&models(""));
    let mut client = server.predict_client().await;
    let mut request = good_mlp();
    request.model_spec = spec("nope", None);
    let err = client.predict(request.clone()).await.expect_err("unknown model");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(err.message().contains("model 'nope' is not served"), "{}", err.message());
    assert!(!err.message().contains("secret-ranker"), "the served names leak: {}", err.message());
    let rest = http_post(server.http, "/v1/models/nope:predict", "{\"instances\": [[1]]}").await;
    assert!(rest.contains("is not served") && !rest.contains("secret-ranker"), "{rest}");
    // Listed where the operator asks for it (a development server).
    let listing = Server::with_config(&models("list_models_in_errors = true"));
    let err = listing.predict_client().await.predict(request).await.expect_err("unknown model");
    assert!(err.message().contains("served: [secret-ranker]"), "{}", err.message());
}

#[test]
fn a_zipmap_classifier_output_is_refused_naming_the_converter_option_that_avoids_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("sluice.toml");
    let base = root().join("tests/fixtures/models/zipmap");
    std::fs::write(&config, format!("[[models]]\nname = \"classifier\"\nbase_path = \"{}\"\n", base.display()))
        .expect("config");
    let stderr = serve_refused(&config);
    assert!(stderr.contains("model output 'probabilities'") && stderr.contains("ZipMap"), "{stderr}");
    assert!(stderr.contains("'zipmap': False") && stderr.contains("zipmap=False"), "{stderr}");
}
