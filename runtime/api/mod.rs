//! The client-facing APIs, thin codecs over the pipeline: [`grpc`] (TF
//! Serving's gRPC services), [`rest`] (TF Serving's REST API, the plugin
//! admin API, metrics), [`health`] (the server's phase: readiness, gRPC
//! health, drain), and what every call shares ([`context`]).
//!
//! A codec decodes a request, builds one `pipeline::ValidRequest` from it
//! through the target's `RequestBuilder`, and encodes the answer; every
//! check and every error is the pipeline's, so both protocols give the
//! same answers.

pub mod context;
pub mod grpc;
pub mod health;
pub mod rest;
