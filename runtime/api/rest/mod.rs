//! The HTTP port (TF Serving's `--rest_api_port`): TF Serving's REST API,
//! the Open Inference Protocol's (KServe v2, [`v2`]), health and
//! readiness, and Prometheus metrics.
//!
//! REST requests go through the same resolution, checks and pipelines as
//! gRPC ones (`api::context`, `pipeline::request`); only the tensor
//! encoding differs — JSON in
//! TF Serving's row (`instances`) or columnar (`inputs`) form, with
//! `{"b64": …}` for bytes. Errors are `{"error": "…"}` with the HTTP status
//! the runtime's one error table gives the code.
//!
//! This port serves from the moment the process starts, so that liveness
//! and metrics answer while models load; predictions are refused with 503
//! until the server is ready, and again once it drains.

pub mod admin;
mod examples_json;
mod json;
mod v2;

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::Router;
use futures::FutureExt;
use std::panic::AssertUnwindSafe;
use tracing::Instrument;

use super::context::{request_id, RequestContext, REQUEST_ID};
use super::examples::Task;
use super::health::{Lifecycle, Phase};
use super::read_delay::{self, RunQueue};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::models::VersionChoice;
use crate::pipeline::deadline::Deadline;
use crate::pipeline::priority::{Priority, PRIORITY_HEADER};
use crate::pipeline::trace::{HeaderCarrier, TraceSampler};
use crate::pipeline::Pipeline;

/// The OpenMetrics text format prometheus-client writes.
const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the HTTP port's handlers share.
#[derive(Clone)]
pub struct RestState {
    /// The phase, and what serves once loaded.
    pub lifecycle: Arc<Lifecycle>,
    /// Every metric, for scrapes and request counts.
    pub metrics: Arc<Metrics>,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// The most values a JSON body may hold (`server.max_json_values`).
    pub max_json_values: usize,
    /// The plugin admin API, when it is on.
    pub admin: Option<Arc<crate::api::admin_access::Admin>>,
    /// The deadline of each REST request (`--rest_api_timeout_in_ms`).
    pub request_timeout: Option<std::time::Duration>,
    /// Another path the metrics answer on (`--monitoring_config_file`).
    pub metrics_path: Option<String>,
    /// How long a request body may take to arrive.
    pub body_read_timeout: std::time::Duration,
    /// Which requests are traced.
    pub tracing: TraceSampler,
    /// How long the tasks of the runtime serving REST wait to run.
    pub run_queue: Arc<RunQueue>,
}

/// The routes of the HTTP port.
pub fn router(state: RestState) -> Router {
    let mut admin = if state.admin.is_some() { admin::routes() } else { Router::new() };
    if let Some(path) = &state.metrics_path {
        admin = admin.route(path, get(scrape));
    }
    admin
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readiness))
        .route("/metrics", get(scrape))
        .route("/monitoring/prometheus/metrics", get(scrape))
        .route("/v1/models/{*path}", any(models))
        // Anything else under /v1 is TF Serving's 400 "Malformed request".
        .route("/v1", any(malformed))
        .route("/v1/{*path}", any(malformed))
        .route("/v2", any(v2_root))
        .route("/v2/{*path}", any(v2_call))
        .fallback(|method: Method, uri: axum::http::Uri| async move {
            error_response(&Error::not_found(format!(
                "no such endpoint: {method} {}; the API is /v1/models/NAME[/versions/N|/labels/L][:predict|/metadata]",
                uri.path()
            )))
        })
        .with_state(state)
}

/// What TF Serving answers for a path under `/v1` that is not an API.
async fn malformed(method: Method, uri: axum::http::Uri) -> Response {
    error_response(&Error::invalid_argument(format!(
        "Malformed request: {method} {}; the API is /v1/models/NAME[/versions/N|/labels/L][:predict|/metadata]",
        uri.path()
    )))
}

/// The admin API alone, for its own port.
pub fn admin_router(state: RestState) -> Router {
    admin::routes()
        .fallback(|uri: axum::http::Uri| async move {
            error_response(&Error::not_found(format!("no such endpoint: {}; this port serves /admin/v1/", uri.path())))
        })
        .with_state(state)
}

async fn scrape(State(state): State<RestState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], state.metrics.encode())
}

async fn readiness(State(state): State<RestState>) -> Response {
    match state.lifecycle.phase() {
        Phase::Ready => (StatusCode::OK, "ready\n").into_response(),
        Phase::Loading => (StatusCode::SERVICE_UNAVAILABLE, "loading models and pipelines\n").into_response(),
        Phase::Leaving | Phase::Draining => (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response(),
    }
}

/// What a `/v1/models/…` path asks for.
#[derive(Debug, PartialEq, Eq)]
enum Call<'a> {
    Predict,
    /// `:classify` and `:regress`: `tf.Example`s in TF Serving's JSON form.
    Task(Task),
    Metadata,
    Status,
    /// A verb TF Serving does not have.
    Other(&'a str),
}

/// A parsed `/v1/models/…` path: the name, the version choice, the call.
#[derive(Debug, PartialEq, Eq)]
struct ModelPath<'a> {
    name: std::borrow::Cow<'a, str>,
    version: Version<'a>,
    call: Call<'a>,
}

/// The version part of a path, its label percent-decoded.
#[derive(Debug, PartialEq, Eq)]
enum Version<'a> {
    Latest,
    Number(i64),
    Label(std::borrow::Cow<'a, str>),
}

impl ModelPath<'_> {
    /// The version the path chooses.
    fn choice(&self) -> VersionChoice<'_> {
        match &self.version {
            Version::Latest => VersionChoice::Latest,
            Version::Number(n) => VersionChoice::Number(*n),
            Version::Label(label) => VersionChoice::Label(label),
        }
    }
}

/// A name or label from the path, percent-decoded: as TF Serving, the path
/// is split on its raw `/` and `:`, so an encoded one (`%2F`) belongs to
/// the name, which is then simply not served (404), not a malformed path.
fn decoded(segment: &str) -> Result<std::borrow::Cow<'_, str>> {
    percent_encoding::percent_decode_str(segment).decode_utf8().map_err(|_| {
        Error::invalid_argument(format!("Malformed request: '{segment}' in the path is not UTF-8 once decoded"))
    })
}

/// Parses `NAME[/versions/N|/labels/L][:verb|/metadata]`, as sent (not
/// percent-decoded).
fn parse_path(path: &str) -> Result<ModelPath<'_>> {
    let (rest, call) = match path.rsplit_once(':') {
        Some((rest, "predict")) => (rest, Call::Predict),
        Some((rest, "classify")) => (rest, Call::Task(Task::Classify)),
        Some((rest, "regress")) => (rest, Call::Task(Task::Regress)),
        Some((rest, verb)) if !verb.contains('/') => (rest, Call::Other(verb)),
        _ => match path.strip_suffix("/metadata") {
            Some(rest) => (rest, Call::Metadata),
            None => (path, Call::Status),
        },
    };
    let segments: Vec<&str> = rest.split('/').collect();
    let version = match segments.as_slice() {
        ["", ..] => {
            return Err(Error::invalid_argument(format!(
                "Malformed request: /v1/models/{path}; the model name is empty"
            )))
        }
        [_] => Version::Latest,
        [_, "versions", n] => Version::Number(n.parse().map_err(|_| {
            Error::invalid_argument(format!("the version in the URL is '{n}'; versions are whole numbers"))
        })?),
        [_, "labels", label] if !label.is_empty() => Version::Label(decoded(label)?),
        // TF Serving answers a path it cannot parse 400 "Malformed request".
        _ => {
            return Err(Error::invalid_argument(format!(
            "Malformed request: /v1/models/{path}; expected /v1/models/NAME[/versions/N|/labels/L][:predict|/metadata]"
        )))
        }
    };
    Ok(ModelPath { name: decoded(segments[0])?, version, call })
}

async fn models(
    State(state): State<RestState>,
    uri: axum::http::Uri,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let given_id = headers.get(REQUEST_ID).and_then(|v| v.to_str().ok());
    // The path as sent: names and labels are decoded one by one.
    let path = uri.path().strip_prefix("/v1/models/").unwrap_or_default();
    with_request_id(route(&state, Sent { path, method: &method, headers: &headers, given_id }, body).await)
}

/// The answer with its request's id in the `x-request-id` header.
fn with_request_id((id, mut response): (String, Response)) -> Response {
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    response
}

async fn v2_root(State(state): State<RestState>, method: Method, headers: HeaderMap, body: Body) -> Response {
    v2_answer(&state, "", method, headers, body).await
}

async fn v2_call(
    State(state): State<RestState>,
    Path(path): Path<String>,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Response {
    v2_answer(&state, &format!("/{path}"), method, headers, body).await
}

/// A `/v2/…` call, answered with the request id.
async fn v2_answer(state: &RestState, path: &str, method: Method, headers: HeaderMap, body: Body) -> Response {
    let given_id = headers.get(REQUEST_ID).and_then(|v| v.to_str().ok());
    with_request_id(v2::route(state, Sent { path, method: &method, headers: &headers, given_id }, body).await)
}

/// What a REST call was sent besides its body: the path below its API's
/// prefix, the method, the headers and the request id the client gave.
#[derive(Clone, Copy)]
struct Sent<'a> {
    path: &'a str,
    method: &'a Method,
    headers: &'a HeaderMap,
    given_id: Option<&'a str>,
}

/// Answers one `/v1/models/…` call; returns the request's id with it.
async fn route(state: &RestState, sent: Sent<'_>, body: Body) -> (String, Response) {
    let Sent { path, method, headers, given_id } = sent;
    let parsed = match parse_path(path) {
        Ok(parsed) => parsed,
        Err(e) => return (request_id(given_id), error_response(&e)),
    };
    let (api, wanted) = match parsed.call {
        Call::Predict => ("predict", Method::POST),
        Call::Task(Task::Classify) => ("classify", Method::POST),
        Call::Task(Task::Regress) => ("regress", Method::POST),
        Call::Metadata => ("get_model_metadata", Method::GET),
        Call::Status => ("get_model_status", Method::GET),
        Call::Other(verb) => {
            let error = Error::unimplemented(format!(
                "':{verb}' is not served; sluice serves ':predict', ':classify', ':regress' (POST), '/metadata' (GET) \
                 and status (GET)"
            ));
            return (request_id(given_id), error_response(&error));
        }
    };
    if method != wanted {
        // TF Serving answers 400 "Malformed request" here too.
        let error = Error::invalid_argument(format!("Malformed request: {method} /v1/models/{path}; use {wanted}"));
        return (request_id(given_id), error_response(&error));
    }
    let deadline = state.request_timeout.map_or(Deadline::NONE, Deadline::after);
    let carrier = HeaderCarrier(headers);
    let cx =
        RequestContext::new(&state.metrics, api, "rest", given_id, &parsed.name, deadline, &state.tracing, &carrier)
            .with_priority_header(headers.get(PRIORITY_HEADER).map(|v| v.as_bytes()));
    run_call(cx, async |cx| {
        let serving = state.lifecycle.serving()?;
        let endpoints = &serving.endpoints;
        let body = match parsed.call {
            Call::Predict => {
                // The URL names the pipeline: a full one refuses before
                // the body (up to server.max_message_bytes) is read.
                let priority = cx.priority()?;
                refuse_unread(state, &cx.resolve(endpoints, parsed.choice(), "")?.pipeline, priority)?;
                let bytes =
                    read_body(body, headers, state.max_body_bytes, "server.max_message_bytes", state.body_read_timeout)
                        .await?;
                json::predict(cx, endpoints, &parsed, &bytes, state.max_json_values).await
            }
            Call::Task(task) => {
                let priority = cx.priority()?;
                refuse_unread(state, &cx.resolve(endpoints, parsed.choice(), "")?.pipeline, priority)?;
                let bytes =
                    read_body(body, headers, state.max_body_bytes, "server.max_message_bytes", state.body_read_timeout)
                        .await?;
                examples_json::answer(cx, endpoints, parsed.choice(), task, &bytes, state.max_json_values).await
            }
            Call::Metadata => json::metadata_json(&cx.resolve(endpoints, parsed.choice(), "")?),
            _ => json::status_json(endpoints, &parsed.name, parsed.choice()),
        }?;
        Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
    })
    .await
}

/// Refuses a call before its body is read: while the tasks of the runtime
/// serving REST stand in a queue (`api::read_delay`), any call but a
/// high-priority one, counted as a late read of its pipeline (HTTP/1.1
/// reads a call inside its connection's task, so the wait before it is
/// the runtime's); then a call its pipeline could not admit now.
pub(super) fn refuse_unread(state: &RestState, pipeline: &Pipeline, priority: Priority) -> Result<()> {
    if let Some(waited) = state.run_queue.standing().filter(|_| priority != Priority::High) {
        pipeline.refuse_late();
        return Err(Error::resource_exhausted(read_delay::overloaded(waited)));
    }
    pipeline.refuse_if_full(priority)
}

/// Runs one call's `work` in its span, answers a bug that panics with
/// INTERNAL instead of a dropped connection, counts the outcome, and
/// returns the request's id with the answer (an error as `{"error": …}`).
pub(crate) async fn run_call(
    mut cx: RequestContext,
    work: impl AsyncFnOnce(&mut RequestContext) -> Result<Response>,
) -> (String, Response) {
    let (span, trace) = (cx.span.clone(), cx.trace.clone());
    let result = AssertUnwindSafe(work(&mut cx).instrument(trace).instrument(span))
        .catch_unwind()
        .await
        .unwrap_or_else(|_| Err(Error::internal("the server hit a bug answering this request (it panicked)")));
    let id = cx.id.clone();
    cx.finish(&result);
    let answer = result.unwrap_or_else(|e| message_response(&e, e.message_for(&id)));
    (id, answer)
}

/// How much of an oversized body is read and thrown away before the 413,
/// so that a client still sending it reads the answer instead of a reset
/// connection. Beyond this the connection is simply closed.
const DRAIN_LIMIT: u64 = 64 << 20;

/// The body, refused early when its declared length is over the limit,
/// cut off when it grows past it, and given up on (408) when it takes
/// longer than `server.body_read_timeout_ms` to arrive.
pub(crate) async fn read_body(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
    key: &str,
    timeout: std::time::Duration,
) -> Result<Bytes> {
    tokio::time::timeout(timeout, read_body_now(body, headers, limit, key)).await.unwrap_or_else(|_| {
        Err(Error::TooSlow(format!(
            "the request body did not arrive within {} ms (server.body_read_timeout_ms)",
            timeout.as_millis()
        )))
    })
}

async fn read_body_now(body: Body, headers: &HeaderMap, limit: usize, key: &str) -> Result<Bytes> {
    let too_large = |size: Option<u64>| {
        let size = size.map_or_else(|| format!("more than {limit}"), |s| s.to_string());
        Error::TooLarge(format!("the request body is {size} bytes; the limit is {limit} bytes ({key})"))
    };
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if let Some(length) = declared.filter(|&l| l > limit as u64) {
        if length <= DRAIN_LIMIT {
            let mut body = body.into_data_stream();
            while let Some(Ok(_)) = futures::StreamExt::next(&mut body).await {}
        }
        return Err(too_large(Some(length)));
    }
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let e = e.into_inner();
        if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
            too_large(None)
        } else {
            Error::invalid_argument(format!("the request body could not be read: {e}"))
        }
    })
}

/// `{"error": message}` with the code's HTTP status.
pub(crate) fn error_response(error: &Error) -> Response {
    message_response(error, error.message())
}

/// `{"error": message}` with `error`'s HTTP status.
fn message_response(error: &Error, message: String) -> Response {
    let body = serde_json::to_vec(&serde_json::json!({ "error": message })).unwrap_or_default();
    (error.code().http(), [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;

    #[test]
    fn paths_parse_as_tf_serving_writes_them() {
        fn parts(p: &str) -> (String, Version<'_>, Call<'_>) {
            let p = parse_path(p).unwrap();
            (p.name.to_string(), p.version, p.call)
        }
        assert_eq!(parts("mlp:predict"), ("mlp".into(), Version::Latest, Call::Predict));
        assert_eq!(parts("mlp/versions/2:predict"), ("mlp".into(), Version::Number(2), Call::Predict));
        assert_eq!(
            parts("mlp/labels/stable/metadata"),
            ("mlp".into(), Version::Label("stable".into()), Call::Metadata)
        );
        assert_eq!(parts("mlp/versions/3"), ("mlp".into(), Version::Number(3), Call::Status));
        assert_eq!(parse_path("mlp:classify").unwrap().call, Call::Task(Task::Classify));
        assert_eq!(parse_path("mlp/versions/2:regress").unwrap().call, Call::Task(Task::Regress));
        assert_eq!(parse_path("mlp:explain").unwrap().call, Call::Other("explain"));
        let err = parse_path("mlp/versions/x:predict").unwrap_err();
        assert!(err.message().contains("'x'"), "{err}");
        // Split as sent, then decoded: an encoded '/' or ':' is part of the
        // name (TF Serving then answers 404, the model is not served).
        assert_eq!(parts("a%2Fb:predict"), ("a/b".into(), Version::Latest, Call::Predict));
        assert_eq!(parts("a%3Ab/metadata"), ("a:b".into(), Version::Latest, Call::Metadata));
        assert_eq!(parts("mlp/labels/x%2Fy:predict"), ("mlp".into(), Version::Label("x/y".into()), Call::Predict));
        assert_eq!(parts("a!$&'()*+,;=@[]b"), ("a!$&'()*+,;=@[]b".into(), Version::Latest, Call::Status));
        assert_eq!(parse_path(":predict").unwrap_err().code(), Code::InvalidArgument);
        assert_eq!(parse_path("%FF:predict").unwrap_err().code(), Code::InvalidArgument);
        assert_eq!(parse_path("mlp/versions").unwrap_err().code(), Code::InvalidArgument);
    }
}
