//! The stage that runs a WebAssembly plugin in a pipeline, swappable while
//! it serves, with a canary version beside the stable one when the registry
//! starts one ([`super::canary`]). It is the registry's [`PluginSlot`]: the
//! registry checks an upload against it, swaps it and sets its canary,
//! without knowing what a pipeline is. A canary that fails its judgement
//! stops serving here at once, and the registry is told, so that it rolls
//! it back everywhere.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use arc_swap::{ArcSwap, ArcSwapOption};

use super::canary::{Canary, Side};
use crate::config::{CanaryPolicy, StageRole};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::models::ModelVersion;
use crate::pipeline::cache::ResponseCache;
use crate::pipeline::served::ServedModel;
use crate::pipeline::stage::{Stage, StageCx, StageIo};
use crate::plugin::registry::{PluginRegistry, PluginSlot};
use crate::plugin::{Plugin, World};
use crate::tensor::spec::{fits, TensorSpec};
use crate::tensor::NamedTensor;

/// A pipeline stage that runs a plugin, swappable while it serves.
///
/// The interface — what the stage takes and returns — is fixed when the
/// pipeline is built, because clients and the model rely on it; a swap
/// replaces the implementation only, with a plugin whose interface is the
/// same (the registry checks before it swaps). A request takes the plugin
/// current when it starts and keeps it to the end, so a swap never fails
/// or mixes a request; the old plugin, with its compiled code and warm
/// instances, is freed when its last request ends.
pub struct PluginStage {
    io: StageIo,
    /// The plugin's name in the registry.
    plugin: String,
    /// The share of plugin calls its team may run at once.
    share: Arc<TeamShare>,
    pipeline: String,
    team: Option<String>,
    world: World,
    /// The model it feeds or reads; `None` in a graph step, whose graph
    /// checks what it reads and makes.
    model: Option<Arc<ServedModel>>,
    current: ArcSwap<Plugin>,
    /// The registry's version of `current` (0: the plugin directory's file).
    version: AtomicU32,
    /// The canary beside `current`, while one runs.
    canary: ArcSwapOption<Canary>,
    /// The input that keeps a caller on one side of a canary.
    canary_key: Option<String>,
    policy: CanaryPolicy,
    /// The pipeline's response cache, emptied when what answers changes.
    cache: Option<Arc<ResponseCache>>,
    /// Told when a canary fails here, to roll it back everywhere.
    registry: Weak<PluginRegistry>,
}

/// Where a plugin stage sits and what it serves.
pub struct PluginPlace<'a> {
    /// The pipeline's name.
    pub pipeline: &'a str,
    /// The pipeline's team.
    pub team: Option<&'a str>,
    /// Before or after the model.
    pub role: StageRole,
    /// The model it feeds or reads.
    pub model: &'a Arc<ServedModel>,
    /// The step it runs as, in a graph pipeline: it may be of either world,
    /// and the graph, not one model, says what it must read and make.
    pub step: Option<&'a str>,
    /// Every team's share of plugin calls.
    pub shares: &'a TeamShares,
    /// The pipeline's response cache.
    pub cache: Option<&'a Arc<ResponseCache>>,
    /// The input that keeps a caller on one side of a canary.
    pub canary_key: Option<&'a str>,
    /// When a canary is rolled back on its own.
    pub canary_policy: &'a CanaryPolicy,
}

/// The plugin calls each team may run at once (`plugins.max_calls_per_team`).
pub struct TeamShares {
    limit: usize,
    teams: Mutex<HashMap<String, Arc<TeamShare>>>,
}

impl TeamShares {
    /// `limit` calls at once per team.
    pub fn new(limit: usize) -> TeamShares {
        TeamShares { limit: limit.max(1), teams: Mutex::new(HashMap::new()) }
    }

    /// The share of `team`; a pipeline without a team has its own.
    fn of(&self, team: Option<&str>, pipeline: &str) -> Arc<TeamShare> {
        let key = match team {
            Some(team) => format!("team {team}"),
            None => format!("pipeline {pipeline}"),
        };
        let mut teams = self.teams.lock().unwrap_or_else(PoisonError::into_inner);
        teams
            .entry(key)
            .or_insert_with(|| Arc::new(TeamShare { limit: self.limit, busy: Mutex::new(0), freed: Condvar::new() }))
            .clone()
    }
}

/// One team's calls in progress.
struct TeamShare {
    limit: usize,
    busy: Mutex<usize>,
    freed: Condvar,
}

/// Longest a call waits for its team's share when its request has no
/// deadline.
const SHARE_WAIT: Duration = Duration::from_secs(5);

impl TeamShare {
    /// Waits (on the stage's worker thread) until the team may run one
    /// more call, at most until the request's deadline.
    fn enter(self: &Arc<Self>, cx: &StageCx<'_>, team: Option<&str>) -> Result<TeamCall> {
        let wait = cx
            .deadline()
            .instant()
            .map_or(SHARE_WAIT, |at| at.saturating_duration_since(tokio::time::Instant::now()).min(SHARE_WAIT));
        let busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        let (mut busy, waited) = self
            .freed
            .wait_timeout_while(busy, wait, |busy| *busy >= self.limit)
            .unwrap_or_else(PoisonError::into_inner);
        if waited.timed_out() && *busy >= self.limit {
            return Err(Error::resource_exhausted(format!(
                "team {:?} already runs {} plugin calls at once (plugins.max_calls_per_team); retry later",
                team.unwrap_or("none"),
                self.limit
            )));
        }
        *busy += 1;
        Ok(TeamCall(self.clone()))
    }
}

/// A call counted in its team's share until dropped.
struct TeamCall(Arc<TeamShare>);

impl Drop for TeamCall {
    fn drop(&mut self) {
        let mut busy = self.0.busy.lock().unwrap_or_else(PoisonError::into_inner);
        *busy = busy.saturating_sub(1);
        self.0.freed.notify_one();
    }
}

impl PluginStage {
    /// Loads plugin `name` (its active uploaded version, else `NAME.wasm`)
    /// for a stage at `place`, checks it fits, and binds the stage to the
    /// registry so activations reach it. Each stage gets its own plugin
    /// instance pool: warm instances are never shared between pipelines.
    pub fn build(name: &str, place: &PluginPlace<'_>, registry: &Arc<PluginRegistry>) -> Result<Arc<PluginStage>> {
        let world_of_role = match place.role {
            StageRole::Preprocess => World::Preprocessor,
            StageRole::Postprocess => World::Postprocessor,
        };
        let mut failures = Vec::new();
        for (version, source, bytes) in registry.initial_sources(name, place.team)? {
            // A panic while loading is this source's failure (the registry
            // guards plugin code), not the server's.
            let plugin = match registry.load(name, &bytes) {
                Ok(plugin) => plugin,
                Err(e) => {
                    tracing::error!(plugin = name, pipeline = place.pipeline, %source, "plugin refused: {e}");
                    failures.push(format!("{source}: {e}"));
                    continue;
                }
            };
            let description = plugin.description();
            let world = if place.step.is_some() { plugin.world() } else { world_of_role };
            let stage = Arc::new(PluginStage {
                io: StageIo {
                    name: format!("plugin {name}"),
                    inputs: description.inputs.clone(),
                    outputs: description.outputs.clone(),
                },
                plugin: name.to_string(),
                canary: ArcSwapOption::empty(),
                canary_key: place.canary_key.map(str::to_string),
                policy: place.canary_policy.clone(),
                cache: place.cache.cloned(),
                registry: Arc::downgrade(registry),
                share: place.shares.of(place.team, place.pipeline),
                pipeline: place.pipeline.to_string(),
                team: place.team.map(str::to_string),
                world,
                model: place.step.is_none().then(|| place.model.clone()),
                current: ArcSwap::new(Arc::new(plugin)),
                version: AtomicU32::new(version),
            });
            let current = stage.current();
            if let Err(e) = stage.fits_model(&current) {
                failures.push(format!("{source}: {} {e}", current.label()));
                continue;
            }
            if let Some(key) = place.canary_key.filter(|_| place.step.is_none()) {
                if place.role == StageRole::Preprocess && !stage.inputs().iter().any(|spec| spec.name == key) {
                    return Err(Error::invalid_argument(format!(
                        "canary_key = \"{key}\" is not an input of plugin '{name}'; its inputs: [{}]",
                        stage.inputs().iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ")
                    )));
                }
            }
            registry.bind(name, stage.clone())?;
            current.accepted();
            // What each pipeline runs, said once at start: a stored version
            // shadowing the file, or a fallback, is never silent.
            tracing::info!(
                pipeline = place.pipeline,
                stage = place.step.unwrap_or(place.role.key()),
                plugin = name,
                version,
                declared = %current.label(),
                sha256 = current.sha256(),
                %source,
                "plugin stage serving"
            );
            return Ok(stage);
        }
        Err(Error::invalid_argument(format!("plugin '{name}' could not be loaded: {}", failures.join("; "))))
    }

    /// The plugin serving new requests.
    pub fn current(&self) -> Arc<Plugin> {
        self.current.load_full()
    }

    /// The plugin is of this stage's world and fits every version of the
    /// model ([`plugin_fits`]).
    fn fits_model(&self, plugin: &Plugin) -> Result<()> {
        let versions = self.model.as_ref().map(|model| model.loaded_versions()).unwrap_or_default();
        plugin_fits(plugin, self.world, &versions)
    }

    /// `plugin` has this stage's interface: the same inputs and outputs,
    /// name for name, dtype for dtype, shape for shape.
    fn same_interface(&self, plugin: &Plugin) -> Result<()> {
        let same = |what: &str, have: &[TensorSpec], given: &[TensorSpec]| {
            if have == given {
                return Ok(());
            }
            let list = |specs: &[TensorSpec]| specs.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
            Err(Error::invalid_argument(format!(
                "{} declares {what} [{}], but the stage's {what} are [{}]; a swap keeps the interface clients and \
                 the model rely on",
                plugin.label(),
                list(given),
                list(have)
            )))
        };
        same("inputs", self.inputs(), &plugin.description().inputs)?;
        same("outputs", self.outputs(), &plugin.description().outputs)
    }
}

impl PluginSlot for PluginStage {
    fn pipeline(&self) -> &str {
        &self.pipeline
    }

    fn team(&self) -> Option<&str> {
        self.team.as_deref()
    }

    fn accepts(&self, plugin: &Plugin) -> Result<()> {
        self.fits_model(plugin)?;
        self.same_interface(plugin)
    }

    fn swap(&self, plugin: Arc<Plugin>, version: u32) -> Result<()> {
        self.accepts(&plugin)?;
        self.current.store(plugin);
        self.version.store(version, Ordering::Relaxed);
        self.forget_answers();
        Ok(())
    }

    fn set_canary(&self, canary: Option<(Arc<Plugin>, u32, f64)>, metrics: &Metrics) -> Result<()> {
        let canary = match canary {
            None => None,
            Some((plugin, version, percent)) => {
                self.accepts(&plugin)?;
                let stable = self.version.load(Ordering::Relaxed);
                let names = (self.pipeline.as_str(), self.plugin.as_str());
                Some(Arc::new(Canary::new(plugin, version, percent, stable, names, &self.policy, metrics)))
            }
        };
        self.canary.store(canary);
        self.forget_answers();
        Ok(())
    }

    fn canary(&self) -> Option<(u32, f64)> {
        self.canary.load().as_ref().map(|c| (c.version, c.percent))
    }

    fn running(&self) -> (u32, String, String) {
        let current = self.current();
        (self.version.load(Ordering::Relaxed), current.label().to_string(), current.sha256().to_string())
    }
}

impl PluginStage {
    fn forget_answers(&self) {
        if let Some(cache) = &self.cache {
            cache.clear();
        }
    }

    /// Runs one call on the side it is dealt, records it, and stops the
    /// canary here (telling the registry) when it fails its judgement.
    fn call(&self, inputs: Vec<NamedTensor>) -> Result<(Arc<Plugin>, Vec<NamedTensor>)> {
        let Some(canary) = self.canary.load_full() else {
            let plugin = self.current.load_full();
            return plugin.call(inputs).map(|outputs| (plugin, outputs));
        };
        let side = canary.deal(&inputs, self.canary_key.as_deref());
        let plugin = match side {
            Side::Canary => canary.plugin.clone(),
            Side::Stable => self.current.load_full(),
        };
        let started = Instant::now();
        let result = plugin.call(inputs);
        if let Some(verdict) = canary.record(side, result.is_ok(), started.elapsed()) {
            // Only the first call to see the verdict ends it.
            let ended = self.canary.compare_and_swap(&Some(canary.clone()), None);
            if ended.as_ref().is_some_and(|c| Arc::ptr_eq(c, &canary)) {
                self.forget_answers();
                if let Some(registry) = self.registry.upgrade() {
                    registry.canary_failed(&self.plugin, canary.version, &self.pipeline, &verdict.0);
                }
            }
        }
        result.map(|outputs| (plugin, outputs))
    }
}

impl Stage for PluginStage {
    fn io(&self) -> &StageIo {
        &self.io
    }

    fn process(&self, inputs: Vec<NamedTensor>, cx: &StageCx<'_>) -> Result<Vec<NamedTensor>> {
        // Fairness between teams: this team's calls take at most their
        // share of the cores.
        let _call = self.share.enter(cx, self.team.as_deref())?;
        // The host checks the outputs against the plugin's declaration,
        // rows in = rows out included (`Plugin::check_outputs`), before the
        // call is scored.
        let (_, outputs) = self.call(inputs)?;
        Ok(outputs)
    }

    fn varies(&self) -> bool {
        self.canary.load().is_some()
    }
}

/// A plugin fits a stage of `world` in front of (or behind) `model`: it is
/// of that world, and fits every version of the model — a preprocessor's
/// outputs feed the model's inputs, a postprocessor's inputs are the
/// model's outputs. The one check, made when a pipeline is built, when a
/// plugin is uploaded, and by `sluice plugin check` and `config check`;
/// a mismatch names what the plugin declares and what the model takes.
pub fn plugin_fits(plugin: &Plugin, world: World, versions: &[Arc<ModelVersion>]) -> Result<()> {
    if plugin.world() != world {
        return Err(Error::invalid_argument(format!("it is a {}, but the stage runs a {world}", plugin.world())));
    }
    let description = plugin.description();
    let list = |specs: &[TensorSpec]| specs.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
    for version in versions {
        let signature = version.signature();
        let (wanted, given, role, side) = match world {
            World::Preprocessor => (&signature.inputs, &description.outputs, "outputs", "takes"),
            World::Postprocessor => (&description.inputs, &signature.outputs, "inputs", "returns"),
        };
        for want in wanted {
            let have = given.iter().find(|g| g.name == want.name).ok_or_else(|| match world {
                World::Preprocessor => Error::invalid_argument(format!(
                    "its outputs do not fit {version}: it produces no '{}'; it produces [{}], the model {side} [{}]",
                    want.name,
                    list(given),
                    list(wanted)
                )),
                World::Postprocessor => Error::invalid_argument(format!(
                    "its inputs do not fit {version}: it reads '{}', which the model does not return; it reads [{}], \
                     the model {side} [{}]",
                    want.name,
                    list(wanted),
                    list(given)
                )),
            })?;
            fits(have, want).map_err(|e| e.context(format_args!("its {role} do not fit {version}")))?;
        }
    }
    Ok(())
}
