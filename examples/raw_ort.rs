//! The raw ONNX Runtime baseline for the GPU check (`scripts/gpu-check`):
//! one model run back to back at one batch size through sluice's own ONNX
//! Runtime backend (the same library and execution provider the server
//! uses, no server around it), printing rows per second as JSON.
//!
//! ```text
//! cargo run --release --features cuda --example raw_ort -- \
//!     --model DIR/1/model.onnx --provider cuda --batch 32 --seconds 10
//! ```
//!
//! Inputs are zeros of the model's input shapes, the batch dimension set to
//! `--batch`; `--sessions` runs that many batches at once (one thread
//! each), as the server's sessions do.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use sluice::config::onnx::{ExecutionProvider, OnnxOptions};
use sluice::infer::onnx::OnnxBackend;
use sluice::infer::{Backend, Batch};
use sluice::tensor::Tensor;

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
    let metrics = sluice::metrics::Metrics::new().model("raw", 1);
    let backend =
        OnnxBackend::load(&model, "raw", &options, None, metrics, None, Duration::ZERO).map_err(|e| e.to_string())?;
    let inputs: Vec<Tensor> = backend
        .signature()
        .inputs
        .iter()
        .map(|spec| {
            let shape = spec.shape.iter().enumerate().map(|(i, &d)| if i == 0 || d < 0 { batch } else { d }).collect();
            Tensor::zeros(spec.dtype, shape)
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let rows = runtime.block_on(async {
        // A warm-up run per session, then each session keeps one batch in
        // flight until the time is up.
        for _ in 0..sessions {
            backend.run(Batch::single(inputs.clone())).await.map_err(|e| e.to_string())?;
        }
        let until = Instant::now() + Duration::from_secs(seconds);
        let started = Instant::now();
        let loops = (0..sessions).map(|_| async {
            let mut runs = 0u64;
            while Instant::now() < until {
                backend.run(Batch::single(inputs.clone())).await.map_err(|e| e.to_string())?;
                runs += 1;
            }
            Ok::<u64, String>(runs)
        });
        let mut total = 0u64;
        for runs in futures::future::join_all(loops).await {
            total += runs?;
        }
        Ok::<f64, String>(total as f64 * batch as f64 / started.elapsed().as_secs_f64())
    })?;
    println!(
        "{{\"model\": {:?}, \"provider\": {:?}, \"batch\": {batch}, \"sessions\": {sessions}, \"rows_per_second\": {rows:.1}}}",
        model.display().to_string(),
        format!("{provider:?}").to_lowercase()
    );
    Ok(())
}
