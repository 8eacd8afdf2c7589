//! The dynamic batcher of one model version.
//!
//! One task owns the queue of waiting requests and forms batches: a batch
//! closes when it holds `max_batch_size` rows, or when its first request
//! has waited `batch_timeout_micros`; it then waits for one of
//! `num_batch_threads` slots, takes in whatever arrived meanwhile (so under
//! load batches fill up by themselves), drops requests whose client left
//! or whose deadline passed, pads to the next allowed batch size, and hands
//! the batch to the backend. Each request gets exactly its own rows back.
//!
//! The queue is bounded in rows (`max_enqueued_batches × max_batch_size`):
//! a request that does not fit is refused at once with RESOURCE_EXHAUSTED.
//! A request larger than `max_batch_size` is split into parts that travel
//! as separate requests and are joined again in order.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
// Tokio's clock: the system's, and a test's paused clock when one pauses it.
use tokio::time::Instant;

use super::deadline::Deadline;
use crate::config::BatchingParameters;
use crate::error::{Error, Result};
use crate::infer::{Backend, Batch};
use crate::metrics::{ModelMetrics, QueueMetrics};
use crate::tensor::batch::{concat_rows, split_rows};
use crate::tensor::Tensor;

/// A request (or part of one) waiting for a batch.
struct Entry {
    inputs: Vec<Tensor>,
    rows: usize,
    deadline: Deadline,
    enqueued: Instant,
    reply: oneshot::Sender<Result<Vec<Tensor>>>,
    /// Its rows' place in the queue, freed when the batch leaves the queue.
    _place: OwnedSemaphorePermit,
}

/// The entrance to one model version's batch queue.
pub struct Batcher {
    entries: mpsc::Sender<Entry>,
    queued_rows: Arc<Semaphore>,
    capacity_rows: usize,
    max_batch_size: usize,
    name: String,
    queue_metrics: QueueMetrics,
}

impl Batcher {
    /// Starts the batching task for `backend`. `name` names the queue in
    /// errors ("the batch queue of model 'cnn' version 1"); `threads` is the
    /// number of batches that may run at once.
    pub fn start(
        backend: Arc<dyn Backend>,
        params: BatchingParameters,
        threads: usize,
        name: String,
        queue_metrics: QueueMetrics,
        model_metrics: ModelMetrics,
    ) -> Batcher {
        let capacity_rows = params.max_enqueued_batches.saturating_mul(params.max_batch_size);
        let max_batch_size = params.max_batch_size;
        // Each entry holds at least one row, so the row bound bounds entries too.
        let (entries, queue) = mpsc::channel(capacity_rows.max(1));
        let former = BatchFormer {
            queue,
            backend,
            max_batch_size,
            timeout: Duration::from_micros(params.batch_timeout_micros),
            params,
            slots: Arc::new(Semaphore::new(threads.max(1))),
            carry: None,
            queue_metrics: queue_metrics.clone(),
            model_metrics,
        };
        tokio::spawn(former.run());
        Batcher {
            entries,
            queued_rows: Arc::new(Semaphore::new(capacity_rows)),
            capacity_rows,
            max_batch_size,
            name,
            queue_metrics,
        }
    }

    /// Runs one request's inputs (signature order, validated) through the
    /// model in a batch with others, and returns its own outputs.
    pub async fn run(&self, inputs: Vec<Tensor>, deadline: Deadline) -> Result<Vec<Tensor>> {
        if deadline.expired() {
            self.queue_metrics.expired.inc();
            return Err(Error::deadline_exceeded(&format!("before {}", self.name)));
        }
        let rows = inputs.first().map_or(1, Tensor::rows);
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
            return self.enqueue(inputs, rows, deadline, places)?.await.unwrap_or_else(|_| Err(self.stopped()));
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
            answers.push(self.enqueue(part, n, deadline, place)?);
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
        place: OwnedSemaphorePermit,
    ) -> Result<oneshot::Receiver<Result<Vec<Tensor>>>> {
        let (reply, answer) = oneshot::channel();
        let entry = Entry { inputs, rows, deadline, enqueued: Instant::now(), reply, _place: place };
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

/// The task that owns the waiting requests and forms batches.
struct BatchFormer {
    queue: mpsc::Receiver<Entry>,
    backend: Arc<dyn Backend>,
    params: BatchingParameters,
    max_batch_size: usize,
    timeout: Duration,
    slots: Arc<Semaphore>,
    /// A request that did not fit in the last batch; it opens the next.
    carry: Option<Entry>,
    queue_metrics: QueueMetrics,
    model_metrics: ModelMetrics,
}

impl BatchFormer {
    async fn run(mut self) {
        loop {
            let first = match self.carry.take() {
                Some(entry) => entry,
                None => match self.queue.recv().await {
                    Some(entry) => entry,
                    None => return,
                },
            };
            let flush_at = first.enqueued + self.timeout;
            let mut rows = first.rows;
            let mut batch = vec![first];
            while rows < self.max_batch_size && self.carry.is_none() {
                tokio::select! {
                    biased;
                    next = self.queue.recv() => match next {
                        Some(entry) => self.add(&mut batch, &mut rows, entry),
                        None => break,
                    },
                    () = tokio::time::sleep_until(flush_at) => break,
                }
            }
            let Ok(slot) = self.slots.clone().acquire_owned().await else { return };
            // While waiting for a slot more requests may have come: take them.
            while rows < self.max_batch_size && self.carry.is_none() {
                match self.queue.try_recv() {
                    Ok(entry) => self.add(&mut batch, &mut rows, entry),
                    Err(_) => break,
                }
            }
            self.dispatch(batch, slot);
        }
    }

    fn add(&mut self, batch: &mut Vec<Entry>, rows: &mut usize, entry: Entry) {
        if *rows + entry.rows <= self.max_batch_size {
            *rows += entry.rows;
            batch.push(entry);
        } else {
            self.carry = Some(entry);
        }
    }

    /// Sends the live part of a batch to the backend and, when it answers,
    /// each request its rows.
    fn dispatch(&self, batch: Vec<Entry>, slot: OwnedSemaphorePermit) {
        let now = Instant::now();
        let mut inputs = Vec::with_capacity(batch.len());
        let mut replies = Vec::with_capacity(batch.len());
        let mut rows = Vec::with_capacity(batch.len());
        // The batch is worth running until its last request gives up.
        let mut due = Some(None);
        for entry in batch {
            self.queue_metrics.depth.dec_by(entry.rows as i64);
            self.queue_metrics.wait.observe(now.duration_since(entry.enqueued).as_secs_f64());
            if entry.reply.is_closed() {
                self.queue_metrics.cancelled.inc();
                continue;
            }
            if entry.deadline.expired() {
                self.queue_metrics.expired.inc();
                let _ = entry.reply.send(Err(Error::deadline_exceeded("in the batch queue")));
                continue;
            }
            due = match (due, entry.deadline.instant()) {
                (Some(None), Some(at)) => Some(Some(at)),
                (Some(Some(latest)), Some(at)) => Some(Some(latest.max(at))),
                _ => None,
            };
            rows.push(entry.rows);
            inputs.push(entry.inputs);
            replies.push(entry.reply);
            // The entry's place in the queue is freed here, as it leaves.
        }
        if inputs.is_empty() {
            return;
        }
        let total: usize = rows.iter().sum();
        let padded = self.params.padded_size(total);
        self.model_metrics.batch_rows.observe(total as f64);
        self.model_metrics.padding_rows.inc_by((padded - total) as u64);
        let backend = self.backend.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let batch = Batch { requests: inputs, padded_rows: padded, deadline: due.flatten() };
            let result = backend.run(batch).await;
            answer(result, &rows, replies, backend.signature());
        });
    }
}

/// Splits a batch's outputs and sends each request its rows, dropping the
/// padding; an error goes to every request of the batch.
fn answer(
    result: Result<Vec<Tensor>>,
    rows: &[usize],
    replies: Vec<oneshot::Sender<Result<Vec<Tensor>>>>,
    signature: &crate::tensor::spec::Signature,
) {
    let split = result.and_then(|outputs| {
        let mut per_request: Vec<Vec<Tensor>> = vec![Vec::with_capacity(outputs.len()); rows.len()];
        for (o, output) in outputs.iter().enumerate() {
            let name = signature.outputs.get(o).map_or("?", |s| s.name.as_str());
            for (r, piece) in split_rows(output, rows, name)?.into_iter().enumerate() {
                per_request[r].push(piece);
            }
        }
        Ok(per_request)
    });
    match split {
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
    use std::sync::Mutex;

    use futures::future::BoxFuture;

    use super::*;
    use crate::error::Code;
    use crate::metrics::Metrics;
    use crate::tensor::spec::{Signature, TensorSpec};
    use crate::tensor::DType;

    /// A model that doubles its one input and records every batch it ran:
    /// the rows of each request and the padded size.
    struct Doubler {
        signature: Signature,
        batches: Mutex<Vec<(Vec<usize>, usize)>>,
    }

    impl Doubler {
        fn new() -> Arc<Doubler> {
            let spec = |name: &str| TensorSpec {
                name: name.into(),
                dtype: DType::F32,
                shape: vec![-1, 2],
                unknown_rank: false,
            };
            Arc::new(Doubler {
                signature: Signature { inputs: vec![spec("x")], outputs: vec![spec("y")] },
                batches: Mutex::new(Vec::new()),
            })
        }
    }

    impl Backend for Doubler {
        fn signature(&self) -> &Signature {
            &self.signature
        }

        fn run(&self, batch: Batch) -> BoxFuture<'static, Result<Vec<Tensor>>> {
            let rows: Vec<usize> = batch.requests.iter().map(|r| r[0].rows()).collect();
            self.batches.lock().expect("batches").push((rows, batch.padded_rows));
            let mut values: Vec<f32> = batch.requests.iter().flat_map(|r| r[0].to_vec::<f32>().expect("f32")).collect();
            values.iter_mut().for_each(|v| *v *= 2.0);
            values.resize(batch.padded_rows * 2, 0.0);
            let out = Tensor::from_values(vec![batch.padded_rows as i64, 2], &values);
            Box::pin(async move { Ok(vec![out]) })
        }
    }

    fn batcher(backend: &Arc<Doubler>, params: BatchingParameters) -> Batcher {
        let metrics = Metrics::new();
        Batcher::start(
            backend.clone(),
            params,
            1,
            "the batch queue of model 'm'".into(),
            metrics.queue("m"),
            metrics.model("m", 1),
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
            batch_timeout_micros: 1000,
            allowed_batch_sizes: vec![4, 8],
            ..BatchingParameters::default()
        };
        let batcher = batcher(&backend, params);
        let (a, b) =
            tokio::join!(batcher.run(rows(0.0, 1), Deadline::NONE), batcher.run(rows(10.0, 2), Deadline::NONE));
        assert_eq!(a.unwrap()[0].to_vec::<f32>().unwrap(), vec![0.0, 2.0]);
        assert_eq!(b.unwrap()[0].to_vec::<f32>().unwrap(), vec![20.0, 22.0, 24.0, 26.0]);
        // One batch of 3 rows, padded to the next allowed size.
        assert_eq!(*backend.batches.lock().unwrap(), vec![(vec![1, 2], 4)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_request_waits_for_the_timeout_then_runs_alone() {
        let backend = Doubler::new();
        let params =
            BatchingParameters { max_batch_size: 8, batch_timeout_micros: 5000, ..BatchingParameters::default() };
        let batcher = Arc::new(batcher(&backend, params));
        let started = tokio::time::Instant::now();
        let out = batcher.run(rows(1.0, 1), Deadline::NONE).await.unwrap();
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
        let params = BatchingParameters { max_batch_size: 2, batch_timeout_micros: 0, ..BatchingParameters::default() };
        let batcher = batcher(&backend, params);
        let out = batcher.run(rows(0.0, 5), Deadline::NONE).await.unwrap();
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
        let err = batcher.run(rows(0.0, 5), Deadline::NONE).await.unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted);
        assert!(err.message().contains("5 rows"), "{err}");
        assert!(backend.batches.lock().unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_whose_deadline_passes_in_the_queue_is_dropped_before_the_model() {
        let backend = Doubler::new();
        let params =
            BatchingParameters { max_batch_size: 8, batch_timeout_micros: 10_000, ..BatchingParameters::default() };
        let batcher = batcher(&backend, params);
        let deadline = Deadline::after(Duration::from_millis(2));
        let err = batcher.run(rows(0.0, 1), deadline).await.unwrap_err();
        assert!(matches!(err, Error::DeadlineExceeded { .. }), "{err}");
        assert!(backend.batches.lock().unwrap().is_empty());
    }
}
