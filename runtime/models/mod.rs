//! The versions of models: loading one from its repository
//! ([`repository`]) off the serving path, on a thread of its own with a
//! bound on loads at once ([`Loader`]), warming it up ([`warmup`]), and
//! what each version is doing ([`status`]). Which versions serve requests,
//! and switching them while requests run, is the pipeline's `lifecycle`,
//! above this layer.

pub mod repository;
pub mod status;
pub mod storage;
pub mod tfrecord;
pub mod warmup;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use crate::config::{BatchingMode, ModelConfig};
use crate::error::{Error, Result};
use crate::infer::latency::LatencyCurve;
use crate::infer::onnx::optimized::CacheOutcome;
use crate::infer::onnx::OnnxBackend;
use crate::infer::tensorflow::{TensorflowBackend, SAVED_MODEL_FILE};
use crate::infer::tfserving::fleet::Fleet;
use crate::infer::tfserving::TfServingBackend;
use crate::infer::Backend;
use crate::metrics::Metrics;
use crate::tensor::spec::Signature;

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
    /// What its runs cost at each batch size, for the auto batcher.
    latency: LatencyCurve,
}

impl fmt::Display for ModelVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "model '{}' version {}", self.model, self.version)
    }
}

impl ModelVersion {
    /// Wraps a loaded backend.
    pub fn new(model: impl Into<Arc<str>>, version: i64, backend: Arc<dyn Backend>) -> ModelVersion {
        ModelVersion { model: model.into(), version, backend, latency: LatencyCurve::new() }
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

    /// What its runs have cost at each batch size: seeded by warmup,
    /// updated by the batcher after every batch.
    pub fn latency(&self) -> &LatencyCurve {
        &self.latency
    }
}

/// What loading a version needs besides the model's own config.
#[derive(Debug, Clone, Default)]
pub struct LoadSettings {
    /// The ONNX Runtime library, when not found automatically.
    pub library: Option<PathBuf>,
    /// TensorFlow's library, when not found automatically.
    pub tensorflow_library: Option<PathBuf>,
    /// Run warmup requests before the version serves.
    pub warmup: bool,
    /// How often each warmup request runs.
    pub warmup_iterations: usize,
    /// The largest tensor a warmup request may hold.
    pub max_tensor_bytes: usize,
    /// Where optimised graphs are cached, when they are.
    pub optimized_model_cache: Option<PathBuf>,
    /// Batches measured to cost at most this run on the caller's thread
    /// (`server.inline_inference_micros`); zero: never.
    pub inline_budget: std::time::Duration,
}

/// Loads versions off the serving path: each on a thread of its own, at
/// most `max_concurrent_loads` at once across every model, so loading a
/// large model never runs on the threads that answer requests and a burst
/// of new versions cannot take every core.
pub struct Loader {
    slots: Arc<Semaphore>,
    settings: LoadSettings,
    metrics: Arc<Metrics>,
}

impl Loader {
    /// A loader that runs at most `max_concurrent_loads` loads at once.
    pub fn new(max_concurrent_loads: usize, settings: LoadSettings, metrics: Arc<Metrics>) -> Loader {
        Loader { slots: Arc::new(Semaphore::new(max_concurrent_loads.max(1))), settings, metrics }
    }

    /// Waits for a loading slot; `on_start` runs once it has one (the
    /// version turns LOADING), then loads and warms up the version from
    /// `source`.
    pub async fn load(
        &self,
        config: &ModelConfig,
        version: i64,
        source: Source,
        on_start: impl FnOnce(),
    ) -> Result<Arc<ModelVersion>> {
        let _slot = self.slots.acquire().await.map_err(|_| Error::unavailable("the model loader is shut down"))?;
        on_start();
        let file = match source {
            Source::File(file) => file,
            Source::Upstream(fleet) => return self.connect(config, version, fleet).await.map(Arc::new),
        };
        let (config, settings, metrics) = (config.clone(), self.settings.clone(), self.metrics.clone());
        let runtime = tokio::runtime::Handle::current();
        let (done, result) = tokio::sync::oneshot::channel();
        crate::threads::spawn_compute(format!("load-{version}"), move || {
            let _ = done.send(load_version(&config, version, &file, &settings, &metrics, &runtime));
        })
        .map_err(|e| Error::internal(format!("starting a loading thread failed: {e}")))?;
        let loaded = result.await.map_err(|_| Error::internal("the loading thread panicked"))??;
        Ok(Arc::new(loaded))
    }
}

impl Loader {
    /// A version served by upstreams: its signature read from them, then
    /// warmed up through them (which also opens the connections).
    async fn connect(&self, config: &ModelConfig, version: i64, fleet: Arc<Fleet>) -> Result<ModelVersion> {
        let label = format!("model '{}' version {version}", config.name);
        let started = Instant::now();
        let backend = TfServingBackend::connect(fleet, version, &label).await?;
        let loaded = ModelVersion::new(config.name.clone(), version, Arc::new(backend));
        self.metrics.lifecycle(&config.name).load_seconds.observe(started.elapsed().as_secs_f64());
        tracing::info!(model = %config.name, version, "upstream version connected");
        if self.settings.warmup {
            // Through the upstreams, which also opens the connections.
            warm_up(&loaded, config, None, &self.settings, &self.metrics).await?;
        }
        Ok(loaded)
    }
}

/// Where a version comes from.
#[derive(Clone)]
pub enum Source {
    /// Its `model.onnx` or `saved_model.pb` in the repository.
    File(PathBuf),
    /// The upstream TF Serving instances that serve it.
    Upstream(Arc<Fleet>),
}

/// Loads one version and warms it up. Blocking: it parses and optimises
/// the graph and waits on warmup runs; call it on a thread of its own.
pub fn load_version(
    config: &ModelConfig,
    version: i64,
    file: &Path,
    settings: &LoadSettings,
    metrics: &Metrics,
    runtime: &tokio::runtime::Handle,
) -> Result<ModelVersion> {
    let label = format!("model '{}' version {version}", config.name);
    let started = Instant::now();
    let dir = file.parent().unwrap_or(Path::new("."));
    let loaded = load_backend(config, version, file, dir, &label, settings, metrics);
    // TensorFlow's loader counts each attempt by the version's directory.
    let model_path = dir.display().to_string();
    metrics.tf_serving.record_load(&model_path, loaded.is_ok(), started.elapsed().as_secs_f64());
    let (backend, cache) = loaded?;
    let loaded = ModelVersion::new(config.name.clone(), version, backend);
    let load_seconds = started.elapsed().as_secs_f64();
    metrics.lifecycle(&config.name).load_seconds.observe(load_seconds);
    metrics.optimized_model_cache.get_or_create(&crate::metrics::OutcomeLabels { outcome: cache }).inc();
    tracing::info!(model = %config.name, version, elapsed_ms = load_seconds * 1e3, optimized_model_cache = cache, "loaded");
    if settings.warmup {
        runtime.block_on(warm_up(&loaded, config, Some(dir), settings, metrics))?;
    }
    Ok(loaded)
}

/// The backend of the version in `file` (a SavedModel's `saved_model.pb`
/// or a `model.onnx`), and what the optimised-graph cache did.
fn load_backend(
    config: &ModelConfig,
    version: i64,
    file: &Path,
    dir: &Path,
    label: &str,
    settings: &LoadSettings,
    metrics: &Metrics,
) -> Result<(Arc<dyn Backend>, &'static str)> {
    Ok(if file.file_name().is_some_and(|n| n == SAVED_MODEL_FILE) {
        if config.onnx.high_priority_sessions > 0 {
            tracing::warn!(
                model = %config.name,
                version,
                "onnx.high_priority_sessions = {} applies to ONNX Runtime versions; this one is a SavedModel, whose \
                 high-priority batches share its TensorFlow run threads",
                config.onnx.high_priority_sessions
            );
        }
        let backend = TensorflowBackend::load(
            dir,
            label,
            &config.tensorflow,
            settings.tensorflow_library.as_deref(),
            metrics.model(&config.name, version),
            settings.inline_budget,
        )?;
        (Arc::new(backend), "off")
    } else {
        let backend = OnnxBackend::load(
            file,
            label,
            &config.onnx,
            settings.library.as_deref(),
            metrics.model(&config.name, version),
            settings.optimized_model_cache.as_deref(),
            settings.inline_budget,
        )?;
        let cache = match backend.cache_outcome() {
            Some(CacheOutcome::Hit) => "hit",
            Some(CacheOutcome::Miss) => "miss",
            None => "off",
        };
        (Arc::new(backend), cache)
    })
}

/// Runs `loaded`'s warmup requests (its directory's TF Serving warmup
/// file, or zeros at each batch size it runs), timed and logged.
async fn warm_up(
    loaded: &ModelVersion,
    config: &ModelConfig,
    version_dir: Option<&Path>,
    settings: &LoadSettings,
    metrics: &Metrics,
) -> Result<()> {
    let (max_tensor_bytes, iterations) = (settings.max_tensor_bytes, settings.warmup_iterations);
    let context = |e: Error| e.context(format_args!("warmup of {loaded}"));
    let started = Instant::now();
    let (requests, source) =
        warmup::requests(loaded, version_dir, config.examples.as_ref(), &batch_sizes(config), max_tensor_bytes)
            .map_err(context)?;
    let count = requests.len();
    // Only the auto batcher plans with the latency curve warmup can seed.
    let learn = config.batching.as_ref().is_some_and(|params| params.mode == BatchingMode::Auto);
    let warmed = warmup::run(loaded, requests, iterations, learn).await;
    if let Some(dir) = version_dir {
        // TF Serving's status words: "OK", or the error.
        let status = warmed.as_ref().map_or_else(|e| e.to_string(), |()| "OK".to_string());
        metrics.tf_serving.record_warmup(&dir.display().to_string(), status, started.elapsed().as_secs_f64());
    }
    warmed.map_err(context)?;
    metrics.lifecycle(&config.name).warmup_seconds.observe(started.elapsed().as_secs_f64());
    tracing::info!(
        model = %config.name,
        version = loaded.version(),
        requests = count,
        from = %source,
        elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
        "warmed up"
    );
    Ok(())
}

/// The batch sizes a version runs: the allowed ones when batching pads to
/// them; under auto batching, 1, 2, 4, … up to the largest batch, which
/// seeds the curve the batcher plans with; else 1 and the largest batch;
/// 1 when it does not batch.
pub fn batch_sizes(config: &ModelConfig) -> Vec<usize> {
    match &config.batching {
        None => vec![1],
        Some(params) if !params.allowed_batch_sizes.is_empty() => params.allowed_batch_sizes.clone(),
        Some(params) if params.mode == BatchingMode::Auto => {
            let max = params.max_batch_size.max(1);
            std::iter::successors(Some(1usize), |&n| n.checked_mul(2))
                .take_while(|&n| n < max)
                .chain(std::iter::once(max))
                .collect()
        }
        Some(params) => {
            let mut sizes = vec![1, params.max_batch_size.max(1)];
            sizes.dedup();
            sizes
        }
    }
}

/// Where a model's versions are, for messages.
pub fn place_of(config: &ModelConfig) -> String {
    match &config.upstream {
        Some(upstream) => format!("the upstreams {:?}", upstream.endpoints),
        None => storage::shown(&config.base_path.display().to_string()),
    }
}

/// Every version `config`'s policy selects, loaded and warmed up one after
/// another: for the command-line tools, which need a model's signature and
/// nothing that serves.
pub async fn load_selected(
    config: &ModelConfig,
    library: Option<&Path>,
    storage: &crate::config::StorageConfig,
    metrics: &Arc<Metrics>,
) -> Result<Vec<Arc<ModelVersion>>> {
    let context = |e: Error| e.context(format_args!("model '{}'", config.name));
    let found: std::collections::BTreeMap<i64, Source> = match &config.upstream {
        Some(upstream) => {
            let fleet = Fleet::start(&config.name, upstream, metrics)?;
            fleet.versions().await.map_err(context)?.into_iter().map(|v| (v, Source::Upstream(fleet.clone()))).collect()
        }
        None if crate::config::is_object_store_url(&config.base_path) => {
            let storage = storage::Storage::new(storage, metrics.clone());
            let repository = storage.repository(&config.name, &config.base_path).map_err(context)?;
            let settle = Duration::from_secs(1);
            let found = repository.discover(&Default::default(), &config.version_policy, true, settle).await;
            found.map_err(context)?.versions.into_iter().map(|(v, file)| (v, Source::File(file))).collect()
        }
        None => repository::discover(&config.base_path)
            .map_err(context)?
            .into_iter()
            .map(|(v, file)| (v, Source::File(file)))
            .collect(),
    };
    let chosen = repository::select(&found, &config.version_policy, &place_of(config)).map_err(context)?;
    let defaults = crate::config::Config::default();
    let settings = LoadSettings {
        library: library.map(Path::to_path_buf),
        tensorflow_library: None,
        warmup: true,
        warmup_iterations: 1,
        max_tensor_bytes: defaults.server.max_tensor_bytes,
        optimized_model_cache: defaults.lifecycle.optimized_model_cache(),
        inline_budget: std::time::Duration::from_micros(defaults.server.inline_inference_micros),
    };
    let loader = Loader::new(1, settings, metrics.clone());
    let mut versions = Vec::with_capacity(chosen.len());
    for (version, file) in chosen {
        versions.push(loader.load(config, version, file, || ()).await?);
    }
    Ok(versions)
}
