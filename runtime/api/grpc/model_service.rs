//! TF Serving's `ModelService`: GetModelStatus.

use tonic::{Request, Response, Status};

use super::{version_choice, ServingState};
use crate::error::Error;
use crate::models::VersionChoice;
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
        let request = request.into_inner();
        let spec =
            request.model_spec.ok_or_else(|| Error::invalid_argument("model_spec is missing; set model_spec.name"))?;
        if spec.name.is_empty() {
            return Err(Error::invalid_argument("model_spec.name is empty; name the model to use").into());
        }
        let model = self.state.endpoints.get(&spec.name)?.model();
        let versions: Vec<_> = match version_choice(&spec) {
            // Without a version, every loaded version.
            VersionChoice::Latest => model.versions().cloned().collect(),
            choice => vec![model.resolve(choice)?.clone()],
        };
        let model_version_status = versions
            .iter()
            .map(|v| ModelVersionStatus {
                version: v.version(),
                state: model_version_status::State::Available as i32,
                status: Some(StatusProto { error_code: 0, error_message: String::new() }),
            })
            .collect();
        Ok(Response::new(GetModelStatusResponse { model_version_status }))
    }
}
