//! The Open Inference Protocol's (KServe v2) REST API on the HTTP port:
//! `GET /v2` (server metadata), `/v2/health/live`, `/v2/health/ready`,
//! `GET /v2/models/NAME[/versions/V]` (model metadata), `…/ready` and
//! `POST …/infer`.
//!
//! Inference bodies are JSON tensors (`name`, `shape`, `datatype`, `data`
//! flat or nested), or, with the binary tensor extension, a JSON header of
//! `Inference-Header-Content-Length` bytes followed by each input's raw
//! bytes (`parameters.binary_data_size`), so clients that send arrays
//! avoid JSON numbers. Outputs come back binary when asked
//! (`parameters.binary_data` per output, or `binary_data_output` for all).

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{read_body, run_call, RestState};
use crate::api::context::{request_id, RequestContext};
use crate::api::health::Phase;
use crate::api::v2;
use crate::error::{Error, Result};
use crate::pipeline::deadline::Deadline;
use crate::pipeline::priority::{Priority, PRIORITY_HEADER};
use crate::pipeline::Target;
use crate::tensor::json::JsonView;
use crate::tensor::v2::{datatype, decode_json, decode_raw, encode_raw, flat};
use crate::tensor::Tensor;

/// The header giving the JSON part's length in a binary request or answer.
const HEADER_LENGTH: &str = "inference-header-content-length";

/// What a `/v2/…` path asks for.
#[derive(Debug, PartialEq, Eq)]
enum Call<'a> {
    ServerMetadata,
    Live,
    Ready,
    ModelMetadata(&'a str, &'a str),
    ModelReady(&'a str, &'a str),
    Infer(&'a str, &'a str),
}

/// Parses the part of the path after `/v2`.
fn parse(path: &str) -> Result<Call<'_>> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    Ok(match segments.as_slice() {
        [""] => Call::ServerMetadata,
        ["health", "live"] => Call::Live,
        ["health", "ready"] => Call::Ready,
        ["models", name, rest @ ..] if !name.is_empty() => {
            let (version, rest) = match rest {
                ["versions", v, rest @ ..] => (*v, rest),
                rest => ("", rest),
            };
            match rest {
                [] => Call::ModelMetadata(name, version),
                ["ready"] => Call::ModelReady(name, version),
                ["infer"] => Call::Infer(name, version),
                _ => return Err(not_found(path)),
            }
        }
        ["repository", ..] => {
            return Err(Error::unimplemented(
                "the model repository extension is not served: models load from the config and the model directories",
            ))
        }
        _ => return Err(not_found(path)),
    })
}

fn not_found(path: &str) -> Error {
    Error::not_found(format!(
        "no such endpoint: /v2{path}; the v2 API is /v2, /v2/health/live|ready, \
         /v2/models/NAME[/versions/V][/ready|/infer]"
    ))
}

/// Answers one `/v2/…` call; returns the request's id with it.
pub(super) async fn route(state: &RestState, sent: super::Sent<'_>, body: Body) -> (String, Response) {
    let super::Sent { path, method, headers, given_id } = sent;
    let call = match parse(path) {
        Ok(call) => call,
        Err(e) => return (request_id(given_id), super::error_response(&e)),
    };
    let wanted = if matches!(call, Call::Infer(..)) { Method::POST } else { Method::GET };
    if method != wanted {
        let error = Error::MethodNotAllowed(format!("{method} /v2{path}: use {wanted}"));
        return (request_id(given_id), super::error_response(&error));
    }
    let phase = state.lifecycle.phase();
    let (api, name) = match call {
        Call::Live => return (request_id(given_id), json_response(json!({ "live": true }))),
        Call::Ready => {
            // The protocol: 200 for true, a 4xx for false.
            let ready = phase == Phase::Ready;
            let status = if ready { StatusCode::OK } else { StatusCode::BAD_REQUEST };
            return (request_id(given_id), (status, json_response(json!({ "ready": ready }))).into_response());
        }
        Call::ServerMetadata => {
            let metadata =
                json!({ "name": v2::SERVER_NAME, "version": v2::SERVER_VERSION, "extensions": v2::EXTENSIONS });
            return (request_id(given_id), json_response(metadata));
        }
        Call::ModelMetadata(name, _) => ("model_metadata", name),
        Call::ModelReady(name, _) => ("model_ready", name),
        Call::Infer(name, _) => ("model_infer", name),
    };
    let deadline = state.request_timeout.map_or(Deadline::NONE, Deadline::after);
    let carrier = crate::pipeline::trace::HeaderCarrier(headers);
    let cx = RequestContext::new(&state.metrics, api, "rest", given_id, name, deadline, &state.tracing, &carrier)
        .with_priority_header(headers.get(PRIORITY_HEADER).map(|v| v.as_bytes()));
    run_call(cx, async |cx| {
        let endpoints = &state.lifecycle.serving()?.endpoints;
        match call {
            Call::ModelReady(name, version) => {
                let ready = v2::model_ready(endpoints, name, version)?;
                let status = if ready { StatusCode::OK } else { StatusCode::BAD_REQUEST };
                Ok((status, json_response(json!({ "name": name, "ready": ready }))).into_response())
            }
            Call::ModelMetadata(_, version) => {
                let target = cx.resolve(endpoints, v2::version_choice(version)?, "")?;
                Ok(json_response(metadata_json(&target)?))
            }
            Call::Infer(_, version) => {
                let target = cx.resolve(endpoints, v2::version_choice(version)?, "")?;
                // A full pipeline refuses before the body is read.
                // (As the header says: the body's `priority` is not read yet.)
                let priority = cx.priority()?;
                super::refuse_unread(state, &target.pipeline, priority)?;
                let body =
                    read_body(body, headers, state.max_body_bytes, "server.max_message_bytes", state.body_read_timeout)
                        .await?;
                infer(&target, headers, body, cx.deadline, priority, state.max_json_values).await
            }
            _ => Err(Error::internal("a v2 call without a model reached the model routes, this is a bug")),
        }
    })
    .await
}

fn json_response(value: Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], value.to_string()).into_response()
}

fn metadata_json(target: &Target) -> Result<Value> {
    let metadata = v2::model_metadata(target)?;
    let tensors = |list: &[v2::TensorMetadata]| -> Vec<Value> {
        list.iter().map(|t| json!({ "name": t.name, "datatype": t.datatype, "shape": t.shape })).collect()
    };
    Ok(json!({
        "name": metadata.name,
        "versions": metadata.versions,
        "platform": v2::PLATFORM,
        "inputs": tensors(&metadata.inputs),
        "outputs": tensors(&metadata.outputs),
    }))
}

/// An inference request's JSON (the header, with the binary extension).
#[derive(Deserialize)]
struct InferRequest {
    id: Option<String>,
    #[serde(default)]
    parameters: Map<String, Value>,
    inputs: Vec<InputJson>,
    #[serde(default)]
    outputs: Vec<OutputJson>,
}

#[derive(Deserialize)]
struct InputJson {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    #[serde(default)]
    parameters: Map<String, Value>,
    data: Option<Value>,
}

#[derive(Deserialize)]
struct OutputJson {
    name: String,
    #[serde(default)]
    parameters: Map<String, Value>,
}

/// Where an input's values are.
enum Given {
    Json(Value),
    Raw(Bytes),
}

async fn infer(
    target: &Target,
    headers: &HeaderMap,
    body: Bytes,
    deadline: Deadline,
    priority: Priority,
    max_json_values: usize,
) -> Result<Response> {
    let (head, mut binary) = match headers.get(HEADER_LENGTH) {
        None => (body, Bytes::new()),
        Some(value) => {
            let length = value.to_str().ok().and_then(|v| v.trim().parse::<usize>().ok()).ok_or_else(|| {
                Error::invalid_argument(format!("{HEADER_LENGTH} is {value:?}; expected a byte count"))
            })?;
            if length > body.len() {
                return Err(Error::invalid_argument(format!(
                    "{HEADER_LENGTH} is {length}, but the body has {} bytes",
                    body.len()
                )));
            }
            let mut body = body;
            let binary = body.split_off(length);
            (body, binary)
        }
    };
    crate::tensor::json::check_json_bounds(&head, max_json_values, "server.max_json_values")?;
    let request: InferRequest = crate::tensor::json::parse(&crate::tensor::json::accept_non_finite(&head))
        .map_err(|e| Error::invalid_argument(format!("the inference request is not valid v2 JSON: {e}")))?;
    let mut inputs = Vec::with_capacity(request.inputs.len());
    for input in request.inputs {
        let given = match (input.parameters.get("binary_data_size"), input.data) {
            (Some(size), None) => {
                let size = size.as_u64().and_then(|s| usize::try_from(s).ok()).ok_or_else(|| {
                    Error::invalid_argument(format!(
                        "input '{}': binary_data_size is {size}; expected a byte count",
                        input.name
                    ))
                })?;
                if size > binary.len() {
                    return Err(Error::invalid_argument(format!(
                        "input '{}': binary_data_size is {size}, but only {} bytes of binary data remain",
                        input.name,
                        binary.len()
                    )));
                }
                Given::Raw(binary.split_to(size))
            }
            (None, Some(data)) => Given::Json(data),
            (Some(_), Some(_)) => {
                return Err(Error::invalid_argument(format!(
                    "input '{}' gives both data and binary_data_size; give one",
                    input.name
                )))
            }
            (None, None) => {
                return Err(Error::invalid_argument(format!(
                    "input '{}' has no data and no binary_data_size",
                    input.name
                )))
            }
        };
        inputs.push(v2::GivenInput { name: input.name, datatype: input.datatype, shape: input.shape, values: given });
    }
    if !binary.is_empty() {
        return Err(Error::invalid_argument(format!(
            "{} bytes of binary data follow the inputs' binary_data_size; they must add up to the body",
            binary.len()
        )));
    }
    let given = request.parameters.get("priority");
    let priority = v2::priority_parameter(
        given.is_some(),
        given.and_then(Value::as_u64),
        &given.map_or_else(String::new, Value::to_string),
    )?
    .unwrap_or(priority);
    let all_binary = request.parameters.get("binary_data_output").and_then(Value::as_bool).unwrap_or(false);
    let binary_of = |name: &str| {
        request
            .outputs
            .iter()
            .find(|o| o.name == name)
            .and_then(|o| o.parameters.get("binary_data").and_then(Value::as_bool))
            .unwrap_or(all_binary)
    };
    if let Some(output) = request.outputs.iter().find(|o| o.parameters.contains_key("classification")) {
        return Err(v2::classification_refused(&output.name));
    }
    let asked: Vec<String> = request.outputs.iter().map(|o| o.name.clone()).collect();
    let answered =
        v2::infer(target, inputs, &asked, deadline, priority, |dtype, shape, given, limit, what| match given {
            Given::Raw(bytes) => decode_raw(dtype, shape, bytes, limit, what),
            Given::Json(data) => decode_json(dtype, shape, &data, limit, what),
        })
        .await?;
    let _encode = crate::pipeline::trace::current_step("encode").entered();
    answer(target, request.id, answered, binary_of)
}

/// One output in the answer's JSON.
#[derive(serde::Serialize)]
struct AnsweredOutput<'a> {
    name: &'a str,
    datatype: &'static str,
    shape: &'a [i64],
    /// The values, flat, written straight from the tensor (floats in their
    /// shortest form, as TF Serving's REST API writes them).
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<JsonView<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<Value>,
}

/// The answer's JSON (the header, with binary outputs).
#[derive(serde::Serialize)]
struct AnswerJson<'a> {
    model_name: &'a str,
    model_version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<String>,
    outputs: Vec<AnsweredOutput<'a>>,
}

/// The answer: JSON alone, or a JSON header and the binary outputs.
fn answer(
    target: &Target,
    id: Option<String>,
    outputs: Vec<(String, Tensor)>,
    binary_of: impl Fn(&str) -> bool,
) -> Result<Response> {
    let binary: Vec<Option<Bytes>> =
        outputs.iter().map(|(name, tensor)| binary_of(name).then(|| encode_raw(tensor))).collect();
    let flats: Vec<Tensor> = outputs.iter().map(|(_, tensor)| flat(tensor)).collect();
    let described = outputs
        .iter()
        .zip(&binary)
        .zip(&flats)
        .map(|(((name, tensor), raw), values)| AnsweredOutput {
            name,
            datatype: datatype(tensor.dtype()),
            shape: tensor.shape(),
            data: raw.is_none().then(|| JsonView::whole(values)),
            parameters: raw.as_ref().map(|raw| json!({ "binary_data_size": raw.len() })),
        })
        .collect();
    let head = AnswerJson {
        model_name: target.pipeline.name(),
        model_version: target.version.version().to_string(),
        id,
        outputs: described,
    };
    let head = serde_json::to_vec(&head).map_err(|e| Error::internal(format!("writing the answer failed: {e}")))?;
    let binary: Vec<Bytes> = binary.into_iter().flatten().collect();
    if binary.is_empty() {
        return Ok(([(header::CONTENT_TYPE, "application/json")], head).into_response());
    }
    let length = head.len();
    let mut body = head;
    body.reserve(binary.iter().map(Bytes::len).sum::<usize>());
    for raw in &binary {
        body.extend_from_slice(raw);
    }
    let mut response = ([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response();
    response.headers_mut().insert(HEADER_LENGTH, HeaderValue::from(length));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_parse_as_the_protocol_writes_them() {
        assert_eq!(parse("").unwrap(), Call::ServerMetadata);
        assert_eq!(parse("/health/ready").unwrap(), Call::Ready);
        assert_eq!(parse("/models/mlp").unwrap(), Call::ModelMetadata("mlp", ""));
        assert_eq!(parse("/models/mlp/versions/2/infer").unwrap(), Call::Infer("mlp", "2"));
        assert_eq!(parse("/models/mlp/ready").unwrap(), Call::ModelReady("mlp", ""));
        assert!(parse("/models/mlp/explain").is_err());
        assert_eq!(parse("/repository/index").unwrap_err().code(), crate::error::Code::Unimplemented);
    }
}
