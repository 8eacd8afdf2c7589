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
use crate::api::metrics::QueueMetrics;
use crate::error::{Error, Result};
use crate::infer::{check_tensor, TensorSpec};
use crate::tensor::NamedTensor;

/// CPU work between the client and the model, or the model and the client.
pub trait Stage: Send + Sync + 'static {
    /// What it is, for messages and metrics: `top_k`, `image_normalize`, …
    fn name(&self) -> &str;

    /// The tensors it takes (-1 where any size goes).
    fn inputs(&self) -> &[TensorSpec];

    /// The tensors it returns, in order.
    fn outputs(&self) -> &[TensorSpec];

    /// Turns inputs into outputs. Runs on a stage worker thread.
    fn process(&self, inputs: Vec<NamedTensor>) -> Result<Vec<NamedTensor>>;
}

struct StageJob {
    tensors: Vec<NamedTensor>,
    deadline: Deadline,
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

    /// Runs the stage on one request's tensors.
    pub async fn run(&self, tensors: Vec<NamedTensor>, deadline: Deadline) -> Result<Vec<NamedTensor>> {
        if deadline.expired() {
            self.metrics.expired.inc();
            return Err(Error::deadline_exceeded(&format!("before {}", self.label)));
        }
        let Some(queue) = &self.queue else {
            // Sequential: here, now, on this thread; the runtime moves its
            // other tasks away while the stage blocks it.
            return tokio::task::block_in_place(|| run_stage(&*self.stage, &self.label, tensors, &self.metrics));
        };
        let (reply, answer) = oneshot::channel();
        let job = StageJob { tensors, deadline, enqueued: Instant::now(), reply, span: tracing::Span::current() };
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
        let result = run_stage(&*stage, label, job.tensors, &metrics);
        let _ = job.reply.send(result);
    }
}

/// Runs the stage, timing it, turning a panic into an error, and checking
/// that what it returns is what it declared.
fn run_stage(
    stage: &dyn Stage,
    label: &str,
    tensors: Vec<NamedTensor>,
    metrics: &QueueMetrics,
) -> Result<Vec<NamedTensor>> {
    let started = Instant::now();
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| stage.process(tensors)))
        .unwrap_or_else(|_| Err(Error::internal(format!("{label} panicked"))));
    metrics.busy.observe(started.elapsed().as_secs_f64());
    let outputs = result?;
    check_declared(label, stage.outputs(), &outputs)?;
    Ok(outputs)
}

/// A stage's outputs must be exactly what it declared: the same names in
/// the same order, dtypes and shapes that fit.
pub fn check_declared(label: &str, declared: &[TensorSpec], outputs: &[NamedTensor]) -> Result<()> {
    struct AsDeclared<'a>(&'a str);
    impl std::fmt::Display for AsDeclared<'_> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{} (as declared)", self.0)
        }
    }
    let owner = AsDeclared(label);
    if outputs.len() != declared.len() || outputs.iter().zip(declared).any(|(o, d)| o.name != d.name) {
        let got: Vec<&str> = outputs.iter().map(|o| o.name.as_str()).collect();
        let want: Vec<&str> = declared.iter().map(|d| d.name.as_str()).collect();
        return Err(Error::internal(format!("{label} returned outputs {got:?}, but declared {want:?}")));
    }
    for (output, spec) in outputs.iter().zip(declared) {
        check_tensor(&owner, "output", spec, &output.tensor).map_err(|e| Error::internal(e.message().to_string()))?;
    }
    Ok(())
}
