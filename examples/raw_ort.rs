//! The raw ONNX Runtime baseline for the GPU check (`scripts/gpu-check`):
//! one model run back to back at one batch size in ONNX Runtime sessions
//! built as the server builds its own (`infer::onnx::build_session`: the
//! same library, threads and execution provider), with nothing of the
//! server around them, printing rows per second as JSON.
//!
//! ```text
//! cargo run --release --features cuda --example raw_ort -- \
//!     --model DIR/1/model.onnx --provider cuda --batch 32 --seconds 10
//! ```
//!
//! Inputs are float32 values of the model's input shapes, the batch
//! dimension set to `--batch`; `--sessions` runs that many sessions at
//! once, one thread each, as the server's sessions do.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ort::session::builder::GraphOptimizationLevel;
use ort::value::{Tensor, ValueType};
use sluice::config::onnx::{ExecutionProvider, OnnxOptions};
use sluice::infer::onnx::{build_session, library};

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model = PathBuf::from(flag(&args, "--model").ok_or("--model FILE is required")?);
    let provider = match flag(&args, "--provider").as_deref().unwrap_or("cpu") {
        "cpu" => ExecutionProvider::Cpu,
        "cuda" => ExecutionProvider::Cuda,
        other => return Err(format!("--provider {other}: expected cpu or cuda").into()),
    };
    let batch: i64 = flag(&args, "--batch").unwrap_or_else(|| "1".into()).parse()?;
    let seconds: u64 = flag(&args, "--seconds").unwrap_or_else(|| "10".into()).parse()?;
    let sessions: usize = flag(&args, "--sessions").unwrap_or_else(|| "2".into()).parse()?;
    let options = OnnxOptions { sessions, intra_op_threads: 1, execution_provider: provider, ..OnnxOptions::default() };
    let environment = library::environment(None).map_err(|e| e.to_string())?;
    let rows: u64 = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..sessions)
            .map(|_| {
                scope.spawn(|| -> Result<u64, String> {
                    let mut session = build_session(environment, &model, &options, GraphOptimizationLevel::Level3)
                        .map_err(|e| e.to_string())?;
                    let mut inputs = Vec::new();
                    for outlet in session.inputs() {
                        let ValueType::Tensor { shape, .. } = outlet.dtype() else {
                            return Err(format!("input '{}' is not a tensor", outlet.name()));
                        };
                        let shape: Vec<i64> =
                            shape.iter().enumerate().map(|(i, &d)| if i == 0 || d < 0 { batch } else { d }).collect();
                        let n = shape.iter().product::<i64>() as usize;
                        let values: Vec<f32> = (0..n).map(|i| (i % 13) as f32 / 13.0).collect();
                        let tensor = Tensor::from_array((shape, values)).map_err(|e| e.to_string())?;
                        inputs.push((outlet.name().to_string(), tensor.into_dyn()));
                    }
                    let mut run = || {
                        session.run(inputs.iter().map(|(n, t)| (n.as_str(), t.view())).collect::<Vec<_>>()).map(drop)
                    };
                    run().map_err(|e| e.to_string())?;
                    let until = Instant::now() + Duration::from_secs(seconds);
                    let mut runs = 0u64;
                    while Instant::now() < until {
                        run().map_err(|e| e.to_string())?;
                        runs += 1;
                    }
                    Ok(runs)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().map_err(|_| "a worker panicked".to_string())?).sum::<Result<u64, String>>()
    })?;
    let rows = rows as f64 * batch as f64 / seconds as f64;
    println!(
        "{{\"model\": {:?}, \"provider\": {:?}, \"batch\": {batch}, \"sessions\": {sessions}, \"rows_per_second\": {rows:.1}}}",
        model.display().to_string(),
        format!("{provider:?}").to_lowercase()
    );
    Ok(())
}
