//! SavedModels in sluice's TensorFlow backend, side by side in
//! one run: the server's CPU per unbatched request and its requests per
//! second, for the example MLP's weights as a SavedModel (built by
//! `scripts/setup` into `.cache/tf-savedmodels/mlp`, TensorFlow in
//! process) and as ONNX (`examples/models/mlp`, ONNX Runtime), against the
//! transport floor (`floor-server --raw`), a TensorFlow run in process
//! through the backend on a prebuilt input, and a Predict server in Python
//! (TensorFlow's own runtime behind grpcio: `tests/tfserving/upstream.py`,
//! the same SavedModel).
//!
//! ```text
//! cargo bench --bench tensorflow [-- --duration 8]
//! ```

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use sluice::config::tensorflow::TensorflowOptions;
use sluice::infer::tensorflow::TensorflowBackend;
use sluice::infer::{Backend, Batch};
use sluice::tensor::Tensor;
use support::process::ServerProcess;
use support::{arg, pool, sluice_binary, SERVER_TABLE};

/// Streams in flight, over 4 connections, as the cost bench loads the MLP.
const STREAMS: usize = 64;

fn measure(
    runtime: &tokio::runtime::Runtime,
    server: &ServerProcess,
    pool: &sluice::cli::bench::inputs::RequestPool,
    duration: Duration,
) -> (f64, f64) {
    support::closed_loop_cost(runtime, server, pool, STREAMS, duration)
}

/// Mean µs of one batch-1 run of the SavedModel in process through the
/// backend (a TF_SessionRun on a prebuilt input, with the input and output
/// copies the backend makes), on the calling thread.
fn raw_tensorflow_micros(dir: &Path, duration: Duration) -> f64 {
    let options = TensorflowOptions { run_threads: 1, ..TensorflowOptions::default() };
    let metrics = sluice::metrics::Metrics::new().model("raw", 1);
    // A budget no run reaches, so every run after the first is inline.
    let backend = TensorflowBackend::load(dir, "raw", &options, None, metrics, Duration::from_secs(10)).expect("load");
    let x = Tensor::from_values(vec![1, 64], &[0.25f32; 64]);
    let batch = Batch::single(vec![x]);
    let runtime = support::runtime();
    runtime.block_on(backend.run(Batch::single(batch.requests[0].clone()))).expect("first run");
    let started = Instant::now();
    let mut runs = 0u64;
    while started.elapsed() < duration {
        backend.run_inline(&batch).expect("measured as cheap").expect("run");
        runs += 1;
    }
    started.elapsed().as_secs_f64() * 1e6 / runs as f64
}

fn floor_server() -> ServerProcess {
    let mut command = Command::new(env!("CARGO_BIN_EXE_floor-server"));
    command.args(["--rows", "1", "--cols", "10", "--raw"]);
    ServerProcess::spawn(command, "echo", "floor-server: serving gRPC on ", Duration::from_secs(30), true)
        .expect("floor-server")
}

/// TensorFlow's Python runtime behind grpcio, serving `base` as `mlp`.
fn python_server(root: &Path, base: &Path) -> ServerProcess {
    let mut command = Command::new(root.join(".cache/tf-venv/bin/python"));
    command
        .arg(root.join("tests/tfserving/upstream.py"))
        .args(["--port", "0", "--model_name", "mlp", "--model_base_path"])
        .arg(base)
        .env("TF_CPP_MIN_LOG_LEVEL", "2");
    ServerProcess::spawn(command, "python-tf", "upstream: serving gRPC on ", Duration::from_secs(120), true)
        .expect("the Python TensorFlow server (scripts/setup installs .cache/tf-venv)")
}

fn main() {
    let duration = Duration::from_secs(arg("--duration").unwrap_or(8));
    let root = support::fixtures::root();
    let saved_model = root.join(".cache/tf-savedmodels/mlp");
    let onnx = root.join("examples/models/mlp");
    let dir = tempfile::tempdir().expect("temp dir");
    let server_of = |name: &str, base: &Path, keys: &str| {
        let path = dir.path().join(format!("{name}.toml"));
        let table = support::fixtures::model_table("mlp", base, keys);
        std::fs::write(&path, format!("{SERVER_TABLE}{table}")).expect("config");
        sluice_binary(Path::new(env!("CARGO_BIN_EXE_sluice")), &path, &[])
    };
    let sessions = support::SESSIONS;
    let tf_server = server_of("tf", &saved_model, &format!("tensorflow = {{ run_threads = {sessions} }}"));
    let onnx_server = server_of("onnx", &onnx, &format!("onnx = {{ sessions = {sessions}, intra_op_threads = 1 }}"));
    let runtime = support::runtime();
    let requests = pool(&runtime, &onnx_server.url(), "mlp");

    let raw = raw_tensorflow_micros(&saved_model.join("2"), Duration::from_secs(2));
    eprintln!("TensorFlow in process, MLP batch 1: {raw:.2} µs per run");
    eprintln!("echo floor, MLP-shaped batch-1 requests, {STREAMS} streams");
    let (echo_cpu, echo_rps) = measure(&runtime, &floor_server(), &requests, duration);
    eprintln!("sluice, SavedModel in TensorFlow, {STREAMS} streams");
    let (tf_cpu, tf_rps) = measure(&runtime, &tf_server, &requests, duration);
    eprintln!("sluice, the same weights in ONNX Runtime, {STREAMS} streams");
    let (onnx_cpu, onnx_rps) = measure(&runtime, &onnx_server, &requests, duration);
    eprintln!("TensorFlow's Python runtime behind grpcio, the same SavedModel, {STREAMS} streams");
    let (py_cpu, py_rps) = measure(&runtime, &python_server(&root, &saved_model), &requests, duration);

    println!("\n| server (MLP batch 1, {STREAMS} streams) | CPU per request | req/s |");
    println!("|---|---|---|");
    for (name, cpu, rps) in [
        ("echo floor (floor-server --raw)", echo_cpu, echo_rps),
        ("sluice, SavedModel (TensorFlow backend)", tf_cpu, tf_rps),
        ("sluice, ONNX (ONNX Runtime backend)", onnx_cpu, onnx_rps),
        ("Python TensorFlow Predict server (grpcio)", py_cpu, py_rps),
    ] {
        println!("| {name} | {cpu:.1} µs | {rps:.0} |");
    }
    println!(
        "\nsluice's own CPU per SavedModel request: {tf_cpu:.1} µs - echo {echo_cpu:.1} µs - TensorFlow run {raw:.1} µs = \
         {:.1} µs (target <= 20)",
        tf_cpu - echo_cpu - raw
    );
    println!("sluice (SavedModel) against the Python TensorFlow server: {:.1}x req/s (target >= 10x)", tf_rps / py_rps);
    println!(
        "SavedModel against ONNX in sluice: {:.2}x the CPU per request, {:.2}x req/s",
        tf_cpu / onnx_cpu,
        tf_rps / onnx_rps
    );
}
