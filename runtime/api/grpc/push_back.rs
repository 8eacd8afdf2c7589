//! Push-back on the gRPC port: a call to a saturated pipeline is refused
//! on its HTTP/2 stream, with `RST_STREAM(REFUSED_STREAM)`, before the
//! router, the codec or any handler runs.
//!
//! A refusal that reads, decodes and answers a request costs nearly what
//! serving it does when the request is small (HTTP/2 stream, routing,
//! tonic's codec, the context, a trailers-only answer): under a spike the
//! core then spends itself refusing. TF Serving's Predict names its model
//! only inside the body, so the check waits for the call's first DATA
//! frame (which arrives with its HEADERS for any request that fits one),
//! reads `model_spec.name` (or KServe's `model_name`) from the first bytes
//! of the message without decoding it, and asks that pipeline's admission
//! whether a request of the call's `x-sluice-priority` would be admitted
//! ([`Pipeline::is_full`](crate::pipeline::Pipeline::is_full)). If not,
//! the stream is reset: hyper sends the reason it finds in the service's
//! error, h2 drops the rest of the body unread, and nothing is allocated
//! for the call beyond what h2 already holds.
//!
//! A call can also wait before anything reads it: each stream's handler is
//! a task of the runtime that accepted it, and when the core cannot keep
//! up (a model cheap enough to run on the network thread, where no
//! admission queue forms), those tasks queue in the runtime, unseen by
//! any admission, until each is served long after its caller stopped
//! waiting. So the time from the stream's arrival (when hyper calls this
//! service) to its handler's first poll is watched as CoDel watches a
//! queue ([`ReadDelay`]): once every call has waited more than
//! `READ_DELAY_TARGET` for `READ_DELAY_INTERVAL`, a call that waited
//! more is answered RESOURCE_EXHAUSTED at once, trailers only, its body
//! unread, and counted in `sluice_rejections_total{reason="late_read"}`
//! of the pipeline it names. That drains the queue to the target within
//! an interval; high-priority calls are never refused this way.
//!
//! Clients treat REFUSED_STREAM as "not processed": gRPC reports it as
//! UNAVAILABLE, and gRPC's retry policies (and its transparent retry) may
//! send the call again, to another replica when the channel balances over
//! several. Anything the check cannot read at once (another message
//! layout, a compressed message, a name split across frames) goes on to
//! the handler, whose admission refuses it the ordinary way, with
//! RESOURCE_EXHAUSTED and a message.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::{BoxFuture, Either, MapErr};
use futures::TryFutureExt;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use crate::api::phase::PhaseCell;
use crate::api::read_delay::ReadDelay;
use crate::pipeline::priority::{Priority, PRIORITY_HEADER};
use crate::pipeline::Endpoints;

/// The calls that enter a pipeline's admission, and where their message
/// names the model.
const ADMITTED_CALLS: [(&str, ModelName); 4] = [
    ("/tensorflow.serving.PredictionService/Predict", ModelName::InSpec),
    ("/tensorflow.serving.PredictionService/Classify", ModelName::InSpec),
    ("/tensorflow.serving.PredictionService/Regress", ModelName::InSpec),
    ("/inference.GRPCInferenceService/ModelInfer", ModelName::Field),
];

/// Where a call's message names its model.
#[derive(Clone, Copy)]
enum ModelName {
    /// `model_spec` (field 1) `.name` (field 1): TF Serving's requests.
    InSpec,
    /// `model_name` (field 1): KServe v2's `ModelInferRequest`.
    Field,
}

/// What the check consults: the pipelines and whether the server serves.
pub struct PushBack {
    endpoints: Arc<Endpoints>,
    phase: Arc<PhaseCell>,
    read_delay: ReadDelay,
}

impl PushBack {
    /// Push-back for the pipelines of `endpoints`, while `phase` is ready.
    pub fn new(endpoints: Arc<Endpoints>, phase: Arc<PhaseCell>) -> Arc<PushBack> {
        Arc::new(PushBack { endpoints, phase, read_delay: ReadDelay::new() })
    }

    /// True when the call whose message starts with `first` names a
    /// pipeline that would refuse it now.
    fn refuses(&self, where_named: ModelName, first: &[u8], priority: Priority) -> bool {
        let Some(name) = model_name(where_named, first) else { return false };
        let Ok(name) = std::str::from_utf8(name) else { return false };
        self.endpoints.is_full(name, priority)
    }
}

/// The gRPC router behind push-back; on the other ports, the router alone.
#[derive(Clone)]
pub struct Gated {
    router: axum::Router,
    push_back: Option<Arc<PushBack>>,
}

impl Gated {
    /// `router`, behind `push_back` when given.
    pub fn new(router: axum::Router, push_back: Option<Arc<PushBack>>) -> Gated {
        Gated { router, push_back }
    }
}

impl From<axum::Router> for Gated {
    fn from(router: axum::Router) -> Gated {
        Gated::new(router, None)
    }
}

/// Why a stream was reset: hyper resets it with the reason found here.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn refused_stream() -> BoxError {
    Box::new(h2::Error::from(h2::Reason::REFUSED_STREAM))
}

type Routed = axum::routing::future::RouteFuture<std::convert::Infallible>;

impl tower::Service<http::Request<Incoming>> for Gated {
    type Response = axum::response::Response;
    type Error = BoxError;
    type Future = Either<
        MapErr<Routed, fn(std::convert::Infallible) -> BoxError>,
        BoxFuture<'static, Result<Self::Response, BoxError>>,
    >;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The router is always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Incoming>) -> Self::Future {
        // Hyper calls this as the stream arrives; the handler below runs
        // when the runtime gets to its task.
        let arrived = Instant::now();
        let checked = self.push_back.as_ref().filter(|p| p.phase.check_serving().is_ok()).and_then(|push_back| {
            let path = request.uri().path();
            ADMITTED_CALLS.iter().find(|(call, _)| *call == path).map(|(_, named)| (push_back.clone(), *named))
        });
        let Some((push_back, named)) = checked else {
            let never: fn(std::convert::Infallible) -> BoxError = |never| match never {};
            return Either::Left(tower::Service::call(&mut self.router, request).map_err(never));
        };
        let mut router = self.router.clone();
        Either::Right(Box::pin(async move {
            let now = Instant::now();
            let waited = now.saturating_duration_since(arrived);
            let priority = Priority::from_header(request.headers().get(PRIORITY_HEADER).map(|v| v.as_bytes()));
            let (parts, mut body) = request.into_parts();
            let first = body.frame().await.transpose().map_err(|e| -> BoxError { Box::new(e) })?;
            let late = !matches!(priority, Ok(Priority::High)) && push_back.read_delay.standing(waited, now);
            if late {
                let name = first.as_ref().and_then(Frame::data_ref).and_then(|data| model_name(named, data));
                let counted =
                    name.and_then(|n| std::str::from_utf8(n).ok()).is_some_and(|n| push_back.endpoints.refuse_late(n));
                if counted {
                    return Ok(late_answer(waited));
                }
            }
            let refuse = match (&first, priority) {
                (Some(frame), Ok(priority)) => {
                    frame.data_ref().is_some_and(|data| push_back.refuses(named, data, priority))
                }
                _ => false,
            };
            if refuse {
                return Err(refused_stream());
            }
            let request = http::Request::from_parts(parts, Replayed { first, rest: body });
            let Ok(response) = tower::Service::call(&mut router, request).await;
            Ok(response)
        }))
    }
}

/// The answer to a call refused for waiting too long before it was read:
/// RESOURCE_EXHAUSTED, trailers only (in the headers), nothing read.
fn late_answer(waited: Duration) -> axum::response::Response {
    let status = tonic::Status::resource_exhausted(crate::api::read_delay::overloaded(waited));
    let (parts, _) = status.into_http::<axum::body::Body>().into_parts();
    axum::response::Response::from_parts(parts, axum::body::Body::empty())
}

/// The service hyper calls as each stream arrives, in the connection's own
/// task (hyper-util's tower adapter would make the call only once the
/// stream's task first runs): so the late-read check measures the wait in
/// front of the handler, not after it.
impl hyper::service::Service<http::Request<Incoming>> for Gated {
    type Response = axum::response::Response;
    type Error = BoxError;
    type Future = <Gated as tower::Service<http::Request<Incoming>>>::Future;

    fn call(&self, request: http::Request<Incoming>) -> Self::Future {
        tower::Service::call(&mut self.clone(), request)
    }
}

/// A request body whose first frame was read for the check, served again
/// ahead of the rest.
struct Replayed {
    first: Option<Frame<Bytes>>,
    rest: Incoming,
}

impl Body for Replayed {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(first)));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let first = self.first.as_ref().and_then(Frame::data_ref).map_or(0, |data| data.len() as u64);
        let rest = self.rest.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower().saturating_add(first));
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(first));
        }
        hint
    }
}

/// The model a gRPC message names, read from the first bytes of its
/// frame (`[compressed: u8][length: u32][message]`); `None` when those
/// bytes do not say (compressed, another layout, cut short).
fn model_name(where_named: ModelName, frame: &[u8]) -> Option<&[u8]> {
    let (&compressed, rest) = frame.split_first()?;
    if compressed != 0 {
        return None;
    }
    let message = rest.get(4..)?;
    match where_named {
        ModelName::Field => first_field(message, 1, Whole),
        // The spec may run past the frame; the name in it may not.
        ModelName::InSpec => first_field(first_field(message, 1, Begun)?, 1, Whole),
    }
}

/// Whether a field cut short at the end of the bytes is enough.
#[derive(Clone, Copy, PartialEq)]
enum Cut {
    /// Its first bytes are.
    Begun,
    /// Only the whole field is.
    Whole,
}
use Cut::{Begun, Whole};

/// The bytes of the length-delimited field `number` of `message`, if it
/// comes before anything cut short; other fields are skipped.
fn first_field(mut message: &[u8], number: u64, cut: Cut) -> Option<&[u8]> {
    while !message.is_empty() {
        let tag = varint(&mut message)?;
        let len = match tag & 7 {
            0 => {
                varint(&mut message)?;
                continue;
            }
            1 => 8,
            2 => usize::try_from(varint(&mut message)?).ok()?,
            5 => 4,
            _ => return None,
        };
        if tag >> 3 == number && tag & 7 == 2 {
            return match message.get(..len) {
                Some(value) => Some(value),
                None if cut == Begun => Some(message),
                None => None,
            };
        }
        message = message.get(len..)?;
    }
    None
}

/// Reads one varint off the front of `bytes`.
fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for (i, &byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            *bytes = &bytes[i + 1..];
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::proto::inference::ModelInferRequest;

    use crate::proto::tensorflow::serving::{ModelSpec, PredictRequest};

    fn framed(message: &impl Message) -> Vec<u8> {
        let body = message.encode_to_vec();
        let mut frame = vec![0];
        frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
        frame.extend_from_slice(&body);
        frame
    }

    #[test]
    fn reads_the_model_name_from_the_first_bytes() {
        let spec = ModelSpec { name: "cnn".into(), signature_name: "serving_default".into(), ..ModelSpec::default() };
        let predict = PredictRequest { model_spec: Some(spec), ..PredictRequest::default() };
        let frame = framed(&predict);
        assert_eq!(model_name(ModelName::InSpec, &frame), Some(&b"cnn"[..]));
        // Only the first bytes arrived: enough.
        assert_eq!(model_name(ModelName::InSpec, &frame[..12]), Some(&b"cnn"[..]));
        let infer = ModelInferRequest { model_name: "mlp".into(), ..ModelInferRequest::default() };
        assert_eq!(model_name(ModelName::Field, &framed(&infer)), Some(&b"mlp"[..]));
    }

    #[test]
    fn says_nothing_of_what_it_cannot_read() {
        let spec = ModelSpec { name: "cnn".into(), ..ModelSpec::default() };
        let mut frame = framed(&PredictRequest { model_spec: Some(spec), ..PredictRequest::default() });
        assert_eq!(model_name(ModelName::InSpec, &frame[..11]), None, "the name cut short");
        frame[0] = 1;
        assert_eq!(model_name(ModelName::InSpec, &frame), None, "compressed");
        assert_eq!(model_name(ModelName::InSpec, &[]), None);
        assert_eq!(model_name(ModelName::InSpec, &[0, 0, 0, 0, 3, 0xff, 0xff, 0xff]), None, "a broken varint");
        assert_eq!(model_name(ModelName::InSpec, &[0, 0, 0, 0, 2, 0x0b, 0x00]), None, "a group");
        // No model spec at all.
        assert_eq!(model_name(ModelName::InSpec, &framed(&PredictRequest::default())), None);
    }
}
