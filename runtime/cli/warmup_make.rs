//! `sluice warmup make LOG --model DIR`: turns a request log into TF
//! Serving's warmup file for one model version
//! (`DIR/assets.extra/tf_serving_warmup_requests`), so a new version warms
//! up on the inputs production sends rather than on zeros.
//!
//! Up to `--max-records` (TF Serving's limit, 1000) requests are taken,
//! evenly spread over the log to keep its mix; each is checked against the
//! version's signature and run through it once before anything is
//! written, so the server will not refuse the file when it loads the
//! version.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use prost::Message;

use crate::config::OnnxOptions;
use crate::error::{Error, Result};
use crate::infer::onnx::OnnxBackend;
use crate::metrics::Metrics;
use crate::models::repository::MODEL_FILE;
use crate::models::storage;
use crate::models::warmup::{self, MAX_RECORDS, WARMUP_FILE};
use crate::models::{tfrecord, ModelVersion};
use crate::pipeline::request_log;
use crate::proto::tensorflow::serving::{prediction_log, PredictLog, PredictionLog};

/// The arguments of `sluice warmup make`.
#[derive(Debug, clap::Args)]
pub struct MakeArgs {
    /// The request log: a `.tfrecord` file, a directory of them, or the
    /// `filename_prefix` it was written with.
    pub log: PathBuf,
    /// The model version directory the warmup file is for (`BASE/VERSION`,
    /// holding model.onnx), or the version in an object store
    /// (`s3://bucket/models/cnn/3`: the file is written there).
    #[arg(long)]
    pub model: PathBuf,
    /// Where to write (a path; with a bucket's version, ignored); default:
    /// DIR/assets.extra/tf_serving_warmup_requests.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// The most requests in the file.
    #[arg(long, default_value_t = MAX_RECORDS)]
    pub max_records: usize,
    /// Replace an existing warmup file.
    #[arg(long)]
    pub force: bool,
    /// The most MiB of log read.
    #[arg(long, default_value_t = 1024)]
    pub max_log_mib: u64,
    /// The ONNX Runtime library; default: as the server finds it.
    #[arg(long)]
    pub onnxruntime: Option<PathBuf>,
}

/// Writes the warmup file; answers what was written.
pub async fn make(args: &MakeArgs) -> Result<String> {
    if args.max_records == 0 || args.max_records > MAX_RECORDS {
        return Err(Error::invalid_argument(format!(
            "--max-records {}: must be between 1 and {MAX_RECORDS} (TF Serving reads at most {MAX_RECORDS})",
            args.max_records
        )));
    }
    let remote = crate::config::is_object_store_url(&args.model).then(|| args.model.display().to_string());
    let output = args.output.clone().unwrap_or_else(|| args.model.join(WARMUP_FILE));
    let exists = match &remote {
        Some(url) => storage::read_object(url, WARMUP_FILE, STORE_TIMEOUT).await?.is_some(),
        None => output.exists(),
    };
    if exists && !args.force {
        let shown = remote
            .as_deref()
            .map_or(output.display().to_string(), |url| format!("{}/{WARMUP_FILE}", storage::shown(url)));
        return Err(Error::failed_precondition(format!("{shown} exists; give --force to replace it")));
    }
    let logged = request_log::read_logged(&args.log, args.max_log_mib << 20).await?;
    if logged.is_empty() {
        return Err(Error::invalid_argument(format!("{}: the request log holds no requests", args.log.display())));
    }
    let total = logged.len();
    let chosen = request_log::spread(logged.into_iter().enumerate().collect(), args.max_records);
    // A bucket's version is read into a directory of its own first.
    let fetched = match &remote {
        Some(url) => Some(fetch_version(url).await?),
        None => None,
    };
    let model_dir = fetched.as_ref().map_or(args.model.clone(), |f| f.dir.clone());
    let version = load(&model_dir, args.onnxruntime.as_deref())?;
    // The largest tensor a logged request may carry: the server's default.
    let max_tensor_bytes = crate::config::Config::default().server.max_tensor_bytes;
    let mut checked = Vec::with_capacity(chosen.len());
    for (index, request) in &chosen {
        let inputs = warmup::fit(request.clone(), version.signature(), max_tensor_bytes)
            .map_err(|e| e.context(format_args!("logged request {index} does not fit {}", args.model.display())))?;
        checked.push(warmup::WarmupRequest { signature: None, inputs });
    }
    warmup::run(&version, checked, 1, false).await?;
    let records: Vec<Vec<u8>> = chosen
        .into_iter()
        .map(|(_, request)| {
            PredictionLog {
                log_metadata: None,
                log_type: Some(prediction_log::LogType::PredictLog(PredictLog {
                    request: Some(request),
                    response: None,
                })),
            }
            .encode_to_vec()
        })
        .collect();
    if let Some(url) = &remote {
        storage::write_object(url, WARMUP_FILE, tfrecord::write(&records), STORE_TIMEOUT).await?;
        return Ok(format!(
            "{}/{WARMUP_FILE}: {} of {total} logged requests, each checked against and run through {version}",
            storage::shown(url),
            records.len()
        ));
    }
    if let Some(dir) = output.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::invalid_argument(format!("cannot make {}: {e}", dir.display())))?;
    }
    // Written aside and renamed, so a server loading the version meanwhile
    // never reads half a file.
    let partial = output.with_extension("partial");
    std::fs::write(&partial, tfrecord::write(&records))
        .and_then(|()| std::fs::rename(&partial, &output))
        .map_err(|e| Error::internal(format!("writing {}: {e}", output.display())))?;
    Ok(format!(
        "{}: {} of {total} logged requests, each checked against and run through {version}",
        output.display(),
        records.len()
    ))
}

/// How long one request to an object store may take.
const STORE_TIMEOUT: Duration = Duration::from_secs(60);

/// A bucket's version read into a temporary `NAME/VERSION/` directory,
/// removed when dropped.
struct Fetched {
    dir: PathBuf,
    root: PathBuf,
}

impl Drop for Fetched {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Reads the model file of the version `url` names (`…/NAME/VERSION`).
async fn fetch_version(url: &str) -> Result<Fetched> {
    let shown = storage::shown(url);
    let mut parts = url.trim_end_matches('/').rsplit('/');
    let (version, name) = (parts.next().unwrap_or(""), parts.next().unwrap_or("model"));
    if version.parse::<i64>().is_err() {
        return Err(Error::invalid_argument(format!("{shown}: give a version (s3://bucket/models/NAME/VERSION)")));
    }
    let model = storage::read_object(url, MODEL_FILE, STORE_TIMEOUT)
        .await?
        .ok_or_else(|| Error::not_found(format!("{shown} has no {MODEL_FILE}; give a model version")))?;
    let root = std::env::temp_dir().join(format!("sluice-warmup-{}-{:08x}", std::process::id(), rand::random::<u32>()));
    let fetched = Fetched { dir: root.join(name).join(version), root };
    std::fs::create_dir_all(&fetched.dir)
        .and_then(|()| std::fs::write(fetched.dir.join(MODEL_FILE), &model))
        .map_err(|e| Error::internal(format!("writing {}: {e}", fetched.dir.display())))?;
    Ok(fetched)
}

/// The version in `dir`, loaded with the server's defaults.
fn load(dir: &Path, library: Option<&Path>) -> Result<ModelVersion> {
    let file = dir.join(MODEL_FILE);
    if !file.is_file() {
        return Err(Error::not_found(format!("{} has no {MODEL_FILE}; give a model version directory", dir.display())));
    }
    let version = dir.file_name().and_then(|n| n.to_str()).and_then(|n| n.parse::<i64>().ok()).ok_or_else(|| {
        Error::invalid_argument(format!("{}: a version directory is named by its number (BASE/1)", dir.display()))
    })?;
    let name = dir.parent().and_then(Path::file_name).map_or("model".to_string(), |n| n.to_string_lossy().into_owned());
    let label = format!("model '{name}' version {version}");
    let metrics = Metrics::new();
    let backend = OnnxBackend::load(
        &file,
        &label,
        &OnnxOptions::default(),
        library,
        metrics.model(&name, version),
        None,
        Duration::ZERO,
    )?;
    Ok(ModelVersion::new(name, version, Arc::new(backend)))
}
