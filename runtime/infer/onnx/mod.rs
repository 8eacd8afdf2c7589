//! The ONNX Runtime backend: a model version loaded into a pool of
//! sessions, each with a dedicated inference thread.
//!
//! `Session::run` needs `&mut Session`, so concurrency comes from several
//! sessions, not from sharing one. Each session has its own OS thread
//! (never one of the async runtime's) that takes batches from one small
//! shared queue — one batch per thread can wait there, so the next batch is
//! ready when a thread finishes, and queueing beyond that happens in front
//! of the backend, where it is bounded and visible.
//!
//! A batch measured to cost less than the inline budget may instead run on
//! the thread that decoded its request (`run_inline`, `infer::inline`): it
//! takes whichever session is free at that moment, and goes to the queue
//! when none is. Each session sits behind a mutex for that: its thread
//! locks it for each batch (uncontended unless an inline run, shorter than
//! the budget, holds it), inline callers only ever try.
//!
//! Sessions kept for high-priority batches (`onnx.high_priority_sessions`)
//! sit after the others in the pool, with a queue of their own: a
//! high-priority batch never waits behind a lower one, and the inference
//! thread that runs it, idle most of the time, is the one the OS
//! scheduler runs first when it wakes beside a busy one.
//!
//! A version may serve signatures besides its main one, as a SavedModel
//! does: `signatures/KEY.onnx` beside the model file (what `sluice model
//! twin` writes for a SavedModel's other signatures) is served as
//! signature KEY, unbatched, on one session of its own.

pub mod library;
pub mod optimized;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, TryLockError};
use std::time::Duration;

use futures::future::BoxFuture;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::{Session, SessionInputValue};
use ort::value::ValueType;

use super::inline::InlineRule;
use super::worker::{self, Job};
use super::{Backend, Batch, Completion};
use crate::config::onnx::{ExecutionProvider, OnnxOptions};
use crate::error::{Error, Result};
use crate::metrics::ModelMetrics;
use crate::proto::tensorflow::SignatureDef;
use crate::tensor::spec::{Signature, TensorSpec, DEFAULT_SIGNATURE};
use crate::tensor::{batch, dtype, onnx as convert, Tensor};

use self::optimized::CacheOutcome;

/// One model version in ONNX Runtime.
pub struct OnnxBackend {
    signature: Signature,
    jobs: async_channel::Sender<Job>,
    /// The queue of the sessions kept for high-priority batches.
    high_priority_jobs: Option<async_channel::Sender<Job>>,
    cache: Option<CacheOutcome>,
    runner: Arc<Runner>,
    /// Every signature, when it has others besides the main one.
    signature_defs: Option<BTreeMap<String, SignatureDef>>,
}

/// The directory beside a model file whose `KEY.onnx` files are its other
/// signatures.
pub const SIGNATURES_DIR: &str = "signatures";

/// A signature besides the main one, on a session of its own.
struct OtherSignature {
    signature: Signature,
    session: Mutex<Session>,
}

/// What the inference threads and inline callers share.
struct Runner {
    /// The first `shared` take any batch; the rest, high-priority ones.
    sessions: Box<[Mutex<Session>]>,
    shared: usize,
    inline: InlineRule,
    metrics: ModelMetrics,
    others: BTreeMap<Arc<str>, OtherSignature>,
}

impl OnnxBackend {
    /// Loads `path` into `options.sessions` sessions and starts their
    /// threads. `label` names the model version in thread names, logs and
    /// errors; `metrics` counts and times the runs; batches measured to
    /// cost at most `inline_budget` run on the caller's thread.
    pub fn load(
        path: &Path,
        label: &str,
        options: &OnnxOptions,
        library: Option<&Path>,
        metrics: ModelMetrics,
        cache: Option<&Path>,
        inline_budget: Duration,
    ) -> Result<OnnxBackend> {
        let environment = library::environment(library)?;
        if options.sessions == 0 || options.intra_op_threads == 0 {
            return Err(Error::invalid_argument(format!(
                "{label}: sessions and intra_op_threads must be at least 1 (got {} and {})",
                options.sessions, options.intra_op_threads
            )));
        }
        // GPU providers optimise for the device they run on, and keep
        // their own engine caches.
        let prepared = match cache.filter(|_| options.execution_provider == ExecutionProvider::Cpu) {
            Some(dir) => optimized::prepare(environment, dir, path, options).map_err(|e| e.context(label))?,
            None => None,
        };
        let (sessions, cache) = match &prepared {
            Some((file, outcome)) => match build_sessions(environment, file, options, optimized::LOAD_LEVEL) {
                Ok(sessions) => (sessions, Some(*outcome)),
                Err(error) => {
                    tracing::warn!(%label, file = %file.display(), "a cached optimised graph did not load ({error}); optimising in place");
                    optimized::discard(file);
                    (
                        build_sessions(environment, path, options, GraphOptimizationLevel::Level3)
                            .map_err(|e| e.context(label))?,
                        None,
                    )
                }
            },
            None => (
                build_sessions(environment, path, options, GraphOptimizationLevel::Level3)
                    .map_err(|e| e.context(label))?,
                None,
            ),
        };
        let signature = signature_of(&sessions[0]).map_err(|e| e.context(label))?;
        let others = other_signatures(environment, path, options).map_err(|e| e.context(label))?;
        let signature_defs = (!others.is_empty()).then(|| {
            let def = |signature: &Signature| crate::tensor::proto::signature_def(signature);
            std::iter::once((DEFAULT_SIGNATURE.to_string(), def(&signature)))
                .chain(others.iter().map(|(key, other)| (key.to_string(), def(&other.signature))))
                .collect()
        });
        let (jobs, queue) = async_channel::bounded::<Job>(options.sessions);
        let (high_priority_jobs, high_priority_queue) =
            async_channel::bounded::<Job>(options.high_priority_sessions.max(1));
        let runner = Arc::new(Runner {
            sessions: sessions.into_iter().map(Mutex::new).collect(),
            shared: options.sessions,
            inline: InlineRule::new(inline_budget),
            metrics,
            others,
        });
        for i in 0..runner.sessions.len() {
            let runner = runner.clone();
            let started = if i < runner.shared {
                let queue = queue.clone();
                crate::threads::spawn_compute(format!("infer-{i}"), move || inference_thread(i, &runner, queue))
            } else {
                let (queue, name) = (high_priority_queue.clone(), format!("infer-high-{}", i - runner.shared));
                crate::threads::spawn_high_priority(name, move || inference_thread(i, &runner, queue))
            };
            started.map_err(|e| Error::internal(format!("{label}: starting an inference thread failed: {e}")))?;
        }
        let high_priority_jobs = (options.high_priority_sessions > 0).then_some(high_priority_jobs);
        Ok(OnnxBackend { signature, jobs, high_priority_jobs, cache, runner, signature_defs })
    }

    /// Whether its optimised graph came from the cache, when it used one.
    pub fn cache_outcome(&self) -> Option<CacheOutcome> {
        self.cache
    }
}

/// The other signatures of the model in `path`: each `signatures/KEY.onnx`
/// beside it, on one session with the model's settings.
fn other_signatures(
    environment: &'static ort::environment::Environment,
    path: &Path,
    options: &OnnxOptions,
) -> Result<BTreeMap<Arc<str>, OtherSignature>> {
    let dir = path.parent().unwrap_or(Path::new(".")).join(SIGNATURES_DIR);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(BTreeMap::new());
    };
    let mut files: Vec<PathBuf> =
        entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "onnx")).collect();
    files.sort();
    let mut others = BTreeMap::new();
    for file in files {
        let key = file.file_stem().and_then(|s| s.to_str()).unwrap_or("").to_string();
        if key.is_empty() || key == DEFAULT_SIGNATURE || key.starts_with("__") {
            return Err(Error::invalid_argument(format!(
                "{}: a signature file is named by its signature key, which may not be '{key}' ({DEFAULT_SIGNATURE} is \
                 the model file itself)",
                file.display()
            )));
        }
        let context = |e: Error| e.context(format_args!("signature '{key}' ({})", file.display()));
        let one = OnnxOptions { sessions: 1, ..options.clone() };
        let session = build_session(environment, &file, &one, GraphOptimizationLevel::Level3).map_err(context)?;
        let signature = signature_of(&session).map_err(context)?;
        others.insert(Arc::from(key.as_str()), OtherSignature { signature, session: Mutex::new(session) });
    }
    Ok(others)
}

fn build_sessions(
    environment: &'static ort::environment::Environment,
    path: &Path,
    options: &OnnxOptions,
    level: GraphOptimizationLevel,
) -> Result<Vec<Session>> {
    let count = options.sessions + options.high_priority_sessions;
    (0..count).map(|i| build_session_at(environment, path, options, level, i >= options.sessions)).collect()
}

impl OnnxBackend {
    /// The queue that runs `batch`: its own sessions' for a high-priority
    /// batch when some are kept.
    fn jobs_for(&self, batch: &Batch) -> &async_channel::Sender<Job> {
        match &self.high_priority_jobs {
            Some(high) if batch.high_priority => high,
            _ => &self.jobs,
        }
    }
}

impl Drop for OnnxBackend {
    fn drop(&mut self) {
        // The threads finish the batch they hold, see the closed queue and
        // exit, dropping their sessions; nothing waits for them here, so a
        // version can be released from any thread.
        self.jobs.close();
        if let Some(high) = &self.high_priority_jobs {
            high.close();
        }
    }
}

impl Backend for OnnxBackend {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn parallelism(&self) -> Option<usize> {
        Some(self.runner.shared)
    }

    fn high_priority_parallelism(&self) -> usize {
        self.runner.sessions.len() - self.runner.shared
    }

    fn signature_defs(&self) -> Option<&BTreeMap<String, SignatureDef>> {
        self.signature_defs.as_ref()
    }

    fn other_signature(&self, key: &str) -> Option<&Signature> {
        self.runner.others.get(key).map(|other| &other.signature)
    }

    fn run_other(&self, key: &str, inputs: Vec<Tensor>) -> BoxFuture<'static, Result<Vec<Tensor>>> {
        let (runner, key) = (self.runner.clone(), Arc::<str>::from(key));
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let other = runner
                    .others
                    .get(&key)
                    .ok_or_else(|| Error::not_found(format!("the model has no signature '{key}'")))?;
                let mut session = other.session.lock().unwrap_or_else(PoisonError::into_inner);
                run_batch(&mut session, &Batch::single(inputs))
            })
            .await
            .map_err(|_| Error::internal("a run of another signature panicked"))?
        })
    }

    fn run(&self, batch: Batch) -> BoxFuture<'static, Result<Vec<Tensor>>> {
        worker::run(self.jobs_for(&batch), batch)
    }

    fn run_inline(&self, batch: &Batch) -> Option<Result<Vec<Tensor>>> {
        if !self.runner.inline.allows(batch.run_elements()) {
            return None;
        }
        // A high-priority batch may take any free session, its own first;
        // others leave the high-priority sessions free for it.
        let (shared, kept) = self.runner.sessions.split_at(self.runner.shared);
        let kept = if batch.high_priority { kept } else { &[] };
        let mut session = kept.iter().chain(shared).find_map(|session| match session.try_lock() {
            Ok(session) => Some(session),
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        })?;
        self.runner.metrics.inline_runs.inc();
        Some(self.runner.run(&mut session, batch))
    }

    fn submit(&self, batch: Batch, done: Completion) {
        worker::submit(self.jobs_for(&batch), batch, done);
    }
}

/// ONNX Runtime's intra-op pool threads, started as compute threads (a
/// session kept for high priority: at its thread's priority) and named
/// for what they are (made by ONNX Runtime itself they would carry the
/// name of the load thread that built the session).
struct PoolThreads {
    high_priority: bool,
}

impl ort::environment::ThreadManager for PoolThreads {
    type Thread = std::thread::JoinHandle<()>;

    fn create(&self, work: impl FnOnce() + Send + 'static) -> ort::Result<Self::Thread> {
        let started = match self.high_priority {
            false => crate::threads::spawn_compute("onnx-pool".into(), work),
            true => crate::threads::spawn_high_priority("onnx-pool-high".into(), work),
        };
        started.map_err(|e| ort::Error::new(format!("starting an ONNX Runtime pool thread failed: {e}")))
    }

    fn join(thread: Self::Thread) -> ort::Result<()> {
        thread.join().map_err(|_| ort::Error::new("an ONNX Runtime pool thread panicked"))
    }
}

/// One ONNX Runtime session of the model in `path` with the settings the
/// server's sessions get from `options` (threads, spinning, execution
/// provider) at optimisation `level`: also what a raw baseline builds, so
/// that it measures ONNX Runtime as the server runs it, without the
/// server around it (`examples/raw_ort.rs`).
pub fn build_session(
    environment: &ort::environment::Environment,
    path: &Path,
    options: &OnnxOptions,
    level: GraphOptimizationLevel,
) -> Result<Session> {
    build_session_at(environment, path, options, level, false)
}

/// [`build_session`], its pool threads at the high-priority sessions'
/// priority when `high_priority`.
fn build_session_at(
    environment: &ort::environment::Environment,
    path: &Path,
    options: &OnnxOptions,
    level: GraphOptimizationLevel,
    high_priority: bool,
) -> Result<Session> {
    let convert = |e: ort::Error<ort::session::builder::SessionBuilder>| {
        Error::internal(format!("configuring ONNX Runtime failed: {}", e.message()))
    };
    let mut builder = Session::builder(environment)
        .map_err(|e| Error::internal(format!("creating an ONNX Runtime session failed: {}", e.message())))?
        .with_optimization_level(level)
        .map_err(convert)?
        .with_intra_threads(options.intra_op_threads)
        .map_err(convert)?
        .with_inter_threads(1)
        .map_err(convert)?
        .with_intra_op_spinning(options.spinning)
        .map_err(convert)?
        .with_thread_manager(PoolThreads { high_priority })
        .map_err(convert)?;
    builder = register_execution_provider(builder, options)?;
    builder
        .commit_from_file(path)
        .map_err(|e| Error::internal(format!("ONNX Runtime could not load {}: {}", path.display(), e.message())))
}

#[cfg(feature = "cuda")]
fn register_execution_provider(
    builder: ort::session::builder::SessionBuilder,
    options: &OnnxOptions,
) -> Result<ort::session::builder::SessionBuilder> {
    use ort::ep;
    let providers = match options.execution_provider {
        ExecutionProvider::Cpu => return Ok(builder),
        ExecutionProvider::Cuda => {
            vec![ep::CUDA::default().with_device_id(options.device_id).build().error_on_failure()]
        }
        ExecutionProvider::Tensorrt => vec![
            ep::TensorRT::default()
                .with_device_id(options.device_id)
                .with_fp16(options.fp16)
                .with_engine_cache(true)
                .build()
                .error_on_failure(),
            ep::CUDA::default().with_device_id(options.device_id).build(),
        ],
    };
    builder.with_execution_providers(providers).map_err(|e| {
        Error::unavailable(format!(
            "the {:?} execution provider could not be registered: {}",
            options.execution_provider,
            e.message()
        ))
    })
}

#[cfg(not(feature = "cuda"))]
fn register_execution_provider(
    builder: ort::session::builder::SessionBuilder,
    options: &OnnxOptions,
) -> Result<ort::session::builder::SessionBuilder> {
    match options.execution_provider {
        ExecutionProvider::Cpu => Ok(builder),
        other => Err(Error::unavailable(format!(
            "execution_provider = {other:?} needs sluice built with the `cuda` feature (cargo build --features cuda)"
        ))),
    }
}

/// The signature ONNX Runtime reports for the model: names, dtypes and
/// shapes, with -1 for dynamic dimensions.
fn signature_of(session: &Session) -> Result<Signature> {
    let spec = |role: &str, outlet: &ort::value::Outlet| -> Result<TensorSpec> {
        let ValueType::Tensor { ty, shape, .. } = outlet.dtype() else {
            // skl2onnx and onnxmltools write a classifier's probabilities
            // as a ZipMap (a sequence of maps, class to probability) by
            // default; the same converters write a tensor when asked.
            let zipmap =
                matches!(outlet.dtype(), ValueType::Sequence(inner) if matches!(**inner, ValueType::Map { .. }));
            let hint = if zipmap {
                ": it is a ZipMap (a classifier's probabilities as one map per row, the default of skl2onnx and \
                 onnxmltools); convert with it off to get a [batch, classes] float tensor: skl2onnx's \
                 convert_sklearn(model, options={id(model): {'zipmap': False}}), onnxmltools' \
                 convert_lightgbm / convert_xgboost(model, zipmap=False)"
            } else {
                ""
            };
            return Err(Error::invalid_argument(format!(
                "model {role} '{}' is a {}, and sluice serves tensors only{hint}",
                outlet.name(),
                outlet.dtype()
            )));
        };
        let dtype = dtype::from_ort(*ty).ok_or_else(|| {
            Error::invalid_argument(format!(
                "model {role} '{}' has element type {ty:?}, which sluice does not serve",
                outlet.name()
            ))
        })?;
        // ONNX Runtime reports no dimensions both for a scalar and for a
        // value of unknown rank (tf2onnx writes inputs converted from
        // TensorSpec(None) with no shape). Refusing every non-scalar would
        // refuse what ONNX Runtime runs, so no dimensions means any rank;
        // ONNX Runtime itself still refuses a rank its graph cannot take.
        Ok(TensorSpec {
            name: outlet.name().to_string(),
            dtype,
            unknown_rank: shape.is_empty(),
            shape: shape.iter().map(|&d| if d < 0 { -1 } else { d }).collect(),
        })
    };
    Ok(Signature {
        inputs: session.inputs().iter().map(|o| spec("input", o)).collect::<Result<_>>()?,
        outputs: session.outputs().iter().map(|o| spec("output", o)).collect::<Result<_>>()?,
    })
}

impl Runner {
    /// Runs `batch` on `session`, timed: the metrics and the inline rule
    /// learn what it cost.
    fn run(&self, session: &mut Session, batch: &Batch) -> Result<Vec<Tensor>> {
        worker::timed_run(&self.metrics, &self.inline, batch, "ONNX Runtime", || run_batch(session, batch))
    }
}

fn inference_thread(own: usize, runner: &Runner, queue: async_channel::Receiver<Job>) {
    while let Ok(job) = queue.recv_blocking() {
        if job.reply.abandoned() {
            // Everyone waiting for this batch has gone (cancelled or timed out).
            continue;
        }
        // Its own session, unless an inline run holds it for a moment.
        let result = {
            let mut session = runner.sessions[own].lock().unwrap_or_else(PoisonError::into_inner);
            runner.run(&mut session, &job.batch)
        };
        job.reply.send(result);
    }
}

fn run_batch(session: &mut Session, batch: &Batch) -> Result<Vec<Tensor>> {
    let inputs = batch.requests.first().map_or(0, Vec::len);
    let mut values: Vec<SessionInputValue<'_>> = Vec::with_capacity(inputs);
    for i in 0..inputs {
        let value = match batch.requests.as_slice() {
            [only] if batch.padded_rows == 0 || only[i].rows() == batch.padded_rows || only[i].shape().is_empty() => {
                convert::to_value(&only[i])?
            }
            requests => {
                let parts: Vec<&Tensor> = requests.iter().map(|r| &r[i]).collect();
                batch::join_to_value(&parts, batch.padded_rows)?
            }
        };
        values.push(value.into());
    }
    let outputs = session.run(values.as_slice()).map_err(convert::ort_error)?;
    (0..outputs.len()).map(|i| convert::from_value(&outputs[i])).collect()
}
