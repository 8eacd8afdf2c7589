//! Request traces: which requests are traced, and the spans of their path
//! through the pipeline.
//!
//! A traced request gets one span from its arrival to its answer, its
//! parent the caller's W3C `traceparent` when it sent one, with a child
//! span for each step: admission, feature fetch, each stage (with its
//! queue wait and its run), the batch queue wait, inference (the batch a
//! request ran in is a span of its own, linked to every traced request in
//! it), and the encoding of the answer. The spans are `tracing` spans of
//! the target [`TARGET`] at TRACE level, which only the OpenTelemetry
//! layer (`server::telemetry`) listens to.
//!
//! The decision is made once, when the request arrives: a request that is
//! not traced makes no span at all (every helper here answers
//! `Span::none()` for it, at the cost of a branch), so tracing 1% of
//! requests costs the other 99% nothing.

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::field::Empty;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::config::TracingConfig;

/// The target of every span of a request trace.
pub const TARGET: &str = "sluice::trace";

/// Decides which requests are traced.
#[derive(Debug, Clone, Copy)]
pub struct TraceSampler {
    /// Off when no exporter is configured: nothing is traced.
    enabled: bool,
    ratio: f64,
}

impl TraceSampler {
    /// Traces nothing.
    pub const OFF: TraceSampler = TraceSampler { enabled: false, ratio: 0.0 };

    /// Samples as `config` says; off without an endpoint.
    pub fn new(config: &TracingConfig) -> TraceSampler {
        TraceSampler { enabled: config.otlp_endpoint.is_some(), ratio: config.sampling_ratio }
    }

    /// The span of a request calling `name` through `api`
    /// (`predict`, `model_infer`, …), or `Span::none()` when it is not
    /// traced: a request with a valid `traceparent` is traced when its
    /// caller sampled it, another one at the configured ratio.
    /// `log` is the request's log span: the trace span is its child for
    /// the log's sake (lines logged in it carry the request id), and a
    /// root (or the caller's span's child) in the trace.
    pub fn request_span(
        &self,
        api: &'static str,
        entrypoint: &'static str,
        name: &str,
        carrier: &dyn Extractor,
        log: &Span,
    ) -> Span {
        if !self.enabled {
            return Span::none();
        }
        let parent = TraceContextPropagator::new().extract(carrier);
        let remote = parent.span().span_context().clone();
        let sampled = if remote.is_valid() {
            remote.is_sampled()
        } else {
            self.ratio >= 1.0 || (self.ratio > 0.0 && rand::random::<f64>() < self.ratio)
        };
        if !sampled {
            return Span::none();
        }
        let span = tracing::trace_span!(
            target: TARGET,
            parent: log,
            "request",
            otel.name = api,
            otel.kind = "server",
            otel.status_code = Empty,
            otel.status_description = Empty,
            sluice.entrypoint = entrypoint,
            sluice.model = name,
            sluice.version = Empty,
        );
        if remote.is_valid() {
            // Only fails for a span no layer records, which is then moot.
            let _ = span.set_parent(parent);
        }
        span
    }
}

/// True when `span` is a recorded span of a request trace (not a log
/// span, not none).
pub fn is_traced(span: &Span) -> bool {
    !span.is_disabled() && span.metadata().is_some_and(|m| m.target() == TARGET)
}

/// A step of a traced request: a child of `parent` called `name`, or
/// `Span::none()` when `parent` is not traced.
pub fn step(parent: &Span, name: &str) -> Span {
    if !is_traced(parent) {
        return Span::none();
    }
    tracing::trace_span!(
        target: TARGET,
        parent: parent,
        "step",
        otel.name = name,
        otel.status_code = Empty,
        sluice.stage = Empty,
        sluice.rows = Empty,
    )
}

/// A step of the request whose span is current (the request's task runs
/// in it), or `Span::none()` when it is not traced.
pub fn current_step(name: &str) -> Span {
    step(&Span::current(), name)
}

/// The span of one batch run: a child of the first traced request in it,
/// linked to every traced request in it, or `Span::none()` when none is.
pub fn batch_span<'a>(requests: impl Iterator<Item = &'a Span>, rows: usize) -> Span {
    let mut batch = Span::none();
    for request in requests.filter(|span| is_traced(span)) {
        if !is_traced(&batch) {
            batch = step(request, "batch");
            batch.record("sluice.rows", rows);
        }
        batch.add_link(request.context().span().span_context().clone());
    }
    batch
}

/// Marks a traced span failed with `message`.
pub fn record_error(span: &Span, message: &dyn std::fmt::Display) {
    if is_traced(span) {
        span.record("otel.status_code", "error");
        span.record("otel.status_description", tracing::field::display(message));
    }
}

/// The W3C trace context of gRPC metadata.
pub struct MetadataCarrier<'a>(pub &'a tonic::metadata::MetadataMap);

impl Extractor for MetadataCarrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// The W3C trace context of HTTP headers.
pub struct HeaderCarrier<'a>(pub &'a http::HeaderMap);

impl Extractor for HeaderCarrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untraced_requests_make_no_spans() {
        let headers = http::HeaderMap::new();
        let log = Span::none();
        let span = TraceSampler::OFF.request_span("predict", "rest", "m", &HeaderCarrier(&headers), &log);
        assert!(span.is_none());
        assert!(step(&span, "inference").is_none());
        // A log span (not a trace span) is no parent of trace spans.
        assert!(step(&tracing::info_span!("request"), "inference").is_none());
        let sampler = TraceSampler { enabled: true, ratio: 0.0 };
        assert!(sampler.request_span("predict", "rest", "m", &HeaderCarrier(&headers), &log).is_none());
        let mut headers = http::HeaderMap::new();
        headers.insert("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00".parse().unwrap());
        assert!(sampler.request_span("predict", "rest", "m", &HeaderCarrier(&headers), &log).is_none());
    }
}
