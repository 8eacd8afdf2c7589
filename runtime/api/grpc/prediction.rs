//! TF Serving's `PredictionService`: Predict and GetModelMetadata.
//!
//! Predict is the edge where a client's request becomes validated inputs:
//! the model spec is resolved to one loaded version, the input names are
//! checked before anything is decoded, each tensor is decoded and checked
//! against the signature, and only then does the request enter the model's
//! queue. Outputs are encoded in signature order, filtered by
//! `output_filter`.

use std::collections::HashMap;

use tonic::{Request, Response, Status};

use super::{deadline_of, resolve, ServingState};
use crate::error::Error;
use crate::infer::{Signature, TensorSpec, DEFAULT_SIGNATURE, PREDICT_METHOD};
use crate::models::ModelVersion;
use crate::pipeline::Pipeline;
use crate::proto::tensorflow::serving::prediction_service_server::PredictionService;
use crate::proto::tensorflow::serving::{
    model_spec, GetModelMetadataRequest, GetModelMetadataResponse, ModelSpec, PredictRequest, PredictResponse,
    SignatureDefMap,
};
use crate::proto::tensorflow::{tensor_info, SignatureDef, TensorInfo};
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

/// What a request runs on, as messages name it.
struct Target<'a> {
    pipeline: &'a Pipeline,
    version: &'a ModelVersion,
}

impl std::fmt::Display for Target<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.pipeline.name() == self.version.model() && !self.pipeline.has_stages() {
            write!(f, "{}", self.version)
        } else {
            write!(f, "pipeline '{}' ({})", self.pipeline.name(), self.version)
        }
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
        let request = request.into_inner();
        let (pipeline, version) = resolve(&self.state.endpoints, request.model_spec.as_ref())?;
        let target = Target { pipeline: &pipeline, version: &version };
        let owner: &(dyn std::fmt::Display + Sync) = &target;
        let signature = pipeline.signature(&version)?;
        let selected = signature.resolve_output_filter(owner, &request.output_filter)?;
        signature.check_input_names(owner, request.inputs.keys())?;
        let mut decoded = HashMap::with_capacity(request.inputs.len());
        for (name, proto) in request.inputs {
            let tensor = decode(&name, proto)?;
            decoded.insert(name, tensor);
        }
        let inputs = signature.bind_inputs(owner, decoded)?;
        // Bounding the whole wait by the deadline also drops the request
        // from whatever queue it is in: the queues skip requests whose
        // caller has gone.
        let outputs = deadline.run("while queued or running", pipeline.predict(&version, inputs, deadline)).await?;
        if outputs.len() != signature.outputs.len() {
            return Err(Error::internal(format!(
                "{owner} returned {} outputs, but its signature has {}",
                outputs.len(),
                signature.outputs.len()
            ))
            .into());
        }
        let encoding = self.state.output_encoding;
        let outputs =
            selected.into_iter().map(|i| (signature.outputs[i].name.clone(), encode(&outputs[i], encoding))).collect();
        Ok(Response::new(PredictResponse {
            model_spec: Some(served_spec(pipeline.name(), version.version())),
            outputs,
        }))
    }

    async fn get_model_metadata(
        &self,
        request: Request<GetModelMetadataRequest>,
    ) -> Result<Response<GetModelMetadataResponse>, Status> {
        let request = request.into_inner();
        let (pipeline, version) = resolve(&self.state.endpoints, request.model_spec.as_ref())?;
        if request.metadata_field.is_empty() {
            return Err(
                Error::invalid_argument(format!("metadata_field is empty; ask for \"{SIGNATURE_DEF_FIELD}\"")).into()
            );
        }
        if let Some(field) = request.metadata_field.iter().find(|f| *f != SIGNATURE_DEF_FIELD) {
            return Err(Error::invalid_argument(format!(
                "metadata_field \"{field}\" is not supported; supported: \"{SIGNATURE_DEF_FIELD}\""
            ))
            .into());
        }
        let signatures = SignatureDefMap {
            signature_def: HashMap::from([(
                DEFAULT_SIGNATURE.to_string(),
                signature_def(pipeline.signature(&version)?),
            )]),
        };
        let any = prost_types::Any {
            type_url: "type.googleapis.com/tensorflow.serving.SignatureDefMap".to_string(),
            value: prost::Message::encode_to_vec(&signatures),
        };
        Ok(Response::new(GetModelMetadataResponse {
            model_spec: Some(served_spec(pipeline.name(), version.version())),
            metadata: HashMap::from([(SIGNATURE_DEF_FIELD.to_string(), any)]),
        }))
    }
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
