//! The client-facing APIs: [`grpc`] (TF Serving's gRPC services), [`rest`]
//! (TF Serving's REST API, health, metrics), what they share
//! ([`predict`]), and the [`metrics`] registry they export.

pub mod grpc;
pub mod health;
pub mod metrics;
pub mod predict;
pub mod rest;
