//! `[tracing]`: OpenTelemetry traces of requests, exported over OTLP/gRPC
//! to a collector. Off unless `otlp_endpoint` is given (or
//! `--otlp_endpoint`); the spans themselves are made in `pipeline::trace`,
//! the exporter is installed by `server::telemetry`.

use serde::Deserialize;

use super::{check_between, MAX_COUNT};
use crate::error::Invalid;
use crate::invalid;

/// Where traces go and how many requests are traced.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    /// The collector's OTLP/gRPC address (`http://collector:4317`); no
    /// traces when absent.
    pub otlp_endpoint: Option<String>,
    /// The share of requests traced that come without a W3C `traceparent`;
    /// a request with one is traced when its caller sampled it.
    pub sampling_ratio: f64,
    /// `service.name` of the exported spans.
    pub service_name: String,
    /// Spans waiting for export at most; more are dropped, never waited for.
    pub max_queued_spans: usize,
    /// Spans per export call at most.
    pub max_export_batch: usize,
    /// Milliseconds between exports.
    pub export_interval_ms: u64,
    /// Milliseconds one export may take before it is given up.
    pub export_timeout_ms: u64,
}

impl Default for TracingConfig {
    fn default() -> Self {
        TracingConfig {
            otlp_endpoint: None,
            sampling_ratio: 0.01,
            service_name: "sluice".to_string(),
            max_queued_spans: 8192,
            max_export_batch: 512,
            export_interval_ms: 1000,
            export_timeout_ms: 5000,
        }
    }
}

impl TracingConfig {
    /// Checks the values, named as `[tracing]` keys.
    pub fn check(&self) -> Result<(), Invalid> {
        if let Some(endpoint) = &self.otlp_endpoint {
            let valid = endpoint
                .parse::<http::Uri>()
                .ok()
                .is_some_and(|uri| matches!(uri.scheme_str(), Some("http" | "https")) && uri.authority().is_some());
            if !valid {
                return Err(invalid!(
                    "tracing.otlp_endpoint = \"{endpoint}\": expected the collector's OTLP/gRPC URL, like \
                     http://collector:4317"
                ));
            }
        }
        if !(0.0..=1.0).contains(&self.sampling_ratio) {
            return Err(invalid!("tracing.sampling_ratio = {}: must be between 0 and 1", self.sampling_ratio));
        }
        if self.service_name.is_empty() {
            return Err(invalid!("tracing.service_name is empty"));
        }
        check_between("tracing.max_queued_spans", self.max_queued_spans, 1, MAX_COUNT)?;
        check_between("tracing.max_export_batch", self.max_export_batch, 1, self.max_queued_spans)?;
        for (key, value) in [
            ("tracing.export_interval_ms", self.export_interval_ms),
            ("tracing.export_timeout_ms", self.export_timeout_ms),
        ] {
            check_between(key, usize::try_from(value).unwrap_or(usize::MAX), 1, 3_600_000)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_are_named() {
        let on = TracingConfig { otlp_endpoint: Some("http://127.0.0.1:4317".into()), ..TracingConfig::default() };
        on.check().unwrap();
        TracingConfig::default().check().unwrap();
        let cases = [
            (TracingConfig { otlp_endpoint: Some("127.0.0.1:4317".into()), ..on.clone() }, "otlp_endpoint"),
            (TracingConfig { sampling_ratio: -0.1, ..on.clone() }, "sampling_ratio = -0.1"),
            (TracingConfig { max_export_batch: 0, ..on.clone() }, "max_export_batch = 0"),
            (TracingConfig { export_timeout_ms: 0, ..on.clone() }, "export_timeout_ms = 0"),
        ];
        for (config, expected) in cases {
            let err = config.check().unwrap_err();
            assert!(err.0.contains(expected), "{err} lacks {expected}");
        }
    }
}
