//! p99 and throughput while new CNN versions load and take over under
//! steady load, against the same load with no switch, in one run on one
//! server; then resident memory over 20 load/unload cycles.
//!
//! cargo bench --bench reload [-- --duration 10 --switches 3]
//!
//! Model `cnn` (policy latest) under a closed loop of 8 gRPC streams.
//! Steady: the load alone. Switching: the same load while new versions
//! appear in the repository (two different CNNs in turn), each found by
//! the 1 s repository poll, loaded, warmed up and switched to, the old one
//! drained. Rows: with the optimised-graph cache (the default) and
//! without it. Memory: after the first of 20 switches and after the last.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use sluice::cli::bench::load::LoadPlan;
use sluice::cli::bench::stats::Summary;
use support::{arg, pool, run, sluice, wait_switched};

/// The two CNNs versions alternate between (same shape, other weights).
fn cnn_file(root: &Path, n: i64) -> PathBuf {
    if n % 2 == 1 {
        root.join("examples/models/cnn/1/model.onnx")
    } else {
        root.join("tests/fixtures/models/cnn/2/model.onnx")
    }
}

/// Puts version `n` in place whole (written aside, renamed in).
fn publish(repository: &Path, root: &Path, n: i64) {
    let staging = repository.join(format!(".staging-{n}"));
    std::fs::create_dir_all(&staging).expect("staging dir");
    std::fs::copy(cnn_file(root, n), staging.join("model.onnx")).expect("copy model");
    std::fs::rename(&staging, repository.join(n.to_string())).expect("rename into place");
}

struct Row {
    label: &'static str,
    steady: Summary,
    switching: Summary,
    switches: Vec<Duration>,
}

fn measure(
    root: &Path,
    label: &'static str,
    cache: bool,
    duration: Duration,
    switches: i64,
) -> (Row, Option<(u64, u64)>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let repository = dir.path().join("cnn");
    std::fs::create_dir_all(&repository).expect("repository");
    publish(&repository, root, 1);
    let config = format!(
        "[lifecycle]\ncache_optimized_models = {cache}\noptimized_model_cache_dir = \"{}\"\n\
         [[models]]\nname = \"cnn\"\nbase_path = \"{}\"\nonnx = {{ sessions = 2, intra_op_threads = 1 }}\n",
        dir.path().join("optimized").display(),
        repository.display()
    );
    let config_path = dir.path().join("sluice.toml");
    std::fs::write(&config_path, config).expect("config");
    let server = sluice(&config_path, &["--file_system_poll_wait_seconds", "1"]);
    let target = server.url();
    let runtime = support::runtime();
    let pool = pool(&runtime, &target, "cnn");
    let plan = LoadPlan::closed(&target, 8, duration);
    let run = |what: &str| -> Summary { run(&runtime, &plan, &pool, &format!("{label}, {what}")) };
    let steady = run("steady");
    // Switches start after the warm-up, spread over the measured time.
    let switcher = {
        let (repository, root, target) = (repository.clone(), root.to_path_buf(), target.clone());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            std::thread::sleep(Duration::from_secs(2));
            let every = duration / (switches as u32 + 1);
            (2..2 + switches)
                .map(|n| {
                    std::thread::sleep(every.saturating_sub(Duration::from_secs(1)));
                    publish(&repository, &root, n);
                    runtime.block_on(wait_switched(&target, "cnn", n))
                })
                .collect::<Vec<_>>()
        })
    };
    let switching = run("switching");
    let took = switcher.join().expect("switcher");
    assert_eq!(switching.ok, switching.requests, "no request may fail during the switches");
    let memory = cache.then(|| {
        // 20 load/unload cycles, no load: resident memory after the first
        // and after the last.
        let mut next = 2 + switches;
        let mut cycle = || {
            publish(&repository, root, next);
            runtime.block_on(wait_switched(&target, "cnn", next));
            next += 1;
        };
        cycle();
        std::thread::sleep(Duration::from_secs(1));
        let first = server.rss_bytes().expect("rss");
        for _ in 1..20 {
            cycle();
        }
        std::thread::sleep(Duration::from_secs(1));
        (first, server.rss_bytes().expect("rss"))
    });
    (Row { label, steady, switching, switches: took }, memory)
}

fn main() {
    let duration = Duration::from_secs(arg("--duration").unwrap_or(10));
    let switches: i64 = arg("--switches").unwrap_or(3);
    let root = support::fixtures::root();
    let (cached, memory) = measure(&root, "optimised-graph cache on (default)", true, duration, switches);
    let (uncached, _) = measure(&root, "cache off", false, duration, switches);
    println!();
    println!("| run | steady p99 ms | switching p99 ms | p99 ratio | steady req/s | switching req/s | throughput ratio | switch took | failed |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for row in [&cached, &uncached] {
        let took: Vec<String> = row.switches.iter().map(|d| format!("{:.2} s", d.as_secs_f64())).collect();
        println!(
            "| {} | {:.3} | {:.3} | {:.2}× | {:.0} | {:.0} | {:.2}× | {} | {} |",
            row.label,
            row.steady.p99_ms,
            row.switching.p99_ms,
            row.switching.p99_ms / row.steady.p99_ms,
            row.steady.requests_per_second,
            row.switching.requests_per_second,
            row.switching.requests_per_second / row.steady.requests_per_second,
            took.join(", "),
            row.switching.requests - row.switching.ok
        );
    }
    if let Some((first, last)) = memory {
        println!(
            "\nresident memory after 1 load/unload cycle: {:.1} MiB; after 20: {:.1} MiB; growth {:+.1} %",
            first as f64 / (1 << 20) as f64,
            last as f64 / (1 << 20) as f64,
            (last as f64 / first as f64 - 1.0) * 100.0
        );
    }
}
