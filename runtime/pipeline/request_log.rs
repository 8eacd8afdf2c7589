//! The request log (TF Serving's `logging_config`): a sampled share of a
//! model's requests, each with its answer, written as TF Serving's
//! `PredictionLog` records to TFRecord files that TensorFlow reads
//! (`tf.data.TFRecordDataset`), `sluice bench --requests-from` replays and
//! `sluice warmup make` turns into a warmup file.
//!
//! The request path only decides whether to log (one random draw) and, for
//! a sampled request, hands its tensors over (shared `Bytes`, no copy)
//! through a bounded queue. Encoding and file I/O happen on the log's own
//! thread. A full queue drops the record and counts it; a log that cannot
//! be written (disk full, directory gone) stops with a log line and a
//! metric, drops what comes meanwhile, and tries again a few seconds later:
//! serving never waits for the log.
//!
//! A `filename_prefix` in object storage (`s3://bucket/logs/mlp`) is
//! written to an owner-only staging directory and each file uploaded, in
//! one atomic put, when it is closed: at its size, at
//! `upload_interval_secs` after it started, and when the log stops. A
//! file whose upload fails stays staged (within `max_files`) and is tried
//! again at the next close.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prometheus_client::metrics::counter::Counter;
use prost::Message as _;

use crate::config::{LoggingConfig, OutputEncoding};
use crate::error::{Error, Result};
use crate::metrics::{Metrics, RequestLogMetrics};
use crate::models::{tfrecord, warmup};
use crate::proto::tensorflow::serving::{
    model_spec, prediction_log, LogMetadata, ModelSpec, PredictLog, PredictRequest, PredictResponse, PredictionLog,
    SamplingConfig,
};
use crate::tensor::proto::encode;
use crate::tensor::spec::{Signature, DEFAULT_SIGNATURE};
use crate::tensor::Tensor;

/// How long a log that failed waits before it tries to write again.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// The most bytes gathered before they are written, so a burst is written
/// in a few large writes without holding much memory.
const MAX_PENDING_BYTES: usize = 4 << 20;

/// The SavedModel tag TF Serving serves with, recorded in each record's
/// metadata as TF Serving does.
const SERVE_TAG: &str = "serve";

/// One logged request and its answer, as the request path hands it over.
pub struct LogEntry {
    /// The name the client called.
    pub name: Arc<str>,
    /// The version that answered.
    pub version: i64,
    /// What the client sent and received (input names, output names).
    pub signature: Arc<Signature>,
    /// The inputs, in the signature's order.
    pub inputs: Vec<Tensor>,
    /// The client's `output_filter`, as the names answered when it gave one.
    pub output_filter: Vec<String>,
    /// The outputs answered.
    pub outputs: Vec<(String, Tensor)>,
}

/// What the writer thread is sent.
enum Message {
    /// A record to write.
    Entry(LogEntry),
    /// Write and close what is open (uploading it, for a log in object
    /// storage), then say so: the server is stopping.
    Stop(SyncSender<()>),
}

/// Every log started, for [`stop_all`].
static LOGS: std::sync::Mutex<Vec<std::sync::Weak<RequestLog>>> = std::sync::Mutex::new(Vec::new());

/// Has every log still open write and close its file (and upload it, for
/// a log in object storage), waiting at most `timeout` in all: the
/// server's last step, so that a stopping pod's records are not lost.
pub fn stop_all(timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let logs: Vec<Arc<RequestLog>> = LOGS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .filter_map(std::sync::Weak::upgrade)
        .collect();
    let mut acks = Vec::new();
    // Every log is told at once; one whose queue is full is told again
    // while the bound lasts, so one stuck log holds none of the others.
    let mut waiting: Vec<(&Arc<RequestLog>, Message, Receiver<()>)> = logs
        .iter()
        .map(|log| {
            let (ack, done) = mpsc::sync_channel(1);
            (log, Message::Stop(ack), done)
        })
        .collect();
    while !waiting.is_empty() {
        let mut full = Vec::new();
        for (log, message, done) in waiting {
            match log.sender.try_send(message) {
                Ok(()) => acks.push(done),
                Err(mpsc::TrySendError::Full(back)) => full.push((log, back, done)),
                Err(mpsc::TrySendError::Disconnected(_)) => {}
            }
        }
        if full.is_empty() || Instant::now() >= deadline {
            break;
        }
        waiting = full;
        std::thread::sleep(Duration::from_millis(5));
    }
    for done in acks {
        let _ = done.recv_timeout(deadline.saturating_duration_since(Instant::now()));
    }
}

/// A model's request log: the sampler and the queue to its writer thread.
pub struct RequestLog {
    config: LoggingConfig,
    sender: SyncSender<Message>,
    queue_full: Counter,
}

impl RequestLog {
    /// Starts the log of model `model` as `config` says; its directory is
    /// made when missing. The writer thread ends once the log is dropped
    /// and its queue is written.
    pub fn start(model: &str, config: &LoggingConfig, metrics: &Metrics) -> Result<Arc<RequestLog>> {
        let (sender, receiver) = mpsc::sync_channel(config.queue_capacity);
        let handles = metrics.request_log(model);
        let queue_full = handles.dropped_queue_full.clone();
        let (upload, staged) = Upload::of(model, config)?;
        let local = LoggingConfig { filename_prefix: staged, ..config.clone() };
        let config_given = config;
        let config = &local;
        if let Some(dir) = config.filename_prefix.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                Error::invalid_argument(format!(
                    "model '{model}': cannot make the request log directory {}: {e}",
                    dir.display()
                ))
            })?;
        }
        let mut writer = Writer::new(model, config, handles);
        writer.upload = upload;
        std::thread::Builder::new()
            .name(format!("request-log-{model}"))
            .spawn(move || writer.run(receiver))
            .map_err(|e| Error::internal(format!("cannot start the request log thread of model '{model}': {e}")))?;
        let log = Arc::new(RequestLog { config: config_given.clone(), sender, queue_full });
        let mut logs = LOGS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        logs.retain(|l| l.strong_count() > 0);
        logs.push(Arc::downgrade(&log));
        Ok(log)
    }

    /// What it was started with (a reload restarts a log whose config
    /// changed).
    pub fn config(&self) -> &LoggingConfig {
        &self.config
    }

    /// True for the requests to log: a uniform draw against the rate.
    pub fn sample(&self) -> bool {
        let rate = self.config.sampling_rate;
        rate >= 1.0 || (rate > 0.0 && rand::random::<f64>() < rate)
    }

    /// Queues `entry` for the writer; when the queue is full it is dropped
    /// and counted.
    pub fn submit(&self, entry: LogEntry) {
        // Disconnected too: the writer only ends once every sender is
        // gone, or if it died, and then the record is dropped all the same.
        if self.sender.try_send(Message::Entry(entry)).is_err() {
            self.queue_full.inc();
        }
    }
}

/// The log's thread: encodes records and writes them to rotating files.
struct Writer {
    model: String,
    prefix: PathBuf,
    sampling_rate: f64,
    max_file_bytes: u64,
    max_files: usize,
    metrics: RequestLogMetrics,
    /// The file being written, and the bytes in it.
    file: Option<(File, PathBuf, u64)>,
    /// Files this process wrote, oldest first, for `max_files`.
    kept: VecDeque<PathBuf>,
    started_ms: u128,
    next_seq: u32,
    /// Encoded records not yet written, and how many.
    pending: Vec<u8>,
    pending_records: u64,
    /// While the log is failing: when it tries again.
    retry_at: Option<Instant>,
    /// Where closed files go, for a log in object storage.
    upload: Option<Upload>,
    /// When the open file started.
    opened_at: Option<Instant>,
}

/// A log in object storage: the directory URL its files are uploaded to,
/// and a runtime of the writer thread's own to upload them on.
struct Upload {
    /// The URL of the prefix's directory (`s3://bucket/logs`).
    dir: String,
    interval: Duration,
    runtime: tokio::runtime::Runtime,
    /// Whether the last upload failed (one line per failing streak).
    failing: bool,
}

impl Upload {
    /// For a `filename_prefix` in object storage: the upload, and the
    /// local prefix files are staged under (owner-only, one directory per
    /// model and URL). Otherwise none, and the prefix itself.
    fn of(model: &str, config: &LoggingConfig) -> Result<(Option<Upload>, PathBuf)> {
        let prefix = &config.filename_prefix;
        if !crate::config::is_object_store_url(prefix) {
            return Ok((None, prefix.clone()));
        }
        let url = prefix.display().to_string();
        if url.contains('?') {
            return Err(Error::invalid_argument(format!(
                "model '{model}': logging.filename_prefix {}: a query (a SAS token, say) would name every log \
                 file; give the store's credentials through the environment",
                crate::models::storage::shown(&url)
            )));
        }
        let (dir, name) = url.rsplit_once('/').unwrap_or((url.as_str(), "requests"));
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        let digest: String = {
            use sha2::Digest;
            hex::encode(&sha2::Sha256::digest(url.as_bytes())[..6])
        };
        let root = std::env::temp_dir().join(format!("sluice-request-logs-{uid}"));
        crate::private_files::ensure_private_dir(&root, "the request log staging directory")?;
        let staging = root.join(format!("{model}-{digest}"));
        std::fs::create_dir_all(&staging)
            .map_err(|e| Error::unavailable(format!("model '{model}': cannot make {}: {e}", staging.display())))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::internal(format!("model '{model}': the request log's upload runtime: {e}")))?;
        let upload = Upload {
            dir: dir.to_string(),
            interval: Duration::from_secs(config.upload_interval_secs),
            runtime,
            failing: false,
        };
        Ok((Some(upload), staging.join(name)))
    }
}

impl Writer {
    fn new(model: &str, config: &LoggingConfig, metrics: RequestLogMetrics) -> Writer {
        Writer {
            model: model.to_string(),
            prefix: config.filename_prefix.clone(),
            sampling_rate: config.sampling_rate,
            max_file_bytes: config.max_file_mib << 20,
            max_files: config.max_files,
            metrics,
            file: None,
            kept: VecDeque::new(),
            started_ms: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis()),
            next_seq: 0,
            pending: Vec::new(),
            pending_records: 0,
            retry_at: None,
            upload: None,
            opened_at: None,
        }
    }

    fn run(mut self, receiver: Receiver<Message>) {
        // Each burst of queued records is written together: one write per
        // burst at high rates, whole records in the file at every moment.
        loop {
            // A log in object storage wakes to close and upload a file
            // that has been open for its interval.
            let entry = match self.upload.as_ref().map(|u| u.interval) {
                None => receiver.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
                Some(interval) => {
                    let left = self.opened_at.map_or(interval, |at| interval.saturating_sub(at.elapsed()));
                    receiver.recv_timeout(left)
                }
            };
            match entry {
                Ok(Message::Entry(entry)) => self.add(entry),
                Ok(Message::Stop(ack)) => {
                    self.flush();
                    self.close();
                    let _ = ack.send(());
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    self.close();
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            while self.pending.len() < MAX_PENDING_BYTES {
                match receiver.try_recv() {
                    Ok(Message::Entry(entry)) => self.add(entry),
                    Ok(Message::Stop(ack)) => {
                        self.flush();
                        self.close();
                        let _ = ack.send(());
                    }
                    Err(_) => break,
                }
            }
            self.flush();
            // Under steady traffic the wait above never times out: a file
            // open past its interval closes here.
            if self.upload.as_ref().zip(self.opened_at).is_some_and(|(u, at)| at.elapsed() >= u.interval) {
                self.close();
            }
        }
        self.flush();
        self.close();
    }

    /// Closes the open file; a log in object storage uploads every closed
    /// file still staged, oldest first, and removes each uploaded.
    fn close(&mut self) {
        self.file = None;
        self.opened_at = None;
        let Some(upload) = &mut self.upload else { return };
        while let Some(path) = self.kept.front().cloned() {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let shipped = std::fs::read(&path)
                .map_err(|e| Error::unavailable(format!("reading {}: {e}", path.display())))
                .and_then(|bytes| {
                    upload.runtime.block_on(crate::models::storage::write_object(
                        &upload.dir,
                        &name,
                        bytes,
                        Duration::from_secs(60),
                    ))
                });
            match shipped {
                Ok(()) => {
                    if upload.failing {
                        upload.failing = false;
                        tracing::info!(model = %self.model, "request log files upload again");
                    }
                    self.kept.pop_front();
                    let _ = std::fs::remove_file(&path);
                }
                Err(error) => {
                    self.metrics.failures.inc();
                    if !upload.failing {
                        upload.failing = true;
                        tracing::error!(
                            model = %self.model,
                            "a request log file could not be uploaded; it stays staged (within max_files) and \
                             is tried again when the next file closes: {error}"
                        );
                    }
                    return;
                }
            }
        }
    }

    fn failing(&mut self) -> bool {
        match self.retry_at {
            Some(at) if Instant::now() < at => true,
            Some(_) => {
                self.retry_at = None;
                false
            }
            None => false,
        }
    }

    fn add(&mut self, entry: LogEntry) {
        if self.failing() {
            self.metrics.dropped_failing.inc();
            return;
        }
        let start = self.pending.len();
        tfrecord::frame(&record(entry, self.sampling_rate).encode_to_vec(), &mut self.pending);
        self.pending_records += 1;
        let in_file = self.file.as_ref().map_or(0, |f| f.2);
        // A record that would take the file past its size starts the next
        // file (unless it is the file's first).
        if in_file + start as u64 > 0 && in_file + self.pending.len() as u64 > self.max_file_bytes {
            let next = self.pending.split_off(start);
            self.pending_records -= 1;
            self.flush();
            self.close();
            self.pending = next;
            self.pending_records = 1;
        }
    }

    fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        if let Err(e) = self.write_pending() {
            tracing::error!(
                model = %self.model,
                error = %e,
                "the request log stopped: records are dropped (counted in sluice_request_log_records_total) \
                 and writing is tried again in {}s",
                RETRY_AFTER.as_secs()
            );
            self.metrics.failures.inc();
            self.metrics.dropped_failing.inc_by(self.pending_records);
            self.file = None;
            self.retry_at = Some(Instant::now() + RETRY_AFTER);
        } else {
            self.metrics.written.inc_by(self.pending_records);
            self.metrics.bytes.inc_by(self.pending.len() as u64);
        }
        self.pending.clear();
        self.pending_records = 0;
    }

    fn write_pending(&mut self) -> std::io::Result<()> {
        if self.file.is_none() {
            let opened = self.open_next()?;
            self.file = Some(opened);
            self.opened_at = Some(Instant::now());
        }
        let Some((file, path, written)) = &mut self.file else {
            return Err(std::io::Error::other("the request log file vanished, this is a bug"));
        };
        // An open file whose directory was removed still takes writes,
        // into nothing anyone can read: check it is still there.
        if !path.exists() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{} was removed while it was written", path.display()),
            ));
        }
        file.write_all(&self.pending)
            .map_err(|e| std::io::Error::new(e.kind(), format!("writing {}: {e}", path.display())))?;
        *written += self.pending.len() as u64;
        Ok(())
    }

    /// Opens the next file, never one that exists; the directory is not
    /// made again (it was at start), so a removed directory stops the log.
    fn open_next(&mut self) -> std::io::Result<(File, PathBuf, u64)> {
        let name = self.prefix.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        loop {
            let path = self.prefix.with_file_name(format!("{name}-{}-{:05}.tfrecord", self.started_ms, self.next_seq));
            self.next_seq += 1;
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(file) => {
                    self.retire_old_files();
                    tracing::info!(model = %self.model, file = %path.display(), "request log file started");
                    self.kept.push_back(path.clone());
                    return Ok((file, path, 0));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(std::io::Error::new(e.kind(), format!("opening {}: {e}", path.display())));
                }
            }
        }
    }

    /// Deletes this process's oldest files beyond `max_files - 1`, to make
    /// room for the next.
    fn retire_old_files(&mut self) {
        if self.max_files == 0 {
            return;
        }
        while self.kept.len() >= self.max_files {
            let Some(old) = self.kept.pop_front() else { break };
            if let Err(e) = std::fs::remove_file(&old) {
                tracing::warn!(model = %self.model, file = %old.display(), error = %e, "cannot delete an old request log file");
            }
        }
    }
}

/// The `PredictionLog` record of `entry`, as TF Serving writes one: the
/// request with the version that answered, the response, and metadata.
fn record(entry: LogEntry, sampling_rate: f64) -> PredictionLog {
    let spec = ModelSpec {
        name: entry.name.to_string(),
        version_choice: Some(model_spec::VersionChoice::Version(entry.version)),
        signature_name: DEFAULT_SIGNATURE.to_string(),
    };
    let inputs = entry
        .signature
        .inputs
        .iter()
        .zip(&entry.inputs)
        .map(|(spec, tensor)| (spec.name.clone(), encode(tensor, OutputEncoding::TensorContent)))
        .collect();
    let outputs = entry
        .outputs
        .iter()
        .map(|(name, tensor)| (name.clone(), encode(tensor, OutputEncoding::TensorContent)))
        .collect();
    PredictionLog {
        log_metadata: Some(LogMetadata {
            model_spec: Some(spec.clone()),
            sampling_config: Some(SamplingConfig { sampling_rate }),
            saved_model_tags: vec![SERVE_TAG.to_string()],
            // Taken when the writer encodes it: at most a queue's wait late.
            timestamp_secs: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64),
        }),
        log_type: Some(prediction_log::LogType::PredictLog(PredictLog {
            request: Some(PredictRequest {
                model_spec: Some(spec.clone()),
                inputs,
                output_filter: entry.output_filter,
            }),
            response: Some(PredictResponse { outputs, model_spec: Some(spec) }),
        })),
    }
}

/// The files a log path names, in the order they were written: a file
/// itself; every `*.tfrecord` file in a directory; or the files a
/// `filename_prefix` started (`PREFIX-*.tfrecord`).
pub fn log_files(path: &Path) -> Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let (dir, prefix) = if path.is_dir() {
        (path.to_path_buf(), String::new())
    } else {
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let prefix = path.file_name().map(|n| format!("{}-", n.to_string_lossy())).unwrap_or_default();
        (dir.to_path_buf(), prefix)
    };
    let entries = std::fs::read_dir(&dir).map_err(|e| {
        Error::invalid_argument(format!("{}: no such log file, directory or prefix ({e})", path.display()))
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|file| {
            let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            file.is_file() && name.starts_with(&prefix) && name.ends_with(".tfrecord")
        })
        .collect();
    // Names carry the start time and a zero-padded sequence number.
    files.sort();
    if files.is_empty() {
        return Err(Error::invalid_argument(format!("{}: no request log files (*.tfrecord) there", path.display())));
    }
    Ok(files)
}

/// At most `max` of `items` (a log's requests), evenly spread over them to
/// keep the log's mix, in their order.
pub fn spread<T>(items: Vec<T>, max: usize) -> Vec<T> {
    let total = items.len();
    if total <= max {
        return items;
    }
    items.into_iter().enumerate().filter(|(i, _)| (i * max) % total < max).map(|(_, item)| item).take(max).collect()
}

/// [`read_requests`] of a log on disk or in object storage
/// (`s3://bucket/logs/mlp`: a directory, a `filename_prefix` or one file
/// there).
pub async fn read_logged(path: &Path, max_bytes: u64) -> Result<Vec<PredictRequest>> {
    if !crate::config::is_object_store_url(path) {
        return read_requests(path, max_bytes);
    }
    let url = path.display().to_string();
    let timeout = Duration::from_secs(60);
    let mut requests = Vec::new();
    for (name, bytes) in crate::models::storage::read_log_objects(&url, max_bytes, timeout).await? {
        requests.extend(warmup::predict_requests(&bytes).map_err(|e| e.context(format_args!("request log {name}")))?);
    }
    Ok(requests)
}

/// The Predict requests of a request log (any path [`log_files`] takes),
/// in the order they were logged; at most `max_bytes` of files are read,
/// and a malformed file is refused naming the file and the record.
pub fn read_requests(path: &Path, max_bytes: u64) -> Result<Vec<PredictRequest>> {
    let mut left = max_bytes;
    let mut requests = Vec::new();
    for file in log_files(path)? {
        let at = |e: Error| e.context(format_args!("request log {}", file.display()));
        let bytes = tfrecord::read_bounded(&file, left)
            .map_err(|e| at(e.context(format_args!("the log files given hold more than {max_bytes} bytes in all"))))?;
        left -= bytes.len() as u64;
        requests.extend(warmup::predict_requests(&bytes).map_err(at)?);
    }
    Ok(requests)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::spec::TensorSpec;
    use crate::tensor::DType;

    #[test]
    fn spread_keeps_order_and_reaches_the_end() {
        let requests: Vec<(usize, PredictRequest)> =
            vec![PredictRequest::default(); 10].into_iter().enumerate().collect();
        let picked: Vec<usize> = spread(requests.clone(), 3).into_iter().map(|(i, _)| i).collect();
        assert_eq!(picked.len(), 3);
        assert!(picked.windows(2).all(|w| w[0] < w[1]));
        assert!(*picked.last().unwrap() >= 6, "{picked:?}");
        assert_eq!(spread(requests, 20).len(), 10);
    }

    fn entry(value: f32) -> LogEntry {
        let spec = |name: &str| TensorSpec::new(name, DType::F32, vec![-1, 1]);
        LogEntry {
            name: "m".into(),
            version: 3,
            signature: Arc::new(Signature { inputs: vec![spec("x")], outputs: vec![spec("y")] }),
            inputs: vec![Tensor::from_values(vec![1, 1], &[value])],
            output_filter: Vec::new(),
            outputs: vec![("y".into(), Tensor::from_values(vec![1, 1], &[value * 2.0]))],
        }
    }

    fn config(dir: &Path, max_file_mib: u64, max_files: usize) -> LoggingConfig {
        LoggingConfig { max_file_mib, max_files, ..LoggingConfig::new(String::new(), dir.join("log/m"), 1.0) }
    }

    fn wait_for_written(metrics: &Metrics, n: u64) {
        let handles = metrics.request_log("m");
        for _ in 0..500 {
            if handles.written.get() >= n {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("{} of {n} records written", handles.written.get());
    }

    #[test]
    fn records_read_back_as_predict_logs() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Metrics::new();
        let log = RequestLog::start("m", &config(dir.path(), 64, 10), &metrics).unwrap();
        for i in 0..5 {
            log.submit(entry(i as f32));
        }
        wait_for_written(&metrics, 5);
        let files = log_files(&dir.path().join("log/m")).unwrap();
        assert_eq!(files.len(), 1);
        let bytes = std::fs::read(&files[0]).unwrap();
        let records = tfrecord::records(&bytes).unwrap();
        assert_eq!(records.len(), 5);
        let (request, response) = warmup::predict_log(records[4]).unwrap();
        assert_eq!(request.model_spec.unwrap().name, "m");
        assert_eq!(request.inputs["x"].tensor_content.as_ref(), 4.0f32.to_le_bytes());
        assert_eq!(response.unwrap().outputs["y"].tensor_content.as_ref(), 8.0f32.to_le_bytes());
        let log = PredictionLog::decode(records[0]).unwrap();
        assert_eq!(log.log_metadata.unwrap().saved_model_tags, vec!["serve"]);
    }

    #[test]
    fn files_rotate_by_size_and_old_ones_are_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Metrics::new();
        let mut writer = Writer::new("m", &config(dir.path(), 1, 2), metrics.request_log("m"));
        std::fs::create_dir_all(dir.path().join("log")).unwrap();
        writer.max_file_bytes = 300;
        for i in 0..20 {
            writer.add(entry(i as f32));
            writer.flush();
        }
        let files = log_files(&dir.path().join("log")).unwrap();
        assert_eq!(files.len(), 2, "{files:?}");
        for file in &files {
            let size = std::fs::metadata(file).unwrap().len();
            assert!(size <= 300, "{} is {size} bytes", file.display());
        }
        assert!(writer.next_seq > 2);
    }

    #[test]
    fn a_removed_directory_stops_the_log_and_counts() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Metrics::new();
        let mut writer = Writer::new("m", &config(dir.path(), 64, 10), metrics.request_log("m"));
        std::fs::create_dir_all(dir.path().join("log")).unwrap();
        writer.add(entry(1.0));
        writer.flush();
        std::fs::remove_dir_all(dir.path().join("log")).unwrap();
        writer.add(entry(2.0));
        writer.flush();
        writer.add(entry(3.0));
        let handles = metrics.request_log("m");
        assert_eq!(handles.written.get(), 1);
        assert_eq!(handles.failures.get(), 1);
        assert_eq!(handles.dropped_failing.get(), 2);
        assert!(writer.retry_at.is_some());
    }

    #[test]
    fn log_paths_name_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let err = log_files(&dir.path().join("nothing/here")).unwrap_err();
        assert!(err.message().contains("no such log file"), "{err}");
        let err = log_files(dir.path()).unwrap_err();
        assert!(err.message().contains("no request log files"), "{err}");
    }
}
