//! The upstream TF Serving instances of one forwarded model: connections,
//! balancing, health and ejection, and the one place an upstream's answer
//! becomes sluice's.
//!
//! Each upstream gets several HTTP/2 connections (`channels`): one
//! connection multiplexes every call but lands on one of the upstream's
//! threads, and a field report saw QPS quadruple once clients opened
//! enough of them. A call goes to the less loaded of two healthy upstreams
//! picked at random (power of two choices, by calls in flight), waiting for
//! a free place when it is at `max_in_flight`. An upstream is ejected after
//! `eject_after_failures` consecutive failures (health checks, or calls it
//! could not be reached for) and returns after one passing health check
//! (`GetModelStatus`, every `health_check_ms`). A call is tried on another
//! upstream only when it provably never reached the first (no connection,
//! or a stream refused before any processing); anything else may have run
//! and is answered as it is.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use rand::Rng;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::config::upstream::UpstreamTls;
use crate::config::UpstreamConfig;
use crate::error::{Code, Error, Result};
use crate::metrics::{Metrics, UpstreamCodeLabels, UpstreamLabels};
use crate::proto::tensorflow::serving::model_service_client::ModelServiceClient;
use crate::proto::tensorflow::serving::prediction_service_client::PredictionServiceClient;
use crate::proto::tensorflow::serving::{
    model_spec, GetModelMetadataRequest, GetModelMetadataResponse, GetModelStatusRequest, ModelSpec, PredictRequest,
    PredictResponse,
};

/// `ModelVersionStatus.State.AVAILABLE`.
const AVAILABLE: i32 = 30;

/// One upstream TF Serving instance.
struct Upstream {
    address: String,
    channels: Vec<Channel>,
    next_channel: AtomicUsize,
    places: Arc<Semaphore>,
    in_flight: AtomicUsize,
    failures: AtomicU32,
    healthy: AtomicBool,
    /// Why it was last ejected, for errors.
    last_error: Mutex<String>,
    requests: Family<UpstreamCodeLabels, Counter>,
    labels: UpstreamLabels,
    seconds: Histogram,
    in_flight_gauge: Gauge,
    ejections: Counter,
    healthy_gauge: Gauge,
}

impl Upstream {
    fn channel(&self) -> Channel {
        let i = self.next_channel.fetch_add(1, Ordering::Relaxed) % self.channels.len();
        self.channels[i].clone()
    }

    fn record(&self, code: &'static str, elapsed: Duration) {
        let labels = UpstreamCodeLabels { model: self.labels.model.clone(), upstream: self.address.clone(), code };
        self.requests.get_or_create(&labels).inc();
        self.seconds.observe(elapsed.as_secs_f64());
    }

    fn succeeded(&self) {
        self.failures.store(0, Ordering::Relaxed);
        if !self.healthy.swap(true, Ordering::AcqRel) {
            self.healthy_gauge.set(1);
            tracing::info!(model = %self.labels.model, upstream = %self.address, "upstream back: taking calls again");
        }
    }

    fn failed(&self, why: &str, eject_after: u32) {
        *self.last_error.lock().unwrap_or_else(PoisonError::into_inner) = why.to_string();
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if failures >= eject_after && self.healthy.swap(false, Ordering::AcqRel) {
            self.healthy_gauge.set(0);
            self.ejections.inc();
            tracing::warn!(
                model = %self.labels.model,
                upstream = %self.address,
                failures,
                "upstream ejected: {why}"
            );
        }
    }

    fn why(&self) -> String {
        self.last_error.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// The TLS settings of a model's upstream connections: the CA their
/// certificates are checked against, and this server's client certificate
/// when it has one.
fn client_tls(model: &str, tls: &UpstreamTls) -> Result<ClientTlsConfig> {
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| {
            Error::invalid_argument(format!("model '{model}': upstream.tls: cannot read {}: {e}", path.display()))
        })
    };
    let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(&tls.ca_file)?));
    if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
        config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
    }
    if let Some(domain) = &tls.domain {
        config = config.domain_name(domain.clone());
    }
    Ok(config)
}

/// Every upstream of one forwarded model.
pub struct Fleet {
    /// The model's name here.
    model: String,
    /// Its name upstream.
    upstream_model: String,
    config: UpstreamConfig,
    upstreams: Vec<Arc<Upstream>>,
}

impl Fleet {
    /// Connects (lazily) to every upstream of `model` and starts checking
    /// their health.
    pub fn start(model: &str, config: &UpstreamConfig, metrics: &Metrics) -> Result<Arc<Fleet>> {
        let mut upstreams = Vec::with_capacity(config.endpoints.len());
        let tls = config.tls.as_ref().map(|tls| client_tls(model, tls)).transpose()?;
        for address in &config.endpoints {
            let scheme = if tls.is_some() { "https" } else { "http" };
            let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
                .map_err(|e| Error::invalid_argument(format!("upstream \"{address}\": {e}")))?
                .connect_timeout(Duration::from_millis(config.connect_timeout_ms))
                .tcp_nodelay(true)
                .http2_adaptive_window(true);
            if let Some(tls) = &tls {
                endpoint = endpoint.tls_config(tls.clone()).map_err(|e| {
                    Error::invalid_argument(format!("model '{model}': upstream \"{address}\": TLS: {e}"))
                })?;
            }
            // Each lazy channel is a connection of its own.
            let channels = (0..config.channels).map(|_| endpoint.connect_lazy()).collect();
            let labels = UpstreamLabels { model: model.to_string(), upstream: address.clone() };
            let healthy_gauge = metrics.upstream_healthy.get_or_create_owned(&labels);
            healthy_gauge.set(1);
            upstreams.push(Arc::new(Upstream {
                address: address.clone(),
                channels,
                next_channel: AtomicUsize::new(0),
                places: Arc::new(Semaphore::new(config.max_in_flight)),
                in_flight: AtomicUsize::new(0),
                failures: AtomicU32::new(0),
                healthy: AtomicBool::new(true),
                last_error: Mutex::new(String::new()),
                requests: metrics.upstream_requests.clone(),
                seconds: metrics.upstream_seconds.get_or_create_owned(&labels),
                in_flight_gauge: metrics.upstream_in_flight.get_or_create_owned(&labels),
                ejections: metrics.upstream_ejections.get_or_create_owned(&labels),
                healthy_gauge,
                labels,
            }));
        }
        let fleet = Arc::new(Fleet {
            model: model.to_string(),
            upstream_model: config.model_name.clone().unwrap_or_else(|| model.to_string()),
            config: config.clone(),
            upstreams,
        });
        tokio::spawn(check_health(Arc::downgrade(&fleet)));
        Ok(fleet)
    }

    /// `upstreams [a, b] (model 'x' there)`, for messages.
    pub fn describe(&self) -> String {
        let addresses: Vec<&str> = self.upstreams.iter().map(|u| u.address.as_str()).collect();
        format!("upstreams [{}] (model '{}' there)", addresses.join(", "), self.upstream_model)
    }

    /// The upstream's name of the model.
    pub fn upstream_model(&self) -> &str {
        &self.upstream_model
    }

    /// The signature name calls use.
    pub fn signature_name(&self) -> &str {
        &self.config.signature_name
    }

    /// The largest message sent or accepted.
    pub fn max_message_bytes(&self) -> usize {
        self.config.max_message_bytes
    }

    /// The versions to forward to, as the upstreams serve them now: the
    /// pinned version, the one the pinned label names, or every AVAILABLE
    /// version (the model's policy then picks).
    pub async fn versions(&self) -> Result<Vec<i64>> {
        if let Some(version) = self.config.version {
            return Ok(vec![version]);
        }
        if let Some(label) = &self.config.version_label {
            // GetModelMetadata resolves a label as Predict does and says
            // which version it named; GetModelStatus takes no label.
            let metadata = self.metadata_of(self.spec(None)).await?;
            return match metadata.model_spec.and_then(|s| s.version_choice) {
                Some(model_spec::VersionChoice::Version(v)) => Ok(vec![v]),
                _ => Err(Error::unavailable(format!(
                    "{} did not say which version label '{label}' names",
                    self.describe()
                ))),
            };
        }
        let spec = self.spec(None);
        let request = GetModelStatusRequest { model_spec: Some(spec) };
        let deadline = Instant::now() + Duration::from_millis(self.config.timeout_ms);
        let status = self
            .on_any("GetModelStatus", deadline, |channel, timeout| {
                let mut request = tonic::Request::new(request.clone());
                request.set_timeout(timeout);
                async move { ModelServiceClient::new(channel).get_model_status(request).await }
            })
            .await?;
        let mut versions: Vec<i64> =
            status.model_version_status.iter().filter(|s| s.state == AVAILABLE).map(|s| s.version).collect();
        versions.sort_unstable();
        if versions.is_empty() {
            return Err(Error::unavailable(format!("{} serve no AVAILABLE version", self.describe())));
        }
        Ok(versions)
    }

    /// The signature of `version` upstream (GetModelMetadata).
    pub async fn metadata(&self, version: i64) -> Result<GetModelMetadataResponse> {
        self.metadata_of(self.spec(Some(version))).await
    }

    async fn metadata_of(&self, spec: ModelSpec) -> Result<GetModelMetadataResponse> {
        let request = GetModelMetadataRequest {
            model_spec: Some(spec),
            metadata_field: vec![crate::tensor::proto::SIGNATURE_DEF_FIELD.to_string()],
        };
        let deadline = Instant::now() + Duration::from_millis(self.config.timeout_ms);
        let max = self.config.max_message_bytes;
        self.on_any("GetModelMetadata", deadline, |channel, timeout| {
            let mut request = tonic::Request::new(request.clone());
            request.set_timeout(timeout);
            async move {
                PredictionServiceClient::new(channel).max_decoding_message_size(max).get_model_metadata(request).await
            }
        })
        .await
    }

    /// The model spec of a call: the upstream's name, the version (or the
    /// pinned label), the signature.
    pub fn spec(&self, version: Option<i64>) -> ModelSpec {
        let version_choice = match (version, &self.config.version_label) {
            (Some(v), _) => Some(model_spec::VersionChoice::Version(v)),
            (None, Some(label)) => Some(model_spec::VersionChoice::VersionLabel(label.clone())),
            (None, None) => None,
        };
        ModelSpec {
            name: self.upstream_model.clone(),
            version_choice,
            signature_name: self.config.signature_name.clone(),
        }
    }

    /// Forwards one Predict, due by `deadline` (the batch's, capped by
    /// `timeout_ms`).
    pub async fn predict(&self, request: PredictRequest, deadline: Option<Instant>) -> Result<PredictResponse> {
        let cap = Instant::now() + Duration::from_millis(self.config.timeout_ms);
        let deadline = deadline.map_or(cap, |d| d.min(cap));
        let max = self.config.max_message_bytes;
        self.on_any("Predict", deadline, |channel, timeout| {
            let mut call = tonic::Request::new(request.clone());
            call.set_timeout(timeout);
            async move {
                PredictionServiceClient::new(channel)
                    .max_decoding_message_size(max)
                    .max_encoding_message_size(max)
                    .predict(call)
                    .await
            }
        })
        .await
    }

    /// Runs `call` on a healthy upstream, another one when it provably
    /// never reached the first, until `deadline`.
    async fn on_any<T, F, Fut>(&self, what: &str, deadline: Instant, call: F) -> Result<T>
    where
        F: Fn(Channel, Duration) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>> + Send,
    {
        let mut tried: Vec<usize> = Vec::new();
        let mut retried_lost = false;
        loop {
            let Some(i) = self.pick(&tried) else { return Err(self.none_left(what, &tried)) };
            let upstream = &self.upstreams[i];
            let place = tokio::time::timeout_at(deadline, upstream.places.clone().acquire_owned())
                .await
                .map_err(|_| {
                    Error::deadline_exceeded(&format!("waiting for a free call to upstream {}", upstream.address))
                })?
                .map_err(|_| Error::internal("an upstream's call places were closed, this is a bug"))?;
            let timeout = deadline.saturating_duration_since(Instant::now());
            if timeout.is_zero() {
                return Err(Error::deadline_exceeded(&format!("before calling upstream {}", upstream.address)));
            }
            upstream.in_flight.fetch_add(1, Ordering::Relaxed);
            upstream.in_flight_gauge.inc();
            let started = Instant::now();
            // Past the deadline the call is dropped (cancelling it
            // upstream), whatever the upstream does with grpc-timeout.
            let result = tokio::time::timeout_at(deadline, call(upstream.channel(), timeout)).await;
            upstream.in_flight.fetch_sub(1, Ordering::Relaxed);
            upstream.in_flight_gauge.dec();
            drop(place);
            let status = match result {
                Ok(Ok(response)) => {
                    upstream.record("OK", started.elapsed());
                    upstream.succeeded();
                    return Ok(response.into_inner());
                }
                // tonic enforces the timeout it sends as grpc-timeout too,
                // and calls its own expiry CANCELLED: it is the deadline.
                Ok(Err(status)) if !is_client_timeout(&status) => status,
                Ok(Err(_)) | Err(_) => {
                    upstream.record("DEADLINE_EXCEEDED", started.elapsed());
                    return Err(Error::deadline_exceeded(&format!(
                        "waiting for upstream {} ({what}, model '{}')",
                        upstream.address, self.model
                    )));
                }
            };
            upstream.record(Code::name_of_grpc(status.code()), started.elapsed());
            if never_sent(&status) {
                upstream.failed(status.message(), self.config.eject_after_failures);
                tried.push(i);
                continue;
            }
            if lost_upstream(&status) {
                upstream.failed(status.message(), self.config.eject_after_failures);
                // Lost under the call: once more elsewhere, when allowed
                // and another upstream is there to take it.
                if self.config.retry_lost_calls
                    && !retried_lost
                    && self.pick(&[tried.as_slice(), &[i]].concat()).is_some()
                {
                    retried_lost = true;
                    tracing::debug!(upstream = %upstream.address, "upstream lost under a {what} call; retrying elsewhere");
                    tried.push(i);
                    continue;
                }
            }
            return Err(self.answer(what, &upstream.address, status));
        }
    }

    /// Two healthy upstreams not yet tried, at random; the one with fewer
    /// calls in flight.
    fn pick(&self, tried: &[usize]) -> Option<usize> {
        let candidates: Vec<usize> = (0..self.upstreams.len())
            .filter(|i| !tried.contains(i) && self.upstreams[*i].healthy.load(Ordering::Acquire))
            .collect();
        match candidates.as_slice() {
            [] => None,
            [only] => Some(*only),
            _ => {
                let mut rng = rand::rng();
                let n = candidates.len();
                let x = rng.random_range(0..n);
                let mut y = rng.random_range(0..n - 1);
                if y >= x {
                    y += 1;
                }
                let (a, b) = (candidates[x], candidates[y]);
                let load = |i: usize| self.upstreams[i].in_flight.load(Ordering::Relaxed);
                Some(if load(b) < load(a) { b } else { a })
            }
        }
    }

    /// UNAVAILABLE naming every upstream and why it could not take the call.
    fn none_left(&self, what: &str, tried: &[usize]) -> Error {
        let reasons: Vec<String> = self
            .upstreams
            .iter()
            .enumerate()
            .map(|(i, u)| {
                let state = if tried.contains(&i) { "unreachable" } else { "ejected" };
                format!("{} {state}: {}", u.address, u.why())
            })
            .collect();
        let message =
            format!("no upstream of model '{}' could take the {what} call: {}", self.model, reasons.join("; "));
        // Every upstream ejected before this call: each ejection was
        // logged once, and each comeback will be; the calls failed
        // meanwhile are counted, not each logged.
        if tried.is_empty() {
            Error::dependency_failed(message)
        } else {
            Error::unavailable(message)
        }
    }

    /// An upstream's refusal as sluice's error: the client's mistakes pass
    /// through with the upstream's words, naming it.
    fn answer(&self, what: &str, address: &str, status: tonic::Status) -> Error {
        let message = format!("upstream {address} ({what}, model '{}'): {}", self.upstream_model, status.message());
        match status.code() {
            tonic::Code::InvalidArgument => Error::InvalidArgument(message),
            tonic::Code::NotFound => Error::NotFound(message),
            tonic::Code::FailedPrecondition => Error::FailedPrecondition(message),
            tonic::Code::ResourceExhausted => Error::LimitExceeded(message),
            tonic::Code::DeadlineExceeded => Error::deadline_exceeded(&message),
            _ if lost_upstream(&status) => Error::Unavailable(message),
            tonic::Code::Unimplemented => Error::Unimplemented(message),
            tonic::Code::PermissionDenied | tonic::Code::Unauthenticated => {
                Error::Internal(format!("{message} (sluice is not allowed to call it)"))
            }
            _ => Error::Internal(message),
        }
    }
}

/// True when the upstream could not answer: UNAVAILABLE, CANCELLED (what
/// the client stack says when the connection is reset under a call), or
/// UNKNOWN carrying a transport error rather than a status the upstream
/// sent (the connection closed before the answer: the upstream died
/// mid-call). The client did not cancel anything; for it the upstream is
/// unavailable, and it counts toward ejection.
fn lost_upstream(status: &tonic::Status) -> bool {
    match status.code() {
        tonic::Code::Unavailable | tonic::Code::Cancelled => true,
        tonic::Code::Unknown => {
            std::error::Error::source(status).is_some() || status.message().contains("transport error")
        }
        _ => false,
    }
}

/// True when tonic gave up on the call at the timeout it was given.
fn is_client_timeout(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Cancelled && status.message() == "Timeout expired"
}

/// True when the call provably never reached the upstream: no connection
/// could be made, or the stream was refused before any processing.
fn never_sent(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unavailable && {
        let message = status.message();
        ["tcp connect error", "error trying to connect", "dns error", "connect timeout", "refused stream"]
            .iter()
            .any(|m| message.contains(m))
    }
}

/// Checks every upstream every `health_check_ms`, until the fleet is gone.
async fn check_health(fleet: Weak<Fleet>) {
    loop {
        let Some(period) = fleet.upgrade().map(|f| Duration::from_millis(f.config.health_check_ms)) else { return };
        tokio::time::sleep(period).await;
        let Some(fleet) = fleet.upgrade() else { return };
        let spec = fleet.spec(None);
        for upstream in &fleet.upstreams {
            let mut request = tonic::Request::new(GetModelStatusRequest { model_spec: Some(spec.clone()) });
            let timeout = Duration::from_millis(fleet.config.timeout_ms.min(fleet.config.health_check_ms.max(100)));
            request.set_timeout(timeout);
            let answer =
                tokio::time::timeout(timeout, ModelServiceClient::new(upstream.channel()).get_model_status(request))
                    .await;
            match answer {
                Ok(Ok(status)) if status.get_ref().model_version_status.iter().any(|s| s.state == AVAILABLE) => {
                    upstream.succeeded();
                }
                Ok(Ok(_)) => upstream.failed("it serves no AVAILABLE version", fleet.config.eject_after_failures),
                Ok(Err(status)) => upstream.failed(
                    &format!("health check: {}: {}", Code::name_of_grpc(status.code()), status.message()),
                    fleet.config.eject_after_failures,
                ),
                Err(_) => upstream.failed(
                    &format!("health check: no answer within {} ms", timeout.as_millis()),
                    fleet.config.eject_after_failures,
                ),
            }
        }
    }
}
