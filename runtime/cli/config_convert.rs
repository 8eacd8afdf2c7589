//! `sluice config convert`: TF Serving's text config files (`models.config`,
//! `--batching_parameters_file`, `--monitoring_config_file`) turned into
//! one sluice TOML file, so a team moving over keeps one file to edit and
//! can then add what only TOML says (per-model batching, threads,
//! `max_in_flight`, the `tf.Example` mapping, pipelines).
//!
//! Everything TF Serving's files say is carried over: each model's name,
//! base path (made absolute, as TF Serving resolves it), version policy,
//! labels and request logging; the batching parameters, which TF Serving
//! applies to every model under `--enable_batching`, as each model's
//! `batching` table; the monitoring path as `server.metrics_path`.

use std::path::{Path, PathBuf};

use clap::Args;
use toml::{Table, Value};

use crate::config::{tf_model_config, BatchingParameters, ModelConfig, VersionPolicy};
use crate::error::{Error, Result};

/// `sluice config convert`'s flags, TF Serving's names.
#[derive(Args)]
pub struct ConvertArgs {
    /// TF Serving's `ModelServerConfig` in text format.
    #[arg(long = "model_config_file")]
    pub model_config_file: PathBuf,
    /// TF Serving's batching parameters (text format), given to every
    /// model as with `--enable_batching`.
    #[arg(long = "batching_parameters_file")]
    pub batching_parameters_file: Option<PathBuf>,
    /// TF Serving's `MonitoringConfig` (text format).
    #[arg(long = "monitoring_config_file")]
    pub monitoring_config_file: Option<PathBuf>,
}

/// The TOML text the files describe.
pub fn convert(args: &ConvertArgs) -> Result<String> {
    let read = |path: &Path| {
        std::fs::read_to_string(path)
            .map_err(|e| Error::invalid_argument(format!("cannot read {}: {e}", path.display())))
    };
    let text = read(&args.model_config_file)?;
    let dir = args.model_config_file.parent().unwrap_or(Path::new("."));
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let models = tf_model_config::parse(&text, &dir)
        .map_err(|e| Error::invalid_argument(format!("{}: {}", args.model_config_file.display(), e.0)))?;
    let batching = args
        .batching_parameters_file
        .as_deref()
        .map(BatchingParameters::from_file)
        .transpose()
        .map_err(|e| Error::invalid_argument(e.to_string()))?;
    let mut root = Table::new();
    if let Some(path) = &args.monitoring_config_file {
        let metrics_path = tf_model_config::prometheus_path(&read(path)?)
            .map_err(|e| Error::invalid_argument(format!("{}: {}", path.display(), e.0)))?;
        if let Some(metrics_path) = metrics_path {
            root.insert(
                "server".into(),
                Value::Table(Table::from_iter([("metrics_path".into(), metrics_path.into())])),
            );
        }
    }
    let models: Vec<Value> = models.iter().map(|model| Value::Table(model_table(model, batching.as_ref()))).collect();
    root.insert("models".into(), Value::Array(models));
    let body = toml::to_string(&root).map_err(|e| Error::internal(format!("writing TOML: {e}")))?;
    Ok(format!(
        "# Converted by `sluice config convert` from {}{}{}.\n\
         # TOML adds what TF Serving's files cannot say, per model: max_in_flight,\n\
         # batching (or batching = {{ mode = \"auto\" }}), onnx / tensorflow threads,\n\
         # examples (tf.Example inputs), cache, quota, canary; and pipelines.\n\
         # docs/CONFIG.md lists every key.\n\n{body}",
        args.model_config_file.display(),
        args.batching_parameters_file.as_ref().map_or(String::new(), |p| format!(", {}", p.display())),
        args.monitoring_config_file.as_ref().map_or(String::new(), |p| format!(", {}", p.display())),
    ))
}

/// One `[[models]]` table.
fn model_table(model: &ModelConfig, batching: Option<&BatchingParameters>) -> Table {
    let mut table = Table::new();
    table.insert("name".into(), model.name.clone().into());
    table.insert("base_path".into(), model.base_path.display().to_string().into());
    let policy: Value = match &model.version_policy {
        VersionPolicy::Latest(1) => "latest".into(),
        VersionPolicy::Latest(n) => Value::Table(Table::from_iter([("latest".into(), (*n as i64).into())])),
        VersionPolicy::All => "all".into(),
        VersionPolicy::Specific(versions) => Value::Table(Table::from_iter([(
            "specific".into(),
            Value::Array(versions.iter().map(|&v| v.into()).collect()),
        )])),
    };
    table.insert("version_policy".into(), policy);
    if !model.version_labels.is_empty() {
        let labels = model.version_labels.iter().map(|(label, &version)| (label.clone(), version.into()));
        table.insert("version_labels".into(), Value::Table(labels.collect()));
    }
    if let Some(logging) = &model.logging {
        let mut log = Table::new();
        log.insert("type".into(), logging.collector.clone().into());
        log.insert("filename_prefix".into(), logging.filename_prefix.display().to_string().into());
        log.insert("sampling_rate".into(), logging.sampling_rate.into());
        table.insert("logging".into(), Value::Table(log));
    }
    if let Some(params) = batching {
        let mut batch = Table::new();
        batch.insert("max_batch_size".into(), (params.max_batch_size as i64).into());
        if let Some(micros) = params.batch_timeout_micros {
            batch.insert("batch_timeout_micros".into(), (micros as i64).into());
        }
        batch.insert("max_enqueued_batches".into(), (params.max_enqueued_batches as i64).into());
        batch.insert("num_batch_threads".into(), (params.num_batch_threads as i64).into());
        if !params.allowed_batch_sizes.is_empty() {
            let sizes = params.allowed_batch_sizes.iter().map(|&s| Value::from(s as i64)).collect();
            batch.insert("allowed_batch_sizes".into(), Value::Array(sizes));
        }
        table.insert("batching".into(), Value::Table(batch));
    }
    table
}
