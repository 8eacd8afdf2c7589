//! Traffic control measured side by side:
//!
//! 1. The response cache on a skewed key mix: the CNN example served with
//!    and without `cache`, both loaded with the same sequence of requests
//!    drawn from `--keys` distinct inputs by a Zipf law (exponent `--zipf`),
//!    closed loop, interleaved rounds; throughput and p99 of each, their
//!    ratios, and the hit rate the server counted.
//! 2. Priorities under a flood: a pipeline (scale plugin → MLP, batched)
//!    serving a steady high-priority stream (open loop, `--stream-rps`)
//!    alone, then beside a closed-loop flood of low-priority requests, then
//!    beside the same flood sent without a priority; the stream's p99 in
//!    each, and its ratio to the stream alone.
//!
//! ```text
//! cargo bench --bench traffic [-- --duration 5 --rounds 3 --keys 1000 --zipf 1.1]
//! ```

mod support;

use std::path::Path;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use sluice::cli::bench::load::{self, LoadPlan};
use sluice::cli::bench::stats::Summary;
use support::{arg, pool, sluice};

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// `n` indexes into `keys` items, drawn by a Zipf law of exponent `s`.
fn zipf_sequence(keys: usize, s: f64, n: usize, seed: u64) -> Vec<usize> {
    let weights: Vec<f64> = (1..=keys).map(|k| 1.0 / (k as f64).powf(s)).collect();
    let total: f64 = weights.iter().sum();
    let mut cumulative = Vec::with_capacity(keys);
    let mut sum = 0.0;
    for w in &weights {
        sum += w / total;
        cumulative.push(sum);
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let u: f64 = rng.random();
            cumulative.partition_point(|&c| c < u).min(keys - 1)
        })
        .collect()
}

fn cache_bench(root: &Path, dir: &Path, runtime: &tokio::runtime::Runtime, duration: Duration, rounds: usize) {
    let keys: usize = arg("--keys").unwrap_or(1000);
    let s: f64 = arg("--zipf").unwrap_or(1.1);
    let model = |cache: &str| {
        format!("[[models]]\nname = \"cnn\"\nbase_path = \"{}\"\n{cache}", root.join("examples/models/cnn").display())
    };
    let servers: Vec<(&str, support::process::ServerProcess)> =
        [("no cache", ""), ("cache", "cache = { max_mib = 256, ttl_secs = 600 }\n")]
            .into_iter()
            .enumerate()
            .map(|(i, (name, cache))| {
                let path = dir.join(format!("cache{i}.toml"));
                std::fs::write(&path, model(cache)).expect("write config");
                (name, sluice(&path, &[]))
            })
            .collect();
    let distinct = {
        let target = servers[0].1.url();
        let spec = sluice::proto::tensorflow::serving::ModelSpec { name: "cnn".into(), ..Default::default() };
        runtime.block_on(async {
            let specs = sluice::cli::bench::inputs::input_specs(&target, &spec, None).await.expect("metadata");
            sluice::cli::bench::inputs::random_pool(&specs, &spec, 1, &Default::default(), keys, 11).expect("pool")
        })
    };
    let sequence: Vec<bytes::Bytes> =
        zipf_sequence(keys, s, 50_000, 5).into_iter().map(|k| distinct.requests[k].clone()).collect();
    let unique = sequence.iter().map(|r| r.as_ptr()).collect::<std::collections::HashSet<_>>().len();
    let mut measured: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); servers.len()];
    for round in 0..rounds {
        for (i, (name, server)) in servers.iter().enumerate() {
            let plan = LoadPlan { warmup: Duration::from_secs(1), ..LoadPlan::closed(&server.url(), 16, duration) };
            let summary = runtime.block_on(load::run(&plan, sequence.clone(), 1)).expect("load");
            assert_eq!(summary.requests, summary.ok, "{name}: failed requests");
            eprintln!("round {round}, {name}: {:.0} req/s, p99 {:.2} ms", summary.requests_per_second, summary.p99_ms);
            measured[i].0.push(summary.requests_per_second);
            measured[i].1.push(summary.p99_ms);
        }
    }
    let metrics = runtime.block_on(async {
        let http = servers[1].1.stdout_after("sluice: serving HTTP on ").expect("HTTP address");
        let mut client =
            sluice::cli::bench::client::RestClient::new(&format!("http://{}", http.trim())).expect("client");
        let response = client.call(http::Method::GET, "/metrics", &[], bytes::Bytes::new()).await.expect("metrics");
        String::from_utf8_lossy(&response.body).to_string()
    });
    let count = |outcome: &str| {
        let series = format!("sluice_response_cache_requests_total{{pipeline=\"cnn\",outcome=\"{outcome}\"}} ");
        metrics.lines().find_map(|l| l.strip_prefix(&series)?.trim().parse::<f64>().ok()).unwrap_or(0.0)
    };
    let (hits, misses) = (count("hit"), count("miss"));
    println!(
        "response cache, CNN, {keys} distinct inputs by Zipf s={s} ({unique} of them in the 50000-request sequence), \
         16 streams closed loop, median of {rounds}:"
    );
    println!("| side | req/s | p99 | throughput vs no cache | p99 vs no cache |");
    println!("|---|---|---|---|---|");
    let (base_rps, base_p99) = (median(&mut measured[0].0.clone()), median(&mut measured[0].1.clone()));
    for ((name, _), (rps, p99)) in servers.iter().zip(&mut measured) {
        let (rps, p99) = (median(rps), median(p99));
        println!("| {name} | {rps:.0} | {p99:.2} ms | {:.2}× | {:.2}× |", rps / base_rps, p99 / base_p99);
    }
    println!(
        "hit rate counted by the server: {:.1}% ({hits} hits, {misses} misses)",
        hits / (hits + misses).max(1.0) * 100.0
    );
}

fn priority_bench(root: &Path, dir: &Path, runtime: &tokio::runtime::Runtime, duration: Duration, rounds: usize) {
    let stream_rps: f64 = arg("--stream-rps").unwrap_or(100.0);
    let plugins = dir.join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugins dir");
    std::fs::copy(root.join("target/plugins/scale.wasm"), plugins.join("scale.wasm"))
        .expect("scale.wasm (run scripts/build-plugins)");
    let config = format!(
        r#"
[plugins]
dir = "{plugins}"
[[models]]
name = "mlp"
base_path = "{mlp}"
batching = {{ max_batch_size = 8, batch_timeout_micros = 500, max_enqueued_batches = 1000, num_batch_threads = 1 }}
[[pipelines]]
name = "scored"
model = "mlp"
max_in_flight = 256
preprocess = {{ plugin = "scale", workers = 1, queue_capacity = 1024 }}
[traffic]
low_priority_share = 0.5
"#,
        plugins = plugins.display(),
        mlp = root.join("examples/models/mlp").display()
    );
    let path = dir.join("priority.toml");
    std::fs::write(&path, config).expect("write config");
    let server = sluice(&path, &[]);
    let target = server.url();
    let requests = pool(runtime, &target, "scored");
    let stream = LoadPlan {
        rps: Some(stream_rps),
        warmup: Duration::from_secs(1),
        priority: Some("high".into()),
        ..LoadPlan::closed(&target, 64, duration)
    };
    let flood = |priority: Option<&str>| LoadPlan {
        warmup: Duration::ZERO,
        priority: priority.map(str::to_string),
        ..LoadPlan::closed(&target, 64, duration + Duration::from_secs(2))
    };
    let mut p99s: Vec<Vec<f64>> = vec![Vec::new(); 3];
    let mut flood_rps: Vec<Vec<f64>> = vec![Vec::new(); 3];
    for round in 0..rounds {
        for (i, flood_priority) in [None, Some(Some("low")), Some(None)].into_iter().enumerate() {
            let (high, flooded): (Summary, Option<Summary>) = runtime.block_on(async {
                let flooding = flood_priority.map(|p| {
                    let plan = flood(p);
                    let requests = requests.requests.clone();
                    tokio::spawn(async move { load::run(&plan, requests, 1).await })
                });
                let high = load::run(&stream, requests.requests.clone(), 1).await.expect("stream");
                let flooded = match flooding {
                    Some(task) => Some(task.await.expect("join").expect("flood")),
                    None => None,
                };
                (high, flooded)
            });
            assert_eq!(high.requests, high.ok, "the high-priority stream had failures: {:?}", high.errors);
            eprintln!(
                "round {round}, side {i}: stream p99 {:.2} ms; flood {:.0} req/s answered, {:.1}% refused",
                high.p99_ms,
                flooded.as_ref().map_or(0.0, |f| f.ok as f64 / f.seconds),
                flooded.as_ref().map_or(0.0, |f| f.error_rate * 100.0)
            );
            p99s[i].push(high.p99_ms);
            flood_rps[i].push(flooded.as_ref().map_or(0.0, |f| f.ok as f64 / f.seconds));
        }
    }
    println!(
        "priorities: a high-priority stream at {stream_rps} req/s (open loop) into scale → MLP (batched), with a \
         64-stream closed-loop flood beside it; median of {rounds}:"
    );
    println!("| side | stream p99 | vs stream alone | flood answered req/s |");
    println!("|---|---|---|---|");
    let alone = median(&mut p99s[0].clone());
    for (i, name) in
        ["stream alone", "with a low-priority flood", "with the same flood at normal priority"].iter().enumerate()
    {
        let p99 = median(&mut p99s[i]);
        println!("| {name} | {p99:.2} ms | {:.2}× | {:.0} |", p99 / alone, median(&mut flood_rps[i]));
    }
}

fn main() {
    let duration = Duration::from_secs(arg("--duration").unwrap_or(5));
    let rounds: usize = arg("--rounds").unwrap_or(3);
    let root = support::fixtures::root();
    let dir = tempfile::tempdir().expect("temp dir");
    let runtime = support::runtime();
    let only: Option<String> = arg("--only");
    if only.as_deref().is_none_or(|o| o == "cache") {
        cache_bench(&root, dir.path(), &runtime, duration, rounds);
    }
    if only.as_deref().is_none_or(|o| o == "priority") {
        priority_bench(&root, dir.path(), &runtime, duration, rounds);
    }
}
