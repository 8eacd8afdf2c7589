//! The path of a request from admission to the answer.
//!
//! Every name a client can call is a [`Pipeline`]: admission (a bounded
//! number of requests in flight), an optional preprocess stage, inference
//! on the model version the request resolved to (through the version's
//! [`batcher`] when batching is on), and an optional postprocess stage. A
//! model served without a configured pipeline gets one with no stages.
//!
//! In `pipelined` mode each stage has its own bounded queue and worker
//! threads, so while one request is in inference the next is already being
//! preprocessed; in `sequential` mode the same stages run one after another
//! in the caller's task. Every queue is bounded: a full one refuses the
//! request at once with RESOURCE_EXHAUSTED naming it, and a request whose
//! deadline has passed is dropped before it reaches the model.

pub mod admission;
pub mod batcher;
pub mod batching;
pub mod builtin;
pub mod deadline;
pub mod stage;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;

use self::admission::Admission;
use self::deadline::Deadline;
use self::stage::{Stage, StageRunner};
use crate::api::metrics::{Metrics, RequestHandles};
use crate::config::{Config, PipelineConfig, StageConfig};
use crate::error::{Error, Result};
use crate::infer::{check_tensor, Signature, TensorSpec};
use crate::models::{ModelRegistry, ModelVersion, ServedModel};
use crate::plugin::registry::PluginRegistry;
use crate::plugin::{PluginStage, PluginsConfig, World};
use crate::tensor::{format_shape, NamedTensor, Tensor};

/// How a pipeline runs its stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Each stage on its own queue and threads; stages of different
    /// requests overlap.
    #[default]
    Pipelined,
    /// The stages one after another in the caller's task: the baseline the
    /// gain of pipelining is measured against.
    Sequential,
}

/// One name clients call, and what runs behind it.
pub struct Pipeline {
    // Shared, not copied, into every request's metric labels.
    name: Arc<str>,
    model: Arc<ServedModel>,
    admission: Admission,
    preprocess: Option<StageRunner>,
    postprocess: Option<StageRunner>,
    /// What clients see for each model version: the first stage's inputs
    /// (or the model's) and the last stage's outputs (or the model's).
    signatures: BTreeMap<i64, Signature>,
    /// Request counts and latencies, resolved once.
    requests: RequestHandles,
}

impl Pipeline {
    /// The pipeline for a model served directly: no stages.
    pub fn direct(model: Arc<ServedModel>, max_in_flight: usize, metrics: &Metrics) -> Pipeline {
        let name = model.name().to_string();
        let queue = metrics.queue(&format!("{name}/admission"));
        let admission =
            Admission::new(format!("the request queue of model '{name}'"), max_in_flight, queue.full, queue.depth);
        let signatures = model.versions().map(|v| (v.version(), v.signature().clone())).collect();
        let name: Arc<str> = name.into();
        let requests = metrics.request_handles(&model.name_label(), &name);
        Pipeline { name, model, admission, preprocess: None, postprocess: None, signatures, requests }
    }

    /// A configured pipeline, its stages checked against every loaded
    /// version of its model.
    pub fn build(config: &PipelineConfig, model: Arc<ServedModel>, stages: &StageContext<'_>) -> Result<Pipeline> {
        let metrics = stages.metrics;
        let name = config.name.clone();
        let context = |e: Error| e.context(format_args!("pipeline '{name}'"));
        let latest = model.latest().map_err(context)?.clone();
        let runner = |role: &str, stage_config: &StageConfig, stage: Arc<dyn Stage>| -> Result<StageRunner> {
            let label = format!("the {role} stage ({}) of pipeline '{name}'", stage.name());
            let queue = metrics.queue(&format!("{name}/{role}"));
            Ok(match config.mode {
                Mode::Pipelined => {
                    StageRunner::pipelined(stage, label, stage_config.workers, stage_config.queue_capacity, queue)?
                }
                Mode::Sequential => StageRunner::sequential(stage, label, queue),
            })
        };
        let preprocess = match &config.preprocess {
            None => None,
            Some(c) => {
                let stage = stages.preprocess(config, c, &model, latest.signature()).map_err(context)?;
                Some(runner("preprocess", c, stage)?)
            }
        };
        let postprocess = match &config.postprocess {
            None => None,
            Some(c) => {
                let stage = stages.postprocess(config, c, &model, latest.signature()).map_err(context)?;
                Some(runner("postprocess", c, stage)?)
            }
        };
        let mut signatures = BTreeMap::new();
        for version in model.versions() {
            let signature = client_signature(version, preprocess.as_ref(), postprocess.as_ref()).map_err(context)?;
            signatures.insert(version.version(), signature);
        }
        let queue = metrics.queue(&format!("{name}/admission"));
        let admission = Admission::new(
            format!("the request queue of pipeline '{name}'"),
            config.max_in_flight,
            queue.full,
            queue.depth,
        );
        let name: Arc<str> = name.into();
        let requests = metrics.request_handles(&model.name_label(), &name);
        Ok(Pipeline { name, model, admission, preprocess, postprocess, signatures, requests })
    }

    /// The name clients call.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name clients call, shared.
    pub fn name_label(&self) -> Arc<str> {
        self.name.clone()
    }

    /// Its request counters and latency histograms.
    pub fn request_handles(&self) -> &RequestHandles {
        &self.requests
    }

    /// True when it runs any stage around the model.
    pub fn has_stages(&self) -> bool {
        self.preprocess.is_some() || self.postprocess.is_some()
    }

    /// The model behind it.
    pub fn model(&self) -> &Arc<ServedModel> {
        &self.model
    }

    /// What clients send and receive when `version` serves them.
    pub fn signature(&self, version: &ModelVersion) -> Result<&Signature> {
        self.signatures.get(&version.version()).ok_or_else(|| {
            Error::internal(format!("pipeline '{}' has no signature for {version}, this is a bug", self.name))
        })
    }

    /// Runs one request, whose inputs were validated against
    /// [`Pipeline::signature`] and come in its order; the outputs come in
    /// its output order.
    pub async fn predict(
        &self,
        version: &ModelVersion,
        inputs: Vec<Tensor>,
        deadline: Deadline,
    ) -> Result<Vec<Tensor>> {
        let _permit = self.admission.try_admit()?;
        let signature = self.signature(version)?;
        let model_inputs = match &self.preprocess {
            None => inputs,
            Some(stage) => {
                let named = name_tensors(&signature.inputs, inputs);
                let produced = stage.run(named, deadline).await?;
                bind_named(&version.signature().inputs, produced, version)?
            }
        };
        let outputs = version.infer(model_inputs, deadline).await?;
        match &self.postprocess {
            None => Ok(outputs),
            Some(stage) => {
                let named = name_tensors(&version.signature().outputs, outputs);
                let produced = stage.run(named, deadline).await?;
                Ok(produced.into_iter().map(|t| t.tensor).collect())
            }
        }
    }
}

/// What building stages needs besides their own config: the plugin
/// settings and engine (when any pipeline uses a plugin) and the metrics.
pub struct StageContext<'a> {
    /// `[plugins]`.
    pub plugins: &'a PluginsConfig,
    /// The engine plugins run on; `None` when no pipeline uses one.
    pub registry: Option<&'a Arc<PluginRegistry>>,
    /// Where plugins report their calls.
    pub metrics: &'a Metrics,
}

impl StageContext<'_> {
    /// Loads plugin `name` for a stage of `pipeline` that needs a plugin of
    /// `world`: the active uploaded version, else `NAME.wasm`. Each stage
    /// gets its own instance of the plugin, so warm instances are never
    /// shared between pipelines; the registry keeps the stage, to swap it
    /// when another version is activated.
    fn plugin(
        &self,
        name: &str,
        world: World,
        pipeline: &PipelineConfig,
        model: &Arc<ServedModel>,
    ) -> Result<Arc<dyn Stage>> {
        let registry = self
            .registry
            .ok_or_else(|| Error::internal("a plugin stage was built without a plugin registry, this is a bug"))?;
        let bytes = registry.initial_bytes(name)?;
        let plugin = registry.load(name, &bytes).map_err(|e| e.context(format_args!("plugin '{name}'")))?;
        if plugin.world() != world {
            return Err(Error::invalid_argument(format!(
                "plugin '{name}' ({}) is a {}, but this stage needs a {world}",
                plugin.label(),
                plugin.world()
            )));
        }
        let stage = Arc::new(PluginStage::new(name, Arc::new(plugin)));
        registry.bind(name, &pipeline.name, pipeline.team.as_deref(), world, stage.clone(), model.clone())?;
        Ok(stage)
    }

    fn preprocess(
        &self,
        pipeline: &PipelineConfig,
        config: &StageConfig,
        model: &Arc<ServedModel>,
        signature: &Signature,
    ) -> Result<Arc<dyn Stage>> {
        match (&config.image_normalize, &config.plugin) {
            (Some(c), None) => Ok(Arc::new(builtin::ImageNormalize::new(c, signature)?)),
            (None, Some(name)) => self.plugin(name, World::Preprocessor, pipeline, model),
            _ => Err(Error::invalid_argument("preprocess: set exactly one of: image_normalize, plugin")),
        }
    }

    fn postprocess(
        &self,
        pipeline: &PipelineConfig,
        config: &StageConfig,
        model: &Arc<ServedModel>,
        signature: &Signature,
    ) -> Result<Arc<dyn Stage>> {
        match (&config.softmax, &config.argmax, &config.top_k, &config.plugin) {
            (Some(c), None, None, None) => Ok(Arc::new(builtin::Softmax::new(c, signature)?)),
            (None, Some(c), None, None) => Ok(Arc::new(builtin::Argmax::new(c, signature)?)),
            (None, None, Some(c), None) => Ok(Arc::new(builtin::TopK::new(c, signature)?)),
            (None, None, None, Some(name)) => self.plugin(name, World::Postprocessor, pipeline, model),
            _ => Err(Error::invalid_argument("postprocess: set exactly one of: softmax, argmax, top_k, plugin")),
        }
    }
}

/// Checks the stages against one model version and returns what clients
/// see: what the preprocess stage takes (or the model), what the
/// postprocess stage returns (or the model).
fn client_signature(
    version: &ModelVersion,
    preprocess: Option<&StageRunner>,
    postprocess: Option<&StageRunner>,
) -> Result<Signature> {
    let model = version.signature();
    let mut signature = model.clone();
    if let Some(pre) = preprocess {
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
    if let Some(post) = postprocess {
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

/// A producer's declared tensor fits a consumer's: the same dtype and rank,
/// and dimensions equal wherever both are fixed.
pub fn fits(given: &TensorSpec, wanted: &TensorSpec) -> Result<()> {
    let dims_fit = given.shape.len() == wanted.shape.len()
        && given.shape.iter().zip(&wanted.shape).all(|(&g, &w)| g < 0 || w < 0 || g == w);
    if given.dtype != wanted.dtype || !dims_fit {
        return Err(Error::invalid_argument(format!(
            "'{}' is {} {}, but {} {} is expected",
            wanted.name,
            given.dtype,
            format_shape(&given.shape),
            wanted.dtype,
            format_shape(&wanted.shape)
        )));
    }
    Ok(())
}

fn name_tensors(specs: &[TensorSpec], tensors: Vec<Tensor>) -> Vec<NamedTensor> {
    specs.iter().zip(tensors).map(|(spec, tensor)| NamedTensor::new(spec.name.clone(), tensor)).collect()
}

/// Orders a stage's named outputs as `specs` and checks each against its
/// spec before it reaches the model.
fn bind_named(specs: &[TensorSpec], mut tensors: Vec<NamedTensor>, version: &ModelVersion) -> Result<Vec<Tensor>> {
    let mut bound = Vec::with_capacity(specs.len());
    for spec in specs {
        let at = tensors.iter().position(|t| t.name == spec.name).ok_or_else(|| {
            Error::internal(format!("the preprocess stage did not produce '{}' for {version}", spec.name))
        })?;
        let tensor = tensors.swap_remove(at).tensor;
        check_tensor(version, "input", spec, &tensor).map_err(|e| Error::internal(e.message().to_string()))?;
        bound.push(tensor);
    }
    Ok(bound)
}

/// Every name clients can call: configured pipelines, and each model that
/// no pipeline of the same name replaces.
pub struct Endpoints {
    registry: Arc<ModelRegistry>,
    pipelines: BTreeMap<String, Arc<Pipeline>>,
}

impl Endpoints {
    /// Builds the pipelines of `config` over the loaded models.
    pub fn build(config: &Config, registry: Arc<ModelRegistry>, stages: &StageContext<'_>) -> Result<Endpoints> {
        let metrics = stages.metrics;
        let mut pipelines = BTreeMap::new();
        for model in &config.models {
            let served = registry.get(&model.name)?.clone();
            pipelines.insert(model.name.clone(), Arc::new(Pipeline::direct(served, model.max_in_flight, metrics)));
        }
        for pipeline in &config.pipelines {
            let served = registry.get(&pipeline.model)?.clone();
            pipelines.insert(pipeline.name.clone(), Arc::new(Pipeline::build(pipeline, served, stages)?));
        }
        Ok(Endpoints { registry, pipelines })
    }

    /// The pipeline called `name`.
    pub fn get(&self, name: &str) -> Result<&Arc<Pipeline>> {
        self.pipelines.get(name).ok_or_else(|| {
            let names: Vec<&str> = self.pipelines.keys().map(String::as_str).collect();
            Error::not_found(format!("model '{name}' is not served; served: [{}]", names.join(", ")))
        })
    }

    /// Every endpoint.
    pub fn all(&self) -> impl Iterator<Item = &Arc<Pipeline>> {
        self.pipelines.values()
    }

    /// The loaded models.
    pub fn registry(&self) -> &Arc<ModelRegistry> {
        &self.registry
    }
}
