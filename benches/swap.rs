//! p99 latency while a pipeline's plugin is swapped 20 times, against the
//! same load without swaps, in one run on one server.
//!
//! cargo bench --bench swap [-- --duration 10]
//!
//! Pipeline `scored` = plugin → MLP, under a closed loop of 16 gRPC
//! streams. Steady: the load alone. Swapping: the same load while another
//! thread activates the two uploaded versions (identity, scale) in turn,
//! 20 times spread over the run. Needs scripts/build-plugins.

mod support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use sluice::cli::bench::client::RestClient;
use sluice::cli::bench::load::LoadPlan;
use sluice::cli::bench::stats::Summary;
use support::fixtures::{admin_token, example_dir, model_table, pipeline_table, plugin_bytes, ConfigDir};
use support::{arg, pool, run, sluice};

const TOKEN: &str = "bench-token";

async fn admin(http: &str, method: Method, path: &str, body: Vec<u8>) {
    let mut client = RestClient::new(http).expect("client");
    let authorization = format!("Bearer {TOKEN}");
    let response =
        client.call(method, path, &[("authorization", &authorization)], Bytes::from(body)).await.expect("admin call");
    assert!(response.status.is_success(), "{path}: {}", response.text());
}

fn main() {
    let duration = Duration::from_secs(arg("--duration").unwrap_or(10));
    let config = format!(
        "[plugins]\ndir = \"$PLUGINS\"\n[admin]\nenabled = true\n{}{}{}",
        admin_token("bench", None, TOKEN),
        model_table("mlp", &example_dir("mlp"), "onnx = { sessions = 2, intra_op_threads = 1 }"),
        pipeline_table("scored", "mlp", "preprocess = { plugin = \"features\", workers = 2 }"),
    );
    let dir = ConfigDir::new(&[("features", "identity")], &config);
    let server = sluice(&dir.config(), &[]);
    let http = server.stdout_after("sluice: serving HTTP on ").expect("HTTP address");
    let runtime = support::runtime();
    runtime.block_on(async {
        admin(&http, Method::PUT, "/admin/v1/plugins/features", plugin_bytes("identity")).await;
        admin(&http, Method::PUT, "/admin/v1/plugins/features?activate=true", plugin_bytes("scale")).await;
    });
    let target = server.url();
    let pool = pool(&runtime, &target, "scored");
    let plan = LoadPlan::closed(&target, 16, duration);
    let run = |label: &str| -> Summary { run(&runtime, &plan, &pool, label) };
    let steady = run("steady: 16 streams, no swaps");
    // Swaps start after the warm-up, spread over the measured time.
    let swapper = {
        let http = http.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            std::thread::sleep(Duration::from_secs(2));
            let every = duration / 21;
            let started = Instant::now();
            for swap in 0..20u32 {
                std::thread::sleep(every);
                let path = format!("/admin/v1/plugins/features/versions/{}/activate", 1 + swap % 2);
                runtime.block_on(admin(&http, Method::POST, &path, vec![]));
            }
            started.elapsed()
        })
    };
    let swapping = run("swapping: the same load, 20 activations");
    let took = swapper.join().expect("swapper");
    assert_eq!(swapping.ok, swapping.requests, "no request may fail during the swaps");
    println!();
    println!("| | p50 ms | p99 ms | req/s | failed |");
    println!("|---|---|---|---|---|");
    for (label, s) in [("steady", &steady), ("20 swaps in {took:?}", &swapping)] {
        let label = label.replace("{took:?}", &format!("{:.1} s", took.as_secs_f64()));
        println!(
            "| {label} | {:.3} | {:.3} | {:.0} | {} |",
            s.p50_ms,
            s.p99_ms,
            s.requests_per_second,
            s.requests - s.ok
        );
    }
    println!("\np99 during swaps / steady p99: {:.2}× (target ≤ 1.2×)", swapping.p99_ms / steady.p99_ms);
}
