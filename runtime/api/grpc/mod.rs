//! The gRPC API: TF Serving's `PredictionService` and `ModelService` at TF
//! Serving's paths, so existing TF Serving clients work unchanged.
//!
//! Each service turns errors into `tonic::Status` through the runtime's one
//! error mapping (`Error` → `Status`).

mod model_service;
mod prediction;

use std::sync::Arc;

pub use self::model_service::ModelStatusApi;
pub use self::prediction::{served_spec, signature_def, PredictionApi};
use crate::error::{Error, Result};
use crate::infer::DEFAULT_SIGNATURE;
use crate::models::{ModelVersion, VersionChoice};
use crate::pipeline::deadline::Deadline;
use crate::pipeline::{Endpoints, Pipeline};
use crate::proto::tensorflow::serving::{model_spec, ModelSpec};
use crate::tensor::proto::OutputEncoding;

/// What the gRPC services share.
#[derive(Clone)]
pub struct ServingState {
    /// Every name clients can call.
    pub endpoints: Arc<Endpoints>,
    /// How numeric outputs are written.
    pub output_encoding: OutputEncoding,
}

/// The deadline a client set with `grpc-timeout`.
pub fn deadline_of(metadata: &tonic::metadata::MetadataMap) -> Deadline {
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

/// The pipeline and loaded version a model spec names; checks the
/// signature name too.
pub fn resolve(endpoints: &Endpoints, spec: Option<&ModelSpec>) -> Result<(Arc<Pipeline>, Arc<ModelVersion>)> {
    let spec = spec.ok_or_else(|| Error::invalid_argument("model_spec is missing; set model_spec.name"))?;
    if spec.name.is_empty() {
        return Err(Error::invalid_argument("model_spec.name is empty; name the model to use"));
    }
    let pipeline = endpoints.get(&spec.name)?;
    let version = pipeline.model().resolve(version_choice(spec))?;
    if !spec.signature_name.is_empty() && spec.signature_name != DEFAULT_SIGNATURE {
        return Err(Error::failed_precondition(format!(
            "{version} has no signature '{}'; signatures: [{DEFAULT_SIGNATURE}]",
            spec.signature_name
        )));
    }
    Ok((pipeline.clone(), version.clone()))
}
