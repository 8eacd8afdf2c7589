//! The plugin admin API, under `/admin/v1/` on the REST port: upload,
//! list, show, activate, roll back and delete plugin versions.
//!
//! Every call carries `Authorization: Bearer TOKEN`. Tokens are configured
//! as SHA-256 hashes; the presented token is hashed and compared with
//! every configured hash in constant time, so neither the comparison nor
//! the config reveals a token. What a token may touch is the registry's
//! decision (`plugin::registry`), made before anything changes.
//!
//! The work (compiling and trying plugins, writing files) runs on a
//! blocking thread, never on the async runtime's.

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{error_response, read_body, RestState};
use crate::api::admin_access::Admin;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::plugin::compiler::{cancelled_by, CancelOnDrop};
use crate::plugin::registry::{Caller, Manifest, PluginRegistry};

/// The admin routes, served when `[admin] enabled = true`.
pub fn routes() -> Router<RestState> {
    Router::new()
        .route("/admin/v1/plugins", get(list))
        .route("/admin/v1/audit", get(audit))
        .route("/admin/v1/plugins/{name}", put(upload).get(show))
        .route("/admin/v1/plugins/{name}/versions/{version}/activate", post(activate))
        .route("/admin/v1/plugins/{name}/rollback", post(rollback))
        .route("/admin/v1/plugins/{name}/promote", post(promote))
        .route("/admin/v1/plugins/{name}/canary", delete(end_canary))
        .route("/admin/v1/plugins/{name}/versions/{version}", delete(remove))
        .route("/admin/v1/pipelines/{pipeline}/plugin", put(upload_to_pipeline))
        .route("/admin/v1/pipelines", get(pipelines))
        .route("/admin/v1/models/config", post(reload_models))
}

type Work = Box<dyn FnOnce(&PluginRegistry, &Caller) -> Result<Value> + Send>;

fn admin_of(state: &RestState) -> Result<&Admin> {
    state.admin.as_deref().ok_or_else(|| Error::not_found("the admin API is off"))
}

/// Runs `work` for an authenticated caller on a blocking thread. A caller
/// that goes away stops the plugin compilation its work runs, if any.
async fn run(admin: &Admin, caller: Caller, work: Work) -> Result<Value> {
    let registry = admin.registry()?;
    let cancel = CancelOnDrop::default();
    let token = cancel.token();
    let result = tokio::task::spawn_blocking(move || cancelled_by(token, || work(&registry, &caller)))
        .await
        .map_err(|e| Error::internal(format!("the admin call failed: {e}")))?;
    drop(cancel);
    result
}

fn respond(result: Result<Value>) -> Response {
    match result {
        Ok(body) => (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response(),
        Err(e) => error_response(&e),
    }
}

/// Authenticates, then runs `work` on a blocking thread; answers JSON.
async fn call(
    state: &RestState,
    headers: &HeaderMap,
    work: impl FnOnce(&PluginRegistry, &Caller) -> Result<Value> + Send + 'static,
) -> Response {
    let result = async {
        let admin = admin_of(state)?;
        let caller = admin.authenticate(headers)?;
        run(admin, caller, Box::new(work)).await
    }
    .await;
    respond(result)
}

/// The largest model config a reload takes, in bytes.
const MAX_MODEL_CONFIG_BYTES: usize = 1 << 20;

/// Replaces the served models with the ones a config lists: TF Serving's
/// text format (`model_config_list { config { … } }`) or sluice's TOML
/// (`[[models]]` tables only). Admin tokens only; relative base paths are
/// taken from the server's working directory.
async fn reload_models(State(state): State<RestState>, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        let admin = admin_of(&state)?;
        crate::api::reload::authorize(Some(admin), &headers)?;
        let serving = state.lifecycle.serving()?;
        let bytes = read_body(
            body,
            &headers,
            MAX_MODEL_CONFIG_BYTES,
            "the largest model config a reload takes",
            state.body_read_timeout,
        )
        .await?;
        let text = std::str::from_utf8(&bytes)
            .map_err(|e| Error::invalid_argument(format!("the model config is not UTF-8 text: {e}")))?;
        let config = Config::from_text(text, "the request body", std::path::Path::new("."))?;
        if !config.pipelines.is_empty() || !config.features.tables.is_empty() {
            return Err(Error::invalid_argument(
                "the request body configures pipelines or features; a reload changes [[models]] only \
                 (pipelines need a restart)",
            ));
        }
        let outcome = crate::api::reload::apply(serving, config.models).await?;
        Ok(json!({ "added": outcome.added, "removed": outcome.removed, "kept": outcome.kept }))
    }
    .await;
    respond(result)
}

fn manifest_json(manifest: &Manifest) -> Value {
    serde_json::to_value(manifest).unwrap_or(Value::Null)
}

fn version_number(text: &str) -> Result<u32> {
    text.parse().map_err(|_| Error::invalid_argument(format!("version '{text}' is not a whole number")))
}

#[derive(Deserialize)]
struct ActivateQuery {
    /// Start the version as a canary taking this percent of the calls.
    canary: Option<String>,
}

#[derive(Deserialize)]
struct UploadQuery {
    /// Activate the new version at once.
    activate: Option<bool>,
}

async fn upload(
    State(state): State<RestState>,
    Path(name): Path<String>,
    Query(query): Query<UploadQuery>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    upload_as(state, headers, body, query.activate.unwrap_or(false), move |_| Ok(name)).await
}

/// What `sluice plugin push --pipeline` calls: a new version of the plugin
/// the pipeline runs, activated unless `activate=false`.
async fn upload_to_pipeline(
    State(state): State<RestState>,
    Path(pipeline): Path<String>,
    Query(query): Query<UploadQuery>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    upload_as(state, headers, body, query.activate.unwrap_or(true), move |registry| {
        registry.plugin_of_pipeline(&pipeline)
    })
    .await
}

async fn upload_as(
    state: RestState,
    headers: HeaderMap,
    body: Body,
    activate: bool,
    name_of: impl FnOnce(&PluginRegistry) -> Result<String> + Send + 'static,
) -> Response {
    let result = async {
        let admin = admin_of(&state)?;
        // Who it is first: an unauthenticated caller's body is never read.
        let caller = admin.authenticate(&headers)?;
        let bytes =
            read_body(body, &headers, admin.max_upload_bytes(), "admin.max_upload_bytes", state.body_read_timeout)
                .await?;
        run(
            admin,
            caller,
            Box::new(move |registry, caller| {
                let name = name_of(registry)?;
                let stored = registry.upload(caller, &name, &bytes)?;
                let mut answer = json!({
                    "name": name,
                    "version": stored.version,
                    "sha256": stored.sha256,
                    "size": stored.size,
                    "declared": stored.declared,
                    "active": false,
                });
                if activate {
                    registry.activate(caller, &name, stored.version)?;
                    answer["active"] = Value::Bool(true);
                }
                Ok(answer)
            }),
        )
        .await
    }
    .await;
    respond(result)
}

async fn list(State(state): State<RestState>, headers: HeaderMap) -> Response {
    call(&state, &headers, |registry, caller| {
        let manifests = registry.list(caller)?;
        Ok(json!({ "plugins": manifests.iter().map(manifest_json).collect::<Vec<_>>() }))
    })
    .await
}

#[derive(Deserialize)]
struct AuditQuery {
    /// Only this plugin's changes.
    plugin: Option<String>,
    /// The newest this many (default 100).
    limit: Option<String>,
}

/// The newest plugin changes the caller may see, newest first: uploads,
/// activations, rollbacks, canaries, deletions, each with who made it.
async fn audit(State(state): State<RestState>, headers: HeaderMap, Query(query): Query<AuditQuery>) -> Response {
    let limit = match query.limit.as_deref().map(str::parse::<usize>) {
        None => 100,
        Some(Ok(limit)) if (1..=crate::plugin::registry::MAX_AUDIT_LISTED).contains(&limit) => limit,
        Some(_) => {
            return respond(Err(Error::invalid_argument(format!(
                "limit = {:?}: expected a whole number from 1 to {}",
                query.limit.unwrap_or_default(),
                crate::plugin::registry::MAX_AUDIT_LISTED
            ))))
        }
    };
    call(&state, &headers, move |registry, caller| {
        let (entries, source) = registry.audit_entries(caller, query.plugin.as_deref(), limit)?;
        Ok(json!({ "entries": entries, "source": source }))
    })
    .await
}

/// What every pipeline's plugin stage runs now: plugin, version, what it
/// declares, sha256.
async fn pipelines(State(state): State<RestState>, headers: HeaderMap) -> Response {
    call(&state, &headers, |registry, caller| {
        Ok(json!({ "pipelines": registry.running(caller), "registry_revision": registry.revision() }))
    })
    .await
}

async fn show(State(state): State<RestState>, Path(name): Path<String>, headers: HeaderMap) -> Response {
    call(&state, &headers, move |registry, caller| Ok(manifest_json(&registry.show(caller, &name)?))).await
}

/// Activates a version, or with `?canary=PERCENT` starts it as a canary
/// taking that percent of the calls.
async fn activate(
    State(state): State<RestState>,
    Path((name, version)): Path<(String, String)>,
    Query(query): Query<ActivateQuery>,
    headers: HeaderMap,
) -> Response {
    call(&state, &headers, move |registry, caller| {
        let version = version_number(&version)?;
        let manifest = match query.canary.as_deref() {
            None => registry.activate(caller, &name, version)?,
            Some(percent) => {
                let percent: f64 = percent.trim().parse().map_err(|_| {
                    Error::invalid_argument(format!("canary = '{percent}': expected a percent, such as 5 or 0.5"))
                })?;
                registry.start_canary(caller, &name, version, percent)?
            }
        };
        Ok(manifest_json(&manifest))
    })
    .await
}

async fn promote(State(state): State<RestState>, Path(name): Path<String>, headers: HeaderMap) -> Response {
    call(&state, &headers, move |registry, caller| Ok(manifest_json(&registry.promote(caller, &name)?))).await
}

async fn end_canary(State(state): State<RestState>, Path(name): Path<String>, headers: HeaderMap) -> Response {
    call(&state, &headers, move |registry, caller| Ok(manifest_json(&registry.end_canary(caller, &name)?))).await
}

async fn rollback(State(state): State<RestState>, Path(name): Path<String>, headers: HeaderMap) -> Response {
    call(&state, &headers, move |registry, caller| Ok(manifest_json(&registry.rollback(caller, &name)?))).await
}

async fn remove(
    State(state): State<RestState>,
    Path((name, version)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    call(&state, &headers, move |registry, caller| {
        Ok(manifest_json(&registry.delete(caller, &name, version_number(&version)?)?))
    })
    .await
}
