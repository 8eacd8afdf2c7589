//! The TensorFlow backend: a SavedModel version (`VERSION/saved_model.pb`
//! with `variables/`, `assets/`) loaded in process through TensorFlow's C
//! API, as TF Serving loads it.
//!
//! One session per version: `TF_SessionRun` may be called from several
//! threads at once, and TensorFlow runs the ops on its own pools, so the
//! backend keeps `run_threads` inference threads (never the async
//! runtime's) that take batches from one small shared queue
//! (`infer::worker`), and a batch measured to cost less than the inline
//! budget runs on the thread that decoded its request. TensorFlow's pools
//! are started by the session load, on a compute thread, so they inherit
//! its priority (below the network threads).
//!
//! The main signature is the one `[models.tensorflow] signature` names
//! (`serving_default`): batched, run inline when cheap. Every other
//! signature of tensors sluice serves answers Predict by its key, one
//! request per run; GetModelMetadata reports all of them as TF Serving
//! does, read from the MetaGraphDef.

pub mod ffi;
pub mod inspect;
pub mod library;
pub mod tensors;

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, CStr, CString};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use prost::Message;

use self::ffi::{Api, Opaque, Output};
use self::tensors::TfTensor;
use super::inline::InlineRule;
use super::worker::{self, Job};
use super::{Backend, Batch, Completion};
use crate::config::tensorflow::TensorflowOptions;
use crate::error::{Error, Result};
use crate::metrics::ModelMetrics;
use crate::proto::tensorflow::{tensor_info, MetaGraphDef, SignatureDef};
use crate::tensor::proto::signature_of_def;
use crate::tensor::spec::Signature;
use crate::tensor::Tensor;

/// The file that makes a version directory a SavedModel.
pub const SAVED_MODEL_FILE: &str = "saved_model.pb";

/// One SavedModel version in TensorFlow.
pub struct TensorflowBackend {
    signature_defs: BTreeMap<String, SignatureDef>,
    run_threads: usize,
    jobs: async_channel::Sender<Job>,
    runner: Arc<Runner>,
}

/// One signature, ready to run: its tensors and where they are in the
/// graph.
struct Plan {
    signature: Signature,
    /// Its inputs' graph endpoints, in its order.
    feeds: Vec<Output>,
    /// Its outputs', in its order.
    fetches: Vec<Output>,
}

/// What the inference threads and inline callers share.
struct Runner {
    api: &'static Api,
    session: Session,
    /// The main signature.
    main: Plan,
    /// Every other signature of served tensors, by key.
    others: BTreeMap<Arc<str>, Plan>,
    inline: InlineRule,
    metrics: ModelMetrics,
}

/// A loaded session and the graph it runs, closed and freed when dropped.
struct Session {
    api: &'static Api,
    graph: *mut Opaque,
    session: *mut Opaque,
}

// SAFETY: TensorFlow's sessions are thread-safe (`TF_SessionRun` may be
// called from any thread, concurrently); the graph is only read after the
// load, and both are freed once, in `drop`, when no run can be going on
// (every runner holds the session through an `Arc`).
unsafe impl Send for Session {}
// SAFETY: as above.
unsafe impl Sync for Session {}

impl Drop for Session {
    fn drop(&mut self) {
        let status = Status::new(self.api);
        // SAFETY: the handles are this value's own, live, and freed once;
        // close before delete, as the C API requires.
        unsafe {
            (self.api.close_session)(self.session, status.raw);
            (self.api.delete_session)(self.session, status.raw);
            (self.api.delete_graph)(self.graph);
        }
        if let Err(error) = status.check() {
            tracing::warn!("closing a TensorFlow session: {error}");
        }
    }
}

/// A `TF_Status`, freed when dropped.
struct Status {
    api: &'static Api,
    raw: *mut Opaque,
}

impl Status {
    fn new(api: &'static Api) -> Status {
        // SAFETY: no preconditions.
        Status { api, raw: unsafe { (api.new_status)() } }
    }

    /// The status as a result: TensorFlow's code kept (its codes are
    /// gRPC's), its message as the error's.
    fn check(&self) -> Result<()> {
        // SAFETY: `raw` is a live status; TF_Message's string lives as long
        // as the status and is copied out here.
        let (code, message) = unsafe {
            let code = (self.api.get_code)(self.raw);
            if code == ffi::TF_OK {
                return Ok(());
            }
            (code, CStr::from_ptr((self.api.message)(self.raw)).to_string_lossy().into_owned())
        };
        Err(status_error(code, message))
    }
}

impl Drop for Status {
    fn drop(&mut self) {
        // SAFETY: a status this value owns.
        unsafe { (self.api.delete_status)(self.raw) }
    }
}

/// TensorFlow's status codes, which are gRPC's, as errors of the same
/// code.
fn status_error(code: c_int, message: String) -> Error {
    match code {
        1 => Error::Cancelled(message),
        3 | 11 => Error::invalid_argument(message),
        4 => Error::DeadlineExceeded { at: format!("TensorFlow ({message})") },
        5 => Error::not_found(message),
        7 => Error::PermissionDenied(message),
        8 => Error::resource_exhausted(message),
        9 => Error::failed_precondition(message),
        10 => Error::Aborted(message),
        12 => Error::unimplemented(message),
        14 => Error::unavailable(message),
        _ => Error::internal(message),
    }
}

/// ConfigProto's thread settings, encoded: `intra_op_parallelism_threads`
/// (field 2) and `inter_op_parallelism_threads` (field 5, negative: ops
/// on the caller's thread); zero fields are left out, so TensorFlow picks.
fn config_proto(options: &TensorflowOptions) -> Vec<u8> {
    let intra = i32::try_from(options.intra_op_threads).unwrap_or(i32::MAX);
    let mut bytes = Vec::new();
    for (field, value) in [(2u32, intra), (5, options.inter_op_threads)] {
        if value != 0 {
            prost::encoding::int32::encode(field, &value, &mut bytes);
        }
    }
    bytes
}

impl TensorflowBackend {
    /// Loads the SavedModel in `dir` with `options.tags` and starts
    /// `options.run_threads` inference threads. `label` names the model
    /// version in thread names, logs and errors; `metrics` counts and times
    /// the runs; batches measured to cost at most `inline_budget` run on
    /// the caller's thread.
    pub fn load(
        dir: &Path,
        label: &str,
        options: &TensorflowOptions,
        library: Option<&Path>,
        metrics: ModelMetrics,
        inline_budget: Duration,
    ) -> Result<TensorflowBackend> {
        let api = library::api(library).map_err(|e| e.context(label))?;
        let (session, meta) = load_session(api, dir, options).map_err(|e| e.context(label))?;
        let signature_defs: BTreeMap<String, SignatureDef> = meta.signature_def.into_iter().collect();
        let served = signature_defs.get(&options.signature).ok_or_else(|| {
            let keys: Vec<&str> = signature_defs.keys().map(String::as_str).collect();
            Error::failed_precondition(format!(
                "{label}: the SavedModel has no signature '{}' (signatures: [{}]); set [models.tensorflow] \
                 signature to one of them",
                options.signature,
                keys.join(", ")
            ))
        })?;
        let context = |key: &str| format!("{label}: signature '{key}'");
        let main = plan(api, &session, served).map_err(|e| e.context(context(&options.signature)))?;
        let mut others = BTreeMap::new();
        for (key, def) in &signature_defs {
            if *key == options.signature || key.starts_with("__") {
                continue;
            }
            // A signature of tensors sluice does not serve (resources,
            // sparse tensors) is listed in the metadata, not served.
            match plan(api, &session, def) {
                Ok(plan) => {
                    others.insert(Arc::from(key.as_str()), plan);
                }
                Err(e) => tracing::warn!("{}: not served: {}", context(key), e.message()),
            }
        }
        let runner = Arc::new(Runner { api, session, main, others, inline: InlineRule::new(inline_budget), metrics });
        let (jobs, queue) = async_channel::bounded::<Job>(options.run_threads);
        for i in 0..options.run_threads {
            let (queue, runner) = (queue.clone(), runner.clone());
            crate::threads::spawn_compute(format!("tf-{i}"), move || inference_thread(&runner, queue))
                .map_err(|e| Error::internal(format!("{label}: starting an inference thread failed: {e}")))?;
        }
        Ok(TensorflowBackend { signature_defs, run_threads: options.run_threads, jobs, runner })
    }
}

/// Loads the MetaGraph `options.tags` names from `dir` into a new session.
fn load_session(api: &'static Api, dir: &Path, options: &TensorflowOptions) -> Result<(Session, MetaGraphDef)> {
    let c_string = |what: &str, text: &str| {
        CString::new(text).map_err(|_| Error::invalid_argument(format!("{what} {text:?} contains a NUL byte")))
    };
    let export_dir = c_string("the SavedModel path", &dir.to_string_lossy())?;
    let tags = options.tags.iter().map(|tag| c_string("the SavedModel tag", tag)).collect::<Result<Vec<_>>>()?;
    let tag_pointers: Vec<*const c_char> = tags.iter().map(|tag| tag.as_ptr()).collect();
    let config = config_proto(options);
    let status = Status::new(api);
    // SAFETY: every pointer passed is live for the call (the strings and
    // arrays above, handles just made); the options and the buffer are
    // freed here, the graph and session handed to `Session`, which frees
    // them once.
    unsafe {
        let session_options = (api.new_session_options)();
        (api.set_config)(session_options, config.as_ptr().cast(), config.len(), status.raw);
        if let Err(error) = status.check() {
            (api.delete_session_options)(session_options);
            return Err(error.context("TensorFlow refused the session's thread settings"));
        }
        let graph = (api.new_graph)();
        let meta = (api.new_buffer)();
        let session = (api.load_session_from_saved_model)(
            session_options,
            std::ptr::null(),
            export_dir.as_ptr(),
            tag_pointers.as_ptr(),
            tag_pointers.len() as c_int,
            graph,
            meta,
            status.raw,
        );
        (api.delete_session_options)(session_options);
        let loaded = status.check();
        let decoded = if loaded.is_ok() && !(*meta).data.is_null() {
            let bytes = std::slice::from_raw_parts((*meta).data.cast::<u8>(), (*meta).length);
            Some(MetaGraphDef::decode(bytes))
        } else {
            None
        };
        (api.delete_buffer)(meta);
        if let Err(error) = loaded {
            (api.delete_graph)(graph);
            return Err(Error::unavailable(format!(
                "TensorFlow could not load the SavedModel in {} with tags {:?}: {}",
                dir.display(),
                options.tags,
                error.message()
            )));
        }
        let session = Session { api, graph, session };
        let meta = match decoded {
            Some(Ok(meta)) => meta,
            Some(Err(e)) => return Err(Error::internal(format!("the SavedModel's MetaGraphDef did not decode: {e}"))),
            None => MetaGraphDef::default(),
        };
        Ok((session, meta))
    }
}

/// A signature ready to run: its tensors (refused when sluice does not
/// serve one) and their graph endpoints.
fn plan(api: &'static Api, session: &Session, def: &SignatureDef) -> Result<Plan> {
    let signature = signature_of_def(def)?;
    let feeds = signature
        .inputs
        .iter()
        .map(|spec| endpoint(api, session, "input", &spec.name, def.inputs.get(&spec.name)))
        .collect::<Result<Vec<_>>>()?;
    let fetches = signature
        .outputs
        .iter()
        .map(|spec| endpoint(api, session, "output", &spec.name, def.outputs.get(&spec.name)))
        .collect::<Result<Vec<_>>>()?;
    Ok(Plan { signature, feeds, fetches })
}

/// The graph endpoint of a signature's input or output: its tensor name
/// (`op:index`) looked up in the loaded graph.
fn endpoint(
    api: &'static Api,
    session: &Session,
    role: &str,
    name: &str,
    info: Option<&crate::proto::tensorflow::TensorInfo>,
) -> Result<Output> {
    let tensor = match info.and_then(|info| info.encoding.as_ref()) {
        Some(tensor_info::Encoding::Name(tensor)) => tensor,
        Some(_) => {
            return Err(Error::invalid_argument(format!(
                "{role} '{name}' is a sparse or composite tensor, which sluice does not serve"
            )))
        }
        None => return Err(Error::invalid_argument(format!("{role} '{name}' names no graph tensor"))),
    };
    let (op, index) = match tensor.rsplit_once(':') {
        Some((op, index)) => (op, index.parse::<c_int>().ok()),
        None => (tensor.as_str(), Some(0)),
    };
    let index = index
        .ok_or_else(|| Error::invalid_argument(format!("{role} '{name}' names tensor {tensor:?}, not op:index")))?;
    let op_name = CString::new(op).map_err(|_| Error::invalid_argument(format!("{role} '{name}': NUL in {op:?}")))?;
    // SAFETY: the graph is live (owned by `session`); the name is a
    // NUL-terminated string that outlives the call.
    let oper = unsafe { (api.graph_operation_by_name)(session.graph, op_name.as_ptr()) };
    // SAFETY: `oper` is checked non-null first; it belongs to the graph.
    if oper.is_null() || index < 0 || index >= unsafe { (api.operation_num_outputs)(oper) } {
        return Err(Error::invalid_argument(format!("{role} '{name}': the graph has no tensor {tensor:?}")));
    }
    Ok(Output { oper, index })
}

impl Drop for TensorflowBackend {
    fn drop(&mut self) {
        // The threads finish the batch they hold, see the closed queue and
        // exit; the last one to let go of the runner closes the session.
        self.jobs.close();
    }
}

impl Backend for TensorflowBackend {
    fn signature(&self) -> &Signature {
        &self.runner.main.signature
    }

    fn signature_defs(&self) -> Option<&BTreeMap<String, SignatureDef>> {
        Some(&self.signature_defs)
    }

    fn parallelism(&self) -> Option<usize> {
        Some(self.run_threads)
    }

    fn other_signature(&self, key: &str) -> Option<&Signature> {
        self.runner.others.get(key).map(|plan| &plan.signature)
    }

    fn run_other(&self, key: &str, inputs: Vec<Tensor>) -> BoxFuture<'static, Result<Vec<Tensor>>> {
        let Some((key, _)) = self.runner.others.get_key_value(key) else {
            let error = Error::not_found(format!("the SavedModel has no served signature '{key}'"));
            return Box::pin(async move { Err(error) });
        };
        worker::run_signature(&self.jobs, Batch::single(inputs), Some(key.clone()))
    }

    fn run(&self, batch: Batch) -> BoxFuture<'static, Result<Vec<Tensor>>> {
        worker::run(&self.jobs, batch)
    }

    fn run_inline(&self, batch: &Batch) -> Option<Result<Vec<Tensor>>> {
        if !self.runner.inline.allows(batch.run_elements()) {
            return None;
        }
        self.runner.metrics.inline_runs.inc();
        Some(self.runner.run(&self.runner.main, batch))
    }

    fn submit(&self, batch: Batch, done: Completion) {
        worker::submit(&self.jobs, batch, done);
    }
}

fn inference_thread(runner: &Runner, queue: async_channel::Receiver<Job>) {
    while let Ok(job) = queue.recv_blocking() {
        if job.reply.abandoned() {
            continue;
        }
        let plan = match &job.signature {
            None => Some(&runner.main),
            Some(key) => runner.others.get(key),
        };
        let result = match plan {
            Some(plan) => runner.run(plan, &job.batch),
            None => Err(Error::internal("a job for a signature the backend does not have, this is a bug")),
        };
        job.reply.send(result);
    }
}

impl Runner {
    /// Runs `batch`, timed: the metrics and the inline rule learn what it
    /// cost.
    fn run(&self, plan: &Plan, batch: &Batch) -> Result<Vec<Tensor>> {
        worker::timed_run(&self.metrics, &self.inline, batch, "the TensorFlow backend", || self.run_batch(plan, batch))
    }

    fn run_batch(&self, plan: &Plan, batch: &Batch) -> Result<Vec<Tensor>> {
        let api = self.api;
        let inputs = plan.feeds.len();
        let mut values: Vec<TfTensor<'static>> = Vec::with_capacity(inputs);
        for i in 0..inputs {
            let parts = batch
                .requests
                .iter()
                .map(|request| request.get(i))
                .collect::<Option<Vec<&Tensor>>>()
                .ok_or_else(|| Error::internal("a request of the batch lacks an input, this is a bug"))?;
            values.push(tensors::batch_input(api, &parts, batch.padded_rows)?);
        }
        let raw_inputs: Vec<*mut Opaque> = values.iter().map(TfTensor::raw).collect();
        let mut raw_outputs: Vec<*mut Opaque> = vec![std::ptr::null_mut(); plan.fetches.len()];
        let status = Status::new(api);
        // SAFETY: feeds and inputs have the same length, as do fetches and
        // the output slots; every handle is live for the call. TensorFlow
        // does not take the input tensors (they are freed here), and gives
        // the caller each output tensor, taken into `TfTensor`s below.
        unsafe {
            (api.session_run)(
                self.session.session,
                std::ptr::null(),
                plan.feeds.as_ptr(),
                raw_inputs.as_ptr(),
                inputs as c_int,
                plan.fetches.as_ptr(),
                raw_outputs.as_mut_ptr(),
                plan.fetches.len() as c_int,
                std::ptr::null(),
                0,
                std::ptr::null_mut(),
                status.raw,
            );
        }
        let outputs: Vec<TfTensor<'static>> =
            raw_outputs.into_iter().filter(|raw| !raw.is_null()).map(|raw| TfTensor::own(api, raw)).collect();
        status.check()?;
        if outputs.len() != plan.fetches.len() {
            return Err(Error::internal("TensorFlow returned fewer outputs than asked for"));
        }
        outputs
            .iter()
            .zip(&plan.signature.outputs)
            .map(|(tensor, spec)| tensors::output(api, tensor, &spec.name))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_settings_encode_as_config_proto_fields() {
        let mut options =
            TensorflowOptions { intra_op_threads: 0, inter_op_threads: 0, ..TensorflowOptions::default() };
        assert!(config_proto(&options).is_empty(), "TensorFlow's own defaults when both are 0");
        options.intra_op_threads = 2;
        options.inter_op_threads = 3;
        assert_eq!(config_proto(&options), vec![0x10, 2, 0x28, 3]);
        // The default: one intra-op thread, ops on the caller's thread
        // (-1, a ten-byte varint).
        let default = config_proto(&TensorflowOptions::default());
        assert_eq!(&default[..3], &[0x10, 1, 0x28]);
        assert_eq!(default.len(), 3 + 10);
    }

    #[test]
    fn tensorflow_codes_keep_their_grpc_code() {
        use crate::error::Code;
        assert_eq!(status_error(3, "bad".into()).code(), Code::InvalidArgument);
        assert_eq!(status_error(8, "oom".into()).code(), Code::ResourceExhausted);
        assert_eq!(status_error(13, "boom".into()).code(), Code::Internal);
        assert_eq!(status_error(2, "unknown".into()).code(), Code::Internal);
    }
}
