//! What the benchmarks share: their flags (`cargo bench --bench X -- --name
//! value`), the sluice binary started on free ports with a config, a pool
//! of requests shaped from a model's metadata, and a load run printed as it
//! ends; and the tests' own helpers (`tests/common/`): processes, fixtures,
//! redis-server, an OTLP collector and the test PKI, so a bench's config is built from the
//! same pieces as a test's.

#![allow(dead_code)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use sluice::cli::bench::inputs::{input_specs, random_pool, RequestPool};
use sluice::cli::bench::load::{self, LoadPlan};
use sluice::cli::bench::stats::Summary;
use sluice::proto::tensorflow::serving::ModelSpec;

use self::process::ServerProcess;

#[allow(dead_code)]
#[path = "../tests/common/fixtures.rs"]
pub mod fixtures;
#[allow(dead_code)]
#[path = "../tests/common/fleet.rs"]
pub mod fleet;
#[allow(dead_code)]
#[path = "../tests/common/object_stores.rs"]
pub mod object_stores;
#[allow(dead_code)]
#[path = "../tests/common/otlp.rs"]
pub mod otlp;
#[allow(dead_code)]
#[path = "../tests/common/pki.rs"]
pub mod pki;
#[allow(dead_code)]
#[path = "../tests/common/process.rs"]
pub mod process;
#[allow(dead_code)]
#[path = "../tests/common/redis.rs"]
pub mod redis;

/// The server's ONNX Runtime sessions per model in the throughput and
/// cost benches, and their raw baselines' threads.
pub const SESSIONS: usize = 2;

/// The config's opening: a short drain, so a bench's server stops at once.
pub const SERVER_TABLE: &str = "[server]\ndrain_timeout_secs = 1\n";

/// Model `name`: example model `example` on [`SESSIONS`] sessions of one
/// thread, with `keys` (batching, …).
pub fn served_model(name: &str, example: &str, keys: &str) -> String {
    let onnx = format!("onnx = {{ sessions = {SESSIONS}, intra_op_threads = 1 }}\n{keys}");
    fixtures::model_table(name, &fixtures::example_dir(example), &onnx)
}

/// `cnn_guarded`: the CNN with a capacity in requests per second low
/// enough for the load generator on the same two cores to offer twice as
/// much (the overload sections).
pub fn guarded_cnn() -> String {
    fixtures::model_table("cnn_guarded", &fixtures::example_dir("cnn"), GUARDED_KEYS)
}

const GUARDED_KEYS: &str = "max_in_flight = 4\nonnx = { sessions = 1, intra_op_threads = 1 }";

/// Auto batching of the MLP and the CNN, as the benches compare it.
pub const MLP_AUTO: &str = "batching = { mode = \"auto\", max_batch_size = 64 }";
pub const CNN_AUTO: &str = "batching = { mode = \"auto\", max_batch_size = 32, max_enqueued_batches = 64 }";

/// The value after `name` on the command line, parsed; `None` when absent
/// or not a `T`.
pub fn arg<T: std::str::FromStr>(name: &str) -> Option<T> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok())
}

/// A multi-threaded tokio runtime for a bench's clients.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime")
}

/// `sluice serve` of this build, on free ports, logging warnings only,
/// with `extra` flags and `config`; returns once it serves gRPC.
pub fn sluice(config: &Path, extra: &[&str]) -> ServerProcess {
    sluice_binary(Path::new(env!("CARGO_BIN_EXE_sluice")), config, extra)
}

/// The same with the `sluice` binary at `binary` (another build, for a
/// before-and-after in one run). At the default log level, as a
/// deployment runs it: what logging costs under load is in the figures.
pub fn sluice_binary(binary: &Path, config: &Path, extra: &[&str]) -> ServerProcess {
    let mut command = Command::new(binary);
    command
        .args(["serve", "--host", "127.0.0.1", "--port", "0", "--rest_api_port", "0"])
        .args(extra)
        .arg("--model_config_file")
        .arg(config);
    ServerProcess::spawn(command, "sluice", "sluice: serving gRPC on ", Duration::from_secs(120), true).expect("sluice")
}

/// Waits until `version` of `model` serves at `target` and every older
/// version has ended (a published version has taken over).
pub async fn wait_switched(target: &str, model: &str, version: i64) -> Duration {
    use sluice::proto::tensorflow::serving::model_service_client::ModelServiceClient;
    use sluice::proto::tensorflow::serving::GetModelStatusRequest;
    let started = Instant::now();
    let mut client = ModelServiceClient::connect(target.to_string()).await.expect("connect");
    loop {
        let request =
            GetModelStatusRequest { model_spec: Some(ModelSpec { name: model.into(), ..Default::default() }) };
        let status = client.get_model_status(request).await.expect("status").into_inner().model_version_status;
        let available = status.iter().any(|s| s.version == version && s.state == 30);
        let old_gone = status.iter().filter(|s| s.version < version).all(|s| s.state == 50);
        if available && old_gone {
            return started.elapsed();
        }
        assert!(started.elapsed() < Duration::from_secs(120), "version {version} did not take over: {status:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// 16 requests of one row each for `model`, shaped from its metadata.
pub fn pool(runtime: &tokio::runtime::Runtime, target: &str, model: &str) -> RequestPool {
    runtime.block_on(async {
        let spec = ModelSpec { name: model.into(), ..Default::default() };
        let specs = input_specs(target, &spec, None).await.expect("metadata");
        random_pool(&specs, &spec, 1, &Default::default(), 16, 7).expect("pool")
    })
}

/// Runs `plan` with `pool` and prints its summary under `label`.
pub fn run(runtime: &tokio::runtime::Runtime, plan: &LoadPlan, pool: &RequestPool, label: &str) -> Summary {
    let summary = runtime.block_on(load::run(plan, pool.requests.clone(), pool.rows)).expect("load");
    eprintln!("{label}\n  {}", summary.text().replace('\n', "\n  "));
    summary
}

/// A KServe v2 ModelInfer request for the example MLP: `x` (FP32, rows of
/// 64) in `raw_input_contents`, as Triton and KServe clients send it.
pub fn mlp_model_infer(x: &[f32]) -> sluice::proto::inference::ModelInferRequest {
    use sluice::proto::inference::model_infer_request::InferInputTensor;
    sluice::proto::inference::ModelInferRequest {
        model_name: "mlp".into(),
        inputs: vec![InferInputTensor {
            name: "x".into(),
            datatype: "FP32".into(),
            shape: vec![(x.len() / 64) as i64, 64],
            ..Default::default()
        }],
        raw_input_contents: vec![bytes::Bytes::copy_from_slice(bytemuck::cast_slice(x))],
        ..Default::default()
    }
}

/// A TF Serving Predict request for the example MLP: `x` (rows of 64) in
/// `tensor_content`.
pub fn mlp_predict(x: &[f32]) -> sluice::proto::tensorflow::serving::PredictRequest {
    use sluice::proto::tensorflow::{DataType, TensorProto};
    let tensor = TensorProto {
        dtype: DataType::DtFloat as i32,
        tensor_shape: Some(sluice::tensor::proto::encode_shape(&[(x.len() / 64) as i64, 64])),
        tensor_content: bytes::Bytes::copy_from_slice(bytemuck::cast_slice(x)),
        ..Default::default()
    };
    sluice::proto::tensorflow::serving::PredictRequest {
        model_spec: Some(ModelSpec { name: "mlp".into(), ..Default::default() }),
        inputs: [("x".to_string(), tensor)].into_iter().collect(),
        output_filter: vec![],
    }
}

/// Runs `in_flight` tasks calling `call(task, n)` back to back for
/// `seconds` (`n` counts each task's calls, interleaved so no two calls
/// share one); answers calls per second.
pub async fn calls_per_second<F, Fut>(seconds: u64, in_flight: usize, call: F) -> f64
where
    F: Fn(usize, usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    use std::sync::atomic::{AtomicU64, Ordering};
    let done = std::sync::Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let tasks: Vec<_> = (0..in_flight)
        .map(|task| {
            let (call, done) = (call.clone(), done.clone());
            tokio::spawn(async move {
                let mut n = task;
                while Instant::now() < until {
                    call(task, n).await;
                    n += in_flight;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("join");
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

/// The server's CPU per request (µs) and its requests per second over a
/// closed loop of `streams` against `server`'s model of `pool`, after a
/// second of warm-up.
pub fn closed_loop_cost(
    runtime: &tokio::runtime::Runtime,
    server: &ServerProcess,
    pool: &RequestPool,
    streams: usize,
    duration: Duration,
) -> (f64, f64) {
    let plan = |duration| LoadPlan { warmup: Duration::ZERO, ..LoadPlan::closed(&server.url(), streams, duration) };
    let run = |duration| runtime.block_on(load::run(&plan(duration), pool.requests.clone(), pool.rows));
    run(Duration::from_secs(1)).expect("warm-up");
    let before = cpu_seconds(Some(server.pid()));
    let summary = run(duration).expect("load");
    let cpu = cpu_seconds(Some(server.pid())) - before;
    eprintln!("  {}", summary.text().replace('\n', "\n  "));
    assert!(summary.errors.is_empty(), "the load failed: {:?}", summary.errors);
    (cpu * 1e6 / summary.requests.max(1) as f64, summary.requests_per_second)
}

/// CPU seconds (user + system) process `pid` (this one when `None`) has used.
pub fn cpu_seconds(pid: Option<u32>) -> f64 {
    let path = pid.map_or_else(|| "/proc/self/stat".to_string(), |p| format!("/proc/{p}/stat"));
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    // Fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // USER_HZ is 100 on every Linux this runs on.
    (ticks(11) + ticks(12)) / 100.0
}

/// ONNX Runtime in process: `threads` threads, each with its own session,
/// running `batch` rows back to back for `duration`. Rows per second.
pub fn raw_rows_per_second(
    model: &Path,
    input: &str,
    row_shape: &[usize],
    batch: usize,
    threads: usize,
    duration: Duration,
) -> f64 {
    let environment = sluice::infer::onnx::library::environment(None).expect("ONNX Runtime (run scripts/setup)");
    let total: usize = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    let mut session = ort::session::Session::builder(environment)
                        .expect("builder")
                        .with_intra_threads(1)
                        .expect("threads")
                        .commit_from_file(model)
                        .expect("session");
                    let mut shape = vec![batch];
                    shape.extend_from_slice(row_shape);
                    let n: usize = shape.iter().product();
                    let values: Vec<f32> = (0..n).map(|i| ((i * 7 + t) % 13) as f32 / 13.0).collect();
                    let tensor = ort::value::Tensor::from_array((shape, values)).expect("input");
                    for _ in 0..3 {
                        session.run(ort::inputs![input => &tensor]).expect("run");
                    }
                    let start = Instant::now();
                    let mut rows = 0;
                    while start.elapsed() < duration {
                        session.run(ort::inputs![input => &tensor]).expect("run");
                        rows += batch;
                    }
                    rows
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("raw worker")).sum()
    });
    total as f64 / duration.as_secs_f64()
}

/// One server in a side-by-side comparison, and what each round measured.
pub struct Side {
    /// What the side is, for the report.
    pub name: String,
    /// The server.
    pub server: ServerProcess,
    /// Its gRPC address (`https://` with `tls`).
    pub target: String,
    /// TLS to it, when it serves TLS.
    pub tls: Option<tonic::transport::ClientTlsConfig>,
    rps: Vec<f64>,
    cpu_us: Vec<f64>,
}

impl Side {
    /// `server`, reached at `target` (over `tls` when given).
    pub fn new(
        name: &str,
        server: ServerProcess,
        target: String,
        tls: Option<tonic::transport::ClientTlsConfig>,
    ) -> Side {
        Side { name: name.to_string(), server, target, tls, rps: Vec::new(), cpu_us: Vec::new() }
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// Loads each side in turn with `pool` (64 streams over 4 connections,
/// closed loop, a second of warm-up each time), `rounds` times over, so
/// drift on a noisy machine hits every side alike; records each side's
/// requests per second and server CPU per request. A failed request fails
/// the bench.
pub fn interleaved_rounds(
    runtime: &tokio::runtime::Runtime,
    sides: &mut [Side],
    pool: &RequestPool,
    rounds: usize,
    duration: Duration,
) {
    for round in 0..rounds {
        for side in sides.iter_mut() {
            let plan = |duration| LoadPlan {
                warmup: Duration::ZERO,
                tls: side.tls.clone(),
                ..LoadPlan::closed(&side.target, 64, duration)
            };
            let run = |duration| runtime.block_on(load::run(&plan(duration), pool.requests.clone(), pool.rows));
            run(Duration::from_secs(1)).expect("warm-up");
            let before = cpu_seconds(Some(side.server.pid()));
            let summary = run(duration).expect("load");
            let cpu = cpu_seconds(Some(side.server.pid())) - before;
            let cpu_us = cpu * 1e6 / summary.requests.max(1) as f64;
            eprintln!(
                "round {round}, {}: {:.0} req/s, {cpu_us:.1} µs server CPU per request, {} errors",
                side.name,
                summary.requests_per_second,
                summary.requests - summary.ok
            );
            assert_eq!(summary.requests, summary.ok, "{} failed requests", side.name);
            side.rps.push(summary.requests_per_second);
            side.cpu_us.push(cpu_us);
        }
    }
}

/// The report of [`interleaved_rounds`]: each side's medians, and their
/// ratio to the first side's (`baseline` names it in the header).
pub fn print_against_first(sides: &[Side], baseline: &str) {
    let Some(first) = sides.first() else { return };
    let (base_rps, base_cpu) = (median(&first.rps), median(&first.cpu_us));
    println!(
        "| side | req/s (median of {}) | server CPU per request | throughput vs {baseline} | CPU vs {baseline} |",
        first.rps.len()
    );
    println!("|---|---|---|---|---|");
    for side in sides {
        let (rps, cpu) = (median(&side.rps), median(&side.cpu_us));
        println!("| {} | {rps:.0} | {cpu:.1} µs | {:.3}× | {:+.1} µs |", side.name, rps / base_rps, cpu - base_cpu);
    }
}
