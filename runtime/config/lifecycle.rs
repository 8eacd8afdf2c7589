//! How model versions come and go while the server runs: the `[lifecycle]`
//! table, and the defaults command-line flags give models that a config
//! reload adds later. The machinery that reads it is
//! `pipeline::lifecycle`.

use std::path::PathBuf;

use serde::Deserialize;

use super::{BatchingParameters, ModelConfig};

/// The `[lifecycle]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LifecycleConfig {
    /// Seconds between re-reads of every model's base path (TF Serving's
    /// `--file_system_poll_wait_seconds`, default 1): a version that enters
    /// the policy is loaded, one that leaves it is drained and unloaded.
    /// 0: versions are read at start-up only.
    pub file_system_poll_wait_seconds: u64,
    /// Seconds between re-reads of `--model_config_file` (TF Serving's
    /// `--model_config_file_poll_wait_seconds`); 0: read at start-up only.
    pub model_config_file_poll_wait_seconds: u64,
    /// Versions loading at once, across every model. Loading parses and
    /// optimises a graph on a thread of its own; bounding it keeps a burst
    /// of new versions from taking the cores serving requests use.
    pub max_concurrent_loads: usize,
    /// Run warmup requests through a new version before it serves (TF
    /// Serving's `--enable_model_warmup`): its warmup file when it has
    /// one, otherwise zeros at each batch size the model runs.
    pub warmup: bool,
    /// How often each warmup request runs (TF Serving's
    /// `--num_request_iterations_for_warmup`; default 1).
    pub warmup_iterations: usize,
    /// While polling, a version whose load failed is tried again this many
    /// times, `load_retry_interval_ms` apart, besides whenever its model
    /// file changes (TF Serving's `--max_num_load_retries`, default 5): a
    /// version read before all its files had arrived (a SavedModel's
    /// `variables/` still uploading) loads once they have. At start-up
    /// and in a config reload a failure is reported at once instead.
    pub max_load_retries: u32,
    /// Milliseconds between those tries (TF Serving's
    /// `--load_retry_interval_micros`, default one minute).
    pub load_retry_interval_ms: u64,
    /// A label may name a version that is not AVAILABLE yet, when the
    /// model has no such label so far (TF Serving's
    /// `--allow_version_labels_for_unavailable_models`): a label can be
    /// set up before its version loads. Requests through it are refused,
    /// naming the version's state, until it does.
    pub allow_version_labels_for_unavailable_models: bool,
    /// Optimise each model's graph once, off the serving path (a
    /// low-priority thread), and keep it on disk, one per model file,
    /// ONNX Runtime version and provider: a version loaded once before
    /// comes back without optimising again. CPU models only.
    pub cache_optimized_models: bool,
    /// Where the optimised graphs are kept (owner-only). Unset: a
    /// directory of this user's in the system's temporary directory.
    pub optimized_model_cache_dir: Option<PathBuf>,
    /// The file the models came from (`--model_config_file`), re-read every
    /// `model_config_file_poll_wait_seconds`. Set by the command line.
    #[serde(skip)]
    pub model_config_file: Option<PathBuf>,
    /// What the command line gives every model, including ones a reload
    /// adds later.
    #[serde(skip)]
    pub model_defaults: ModelDefaults,
}

impl LifecycleConfig {
    /// Where optimised graphs are kept, when they are.
    pub fn optimized_model_cache(&self) -> Option<PathBuf> {
        if !self.cache_optimized_models {
            return None;
        }
        Some(self.optimized_model_cache_dir.clone().unwrap_or_else(|| {
            // SAFETY: geteuid has no preconditions.
            let uid = unsafe { libc::geteuid() };
            std::env::temp_dir().join(format!("sluice-optimized-models-{uid}"))
        }))
    }
}

impl Default for LifecycleConfig {
    fn default() -> Self {
        LifecycleConfig {
            file_system_poll_wait_seconds: 1,
            model_config_file_poll_wait_seconds: 0,
            max_concurrent_loads: 1,
            warmup: true,
            warmup_iterations: 1,
            max_load_retries: 5,
            load_retry_interval_ms: 60_000,
            allow_version_labels_for_unavailable_models: false,
            cache_optimized_models: true,
            optimized_model_cache_dir: None,
            model_config_file: None,
            model_defaults: ModelDefaults::default(),
        }
    }
}

/// Settings the command line applies to every model (`--enable_batching`,
/// `--tensorflow_intra_op_parallelism`, …): kept, so that a model a
/// config reload adds gets them too.
#[derive(Debug, Clone, Default)]
pub struct ModelDefaults {
    /// Batching for models that configure none.
    pub batching: Option<BatchingParameters>,
    /// ONNX Runtime sessions per version.
    pub sessions: Option<usize>,
    /// ONNX Runtime intra-op threads per session.
    pub intra_op_threads: Option<usize>,
    /// TensorFlow's intra-op threads (`--tensorflow_intra_op_parallelism`).
    pub tensorflow_intra_op_threads: Option<usize>,
    /// TensorFlow's inter-op threads (`--tensorflow_inter_op_parallelism`).
    pub tensorflow_inter_op_threads: Option<usize>,
    /// The MetaGraph tags SavedModels load with (`--saved_model_tags`).
    pub saved_model_tags: Option<Vec<String>>,
}

impl ModelDefaults {
    /// Gives `model` what the command line set.
    pub fn apply(&self, model: &mut ModelConfig) {
        if model.batching.is_none() {
            model.batching.clone_from(&self.batching);
        }
        if let Some(sessions) = self.sessions {
            model.onnx.sessions = sessions;
        }
        if let Some(threads) = self.intra_op_threads {
            model.onnx.intra_op_threads = threads;
        }
        if let Some(threads) = self.tensorflow_intra_op_threads {
            model.tensorflow.intra_op_threads = threads;
        }
        if let Some(threads) = self.tensorflow_inter_op_threads {
            model.tensorflow.inter_op_threads = i32::try_from(threads).unwrap_or(i32::MAX);
        }
        if let Some(tags) = &self.saved_model_tags {
            model.tensorflow.tags.clone_from(tags);
        }
    }
}
