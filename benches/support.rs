//! What the benchmarks share: their flags (`cargo bench --bench X -- --name
//! value`), the sluice binary started on free ports with a config, a pool
//! of requests shaped from a model's metadata, and a load run printed as it
//! ends. A bench that uses it also declares `mod process`
//! (`tests/common/process.rs`).

#![allow(dead_code)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

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
    let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
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
        let specs = input_specs(target, &spec).await.expect("metadata");
        random_pool(&specs, &spec, 1, &Default::default(), 16, 7).expect("pool")
    })
}

/// Runs `plan` with `pool` and prints its summary under `label`.
pub fn run(runtime: &tokio::runtime::Runtime, plan: &LoadPlan, pool: &RequestPool, label: &str) -> Summary {
    let summary = runtime.block_on(load::run(plan, pool.requests.clone(), pool.rows)).expect("load");
    eprintln!("{label}\n  {}", summary.text().replace('\n', "\n  "));
    summary
}
