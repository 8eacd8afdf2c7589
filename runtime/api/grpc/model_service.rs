//! TF Serving's `ModelService`: GetModelStatus.

use tonic::{Request, Response, Status};

use super::{context, required_spec, serve, version_choice};
use crate::api::context::ServingState;
use crate::proto::tensorflow::serving::model_service_server::ModelService;
use crate::proto::tensorflow::serving::{
    model_version_status, GetModelStatusRequest, GetModelStatusResponse, ModelVersionStatus, StatusProto,
};

/// The `ModelService` implementation.
pub struct ModelStatusApi {
    state: ServingState,
}

impl ModelStatusApi {
    /// Reports on the models in `state`.
    pub fn new(state: ServingState) -> Self {
        ModelStatusApi { state }
    }
}

#[tonic::async_trait]
impl ModelService for ModelStatusApi {
    async fn get_model_status(
        &self,
        request: Request<GetModelStatusRequest>,
    ) -> Result<Response<GetModelStatusResponse>, Status> {
        let cx = context(&self.state, "get_model_status", &request, request.get_ref().model_spec.as_ref());
        let request = request.into_inner();
        let state = &self.state;
        serve(state, cx, async |_| {
            let spec = required_spec(request.model_spec.as_ref())?;
            let versions = state.endpoints.status_versions(&spec.name, version_choice(spec))?;
            let model_version_status = versions
                .iter()
                .map(|v| ModelVersionStatus {
                    version: v.version(),
                    state: model_version_status::State::Available as i32,
                    status: Some(StatusProto { error_code: 0, error_message: String::new() }),
                })
                .collect();
            Ok(GetModelStatusResponse { model_version_status })
        })
        .await
    }
}
