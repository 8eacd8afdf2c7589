//! Inference: the [`Backend`] trait that runs a batch through a model, and
//! its implementations ([`onnx`]: ONNX Runtime in-process; [`tensorflow`]:
//! SavedModels in TensorFlow in-process; [`tfserving`]: forwarded to TF
//! Serving instances). [`worker`] is the job queue in front of the
//! in-process backends' inference threads.
//!
//! A backend receives a [`Batch`] — one or more requests' inputs, already
//! validated against its [`Signature`] — and returns the outputs for the
//! whole batch; the batcher in `pipeline/` splits them per request. Backends
//! do their blocking work on threads of their own, so `run` is a future the
//! async runtime only waits on, except a batch cheap enough to run on
//! the caller's thread ([`inline`]). [`latency`] keeps what each batch
//! size costs a model version, for the auto batcher.

pub mod inline;
pub mod latency;
pub mod onnx;
pub mod tensorflow;
pub mod tfserving;
pub mod worker;

use std::collections::BTreeMap;

use futures::future::BoxFuture;

use crate::error::Result;
use crate::proto::tensorflow::SignatureDef;
use crate::tensor::spec::Signature;
use crate::tensor::Tensor;

/// Requests to run together through a model.
#[derive(Debug)]
pub struct Batch {
    /// Each request's inputs, in signature order.
    pub requests: Vec<Vec<Tensor>>,
    /// The batch size to run: the sum of the requests' rows, or more when
    /// `allowed_batch_sizes` asks for padding. 0 for a single request run
    /// exactly as sent: its inputs need not share a dimension 0 at all.
    pub padded_rows: usize,
    /// When the last request of the batch stops waiting for it: a backend
    /// that calls another server passes it on. `None`: no deadline.
    pub deadline: Option<tokio::time::Instant>,
    /// Runs on the sessions the backend keeps for high-priority batches
    /// (`onnx.high_priority_sessions`), when it keeps some: set for a batch
    /// of high-priority requests that holds one of their slots in the
    /// batcher, or an unbatched high-priority request.
    pub high_priority: bool,
}

impl Batch {
    /// One request, run exactly as sent: nothing joined, nothing padded.
    /// Only the batcher, for models whose every input shares dimension 0,
    /// joins and pads.
    pub fn single(inputs: Vec<Tensor>) -> Batch {
        Batch { requests: vec![inputs], padded_rows: 0, deadline: None, high_priority: false }
    }

    /// The same batch, marked as of high priority or not.
    pub fn high_priority(mut self, high: bool) -> Batch {
        self.high_priority = high;
        self
    }

    /// The same batch, due by `deadline`.
    pub fn due(mut self, deadline: Option<tokio::time::Instant>) -> Batch {
        self.deadline = deadline;
        self
    }

    /// The rows the model runs: padded, or the real rows.
    pub fn run_rows(&self) -> usize {
        if self.padded_rows == 0 {
            self.rows()
        } else {
            self.padded_rows
        }
    }

    /// The elements of every input the model runs, padding included: the
    /// size a run's cost grows with (rows alone would call a `[1, 2M]`
    /// request as cheap as a `[1, 8]` one).
    pub fn run_elements(&self) -> usize {
        let sent: usize = self.requests.iter().flatten().map(Tensor::len).sum();
        let rows = self.rows();
        if self.padded_rows > rows && rows > 0 {
            sent.saturating_mul(self.padded_rows).div_ceil(rows)
        } else {
            sent
        }
    }

    /// Total rows of real (not padding) data.
    pub fn rows(&self) -> usize {
        self.requests.iter().map(|inputs| inputs.first().map_or(1, Tensor::rows)).sum()
    }
}

/// What to do with a batch's outputs, called once on whichever thread
/// finished the batch.
pub type Completion = Box<dyn FnOnce(Result<Vec<Tensor>>) + Send>;

/// Something that runs batches through one version of a model.
pub trait Backend: Send + Sync + 'static {
    /// The model's inputs and outputs.
    fn signature(&self) -> &Signature;

    /// How many batches it runs at once (its sessions or inference
    /// threads), when it has a bound of its own: what the batcher keeps in
    /// flight unless `num_batch_threads` says otherwise.
    fn parallelism(&self) -> Option<usize> {
        None
    }

    /// How many high-priority batches it runs at once on sessions of
    /// their own, beside [`Backend::parallelism`]'s (0: none kept).
    fn high_priority_parallelism(&self) -> usize {
        0
    }

    /// Every signature of the model as its own file declares them (a
    /// SavedModel's MetaGraphDef), for GetModelMetadata; `None` when the
    /// model has only [`Backend::signature`].
    fn signature_defs(&self) -> Option<&BTreeMap<String, SignatureDef>> {
        None
    }

    /// Another signature the model serves for Predict by its key (a
    /// SavedModel's), when it has one of that key besides its main one.
    fn other_signature(&self, _key: &str) -> Option<&Signature> {
        None
    }

    /// Runs one request's inputs (checked against
    /// [`Backend::other_signature`]`(key)`, in its order) through that
    /// signature, unbatched.
    fn run_other(&self, key: &str, _inputs: Vec<Tensor>) -> BoxFuture<'static, Result<Vec<Tensor>>> {
        let error = crate::error::Error::not_found(format!("the model has no signature '{key}'"));
        Box::pin(async move { Err(error) })
    }

    /// Runs a batch; the outputs come in signature order and cover the
    /// whole (padded) batch. Waits for a free worker when all are busy: the
    /// queues in front of the backend are where requests are refused.
    fn run(&self, batch: Batch) -> BoxFuture<'static, Result<Vec<Tensor>>>;

    /// Runs `batch` on the calling thread, when the backend measured
    /// batches of its size to cost less than its inline budget and has a
    /// free session now (`inline`); `None` when it did not run it, and the
    /// batch goes to `run` or `submit`. Never waits for anything but the
    /// run itself.
    fn run_inline(&self, _batch: &Batch) -> Option<Result<Vec<Tensor>>> {
        None
    }

    /// Runs a batch and hands its outputs to `done`. A backend with threads
    /// of its own calls `done` on the thread that ran the batch, so the
    /// batch's requests are woken straight from there, with no task in
    /// between. This default runs `run` on the async runtime. Call it from
    /// within the runtime.
    fn submit(&self, batch: Batch, done: Completion) {
        let running = self.run(batch);
        tokio::spawn(async move { done(running.await) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_as_large_as_its_elements_padding_included() {
        let small = Batch::single(vec![Tensor::from_values(vec![1, 8], &[0f32; 8])]);
        assert_eq!(small.run_elements(), 8);
        let wide = Batch::single(vec![Tensor::from_values(vec![1, 4096], &[0f32; 4096])]);
        assert_eq!((wide.run_rows(), wide.run_elements()), (1, 4096), "one row, but 4096 elements");
        let two_inputs = Batch::single(vec![
            Tensor::from_values(vec![2, 3], &[0i64; 6]),
            Tensor::from_values(vec![2, 5], &[0f32; 10]),
        ]);
        assert_eq!(two_inputs.run_elements(), 16);
        let padded = Batch {
            requests: vec![vec![Tensor::from_values(vec![3, 4], &[0f32; 12])]],
            padded_rows: 4,
            deadline: None,
            high_priority: false,
        };
        assert_eq!(padded.run_elements(), 16);
    }
}
