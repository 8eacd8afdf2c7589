//! Warmup: the requests a new version runs before it takes traffic, so
//! the first client does not pay for ONNX Runtime's lazy initialisation
//! (memory arenas, kernel choices per shape).
//!
//! A version with TF Serving's warmup file next to it
//! (`VERSION/assets.extra/tf_serving_warmup_requests`: a TFRecord file of
//! `PredictionLog` records) runs those requests, so an existing TF Serving
//! warmup file works unchanged. Otherwise the requests are made up from the
//! signature: zeros at each batch size the model will run. A request that
//! does not fit the model, or fails, fails the version.

use std::path::Path;

use prost::Message;

use super::{tfrecord, ModelVersion};
use crate::error::{Error, Result};
use crate::infer::Batch;
use crate::proto::tensorflow::serving::{prediction_log, PredictRequest, PredictResponse, PredictionLog};
use crate::tensor::spec::{check_tensor, Signature};
use crate::tensor::{proto, Tensor};

/// Where TF Serving keeps a version's warmup requests, under its directory.
pub const WARMUP_FILE: &str = "assets.extra/tf_serving_warmup_requests";

/// TF Serving's own bound on warmup records.
pub const MAX_RECORDS: usize = 1000;

/// The largest warmup file read, so a stray huge file is refused rather
/// than read into memory.
const MAX_FILE_BYTES: u64 = 256 << 20;

/// The requests to warm `version` up with: its warmup file's when its
/// directory (none for a version served by upstreams) has one, else zeros
/// at each of `batch_sizes`. Answers where they came from too, for the log.
pub fn requests(
    version: &ModelVersion,
    version_dir: Option<&Path>,
    batch_sizes: &[usize],
    max_tensor_bytes: usize,
) -> Result<(Vec<Vec<Tensor>>, String)> {
    let file = version_dir.map(|dir| dir.join(WARMUP_FILE)).filter(|file| file.is_file());
    if let Some(file) = file {
        let requests = from_file(&file, version.signature(), max_tensor_bytes)
            .map_err(|e| e.context(format_args!("warmup file {}", file.display())))?;
        return Ok((requests, file.display().to_string()));
    }
    // Empty strings are no meaningful input to a graph that parses them
    // (a SavedModel's tf.Example input fails on a required feature), so
    // a SavedModel that takes strings warms up only from its file, as TF
    // Serving does.
    let takes_strings = version.signature().inputs.iter().any(|spec| spec.dtype == crate::tensor::DType::String);
    if takes_strings && version.backend().signature_defs().is_some() {
        return Ok((Vec::new(), "nothing (string inputs and no warmup file)".to_string()));
    }
    Ok((synthesised(version.signature(), batch_sizes)?, format!("zeros at batch sizes {batch_sizes:?}")))
}

/// How often each warmup request runs when it seeds the latency curve:
/// the first run of a shape pays for ONNX Runtime's lazy set-up, the
/// second shows what serving costs.
const RUNS_TO_LEARN: usize = 2;

/// Runs each request through `version`; the first failure fails it. With
/// `learn` (the auto batcher plans with the curve), each batched request
/// runs twice and the faster time seeds the version's latency curve.
pub async fn run(version: &ModelVersion, requests: Vec<Vec<Tensor>>, learn: bool) -> Result<()> {
    let learn = learn && version.signature().is_batched();
    let runs = if learn { RUNS_TO_LEARN } else { 1 };
    for (i, inputs) in requests.into_iter().enumerate() {
        let rows = inputs.first().map_or(1, Tensor::rows);
        for _ in 0..runs {
            let started = std::time::Instant::now();
            version
                .backend()
                .run(Batch::single(inputs.clone()))
                .await
                .map_err(|e| e.context(format_args!("warmup request {i} failed")))?;
            if learn {
                version.latency().seed(rows, started.elapsed().as_secs_f64());
            }
        }
    }
    Ok(())
}

/// Zeros shaped as `signature` takes them: dimension 0 at each batch size
/// when the model batches, other free dimensions 1.
pub fn synthesised(signature: &Signature, batch_sizes: &[usize]) -> Result<Vec<Vec<Tensor>>> {
    let sizes: Vec<i64> = if signature.is_batched() {
        batch_sizes.iter().map(|&b| i64::try_from(b).unwrap_or(i64::MAX)).collect()
    } else {
        vec![1]
    };
    sizes
        .iter()
        .map(|&rows| {
            signature
                .inputs
                .iter()
                .map(|spec| {
                    let shape = spec
                        .shape
                        .iter()
                        .enumerate()
                        .map(|(axis, &d)| match (axis, d) {
                            (_, d) if d >= 0 => d,
                            (0, _) => rows,
                            _ => 1,
                        })
                        .collect();
                    Tensor::zeros(spec.dtype, shape)
                })
                .collect()
        })
        .collect()
}

/// The Predict requests of a TF Serving warmup file, each checked against
/// `signature` and put in its input order.
pub fn from_file(path: &Path, signature: &Signature, max_tensor_bytes: usize) -> Result<Vec<Vec<Tensor>>> {
    let bytes = tfrecord::read_bounded(path, MAX_FILE_BYTES)?;
    let requests = predict_requests(&bytes)?;
    if requests.len() > MAX_RECORDS {
        return Err(Error::invalid_argument(format!(
            "it holds {} records; at most {MAX_RECORDS} are allowed (TF Serving's limit)",
            requests.len()
        )));
    }
    requests
        .into_iter()
        .enumerate()
        .map(|(i, request)| {
            fit(request, signature, max_tensor_bytes).map_err(|e| e.context(format_args!("record {i}")))
        })
        .collect()
}

/// The inputs of `request` checked against `signature`, in its input order.
pub fn fit(request: PredictRequest, signature: &Signature, max_tensor_bytes: usize) -> Result<Vec<Tensor>> {
    let owner = "the model";
    signature.check_input_names(&owner, request.inputs.keys().map(String::as_str))?;
    let mut inputs = request.inputs;
    let mut ordered = Vec::with_capacity(signature.inputs.len());
    for spec in &signature.inputs {
        let given = inputs.remove(&spec.name).ok_or_else(|| Error::internal("an input vanished, this is a bug"))?;
        let tensor = proto::decode(&spec.name, given, max_tensor_bytes)?;
        check_tensor(&owner, "input", spec, &tensor)?;
        ordered.push(tensor);
    }
    signature.check_rows(&owner, &ordered)?;
    Ok(ordered)
}

/// The Predict requests of a TFRecord file of `PredictionLog` records (a
/// warmup file, a request log); a record that is not one is named.
pub fn predict_requests(bytes: &[u8]) -> Result<Vec<PredictRequest>> {
    tfrecord::records(bytes)?
        .into_iter()
        .enumerate()
        .map(|(i, record)| predict_log(record).map(|log| log.0).map_err(|e| e.context(format_args!("record {i}"))))
        .collect()
}

/// The request and response of one `PredictionLog` record.
pub fn predict_log(record: &[u8]) -> Result<(PredictRequest, Option<PredictResponse>)> {
    let log =
        PredictionLog::decode(record).map_err(|e| Error::invalid_argument(format!("not a PredictionLog: {e}")))?;
    match log.log_type {
        Some(prediction_log::LogType::PredictLog(log)) => Ok((log.request.unwrap_or_default(), log.response)),
        other => {
            let kind = match other {
                Some(prediction_log::LogType::ClassifyLog(_)) => "classify_log",
                Some(prediction_log::LogType::RegressLog(_)) => "regress_log",
                Some(prediction_log::LogType::PredictStreamedLog(_)) => "predict_streamed_log",
                Some(prediction_log::LogType::MultiInferenceLog(_)) => "multi_inference_log",
                Some(prediction_log::LogType::SessionRunLog(_)) => "session_run_log",
                _ => "empty",
            };
            Err(Error::invalid_argument(format!("it is a {kind} record; sluice reads predict_log records")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::spec::TensorSpec;
    use crate::tensor::DType;

    fn spec(name: &str, shape: Vec<i64>) -> TensorSpec {
        TensorSpec::new(name, DType::F32, shape)
    }

    #[test]
    fn synthesised_requests_cover_each_batch_size() {
        let signature = Signature { inputs: vec![spec("x", vec![-1, 4])], outputs: vec![spec("y", vec![-1, 2])] };
        let requests = synthesised(&signature, &[1, 8, 32]).unwrap();
        let shapes: Vec<&[i64]> = requests.iter().map(|r| r[0].shape()).collect();
        assert_eq!(shapes, vec![&[1, 4][..], &[8, 4][..], &[32, 4][..]]);
    }
}
