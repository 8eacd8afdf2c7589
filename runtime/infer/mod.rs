//! Inference: the [`Backend`] trait that runs a batch through a model, and
//! its implementations ([`onnx`]: ONNX Runtime in-process; [`tfserving`]:
//! forwarded to TF Serving instances).
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
pub mod tfserving;

use futures::future::BoxFuture;

use crate::error::Result;
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
}

impl Batch {
    /// One request, run exactly as sent: nothing joined, nothing padded.
    /// Only the batcher, for models whose every input shares dimension 0,
    /// joins and pads.
    pub fn single(inputs: Vec<Tensor>) -> Batch {
        Batch { requests: vec![inputs], padded_rows: 0, deadline: None }
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
