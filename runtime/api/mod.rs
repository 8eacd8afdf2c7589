//! The client-facing APIs: [`grpc`] (TF Serving's gRPC services) and
//! [`http`] (metrics), and the [`metrics`] registry they export.

pub mod grpc;
pub mod http;
pub mod metrics;
