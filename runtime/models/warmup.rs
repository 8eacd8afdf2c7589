//! Warmup: the requests a new version runs before it takes traffic, so
//! the first client does not pay for ONNX Runtime's lazy initialisation
//! (memory arenas, kernel choices per shape).
//!
//! A version with TF Serving's warmup file next to it
//! (`VERSION/assets.extra/tf_serving_warmup_requests`: a TFRecord file of
//! `PredictionLog` records) runs those requests, so an existing TF Serving
//! warmup file works unchanged: Predict records on the signature they
//! name, Classify, Regress and MultiInference records through the model's
//! `examples` table or, on a SavedModel without one, through its own
//! classification and regression signatures, as those calls run.
//! Otherwise the requests are made up from the signature: zeros at each
//! batch size the model will run. A request that does not fit the model,
//! or fails, fails the version.

use std::path::Path;
use std::sync::Arc;

use prost::Message;

use super::{tfrecord, ModelVersion};
use crate::config::ExamplesConfig;
use crate::error::{Error, Result};
use crate::infer::Batch;
use crate::proto::tensorflow::serving::{
    input, prediction_log, Input, ModelSpec, PredictRequest, PredictResponse, PredictionLog,
};
use crate::tensor::example::{ExampleBatch, ExampleColumns};
use crate::tensor::spec::{check_tensor, Signature, CLASSIFY_METHOD, DEFAULT_SIGNATURE, REGRESS_METHOD};
use crate::tensor::{proto, Tensor};

/// One warmup request: inputs in signature order, for the model's main
/// signature (run batched, as clients' requests are) or another one of a
/// SavedModel's by key.
#[derive(Debug)]
pub struct WarmupRequest {
    /// `None`: the main signature.
    pub signature: Option<Arc<str>>,
    /// The inputs, in the signature's order.
    pub inputs: Vec<Tensor>,
}

impl WarmupRequest {
    fn main(inputs: Vec<Tensor>) -> WarmupRequest {
        WarmupRequest { signature: None, inputs }
    }
}

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
    examples: Option<&ExamplesConfig>,
    batch_sizes: &[usize],
    max_tensor_bytes: usize,
) -> Result<(Vec<WarmupRequest>, String)> {
    let file = version_dir.map(|dir| dir.join(WARMUP_FILE)).filter(|file| file.is_file());
    if let Some(file) = file {
        let requests = from_file(&file, version, examples, max_tensor_bytes)
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
    let requests = synthesised(version.signature(), batch_sizes)?.into_iter().map(WarmupRequest::main).collect();
    Ok((requests, format!("zeros at batch sizes {batch_sizes:?}")))
}

/// How often each warmup request runs when it seeds the latency curve:
/// the first run of a shape pays for ONNX Runtime's lazy set-up, the
/// second shows what serving costs.
const RUNS_TO_LEARN: usize = 2;

/// Runs each request through `version` `iterations` times; the first
/// failure fails it. With `learn` (the auto batcher plans with the curve),
/// each batched request of the main signature runs at least twice and the
/// faster time seeds the version's latency curve.
pub async fn run(version: &ModelVersion, requests: Vec<WarmupRequest>, iterations: usize, learn: bool) -> Result<()> {
    let learn = learn && version.signature().is_batched();
    for (i, request) in requests.into_iter().enumerate() {
        let failed = |e: Error| e.context(format_args!("warmup request {i} failed"));
        let Some(key) = request.signature else {
            let rows = request.inputs.first().map_or(1, Tensor::rows);
            for _ in 0..if learn { iterations.max(RUNS_TO_LEARN) } else { iterations } {
                let started = std::time::Instant::now();
                version.backend().run(Batch::single(request.inputs.clone())).await.map_err(failed)?;
                if learn {
                    version.latency().seed(rows, started.elapsed().as_secs_f64());
                }
            }
            continue;
        };
        for _ in 0..iterations {
            version.backend().run_other(&key, request.inputs.clone()).await.map_err(failed)?;
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
            signature.inputs.iter().map(|spec| Tensor::zeros(spec.dtype, spec.shape_with_rows(rows))).collect()
        })
        .collect()
}

/// The requests of a TF Serving warmup file, each checked against the
/// signature it runs on and put in its input order; `examples` is the
/// model's table for Classify and Regress, when it has one.
pub fn from_file(
    path: &Path,
    version: &ModelVersion,
    examples: Option<&ExamplesConfig>,
    max_tensor_bytes: usize,
) -> Result<Vec<WarmupRequest>> {
    let bytes = tfrecord::read_bounded(path, MAX_FILE_BYTES)?;
    let records = tfrecord::records(&bytes)?;
    if records.len() > MAX_RECORDS {
        return Err(Error::invalid_argument(format!(
            "it holds {} records; at most {MAX_RECORDS} are allowed (TF Serving's limit)",
            records.len()
        )));
    }
    let columns = examples.map(|config| ExampleColumns::new(config, version.signature(), version)).transpose()?;
    let mut requests = Vec::with_capacity(records.len());
    for (i, record) in records.into_iter().enumerate() {
        let record_error = |e: Error| e.context(format_args!("record {i}"));
        let log = PredictionLog::decode(record)
            .map_err(|e| Error::invalid_argument(format!("not a PredictionLog: {e}")))
            .map_err(record_error)?;
        let made = match log.log_type {
            Some(prediction_log::LogType::PredictLog(log)) => {
                predict_request(log.request.unwrap_or_default(), version, max_tensor_bytes).map(|r| vec![r])
            }
            Some(prediction_log::LogType::ClassifyLog(log)) => {
                let request = log.request.unwrap_or_default();
                let tasks = [(request.model_spec, CLASSIFY_METHOD)];
                example_warmup(request.input, &tasks, version, columns.as_ref(), max_tensor_bytes)
            }
            Some(prediction_log::LogType::RegressLog(log)) => {
                let request = log.request.unwrap_or_default();
                let tasks = [(request.model_spec, REGRESS_METHOD)];
                example_warmup(request.input, &tasks, version, columns.as_ref(), max_tensor_bytes)
            }
            Some(prediction_log::LogType::MultiInferenceLog(log)) => {
                let request = log.request.unwrap_or_default();
                let tasks: Vec<(Option<ModelSpec>, &str)> =
                    request.tasks.iter().map(|task| (task.model_spec.clone(), task.method_name.as_str())).collect();
                example_warmup(request.input, &tasks, version, columns.as_ref(), max_tensor_bytes)
            }
            other => Err(Error::invalid_argument(format!(
                "it is a {} record; warmup replays predict_log, classify_log, regress_log and \
                 multi_inference_log records",
                record_kind(other.as_ref())
            ))),
        };
        requests.extend(made.map_err(record_error)?);
    }
    Ok(requests)
}

/// A Predict request (a warmup record, a logged request): the signature
/// it names (a SavedModel's other signatures too), its inputs checked
/// against it.
pub fn predict_request(
    request: PredictRequest,
    version: &ModelVersion,
    max_tensor_bytes: usize,
) -> Result<WarmupRequest> {
    let key = request.model_spec.as_ref().map_or("", |spec| spec.signature_name.as_str());
    // Predict runs any signature, whatever its method (as TF Serving's).
    let (signature_key, signature) = signature_of(version, key, None)?;
    let inputs = fit(request, signature, max_tensor_bytes)?;
    Ok(WarmupRequest { signature: signature_key, inputs })
}

/// A Classify, Regress or MultiInference record: its examples through the
/// model's `examples` table (`columns`: one run serves every task), or
/// fed to each task's own signature of a SavedModel, as the calls run.
fn example_warmup(
    input: Option<Input>,
    tasks: &[(Option<ModelSpec>, &str)],
    version: &ModelVersion,
    columns: Option<&ExampleColumns>,
    max_tensor_bytes: usize,
) -> Result<Vec<WarmupRequest>> {
    let empty = || Error::invalid_argument("input is empty: set input.example_list or input.example_list_with_context");
    let (examples, context) = match input.and_then(|input| input.kind).ok_or_else(empty)? {
        input::Kind::ExampleList(list) => (list.examples, None),
        input::Kind::ExampleListWithContext(list) => (list.examples, Some(list.context)),
    };
    let batch = ExampleBatch { examples: &examples, context: context.as_ref() };
    if tasks.is_empty() {
        return Err(Error::invalid_argument("the multi_inference_log request names no task"));
    }
    if let Some(columns) = columns {
        columns.check_count(examples.len())?;
        return Ok(vec![WarmupRequest::main(columns.parse(batch, max_tensor_bytes)?)]);
    }
    if version.backend().signature_defs().is_none() {
        return Err(Error::invalid_argument(format!(
            "it holds tf.Examples, but {version} has no examples table to turn them into its inputs; declare \
             [models.examples] in its config"
        )));
    }
    let serialized = batch.merged(max_tensor_bytes)?;
    let rows = serialized.len() as i64;
    tasks
        .iter()
        .map(|(spec, method)| {
            let key = spec.as_ref().map_or("", |spec| spec.signature_name.as_str());
            let (signature_key, signature) = signature_of(version, key, Some(method))?;
            let who = format!("signature \"{}\" of {version}", signature_key.as_deref().unwrap_or(DEFAULT_SIGNATURE));
            signature.serialized_examples_input(&who, &format!("a {method} record"))?;
            let inputs = vec![Tensor::from_strings(vec![rows], serialized.clone())?];
            Ok(WarmupRequest { signature: signature_key, inputs })
        })
        .collect()
}

/// The signature `key` names on `version` (empty: the default), which must
/// be of `method`, when given, where the model declares methods (a
/// SavedModel): `None` for the main one, else its key.
fn signature_of<'v>(
    version: &'v ModelVersion,
    key: &str,
    method: Option<&str>,
) -> Result<(Option<Arc<str>>, &'v Signature)> {
    let key = if key.is_empty() { DEFAULT_SIGNATURE } else { key };
    if let (Some(defs), Some(method)) = (version.backend().signature_defs(), method) {
        let def = defs.get(key).ok_or_else(|| {
            Error::invalid_argument(format!("No signature was found with the name: \"{key}\" on {version}"))
        })?;
        if def.method_name != method {
            return Err(Error::invalid_argument(format!(
                "signature \"{key}\" of {version} is a {} signature; the record needs a {method} one",
                def.method_name
            )));
        }
    }
    if let Some(other) = version.backend().other_signature(key) {
        return Ok((Some(Arc::from(key)), other));
    }
    if key == DEFAULT_SIGNATURE {
        return Ok((None, version.signature()));
    }
    Err(Error::invalid_argument(format!("No signature was found with the name: \"{key}\" on {version}")))
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
        other => Err(Error::invalid_argument(format!(
            "it is a {} record; sluice reads predict_log records",
            record_kind(other.as_ref())
        ))),
    }
}

/// The field name of a record's kind, for messages.
fn record_kind(log: Option<&prediction_log::LogType>) -> &'static str {
    match log {
        Some(prediction_log::LogType::PredictLog(_)) => "predict_log",
        Some(prediction_log::LogType::ClassifyLog(_)) => "classify_log",
        Some(prediction_log::LogType::RegressLog(_)) => "regress_log",
        Some(prediction_log::LogType::PredictStreamedLog(_)) => "predict_streamed_log",
        Some(prediction_log::LogType::MultiInferenceLog(_)) => "multi_inference_log",
        Some(prediction_log::LogType::SessionRunLog(_)) => "session_run_log",
        None => "empty",
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
