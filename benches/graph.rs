//! Graph pipelines against what teams do without them, in one run:
//!
//! 1. The ranking cascade (coarse ranker over 100 candidates → the best 8 →
//!    fine ranker → re-rank) as one pipeline, against the same cascade
//!    done by a client calling sluice once per model (its top-k and gather
//!    in the client), same models, same server, same in-flight requests:
//!    requests per second and p99, in alternating rounds.
//! 2. Server CPU per request of a two-model graph (the ensemble: both
//!    rankers over the same 16 rows, blended) against the sum of the two
//!    models served alone with the same rows.
//! 3. The cascade over KServe v2 gRPC against KServe's Python ModelServer
//!    doing the same cascade in one `predict` with two ONNX Runtime
//!    sessions (`benches/peers/kserve_cascade.py`, from
//!    `scripts/bench-peers-setup`).
//!
//! The load generator shares the machine's cores with the servers; every
//! figure that matters is a ratio of two sides measured the same way.
//!
//! ```text
//! cargo bench --bench graph [-- --seconds 4 --rounds 3 --only cascade,cpu,kserve]
//! cargo bench --bench graph --no-run && taskset -c 1 cargo bench --bench graph -- --pin yes
//! ```
//!
//! With `--pin` the server runs on core 0 and (run as above) the load
//! generator on core 1, so requests per second measure the server's
//! capacity rather than two processes sharing two cores.

mod support;

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice::proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use sluice::proto::inference::model_infer_request::InferInputTensor;
use sluice::proto::inference::ModelInferRequest;
use sluice::proto::tensorflow::serving::prediction_service_client::PredictionServiceClient;
use sluice::proto::tensorflow::serving::{ModelSpec, PredictRequest};
use sluice::proto::tensorflow::{DataType, TensorProto};
use support::process::ServerProcess;
use support::{arg, cpu_seconds, fixtures, sluice, SERVER_TABLE, SESSIONS};
use tonic::transport::Channel;

const CANDIDATES: usize = 100;
const K: usize = 8;
const IN_FLIGHT: usize = 16;
const CONNECTIONS: usize = 4;

/// The example config's `rank` and `ensemble` pipelines and the models
/// they run (`examples/sluice.toml`, what `make run` serves), with the
/// benches' sessions.
fn config() -> String {
    let root = fixtures::root();
    let text = std::fs::read_to_string(root.join("examples/sluice.toml")).expect("examples/sluice.toml");
    let example: toml::Table = text.parse().expect("the example config");
    let kept = |key: &str, names: &[&str]| -> toml::Value {
        let tables = example[key].as_array().expect("an array of tables");
        let kept = tables.iter().filter(|t| names.contains(&t["name"].as_str().unwrap_or_default()));
        toml::Value::Array(kept.cloned().collect())
    };
    let mut models = kept("models", &["ranker_coarse", "ranker_fine"]);
    for model in models.as_array_mut().expect("models") {
        let table = model.as_table_mut().expect("a model");
        let base = root.join("examples").join(table["base_path"].as_str().expect("base_path"));
        table.insert("base_path".into(), base.display().to_string().into());
        let onnx: toml::Table = format!("sessions = {SESSIONS}\nintra_op_threads = 1").parse().expect("onnx");
        table.insert("onnx".into(), onnx.into());
    }
    let mut config = toml::Table::new();
    config.insert("server".into(), SERVER_TABLE.parse::<toml::Table>().expect("server")["server"].clone());
    config.insert("models".into(), models);
    config.insert("pipelines".into(), kept("pipelines", &["rank", "ensemble"]));
    toml::to_string(&config).expect("config")
}

fn features(seed: usize, rows: usize) -> Vec<f32> {
    (0..rows * 16).map(|i| ((i * 7919 + seed * 104729) as f32 * 0.001).sin()).collect()
}

fn f32_tensor(shape: &[i64], values: &[f32]) -> TensorProto {
    TensorProto {
        dtype: DataType::DtFloat as i32,
        tensor_shape: Some(sluice::tensor::proto::encode_shape(shape)),
        tensor_content: bytes::Bytes::copy_from_slice(bytemuck::cast_slice(values)),
        ..Default::default()
    }
}

fn i64_tensor(shape: &[i64], values: &[i64]) -> TensorProto {
    TensorProto {
        dtype: DataType::DtInt64 as i32,
        tensor_shape: Some(sluice::tensor::proto::encode_shape(shape)),
        tensor_content: bytes::Bytes::copy_from_slice(bytemuck::cast_slice(values)),
        ..Default::default()
    }
}

fn predict(model: &str, inputs: Vec<(&str, TensorProto)>) -> PredictRequest {
    PredictRequest {
        model_spec: Some(ModelSpec { name: model.into(), ..Default::default() }),
        inputs: inputs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        output_filter: vec![],
    }
}

fn floats_of(tensor: &TensorProto) -> Vec<f32> {
    if tensor.tensor_content.is_empty() {
        tensor.float_val.clone()
    } else {
        bytemuck::pod_collect_to_vec(&tensor.tensor_content)
    }
}

/// Best first, ties to the lower index, as sluice's top_rows.
fn top(scores: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    order.truncate(k);
    order
}

/// What a closed loop measured.
struct Run {
    rate: f64,
    p99: Duration,
    /// The server's CPU per call, in µs.
    server_cpu: f64,
}

/// Calls per second and the p99 latency of `in_flight` tasks calling
/// `call(task, n)` back to back for `seconds`, with the CPU `server` used.
async fn measured<F, Fut>(server: &ServerProcess, seconds: u64, in_flight: usize, call: F) -> Run
where
    F: Fn(usize, usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let before = cpu_seconds(Some(server.pid()));
    let started = Instant::now();
    let (rate, p99) = closed_loop(seconds, in_flight, call).await;
    let calls = rate * started.elapsed().as_secs_f64();
    let server_cpu = (cpu_seconds(Some(server.pid())) - before) * 1e6 / calls.max(1.0);
    Run { rate, p99, server_cpu }
}

/// Calls per second and the p99 latency of `in_flight` tasks calling
/// `call(task, n)` back to back for `seconds`.
async fn closed_loop<F, Fut>(seconds: u64, in_flight: usize, call: F) -> (f64, Duration)
where
    F: Fn(usize, usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let until = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let tasks: Vec<_> = (0..in_flight)
        .map(|task| {
            let (call, latencies) = (call.clone(), latencies.clone());
            tokio::spawn(async move {
                let mut mine = Vec::new();
                let mut n = task;
                while Instant::now() < until {
                    let at = Instant::now();
                    call(task, n).await;
                    mine.push(at.elapsed());
                    n += in_flight;
                }
                latencies.lock().expect("latencies").extend(mine);
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("join");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut all = std::mem::take(&mut *latencies.lock().expect("latencies"));
    all.sort();
    let p99 = all.get(all.len() * 99 / 100).copied().unwrap_or_default();
    (all.len() as f64 / elapsed, p99)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn channels(url: &str) -> Arc<Vec<Channel>> {
    let mut all = Vec::new();
    for _ in 0..CONNECTIONS {
        all.push(Channel::from_shared(url.to_string()).expect("url").connect().await.expect("connect"));
    }
    Arc::new(all)
}

/// The cascade's inputs for call `n`.
fn cascade_inputs(n: usize) -> (Vec<f32>, Vec<i64>) {
    (features(n % 64, CANDIDATES), (0..CANDIDATES as i64).map(|i| i * 13 + n as i64 % 7).collect())
}

async fn cascade(server: &ServerProcess, seconds: u64, rounds: usize, rows: &mut Vec<String>) {
    let channels = channels(&server.url()).await;
    let (mut one, mut client, mut one_p99, mut client_p99) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut one_cpu, mut client_cpu) = (Vec::new(), Vec::new());
    for round in 0..=rounds {
        let c = channels.clone();
        let pipeline = measured(server, seconds, IN_FLIGHT, move |t, n| {
            let mut grpc = PredictionServiceClient::new(c[t % CONNECTIONS].clone());
            async move {
                let (x, ids) = cascade_inputs(n);
                let request = predict(
                    "rank",
                    vec![
                        ("candidates", f32_tensor(&[CANDIDATES as i64, 16], &x)),
                        ("item_ids", i64_tensor(&[CANDIDATES as i64], &ids)),
                    ],
                );
                grpc.predict(request).await.expect("rank");
            }
        })
        .await;
        let c = channels.clone();
        let hops = measured(server, seconds, IN_FLIGHT, move |t, n| {
            let mut grpc = PredictionServiceClient::new(c[t % CONNECTIONS].clone());
            async move {
                let (x, ids) = cascade_inputs(n);
                let coarse = grpc
                    .predict(predict("ranker_coarse", vec![("features", f32_tensor(&[CANDIDATES as i64, 16], &x))]))
                    .await
                    .expect("coarse")
                    .into_inner();
                let best = top(&floats_of(&coarse.outputs["score"]), K);
                let picked: Vec<f32> = best.iter().flat_map(|&r| x[r * 16..(r + 1) * 16].iter().copied()).collect();
                let fine = grpc
                    .predict(predict("ranker_fine", vec![("features", f32_tensor(&[best.len() as i64, 16], &picked))]))
                    .await
                    .expect("fine")
                    .into_inner();
                let scores = floats_of(&fine.outputs["score"]);
                let order = top(&scores, K);
                let items: Vec<i64> = order.iter().map(|&i| ids[best[i]]).collect();
                std::hint::black_box(items);
            }
        })
        .await;
        eprintln!(
            "round {round}: one pipeline {:.0} req/s p99 {:.2} ms server CPU {:.1} µs; a client calling per model \
             {:.0} req/s p99 {:.2} ms server CPU {:.1} µs",
            pipeline.rate,
            pipeline.p99.as_secs_f64() * 1e3,
            pipeline.server_cpu,
            hops.rate,
            hops.p99.as_secs_f64() * 1e3,
            hops.server_cpu
        );
        // Round 0 warms both up.
        if round > 0 {
            one.push(pipeline.rate);
            client.push(hops.rate);
            one_p99.push(pipeline.p99.as_secs_f64() * 1e3);
            client_p99.push(hops.p99.as_secs_f64() * 1e3);
            one_cpu.push(pipeline.server_cpu);
            client_cpu.push(hops.server_cpu);
        }
    }
    let (a, b) = (median(one), median(client));
    rows.push(format!(
        "| cascade as one pipeline vs a client calling per model (100 candidates, top 8, {IN_FLIGHT} in flight) | {a:.0} req/s | {b:.0} req/s | **{:.2}×** | ≥ 1.8× |",
        a / b
    ));
    let (pa, pb) = (median(one_p99), median(client_p99));
    rows.push(format!("| its p99 | {pa:.2} ms | {pb:.2} ms | **{:.2}×** | lower |", pa / pb));
    let (ca, cb) = (median(one_cpu), median(client_cpu));
    rows.push(format!(
        "| server CPU per cascade (what a server's capacity divides) | {ca:.1} µs | {cb:.1} µs | **{:.2}×** the requests per core | report |",
        cb / ca
    ));
}

/// Server CPU per request (µs) over a closed loop of `request`s.
async fn cpu_per_request(server: &ServerProcess, seconds: u64, request: PredictRequest) -> f64 {
    let channels = channels(&server.url()).await;
    let make = |channels: Arc<Vec<Channel>>, request: PredictRequest| {
        move |t: usize, _n: usize| {
            let mut grpc = PredictionServiceClient::new(channels[t % CONNECTIONS].clone());
            let request = request.clone();
            async move {
                grpc.predict(request).await.expect("predict");
            }
        }
    };
    closed_loop(1, IN_FLIGHT, make(channels.clone(), request.clone())).await;
    let before = cpu_seconds(Some(server.pid()));
    let started = Instant::now();
    let (rate, _) = closed_loop(seconds, IN_FLIGHT, make(channels, request)).await;
    let cpu = cpu_seconds(Some(server.pid())) - before;
    let calls = rate * started.elapsed().as_secs_f64();
    cpu * 1e6 / calls.max(1.0)
}

async fn cpu(server: &ServerProcess, seconds: u64, rounds: usize, rows: &mut Vec<String>) {
    let x = features(3, 16);
    let input = || vec![("features", f32_tensor(&[16, 16], &x))];
    let parts = [predict("ranker_coarse", input()), predict("ranker_fine", input())];
    let (g, s) = graph_against_models(server, seconds, rounds, predict("ensemble", input()), parts).await;
    rows.push(format!(
        "| server CPU of the two-model ensemble vs its models served alone (16 rows) | {g:.1} µs | {s:.1} µs (sum) | **{:+.1} µs** | ≤ +10 µs |",
        g - s
    ));
    // The cascade against its two model calls alone, with the rows each
    // model sees in it (100 candidates, then the 8 best).
    let (x, ids) = cascade_inputs(0);
    let request = predict(
        "rank",
        vec![
            ("candidates", f32_tensor(&[CANDIDATES as i64, 16], &x)),
            ("item_ids", i64_tensor(&[CANDIDATES as i64], &ids)),
        ],
    );
    let parts = [
        predict("ranker_coarse", vec![("features", f32_tensor(&[CANDIDATES as i64, 16], &x))]),
        predict("ranker_fine", vec![("features", f32_tensor(&[K as i64, 16], &x[..K * 16]))]),
    ];
    let (g, s) = graph_against_models(server, seconds, rounds, request, parts).await;
    rows.push(format!(
        "| server CPU of the cascade (2 models, 2 top_rows) vs its two model calls alone (100 and 8 rows) | {g:.1} µs | {s:.1} µs (sum) | **{:+.1} µs** | ≤ +10 µs |",
        g - s
    ));
}

/// Server CPU per request of `graph` and the sum of its two `models`'
/// requests served alone, each the median of `rounds` rounds.
async fn graph_against_models(
    server: &ServerProcess,
    seconds: u64,
    rounds: usize,
    graph: PredictRequest,
    models: [PredictRequest; 2],
) -> (f64, f64) {
    let name = |request: &PredictRequest| request.model_spec.as_ref().map_or(String::new(), |spec| spec.name.clone());
    let (mut graphs, mut sums) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let g = cpu_per_request(server, seconds, graph.clone()).await;
        let first = cpu_per_request(server, seconds, models[0].clone()).await;
        let second = cpu_per_request(server, seconds, models[1].clone()).await;
        eprintln!(
            "round {round}: {} {g:.1} µs; {} {first:.1} + {} {second:.1} = {:.1} µs",
            name(&graph),
            name(&models[0]),
            name(&models[1]),
            first + second
        );
        graphs.push(g);
        sums.push(first + second);
    }
    (median(graphs), median(sums))
}

fn model_infer(n: usize) -> ModelInferRequest {
    let (x, ids) = cascade_inputs(n);
    ModelInferRequest {
        model_name: "rank".into(),
        inputs: vec![
            InferInputTensor {
                name: "candidates".into(),
                datatype: "FP32".into(),
                shape: vec![CANDIDATES as i64, 16],
                ..Default::default()
            },
            InferInputTensor {
                name: "item_ids".into(),
                datatype: "INT64".into(),
                shape: vec![CANDIDATES as i64],
                ..Default::default()
            },
        ],
        raw_input_contents: vec![
            bytes::Bytes::copy_from_slice(bytemuck::cast_slice(&x)),
            bytes::Bytes::copy_from_slice(bytemuck::cast_slice(&ids)),
        ],
        ..Default::default()
    }
}

async fn model_infer_rate(url: &str, seconds: u64) -> f64 {
    let channels = channels(url).await;
    let call = move |t: usize, n: usize| {
        let mut grpc = GrpcInferenceServiceClient::new(channels[t % CONNECTIONS].clone());
        async move {
            let answer = grpc.model_infer(model_infer(n)).await.expect("ModelInfer").into_inner();
            assert_eq!(answer.outputs.len(), 2, "items and scores");
        }
    };
    closed_loop(1, IN_FLIGHT, call.clone()).await;
    closed_loop(seconds, IN_FLIGHT, call).await.0
}

fn kserve_peer(root: &std::path::Path) -> ServerProcess {
    let python = root.join(".cache/kserve-peer-venv/bin/python");
    if !python.exists() {
        let status = Command::new(root.join("scripts/bench-peers-setup")).status().expect("bench-peers-setup");
        assert!(status.success(), "scripts/bench-peers-setup failed");
    }
    let port = || std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
    let (grpc, http) = (port(), port());
    // Pinned as the server is, when it is.
    let mut command = if arg::<String>("--pin").is_some() {
        let mut taskset = Command::new("taskset");
        taskset.args(["-c", "0"]).arg(python);
        taskset
    } else {
        Command::new(python)
    };
    command.arg(root.join("benches/peers/kserve_cascade.py")).args([
        "--grpc_port",
        &grpc.to_string(),
        "--http_port",
        &http.to_string(),
    ]);
    let ready = format!("peer-ready kserve http=127.0.0.1:{http} grpc=");
    ServerProcess::spawn(command, "kserve", &ready, Duration::from_secs(300), false).expect("KServe peer")
}

async fn kserve(server: &ServerProcess, seconds: u64, rounds: usize, rows: &mut Vec<String>) {
    let root = fixtures::root();
    let peer = kserve_peer(&root);
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let a = model_infer_rate(&server.url(), seconds).await;
        let b = model_infer_rate(&peer.url(), seconds).await;
        eprintln!("round {round}: sluice {a:.0} req/s, KServe ModelServer {b:.0} req/s");
        ours.push(a);
        theirs.push(b);
    }
    let (a, b) = (median(ours), median(theirs));
    rows.push(format!(
        "| cascade over KServe v2 gRPC: sluice's graph vs KServe's Python ModelServer (two ORT sessions in one predict) | {a:.0} req/s | {b:.0} req/s | **{:.1}×** | ≥ 20× |",
        a / b
    ));
}

fn main() {
    let seconds: u64 = arg("--seconds").unwrap_or(4);
    let rounds: usize = arg("--rounds").unwrap_or(3);
    let only: String = arg("--only").unwrap_or_else(|| "cascade,cpu,kserve".to_string());
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("graph.toml");
    std::fs::write(&path, config()).expect("config");
    // `--pin`: the server on core 0, so that run through `taskset -c 1`
    // the load generator does not take its CPU.
    let server = if arg::<String>("--pin").is_some() {
        let mut command = Command::new("taskset");
        command
            .args(["-c", "0", env!("CARGO_BIN_EXE_sluice"), "serve", "--host", "127.0.0.1", "--port", "0"])
            .args(["--rest_api_port", "0", "--model_config_file"])
            .arg(&path);
        ServerProcess::spawn(command, "sluice", "sluice: serving gRPC on ", Duration::from_secs(120), true)
            .expect("sluice pinned to core 0 (is taskset installed?)")
    } else {
        sluice(&path, &[])
    };
    let runtime = support::runtime();
    let mut rows = Vec::new();
    runtime.block_on(async {
        if only.contains("cascade") {
            cascade(&server, seconds, rounds, &mut rows).await;
        }
        if only.contains("cpu") {
            cpu(&server, seconds, rounds, &mut rows).await;
        }
        if only.contains("kserve") {
            kserve(&server, seconds, rounds, &mut rows).await;
        }
    });
    println!("\n| what | sluice | against | ratio | target |\n|---|---|---|---|---|");
    for row in rows {
        println!("{row}");
    }
}
