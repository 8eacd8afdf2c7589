//! A pipeline that is a graph of steps: models, built-in transforms and
//! plugins over named tensors, each step running as soon as what it reads
//! is there, independent steps at once.
//!
//! Built once per pipeline ([`Graph::build`]): the steps in an order where
//! every step comes after what it reads (the config check refused cycles),
//! each step's reads and writes fitted by dtype and shape to what makes and
//! takes them, and every tensor given a slot. A request then fills a table
//! of slots ([`Graph::run`]): the client's inputs first, then each step's
//! outputs as it finishes.
//!
//! A model step goes through the model version's own inference stage, the
//! one its direct callers and every other pipeline use, so its batches
//! hold rows of all of them. The pipeline's own model (its `model` key) is
//! the one whose version the request chose; another model step runs its
//! configured version or label, or the model's latest, resolved per
//! request and held until the step ends, so a hot swap drains it like any
//! request. A step with a condition (`when`/`unless`) runs only when its
//! tensor says so, and a step left without what it reads is skipped too:
//! a branch not taken runs nothing.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use futures::stream::{FuturesUnordered, StreamExt};
use tracing::Instrument;

use super::deadline::Deadline;
use super::fetch::{FeatureFetch, FELL_BACK};
use super::priority::Priority;
use super::served::{ServedModel, ServedVersion};
use super::stage::StageRunner;
use super::stages::{self, plugin::PluginPlace};
use super::trace::current_step;
use super::BuildContext;
use crate::config::{Mode, ModelStep, PipelineConfig, StageKind, StepAction, StepConfig};
use crate::error::{Error, Result};
use crate::metrics::StepMetrics;
use crate::models::{ModelVersion, VersionChoice};
use crate::tensor::spec::{check_tensor, fits, Signature, TensorSpec};
use crate::tensor::{DType, NamedTensor, Tensor};

/// Which version of its model a model step runs.
#[derive(Debug, Clone, PartialEq)]
enum StepVersion {
    /// The version the request chose: the pipeline's own model.
    Chosen,
    /// The model's latest.
    Latest,
    /// A version number.
    Number(i64),
    /// A version label.
    Label(String),
}

impl StepVersion {
    fn choice(&self) -> VersionChoice<'_> {
        match self {
            StepVersion::Chosen | StepVersion::Latest => VersionChoice::Latest,
            StepVersion::Number(n) => VersionChoice::Number(*n),
            StepVersion::Label(label) => VersionChoice::Label(label),
        }
    }
}

/// What a step runs.
enum StepRun {
    /// `direct` is the model served under its own name: its admission
    /// (`max_in_flight`, priorities, quotas) bounds the model's work from
    /// graphs as from its direct callers.
    Model {
        model: Arc<ServedModel>,
        version: StepVersion,
        direct: Option<Arc<super::Pipeline>>,
    },
    Stage(StageRunner),
}

/// One step, wired to the graph's slots.
struct Step {
    name: Arc<str>,
    run: StepRun,
    /// Its input names, each with the slot it reads and what the graph
    /// gives there (for checking later versions of a model step).
    reads: Vec<(String, usize, TensorSpec)>,
    /// Its output names, each with the slot it writes and what readers of
    /// that slot were fitted to.
    writes: Vec<(String, usize, TensorSpec)>,
    /// The slot it waits on and the value it must have.
    condition: Option<(usize, bool)>,
    metrics: StepMetrics,
}

/// A graph pipeline's steps and tensors.
pub struct Graph {
    pipeline: Arc<str>,
    /// Every tensor's name, by slot; the client's inputs first.
    tensors: Vec<Arc<str>>,
    /// The steps that write each slot (none for inputs and fetched ones).
    writers: Vec<Vec<usize>>,
    /// Features fetched first, by the keys among the inputs: the fetch,
    /// the slots of what it makes, and the slot telling it fell back.
    fetch: Option<(FeatureFetch, Vec<usize>, usize)>,
    steps: Vec<Step>,
    /// The slots answered, in answer order.
    outputs: Vec<usize>,
    /// What each slot's readers take (a step's input, or the answer's
    /// output), by who reads it: what a new version of the model that
    /// makes it must fit.
    wanted: Vec<Vec<(String, TensorSpec)>>,
    /// What clients send and receive.
    signature: Signature,
    max_tensor_bytes: usize,
}

/// A slot's state during one request.
#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Waiting,
    Running,
    Done,
    Skipped,
}

/// Names the model step whose input failed a check, lazily (messages only).
struct StepOwner<'a> {
    step: &'a str,
    version: &'a ServedVersion,
}

impl fmt::Display for StepOwner<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "step '{}' ({})", self.step, self.version)
    }
}

impl Graph {
    /// Builds the graph of `config` over the served `models`, fitted to
    /// the latest version of each; `fetch` is the pipeline's feature
    /// fetch, already built; `direct` the pipelines serving each model
    /// under its own name.
    pub fn build(
        config: &PipelineConfig,
        models: &BTreeMap<String, Arc<ServedModel>>,
        direct: &BTreeMap<String, Arc<super::Pipeline>>,
        fetch: Option<FeatureFetch>,
        cx: &BuildContext<'_>,
    ) -> Result<Graph> {
        let pipeline: Arc<str> = config.name.as_str().into();
        let lead = models
            .get(&config.model)
            .ok_or_else(|| Error::internal(format!("model '{}' is not loaded, this is a bug", config.model)))?;
        let served = |step: &ModelStep| -> Result<Arc<ServedVersion>> {
            let model = models
                .get(&step.model)
                .ok_or_else(|| Error::internal(format!("model '{}' is not loaded, this is a bug", step.model)))?;
            model.resolve(step_version(step, &config.model).choice())
        };
        let plan = plan(
            config,
            fetch.as_ref().map(|f| (f.key_inputs(), fetched_tensors(f))),
            &mut |step| served(step).map(|v| v.signature().clone()),
            &mut |step, kind, reads| {
                let place = PluginPlace {
                    pipeline: &config.name,
                    team: config.team.as_deref(),
                    role: crate::config::StageRole::Preprocess,
                    model: lead,
                    step: Some(&step.name),
                    shares: cx.team_shares,
                    cache: None,
                    canary_key: config.canary_key.as_deref(),
                    canary_policy: &cx.traffic.config().canary,
                };
                let given = Signature { inputs: Vec::new(), outputs: reads };
                let stage = stages::build(kind, &given, &place, cx.registry)?;
                let label = format!("step '{}' ({}) of pipeline '{}'", step.name, stage.name(), config.name);
                let queue = cx.metrics.queue(&format!("{}/{}", config.name, step.name));
                let (workers, capacity) = step.stage().map_or((1, 1), |s| (s.workers, s.queue_capacity));
                let runner = match config.mode {
                    // A built-in measured cheap runs in the request's task:
                    // the hand-off to a worker would cost more than it.
                    Mode::Pipelined if !matches!(kind, StageKind::Plugin(_)) => {
                        StageRunner::pipelined(stage.clone(), label, workers, capacity, queue)?
                            .inline_when_cheap(cx.inline_budget)
                    }
                    Mode::Pipelined => StageRunner::pipelined(stage.clone(), label, workers, capacity, queue)?,
                    Mode::Sequential => StageRunner::sequential(stage.clone(), label, queue),
                };
                Ok((runner, stage.inputs().to_vec(), stage.outputs().to_vec()))
            },
        )?;
        // Slots: the client's inputs first, in the order it lists them.
        let mut tensors: Vec<Arc<str>> = plan.inputs.iter().map(|s| Arc::from(s.name.as_str())).collect();
        let mut slot_of: HashMap<String, usize> = tensors.iter().enumerate().map(|(i, n)| (n.to_string(), i)).collect();
        let mut slot = |name: &str, tensors: &mut Vec<Arc<str>>| -> usize {
            *slot_of.entry(name.to_string()).or_insert_with(|| {
                tensors.push(Arc::from(name));
                tensors.len() - 1
            })
        };
        let fetch = fetch.map(|fetch| {
            let slots = fetch.outputs().iter().map(|made| slot(&made.name, &mut tensors)).collect();
            let fell_back = slot(FELL_BACK, &mut tensors);
            (fetch, slots, fell_back)
        });
        let mut steps = Vec::with_capacity(config.steps.len());
        let mut wanted_at: Vec<(usize, String, TensorSpec)> = Vec::new();
        for (step, fitted) in config.steps.iter().zip(plan.steps) {
            for ((local, _), wanted) in fitted.reads.iter().zip(&fitted.wanted) {
                let at = slot(step.input_source(local), &mut tensors);
                wanted_at.push((at, format!("step '{}'", step.name), wanted.clone()));
            }
            let run = match (&step.action, fitted.stage) {
                (StepAction::Model(model_step), _) => {
                    let model = models.get(&model_step.model).cloned().ok_or_else(|| {
                        Error::internal(format!("model '{}' is not loaded, this is a bug", model_step.model))
                    })?;
                    let direct = direct.get(&model_step.model).cloned();
                    StepRun::Model { model, version: step_version(model_step, &config.model), direct }
                }
                (StepAction::Stage(_), Some(runner)) => StepRun::Stage(runner),
                (StepAction::Stage(_), None) => {
                    return Err(Error::internal("a stage step was not built, this is a bug"))
                }
            };
            let reads = fitted
                .reads
                .into_iter()
                .map(|(local, spec)| {
                    let at = slot(step.input_source(&local), &mut tensors);
                    (local, at, spec)
                })
                .collect();
            let writes = fitted
                .writes
                .into_iter()
                .map(|(local, spec)| {
                    let at = slot(&spec.name, &mut tensors);
                    (local, at, spec)
                })
                .collect();
            let condition = step.condition().map(|(tensor, want)| (slot(tensor, &mut tensors), want));
            steps.push(Step {
                name: step.name.as_str().into(),
                run,
                reads,
                writes,
                condition,
                metrics: cx.metrics.graph_step(&config.name, &step.name),
            });
        }
        let outputs: Vec<usize> = plan.outputs.iter().map(|spec| slot(&spec.name, &mut tensors)).collect();
        for (at, spec) in outputs.iter().zip(&plan.outputs) {
            wanted_at.push((*at, "the pipeline's answer".to_string(), spec.clone()));
        }
        let mut wanted = vec![Vec::new(); tensors.len()];
        for (at, reader, spec) in wanted_at {
            wanted[at].push((reader, spec));
        }
        let mut writers = vec![Vec::new(); tensors.len()];
        for (index, step) in steps.iter().enumerate() {
            for (_, at, _) in &step.writes {
                writers[*at].push(index);
            }
        }
        Ok(Graph {
            pipeline,
            tensors,
            writers,
            fetch,
            steps,
            outputs,
            wanted,
            signature: Signature { inputs: plan.inputs, outputs: plan.outputs },
            max_tensor_bytes: cx.max_tensor_bytes,
        })
    }

    /// What clients send and receive.
    pub fn signature(&self) -> &Signature {
        &self.signature
    }

    /// True when a step runs `model`.
    pub fn runs(&self, model: &Arc<ServedModel>) -> bool {
        self.steps.iter().any(|step| matches!(&step.run, StepRun::Model { model: m, .. } if Arc::ptr_eq(m, model)))
    }

    /// True while a step may give different answers to the same inputs
    /// (a plugin canary): a response cache must not keep them.
    pub fn varies(&self) -> bool {
        self.steps.iter().any(|step| matches!(&step.run, StepRun::Stage(runner) if runner.stage().varies()))
    }

    /// Checks that `version` (of a model some step runs) fits every step
    /// that runs its model: it takes what the graph gives the step, and
    /// makes what the step's readers were fitted to. The one check a new
    /// version of any model of the graph passes before it serves.
    pub fn fits(&self, version: &ModelVersion) -> Result<()> {
        for step in &self.steps {
            let StepRun::Model { model, version: runs, .. } = &step.run else { continue };
            // A step pinned to another number never runs this version.
            let pinned_elsewhere = matches!(runs, StepVersion::Number(n) if *n != version.version());
            if model.name() != version.model() || pinned_elsewhere {
                continue;
            }
            let signature = version.signature();
            let context = |e: Error| e.context(format_args!("step '{}' of pipeline '{}'", step.name, self.pipeline));
            for wanted in &signature.inputs {
                let (_, _, given) = step.reads.iter().find(|(local, _, _)| *local == wanted.name).ok_or_else(|| {
                    context(Error::invalid_argument(format!(
                        "{version} takes '{}', which the step is not given",
                        wanted.name
                    )))
                })?;
                fits(given, wanted)
                    .map_err(|e| context(e.context(format_args!("input '{}' of {version}", wanted.name))))?;
            }
            // What it makes must fit every reader as they take it, not as
            // the version before made it (`fits` is no order: -1 fits 3).
            for (local, at, _) in &step.writes {
                let made = signature.outputs.iter().find(|o| &o.name == local).ok_or_else(|| {
                    context(Error::invalid_argument(format!(
                        "{version} does not make '{local}', which the graph reads"
                    )))
                })?;
                for (reader, wanted) in &self.wanted[*at] {
                    fits(made, wanted).map_err(|e| {
                        context(e.context(format_args!("output '{local}' of {version}, read by {reader}")))
                    })?;
                }
            }
        }
        Ok(())
    }

    /// Runs one request: `inputs` in signature order, `chosen` the version
    /// of the pipeline's own model it resolved to; the answer in the
    /// order of `outputs`. `caller` is the pipeline's name, as the batches
    /// of its models count it.
    pub async fn run(
        &self,
        chosen: &Arc<ServedVersion>,
        inputs: Vec<Tensor>,
        deadline: Deadline,
        priority: Priority,
        caller: &Arc<str>,
    ) -> Result<Vec<Tensor>> {
        let mut slots: Vec<Option<Tensor>> = vec![None; self.tensors.len()];
        for (slot, tensor) in slots.iter_mut().zip(inputs) {
            *slot = Some(tensor);
        }
        if let Some((fetch, fetched, fell_back_at)) = &self.fetch {
            let given: Vec<NamedTensor> = self
                .signature
                .inputs
                .iter()
                .zip(&slots)
                .filter_map(|(spec, t)| t.as_ref().map(|t| NamedTensor::new(spec.name.clone(), t.clone())))
                .collect();
            let (all, fell_back) = fetch
                .run_telling(given, deadline, priority, self.max_tensor_bytes)
                .instrument(current_step("feature_fetch"))
                .await?;
            slots[*fell_back_at] = Some(Tensor::from_bools(Vec::new(), &[fell_back]));
            for made in all {
                if let Some(&at) = fetched.iter().find(|&&at| *self.tensors[at] == made.name) {
                    slots[at] = Some(made.tensor);
                }
            }
        }
        let mut states = vec![State::Waiting; self.steps.len()];
        let mut running = FuturesUnordered::new();
        loop {
            // Start (or skip) every step that can: skipping one may
            // settle another, so until nothing changes.
            let mut changed = true;
            while changed {
                changed = false;
                for (index, step) in self.steps.iter().enumerate() {
                    if states[index] != State::Waiting {
                        continue;
                    }
                    match self.readiness(step, &slots, &states) {
                        Readiness::Wait => {}
                        Readiness::Skip => {
                            step.metrics.skipped.inc();
                            states[index] = State::Skipped;
                            changed = true;
                        }
                        Readiness::Go => {
                            deadline.check("before the next step of the pipeline")?;
                            let inputs = step
                                .reads
                                .iter()
                                .filter_map(|(local, at, _)| {
                                    slots[*at].clone().map(|t| NamedTensor::new(local.clone(), t))
                                })
                                .collect();
                            states[index] = State::Running;
                            running.push(async move {
                                let result = self.run_step(step, chosen, inputs, deadline, priority, caller).await;
                                (index, result)
                            });
                        }
                    }
                }
            }
            let Some((index, result)) = running.next().await else { break };
            let step = &self.steps[index];
            let made = result.map_err(|e| {
                step.metrics.failed.inc();
                e.context(format_args!("step '{}'", step.name))
            })?;
            step.metrics.ran.inc();
            for made in made {
                if let Some((_, at, _)) = step.writes.iter().find(|(local, _, _)| *local == made.name) {
                    slots[*at] = Some(made.tensor);
                }
            }
            states[index] = State::Done;
        }
        self.outputs.iter().map(|&at| slots[at].take().ok_or_else(|| self.not_made(at, &states))).collect()
    }

    /// Whether `step` can start now, must wait, or will never run.
    fn readiness(&self, step: &Step, slots: &[Option<Tensor>], states: &[State]) -> Readiness {
        // A slot nothing will fill any more: every writer ended without it.
        let never = |at: usize| {
            slots[at].is_none() && self.writers[at].iter().all(|&w| matches!(states[w], State::Skipped | State::Done))
        };
        if let Some((at, want)) = step.condition {
            match &slots[at] {
                None if never(at) => return Readiness::Skip,
                None => return Readiness::Wait,
                Some(tensor) if truth(tensor) != want => return Readiness::Skip,
                Some(_) => {}
            }
        }
        let mut ready = true;
        for (_, at, _) in &step.reads {
            if slots[*at].is_none() {
                if never(*at) {
                    return Readiness::Skip;
                }
                ready = false;
            }
        }
        if ready {
            Readiness::Go
        } else {
            Readiness::Wait
        }
    }

    async fn run_step(
        &self,
        step: &Step,
        chosen: &Arc<ServedVersion>,
        inputs: Vec<NamedTensor>,
        deadline: Deadline,
        priority: Priority,
        caller: &Arc<str>,
    ) -> Result<Vec<NamedTensor>> {
        let span = current_step(&step.name);
        match &step.run {
            StepRun::Stage(runner) => {
                runner.run(inputs, deadline, priority, self.max_tensor_bytes).instrument(span).await
            }
            StepRun::Model { model, version, direct } => {
                // A place in the model's own admission for the step's run.
                let _admitted =
                    direct.as_ref().map(|direct| direct.admission.try_admit(priority, deadline)).transpose()?;
                let served = match version {
                    StepVersion::Chosen => chosen.clone(),
                    other => model.resolve(other.choice())?,
                };
                let signature = served.signature();
                let owner = StepOwner { step: &step.name, version: &served };
                let mut ordered = Vec::with_capacity(signature.inputs.len());
                let mut given = inputs;
                for spec in &signature.inputs {
                    let at = given.iter().position(|t| t.name == spec.name).ok_or_else(|| {
                        Error::internal(format!("{owner} was not given '{}', this is a bug", spec.name))
                    })?;
                    let tensor = given.swap_remove(at).tensor;
                    // What reaches a model was made by another step, with
                    // rows only a request knows: checked as a client's.
                    check_tensor(&owner, "input", spec, &tensor)?;
                    ordered.push(tensor);
                }
                if signature.is_batched() {
                    signature.check_rows(&owner, &ordered)?;
                }
                let outputs = served.inference().run(ordered, deadline, priority, caller).instrument(span).await?;
                Ok(signature
                    .outputs
                    .iter()
                    .zip(outputs)
                    .map(|(spec, t)| NamedTensor::new(spec.name.clone(), t))
                    .collect())
            }
        }
    }

    /// Why output slot `at` is empty at the end.
    fn not_made(&self, at: usize, states: &[State]) -> Error {
        let name = &self.tensors[at];
        let skipped: Vec<&str> =
            self.writers[at].iter().filter(|&&w| states[w] == State::Skipped).map(|&w| &*self.steps[w].name).collect();
        Error::failed_precondition(format!(
            "pipeline '{}' made no '{name}' for this request: the steps that make it ({skipped:?}) did not run, \
             their condition being false or what they read not made",
            self.pipeline
        ))
    }
}

enum Readiness {
    Wait,
    Go,
    Skip,
}

/// True when every element is true (non-zero); an empty tensor is false.
fn truth(tensor: &Tensor) -> bool {
    if tensor.is_empty() {
        return false;
    }
    // Floats by value: -0.0 is zero though a byte of it is not.
    if let Some(values) = tensor.to_vec::<f32>() {
        return values.iter().all(|&v| v != 0.0);
    }
    if let Some(values) = tensor.to_vec::<f64>() {
        return values.iter().all(|&v| v != 0.0);
    }
    match (tensor.bytes(), tensor.dtype().size()) {
        (Some(bytes), Some(size)) if size > 0 => {
            bytes.chunks_exact(size).all(|element| element.iter().any(|&b| b != 0))
        }
        _ => false,
    }
}

fn renamed(spec: &TensorSpec, name: &str) -> TensorSpec {
    let mut spec = spec.clone();
    spec.name = name.to_string();
    spec
}

/// What a feature fetch makes in a graph: its features, and [`FELL_BACK`].
fn fetched_tensors(fetch: &FeatureFetch) -> Vec<TensorSpec> {
    let mut made = fetch.outputs();
    made.push(TensorSpec::new(FELL_BACK, DType::Bool, Vec::new()));
    made
}

/// Which version of its model `step` runs, in a pipeline over `chosen`.
fn step_version(step: &ModelStep, chosen: &str) -> StepVersion {
    match (&step.version, &step.version_label) {
        (Some(n), _) => StepVersion::Number(*n),
        (None, Some(label)) => StepVersion::Label(label.clone()),
        (None, None) if step.model == chosen => StepVersion::Chosen,
        (None, None) => StepVersion::Latest,
    }
}

/// One step as fitting found it: its stage (for a stage step), and what it
/// reads and writes, named as the step names them, with the graph's specs
/// (a write's spec carries the tensor's graph name).
pub struct FittedStep<S> {
    pub stage: Option<S>,
    pub reads: Vec<(String, TensorSpec)>,
    /// What the step takes for each of `reads`, in its order.
    pub wanted: Vec<TensorSpec>,
    pub writes: Vec<(String, TensorSpec)>,
}

/// A graph fitted by dtype and shape: every step, by config index, and what
/// clients send and receive.
pub struct Plan<S> {
    pub steps: Vec<FittedStep<S>>,
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
}

/// The signature of a model step's model version.
pub type ModelSignatureOf<'a> = dyn FnMut(&ModelStep) -> Result<Signature> + 'a;

/// A stage step's stage, with its inputs and outputs.
pub type BuiltStage<S> = (S, Vec<TensorSpec>, Vec<TensorSpec>);

/// Builds a stage step's stage from its kind and what it reads (a
/// built-in's reads; empty for a plugin, which declares its own), and
/// returns it with its inputs and outputs.
pub type StageOf<'a, S> = dyn FnMut(&StepConfig, &StageKind, Vec<TensorSpec>) -> Result<BuiltStage<S>> + 'a;

/// Fits the steps of `config` to each other: every step after what it
/// reads, each read checked by dtype and shape against what makes it, each
/// graph input's spec from the model, plugin or feature-fetch key that
/// reads it. The one check of a graph's dtypes and shapes: the server runs
/// it with its served models and built stages, `sluice config check` with
/// the models and plugins it loads. `fetch` is the feature fetch's keys
/// and the tensors it makes.
pub fn plan<S>(
    config: &PipelineConfig,
    fetch: Option<(Vec<TensorSpec>, Vec<TensorSpec>)>,
    model_signature: &mut ModelSignatureOf<'_>,
    build_stage: &mut StageOf<'_, S>,
) -> Result<Plan<S>> {
    let (keys, fetched) = fetch.unwrap_or_default();
    // Graph inputs get their spec from the first reader that declares one.
    let mut inputs: Vec<(String, Option<TensorSpec>)> = config
        .inputs
        .iter()
        .map(|input| {
            let name = &input.name;
            let declared = input.spec.as_ref().map(|(dtype, shape)| TensorSpec::new(name, *dtype, shape.clone()));
            (name.clone(), declared.or_else(|| keys.iter().find(|k| &k.name == name).map(|k| renamed(k, name))))
        })
        .collect();
    let mut signatures: Vec<Option<Signature>> = Vec::with_capacity(config.steps.len());
    for step in &config.steps {
        signatures.push(match step.model() {
            Some(model) => Some(model_signature(model).map_err(|e| e.context(format_args!("step '{}'", step.name)))?),
            None => None,
        });
    }
    for (step, signature) in config.steps.iter().zip(&signatures) {
        let Some(signature) = signature else { continue };
        for wanted in &signature.inputs {
            let source = step.input_source(&wanted.name);
            if let Some((name, spec)) = inputs.iter_mut().find(|(name, _)| name == source) {
                match spec {
                    None => *spec = Some(renamed(wanted, name)),
                    Some(have) => fits(have, wanted).map_err(|e| {
                        e.context(format_args!("input '{name}', read by step '{}' as '{}'", step.name, wanted.name))
                    })?,
                }
            }
        }
    }
    // An input only conditions read is a switch the client sets: a
    // boolean of any shape (true when every element is).
    for (name, spec) in inputs.iter_mut().filter(|(_, spec)| spec.is_none()) {
        if config.steps.iter().any(|step| step.condition().is_some_and(|(tensor, _)| tensor == name)) {
            *spec = Some(TensorSpec { name: name.clone(), dtype: DType::Bool, shape: Vec::new(), unknown_rank: true });
        }
    }
    let mut specs: HashMap<String, TensorSpec> = HashMap::new();
    for made in fetched {
        specs.insert(made.name.clone(), made);
    }
    let mut writers: HashMap<String, usize> = HashMap::new();
    let mut fitted: Vec<Option<FittedStep<S>>> = (0..config.steps.len()).map(|_| None).collect();
    // Plugins are built first: they say what they read, which orders them.
    let mut plugins: Vec<Option<BuiltStage<S>>> = Vec::with_capacity(config.steps.len());
    for step in &config.steps {
        plugins.push(match step.stage().and_then(|s| s.kind()) {
            Some(kind @ StageKind::Plugin(_)) => {
                Some(build_stage(step, kind, Vec::new()).map_err(|e| e.context(format_args!("step '{}'", step.name)))?)
            }
            _ => None,
        });
    }
    // Each pass fits every step whose reads are all made (a step's own
    // names for them: its model's inputs, its plugin's, its built-in's
    // `inputs` table); a pass that fits none leaves a cycle or a tensor
    // nothing makes, named. Listing order does not matter.
    let mut pending: Vec<usize> = (0..config.steps.len()).collect();
    while !pending.is_empty() {
        let reads_of = |index: usize| -> Vec<String> {
            let step = &config.steps[index];
            let mut reads: Vec<String> = match (&signatures[index], &plugins[index]) {
                (Some(signature), _) => {
                    signature.inputs.iter().map(|w| step.input_source(&w.name).to_string()).collect()
                }
                (None, Some((_, declared, _))) => {
                    declared.iter().map(|w| step.input_source(&w.name).to_string()).collect()
                }
                (None, None) => step.inputs.values().cloned().collect(),
            };
            reads.extend(step.condition().map(|(tensor, _)| tensor.to_string()));
            reads
        };
        let made = |tensor: &String| specs.contains_key(tensor) || inputs.iter().any(|(name, _)| name == tensor);
        let Some(at) = pending.iter().position(|&index| reads_of(index).iter().all(made)) else {
            let stuck: Vec<String> = pending
                .iter()
                .map(|&index| {
                    let missing: Vec<String> = reads_of(index).into_iter().filter(|t| !made(t)).collect();
                    format!("'{}' waits for {missing:?}", config.steps[index].name)
                })
                .collect();
            return Err(Error::invalid_argument(format!(
                "steps that can never run: {}; nothing makes what they wait for, or they wait for each other (a cycle)",
                stuck.join(", ")
            )));
        };
        let index = pending.remove(at);
        let step = &config.steps[index];
        let context = |e: Error| e.context(format_args!("step '{}'", step.name));
        let (stage, declared_inputs, outputs) = match (&step.action, signatures[index].take(), plugins[index].take()) {
            (StepAction::Model(_), Some(signature), _) => (None, signature.inputs, signature.outputs),
            (StepAction::Model(_), None, _) => {
                return Err(Error::internal("a model step without a signature, this is a bug"))
            }
            (StepAction::Stage(_), _, Some((stage, inputs, outputs))) => (Some(stage), inputs, outputs),
            (StepAction::Stage(stage_config), _, None) => {
                let kind = stage_config.kind().ok_or_else(|| {
                    Error::internal(format!("step '{}': an unchecked stage config, this is a bug", step.name))
                })?;
                // A built-in reads what the step's `inputs` give it.
                let reads = step
                    .inputs
                    .iter()
                    .map(|(local, source)| {
                        known(step, source, &specs, &inputs).map(|spec| renamed(&spec, local)).map_err(context)
                    })
                    .collect::<Result<Vec<_>>>()?;
                let (stage, inputs, outputs) = build_stage(step, kind, reads).map_err(context)?;
                (Some(stage), inputs, outputs)
            }
        };
        // A name in `inputs` or `outputs` the step does not have is a typo.
        for (key, what, map, specs) in
            [("inputs", "input", &step.inputs, &declared_inputs), ("outputs", "output", &step.outputs, &outputs)]
        {
            if let Some(local) = map.keys().find(|k| !specs.iter().any(|s| &s.name == *k)) {
                let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
                return Err(context(Error::invalid_argument(format!(
                    "{key}.{local}: the step has no {what} '{local}'; its {key}: {names:?}"
                ))));
            }
        }
        let mut reads = Vec::with_capacity(declared_inputs.len());
        for wanted in &declared_inputs {
            let source = step.input_source(&wanted.name);
            // A plugin may be the first to say what a graph input is.
            if let Some((name, spec @ None)) = inputs.iter_mut().find(|(name, _)| name == source) {
                *spec = Some(renamed(wanted, name));
            }
            let given = known(step, source, &specs, &inputs).map_err(context)?;
            fits(&given, wanted)
                .map_err(|e| context(e.context(format_args!("input '{}' reads '{source}'", wanted.name))))?;
            reads.push((wanted.name.clone(), given));
        }
        if let Some((tensor, _)) = step.condition() {
            let spec = known(step, tensor, &specs, &inputs).map_err(context)?;
            if spec.dtype == DType::String {
                return Err(context(Error::invalid_argument(format!(
                    "its condition '{tensor}' is {}; a condition is a boolean or a number (true when not 0)",
                    spec.dtype
                ))));
            }
        }
        let mut writes = Vec::with_capacity(outputs.len());
        for made in &outputs {
            let name = step.output_name(&made.name);
            // Two steps on opposite conditions may make one tensor: its
            // readers take what either makes, so both must fit them.
            if let (Some(other), Some(_)) = (specs.get(&name), writers.get(&name)) {
                fits(made, other)
                    .map_err(|e| context(e.context(format_args!("output '{name}', also made by another step"))))?;
            }
            writers.insert(name.clone(), index);
            specs.insert(name.clone(), renamed(made, &name));
            writes.push((made.name.clone(), renamed(made, &name)));
        }
        fitted[index] = Some(FittedStep { stage, reads, wanted: declared_inputs, writes });
    }
    let inputs: Vec<TensorSpec> = inputs
        .into_iter()
        .map(|(name, spec)| {
            spec.ok_or_else(|| {
                Error::invalid_argument(format!(
                    "inputs: '{name}' is read by no model or plugin step (nor is it a feature fetch key), so nothing \
                     says its dtype and shape; built-ins take any"
                ))
            })
        })
        .collect::<Result<_>>()?;
    let mut outputs = Vec::with_capacity(config.outputs.len());
    for name in &config.outputs {
        let spec = specs.get(name).or_else(|| inputs.iter().find(|s| &s.name == name)).ok_or_else(|| {
            let mut names: Vec<&str> = specs.keys().map(String::as_str).collect();
            names.sort_unstable();
            Error::invalid_argument(format!("outputs: nothing makes '{name}'; tensors: {names:?}"))
        })?;
        outputs.push(spec.clone());
    }
    let steps = fitted
        .into_iter()
        .map(|step| step.ok_or_else(|| Error::internal("a step was not fitted, this is a bug")))
        .collect::<Result<_>>()?;
    Ok(Plan { steps, inputs, outputs })
}

/// The spec of tensor `source` as `step` reads it: made before it, or a
/// graph input whose spec is known.
fn known(
    step: &StepConfig,
    source: &str,
    specs: &HashMap<String, TensorSpec>,
    inputs: &[(String, Option<TensorSpec>)],
) -> Result<TensorSpec> {
    if let Some(spec) = specs.get(source) {
        return Ok(spec.clone());
    }
    match inputs.iter().find(|(name, _)| name == source) {
        Some((_, Some(spec))) => Ok(spec.clone()),
        Some((_, None)) => Err(Error::invalid_argument(format!(
            "step '{}' reads input '{source}' before any model or plugin step says its dtype and shape",
            step.name
        ))),
        None => {
            let mut names: Vec<&str> =
                specs.keys().map(String::as_str).chain(inputs.iter().map(|(n, _)| n.as_str())).collect();
            names.sort_unstable();
            let made_by = source.split_once('.').map(|(step, _)| step);
            Err(Error::invalid_argument(format!(
                "step '{}' reads '{source}', which nothing before it makes{}; tensors made before it: {names:?}",
                step.name,
                made_by.map_or(String::new(), |s| format!(" (step '{s}' has no such output, or runs after it)"))
            )))
        }
    }
}
