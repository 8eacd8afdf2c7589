//! What gRPC and REST share: resolving what a request names to a pipeline
//! and a loaded version, running validated inputs through it, and the
//! bookkeeping every request gets — an id, a tracing span, metrics.
//!
//! The protocols differ only in how tensors are decoded and encoded; the
//! checks and the errors are the same, from here.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use rand::Rng;

use super::metrics::{Metrics, RequestLabels};
use crate::error::{Error, Result};
use crate::infer::{Signature, DEFAULT_SIGNATURE};
use crate::models::{ModelVersion, VersionChoice};
use crate::pipeline::deadline::Deadline;
use crate::pipeline::{Endpoints, Pipeline};
use crate::tensor::Tensor;

/// The header (and gRPC metadata key) carrying a request's id.
pub const REQUEST_ID: &str = "x-request-id";

/// A request's id: the client's `x-request-id` when it sent a usable one
/// (1 to 64 visible ASCII characters), otherwise a new random one.
pub fn request_id(given: Option<&str>) -> String {
    match given {
        Some(id) if !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_graphic()) => id.to_string(),
        _ => format!("{:016x}", rand::rng().random::<u64>()),
    }
}

/// What a request runs on: a pipeline and the model version it resolved to.
pub struct Target {
    /// The pipeline (a model served directly is a pipeline without stages).
    pub pipeline: Arc<Pipeline>,
    /// The version that serves the request.
    pub version: Arc<ModelVersion>,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.pipeline.name() == self.version.model() && !self.pipeline.has_stages() {
            write!(f, "{}", self.version)
        } else {
            write!(f, "pipeline '{}' ({})", self.pipeline.name(), self.version)
        }
    }
}

impl Target {
    /// The pipeline called `name` and the version `choice` picks; checks
    /// the signature name too.
    pub fn resolve(
        endpoints: &Endpoints,
        name: &str,
        choice: VersionChoice<'_>,
        signature_name: &str,
    ) -> Result<Target> {
        let pipeline = named(endpoints, name)?;
        let version = pipeline.model().resolve(choice)?;
        if !signature_name.is_empty() && signature_name != DEFAULT_SIGNATURE {
            return Err(Error::failed_precondition(format!(
                "{version} has no signature '{signature_name}'; signatures: [{DEFAULT_SIGNATURE}]"
            )));
        }
        Ok(Target { pipeline: pipeline.clone(), version: version.clone() })
    }

    /// What clients send and receive.
    pub fn signature(&self) -> Result<&Signature> {
        self.pipeline.signature(&self.version)
    }

    /// Runs decoded inputs through the pipeline; returns the outputs
    /// `output_filter` selects (all when empty), by name, in signature
    /// order unless the filter orders them.
    pub async fn predict(
        &self,
        inputs: HashMap<String, Tensor>,
        output_filter: &[String],
        deadline: Deadline,
    ) -> Result<Vec<(String, Tensor)>> {
        let signature = self.signature()?;
        let selected = signature.resolve_output_filter(self, output_filter)?;
        let inputs = signature.bind_inputs(self, inputs)?;
        // Bounding the whole wait by the deadline also drops the request
        // from whatever queue it is in: the queues skip requests whose
        // caller has gone.
        let mut outputs =
            deadline.run("while queued or running", self.pipeline.predict(&self.version, inputs, deadline)).await?;
        if outputs.len() != signature.outputs.len() {
            return Err(Error::internal(format!(
                "{self} returned {} outputs, but its signature has {}",
                outputs.len(),
                signature.outputs.len()
            )));
        }
        let mut taken: Vec<Option<Tensor>> = outputs.drain(..).map(Some).collect();
        Ok(selected
            .into_iter()
            .filter_map(|i| taken[i].take().map(|t| (signature.outputs[i].name.clone(), t)))
            .collect())
    }
}

/// The endpoint a request names; an empty name is the client's mistake,
/// not an unknown model.
fn named<'e>(endpoints: &'e Endpoints, name: &str) -> Result<&'e Arc<Pipeline>> {
    if name.is_empty() {
        return Err(Error::invalid_argument("the model name is empty; name the model to use"));
    }
    endpoints.get(name)
}

/// The versions a status request asks about: every loaded one without a
/// version, else the one named.
pub fn status_versions(endpoints: &Endpoints, name: &str, choice: VersionChoice<'_>) -> Result<Vec<Arc<ModelVersion>>> {
    let model = named(endpoints, name)?.model();
    Ok(match choice {
        VersionChoice::Latest => model.versions().cloned().collect(),
        choice => vec![model.resolve(choice)?.clone()],
    })
}

/// Times one request and counts it, by model, pipeline, API, entry point
/// and outcome, when it ends.
pub struct RequestMeter<'a> {
    metrics: &'a Metrics,
    api: &'static str,
    entrypoint: &'static str,
    started: Instant,
}

impl<'a> RequestMeter<'a> {
    /// Starts timing an `api` call (`predict`, `get_model_metadata`, …)
    /// that came in through `entrypoint` (`grpc`, `rest`).
    pub fn start(metrics: &'a Metrics, api: &'static str, entrypoint: &'static str) -> Self {
        RequestMeter { metrics, api, entrypoint, started: Instant::now() }
    }

    /// Records the outcome; `target` is what the request resolved to, if
    /// it got that far, and `name` what it asked for.
    pub fn finish<T>(self, name: &str, target: Option<&Target>, result: &Result<T>) {
        let elapsed = self.started.elapsed().as_secs_f64();
        if let Err(e) = result {
            // Failures are worth a line; successes are what metrics are for.
            tracing::info!(code = %e.code(), api = self.api, "request failed: {}", e.message());
        }
        // The common case, a request that reached its pipeline: handles
        // resolved when the pipeline was built, no label lookup.
        let handles = target.and_then(|t| t.pipeline.request_handles().get(self.api, self.entrypoint));
        if let Some((ok, latency)) = handles {
            latency.observe(elapsed);
            if result.is_ok() {
                ok.inc();
                return;
            }
        }
        let code = match result {
            Ok(_) => "OK",
            Err(e) => e.code().as_str(),
        };
        // Shared names and static strings: counting a request allocates
        // nothing once its series exists.
        let (model, pipeline) = match target {
            Some(t) => (t.version.model_label(), t.pipeline.name_label()),
            None => {
                let name: Arc<str> = Arc::from(name);
                (name.clone(), name)
            }
        };
        let labels =
            RequestLabels { model_name: model, pipeline, api: self.api, entrypoint: self.entrypoint, status: code };
        self.metrics.requests.get_or_create(&labels).inc();
        if handles.is_none() {
            let latency = super::metrics::LatencyLabels {
                model_name: labels.model_name,
                pipeline: labels.pipeline,
                api: labels.api,
                entrypoint: labels.entrypoint,
            };
            self.metrics.request_latency.get_or_create(&latency).observe(elapsed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_taken_when_sane_and_made_otherwise() {
        assert_eq!(request_id(Some("abc-123")), "abc-123");
        assert_eq!(request_id(None).len(), 16);
        assert_eq!(request_id(Some("has space")).len(), 16);
        assert_eq!(request_id(Some(&"x".repeat(65))).len(), 16);
        assert_ne!(request_id(None), request_id(None));
    }
}
