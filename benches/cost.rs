//! What one request costs the server, measured side by side in
//! one run: the CPU time of the server process per request (user +
//! system from /proc, so the load generator on the same cores does not
//! blur it) and requests per second, against the transport floor and raw
//! ONNX Runtime.
//!
//! - raw: ONNX Runtime in process on a prebuilt input (µs per call at
//!   batch 1; rows per second at batch 32 on the server's session count).
//! - echo: `floor-server --raw`, a bare tonic server on tokio's default
//!   runtime answering fixed bytes: the transport's cost.
//! - sluice as configured by default (gRPC served by a runtime per core,
//!   cheap batches run inline), on tokio's shared runtime
//!   (`--grpc_threads shared`), and on it with inline runs off as well
//!   (every batch handed to an inference thread: the server before issue
//!   35); and, with `--baseline PATH`, another build of sluice.
//!
//! Sections: `mlp` (batch-1 × 64 streams over 4 connections, unbatched
//! and auto batched), `cnn` (batch-1 requests auto batched, against the
//! composite limit of the transport and the model at batch 32),
//! `overload` (CPU per refusal against CPU per served request at twice
//! capacity), `peers` (the same KServe v2 ModelInfer bytes, MLP batch 1,
//! to sluice, to KServe's Python ModelServer and to MLServer, both
//! running the model in ONNX Runtime: `scripts/bench-peers`, which
//! installs them into git-ignored venvs on first use).
//!
//! ```text
//! cargo bench --bench cost [-- --duration 8 --only mlp,cnn,overload,peers --baseline PATH]
//! ```

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use sluice::cli::bench::inputs::RequestPool;
use sluice::cli::bench::load::{self, LoadPlan};
use sluice::cli::bench::stats::Summary;
use support::process::ServerProcess;
use support::{
    arg, cpu_seconds, guarded_cnn, mlp_model_infer, pool, raw_rows_per_second, served_model, sluice_binary, CNN_AUTO,
    MLP_AUTO, SERVER_TABLE, SESSIONS,
};

fn config() -> String {
    [
        SERVER_TABLE.to_string(),
        served_model("mlp", "mlp", ""),
        served_model("mlp_auto", "mlp", MLP_AUTO),
        served_model("cnn_auto", "cnn", CNN_AUTO),
        guarded_cnn(),
    ]
    .concat()
}

/// A load run's answers and the server's CPU time over it.
struct Measured {
    summary: Summary,
    /// Server CPU seconds over the measured run.
    cpu: f64,
}

impl Measured {
    /// Server CPU µs per request finished (answered or refused).
    fn cpu_us_per_request(&self) -> f64 {
        self.cpu * 1e6 / self.summary.requests.max(1) as f64
    }
}

struct Bench {
    runtime: tokio::runtime::Runtime,
    duration: Duration,
    rows: Vec<String>,
}

impl Bench {
    /// Loads `server` with `pool` (closed loop of `concurrency`, or open
    /// at `rps`) after a second of warm-up, and measures the server's CPU
    /// over exactly the measured part.
    fn measure(&self, server: &ServerProcess, pool: &RequestPool, concurrency: usize, rps: Option<f64>) -> Measured {
        self.measure_method(server, pool, concurrency, rps, None)
    }

    /// The same, sending the requests to the gRPC `method` (Predict when `None`).
    fn measure_method(
        &self,
        server: &ServerProcess,
        pool: &RequestPool,
        concurrency: usize,
        rps: Option<f64>,
        method: Option<&str>,
    ) -> Measured {
        let plan = |duration| LoadPlan {
            rps,
            warmup: Duration::ZERO,
            grpc_method: method.map(str::to_string),
            ..LoadPlan::closed(&server.url(), concurrency, duration)
        };
        let run = |duration| self.runtime.block_on(load::run(&plan(duration), pool.requests.clone(), pool.rows));
        run(Duration::from_secs(1)).expect("warm-up");
        let before = cpu_seconds(Some(server.pid()));
        let summary = run(self.duration).expect("load");
        let cpu = cpu_seconds(Some(server.pid())) - before;
        eprintln!("  {}", summary.text().replace('\n', "\n  "));
        eprintln!("  server CPU: {:.1} µs per request", cpu * 1e6 / summary.requests.max(1) as f64);
        Measured { summary, cpu }
    }

    fn row(&mut self, what: &str, measured: String, against: String, ratio: String, target: &str) {
        eprintln!("=> {what}: {measured} | {against} | {ratio} (target {target})");
        self.rows.push(format!("| {what} | {measured} | {against} | {ratio} | {target} |"));
    }
}

/// Mean µs of one `Session::run` of the MLP at batch 1, one thread.
fn raw_mlp_micros(model: &Path, duration: Duration) -> f64 {
    1e6 / raw_rows_per_second(model, "x", &[64], 1, 1, duration)
}

fn floor_server(rows: i64, extra: &[&str]) -> ServerProcess {
    let mut command = Command::new(env!("CARGO_BIN_EXE_floor-server"));
    command.args(["--rows", &rows.to_string(), "--cols", "10", "--raw"]).args(extra);
    ServerProcess::spawn(command, "echo", "floor-server: serving gRPC on ", Duration::from_secs(30), true)
        .expect("floor-server")
}

/// KServe v2 ModelInfer's path.
const MODEL_INFER: &str = "/inference.GRPCInferenceService/ModelInfer";

/// 16 ModelInfer requests for the MLP at batch 1, FP32 in
/// `raw_input_contents`, as any Triton or KServe client sends them.
fn model_infer_pool() -> RequestPool {
    let requests = (0..16u64)
        .map(|seed| {
            let x: Vec<f32> = (0..64).map(|i| ((i as u64 * 7 + seed * 13) % 17) as f32 / 17.0 - 0.5).collect();
            Bytes::from(prost::Message::encode_to_vec(&mlp_model_infer(&x)))
        })
        .collect();
    RequestPool { requests, rows: 1 }
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// `scripts/bench-peers serve NAME` on free ports: KServe's or MLServer's
/// Python server with the MLP in ONNX Runtime.
fn peer(root: &Path, name: &str) -> ServerProcess {
    let (grpc, http) = (free_port(), free_port());
    let mut command = Command::new(root.join("scripts/bench-peers"));
    command.args(["serve", name, "--grpc-port", &grpc.to_string(), "--http-port", &http.to_string()]);
    let ready = format!("peer-ready {name} http=127.0.0.1:{http} grpc=");
    ServerProcess::spawn(command, name, &ready, Duration::from_secs(600), false).expect("peer")
}

fn main() {
    let duration = Duration::from_secs(arg("--duration").unwrap_or(8));
    let only: String = arg("--only").unwrap_or_else(|| "mlp,cnn,overload".to_string());
    let root = support::fixtures::root();
    let dir = tempfile::tempdir().expect("temp dir");
    let config_path = dir.path().join("cost.toml");
    std::fs::write(&config_path, config()).expect("write config");
    let this = PathBuf::from(env!("CARGO_BIN_EXE_sluice"));
    let server = sluice_binary(&this, &config_path, &[]);
    // The same build with one change each, then (when given) another build.
    let mut sides: Vec<(String, ServerProcess)> = vec![
        ("shared runtime".into(), sluice_binary(&this, &config_path, &["--grpc_threads", "shared"])),
        (
            "shared runtime, inline off".into(),
            sluice_binary(&this, &config_path, &["--grpc_threads", "shared", "--inline_inference_micros", "0"]),
        ),
    ];
    if let Some(path) = arg::<PathBuf>("--baseline") {
        sides.push((format!("baseline {}", path.display()), sluice_binary(&path, &config_path, &[])));
    }
    let servers: Vec<(&str, &ServerProcess)> = std::iter::once(("sluice", &server))
        .chain(sides.iter().map(|(name, process)| (name.as_str(), process)))
        .collect();
    let mut bench = Bench { runtime: support::runtime(), duration, rows: Vec::new() };
    let target = server.url();

    if only.contains("mlp") {
        let echo = floor_server(1, &[]);
        let raw = raw_mlp_micros(&root.join("examples/models/mlp/2/model.onnx"), Duration::from_secs(2));
        eprintln!("raw ONNX Runtime, MLP batch 1: {raw:.2} µs per call");
        let ones = pool(&bench.runtime, &target, "mlp");
        eprintln!("echo floor, MLP-shaped batch-1 requests, 64 streams");
        let floor = bench.measure(&echo, &ones, 64, None);
        eprintln!("echo floor thread-per-core (a current-thread runtime per core, SO_REUSEPORT), 64 streams");
        let per_core = bench.measure(&floor_server(1, &["--per-core"]), &ones, 64, None);
        bench.row(
            "echo floor: thread-per-core against tokio's multi-thread runtime",
            format!(
                "{:.0} req/s, {:.1} µs CPU per request",
                per_core.summary.requests_per_second,
                per_core.cpu_us_per_request()
            ),
            format!(
                "{:.0} req/s, {:.1} µs CPU per request",
                floor.summary.requests_per_second,
                floor.cpu_us_per_request()
            ),
            format!("{:.2}× req/s", per_core.summary.requests_per_second / floor.summary.requests_per_second),
            "report",
        );
        let mut measured = Vec::new();
        for &(name, process) in &servers {
            eprintln!("{name}, MLP batch-1, 64 streams, no batching");
            let unbatched = bench.measure(process, &ones, 64, None);
            eprintln!("{name}, MLP batch-1, 64 streams, auto batching");
            let auto = bench.measure(process, &pool(&bench.runtime, &target, "mlp_auto"), 64, None);
            measured.push((name, unbatched, auto));
        }
        let floor_cpu = floor.cpu_us_per_request();
        let floor_rps = floor.summary.requests_per_second;
        for (name, unbatched, auto) in &measured {
            for (how, m) in [("no batching", unbatched), ("auto batching", auto)] {
                let cpu = m.cpu_us_per_request();
                bench.row(
                    &format!("{name}: server CPU per MLP request, {how}"),
                    format!("{cpu:.1} µs"),
                    format!("echo {floor_cpu:.1} µs + raw ORT {raw:.1} µs"),
                    format!("{:.1} µs added", cpu - floor_cpu - raw),
                    "≤ 20 µs",
                );
                bench.row(
                    &format!("{name}: MLP batch-1 × 64 streams, {how}"),
                    format!("{:.0} req/s", m.summary.requests_per_second),
                    format!("echo {floor_rps:.0} req/s"),
                    format!("{:.2}×", m.summary.requests_per_second / floor_rps),
                    "≥ 1.0×",
                );
            }
        }
    }

    if only.contains("cnn") {
        let echo = floor_server(1, &[]);
        let raw = raw_rows_per_second(
            &root.join("examples/models/cnn/1/model.onnx"),
            "image",
            &[3, 32, 32],
            32,
            SESSIONS,
            duration,
        );
        eprintln!("raw ONNX Runtime, CNN batch 32, {SESSIONS} threads: {raw:.0} rows/s");
        let ones = pool(&bench.runtime, &target, "cnn_auto");
        eprintln!("echo floor, CNN-sized batch-1 requests, 64 streams");
        let floor = bench.measure(&echo, &ones, 64, None).summary.requests_per_second;
        let composite = 1.0 / (1.0 / floor + 1.0 / raw);
        for &(name, process) in &servers {
            eprintln!("{name}, CNN batch-1 requests, 64 streams, auto batching (at most 32)");
            let auto = bench.measure(process, &ones, 64, None).summary.rows_per_second;
            bench.row(
                &format!("{name}: CNN batch-1 × 64 streams, auto batched"),
                format!("{auto:.0} rows/s"),
                format!("composite 1/(1/{floor:.0} + 1/{raw:.0}) = {composite:.0}"),
                format!("{:.2}× (raw ORT b32: {:.2}×)", auto / composite, auto / raw),
                "≥ 0.7× composite",
            );
        }
    }

    if only.contains("overload") {
        let guarded = pool(&bench.runtime, &target, "cnn_guarded");
        for &(name, process) in &servers {
            eprintln!("{name}: capacity of cnn_guarded (4 admitted at once), closed loop of 4");
            let capacity = bench.measure(process, &guarded, 4, None);
            let served_cpu = capacity.cpu / capacity.summary.ok.max(1) as f64;
            let rate = 2.0 * capacity.summary.requests_per_second;
            eprintln!("{name}: open loop at twice capacity, {rate:.0} req/s");
            let over = bench.measure(process, &guarded, 1024, Some(rate));
            let refused = over.summary.requests - over.summary.ok;
            let refusal_cpu = (over.cpu - over.summary.ok as f64 * served_cpu) / refused.max(1) as f64;
            let codes: Vec<String> = over.summary.errors.iter().map(|(code, n)| format!("{code}: {n}")).collect();
            bench.row(
                &format!("{name}: server CPU per refusal at 2× capacity"),
                format!("{:.1} µs", refusal_cpu * 1e6),
                format!("per served request {:.1} µs", served_cpu * 1e6),
                format!("{:.2}×", refusal_cpu / served_cpu),
                "≤ 0.2×",
            );
            bench.row(
                &format!("{name}: goodput at 2× capacity ({})", codes.join(", ")),
                format!("{:.0} req/s", over.summary.requests_per_second),
                format!("capacity {:.0} req/s", capacity.summary.requests_per_second),
                format!("{:.2}×", over.summary.requests_per_second / capacity.summary.requests_per_second),
                "≥ 0.9×, only RESOURCE_EXHAUSTED",
            );
        }
    }

    if only.contains("peers") {
        let pool = model_infer_pool();
        let mut rates = Vec::new();
        for name in ["kserve", "mlserver"] {
            let process = peer(&root, name);
            eprintln!("{name}: KServe v2 ModelInfer, MLP batch 1, 64 streams");
            let peer = bench.measure_method(&process, &pool, 64, None, Some(MODEL_INFER));
            assert_eq!(peer.summary.ok, peer.summary.requests, "{name} answered every request");
            rates.push((name, peer.summary.requests_per_second, peer.cpu_us_per_request()));
        }
        eprintln!("sluice: KServe v2 ModelInfer, MLP batch 1, 64 streams");
        let ours = bench.measure_method(&server, &pool, 64, None, Some(MODEL_INFER));
        assert_eq!(ours.summary.ok, ours.summary.requests, "sluice answered every request");
        for (name, rate, cpu) in &rates {
            bench.row(
                &format!("KServe v2 ModelInfer, MLP batch 1 × 64 streams: sluice against {name}"),
                format!(
                    "{:.0} req/s, {:.1} µs CPU per request",
                    ours.summary.requests_per_second,
                    ours.cpu_us_per_request()
                ),
                format!("{rate:.0} req/s, {cpu:.1} µs CPU per request"),
                format!("{:.1}×", ours.summary.requests_per_second / rate),
                "≥ 20× the faster",
            );
        }
    }

    println!("\n| what | measured | against | ratio | target |\n|---|---|---|---|---|");
    for row in &bench.rows {
        println!("{row}");
    }
}
