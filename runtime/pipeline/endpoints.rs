//! Every name clients call, and the reload that changes them: the models
//! loaded and their pipelines built from the config, a reload staged so
//! that it builds everything fallible before it changes a kept model, and
//! the status of a name's versions.

use std::collections::BTreeMap;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::admission::TrafficRules;
use super::lifecycle::ModelManager;
use super::priority::Priority;
use super::{BuildContext, Pipeline, ServedModel};
use crate::config::{check_models, Config, ModelConfig};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::models::VersionChoice;

/// Every name clients can call: configured pipelines, and each model that
/// no pipeline of the same name replaces. Models (and the names serving
/// them directly) come and go with config reloads; the maps are swapped
/// whole, so a request reads them without a lock.
pub struct Endpoints {
    pipelines: ArcSwap<BTreeMap<String, Arc<Pipeline>>>,
    models: ArcSwap<BTreeMap<String, Arc<ServedModel>>>,
    /// Pipelines whose plugin could not be loaded, and why: they answer
    /// UNAVAILABLE with the reason while everything else serves.
    failed: BTreeMap<String, Error>,
    /// The configured pipelines over each model: a reload may not remove
    /// a model one of them runs.
    used_by: BTreeMap<String, Vec<String>>,
    manager: ModelManager,
    metrics: Arc<Metrics>,
    max_tensor_bytes: usize,
    traffic: Arc<TrafficRules>,
    /// `server.list_models_in_errors`: a request for a name not served is
    /// told the names that are.
    list_models_in_errors: bool,
}

/// What a config reload changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReloadOutcome {
    /// Models added, each served under its own name.
    pub added: Vec<String>,
    /// Models removed; their versions drain and unload.
    pub removed: Vec<String>,
    /// Models kept, with their policy, labels and path as the new config says.
    pub kept: Vec<String>,
}

impl Endpoints {
    /// Loads every version `models`' policies select, warming each up.
    /// Any failure stops the start: a server that silently lacks a model
    /// is worse than one that does not start.
    pub async fn load_models(
        models: &[ModelConfig],
        manager: &ModelManager,
    ) -> Result<BTreeMap<String, Arc<ServedModel>>> {
        let loads = models.iter().map(|config| async move {
            let model = ServedModel::new(config.clone(), manager.metrics().clone())?;
            // No pipeline exists yet: each is fitted to the versions
            // serving when it is built.
            manager.reconcile(&model, &[], true).await?;
            Ok::<_, Error>((config.name.clone(), model))
        });
        futures::future::try_join_all(loads).await.map(|loaded| loaded.into_iter().collect())
    }

    /// Builds the pipelines of `config` over the loaded models; each model
    /// version has one inference stage shared by all of them.
    pub fn build(
        config: &Config,
        models: BTreeMap<String, Arc<ServedModel>>,
        manager: ModelManager,
        cx: &BuildContext<'_>,
        metrics: Arc<Metrics>,
    ) -> Result<Endpoints> {
        let mut pipelines = BTreeMap::new();
        for model in &config.models {
            let served = models.get(&model.name).cloned().ok_or_else(|| {
                Error::internal(format!("model '{}' was not loaded before its pipelines, this is a bug", model.name))
            })?;
            pipelines.insert(
                model.name.clone(),
                Pipeline::direct(served, model, cx.traffic, cx.metrics, cx.max_tensor_bytes)?,
            );
        }
        // Before any configured pipeline takes a model's name.
        let direct = pipelines.clone();
        let mut failed = BTreeMap::new();
        let mut used_by: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for pipeline in &config.pipelines {
            for model in pipeline.models() {
                let users = used_by.entry(model.to_string()).or_default();
                if !users.contains(&pipeline.name) {
                    users.push(pipeline.name.clone());
                }
            }
            let served = models.get(&pipeline.model).cloned().ok_or_else(|| {
                Error::not_found(format!("pipeline '{}': model '{}' is not served", pipeline.name, pipeline.model))
            })?;
            let built = if pipeline.is_graph() {
                Pipeline::graph(pipeline, served, &models, &direct, cx)
            } else {
                Pipeline::build(pipeline, served, cx)
            };
            match built {
                Ok(built) => {
                    pipelines.insert(pipeline.name.clone(), built);
                }
                // One team's plugin must not stop the server for every
                // team: its pipeline is left out, with the reason.
                Err(error) if pipeline.uses_plugins() => {
                    tracing::error!(pipeline = %pipeline.name, "pipeline not served: {error}");
                    pipelines.remove(&pipeline.name);
                    failed.insert(pipeline.name.clone(), error);
                }
                Err(error) => return Err(error),
            }
        }
        Ok(Endpoints {
            pipelines: ArcSwap::from_pointee(pipelines),
            models: ArcSwap::from_pointee(models),
            failed,
            used_by,
            manager,
            metrics,
            max_tensor_bytes: cx.max_tensor_bytes,
            traffic: cx.traffic.clone(),
            list_models_in_errors: config.server.list_models_in_errors,
        })
    }

    /// Pipelines that failed to load, and why.
    pub fn failed(&self) -> impl Iterator<Item = (&str, &Error)> {
        self.failed.iter().map(|(name, error)| (name.as_str(), error))
    }

    /// The pipeline called `name`.
    pub fn get(&self, name: &str) -> Result<Arc<Pipeline>> {
        if let Some(error) = self.failed.get(name) {
            return Err(Error::unavailable(format!("pipeline '{name}' is not serving: it failed to load: {error}")));
        }
        let pipelines = self.pipelines.load();
        pipelines.get(name).cloned().ok_or_else(|| {
            // As TF Serving, the names served are not told to whoever asks
            // (they may say more than a caller should know), unless the
            // operator chose to.
            if !self.list_models_in_errors {
                return Error::not_found(format!("model '{name}' is not served"));
            }
            let names: Vec<&str> = pipelines.keys().map(String::as_str).collect();
            Error::not_found(format!("model '{name}' is not served; served: [{}]", names.join(", ")))
        })
    }

    /// True when the endpoint `name` exists and would refuse a request of
    /// `priority` now; made without a message or an allocation.
    pub fn is_full(&self, name: &str, priority: Priority) -> bool {
        self.pipelines.load().get(name).is_some_and(|pipeline| pipeline.is_full(priority))
    }

    /// Counts a call to the endpoint `name` that the transport refused
    /// unread because it waited too long to be read; false when there is
    /// no such endpoint (the call goes on, to be answered NOT_FOUND).
    pub fn refuse_late(&self, name: &str) -> bool {
        self.pipelines.load().get(name).map(|pipeline| pipeline.refuse_late()).is_some()
    }

    /// The endpoint a request names; an empty name is the client's
    /// mistake, not an unknown model.
    pub fn named(&self, name: &str) -> Result<Arc<Pipeline>> {
        if name.is_empty() {
            return Err(Error::invalid_argument("the model name is empty; name the model to use"));
        }
        self.get(name)
    }

    /// Every endpoint.
    pub fn all(&self) -> Vec<Arc<Pipeline>> {
        self.pipelines.load().values().cloned().collect()
    }

    /// Every served model.
    pub fn models(&self) -> Vec<Arc<ServedModel>> {
        self.models.load().values().cloned().collect()
    }

    /// The object-store mirrors of models whose base path is a bucket.
    pub fn storage(&self) -> &Arc<crate::models::storage::Storage> {
        self.manager.storage()
    }

    /// Re-reads every model's repository: new versions in the policy are
    /// loaded and served, versions that left it are drained and unloaded.
    /// Failures are recorded in each version's status; serving goes on.
    pub async fn poll(&self) {
        let _one_change = self.manager.exclusive().await;
        for model in self.models() {
            if let Err(error) = self.manager.reconcile(&model, &self.pipelines_over(&model), false).await {
                tracing::warn!(model = model.name(), "repository poll failed: {error}");
            }
        }
    }

    /// Serves the models `configs` lists, as TF Serving's
    /// HandleReloadConfigRequest does: new ones are loaded (and only then
    /// served), missing ones drained and unloaded, kept ones take the new
    /// policy, labels and base path. A model a configured pipeline runs
    /// cannot be removed. Any failure refuses the reload: added models are
    /// not served and removed ones keep serving; versions a kept model's
    /// new policy loaded before the failure stay loaded.
    pub async fn reload(&self, mut configs: Vec<ModelConfig>) -> Result<ReloadOutcome> {
        check_models(&configs).map_err(|e| Error::invalid_argument(e.0))?;
        let _one_change = self.manager.exclusive().await;
        let current = self.models.load_full();
        let mut outcome = ReloadOutcome::default();
        for name in current.keys() {
            if !configs.iter().any(|c| &c.name == name) {
                if let Some(pipelines) = self.used_by.get(name) {
                    return Err(Error::failed_precondition(format!(
                        "the new config leaves out model '{name}', which pipelines [{}] run; a reload cannot \
                         remove it (change the pipelines and restart)",
                        pipelines.join(", ")
                    )));
                }
                outcome.removed.push(name.clone());
            }
        }
        // Everything fallible first, while nothing served has changed: the
        // new models loaded and their pipelines built, so a new model
        // whose pipeline cannot be built fails the reload before any kept
        // model changed.
        let mut added: Vec<(Arc<ServedModel>, Arc<Pipeline>)> = Vec::new();
        for config in &mut configs {
            match current.get(&config.name) {
                Some(model) => {
                    // Only what a model config in TF Serving's format holds
                    // changes; sessions and batching stay as they started.
                    let served = model.config();
                    let kept = ModelConfig {
                        base_path: config.base_path.clone(),
                        version_policy: config.version_policy.clone(),
                        version_labels: config.version_labels.clone(),
                        logging: config.logging.clone(),
                        canary: config.canary.clone(),
                        ..ModelConfig::clone(&served)
                    };
                    *config = kept;
                    outcome.kept.push(config.name.clone());
                }
                None => {
                    let built = async {
                        let model = ServedModel::new(config.clone(), self.metrics.clone())?;
                        self.manager.reconcile(&model, &[], true).await.inspect_err(|_| self.discard(&model))?;
                        let pipeline = Pipeline::direct(
                            model.clone(),
                            config,
                            &self.traffic,
                            &self.metrics,
                            self.max_tensor_bytes,
                        )
                        .inspect_err(|_| self.discard(&model))?;
                        Ok::<_, Error>((model, pipeline))
                    };
                    match built.await {
                        Ok(built) => added.push(built),
                        Err(error) => {
                            added.iter().for_each(|(model, _)| self.discard(model));
                            return Err(error);
                        }
                    }
                    outcome.added.push(config.name.clone());
                }
            }
        }
        // Then the kept models, each in turn; a failure puts back every
        // one changed so far, and drops the new ones.
        let mut changed: Vec<(&Arc<ServedModel>, Arc<ModelConfig>)> = Vec::new();
        for config in configs.iter().filter(|c| current.contains_key(&c.name)) {
            let model = &current[&config.name];
            changed.push((model, model.config()));
            let applied = match model.set_config(config.clone()) {
                Ok(()) => self.manager.reconcile(model, &self.pipelines_over(model), true).await,
                Err(error) => Err(error),
            };
            if let Err(error) = applied {
                for (model, previous) in changed.into_iter().rev() {
                    self.restore(model, previous).await;
                }
                added.iter().for_each(|(model, _)| self.discard(model));
                return Err(error);
            }
        }
        let mut models = BTreeMap::clone(&current);
        let mut pipelines = BTreeMap::clone(&self.pipelines.load());
        for (model, pipeline) in added {
            let name = model.name().to_string();
            pipelines.insert(name.clone(), pipeline);
            models.insert(name, model);
        }
        for name in &outcome.removed {
            pipelines.remove(name);
            if let Some(model) = models.remove(name) {
                let over = self.pipelines_over(&model);
                for version in model.versions() {
                    self.manager.retire(&model, version.version(), over.clone());
                }
            }
        }
        self.pipelines.store(Arc::new(pipelines));
        self.models.store(Arc::new(models));
        self.retain_mirrors();
        tracing::info!(added = ?outcome.added, removed = ?outcome.removed, kept = ?outcome.kept, "model config reloaded");
        Ok(outcome)
    }

    /// Purges the object-store mirrors of models no longer served from
    /// them (at start-up: of models no longer configured).
    pub fn retain_mirrors(&self) {
        let served: Vec<(String, std::path::PathBuf)> =
            self.models().iter().map(|m| (m.name().to_string(), m.config().base_path.clone())).collect();
        self.storage().retain(&served);
    }

    /// Unloads a model a failed reload loaded but never served (no served
    /// pipeline runs it).
    fn discard(&self, model: &Arc<ServedModel>) {
        for version in model.versions() {
            self.manager.retire(model, version.version(), Vec::new());
        }
    }

    /// The served pipelines over `model`, a model served directly
    /// included: what its versions are fitted to as they come and go.
    fn pipelines_over(&self, model: &Arc<ServedModel>) -> Vec<Arc<Pipeline>> {
        self.pipelines.load().values().filter(|p| p.runs(model)).cloned().collect()
    }

    /// Puts a kept model back as it was before a failed reload: its
    /// config, and its versions and labels as that config wants them.
    async fn restore(&self, model: &Arc<ServedModel>, previous: Arc<ModelConfig>) {
        if let Err(error) = model.set_config(ModelConfig::clone(&previous)) {
            tracing::error!(model = model.name(), %error, "cannot restore the request log after a failed reload");
        }
        if let Err(error) = self.manager.reconcile(model, &self.pipelines_over(model), false).await {
            tracing::error!(model = model.name(), %error, "restoring the versions after a failed reload");
        }
    }
}

/// The versions a status request asks about, and what each is doing.
pub fn status_of(
    endpoints: &Endpoints,
    name: &str,
    choice: VersionChoice<'_>,
) -> Result<Vec<(i64, crate::models::status::VersionStatus)>> {
    let pipeline = endpoints.named(name)?;
    let model = pipeline.model();
    let all = model.status().all();
    Ok(match choice {
        VersionChoice::Latest => all,
        VersionChoice::Number(v) => match all.into_iter().find(|(version, _)| *version == v) {
            Some(found) => vec![found],
            None => {
                let seen: Vec<String> = model.status().all().iter().map(|(v, _)| v.to_string()).collect();
                return Err(Error::not_found(format!(
                    "model '{name}' has no version {v}; versions seen: [{}]",
                    seen.join(", ")
                )));
            }
        },
        VersionChoice::Label(_) => {
            let version = model.resolve(choice)?.version();
            all.into_iter().filter(|(v, _)| *v == version).collect()
        }
    })
}
