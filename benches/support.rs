//! What the benchmarks share: their flags (`cargo bench --bench X -- --name
//! value`), the sluice binary started on free ports with a config, a pool
//! of requests shaped from a model's metadata, and a load run printed as it
//! ends. A bench that uses it also declares `mod process`
//! (`tests/common/process.rs`).

#![allow(dead_code)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use sluice::cli::bench::inputs::{input_specs, random_pool, RequestPool};
use sluice::cli::bench::load::{self, LoadPlan};
use sluice::cli::bench::stats::Summary;
use sluice::proto::tensorflow::serving::ModelSpec;

use super::process::ServerProcess;

/// The value after `name` on the command line, parsed; `None` when absent
/// or not a `T`.
pub fn arg<T: std::str::FromStr>(name: &str) -> Option<T> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok())
}

/// `sluice serve` of this build, on free ports, logging warnings only,
/// with `extra` flags and `config`; returns once it serves gRPC.
pub fn sluice(config: &Path, extra: &[&str]) -> ServerProcess {
    sluice_binary(Path::new(env!("CARGO_BIN_EXE_sluice")), config, extra)
}

/// The same with the `sluice` binary at `binary` (another build, for a
/// before-and-after in one run).
pub fn sluice_binary(binary: &Path, config: &Path, extra: &[&str]) -> ServerProcess {
    let mut command = Command::new(binary);
    command
        .args(["serve", "--host", "127.0.0.1", "--port", "0", "--rest_api_port", "0", "--log_level", "warn"])
        .args(extra)
        .arg("--model_config_file")
        .arg(config);
    ServerProcess::spawn(command, "sluice", "sluice: serving gRPC on ", Duration::from_secs(120), true).expect("sluice")
}

/// 16 requests of one row each for `model`, shaped from its metadata.
pub fn pool(runtime: &tokio::runtime::Runtime, target: &str, model: &str) -> RequestPool {
    runtime.block_on(async {
        let spec = ModelSpec { name: model.into(), ..Default::default() };
        let specs = input_specs(target, &spec, None).await.expect("metadata");
        random_pool(&specs, &spec, 1, &Default::default(), 16, 7).expect("pool")
    })
}

/// Runs `plan` with `pool` and prints its summary under `label`.
pub fn run(runtime: &tokio::runtime::Runtime, plan: &LoadPlan, pool: &RequestPool, label: &str) -> Summary {
    let summary = runtime.block_on(load::run(plan, pool.requests.clone(), pool.rows)).expect("load");
    eprintln!("{label}\n  {}", summary.text().replace('\n', "\n  "));
    summary
}

/// A KServe v2 ModelInfer request for the example MLP: `x` (FP32, rows of
/// 64) in `raw_input_contents`, as Triton and KServe clients send it.
pub fn mlp_model_infer(x: &[f32]) -> sluice::proto::inference::ModelInferRequest {
    use sluice::proto::inference::model_infer_request::InferInputTensor;
    sluice::proto::inference::ModelInferRequest {
        model_name: "mlp".into(),
        inputs: vec![InferInputTensor {
            name: "x".into(),
            datatype: "FP32".into(),
            shape: vec![(x.len() / 64) as i64, 64],
            ..Default::default()
        }],
        raw_input_contents: vec![bytes::Bytes::copy_from_slice(bytemuck::cast_slice(x))],
        ..Default::default()
    }
}

/// CPU seconds (user + system) process `pid` (this one when `None`) has used.
pub fn cpu_seconds(pid: Option<u32>) -> f64 {
    let path = pid.map_or_else(|| "/proc/self/stat".to_string(), |p| format!("/proc/{p}/stat"));
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    // Fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // USER_HZ is 100 on every Linux this runs on.
    (ticks(11) + ticks(12)) / 100.0
}

/// ONNX Runtime in process: `threads` threads, each with its own session,
/// running `batch` rows back to back for `duration`. Rows per second.
pub fn raw_rows_per_second(
    model: &Path,
    input: &str,
    row_shape: &[usize],
    batch: usize,
    threads: usize,
    duration: Duration,
) -> f64 {
    let environment = sluice::infer::onnx::library::environment(None).expect("ONNX Runtime (run scripts/setup)");
    let total: usize = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    let mut session = ort::session::Session::builder(environment)
                        .expect("builder")
                        .with_intra_threads(1)
                        .expect("threads")
                        .commit_from_file(model)
                        .expect("session");
                    let mut shape = vec![batch];
                    shape.extend_from_slice(row_shape);
                    let n: usize = shape.iter().product();
                    let values: Vec<f32> = (0..n).map(|i| ((i * 7 + t) % 13) as f32 / 13.0).collect();
                    let tensor = ort::value::Tensor::from_array((shape, values)).expect("input");
                    for _ in 0..3 {
                        session.run(ort::inputs![input => &tensor]).expect("run");
                    }
                    let start = Instant::now();
                    let mut rows = 0;
                    while start.elapsed() < duration {
                        session.run(ort::inputs![input => &tensor]).expect("run");
                        rows += batch;
                    }
                    rows
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("raw worker")).sum()
    });
    total as f64 / duration.as_secs_f64()
}
