//! WebAssembly plugins: teams' own preprocessing and postprocessing, run
//! sandboxed by wasmtime.
//!
//! A [`Plugin`] is a component of the `preprocessor` or `postprocessor`
//! world (`sdk/wit`), compiled once ([`engine`]) and run in a fresh, clean
//! instance per call by default: a pooled instance from `InstancePre`,
//! with a new [`state::HostState`] that grants nothing — no files,
//! environment, arguments, sockets or wall clock — a memory limit, a time
//! limit (epochs) and optionally fuel. A trap, a timeout or running out of
//! memory fails that one call with an error naming the plugin, its version
//! and the cause; the server and every other call carry on.
//!
//! [`PluginStage`] puts a plugin into a pipeline as a stage.

pub mod bindings;
pub mod check;
pub mod engine;
mod instances;
pub mod push;
pub mod registry;
mod state;
pub mod store;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Deserialize;
use wasmtime::component::Component;
use wasmtime::Trap;

use self::bindings::post::PostprocessorPre;
use self::bindings::pre::PreprocessorPre;
use self::bindings::{Dtype, PluginError};
pub use self::engine::PluginEngine;
use self::instances::{Instance, Instances, Pre};
use self::state::HostState;
use crate::api::metrics::{Metrics, PluginMetrics};
use crate::error::{Code, Error, Result};
use crate::infer::TensorSpec;
use crate::pipeline::stage::{check_declared, Stage};
use crate::tensor::{DType, NamedTensor, Tensor, TensorData};

/// The `[plugins]` table: where plugins are and how the engine runs them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PluginsConfig {
    /// The directory of `NAME.wasm` files that pipelines name.
    pub dir: Option<PathBuf>,
    /// Where compiled plugins are cached; none when unset.
    pub cache_dir: Option<PathBuf>,
    /// Meter fuel, so that `fuel` limits apply (costs a few percent).
    pub fuel: bool,
    /// Plugin instances that may exist at once (the instance pool).
    pub max_instances: u32,
    /// The largest `memory_mib` any plugin may be given.
    pub max_memory_mib: u64,
    /// Linear memory kept mapped between instances of a pool slot, zeroed
    /// instead of unmapped (KiB): faster fresh instances, at the cost of
    /// that much resident memory per slot used.
    pub keep_resident_kib: u64,
    /// Limits per plugin, by name; plugins not named get the defaults.
    pub limits: BTreeMap<String, PluginLimits>,
}

impl Default for PluginsConfig {
    fn default() -> Self {
        PluginsConfig {
            dir: None,
            cache_dir: None,
            fuel: false,
            max_instances: 256,
            max_memory_mib: 256,
            keep_resident_kib: 2048,
            limits: BTreeMap::new(),
        }
    }
}

impl PluginsConfig {
    /// The limits of the plugin called `name`.
    pub fn limits_of(&self, name: &str) -> PluginLimits {
        self.limits.get(name).cloned().unwrap_or_default()
    }

    /// The file of the plugin called `name`.
    pub fn path_of(&self, name: &str) -> Result<PathBuf> {
        let dir = self.dir.as_ref().ok_or_else(|| {
            Error::invalid_argument(format!("plugin '{name}' is named, but [plugins] dir is not set"))
        })?;
        Ok(dir.join(format!("{name}.wasm")))
    }
}

/// What one call of a plugin may use.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PluginLimits {
    /// Wall time per call, in milliseconds.
    pub timeout_ms: u64,
    /// Linear memory per instance, in MiB.
    pub memory_mib: u64,
    /// Fuel (roughly, instructions) per call; needs `[plugins] fuel = true`.
    pub fuel: Option<u64>,
    /// Keep an instance per worker between calls instead of a fresh one
    /// per call: faster, but state persists between requests of the same
    /// pipeline. An instance that fails is thrown away.
    pub reuse_instance: bool,
}

impl Default for PluginLimits {
    fn default() -> Self {
        PluginLimits { timeout_ms: 50, memory_mib: 64, fuel: None, reuse_instance: false }
    }
}

/// Which world a plugin implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum World {
    /// Before the model.
    Preprocessor,
    /// After the model.
    Postprocessor,
}

impl std::fmt::Display for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            World::Preprocessor => "preprocessor",
            World::Postprocessor => "postprocessor",
        })
    }
}

/// What a plugin says about itself, in host types.
#[derive(Debug, Clone, PartialEq)]
pub struct Description {
    /// Its name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// What it takes.
    pub inputs: Vec<TensorSpec>,
    /// What it returns.
    pub outputs: Vec<TensorSpec>,
    /// The sample it declares, if any.
    pub sample: Option<Vec<NamedTensor>>,
}

/// What one call measured.
#[derive(Debug, Clone, Copy)]
pub struct CallStats {
    /// Wall time of the call.
    pub elapsed: Duration,
    /// The most linear memory the instance asked for, in bytes.
    pub peak_memory: usize,
}

/// A loaded plugin, ready to be called from any thread.
pub struct Plugin {
    world: World,
    description: Description,
    label: Arc<str>,
    limits: PluginLimits,
    sha256: String,
    instances: Instances,
    metrics: PluginMetrics,
}

impl Plugin {
    /// Compiles (or loads from the cache) and checks a plugin: it must be a
    /// component of one of the two worlds, import nothing the host does not
    /// provide, answer `describe`, and — when it declares one — run its
    /// sample under its limits. `metrics`, when given, receives the
    /// plugin's call counts and times under `name version`.
    pub fn load(
        engine: &Arc<PluginEngine>,
        wasm: &[u8],
        limits: PluginLimits,
        metrics: Option<&Metrics>,
    ) -> Result<Plugin> {
        let component = engine.compile(wasm)?;
        let missing = engine.missing_imports(&component);
        if !missing.is_empty() {
            return Err(Error::invalid_argument(format!(
                "the plugin imports what the host does not provide: {}; a plugin may import only WASI 0.2 \
                 (every capability off) and sluice:plugin/log",
                missing.join(", ")
            )));
        }
        let (world, pre) = instantiate_pre(engine, &component)?;
        let sha256 = store::sha256_hex(wasm);
        // `describe` runs once, in an instance of its own, before the
        // plugin's name is known.
        let unnamed = PluginLimits { reuse_instance: false, ..limits.clone() };
        let describing = Instances::new(engine, pre.clone(), unnamed.clone(), Arc::from("plugin"));
        let description = describe(&describing, &unnamed)?;
        let (name, version) = (&description.name, &description.version);
        let label: Arc<str> = Arc::from(format!("plugin '{name}' {version}"));
        let metrics = match metrics {
            Some(metrics) => metrics.plugin(&format!("{name} {version}")),
            None => PluginMetrics::detached(&format!("{name} {version}")),
        };
        let instances = Instances::new(engine, pre, limits.clone(), label.clone());
        let plugin = Plugin { world, description, label, limits, sha256, instances, metrics };
        if let Some(sample) = plugin.description.sample.clone() {
            plugin.call(sample).map_err(|e| e.context("its sample failed"))?;
        }
        Ok(plugin)
    }

    /// Reads and loads `path`.
    pub fn load_file(
        engine: &Arc<PluginEngine>,
        path: &Path,
        limits: PluginLimits,
        metrics: Option<&Metrics>,
    ) -> Result<Plugin> {
        let wasm = std::fs::read(path)
            .map_err(|e| Error::invalid_argument(format!("cannot read plugin {}: {e}", path.display())))?;
        Plugin::load(engine, &wasm, limits, metrics).map_err(|e| e.context(path.display()))
    }

    /// `plugin 'name' version`.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// What it says about itself.
    pub fn description(&self) -> &Description {
        &self.description
    }

    /// Its world.
    pub fn world(&self) -> World {
        self.world
    }

    /// The SHA-256 of its bytes, hex.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// Its limits.
    pub fn limits(&self) -> &PluginLimits {
        &self.limits
    }

    /// Calls the plugin's `preprocess` or `postprocess` on `inputs`.
    pub fn call(&self, inputs: Vec<NamedTensor>) -> Result<Vec<NamedTensor>> {
        self.call_measured(inputs).map(|(outputs, _)| outputs)
    }

    /// Like [`Plugin::call`], also returning time and peak memory.
    pub fn call_measured(&self, inputs: Vec<NamedTensor>) -> Result<(Vec<NamedTensor>, CallStats)> {
        let started = Instant::now();
        let wit_inputs: Vec<bindings::Tensor> = inputs.iter().map(tensor_out).collect();
        drop(inputs);
        let mut live = match self.instances.take() {
            Ok(live) => live,
            Err(e) => {
                self.metrics.record("no_instance");
                return Err(Error::resource_exhausted(format!("{}: no instance available: {e:#}", self.label)));
            }
        };
        let answer = match &live.instance {
            Instance::Preprocessor(i) => i.call_preprocess(&mut live.store, &wit_inputs),
            Instance::Postprocessor(i) => i.call_postprocess(&mut live.store, &wit_inputs),
        };
        let stats = CallStats { elapsed: started.elapsed(), peak_memory: live.store.data().limiter.peak };
        self.metrics.seconds.observe(stats.elapsed.as_secs_f64());
        let (outcome, kind) = match answer {
            Err(trap) => {
                let (error, kind) = self.failure(trap, live.store.data());
                (Err(error), kind)
            }
            Ok(Err(PluginError::InvalidInput(message))) => {
                (Err(Error::invalid_argument(format!("{} rejected the input: {message}", self.label))), "invalid_input")
            }
            Ok(Err(PluginError::Internal(message))) => {
                (Err(Error::internal(format!("{} failed: {message}", self.label))), "plugin_error")
            }
            Ok(Ok(outputs)) => {
                let converted = outputs
                    .into_iter()
                    .map(tensor_in)
                    .collect::<Result<Vec<_>>>()
                    .map_err(|e| {
                        Error::internal(format!("{} returned a malformed tensor: {}", self.label, e.message()))
                    })
                    .and_then(|outputs| {
                        check_declared(&self.label, &self.description.outputs, &outputs)?;
                        Ok(outputs)
                    });
                let kind = if converted.is_ok() { "ok" } else { "bad_output" };
                (converted, kind)
            }
        };
        live.store.data().flush_output();
        // A trapped instance cannot be entered again; others may be kept.
        self.instances
            .give_back(live, !matches!(kind, "timeout" | "out_of_memory" | "out_of_fuel" | "stack_overflow" | "trap"));
        self.metrics.record(kind);
        outcome.map(|outputs| (outputs, stats))
    }

    fn failure(&self, error: wasmtime::Error, state: &HostState) -> (Error, &'static str) {
        classify(&self.label, &self.limits, error, state)
    }
}

/// Runs `describe` in an instance of its own.
fn describe(instances: &Instances, limits: &PluginLimits) -> Result<Description> {
    let mut live =
        instances.take().map_err(|e| Error::invalid_argument(format!("the plugin cannot be instantiated: {e:#}")))?;
    let result = match &live.instance {
        Instance::Preprocessor(i) => i.call_describe(&mut live.store),
        Instance::Postprocessor(i) => i.call_describe(&mut live.store),
    };
    let info = result.map_err(|e| classify("the plugin", limits, e, live.store.data()).0.context("describe"));
    live.store.data().flush_output();
    instances.give_back(live, false);
    let info = info?;
    let spec = |s: bindings::TensorSpec| TensorSpec { name: s.name, dtype: dtype_in(s.dtype), shape: s.shape };
    let sample = match info.sample {
        None => None,
        Some(tensors) => Some(
            tensors
                .into_iter()
                .map(tensor_in)
                .collect::<Result<Vec<_>>>()
                .map_err(|e| e.context("its declared sample is malformed"))?,
        ),
    };
    Ok(Description {
        name: info.name,
        version: info.version,
        inputs: info.inputs.into_iter().map(spec).collect(),
        outputs: info.outputs.into_iter().map(spec).collect(),
        sample,
    })
}

/// A trap or host error as the client's error — what limit was hit, or
/// what the guest said before it trapped — and the metric label.
fn classify(label: &str, limits: &PluginLimits, error: wasmtime::Error, state: &HostState) -> (Error, &'static str) {
    let said = state.stderr.last_words().map(|l| format!(" (it said: {l})")).unwrap_or_default();
    match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => (
            Error::resource_exhausted(format!(
                "{label} exceeded its time limit of {} ms and was stopped",
                limits.timeout_ms
            )),
            "timeout",
        ),
        Some(Trap::OutOfFuel) => (
            Error::resource_exhausted(format!("{label} ran out of fuel ({} units)", limits.fuel.unwrap_or(u64::MAX))),
            "out_of_fuel",
        ),
        _ if state.limiter.memory_denied => (
            Error::resource_exhausted(format!(
                "{label} tried to grow its memory past its limit of {} MiB and was stopped{said}",
                limits.memory_mib
            )),
            "out_of_memory",
        ),
        Some(Trap::StackOverflow) => {
            (Error::internal(format!("{label} overflowed its stack (runaway recursion?)")), "stack_overflow")
        }
        // Rust keeps most of a wasm function's stack in linear memory,
        // below the data; running off its start is an out-of-bounds access.
        Some(Trap::MemoryOutOfBounds) => (
            Error::internal(format!(
                "{label} accessed memory out of bounds (a runaway recursion that overflows the stack ends this way){said}"
            )),
            "stack_overflow",
        ),
        Some(Trap::UnreachableCodeReached) => (
            Error::internal(format!("{label} trapped: it reached unreachable code (a panic or an abort){said}")),
            "trap",
        ),
        Some(trap) => (Error::internal(format!("{label} trapped: {trap}{said}")), "trap"),
        None => (Error::internal(format!("{label} failed: {error:#}{said}")), "trap"),
    }
}

fn instantiate_pre(engine: &PluginEngine, component: &Component) -> Result<(World, Pre)> {
    let exports = engine.exports(component);
    let has = |name: &str| exports.iter().any(|e| e == name);
    let world = match (has("preprocess"), has("postprocess")) {
        (true, false) => World::Preprocessor,
        (false, true) => World::Postprocessor,
        _ => {
            return Err(Error::invalid_argument(format!(
                "the component is not a sluice plugin: it exports {exports:?}; a preprocessor exports `describe` \
                 and `preprocess`, a postprocessor `describe` and `postprocess` (see sdk/wit/plugin.wit)"
            )))
        }
    };
    let instance_pre = engine
        .linker()
        .instantiate_pre(component)
        .map_err(|e| Error::invalid_argument(format!("the component cannot be linked: {e:#}")))?;
    let mismatch = |e: wasmtime::Error| {
        Error::invalid_argument(format!("the component's exports do not match the {world} world: {e:#}"))
    };
    let pre = match world {
        World::Preprocessor => Pre::Preprocessor(PreprocessorPre::new(instance_pre).map_err(mismatch)?),
        World::Postprocessor => Pre::Postprocessor(PostprocessorPre::new(instance_pre).map_err(mismatch)?),
    };
    Ok((world, pre))
}

fn dtype_in(d: Dtype) -> DType {
    match d {
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::F16 => DType::F16,
        Dtype::Bf16 => DType::BF16,
        Dtype::I8 => DType::I8,
        Dtype::I16 => DType::I16,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::U8 => DType::U8,
        Dtype::U16 => DType::U16,
        Dtype::U32 => DType::U32,
        Dtype::U64 => DType::U64,
        Dtype::Boolean => DType::Bool,
        Dtype::String => DType::String,
    }
}

fn dtype_out(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::Bf16,
        DType::I8 => Dtype::I8,
        DType::I16 => Dtype::I16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::U8 => Dtype::U8,
        DType::U16 => Dtype::U16,
        DType::U32 => Dtype::U32,
        DType::U64 => Dtype::U64,
        DType::Bool => Dtype::Boolean,
        DType::String => Dtype::String,
    }
}

fn tensor_out(t: &NamedTensor) -> bindings::Tensor {
    let (data, strings) = match t.tensor.data() {
        TensorData::Fixed(bytes) => (bytes.to_vec(), Vec::new()),
        TensorData::Strings(strings) => (Vec::new(), strings.iter().map(|s| s.to_vec()).collect()),
    };
    bindings::Tensor {
        name: t.name.clone(),
        dtype: dtype_out(t.tensor.dtype()),
        shape: t.tensor.shape().to_vec(),
        data,
        strings,
    }
}

/// A tensor from a plugin, checked like any client tensor: shape, byte
/// length, booleans.
fn tensor_in(t: bindings::Tensor) -> Result<NamedTensor> {
    let dtype = dtype_in(t.dtype);
    let name = t.name;
    let tensor = match dtype {
        DType::String => {
            if !t.data.is_empty() {
                return Err(Error::internal(format!("string tensor '{name}' carries {} data bytes", t.data.len())));
            }
            Tensor::from_strings(t.shape, t.strings.into_iter().map(Bytes::from).collect())
        }
        _ => {
            if !t.strings.is_empty() {
                return Err(Error::internal(format!("{dtype} tensor '{name}' carries strings")));
            }
            Tensor::from_bytes(dtype, t.shape, Bytes::from(t.data))
        }
    }
    .map_err(|e| Error::internal(format!("tensor '{name}': {}", e.message())))?;
    Ok(NamedTensor::new(name, tensor))
}

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
    name: String,
    current: arc_swap::ArcSwap<Plugin>,
    inputs: Vec<TensorSpec>,
    outputs: Vec<TensorSpec>,
}

impl PluginStage {
    /// A stage called `name` (the plugin's name in the config) running
    /// `plugin`, whose declared inputs and outputs become the stage's.
    pub fn new(name: &str, plugin: Arc<Plugin>) -> PluginStage {
        PluginStage {
            name: format!("plugin {name}"),
            inputs: plugin.description.inputs.clone(),
            outputs: plugin.description.outputs.clone(),
            current: arc_swap::ArcSwap::new(plugin),
        }
    }

    /// The plugin serving new requests.
    pub fn current(&self) -> Arc<Plugin> {
        self.current.load_full()
    }

    /// Checks that `plugin` has this stage's interface: the same inputs
    /// and outputs, name for name, dtype for dtype, shape for shape.
    pub fn accepts(&self, plugin: &Plugin) -> Result<()> {
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
        same("inputs", &self.inputs, &plugin.description.inputs)?;
        same("outputs", &self.outputs, &plugin.description.outputs)
    }

    /// Serves new requests with `plugin` from now on; requests in flight
    /// finish on the plugin they started with.
    pub fn swap(&self, plugin: Arc<Plugin>) -> Result<()> {
        self.accepts(&plugin)?;
        self.current.store(plugin);
        Ok(())
    }
}

impl Stage for PluginStage {
    fn name(&self) -> &str {
        &self.name
    }

    fn inputs(&self) -> &[TensorSpec] {
        &self.inputs
    }

    fn outputs(&self) -> &[TensorSpec] {
        &self.outputs
    }

    fn process(&self, inputs: Vec<NamedTensor>) -> Result<Vec<NamedTensor>> {
        // The batch: the rows of the first input declared with a free
        // dimension 0.
        let rows = self
            .inputs()
            .iter()
            .filter(|spec| spec.shape.first() == Some(&-1))
            .find_map(|spec| inputs.iter().find(|t| t.name == spec.name))
            .map(|t| t.tensor.rows());
        let plugin = self.current.load_full();
        let outputs = plugin.call(inputs)?;
        // Rows in, the same rows out: a plugin must not invent or drop rows.
        if let Some(rows) = rows {
            for (output, spec) in outputs.iter().zip(self.outputs()) {
                if spec.shape.first() == Some(&-1) && output.tensor.rows() != rows {
                    return Err(Error::new(
                        Code::Internal,
                        format!(
                            "{} returned {} rows in '{}' for a request of {rows}",
                            plugin.label(),
                            output.tensor.rows(),
                            output.name
                        ),
                    ));
                }
            }
        }
        Ok(outputs)
    }
}
