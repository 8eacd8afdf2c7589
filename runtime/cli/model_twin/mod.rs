//! `sluice model twin BASE`: an ONNX twin of a SavedModel version,
//! verified on the traffic the model sees, and with `--publish` served as
//! the next version.
//!
//! Version N's main signature is converted by tf2onnx ([`convert`]) into
//! `model.onnx`, each other signature into `signatures/KEY.onnx` (which
//! the ONNX backend serves as signature KEY), then both models run in this process through the server's own backends
//! (TensorFlow's C API and ONNX Runtime, with the server's default
//! settings) on the version's warmup requests and on up to 10,000 logged
//! requests of the model; each output is compared ([`compare`]) and each
//! backend's CPU per request measured at batch 1 and 32 ([`cost`]). A
//! clean verification may then publish `BASE/N+1/` ([`publish`]): the
//! ONNX model and the SavedModel's `assets.extra/` (its warmup file
//! carries over), written aside and renamed into place, so a polling
//! server sees the whole version or none of it.

pub mod compare;
pub mod convert;
pub mod cost;
pub mod publish;
mod report;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use self::compare::{OutputDiff, Tolerance};
use self::cost::Cost;
use crate::config::tensorflow::TensorflowOptions;
use crate::config::OnnxOptions;
use crate::error::{Error, Result};
use crate::infer::onnx::OnnxBackend;
use crate::infer::tensorflow::TensorflowBackend;
use crate::infer::Batch;
use crate::metrics::Metrics;
use crate::models::warmup::{self, WarmupRequest, WARMUP_FILE};
use crate::models::ModelVersion;
use crate::pipeline::request_log;
use crate::proto::tensorflow::serving::PredictRequest;
use crate::tensor::spec::Signature;
use crate::tensor::{DType, Tensor};

/// The SavedModel file of a version directory.
const SAVED_MODEL_FILE: &str = "saved_model.pb";

/// The arguments of `sluice model twin`.
#[derive(Debug, clap::Args)]
pub struct TwinArgs {
    /// The model's base path: `BASE/VERSION/saved_model.pb`, as TF Serving
    /// serves it.
    pub base: PathBuf,
    /// The SavedModel version to twin; default: the highest.
    #[arg(long)]
    pub version: Option<i64>,
    /// A request log of the model (a `.tfrecord` file, a directory of them,
    /// a `filename_prefix`, or any of these in object storage): up to
    /// `--max-requests` of its requests are compared besides the warmup
    /// file's.
    #[arg(long)]
    pub requests_from: Option<PathBuf>,
    /// The most logged requests compared, evenly spread over the log.
    #[arg(long, default_value_t = 10_000)]
    pub max_requests: usize,
    /// The model's name in the log's requests; default: BASE's directory
    /// name. Logged requests for other models are left out.
    #[arg(long)]
    pub model_name: Option<String>,
    /// Write `BASE/N+1/` (model.onnx and assets.extra/) when the twin
    /// verifies.
    #[arg(long)]
    pub publish: bool,
    /// Publish though some of the SavedModel's other signatures could not
    /// be twinned (converted and compared): the twin leaves them out, so
    /// calls to them fail on it.
    #[arg(long)]
    pub drop_other_signatures: bool,
    /// Relative tolerance of a floating-point output, to the SavedModel's
    /// value.
    #[arg(long, default_value_t = 1e-4)]
    pub rtol: f64,
    /// Absolute tolerance of a floating-point output.
    #[arg(long, default_value_t = 1e-5)]
    pub atol: f64,
    /// Print the report as JSON (for CI pipelines) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Verify this ONNX model instead of converting one (a conversion made
    /// by hand or by another tool).
    #[arg(long)]
    pub onnx: Option<PathBuf>,
    /// Keep the converted model here too (publishing or not).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// The ONNX opset tf2onnx converts to.
    #[arg(long, default_value_t = 17)]
    pub opset: u32,
    /// How long the conversion may take.
    #[arg(long, default_value_t = 600)]
    pub convert_timeout_secs: u64,
    /// The SavedModel's MetaGraph tag (TF Serving's --saved_model_tags).
    #[arg(long, default_value = "serve")]
    pub saved_model_tags: String,
    /// The signature twinned: the one the model serves as its main
    /// signature ([models.tensorflow] signature).
    #[arg(long, default_value = crate::tensor::spec::DEFAULT_SIGNATURE)]
    pub signature: String,
    /// Seconds each CPU measurement runs (two batch sizes, two backends);
    /// 0 skips them.
    #[arg(long, default_value_t = 1.0)]
    pub cost_seconds: f64,
    /// The Python with TensorFlow and tf2onnx; default:
    /// .cache/tf-venv/bin/python as scripts/setup installs it.
    #[arg(long, env = convert::PYTHON_ENV)]
    pub python: Option<PathBuf>,
    /// ONNX Runtime's library; default: as the server finds it.
    #[arg(long)]
    pub onnxruntime: Option<PathBuf>,
    /// TensorFlow's library; default: as the server finds it.
    #[arg(long)]
    pub tensorflow_library: Option<PathBuf>,
    /// The most MiB of request log read.
    #[arg(long, default_value_t = 1024)]
    pub max_log_mib: u64,
}

/// What `sluice model twin` found, as printed.
pub struct Outcome {
    /// The report, as a table or JSON.
    pub shown: String,
    /// Whether the twin verified (and, with --publish, was published).
    pub verified: bool,
    /// Why not, when it did not.
    pub problems: Vec<String>,
}

/// Where the compared requests came from.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Requests {
    /// Predict requests of the version's warmup file on the main signature.
    pub warmup: usize,
    /// Logged requests of the model compared.
    pub logged: usize,
    /// Requests the log held, every model's.
    pub logged_read: usize,
    /// Made up from the signature (random values) because neither the
    /// warmup file nor a log gave any.
    pub synthetic: usize,
    /// Of those, requests for the SavedModel's other signatures (compared
    /// where the signature was twinned).
    pub other_signatures: usize,
    /// Requests the SavedModel itself failed (a log may hold requests that
    /// were refused): not compared.
    pub failed_in_saved_model: usize,
}

/// The CPU per request of both backends at one batch size.
#[derive(Debug, Clone, Serialize)]
pub struct CostRow {
    /// Requests per run.
    pub batch: usize,
    /// The SavedModel in TensorFlow.
    pub saved_model: Cost,
    /// The twin in ONNX Runtime.
    pub twin: Cost,
    /// Twin CPU over SavedModel CPU.
    pub cpu_ratio: f64,
}

/// Everything the command found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The model's name.
    pub model: String,
    /// The SavedModel version directory.
    pub saved_model: String,
    /// Its version.
    pub version: i64,
    /// The signature twinned.
    pub signature: String,
    /// What made the twin.
    pub converter: String,
    /// The tolerance of floating-point outputs.
    pub tolerance: Tolerance,
    /// The requests compared.
    pub requests: Requests,
    /// How the twin's signature differs from the SavedModel's.
    pub signature_differences: Vec<String>,
    /// The SavedModel's other signatures the twin serves too.
    pub twinned_signatures: Vec<String>,
    /// The other signatures it does not, each with why ("KEY: reason").
    pub not_twinned: Vec<String>,
    /// Requests the SavedModel answered and the twin failed (the first 5).
    pub twin_failures: Vec<String>,
    /// How many requests the twin failed.
    pub twin_failure_count: usize,
    /// Per output, what the twin's answers differ by.
    pub outputs: Vec<OutputDiff>,
    /// CPU per request of each backend.
    pub cost: Vec<CostRow>,
    /// Why the CPU was not measured, when a run failed.
    pub cost_error: Option<String>,
    /// Whether the twin verified.
    pub verified: bool,
    /// Why it did not (or was not published).
    pub problems: Vec<String>,
    /// The version directory published, when one was.
    pub published: Option<String>,
}

/// Makes, verifies and (with `--publish`) publishes the twin.
pub async fn twin(args: &TwinArgs) -> Result<Outcome> {
    check_args(args)?;
    let (version, dir) = saved_model_version(&args.base, args.version)?;
    let name = args.model_name.clone().unwrap_or_else(|| base_name(&args.base));
    let metrics = Metrics::new();
    let saved = load_saved_model(args, &name, version, &dir, &metrics).await?;

    if args.publish {
        publish::check_free(&args.base, version + 1)?;
    }
    // The requests first: a log that gives none fails before a conversion
    // that may take minutes.
    let mut counts = Requests::default();
    let requests = requests(args, &saved, &dir, &name, &mut counts).await?;
    let stage = publish::Stage::new()?;
    let twin_file = stage.dir().join(crate::models::repository::MODEL_FILE);
    // The converter, unless the twin is given.
    let python = args.onnx.is_none().then(|| convert::python(args.python.as_deref())).transpose()?;
    let converter = match &python {
        None => {
            let given = given_or(args)?;
            std::fs::copy(given, &twin_file)
                .map_err(|e| Error::invalid_argument(format!("--onnx {}: cannot read it: {e}", given.display())))?;
            format!("given: {}", given.display())
        }
        Some(python) => {
            let (converted, declared) =
                convert_signature(args, python, &dir, &args.signature, saved.signature(), &twin_file).await?;
            let mut converter = format!("{}, opset {}", converted.converter, args.opset);
            if !declared.is_empty() {
                converter +=
                    &format!("; output shapes tf2onnx left out declared as the SavedModel's: {}", declared.join(", "));
            }
            converter
        }
    };
    let mut twinned = Vec::new();
    let mut not_twinned = Vec::new();
    for key in other_signatures(&saved, &args.signature) {
        if let Some(method) = non_predict_method(&saved, &key) {
            not_twinned.push(format!(
                "{key}: a {method} signature; the twin serves Predict signatures only, so Classify and Regress \
                 calls on it would fail"
            ));
            continue;
        }
        match twin_other(args, python.as_deref(), &saved, &dir, &key, stage.dir()).await {
            Ok(()) => twinned.push(key),
            Err(e) => not_twinned.push(format!("{key}: {}", e.message())),
        }
    }
    if let Some(output) = &args.output {
        std::fs::copy(&twin_file, output)
            .map_err(|e| Error::invalid_argument(format!("--output {}: cannot write it: {e}", output.display())))?;
    }

    let twin = load_twin(args, &name, version, &twin_file, &metrics).await?;
    let mut report = Report {
        model: name.clone(),
        saved_model: dir.display().to_string(),
        version,
        signature: args.signature.clone(),
        converter,
        tolerance: Tolerance { rtol: args.rtol, atol: args.atol },
        requests: counts,
        signature_differences: signature_differences(&saved, &twin, &twinned),
        outputs: std::iter::once(compare::outputs(&args.signature, saved.signature()))
            .chain(twinned.iter().filter_map(|key| Some(compare::outputs(key, saved.backend().other_signature(key)?))))
            .flatten()
            .collect(),
        twinned_signatures: twinned,
        not_twinned,
        twin_failures: Vec::new(),
        twin_failure_count: 0,
        cost: Vec::new(),
        cost_error: None,
        verified: false,
        problems: Vec::new(),
        published: None,
    };

    let cheapest = compare_all(&saved, &twin, requests, &mut report).await;
    // A signature no request reached is not verified: it leaves the twin.
    for key in std::mem::take(&mut report.twinned_signatures) {
        let compared = report.outputs.iter().filter(|o| o.signature == key).map(|o| o.rows).max().unwrap_or(0);
        if compared > 0 {
            report.twinned_signatures.push(key);
            continue;
        }
        let _ = std::fs::remove_file(stage.dir().join(crate::infer::onnx::SIGNATURES_DIR).join(format!("{key}.onnx")));
        report.outputs.retain(|o| o.signature != key);
        report.not_twinned.push(format!(
            "{key}: converted, but no request of it could be compared (its inputs cannot be made up, and neither the \
             warmup file nor the log holds one)"
        ));
    }
    if let (Some(request), true) = (cheapest, args.cost_seconds > 0.0) {
        // A failed measurement leaves the verification standing.
        match costs(&saved, &twin, &request, Duration::from_secs_f64(args.cost_seconds)).await {
            Ok(cost) => report.cost = cost,
            Err(e) => report.cost_error = Some(e.message().to_string()),
        }
    }
    report.problems = problems(&report);
    if let Some(method) = non_predict_method(&saved, &args.signature) {
        report.problems.push(format!(
            "signature '{}' is a {method} signature; the twin serves Predict signatures only, so Classify and \
             Regress calls on it would fail",
            args.signature
        ));
    }
    report.verified = report.problems.is_empty();
    if args.publish && report.verified {
        if !report.not_twinned.is_empty() && !args.drop_other_signatures {
            report.problems.push(format!(
                "not published: the SavedModel also serves signatures the twin could not take ({}), so calls to \
                 them would fail on it; give --drop-other-signatures to publish without them",
                report.not_twinned.join("; ")
            ));
        } else {
            // The report kept with the version says where it went.
            report.published = Some(args.base.join((version + 1).to_string()).display().to_string());
            let record = serde_json::to_vec_pretty(&report)
                .map_err(|e| Error::internal(format!("writing the report as JSON failed: {e}")))?;
            report.published = Some(stage.publish(&args.base, &dir, version + 1, &record)?.display().to_string());
        }
    }
    let verified = report.problems.is_empty();
    let shown = if args.json {
        serde_json::to_string_pretty(&report)
            .map_err(|e| Error::internal(format!("writing the report as JSON failed: {e}")))?
    } else {
        report::table(&report)
    };
    Ok(Outcome { shown, verified, problems: report.problems })
}

fn check_args(args: &TwinArgs) -> Result<()> {
    let finite = |name: &str, value: f64| {
        if value.is_finite() && value >= 0.0 {
            Ok(())
        } else {
            Err(Error::invalid_argument(format!("--{name} {value}: must be a number 0 or above")))
        }
    };
    finite("rtol", args.rtol)?;
    finite("atol", args.atol)?;
    finite("cost-seconds", args.cost_seconds)?;
    if args.cost_seconds > 600.0 {
        return Err(Error::invalid_argument(format!("--cost-seconds {}: at most 600", args.cost_seconds)));
    }
    if args.max_requests == 0 {
        return Err(Error::invalid_argument("--max-requests 0: compare at least 1 logged request"));
    }
    if args.saved_model_tags.contains(',') {
        return Err(Error::invalid_argument(format!(
            "--saved-model-tags {}: tf2onnx loads a MetaGraph by one tag",
            args.saved_model_tags
        )));
    }
    if args.convert_timeout_secs == 0 {
        return Err(Error::invalid_argument("--convert-timeout-secs 0: give the conversion at least 1 s"));
    }
    Ok(())
}

/// The version to twin and its directory: `version`, or the highest one
/// with a SavedModel.
fn saved_model_version(base: &Path, version: Option<i64>) -> Result<(i64, PathBuf)> {
    if let Some(version) = version {
        let dir = base.join(version.to_string());
        if !dir.join(SAVED_MODEL_FILE).is_file() {
            return Err(Error::not_found(format!(
                "{} has no {SAVED_MODEL_FILE}: give --version of a SavedModel version of {}",
                dir.display(),
                base.display()
            )));
        }
        return Ok((version, dir));
    }
    let entries = std::fs::read_dir(base)
        .map_err(|e| Error::not_found(format!("{}: cannot list the model's versions: {e}", base.display())))?;
    entries
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<i64>().ok().filter(|v| *v >= 0)?;
            entry.path().join(SAVED_MODEL_FILE).is_file().then(|| (version, entry.path()))
        })
        .max_by_key(|(version, _)| *version)
        .ok_or_else(|| {
            Error::not_found(format!(
                "{} holds no SavedModel version (VERSION/{SAVED_MODEL_FILE}); give the model's base path",
                base.display()
            ))
        })
}

/// The model's name: the base path's last directory.
fn base_name(base: &Path) -> String {
    let base = base.canonicalize().unwrap_or_else(|_| base.to_path_buf());
    base.file_name().map_or("model".to_string(), |n| n.to_string_lossy().into_owned())
}

/// The SavedModel, loaded as the server loads it, off the async threads.
async fn load_saved_model(
    args: &TwinArgs,
    name: &str,
    version: i64,
    dir: &Path,
    metrics: &Metrics,
) -> Result<ModelVersion> {
    let options = TensorflowOptions {
        tags: vec![args.saved_model_tags.clone()],
        signature: args.signature.clone(),
        ..TensorflowOptions::default()
    };
    let (label, dir, library) =
        (format!("model '{name}' version {version}"), dir.to_path_buf(), args.tensorflow_library.clone());
    let model_metrics = metrics.model(name, version);
    let backend = tokio::task::spawn_blocking(move || {
        TensorflowBackend::load(&dir, &label, &options, library.as_deref(), model_metrics, Duration::ZERO)
    })
    .await
    .map_err(|_| Error::internal("loading the SavedModel panicked"))??;
    Ok(ModelVersion::new(name, version, Arc::new(backend)))
}

/// The twin, loaded as the server would load it as version N+1.
async fn load_twin(args: &TwinArgs, name: &str, version: i64, file: &Path, metrics: &Metrics) -> Result<ModelVersion> {
    let label = format!("the twin of model '{name}' version {version}");
    let (file, library, model_metrics) =
        (file.to_path_buf(), args.onnxruntime.clone(), metrics.model(name, version + 1));
    let backend = tokio::task::spawn_blocking(move || {
        OnnxBackend::load(
            &file,
            &label,
            &OnnxOptions::default(),
            library.as_deref(),
            model_metrics,
            None,
            Duration::ZERO,
        )
    })
    .await
    .map_err(|_| Error::internal("loading the twin panicked"))??;
    Ok(ModelVersion::new(name, version + 1, Arc::new(backend)))
}

/// The SavedModel's signatures besides `main` (its own `__…` ones aside).
fn other_signatures(saved: &ModelVersion, main: &str) -> Vec<String> {
    saved.backend().signature_defs().map_or_else(Vec::new, |defs| {
        defs.keys().filter(|key| *key != main && !key.starts_with("__")).cloned().collect()
    })
}

/// The method of the SavedModel's signature `key` when it is not Predict's
/// (a classification or regression signature, which Classify and Regress
/// calls need and an ONNX version does not declare).
fn non_predict_method(saved: &ModelVersion, key: &str) -> Option<String> {
    let method = &saved.backend().signature_defs()?.get(key)?.method_name;
    (method != crate::tensor::spec::PREDICT_METHOD && !method.is_empty()).then(|| method.clone())
}

/// Converts the SavedModel's signature `key` into `stage/signatures/KEY.onnx`,
/// as the main one (or copies it from beside `--onnx`).
async fn twin_other(
    args: &TwinArgs,
    python: Option<&Path>,
    saved: &ModelVersion,
    dir: &Path,
    key: &str,
    stage: &Path,
) -> Result<()> {
    if key.contains(['/', '\\', '\0']) || key.starts_with('.') {
        return Err(Error::invalid_argument("the key cannot name a file"));
    }
    let signatures = stage.join(crate::infer::onnx::SIGNATURES_DIR);
    std::fs::create_dir_all(&signatures)
        .map_err(|e| Error::internal(format!("cannot make {}: {e}", signatures.display())))?;
    let file = signatures.join(format!("{key}.onnx"));
    let Some(python) = python else {
        // A given twin's other signatures sit beside it.
        let given = given_or(args)?;
        let beside = given.parent().unwrap_or(Path::new(".")).join(crate::infer::onnx::SIGNATURES_DIR);
        let source = beside.join(format!("{key}.onnx"));
        std::fs::copy(&source, &file)
            .map_err(|e| Error::not_found(format!("--onnx: no {} ({e})", source.display())))?;
        return Ok(());
    };
    // A signature the SavedModel lists but does not serve (a resource
    // output) could never be compared.
    let signature = saved
        .backend()
        .other_signature(key)
        .ok_or_else(|| Error::failed_precondition("the SavedModel lists it but does not serve it"))?;
    match convert_signature(args, python, dir, key, signature, &file).await {
        Ok(_) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&file);
            Err(e)
        }
    }
}

/// `--onnx`, which the twin was given when no converter was looked for.
fn given_or(args: &TwinArgs) -> Result<&Path> {
    args.onnx.as_deref().ok_or_else(|| Error::internal("neither --onnx nor a converter, this is a bug"))
}

/// Converts the SavedModel's signature `key` (of `signature`) in `dir` to
/// `file` and declares the output shapes tf2onnx left out: what converted
/// it, and the outputs declared.
async fn convert_signature(
    args: &TwinArgs,
    python: &Path,
    dir: &Path,
    key: &str,
    signature: &Signature,
    file: &Path,
) -> Result<(convert::Converted, Vec<String>)> {
    let timeout = Duration::from_secs(args.convert_timeout_secs);
    let converted = convert::convert(python, dir, &args.saved_model_tags, key, args.opset, file, timeout).await?;
    // Each output's shape, where its rank is known.
    let shapes: Vec<(String, Vec<i64>)> = signature
        .outputs
        .iter()
        .filter(|spec| !spec.unknown_rank)
        .map(|spec| (spec.name.clone(), spec.shape.clone()))
        .collect();
    let declared = convert::declare_missing_shapes(python, file, &shapes).await?;
    Ok((converted, declared))
}

/// How the twin's signatures differ from the SavedModel's: the main one,
/// and each other one twinned (named).
fn signature_differences(saved: &ModelVersion, twin: &ModelVersion, twinned: &[String]) -> Vec<String> {
    let mut differences = compare::signature_differences(saved.signature(), twin.signature());
    for key in twinned {
        match (saved.backend().other_signature(key), twin.backend().other_signature(key)) {
            (Some(a), Some(b)) => differences
                .extend(compare::signature_differences(a, b).into_iter().map(|d| format!("signature '{key}': {d}"))),
            _ => differences.push(format!("signature '{key}' is not served by the twin")),
        }
    }
    differences
}

/// A request to compare: what it is for the report ("warmup 3", "log
/// 1207", "synthetic 0"), the signature it runs (`None`: the main one),
/// and its inputs in that signature's order.
type Compared = (String, Option<Arc<str>>, Vec<Tensor>);

/// The requests to compare, counted in `counts`.
async fn requests(
    args: &TwinArgs,
    saved: &ModelVersion,
    dir: &Path,
    name: &str,
    counts: &mut Requests,
) -> Result<Vec<Compared>> {
    let max_tensor_bytes = crate::config::Config::default().server.max_tensor_bytes;
    let mut chosen = Vec::new();
    let file = dir.join(WARMUP_FILE);
    if file.is_file() {
        let records = warmup::from_file(&file, saved, None, max_tensor_bytes)
            .map_err(|e| e.context(format_args!("warmup file {}", file.display())))?;
        for (i, request) in records.into_iter().enumerate() {
            let WarmupRequest { signature, inputs } = request;
            counts.warmup += 1;
            counts.other_signatures += usize::from(signature.is_some());
            chosen.push((format!("warmup {i}"), signature, inputs));
        }
    }
    if let Some(log) = &args.requests_from {
        let max_bytes = args.max_log_mib.checked_mul(1 << 20).ok_or_else(|| {
            Error::invalid_argument(format!(
                "--max-log-mib {}: too large (at most {})",
                args.max_log_mib,
                u64::MAX >> 20
            ))
        })?;
        let logged = request_log::read_logged(log, max_bytes).await?;
        counts.logged_read = logged.len();
        let mut names_seen = std::collections::BTreeSet::new();
        let of_model: Vec<(usize, PredictRequest)> = logged
            .into_iter()
            .enumerate()
            .filter(|(_, r)| {
                let logged_name = r.model_spec.as_ref().map_or("", |spec| spec.name.as_str());
                if names_seen.len() < 10 {
                    names_seen.insert(logged_name.to_string());
                }
                logged_name.is_empty() || logged_name == name
            })
            .collect();
        let of_model_count = of_model.len();
        for (i, request) in request_log::spread(of_model, args.max_requests) {
            // A request naming no signature runs the model's main one.
            let key = request.model_spec.as_ref().map_or("", |spec| spec.signature_name.as_str());
            let fitted = if key.is_empty() || key == args.signature {
                warmup::fit(request, saved.signature(), max_tensor_bytes).map(|inputs| (None, inputs))
            } else {
                warmup::predict_request(request, saved, max_tensor_bytes).map(|r| (r.signature, r.inputs))
            };
            match fitted {
                Ok((signature, inputs)) => {
                    counts.logged += 1;
                    counts.other_signatures += usize::from(signature.is_some());
                    chosen.push((format!("log {i}"), signature, inputs));
                }
                // A logged request that does not fit the model was refused
                // when it was sent too.
                Err(_) => counts.failed_in_saved_model += 1,
            }
        }
        if counts.logged == 0 {
            let seen: Vec<String> = names_seen.into_iter().map(|n| format!("'{n}'")).collect();
            return Err(Error::invalid_argument(format!(
                "--requests-from {}: none of its {} requests is a Predict request of model '{name}' that fits the \
                 SavedModel ({of_model_count} name the model, {} do not fit); model names in the log: {}; give \
                 --model-name to pick another",
                log.display(),
                counts.logged_read,
                counts.failed_in_saved_model,
                seen.join(", ")
            )));
        }
    }
    // Made-up requests only when the version has no traffic at all; a log
    // that gave none is refused above.
    if chosen.is_empty() && !file.is_file() {
        for (i, inputs) in synthetic(saved.signature())?.into_iter().enumerate() {
            counts.synthetic += 1;
            chosen.push((format!("synthetic {i}"), None, inputs));
        }
        // Other signatures of strings stay uncompared, and are reported so.
        for key in other_signatures(saved, &args.signature) {
            let Some(signature) = saved.backend().other_signature(&key) else { continue };
            let key: Arc<str> = Arc::from(key.as_str());
            for (i, inputs) in synthetic(signature).into_iter().flatten().enumerate() {
                counts.synthetic += 1;
                counts.other_signatures += 1;
                chosen.push((format!("synthetic {key} {i}"), Some(key.clone()), inputs));
            }
        }
    }
    if chosen.is_empty() {
        return Err(Error::failed_precondition(format!(
            "{}: it holds no record this command can compare; give --requests-from a request log of the model",
            file.display()
        )));
    }
    Ok(chosen)
}

/// How many requests are made up when nothing else is there to compare.
const SYNTHETIC_REQUESTS: usize = 16;

/// Requests of random values (`sluice bench`'s: floats in [-1, 1),
/// integers in [0, 10)) shaped as `signature` takes them (free dimensions
/// 1, the batch dimension 1 to 8): a weaker check than real traffic, said
/// so in the report. Strings cannot be made up meaningfully.
fn synthetic(signature: &Signature) -> Result<Vec<Vec<Tensor>>> {
    if let Some(spec) = signature.inputs.iter().find(|spec| spec.dtype == DType::String) {
        return Err(Error::failed_precondition(format!(
            "input '{}' is DT_STRING and the version has no warmup file: give --requests-from a request log of \
             the model, so the twin is compared on real inputs",
            spec.name
        )));
    }
    let mut rng = rand::rng();
    (0..SYNTHETIC_REQUESTS)
        .map(|i| {
            let rows = [1i64, 8, 3, 1][i % 4];
            signature
                .inputs
                .iter()
                .map(|spec| {
                    let shape = if spec.unknown_rank { vec![rows] } else { spec.shape_with_rows(rows) };
                    let count = crate::tensor::element_count(&shape)?;
                    Ok(crate::cli::bench::inputs::random_tensor(spec.dtype, shape, count, &mut rng))
                })
                .collect()
        })
        .collect()
}

/// Runs every request through both models and adds what their answers
/// differ by to `report`; answers the request with the fewest rows that
/// both answered, which the CPU is measured with.
async fn compare_all(
    saved: &ModelVersion,
    twin: &ModelVersion,
    requests: Vec<Compared>,
    report: &mut Report,
) -> Option<Vec<Tensor>> {
    let tolerance = report.tolerance;
    let mut cheapest: Option<Vec<Tensor>> = None;
    for (what, key, inputs) in requests {
        let signatures = match &key {
            None => Some((saved.signature(), twin.signature())),
            Some(key) => saved.backend().other_signature(key).zip(twin.backend().other_signature(key)),
        };
        // A signature the twin does not serve is reported as such.
        let Some((saved_signature, twin_signature)) = signatures else { continue };
        let run = |model: &ModelVersion, inputs: Vec<Tensor>| match &key {
            None => model.backend().run(Batch::single(inputs)),
            Some(key) => model.backend().run_other(key, inputs),
        };
        let expected = match run(saved, inputs.clone()).await {
            Ok(outputs) => outputs,
            Err(_) => {
                report.requests.failed_in_saved_model += 1;
                continue;
            }
        };
        // The twin takes its inputs in its own order, by name.
        let Some(twin_inputs) = reorder(&inputs, saved_signature, twin_signature) else {
            // A signature difference, reported once as such.
            continue;
        };
        let answered = match run(twin, twin_inputs).await {
            Ok(outputs) => outputs,
            Err(e) => {
                report.twin_failure_count += 1;
                if report.twin_failures.len() < 5 {
                    report.twin_failures.push(format!("request {what}: {}", e.message()));
                }
                continue;
            }
        };
        let key_name = key.as_deref().unwrap_or(report.signature.as_str()).to_string();
        for (spec, saved_output) in saved_signature.outputs.iter().zip(&expected) {
            let twin_output = twin_signature.output_index(&spec.name).and_then(|i| answered.get(i));
            let diff = report.outputs.iter_mut().find(|d| d.signature == key_name && d.output == spec.name);
            if let (Some(diff), Some(twin_output)) = (diff, twin_output) {
                diff.add(saved_output, twin_output, tolerance, &what);
            }
        }
        // CPU is measured on the main signature's smallest request that
        // has rows.
        let rows = |inputs: &[Tensor]| inputs.first().map_or(1, Tensor::rows);
        if key.is_none() && rows(&inputs) > 0 && cheapest.as_deref().is_none_or(|best| rows(&inputs) < rows(best)) {
            cheapest = Some(inputs);
        }
    }
    cheapest
}

/// `inputs` (in `from`'s order) in `to`'s order, by name; `None` when `to`
/// has an input `from` has not.
fn reorder(inputs: &[Tensor], from: &Signature, to: &Signature) -> Option<Vec<Tensor>> {
    to.inputs
        .iter()
        .map(|spec| from.inputs.iter().position(|s| s.name == spec.name).and_then(|i| inputs.get(i).cloned()))
        .collect()
}

/// CPU per request of both backends at each batch size the model runs.
async fn costs(
    saved: &ModelVersion,
    twin: &ModelVersion,
    request: &[Tensor],
    budget: Duration,
) -> Result<Vec<CostRow>> {
    let twin_request = reorder(request, saved.signature(), twin.signature())
        .ok_or_else(|| Error::internal("a compared request does not fit the twin, this is a bug"))?;
    let batched = saved.signature().is_batched() && twin.signature().is_batched();
    let mut rows = Vec::new();
    for batch in cost::BATCH_SIZES.into_iter().filter(|&b| b == 1 || batched) {
        let saved_cost = cost::measure(saved.backend().as_ref(), request, batch, budget)
            .await
            .map_err(|e| e.context("measuring the SavedModel's CPU"))?;
        let twin_cost = cost::measure(twin.backend().as_ref(), &twin_request, batch, budget)
            .await
            .map_err(|e| e.context("measuring the twin's CPU"))?;
        let cpu_ratio = twin_cost.cpu_us_per_request / saved_cost.cpu_us_per_request.max(f64::MIN_POSITIVE);
        rows.push(CostRow { batch, saved_model: saved_cost, twin: twin_cost, cpu_ratio });
    }
    Ok(rows)
}

/// Why the twin does not verify; empty when it does.
fn problems(report: &Report) -> Vec<String> {
    let mut problems = Vec::new();
    for difference in &report.signature_differences {
        problems.push(format!("signature: {difference}"));
    }
    if report.twin_failure_count > 0 {
        problems.push(format!(
            "the twin failed {} request{} the SavedModel answered (first: {})",
            report.twin_failure_count,
            if report.twin_failure_count > 1 { "s" } else { "" },
            report.twin_failures.first().map_or("", String::as_str)
        ));
    }
    for output in report.outputs.iter().filter(|o| o.rows_over > 0) {
        problems.push(format!(
            "output '{}': {} of {} rows over tolerance (rtol {}, atol {}); first: {}",
            output.output,
            output.rows_over,
            output.rows,
            report.tolerance.rtol,
            report.tolerance.atol,
            output.first_over.as_deref().unwrap_or("?")
        ));
    }
    let compared = report.outputs.iter().find(|o| o.signature == report.signature).map_or(0, |o| o.rows);
    if compared == 0 && report.signature_differences.is_empty() && report.twin_failure_count == 0 {
        problems.push(format!(
            "no row was compared: {} requests failed in the SavedModel, and the others had no rows",
            report.requests.failed_in_saved_model
        ));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::spec::TensorSpec;

    #[test]
    fn synthetic_requests_fit_the_signature_and_strings_are_refused() {
        let signature = Signature {
            inputs: vec![
                TensorSpec::new("x", DType::F32, vec![-1, 3, 2]),
                TensorSpec::new("ids", DType::I64, vec![-1]),
                TensorSpec::new("h", DType::F16, vec![-1, -1]),
            ],
            outputs: vec![],
        };
        let requests = synthetic(&signature).unwrap();
        assert_eq!(requests.len(), SYNTHETIC_REQUESTS);
        assert_eq!(requests[1][0].shape(), &[8, 3, 2]);
        assert_eq!(requests[1][2].shape(), &[8, 1]);
        let ids = requests[1][1].to_vec::<i64>().unwrap();
        assert!(ids.iter().all(|&v| (0..10).contains(&v)), "{ids:?}");
        let floats = requests[1][0].to_vec::<f32>().unwrap();
        assert!(floats.iter().all(|v| (-2.0..2.0).contains(v)) && floats.iter().any(|&v| v != floats[0]));
        let strings = Signature { inputs: vec![TensorSpec::new("words", DType::String, vec![-1])], outputs: vec![] };
        let refused = synthetic(&strings).unwrap_err();
        assert!(
            refused.message().contains("input 'words' is DT_STRING") && refused.message().contains("--requests-from")
        );
    }

    #[test]
    fn the_newest_savedmodel_version_is_twinned_unless_one_is_named() {
        let base = tempfile::tempdir().unwrap();
        for (version, file) in
            [("1", SAVED_MODEL_FILE), ("3", SAVED_MODEL_FILE), ("4", "model.onnx"), ("x", SAVED_MODEL_FILE)]
        {
            std::fs::create_dir_all(base.path().join(version)).unwrap();
            std::fs::write(base.path().join(version).join(file), b"").unwrap();
        }
        assert_eq!(saved_model_version(base.path(), None).unwrap().0, 3);
        assert_eq!(saved_model_version(base.path(), Some(1)).unwrap().0, 1);
        let missing = saved_model_version(base.path(), Some(4)).unwrap_err();
        assert!(missing.message().contains("has no saved_model.pb"), "{missing}");
    }
}
