//! Model config reloads from outside: TF Serving's
//! `ModelService/HandleReloadConfigRequest`, the admin API's
//! `POST /admin/v1/models/config`, and the `--model_config_file` poll. Who
//! may ask, applying the change (`pipeline::Endpoints::reload`), and
//! telling the gRPC health service which names came and went.
//!
//! With the admin API on, a reload needs an admin token on every path, the
//! gRPC one included (`authorization: Bearer TOKEN` metadata). With it
//! off, gRPC reloads are open, as they are in TF Serving: keep the gRPC
//! port on a network only trusted callers reach, or turn the admin API on.

use http::HeaderMap;
use tonic_health::ServingStatus;

use super::admin_access::Admin;
use super::context::ServingState;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::pipeline::ReloadOutcome;

/// Checks that the caller presenting `headers` may reload the config.
pub fn authorize(admin: Option<&Admin>, headers: &HeaderMap) -> Result<()> {
    let Some(admin) = admin else { return Ok(()) };
    let caller = admin.authenticate(headers)?;
    if !caller.admin {
        tracing::warn!(target: "sluice::audit", token = %caller.token_id, "model config reload refused: not an admin token");
        return Err(Error::PermissionDenied(format!(
            "token '{}' may not reload the model config; it takes an admin token",
            caller.token_id
        )));
    }
    tracing::info!(target: "sluice::audit", token = %caller.token_id, "model config reload");
    Ok(())
}

/// Serves `models` from now on (each given the command line's model
/// settings), and reports added names SERVING and removed ones gone.
pub async fn apply(state: &ServingState, mut models: Vec<ModelConfig>) -> Result<ReloadOutcome> {
    for model in &mut models {
        state.model_defaults.apply(model);
    }
    // What a reload starts (loads, batching tasks, drains) outlives the
    // call, so it runs on the shared runtime whichever thread serves the
    // call: a gRPC core's runtime serves calls and nothing else.
    let endpoints = state.endpoints.clone();
    let outcome = state
        .runtime
        .spawn(async move { endpoints.reload(models).await })
        .await
        .map_err(|e| Error::internal(format!("the reload stopped before it finished: {e}")))??;
    let mut health = state.health.clone();
    for name in &outcome.added {
        health.set_service_status(name, ServingStatus::Serving).await;
    }
    for name in &outcome.removed {
        health.clear_service_status(name).await;
    }
    Ok(outcome)
}
