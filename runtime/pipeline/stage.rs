//! A pipeline stage — preprocessing, postprocessing — and the workers that
//! run it.
//!
//! A [`Stage`] is CPU work on tensors. In a pipelined pipeline a
//! [`StageRunner`] owns a bounded queue and a pool of OS threads that take
//! requests from it, so stage work never runs on the async runtime's
//! threads and stages of different requests overlap; a full queue refuses
//! the request at once. In a sequential pipeline the same stage runs in the
//! caller's task instead, one stage after another.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::oneshot;

use super::deadline::Deadline;
use crate::error::{Error, Result};
use crate::metrics::QueueMetrics;
use crate::tensor::spec::TensorSpec;
use crate::tensor::NamedTensor;

/// CPU work between the client and the model, or the model and the client.
pub trait Stage: Send + Sync + 'static {
    /// What it is, for messages and metrics: `top_k`, `image_normalize`, …
    fn name(&self) -> &str;

    /// The tensors it takes (-1 where any size goes).
    fn inputs(&self) -> &[TensorSpec];

    /// The tensors it returns, in order.
    fn outputs(&self) -> &[TensorSpec];

    /// Turns inputs into outputs. Runs on a stage worker thread. Long work
    /// calls [`StageCx::check`] between pieces, so a request whose client
    /// left or whose deadline passed stops using the CPU.
    fn process(&self, inputs: Vec<NamedTensor>, cx: &StageCx<'_>) -> Result<Vec<NamedTensor>>;
}

/// What a stage knows about the request it works on: whether it is still
/// worth finishing, and how much it may allocate for it.
pub struct StageCx<'a> {
    deadline: Deadline,
    /// True once the client has gone (its answer would be dropped).
    gone: &'a (dyn Fn() -> bool + Sync),
    /// The most bytes one tensor the stage builds may hold.
    pub max_tensor_bytes: usize,
}

impl<'a> StageCx<'a> {
    /// A context for one request.
    pub fn new(deadline: Deadline, gone: &'a (dyn Fn() -> bool + Sync), max_tensor_bytes: usize) -> StageCx<'a> {
        StageCx { deadline, gone, max_tensor_bytes }
    }

    /// `Ok` while the request is worth finishing; DEADLINE_EXCEEDED or
    /// CANCELLED, saying `at` where, once it is not.
    pub fn check(&self, at: &str) -> Result<()> {
        if (self.gone)() {
            return Err(Error::Cancelled(format!("the client went away {at}")));
        }
        self.deadline.check(at)
    }
}

/// Never gone: for work whose caller always waits (tests, warm-up).
pub fn never_gone() -> bool {
    false
}

struct StageJob {
    tensors: Vec<NamedTensor>,
    deadline: Deadline,
    max_tensor_bytes: usize,
    enqueued: Instant,
    reply: oneshot::Sender<Result<Vec<NamedTensor>>>,
    /// The request's span: what a worker (or a plugin's captured output)
    /// logs carries the request id.
    span: tracing::Span,
}

/// Runs one stage of one pipeline, through its own queue and threads or
/// in the caller's task.
pub struct StageRunner {
    stage: Arc<dyn Stage>,
    /// "the postprocess stage of pipeline 'cnn-top5'", for messages.
    label: Arc<str>,
    queue: Option<async_channel::Sender<StageJob>>,
    capacity: usize,
    metrics: QueueMetrics,
}

impl StageRunner {
    /// A stage with `workers` threads fed by a queue of `capacity` requests.
    pub fn pipelined(
        stage: Arc<dyn Stage>,
        label: String,
        workers: usize,
        capacity: usize,
        metrics: QueueMetrics,
    ) -> Result<StageRunner> {
        let label: Arc<str> = label.into();
        let (queue, jobs) = async_channel::bounded::<StageJob>(capacity.max(1));
        for i in 0..workers.max(1) {
            let jobs = jobs.clone();
            let stage = stage.clone();
            let worker_label = label.clone();
            let metrics = metrics.clone();
            std::thread::Builder::new()
                .name(format!("stage-{}-{i}", stage.name()))
                .spawn(move || worker(stage, &worker_label, jobs, metrics))
                .map_err(|e| Error::internal(format!("{label}: starting a worker thread failed: {e}")))?;
        }
        Ok(StageRunner { stage, label, queue: Some(queue), capacity, metrics })
    }

    /// A stage run in the caller's task.
    pub fn sequential(stage: Arc<dyn Stage>, label: String, metrics: QueueMetrics) -> StageRunner {
        StageRunner { stage, label: label.into(), queue: None, capacity: 0, metrics }
    }

    /// The stage.
    pub fn stage(&self) -> &Arc<dyn Stage> {
        &self.stage
    }

    /// Runs the stage on one request's tensors; `max_tensor_bytes` bounds
    /// what the stage may build for it.
    pub async fn run(
        &self,
        tensors: Vec<NamedTensor>,
        deadline: Deadline,
        max_tensor_bytes: usize,
    ) -> Result<Vec<NamedTensor>> {
        if deadline.expired() {
            self.metrics.expired.inc();
            return Err(Error::deadline_exceeded(&format!("before {}", self.label)));
        }
        let Some(queue) = &self.queue else {
            // Sequential: here, now, on this thread; the runtime moves its
            // other tasks away while the stage blocks it.
            let cx = StageCx::new(deadline, &never_gone, max_tensor_bytes);
            return tokio::task::block_in_place(|| run_stage(&*self.stage, &self.label, tensors, &cx, &self.metrics));
        };
        let (reply, answer) = oneshot::channel();
        let job = StageJob {
            tensors,
            deadline,
            max_tensor_bytes,
            enqueued: Instant::now(),
            reply,
            span: tracing::Span::current(),
        };
        queue.try_send(job).map_err(|e| match e {
            async_channel::TrySendError::Full(_) => {
                self.metrics.full.inc();
                Error::queue_full(&format!("the queue of {}", self.label), self.capacity)
            }
            async_channel::TrySendError::Closed(_) => Error::unavailable(format!("{} has stopped", self.label)),
        })?;
        self.metrics.depth.inc();
        answer
            .await
            .unwrap_or_else(|_| Err(Error::internal(format!("{} dropped a request, this is a bug", self.label))))
    }
}

impl Drop for StageRunner {
    fn drop(&mut self) {
        // Workers finish what they hold, see the closed queue and exit.
        if let Some(queue) = &self.queue {
            queue.close();
        }
    }
}

fn worker(stage: Arc<dyn Stage>, label: &str, jobs: async_channel::Receiver<StageJob>, metrics: QueueMetrics) {
    while let Ok(job) = jobs.recv_blocking() {
        let _in_request = job.span.enter();
        metrics.depth.dec();
        metrics.wait.observe(job.enqueued.elapsed().as_secs_f64());
        if job.reply.is_closed() {
            metrics.cancelled.inc();
            continue;
        }
        if job.deadline.expired() {
            metrics.expired.inc();
            let _ = job.reply.send(Err(Error::deadline_exceeded(&format!("in the queue of {label}"))));
            continue;
        }
        let reply = job.reply;
        let gone = || reply.is_closed();
        let cx = StageCx::new(job.deadline, &gone, job.max_tensor_bytes);
        let result = run_stage(&*stage, label, job.tensors, &cx, &metrics);
        if let Err(Error::Cancelled(_)) = &result {
            metrics.cancelled.inc();
        }
        let _ = reply.send(result);
    }
}

/// Runs the stage, timing it and turning a panic into an error. What a
/// stage returns is trusted here: built-in stages are the server's own
/// code, and a plugin's outputs were checked against its declaration by
/// the plugin host, the one place untrusted outputs are checked.
fn run_stage(
    stage: &dyn Stage,
    label: &str,
    tensors: Vec<NamedTensor>,
    cx: &StageCx<'_>,
    metrics: &QueueMetrics,
) -> Result<Vec<NamedTensor>> {
    let started = Instant::now();
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| stage.process(tensors, cx)))
        .unwrap_or_else(|_| Err(Error::internal(format!("{label} panicked"))));
    metrics.busy.observe(started.elapsed().as_secs_f64());
    result
}
