//! Overload: twice the measured capacity for a minute, then back to normal.
//!
//! scripts/overload [-- --duration 60]
//!
//! Model `cnn` (batching on, `max_in_flight = 64`) on the release server.
//! First its capacity: a closed loop of 32 streams for 10 s. Then an open
//! loop at 2× that rate: what is over capacity must be refused, fast, with
//! RESOURCE_EXHAUSTED, while accepted requests keep a bounded p99 and
//! memory stays flat. Then the same closed loop again, and /readyz.

#[allow(dead_code)]
#[path = "../tests/common/process.rs"]
mod process;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use process::ServerProcess;
use sluice::cli::bench::client::RestClient;
use sluice::cli::bench::inputs::{input_specs, random_pool};
use sluice::cli::bench::load::{self, LoadPlan};
use sluice::cli::bench::stats::Summary;
use sluice::proto::tensorflow::serving::ModelSpec;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let duration = Duration::from_secs(arg("--duration").and_then(|d| d.parse().ok()).unwrap_or(60));
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("sluice.toml");
    std::fs::write(
        &config,
        format!(
            "[[models]]\nname = \"cnn\"\nbase_path = \"{}\"\nmax_in_flight = 64\n\
             onnx = {{ sessions = 2, intra_op_threads = 1 }}\n\
             batching = {{ max_batch_size = 8, batch_timeout_micros = 2000, max_enqueued_batches = 8 }}\n",
            root.join("examples/models/cnn").display()
        ),
    )
    .expect("config");
    let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
    command
        .args(["serve", "--host", "127.0.0.1", "--port", "0", "--rest_api_port", "0", "--log_level", "warn"])
        .arg("--model_config_file")
        .arg(&config);
    let server = ServerProcess::spawn(command, "sluice", "sluice: serving gRPC on ", Duration::from_secs(120), true)
        .expect("sluice");
    let http = server.stdout_after("sluice: serving HTTP on ").expect("HTTP address");
    let target = server.url();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let pool = runtime.block_on(async {
        let spec = ModelSpec { name: "cnn".into(), ..Default::default() };
        let specs = input_specs(&target, &spec).await.expect("metadata");
        random_pool(&specs, &spec, 1, &Default::default(), 16, 7).expect("pool")
    });
    let plan = |rps: Option<f64>, concurrency: usize, duration: Duration| LoadPlan {
        target: target.clone(),
        connections: 8,
        concurrency,
        rps,
        duration,
        warmup: Duration::from_secs(2),
        timeout: Some(Duration::from_secs(2)),
        progress: false,
        rest_path: None,
    };
    let run = |what: &str, plan: LoadPlan| -> Summary {
        let summary = runtime.block_on(load::run(&plan, pool.requests.clone(), pool.rows)).expect("load");
        eprintln!("{what}\n  {}", summary.text().replace('\n', "\n  "));
        summary
    };
    let capacity = run("capacity: closed loop, 32 streams", plan(None, 32, Duration::from_secs(10)));
    let rss_before = server.rss_bytes().expect("rss");
    let rate = capacity.requests_per_second * 2.0;
    let overload = run(&format!("overload: open loop at {rate:.0} req/s (2x)"), plan(Some(rate), 1024, duration));
    let rss_after = server.rss_bytes().expect("rss");
    let after = run("after: closed loop, 32 streams", plan(None, 32, Duration::from_secs(10)));
    let ready = runtime.block_on(async {
        let mut client = RestClient::new(&http).expect("client");
        client.call(http::Method::GET, "/readyz", &[], bytes::Bytes::new()).await.expect("readyz").status
    });

    let refused = overload.errors.get("RESOURCE_EXHAUSTED").copied().unwrap_or(0);
    let other: u64 = overload.errors.iter().filter(|(c, _)| c.as_str() != "RESOURCE_EXHAUSTED").map(|(_, n)| n).sum();
    println!();
    println!("| phase | offered | answered OK | refused (RESOURCE_EXHAUSTED) | other errors | OK p50 ms | OK p99 ms | refusal p99 ms |");
    println!("|---|---|---|---|---|---|---|---|");
    for (label, s, offered) in [
        ("capacity (closed loop)", &capacity, "32 streams".to_string()),
        ("2x capacity (open loop)", &overload, format!("{rate:.0} req/s")),
        ("after (closed loop)", &after, "32 streams".to_string()),
    ] {
        let refused = s.errors.get("RESOURCE_EXHAUSTED").copied().unwrap_or(0);
        let other: u64 = s.errors.iter().filter(|(c, _)| c.as_str() != "RESOURCE_EXHAUSTED").map(|(_, n)| n).sum();
        println!(
            "| {label} | {offered} | {} ({:.0}/s) | {refused} | {other} | {:.2} | {:.2} | {:.2} |",
            s.ok,
            s.ok as f64 / s.seconds,
            s.p50_ms,
            s.p99_ms,
            s.error_p99_ms
        );
    }
    println!(
        "\nresident memory: {:.1} MiB before the overload, {:.1} MiB after ({:+.1} %); /readyz after: {ready}",
        rss_before as f64 / (1 << 20) as f64,
        rss_after as f64 / (1 << 20) as f64,
        (rss_after as f64 / rss_before as f64 - 1.0) * 100.0
    );
    println!(
        "targets: refusals p99 < 5 ms ({}), other errors 0 ({}), after p99 within 1.5x of capacity p99 ({:.2}x)",
        if overload.error_p99_ms < 5.0 { "met" } else { "MISSED" },
        if other == 0 { "met" } else { "MISSED" },
        after.p99_ms / capacity.p99_ms
    );
    assert!(refused > 0, "2x capacity was all accepted: the capacity run did not find the limit");
}
