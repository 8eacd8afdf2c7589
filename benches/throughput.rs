//! Throughput, batching, pipelining and overload, measured side by side in
//! one run on this machine; every figure is a ratio against a baseline
//! measured in the same run.
//!
//! - raw: ONNX Runtime in process, one session per thread, batch 32, as many
//!   threads as the server's sessions.
//! - sluice: the release binary, loaded over loopback by `sluice bench`'s
//!   load generator (the same encoded requests for every target).
//! - floor: `floor-server`, a bare tonic server answering a fixed response.
//!
//! ```text
//! cargo bench --bench throughput [-- --duration 8 --only cnn,mlp,rest,pipeline,latency,overload]
//! ```

mod support;

use support::fixtures::{pipeline_table, root};
use support::{arg, guarded_cnn, raw_rows_per_second, served_model, CNN_AUTO, MLP_AUTO, SERVER_TABLE, SESSIONS};

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use sluice::cli::bench::inputs::{input_specs, random_pool, rest_bodies, RequestPool};
use sluice::cli::bench::load::{self, LoadPlan};
use sluice::cli::bench::stats::Summary;
use sluice::proto::tensorflow::serving::ModelSpec;
use support::process::ServerProcess;

fn config() -> String {
    let pixels = "image_normalize = { input = \"pixels\", mean = [0.5, 0.5, 0.5], std = [0.25, 0.25, 0.25] }";
    let plugin = "preprocess = { plugin = \"image_normalize\"";
    [
        SERVER_TABLE.to_string(),
        format!("[plugins]\ndir = \"{}\"\n", root().join("target/plugins").display()),
        served_model("cnn", "cnn", ""),
        served_model("cnn_batched", "cnn", CNN_BATCHED),
        served_model("cnn_auto", "cnn", CNN_AUTO),
        guarded_cnn(),
        served_model("mlp", "mlp", ""),
        served_model("mlp_batched", "mlp", "batching = { max_batch_size = 64, batch_timeout_micros = 500 }"),
        served_model("mlp_auto", "mlp", MLP_AUTO),
        // The same preprocessing built in and as a plugin, each with its
        // stage on two workers of its own (pipelined) and in the request's
        // task (sequential).
        pipeline_table(
            "cnn_pixels_pipelined",
            "cnn_batched",
            &format!("mode = \"pipelined\"\n[pipelines.preprocess]\nworkers = 2\n{pixels}"),
        ),
        pipeline_table(
            "cnn_plugin_pipelined",
            "cnn_batched",
            &format!("mode = \"pipelined\"\n{plugin}, workers = 2 }}"),
        ),
        pipeline_table("cnn_plugin_sequential", "cnn_batched", &format!("mode = \"sequential\"\n{plugin} }}")),
        pipeline_table(
            "cnn_pixels_sequential",
            "cnn_batched",
            &format!("mode = \"sequential\"\n[pipelines.preprocess]\n{pixels}"),
        ),
    ]
    .concat()
}

/// Fixed-window batching of the CNN.
const CNN_BATCHED: &str = "batching = { max_batch_size = 32, batch_timeout_micros = 2000, max_enqueued_batches = 64 }";

struct Bench {
    runtime: tokio::runtime::Runtime,
    duration: Duration,
    rows: Vec<String>,
}

impl Bench {
    fn pool(&self, target: &str, model: &str, shapes: &[(&str, Vec<i64>)], batch: i64) -> RequestPool {
        self.runtime.block_on(async {
            let spec = ModelSpec { name: model.to_string(), ..Default::default() };
            let specs = input_specs(target, &spec, None).await.expect("metadata");
            let shapes: HashMap<String, Vec<i64>> = shapes.iter().map(|(n, s)| (n.to_string(), s.clone())).collect();
            random_pool(&specs, &spec, batch, &shapes, 16, 7).expect("pool")
        })
    }

    fn load(&self, target: &str, pool: &RequestPool, concurrency: usize, rps: Option<f64>) -> Summary {
        self.load_with(target, None, pool, concurrency, rps)
    }

    /// The same pool as REST bodies posted to `path` on the HTTP port.
    fn load_rest(&self, http: &str, path: &str, pool: &RequestPool, concurrency: usize) -> Summary {
        let bodies = RequestPool { requests: rest_bodies(&pool.requests).expect("REST bodies"), rows: pool.rows };
        self.load_with(http, Some(path.to_string()), &bodies, concurrency, None)
    }

    fn load_with(
        &self,
        target: &str,
        rest_path: Option<String>,
        pool: &RequestPool,
        concurrency: usize,
        rps: Option<f64>,
    ) -> Summary {
        let plan = LoadPlan { rps, rest_path, ..LoadPlan::closed(target, concurrency, self.duration) };
        let summary = self.runtime.block_on(load::run(&plan, pool.requests.clone(), pool.rows)).expect("load");
        eprintln!("  {}", summary.text().replace('\n', "\n  "));
        summary
    }

    /// Pipelines `PREFIX_pipelined` and `PREFIX_sequential` under the same
    /// 64 streams of requests shaped `shapes`, as one row.
    fn pipelined_against_sequential(&mut self, target: &str, prefix: &str, shapes: &[(&str, Vec<i64>)], what: &str) {
        let [pipelined, sequential] = ["pipelined", "sequential"].map(|mode| {
            eprintln!("{what}, {mode}, 64 streams");
            self.load(target, &self.pool(target, &format!("{prefix}_{mode}"), shapes, 1), 64, None)
        });
        self.row(
            &format!("{what}, pipelined"),
            format!("{:.0} req/s", pipelined.requests_per_second),
            format!("sequential: {:.0} req/s", sequential.requests_per_second),
            pipelined.requests_per_second / sequential.requests_per_second,
            "≥ 1.3×",
        );
    }

    fn row(&mut self, what: &str, measured: String, against: String, ratio: f64, target: &str) {
        eprintln!("=> {what}: {measured} vs {against}: {ratio:.2}× (target {target})");
        self.rows.push(format!("| {what} | {measured} | {against} | {ratio:.2}× | {target} |"));
    }
}

fn main() {
    let duration = Duration::from_secs(arg("--duration").unwrap_or(8));
    let only: String = arg("--only").unwrap_or_else(|| "cnn,mlp,rest,pipeline,plugin,latency,overload".to_string());
    let root = support::fixtures::root();
    let dir = tempfile::tempdir().expect("temp dir");
    let config_path = dir.path().join("bench.toml");
    std::fs::write(&config_path, config()).expect("write config");
    let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
    command
        .args(["serve", "--host", "127.0.0.1", "--port", "0", "--rest_api_port", "0", "--log_level", "warn"])
        .arg("--model_config_file")
        .arg(&config_path);
    let ready = Duration::from_secs(120);
    let server = ServerProcess::spawn(command, "sluice", "sluice: serving gRPC on ", ready, true).expect("sluice");
    let target = server.url();
    let mut bench = Bench { runtime: support::runtime(), duration, rows: Vec::new() };
    let cnn_file = root.join("examples/models/cnn/1/model.onnx");
    let image = [3usize, 32, 32];
    let mut cnn_batched_rows = None;

    if only.contains("cnn") {
        eprintln!("raw ONNX Runtime, CNN batch 32, {SESSIONS} threads");
        let raw = raw_rows_per_second(&cnn_file, "image", &image, 32, SESSIONS, duration);
        eprintln!("  {raw:.1} rows/s");
        eprintln!("sluice CNN, batch-1 requests, 64 streams, dynamic batching to 32");
        let ones = bench.pool(&target, "cnn_batched", &[], 1);
        let batched = bench.load(&target, &ones, 64, None);
        eprintln!("sluice CNN, batch-1 requests, 64 streams, auto batching (at most 32)");
        let auto = bench.load(&target, &bench.pool(&target, "cnn_auto", &[], 1), 64, None);
        eprintln!("sluice CNN, batch-1 requests, 64 streams, no batching");
        let unbatched = bench.load(&target, &bench.pool(&target, "cnn", &[], 1), 64, None);
        eprintln!("sluice CNN, batch-32 requests, 4 streams, no batching");
        let thirty_two = bench.load(&target, &bench.pool(&target, "cnn", &[], 32), 4, None);
        let rows = |s: &Summary| format!("{:.0} rows/s", s.rows_per_second);
        bench.row(
            "CNN batch-1 × 64 streams, batched to 32",
            rows(&batched),
            format!("raw ORT batch 32: {raw:.0} rows/s"),
            batched.rows_per_second / raw,
            "≥ 0.7×",
        );
        bench.row(
            "CNN batch-1 × 64 streams, auto batching",
            rows(&auto),
            format!("raw ORT batch 32: {raw:.0} rows/s"),
            auto.rows_per_second / raw,
            "≥ 0.6×",
        );
        bench.row(
            "CNN batch-1 × 64 streams, batched to 32",
            rows(&batched),
            format!("sluice without batching: {}", rows(&unbatched)),
            batched.rows_per_second / unbatched.rows_per_second,
            "the gain",
        );
        bench.row(
            "CNN batch-32 requests × 4 streams",
            rows(&thirty_two),
            format!("raw ORT batch 32: {raw:.0} rows/s"),
            thirty_two.rows_per_second / raw,
            "≥ 0.9×",
        );
        cnn_batched_rows = Some(batched.rows_per_second);
    }

    if only.contains("mlp") {
        let mut floor_command = Command::new(env!("CARGO_BIN_EXE_floor-server"));
        floor_command.args(["--rows", "1", "--cols", "10"]);
        let floor =
            ServerProcess::spawn(floor_command, "floor", "floor-server: serving gRPC on ", ready, true).expect("floor");
        let mut echo_command = Command::new(env!("CARGO_BIN_EXE_floor-server"));
        echo_command.args(["--rows", "1", "--cols", "10", "--raw"]);
        let echo =
            ServerProcess::spawn(echo_command, "echo", "floor-server: serving gRPC on ", ready, true).expect("echo");
        let pool = bench.pool(&target, "mlp", &[], 1);
        eprintln!("floor server, MLP-shaped batch-1 requests, 64 streams");
        let floor_summary = bench.load(&floor.url(), &pool, 64, None);
        eprintln!("echo floor (fixed bytes, nothing decoded or encoded), 64 streams");
        let echo_summary = bench.load(&echo.url(), &pool, 64, None);
        eprintln!("sluice MLP, batch-1 requests, 64 streams, no batching");
        let mlp = bench.load(&target, &pool, 64, None);
        eprintln!("sluice MLP, batch-1 requests, 64 streams, dynamic batching to 64");
        let mlp_batched = bench.load(&target, &bench.pool(&target, "mlp_batched", &[], 1), 64, None);
        eprintln!("sluice MLP, batch-1 requests, 64 streams, auto batching (at most 64)");
        let mlp_auto = bench.load(&target, &bench.pool(&target, "mlp_auto", &[], 1), 64, None);
        let rps = |s: &Summary| format!("{:.0} req/s", s.requests_per_second);
        let floor_text = format!("floor: {}", rps(&floor_summary));
        bench.row(
            "MLP batch-1 × 64 streams, no batching",
            rps(&mlp),
            floor_text.clone(),
            mlp.requests_per_second / floor_summary.requests_per_second,
            "≥ 0.7×",
        );
        bench.row(
            "MLP batch-1 × 64 streams, batched to 64",
            rps(&mlp_batched),
            floor_text.clone(),
            mlp_batched.requests_per_second / floor_summary.requests_per_second,
            "≥ 0.7×",
        );
        let echo_text = format!("echo floor: {}", rps(&echo_summary));
        for (what, summary) in [("no batching", &mlp), ("batched to 64", &mlp_batched), ("auto batching", &mlp_auto)] {
            bench.row(
                &format!("MLP batch-1 × 64 streams, {what}"),
                rps(summary),
                echo_text.clone(),
                summary.requests_per_second / echo_summary.requests_per_second,
                "≥ 0.85×",
            );
        }
        bench.row(
            "floor (tonic, decodes and encodes) × 64 streams",
            rps(&floor_summary),
            echo_text,
            floor_summary.requests_per_second / echo_summary.requests_per_second,
            "report",
        );
    }

    if only.contains("rest") {
        let http = server.stdout_after("sluice: serving HTTP on ").expect("the HTTP address");
        let rps = |s: &Summary| format!("{:.0} req/s", s.requests_per_second);
        for batch in [1i64, 32] {
            let pool = bench.pool(&target, "mlp", &[], batch);
            eprintln!("sluice MLP, batch-{batch} requests, 16 streams, gRPC");
            let grpc = bench.load(&target, &pool, 16, None);
            eprintln!("sluice MLP, batch-{batch} requests, 16 streams, REST (row form)");
            let rest = bench.load_rest(&http, "/v1/models/mlp:predict", &pool, 16);
            assert_eq!(rest.ok, rest.requests, "every REST request is answered");
            bench.row(
                &format!("MLP batch-{batch} × 16 streams, REST (instances)"),
                rps(&rest),
                format!("gRPC: {}", rps(&grpc)),
                rest.requests_per_second / grpc.requests_per_second,
                "report",
            );
        }
    }

    if only.contains("pipeline") {
        let shapes = [("pixels", vec![1i64, 224, 224, 3])];
        eprintln!("pipelined: 224×224 u8 images → image_normalize (resize + normalise) → CNN, 64 streams");
        bench.pipelined_against_sequential(&target, "cnn_pixels", &shapes, "224×224 images → preprocess → CNN");
    }

    if only.contains("plugin") {
        eprintln!("model alone: CNN batched, f32 batch-1 requests, 64 streams");
        let alone = bench.load(&target, &bench.pool(&target, "cnn_batched", &[], 1), 64, None);
        let small = [("pixels", vec![1i64, 32, 32, 3])];
        eprintln!("32×32 u8 images → image-normalize plugin → CNN, pipelined, 64 streams");
        let with_plugin = bench.load(&target, &bench.pool(&target, "cnn_plugin_pipelined", &small, 1), 64, None);
        bench.row(
            "32×32 images → image-normalize plugin → CNN (batched)",
            format!("{:.0} req/s", with_plugin.requests_per_second),
            format!("the model alone: {:.0} req/s", alone.requests_per_second),
            with_plugin.requests_per_second / alone.requests_per_second,
            "the plugin's cost",
        );
        let big = [("pixels", vec![1i64, 224, 224, 3])];
        eprintln!("224×224 images → image-normalize plugin → CNN, pipelined vs sequential");
        bench.pipelined_against_sequential(
            &target,
            "cnn_plugin",
            &big,
            "224×224 images → image-normalize plugin → CNN",
        );
    }

    if only.contains("latency") {
        let capacity = match cnn_batched_rows {
            Some(rows) => rows,
            None => {
                eprintln!("capacity: sluice CNN, batch-1 requests, 64 streams, batched");
                bench.load(&target, &bench.pool(&target, "cnn_batched", &[], 1), 64, None).requests_per_second
            }
        };
        let rate = 0.8 * capacity;
        eprintln!("open loop at 80% of capacity: {rate:.0} req/s");
        let at80 = bench.load(&target, &bench.pool(&target, "cnn_batched", &[], 1), 1024, Some(rate));
        bench.row(
            &format!("CNN batched, open loop at 80% of capacity ({rate:.0} req/s)"),
            format!("p99 {:.2} ms", at80.p99_ms),
            format!("p50 {:.2} ms", at80.p50_ms),
            at80.p99_ms / at80.p50_ms,
            "≤ 3×",
        );
    }

    if only.contains("overload") {
        // 8-row requests, one session, at most 4 in flight: capacity is a
        // few hundred requests per second.
        let pool = bench.pool(&target, "cnn_guarded", &[], 8);
        eprintln!("capacity: CNN 8-row requests, 4 streams (= max_in_flight), one session");
        let at_capacity = bench.load(&target, &pool, 4, None);
        let rate = 2.0 * at_capacity.requests_per_second;
        let rss_before = server.rss_bytes().unwrap_or(0);
        eprintln!("open loop at 2× capacity: {rate:.0} req/s");
        let first = bench.load(&target, &pool, 4096, Some(rate));
        let rss_middle = server.rss_bytes().unwrap_or(0);
        let second = bench.load(&target, &pool, 4096, Some(rate));
        let rss_after = server.rss_bytes().unwrap_or(0);
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        bench.row(
            &format!("CNN at 2× capacity ({rate:.0} req/s): refusals"),
            format!("p99 {:.2} ms to refuse ({:.0}% refused)", second.error_p99_ms, second.error_rate * 100.0),
            "5 ms".to_string(),
            second.error_p99_ms / 5.0,
            "< 1× (p99 < 5 ms)",
        );
        bench.row(
            &format!("CNN at 2× capacity ({rate:.0} req/s): accepted"),
            format!("p99 {:.2} ms", second.p99_ms),
            format!("p99 at capacity, closed loop: {:.2} ms", at_capacity.p99_ms),
            second.p99_ms / at_capacity.p99_ms,
            "bounded",
        );
        bench.row(
            "CNN at 2× capacity: server memory",
            format!("RSS {:.1} MiB after two runs", mib(rss_after)),
            format!("after one: {:.1} MiB (before: {:.1} MiB)", mib(rss_middle), mib(rss_before)),
            rss_after as f64 / rss_middle.max(1) as f64,
            "flat (≈ 1×)",
        );
        drop(first);
    }

    println!("\n| scenario | measured | compared with | ratio | target |");
    println!("|---|---|---|---|---|");
    for row in &bench.rows {
        println!("{row}");
    }
}
