//! The configuration file (TOML) and its checks.
//!
//! One file describes the server and everything it serves; TF Serving's own
//! `--model_config_file` (a `ModelServerConfig` in protobuf text format) is
//! read too ([`tf_model_config`]). Unknown keys are
//! refused (`deny_unknown_fields`), and every error names the file, the key,
//! the value and what is allowed. Relative paths in the file are relative
//! to the file's own directory, so a config works from any working
//! directory.

pub mod batching;
pub mod examples;
pub mod features;
pub mod lifecycle;
pub mod logging;
pub mod onnx;
pub mod plugins;
pub mod redis_access;
pub mod stage;
pub mod telemetry;
pub mod tf_model_config;
pub mod tls;
pub mod traffic;
pub mod upstream;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use crate::error::{ConfigError, Invalid};
use crate::invalid;

pub use self::batching::{BatchingMode, BatchingParameters};
pub use self::examples::ExamplesConfig;
pub use self::features::{FeatureFetchConfig, FeaturesConfig};
pub use self::lifecycle::{LifecycleConfig, ModelDefaults};
pub use self::logging::LoggingConfig;
pub use self::onnx::OnnxOptions;
pub use self::plugins::{InstancePolicy, PluginLimits, PluginsConfig};
pub use self::stage::{StageConfig, StageKind, StageRole};
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
    /// OpenTelemetry traces of requests; off unless an endpoint is given.
    #[serde(default)]
    pub tracing: TracingConfig,
    /// Priorities, team quotas and canary rollbacks.
    #[serde(default)]
    pub traffic: TrafficConfig,
}

/// The plugin admin API (on the REST port, under `/admin/v1/`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Serve the admin API at all.
    pub enabled: bool,
    /// A port of its own (for a network only deploy tooling reaches); 0
    /// picks a free one. Unset: the admin API is on the REST port.
    pub port: Option<u16>,
    /// Largest plugin upload accepted, in bytes.
    pub max_upload_bytes: usize,
    /// Who may call it.
    pub tokens: Vec<TokenConfig>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig { enabled: false, port: None, max_upload_bytes: 64 << 20, tokens: Vec::new() }
    }
}

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Its own team's plugins and pipelines.
    Team,
    /// Everything.
    Admin,
}

/// One bearer token, stored as the SHA-256 of the token, never the token.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// A name for the token, written in the audit log instead of the token.
    pub id: String,
    /// The team it acts for (required for the `team` role).
    pub team: Option<String>,
    /// What it may do.
    pub role: Role,
    /// `printf %s TOKEN | sha256sum`, 64 hex digits.
    pub sha256: String,
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

/// How numeric outputs are written into a `TensorProto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum OutputEncoding {
    /// Typed fields (`float_val`, `int64_val`, …): what TF Serving sends by
    /// default, and what client code reading `.float_val` expects.
    #[default]
    TypedFields,
    /// Packed `tensor_content`: one copy of the bytes, the fastest.
    TensorContent,
}

/// Which threads serve the gRPC port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum GrpcThreads {
    /// One single-threaded runtime per core, each serving the connections
    /// it is dealt (the least busy core gets the next): a connection's
    /// calls never leave its thread, so no call wakes a second thread.
    #[default]
    PerCore,
    /// Tokio's work-stealing runtime, shared with the HTTP port: any idle
    /// thread may take any call, at the cost of waking threads to steal.
    Shared,
}

impl PipelineConfig {
    /// Its stages, in the order a request passes them.
    pub fn stages(&self) -> impl Iterator<Item = (StageRole, &StageConfig)> {
        [(StageRole::Preprocess, &self.preprocess), (StageRole::Postprocess, &self.postprocess)]
            .into_iter()
            .filter_map(|(role, stage)| stage.as_ref().map(|s| (role, s)))
    }

    /// True when a stage runs a plugin.
    pub fn uses_plugins(&self) -> bool {
        self.stages().any(|(_, stage)| matches!(stage.kind(), Some(StageKind::Plugin(_))))
    }
}

/// Listening addresses and protocol limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address to bind; `0.0.0.0` serves every interface, as TF Serving does.
    pub host: String,
    /// gRPC port (TF Serving's `--port`); 0 picks a free one.
    pub port: u16,
    /// HTTP port for metrics (TF Serving's `--rest_api_port`); 0 picks a
    /// free one.
    pub rest_api_port: u16,
    /// Largest gRPC message accepted or sent, in bytes.
    pub max_message_bytes: usize,
    /// Largest tensor a request may make the server build, in bytes:
    /// decoded inputs (a single value broadcast to a large shape), stage
    /// outputs (a built-in sized from the request's rows). Checked before
    /// anything is allocated; a request over it gets RESOURCE_EXHAUSTED.
    pub max_tensor_bytes: usize,
    /// The most values (numbers, strings, arrays, objects) a REST JSON
    /// body may hold: parsed JSON takes far more memory than its text, so
    /// the body size alone does not bound it.
    pub max_json_values: usize,
    /// How numeric outputs are written in Predict responses.
    pub output_encoding: OutputEncoding,
    /// Seconds in-flight requests get to finish after SIGTERM.
    pub drain_timeout_secs: u64,
    /// A Unix socket to serve gRPC on too (TF Serving's `--grpc_socket_path`).
    pub grpc_socket_path: Option<PathBuf>,
    /// The deadline of a REST request, in milliseconds (TF Serving's
    /// `--rest_api_timeout_in_ms`); none: no deadline.
    pub rest_api_timeout_ms: Option<u64>,
    /// Another path the Prometheus metrics answer on (TF Serving's
    /// `--monitoring_config_file` `prometheus_config { path }`).
    pub metrics_path: Option<String>,
    /// Connections open at once, per port; more are closed at once.
    pub max_connections: usize,
    /// HTTP/2 streams (calls) open at once on one connection.
    pub max_concurrent_streams: u32,
    /// The largest request head (request line and headers), in bytes;
    /// larger gets 431.
    pub max_header_bytes: usize,
    /// How long a client may take to send a request's headers, in
    /// milliseconds; a slower one (a slow-loris) is cut off.
    pub header_read_timeout_ms: u64,
    /// How long a client may take to send a REST request's body, in
    /// milliseconds; slower gets 408 and the connection closed.
    pub body_read_timeout_ms: u64,
    /// How many nice steps below the network threads the compute threads
    /// run (inference sessions and their pools, pipelined stage workers):
    /// 0 (the default) runs them alike, 19 only when nothing else wants
    /// the CPU. Above 0, a saturated CPU still answers refusals and health
    /// probes at once, at a cost in peak throughput (`runtime/threads.rs`).
    /// Read at start-up.
    pub compute_nice: usize,
    /// The most a batch may cost, in microseconds, to run on the network
    /// thread that decoded its request instead of being handed to an
    /// inference thread (two thread wake-ups that cost more than a small
    /// model's run). Measured per model and batch size while serving; a
    /// size not yet measured, or dearer, runs on the inference threads.
    /// 0 turns inline runs off.
    pub inline_inference_micros: u64,
    /// Which threads serve the gRPC port: `per_core` (a single-threaded
    /// runtime per core) or `shared` (tokio's work-stealing runtime).
    pub grpc_threads: GrpcThreads,
    /// TLS on the gRPC, REST and admin ports (not the Unix socket); off
    /// when absent.
    pub tls: Option<TlsConfig>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "0.0.0.0".to_string(),
            port: 8500,
            rest_api_port: 8501,
            max_message_bytes: 64 << 20,
            max_tensor_bytes: 256 << 20,
            max_json_values: 1 << 22,
            output_encoding: OutputEncoding::TypedFields,
            drain_timeout_secs: 30,
            grpc_socket_path: None,
            rest_api_timeout_ms: None,
            metrics_path: None,
            max_connections: 10_000,
            max_concurrent_streams: 1024,
            max_header_bytes: 64 << 10,
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 30_000,
            compute_nice: 0,
            inline_inference_micros: DEFAULT_INLINE_INFERENCE_MICROS,
            grpc_threads: GrpcThreads::PerCore,
            tls: None,
        }
    }
}

/// Where the ONNX Runtime library is.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnnxRuntimeConfig {
    /// Path of `libonnxruntime.so.*`; found automatically when unset.
    pub library: Option<PathBuf>,
}

/// Which versions of a model are loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionPolicy {
    /// The N highest versions (TF Serving's default is the highest one).
    Latest(usize),
    /// Every version found.
    All,
    /// Exactly these versions; each must exist.
    Specific(Vec<i64>),
}

impl Default for VersionPolicy {
    fn default() -> Self {
        VersionPolicy::Latest(1)
    }
}

impl<'de> Deserialize<'de> for VersionPolicy {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged, expecting = "\"latest\", \"all\", { latest = N } or { specific = [versions] }")]
        enum Repr {
            Name(String),
            Latest { latest: usize },
            Specific { specific: Vec<i64> },
        }
        match Repr::deserialize(deserializer)? {
            Repr::Name(name) if name == "latest" => Ok(VersionPolicy::Latest(1)),
            Repr::Name(name) if name == "all" => Ok(VersionPolicy::All),
            Repr::Name(other) => Err(serde::de::Error::custom(format!(
                "unknown version policy \"{other}\"; expected \"latest\", \"all\", {{ latest = N }} or {{ specific = [versions] }}"
            ))),
            Repr::Latest { latest: 0 } => Err(serde::de::Error::custom("{ latest = 0 } would load nothing; use 1 or more")),
            Repr::Latest { latest } => Ok(VersionPolicy::Latest(latest)),
            Repr::Specific { specific } if specific.is_empty() => {
                Err(serde::de::Error::custom("{ specific = [] } would load nothing; list at least one version"))
            }
            Repr::Specific { specific } => Ok(VersionPolicy::Specific(specific)),
        }
    }
}

/// One model: where its versions are and how to serve them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The name clients put in `model_spec.name`.
    pub name: String,
    /// Directory holding one subdirectory per version: `BASE/VERSION/model.onnx`.
    /// Empty for a model forwarded to an upstream.
    #[serde(default)]
    pub base_path: PathBuf,
    /// Which versions to load.
    #[serde(default)]
    pub version_policy: VersionPolicy,
    /// Names for versions (`stable = 1`), for `model_spec.version_label`.
    #[serde(default)]
    pub version_labels: BTreeMap<String, i64>,
    /// Requests of this model admitted at once, waiting or running; more
    /// are refused with RESOURCE_EXHAUSTED.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// ONNX Runtime session settings.
    #[serde(default)]
    pub onnx: OnnxOptions,
    /// Dynamic batching; off when absent.
    pub batching: Option<BatchingParameters>,
    /// Forward inference to TF Serving instead of running ONNX Runtime.
    pub upstream: Option<UpstreamConfig>,
    /// Request logging (TF Serving's `logging_config`); off when absent.
    pub logging: Option<LoggingConfig>,
    /// The response cache of the model served under its own name; off
    /// when absent.
    pub cache: Option<CacheConfig>,
    /// The rate (and concurrency) quota of the model served under its
    /// own name.
    pub quota: Option<QuotaConfig>,
    /// A share of the requests that name no version sent to a labelled
    /// version instead of the latest.
    pub canary: Option<ModelCanary>,
    /// How `tf.Example`s fill the inputs of the model served under its own
    /// name; refused when absent.
    pub examples: Option<ExamplesConfig>,
}

/// What `server.inline_inference_micros` is unless set: below the cost
/// of the two thread wake-ups an inference thread costs (docs/BENCHMARKS.md).
pub const DEFAULT_INLINE_INFERENCE_MICROS: u64 = 50;

/// Above this a run holds a network thread long enough to delay every
/// other connection it serves: that is what inference threads are for.
const MAX_INLINE_INFERENCE_MICROS: usize = 1000;

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

fn default_max_in_flight() -> usize {
    1024
}

impl ModelConfig {
    /// A model given on the command line (`--model_name`, `--model_base_path`).
    pub fn from_flags(name: String, base_path: PathBuf) -> ModelConfig {
        ModelConfig {
            name,
            base_path,
            version_policy: VersionPolicy::default(),
            version_labels: BTreeMap::new(),
            max_in_flight: default_max_in_flight(),
            onnx: OnnxOptions::default(),
            batching: None,
            upstream: None,
            logging: None,
            cache: None,
            quota: None,
            canary: None,
            examples: None,
        }
    }
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
            if model.upstream.is_none() && model.base_path.is_relative() {
                model.base_path = base.join(&model.base_path);
            }
            if let Some(tls) = model.upstream.as_mut().and_then(|u| u.tls.as_mut()) {
                tls.resolve(base);
            }
            if let Some(logging) = &mut model.logging {
                if logging.filename_prefix.is_relative() {
                    logging.filename_prefix = base.join(&logging.filename_prefix);
                }
            }
        }
        for pipeline in &mut config.pipelines {
            for stage in [&mut pipeline.preprocess, &mut pipeline.postprocess].into_iter().flatten() {
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
        self.tracing.check()?;
        self.traffic.check()?;
        if let Some(tls) = &self.server.tls {
            tls.check()?;
        }
        check_at_most(
            "server.inline_inference_micros",
            usize::try_from(self.server.inline_inference_micros).unwrap_or(usize::MAX),
            MAX_INLINE_INFERENCE_MICROS,
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
        self.check_admin()?;
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

impl Config {
    fn check_admin(&self) -> Result<(), Invalid> {
        let admin = &self.admin;
        if !admin.enabled {
            return Ok(());
        }
        if self.plugins.dir.is_none() {
            return Err(Invalid(
                "admin.enabled = true: set [plugins] dir, where uploaded plugins are stored".to_string(),
            ));
        }
        if admin.tokens.is_empty() {
            return Err(Invalid(
                "admin.enabled = true, but admin.tokens is empty: nobody could use the admin API".to_string(),
            ));
        }
        if admin.max_upload_bytes == 0 {
            return Err(Invalid("admin.max_upload_bytes = 0: must be at least 1".to_string()));
        }
        let mut ids = HashSet::new();
        for (i, token) in admin.tokens.iter().enumerate() {
            let key = format!("admin.tokens[{i}]");
            check_name(&format!("{key}.id"), &token.id)?;
            if !ids.insert(token.id.as_str()) {
                return Err(invalid!("{key}.id = \"{}\": another token has the same id", token.id));
            }
            if token.sha256.len() != 64 || !token.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(invalid!(
                    "{key}.sha256 = \"{}\": expected 64 hex digits, the SHA-256 of the token (printf %s TOKEN | sha256sum)",
                    token.sha256
                ));
            }
            match (token.role, &token.team) {
                (Role::Team, None) => return Err(invalid!("{key}: role = \"team\" needs team = \"NAME\"")),
                (_, Some(team)) => check_name(&format!("{key}.team"), team)?,
                (Role::Admin, None) => {}
            }
        }
        Ok(())
    }
}

/// The checks of a model list, whether from the config file or a reload:
/// names valid and unique, limits at least 1, versions non-negative.
/// Answers the names.
pub fn check_models(models: &[ModelConfig]) -> Result<HashSet<&str>, Invalid> {
    let mut names = HashSet::new();
    for (i, model) in models.iter().enumerate() {
        let key = format!("models[{i}]");
        check_name(&format!("{key}.name"), &model.name)?;
        if !names.insert(model.name.as_str()) {
            return Err(invalid!("{key}.name = \"{}\": another model has the same name", model.name));
        }
        match (&model.upstream, model.base_path.as_os_str().is_empty()) {
            (None, true) => {
                return Err(invalid!(
                    "{key} (\"{}\"): base_path is missing; give the model's directory, or [models.upstream] to \
                     forward it to TF Serving",
                    model.name
                ))
            }
            (Some(_), false) => {
                return Err(invalid!(
                    "{key} (\"{}\"): base_path and upstream are both set; a model is loaded from its directory \
                     or forwarded, not both",
                    model.name
                ))
            }
            (Some(upstream), true) => upstream.check(&format!("{key}.upstream"))?,
            (None, false) => {}
        }
        check_between(&format!("{key}.max_in_flight"), model.max_in_flight, 1, MAX_COUNT)?;
        if let Some(logging) = &model.logging {
            logging.check(&format!("{key}.logging"))?;
        }
        traffic::check_endpoint(&key, model.cache.as_ref(), model.quota.as_ref())?;
        if let Some(examples) = &model.examples {
            examples.check(&format!("{key}.examples"))?;
        }
        if let Some(canary) = &model.canary {
            canary.check(&format!("{key}.canary"), &model.version_labels)?;
        }
        check_between(&format!("{key}.onnx.sessions"), model.onnx.sessions, 1, MAX_THREADS)?;
        check_between(&format!("{key}.onnx.intra_op_threads"), model.onnx.intra_op_threads, 1, MAX_THREADS)?;
        if let VersionPolicy::Specific(versions) = &model.version_policy {
            if let Some(v) = versions.iter().find(|&&v| v < 0) {
                return Err(invalid!("{key}.version_policy: version {v} is negative; versions are >= 0"));
            }
        }
        for (label, version) in &model.version_labels {
            check_name(&format!("{key}.version_labels"), label)?;
            if *version < 0 {
                return Err(invalid!("{key}.version_labels.{label} = {version}: versions are >= 0"));
            }
        }
    }
    Ok(names)
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
        let err = parse("[[models]]\nname = \"a/b\"\nbase_path = \"x\"\n").unwrap_err();
        assert!(err.message.contains("models[0].name = \"a/b\""), "{err}");
        let err = parse("[[models]]\nname = \"m\"\nbase_path = \"x\"\n[[models]]\nname = \"m\"\nbase_path = \"y\"\n")
            .unwrap_err();
        assert!(err.message.contains("models[1].name"), "{err}");
        let err = parse("[server]\nportt = 1\n").unwrap_err();
        assert!(err.message.contains("portt"), "{err}");
        let err = parse("[[models]]\nname = \"m\"\nbase_path = \"x\"\n[models.onnx]\nsessions = 0\n").unwrap_err();
        assert!(err.message.contains("models[0].onnx.sessions = 0"), "{err}");
        // Counts the server would allocate or start are bounded, not a panic.
        let err =
            parse("[[models]]\nname = \"m\"\nbase_path = \"x\"\nmax_in_flight = 9223372036854775807\n").unwrap_err();
        assert!(err.message.contains("max_in_flight = 9223372036854775807: must be between 1 and 1048576"), "{err}");
        let err = parse("[[models]]\nname = \"m\"\nbase_path = \"x\"\n[models.onnx]\nintra_op_threads = 100000\n")
            .unwrap_err();
        assert!(err.message.contains("onnx.intra_op_threads = 100000: must be between 1 and 1024"), "{err}");
        let err = parse("[server]\nmax_connections = 4611686018427387904\n").unwrap_err();
        assert!(err.message.contains("server.max_connections = 4611686018427387904: must be at most 1048576"), "{err}");
        let err = parse("[lifecycle]\nmax_concurrent_loads = 5000\n").unwrap_err();
        assert!(err.message.contains("lifecycle.max_concurrent_loads = 5000: must be at most 1024"), "{err}");
        let err = parse("[server]\ninline_inference_micros = 5000\n").unwrap_err();
        assert!(err.message.contains("server.inline_inference_micros = 5000: must be at most 1000"), "{err}");
        let err = parse("[server]\ncompute_nice = 20\n").unwrap_err();
        assert!(err.message.contains("server.compute_nice = 20: must be between 0 and 19"), "{err}");
        let err = parse("[server]\ncompute_nice = -1\n").unwrap_err();
        assert!(err.message.contains("compute_nice"), "{err}");
        // The plugin compile limits: named, bounded, never zero.
        let err = parse("[plugins]\nmax_code_mib = 0\n").unwrap_err();
        assert!(err.message.contains("plugins.max_code_mib = 0: must be between 1 and 256"), "{err}");
        let err = parse("[plugins]\ncompile_cpu_seconds = 100000\n").unwrap_err();
        assert!(err.message.contains("plugins.compile_cpu_seconds = 100000: must be between 1 and 3600"), "{err}");
        let err = parse("[plugins.limits.p]\ninstances = \"sometimes\"\n").unwrap_err();
        assert!(err.message.contains("sometimes"), "{err}");
    }
}
