//! What seeing requests costs (issue 30), side by side in one run: the
//! same build serving the MLP (batch 1, 64 streams over 4 connections,
//! closed loop) plain, with its request log at sampling 0.01 and 1.0, and
//! with traces at 1% and 100% exported to an OTLP collector running in
//! this process. Each server is loaded in turn, `--rounds` times over
//! (`support::interleaved_rounds`); the report gives each side's median
//! requests per second and server CPU per request, and their ratios to the
//! plain server.
//!
//! ```text
//! cargo bench --bench observe [-- --duration 5 --rounds 3]
//! ```

#[allow(dead_code)]
#[path = "../tests/common/process.rs"]
mod process;
mod support;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use support::{arg, interleaved_rounds, pool, print_against_first, sluice, Side};

/// Counts the spans it is sent, as a collector would receive them.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans: usize =
            request.into_inner().resource_spans.iter().flat_map(|r| &r.scope_spans).map(|s| s.spans.len()).sum();
        self.spans.fetch_add(spans as u64, Ordering::Relaxed);
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

fn config(root: &Path, logging: Option<(&Path, f64)>, tracing: Option<(&str, f64)>) -> String {
    let mut text = String::new();
    if let Some((endpoint, ratio)) = tracing {
        text += &format!("[tracing]\notlp_endpoint = \"{endpoint}\"\nsampling_ratio = {ratio}\n\n");
    }
    text += &format!(
        "[[models]]\nname = \"mlp\"\nbase_path = \"{}\"\nonnx = {{ sessions = 2, intra_op_threads = 1 }}\n",
        root.join("examples/models/mlp").display()
    );
    if let Some((prefix, rate)) = logging {
        text += &format!("logging = {{ filename_prefix = \"{}\", sampling_rate = {rate} }}\n", prefix.display());
    }
    text
}

fn main() {
    let duration = Duration::from_secs(arg("--duration").unwrap_or(5));
    let rounds: usize = arg("--rounds").unwrap_or(3);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("temp dir");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let collector = Collector::default();
    let endpoint = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(collector.clone()))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        format!("http://{addr}")
    });
    let variants: Vec<(&str, Option<f64>, Option<f64>)> = vec![
        ("plain", None, None),
        ("request log at 0.01", Some(0.01), None),
        ("request log at 1.0", Some(1.0), None),
        ("traces at 1%", None, Some(0.01)),
        ("traces at 100%", None, Some(1.0)),
    ];
    let mut sides: Vec<Side> = variants
        .into_iter()
        .enumerate()
        .map(|(i, (name, log, trace))| {
            let prefix = dir.path().join(format!("logs{i}/mlp"));
            let text = config(&root, log.map(|rate| (prefix.as_path(), rate)), trace.map(|r| (endpoint.as_str(), r)));
            let path = dir.path().join(format!("observe{i}.toml"));
            std::fs::write(&path, text).expect("write config");
            let server = sluice(&path, &[]);
            let target = server.url();
            Side::new(name, server, target, None)
        })
        .collect();
    let requests = pool(&runtime, &sides[0].target, "mlp");
    interleaved_rounds(&runtime, &mut sides, &requests, rounds, duration);
    print_against_first(&sides, "plain");
    println!("spans received by the collector: {}", collector.spans.load(Ordering::Relaxed));
    for (i, side) in sides.iter().enumerate() {
        let bytes: u64 = std::fs::read_dir(dir.path().join(format!("logs{i}")))
            .map(|files| files.filter_map(|f| f.ok()?.metadata().ok()).map(|m| m.len()).sum())
            .unwrap_or(0);
        if bytes > 0 {
            println!("{}: {:.1} MiB of request log written", side.name, bytes as f64 / (1 << 20) as f64);
        }
    }
}
