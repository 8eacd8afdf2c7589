//! The client-facing APIs: [`grpc`] (TF Serving's gRPC services).

pub mod grpc;
