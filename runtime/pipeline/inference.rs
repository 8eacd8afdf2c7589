//! The inference stage: one loaded model version and, when batching is on
//! for its model, the [`Batcher`] in front of it.
//!
//! One inference stage exists per model version (in its `ServedVersion`),
//! shared by every pipeline that runs the model, so requests of all of
//! them batch together.

use std::sync::Arc;

use super::batcher::{run_now, Batcher};
use super::deadline::Deadline;
use super::priority::Priority;
use crate::config::ModelConfig;
use crate::error::Result;
use crate::infer::Batch;
use crate::metrics::Metrics;
use crate::models::ModelVersion;
use crate::tensor::Tensor;

/// Runs requests through one model version.
pub struct InferenceStage {
    version: Arc<ModelVersion>,
    /// Present when batching is on for the model.
    batcher: Option<Batcher>,
}

impl InferenceStage {
    /// The inference stage of `version`, batching as `config` says.
    pub fn start(version: Arc<ModelVersion>, config: &ModelConfig, metrics: &Metrics) -> InferenceStage {
        // Only a model whose every input and output shares a dynamic
        // dimension 0 can be batched (and padded); any other runs each
        // request exactly as sent, as TF Serving does with such models.
        let batchable = version.signature().is_batched();
        if config.batching.is_some() && !batchable {
            tracing::warn!(
                model = version.model(),
                version = version.version(),
                "batching is on, but the model's inputs and outputs do not all share a dynamic dimension 0; \
                 its requests run unbatched"
            );
        }
        let batcher = config.batching.as_ref().filter(|_| batchable).map(|params| {
            let (model, number) = (version.model(), version.version());
            // As many batches in flight as the backend runs at once.
            let threads = match params.num_batch_threads {
                0 => version.backend().parallelism().unwrap_or(config.onnx.sessions),
                n => n,
            };
            Batcher::start(
                version.clone(),
                params.clone(),
                threads,
                config.max_queue_wait(),
                format!("the batch queue of model '{model}' version {number}"),
                metrics.batch_queue(&format!("{model}/{number}/batch")),
                metrics.model(model, number),
                metrics.batch_plan(model, number),
            )
        });
        InferenceStage { version, batcher }
    }

    /// Runs one request's inputs (validated against the signature, in its
    /// order) through the model: batched with others when batching is on.
    /// `caller` is the pipeline (or model) it comes from.
    pub async fn run(
        &self,
        inputs: Vec<Tensor>,
        deadline: Deadline,
        priority: Priority,
        caller: &Arc<str>,
    ) -> Result<Vec<Tensor>> {
        match &self.batcher {
            Some(batcher) => batcher.run(inputs, deadline, priority, caller).await,
            None => {
                deadline.check("before inference")?;
                let batch = Batch::single(inputs).due(deadline.instant()).high_priority(priority == Priority::High);
                run_now(self.version.backend().as_ref(), batch, deadline).await
            }
        }
    }

    /// The version it runs.
    pub fn version(&self) -> &Arc<ModelVersion> {
        &self.version
    }
}
