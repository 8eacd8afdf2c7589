//! The Open Inference Protocol's (KServe v2) `inference.GRPCInferenceService`
//! on the same port as TF Serving's services: ServerLive, ServerReady,
//! ModelReady, ServerMetadata, ModelMetadata and ModelInfer, for Triton,
//! KServe, MLServer and OpenVINO Model Server clients.
//!
//! ModelInfer takes typed `contents` or `raw_input_contents` (not both),
//! and answers in `raw_output_contents` (what Triton sends, and what every
//! v2 client reads): one copy of each output's bytes, no per-value
//! encoding. The request id is echoed; the requested outputs select and
//! order the answer.

use crate::pipeline::trace::current_step;
use tonic::{Request, Response, Status};

use super::{context_named, serve};
use crate::api::context::ServingState;
use crate::api::v2;
use crate::error::{Error, Result};
use crate::proto::inference::grpc_inference_service_server::GrpcInferenceService;
use crate::proto::inference::model_infer_response::InferOutputTensor;
use crate::proto::inference::model_metadata_response::TensorMetadata;
use crate::proto::inference::{
    InferTensorContents, ModelInferRequest, ModelInferResponse, ModelMetadataRequest, ModelMetadataResponse,
    ModelReadyRequest, ModelReadyResponse, ServerLiveRequest, ServerLiveResponse, ServerMetadataRequest,
    ServerMetadataResponse, ServerReadyRequest, ServerReadyResponse,
};
use crate::tensor::v2::{datatype, decode_contents, decode_raw, encode_raw};

/// The `GRPCInferenceService` implementation.
pub struct InferenceApi {
    state: ServingState,
}

impl InferenceApi {
    /// Serves the models in `state`.
    pub fn new(state: ServingState) -> Self {
        InferenceApi { state }
    }
}

/// Where an input's values are.
enum Given {
    Typed(Option<InferTensorContents>),
    Raw(bytes::Bytes),
}

#[tonic::async_trait]
impl GrpcInferenceService for InferenceApi {
    async fn server_live(&self, _: Request<ServerLiveRequest>) -> Result<Response<ServerLiveResponse>, Status> {
        Ok(Response::new(ServerLiveResponse { live: true }))
    }

    async fn server_ready(&self, _: Request<ServerReadyRequest>) -> Result<Response<ServerReadyResponse>, Status> {
        Ok(Response::new(ServerReadyResponse { ready: self.state.phase.check_ready().is_ok() }))
    }

    async fn model_ready(&self, request: Request<ModelReadyRequest>) -> Result<Response<ModelReadyResponse>, Status> {
        // Not ready (loading, draining): false, not an error.
        if self.state.phase.check_ready().is_err() {
            return Ok(Response::new(ModelReadyResponse { ready: false }));
        }
        let cx = context_named(&self.state, "model_ready", &request, &request.get_ref().name);
        let request = request.into_inner();
        let state = &self.state;
        serve(state, cx, async |_| {
            Ok(ModelReadyResponse { ready: v2::model_ready(&state.endpoints, &request.name, &request.version)? })
        })
        .await
    }

    async fn server_metadata(
        &self,
        _: Request<ServerMetadataRequest>,
    ) -> Result<Response<ServerMetadataResponse>, Status> {
        Ok(Response::new(ServerMetadataResponse {
            name: v2::SERVER_NAME.to_string(),
            version: v2::SERVER_VERSION.to_string(),
            extensions: v2::EXTENSIONS.iter().map(|e| e.to_string()).collect(),
        }))
    }

    async fn model_metadata(
        &self,
        request: Request<ModelMetadataRequest>,
    ) -> Result<Response<ModelMetadataResponse>, Status> {
        let cx = context_named(&self.state, "model_metadata", &request, &request.get_ref().name);
        let request = request.into_inner();
        let state = &self.state;
        serve(state, cx, async |cx| {
            let target = cx.resolve(&state.endpoints, v2::version_choice(&request.version)?, "")?;
            let metadata = v2::model_metadata(&target)?;
            let tensors = |list: Vec<v2::TensorMetadata>| {
                list.into_iter()
                    .map(|t| TensorMetadata { name: t.name, datatype: t.datatype.to_string(), shape: t.shape })
                    .collect()
            };
            Ok(ModelMetadataResponse {
                name: metadata.name,
                versions: metadata.versions,
                platform: v2::PLATFORM.to_string(),
                inputs: tensors(metadata.inputs),
                outputs: tensors(metadata.outputs),
            })
        })
        .await
    }

    async fn model_infer(&self, request: Request<ModelInferRequest>) -> Result<Response<ModelInferResponse>, Status> {
        let cx = context_named(&self.state, "model_infer", &request, &request.get_ref().model_name);
        let request = request.into_inner();
        let state = &self.state;
        serve(state, cx, async |cx| {
            let target = cx.resolve(&state.endpoints, v2::version_choice(&request.model_version)?, "")?;
            let priority = match request.parameters.get("priority") {
                None => cx.priority()?,
                Some(param) => {
                    use crate::proto::inference::infer_parameter::ParameterChoice;
                    let level = match param.parameter_choice {
                        Some(ParameterChoice::Uint64Param(v)) => Some(v),
                        Some(ParameterChoice::Int64Param(v)) => u64::try_from(v).ok(),
                        _ => None,
                    };
                    let shown = format!("{:?}", param.parameter_choice);
                    v2::priority_parameter(true, level, &shown)?.unwrap_or_default()
                }
            };
            infer(&target, request, cx.deadline, priority).await
        })
        .await
    }
}

async fn infer(
    target: &crate::pipeline::Target,
    request: ModelInferRequest,
    deadline: crate::pipeline::deadline::Deadline,
    priority: crate::pipeline::priority::Priority,
) -> Result<ModelInferResponse> {
    let ModelInferRequest { model_name, id, inputs, outputs, raw_input_contents, .. } = request;
    if !raw_input_contents.is_empty() {
        if raw_input_contents.len() != inputs.len() {
            return Err(Error::invalid_argument(format!(
                "raw_input_contents has {} entries for {} inputs; give one per input, in input order",
                raw_input_contents.len(),
                inputs.len()
            )));
        }
        if let Some(input) = inputs.iter().find(|i| i.contents.is_some()) {
            return Err(Error::invalid_argument(format!(
                "input '{}' sets contents while raw_input_contents is used; use one or the other",
                input.name
            )));
        }
    }
    let mut raw = raw_input_contents.into_iter();
    let given: Vec<v2::GivenInput<Given>> = inputs
        .into_iter()
        .map(|input| v2::GivenInput {
            values: match raw.next() {
                Some(bytes) => Given::Raw(bytes),
                None => Given::Typed(input.contents),
            },
            name: input.name,
            datatype: input.datatype,
            shape: input.shape,
        })
        .collect();
    if let Some(output) = outputs.iter().find(|o| o.parameters.contains_key("classification")) {
        return Err(v2::classification_refused(&output.name));
    }
    let asked: Vec<String> = outputs.into_iter().map(|o| o.name).collect();
    let answered =
        v2::infer(target, given, &asked, deadline, priority, |dtype, shape, values, limit, what| match values {
            Given::Raw(bytes) => decode_raw(dtype, shape, bytes, limit, what),
            Given::Typed(contents) => decode_contents(dtype, shape, contents.unwrap_or_default(), limit, what),
        })
        .await?;
    let _encode = current_step("encode").entered();
    let mut tensors = Vec::with_capacity(answered.len());
    let mut raw_output_contents = Vec::with_capacity(answered.len());
    for (name, tensor) in answered {
        tensors.push(InferOutputTensor {
            name,
            datatype: datatype(tensor.dtype()).to_string(),
            shape: tensor.shape().to_vec(),
            parameters: Default::default(),
            contents: None,
        });
        raw_output_contents.push(encode_raw(&tensor));
    }
    Ok(ModelInferResponse {
        model_name,
        model_version: target.version.version().to_string(),
        id,
        parameters: Default::default(),
        outputs: tensors,
        raw_output_contents,
    })
}
