//! Overload: twice the measured capacity for a minute, then back to normal.
//!
//! scripts/overload [--duration 60]
//!
//! Model `cnn` (batching on, `max_in_flight = 64`) on the release server,
//! its compute threads at the network threads' priority unless
//! `SLUICE_COMPUTE_NICE` (`server.compute_nice`) puts them below.
//! First its capacity: a closed loop of 32 streams for 10 s. Then an open
//! loop at 2× that rate: what is over capacity must be refused, fast, with
//! RESOURCE_EXHAUSTED, while accepted requests keep a bounded p99 and
//! memory stays flat. Then the same closed loop again, and /readyz.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::cli::bench::client::RestClient;
use sluice::cli::bench::load::LoadPlan;
use sluice::cli::bench::stats::{Recorder, Summary};
use support::{arg, pool, run, sluice};

fn main() {
    let duration = Duration::from_secs(arg("--duration").unwrap_or(60));
    let root = support::fixtures::root();
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
    let server = sluice(&config, &[]);
    let http = server.stdout_after("sluice: serving HTTP on ").expect("HTTP address");
    let target = server.url();
    let runtime = support::runtime();
    let pool = pool(&runtime, &target, "cnn");
    let plan = |rps: Option<f64>, concurrency: usize, duration: Duration| LoadPlan {
        connections: 8,
        rps,
        timeout: Some(Duration::from_secs(2)),
        ..LoadPlan::closed(&target, concurrency, duration)
    };
    let run = |what: &str, plan: LoadPlan| -> Summary { run(&runtime, &plan, &pool, what) };
    let capacity = run("capacity: closed loop, 32 streams", plan(None, 32, Duration::from_secs(10)));
    let rss_before = server.rss_bytes().expect("rss");
    let rate = capacity.requests_per_second * 2.0;
    // A health probe every 50 ms through the burst, as Kubernetes sends
    // them: a saturated server that answers them late gets restarted.
    let stop_probing = Arc::new(AtomicBool::new(false));
    let probes = runtime.spawn(probe_health(http.clone(), stop_probing.clone()));
    let overload = run(&format!("overload: open loop at {rate:.0} req/s (2x)"), plan(Some(rate), 1024, duration));
    stop_probing.store(true, Ordering::Relaxed);
    let probes = runtime.block_on(probes).expect("health probes").summary(duration);
    let rss_after = server.rss_bytes().expect("rss");
    let after = run("after: closed loop, 32 streams", plan(None, 32, Duration::from_secs(10)));
    // Memory once normal load has run again: what the burst left behind,
    // as against what the allocator still held right after it.
    let rss_settled = server.rss_bytes().expect("rss");
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
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    let growth = |bytes: u64| (bytes as f64 / rss_before as f64 - 1.0) * 100.0;
    println!(
        "\nresident memory: {:.1} MiB before the overload, {:.1} MiB right after ({:+.1} %), {:.1} MiB after 10 s \
         of normal load ({:+.1} %); /readyz after: {ready}",
        mib(rss_before),
        mib(rss_after),
        growth(rss_after),
        mib(rss_settled),
        growth(rss_settled)
    );
    println!(
        "/healthz during the overload: {} probes, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        probes.requests, probes.p50_ms, probes.p99_ms, probes.max_ms
    );
    println!(
        "targets: refusals p99 < 5 ms ({}), other errors 0 ({}), after p99 within 1.5x of capacity p99 ({:.2}x)",
        if overload.error_p99_ms < 5.0 { "met" } else { "MISSED" },
        if other == 0 { "met" } else { "MISSED" },
        after.p99_ms / capacity.p99_ms
    );
    assert!(refused > 0, "2x capacity was all accepted: the capacity run did not find the limit");
}

/// Probes `/healthz` at `http` every 50 ms until `stop`; answers the
/// probes' latencies (a failed probe counts as a 2 s answer, so that it
/// shows in the tail).
async fn probe_health(http: String, stop: Arc<AtomicBool>) -> Recorder {
    let mut client = RestClient::new(&http).expect("client");
    let mut latencies = Recorder::default();
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let start = Instant::now();
        let answered = tokio::time::timeout(
            Duration::from_secs(2),
            client.call(http::Method::GET, "/healthz", &[], bytes::Bytes::new()),
        )
        .await;
        let ok = matches!(answered, Ok(Ok(ref response)) if response.status == http::StatusCode::OK);
        latencies.ok(if ok { start.elapsed() } else { Duration::from_secs(2) }, 1);
    }
    latencies
}
