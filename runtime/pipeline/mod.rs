//! The path of a request from admission to the answer.
//!
//! Every name a client can call is a [`Pipeline`]: admission (a bounded
//! number of requests in flight), an optional feature fetch ([`fetch`]:
//! features looked up by the keys a request gives), an optional preprocess
//! stage, inference
//! on the model version the request resolved to ([`inference`], through
//! the version's [`batcher`] when batching is on), and an optional
//! postprocess stage. A model served without a configured pipeline gets
//! one with no stages. A request enters only as a [`ValidRequest`]
//! ([`request`]), built at the API edge.
//!
//! In `pipelined` mode each stage has its own bounded queue and worker
//! threads, so while one request is in inference the next is already being
//! preprocessed; in `sequential` mode the same stages run one after another
//! in the caller's task. Every queue is bounded: a full one refuses the
//! request at once with RESOURCE_EXHAUSTED naming it, and a request whose
//! deadline has passed is dropped before it reaches the model.

pub mod admission;
pub mod batcher;
pub mod cache;
pub mod deadline;
pub mod fetch;
pub mod inference;
pub mod lanes;
pub mod lifecycle;
pub mod pace;
pub mod priority;
pub mod request;
pub mod request_log;
pub mod served;
pub mod stage;
pub mod stages;
pub mod trace;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tracing::Instrument;

use self::admission::{Admission, TrafficRules};
use self::cache::ResponseCache;
use self::deadline::Deadline;
use self::fetch::FeatureFetch;
use self::lifecycle::ModelManager;
use self::priority::Priority;
pub use self::request::{RequestBuilder, Target, ValidRequest};
pub use self::served::{ServedModel, ServedVersion};
use self::stage::StageRunner;
use self::stages::plugin::PluginPlace;
use self::trace::current_step;
use crate::config::{check_models, Config, ExamplesConfig, Mode, ModelConfig, PipelineConfig, StageConfig, StageRole};
use crate::error::{Error, Result};
use crate::feature::FeatureTables;
use crate::metrics::{Metrics, RequestHandles};
use crate::models::{ModelVersion, VersionChoice};
use crate::plugin::registry::PluginRegistry;
use crate::tensor::example::ExampleColumns;
use crate::tensor::spec::{fits, Signature, TensorSpec};
use crate::tensor::{NamedTensor, Tensor};

/// One name clients call, and what runs behind it.
pub struct Pipeline {
    // Shared, not copied, into every request's metric labels.
    name: Arc<str>,
    model: Arc<ServedModel>,
    admission: Admission,
    feature_fetch: Option<FeatureFetch>,
    preprocess: Option<StageRunner>,
    postprocess: Option<StageRunner>,
    /// Answers kept by their inputs, when configured.
    cache: Option<Arc<ResponseCache>>,
    /// What clients see for each model version: the first stage's inputs
    /// (or the model's) and the last stage's outputs (or the model's).
    /// Swapped whole as versions come and go (`lifecycle`).
    signatures: ArcSwap<BTreeMap<i64, EntryPoint>>,
    /// How `tf.Example`s fill its inputs, when it takes them.
    examples: Option<ExamplesConfig>,
    /// The most bytes one tensor built for a request may hold.
    max_tensor_bytes: usize,
    /// Request counts and latencies, resolved once.
    requests: RequestHandles,
}

/// What clients see of one model version behind a pipeline.
#[derive(Clone)]
pub struct EntryPoint {
    /// The inputs clients send and the outputs they receive.
    pub signature: Arc<Signature>,
    /// How `tf.Example`s fill those inputs; `None` when the pipeline takes
    /// none.
    pub examples: Option<Arc<ExampleColumns>>,
}

impl EntryPoint {
    /// `signature`, with `examples` checked against it.
    fn new(signature: Signature, examples: Option<&ExamplesConfig>, owner: &dyn std::fmt::Display) -> Result<Self> {
        let examples =
            examples.map(|config| ExampleColumns::new(config, &signature, owner).map(Arc::new)).transpose()?;
        Ok(EntryPoint { signature: Arc::new(signature), examples })
    }
}

/// What building pipelines needs besides their own config.
pub struct BuildContext<'a> {
    /// The plugin registry; `None` when no pipeline uses a plugin.
    pub registry: Option<&'a Arc<PluginRegistry>>,
    /// Where stages report.
    pub metrics: &'a Metrics,
    /// `server.max_tensor_bytes`.
    pub max_tensor_bytes: usize,
    /// Each team's share of plugin calls.
    pub team_shares: &'a stages::plugin::TeamShares,
    /// The feature tables, opened.
    pub features: &'a FeatureTables,
    /// Priorities and quotas.
    pub traffic: &'a Arc<TrafficRules>,
}

impl Pipeline {
    /// The pipeline for a model served directly: no stages.
    pub fn direct(
        model: Arc<ServedModel>,
        config: &ModelConfig,
        traffic: &TrafficRules,
        metrics: &Metrics,
        max_tensor_bytes: usize,
    ) -> Result<Arc<Pipeline>> {
        let name = model.name().to_string();
        let quota = config.quota.as_ref().map(|quota| (quota, format!("models.{name}.quota")));
        let admission = traffic
            .admission("model", &name, config.max_in_flight, None, quota, metrics)
            .bounded_by(config.max_queue_wait());
        let cache = config.cache.as_ref().map(|cache| Arc::new(ResponseCache::new(cache, &name, metrics)));
        let examples = config.examples.clone();
        let signatures = model
            .versions()
            .iter()
            .map(|v| Ok((v.version(), EntryPoint::new(v.signature().clone(), examples.as_ref(), v)?)))
            .collect::<Result<_>>()?;
        let name: Arc<str> = name.into();
        let requests = metrics.request_handles(&model.name_label(), &name);
        let pipeline = Arc::new(Pipeline {
            name,
            model: model.clone(),
            admission,
            feature_fetch: None,
            preprocess: None,
            postprocess: None,
            cache,
            signatures: ArcSwap::from_pointee(signatures),
            examples,
            max_tensor_bytes,
            requests,
        });
        model.attach(&pipeline);
        Ok(pipeline)
    }

    /// A configured pipeline, its stages checked against every loaded
    /// version of its model.
    pub fn build(config: &PipelineConfig, model: Arc<ServedModel>, cx: &BuildContext<'_>) -> Result<Arc<Pipeline>> {
        let name = config.name.clone();
        let context = |e: Error| e.context(format_args!("pipeline '{name}'"));
        let served = model.clone();
        let latest = served.latest().map_err(context)?;
        let cache = config.cache.as_ref().map(|cache| Arc::new(ResponseCache::new(cache, &name, cx.metrics)));
        let stage = |role: StageRole, stage_config: &StageConfig| -> Result<StageRunner> {
            let kind = stage_config
                .kind()
                .ok_or_else(|| Error::internal(format!("{}: an unchecked stage config, this is a bug", role.key())))?;
            let place = PluginPlace {
                pipeline: &config.name,
                team: config.team.as_deref(),
                role,
                model: &served,
                shares: cx.team_shares,
                cache: cache.as_ref(),
                canary_key: config.canary_key.as_deref(),
                canary_policy: &cx.traffic.config().canary,
            };
            let built =
                stages::build(kind, latest.signature(), &place, cx.registry).map_err(|e| e.context(role.key()))?;
            let label = format!("the {} stage ({}) of pipeline '{name}'", role.key(), built.name());
            let queue = cx.metrics.queue(&format!("{name}/{}", role.key()));
            Ok(match config.mode {
                Mode::Pipelined => {
                    StageRunner::pipelined(built, label, stage_config.workers, stage_config.queue_capacity, queue)?
                }
                Mode::Sequential => StageRunner::sequential(built, label, queue),
            })
        };
        let mut preprocess = None;
        let mut postprocess = None;
        for (role, stage_config) in config.stages() {
            let runner = stage(role, stage_config).map_err(context)?;
            match role {
                StageRole::Preprocess => preprocess = Some(runner),
                StageRole::Postprocess => postprocess = Some(runner),
            }
        }
        let feature_fetch = config
            .feature_fetch
            .as_ref()
            .map(|fetch| {
                FeatureFetch::build(fetch, &name, cx.features, cx.metrics, cx.traffic.config())
                    .map_err(|e| e.context("feature_fetch"))
            })
            .transpose()
            .map_err(context)?;
        let mut signatures = BTreeMap::new();
        for version in served.versions() {
            let stages = Stages { fetch: feature_fetch.as_ref(), pre: preprocess.as_ref(), post: postprocess.as_ref() };
            let signature = client_signature(&version, &stages).map_err(context)?;
            let owner = format!("pipeline '{name}' ({version})");
            let entry = EntryPoint::new(signature, config.examples.as_ref(), &owner).map_err(context)?;
            signatures.insert(version.version(), entry);
        }
        let quota = config.quota.as_ref().map(|quota| (quota, format!("pipelines.{name}.quota")));
        let max_queue_wait =
            config.max_queue_wait_ms.map_or_else(|| served.config().max_queue_wait(), Duration::from_millis);
        let admission = cx
            .traffic
            .admission("pipeline", &name, config.max_in_flight, config.team.as_deref(), quota, cx.metrics)
            .bounded_by(max_queue_wait);
        let name: Arc<str> = name.into();
        let requests = cx.metrics.request_handles(&served.name_label(), &name);
        let pipeline = Arc::new(Pipeline {
            name,
            model,
            admission,
            feature_fetch,
            preprocess,
            postprocess,
            cache,
            signatures: ArcSwap::from_pointee(signatures),
            examples: config.examples.clone(),
            max_tensor_bytes: cx.max_tensor_bytes,
            requests,
        });
        served.attach(&pipeline);
        Ok(pipeline)
    }

    /// The name clients call.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name clients call, shared.
    pub fn name_label(&self) -> Arc<str> {
        self.name.clone()
    }

    /// Refuses with RESOURCE_EXHAUSTED when the pipeline could admit no
    /// request now, before anything of the request is read
    /// ([`Admission::refuse_if_full`]).
    pub fn refuse_if_full(&self, priority: Priority) -> Result<()> {
        self.admission.refuse_if_full(priority)
    }

    /// True, counting it, when a request of `priority` would be refused
    /// now: the transport's check before it reads a request
    /// ([`Admission::is_full`]).
    pub fn is_full(&self, priority: Priority) -> bool {
        self.admission.is_full(priority)
    }

    /// The most bytes one tensor built for a request may hold.
    pub fn max_tensor_bytes(&self) -> usize {
        self.max_tensor_bytes
    }

    /// Its request counters and latency histograms.
    pub fn request_handles(&self) -> &RequestHandles {
        &self.requests
    }

    /// True when it runs any stage around the model.
    pub fn has_stages(&self) -> bool {
        self.feature_fetch.is_some() || self.preprocess.is_some() || self.postprocess.is_some()
    }

    /// The model behind it.
    pub fn model(&self) -> &Arc<ServedModel> {
        &self.model
    }

    /// What clients send and receive when `version` serves them.
    pub fn signature(&self, version: &ModelVersion) -> Result<Arc<Signature>> {
        self.entry_point(version).map(|entry| entry.signature)
    }

    /// What clients send and receive when `version` serves them, and how
    /// `tf.Example`s fill it.
    pub fn entry_point(&self, version: &ModelVersion) -> Result<EntryPoint> {
        self.signatures.load().get(&version.version()).cloned().ok_or_else(|| {
            Error::internal(format!("pipeline '{}' has no signature for {version}, this is a bug", self.name))
        })
    }

    /// What clients would see with `version` behind this pipeline's
    /// stages: the one check that a new version fits them (and its
    /// `examples` config).
    pub(crate) fn signature_over(&self, version: &ModelVersion) -> Result<EntryPoint> {
        let stages = Stages {
            fetch: self.feature_fetch.as_ref(),
            pre: self.preprocess.as_ref(),
            post: self.postprocess.as_ref(),
        };
        let signature = client_signature(version, &stages)?;
        EntryPoint::new(signature, self.examples.as_ref(), &format!("pipeline '{}' ({version})", self.name))
    }

    /// `version` serves this pipeline from now on, as `signature`.
    pub(crate) fn add_signature(&self, version: i64, signature: EntryPoint) {
        self.signatures.rcu(|map| {
            let mut map = BTreeMap::clone(map);
            map.insert(version, signature.clone());
            map
        });
        self.forget_answers();
    }

    /// Empties the response cache: what answers has changed.
    pub(crate) fn forget_answers(&self) {
        if let Some(cache) = &self.cache {
            cache.clear();
        }
    }

    /// `version` is gone.
    pub(crate) fn remove_signature(&self, version: i64) {
        self.signatures.rcu(|map| {
            let mut map = BTreeMap::clone(map);
            map.remove(&version);
            map
        });
        self.forget_answers();
    }

    /// Runs one validated (and admitted) request's inputs (in
    /// `signature`'s order); the outputs come in its output order.
    async fn predict(
        &self,
        version: &ServedVersion,
        signature: &Signature,
        inputs: Vec<Tensor>,
        deadline: Deadline,
        priority: Priority,
    ) -> Result<Vec<Tensor>> {
        let model = version.signature();
        let inputs = match &self.feature_fetch {
            None => inputs,
            Some(fetch) => {
                let named = name_tensors(&signature.inputs, inputs);
                let all = fetch
                    .run(named, deadline, priority, self.max_tensor_bytes)
                    .instrument(current_step("feature_fetch"))
                    .await?;
                let next = self.preprocess.as_ref().map_or(&model.inputs[..], |pre| pre.stage().inputs());
                order_as(next, all, "the feature fetch stage", version)?
            }
        };
        // Looked up after the fetch: fetched features are part of the key.
        let cache = self.cache.as_ref().filter(|cache| {
            let varies = [&self.preprocess, &self.postprocess].into_iter().flatten().any(|s| s.stage().varies());
            if varies {
                cache.bypass();
            }
            !varies
        });
        let Some(cache) = cache else { return self.infer(version, inputs, deadline, priority).await };
        let generation = cache.generation();
        if let Some(outputs) = cache.get(version.version(), &inputs) {
            return Ok(outputs);
        }
        // Shared buffers, not copies.
        let key = inputs.clone();
        let outputs = self.infer(version, inputs, deadline, priority).await?;
        cache.put(generation, version.version(), key, outputs.clone());
        Ok(outputs)
    }

    /// The stages from preprocess on: preprocess, inference, postprocess.
    async fn infer(
        &self,
        version: &ServedVersion,
        inputs: Vec<Tensor>,
        deadline: Deadline,
        priority: Priority,
    ) -> Result<Vec<Tensor>> {
        let model = version.signature();
        let model_inputs = match &self.preprocess {
            None => inputs,
            Some(stage) => {
                let named = name_tensors(stage.stage().inputs(), inputs);
                let produced = stage
                    .run(named, deadline, priority, self.max_tensor_bytes)
                    .instrument(current_step("preprocess"))
                    .await?;
                order_as(&model.inputs, produced, "the preprocess stage", version)?
            }
        };
        let outputs =
            version.inference().run(model_inputs, deadline, priority).instrument(current_step("inference")).await?;
        match &self.postprocess {
            None => Ok(outputs),
            Some(stage) => {
                let named = name_tensors(&model.outputs, outputs);
                let produced = stage
                    .run(named, deadline, priority, self.max_tensor_bytes)
                    .instrument(current_step("postprocess"))
                    .await?;
                Ok(produced.into_iter().map(|t| t.tensor).collect())
            }
        }
    }
}

/// A pipeline's stages, for [`client_signature`].
struct Stages<'a> {
    fetch: Option<&'a FeatureFetch>,
    pre: Option<&'a StageRunner>,
    post: Option<&'a StageRunner>,
}

/// Checks the stages against one model version and returns what clients
/// see: what the feature fetch and the preprocess stage take (or the
/// model), what the postprocess stage returns (or the model). This is the
/// one check that the stages fit each other and the model; requests rely
/// on it.
fn client_signature(version: &ModelVersion, stages: &Stages<'_>) -> Result<Signature> {
    let model = version.signature();
    let mut signature = model.clone();
    if let Some(pre) = stages.pre {
        for wanted in &model.inputs {
            let given = pre.stage().outputs().iter().find(|o| o.name == wanted.name).ok_or_else(|| {
                Error::invalid_argument(format!(
                    "preprocess ({}) does not produce '{}', an input of {version}",
                    pre.stage().name(),
                    wanted.name
                ))
            })?;
            fits(given, wanted).map_err(|e| e.context(format_args!("preprocess output feeding {version}")))?;
        }
        signature.inputs = pre.stage().inputs().to_vec();
    }
    if let Some(fetch) = stages.fetch {
        signature.inputs = fetch_inputs(fetch, &signature.inputs, stages.pre.map(|pre| pre.stage().name()), version)?;
    }
    if let Some(post) = stages.post {
        for wanted in post.stage().inputs() {
            let given = model.outputs.iter().find(|o| o.name == wanted.name).ok_or_else(|| {
                Error::invalid_argument(format!(
                    "postprocess ({}) reads '{}', which is not an output of {version}",
                    post.stage().name(),
                    wanted.name
                ))
            })?;
            fits(given, wanted).map_err(|e| e.context(format_args!("output of {version} feeding postprocess")))?;
        }
        signature.outputs = post.stage().outputs().to_vec();
    }
    Ok(signature)
}

/// What clients give a pipeline whose feature fetch feeds `next` (the
/// preprocess stage's inputs, or the model's): the lookups' keys, then
/// what `next` takes that no lookup makes. Every fetched tensor must be
/// taken by `next` and fit it.
fn fetch_inputs(
    fetch: &FeatureFetch,
    next: &[TensorSpec],
    pre: Option<&str>,
    version: &ModelVersion,
) -> Result<Vec<TensorSpec>> {
    let next_name = || pre.map_or_else(|| version.to_string(), |name| format!("preprocess ({name})"));
    let made = fetch.outputs();
    for given in &made {
        let wanted = next.iter().find(|w| w.name == given.name).ok_or_else(|| {
            Error::invalid_argument(format!(
                "feature_fetch makes '{}', which {} does not take; it takes {:?}",
                given.name,
                next_name(),
                next.iter().map(|s| s.name.as_str()).collect::<Vec<_>>()
            ))
        })?;
        fits(given, wanted).map_err(|e| e.context(format_args!("feature_fetch output feeding {}", next_name())))?;
    }
    let mut inputs = fetch.key_inputs();
    for key in &inputs {
        if let Some(wanted) = next.iter().find(|w| w.name == key.name) {
            fits(key, wanted).map_err(|e| e.context(format_args!("key input passed on to {}", next_name())))?;
        }
    }
    for wanted in next {
        if !made.iter().any(|m| m.name == wanted.name) && !inputs.iter().any(|i| i.name == wanted.name) {
            inputs.push(wanted.clone());
        }
    }
    Ok(inputs)
}

fn name_tensors(specs: &[TensorSpec], tensors: Vec<Tensor>) -> Vec<NamedTensor> {
    specs.iter().zip(tensors).map(|(spec, tensor)| NamedTensor::new(spec.name.clone(), tensor)).collect()
}

/// Orders a stage's outputs as the next one's inputs, leaving out what it
/// does not take. The stage's declared outputs were checked to fit the
/// next when the pipeline was built, and what it returned was checked
/// against its declaration (by the plugin host for plugins), so only the
/// order changes here.
fn order_as(
    specs: &[TensorSpec],
    mut tensors: Vec<NamedTensor>,
    stage: &str,
    version: &ModelVersion,
) -> Result<Vec<Tensor>> {
    let mut ordered = Vec::with_capacity(specs.len());
    for spec in specs {
        let at = tensors
            .iter()
            .position(|t| t.name == spec.name)
            .ok_or_else(|| Error::internal(format!("{stage} did not produce '{}' for {version}", spec.name)))?;
        ordered.push(tensors.swap_remove(at).tensor);
    }
    Ok(ordered)
}

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
            manager.reconcile(&model, true).await?;
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
        let mut failed = BTreeMap::new();
        let mut used_by: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for pipeline in &config.pipelines {
            used_by.entry(pipeline.model.clone()).or_default().push(pipeline.name.clone());
            let served = models.get(&pipeline.model).cloned().ok_or_else(|| {
                Error::not_found(format!("pipeline '{}': model '{}' is not served", pipeline.name, pipeline.model))
            })?;
            match Pipeline::build(pipeline, served, cx) {
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
        self.pipelines.load().get(name).map(|pipeline| pipeline.admission.refuse_late()).is_some()
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

    /// Re-reads every model's repository: new versions in the policy are
    /// loaded and served, versions that left it are drained and unloaded.
    /// Failures are recorded in each version's status; serving goes on.
    pub async fn poll(&self) {
        let _one_change = self.manager.exclusive().await;
        for model in self.models() {
            if let Err(error) = self.manager.reconcile(&model, false).await {
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
                        self.manager.reconcile(&model, true).await.inspect_err(|_| self.discard(&model))?;
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
                Ok(()) => self.manager.reconcile(model, true).await,
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
                for version in model.versions() {
                    self.manager.retire(&model, version.version());
                }
            }
        }
        self.pipelines.store(Arc::new(pipelines));
        self.models.store(Arc::new(models));
        tracing::info!(added = ?outcome.added, removed = ?outcome.removed, kept = ?outcome.kept, "model config reloaded");
        Ok(outcome)
    }

    /// Unloads a model a failed reload loaded but never served.
    fn discard(&self, model: &Arc<ServedModel>) {
        for version in model.versions() {
            self.manager.retire(model, version.version());
        }
    }

    /// Puts a kept model back as it was before a failed reload: its
    /// config, and its versions and labels as that config wants them.
    async fn restore(&self, model: &Arc<ServedModel>, previous: Arc<ModelConfig>) {
        if let Err(error) = model.set_config(ModelConfig::clone(&previous)) {
            tracing::error!(model = model.name(), %error, "cannot restore the request log after a failed reload");
        }
        if let Err(error) = self.manager.reconcile(model, false).await {
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
