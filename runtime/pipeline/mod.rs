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
//!
//! This file is the request path; fitting the stages to each model
//! version at build is `fitting.rs`, and the registry of every name with
//! its reload is `endpoints.rs`.

pub mod admission;
pub mod batcher;
pub mod cache;
pub mod deadline;
mod endpoints;
pub mod fetch;
mod fitting;
pub mod graph;
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
pub use self::endpoints::{status_of, Endpoints, ReloadOutcome};
use self::fetch::FeatureFetch;
pub use self::fitting::EntryPoint;
use self::fitting::{client_signature, Stages};
use self::priority::Priority;
pub use self::request::{RequestBuilder, Target, ValidRequest};
pub use self::served::{ServedModel, ServedVersion};
use self::stage::StageRunner;
use self::stages::plugin::PluginPlace;
use self::trace::current_step;
use crate::config::{ExamplesConfig, Mode, ModelConfig, PipelineConfig, StageConfig, StageRole};
use crate::error::{Error, Result};
use crate::feature::FeatureTables;
use crate::metrics::{Metrics, RequestHandles};
use crate::models::ModelVersion;
use crate::plugin::registry::PluginRegistry;
use crate::tensor::spec::{Signature, TensorSpec};
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
    /// A graph of steps in place of the stages and the one model.
    graph: Option<graph::Graph>,
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
    /// `server.inline_inference_micros`: a graph's built-in steps measured
    /// cheaper than this run in the request's task, as cheap model runs do.
    pub inline_budget: Duration,
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
            graph: None,
            cache,
            signatures: ArcSwap::from_pointee(signatures),
            examples,
            max_tensor_bytes,
            requests,
        });
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
                step: None,
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
        let feature_fetch = configured_fetch(config, cx).map_err(context)?;
        let mut signatures = BTreeMap::new();
        for version in served.versions() {
            let stages = Stages { fetch: feature_fetch.as_ref(), pre: preprocess.as_ref(), post: postprocess.as_ref() };
            let signature = client_signature(&version, &stages).map_err(context)?;
            let owner = format!("pipeline '{name}' ({version})");
            let entry = EntryPoint::new(signature, config.examples.as_ref(), &owner).map_err(context)?;
            signatures.insert(version.version(), entry);
        }
        let admission = configured_admission(config, &served, cx);
        let name: Arc<str> = name.into();
        let requests = cx.metrics.request_handles(&served.name_label(), &name);
        let pipeline = Arc::new(Pipeline {
            name,
            model,
            admission,
            feature_fetch,
            preprocess,
            postprocess,
            graph: None,
            cache,
            signatures: ArcSwap::from_pointee(signatures),
            examples: config.examples.clone(),
            max_tensor_bytes: cx.max_tensor_bytes,
            requests,
        });
        Ok(pipeline)
    }

    /// A pipeline that is a graph of steps: `model` (its `model` key) is
    /// the one whose versions clients choose; `models` are every model
    /// served, its steps' among them, and `direct` the pipeline serving
    /// each under its own name, whose admission its steps take a place in.
    pub fn graph(
        config: &PipelineConfig,
        model: Arc<ServedModel>,
        models: &BTreeMap<String, Arc<ServedModel>>,
        direct: &BTreeMap<String, Arc<Pipeline>>,
        cx: &BuildContext<'_>,
    ) -> Result<Arc<Pipeline>> {
        let name = config.name.clone();
        let context = |e: Error| e.context(format_args!("pipeline '{name}'"));
        let fetch = configured_fetch(config, cx).map_err(context)?;
        let graph = graph::Graph::build(config, models, direct, fetch, cx).map_err(context)?;
        // Every loaded version of every model a step runs: a label or a
        // policy may route a step to any of them.
        for name in config.models().collect::<std::collections::BTreeSet<_>>() {
            for version in models.get(name).map(|m| m.versions()).unwrap_or_default() {
                graph.fits(&version).map_err(context)?;
            }
        }
        let mut signatures = BTreeMap::new();
        for version in model.versions() {
            let owner = format!("pipeline '{name}' ({version})");
            let entry =
                EntryPoint::new(graph.signature().clone(), config.examples.as_ref(), &owner).map_err(context)?;
            signatures.insert(version.version(), entry);
        }
        let cache = config.cache.as_ref().map(|cache| Arc::new(ResponseCache::new(cache, &name, cx.metrics)));
        let admission = configured_admission(config, &model, cx);
        let name: Arc<str> = name.into();
        let requests = cx.metrics.request_handles(&model.name_label(), &name);
        Ok(Arc::new(Pipeline {
            name,
            model,
            admission,
            feature_fetch: None,
            preprocess: None,
            postprocess: None,
            graph: Some(graph),
            cache,
            signatures: ArcSwap::from_pointee(signatures),
            examples: config.examples.clone(),
            max_tensor_bytes: cx.max_tensor_bytes,
            requests,
        }))
    }

    /// True when it is a graph of steps.
    pub fn is_graph(&self) -> bool {
        self.graph.is_some()
    }

    /// True when it runs `model`: its own, or a step's.
    pub fn runs(&self, model: &Arc<ServedModel>) -> bool {
        Arc::ptr_eq(&self.model, model) || self.graph.as_ref().is_some_and(|graph| graph.runs(model))
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

    /// Counts a call the transport refused unread because it waited too
    /// long to be read ([`Admission::refuse_late`]).
    pub fn refuse_late(&self) {
        self.admission.refuse_late();
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
        self.feature_fetch.is_some() || self.preprocess.is_some() || self.postprocess.is_some() || self.graph.is_some()
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
    /// `examples` config). `None` for a version of another model a graph
    /// step runs: it is checked, but clients choose only the pipeline's
    /// own model's versions.
    pub(crate) fn signature_over(&self, version: &ModelVersion) -> Result<Option<EntryPoint>> {
        if let Some(graph) = &self.graph {
            graph.fits(version)?;
            if version.model() != self.model.name() {
                return Ok(None);
            }
            let owner = format!("pipeline '{}' ({version})", self.name);
            return EntryPoint::new(graph.signature().clone(), self.examples.as_ref(), &owner).map(Some);
        }
        let stages = Stages {
            fetch: self.feature_fetch.as_ref(),
            pre: self.preprocess.as_ref(),
            post: self.postprocess.as_ref(),
        };
        let signature = client_signature(version, &stages)?;
        EntryPoint::new(signature, self.examples.as_ref(), &format!("pipeline '{}' ({version})", self.name)).map(Some)
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

    /// `version` of `model` is gone (a graph's other models' versions
    /// were never the pipeline's).
    pub(crate) fn remove_signature(&self, model: &str, version: i64) {
        if model != self.model.name() {
            // A graph step's model: its requests go to another version now.
            self.forget_answers();
            return;
        }
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
        version: &Arc<ServedVersion>,
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
            let varies = [&self.preprocess, &self.postprocess].into_iter().flatten().any(|s| s.stage().varies())
                || self.graph.as_ref().is_some_and(graph::Graph::varies);
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
        version: &Arc<ServedVersion>,
        inputs: Vec<Tensor>,
        deadline: Deadline,
        priority: Priority,
    ) -> Result<Vec<Tensor>> {
        if let Some(graph) = &self.graph {
            return graph.run(version, inputs, deadline, priority, &self.name).await;
        }
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
        let outputs = version
            .inference()
            .run(model_inputs, deadline, priority, &self.name)
            .instrument(current_step("inference"))
            .await?;
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

/// A configured pipeline's feature fetch, when it has one.
fn configured_fetch(config: &PipelineConfig, cx: &BuildContext<'_>) -> Result<Option<FeatureFetch>> {
    config
        .feature_fetch
        .as_ref()
        .map(|fetch| {
            FeatureFetch::build(fetch, &config.name, cx.features, cx.metrics, cx.traffic.config())
                .map_err(|e| e.context("feature_fetch"))
        })
        .transpose()
}

/// A configured pipeline's admission over `model`: its places, team and
/// quota, bounded by its `max_queue_wait_ms` (else the model's).
fn configured_admission(config: &PipelineConfig, model: &ServedModel, cx: &BuildContext<'_>) -> Admission {
    let name = &config.name;
    let quota = config.quota.as_ref().map(|quota| (quota, format!("pipelines.{name}.quota")));
    let max_queue_wait =
        config.max_queue_wait_ms.map_or_else(|| model.config().max_queue_wait(), Duration::from_millis);
    cx.traffic
        .admission("pipeline", name, config.max_in_flight, config.team.as_deref(), quota, cx.metrics)
        .bounded_by(max_queue_wait)
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
