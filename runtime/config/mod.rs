//! The configuration file (TOML) and its checks.
//!
//! One file describes the server and everything it serves; TF Serving's own
//! `--model_config_file` (a `ModelServerConfig` in protobuf text format) is
//! read too ([`tf_model_config`]). Unknown keys are
//! refused (`deny_unknown_fields`), and every error names the file, the key,
//! the value and what is allowed. Relative paths in the file are relative
//! to the file's own directory, so a config works from any working
//! directory.

pub mod admin;
pub mod batching;
pub mod examples;
pub mod features;
pub mod graph;
pub mod lifecycle;
pub mod logging;
pub mod model;
pub mod onnx;
pub mod plugins;
pub mod redis_access;
pub mod server;
pub mod stage;
pub mod storage;
pub mod telemetry;
pub mod tensorflow;
pub mod tf_model_config;
pub mod tls;
pub mod traffic;
pub mod upstream;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use crate::error::{ConfigError, Invalid};
use crate::invalid;

pub use self::admin::{AdminConfig, Role, TokenConfig};
pub use self::batching::{BatchingMode, BatchingParameters};
pub use self::examples::ExamplesConfig;
pub use self::features::{FeatureFetchConfig, FeaturesConfig};
pub use self::graph::{GraphInput, ModelStep, StepAction, StepConfig};
pub use self::lifecycle::{LifecycleConfig, ModelDefaults};
pub use self::logging::LoggingConfig;
pub use self::model::{check_models, ModelConfig, VersionPolicy};
pub use self::onnx::OnnxOptions;
pub use self::plugins::{InstancePolicy, PluginLimits, PluginsConfig};
pub use self::server::{GrpcThreads, OutputEncoding, ServerConfig, DEFAULT_INLINE_INFERENCE_MICROS};
pub use self::stage::{StageConfig, StageKind, StageRole};
pub use self::storage::{is_object_store_url, StorageConfig};
pub use self::telemetry::TracingConfig;
pub use self::tls::TlsConfig;
pub use self::traffic::{CacheConfig, CanaryPolicy, ModelCanary, QuotaConfig, TrafficConfig};
pub use self::upstream::UpstreamConfig;

/// Everything the server is configured with.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Listening addresses and protocol limits.
    #[serde(default)]
    pub server: ServerConfig,
    /// Where the ONNX Runtime library is.
    #[serde(default)]
    pub onnxruntime: OnnxRuntimeConfig,
    /// Where TensorFlow's library is (for SavedModels).
    #[serde(default)]
    pub tensorflow: tensorflow::TensorflowConfig,
    /// The models served; each is reachable under its own name.
    #[serde(default)]
    pub models: Vec<ModelConfig>,
    /// Pipelines: names clients call that run stages around a model.
    #[serde(default)]
    pub pipelines: Vec<PipelineConfig>,
    /// WebAssembly plugins: where they are and their limits.
    #[serde(default)]
    pub plugins: PluginsConfig,
    /// The plugin admin API and who may use it.
    #[serde(default)]
    pub admin: AdminConfig,
    /// Feature tables that pipelines fetch from.
    #[serde(default)]
    pub features: FeaturesConfig,
    /// Repository polling, warmup and config reloads.
    #[serde(default)]
    pub lifecycle: LifecycleConfig,
    /// Model repositories in object storage (s3://, gs://, az://, http(s)://).
    #[serde(default)]
    pub storage: StorageConfig,
    /// OpenTelemetry traces of requests; off unless an endpoint is given.
    #[serde(default)]
    pub tracing: TracingConfig,
    /// Priorities, team quotas and canary rollbacks.
    #[serde(default)]
    pub traffic: TrafficConfig,
}

/// A pipeline: the name clients call, its model, and its stages.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// The name clients put in `model_spec.name`. It may be a model's name,
    /// which the pipeline then replaces for clients.
    pub name: String,
    /// The model it runs.
    pub model: String,
    /// `pipelined` (stages on their own threads) or `sequential`.
    #[serde(default)]
    pub mode: Mode,
    /// Requests admitted at once; more are refused with RESOURCE_EXHAUSTED.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// The most queueing an admitted request should meet (see the model's
    /// key of the same name); unset: its model's.
    pub max_queue_wait_ms: Option<u64>,
    /// The team that owns it: that team's admin tokens may upload and
    /// activate the plugins it runs. Unset: only admin tokens may.
    pub team: Option<String>,
    /// The first stage: features fetched by the keys a request gives.
    pub feature_fetch: Option<FeatureFetchConfig>,
    /// The stage before the model.
    pub preprocess: Option<StageConfig>,
    /// The stage after the model.
    pub postprocess: Option<StageConfig>,
    /// Its response cache; off when absent.
    pub cache: Option<CacheConfig>,
    /// Its own rate (and concurrency) quota, besides its team's.
    pub quota: Option<QuotaConfig>,
    /// The input whose value keeps a caller on one side of a plugin
    /// canary (a user id): the same value, the same version. Unset: each
    /// request is dealt at random.
    pub canary_key: Option<String>,
    /// How `tf.Example`s fill its inputs (Classify, Regress, MultiInference,
    /// Predict's `examples` input); refused when absent.
    pub examples: Option<ExamplesConfig>,
    /// A graph of steps (models, built-ins, plugins) in place of
    /// preprocess → model → postprocess; see [`graph`].
    #[serde(default)]
    pub steps: Vec<StepConfig>,
    /// With `steps`: the tensors clients send.
    #[serde(default)]
    pub inputs: Vec<GraphInput>,
    /// With `steps`: the tensors it answers with, in this order.
    #[serde(default)]
    pub outputs: Vec<String>,
}

/// How a pipeline runs its stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Each stage on its own queue and threads; stages of different
    /// requests overlap.
    #[default]
    Pipelined,
    /// The stages one after another in the caller's task: the baseline the
    /// gain of pipelining is measured against.
    Sequential,
}

impl PipelineConfig {
    /// Its stages, in the order a request passes them.
    pub fn stages(&self) -> impl Iterator<Item = (StageRole, &StageConfig)> {
        [(StageRole::Preprocess, &self.preprocess), (StageRole::Postprocess, &self.postprocess)]
            .into_iter()
            .filter_map(|(role, stage)| stage.as_ref().map(|s| (role, s)))
    }

    /// True when a stage or a step runs a plugin.
    pub fn uses_plugins(&self) -> bool {
        self.stages()
            .map(|(_, stage)| stage)
            .chain(self.steps.iter().filter_map(StepConfig::stage))
            .any(|stage| matches!(stage.kind(), Some(StageKind::Plugin(_))))
    }

    /// True when it is a graph of steps.
    pub fn is_graph(&self) -> bool {
        !self.steps.is_empty()
    }

    /// Every model it runs: its own and each model step's.
    pub fn models(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.model.as_str())
            .chain(self.steps.iter().filter_map(|s| s.model()).map(|m| m.model.as_str()))
    }
}

/// Where the ONNX Runtime library is.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnnxRuntimeConfig {
    /// Path of `libonnxruntime.so.*`; found automatically when unset.
    pub library: Option<PathBuf>,
}

/// The most threads one setting may start.
pub(crate) const MAX_THREADS: usize = 1024;

/// The most places one queue, semaphore, admission or connection table
/// may count (and the most rows of one batch): far above any real load.
pub(crate) const MAX_COUNT: usize = 1 << 20;

/// Refuses a count above `max`: counts size semaphores (which panic past
/// 2^61 permits), preallocated queues and thread pools, so an absurd one
/// must stop at the config check, named, not abort the start.
pub(crate) fn check_at_most(key: &str, value: usize, max: usize) -> Result<(), Invalid> {
    if value > max {
        return Err(invalid!("{key} = {value}: must be at most {max}"));
    }
    Ok(())
}

/// Refuses a count outside `min..=max`, for the same reason as
/// [`check_at_most`], where 0 means nothing would ever run.
pub(crate) fn check_between(key: &str, value: usize, min: usize, max: usize) -> Result<(), Invalid> {
    if value < min || value > max {
        return Err(invalid!("{key} = {value}: must be between {min} and {max}"));
    }
    Ok(())
}

pub(crate) fn default_max_in_flight() -> usize {
    1024
}

impl Config {
    /// Reads and checks a config file.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let source = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError { source: source.clone(), message: format!("cannot read the file: {e}") })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Config::from_text(&text, &source, base)
    }

    /// Parses and checks config text in either format: TF Serving's
    /// `ModelServerConfig` text format or sluice's TOML.
    pub fn from_text(text: &str, source: &str, base: &Path) -> Result<Config, ConfigError> {
        if tf_model_config::is_text_format(text) {
            // TF Serving's ModelServerConfig, brought unchanged.
            let models = tf_model_config::parse(text, base).map_err(|e| e.in_file(source))?;
            let config = Config { models, ..Config::default() };
            config.check().map_err(|e| e.in_file(source))?;
            return Ok(config);
        }
        Config::from_toml(text, source, base)
    }

    /// Parses and checks config text; relative paths are taken from `base`.
    pub fn from_toml(text: &str, source: &str, base: &Path) -> Result<Config, ConfigError> {
        let error = |message: String| ConfigError { source: source.to_string(), message };
        let mut config: Config = toml::from_str(text).map_err(|e| error(e.to_string().trim_end().to_string()))?;
        for model in &mut config.models {
            if model.upstream.is_none() && model.base_path.is_relative() && !is_object_store_url(&model.base_path) {
                model.base_path = base.join(&model.base_path);
            }
            if let Some(tls) = model.upstream.as_mut().and_then(|u| u.tls.as_mut()) {
                tls.resolve(base);
            }
            if let Some(logging) = &mut model.logging {
                if logging.filename_prefix.is_relative() && !is_object_store_url(&logging.filename_prefix) {
                    logging.filename_prefix = base.join(&logging.filename_prefix);
                }
            }
        }
        for pipeline in &mut config.pipelines {
            let steps = pipeline.steps.iter_mut().filter_map(|step| match &mut step.action {
                StepAction::Stage(stage) => Some(stage),
                StepAction::Model(_) => None,
            });
            for stage in [&mut pipeline.preprocess, &mut pipeline.postprocess].into_iter().flatten().chain(steps) {
                for path in stage.paths_mut() {
                    if path.is_relative() {
                        *path = base.join(&*path);
                    }
                }
            }
        }
        for file in config.features.tables.values_mut().filter_map(|t| t.file.as_mut()) {
            if file.is_relative() {
                *file = base.join(&*file);
            }
        }
        for dir in [&mut config.plugins.dir, &mut config.plugins.cache_dir].into_iter().flatten() {
            if dir.is_relative() {
                *dir = base.join(&*dir);
            }
        }
        if let Some(tls) = &mut config.server.tls {
            tls.resolve(base);
        }
        if let Some(redis) = &mut config.features.redis {
            let mut access = redis.access();
            access.resolve(base);
            (redis.password_file, redis.tls) = (access.password_file, access.tls);
        }
        if let Some(shared) = &mut config.plugins.shared {
            let mut access = shared.access();
            access.resolve(base);
            (shared.password_file, shared.tls) = (access.password_file, access.tls);
        }
        if let Some(library) = &mut config.onnxruntime.library {
            if library.is_relative() {
                *library = base.join(&*library);
            }
        }
        config.check().map_err(|e| e.in_file(source))?;
        Ok(config)
    }

    /// Checks what the types alone cannot: names, ranges, references.
    pub fn check(&self) -> Result<(), Invalid> {
        if self.lifecycle.max_concurrent_loads == 0 {
            return Err(invalid!(
                "lifecycle.max_concurrent_loads = 0: must be at least 1, or no version would ever load"
            ));
        }
        check_at_most("lifecycle.max_concurrent_loads", self.lifecycle.max_concurrent_loads, MAX_THREADS)?;
        check_between("lifecycle.warmup_iterations", self.lifecycle.warmup_iterations, 1, 1000)?;
        check_between("storage.max_concurrent_downloads", self.storage.max_concurrent_downloads, 1, 256)?;
        if !(self.storage.cache_max_gib > 0.0 && self.storage.cache_max_gib.is_finite()) {
            return Err(invalid!(
                "storage.cache_max_gib = {}: expected a positive number of GiB",
                self.storage.cache_max_gib
            ));
        }
        if let Some(rate) = self.storage.max_download_mib_per_sec.filter(|r| !(*r > 0.0 && r.is_finite())) {
            return Err(invalid!("storage.max_download_mib_per_sec = {rate}: expected a positive number, or no key"));
        }
        if let Some(marker) = self.storage.completion_marker.as_deref().filter(|m| m.is_empty() || m.contains('/')) {
            return Err(invalid!(
                "storage.completion_marker = {marker:?}: expected the name of an object in each version's directory"
            ));
        }
        check_between("storage.request_timeout_secs", self.storage.request_timeout_secs as usize, 1, 3600)?;
        check_at_most("lifecycle.max_load_retries", self.lifecycle.max_load_retries as usize, 1000)?;
        if self.lifecycle.load_retry_interval_ms < 10 {
            return Err(invalid!(
                "lifecycle.load_retry_interval_ms = {}: expected at least 10",
                self.lifecycle.load_retry_interval_ms
            ));
        }
        for (key, value) in [
            ("server.max_connections", self.server.max_connections),
            ("server.max_concurrent_streams", self.server.max_concurrent_streams as usize),
        ] {
            if value == 0 {
                return Err(invalid!("{key} = 0: must be at least 1"));
            }
            check_at_most(key, value, MAX_COUNT)?;
        }
        check_between("server.compute_nice", self.server.compute_nice, 0, 19)?;
        if let Some(age) = self.server.max_connection_age_ms {
            if age < 100 {
                return Err(invalid!(
                    "server.max_connection_age_ms = {age}: expected at least 100 (a connection must live long \
                     enough to serve); leave it unset for no limit"
                ));
            }
        }
        self.tracing.check()?;
        self.traffic.check()?;
        if let Some(tls) = &self.server.tls {
            tls.check()?;
        }
        check_at_most(
            "server.inline_inference_micros",
            usize::try_from(self.server.inline_inference_micros).unwrap_or(usize::MAX),
            server::MAX_INLINE_INFERENCE_MICROS,
        )?;
        let names = check_models(&self.models)?;
        let mut endpoint_names = HashSet::new();
        for (i, pipeline) in self.pipelines.iter().enumerate() {
            let key = format!("pipelines[{i}]");
            check_name(&format!("{key}.name"), &pipeline.name)?;
            if !endpoint_names.insert(pipeline.name.as_str()) {
                return Err(invalid!("{key}.name = \"{}\": another pipeline has the same name", pipeline.name));
            }
            if !names.contains(pipeline.model.as_str()) {
                let models: Vec<&str> = self.models.iter().map(|m| m.name.as_str()).collect();
                return Err(invalid!("{key}.model = \"{}\": no such model; models: {models:?}", pipeline.model));
            }
            check_between(&format!("{key}.max_in_flight"), pipeline.max_in_flight, 1, MAX_COUNT)?;
            model::check_queue_wait(&key, pipeline.max_queue_wait_ms)?;
            traffic::check_endpoint(&key, pipeline.cache.as_ref(), pipeline.quota.as_ref())?;
            if let Some(examples) = &pipeline.examples {
                examples.check(&format!("{key}.examples"))?;
            }
            if let Some(input) = &pipeline.canary_key {
                if input.is_empty() {
                    return Err(invalid!("{key}.canary_key = \"\": name the input that keeps a caller on one version"));
                }
            }
            if let Some(fetch) = &pipeline.feature_fetch {
                fetch.check(&format!("{key}.feature_fetch"), &self.features)?;
            }
            if pipeline.is_graph() {
                if pipeline.cache.is_some() && pipeline.feature_fetch.is_some() {
                    return Err(invalid!(
                        "{key}.cache: a graph fetches its features inside its steps, so its answers depend on more \
                         than the inputs a cache would keep them by; drop the cache or the feature fetch"
                    ));
                }
                if let Some((role, _)) = pipeline.stages().next() {
                    return Err(invalid!(
                        "{key}.{}: a pipeline with steps runs everything as steps; make it a step",
                        role.key()
                    ));
                }
                graph::check_graph(
                    &key,
                    &pipeline.model,
                    &pipeline.inputs,
                    &pipeline.outputs,
                    &pipeline.steps,
                    pipeline.feature_fetch.as_ref(),
                    &names,
                )?;
                if pipeline.uses_plugins() && self.plugins.dir.is_none() {
                    return Err(invalid!(
                        "{key}.steps: a step runs a plugin; set [plugins] dir, where NAME.wasm files are"
                    ));
                }
            } else if !pipeline.inputs.is_empty() || !pipeline.outputs.is_empty() {
                return Err(invalid!(
                    "{key}: inputs and outputs belong to a pipeline with steps; without steps its model says them"
                ));
            }
            for (role, stage) in pipeline.stages() {
                let role_key = role.key();
                if stage.workers == 0 {
                    return Err(invalid!("{key}.{role_key}.workers = 0: must be at least 1"));
                }
                if stage.queue_capacity == 0 {
                    return Err(invalid!("{key}.{role_key}.queue_capacity = 0: must be at least 1"));
                }
                check_at_most(&format!("{key}.{role_key}.workers"), stage.workers, MAX_THREADS)?;
                check_at_most(&format!("{key}.{role_key}.queue_capacity"), stage.queue_capacity, MAX_COUNT)?;
                let allowed = StageKind::allowed_in(role);
                let chosen = stage.kind_names();
                if chosen.len() != 1 || !allowed.contains(&chosen[0]) {
                    return Err(invalid!("{key}.{role_key}: set exactly one of {allowed:?} (found {chosen:?})"));
                }
                if let Some(StageKind::Plugin(plugin)) = stage.kind() {
                    check_name(&format!("{key}.{role_key}.plugin"), plugin.as_str())?;
                    if self.plugins.dir.is_none() {
                        return Err(invalid!(
                            "{key}.{role_key}.plugin = \"{plugin}\": set [plugins] dir, where NAME.wasm files are"
                        ));
                    }
                }
            }
        }
        for (i, model) in self.models.iter().enumerate() {
            if let Some(batching) = &model.batching {
                batching.check(&format!("models[{i}].batching"))?;
            }
        }
        if let Some(shared) = &self.plugins.shared {
            shared.access().check("plugins.shared", &shared.redis_url)?;
        }
        for (name, limits) in &self.plugins.limits {
            let key = format!("plugins.limits.{name}");
            if limits.timeout_ms == 0 {
                return Err(invalid!("{key}.timeout_ms = 0: must be at least 1"));
            }
            if limits.memory_mib == 0 || limits.memory_mib > self.plugins.max_memory_mib {
                return Err(invalid!(
                    "{key}.memory_mib = {}: must be between 1 and plugins.max_memory_mib ({})",
                    limits.memory_mib,
                    self.plugins.max_memory_mib
                ));
            }
            if limits.fuel.is_some() && !self.plugins.fuel {
                return Err(invalid!("{key}.fuel is set, but fuel metering is off; set plugins.fuel = true"));
            }
        }
        admin::check(&self.admin, self.plugins.dir.is_some())?;
        self.features.check()?;
        for (i, pipeline) in self.pipelines.iter().enumerate() {
            if let Some(team) = &pipeline.team {
                check_name(&format!("pipelines[{i}].team"), team)?;
            }
        }
        if self.plugins.max_calls_per_team == 0 {
            return Err(Invalid("plugins.max_calls_per_team = 0: must be at least 1".to_string()));
        }
        if self.plugins.max_instances == 0 {
            return Err(Invalid("plugins.max_instances = 0: must be at least 1".to_string()));
        }
        self.plugins.check_compile_limits()?;
        if let Some(path) = &self.server.metrics_path {
            if !path.starts_with('/') || path.starts_with("/v1/") || path.starts_with("/admin/") {
                return Err(invalid!(
                    "server.metrics_path = \"{path}\": must start with '/' and not be under /v1/ or /admin/"
                ));
            }
        }
        if self.server.max_tensor_bytes < 1024 {
            return Err(invalid!("server.max_tensor_bytes = {}: must be at least 1024", self.server.max_tensor_bytes));
        }
        if self.server.max_json_values == 0 {
            return Err(invalid!("server.max_json_values = 0: must be at least 1"));
        }
        if self.server.max_message_bytes < 1024 {
            return Err(invalid!(
                "server.max_message_bytes = {}: must be at least 1024",
                self.server.max_message_bytes
            ));
        }
        Ok(())
    }
}

/// Names (models, labels, later pipelines and plugins) are what clients
/// type and what may become file names: short, and without separators.
pub fn check_name(key: &str, name: &str) -> Result<(), Invalid> {
    let valid = !name.is_empty()
        && name.len() <= 128
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !name.starts_with('.');
    if valid {
        Ok(())
    } else {
        Err(invalid!(
            "{key} = \"{name}\": names are 1 to 128 characters of A-Z, a-z, 0-9, '_', '-', '.', not starting with '.'"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml(text, "test.toml", Path::new("/base"))
    }

    #[test]
    fn minimal_model_config_gets_defaults_and_relative_paths() {
        let config = parse("[[models]]\nname = \"mlp\"\nbase_path = \"models/mlp\"\n").unwrap();
        let model = &config.models[0];
        assert_eq!(model.base_path, Path::new("/base/models/mlp"));
        assert_eq!(model.version_policy, VersionPolicy::Latest(1));
        assert_eq!(config.server.port, 8500);
    }

    #[test]
    fn version_policies_parse() {
        for (text, policy) in [
            ("\"latest\"", VersionPolicy::Latest(1)),
            ("\"all\"", VersionPolicy::All),
            ("{ latest = 2 }", VersionPolicy::Latest(2)),
            ("{ specific = [1, 3] }", VersionPolicy::Specific(vec![1, 3])),
        ] {
            let config =
                parse(&format!("[[models]]\nname = \"m\"\nbase_path = \"x\"\nversion_policy = {text}\n")).unwrap();
            assert_eq!(config.models[0].version_policy, policy, "{text}");
        }
        let err = parse("[[models]]\nname = \"m\"\nbase_path = \"x\"\nversion_policy = \"newest\"\n").unwrap_err();
        assert!(err.to_string().contains("test.toml"), "{err}");
        assert!(err.message.contains("version_policy"), "{err}");
    }

    #[test]
    fn errors_name_the_key_and_value() {
        let model = "[[models]]\nname = \"m\"\nbase_path = \"x\"\n";
        let refused = [
            ("[[models]]\nname = \"a/b\"\nbase_path = \"x\"\n", "models[0].name = \"a/b\""),
            ("$MODEL[[models]]\nname = \"m\"\nbase_path = \"y\"\n", "models[1].name"),
            ("[server]\nportt = 1\n", "portt"),
            ("$MODEL[models.onnx]\nsessions = 0\n", "models[0].onnx.sessions = 0"),
            // Counts the server would allocate or start are bounded, not a panic.
            (
                "$MODELmax_in_flight = 9223372036854775807\n",
                "max_in_flight = 9223372036854775807: must be between 1 and 1048576",
            ),
            (
                "$MODEL[models.onnx]\nintra_op_threads = 100000\n",
                "onnx.intra_op_threads = 100000: must be between 1 and 1024",
            ),
            (
                "[server]\nmax_connections = 4611686018427387904\n",
                "server.max_connections = 4611686018427387904: must be at most 1048576",
            ),
            (
                "[lifecycle]\nmax_concurrent_loads = 5000\n",
                "lifecycle.max_concurrent_loads = 5000: must be at most 1024",
            ),
            (
                "[server]\ninline_inference_micros = 5000\n",
                "server.inline_inference_micros = 5000: must be at most 1000",
            ),
            ("[server]\ncompute_nice = 20\n", "server.compute_nice = 20: must be between 0 and 19"),
            ("[server]\ncompute_nice = -1\n", "compute_nice"),
            // The plugin compile limits: named, bounded, never zero.
            ("[plugins]\nmax_code_mib = 0\n", "plugins.max_code_mib = 0: must be between 1 and 256"),
            (
                "[plugins]\ncompile_cpu_seconds = 100000\n",
                "plugins.compile_cpu_seconds = 100000: must be between 1 and 3600",
            ),
            ("[plugins.limits.p]\ninstances = \"sometimes\"\n", "sometimes"),
        ];
        for (text, expected) in refused {
            let text = text.replace("$MODEL", model);
            let err = parse(&text).unwrap_err();
            assert!(err.message.contains(expected), "{text}: {err}");
        }
    }
}
