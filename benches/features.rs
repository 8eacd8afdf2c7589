//! Feature fetch, measured side by side in one run.
//!
//! 1. Redis lookups, coalesced vs one command per key: 64 requests in
//!    flight × 16 keys each against a real `redis-server`, through sluice's
//!    Redis store (cache off: every key goes to Redis) and through the
//!    plain way — one `HGETALL` per key on the same kind of multiplexed
//!    connection, the 16 of a request one after another, and all 16 at
//!    once. Throughput and round trips per request.
//! 2. What a pipeline pays for fetching its input: the MLP behind the
//!    release server, one request in flight, fed directly (`mlp`, 64
//!    floats sent) and through feature fetch (`mlp-embedded`: one key
//!    sent, 64 floats fetched from an embedded table; `mlp-cached`: the
//!    same from a Redis table whose local cache holds every key), in
//!    alternating rounds. Added = p50(with fetch) − p50(direct).
//! 3. Redis down: the MLP fed from a Redis table with the local cache
//!    off, 8 clients in a closed loop, healthy and then with
//!    redis-server killed, through a pipeline falling back to defaults
//!    (`on_store_error = "defaults"`): req/s down / healthy. And one
//!    client on a pipeline that fails: how fast a request is refused
//!    while the circuit breaker holds Redis down, against a healthy
//!    answer.
//!
//! ```text
//! cargo bench --bench features [-- --seconds 5 --requests 3000 --rounds 6]
//! ```

mod support;

use support::fixtures::{feature_fetch, pipeline_table};
use support::{arg, calls_per_second, cpu_seconds};

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use redis::AsyncCommands;
use sluice::config::FeaturesConfig;
use sluice::feature::{FeatureTables, Keys};
use sluice::metrics::Metrics;
use sluice::proto::tensorflow::serving::prediction_service_client::PredictionServiceClient;
use sluice::proto::tensorflow::serving::{ModelSpec, PredictRequest};
use sluice::proto::tensorflow::{DataType, TensorProto};
use sluice::tensor::proto::encode_shape;
use support::process::ServerProcess;
use support::redis::RedisServer;

// The allocator the server runs with: the store's costs are measured as
// they are in `sluice serve`.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const IN_FLIGHT: usize = 64;
const KEYS_PER_REQUEST: usize = 16;
const ENTITIES: usize = 1000;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Lookups per second, and CPU microseconds per lookup of this process
/// and of redis-server.
struct Measured {
    rate: f64,
    client_us: f64,
    redis_us: f64,
}

async fn measured<F, Fut>(seconds: u64, redis_pid: Option<u32>, lookup: F) -> Measured
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let (client, redis) = (cpu_seconds(None), cpu_seconds(redis_pid));
    let started = Instant::now();
    let rate = calls_per_second(seconds, IN_FLIGHT, move |_, n| lookup(n)).await;
    let lookups = rate * started.elapsed().as_secs_f64();
    Measured {
        rate,
        client_us: (cpu_seconds(None) - client) * 1e6 / lookups,
        redis_us: (cpu_seconds(redis_pid) - redis) * 1e6 / lookups,
    }
}

/// `x` of entity k: 64 floats.
fn row(k: usize) -> Vec<f32> {
    (0..64).map(|i| ((k * 64 + i) as f32 * 0.37).sin()).collect()
}

/// A table file of `ENTITIES` rows and the config naming it as `rows`
/// (embedded) and `cached` (Redis at `url`, cache on).
fn write_tables(dir: &Path, url: &str) -> PathBuf {
    let mut csv = String::from("key,x\n");
    for k in 0..ENTITIES {
        let values: Vec<String> = row(k).iter().map(f32::to_string).collect();
        csv.push_str(&format!("e{k},{}\n", values.join(" ")));
    }
    std::fs::write(dir.join("rows.csv"), csv).expect("write rows.csv");
    let root = support::fixtures::root();
    let config = format!(
        r#"
[[models]]
name = "mlp"
base_path = "{mlp}"
version_policy = {{ specific = [2] }}

[features.redis]
url = "{url}"
cache_entries = 100000
cache_ttl_ms = 600000

[features.tables.rows]
file = "rows.csv"
features.x = {{ dtype = "float32", shape = [64] }}

[features.tables.cached]
store = "redis"
features.x = {{ dtype = "float32", shape = [64] }}

{embedded}{cached}"#,
        mlp = root.join("examples/models/mlp").display(),
        embedded = fetching_pipeline("mlp-embedded", "rows"),
        cached = fetching_pipeline("mlp-cached", "cached"),
    );
    let path = dir.join("bench.toml");
    std::fs::write(&path, config).expect("write config");
    path
}

/// Pipeline `name`: the MLP's `x` fetched from `table` by `key`.
fn fetching_pipeline(name: &str, table: &str) -> String {
    pipeline_table(name, "mlp", &feature_fetch("", &[("key", table, "[{ feature = \"x\" }]")]))
}

/// Every entity's key, made once: formatting keys is the load
/// generator's cost, not the store's.
fn all_keys() -> &'static [Bytes] {
    static KEYS: std::sync::OnceLock<Vec<Bytes>> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| (0..ENTITIES).map(|k| Bytes::from(format!("e{k}"))).collect())
}

fn keys_of(request: usize) -> Vec<Bytes> {
    (0..KEYS_PER_REQUEST).map(|j| all_keys()[(request * 7 + j * 61) % ENTITIES].clone()).collect()
}

async fn redis_comparison(config_path: &Path, url: &str, redis_pid: Option<u32>, seconds: u64) {
    load_table(config_path, "cached", url).await;
    // The store with its cache off (every key crosses to Redis), with its
    // defaults and with a 200 µs window.
    let default = coalesced(url, redis_pid, seconds, 4, 0).await;
    let windowed = coalesced(url, redis_pid, seconds, 8, 200).await;
    let client = redis::Client::open(url).expect("client");
    let connection = client.get_multiplexed_async_connection().await.expect("connect");
    let sequential = {
        let connection = connection.clone();
        measured(seconds, redis_pid, move |n| {
            let mut connection = connection.clone();
            async move {
                for key in keys_of(n) {
                    let hash = [b"cached:", key.as_ref()].concat();
                    let row: std::collections::HashMap<String, Vec<u8>> =
                        connection.hgetall(hash).await.expect("HGETALL");
                    assert_eq!(row["x"].len(), 256);
                }
            }
        })
        .await
    };
    let concurrent = {
        let connection = connection.clone();
        measured(seconds, redis_pid, move |n| {
            let connection = connection.clone();
            async move {
                let calls = keys_of(n).into_iter().map(|key| {
                    let mut connection = connection.clone();
                    async move {
                        let hash = [b"cached:", key.as_ref()].concat();
                        let row: std::collections::HashMap<String, Vec<u8>> =
                            connection.hgetall(hash).await.expect("HGETALL");
                        assert_eq!(row["x"].len(), 256);
                    }
                });
                futures::future::join_all(calls).await;
            }
        })
        .await
    };
    println!("\nRedis lookups, {IN_FLIGHT} requests in flight × {KEYS_PER_REQUEST} keys, {seconds} s each\n");
    println!(
        "| path | lookups/s | round trips per request | vs coalesced | CPU µs per lookup: client | redis-server |"
    );
    println!("|---|---|---|---|---|---|");
    let coalesced = &default.0;
    for (name, trips, m) in [
        ("sluice, coalesced, defaults (4 trips in flight, no window)", format!("{:.3}", default.1), &default.0),
        ("sluice, coalesced, 8 trips in flight, 200 µs window", format!("{:.3}", windowed.1), &windowed.0),
        ("one HGETALL per key, one after another", format!("{KEYS_PER_REQUEST}"), &sequential),
        ("one HGETALL per key, all 16 at once", format!("{KEYS_PER_REQUEST}"), &concurrent),
    ] {
        println!(
            "| {name} | {:.0} | {trips} | {:.2}× | {:.1} | {:.1} |",
            m.rate,
            m.rate / coalesced.rate,
            m.client_us,
            m.redis_us
        );
    }
    println!(
        "\ncoalesced (defaults) / one-after-another = {:.2}×, / all-at-once = {:.2}×; \
         with the window: {:.2}× and {:.2}× (target ≥ 3×)",
        coalesced.rate / sequential.rate,
        coalesced.rate / concurrent.rate,
        windowed.0.rate / sequential.rate,
        windowed.0.rate / concurrent.rate
    );
    let cpu = |m: &Measured| m.client_us + m.redis_us;
    println!(
        "CPU per lookup (client + redis-server): one-after-another / coalesced = {:.2}× (defaults), {:.2}× (window)",
        cpu(&sequential) / cpu(coalesced),
        cpu(&sequential) / cpu(&windowed.0)
    );
}

/// sluice's Redis store (cache off) under the load: its rate and CPU, and
/// round trips per request.
async fn coalesced(url: &str, redis_pid: Option<u32>, seconds: u64, trips: usize, window: usize) -> (Measured, f64) {
    let features: FeaturesConfig = toml::from_str(&format!(
        "[redis]\nurl = \"{url}\"\ncache_entries = 0\ntimeout_ms = 1000\n\
         max_round_trips_in_flight = {trips}\nbatch_window_us = {window}\n\
         [tables.cached]\nstore = \"redis\"\nfeatures.x = {{ dtype = \"float32\", shape = [64] }}\n"
    ))
    .expect("features config");
    let metrics = Metrics::new();
    let tables = Arc::new(FeatureTables::open(&features, &metrics).await.expect("open"));
    // Wait for the background connection.
    let probe = keys_of(0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while tables.get("cached").expect("table").lookup(Keys::Strings(&probe), &[0], None).await.is_err() {
        assert!(Instant::now() < deadline, "sluice's Redis store did not connect");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let measured = measured(seconds, redis_pid, move |n| {
        let tables = tables.clone();
        async move {
            let keys = keys_of(n);
            let found = tables.get("cached").expect("table").lookup(Keys::Strings(&keys), &[0], None).await;
            assert!(found.expect("lookup")[0].present.iter().all(|&p| p));
        }
    })
    .await;
    let family = |name: &str| {
        metrics
            .encode()
            .lines()
            .find(|l| l.starts_with(name) && l.contains("table=\"cached\""))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let trips_per_request =
        family("sluice_feature_round_trips_total") / family("sluice_feature_lookups_total").max(1.0);
    (measured, trips_per_request)
}

fn request(pipeline: &str, name: &str, tensor: TensorProto) -> PredictRequest {
    PredictRequest {
        model_spec: Some(ModelSpec { name: pipeline.into(), ..Default::default() }),
        inputs: [(name.to_string(), tensor)].into_iter().collect(),
        output_filter: vec![],
    }
}

/// A request to `pipeline` giving one entity's `key` as input `key`.
fn key_request(pipeline: &str, key: Bytes) -> PredictRequest {
    let tensor = TensorProto {
        dtype: DataType::DtString as i32,
        tensor_shape: Some(encode_shape(&[1])),
        string_val: vec![key],
        ..Default::default()
    };
    request(pipeline, "key", tensor)
}

/// Writes `table` (its file: `rows.csv` beside `config`) into Redis at `url`.
async fn load_table(config: &Path, table: &str, url: &str) {
    let args = sluice::cli::features_load::LoadArgs {
        file: config.with_file_name("rows.csv"),
        config: config.to_path_buf(),
        table: table.into(),
        redis: Some(url.to_string()),
        key: None,
        chunk: 1000,
    };
    println!("{}", sluice::cli::features_load::load(&args).await.expect("load the table into Redis"));
}

async fn pipeline_cost(config_path: &Path, requests: usize, rounds: usize) {
    let mut sluice = Command::new(env!("CARGO_BIN_EXE_sluice"));
    sluice
        .args(["serve", "--host", "127.0.0.1", "--port", "0", "--rest_api_port", "0", "--log_level", "warn"])
        .arg("--model_config_file")
        .arg(config_path);
    let sluice = ServerProcess::spawn(sluice, "sluice", "sluice: serving gRPC on ", Duration::from_secs(120), true)
        .expect("sluice");
    let k = 17;
    let direct = request(
        "mlp",
        "x",
        TensorProto {
            dtype: DataType::DtFloat as i32,
            tensor_shape: Some(encode_shape(&[1, 64])),
            tensor_content: Bytes::copy_from_slice(bytemuck::cast_slice(&row(k))),
            ..Default::default()
        },
    );
    let key = |pipeline: &str| key_request(pipeline, Bytes::from(format!("e{k}")));
    let paths = [
        ("direct (64 floats sent)", direct),
        ("embedded table", key("mlp-embedded")),
        ("Redis, cache hit", key("mlp-cached")),
    ];
    let mut client = PredictionServiceClient::connect(sluice.url()).await.expect("connect");
    let mut answers = Vec::new();
    for (name, request) in &paths {
        let response = client.predict(request.clone()).await.unwrap_or_else(|e| panic!("{name}: {e}")).into_inner();
        answers.push(response.outputs);
    }
    assert!(answers.windows(2).all(|w| w[0] == w[1]), "the three paths must answer the same");
    for _ in 0..1000 {
        for (_, request) in &paths {
            client.predict(request.clone()).await.expect("warm up");
        }
    }
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); paths.len()];
    let mut gaps: Vec<Vec<f64>> = vec![Vec::new(); paths.len()];
    for _ in 0..rounds {
        let mut round: Vec<Vec<Duration>> = vec![Vec::with_capacity(requests); paths.len()];
        for _ in 0..requests {
            for (i, (_, request)) in paths.iter().enumerate() {
                let started = Instant::now();
                client.predict(request.clone()).await.expect("predict");
                round[i].push(started.elapsed());
            }
        }
        for r in &mut round {
            r.sort();
        }
        for i in 0..paths.len() {
            gaps[i].push(micros(percentile(&round[i], 0.5)) - micros(percentile(&round[0], 0.5)));
            times[i].extend(round[i].iter().copied());
        }
    }
    println!("\nMLP batch 1 through the release server, one request in flight, {} requests each ({rounds} alternating rounds)\n", requests * rounds);
    println!("| path | p50 µs | p99 µs | added at p50 vs direct (median of rounds) |");
    println!("|---|---|---|---|");
    for (i, (name, _)) in paths.iter().enumerate() {
        times[i].sort();
        gaps[i].sort_by(f64::total_cmp);
        println!(
            "| {name} | {:.1} | {:.1} | {:+.1} µs |",
            micros(percentile(&times[i], 0.5)),
            micros(percentile(&times[i], 0.99)),
            gaps[i][gaps[i].len() / 2]
        );
    }
}

/// Part 3: closed-loop req/s with Redis up and down, and the refusal
/// time while it is held down.
async fn store_down(redis: &mut RedisServer, dir: &Path, seconds: u64, requests: usize) {
    let url = redis.url();
    let root = support::fixtures::root();
    let defaults =
        feature_fetch("on_store_error = \"defaults\"", &[("key", "live", "[{ feature = \"x\", default = 0.0 }]")]);
    let fail = feature_fetch("", &[("key", "live", "[{ feature = \"x\" }]")]);
    let config = format!(
        r#"{server}
[[models]]
name = "mlp"
base_path = "{mlp}"
version_policy = {{ specific = [2] }}

[features.redis]
url = "{url}"
cache_entries = 0

[features.tables.live]
store = "redis"
features.x = {{ dtype = "float32", shape = [64] }}

{defaults}{fail}"#,
        server = support::SERVER_TABLE,
        mlp = root.join("examples/models/mlp").display(),
        defaults = pipeline_table("mlp-defaults", "mlp", &defaults),
        fail = pipeline_table("mlp-fail", "mlp", &fail),
    );
    let path = dir.join("down.toml");
    std::fs::write(&path, config).expect("write config");
    load_table(&path, "live", &url).await;
    // The default log level, as users run it: what the outage logs is
    // part of its cost.
    let sluice = support::sluice(&path, &[]);
    let client = PredictionServiceClient::connect(sluice.url()).await.expect("connect");
    let key = |pipeline: &str, n: usize| key_request(pipeline, all_keys()[(n * 61) % ENTITIES].clone());
    let closed_loop = |pipeline: &'static str| {
        let client = client.clone();
        calls_per_second(seconds, 8, move |_, n| {
            let mut client = client.clone();
            let request = key(pipeline, n);
            async move {
                client.predict(request).await.expect("a pipeline with defaults answers");
            }
        })
    };
    let one_by_one = |pipeline: &'static str| {
        let mut client = client.clone();
        async move {
            let mut times = Vec::with_capacity(requests);
            let mut failed = 0;
            for n in 0..requests {
                let started = Instant::now();
                if let Err(status) = client.predict(key(pipeline, n)).await {
                    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
                    failed += 1;
                }
                times.push(started.elapsed());
            }
            times.sort();
            (percentile(&times, 0.5), percentile(&times, 0.99), failed)
        }
    };
    let _ = closed_loop("mlp-defaults").await;
    let healthy = closed_loop("mlp-defaults").await;
    let (healthy_p50, healthy_p99, _) = one_by_one("mlp-fail").await;
    redis.kill();
    // Held down once a few round trips have failed.
    let mut probe = client.clone();
    let started = Instant::now();
    loop {
        let status = probe.predict(key("mlp-fail", 0)).await.expect_err("Redis is dead");
        if status.message().contains("is down") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "never held down: {status:?}");
    }
    let down = closed_loop("mlp-defaults").await;
    let (down_p50, down_p99, refused) = one_by_one("mlp-fail").await;
    redis.restart();
    println!(
        "\nRedis down: the MLP fed from a Redis table (local cache off), release server at the default log level\n"
    );
    println!("| pipeline | Redis up | Redis down (held down by the breaker) | down / up |");
    println!("|---|---|---|---|");
    println!(
        "| `on_store_error = \"defaults\"`, 8 clients, closed loop | {healthy:.0} req/s | {down:.0} req/s | {:.2}x |",
        down / healthy
    );
    println!(
        "| `on_store_error = \"fail\"`, one client: p50 / p99 | {:.0} / {:.0} µs (answered) | {:.0} / {:.0} µs \
         ({refused} of {requests} refused) | {:.2}x at p50 |",
        micros(healthy_p50),
        micros(healthy_p99),
        micros(down_p50),
        micros(down_p99),
        micros(down_p50) / micros(healthy_p50)
    );
}

fn main() {
    let seconds: u64 = arg("--seconds").unwrap_or(5);
    let requests: usize = arg("--requests").unwrap_or(3000);
    let rounds: usize = arg("--rounds").unwrap_or(6);
    let mut redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write_tables(dir.path(), &redis.url());
    let runtime = support::runtime();
    runtime.block_on(redis_comparison(&config, &redis.url(), redis.pid(), seconds));
    runtime.block_on(pipeline_cost(&config, requests, rounds));
    runtime.block_on(store_down(&mut redis, dir.path(), seconds, requests));
}
