//! The gRPC API: TF Serving's `PredictionService` and `ModelService` at TF
//! Serving's paths, so existing TF Serving clients work unchanged.
//!
//! Each call gets a request id (the client's `x-request-id`, or a new one),
//! runs in a tracing span carrying it, and returns it in the response
//! metadata — on errors too. Errors become `tonic::Status` through the
//! runtime's one error mapping.

mod model_service;
mod prediction;

use std::future::Future;
use std::sync::Arc;

use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Response, Status};
use tracing::Instrument;

pub use self::model_service::ModelStatusApi;
pub use self::prediction::{served_spec, signature_def, PredictionApi};
use super::health::PhaseCell;
use super::metrics::Metrics;
use super::predict::{request_id, RequestMeter, Target, REQUEST_ID};
use crate::error::Result;
use crate::models::VersionChoice;
use crate::pipeline::deadline::Deadline;
use crate::pipeline::Endpoints;
use crate::proto::tensorflow::serving::{model_spec, ModelSpec};
use crate::tensor::proto::OutputEncoding;

/// What the gRPC services share.
#[derive(Clone)]
pub struct ServingState {
    /// Every name clients can call.
    pub endpoints: Arc<Endpoints>,
    /// How numeric outputs are written.
    pub output_encoding: OutputEncoding,
    /// Request counts and latencies.
    pub metrics: Arc<Metrics>,
    /// Ready or draining: calls that arrive on an open connection while
    /// the server drains are refused.
    pub phase: Arc<PhaseCell>,
}

/// The deadline a client set with `grpc-timeout`.
pub fn deadline_of(metadata: &MetadataMap) -> Deadline {
    Deadline::from_grpc_timeout(metadata.get("grpc-timeout").and_then(|v| v.to_str().ok()))
}

/// The version choice a model spec makes.
pub fn version_choice(spec: &ModelSpec) -> VersionChoice<'_> {
    match &spec.version_choice {
        None => VersionChoice::Latest,
        Some(model_spec::VersionChoice::Version(v)) => VersionChoice::Number(*v),
        Some(model_spec::VersionChoice::VersionLabel(label)) => VersionChoice::Label(label),
    }
}

/// The request's model spec, which every call needs.
pub fn required_spec(spec: Option<&ModelSpec>) -> Result<&ModelSpec> {
    spec.ok_or_else(|| crate::error::Error::invalid_argument("model_spec is missing; set model_spec.name"))
}

/// The name a request asks for, for its log span and metrics (empty when
/// the spec is missing).
pub fn spec_name(spec: Option<&ModelSpec>) -> String {
    spec.map(|s| s.name.clone()).unwrap_or_default()
}

/// What a model spec names.
pub fn resolve(endpoints: &Endpoints, spec: Option<&ModelSpec>) -> Result<Target> {
    let spec = required_spec(spec)?;
    Target::resolve(endpoints, &spec.name, version_choice(spec), &spec.signature_name)
}

/// Runs one call: a request id and span around `work`, the outcome
/// counted, and the id returned in the response or status metadata.
pub async fn handle<T>(
    state: &ServingState,
    api: &'static str,
    metadata: &MetadataMap,
    name: &str,
    work: impl Future<Output = (Option<Target>, Result<T>)>,
) -> Result<Response<T>, Status> {
    let id = request_id(metadata.get(REQUEST_ID).and_then(|v| v.to_str().ok()));
    let meter = RequestMeter::start(&state.metrics, api, "grpc");
    let span = tracing::info_span!("request", id = %id, model = name);
    let (target, result) = match state.phase.check_ready() {
        Ok(()) => work.instrument(span.clone()).await,
        Err(e) => (None, Err(e)),
    };
    span.in_scope(|| meter.finish(name, target.as_ref(), &result));
    let id_value = MetadataValue::try_from(id.as_str()).ok();
    match result {
        Ok(message) => {
            let mut response = Response::new(message);
            if let Some(id) = id_value {
                response.metadata_mut().insert(REQUEST_ID, id);
            }
            Ok(response)
        }
        Err(error) => {
            let mut status: Status = error.into();
            if let Some(id) = id_value {
                status.metadata_mut().insert(REQUEST_ID, id);
            }
            Err(status)
        }
    }
}
