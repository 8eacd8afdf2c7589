//! `[server]`: listening addresses, protocol and size limits, timeouts,
//! which threads serve the gRPC port, and how numeric outputs are encoded.

use std::path::PathBuf;

use serde::Deserialize;

use super::TlsConfig;

/// How numeric outputs are written into a `TensorProto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum OutputEncoding {
    /// Typed fields (`float_val`, `int64_val`, …): what TF Serving sends by
    /// default, and what client code reading `.float_val` expects.
    #[default]
    TypedFields,
    /// Packed `tensor_content`: one copy of the bytes, the fastest.
    TensorContent,
}

/// Which threads serve the gRPC port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum GrpcThreads {
    /// One single-threaded runtime per core, each serving the connections
    /// it is dealt (the least busy core gets the next): a connection's
    /// calls never leave its thread, so no call wakes a second thread.
    #[default]
    PerCore,
    /// Tokio's work-stealing runtime, shared with the HTTP port: any idle
    /// thread may take any call, at the cost of waking threads to steal.
    Shared,
}

/// Listening addresses and protocol limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address to bind; `0.0.0.0` serves every interface, as TF Serving does.
    pub host: String,
    /// gRPC port (TF Serving's `--port`); 0 picks a free one.
    pub port: u16,
    /// HTTP port for metrics (TF Serving's `--rest_api_port`); 0 picks a
    /// free one.
    pub rest_api_port: u16,
    /// Largest gRPC message accepted or sent, in bytes.
    pub max_message_bytes: usize,
    /// Largest tensor a request may make the server build, in bytes:
    /// decoded inputs (a single value broadcast to a large shape), stage
    /// outputs (a built-in sized from the request's rows). Checked before
    /// anything is allocated; a request over it gets RESOURCE_EXHAUSTED.
    pub max_tensor_bytes: usize,
    /// The most values (numbers, strings, arrays, objects) a REST JSON
    /// body may hold: parsed JSON takes far more memory than its text, so
    /// the body size alone does not bound it.
    pub max_json_values: usize,
    /// How numeric outputs are written in Predict responses.
    pub output_encoding: OutputEncoding,
    /// Seconds in-flight requests get to finish after SIGTERM.
    pub drain_timeout_secs: u64,
    /// Seconds between SIGTERM and the ports' closing, during which the
    /// server reports not ready (readiness 503, gRPC health NOT_SERVING)
    /// and still serves every call: the window in which load balancers and
    /// Kubernetes' endpoints still send to a replica being stopped. Ctrl-C
    /// skips it.
    pub drain_delay_secs: u64,
    /// A Unix socket to serve gRPC on too (TF Serving's `--grpc_socket_path`).
    pub grpc_socket_path: Option<PathBuf>,
    /// The deadline of a REST request, in milliseconds (TF Serving's
    /// `--rest_api_timeout_in_ms`); none: no deadline.
    pub rest_api_timeout_ms: Option<u64>,
    /// Another path the Prometheus metrics answer on (TF Serving's
    /// `--monitoring_config_file` `prometheus_config { path }`).
    pub metrics_path: Option<String>,
    /// Connections open at once, per port; more are closed at once.
    pub max_connections: usize,
    /// HTTP/2 streams (calls) open at once on one connection.
    pub max_concurrent_streams: u32,
    /// The largest request head (request line and headers), in bytes;
    /// larger gets 431.
    pub max_header_bytes: usize,
    /// How long a client may take to send a request's headers, in
    /// milliseconds; a slower one (a slow-loris) is cut off.
    pub header_read_timeout_ms: u64,
    /// How long a client may take to send a REST request's body, in
    /// milliseconds; slower gets 408 and the connection closed.
    pub body_read_timeout_ms: u64,
    /// The age, in milliseconds (±10 %, so a fleet's connections do not
    /// all reconnect at once), at which a connection is told to go away
    /// (HTTP/2 GOAWAY; HTTP/1.1 closed after its current request), as
    /// gRPC's `grpc.max_connection_age_ms`: long-lived clients reconnect
    /// and so reach replicas added since. None: connections live on.
    pub max_connection_age_ms: Option<u64>,
    /// How long, in milliseconds, calls in flight on a connection told to
    /// go away for its age get before it is closed (gRPC's
    /// `grpc.max_connection_age_grace_ms`). None: as long as they take.
    pub max_connection_age_grace_ms: Option<u64>,
    /// How many nice steps below the network threads the compute threads
    /// run (inference sessions and their pools, pipelined stage workers):
    /// 0 (the default) runs them alike, 19 only when nothing else wants
    /// the CPU. Above 0, a saturated CPU still answers refusals and health
    /// probes at once, at a cost in peak throughput (`runtime/threads.rs`).
    /// Read at start-up.
    pub compute_nice: usize,
    /// The most a batch may cost, in microseconds, to run on the network
    /// thread that decoded its request instead of being handed to an
    /// inference thread (two thread wake-ups that cost more than a small
    /// model's run). Measured per model and batch size while serving; a
    /// size not yet measured, or dearer, runs on the inference threads.
    /// 0 turns inline runs off.
    pub inline_inference_micros: u64,
    /// Which threads serve the gRPC port: `per_core` (a single-threaded
    /// runtime per core) or `shared` (tokio's work-stealing runtime).
    pub grpc_threads: GrpcThreads,
    /// Refuse a gRPC call to a saturated pipeline on its HTTP/2 stream
    /// (`RST_STREAM(REFUSED_STREAM)`, which clients see as UNAVAILABLE and
    /// may retry elsewhere) before it is decoded (`api::grpc::push_back`).
    /// Off: such calls are read and refused with RESOURCE_EXHAUSTED.
    pub push_back: bool,
    /// TLS on the gRPC, REST and admin ports (not the Unix socket); off
    /// when absent.
    pub tls: Option<TlsConfig>,
    /// A request for a model or pipeline that is not served is told the
    /// names that are (handy in development; off by default, as TF
    /// Serving, since the names may say more than a caller should know).
    pub list_models_in_errors: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "0.0.0.0".to_string(),
            port: 8500,
            rest_api_port: 8501,
            max_message_bytes: 64 << 20,
            max_tensor_bytes: 256 << 20,
            max_json_values: 1 << 22,
            output_encoding: OutputEncoding::TypedFields,
            drain_timeout_secs: 30,
            drain_delay_secs: 5,
            grpc_socket_path: None,
            rest_api_timeout_ms: None,
            metrics_path: None,
            max_connections: 10_000,
            max_concurrent_streams: 1024,
            max_header_bytes: 64 << 10,
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 30_000,
            max_connection_age_ms: None,
            max_connection_age_grace_ms: None,
            compute_nice: 0,
            inline_inference_micros: DEFAULT_INLINE_INFERENCE_MICROS,
            grpc_threads: GrpcThreads::PerCore,
            push_back: true,
            tls: None,
            list_models_in_errors: false,
        }
    }
}

/// What `server.inline_inference_micros` is unless set: below the cost
/// of the two thread wake-ups an inference thread costs (docs/BENCHMARKS.md).
pub const DEFAULT_INLINE_INFERENCE_MICROS: u64 = 50;

/// Above this a run holds a network thread long enough to delay every
/// other connection it serves: that is what inference threads are for.
pub(super) const MAX_INLINE_INFERENCE_MICROS: usize = 1000;
