//! TF Serving's own metric families, as its Prometheus exporter writes
//! them (`tensorflow_serving/util/prometheus_exporter.cc`), so dashboards
//! and alerts written for TF Serving keep working on sluice: the names
//! (`/tensorflow/serving/request_count` as
//! `:tensorflow:serving:request_count`), labels, units (microseconds) and
//! buckets of TF Serving's source, recorded where TF Serving records them.
//!
//! - `:tensorflow:serving:request_count{model_name, status}`: every
//!   Predict, Classify and Regress call, `status` the canonical code
//!   (`OK`, `INVALID_ARGUMENT`, …).
//! - `:tensorflow:serving:request_latency{model_name, API, entrypoint}`:
//!   successful calls only (TF Serving's `if (status.ok())`), `API`
//!   `Predict`/`Classify`/`Regress` over gRPC and `predict`/`classify`/
//!   `regress` over REST, `entrypoint` `GRPC` or `REST`; buckets 10 µs ×
//!   1.8^i, 33 of them.
//! - `:tensorflow:serving:batching_session:queuing_latency{thread_pool_name}`:
//!   time in a batch queue, `thread_pool_name` empty as TF Serving's model
//!   server leaves it; buckets 100 µs × 1.2^i, 52 of them.
//! - `:tensorflow:cc:saved_model:load_attempt_count{model_path, status}`
//!   (`success` or `fail`) and `:tensorflow:cc:saved_model:load_latency{model_path}`
//!   (microseconds, successful loads), `model_path` the version's
//!   directory, for every version sluice loads (TensorFlow's loader
//!   counts SavedModels; sluice counts ONNX versions alike).
//! - `:tensorflow:serving:model_warmup_latency{model_path, status}`
//!   (`OK` or the error).
//!
//! TF Serving types counters `counter` without the `_total` suffix that
//! OpenMetrics, which sluice's exposition is, requires of counters; they
//! are typed `unknown` here, so the samples keep TF Serving's names.

use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

/// A counter TF Serving's way: the sample carries the family's name.
#[derive(Debug, Clone, Default)]
pub struct Untyped(Counter);

impl Untyped {
    /// Adds one.
    pub fn inc(&self) {
        self.0.inc();
    }

    /// Adds `by`.
    pub fn inc_by(&self, by: u64) {
        self.0.inc_by(by);
    }
}

impl TypedMetric for Untyped {}

impl EncodeMetric for Untyped {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_gauge(&self.0.get())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Unknown
    }
}

/// `request_count`'s labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestCountLabels {
    pub model_name: Arc<str>,
    pub status: &'static str,
}

/// `request_latency`'s labels, TF Serving's names (`API` upper-case).
#[allow(non_snake_case)]
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLatencyLabels {
    pub model_name: Arc<str>,
    pub API: &'static str,
    pub entrypoint: &'static str,
}

/// `queuing_latency`'s label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ThreadPoolLabels {
    pub thread_pool_name: &'static str,
}

/// A version directory's label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelPathLabels {
    pub model_path: String,
}

/// A version directory and an outcome.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelPathStatusLabels {
    pub model_path: String,
    pub status: String,
}

/// TensorFlow's `Buckets::Exponential(scale, growth, count)`, each bound
/// at the six significant digits TF Serving's exporter prints
/// (`absl::StrCat`), so the `le` labels read as TF Serving's do.
fn tf_exponential_buckets(scale: f64, growth: f64, count: u16) -> impl Iterator<Item = f64> {
    exponential_buckets(scale, growth, count).map(|bound| {
        let magnitude = 10f64.powi(5 - bound.log10().floor() as i32);
        (bound * magnitude).round() / magnitude
    })
}

/// TF Serving's request and warmup latency buckets, in microseconds:
/// `Buckets::Exponential(10, 1.8, 33)` (to about 20 minutes).
#[derive(Clone)]
pub struct LatencyMicros;

impl MetricConstructor<Histogram> for LatencyMicros {
    fn new_metric(&self) -> Histogram {
        Histogram::new(tf_exponential_buckets(10.0, 1.8, 33))
    }
}

/// TF Serving's batch queuing buckets, in microseconds:
/// `Buckets::Exponential(100, 1.2, 52)` (to about a second).
#[derive(Clone)]
pub struct QueuingMicros;

impl MetricConstructor<Histogram> for QueuingMicros {
    fn new_metric(&self) -> Histogram {
        Histogram::new(tf_exponential_buckets(100.0, 1.2, 52))
    }
}

/// TF Serving's name for the API sluice calls `api` through `entrypoint`
/// (`grpc`, `rest`), and its entry point's, when TF Serving records that
/// call's count and latency (Predict, Classify, Regress).
pub fn tf_api(api: &str, entrypoint: &str) -> Option<(&'static str, &'static str)> {
    match (api, entrypoint) {
        ("predict", "grpc") => Some(("Predict", "GRPC")),
        ("classify", "grpc") => Some(("Classify", "GRPC")),
        ("regress", "grpc") => Some(("Regress", "GRPC")),
        ("predict", "rest") => Some(("predict", "REST")),
        ("classify", "rest") => Some(("classify", "REST")),
        ("regress", "rest") => Some(("regress", "REST")),
        _ => None,
    }
}

/// The families, in a registry of their own (encoded after sluice's).
pub struct TfServingMetrics {
    registry: Registry,
    request_count: Family<RequestCountLabels, Untyped>,
    request_latency: Family<RequestLatencyLabels, Histogram, LatencyMicros>,
    queuing_latency: Histogram,
    load_attempts: Family<ModelPathStatusLabels, Untyped>,
    load_latency: Family<ModelPathLabels, Untyped>,
    warmup_latency: Family<ModelPathStatusLabels, Histogram, LatencyMicros>,
}

/// One model's OK counter and the latency histogram of one API and entry
/// point, resolved when a pipeline is built.
#[derive(Clone)]
pub struct TfRequestHandle {
    ok: Untyped,
    latency: Histogram,
}

impl TfRequestHandle {
    /// A successful call that took `seconds`.
    pub fn record_ok(&self, seconds: f64) {
        self.ok.inc();
        self.latency.observe(seconds * 1e6);
    }
}

impl Default for TfServingMetrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let request_count = Family::<RequestCountLabels, Untyped>::default();
        registry.register(":tensorflow:serving:request_count", "The total number of requests.", request_count.clone());
        let request_latency = Family::new_with_constructor(LatencyMicros);
        registry.register(
            ":tensorflow:serving:request_latency",
            "Distribution of wall time (in microseconds) for Tensorflow Serving request.",
            request_latency.clone(),
        );
        let queuing = Family::<ThreadPoolLabels, Histogram, QueuingMicros>::new_with_constructor(QueuingMicros);
        registry.register(
            ":tensorflow:serving:batching_session:queuing_latency",
            "Distribution of wall time spent (in microseconds) in queuing",
            queuing.clone(),
        );
        let queuing_latency = queuing.get_or_create_owned(&ThreadPoolLabels { thread_pool_name: "" });
        let load_attempts = Family::<ModelPathStatusLabels, Untyped>::default();
        registry.register(
            ":tensorflow:cc:saved_model:load_attempt_count",
            "The number of times a SavedModel was successfully loaded.",
            load_attempts.clone(),
        );
        let load_latency = Family::<ModelPathLabels, Untyped>::default();
        registry.register(
            ":tensorflow:cc:saved_model:load_latency",
            "Latency in microseconds for SavedModels that were successfully loaded.",
            load_latency.clone(),
        );
        let warmup_latency = Family::new_with_constructor(LatencyMicros);
        registry.register(
            ":tensorflow:serving:model_warmup_latency",
            "Distribution of wall time (in microseconds) for warming up the model.",
            warmup_latency.clone(),
        );
        TfServingMetrics {
            registry,
            request_count,
            request_latency,
            queuing_latency,
            load_attempts,
            load_latency,
            warmup_latency,
        }
    }
}

impl TfServingMetrics {
    /// The registry to encode.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The handle of `model`'s successful `api` calls through
    /// `entrypoint`, when TF Serving records such calls.
    pub fn request_handle(&self, model: &Arc<str>, api: &str, entrypoint: &str) -> Option<TfRequestHandle> {
        let (tf_api, tf_entrypoint) = tf_api(api, entrypoint)?;
        Some(TfRequestHandle {
            ok: self.request_count.get_or_create_owned(&RequestCountLabels { model_name: model.clone(), status: "OK" }),
            latency: self.request_latency.get_or_create_owned(&RequestLatencyLabels {
                model_name: model.clone(),
                API: tf_api,
                entrypoint: tf_entrypoint,
            }),
        })
    }

    /// A failed `api` call to `model`, counted under its canonical code
    /// when TF Serving counts such calls.
    pub fn record_failure(&self, model: &Arc<str>, api: &str, entrypoint: &str, code: &'static str) {
        if tf_api(api, entrypoint).is_some() {
            self.request_count.get_or_create(&RequestCountLabels { model_name: model.clone(), status: code }).inc();
        }
    }

    /// The histogram of time spent in batch queues, in microseconds.
    pub fn queuing_latency(&self) -> Histogram {
        self.queuing_latency.clone()
    }

    /// A load of the version in `model_path` that took `seconds`.
    pub fn record_load(&self, model_path: &str, ok: bool, seconds: f64) {
        let status = if ok { "success" } else { "fail" };
        let labels = ModelPathStatusLabels { model_path: model_path.to_string(), status: status.to_string() };
        self.load_attempts.get_or_create(&labels).inc();
        if ok {
            let micros = (seconds * 1e6) as u64;
            self.load_latency.get_or_create(&ModelPathLabels { model_path: labels.model_path }).inc_by(micros);
        }
    }

    /// A warmup of the version in `model_path` that took `seconds`, with
    /// its outcome (`Ok` or the error's words, as TF Serving's
    /// `Status::ToString`).
    pub fn record_warmup(&self, model_path: &str, status: String, seconds: f64) {
        let labels = ModelPathStatusLabels { model_path: model_path.to_string(), status };
        self.warmup_latency.get_or_create(&labels).observe(seconds * 1e6);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_carry_tf_servings_names_labels_and_units() {
        let metrics = TfServingMetrics::default();
        let model: Arc<str> = "mlp".into();
        let handle = metrics.request_handle(&model, "predict", "grpc").expect("Predict is recorded");
        handle.record_ok(0.002);
        metrics.record_failure(&model, "predict", "rest", "INVALID_ARGUMENT");
        assert!(metrics.request_handle(&model, "get_model_metadata", "grpc").is_none());
        metrics.record_load("/models/mlp/1", true, 0.5);
        let mut text = String::new();
        prometheus_client::encoding::text::encode_registry(&mut text, metrics.registry()).expect("encode");
        assert!(text.contains("# TYPE :tensorflow:serving:request_count unknown"), "{text}");
        assert!(text.contains(":tensorflow:serving:request_count{model_name=\"mlp\",status=\"OK\"} 1"), "{text}");
        assert!(
            text.contains(":tensorflow:serving:request_count{model_name=\"mlp\",status=\"INVALID_ARGUMENT\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                ":tensorflow:serving:request_latency_sum{model_name=\"mlp\",API=\"Predict\",entrypoint=\"GRPC\"} 2000"
            ),
            "{text}"
        );
        assert!(
            text.contains(":tensorflow:cc:saved_model:load_latency{model_path=\"/models/mlp/1\"} 500000"),
            "{text}"
        );
        assert!(text.contains("thread_pool_name=\"\""), "{text}");
        // The bounds TF Serving prints: 10 × 1.8^i at six digits.
        assert!(text.contains("le=\"32.4\","), "{text}");
        assert!(text.contains("le=\"188.957\","), "{text}");
    }
}
