//! TF Serving's `PredictionService`: Predict and GetModelMetadata.
//!
//! Predict is the edge where a client's request becomes validated inputs:
//! the model spec is resolved to one loaded version, the input names are
//! checked before anything is decoded, each tensor is decoded and checked
//! against the signature, and only then does the request enter the model's
//! queue (see `api::predict`). Outputs are encoded in signature order,
//! filtered by `output_filter`.

use std::collections::HashMap;

use tonic::{Request, Response, Status};

use super::{deadline_of, handle, resolve, spec_name, ServingState};
use crate::api::predict::Target;
use crate::error::Error;
use crate::infer::{Signature, TensorSpec, DEFAULT_SIGNATURE, PREDICT_METHOD};
use crate::pipeline::deadline::Deadline;
use crate::proto::tensorflow::serving::prediction_service_server::PredictionService;
use crate::proto::tensorflow::serving::{
    model_spec, GetModelMetadataRequest, GetModelMetadataResponse, ModelSpec, PredictRequest, PredictResponse,
    SignatureDefMap,
};
use crate::proto::tensorflow::{tensor_info, SignatureDef, TensorInfo};
use crate::tensor::proto::OutputEncoding;
use crate::tensor::proto::{decode, encode, encode_shape};

/// The metadata field TF Serving clients ask for.
const SIGNATURE_DEF_FIELD: &str = "signature_def";

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
        let deadline = deadline_of(request.metadata());
        let (metadata, _, request) = request.into_parts();
        let name = spec_name(request.model_spec.as_ref());
        let encoding = self.state.output_encoding;
        handle(&self.state, "predict", &metadata, &name, async move {
            let target = match resolve(&self.state.endpoints, request.model_spec.as_ref()) {
                Ok(target) => target,
                Err(e) => return (None, Err(e)),
            };
            let result = predict(&target, request, deadline, encoding).await;
            (Some(target), result)
        })
        .await
    }

    async fn get_model_metadata(
        &self,
        request: Request<GetModelMetadataRequest>,
    ) -> Result<Response<GetModelMetadataResponse>, Status> {
        let (metadata, _, request) = request.into_parts();
        let name = spec_name(request.model_spec.as_ref());
        handle(&self.state, "get_model_metadata", &metadata, &name, async move {
            let target = match resolve(&self.state.endpoints, request.model_spec.as_ref()) {
                Ok(target) => target,
                Err(e) => return (None, Err(e)),
            };
            let result = model_metadata(&target, &request.metadata_field);
            (Some(target), result)
        })
        .await
    }
}

async fn predict(
    target: &Target,
    request: PredictRequest,
    deadline: Deadline,
    encoding: OutputEncoding,
) -> Result<PredictResponse, Error> {
    let signature = target.signature()?;
    // Names first: nothing is decoded for a request that names the wrong inputs.
    signature.check_input_names(target, request.inputs.keys().map(String::as_str))?;
    let mut decoded = HashMap::with_capacity(request.inputs.len());
    for (name, proto) in request.inputs {
        let tensor = decode(&name, proto)?;
        decoded.insert(name, tensor);
    }
    let outputs = target.predict(decoded, &request.output_filter, deadline).await?;
    Ok(PredictResponse {
        model_spec: Some(served_spec(target.pipeline.name(), target.version.version())),
        outputs: outputs.into_iter().map(|(name, tensor)| (name, encode(&tensor, encoding))).collect(),
    })
}

fn model_metadata(target: &Target, fields: &[String]) -> Result<GetModelMetadataResponse, Error> {
    if fields.is_empty() {
        return Err(Error::invalid_argument(format!("metadata_field is empty; ask for \"{SIGNATURE_DEF_FIELD}\"")));
    }
    if let Some(field) = fields.iter().find(|f| *f != SIGNATURE_DEF_FIELD) {
        return Err(Error::invalid_argument(format!(
            "metadata_field \"{field}\" is not supported; supported: \"{SIGNATURE_DEF_FIELD}\""
        )));
    }
    let signatures = SignatureDefMap {
        signature_def: HashMap::from([(DEFAULT_SIGNATURE.to_string(), signature_def(target.signature()?))]),
    };
    let any = prost_types::Any {
        type_url: "type.googleapis.com/tensorflow.serving.SignatureDefMap".to_string(),
        value: prost::Message::encode_to_vec(&signatures),
    };
    Ok(GetModelMetadataResponse {
        model_spec: Some(served_spec(target.pipeline.name(), target.version.version())),
        metadata: HashMap::from([(SIGNATURE_DEF_FIELD.to_string(), any)]),
    })
}

/// A signature as TensorFlow's `SignatureDef`.
pub fn signature_def(signature: &Signature) -> SignatureDef {
    let info = |spec: &TensorSpec| {
        (
            spec.name.clone(),
            TensorInfo {
                encoding: Some(tensor_info::Encoding::Name(spec.name.clone())),
                dtype: spec.dtype.to_tf(),
                tensor_shape: Some(encode_shape(&spec.shape)),
            },
        )
    };
    SignatureDef {
        inputs: signature.inputs.iter().map(info).collect(),
        outputs: signature.outputs.iter().map(info).collect(),
        method_name: PREDICT_METHOD.to_string(),
        defaults: HashMap::new(),
    }
}
