//! The client-facing APIs, thin codecs over the pipeline: [`grpc`] (TF
//! Serving's gRPC services and KServe v2's), [`rest`] (TF Serving's REST
//! API, KServe v2's, the plugin admin API, metrics), [`health`] (readiness,
//! gRPC health, drain) over the server's [`phase`], model config reloads
//! ([`reload`]), the admin API's tokens ([`admin_access`]), the rule that
//! refuses calls which waited too long to be read ([`read_delay`]), what every call
//! shares ([`context`]), what both KServe v2 codecs share ([`v2`]) and what
//! both TF Serving codecs share for Classify and Regress ([`examples`]).
//!
//! A codec decodes a request, builds one `pipeline::ValidRequest` from it
//! through the target's `RequestBuilder`, and encodes the answer; every
//! check and every error is the pipeline's, so both protocols give the
//! same answers.

pub mod admin_access;
pub mod context;
pub mod examples;
pub mod grpc;
pub mod health;
pub mod phase;
pub mod read_delay;
pub mod reload;
pub mod rest;
pub mod v2;
