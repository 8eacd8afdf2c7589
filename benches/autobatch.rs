//! Auto batching against hand-tuned batching, step by step from 10 % to
//! 150 % of capacity, on the example CNN with batch-1 requests.
//!
//! One server serves the same model under several names, each admitting
//! at most 128 requests at once (so that load past capacity is refused,
//! and goodput, not a growing queue, tells the configurations apart): `auto` (auto
//! mode, the latency target given here), and one fixed configuration per
//! point of a sweep over (max_batch_size, batch_timeout_micros), TF
//! Serving's default (32, 1000) among them. Capacity is measured first (a
//! closed loop of 256 streams on `auto`); then each step offers the same
//! open-loop rate to every configuration in turn, with `sluice bench`'s
//! load generator. Printed per step: auto's goodput against the best fixed
//! configuration's at that step and against the default's, and auto's p99
//! against the target.
//!
//! ```text
//! cargo bench --bench autobatch [-- --step-seconds 4 --target-ms 10]
//! ```

mod support;

use std::time::Duration;

use sluice::cli::bench::batching;
use sluice::cli::bench::load::LoadPlan;
use sluice::cli::bench::stats::Summary;
use support::{arg, pool, run, sluice};

/// The fixed sweep: (max_batch_size, batch_timeout_micros).
const SWEEP: &[(usize, u64)] =
    &[(8, 0), (8, 1000), (8, 4000), (16, 0), (16, 1000), (16, 4000), (32, 0), (32, 1000), (32, 4000)];

/// TF Serving's defaults in sluice: max_batch_size 32, 1000 µs.
const DEFAULT: (usize, u64) = (32, 1000);

/// Offered load, as fractions of the measured capacity.
const STEPS: &[f64] = &[0.1, 0.3, 0.5, 0.7, 0.9, 1.1, 1.3, 1.5];

fn main() {
    let step = Duration::from_secs(arg("--step-seconds").unwrap_or(4));
    let target_ms: u64 = arg("--target-ms").unwrap_or(10);
    let root = support::fixtures::root();
    let cnn = root.join("examples/models/cnn");
    let mut config = String::from("[server]\ndrain_timeout_secs = 1\n");
    let model = |name: &str, batching: String| {
        format!(
            "\n[[models]]\nname = \"{name}\"\nbase_path = \"{}\"\nmax_in_flight = 128\n\
             onnx = {{ sessions = 2, intra_op_threads = 1 }}\nbatching = {{ {batching}, max_enqueued_batches = 64 }}\n",
            cnn.display()
        )
    };
    config.push_str(&model("auto", format!("mode = \"auto\", latency_target_ms = {target_ms}, max_batch_size = 32")));
    for &(size, micros) in SWEEP {
        config.push_str(&model(
            &format!("fixed_{size}_{micros}"),
            format!("max_batch_size = {size}, batch_timeout_micros = {micros}"),
        ));
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("sluice.toml");
    std::fs::write(&path, config).expect("config");
    let server = sluice(&path, &[]);
    let http = server.stdout_after("sluice: serving HTTP on ").expect("HTTP address");
    let target = server.url();
    let runtime = support::runtime();
    let plan = |rps: Option<f64>, duration: Duration| LoadPlan {
        rps,
        warmup: Duration::from_secs(1),
        timeout: Some(Duration::from_secs(2)),
        // Open loop: room for any backlog. Closed loop: enough streams to
        // keep every batch full, so that it measures capacity.
        ..LoadPlan::closed(&target, if rps.is_some() { 1024 } else { 256 }, duration)
    };
    let goodput = |s: &Summary| s.ok as f64 / s.seconds.max(1e-9);
    let auto_pool = pool(&runtime, &target, "auto");
    let capacity =
        run(&runtime, &plan(None, Duration::from_secs(6)), &auto_pool, "capacity: auto, closed loop, 256 streams");
    let capacity = goodput(&capacity);
    let names: Vec<String> =
        std::iter::once("auto".to_string()).chain(SWEEP.iter().map(|(s, m)| format!("fixed_{s}_{m}"))).collect();
    let pools: Vec<_> = names.iter().map(|name| pool(&runtime, &target, name)).collect();
    let default_name = format!("fixed_{}_{}", DEFAULT.0, DEFAULT.1);
    let mut rows = Vec::new();
    for (step_index, &fraction) in STEPS.iter().enumerate() {
        let rate = capacity * fraction;
        let mut results: Vec<(String, Summary)> = Vec::new();
        // Each step starts at a different configuration, so that no one
        // configuration always runs first (or last) in a step.
        let start = step_index % names.len();
        for at in (0..names.len()).map(|i| (start + i) % names.len()) {
            let (name, requests) = (&names[at], &pools[at]);
            let label = format!("{:.0} % of capacity ({rate:.0} req/s): {name}", fraction * 100.0);
            results.push((name.clone(), run(&runtime, &plan(Some(rate), step), requests, &label)));
        }
        let auto = &results.iter().find(|(n, _)| n == "auto").expect("auto").1;
        let (best_name, best) = results
            .iter()
            .filter(|(n, _)| n != "auto")
            .max_by(|a, b| goodput(&a.1).total_cmp(&goodput(&b.1)).then(b.1.p99_ms.total_cmp(&a.1.p99_ms)))
            .expect("a fixed configuration");
        let default = &results.iter().find(|(n, _)| *n == default_name).expect("the default").1;
        let batchers = runtime.block_on(batching::fetch(&format!("http://{http}/metrics"), "auto")).unwrap_or_default();
        let chosen = batchers.first().map_or_else(String::new, |b| format!("{} (cap {})", b.want_rows, b.cap_rows));
        rows.push(format!(
            "| {:.0} % | {rate:.0} | {:.0} | {:.2} | {chosen} | {best_name}: {:.0} ok/s, p99 {:.2} ms | {:.2}× | {:.0} ok/s, p99 {:.2} ms | {:.2}× |",
            fraction * 100.0,
            goodput(auto),
            auto.p99_ms,
            goodput(best),
            best.p99_ms,
            goodput(auto) / goodput(best),
            goodput(default),
            default.p99_ms,
            goodput(auto) / goodput(default),
        ));
        eprintln!("{}", rows.last().expect("row"));
    }
    println!("\nCNN batch-1 requests, capacity {capacity:.0} req/s (auto, closed loop); auto target {target_ms} ms\n");
    println!(
        "| step | offered req/s | auto ok/s | auto p99 ms | auto waits for (cap) | best fixed | auto / best | default fixed (32, 1000 µs) | auto / default |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for row in &rows {
        println!("{row}");
    }
    let batchers = runtime.block_on(batching::fetch(&format!("http://{http}/metrics"), "auto")).unwrap_or_default();
    print!("\n{}", batching::text(&batchers));
}
