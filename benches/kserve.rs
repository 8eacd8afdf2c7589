//! KServe v2 against TF Serving's API on the same server, same load, same
//! run, in alternating rounds so drift on a noisy machine hits both alike.
//!
//! 1. gRPC, MLP batch 1: ModelInfer with `raw_input_contents` vs Predict
//!    with `tensor_content` (and Predict answered in `tensor_content`
//!    too, so both sides move the same bytes), 32 requests in flight over
//!    4 connections.
//! 2. REST, MLP batch 32: v2 with the binary tensor extension vs v2 JSON
//!    (and TF Serving's JSON for reference), 8 requests in flight.
//!
//! ```text
//! cargo bench --bench kserve [-- --seconds 4 --rounds 4]
//! ```

mod support;

use support::{arg, calls_per_second, mlp_model_infer, mlp_predict};

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sluice::cli::bench::client::RestClient;
use sluice::proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use sluice::proto::tensorflow::serving::prediction_service_client::PredictionServiceClient;
use support::process::ServerProcess;
use tonic::transport::Channel;

const GRPC_IN_FLIGHT: usize = 32;
const CONNECTIONS: usize = 4;
const REST_IN_FLIGHT: usize = 8;

fn floats(rows: usize) -> Vec<f32> {
    (0..rows * 64).map(|i| (i as f32 * 0.37).sin()).collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn grpc(url: String, seconds: u64, rounds: u64) {
    let x = floats(1);
    let predict = mlp_predict(&x);
    let infer = mlp_model_infer(&x);
    let mut channels: Vec<Channel> = Vec::new();
    for _ in 0..CONNECTIONS {
        channels.push(Channel::from_shared(url.clone()).expect("url").connect().await.expect("connect"));
    }
    let channels = Arc::new(channels);
    let (mut predict_rates, mut infer_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..=rounds {
        let p = {
            let (channels, request) = (channels.clone(), predict.clone());
            calls_per_second(seconds, GRPC_IN_FLIGHT, move |t, _| {
                let mut client = PredictionServiceClient::new(channels[t % CONNECTIONS].clone());
                let request = request.clone();
                async move {
                    client.predict(request).await.expect("Predict");
                }
            })
            .await
        };
        let i = {
            let (channels, request) = (channels.clone(), infer.clone());
            calls_per_second(seconds, GRPC_IN_FLIGHT, move |t, _| {
                let mut client = GrpcInferenceServiceClient::new(channels[t % CONNECTIONS].clone());
                let request = request.clone();
                async move {
                    client.model_infer(request).await.expect("ModelInfer");
                }
            })
            .await
        };
        // Round 0 warms both up.
        if round > 0 {
            predict_rates.push(p);
            infer_rates.push(i);
            ratios.push(i / p);
        }
    }
    println!(
        "\ngRPC, MLP batch 1, {GRPC_IN_FLIGHT} in flight over {CONNECTIONS} connections, {rounds} alternating rounds of {seconds} s\n"
    );
    println!("| path | req/s (median of rounds) |");
    println!("|---|---|");
    println!("| Predict, tensor_content in and out | {:.0} |", median(predict_rates));
    println!("| ModelInfer, raw contents in and out | {:.0} |", median(infer_rates));
    let spread = (ratios.iter().copied().fold(f64::MAX, f64::min), ratios.iter().copied().fold(0.0, f64::max));
    println!(
        "\nModelInfer / Predict: median {:.3}× (rounds {:.3}–{:.3}; target ≥ 0.95×)",
        median(ratios),
        spread.0,
        spread.1
    );
}

async fn rest(addr: String, seconds: u64, rounds: u64) {
    let x = floats(32);
    let raw: &[u8] = bytemuck::cast_slice(&x);
    let v2_json = serde_json::json!({
        "inputs": [{"name": "x", "shape": [32, 64], "datatype": "FP32", "data": x}],
        "outputs": [{"name": "logits", "parameters": {"binary_data": false}}],
    })
    .to_string();
    let head = serde_json::json!({
        "inputs": [{"name": "x", "shape": [32, 64], "datatype": "FP32", "parameters": {"binary_data_size": raw.len()}}],
        "outputs": [{"name": "logits", "parameters": {"binary_data": true}}],
    })
    .to_string();
    let mut binary = head.clone().into_bytes();
    binary.extend_from_slice(raw);
    let rows: Vec<Vec<f32>> = x.chunks(64).map(<[f32]>::to_vec).collect();
    let tf_json = serde_json::json!({ "instances": rows }).to_string();
    let head_length = head.len().to_string();
    let paths: Vec<(&str, &str, Bytes, Option<String>)> = vec![
        ("v2, binary tensor extension", "/v2/models/mlp/infer", Bytes::from(binary), Some(head_length)),
        ("v2, JSON", "/v2/models/mlp/infer", Bytes::from(v2_json), None),
        ("TF Serving REST, JSON (reference)", "/v1/models/mlp:predict", Bytes::from(tf_json), None),
    ];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); paths.len()];
    for round in 0..=rounds {
        for (i, (name, path, body, length)) in paths.iter().enumerate() {
            let (addr, path, body, length, name) = (addr.clone(), *path, body.clone(), length.clone(), *name);
            let clients: Arc<Vec<tokio::sync::Mutex<RestClient>>> = Arc::new(
                (0..REST_IN_FLIGHT).map(|_| tokio::sync::Mutex::new(RestClient::new(&addr).expect("client"))).collect(),
            );
            let r = calls_per_second(seconds, REST_IN_FLIGHT, move |t, _| {
                let (clients, body, length) = (clients.clone(), body.clone(), length.clone());
                async move {
                    let mut client = clients[t].lock().await;
                    let headers: Vec<(&str, &str)> =
                        length.as_deref().map(|l| vec![("inference-header-content-length", l)]).unwrap_or_default();
                    let answer = client.call(http::Method::POST, path, &headers, body).await.expect("REST call");
                    assert_eq!(answer.status, http::StatusCode::OK, "{name}: {}", answer.text());
                }
            })
            .await;
            if round > 0 {
                rates[i].push(r);
            }
        }
    }
    println!("\nREST, MLP batch 32, {REST_IN_FLIGHT} in flight, {rounds} alternating rounds of {seconds} s\n");
    println!("| path | req/s (median of rounds) | vs v2 JSON |");
    println!("|---|---|---|");
    let json_rate = median(rates[1].clone());
    for (i, (name, ..)) in paths.iter().enumerate() {
        let r = median(rates[i].clone());
        println!("| {name} | {r:.0} | {:.2}× |", r / json_rate);
    }
}

fn main() {
    let seconds: u64 = arg("--seconds").unwrap_or(4);
    let rounds: u64 = arg("--rounds").unwrap_or(4);
    let root = support::fixtures::root();
    let mut sluice = Command::new(env!("CARGO_BIN_EXE_sluice"));
    sluice
        .args(["serve", "--host", "127.0.0.1", "--port", "0", "--rest_api_port", "0", "--log_level", "warn"])
        .args(["--model_name", "mlp", "--output_encoding", "tensor-content", "--model_base_path"])
        .arg(root.join("examples/models/mlp"));
    let sluice = ServerProcess::spawn(sluice, "sluice", "sluice: serving gRPC on ", Duration::from_secs(120), true)
        .expect("sluice");
    let http = sluice.stdout_after("sluice: serving HTTP on ").expect("the HTTP address");
    let runtime = support::runtime();
    runtime.block_on(grpc(sluice.url(), seconds, rounds));
    runtime.block_on(rest(http, seconds, rounds));
}
