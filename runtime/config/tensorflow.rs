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
    /// 1 by default, as ONNX Runtime's sessions: batches run side by side
    /// on `run_threads` rather than one batch spread over the cores.
    pub intra_op_threads: usize,
    /// Ops TensorFlow runs at once in one run (ConfigProto's
    /// `inter_op_parallelism_threads`); 0: TensorFlow picks; -1 (the
    /// default): every op on the thread that runs the batch, with no
    /// hand-off to TensorFlow's pool (a hand-off per op costs more than a
    /// small model's ops).
    pub inter_op_threads: i32,
}

impl Default for TensorflowOptions {
    fn default() -> Self {
        TensorflowOptions {
            tags: vec!["serve".to_string()],
            signature: "serving_default".to_string(),
            run_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            intra_op_threads: 1,
            inter_op_threads: -1,
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
