//! TF Serving's `PredictionService`: Predict and GetModelMetadata.
//!
//! Predict is the edge where a client's request becomes a
//! `pipeline::ValidRequest`: the model spec is resolved to one loaded
//! version, the input names and `output_filter` are checked before
//! anything is decoded, each tensor is decoded and checked against the
//! signature as it is added, and only then does the request enter the
//! pipeline. Outputs are encoded in signature order, filtered by
//! `output_filter`.

use std::collections::HashMap;

use tonic::{Request, Response, Status};

use super::{context, resolve, serve};
use crate::api::context::ServingState;
use crate::config::OutputEncoding;
use crate::error::Error;
use crate::pipeline::deadline::Deadline;
use crate::pipeline::priority::Priority;
use crate::pipeline::trace::current_step;
use crate::pipeline::Target;
use crate::proto::tensorflow::serving::prediction_service_server::PredictionService;
use crate::proto::tensorflow::serving::{
    model_spec, GetModelMetadataRequest, GetModelMetadataResponse, ModelSpec, PredictRequest, PredictResponse,
    SignatureDefMap,
};
use crate::tensor::proto::{decode, encode, signature_def, SIGNATURE_DEF_FIELD, SIGNATURE_DEF_MAP_TYPE};
use crate::tensor::spec::DEFAULT_SIGNATURE;

/// The `PredictionService` implementation.
pub struct PredictionApi {
    state: ServingState,
}

impl PredictionApi {
    /// Serves the models in `state`.
    pub fn new(state: ServingState) -> Self {
        PredictionApi { state }
    }
}

/// The `model_spec` of a response: the name asked for, the version that
/// served, the signature used.
pub fn served_spec(name: &str, version: i64) -> ModelSpec {
    ModelSpec {
        name: name.to_string(),
        version_choice: Some(model_spec::VersionChoice::Version(version)),
        signature_name: DEFAULT_SIGNATURE.to_string(),
    }
}

#[tonic::async_trait]
impl PredictionService for PredictionApi {
    async fn predict(&self, request: Request<PredictRequest>) -> Result<Response<PredictResponse>, Status> {
        let cx = context(&self.state, "predict", &request, request.get_ref().model_spec.as_ref());
        let request = request.into_inner();
        let state = &self.state;
        serve(state, cx, async |cx| {
            let target = resolve(cx, state, request.model_spec.as_ref())?;
            predict(&target, request, cx.deadline, cx.priority()?, state.output_encoding).await
        })
        .await
    }

    async fn get_model_metadata(
        &self,
        request: Request<GetModelMetadataRequest>,
    ) -> Result<Response<GetModelMetadataResponse>, Status> {
        let cx = context(&self.state, "get_model_metadata", &request, request.get_ref().model_spec.as_ref());
        let request = request.into_inner();
        let state = &self.state;
        serve(state, cx, async |cx| {
            let target = resolve(cx, state, request.model_spec.as_ref())?;
            let signature_name = request.model_spec.as_ref().map_or("", |spec| spec.signature_name.as_str());
            model_metadata(&target, &request.metadata_field, signature_name)
        })
        .await
    }
}

async fn predict(
    target: &Target,
    request: PredictRequest,
    deadline: Deadline,
    priority: Priority,
    encoding: OutputEncoding,
) -> Result<PredictResponse, Error> {
    // Names first: nothing is decoded for a request that names the wrong
    // inputs or outputs.
    let mut builder =
        target.request(request.inputs.keys().map(String::as_str), &request.output_filter, deadline, priority)?;
    for (name, proto) in request.inputs {
        let tensor = decode(&name, proto, target.pipeline.max_tensor_bytes())?;
        builder.put(&name, tensor)?;
    }
    let outputs = builder.finish()?.run().await?;
    let _encode = current_step("encode").entered();
    Ok(PredictResponse {
        model_spec: Some(served_spec(target.pipeline.name(), target.version.version())),
        outputs: outputs.into_iter().map(|(name, tensor)| (name, encode(&tensor, encoding))).collect(),
    })
}

fn model_metadata(target: &Target, fields: &[String], signature_name: &str) -> Result<GetModelMetadataResponse, Error> {
    if fields.is_empty() {
        return Err(Error::invalid_argument(format!("metadata_field is empty; ask for \"{SIGNATURE_DEF_FIELD}\"")));
    }
    if let Some(field) = fields.iter().find(|f| *f != SIGNATURE_DEF_FIELD) {
        return Err(Error::invalid_argument(format!(
            "metadata_field \"{field}\" is not supported; supported: \"{SIGNATURE_DEF_FIELD}\""
        )));
    }
    let signatures = SignatureDefMap {
        signature_def: HashMap::from([(DEFAULT_SIGNATURE.to_string(), signature_def(target.signature()))]),
    };
    let any = prost_types::Any {
        type_url: SIGNATURE_DEF_MAP_TYPE.to_string(),
        value: prost::Message::encode_to_vec(&signatures),
    };
    // TF Serving echoes the signature name the request gave (often none).
    let mut model_spec = served_spec(target.pipeline.name(), target.version.version());
    model_spec.signature_name = signature_name.to_string();
    Ok(GetModelMetadataResponse {
        model_spec: Some(model_spec),
        metadata: HashMap::from([(SIGNATURE_DEF_FIELD.to_string(), any)]),
    })
}
