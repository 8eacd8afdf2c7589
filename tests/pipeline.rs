//! Pipelines through the real server: built-in pre- and postprocessing
//! around a model, in pipelined and sequential mode, compared with the
//! same computation done here.

mod common;

use bytes::Bytes;
use common::*;
use prost::Message;
use sluice::proto::tensorflow::serving::{GetModelMetadataRequest, SignatureDefMap};
use sluice::proto::tensorflow::{DataType, TensorProto};

fn config(mode: &str) -> String {
    format!(
        r#"
[[models]]
name = "cnn"
base_path = "$ROOT/examples/models/cnn"
onnx = {{ sessions = 2, intra_op_threads = 1 }}
batching = {{ max_batch_size = 16, batch_timeout_micros = 500 }}

[[pipelines]]
name = "cnn-top3"
model = "cnn"
mode = "{mode}"
[pipelines.postprocess]
workers = 2
top_k = {{ k = 3, labels = "$ROOT/examples/cnn-labels.txt" }}

[[pipelines]]
name = "cnn-pixels"
model = "cnn"
mode = "{mode}"
[pipelines.preprocess]
workers = 2
image_normalize = {{ input = "pixels", mean = [0.5, 0.4, 0.3], std = [0.25, 0.2, 0.3] }}
[pipelines.postprocess]
argmax = {{}}
"#
    )
}

const LABELS: [&str; 10] = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"];

/// Indexes of the k largest, largest first, ties to the lower index.
fn top_k(row: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..row.len()).collect();
    order.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).unwrap().then(a.cmp(&b)));
    order.truncate(k);
    order
}

async fn check_top3(server: &Server, rows: i64, seed: u64) {
    let image = values(seed, rows as usize * 3 * 32 * 32);
    let response = server
        .predict_client()
        .await
        .predict(predict_request("cnn-top3", vec![("image", f32_content(&[rows, 3, 32, 32], &image))]))
        .await
        .expect("predict")
        .into_inner();
    assert_eq!(response.model_spec.as_ref().unwrap().name, "cnn-top3");
    let (_, logits) =
        reference(&example_model("cnn", 1), vec![("image", RefInput::F32(vec![rows, 3, 32, 32], image))], "logits");
    let scores = f32_values(&response.outputs["scores"]);
    let classes = &response.outputs["classes"].int64_val;
    let labels = &response.outputs["labels"].string_val;
    assert_eq!(dims(&response.outputs["scores"]), vec![rows, 3]);
    for (r, row) in logits.chunks(10).enumerate() {
        let want = top_k(row, 3);
        for (j, &class) in want.iter().enumerate() {
            assert_eq!(classes[r * 3 + j], class as i64, "row {r} rank {j}");
            assert!((scores[r * 3 + j] - row[class]).abs() <= 1e-5, "row {r} rank {j}");
            assert_eq!(labels[r * 3 + j], Bytes::from(LABELS[class]), "row {r} rank {j}");
        }
    }
}

/// The preprocessing, done here: HWC bytes to normalised CHW floats.
fn normalize(pixels: &[u8], rows: usize) -> Vec<f32> {
    let (mean, std) = ([0.5f32, 0.4, 0.3], [0.25f32, 0.2, 0.3]);
    let mut out = vec![0f32; rows * 3 * 32 * 32];
    for n in 0..rows {
        for y in 0..32 {
            for x in 0..32 {
                for c in 0..3 {
                    let v = pixels[((n * 32 + y) * 32 + x) * 3 + c] as f32 / 255.0;
                    out[((n * 3 + c) * 32 + y) * 32 + x] = (v - mean[c]) / std[c];
                }
            }
        }
    }
    out
}

async fn check_pixels(server: &Server, rows: usize, seed: u64) {
    let pixels: Vec<u8> = values(seed, rows * 32 * 32 * 3).iter().map(|v| ((v + 1.0) * 127.5) as u8).collect();
    let tensor = TensorProto {
        dtype: DataType::DtUint8 as i32,
        tensor_shape: shape(&[rows as i64, 32, 32, 3]),
        tensor_content: Bytes::from(pixels.clone()),
        ..Default::default()
    };
    let response = server
        .predict_client()
        .await
        .predict(predict_request("cnn-pixels", vec![("pixels", tensor)]))
        .await
        .expect("predict")
        .into_inner();
    let (_, logits) = reference(
        &example_model("cnn", 1),
        vec![("image", RefInput::F32(vec![rows as i64, 3, 32, 32], normalize(&pixels, rows)))],
        "logits",
    );
    let want: Vec<i64> = logits.chunks(10).map(|row| top_k(row, 1)[0] as i64).collect();
    assert_eq!(response.outputs["classes"].int64_val, want);
}

#[tokio::test]
async fn top_k_postprocessing_returns_the_top_k_of_the_raw_model_output() {
    let server = Server::with_config(&config("pipelined"));
    for (rows, seed) in [(1, 1), (5, 2), (16, 3)] {
        check_top3(&server, rows, seed).await;
    }
}

#[tokio::test]
async fn image_normalize_preprocessing_matches_the_transform_done_natively() {
    let server = Server::with_config(&config("pipelined"));
    for (rows, seed) in [(1, 4), (6, 5)] {
        check_pixels(&server, rows, seed).await;
    }
}

#[tokio::test]
async fn sequential_mode_answers_exactly_as_pipelined_mode() {
    let server = Server::with_config(&config("sequential"));
    check_top3(&server, 4, 6).await;
    check_pixels(&server, 3, 7).await;
}

#[tokio::test]
async fn concurrent_requests_through_a_pipeline_each_get_their_own_answer() {
    let server = std::sync::Arc::new(Server::with_config(&config("pipelined")));
    let mut tasks = Vec::new();
    for i in 0..24u64 {
        let server = server.clone();
        tasks.push(tokio::spawn(async move {
            if i % 2 == 0 {
                check_top3(&server, 1 + (i % 3) as i64, 100 + i).await
            } else {
                check_pixels(&server, 1 + (i % 4) as usize, 200 + i).await
            }
        }));
    }
    for task in tasks {
        task.await.expect("each pipeline answer matches its own input");
    }
}

#[tokio::test]
async fn a_pipeline_reports_its_own_signature_and_checks_inputs_against_it() {
    let server = Server::with_config(&config("pipelined"));
    let mut client = server.predict_client().await;
    let response = client
        .get_model_metadata(GetModelMetadataRequest {
            model_spec: spec("cnn-pixels", None),
            metadata_field: vec!["signature_def".into()],
        })
        .await
        .expect("metadata")
        .into_inner();
    let map = SignatureDefMap::decode(response.metadata["signature_def"].value.as_slice()).expect("decode");
    let def = &map.signature_def["serving_default"];
    assert_eq!(def.inputs["pixels"].dtype, DataType::DtUint8 as i32);
    assert_eq!(def.outputs["classes"].dtype, DataType::DtInt64 as i32);
    assert_eq!(def.inputs.len(), 1);

    // Floats where the pipeline takes bytes.
    let status = client
        .predict(predict_request("cnn-pixels", vec![("pixels", f32_content(&[1, 32, 32, 3], &values(1, 3072)))]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("pipeline 'cnn-pixels'"), "{}", status.message());
    assert!(status.message().contains("DT_UINT8"), "{}", status.message());
}

#[tokio::test]
async fn a_request_whose_stage_output_would_be_huge_is_refused_and_memory_stays_bounded() {
    // 20 million 1×1 images (60 MB on the wire) would make image_normalize
    // build 20M × 3 × 32 × 32 floats: 245 GB. It must be refused before
    // anything that size is allocated, and the server must keep serving.
    let server = Server::with_config(&config("pipelined"));
    let rows = 20_000_000i64;
    let tensor = TensorProto {
        dtype: DataType::DtUint8 as i32,
        tensor_shape: shape(&[rows, 1, 1, 3]),
        tensor_content: Bytes::from(vec![9u8; rows as usize * 3]),
        ..Default::default()
    };
    let before = server.rss_bytes();
    let status = server
        .predict_client()
        .await
        .predict(predict_request("cnn-pixels", vec![("pixels", tensor)]))
        .await
        .expect_err("a 245 GB stage output must be refused");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{}", status.message());
    assert!(status.message().contains("server.max_tensor_bytes"), "{}", status.message());
    assert!(status.message().contains("image_normalize"), "{}", status.message());
    check_pixels(&server, 2, 7).await;
    let after = server.rss_bytes();
    // The request itself (60 MB) and its decoding may stay cached by the
    // allocator; nothing near the 245 GB it asked for may.
    assert!(after < before + (512 << 20), "resident memory grew from {before} to {after} bytes");
}
