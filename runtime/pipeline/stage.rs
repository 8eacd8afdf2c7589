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
use super::lanes::{self, LanesReceiver, LanesSender, Refused};
use super::priority::Priority;
use super::trace;
use crate::error::{Error, Result};
use crate::infer::inline::InlineRule;
use crate::metrics::QueueMetrics;
use crate::tensor::spec::TensorSpec;
use crate::tensor::NamedTensor;

/// CPU work between the client and the model, or the model and the client.
pub trait Stage: Send + Sync + 'static {
    /// Its name and the tensors it takes and returns, fixed when it is built.
    fn io(&self) -> &StageIo;

    /// What it is, for messages and metrics: `top_k`, `image_normalize`, …
    fn name(&self) -> &str {
        &self.io().name
    }

    /// The tensors it takes (-1 where any size goes).
    fn inputs(&self) -> &[TensorSpec] {
        &self.io().inputs
    }

    /// The tensors it returns, in order.
    fn outputs(&self) -> &[TensorSpec] {
        &self.io().outputs
    }

    /// Turns inputs into outputs. Runs on a stage worker thread. Long work
    /// calls [`StageCx::check`] between pieces, so a request whose client
    /// left or whose deadline passed stops using the CPU.
    fn process(&self, inputs: Vec<NamedTensor>, cx: &StageCx<'_>) -> Result<Vec<NamedTensor>>;

    /// True while the same inputs may get different answers from it (a
    /// plugin canary deals requests to two versions): a response cache
    /// must not keep them.
    fn varies(&self) -> bool {
        false
    }
}

/// A stage's name and interface: what the pipeline checks its neighbours
/// against when it is built.
#[derive(Debug, Clone)]
pub struct StageIo {
    pub name: String,
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
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

    /// The request's deadline.
    pub fn deadline(&self) -> Deadline {
        self.deadline
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
    /// logs carries the request id; a traced request's stage span.
    span: tracing::Span,
    /// A traced request's wait for a worker, ended when one takes it.
    queue_wait: tracing::Span,
    /// Where the run's cost is recorded, with its size, when cheap runs
    /// may run inline.
    measure: Option<(Arc<InlineRule>, usize)>,
}

/// Runs one stage of one pipeline, through its own queue and threads or
/// in the caller's task.
pub struct StageRunner {
    stage: Arc<dyn Stage>,
    /// "the postprocess stage of pipeline 'cnn-top5'", for messages.
    label: Arc<str>,
    queue: Option<LanesSender<StageJob>>,
    capacity: usize,
    metrics: QueueMetrics,
    /// Present when a request measured cheap may run in the caller's task
    /// instead of waking a worker (a graph's built-ins: microseconds of
    /// work, where a hand-off to a worker and back costs tens).
    inline: Option<Arc<InlineRule>>,
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
        let (queue, jobs) = lanes::bounded::<StageJob>(capacity.max(1));
        for i in 0..workers.max(1) {
            let jobs = jobs.clone();
            let stage = stage.clone();
            let worker_label = label.clone();
            let metrics = metrics.clone();
            crate::threads::spawn_compute(format!("stage-{}-{i}", stage.name()), move || {
                worker(stage, &worker_label, jobs, metrics)
            })
            .map_err(|e| Error::internal(format!("{label}: starting a worker thread failed: {e}")))?;
        }
        Ok(StageRunner { stage, label, queue: Some(queue), capacity, metrics, inline: None })
    }

    /// The same runner, running a request in the caller's task when the
    /// stage's runs of its size are measured to cost no more than
    /// `budget` (`server.inline_inference_micros`); zero: never. Only for
    /// the server's own code: a plugin runs on its workers, whatever it
    /// cost before.
    pub fn inline_when_cheap(mut self, budget: std::time::Duration) -> StageRunner {
        if self.queue.is_some() && !budget.is_zero() {
            self.inline = Some(Arc::new(InlineRule::new(budget)));
        }
        self
    }

    /// A stage run in the caller's task.
    pub fn sequential(stage: Arc<dyn Stage>, label: String, metrics: QueueMetrics) -> StageRunner {
        StageRunner { stage, label: label.into(), queue: None, capacity: 0, metrics, inline: None }
    }

    /// Requests waiting for a worker now.
    pub fn queued(&self) -> usize {
        self.queue.as_ref().map_or(0, |queue| queue.len())
    }

    /// The stage.
    pub fn stage(&self) -> &Arc<dyn Stage> {
        &self.stage
    }

    /// Runs the stage on one request's tensors; `max_tensor_bytes` bounds
    /// what the stage may build for it. Workers take higher `priority`
    /// requests first.
    pub async fn run(
        &self,
        tensors: Vec<NamedTensor>,
        deadline: Deadline,
        priority: Priority,
        max_tensor_bytes: usize,
    ) -> Result<Vec<NamedTensor>> {
        if deadline.expired() {
            self.metrics.expired.inc();
            return Err(Error::deadline_exceeded(&format!("before {}", self.label)));
        }
        let elements: usize = tensors.iter().map(|t| t.tensor.len()).sum();
        let here = self.queue.is_none() || self.inline.as_ref().is_some_and(|rule| rule.allows(elements));
        if !here {
            return self.hand_off(tensors, deadline, priority, max_tensor_bytes, elements).await;
        }
        // Sequential, or measured cheap: here, now, on this thread.
        let cx = StageCx::new(deadline, &never_gone, max_tensor_bytes);
        let span = trace::current_step(self.stage.name());
        let started = Instant::now();
        let result = crate::threads::run_blocking_here(|| {
            span.in_scope(|| run_stage(&*self.stage, &self.label, tensors, &cx, &self.metrics))
        });
        if let Some(rule) = &self.inline {
            rule.record(elements, started.elapsed().as_secs_f64());
        }
        result
    }

    /// Sends one request to the workers and waits for their answer.
    async fn hand_off(
        &self,
        tensors: Vec<NamedTensor>,
        deadline: Deadline,
        priority: Priority,
        max_tensor_bytes: usize,
        elements: usize,
    ) -> Result<Vec<NamedTensor>> {
        let Some(queue) = &self.queue else {
            return Err(Error::internal(format!("{} has no workers, this is a bug", self.label)));
        };
        let (reply, answer) = oneshot::channel();
        let job = StageJob {
            tensors,
            deadline,
            max_tensor_bytes,
            enqueued: Instant::now(),
            reply,
            span: tracing::Span::current(),
            queue_wait: trace::current_step("queue_wait"),
            measure: self.inline.clone().map(|rule| (rule, elements)),
        };
        queue.try_send(priority, job).map_err(|e| match e {
            Refused::Full(_) => {
                self.metrics.full.inc();
                Error::queue_full(&format!("the queue of {}", self.label), self.capacity)
            }
            Refused::Closed(_) => Error::unavailable(format!("{} has stopped", self.label)),
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

fn worker(stage: Arc<dyn Stage>, label: &str, jobs: LanesReceiver<StageJob>, metrics: QueueMetrics) {
    while let Some(job) = jobs.recv_blocking() {
        drop(job.queue_wait);
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
        let started = Instant::now();
        let result =
            trace::step(&job.span, stage.name()).in_scope(|| run_stage(&*stage, label, job.tensors, &cx, &metrics));
        if let Some((rule, elements)) = &job.measure {
            rule.record(*elements, started.elapsed().as_secs_f64());
        }
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

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;
    use crate::metrics::Metrics;
    use crate::tensor::{DType, Tensor};

    /// Passes its input through once the test lets it (one message on
    /// `gate` per call); panics on a tensor named "panic".
    struct Gated {
        io: StageIo,
        gate: Mutex<mpsc::Receiver<()>>,
        started: tokio::sync::mpsc::UnboundedSender<()>,
    }

    impl Stage for Gated {
        fn io(&self) -> &StageIo {
            &self.io
        }
        fn process(&self, inputs: Vec<NamedTensor>, cx: &StageCx<'_>) -> Result<Vec<NamedTensor>> {
            assert!(inputs[0].name != "panic", "a stage bug");
            let _ = self.started.send(());
            self.gate.lock().expect("gate").recv().map_err(|_| Error::internal("gate closed"))?;
            cx.check("in the gated stage")?;
            Ok(inputs)
        }
    }

    struct Harness {
        runner: Arc<StageRunner>,
        open: mpsc::Sender<()>,
        started: tokio::sync::mpsc::UnboundedReceiver<()>,
    }

    fn gated(workers: usize, capacity: usize) -> Harness {
        let (open, gate) = mpsc::channel();
        let (started_tx, started) = tokio::sync::mpsc::unbounded_channel();
        let specs = vec![TensorSpec::new("x", DType::F32, vec![-1])];
        let io = StageIo { name: "gated".into(), inputs: specs.clone(), outputs: specs };
        let stage = Arc::new(Gated { io, gate: Mutex::new(gate), started: started_tx });
        let metrics = Metrics::new().queue("test");
        let runner =
            StageRunner::pipelined(stage, "the gated stage".into(), workers, capacity, metrics).expect("start");
        Harness { runner: Arc::new(runner), open, started }
    }

    /// Waits (at most 10 s) until `runner` holds `n` waiting requests.
    async fn until_queued(runner: &StageRunner, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while runner.queued() != n {
            assert!(tokio::time::Instant::now() < deadline, "the queue holds {}, not {n}", runner.queued());
            tokio::task::yield_now().await;
        }
    }

    fn input(name: &str) -> Vec<NamedTensor> {
        vec![NamedTensor::new(name, Tensor::from_values(vec![1], &[1.0f32]))]
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_queue_refuses_at_once_and_queued_work_is_answered() {
        let Harness { runner, open, mut started } = gated(1, 1);
        let run = |runner: Arc<StageRunner>| async move {
            runner.run(input("x"), Deadline::NONE, Priority::Normal, 1 << 20).await
        };
        // The first request holds the only worker, the second the only place.
        let first = tokio::spawn(run(runner.clone()));
        started.recv().await.expect("the first request reached the stage");
        let second = tokio::spawn(run(runner.clone()));
        until_queued(&runner, 1).await;
        let refused = runner.run(input("x"), Deadline::NONE, Priority::Normal, 1 << 20).await.unwrap_err();
        assert!(matches!(refused, Error::QueueFull { capacity: 1, .. }), "{refused}");
        assert!(refused.message().contains("the gated stage"), "{refused}");
        open.send(()).expect("open");
        open.send(()).expect("open");
        assert_eq!(first.await.expect("join").expect("first")[0].name, "x");
        assert_eq!(second.await.expect("join").expect("second")[0].name, "x");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_stage_answers_internal_and_its_worker_keeps_serving() {
        let Harness { runner, open, .. } = gated(1, 4);
        let err = runner.run(input("panic"), Deadline::NONE, Priority::Normal, 1 << 20).await.unwrap_err();
        assert_eq!(err.code(), crate::error::Code::Internal);
        assert!(err.message().contains("panicked"), "{err}");
        open.send(()).expect("open");
        assert!(runner.run(input("x"), Deadline::NONE, Priority::Normal, 1 << 20).await.is_ok());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_expired_request_never_reaches_the_stage() {
        let Harness { runner, .. } = gated(1, 4);
        let past = Deadline::after(Duration::ZERO);
        let err = runner.run(input("x"), past, Priority::Normal, 1 << 20).await.unwrap_err();
        assert!(matches!(err, Error::DeadlineExceeded { .. }), "{err}");
        assert!(err.message().contains("before the gated stage"), "{err}");
    }

    #[test]
    fn a_context_reports_a_client_that_left() {
        let gone = || true;
        let cx = StageCx::new(Deadline::NONE, &gone, 0);
        assert!(matches!(cx.check("here"), Err(Error::Cancelled(_))));
        let cx = StageCx::new(Deadline::NONE, &never_gone, 0);
        assert!(cx.check("here").is_ok());
    }
}
