//! An OpenTelemetry collector in the test's process: an OTLP/gRPC trace
//! service on a free port that counts the spans it is sent and, when asked
//! to, keeps them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::trace::v1::Span;

/// The spans sent to it: counted always, kept when it was started to keep
/// them (a bench's hundreds of thousands are only counted).
#[derive(Clone)]
pub struct Collector {
    count: Arc<AtomicU64>,
    kept: Option<Arc<Mutex<Vec<Span>>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans = request.into_inner().resource_spans.into_iter().flat_map(|r| r.scope_spans).flat_map(|s| s.spans);
        match &self.kept {
            Some(kept) => {
                let mut kept = kept.lock().expect("spans");
                let before = kept.len();
                kept.extend(spans);
                self.count.fetch_add((kept.len() - before) as u64, Ordering::Relaxed);
            }
            None => {
                self.count.fetch_add(spans.count() as u64, Ordering::Relaxed);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

impl Collector {
    /// Serves on a free loopback port from the current tokio runtime;
    /// returns it and its `http://ADDR` endpoint. `keep`: keep the spans.
    pub async fn start(keep: bool) -> (Collector, String) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let collector = Collector { count: Arc::default(), kept: keep.then(Arc::default) };
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(collector.clone()))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        (collector, format!("http://{addr}"))
    }

    /// How many spans it was sent.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The spans kept so far.
    pub fn spans(&self) -> Vec<Span> {
        self.kept.as_ref().map_or_else(Vec::new, |kept| kept.lock().expect("spans").clone())
    }

    /// The kept spans of trace `trace_id`.
    pub fn of_trace(&self, trace_id: &[u8]) -> Vec<Span> {
        let Some(kept) = &self.kept else { return Vec::new() };
        kept.lock().expect("spans").iter().filter(|s| s.trace_id == trace_id).cloned().collect()
    }
}
