//! The dynamic batcher of one model version.
//!
//! One task owns the queue of waiting requests and forms batches as its
//! [`plan`] says: a batch closes when it holds the rows the plan wants, or
//! when the plan's close time comes (fixed mode: `max_batch_size` rows or
//! `batch_timeout_micros` after its first request, as TF Serving; auto
//! mode: sizes and waits learned to a latency target). It then waits for
//! one of `num_batch_threads` slots, takes in whatever arrived meanwhile up
//! to the plan's cap (so under load batches fill up by themselves), drops
//! requests whose client left or whose deadline passed, pads to the next
//! allowed batch size, and submits the batch to the backend. The thread
//! that runs the batch splits its outputs and wakes each request with its
//! own rows: no task sits between the model and the requests.
//!
//! A request that arrives at an empty queue when the plan would not wait
//! and a slot is free skips the batching task: it runs as a batch of its
//! own from the request's task, as an unbatched model would: inline on
//! that thread when the backend measured it cheap (`infer::inline`), else
//! with one hand-off to the model's thread and one back.
//!
//! The queue is bounded in rows (`max_enqueued_batches × max_batch_size`):
//! a request that does not fit is refused at once with RESOURCE_EXHAUSTED.
//! It is bounded in time too, under sustained overload: once the queue has
//! not been empty for [`OVERLOAD_INTERVAL`] (plus the fixed batch timeout),
//! a request that has waited longer than the model's `max_queue_wait_ms`
//! (plus that timeout and the last batch's run, the wait behind a running
//! batch that no discipline can spare) when its batch leaves is answered
//! RESOURCE_EXHAUSTED instead of run. That is the rule of CoDel and of
//! Facebook's "controlled delay" queues: a burst the model drains in time
//! is served however long its tail waited, while a standing queue never
//! spends the model on work whose caller has stopped waiting for a timely
//! answer. The admission in front keeps such drops rare.
//!
//! A request larger than `max_batch_size` is split into parts that travel
//! as separate requests and are joined again in order.

pub mod plan;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tracing::Instrument;
// Tokio's clock: the system's, and a test's paused clock when one pauses it.
use tokio::time::Instant;

use self::plan::{Plan, Policy};
use super::deadline::Deadline;
use super::priority::Priority;
use super::trace;
use crate::config::BatchingParameters;
use crate::error::{Error, Result};
use crate::infer::{Backend, Batch, Completion};
use crate::metrics::{BatchPlanMetrics, ModelMetrics, QueueMetrics};
use crate::models::ModelVersion;
use crate::tensor::batch::{concat_rows, split_rows};
use crate::tensor::spec::Signature;
use crate::tensor::Tensor;

/// A request (or part of one) waiting for a batch.
struct Entry {
    inputs: Vec<Tensor>,
    rows: usize,
    deadline: Deadline,
    /// Higher priorities join batches first.
    priority: Priority,
    /// The pipeline (or model name) that sent it: a batch of several
    /// callers is counted, to show that pipelines sharing a model share
    /// its batches.
    caller: Arc<str>,
    enqueued: Instant,
    reply: oneshot::Sender<Result<Vec<Tensor>>>,
    /// Its rows' place in the queue, freed when the batch leaves the queue.
    _place: OwnedSemaphorePermit,
    /// A traced request's inference span, which its batch links to.
    span: tracing::Span,
    /// A traced request's wait in the queue, ended when its batch leaves.
    _queue_wait: tracing::Span,
}

/// The entrance to one model version's batch queue.
pub struct Batcher {
    entries: mpsc::Sender<Entry>,
    queued_rows: Arc<Semaphore>,
    capacity_rows: usize,
    max_batch_size: usize,
    name: String,
    queue_metrics: QueueMetrics,
    shared: Arc<Shared>,
}

/// What the requests' side and the batching task share.
struct Shared {
    version: Arc<ModelVersion>,
    params: BatchingParameters,
    policy: Policy,
    /// One per batch that may run at once.
    slots: Arc<Semaphore>,
    /// One per high-priority batch that may run at once on the sessions
    /// the backend keeps for them, when it keeps some.
    high_priority_slots: Option<Arc<Semaphore>>,
    model_metrics: ModelMetrics,
    /// Present in auto mode.
    plan_metrics: Option<BatchPlanMetrics>,
    /// When the learned curve was last published to the metrics.
    curve_published: Mutex<Option<Instant>>,
    /// The longest a request may queue, beyond the batch timeout and one
    /// batch's run, before its batch leaves under sustained overload.
    max_queue_wait: Duration,
    /// How long the last batch ran, in microseconds: the wait behind a
    /// running batch that no queue discipline can spare a request.
    last_run_micros: AtomicU64,
    /// The queue's name, in errors.
    name: String,
}

/// A batch's right to run: a shared slot, or one the backend keeps for
/// high-priority batches (which then run on its kept sessions).
struct Slot {
    _permit: OwnedSemaphorePermit,
    kept: bool,
}

/// How long the queue must stay non-empty (beyond a fixed batch timeout)
/// before it counts as overloaded and stale requests are refused: a burst
/// drained within it is served whole.
pub const OVERLOAD_INTERVAL: Duration = Duration::from_millis(100);

/// The priority lanes of a batch queue (high, normal, low).
const LANES: usize = 3;

/// How often the learned curve is copied to the metrics.
const CURVE_PUBLISH_INTERVAL: Duration = Duration::from_secs(1);

impl Batcher {
    /// Starts the batching task for `version`. `name` names the queue in
    /// errors ("the batch queue of model 'cnn' version 1"); `threads` is the
    /// number of batches that may run at once; no request that waited
    /// longer than `max_queue_wait` runs.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        version: Arc<ModelVersion>,
        params: BatchingParameters,
        threads: usize,
        max_queue_wait: Duration,
        name: String,
        queue_metrics: QueueMetrics,
        model_metrics: ModelMetrics,
        plan_metrics: BatchPlanMetrics,
    ) -> Batcher {
        let capacity_rows = params.max_enqueued_batches.saturating_mul(params.max_batch_size);
        let max_batch_size = params.max_batch_size;
        // Each entry holds at least one row, so the row bound bounds entries too.
        let (entries, queue) = mpsc::channel(capacity_rows.max(1));
        let policy = Policy::new(&params, threads);
        let plan_metrics = matches!(policy, Policy::Auto(_)).then_some(plan_metrics);
        let high_priority_slots = match version.backend().high_priority_parallelism() {
            0 => None,
            kept => Some(Arc::new(Semaphore::new(kept))),
        };
        let shared = Arc::new(Shared {
            version,
            params,
            policy,
            slots: Arc::new(Semaphore::new(threads.max(1))),
            high_priority_slots,
            model_metrics,
            plan_metrics,
            curve_published: Mutex::new(None),
            max_queue_wait,
            last_run_micros: AtomicU64::new(0),
            name: name.clone(),
        });
        if let Some(metrics) = &shared.plan_metrics {
            metrics.publish_curve(shared.version.latency().snapshot().points());
        }
        let former = BatchFormer {
            queue,
            shared: shared.clone(),
            waiting: Default::default(),
            queue_metrics: queue_metrics.clone(),
            last_empty: Instant::now(),
        };
        tokio::spawn(former.run());
        Batcher {
            entries,
            queued_rows: Arc::new(Semaphore::new(capacity_rows)),
            capacity_rows,
            max_batch_size,
            name,
            queue_metrics,
            shared,
        }
    }

    /// Runs one request's inputs (signature order, validated) through the
    /// model in a batch with others, and returns its own outputs. Waiting
    /// requests of a higher `priority` join batches first.
    pub async fn run(
        &self,
        inputs: Vec<Tensor>,
        deadline: Deadline,
        priority: Priority,
        caller: &Arc<str>,
    ) -> Result<Vec<Tensor>> {
        if deadline.expired() {
            self.queue_metrics.expired.inc();
            return Err(Error::deadline_exceeded(&format!("before {}", self.name)));
        }
        let rows = inputs.first().map_or(1, Tensor::rows);
        let now = Instant::now();
        self.shared.policy.arrived(now, rows);
        if priority == Priority::High && rows <= self.max_batch_size {
            // A session kept for high priority that is free runs it now,
            // whatever lower requests wait.
            if let Some(permit) =
                self.shared.high_priority_slots.as_ref().and_then(|s| s.clone().try_acquire_owned().ok())
            {
                return self.shared.run_alone(inputs, rows, deadline, Slot { _permit: permit, kept: true }).await;
            }
        }
        if rows <= self.max_batch_size && self.queued_rows() == 0 {
            // Nothing waits: when the plan would not wait either, and a
            // slot is free, this request is a batch of its own.
            let plan = self.shared.plan(now, now, rows);
            if plan.close_at <= now {
                if let Ok(permit) = self.shared.slots.clone().try_acquire_owned() {
                    self.shared.publish(&plan, now);
                    return self.shared.run_alone(inputs, rows, deadline, Slot { _permit: permit, kept: false }).await;
                }
            }
        }
        let places = u32::try_from(rows).ok().and_then(|n| self.queued_rows.clone().try_acquire_many_owned(n).ok());
        let Some(mut places) = places else {
            self.queue_metrics.full.inc();
            if rows > self.capacity_rows {
                return Err(Error::resource_exhausted(format!(
                    "the request has {rows} rows, more than {} can hold ({} rows)",
                    self.name, self.capacity_rows
                )));
            }
            return Err(Error::queue_full(&self.name, self.capacity_rows));
        };
        if rows <= self.max_batch_size {
            return self
                .enqueue(inputs, rows, deadline, priority, caller, places)?
                .await
                .unwrap_or_else(|_| Err(self.stopped()));
        }
        // Larger than a batch: split into parts of at most max_batch_size rows.
        let mut sizes = vec![self.max_batch_size; rows / self.max_batch_size];
        if !rows.is_multiple_of(self.max_batch_size) {
            sizes.push(rows % self.max_batch_size);
        }
        let mut parts: Vec<Vec<Tensor>> = vec![Vec::with_capacity(inputs.len()); sizes.len()];
        for (i, input) in inputs.iter().enumerate() {
            for (part, piece) in split_rows(input, &sizes, &format!("input {i}"))?.into_iter().enumerate() {
                parts[part].push(piece);
            }
        }
        let mut answers = Vec::with_capacity(sizes.len());
        for (part, &n) in parts.into_iter().zip(&sizes) {
            let place = places.split(n).ok_or_else(|| Error::internal("row permits do not add up, this is a bug"))?;
            answers.push(self.enqueue(part, n, deadline, priority, caller, place)?);
        }
        let mut outputs: Vec<Vec<Tensor>> = Vec::with_capacity(answers.len());
        for answer in answers {
            outputs.push(answer.await.unwrap_or_else(|_| Err(self.stopped()))?);
        }
        let count = outputs.first().map_or(0, Vec::len);
        (0..count).map(|o| concat_rows(&outputs.iter().map(|part| part[o].clone()).collect::<Vec<_>>())).collect()
    }

    fn enqueue(
        &self,
        inputs: Vec<Tensor>,
        rows: usize,
        deadline: Deadline,
        priority: Priority,
        caller: &Arc<str>,
        place: OwnedSemaphorePermit,
    ) -> Result<oneshot::Receiver<Result<Vec<Tensor>>>> {
        let (reply, answer) = oneshot::channel();
        let entry = Entry {
            inputs,
            rows,
            deadline,
            priority,
            caller: caller.clone(),
            enqueued: Instant::now(),
            reply,
            _place: place,
            span: tracing::Span::current(),
            _queue_wait: trace::current_step("batch_queue"),
        };
        self.entries.try_send(entry).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => {
                self.queue_metrics.full.inc();
                Error::queue_full(&self.name, self.capacity_rows)
            }
            mpsc::error::TrySendError::Closed(_) => self.stopped(),
        })?;
        self.queue_metrics.depth.inc_by(rows as i64);
        Ok(answer)
    }

    fn stopped(&self) -> Error {
        Error::unavailable(format!("{} has stopped (the model version is unloading)", self.name))
    }

    /// Rows waiting now.
    pub fn queued_rows(&self) -> usize {
        self.capacity_rows - self.queued_rows.available_permits()
    }
}

impl Shared {
    /// The plan for a batch of `rows` rows whose oldest arrived at
    /// `oldest`.
    fn plan(&self, now: Instant, oldest: Instant, rows: usize) -> Plan {
        self.policy.plan(self.version.latency(), now, oldest, rows)
    }

    /// Shows, in auto mode, the plan a batch was dispatched under (made
    /// at `planned`): once a batch, not once a request, so that requests
    /// on every core do not write the same gauges.
    fn publish(&self, plan: &Plan, planned: Instant) {
        if let Some(metrics) = &self.plan_metrics {
            metrics.want_rows.set(plan.want as i64);
            metrics.cap_rows.set(plan.cap as i64);
            metrics.wait_seconds.set(plan.close_at.saturating_duration_since(planned).as_secs_f64());
            metrics.arrival_rate.set(plan.arrival_rate);
        }
    }

    /// A batch of `padded` rows took `elapsed`: the curve learns it.
    fn ran(&self, padded: usize, elapsed: Duration) {
        self.last_run_micros.store(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX), Ordering::Relaxed);
        let curve = self.version.latency();
        curve.record(padded, elapsed.as_secs_f64());
        let Some(metrics) = &self.plan_metrics else { return };
        let now = Instant::now();
        let mut published = self.curve_published.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if published.is_none_or(|at| now.saturating_duration_since(at) >= CURVE_PUBLISH_INTERVAL) {
            *published = Some(now);
            drop(published);
            metrics.publish_curve(curve.snapshot().points());
        }
    }

    fn signature(&self) -> &Signature {
        self.version.signature()
    }

    /// What a fixed-mode batch waits for company on purpose: not queueing.
    fn batch_timeout(&self) -> Duration {
        match self.policy {
            Policy::Auto(_) => Duration::ZERO,
            _ => Duration::from_micros(self.params.timeout_micros()),
        }
    }

    /// The longest a request may wait under sustained overload; none
    /// before a batch has run, since the bound allows one batch's run and
    /// that is not known yet (a burst at start-up waits behind the first
    /// batches, which is no sign of requests admitted past the bound).
    fn stale_after(&self) -> Duration {
        let last_run = self.last_run_micros.load(Ordering::Relaxed);
        if last_run == 0 {
            return Duration::MAX;
        }
        self.max_queue_wait + self.batch_timeout() + Duration::from_micros(last_run)
    }

    /// The answer of a request that waited `waited`, past `bound`.
    fn stale(&self, waited: Duration, bound: Duration) -> Error {
        Error::resource_exhausted(format!(
            "the request waited {:.1} ms in {}, more than the {:.1} ms it may while the model is overloaded \
             (max_queue_wait_ms, the batch timeout and one batch's run); retry later",
            waited.as_secs_f64() * 1e3,
            self.name,
            bound.as_secs_f64() * 1e3,
        ))
    }

    /// Runs one request as a batch of its own, from its own task.
    async fn run_alone(&self, inputs: Vec<Tensor>, rows: usize, deadline: Deadline, slot: Slot) -> Result<Vec<Tensor>> {
        let padded = self.params.padded_size(rows);
        self.model_metrics.batch_rows.observe(rows as f64);
        self.model_metrics.padding_rows.inc_by((padded - rows) as u64);
        let batch = Batch {
            requests: vec![inputs],
            padded_rows: padded,
            deadline: deadline.instant(),
            high_priority: slot.kept,
        };
        let started = Instant::now();
        let span = trace::batch_span(std::iter::once(&tracing::Span::current()), padded);
        let result = run_now(self.version.backend().as_ref(), batch, deadline).instrument(span).await;
        drop(slot);
        let outputs = result?;
        self.ran(padded, started.elapsed());
        if padded == rows {
            return Ok(outputs);
        }
        let mut own = split_outputs(&outputs, &[rows], self.signature())?;
        own.pop().ok_or_else(|| Error::internal("a batch of one request split into none, this is a bug"))
    }

    /// Sends the live part of a batch to the backend; the thread that runs
    /// it sends each request its rows. When the queue is `overloaded`,
    /// requests that waited past the bound are refused instead.
    fn dispatch(self: &Arc<Self>, batch: Vec<Entry>, slot: Slot, queue_metrics: &QueueMetrics, overloaded: bool) {
        let now = Instant::now();
        let stale_after = if overloaded { self.stale_after() } else { Duration::MAX };
        let mut inputs = Vec::with_capacity(batch.len());
        let mut replies = Vec::with_capacity(batch.len());
        let mut rows = Vec::with_capacity(batch.len());
        let mut spans = Vec::new();
        // The batch is worth running until its last request gives up.
        let mut due = Some(None);
        let mut first_caller: Option<Arc<str>> = None;
        let mut callers_mixed = false;
        for entry in batch {
            queue_metrics.depth.dec_by(entry.rows as i64);
            if entry.reply.is_closed() {
                queue_metrics.cancelled.inc();
                continue;
            }
            if entry.deadline.expired() {
                queue_metrics.expired.inc();
                let _ = entry.reply.send(Err(Error::deadline_exceeded("in the batch queue")));
                continue;
            }
            let waited = now.duration_since(entry.enqueued);
            if waited > stale_after {
                queue_metrics.stale.inc();
                let _ = entry.reply.send(Err(self.stale(waited, stale_after)));
                continue;
            }
            queue_metrics.wait.observe(waited.as_secs_f64());
            if let Some(tf_serving) = &queue_metrics.tf_serving_wait {
                tf_serving.observe(waited.as_secs_f64() * 1e6);
            }
            due = match (due, entry.deadline.instant()) {
                (Some(None), Some(at)) => Some(Some(at)),
                (Some(Some(latest)), Some(at)) => Some(Some(latest.max(at))),
                _ => None,
            };
            match &first_caller {
                None => first_caller = Some(entry.caller.clone()),
                Some(first) => callers_mixed |= !Arc::ptr_eq(first, &entry.caller) && **first != *entry.caller,
            }
            rows.push(entry.rows);
            inputs.push(entry.inputs);
            replies.push(entry.reply);
            if trace::is_traced(&entry.span) {
                spans.push(entry.span);
            }
            // The entry's place in the queue is freed here, as it leaves.
        }
        if inputs.is_empty() {
            return;
        }
        let total: usize = rows.iter().sum();
        let padded = self.params.padded_size(total);
        self.model_metrics.batch_rows.observe(total as f64);
        self.model_metrics.padding_rows.inc_by((padded - total) as u64);
        if callers_mixed {
            self.model_metrics.shared_batches.inc();
        }
        let shared = self.clone();
        let slot_kept = slot.kept;
        // Ends when the backend answers, on the thread that ran it.
        let batch_span = trace::batch_span(spans.iter(), padded);
        let done: Completion = Box::new(move |result| {
            let _slot = slot;
            if let Err(e) = &result {
                trace::record_error(&batch_span, e);
            }
            drop(batch_span);
            if result.is_ok() {
                shared.ran(padded, now.elapsed());
            }
            answer(result, &rows, replies, shared.signature());
        });
        let batch = Batch { requests: inputs, padded_rows: padded, deadline: due.flatten(), high_priority: slot_kept };
        self.version.backend().submit(batch, done);
    }
}

/// Runs `batch` now, with nothing forming around it: inline on this
/// thread when the backend measured it cheap (`infer::inline`), else on
/// the backend's threads, waited for until `deadline`.
pub(super) async fn run_now(backend: &dyn Backend, batch: Batch, deadline: Deadline) -> Result<Vec<Tensor>> {
    match backend.run_inline(&batch) {
        Some(outputs) => outputs,
        None => deadline.run("during inference", backend.run(batch)).await,
    }
}

/// The task that owns the waiting requests and forms batches.
struct BatchFormer {
    queue: mpsc::Receiver<Entry>,
    shared: Arc<Shared>,
    /// Requests taken off the channel and not yet in a batch, one lane per
    /// priority, each in arrival order.
    waiting: [VecDeque<Entry>; LANES],
    queue_metrics: QueueMetrics,
    /// When nothing last waited beyond the batch being formed.
    last_empty: Instant,
}

impl BatchFormer {
    async fn run(mut self) {
        loop {
            let first = match self.pop() {
                Some(entry) => entry,
                None => {
                    let next = self.queue.recv().await;
                    // Empty until this moment.
                    self.last_empty = Instant::now();
                    match next {
                        Some(entry) => entry,
                        None => return,
                    }
                }
            };
            let oldest = first.enqueued;
            let mut rows = first.rows;
            // A batch a high-priority request opens holds high-priority
            // rows only and waits for none: the latency it protects is its
            // own run, which a batch topped up with a flood's rows would
            // lengthen to the flood's batch size.
            let mut lanes = if first.priority == Priority::High { 1 } else { LANES };
            let mut batch = vec![first];
            let mut full = lanes == 1;
            // With slots kept for high priority, a lower batch leaves the
            // high-priority requests to them.
            let from = usize::from(lanes > 1 && self.shared.high_priority_slots.is_some());
            while !full {
                self.send_high_priority_ahead();
                let plan = self.shared.plan(Instant::now(), oldest, rows);
                if rows >= plan.want.min(plan.cap) {
                    break;
                }
                if let Some(entry) = self.pop_from(from..LANES) {
                    full = !self.add(&mut batch, &mut rows, entry, plan.cap);
                    continue;
                }
                let next = tokio::select! {
                    biased;
                    next = self.queue.recv() => next,
                    () = tokio::time::sleep_until(plan.close_at) => None,
                };
                // Nothing waited beyond this batch until now.
                self.last_empty = Instant::now();
                match next {
                    Some(entry) if entry.priority.index() < from => {
                        self.waiting[entry.priority.index()].push_back(entry)
                    }
                    Some(entry) => full = !self.add(&mut batch, &mut rows, entry, plan.cap),
                    None => break,
                }
            }
            let Some(slot) = self.slot_for(&mut batch, &mut lanes).await else { return };
            let Some(oldest) = batch.first().map(|entry| entry.enqueued) else { continue };
            let mut rows = batch.iter().map(|entry| entry.rows).sum();
            // While waiting for a slot more requests may have come: take
            // them, up to the cap; past it, more still waiting is a
            // backlog, and the batch grows to the backlog cap to drain it.
            let planned = Instant::now();
            let plan = self.shared.plan(planned, oldest, rows);
            self.shared.publish(&plan, planned);
            let full = self.top_up(&mut batch, &mut rows, plan.cap, lanes);
            if full && plan.backlog_cap > plan.cap {
                self.top_up(&mut batch, &mut rows, plan.backlog_cap, lanes);
            }
            let overloaded = self.overloaded();
            self.shared.dispatch(batch, slot, &self.queue_metrics, overloaded);
        }
    }

    /// Whether the queue has stood long enough to count as overloaded.
    fn overloaded(&self) -> bool {
        let standing = Instant::now().saturating_duration_since(self.last_empty);
        standing > OVERLOAD_INTERVAL + self.shared.batch_timeout()
    }

    /// A slot to run the formed `batch` in. A high-priority batch (of one
    /// lane) takes whichever comes free first, a shared slot or one the
    /// backend keeps for high priority. While a lower batch waits for a
    /// shared slot, high-priority requests that come go ahead of it
    /// (topped up into it, they would run at the flood's batch size after
    /// the flood's running batch): on a kept slot when the backend keeps
    /// some, else in its place, the lower batch going back to its lanes.
    /// `None`: the server is stopping.
    async fn slot_for(&mut self, batch: &mut Vec<Entry>, lanes: &mut usize) -> Option<Slot> {
        let shared = self.shared.slots.clone();
        let Some(kept) = self.shared.high_priority_slots.clone() else {
            let permit = shared.acquire_owned().await.ok()?;
            if *lanes > 1 && self.high_waiting() {
                self.put_back(batch);
                batch.extend(self.pop_within(1));
                *lanes = 1;
            }
            return Some(Slot { _permit: permit, kept: false });
        };
        if *lanes == 1 {
            return tokio::select! {
                biased;
                permit = kept.acquire_owned() => Some(Slot { _permit: permit.ok()?, kept: true }),
                permit = shared.acquire_owned() => Some(Slot { _permit: permit.ok()?, kept: false }),
            };
        }
        let mut open = true;
        loop {
            self.send_high_priority_ahead();
            let high_waiting = !self.waiting[Priority::High.index()].is_empty();
            tokio::select! {
                biased;
                permit = shared.clone().acquire_owned() => return Some(Slot { _permit: permit.ok()?, kept: false }),
                permit = kept.clone().acquire_owned(), if high_waiting => {
                    let slot = Slot { _permit: permit.ok()?, kept: true };
                    self.dispatch_high_priority(slot);
                }
                arrived = self.queue.recv(), if open => match arrived {
                    Some(entry) => self.waiting[entry.priority.index()].push_back(entry),
                    None => open = false,
                },
            }
        }
    }

    /// Sends what waits in the high-priority lane to a slot the backend
    /// keeps for high priority, when one is free.
    fn send_high_priority_ahead(&mut self) {
        let Some(kept) = self.shared.high_priority_slots.clone() else { return };
        if !self.high_waiting() {
            return;
        }
        if let Ok(permit) = kept.try_acquire_owned() {
            self.dispatch_high_priority(Slot { _permit: permit, kept: true });
        }
    }

    /// Forms a batch of what waits in the high-priority lane and sends it
    /// to `slot`.
    fn dispatch_high_priority(&mut self, slot: Slot) {
        let Some(first) = self.pop_within(1) else { return };
        let plan = self.shared.plan(Instant::now(), first.enqueued, first.rows);
        let mut rows = first.rows;
        let mut batch = vec![first];
        self.top_up(&mut batch, &mut rows, plan.cap, 1);
        let overloaded = self.overloaded();
        self.shared.dispatch(batch, slot, &self.queue_metrics, overloaded);
    }

    /// The next waiting request, highest priority first (what arrived on
    /// the channel is sorted into the lanes first); none marks the queue
    /// empty now.
    fn pop(&mut self) -> Option<Entry> {
        self.pop_within(LANES)
    }

    /// [`BatchFormer::pop`] from the first `lanes` lanes only (1: high
    /// priority only); the queue counts as empty only when every lane is.
    fn pop_within(&mut self, lanes: usize) -> Option<Entry> {
        self.pop_from(0..lanes.min(LANES))
    }

    /// [`BatchFormer::pop`] from the lanes `lanes` only.
    fn pop_from(&mut self, lanes: std::ops::Range<usize>) -> Option<Entry> {
        self.sort_arrivals();
        let next = self.waiting[lanes].iter_mut().find_map(VecDeque::pop_front);
        if next.is_none() && self.waiting.iter().all(VecDeque::is_empty) {
            self.last_empty = Instant::now();
        }
        next
    }

    /// Whether a high-priority request waits (what arrived on the channel
    /// is sorted into the lanes first).
    fn high_waiting(&mut self) -> bool {
        self.sort_arrivals();
        !self.waiting[Priority::High.index()].is_empty()
    }

    /// Moves what arrived on the channel into the lanes.
    fn sort_arrivals(&mut self) {
        while let Ok(entry) = self.queue.try_recv() {
            self.waiting[entry.priority.index()].push_back(entry);
        }
    }

    /// Returns a formed batch's requests to the heads of their lanes, each
    /// lane in its order.
    fn put_back(&mut self, batch: &mut Vec<Entry>) {
        while let Some(entry) = batch.pop() {
            self.waiting[entry.priority.index()].push_front(entry);
        }
    }

    /// Takes what is waiting in the first `lanes` lanes into the batch, up
    /// to `cap` rows; true when a request was left for lack of room.
    fn top_up(&mut self, batch: &mut Vec<Entry>, rows: &mut usize, cap: usize, lanes: usize) -> bool {
        while *rows < cap {
            match self.pop_within(lanes) {
                Some(entry) => {
                    if !self.add(batch, rows, entry, cap) {
                        return true;
                    }
                }
                None => return false,
            }
        }
        false
    }

    /// Adds `entry` to the batch when it fits in `cap` rows; otherwise puts
    /// it back at the head of its lane (it opens a later batch) and
    /// answers false.
    fn add(&mut self, batch: &mut Vec<Entry>, rows: &mut usize, entry: Entry, cap: usize) -> bool {
        if *rows + entry.rows <= cap {
            *rows += entry.rows;
            batch.push(entry);
            true
        } else {
            self.waiting[entry.priority.index()].push_front(entry);
            false
        }
    }
}

/// Each request's own rows of a batch's outputs (`rows` per request, in
/// order), the padding dropped.
fn split_outputs(outputs: &[Tensor], rows: &[usize], signature: &Signature) -> Result<Vec<Vec<Tensor>>> {
    let mut per_request: Vec<Vec<Tensor>> = vec![Vec::with_capacity(outputs.len()); rows.len()];
    for (o, output) in outputs.iter().enumerate() {
        let name = signature.outputs.get(o).map_or("?", |s| s.name.as_str());
        for (r, piece) in split_rows(output, rows, name)?.into_iter().enumerate() {
            per_request[r].push(piece);
        }
    }
    Ok(per_request)
}

/// Splits a batch's outputs and sends each request its rows, dropping the
/// padding; an error goes to every request of the batch.
fn answer(
    result: Result<Vec<Tensor>>,
    rows: &[usize],
    replies: Vec<oneshot::Sender<Result<Vec<Tensor>>>>,
    signature: &Signature,
) {
    match result.and_then(|outputs| split_outputs(&outputs, rows, signature)) {
        Ok(per_request) => {
            for (reply, outputs) in replies.into_iter().zip(per_request) {
                let _ = reply.send(Ok(outputs));
            }
        }
        Err(error) => {
            for reply in replies {
                let _ = reply.send(Err(error.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::future::BoxFuture;

    use super::*;
    use crate::error::Code;
    use crate::metrics::Metrics;
    use crate::tensor::spec::{Signature, TensorSpec};
    use crate::tensor::DType;

    /// Who sends the tests' requests.
    fn caller() -> &'static Arc<str> {
        static CALLER: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| Arc::from("test"));
        &CALLER
    }

    /// A model that doubles its one input and records every batch it ran:
    /// the rows of each request and the padded size. A slow one takes
    /// (on tokio's clock) a fixed time per batch plus a time per row.
    struct Doubler {
        signature: Signature,
        batches: Mutex<Vec<(Vec<usize>, usize)>>,
        /// Of each batch: whether it ran on a session kept for high priority.
        on_kept: Mutex<Vec<bool>>,
        speed: Option<(Duration, Duration)>,
        /// Sessions kept for high-priority batches.
        kept: usize,
    }

    impl Doubler {
        fn slow(fixed: Duration, per_row: Duration) -> Arc<Doubler> {
            let mut doubler = Arc::into_inner(Doubler::new()).expect("one owner");
            doubler.speed = Some((fixed, per_row));
            Arc::new(doubler)
        }

        /// A slow one that keeps a session for high-priority batches.
        fn slow_keeping_one(fixed: Duration, per_row: Duration) -> Arc<Doubler> {
            let mut doubler = Arc::into_inner(Doubler::slow(fixed, per_row)).expect("one owner");
            doubler.kept = 1;
            Arc::new(doubler)
        }

        fn new() -> Arc<Doubler> {
            let spec = |name: &str| TensorSpec::new(name, DType::F32, vec![-1, 2]);
            Arc::new(Doubler {
                signature: Signature { inputs: vec![spec("x")], outputs: vec![spec("y")] },
                batches: Mutex::new(Vec::new()),
                on_kept: Mutex::new(Vec::new()),
                speed: None,
                kept: 0,
            })
        }
    }

    impl Backend for Doubler {
        fn signature(&self) -> &Signature {
            &self.signature
        }

        fn high_priority_parallelism(&self) -> usize {
            self.kept
        }

        fn run(&self, batch: Batch) -> BoxFuture<'static, Result<Vec<Tensor>>> {
            let rows: Vec<usize> = batch.requests.iter().map(|r| r[0].rows()).collect();
            self.batches.lock().expect("batches").push((rows, batch.padded_rows));
            self.on_kept.lock().expect("on_kept").push(batch.high_priority);
            let mut values: Vec<f32> = batch.requests.iter().flat_map(|r| r[0].to_vec::<f32>().expect("f32")).collect();
            values.iter_mut().for_each(|v| *v *= 2.0);
            values.resize(batch.padded_rows * 2, 0.0);
            let out = Tensor::from_values(vec![batch.padded_rows as i64, 2], &values);
            let takes = self.speed.map(|(fixed, per_row)| fixed + per_row * batch.padded_rows as u32);
            Box::pin(async move {
                if let Some(takes) = takes {
                    tokio::time::sleep(takes).await;
                }
                Ok(vec![out])
            })
        }
    }

    fn batcher(backend: &Arc<Doubler>, params: BatchingParameters) -> Batcher {
        batcher_of(Arc::new(ModelVersion::new("m", 1, backend.clone())), params)
    }

    fn batcher_of(version: Arc<ModelVersion>, params: BatchingParameters) -> Batcher {
        batcher_waiting(version, params, Duration::from_secs(60))
    }

    fn batcher_waiting(version: Arc<ModelVersion>, params: BatchingParameters, max_queue_wait: Duration) -> Batcher {
        let metrics = Metrics::new();
        Batcher::start(
            version,
            params,
            1,
            max_queue_wait,
            "the batch queue of model 'm'".into(),
            metrics.queue("m"),
            metrics.model("m", 1),
            metrics.batch_plan("m", 1),
        )
    }

    fn rows(first: f32, n: usize) -> Vec<Tensor> {
        let values: Vec<f32> = (0..n * 2).map(|i| first + i as f32).collect();
        vec![Tensor::from_values(vec![n as i64, 2], &values)]
    }

    #[tokio::test(start_paused = true)]
    async fn requests_within_the_timeout_share_a_padded_batch_and_get_their_own_rows() {
        let backend = Doubler::new();
        let params = BatchingParameters {
            max_batch_size: 8,
            batch_timeout_micros: Some(1000),
            allowed_batch_sizes: vec![4, 8],
            ..BatchingParameters::default()
        };
        let batcher = batcher(&backend, params);
        let (a, b) = tokio::join!(
            batcher.run(rows(0.0, 1), Deadline::NONE, Priority::Normal, caller()),
            batcher.run(rows(10.0, 2), Deadline::NONE, Priority::Normal, caller())
        );
        assert_eq!(a.unwrap()[0].to_vec::<f32>().unwrap(), vec![0.0, 2.0]);
        assert_eq!(b.unwrap()[0].to_vec::<f32>().unwrap(), vec![20.0, 22.0, 24.0, 26.0]);
        // One batch of 3 rows, padded to the next allowed size.
        assert_eq!(*backend.batches.lock().unwrap(), vec![(vec![1, 2], 4)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_request_waits_for_the_timeout_then_runs_alone() {
        let backend = Doubler::new();
        let params =
            BatchingParameters { max_batch_size: 8, batch_timeout_micros: Some(5000), ..BatchingParameters::default() };
        let batcher = Arc::new(batcher(&backend, params));
        let started = tokio::time::Instant::now();
        let out = batcher.run(rows(1.0, 1), Deadline::NONE, Priority::Normal, caller()).await.unwrap();
        assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
        // Alone, it waited for the batch timeout (paused time advances
        // straight to it), then ran.
        let waited = started.elapsed();
        assert!(waited >= Duration::from_micros(5000) && waited < Duration::from_micros(5100), "{waited:?}");
        assert_eq!(*backend.batches.lock().unwrap(), vec![(vec![1], 1)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_larger_than_a_batch_is_split_and_joined_in_order() {
        let backend = Doubler::new();
        let params =
            BatchingParameters { max_batch_size: 2, batch_timeout_micros: Some(0), ..BatchingParameters::default() };
        let batcher = batcher(&backend, params);
        let out = batcher.run(rows(0.0, 5), Deadline::NONE, Priority::Normal, caller()).await.unwrap();
        let want: Vec<f32> = (0..10).map(|i| 2.0 * i as f32).collect();
        assert_eq!(out[0].to_vec::<f32>().unwrap(), want);
        assert_eq!(out[0].shape(), &[5, 2]);
        let seen: Vec<usize> = backend.batches.lock().unwrap().iter().flat_map(|(r, _)| r.clone()).collect();
        assert_eq!(seen, vec![2, 2, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn more_rows_than_the_queue_holds_are_refused_at_once() {
        let backend = Doubler::new();
        let params = BatchingParameters { max_batch_size: 2, max_enqueued_batches: 2, ..BatchingParameters::default() };
        let batcher = batcher(&backend, params);
        let err = batcher.run(rows(0.0, 5), Deadline::NONE, Priority::Normal, caller()).await.unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted);
        assert!(err.message().contains("5 rows"), "{err}");
        assert!(backend.batches.lock().unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_whose_deadline_passes_in_the_queue_is_dropped_before_the_model() {
        let backend = Doubler::new();
        let params = BatchingParameters {
            max_batch_size: 8,
            batch_timeout_micros: Some(10_000),
            ..BatchingParameters::default()
        };
        let batcher = batcher(&backend, params);
        let deadline = Deadline::after(Duration::from_millis(2));
        let err = batcher.run(rows(0.0, 1), deadline, Priority::Normal, caller()).await.unwrap_err();
        assert!(matches!(err, Error::DeadlineExceeded { .. }), "{err}");
        assert!(backend.batches.lock().unwrap().is_empty());
    }

    /// Runs `rows` rows at `priority` after `after`; answers when it was
    /// answered.
    fn call_at(
        batcher: &Arc<Batcher>,
        after: Duration,
        rows_of: usize,
        priority: Priority,
    ) -> tokio::task::JoinHandle<Instant> {
        let batcher = batcher.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let out = batcher.run(rows(1.0, rows_of), Deadline::NONE, priority, caller()).await.expect("answered");
            assert_eq!(out[0].rows(), rows_of, "its own rows");
            Instant::now()
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_high_priority_request_goes_ahead_of_a_lower_batch_waiting_for_its_slot() {
        // One slot; batches take 10 ms. A runs from 1 ms to 11 ms; B and C
        // form a batch at 3 ms that waits for the slot; H comes at 5 ms.
        let backend = Doubler::slow(Duration::from_millis(10), Duration::ZERO);
        let params =
            BatchingParameters { max_batch_size: 8, batch_timeout_micros: Some(1000), ..BatchingParameters::default() };
        let batcher = Arc::new(batcher(&backend, params));
        let started = Instant::now();
        let a = call_at(&batcher, Duration::ZERO, 1, Priority::Low);
        let b = call_at(&batcher, Duration::from_millis(2), 2, Priority::Low);
        let c = call_at(&batcher, Duration::from_millis(2), 2, Priority::Normal);
        let h = call_at(&batcher, Duration::from_millis(5), 3, Priority::High);
        let [a, b, c, h] = [a.await, b.await, c.await, h.await].map(|at| at.expect("call") - started);
        // H ran alone, right after A, and B and C after it.
        let batches: Vec<Vec<usize>> = backend.batches.lock().unwrap().iter().map(|(rows, _)| rows.clone()).collect();
        assert_eq!(batches, vec![vec![1], vec![3], vec![2, 2]]);
        assert!(a < h && h < b && b == c, "answered at A {a:?}, H {h:?}, B {b:?}, C {c:?}");
        assert!(h <= Duration::from_millis(22), "H waited for A's batch only: {h:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_kept_for_high_priority_runs_it_beside_a_lower_batch_and_nothing_else() {
        // One shared slot and one kept; a batch takes 10 ms and 10 ms a
        // row. A (4 rows) runs from 1 ms to 51 ms. H1 comes at 5 ms and
        // runs at once on the kept session (to 25 ms); H2 comes at 6 ms,
        // while B waits for the shared slot, and takes the kept session
        // when H1 leaves it (to 45 ms). B, low, never runs there.
        let backend = Doubler::slow_keeping_one(Duration::from_millis(10), Duration::from_millis(10));
        let params =
            BatchingParameters { max_batch_size: 8, batch_timeout_micros: Some(1000), ..BatchingParameters::default() };
        let batcher = Arc::new(batcher(&backend, params));
        let started = Instant::now();
        let a = call_at(&batcher, Duration::ZERO, 4, Priority::Low);
        let h1 = call_at(&batcher, Duration::from_millis(5), 1, Priority::High);
        let b = call_at(&batcher, Duration::from_millis(5), 2, Priority::Low);
        let h2 = call_at(&batcher, Duration::from_millis(6), 1, Priority::High);
        let [a, h1, b, h2] = [a.await, h1.await, b.await, h2.await].map(|at| at.expect("call") - started);
        assert!(h1 < h2 && h2 < a && a < b, "answered at A {a:?}, H1 {h1:?}, H2 {h2:?}, B {b:?}");
        assert!(h1 <= Duration::from_millis(26) && h2 <= Duration::from_millis(46), "H1 {h1:?}, H2 {h2:?}");
        let ran: Vec<(Vec<usize>, bool)> = backend
            .batches
            .lock()
            .unwrap()
            .iter()
            .map(|(rows, _)| rows.clone())
            .zip(backend.on_kept.lock().unwrap().iter().copied())
            .collect();
        assert_eq!(ran, vec![(vec![4], false), (vec![1], true), (vec![1], true), (vec![2], false)]);
    }

    /// Sends `count` one-row requests at once to a batcher whose batches
    /// of 2 take 30 ms, bounded by `bound`; answers the answers and how
    /// many requests reached the model.
    async fn at_once_against_30ms_batches(count: usize, bound: Duration) -> (Vec<Result<Vec<Tensor>>>, usize) {
        let backend = Doubler::slow(Duration::from_millis(30), Duration::ZERO);
        let params =
            BatchingParameters { max_batch_size: 2, batch_timeout_micros: Some(0), ..BatchingParameters::default() };
        let version = Arc::new(ModelVersion::new("m", 1, backend.clone()));
        let batcher = Arc::new(batcher_waiting(version, params, bound));
        let calls = (0..count).map(|i| {
            let batcher = batcher.clone();
            async move { batcher.run(rows(i as f32, 1), Deadline::NONE, Priority::Normal, caller()).await }
        });
        let answers = futures::future::join_all(calls).await;
        let ran = backend.batches.lock().unwrap().iter().map(|(rows, _)| rows.len()).sum();
        (answers, ran)
    }

    #[tokio::test(start_paused = true)]
    async fn under_a_standing_queue_a_request_that_waited_past_the_bound_is_refused_not_run() {
        // 16 requests take 240 ms; the queue stands past the 100 ms
        // interval, and from then on requests that waited over 70 ms (40,
        // and one batch's 30) are refused.
        let (answers, ran) = at_once_against_30ms_batches(16, Duration::from_millis(40)).await;
        let served = answers.iter().filter(|a| a.is_ok()).count();
        assert!((2..=12).contains(&served), "{served} served");
        for refused in answers.iter().filter_map(|a| a.as_ref().err()) {
            assert_eq!(refused.code(), Code::ResourceExhausted, "{refused}");
            assert!(
                refused.message().contains("more than the 70.0 ms it may while the model is overloaded"),
                "{refused}"
            );
        }
        assert_eq!(ran, served, "no stale request reached the model");
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_drained_within_the_interval_is_served_whole() {
        // 6 requests take 90 ms, the last waiting 60 ms, past a 10 ms
        // bound, but the queue empties before it counts as overloaded.
        let (answers, ran) = at_once_against_30ms_batches(6, Duration::from_millis(10)).await;
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        assert_eq!(ran, 6);
    }

    /// Sends one-row requests `gap` apart for `span` and checks every
    /// answer is the request's own rows doubled; answers each answered
    /// request's latency. Refusals must be RESOURCE_EXHAUSTED, and only
    /// `overload` allows them.
    async fn steady_load(batcher: &Arc<Batcher>, gap: Duration, span: Duration) -> Vec<Duration> {
        load(batcher, gap, span, false).await
    }

    async fn load(batcher: &Arc<Batcher>, gap: Duration, span: Duration, overload: bool) -> Vec<Duration> {
        let mut running = Vec::new();
        let end = Instant::now() + span;
        let mut i = 0usize;
        while Instant::now() < end {
            let batcher = batcher.clone();
            let first = (i * 2) as f32;
            running.push(tokio::spawn(async move {
                let sent = Instant::now();
                match batcher.run(rows(first, 1), Deadline::NONE, Priority::Normal, caller()).await {
                    Ok(out) => {
                        assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![first * 2.0, first * 2.0 + 2.0]);
                        Some(sent.elapsed())
                    }
                    Err(refused) if overload && refused.code() == Code::ResourceExhausted => None,
                    Err(error) => panic!("request {first}: {error}"),
                }
            }));
            i += 1;
            tokio::time::sleep(gap).await;
        }
        let mut latencies = Vec::with_capacity(running.len());
        for task in running {
            latencies.extend(task.await.expect("request task"));
        }
        latencies
    }

    /// Auto mode (target 100 ms) over a model taking 10 ms + 1 ms per row,
    /// warmed up. (Tokio's timer counts whole milliseconds, so the test
    /// model is slow enough for its clock.)
    fn auto_batcher(backend: &Arc<Doubler>) -> Arc<Batcher> {
        let version = Arc::new(ModelVersion::new("m", 1, backend.clone()));
        for n in [1usize, 2, 4, 8, 16, 32, 64] {
            version.latency().seed(n, 1e-2 + 1e-3 * n as f64);
        }
        let params =
            BatchingParameters { latency_target_ms: Some(100), max_batch_size: 64, ..BatchingParameters::auto() };
        Arc::new(batcher_of(version, params))
    }

    fn batch_sizes(backend: &Doubler) -> Vec<usize> {
        backend.batches.lock().unwrap().iter().map(|(rows, _)| rows.iter().sum()).collect()
    }

    fn model() -> Arc<Doubler> {
        Doubler::slow(Duration::from_millis(10), Duration::from_millis(1))
    }

    #[tokio::test(start_paused = true)]
    async fn auto_mode_runs_sparse_requests_at_once_and_alone() {
        let backend = model();
        let batcher = auto_batcher(&backend);
        let latencies = steady_load(&batcher, Duration::from_millis(500), Duration::from_secs(10)).await;
        assert_eq!(latencies.len(), 20);
        // No waiting: each took the model's 11 ms.
        assert!(latencies.iter().all(|l| *l < Duration::from_millis(13)), "{latencies:?}");
        assert!(batch_sizes(&backend).iter().all(|&n| n == 1));
    }

    #[tokio::test(start_paused = true)]
    async fn auto_mode_batches_steady_load_within_the_target_with_every_row_in_place() {
        let backend = model();
        let batcher = auto_batcher(&backend);
        // 250 rows/s: more than batch-1 runs keep up with (91/s), far less
        // than the 800/s the target allows at 40 rows.
        let latencies = steady_load(&batcher, Duration::from_millis(4), Duration::from_secs(10)).await;
        let sizes = batch_sizes(&backend);
        assert_eq!(sizes.iter().sum::<usize>(), latencies.len());
        let late = &sizes[sizes.len() / 2..];
        let mean = late.iter().sum::<usize>() as f64 / late.len() as f64;
        assert!(mean >= 3.0, "batches did not grow: {late:?}");
        let mut sorted = latencies[latencies.len() / 2..].to_vec();
        sorted.sort();
        let p99 = sorted[sorted.len() * 99 / 100];
        assert!(p99 <= Duration::from_millis(100), "p99 {p99:?} over the 100 ms target; batches {late:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn auto_mode_shrinks_batches_when_the_model_slows_down() {
        let fast = model();
        let batcher = auto_batcher(&fast);
        // Overload: 1000 rows/s, beyond the model within the target;
        // batches reach the most the target allows (40 rows in 50 ms).
        load(&batcher, Duration::from_millis(1), Duration::from_secs(3), true).await;
        let big = batch_sizes(&fast).into_iter().max().unwrap_or(0);
        assert!(big >= 40, "{big}");
        // The same version's runs now take 4 ms per row: the batcher
        // learns it from the runs alone.
        let version = batcher.shared.version.clone();
        let slow = Doubler::slow(Duration::from_millis(10), Duration::from_millis(4));
        let slowed = Arc::new(ModelVersion::new("m", 1, slow.clone()));
        for (n, seconds) in version.latency().snapshot().points() {
            slowed.latency().seed(*n, *seconds);
        }
        let params =
            BatchingParameters { latency_target_ms: Some(100), max_batch_size: 64, ..BatchingParameters::auto() };
        let batcher = Arc::new(batcher_of(slowed, params));
        load(&batcher, Duration::from_millis(1), Duration::from_secs(3), true).await;
        let sizes = batch_sizes(&slow);
        // 10 ms + 4 ms per row within half of 100 ms: 10 rows. The warmup
        // curve it started from fades as the slower runs come in.
        let late = &sizes[sizes.len() / 2..];
        assert!(late.iter().all(|&n| n <= 16), "{late:?}");
        let last = &sizes[sizes.len() * 9 / 10..sizes.len() - 1];
        assert!(last.iter().all(|&n| n <= 12), "{last:?}");
    }
}
