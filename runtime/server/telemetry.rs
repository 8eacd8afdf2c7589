//! The trace exporter: the `tracing` layer that turns request traces
//! (`pipeline::trace`) into OpenTelemetry spans and exports them over
//! OTLP/gRPC to a collector, in batches, off the request path.
//!
//! The layer sees only the trace spans (target `sluice::trace`), never the
//! log's spans and events. Spans wait in a bounded queue for the exporter's
//! thread; a full queue drops spans, and a collector that is down costs
//! the export thread its timeout, never a request its time.

use std::fmt;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider, SpanData, SpanExporter,
};
use opentelemetry_sdk::Resource;
use tracing::Subscriber;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use crate::config::TracingConfig;
use crate::error::{Error, Result};
use crate::pipeline::trace::TARGET;

/// The exporter, kept for the life of the process: dropping it flushes
/// the spans still queued and stops the export thread.
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("sluice: flushing traces at exit failed: {e}");
        }
    }
}

/// The layer exporting request traces as `config` says, and the handle
/// that keeps its exporter running. Call it inside the async runtime: the
/// gRPC channel to the collector lives on it.
pub fn layer<S>(config: &TracingConfig) -> Result<Option<(impl Layer<S> + use<S>, Telemetry)>>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let Some(endpoint) = &config.otlp_endpoint else { return Ok(None) };
    let runtime = tokio::runtime::Handle::try_current()
        .map_err(|e| Error::internal(format!("traces need the async runtime to export on: {e}")))?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint.clone())
        .with_timeout(Duration::from_millis(config.export_timeout_ms))
        .with_channel(
            tonic::transport::Channel::from_shared(endpoint.clone())
                .map_err(|e| Error::invalid_argument(format!("tracing.otlp_endpoint = \"{endpoint}\": {e}")))?
                .connect_timeout(Duration::from_millis(config.export_timeout_ms))
                .connect_lazy(),
        )
        .build()
        .map_err(|e| Error::invalid_argument(format!("tracing.otlp_endpoint = \"{endpoint}\": {e}")))?;
    let batches = BatchConfigBuilder::default()
        .with_max_queue_size(config.max_queued_spans)
        .with_max_export_batch_size(config.max_export_batch)
        .with_scheduled_delay(Duration::from_millis(config.export_interval_ms))
        .build();
    let processor =
        BatchSpanProcessor::builder(OnRuntime { inner: exporter, runtime }).with_batch_config(batches).build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        // Which requests are traced is decided when they arrive
        // (`pipeline::trace`); every span that reaches here is kept.
        .with_sampler(Sampler::AlwaysOn)
        .with_resource(Resource::builder().with_service_name(config.service_name.clone()).build())
        .build();
    let tracer = provider.tracer("sluice");
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_level(false)
        .with_target(false)
        .with_tracked_inactivity(false)
        .with_filter(Targets::new().with_target(TARGET, tracing::Level::TRACE));
    tracing::info!(%endpoint, sampling_ratio = config.sampling_ratio, "exporting request traces");
    Ok(Some((layer, Telemetry { provider })))
}

/// The OTLP exporter, run on sluice's async runtime: the batch processor
/// exports from a thread of its own, where tonic's channel would find no
/// reactor to run on.
struct OnRuntime {
    inner: opentelemetry_otlp::SpanExporter,
    runtime: tokio::runtime::Handle,
}

impl fmt::Debug for OnRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OnRuntime").field("inner", &self.inner).finish_non_exhaustive()
    }
}

impl SpanExporter for OnRuntime {
    fn export(&self, batch: Vec<SpanData>) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        // Called on the batch processor's own thread, never a runtime's.
        let result = self.runtime.block_on(self.inner.export(batch));
        std::future::ready(result)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}
