//! How a model version is loaded into ONNX Runtime: the `[models.onnx]`
//! table. The backend that reads it is `infer::onnx`.

use serde::Deserialize;

/// Where ONNX Runtime runs the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecutionProvider {
    /// ONNX Runtime's CPU kernels.
    #[default]
    Cpu,
    /// NVIDIA CUDA (needs the `cuda` build feature and a GPU build of ONNX Runtime).
    Cuda,
    /// NVIDIA TensorRT, falling back to CUDA for unsupported nodes.
    Tensorrt,
}

/// How a model version is loaded into ONNX Runtime.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OnnxOptions {
    /// Sessions in the pool, each with its own inference thread: how many
    /// batches of this model run at once.
    pub sessions: usize,
    /// Sessions beside `sessions` that run only high-priority batches,
    /// each with its own thread: a high-priority request never waits for
    /// a lower one's batch to finish, and the OS, whose scheduler favours
    /// a thread that mostly sleeps, runs its batch ahead of the busy ones.
    /// Each is one more copy of the model in memory.
    pub high_priority_sessions: usize,
    /// Threads ONNX Runtime uses inside one run (intra-op parallelism).
    pub intra_op_threads: usize,
    /// Whether idle intra-op threads spin waiting for work. Spinning cuts
    /// latency by microseconds but burns cores other sessions could use.
    pub spinning: bool,
    /// CPU, CUDA or TensorRT.
    pub execution_provider: ExecutionProvider,
    /// GPU ordinal for CUDA and TensorRT.
    pub device_id: i32,
    /// Let TensorRT build FP16 engines.
    pub fp16: bool,
}

impl Default for OnnxOptions {
    fn default() -> Self {
        OnnxOptions {
            sessions: std::thread::available_parallelism().map_or(1, |n| n.get()),
            high_priority_sessions: 0,
            intra_op_threads: 1,
            spinning: false,
            execution_provider: ExecutionProvider::Cpu,
            device_id: 0,
            fp16: false,
        }
    }
}
