//! The metrics registry: every counter, gauge and histogram sluice exports,
//! in Prometheus form, with names prefixed `sluice_` and few label values.
//!
//! Components take their handles once, when they are built (`Family` lookups
//! hash and lock), and update them on the hot path with atomics only.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

mod tf_serving;

pub use tf_serving::{TfRequestHandle, TfServingMetrics};

/// The most names that resolved to nothing labelled as themselves.
pub const MAX_UNRESOLVED_NAMES: usize = 100;

/// The label of every further name that resolved to nothing.
pub const UNKNOWN_NAME: &str = "unknown";

/// Labels of a queue: where requests wait.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    /// `pipeline/stage`, `model/batch`, …
    pub queue: String,
}

/// Labels of one step of a graph pipeline and what became of it.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabels {
    /// The pipeline.
    pub pipeline: String,
    /// The step's name.
    pub step: String,
    /// `ran`, `skipped` (its condition, or what it reads, was not there)
    /// or `failed`.
    pub outcome: String,
}

/// The counters of one graph step, resolved once.
#[derive(Clone)]
pub struct StepMetrics {
    /// Requests it ran for.
    pub ran: Counter,
    /// Requests it was skipped for.
    pub skipped: Counter,
    /// Requests it failed.
    pub failed: Counter,
}

/// Labels of a refusal.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectionLabels {
    /// Where the request was refused.
    pub queue: String,
    /// `queue_full`, `deadline`, `cancelled`.
    pub reason: String,
}

/// Labels of a model version.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    /// Model name.
    pub model: String,
    /// Version number.
    pub version: String,
}

/// Labels of one point of a model version's latency curve.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CurveLabels {
    /// Model name.
    pub model: String,
    /// Version number.
    pub version: String,
    /// Rows in the batch, padding included.
    pub batch_size: String,
}

/// A gauge of seconds or rates.
pub type FloatGauge = Gauge<f64, AtomicU64>;

/// Labels of a model.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelNameLabels {
    /// Model name.
    pub model: String,
}

/// Labels of a model's request log records.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLogLabels {
    /// Model name.
    pub model: String,
    /// `written`, `dropped_queue_full`, `dropped_failing`.
    pub outcome: &'static str,
}

/// Labels of a model's versions in one state.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionStateLabels {
    /// Model name.
    pub model: String,
    /// `START`, `LOADING`, `AVAILABLE`, `UNLOADING` or `END`.
    pub state: &'static str,
}

/// Labels of one upstream of a forwarded model.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamLabels {
    /// The model here.
    pub model: String,
    /// `host:port`.
    pub upstream: String,
}

/// Labels of an upstream's answers.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamCodeLabels {
    /// The model here.
    pub model: String,
    /// `host:port`.
    pub upstream: String,
    /// The gRPC code of the answer (`OK`, `UNAVAILABLE`, …).
    pub code: &'static str,
}

/// Labels of a listening port.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PortLabels {
    /// `grpc`, `http`, `admin` or `grpc_socket`.
    pub port: &'static str,
}

/// The metric handles of one cache.
pub struct CacheHandles {
    /// Requests answered from the cache.
    pub hits: Counter,
    /// Requests the cache had no answer for.
    pub misses: Counter,
    /// Requests that could not use the cache (a canary was running).
    pub bypassed: Counter,
    /// Bytes kept.
    pub bytes: Gauge,
}

/// Labels of a pipeline.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PipelineLabels {
    /// The pipeline (or a model served under its own name).
    pub pipeline: String,
}

/// Labels of a pipeline's outcomes.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PipelineOutcomeLabels {
    /// The pipeline.
    pub pipeline: String,
    /// What happened.
    pub outcome: &'static str,
}

/// Labels of the calls of one side of a plugin canary.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CanaryLabels {
    /// The pipeline.
    pub pipeline: String,
    /// The plugin.
    pub plugin: String,
    /// The registry's version of the plugin.
    pub version: String,
    /// `stable` or `canary`.
    pub side: &'static str,
    /// `ok` or `error`.
    pub outcome: &'static str,
}

/// Labels of a plugin.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginNameLabels {
    /// The plugin.
    pub plugin: String,
}

/// Labels of an outcome.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// What happened.
    pub outcome: &'static str,
}

/// Labels of a finished request, as TF Serving's `request_count` has them
/// (`model_name`, `status`), plus sluice's pipeline and entry point.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The model that served (or was asked for).
    pub model_name: Arc<str>,
    /// The pipeline (the model's name for a model served directly).
    pub pipeline: Arc<str>,
    /// `predict`, `get_model_metadata`, `get_model_status`.
    pub api: &'static str,
    /// `grpc` or `rest`.
    pub entrypoint: &'static str,
    /// The canonical code: `OK`, `INVALID_ARGUMENT`, …
    pub status: &'static str,
}

/// Labels of request latency, as TF Serving's `request_latency`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LatencyLabels {
    /// The model.
    pub model_name: Arc<str>,
    /// The pipeline.
    pub pipeline: Arc<str>,
    /// The API.
    pub api: &'static str,
    /// `grpc` or `rest`.
    pub entrypoint: &'static str,
}

/// The APIs requests are counted under.
/// TF Serving's (`predict`, `get_model_metadata`, `get_model_status`) and
/// the Open Inference Protocol's (`model_infer`, `model_metadata`,
/// `model_ready`).
pub const APIS: [&str; 9] = [
    "predict",
    "classify",
    "regress",
    "multi_inference",
    "get_model_metadata",
    "get_model_status",
    "model_infer",
    "model_metadata",
    "model_ready",
];

/// The entry points requests come through.
pub const ENTRYPOINTS: [&str; 2] = ["grpc", "rest"];

/// One pipeline's successful-request counters and latency histograms for
/// every API and entry point, resolved when the pipeline is built, so that
/// answering a request touches no label map.
pub struct RequestHandles {
    ok: Vec<Counter>,
    latency: Vec<Histogram>,
    tf_serving: Vec<Option<TfRequestHandle>>,
}

/// The handles of one API through one entry point.
pub struct RequestHandle<'a> {
    /// Successful requests.
    pub ok: &'a Counter,
    /// Their latency.
    pub latency: &'a Histogram,
    /// TF Serving's count and latency, where TF Serving records the API.
    pub tf_serving: Option<&'a TfRequestHandle>,
}

impl RequestHandle<'_> {
    /// A successful request that took `seconds`.
    pub fn record_ok(&self, seconds: f64) {
        self.ok.inc();
        self.latency.observe(seconds);
        if let Some(tf) = self.tf_serving {
            tf.record_ok(seconds);
        }
    }
}

impl RequestHandles {
    /// The handles of `api` through `entrypoint`.
    pub fn get(&self, api: &str, entrypoint: &str) -> Option<RequestHandle<'_>> {
        let a = APIS.iter().position(|&x| x == api)?;
        let e = ENTRYPOINTS.iter().position(|&x| x == entrypoint)?;
        let i = a * ENTRYPOINTS.len() + e;
        Some(RequestHandle {
            ok: self.ok.get(i)?,
            latency: self.latency.get(i)?,
            tf_serving: self.tf_serving.get(i)?.as_ref(),
        })
    }
}

/// Labels of a plugin call.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginCallLabels {
    /// `name version`.
    pub plugin: String,
    /// `ok`, `invalid_input`, `plugin_error`, `bad_output`, `timeout`,
    /// `out_of_memory`, `out_of_fuel`, `stack_overflow`, `trap`.
    pub outcome: String,
}

/// Labels of a plugin.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginLabels {
    /// `name version`.
    pub plugin: String,
}

/// Labels of a feature table.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TableLabels {
    /// The table's name.
    pub table: String,
    /// `embedded` or `redis`.
    pub store: &'static str,
}

/// Labels of a model's object-store operation or outcome.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StorageLabels {
    /// Model name.
    pub model: String,
    /// `list` or `download` (errors); `ok`, `failed`, `refused` (downloads).
    pub outcome: &'static str,
}

/// Labels of a feature store's connection.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreLabels {
    /// `redis`.
    pub store: &'static str,
}

/// Labels of a feature table's outcome counters.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TableOutcomeLabels {
    /// The table's name.
    pub table: String,
    /// `embedded` or `redis`.
    pub store: &'static str,
    /// `hit`, `miss`; for the cache `hit`, `miss`; for reloads `ok`, `refused`.
    pub outcome: &'static str,
}

/// Histogram buckets for durations: 10 µs to about 42 s.
#[derive(Clone)]
pub struct SecondsBuckets;

impl MetricConstructor<Histogram> for SecondsBuckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(exponential_buckets(1e-5, 2.0, 22))
    }
}

/// Histogram buckets for loading and warming up a version: 1 ms to 17 min.
#[derive(Clone)]
pub struct LoadSecondsBuckets;

impl MetricConstructor<Histogram> for LoadSecondsBuckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(exponential_buckets(1e-3, 2.0, 21))
    }
}

/// Histogram buckets for batch sizes: 1 to 1024 rows.
#[derive(Clone)]
pub struct RowsBuckets;

impl MetricConstructor<Histogram> for RowsBuckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(exponential_buckets(1.0, 2.0, 11))
    }
}

/// Declares every metric family once: its field of [`Metrics`], type,
/// constructor, exported name and help. `Metrics::new` builds and
/// registers them all from this one table.
macro_rules! metric_families {
    ($($(#[$doc:meta])* $field:ident: $ty:ty = $make:expr, $name:literal => $help:literal;)*) => {
        /// Every metric family, and the registry that exports them.
        pub struct Metrics {
            registry: Registry,
            /// Names requests asked for that resolved to nothing, as labelled so
            /// far (at most [`MAX_UNRESOLVED_NAMES`]).
            unresolved_names: std::sync::Mutex<std::collections::HashSet<Arc<str>>>,
            /// TF Serving's own families, in a registry of their own.
            pub tf_serving: TfServingMetrics,
            $($(#[$doc])* pub $field: $ty,)*
        }

        impl Metrics {
            /// A registry with every family registered.
            pub fn new() -> Arc<Metrics> {
                let mut registry = Registry::default();
                $(
                    let $field: $ty = $make;
                    registry.register($name, $help, $field.clone());
                )*
                Arc::new(Metrics {
                    registry,
                    unresolved_names: std::sync::Mutex::default(),
                    tf_serving: TfServingMetrics::default(),
                    $($field,)*
                })
            }
        }
    };
}

metric_families! {
    /// Requests waiting in a queue now.
    queue_depth: Family<QueueLabels, Gauge> = Family::default(),
        "sluice_queue_depth" => "Requests waiting in a queue; for an admission queue, requests admitted and not yet answered";
    /// Time requests waited in a queue before a worker took them.
    queue_wait_seconds: Family<QueueLabels, Histogram, SecondsBuckets> = Family::new_with_constructor(SecondsBuckets),
        "sluice_queue_wait_seconds" => "Time requests waited in a queue before a worker took them";
    /// Time a stage spent on a request.
    stage_seconds: Family<QueueLabels, Histogram, SecondsBuckets> = Family::new_with_constructor(SecondsBuckets),
        "sluice_stage_seconds" => "Time a pipeline stage spent on a request";
    /// Requests refused, by queue and reason.
    rejections: Family<RejectionLabels, Counter> = Family::default(),
        "sluice_rejections" => "Requests refused, by queue and reason";
    /// Rows per batch run (without padding).
    batch_rows: Family<ModelLabels, Histogram, RowsBuckets> = Family::new_with_constructor(RowsBuckets),
        "sluice_batch_rows" => "Rows per batch run, without padding";
    /// Padding rows added to reach an allowed batch size.
    padding_rows: Family<ModelLabels, Counter> = Family::default(),
        "sluice_padding_rows" => "Rows of padding added to batches";
    /// Batches holding rows of several callers.
    shared_batches: Family<ModelLabels, Counter> = Family::default(),
        "sluice_shared_batches" => "Batches a model version ran holding rows of more than one caller (pipelines, or the model called directly)";
    /// What became of each graph step, per request.
    graph_steps: Family<StepLabels, Counter> = Family::default(),
        "sluice_graph_steps" => "Steps of graph pipelines by outcome: ran, skipped (condition false, or what it reads was not made) or failed";
    /// Batches run by the model.
    model_runs: Family<ModelLabels, Counter> = Family::default(),
        "sluice_model_runs" => "Batches run by a model version";
    /// Of those, the batches run on the thread that decoded the request.
    inline_runs: Family<ModelLabels, Counter> = Family::default(),
        "sluice_inline_runs" => "Batches a model version ran on the thread that decoded the request (cheaper than server.inline_inference_micros)";
    /// Time the model took per batch.
    inference_seconds: Family<ModelLabels, Histogram, SecondsBuckets> = Family::new_with_constructor(SecondsBuckets),
        "sluice_inference_seconds" => "Time a model version took per batch";
    /// Requests by model, pipeline, API, entry point and status (TF
    /// Serving's `:tensorflow:serving:request_count`).
    requests: Family<RequestLabels, Counter> = Family::default(),
        "sluice_serving_request_count" => "Requests by model, pipeline, API, entry point and status (TF Serving's request_count)";
    /// Request latency (TF Serving's `:tensorflow:serving:request_latency`).
    request_latency: Family<LatencyLabels, Histogram, SecondsBuckets> = Family::new_with_constructor(SecondsBuckets),
        "sluice_serving_request_latency_seconds" => "Request latency by model, pipeline, API and entry point (TF Serving's request_latency)";
    /// Resident memory of the process, read at each scrape.
    resident_memory: Gauge = Gauge::default(),
        "sluice_process_resident_memory_bytes" => "Resident memory of the sluice process";
    /// Plugin calls by outcome.
    plugin_calls: Family<PluginCallLabels, Counter> = Family::default(),
        "sluice_plugin_calls" => "Plugin calls by outcome";
    /// Time per plugin call, instantiation included.
    plugin_seconds: Family<PluginLabels, Histogram, SecondsBuckets> = Family::new_with_constructor(SecondsBuckets),
        "sluice_plugin_seconds" => "Time per plugin call, instantiation included";
    /// Plugin instances made: under the `reset` policy a steady rate means
    /// resets that fail (memories that grow, traps), under `fresh` one a call.
    plugin_instances_made: Family<PluginLabels, Counter> = Family::default(),
        "sluice_plugin_instances_made" => "Plugin instances made (under instances = reset, only when one cannot be put back)";
    /// Feature lookups (one per request and table).
    feature_lookups: Family<TableLabels, Counter> = Family::default(),
        "sluice_feature_lookups" => "Feature lookups, one per request and table";
    /// Feature keys looked up, by outcome (`hit`, `miss`).
    feature_keys: Family<TableOutcomeLabels, Counter> = Family::default(),
        "sluice_feature_keys" => "Feature keys looked up, by outcome";
    /// Feature lookups that failed (store down, too slow, malformed value).
    feature_errors: Family<TableLabels, Counter> = Family::default(),
        "sluice_feature_errors" => "Feature lookups that failed: store down or too slow, malformed value";
    /// Local cache answers (`hit`, `miss`), per key.
    feature_cache: Family<TableOutcomeLabels, Counter> = Family::default(),
        "sluice_feature_cache" => "Feature cache answers per key, by outcome";
    /// Round trips to a feature store.
    feature_round_trips: Family<TableLabels, Counter> = Family::default(),
        "sluice_feature_round_trips" => "Round trips to a feature store";
    /// Distinct keys per round trip.
    feature_round_trip_keys: Family<TableLabels, Histogram, RowsBuckets> = Family::new_with_constructor(RowsBuckets),
        "sluice_feature_round_trip_keys" => "Distinct keys per round trip to a feature store";
    /// Time a lookup took, cache and round trip included.
    feature_fetch_seconds: Family<TableLabels, Histogram, SecondsBuckets> = Family::new_with_constructor(SecondsBuckets),
        "sluice_feature_fetch_seconds" => "Time a feature lookup took, cache and round trip included";
    /// Embedded table reloads, by outcome (`ok`, `refused`).
    feature_reloads: Family<TableOutcomeLabels, Counter> = Family::default(),
        "sluice_feature_reloads" => "Embedded feature table reloads, by outcome";
    /// 1 while a feature store's circuit breaker is open.
    feature_store_down: Family<StoreLabels, Gauge> = Family::default(),
        "sluice_feature_store_down" => "1 while a feature store is held down by its circuit breaker: lookups fail at once or fall back";
    /// Times a feature store's circuit breaker opened.
    feature_store_outages: Family<StoreLabels, Counter> = Family::default(),
        "sluice_feature_store_outages" => "Times a feature store was found down and its circuit breaker opened";
    /// Lookups answered by a fallback while their store was down.
    feature_fallbacks: Family<TableOutcomeLabels, Counter> = Family::default(),
        "sluice_feature_fallbacks" => "Feature lookups answered by a fallback (defaults, last_seen) because the store failed";
    /// Versions of each model by state.
    model_versions: Family<VersionStateLabels, Gauge> = Family::default(),
        "sluice_model_versions" => "Versions of each model by state (START, LOADING, AVAILABLE, UNLOADING, END)";
    /// Time to load a version (graph optimisation and sessions).
    model_load_seconds: Family<ModelNameLabels, Histogram, LoadSecondsBuckets> = Family::new_with_constructor(LoadSecondsBuckets),
        "sluice_model_load_seconds" => "Time to load a model version: graph optimisation and sessions";
    /// Time to warm a version up.
    model_warmup_seconds: Family<ModelNameLabels, Histogram, LoadSecondsBuckets> = Family::new_with_constructor(LoadSecondsBuckets),
        "sluice_model_warmup_seconds" => "Time to warm a model version up";
    /// Versions whose load or warmup failed.
    model_load_failures: Family<ModelNameLabels, Counter> = Family::default(),
        "sluice_model_load_failures" => "Model versions whose load or warmup failed";
    /// Loads by where their optimised graph came from (`hit`, `miss`, `off`).
    optimized_model_cache: Family<OutcomeLabels, Counter> = Family::default(),
        "sluice_optimized_model_cache" => "Version loads by where their optimised graph came from: hit, miss, off";
    /// Calls forwarded to an upstream, by the code it answered.
    upstream_requests: Family<UpstreamCodeLabels, Counter> = Family::default(),
        "sluice_upstream_requests" => "Calls forwarded to an upstream TF Serving, by the code it answered";
    /// Time a forwarded call took.
    upstream_seconds: Family<UpstreamLabels, Histogram, SecondsBuckets> = Family::new_with_constructor(SecondsBuckets),
        "sluice_upstream_seconds" => "Time a call forwarded to an upstream took";
    /// Calls in flight to an upstream.
    upstream_in_flight: Family<UpstreamLabels, Gauge> = Family::default(),
        "sluice_upstream_in_flight" => "Calls in flight to an upstream";
    /// Times an upstream was ejected.
    upstream_ejections: Family<UpstreamLabels, Counter> = Family::default(),
        "sluice_upstream_ejections" => "Times an upstream was ejected after failing";
    /// 1 while an upstream takes calls, 0 while it is ejected.
    upstream_healthy: Family<UpstreamLabels, Gauge> = Family::default(),
        "sluice_upstream_healthy" => "1 while an upstream takes calls, 0 while it is ejected";
    /// Connections open, by port.
    connections_open: Family<PortLabels, Gauge> = Family::default(),
        "sluice_connections_open" => "Connections open, by port";
    /// Connections accepted (and served), by port.
    connections_accepted: Family<PortLabels, Counter> = Family::default(),
        "sluice_connections_accepted" => "Connections accepted and served, by port";
    /// Connections closed at once because `max_connections` were open.
    connections_refused: Family<PortLabels, Counter> = Family::default(),
        "sluice_connections_refused" => "Connections closed at once because server.max_connections were open";
    model_config_file_polls: Family<OutcomeLabels, Counter> = Family::default(),
        "sluice_model_config_file_polls" => "Re-reads of --model_config_file by outcome: unchanged, applied, refused, unreadable";
    plugin_uploads: Family<OutcomeLabels, Counter> = Family::default(),
        "sluice_plugin_uploads" => "Plugin uploads by outcome: accepted (stored), refused (did not compile, fit or pass its sample)";
    connections_aged: Family<PortLabels, Counter> = Family::default(),
        "sluice_connections_aged" => "Connections told to go away (GOAWAY) on reaching server.max_connection_age_ms, by port";
    /// Auto batching: the rows a batch waits for now.
    batch_auto_want_rows: Family<ModelLabels, Gauge> = Family::default(),
        "sluice_batch_auto_want_rows" => "Auto batching: the rows a batch of a model version waits for now (1: no waiting)";
    /// Auto batching: the largest batch within the latency target now.
    batch_auto_cap_rows: Family<ModelLabels, Gauge> = Family::default(),
        "sluice_batch_auto_cap_rows" => "Auto batching: the largest batch of a model version that runs within the latency target";
    /// Auto batching: how long the last batch planned to wait.
    batch_auto_wait_seconds: Family<ModelLabels, FloatGauge> = Family::default(),
        "sluice_batch_auto_wait_seconds" => "Auto batching: how long the last batch planned to wait for more rows";
    /// Auto batching: rows arriving per second.
    batch_arrival_rate: Family<ModelLabels, FloatGauge> = Family::default(),
        "sluice_batch_arrival_rows_per_second" => "Auto batching: rows arriving at a model version per second (moving average)";
    /// Auto batching: the learned seconds per batch, by batch size.
    batch_latency_estimate: Family<CurveLabels, FloatGauge> = Family::default(),
        "sluice_batch_latency_estimate_seconds" => "Auto batching: the learned seconds a model version takes per batch, by batch size";
    /// The shared plugin registry's revision this replica serves.
    plugin_registry_revision: Gauge = Gauge::default(),
        "sluice_plugin_registry_revision" => "The shared plugin registry's revision this replica serves";
    /// Syncs with the shared plugin registry that failed.
    plugin_registry_sync_failures: Counter = Counter::default(),
        "sluice_plugin_registry_sync_failures" => "Syncs with the shared plugin registry that failed";
    /// 1 while a model's object store cannot be listed.
    storage_unreachable: Family<ModelNameLabels, Gauge> = Family::default(),
        "sluice_storage_unreachable" => "1 while a model's object store cannot be listed: loaded versions serve, no new one arrives";
    /// Failed requests to object stores, by model and operation.
    storage_errors: Family<StorageLabels, Counter> = Family::default(),
        "sluice_storage_errors" => "Failed object-store operations, by model and operation (list, download)";
    /// Version downloads from object stores, by model and outcome.
    storage_downloads: Family<StorageLabels, Counter> = Family::default(),
        "sluice_storage_downloads" => "Version downloads from object stores, by model and outcome (ok, failed, refused)";
    /// Bytes downloaded from object stores.
    storage_downloaded_bytes: Family<ModelNameLabels, Counter> = Family::default(),
        "sluice_storage_downloaded_bytes" => "Bytes downloaded from object stores, by model";
    /// Bytes the local cache of downloaded versions holds.
    storage_cache_bytes: Gauge = Gauge::default(),
        "sluice_storage_cache_bytes" => "Bytes the local cache of versions downloaded from object stores holds";
    /// Request log records, by outcome.
    request_log_records: Family<RequestLogLabels, Counter> = Family::default(),
        "sluice_request_log_records" => "Request log records by outcome: written, dropped_queue_full, dropped_failing (the log could not be written)";
    /// Bytes written to request logs.
    request_log_bytes: Family<ModelNameLabels, Counter> = Family::default(),
        "sluice_request_log_bytes" => "Bytes written to a model's request log files";
    /// Times a request log could not be written and stopped for a while.
    request_log_failures: Family<ModelNameLabels, Counter> = Family::default(),
        "sluice_request_log_failures" => "Times a model's request log could not be written (disk full, directory gone) and stopped for a while";
    /// TLS certificate reloads, by outcome (`ok`, `refused`).
    tls_reloads: Family<OutcomeLabels, Counter> = Family::default(),
        "sluice_tls_reloads" => "TLS certificate reloads after the files changed, by outcome: ok, refused (the current ones stay)";
    /// Response cache lookups, by outcome (`hit`, `miss`, `bypass`).
    response_cache_requests: Family<PipelineOutcomeLabels, Counter> = Family::default(),
        "sluice_response_cache_requests" => "Response cache lookups by pipeline and outcome: hit, miss, bypass (a plugin canary was running)";
    /// Bytes a response cache keeps.
    response_cache_bytes: Family<PipelineLabels, Gauge> = Family::default(),
        "sluice_response_cache_bytes" => "Bytes a pipeline's response cache keeps (inputs and answers)";
    /// Plugin calls on each side of a canary, by version and outcome.
    canary_calls: Family<CanaryLabels, Counter> = Family::default(),
        "sluice_canary_calls" => "Plugin calls on each side of a canary (stable, canary), by version and outcome";
    /// The percent of calls a plugin's canary version gets (0: none).
    canary_percent: Family<PluginNameLabels, FloatGauge> = Family::default(),
        "sluice_canary_percent" => "The percent of a plugin's calls its canary version gets; 0 when none runs";
    /// Canaries rolled back because they did worse than the stable version.
    canary_rollbacks: Family<PluginNameLabels, Counter> = Family::default(),
        "sluice_canary_rollbacks" => "Canary versions rolled back on their own for doing worse than the stable version";
    /// TLS handshakes that failed (no or a wrong client certificate, a
    /// plaintext client, a timeout), by port.
    tls_handshake_failures: Family<PortLabels, Counter> = Family::default(),
        "sluice_tls_handshake_failures" => "TLS handshakes that failed (a missing or unknown client certificate, a plaintext client, a timeout), by port";
}

impl Metrics {
    /// The handles of pipeline `pipeline`'s response cache.
    pub fn response_cache(&self, pipeline: &str) -> CacheHandles {
        let outcome = |outcome| {
            self.response_cache_requests
                .get_or_create_owned(&PipelineOutcomeLabels { pipeline: pipeline.to_string(), outcome })
        };
        CacheHandles {
            hits: outcome("hit"),
            misses: outcome("miss"),
            bypassed: outcome("bypass"),
            bytes: self.response_cache_bytes.get_or_create_owned(&PipelineLabels { pipeline: pipeline.to_string() }),
        }
    }

    /// The auto batching handles of one model version.
    pub fn batch_plan(&self, model: &str, version: i64) -> BatchPlanMetrics {
        let labels = ModelLabels { model: model.to_string(), version: version.to_string() };
        BatchPlanMetrics {
            want_rows: self.batch_auto_want_rows.get_or_create_owned(&labels),
            cap_rows: self.batch_auto_cap_rows.get_or_create_owned(&labels),
            wait_seconds: self.batch_auto_wait_seconds.get_or_create_owned(&labels),
            arrival_rate: self.batch_arrival_rate.get_or_create_owned(&labels),
            curve: self.batch_latency_estimate.clone(),
            labels,
        }
    }

    /// The lifecycle metrics of model `model`.
    pub fn lifecycle(&self, model: &str) -> LifecycleMetrics {
        let labels = ModelNameLabels { model: model.to_string() };
        LifecycleMetrics {
            load_seconds: self.model_load_seconds.get_or_create_owned(&labels),
            warmup_seconds: self.model_warmup_seconds.get_or_create_owned(&labels),
            failures: self.model_load_failures.get_or_create_owned(&labels),
        }
    }

    /// Sets how many versions of `model` are in each state.
    pub fn set_version_states(&self, model: &str, counts: &[(&'static str, i64)]) {
        for &(state, count) in counts {
            self.model_versions.get_or_create(&VersionStateLabels { model: model.to_string(), state }).set(count);
        }
    }

    /// The handles of feature table `table` in `store`.
    pub fn feature_table(&self, table: &str, store: &'static str) -> FeatureMetrics {
        let labels = TableLabels { table: table.to_string(), store };
        let outcome = |family: &Family<TableOutcomeLabels, Counter>, outcome| {
            family.get_or_create_owned(&TableOutcomeLabels { table: table.to_string(), store, outcome })
        };
        FeatureMetrics {
            lookups: self.feature_lookups.get_or_create_owned(&labels),
            hits: outcome(&self.feature_keys, "hit"),
            misses: outcome(&self.feature_keys, "miss"),
            errors: self.feature_errors.get_or_create_owned(&labels),
            cache_hits: outcome(&self.feature_cache, "hit"),
            cache_misses: outcome(&self.feature_cache, "miss"),
            round_trips: self.feature_round_trips.get_or_create_owned(&labels),
            round_trip_keys: self.feature_round_trip_keys.get_or_create_owned(&labels),
            seconds: self.feature_fetch_seconds.get_or_create_owned(&labels),
            reloads: outcome(&self.feature_reloads, "ok"),
            refused_reloads: outcome(&self.feature_reloads, "refused"),
        }
    }

    /// The counter of lookups of `table` answered by `fallback`
    /// (`defaults`, `last_seen`) while its store failed.
    pub fn feature_fallbacks(&self, table: &str, store: &'static str, fallback: &'static str) -> Counter {
        self.feature_fallbacks.get_or_create_owned(&TableOutcomeLabels {
            table: table.to_string(),
            store,
            outcome: fallback,
        })
    }

    /// The breaker gauge and outage counter of a feature store's connection.
    pub fn feature_store(&self, store: &'static str) -> (Gauge, Counter) {
        let labels = StoreLabels { store };
        (self.feature_store_down.get_or_create_owned(&labels), self.feature_store_outages.get_or_create_owned(&labels))
    }

    /// The registry, to add more families or to encode.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Everything in Prometheus' text format, with process memory read now.
    pub fn encode(&self) -> String {
        if let Some(rss) = resident_bytes(None) {
            self.resident_memory.set(rss as i64);
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode_registry(&mut out, &self.registry);
        let _ = prometheus_client::encoding::text::encode_registry(&mut out, self.tf_serving.registry());
        let _ = prometheus_client::encoding::text::encode_eof(&mut out);
        out
    }

    /// The counters of step `step` of graph pipeline `pipeline`.
    pub fn graph_step(&self, pipeline: &str, step: &str) -> StepMetrics {
        let outcome = |outcome: &str| {
            self.graph_steps.get_or_create_owned(&StepLabels {
                pipeline: pipeline.to_string(),
                step: step.to_string(),
                outcome: outcome.to_string(),
            })
        };
        StepMetrics { ran: outcome("ran"), skipped: outcome("skipped"), failed: outcome("failed") }
    }

    /// The handles of one queue.
    pub fn queue(&self, queue: &str) -> QueueMetrics {
        let labels = QueueLabels { queue: queue.to_string() };
        let rejection = |reason: &str| {
            self.rejections
                .get_or_create_owned(&RejectionLabels { queue: queue.to_string(), reason: reason.to_string() })
        };
        QueueMetrics {
            depth: self.queue_depth.get_or_create_owned(&labels),
            wait: self.queue_wait_seconds.get_or_create_owned(&labels),
            busy: self.stage_seconds.get_or_create_owned(&labels),
            full: rejection("queue_full"),
            expired: rejection("deadline"),
            cancelled: rejection("cancelled"),
            stale: rejection("stale"),
            tf_serving_wait: None,
        }
    }

    /// The handles of a model's batch queue: a queue whose waits are TF
    /// Serving's batching session queuing latency too.
    pub fn batch_queue(&self, queue: &str) -> QueueMetrics {
        QueueMetrics { tf_serving_wait: Some(self.tf_serving.queuing_latency()), ..self.queue(queue) }
    }

    /// The request handles of pipeline `pipeline` running model `model`.
    pub fn request_handles(&self, model: &Arc<str>, pipeline: &Arc<str>) -> RequestHandles {
        let mut handles = RequestHandles { ok: Vec::new(), latency: Vec::new(), tf_serving: Vec::new() };
        for api in APIS {
            for entrypoint in ENTRYPOINTS {
                handles.tf_serving.push(self.tf_serving.request_handle(model, api, entrypoint));
                let (model_name, pipeline) = (model.clone(), pipeline.clone());
                let ok = RequestLabels { model_name, pipeline, api, entrypoint, status: "OK" };
                handles.ok.push(self.requests.get_or_create_owned(&ok));
                let latency = LatencyLabels { model_name: ok.model_name, pipeline: ok.pipeline, api, entrypoint };
                handles.latency.push(self.request_latency.get_or_create_owned(&latency));
            }
        }
        handles
    }

    /// The label of a name a request asked for that resolved to nothing:
    /// the name itself for the first [`MAX_UNRESOLVED_NAMES`] such names,
    /// [`UNKNOWN_NAME`] for any other, so that clients inventing names
    /// cannot grow the metrics without bound.
    pub fn unresolved_name(&self, name: &str) -> Arc<str> {
        let mut seen = self.unresolved_names.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(known) = seen.get(name) {
            return known.clone();
        }
        if seen.len() >= MAX_UNRESOLVED_NAMES {
            return Arc::from(UNKNOWN_NAME);
        }
        let label: Arc<str> = Arc::from(name);
        seen.insert(label.clone());
        label
    }

    /// The request log handles of model `model`.
    pub fn request_log(&self, model: &str) -> RequestLogMetrics {
        let records = |outcome| {
            self.request_log_records.get_or_create_owned(&RequestLogLabels { model: model.to_string(), outcome })
        };
        let labels = ModelNameLabels { model: model.to_string() };
        RequestLogMetrics {
            written: records("written"),
            dropped_queue_full: records("dropped_queue_full"),
            dropped_failing: records("dropped_failing"),
            bytes: self.request_log_bytes.get_or_create_owned(&labels),
            failures: self.request_log_failures.get_or_create_owned(&labels),
        }
    }

    /// The handles of one model version.
    pub fn model(&self, model: &str, version: i64) -> ModelMetrics {
        let labels = ModelLabels { model: model.to_string(), version: version.to_string() };
        ModelMetrics {
            runs: self.model_runs.get_or_create_owned(&labels),
            inline_runs: self.inline_runs.get_or_create_owned(&labels),
            seconds: self.inference_seconds.get_or_create_owned(&labels),
            batch_rows: self.batch_rows.get_or_create_owned(&labels),
            padding_rows: self.padding_rows.get_or_create_owned(&labels),
            shared_batches: self.shared_batches.get_or_create_owned(&labels),
        }
    }
}

impl Metrics {
    /// The handles of one plugin (`name version`).
    pub fn plugin(&self, plugin: &str) -> PluginMetrics {
        PluginMetrics {
            plugin: plugin.to_string(),
            seconds: self.plugin_seconds.get_or_create_owned(&PluginLabels { plugin: plugin.to_string() }),
            ok: self
                .plugin_calls
                .get_or_create_owned(&PluginCallLabels { plugin: plugin.to_string(), outcome: "ok".to_string() }),
            calls: self.plugin_calls.clone(),
            instances_made: self
                .plugin_instances_made
                .get_or_create_owned(&PluginLabels { plugin: plugin.to_string() }),
        }
    }
}

/// The metrics of one model's request log.
#[derive(Clone)]
pub struct RequestLogMetrics {
    /// Records written.
    pub written: Counter,
    /// Records dropped because the writer's queue was full.
    pub dropped_queue_full: Counter,
    /// Records dropped while the log could not be written.
    pub dropped_failing: Counter,
    /// Bytes written.
    pub bytes: Counter,
    /// Times writing failed and the log stopped for a while.
    pub failures: Counter,
}

/// The metrics of one plugin.
#[derive(Clone)]
pub struct PluginMetrics {
    plugin: String,
    /// Time per call.
    pub seconds: Histogram,
    /// Successful calls, resolved once: the common case.
    ok: Counter,
    calls: Family<PluginCallLabels, Counter>,
    /// Instances made.
    pub instances_made: Counter,
}

impl PluginMetrics {
    /// Handles that go nowhere, for plugins run outside a server.
    pub fn detached(plugin: &str) -> PluginMetrics {
        PluginMetrics {
            plugin: plugin.to_string(),
            seconds: SecondsBuckets.new_metric(),
            ok: Counter::default(),
            calls: Family::default(),
            instances_made: Counter::default(),
        }
    }

    /// Counts a call with its outcome.
    pub fn record(&self, outcome: &str) {
        if outcome == "ok" {
            self.ok.inc();
            return;
        }
        self.calls.get_or_create(&PluginCallLabels { plugin: self.plugin.clone(), outcome: outcome.to_string() }).inc();
    }
}

/// Resident memory of process `pid` (this one when `None`), from /proc.
pub fn resident_bytes(pid: Option<u32>) -> Option<u64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_string(),
    };
    let status = std::fs::read_to_string(path).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// The metrics of one queue, resolved once.
#[derive(Clone)]
pub struct QueueMetrics {
    /// Requests waiting now.
    pub depth: Gauge,
    /// Time waited before a worker took the request.
    pub wait: Histogram,
    /// Time the worker spent on it.
    pub busy: Histogram,
    /// Refused because the queue was full.
    pub full: Counter,
    /// Dropped because the deadline passed while waiting.
    pub expired: Counter,
    /// Dropped because the client went away while waiting.
    pub cancelled: Counter,
    /// Answered RESOURCE_EXHAUSTED for waiting longer than the queue's
    /// time bound.
    pub stale: Counter,
    /// A batch queue's wait in TF Serving's
    /// `batching_session:queuing_latency` too, in microseconds.
    pub tf_serving_wait: Option<Histogram>,
}

/// The metrics of one feature table, resolved once.
#[derive(Clone)]
pub struct FeatureMetrics {
    /// Lookups.
    pub lookups: Counter,
    /// Keys found.
    pub hits: Counter,
    /// Keys not found.
    pub misses: Counter,
    /// Failed lookups.
    pub errors: Counter,
    /// Keys answered by the local cache.
    pub cache_hits: Counter,
    /// Keys the local cache did not hold.
    pub cache_misses: Counter,
    /// Round trips to the store.
    pub round_trips: Counter,
    /// Distinct keys per round trip.
    pub round_trip_keys: Histogram,
    /// Time per lookup.
    pub seconds: Histogram,
    /// Reloads that replaced the table.
    pub reloads: Counter,
    /// Reloads refused (the old table kept serving).
    pub refused_reloads: Counter,
}

/// The lifecycle metrics of one model.
pub struct LifecycleMetrics {
    /// Time to load a version.
    pub load_seconds: Histogram,
    /// Time to warm a version up.
    pub warmup_seconds: Histogram,
    /// Failed loads.
    pub failures: Counter,
}

/// The metrics of one model version, resolved once.
#[derive(Clone)]
pub struct ModelMetrics {
    /// Batches run.
    pub runs: Counter,
    /// Of those, the batches run inline, on the request's thread.
    pub inline_runs: Counter,
    /// Time per batch.
    pub seconds: Histogram,
    /// Rows per batch.
    pub batch_rows: Histogram,
    /// Padding rows added.
    pub padding_rows: Counter,
    /// Batches holding rows of more than one caller.
    pub shared_batches: Counter,
}

/// The auto batcher's choices for one model version, resolved once.
#[derive(Clone)]
pub struct BatchPlanMetrics {
    /// Rows a batch waits for.
    pub want_rows: Gauge,
    /// The largest batch within the target.
    pub cap_rows: Gauge,
    /// The last planned wait.
    pub wait_seconds: FloatGauge,
    /// Rows arriving per second.
    pub arrival_rate: FloatGauge,
    curve: Family<CurveLabels, FloatGauge>,
    labels: ModelLabels,
}

impl BatchPlanMetrics {
    /// Publishes the learned latency at each measured batch size (off the
    /// request path: a family lookup per point).
    pub fn publish_curve(&self, points: &[(usize, f64)]) {
        for &(batch_size, seconds) in points {
            let labels = CurveLabels {
                model: self.labels.model.clone(),
                version: self.labels.version.clone(),
                batch_size: batch_size.to_string(),
            };
            self.curve.get_or_create(&labels).set(seconds);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_update_the_exported_text() {
        let metrics = Metrics::new();
        let queue = metrics.queue("cnn/batch");
        queue.full.inc();
        queue.depth.set(3);
        metrics.model("cnn", 1).runs.inc_by(2);
        let text = metrics.encode();
        assert!(text.contains("sluice_rejections_total{queue=\"cnn/batch\",reason=\"queue_full\"} 1"), "{text}");
        assert!(text.contains("sluice_queue_depth{queue=\"cnn/batch\"} 3"), "{text}");
        assert!(text.contains("sluice_model_runs_total{model=\"cnn\",version=\"1\"} 2"), "{text}");
    }
}
