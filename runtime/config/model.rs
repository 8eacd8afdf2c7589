//! `[[models]]`: one model — where its versions are and which to load,
//! version labels, admission, ONNX Runtime options, batching, forwarding,
//! request logging, traffic control and `tf.Example` inputs — and the
//! checks of a model list, from the file or a reload.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;

use serde::Deserialize;

use super::tensorflow::TensorflowOptions;
use super::{
    check_between, check_name, default_max_in_flight, traffic, BatchingParameters, CacheConfig, ExamplesConfig,
    LoggingConfig, ModelCanary, OnnxOptions, QuotaConfig, UpstreamConfig, MAX_COUNT, MAX_THREADS,
};
use crate::error::Invalid;
use crate::invalid;

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
    /// The most queueing an admitted request should meet: once the model's
    /// service rate is learned, its admission holds only what it can answer
    /// within it, and its batch queue never runs a request that waited
    /// longer. Unset: the auto batching latency target, else 50 ms.
    pub max_queue_wait_ms: Option<u64>,
    /// ONNX Runtime session settings.
    #[serde(default)]
    pub onnx: OnnxOptions,
    /// TensorFlow session settings, for versions that are SavedModels.
    #[serde(default)]
    pub tensorflow: TensorflowOptions,
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

impl ModelConfig {
    /// The most queueing its requests should meet (`max_queue_wait_ms`).
    pub fn max_queue_wait(&self) -> std::time::Duration {
        let auto = self.batching.as_ref().filter(|b| b.mode == super::batching::BatchingMode::Auto);
        match (self.max_queue_wait_ms, auto) {
            (Some(ms), _) => std::time::Duration::from_millis(ms),
            (None, Some(batching)) => batching.latency_target(),
            (None, None) => std::time::Duration::from_millis(DEFAULT_MAX_QUEUE_WAIT_MS),
        }
    }

    /// A model given on the command line (`--model_name`, `--model_base_path`).
    pub fn from_flags(name: String, base_path: PathBuf) -> ModelConfig {
        ModelConfig {
            name,
            base_path,
            version_policy: VersionPolicy::default(),
            version_labels: BTreeMap::new(),
            max_in_flight: default_max_in_flight(),
            max_queue_wait_ms: None,
            onnx: OnnxOptions::default(),
            tensorflow: TensorflowOptions::default(),
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

/// `max_queue_wait_ms` when a model or pipeline does not set it and auto
/// batching gives no latency target.
pub const DEFAULT_MAX_QUEUE_WAIT_MS: u64 = 50;

/// The longest `max_queue_wait_ms`: a minute of queueing is no bound.
pub const MAX_QUEUE_WAIT_MS: u64 = 60_000;

/// Checks `KEY.max_queue_wait_ms`.
pub(crate) fn check_queue_wait(key: &str, wait: Option<u64>) -> Result<(), Invalid> {
    match wait {
        Some(ms) if ms == 0 || ms > MAX_QUEUE_WAIT_MS => {
            Err(invalid!("{key}.max_queue_wait_ms = {ms}: must be between 1 and {MAX_QUEUE_WAIT_MS} milliseconds"))
        }
        _ => Ok(()),
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
        check_queue_wait(&key, model.max_queue_wait_ms)?;
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
        check_between(
            &format!("{key}.onnx.high_priority_sessions"),
            model.onnx.high_priority_sessions,
            0,
            MAX_THREADS,
        )?;
        check_between(&format!("{key}.onnx.intra_op_threads"), model.onnx.intra_op_threads, 1, MAX_THREADS)?;
        let tf = &model.tensorflow;
        check_between(&format!("{key}.tensorflow.run_threads"), tf.run_threads, 1, MAX_THREADS)?;
        check_between(&format!("{key}.tensorflow.intra_op_threads"), tf.intra_op_threads, 0, MAX_THREADS)?;
        if tf.inter_op_threads < -1 || tf.inter_op_threads > MAX_THREADS as i32 {
            return Err(invalid!(
                "{key}.tensorflow.inter_op_threads = {}: expected -1 (ops on the batch's own thread), 0 (TensorFlow \
                 picks) or up to {MAX_THREADS}",
                tf.inter_op_threads
            ));
        }
        if tf.tags.is_empty() || tf.tags.iter().any(|t| t.is_empty()) {
            return Err(invalid!(
                "{key}.tensorflow.tags = {:?}: expected one or more non-empty SavedModel tags, e.g. [\"serve\"]",
                tf.tags
            ));
        }
        if tf.signature.is_empty() {
            return Err(invalid!(
                "{key}.tensorflow.signature is empty: expected a signature key, e.g. \"serving_default\""
            ));
        }
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
