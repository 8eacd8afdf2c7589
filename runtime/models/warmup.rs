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

use std::io::Read;
use std::path::Path;

use prost::Message;

use super::ModelVersion;
use crate::error::{Error, Result};
use crate::infer::Batch;
use crate::proto::tensorflow::serving::{prediction_log, PredictionLog};
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
    let bytes = read_bounded(path)?;
    let records = tfrecord::records(&bytes)?;
    if records.len() > MAX_RECORDS {
        return Err(Error::invalid_argument(format!(
            "it holds {} records; at most {MAX_RECORDS} are allowed (TF Serving's limit)",
            records.len()
        )));
    }
    let owner = "the model";
    let mut requests = Vec::with_capacity(records.len());
    for (i, record) in records.into_iter().enumerate() {
        let at = |e: Error| e.context(format_args!("record {i}"));
        let log = PredictionLog::decode(record)
            .map_err(|e| at(Error::invalid_argument(format!("not a PredictionLog: {e}"))))?;
        let request = match log.log_type {
            Some(prediction_log::LogType::PredictLog(log)) => log.request.unwrap_or_default(),
            other => {
                let kind = match other {
                    Some(prediction_log::LogType::ClassifyLog(_)) => "classify_log",
                    Some(prediction_log::LogType::RegressLog(_)) => "regress_log",
                    Some(prediction_log::LogType::PredictStreamedLog(_)) => "predict_streamed_log",
                    Some(prediction_log::LogType::MultiInferenceLog(_)) => "multi_inference_log",
                    Some(prediction_log::LogType::SessionRunLog(_)) => "session_run_log",
                    _ => "empty",
                };
                return Err(at(Error::invalid_argument(format!(
                    "it is a {kind} record; sluice warms up with predict_log records"
                ))));
            }
        };
        signature.check_input_names(&owner, request.inputs.keys().map(String::as_str)).map_err(at)?;
        let mut inputs = request.inputs;
        let mut ordered = Vec::with_capacity(signature.inputs.len());
        for spec in &signature.inputs {
            let given =
                inputs.remove(&spec.name).ok_or_else(|| at(Error::internal("an input vanished, this is a bug")))?;
            let tensor = proto::decode(&spec.name, given, max_tensor_bytes).map_err(at)?;
            check_tensor(&owner, "input", spec, &tensor).map_err(at)?;
            ordered.push(tensor);
        }
        signature.check_rows(&owner, &ordered).map_err(at)?;
        requests.push(ordered);
    }
    Ok(requests)
}

fn read_bounded(path: &Path) -> Result<Vec<u8>> {
    let cannot = |e: std::io::Error| Error::invalid_argument(format!("cannot read it: {e}"));
    let file = std::fs::File::open(path).map_err(cannot)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(cannot)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(Error::invalid_argument(format!("it is larger than {MAX_FILE_BYTES} bytes")));
    }
    Ok(bytes)
}

/// TFRecord framing, as TensorFlow writes it: each record is its length
/// (u64, little-endian), the masked CRC-32C of those 8 bytes, the data,
/// and the masked CRC-32C of the data.
pub mod tfrecord {
    use crate::error::{Error, Result};

    /// TensorFlow's CRC mask: a CRC stored next to data that is itself a
    /// CRC would otherwise be easy to get right by accident.
    pub fn masked_crc(data: &[u8]) -> u32 {
        let crc = crc32c::crc32c(data);
        crc.rotate_right(15).wrapping_add(0xa282_ead8)
    }

    /// The records of a TFRecord file, every checksum checked.
    pub fn records(mut bytes: &[u8]) -> Result<Vec<&[u8]>> {
        let mut records = Vec::new();
        while !bytes.is_empty() {
            let at = records.len();
            let bad = |what: &str| Error::invalid_argument(format!("record {at}: {what}; not a TFRecord file?"));
            if bytes.len() < 12 {
                return Err(bad("the file ends inside a record header"));
            }
            let (length_bytes, rest) = bytes.split_at(8);
            let length = u64::from_le_bytes(length_bytes.try_into().map_err(|_| bad("short length"))?);
            let length_crc = u32::from_le_bytes(rest[..4].try_into().map_err(|_| bad("short checksum"))?);
            if masked_crc(length_bytes) != length_crc {
                return Err(bad("the checksum of its length is wrong"));
            }
            let rest = &rest[4..];
            let length =
                usize::try_from(length).ok().filter(|&n| n.checked_add(4).is_some_and(|end| end <= rest.len()));
            let Some(length) = length else {
                return Err(bad("its length runs past the end of the file"));
            };
            let (data, rest) = rest.split_at(length);
            let data_crc = u32::from_le_bytes(rest[..4].try_into().map_err(|_| bad("short checksum"))?);
            if masked_crc(data) != data_crc {
                return Err(bad("the checksum of its data is wrong"));
            }
            records.push(data);
            bytes = &rest[4..];
        }
        Ok(records)
    }

    /// Frames `records` as a TFRecord file (for tools and tests that write
    /// warmup files).
    pub fn write(records: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for data in records {
            let length = (data.len() as u64).to_le_bytes();
            out.extend_from_slice(&length);
            out.extend_from_slice(&masked_crc(&length).to_le_bytes());
            out.extend_from_slice(data);
            out.extend_from_slice(&masked_crc(data).to_le_bytes());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::spec::TensorSpec;
    use crate::tensor::DType;

    #[test]
    fn crc32c_is_castagnoli() {
        // The standard check value of CRC-32C.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn records_round_trip_and_damage_is_named() {
        let file = tfrecord::write(&[b"one".to_vec(), Vec::new(), b"three".to_vec()]);
        let records = tfrecord::records(&file).unwrap();
        assert_eq!(records, vec![&b"one"[..], &b""[..], &b"three"[..]]);
        let mut damaged = file.clone();
        damaged[13] ^= 1;
        assert!(tfrecord::records(&damaged).unwrap_err().message().contains("record 0"));
        let err = tfrecord::records(&file[..file.len() - 1]).unwrap_err();
        assert!(err.message().contains("record 2"), "{err}");
        let mut huge = file.clone();
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        huge[8..12].copy_from_slice(&tfrecord::masked_crc(&u64::MAX.to_le_bytes()).to_le_bytes());
        assert!(tfrecord::records(&huge).unwrap_err().message().contains("past the end"));
    }

    fn spec(name: &str, shape: Vec<i64>) -> TensorSpec {
        TensorSpec { name: name.into(), dtype: DType::F32, shape, unknown_rank: false }
    }

    #[test]
    fn synthesised_requests_cover_each_batch_size() {
        let signature = Signature { inputs: vec![spec("x", vec![-1, 4])], outputs: vec![spec("y", vec![-1, 2])] };
        let requests = synthesised(&signature, &[1, 8, 32]).unwrap();
        let shapes: Vec<&[i64]> = requests.iter().map(|r| r[0].shape()).collect();
        assert_eq!(shapes, vec![&[1, 4][..], &[8, 4][..], &[32, 4][..]]);
    }
}
