//! The gRPC API: TF Serving's `PredictionService` and `ModelService` at TF
//! Serving's paths, so existing TF Serving clients work unchanged, and the
//! Open Inference Protocol's `GRPCInferenceService` ([`inference`]) on the
//! same port for KServe v2 / Triton clients.
//!
//! Each call gets a [`RequestContext`] (the client's `x-request-id` or a new
//! one, its `grpc-timeout` as the deadline, a tracing span), runs through
//! [`serve`], and returns the id in the response metadata — on errors too.
//! Errors become `tonic::Status` through the runtime's one error mapping.

mod inference;
mod model_service;
mod prediction;

use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Request, Response, Status};
use tracing::Instrument;

pub use self::inference::InferenceApi;
pub use self::model_service::ModelStatusApi;
pub use self::prediction::{served_spec, signature_def, PredictionApi};
use super::context::{RequestContext, ServingState, REQUEST_ID};
use crate::error::{Error, Result};
use crate::models::VersionChoice;
use crate::pipeline::deadline::Deadline;
use crate::pipeline::Target;
use crate::proto::tensorflow::serving::{model_spec, ModelSpec};

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
    spec.ok_or_else(|| Error::invalid_argument("model_spec is missing; set model_spec.name"))
}

/// Resolves what the request's model spec names (a pipeline, a version, a
/// signature), recording it in `cx` for the call's metrics.
fn resolve(cx: &mut RequestContext, state: &ServingState, spec: Option<&ModelSpec>) -> Result<Target> {
    let spec = required_spec(spec)?;
    cx.resolve(&state.endpoints, version_choice(spec), &spec.signature_name)
}

/// The context of a gRPC call asking for the model `spec` names: its id
/// from `x-request-id`, its deadline from `grpc-timeout`.
fn context<T>(
    state: &ServingState,
    api: &'static str,
    request: &Request<T>,
    spec: Option<&ModelSpec>,
) -> RequestContext {
    context_named(state, api, request, spec.map_or("", |s| s.name.as_str()))
}

/// The context of a gRPC call asking for the model called `name`.
fn context_named<T>(state: &ServingState, api: &'static str, request: &Request<T>, name: &str) -> RequestContext {
    let metadata = request.metadata();
    let deadline = Deadline::from_grpc_timeout(metadata.get("grpc-timeout").and_then(|v| v.to_str().ok()));
    let id = metadata.get(REQUEST_ID).and_then(|v| v.to_str().ok());
    RequestContext::new(&state.metrics, api, "grpc", id, name, deadline)
}

/// Runs one call: `work` in the request's span (refused while the server
/// is not ready), the outcome counted, and the id returned in the response
/// or status metadata.
async fn serve<T>(
    state: &ServingState,
    mut cx: RequestContext,
    work: impl AsyncFnOnce(&mut RequestContext) -> Result<T>,
) -> Result<Response<T>, Status> {
    let span = cx.span.clone();
    let result = async {
        state.phase.check_ready()?;
        work(&mut cx).await
    }
    .instrument(span);
    // A bug that panics answers this call INTERNAL instead of resetting
    // the stream.
    let result = AssertUnwindSafe(result)
        .catch_unwind()
        .await
        .unwrap_or_else(|_| Err(Error::internal("the server hit a bug answering this call (it panicked)")));
    let id = MetadataValue::try_from(cx.id.as_str()).ok();
    cx.finish(&result);
    let with_id = |metadata: &mut MetadataMap| {
        if let Some(id) = id {
            metadata.insert(REQUEST_ID, id);
        }
    };
    match result {
        Ok(message) => {
            let mut response = Response::new(message);
            with_id(response.metadata_mut());
            Ok(response)
        }
        Err(error) => {
            let mut status: Status = error.into();
            with_id(status.metadata_mut());
            Err(status)
        }
    }
}
