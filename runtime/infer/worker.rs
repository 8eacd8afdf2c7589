//! The queue between a backend and its inference threads: a [`Job`] is a
//! batch and where its outputs go, taken by whichever thread is free.
//!
//! The queue holds one batch per thread, so the next batch is ready when a
//! thread finishes, and queueing beyond that happens in front of the
//! backend, where it is bounded and visible.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use tokio::sync::oneshot;

use super::inline::InlineRule;
use super::{Batch, Completion};
use crate::error::{Error, Result};
use crate::metrics::ModelMetrics;
use crate::tensor::Tensor;

/// A batch to run and where its outputs go.
pub struct Job {
    pub batch: Batch,
    pub reply: Reply,
    /// Which of the backend's signatures runs it (a SavedModel's other
    /// signatures); `None`: its main one, the only one a backend of one
    /// signature has.
    pub signature: Option<Arc<str>>,
}

/// Where a batch's outputs go.
pub enum Reply {
    /// To a task awaiting them (`run`).
    Waiting(oneshot::Sender<Result<Vec<Tensor>>>),
    /// To a completion called on the inference thread (`submit`).
    Done(Completion),
}

impl Reply {
    /// Everyone waiting for the batch has gone (cancelled or timed out).
    pub fn abandoned(&self) -> bool {
        matches!(self, Reply::Waiting(sender) if sender.is_closed())
    }

    /// Hands over the outputs.
    pub fn send(self, result: Result<Vec<Tensor>>) {
        match self {
            Reply::Waiting(sender) => {
                let _ = sender.send(result);
            }
            Reply::Done(done) => done(result),
        }
    }
}

/// The answer to a batch sent to a version whose threads have stopped.
pub fn unloading() -> Error {
    Error::unavailable("the model version is being unloaded")
}

/// `Backend::run` over a job queue: queues the batch, waiting for room,
/// and awaits its outputs.
pub fn run(jobs: &async_channel::Sender<Job>, batch: Batch) -> BoxFuture<'static, Result<Vec<Tensor>>> {
    run_signature(jobs, batch, None)
}

/// [`run`] through one of the backend's signatures (`None`: its main one).
pub fn run_signature(
    jobs: &async_channel::Sender<Job>,
    batch: Batch,
    signature: Option<Arc<str>>,
) -> BoxFuture<'static, Result<Vec<Tensor>>> {
    let jobs = jobs.clone();
    Box::pin(async move {
        let (reply, answer) = oneshot::channel();
        jobs.send(Job { batch, reply: Reply::Waiting(reply), signature }).await.map_err(|_| unloading())?;
        answer.await.map_err(|_| Error::internal("the inference thread stopped before answering"))?
    })
}

/// `Backend::submit` over a job queue: queues the batch, or, when more
/// batches are in flight than threads (`num_batch_threads` above them),
/// waits for room off the caller's path.
pub fn submit(jobs: &async_channel::Sender<Job>, batch: Batch, done: Completion) {
    match jobs.try_send(Job { batch, reply: Reply::Done(done), signature: None }) {
        Ok(()) => {}
        Err(async_channel::TrySendError::Full(job)) => {
            let jobs = jobs.clone();
            tokio::spawn(async move {
                if let Err(async_channel::SendError(job)) = jobs.send(job).await {
                    job.reply.send(Err(unloading()));
                }
            });
        }
        Err(async_channel::TrySendError::Closed(job)) => job.reply.send(Err(unloading())),
    }
}

/// Runs `run` over `batch` on whichever thread called, timed: the
/// `metrics` count and time it, and `inline` learns what a successful run
/// of its size cost. A panic in the engine is an INTERNAL error naming
/// `engine`, not a lost thread.
pub fn timed_run(
    metrics: &ModelMetrics,
    inline: &InlineRule,
    batch: &Batch,
    engine: &str,
    run: impl FnOnce() -> Result<Vec<Tensor>>,
) -> Result<Vec<Tensor>> {
    let started = Instant::now();
    let result = std::panic::catch_unwind(AssertUnwindSafe(run))
        .unwrap_or_else(|_| Err(Error::internal(format!("{engine} panicked while running the model"))));
    let seconds = started.elapsed().as_secs_f64();
    metrics.runs.inc();
    metrics.seconds.observe(seconds);
    if result.is_ok() {
        inline.record(batch.run_elements(), seconds);
    }
    result
}
