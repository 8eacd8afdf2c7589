//! Goodput under a spike: the server on one core, the load generator on
//! the other, offered 0.5× to 3× what the server can serve.
//!
//! scripts/goodput [--duration 6] [--only cnn,cnn_unbatched,mlp,rest,priority] [--loads 0.5,1,1.5,2,3]
//!
//! The script pins this process to core 1 (`taskset -c 1`) and it starts
//! the release server pinned to core 0, at the default log level (as users
//! run it), so refusing competes only with the server's own serving. For
//! each model: capacity is the closed-loop throughput at 64 in flight;
//! then, for each multiple of it, an open loop at that rate with a 1 s
//! deadline on every request. Printed per row: OK answers per second and
//! their share of capacity (goodput), p50 and p99 of the OK answers, the
//! refusals by code and their p99, how much of its schedule the load
//! generator kept, and the server's CPU per refusal against its CPU per
//! served request (from `/proc`: the load's CPU minus what its OK answers
//! cost at the capacity run's CPU per answer, over the refusals). Each
//! model runs twice in one go, with push-back on (the default) and off
//! (`--push_back false`), side by side.
//!
//! `rest`: the CNN over REST: capacity a closed loop of 16 connections,
//! then an open loop at each multiple (a connection per call in flight,
//! reused), then a closed loop of 256 workers that send again at once.
//!
//! `priority`: a high-priority stream at a tenth of capacity, alone and
//! then beside a low-priority flood at 3× capacity; its p99 each time,
//! against four servers: with and without a session kept for high
//! priority (`onnx.high_priority_sessions`), at `compute_nice` 0 and 10.
//! Beside the flood it is measured twice: sent from a thread of its own
//! (as a separate client would send it; the flood's thread sends up to
//! 3× capacity and would delay the stream's calls before they leave),
//! and from the flood's own thread, as earlier runs measured it.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use sluice::cli::bench::inputs::{input_specs, random_pool, rest_bodies, RequestPool};
use sluice::cli::bench::load::LoadPlan;
use sluice::cli::bench::stats::Summary;
use sluice::proto::tensorflow::serving::ModelSpec;
use support::process::ServerProcess;
use support::{arg, cpu_seconds, fixtures, run};

/// The CNN batched as `--enable_batching` alone batches it (auto, to its
/// 10 ms latency target), and the MLP unbatched.
const CNN: &str = "batching = { mode = \"auto\" }";
const MLP: &str = "";
/// The CNN unbatched: the unbatched case the one load core can offer 3×
/// of (it cannot offer 3× of the MLP's ~20k req/s: the `client CPU`
/// column shows it saturated there).
const CNN_UNBATCHED: &str = "";

/// The server's ONNX Runtime settings: one core, one thread.
const ONNX: &str = "onnx = { sessions = 1, intra_op_threads = 1 }";

/// `sluice serve` of this build pinned to core 0, at the default log
/// level, serving `config` with `extra` flags.
fn pinned_server(config: &Path, extra: &[&str]) -> ServerProcess {
    let mut command = Command::new("taskset");
    command
        .args(["-c", "0", env!("CARGO_BIN_EXE_sluice")])
        .args(["serve", "--host", "127.0.0.1", "--port", "0", "--rest_api_port", "0"])
        .args(extra)
        .arg("--model_config_file")
        .arg(config);
    ServerProcess::spawn(command, "sluice", "sluice: serving gRPC on ", Duration::from_secs(120), false)
        .expect("sluice pinned to core 0 (is taskset installed?)")
}

/// One open-loop row of the sweep.
struct Row {
    multiple: f64,
    offered: f64,
    summary: Summary,
    server_cpu: f64,
    /// This process's CPU over the row: near 1 s a second, the load
    /// generator, not the server, bounds what the row shows.
    client_cpu: f64,
}

fn main() {
    let duration = Duration::from_secs(arg("--duration").unwrap_or(6));
    let only: Option<String> = arg("--only");
    let wants = |what: &str| only.as_deref().is_none_or(|o| o.split(',').any(|w| w == what));
    let loads: Vec<f64> = arg::<String>("--loads")
        .unwrap_or_else(|| "0.5,1,1.5,2,3".into())
        .split(',')
        .filter_map(|v| v.parse().ok())
        .collect();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    if cores != 1 {
        eprintln!("goodput: this process may run on {cores} cores; run it through scripts/goodput (taskset -c 1)");
    }
    let dir = tempfile::tempdir().expect("temp dir");
    // One thread: the load generator is one core's worth of client.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    for (label, model, keys) in [("cnn", "cnn", CNN), ("cnn_unbatched", "cnn", CNN_UNBATCHED), ("mlp", "mlp", MLP)] {
        if !wants(label) {
            continue;
        }
        let config = dir.path().join(format!("{label}.toml"));
        let table = fixtures::model_table(model, &fixtures::example_dir(model), &format!("{ONNX}\n{keys}"));
        std::fs::write(&config, format!("{}{table}", support::SERVER_TABLE)).expect("config");
        for push_back in ["true", "false"] {
            sweep(&runtime, &config, (label, model), push_back, &loads, duration);
        }
    }
    if wants("rest") {
        let config = dir.path().join("rest.toml");
        let table = fixtures::model_table("cnn", &fixtures::example_dir("cnn"), &format!("{ONNX}\n{CNN}"));
        std::fs::write(&config, format!("{}{table}", support::SERVER_TABLE)).expect("config");
        rest_sweep(&runtime, &config, &loads, duration);
    }
    if wants("priority") {
        priority(&runtime, dir.path(), duration);
    }
}

/// Capacity, then each multiple of it, against one server.
fn sweep(
    runtime: &tokio::runtime::Runtime,
    config: &Path,
    (label, model): (&str, &str),
    push_back: &str,
    loads: &[f64],
    duration: Duration,
) {
    let server = pinned_server(config, &["--push_back", push_back]);
    let target = server.url();
    let requests = runtime.block_on(pool_async(&target, model));
    let plan = |rps: Option<f64>, concurrency: usize| LoadPlan {
        connections: 8,
        rps,
        timeout: Some(Duration::from_secs(1)),
        warmup: Duration::from_secs(1),
        ..LoadPlan::closed(&target, concurrency, duration)
    };
    let pid = Some(server.pid());
    let cpu_before = cpu_seconds(pid);
    let capacity = run(runtime, &plan(None, 64), &requests, &format!("{label}: capacity, closed loop of 64"));
    let capacity_cpu = cpu_seconds(pid) - cpu_before;
    let per_answer = capacity_cpu / capacity.ok.max(1) as f64;
    let rss_steady = server.rss_bytes().unwrap_or(0);
    let mut rows = Vec::new();
    let mut rss_3x = 0;
    for &multiple in loads {
        let offered = capacity.requests_per_second * multiple;
        let before = cpu_seconds(pid);
        let client_before = cpu_seconds(None);
        let summary = run(
            runtime,
            &plan(Some(offered), 8192),
            &requests,
            &format!("{label}: open loop at {multiple}x ({offered:.0} req/s), push_back {push_back}"),
        );
        let server_cpu = cpu_seconds(pid) - before;
        let client_cpu = cpu_seconds(None) - client_before;
        if multiple >= 3.0 {
            rss_3x = server.rss_bytes().unwrap_or(0);
        }
        rows.push(Row { multiple, offered, summary, server_cpu, client_cpu });
    }
    println!(
        "\n{label}, push_back {push_back}: capacity {:.0} req/s (closed loop of 64, p50 {:.2} ms), server CPU {:.1} µs per answer",
        capacity.requests_per_second,
        capacity.p50_ms,
        per_answer * 1e6
    );
    print_rows(&capacity, per_answer, &rows);
    if rss_3x > 0 && rss_steady > 0 {
        println!(
            "RSS: {:.1} MiB steady, {:.1} MiB under 3x ({:.2}x)",
            mib(rss_steady),
            mib(rss_3x),
            rss_3x as f64 / rss_steady as f64
        );
    }
}

/// Each open-loop row against `capacity`, whose CPU per answer was
/// `per_answer` seconds.
fn print_rows(capacity: &Summary, per_answer: f64, rows: &[Row]) {
    println!("| offered | OK/s | goodput | p50 OK | p99 OK | refused (codes) | refusal p99 | schedule kept | CPU per refusal / per answer | client CPU |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        let s = &row.summary;
        let refused = s.requests - s.ok;
        let refusal_cpu =
            if refused > 0 { ((row.server_cpu - per_answer * s.ok as f64) / refused as f64).max(0.0) } else { 0.0 };
        let codes: Vec<String> = s.errors.iter().map(|(code, n)| format!("{code} {n}")).collect();
        println!(
            "| {:.1}x ({:.0}/s) | {:.0} | {:.2}x | {:.2} ms | {:.2} ms | {refused} ({}) | {:.2} ms | {:.0} % | {:.2}x ({:.1} µs) | {:.0} % |",
            row.multiple,
            row.offered,
            s.requests_per_second,
            s.requests_per_second / capacity.requests_per_second,
            s.p50_ms,
            s.p99_ms,
            if codes.is_empty() { "none".to_string() } else { codes.join(", ") },
            s.error_p99_ms,
            100.0 * s.requests as f64 / (row.offered * s.seconds),
            refusal_cpu / per_answer,
            refusal_cpu * 1e6,
            // The row's warm-up second counts too.
            100.0 * row.client_cpu / (s.seconds + 1.0),
        );
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

async fn pool_async(target: &str, model: &str) -> RequestPool {
    let spec = ModelSpec { name: model.into(), ..Default::default() };
    let specs = input_specs(target, &spec, None).await.expect("metadata");
    random_pool(&specs, &spec, 1, &Default::default(), 16, 7).expect("pool")
}

/// REST: capacity is a closed loop of 16 workers (one HTTP/1.1
/// connection each); then an open loop at each multiple of it, each call
/// on an idle connection or a new one (at most 2048 at once), as many
/// independent callers would send; then a closed loop of 256 workers,
/// each sending again at once after a refusal, as earlier runs measured.
fn rest_sweep(runtime: &tokio::runtime::Runtime, config: &Path, loads: &[f64], duration: Duration) {
    let server = pinned_server(config, &[]);
    let http = server.stdout_after("sluice: serving HTTP on ").expect("HTTP address");
    let grpc = runtime.block_on(pool_async(&server.url(), "cnn"));
    let bodies = RequestPool { requests: rest_bodies(&grpc.requests).expect("REST bodies"), rows: grpc.rows };
    let plan = |rps: Option<f64>, concurrency: usize| LoadPlan {
        rest_path: Some("/v1/models/cnn:predict".into()),
        rps,
        timeout: Some(Duration::from_secs(1)),
        warmup: Duration::from_secs(1),
        ..LoadPlan::closed(&format!("http://{http}"), concurrency, duration)
    };
    let pid = Some(server.pid());
    let cpu_before = cpu_seconds(pid);
    let capacity = run(runtime, &plan(None, 16), &bodies, "rest cnn: capacity, closed loop of 16");
    let per_answer = (cpu_seconds(pid) - cpu_before) / capacity.ok.max(1) as f64;
    let mut rows = Vec::new();
    for &multiple in loads {
        let offered = capacity.requests_per_second * multiple;
        let (before, client_before) = (cpu_seconds(pid), cpu_seconds(None));
        let summary = run(
            runtime,
            &plan(Some(offered), 2048),
            &bodies,
            &format!("rest cnn: open loop at {multiple}x ({offered:.0} req/s)"),
        );
        let (server_cpu, client_cpu) = (cpu_seconds(pid) - before, cpu_seconds(None) - client_before);
        rows.push(Row { multiple, offered, summary, server_cpu, client_cpu });
    }
    let flood = run(runtime, &plan(None, 256), &bodies, "rest cnn: closed loop of 256");
    println!(
        "\nrest cnn: capacity {:.0} req/s (closed loop of 16, p50 {:.2} ms), server CPU {:.1} µs per answer",
        capacity.requests_per_second,
        capacity.p50_ms,
        per_answer * 1e6
    );
    print_rows(&capacity, per_answer, &rows);
    println!(
        "rest cnn: closed loop of 256 workers: {:.0} OK/s ({:.2}x), p99 OK {:.2} ms, {} refused ({:?}), refusal p99 {:.2} ms",
        flood.requests_per_second,
        flood.requests_per_second / capacity.requests_per_second,
        flood.p99_ms,
        flood.requests - flood.ok,
        flood.errors,
        flood.error_p99_ms
    );
}

/// A high-priority stream alone, then beside a low-priority flood at 3×.
fn priority(runtime: &tokio::runtime::Runtime, dir: &Path, duration: Duration) {
    for (kept, nice) in [(0, 0), (1, 0), (0, 10), (1, 10)] {
        println!(
            "\npriority: the model with {kept} session(s) kept for high priority (onnx.high_priority_sessions), \
             compute_nice {nice}"
        );
        priority_with(runtime, dir, duration, kept, nice);
    }
}

fn priority_with(runtime: &tokio::runtime::Runtime, dir: &Path, duration: Duration, kept: usize, nice: usize) {
    let config = dir.join("priority.toml");
    let onnx = format!("onnx = {{ sessions = 1, intra_op_threads = 1, high_priority_sessions = {kept} }}");
    let table = fixtures::model_table("cnn", &fixtures::example_dir("cnn"), &format!("{onnx}\n{CNN}"));
    std::fs::write(&config, format!("{}{table}\n[traffic]\nlow_priority_share = 0.5\n", support::SERVER_TABLE))
        .expect("config");
    let server = pinned_server(&config, &["--compute_nice", &nice.to_string()]);
    let target = server.url();
    let requests = runtime.block_on(pool_async(&target, "cnn"));
    let base = |rps: Option<f64>, concurrency: usize, priority: &str| LoadPlan {
        connections: 4,
        rps,
        timeout: Some(Duration::from_secs(1)),
        warmup: Duration::from_secs(1),
        priority: Some(priority.into()),
        ..LoadPlan::closed(&target, concurrency, duration)
    };
    let capacity = run(runtime, &base(None, 64, "normal"), &requests, "priority: capacity, closed loop of 64");
    let stream_rps = capacity.requests_per_second / 10.0;
    let alone = run(runtime, &base(Some(stream_rps), 1024, "high"), &requests, "high-priority stream alone");
    let stream_plan = base(Some(stream_rps), 1024, "high");
    let flood_plan = base(Some(capacity.requests_per_second * 3.0), 8192, "low");
    println!("\npriority: high-priority stream at {stream_rps:.0} req/s: p99 {:.2} ms alone", alone.p99_ms);
    for own_thread in [true, false] {
        let (with_flood, flood) = if own_thread {
            // The stream's client on a thread (and runtime) of its own.
            let (plan, pool) = (stream_plan.clone(), requests.requests.clone());
            let stream = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                runtime.block_on(sluice::cli::bench::load::run(&plan, pool, 1))
            });
            let flood = runtime.block_on(sluice::cli::bench::load::run(&flood_plan, requests.requests.clone(), 1));
            (stream.join().expect("stream thread").expect("stream"), flood.expect("flood"))
        } else {
            runtime.block_on(async {
                let stream = sluice::cli::bench::load::run(&stream_plan, requests.requests.clone(), 1);
                let flood = sluice::cli::bench::load::run(&flood_plan, requests.requests.clone(), 1);
                let (stream, flood) = tokio::join!(stream, flood);
                (stream.expect("stream"), flood.expect("flood"))
            })
        };
        println!(
            "priority: beside a low-priority flood at 3x ({:.0} OK/s of it, {} refused), the stream sent from {}: \
             p99 {:.2} ms, {:.2}x of alone; the stream's failures: {:?}",
            flood.requests_per_second,
            flood.requests - flood.ok,
            if own_thread { "a thread of its own" } else { "the flood's thread" },
            with_flood.p99_ms,
            with_flood.p99_ms / alone.p99_ms,
            with_flood.errors
        );
    }
}
