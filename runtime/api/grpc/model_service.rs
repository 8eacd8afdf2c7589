//! TF Serving's `ModelService`: GetModelStatus (every version seen, with
//! its state and the error of a failed load) and
//! HandleReloadConfigRequest (the served models replaced by a
//! `ModelServerConfig`).

use tonic::{Request, Response, Status};

use super::{context, context_named, required_spec, serve, version_choice};
use crate::api::context::ServingState;
use crate::api::reload;
use crate::config::tf_model_config;
use crate::error::{Error, Result};
use crate::pipeline::status_of;
use crate::proto::tensorflow::serving::model_service_server::ModelService;
use crate::proto::tensorflow::serving::{
    GetModelStatusRequest, GetModelStatusResponse, ModelVersionStatus, ReloadConfigRequest, ReloadConfigResponse,
    StatusProto,
};

/// The `ModelService` implementation.
pub struct ModelStatusApi {
    state: ServingState,
}

impl ModelStatusApi {
    /// Reports on (and reloads) the models in `state`.
    pub fn new(state: ServingState) -> Self {
        ModelStatusApi { state }
    }
}

/// TF Serving's `StatusProto`: OK, or the error's code and message.
fn status_proto(error: Option<&Error>) -> StatusProto {
    match error {
        None => StatusProto { error_code: 0, error_message: String::new() },
        Some(error) => StatusProto { error_code: error.code().grpc() as i32, error_message: error.to_string() },
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
            let versions = status_of(&state.endpoints, &spec.name, version_choice(spec))?;
            let model_version_status = versions
                .into_iter()
                .map(|(version, status)| ModelVersionStatus {
                    version,
                    state: status.state.number(),
                    status: Some(status_proto(status.error.as_ref())),
                })
                .collect();
            Ok(GetModelStatusResponse { model_version_status })
        })
        .await
    }

    async fn handle_reload_config_request(
        &self,
        request: Request<ReloadConfigRequest>,
    ) -> Result<Response<ReloadConfigResponse>, Status> {
        let cx = context_named(&self.state, "reload_config", &request, "");
        let headers = request.metadata().clone().into_headers();
        let request = request.into_inner();
        let state = &self.state;
        serve(state, cx, async |_| {
            reload::authorize(state.admin.as_deref(), &headers)?;
            let config = request.config.ok_or_else(|| {
                Error::invalid_argument("config is missing; send model_config_list { config { name base_path } }")
            })?;
            let models = tf_model_config::from_proto(config).map_err(|e| Error::invalid_argument(e.0))?;
            reload::apply(state, models).await?;
            Ok(ReloadConfigResponse { status: Some(status_proto(None)) })
        })
        .await
    }
}
