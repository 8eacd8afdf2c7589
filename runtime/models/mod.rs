//! The models being served: loading them from their repositories, warming
//! them up, and resolving a client's model spec (name, version or label) to
//! one loaded version. What runs a request through a version (the batcher,
//! deadlines) is the pipeline's inference stage, above this layer.

pub mod repository;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::infer::onnx::OnnxBackend;
use crate::infer::{Backend, Batch};
use crate::metrics::Metrics;
use crate::tensor::spec::Signature;
use crate::tensor::Tensor;

/// Which version a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionChoice<'a> {
    /// The highest version loaded.
    Latest,
    /// A version number.
    Number(i64),
    /// A version label from the config.
    Label(&'a str),
}

/// One loaded version of a model.
pub struct ModelVersion {
    // Shared, not copied, into every request's metric labels.
    model: Arc<str>,
    version: i64,
    backend: Arc<dyn Backend>,
}

impl fmt::Display for ModelVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "model '{}' version {}", self.model, self.version)
    }
}

impl ModelVersion {
    /// Wraps a loaded backend.
    pub fn new(model: impl Into<Arc<str>>, version: i64, backend: Arc<dyn Backend>) -> ModelVersion {
        ModelVersion { model: model.into(), version, backend }
    }

    /// The model's name.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The model's name, shared.
    pub fn model_label(&self) -> Arc<str> {
        self.model.clone()
    }

    /// The version number.
    pub fn version(&self) -> i64 {
        self.version
    }

    /// Inputs and outputs.
    pub fn signature(&self) -> &Signature {
        self.backend.signature()
    }

    /// The backend that runs this version.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Runs zeros of batch 1 through the model, so the first client request
    /// does not pay for ONNX Runtime's lazy initialisation.
    async fn warm_up(&self) -> Result<()> {
        let inputs = self
            .signature()
            .inputs
            .iter()
            .map(|spec| {
                let shape = spec.shape.iter().map(|&d| if d < 0 { 1 } else { d }).collect();
                Tensor::zeros(spec.dtype, shape)
            })
            .collect::<Result<Vec<_>>>()?;
        let started = Instant::now();
        self.backend
            .run(Batch::single(inputs))
            .await
            .map_err(|e| e.context(format_args!("warm-up of {self} failed")))?;
        tracing::info!(model = %self.model, version = self.version, elapsed_ms = started.elapsed().as_secs_f64() * 1e3, "warmed up");
        Ok(())
    }
}

/// A model and its loaded versions.
pub struct ServedModel {
    name: Arc<str>,
    versions: BTreeMap<i64, Arc<ModelVersion>>,
    labels: BTreeMap<String, i64>,
}

impl ServedModel {
    /// The model's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The model's name, shared (metric labels).
    pub fn name_label(&self) -> Arc<str> {
        self.name.clone()
    }

    /// Loaded versions, lowest first.
    pub fn versions(&self) -> impl Iterator<Item = &Arc<ModelVersion>> {
        self.versions.values()
    }

    /// The highest loaded version.
    pub fn latest(&self) -> Result<&Arc<ModelVersion>> {
        self.resolve(VersionChoice::Latest)
    }

    /// The version a request asks for.
    pub fn resolve(&self, choice: VersionChoice<'_>) -> Result<&Arc<ModelVersion>> {
        let loaded = || self.versions.keys().map(i64::to_string).collect::<Vec<_>>().join(", ");
        match choice {
            VersionChoice::Latest => self
                .versions
                .values()
                .next_back()
                .ok_or_else(|| Error::not_found(format!("model '{}' has no version loaded", self.name))),
            VersionChoice::Number(v) => self.versions.get(&v).ok_or_else(|| {
                Error::not_found(format!(
                    "model '{}' has no version {v} loaded; loaded versions: {}",
                    self.name,
                    loaded()
                ))
            }),
            VersionChoice::Label(label) => {
                // TF Serving: "Unrecognized servable version label",
                // INVALID_ARGUMENT (400 over REST).
                let v = self.labels.get(label).ok_or_else(|| {
                    let labels: Vec<&str> = self.labels.keys().map(String::as_str).collect();
                    Error::invalid_argument(format!(
                        "model '{}' has no version label '{label}'; labels: [{}]",
                        self.name,
                        labels.join(", ")
                    ))
                })?;
                self.versions.get(v).ok_or_else(|| {
                    Error::not_found(format!(
                        "label '{label}' of model '{}' points at version {v}, which is not loaded",
                        self.name
                    ))
                })
            }
        }
    }
}

/// Every model the server serves, by name.
#[derive(Default)]
pub struct ModelRegistry {
    models: BTreeMap<String, Arc<ServedModel>>,
}

impl ModelRegistry {
    /// Loads every configured model and warms each version up. Any failure
    /// stops the start: a server that silently lacks a model is worse than
    /// one that does not start.
    pub async fn load(configs: &[ModelConfig], library: Option<&Path>, metrics: &Metrics) -> Result<ModelRegistry> {
        let mut models = BTreeMap::new();
        for config in configs {
            let model = load_model(config, library, metrics).await?;
            models.insert(config.name.clone(), Arc::new(model));
        }
        Ok(ModelRegistry { models })
    }

    /// The model called `name`.
    pub fn get(&self, name: &str) -> Result<&Arc<ServedModel>> {
        self.models.get(name).ok_or_else(|| {
            let names: Vec<&str> = self.models.keys().map(String::as_str).collect();
            Error::not_found(format!("model '{name}' is not served; served models: [{}]", names.join(", ")))
        })
    }

    /// Every model, by name.
    pub fn models(&self) -> impl Iterator<Item = &Arc<ServedModel>> {
        self.models.values()
    }
}

async fn load_model(config: &ModelConfig, library: Option<&Path>, metrics: &Metrics) -> Result<ServedModel> {
    let context = |e: Error| e.context(format_args!("model '{}'", config.name));
    let found = repository::discover(&config.base_path).map_err(context)?;
    let chosen = repository::select(&found, &config.version_policy, &config.base_path).map_err(context)?;
    let mut versions = BTreeMap::new();
    for (version, path) in chosen {
        let label = format!("model '{}' version {version}", config.name);
        let options = config.onnx.clone();
        let library = library.map(Path::to_path_buf);
        let started = Instant::now();
        let model_metrics = metrics.model(&config.name, version);
        // Session creation parses and optimises the graph: blocking work.
        let backend: Arc<dyn Backend> = Arc::new(
            tokio::task::spawn_blocking(move || {
                OnnxBackend::load(&path, &label, &options, library.as_deref(), model_metrics)
            })
            .await
            .map_err(|e| Error::internal(format!("loading task failed: {e}")))??,
        );
        let loaded = ModelVersion::new(config.name.clone(), version, backend);
        tracing::info!(model = %config.name, version, elapsed_ms = started.elapsed().as_secs_f64() * 1e3, "loaded");
        loaded.warm_up().await?;
        versions.insert(version, Arc::new(loaded));
    }
    for (label, version) in &config.version_labels {
        if !versions.contains_key(version) {
            let loaded: Vec<String> = versions.keys().map(i64::to_string).collect();
            return Err(Error::invalid_argument(format!(
                "model '{}': version_labels.{label} = {version}, but version {version} is not loaded (loaded: {})",
                config.name,
                loaded.join(", ")
            )));
        }
    }
    Ok(ServedModel { name: config.name.as_str().into(), versions, labels: config.version_labels.clone() })
}
