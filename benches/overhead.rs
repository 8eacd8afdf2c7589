//! What sluice adds to one unbatched request, measured side by side in one
//! run: the MLP at batch 1, one request in flight, over loopback.
//!
//! - sluice: the release binary serving the MLP;
//! - floor: `floor-server --raw`, a bare tonic echo server answering fixed
//!   bytes of the same response shape, decoding and encoding nothing (the
//!   transport's cost, and nothing more);
//! - raw: `Session::run` on the same model, in process.
//!
//! The same lean client (`sluice bench`'s: pre-encoded request bytes sent
//! as they are, answers not decoded) and the same bytes go to both
//! servers, in alternating rounds so that drift on a noisy machine hits both alike.
//! Overhead = p50(sluice) − p50(floor) − p50(raw).
//!
//! Each server's CPU per request over the measured rounds is printed too.
//! `SLUICE_EXTRA_ARGS` and `FLOOR_EXTRA_ARGS` add flags to either server
//! (`--grpc_threads shared`, `--per-core`).
//!
//! ```text
//! cargo bench --bench overhead [-- --requests 5000 --rounds 6]
//! ```

mod support;

use support::{arg, cpu_seconds, mlp_predict};

use std::process::Command;
use std::time::{Duration, Instant};

use sluice::cli::bench::client::RawPredictClient;
use support::process::ServerProcess;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let requests: usize = arg("--requests").unwrap_or(2000);
    let rounds: usize = arg("--rounds").unwrap_or(10);
    let root = support::fixtures::root();
    let model_dir = root.join("examples/models/mlp");
    let ready = Duration::from_secs(120);

    let mut sluice = Command::new(env!("CARGO_BIN_EXE_sluice"));
    sluice
        .args(["serve", "--host", "127.0.0.1", "--port", "0", "--rest_api_port", "0", "--log_level", "warn"])
        .args(["--model_name", "mlp"])
        .args(std::env::var("SLUICE_EXTRA_ARGS").unwrap_or_default().split_whitespace())
        .arg("--model_base_path")
        .arg(&model_dir)
        .current_dir(&root);
    let sluice = ServerProcess::spawn(sluice, "sluice", "sluice: serving gRPC on ", ready, true).expect("sluice");
    let mut floor = Command::new(env!("CARGO_BIN_EXE_floor-server"));
    floor
        .args(["--rows", "1", "--cols", "10", "--raw"])
        .args(std::env::var("FLOOR_EXTRA_ARGS").unwrap_or_default().split_whitespace());
    let floor = ServerProcess::spawn(floor, "floor", "floor-server: serving gRPC on ", ready, true).expect("floor");

    let x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
    let request = mlp_predict(&x);
    let request = bytes::Bytes::from(prost::Message::encode_to_vec(&request));

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let (sluice_pid, floor_pid) = (sluice.pid(), floor.pid());
    let (sluice_times, floor_times, round_gaps, cpu) = runtime.block_on(async {
        let mut to_sluice = RawPredictClient::connect(&sluice.url(), None).await.expect("connect sluice");
        let mut to_floor = RawPredictClient::connect(&floor.url(), None).await.expect("connect floor");
        for _ in 0..1000 {
            to_sluice.predict(request.clone(), None).await.expect("sluice predict");
            to_floor.predict(request.clone(), None).await.expect("floor predict");
        }
        let mut sluice_times = Vec::with_capacity(requests * rounds);
        let mut floor_times = Vec::with_capacity(requests * rounds);
        let mut round_gaps = Vec::with_capacity(rounds);
        let cpu_before = (cpu_seconds(Some(sluice_pid)), cpu_seconds(Some(floor_pid)));
        for _ in 0..rounds {
            let (mut s, mut f) = (Vec::with_capacity(requests), Vec::with_capacity(requests));
            for _ in 0..requests {
                let started = Instant::now();
                to_sluice.predict(request.clone(), None).await.expect("sluice predict");
                s.push(started.elapsed());
                let started = Instant::now();
                to_floor.predict(request.clone(), None).await.expect("floor predict");
                f.push(started.elapsed());
            }
            s.sort();
            f.sort();
            round_gaps.push(micros(percentile(&s, 0.5)) - micros(percentile(&f, 0.5)));
            sluice_times.extend(s);
            floor_times.extend(f);
        }
        // Server CPU per request, at one request in flight: mostly waking
        // up for each request and going back to sleep.
        let per_request = |now: f64, before: f64| (now - before) * 1e6 / (requests * rounds) as f64;
        let cpu = (
            per_request(cpu_seconds(Some(sluice_pid)), cpu_before.0),
            per_request(cpu_seconds(Some(floor_pid)), cpu_before.1),
        );
        round_gaps.sort_by(f64::total_cmp);
        (sluice_times, floor_times, round_gaps, cpu)
    });

    let environment = sluice::infer::onnx::library::environment(None).expect("ONNX Runtime (run scripts/setup)");
    let mut session = ort::session::Session::builder(environment)
        .expect("builder")
        .with_intra_threads(1)
        .expect("threads")
        .commit_from_file(model_dir.join("2/model.onnx"))
        .expect("session");
    let input = ort::value::Tensor::from_array(([1usize, 64], x.clone())).expect("input");
    for _ in 0..1000 {
        session.run(ort::inputs!["x" => &input]).expect("run");
    }
    let mut raw_times = Vec::with_capacity(requests * rounds);
    for _ in 0..requests * rounds {
        let started = Instant::now();
        let outputs = session.run(ort::inputs!["x" => &input]).expect("run");
        drop(outputs);
        raw_times.push(started.elapsed());
    }

    let mut rows = Vec::new();
    for (name, mut times) in
        [("sluice", sluice_times), ("floor (tonic echo, fixed bytes)", floor_times), ("raw session.run", raw_times)]
    {
        times.sort();
        rows.push((name, percentile(&times, 0.5), percentile(&times, 0.9), percentile(&times, 0.99)));
    }
    println!(
        "\nMLP batch 1, one request in flight, {} requests each ({rounds} alternating rounds)\n",
        requests * rounds
    );
    println!("| path | p50 µs | p90 µs | p99 µs |");
    println!("|---|---|---|---|");
    for (name, p50, p90, p99) in &rows {
        println!("| {name} | {:.1} | {:.1} | {:.1} |", micros(*p50), micros(*p90), micros(*p99));
    }
    let overhead = micros(rows[0].1) - micros(rows[1].1) - micros(rows[2].1);
    let median_gap = round_gaps[round_gaps.len() / 2];
    println!("\noverhead = p50 sluice − p50 floor − p50 raw = {overhead:.1} µs (target ≤ 30 µs)");
    println!(
        "per round (sluice and floor interleaved request by request), p50 sluice − p50 floor: median {median_gap:.1} µs, \
         range {:.1} to {:.1} µs; minus raw: {:.1} µs",
        round_gaps[0],
        round_gaps[round_gaps.len() - 1],
        median_gap - micros(rows[2].1)
    );
    println!("server CPU per request: sluice {:.1} µs, floor {:.1} µs", cpu.0, cpu.1);
}
