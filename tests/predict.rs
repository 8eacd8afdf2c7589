//! Predict, GetModelMetadata and GetModelStatus against the real server,
//! with outputs compared to ONNX Runtime run directly on the same inputs.

mod common;

use std::collections::HashMap;

use bytes::Bytes;
use common::*;
use sluice::proto::tensorflow::serving::{
    model_spec, model_version_status, GetModelStatusRequest, ModelSpec, PredictRequest,
};
use sluice::proto::tensorflow::{DataType, TensorProto};

const TOLERANCE: f32 = 1e-5;

fn mlp_request(batch: i64, seed: u64, typed: bool) -> (PredictRequest, Vec<f32>) {
    let x = values(seed, batch as usize * 64);
    let tensor = if typed { f32_typed(&[batch, 64], &x) } else { f32_content(&[batch, 64], &x) };
    (predict_request("mlp", vec![("x", tensor)]), x)
}

#[tokio::test]
async fn each_example_model_matches_onnx_runtime_at_batch_1_7_32() {
    let server = Server::examples();
    let mut client = server.predict_client().await;
    for batch in [1i64, 7, 32] {
        for typed in [false, true] {
            let how = if typed { "typed values" } else { "tensor_content" };

            let (request, x) = mlp_request(batch, batch as u64, typed);
            let response = client.predict(request).await.expect("mlp predict").into_inner();
            let logits = &response.outputs["logits"];
            let (want_shape, want) =
                reference(&example_model("mlp", 2), vec![("x", RefInput::F32(vec![batch, 64], x))], "logits");
            assert_eq!(dims(logits), want_shape, "mlp batch {batch} {how}: shape");
            assert_close(&f32_values(logits), &want, TOLERANCE, &format!("mlp batch {batch} {how}"));

            let image = values(100 + batch as u64, batch as usize * 3 * 32 * 32);
            let tensor =
                if typed { f32_typed(&[batch, 3, 32, 32], &image) } else { f32_content(&[batch, 3, 32, 32], &image) };
            let response = client
                .predict(predict_request("cnn", vec![("image", tensor)]))
                .await
                .expect("cnn predict")
                .into_inner();
            let (want_shape, want) = reference(
                &example_model("cnn", 1),
                vec![("image", RefInput::F32(vec![batch, 3, 32, 32], image))],
                "logits",
            );
            let logits = &response.outputs["logits"];
            assert_eq!(dims(logits), want_shape, "cnn batch {batch} {how}: shape");
            assert_close(&f32_values(logits), &want, TOLERANCE, &format!("cnn batch {batch} {how}"));

            let dense = values(200 + batch as u64, batch as usize * 13);
            let id_values = ids(300 + batch as u64, batch as usize * 4, 1000);
            let (dense_t, ids_t) = if typed {
                (f32_typed(&[batch, 13], &dense), i64_typed(&[batch, 4], &id_values))
            } else {
                (f32_content(&[batch, 13], &dense), i64_content(&[batch, 4], &id_values))
            };
            let response = client
                .predict(predict_request("recommender", vec![("dense", dense_t), ("ids", ids_t)]))
                .await
                .expect("recommender predict")
                .into_inner();
            let (want_shape, want) = reference(
                &example_model("recommender", 1),
                vec![
                    ("dense", RefInput::F32(vec![batch, 13], dense)),
                    ("ids", RefInput::I64(vec![batch, 4], id_values)),
                ],
                "score",
            );
            let score = &response.outputs["score"];
            assert_eq!(dims(score), want_shape, "recommender batch {batch} {how}: shape");
            assert_close(&f32_values(score), &want, TOLERANCE, &format!("recommender batch {batch} {how}"));
        }
    }
}

#[tokio::test]
async fn a_single_typed_value_fills_the_shape() {
    let server = Server::examples();
    let mut client = server.predict_client().await;
    let response = client
        .predict(predict_request("mlp", vec![("x", f32_typed(&[3, 64], &[0.25]))]))
        .await
        .expect("predict")
        .into_inner();
    let (_, want) =
        reference(&example_model("mlp", 2), vec![("x", RefInput::F32(vec![3, 64], vec![0.25; 192]))], "logits");
    assert_close(&f32_values(&response.outputs["logits"]), &want, TOLERANCE, "broadcast");
}

#[tokio::test]
async fn explicit_versions_and_labels_select_the_version_that_serves() {
    let server = Server::examples();
    let mut client = server.predict_client().await;
    let x = values(7, 2 * 64);
    let want_v1 = reference(&example_model("mlp", 1), vec![("x", RefInput::F32(vec![2, 64], x.clone()))], "logits").1;
    let want_v2 = reference(&example_model("mlp", 2), vec![("x", RefInput::F32(vec![2, 64], x.clone()))], "logits").1;
    assert!(want_v1 != want_v2, "the two versions must differ for this test to mean anything");

    let cases: Vec<(Option<model_spec::VersionChoice>, i64, &Vec<f32>)> = vec![
        (None, 2, &want_v2),
        (Some(model_spec::VersionChoice::Version(1)), 1, &want_v1),
        (Some(model_spec::VersionChoice::Version(2)), 2, &want_v2),
        (Some(model_spec::VersionChoice::VersionLabel("stable".into())), 1, &want_v1),
        (Some(model_spec::VersionChoice::VersionLabel("canary".into())), 2, &want_v2),
    ];
    for (choice, served, want) in cases {
        let request = PredictRequest {
            model_spec: Some(ModelSpec {
                name: "mlp".into(),
                version_choice: choice.clone(),
                signature_name: "serving_default".into(),
            }),
            inputs: HashMap::from([("x".to_string(), f32_content(&[2, 64], &x))]),
            output_filter: vec![],
        };
        let response = client.predict(request).await.expect("predict").into_inner();
        let spec = response.model_spec.expect("model_spec in the response");
        assert_eq!(spec.name, "mlp");
        assert_eq!(spec.version_choice, Some(model_spec::VersionChoice::Version(served)), "{choice:?}");
        assert_eq!(spec.signature_name, "serving_default");
        assert_close(&f32_values(&response.outputs["logits"]), want, TOLERANCE, &format!("{choice:?}"));
    }
}

#[tokio::test]
async fn every_dtype_survives_the_round_trip_and_output_filter_selects() {
    let server = Server::examples();
    let mut client = server.predict_client().await;
    let t = |dtype: DataType, f: &dyn Fn(&mut TensorProto)| {
        let mut proto = TensorProto { dtype: dtype as i32, tensor_shape: shape(&[1, 3]), ..Default::default() };
        f(&mut proto);
        proto
    };
    let inputs: Vec<(&str, TensorProto)> = vec![
        ("in_f32", t(DataType::DtFloat, &|p| p.float_val = vec![1.5, -2.25, 3.0])),
        ("in_f64", t(DataType::DtDouble, &|p| p.double_val = vec![1e300, -1e-300, 0.5])),
        (
            "in_f16",
            t(DataType::DtHalf, &|p| {
                p.half_val = [1.5f32, -2.0, 65504.0].iter().map(|v| half::f16::from_f32(*v).to_bits() as i32).collect()
            }),
        ),
        ("in_i8", t(DataType::DtInt8, &|p| p.int_val = vec![-128, 0, 127])),
        ("in_i16", t(DataType::DtInt16, &|p| p.int_val = vec![-32768, 1, 32767])),
        ("in_i32", t(DataType::DtInt32, &|p| p.int_val = vec![i32::MIN, 0, i32::MAX])),
        ("in_i64", t(DataType::DtInt64, &|p| p.int64_val = vec![i64::MIN, 0, i64::MAX])),
        ("in_u8", t(DataType::DtUint8, &|p| p.tensor_content = Bytes::from_static(&[0, 128, 255]))),
        ("in_u16", t(DataType::DtUint16, &|p| p.int_val = vec![0, 1, 65535])),
        ("in_u32", t(DataType::DtUint32, &|p| p.uint32_val = vec![0, 1, u32::MAX])),
        ("in_u64", t(DataType::DtUint64, &|p| p.uint64_val = vec![0, 1, u64::MAX])),
        ("in_b", t(DataType::DtBool, &|p| p.bool_val = vec![true, false, true])),
        (
            "in_s",
            t(DataType::DtString, &|p| {
                p.string_val = vec![Bytes::from_static(b"a"), Bytes::from_static("é∑".as_bytes()), Bytes::new()]
            }),
        ),
    ];
    let mut request = predict_request("dtypes", inputs.clone());
    let response = client.predict(request.clone()).await.expect("predict").into_inner();
    assert_eq!(response.outputs.len(), 13);
    for (name, sent) in &inputs {
        let out_name = name.replace("in_", "out_");
        let got = &response.outputs[&out_name];
        assert_eq!(got.dtype, sent.dtype, "{out_name} dtype");
        assert_eq!(dims(got), vec![1, 3], "{out_name} shape");
        let as_tensor = |p: &TensorProto| sluice::tensor::proto::decode("t", p.clone(), usize::MAX).expect("decode");
        assert_eq!(as_tensor(got), as_tensor(sent), "{out_name} values");
    }

    request.output_filter = vec!["out_i64".into(), "out_s".into()];
    let response = client.predict(request).await.expect("predict").into_inner();
    let mut keys: Vec<&String> = response.outputs.keys().collect();
    keys.sort();
    assert_eq!(keys, vec!["out_i64", "out_s"]);
}

#[tokio::test]
async fn metadata_signature_matches_each_model() {
    let server = Server::examples();
    type Io = Vec<(&'static str, DataType, Vec<i64>)>;
    let expected: Vec<(&str, Io, Io)> = vec![
        ("mlp", vec![("x", DataType::DtFloat, vec![-1, 64])], vec![("logits", DataType::DtFloat, vec![-1, 10])]),
        (
            "cnn",
            vec![("image", DataType::DtFloat, vec![-1, 3, 32, 32])],
            vec![("logits", DataType::DtFloat, vec![-1, 10])],
        ),
        (
            "recommender",
            vec![("dense", DataType::DtFloat, vec![-1, 13]), ("ids", DataType::DtInt64, vec![-1, 4])],
            vec![("score", DataType::DtFloat, vec![-1, 1])],
        ),
    ];
    for (model, inputs, outputs) in expected {
        let signatures = server.signature_def_map(model).await;
        let def = &signatures.signature_def["serving_default"];
        assert_eq!(def.method_name, "tensorflow/serving/predict");
        for (map, want) in [(&def.inputs, &inputs), (&def.outputs, &outputs)] {
            assert_eq!(map.len(), want.len(), "{model}");
            for (name, dtype, shape) in want {
                let info = &map[*name];
                assert_eq!(info.dtype, *dtype as i32, "{model} {name} dtype");
                let got: Vec<i64> = info.tensor_shape.as_ref().unwrap().dim.iter().map(|d| d.size).collect();
                assert_eq!(&got, shape, "{model} {name} shape");
            }
        }
    }
}

#[tokio::test]
async fn status_reports_every_loaded_version_available() {
    let server = Server::examples();
    let mut client = server.model_client().await;
    let response = client
        .get_model_status(GetModelStatusRequest { model_spec: spec("mlp", None) })
        .await
        .expect("status")
        .into_inner();
    let versions: Vec<(i64, i32)> = response.model_version_status.iter().map(|s| (s.version, s.state)).collect();
    let available = model_version_status::State::Available as i32;
    assert_eq!(versions, vec![(1, available), (2, available)]);
    assert!(response.model_version_status.iter().all(|s| s.status.as_ref().unwrap().error_code == 0));

    let response = client
        .get_model_status(GetModelStatusRequest { model_spec: spec("mlp", Some(1)) })
        .await
        .expect("status v1")
        .into_inner();
    assert_eq!(response.model_version_status.len(), 1);
    assert_eq!(response.model_version_status[0].version, 1);
}

#[tokio::test]
async fn sixty_four_concurrent_predicts_each_get_their_own_answer() {
    let server = Server::examples();
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let url = server.grpc_url();
        tasks.push(tokio::spawn(async move {
            let mut client =
                sluice::proto::tensorflow::serving::prediction_service_client::PredictionServiceClient::connect(url)
                    .await
                    .expect("connect");
            let batch = 1 + (i % 4) as i64;
            let (request, x) = mlp_request(batch, 1000 + i, i % 2 == 0);
            let response = client.predict(request).await.expect("predict").into_inner();
            (batch, x, f32_values(&response.outputs["logits"]))
        }));
    }
    for task in tasks {
        let (batch, x, got) = task.await.expect("task");
        let (_, want) = reference(&example_model("mlp", 2), vec![("x", RefInput::F32(vec![batch, 64], x))], "logits");
        assert_close(&got, &want, TOLERANCE, "concurrent answer");
    }
}
