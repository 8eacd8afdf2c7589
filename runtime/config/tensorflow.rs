//! How a SavedModel version is loaded into TensorFlow: the
//! `[models.tensorflow]` table, and where TensorFlow's library is (the
//! top-level `[tensorflow]` table). The backend that reads them is
//! `infer::tensorflow`.

use std::path::PathBuf;

use serde::Deserialize;

/// How a SavedModel version is loaded and run.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TensorflowOptions {
    /// The tags of the MetaGraph to load (TF Serving's
    /// `--saved_model_tags`, comma-separated there).
    pub tags: Vec<String>,
    /// The signature Predict, the REST `:predict` and KServe v2 serve
    /// when the request names none.
    pub signature: String,
    /// Batches of one version run at once (threads calling
    /// `TF_SessionRun` on its one session).
    pub run_threads: usize,
    /// Threads TensorFlow uses inside one op (ConfigProto's
    /// `intra_op_parallelism_threads`); 0: TensorFlow picks (one per core).
    pub intra_op_threads: usize,
    /// Ops TensorFlow runs at once in one run (ConfigProto's
    /// `inter_op_parallelism_threads`); 0: TensorFlow picks.
    pub inter_op_threads: usize,
}

impl Default for TensorflowOptions {
    fn default() -> Self {
        TensorflowOptions {
            tags: vec!["serve".to_string()],
            signature: "serving_default".to_string(),
            run_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            intra_op_threads: 0,
            inter_op_threads: 0,
        }
    }
}

/// Where TensorFlow's library is.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorflowConfig {
    /// Path of `libtensorflow_cc.so.2` (the `tensorflow-cpu` wheel's) or
    /// `libtensorflow.so.2`; found automatically when unset.
    pub library: Option<PathBuf>,
}
