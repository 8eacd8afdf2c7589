//! A SavedModel against its ONNX twin (`sluice model twin`), both served
//! by sluice in one server and one run: for the example MLP's weights as a
//! SavedModel (`.cache/tf-savedmodels/mlp`, built by `scripts/setup`) and
//! a Keras CNN of the benchmark CNN's size (`benches/twin/make_cnn.py`),
//! each is twinned and published as version 2, then version 1 (TensorFlow)
//! and version 2 (ONNX Runtime) are served as two models from the same
//! base path and loaded in turn by one client (batch-1 requests, 64
//! streams): the server's CPU per request and req/s. The twin command's
//! own in-process figures (both backends, batch 1 and 32) are printed too.
//!
//! ```text
//! cargo bench --bench twin [-- --duration 6 --cost_seconds 2]
//! ```

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use support::fixtures::copy_dir;
use support::{arg, pool, sluice_binary, SERVER_TABLE, SESSIONS};

/// Streams in flight, as the TensorFlow bench loads the MLP.
const STREAMS: usize = 64;

/// `sluice model twin BASE --publish`: the report.
fn twin(base: &Path, cost_seconds: f64) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["--log_level", "warn", "model", "twin"])
        .arg(base)
        .args(["--publish", "--drop-other-signatures", "--json", "--cost-seconds", &cost_seconds.to_string()])
        .env("TF_CPP_MIN_LOG_LEVEL", "2")
        .output()
        .expect("sluice model twin");
    let report: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("no report ({e}): {}", String::from_utf8_lossy(&output.stderr)));
    assert!(output.status.success(), "the twin of {} did not verify: {report:#}", base.display());
    report
}

fn main() {
    let duration = Duration::from_secs(arg("--duration").unwrap_or(6));
    let cost_seconds: f64 = arg("--cost_seconds").unwrap_or(2.0);
    let root = support::fixtures::root();
    let dir = tempfile::tempdir().expect("temp dir");
    let cnn_source = dir.path().join("cnn-source");
    let made = Command::new(root.join(".cache/tf-venv/bin/python"))
        .arg(root.join("benches/twin/make_cnn.py"))
        .arg(&cnn_source)
        .status()
        .expect("python (scripts/setup installs .cache/tf-venv)");
    assert!(made.success(), "building the Keras CNN failed");
    let sources: [(&str, PathBuf); 2] =
        [("mlp", root.join(".cache/tf-savedmodels/mlp/2")), ("cnn", cnn_source.join("1"))];

    let mut config = SERVER_TABLE.to_string();
    let mut reports = Vec::new();
    for (name, source) in &sources {
        let base = dir.path().join(name);
        copy_dir(source, &base.join("1"));
        eprintln!("twinning {name}");
        reports.push((name, twin(&base, cost_seconds)));
        let tf = format!("version_policy = {{ specific = [1] }}\ntensorflow = {{ run_threads = {SESSIONS} }}");
        let onnx =
            format!("version_policy = {{ specific = [2] }}\nonnx = {{ sessions = {SESSIONS}, intra_op_threads = 1 }}");
        config += &support::fixtures::model_table(&format!("{name}_saved"), &base, &tf);
        config += &support::fixtures::model_table(&format!("{name}_twin"), &base, &onnx);
    }
    let config_path = dir.path().join("sluice.toml");
    std::fs::write(&config_path, config).expect("config");
    let server = sluice_binary(Path::new(env!("CARGO_BIN_EXE_sluice")), &config_path, &[]);
    let runtime = support::runtime();

    let mut served = Vec::new();
    for (name, _) in &sources {
        for side in ["saved", "twin"] {
            let model = format!("{name}_{side}");
            eprintln!("{model}: batch-1 requests, {STREAMS} streams");
            let requests = pool(&runtime, &server.url(), &model);
            served.push((model.clone(), support::closed_loop_cost(&runtime, &server, &requests, STREAMS, duration)));
        }
    }

    println!("\n| model, served by sluice (batch 1, {STREAMS} streams) | server CPU per request | req/s |");
    println!("|---|---|---|");
    for (model, (cpu, rps)) in &served {
        println!("| {model} | {cpu:.1} µs | {rps:.0} |");
    }
    for pair in served.chunks(2) {
        if let [(saved, (saved_cpu, saved_rps)), (_, (twin_cpu, twin_rps))] = pair {
            println!(
                "{}: the twin takes {:.2}x the SavedModel's server CPU per request, {:.2}x its req/s",
                saved.trim_end_matches("_saved"),
                twin_cpu / saved_cpu,
                twin_rps / saved_rps
            );
        }
    }
    println!("\nIn process (sluice model twin's own measurement, each backend alone):");
    println!("| model | batch | SavedModel CPU per request | twin CPU per request | twin / SavedModel | max abs difference |");
    println!("|---|---|---|---|---|---|");
    for (name, report) in &reports {
        let max_abs = report["outputs"][0]["max_abs"].as_f64().unwrap_or(f64::NAN);
        for row in report["cost"].as_array().into_iter().flatten() {
            println!(
                "| {name} | {} | {:.1} µs | {:.1} µs | {:.2}x | {max_abs:.1e} |",
                row["batch"],
                row["saved_model"]["cpu_us_per_request"].as_f64().unwrap_or(f64::NAN),
                row["twin"]["cpu_us_per_request"].as_f64().unwrap_or(f64::NAN),
                row["cpu_ratio"].as_f64().unwrap_or(f64::NAN)
            );
        }
    }
}
