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
pub mod push_back;

use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Request, Response, Status};
use tracing::Instrument;

pub use self::inference::InferenceApi;
pub use self::model_service::ModelStatusApi;
pub use self::prediction::{served_spec, PredictionApi};
use super::context::{RequestContext, ServingState, REQUEST_ID};
use crate::error::{Error, Result};
use crate::models::VersionChoice;
use crate::pipeline::deadline::Deadline;
use crate::pipeline::priority::PRIORITY_HEADER;
use crate::pipeline::trace::MetadataCarrier;
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
    let carrier = MetadataCarrier(metadata);
    RequestContext::new(&state.metrics, api, "grpc", id, name, deadline, &state.tracing, &carrier)
        .with_priority_header(metadata.get(PRIORITY_HEADER).map(|v| v.as_bytes()))
}

/// Runs one call: `work` in the request's span (refused while the server
/// is not ready), the outcome counted, and the id returned in the response
/// or status metadata.
async fn serve<T>(
    state: &ServingState,
    mut cx: RequestContext,
    work: impl AsyncFnOnce(&mut RequestContext) -> Result<T>,
) -> Result<Response<T>, Status> {
    let (span, trace) = (cx.span.clone(), cx.trace.clone());
    let result = async {
        state.phase.check_serving()?;
        work(&mut cx).await
    }
    .instrument(trace)
    .instrument(span);
    // A bug that panics answers this call INTERNAL instead of resetting
    // the stream.
    let result = AssertUnwindSafe(result)
        .catch_unwind()
        .await
        .unwrap_or_else(|_| Err(Error::internal("the server hit a bug answering this call (it panicked)")));
    let id = MetadataValue::try_from(cx.id.as_str()).ok();
    // Only a failure names the id in its message.
    let failed_id = result.as_ref().err().map(|_| cx.id.clone());
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
            let mut status = Status::new(error.code().grpc(), error.message_for(failed_id.as_deref().unwrap_or("")));
            with_id(status.metadata_mut());
            Err(status)
        }
    }
}

/// A refusal by tonic's codec, as TF Serving's clients expect it: tonic
/// answers a request over `max_decoding_message_size` with OUT_OF_RANGE,
/// gRPC C++ (and so TF Serving) with RESOURCE_EXHAUSTED, which is what
/// retry policies and client code test for. The refusal is a trailers-only
/// response, so its status is in the headers; nothing else is touched.
pub async fn tf_serving_status(mut response: axum::response::Response) -> axum::response::Response {
    let headers = response.headers_mut();
    let out_of_range = headers.get("grpc-status").is_some_and(|v| v.as_bytes() == b"11");
    let message = headers.get("grpc-message").map(|v| percent_decode(v.as_bytes())).unwrap_or_default();
    if out_of_range && message.contains("message length too large") {
        let message = format!("{message} (server.max_message_bytes); send a smaller request");
        headers.insert("grpc-status", http::HeaderValue::from_static("8"));
        if let Ok(value) = http::HeaderValue::from_str(&percent_encode(&message)) {
            headers.insert("grpc-message", value);
        }
    }
    response
}

/// gRPC's percent-decoding of `grpc-message`.
fn percent_decode(bytes: &[u8]) -> String {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b, ..) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// gRPC's percent-encoding of `grpc-message`: visible ASCII but '%' as is.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| if (0x20..=0x7e).contains(&b) && b != b'%' { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_messages_percent_round_trip() {
        let text = "found 131082 bytes, the limit is: 65536 bytes (100%) é";
        assert_eq!(percent_decode(percent_encode(text).as_bytes()), text);
        assert_eq!(percent_encode("a b%"), "a b%25");
    }
}
