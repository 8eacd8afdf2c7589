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
//! This module is the host only: the engine ([`engine`]), instances and
//! their limits ([`instances`], [`state`]), the generated bindings
//! ([`bindings`]), and the plugin registry ([`registry`]: stored versions,
//! tokens, swaps, audit). The stage that runs a plugin inside a pipeline
//! is `pipeline::stages::plugin`; the registry reaches it through the
//! [`registry::PluginSlot`] handle, so this module imports nothing of
//! `pipeline/` or `models/`.

pub mod bindings;
pub mod compiler;
pub mod engine;
mod instances;
pub mod manifest;
mod memory;
pub mod registry;
pub mod shared;
mod state;
pub mod store;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use wasmtime::component::Component;
use wasmtime::Trap;

use self::bindings::post::PostprocessorPre;
use self::bindings::pre::PreprocessorPre;
use self::bindings::{Dtype, PluginError};
pub use self::engine::PluginEngine;
use self::instances::{Instance, Instances, Pre};
use self::state::HostState;
pub use crate::config::{InstancePolicy, PluginLimits, PluginsConfig};
use crate::error::{Error, Invalid, PluginFault, Result};
use crate::metrics::{Metrics, PluginMetrics};
use crate::tensor::spec::{check_outputs, TensorSpec};
use crate::tensor::{DType, NamedTensor, Tensor, TensorData};

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
    engine: Arc<PluginEngine>,
    component: Component,
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
    /// plugin's call counts and times under the name the registry knows it
    /// by (never the text the plugin declares).
    pub fn load(
        engine: &Arc<PluginEngine>,
        wasm: &[u8],
        limits: PluginLimits,
        metrics: Option<(&Metrics, &str)>,
    ) -> Result<Plugin> {
        let component = engine.compile(wasm)?;
        let missing = engine.missing_imports(&component);
        if !missing.is_empty() {
            // JavaScript toolchains import wasi:http unless told not to;
            // say how, rather than only what.
            let hint = if missing.iter().any(|m| m.starts_with("wasi:http/")) {
                "; plugins get no network: build without wasi:http (componentize-js / jco componentize: \
                 `--disable http fetch-event`; componentize-qjs imports none)"
            } else {
                ""
            };
            return Err(Error::invalid_argument(format!(
                "the plugin imports what the host does not provide: {}; a plugin may import only WASI 0.2 \
                 (every capability off) and sluice:plugin/log{hint}",
                missing.join(", ")
            )));
        }
        let (world, pre) = instantiate_pre(engine, &component)?;
        let sha256 = store::sha256_hex(wasm);
        // `describe` runs once, in an instance of its own, before the
        // plugin's name is known.
        let unnamed = PluginLimits { instances: InstancePolicy::Fresh, ..limits.clone() };
        let describing =
            Instances::new(engine, pre.clone(), unnamed.clone(), Arc::from("plugin"), Vec::new(), Default::default());
        let description = describe(&describing, &unnamed)?;
        let (name, version) = (&description.name, &description.version);
        let label: Arc<str> = Arc::from(format!("plugin '{name}' {version}"));
        let metrics = match metrics {
            Some((metrics, registered)) => metrics.plugin(registered),
            None => PluginMetrics::detached(name),
        };
        // What a `reset` instance is warmed up on: the plugin's sample, or
        // zeros shaped like its inputs (a zero-sized declared input makes
        // the warm-up an empty call: it is a warm-up, not a check).
        let warm_up = match &description.sample {
            Some(sample) => sample.iter().map(tensor_out).collect::<Result<_>>()?,
            None => zeros(&description.inputs, memory_bytes(&limits))
                .and_then(|z| z.iter().map(tensor_out).collect())
                .unwrap_or_default(),
        };
        let instances =
            Instances::new(engine, pre, limits.clone(), label.clone(), warm_up, metrics.instances_made.clone());
        let plugin =
            Plugin { engine: engine.clone(), component, world, description, label, limits, sha256, instances, metrics };
        // Not fatal: `describe` ran, so it instantiates; the first call
        // makes its instance when this one could not be (all
        // `max_instances` in use).
        if let Err(e) = plugin.instances.prepare() {
            tracing::debug!(plugin = %plugin.label, "no instance made ahead of the first call: {e:#}");
        }
        if let Some(sample) = plugin.description.sample.clone() {
            plugin.call(sample).map_err(|e| {
                // The sample ran; what it returned is what does not fit.
                let step = match &e {
                    Error::Plugin { fault: PluginFault::BadOutput, .. } => {
                        "its sample ran, but its outputs do not match what it declares"
                    }
                    _ => "its sample failed",
                };
                e.context(step)
            })?;
        }
        Ok(plugin)
    }

    /// Reads and loads `path`.
    pub fn load_file(
        engine: &Arc<PluginEngine>,
        path: &Path,
        limits: PluginLimits,
        metrics: Option<(&Metrics, &str)>,
    ) -> Result<Plugin> {
        let wasm = std::fs::read(path).map_err(|e| {
            let hint = if e.kind() == std::io::ErrorKind::NotFound {
                "; if it is a plugin crate's build output: a crate builds a .wasm only with \
                 crate-type = [\"cdylib\"] under [lib] in its Cargo.toml (into target/wasm32-wasip2/PROFILE/)"
            } else {
                ""
            };
            Error::invalid_argument(format!("cannot read plugin {}: {e}{hint}", path.display()))
        })?;
        Plugin::load(engine, &wasm, limits, metrics).map_err(|e| e.context(path.display()))
    }

    /// The same plugin, counted in `metrics` under `registered` from now
    /// on (it was checked detached, so that a refused one counts nowhere).
    pub fn counted_as(mut self, metrics: &Metrics, registered: &str) -> Plugin {
        self.metrics = metrics.plugin(registered);
        self.instances.count_made_in(self.metrics.instances_made.clone());
        self
    }

    /// The plugin passed every check and serves (or is stored): its
    /// compiled code may go to the cache. Nothing refused is ever cached.
    pub fn accepted(&self) {
        self.engine.remember(&self.sha256, &self.component);
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
        let rows = self.batch_rows(&inputs);
        let wit_inputs: Vec<bindings::Tensor> = inputs.iter().map(tensor_out).collect::<Result<_>>()?;
        drop(inputs);
        let mut live = match self.instances.take() {
            Ok(live) => live,
            Err(e) => {
                self.metrics.record(PluginFault::NoInstance.label());
                return Err(Error::plugin(
                    PluginFault::NoInstance,
                    format!("{}: no instance available: {e:#}", self.label),
                ));
            }
        };
        let answer = live.instance.run(&mut live.store, &wit_inputs);
        let stats = CallStats { elapsed: started.elapsed(), peak_memory: live.store.data().limiter.peak };
        self.metrics.seconds.observe(stats.elapsed.as_secs_f64());
        let outcome = match answer {
            Err(trap) => Err(self.failure(trap, live.store.data())),
            Ok(Err(PluginError::InvalidInput(message))) => Err(Error::plugin(
                PluginFault::InvalidInput,
                format!("{} rejected the input: {}", self.label, plugin_text(&message)),
            )),
            // An interpreter refused memory raises its own error (Python's
            // MemoryError) instead of trapping: the cause is still the limit.
            Ok(Err(PluginError::Internal(message))) if live.store.data().limiter.memory_denied => {
                Err(Error::plugin_said(
                    PluginFault::OutOfMemory,
                    format!(
                        "{} tried to grow its memory past its limit of {} MiB and was stopped",
                        self.label, self.limits.memory_mib
                    ),
                    Some(plugin_text(&message)),
                ))
            }
            Ok(Err(PluginError::Internal(message))) => Err(Error::plugin_said(
                PluginFault::Failed,
                format!("{} failed", self.label),
                Some(plugin_text(&message)),
            )),
            Ok(Ok(outputs)) => self.check_outputs(outputs, rows),
        }
        .map_err(|e| self.engine.shown(e));
        live.store.data().flush_output();
        let fault = match &outcome {
            Ok(_) => None,
            Err(Error::Plugin { fault, .. }) => Some(*fault),
            Err(_) => Some(PluginFault::Trap),
        };
        // A trapped instance cannot be entered again; others may be kept.
        self.instances.give_back(live, !fault.is_some_and(PluginFault::poisons_instance));
        self.metrics.record(fault.map_or("ok", PluginFault::label));
        outcome.map(|outputs| (outputs, stats))
    }

    /// The rows of a call: those of the first input the plugin declares
    /// with a free dimension 0 (its batch); `None` when it declares none.
    fn batch_rows(&self, inputs: &[NamedTensor]) -> Option<usize> {
        self.description
            .inputs
            .iter()
            .filter(|spec| spec.shape.first() == Some(&-1))
            .find_map(|spec| inputs.iter().find(|t| t.name == spec.name))
            .map(|t| t.tensor.rows())
    }

    /// What a plugin returned, as host tensors, checked against what it
    /// declared, and each output it declares with a free dimension 0
    /// holding the call's `rows` (a plugin must not invent or drop rows):
    /// the only check of a plugin's outputs, made before the call is
    /// scored, so nothing downstream sizes anything from an unchecked one
    /// and a plugin that breaks it fails as `bad_output`, its own fault.
    fn check_outputs(&self, outputs: Vec<bindings::Tensor>, rows: Option<usize>) -> Result<Vec<NamedTensor>> {
        let bad = |e: Error| Error::plugin(PluginFault::BadOutput, format!("{} returned {e}", self.label));
        let max_bytes = memory_bytes(&self.limits);
        let outputs = outputs
            .into_iter()
            .map(|t| tensor_in(t, max_bytes))
            .collect::<Result<Vec<_>>>()
            .map_err(|e| bad(e.context("a malformed tensor")))?;
        check_outputs(&self.label, &self.description.outputs, &outputs)
            .map_err(|e| Error::plugin(PluginFault::BadOutput, e.message()))?;
        if let Some(rows) = rows {
            for (output, spec) in outputs.iter().zip(&self.description.outputs) {
                if spec.shape.first() == Some(&-1) && output.tensor.rows() != rows {
                    return Err(Error::plugin(
                        PluginFault::BadOutput,
                        format!(
                            "{} returned {} rows in '{}' for a request of {rows}; a plugin keeps the rows it is given",
                            self.label,
                            output.tensor.rows(),
                            output.name
                        ),
                    ));
                }
            }
        }
        Ok(outputs)
    }

    fn failure(&self, error: wasmtime::Error, state: &HostState) -> Error {
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
    let info = result.map_err(|e| classify("the plugin", limits, e, live.store.data()).context("describe"));
    live.store.data().flush_output();
    instances.give_back(live, false);
    let info = info?;
    // Everything a plugin declares is a claim: bound it before anything is
    // sized or named from it.
    let refused = |what: Invalid| Error::invalid_argument(format!("describe: {what}"));
    check_declared_text("name", &info.name, NAME_CHARS).map_err(refused)?;
    check_declared_text("version", &info.version, VERSION_CHARS).map_err(refused)?;
    let specs = |role: &str, specs: Vec<bindings::TensorSpec>| -> Result<Vec<TensorSpec>> {
        if specs.len() > MAX_DECLARED_TENSORS {
            return Err(refused(crate::invalid!(
                "it declares {} {role}; at most {MAX_DECLARED_TENSORS} are allowed",
                specs.len()
            )));
        }
        specs
            .into_iter()
            .map(|s| {
                check_declared_text(&format!("{role} name"), &s.name, TENSOR_NAME_CHARS).map_err(refused)?;
                check_declared_shape(&s.name, &s.shape).map_err(refused)?;
                Ok(TensorSpec::new(s.name, dtype_in(s.dtype), s.shape))
            })
            .collect()
    };
    let inputs = specs("inputs", info.inputs)?;
    let outputs = specs("outputs", info.outputs)?;
    let max_bytes = memory_bytes(limits);
    let sample = match info.sample {
        None => None,
        Some(tensors) => Some(
            tensors
                .into_iter()
                .map(|t| tensor_in(t, max_bytes))
                .collect::<Result<Vec<_>>>()
                .map_err(|e| e.context("its declared sample is malformed"))?,
        ),
    };
    Ok(Description { name: info.name, version: info.version, inputs, outputs, sample })
}

/// The characters a kind of declared text may use: letters and digits,
/// `extra`, as `described` says in messages.
struct Charset {
    extra: &'static str,
    described: &'static str,
}

/// Characters of a plugin's declared name.
const NAME_CHARS: Charset = Charset { extra: "_-.", described: "A-Z, a-z, 0-9, '_', '-', '.'" };
/// Characters of a plugin's declared version.
const VERSION_CHARS: Charset = Charset { extra: "_-.+", described: "A-Z, a-z, 0-9, '_', '-', '.', '+'" };
/// Characters of a declared tensor name.
const TENSOR_NAME_CHARS: Charset = Charset { extra: "_-./:", described: "A-Z, a-z, 0-9, '_', '-', '.', '/', ':'" };
/// Longest declared name or version.
const MAX_DECLARED_TEXT: usize = 64;
/// Most inputs or outputs a plugin may declare.
const MAX_DECLARED_TENSORS: usize = 64;
/// Highest rank a declared tensor may have.
const MAX_DECLARED_RANK: usize = 8;
/// Largest fixed dimension a plugin may declare.
const MAX_DECLARED_DIM: i64 = i32::MAX as i64;

/// A declared name or version: short, and only the characters `allowed`
/// lists (nothing that could break a log line, a metric or a message).
fn check_declared_text(what: &str, text: &str, allowed: Charset) -> std::result::Result<(), Invalid> {
    let valid = !text.is_empty()
        && text.len() <= MAX_DECLARED_TEXT
        && text.chars().all(|c| c.is_ascii_alphanumeric() || allowed.extra.contains(c));
    if valid {
        return Ok(());
    }
    let shown = state::escape(&state::cap(text, MAX_DECLARED_TEXT)).into_owned();
    Err(crate::invalid!(
        "its {what} \"{shown}\" ({} bytes) is not 1 to {MAX_DECLARED_TEXT} characters of {}",
        text.len(),
        allowed.described
    ))
}

/// A declared shape: rank at most 8, each dimension -1 (any size) or 0 to
/// 2^31 - 1; no other negative number is a wildcard.
fn check_declared_shape(name: &str, shape: &[i64]) -> std::result::Result<(), Invalid> {
    if shape.len() > MAX_DECLARED_RANK {
        return Err(crate::invalid!("'{name}' has rank {}; at most {MAX_DECLARED_RANK}", shape.len()));
    }
    if let Some((axis, dim)) = shape.iter().enumerate().find(|(_, &d)| !(-1..=MAX_DECLARED_DIM).contains(&d)) {
        return Err(crate::invalid!(
            "'{name}' declares dimension {axis} = {dim}; a dimension is -1 (any size) or 0 to {MAX_DECLARED_DIM}"
        ));
    }
    Ok(())
}

/// The plugin's memory limit in bytes: nothing it returns or declares can
/// fairly need more.
pub fn memory_bytes(limits: &PluginLimits) -> usize {
    usize::try_from(limits.memory_mib).unwrap_or(usize::MAX).saturating_mul(1 << 20)
}

/// Longest error message kept from a plugin.
const MAX_PLUGIN_MESSAGE: usize = 1024;

/// A trap or host error as the client's error: what limit was hit, or
/// what the guest said before it trapped.
fn classify(label: &str, limits: &PluginLimits, error: wasmtime::Error, state: &HostState) -> Error {
    let said = state.stderr.last_words().map(|l| plugin_text(&l));
    if error.downcast_ref::<state::BlockedPastDeadline>().is_some() {
        return Error::plugin(
            PluginFault::Timeout,
            format!(
                "{label} blocked in a host call (a sleep or a poll) until its time limit of {} ms and was stopped",
                limits.timeout_ms
            ),
        );
    }
    let (fault, message) = match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => (
            PluginFault::Timeout,
            format!("{label} exceeded its time limit of {} ms and was stopped", limits.timeout_ms),
        ),
        Some(Trap::OutOfFuel) => {
            (PluginFault::OutOfFuel, format!("{label} ran out of fuel ({} units)", limits.fuel.unwrap_or(u64::MAX)))
        }
        _ if state.limiter.memory_denied => (
            PluginFault::OutOfMemory,
            format!("{label} tried to grow its memory past its limit of {} MiB and was stopped", limits.memory_mib),
        ),
        Some(Trap::StackOverflow) => {
            (PluginFault::StackOverflow, format!("{label} overflowed its stack (runaway recursion?)"))
        }
        // Rust keeps most of a wasm function's stack in linear memory,
        // below the data; running off its start is an out-of-bounds access.
        Some(Trap::MemoryOutOfBounds) => (
            PluginFault::StackOverflow,
            format!(
                "{label} accessed memory out of bounds (a runaway recursion that overflows the stack ends this way)"
            ),
        ),
        Some(Trap::UnreachableCodeReached) => {
            (PluginFault::Trap, format!("{label} trapped: it reached unreachable code (a panic or an abort)"))
        }
        Some(trap) => (PluginFault::Trap, format!("{label} trapped: {trap}")),
        // wasmtime's own text can carry the guest's backtrace: the
        // plugin's words, not the host's.
        None => {
            let words = plugin_text(&format!("{error:#}"));
            let said = Some(said.map_or(words.clone(), |s| format!("{words}; {s}")));
            return Error::plugin_said(PluginFault::Trap, format!("{label} failed"), said);
        }
    };
    Error::plugin_said(fault, message, said)
}

/// Zeros shaped like `specs` (dynamic dimensions as 1): what a plugin
/// without a sample is tried with. Each is sized against `max_bytes` first:
/// the shapes are the plugin's claims.
pub fn zeros(specs: &[TensorSpec], max_bytes: usize) -> Result<Vec<NamedTensor>> {
    specs
        .iter()
        .map(|s| {
            let shape: Vec<i64> = s.shape.iter().map(|&d| if d < 0 { 1 } else { d }).collect();
            crate::tensor::tensor_bytes(s.dtype, &shape, max_bytes, &format!("declared input '{}'", s.name))?;
            Ok(NamedTensor::new(s.name.clone(), Tensor::zeros(s.dtype, shape)?))
        })
        .collect()
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
    // The WIT enum and DType list the dtypes in the same order.
    DType::from_wit_index(d as u8).expect("the WIT dtype enum and DType agree")
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
        // Refused in tensor_out before this is asked.
        DType::Complex64 | DType::Complex128 => Dtype::String,
    }
}

/// A tensor as the plugin interface carries it. The interface has no
/// complex types: a pipeline whose plugin would take one does not build
/// (the dtypes do not fit), so this refusal is a last line.
fn tensor_out(t: &NamedTensor) -> Result<bindings::Tensor> {
    if !t.tensor.dtype().in_plugin_interface() {
        return Err(Error::invalid_argument(format!(
            "tensor '{}' is {}, which the plugin interface does not carry",
            t.name,
            t.tensor.dtype()
        )));
    }
    let (data, strings) = match t.tensor.data() {
        TensorData::Fixed(bytes) => (bytes.to_vec(), Vec::new()),
        TensorData::Strings(strings) => (Vec::new(), strings.iter().map(|s| s.to_vec()).collect()),
    };
    Ok(bindings::Tensor {
        name: t.name.clone(),
        dtype: dtype_out(t.tensor.dtype()),
        shape: t.tensor.shape().to_vec(),
        data,
        strings,
    })
}

/// A message a plugin wrote, for a client or a log: capped and escaped.
fn plugin_text(message: &str) -> String {
    state::escape(&state::cap(message, MAX_PLUGIN_MESSAGE)).into_owned()
}

/// A tensor from a plugin, checked like any client tensor — shape, byte
/// length, booleans — and sized against `max_bytes` (counting zero
/// dimensions as one, so a shape of `[2^40, 0]` with no bytes cannot make
/// an encoder write 2^40 empty rows).
fn tensor_in(t: bindings::Tensor, max_bytes: usize) -> Result<NamedTensor> {
    let dtype = dtype_in(t.dtype);
    let name = t.name;
    if name.len() > MAX_DECLARED_TEXT {
        return Err(Error::invalid_argument(format!("a tensor name of {} bytes", name.len())));
    }
    crate::tensor::tensor_bytes(dtype, &t.shape, max_bytes, &format!("tensor '{name}'"))?;
    let tensor = match dtype {
        DType::String => {
            if !t.data.is_empty() {
                return Err(Error::invalid_argument(format!(
                    "string tensor '{name}' carries {} data bytes",
                    t.data.len()
                )));
            }
            Tensor::from_strings(t.shape, t.strings.into_iter().map(Bytes::from).collect())
        }
        _ => {
            if !t.strings.is_empty() {
                return Err(Error::invalid_argument(format!("{dtype} tensor '{name}' carries strings")));
            }
            Tensor::from_bytes(dtype, t.shape, Bytes::from(t.data))
        }
    }
    .map_err(|e| e.context(format_args!("tensor '{name}'")))?;
    Ok(NamedTensor::new(name, tensor))
}

#[cfg(test)]
mod tests {
    //! The host against real components: `target/plugins/*.wasm`, built by
    //! `scripts/build-plugins` (which `make test` runs first).

    use std::sync::OnceLock;

    use super::*;

    fn engine() -> &'static Arc<PluginEngine> {
        static ENGINE: OnceLock<Arc<PluginEngine>> = OnceLock::new();
        ENGINE.get_or_init(|| Arc::new(PluginEngine::new(&PluginsConfig::default()).expect("plugin engine")))
    }

    fn load(name: &str) -> Plugin {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/plugins").join(format!("{name}.wasm"));
        let limits = PluginLimits { timeout_ms: 100, memory_mib: 16, ..PluginLimits::default() };
        Plugin::load_file(engine(), &path, limits, None).unwrap_or_else(|e| panic!("{e} (run scripts/build-plugins)"))
    }

    fn attack(plugin: &Plugin, verb: &str) -> Result<Vec<NamedTensor>> {
        let attack = Tensor::from_strings(vec![1], vec![Bytes::from(verb.to_string())]).expect("attack tensor");
        let x = Tensor::from_values(vec![1, 64], &[1.0f32; 64]);
        plugin.call(vec![NamedTensor::new("attack", attack), NamedTensor::new("x", x)])
    }

    /// The fault and the whole text (what the log gets).
    fn fault_of(result: Result<Vec<NamedTensor>>) -> (PluginFault, String) {
        match result {
            Err(error) => match &error {
                Error::Plugin { fault, .. } => (*fault, error.to_string()),
                other => panic!("expected a plugin fault, got {other}"),
            },
            other => panic!("expected a plugin fault, got {:?}", other.map(|o| o.len())),
        }
    }

    #[test]
    fn each_way_a_guest_fails_is_its_own_fault_and_the_plugin_keeps_serving() {
        let plugin = load("hostile");
        let cases = [
            ("loop", PluginFault::Timeout, "time limit of 100 ms"),
            ("sleep", PluginFault::Timeout, "blocked in a host call"),
            ("memory", PluginFault::OutOfMemory, "limit of 16 MiB"),
            ("recursion", PluginFault::StackOverflow, "stack"),
            ("unreachable", PluginFault::Trap, "unreachable"),
            ("panic", PluginFault::Trap, "unreachable code"),
            ("wrong-name", PluginFault::BadOutput, "declared"),
            ("wrong-dtype", PluginFault::BadOutput, "DT_INT32"),
            ("bad-length", PluginFault::BadOutput, "malformed"),
            ("invalid", PluginFault::InvalidInput, "refuses this input"),
        ];
        for (verb, fault, says) in cases {
            let started = std::time::Instant::now();
            let (got, message) = fault_of(attack(&plugin, verb));
            assert!(started.elapsed() < std::time::Duration::from_secs(2), "{verb} ran {:?}", started.elapsed());
            assert_eq!(got, fault, "{verb}: {message}");
            assert!(message.contains(says), "{verb}: {message}");
            assert!(message.contains("plugin 'hostile' 6.6.6"), "{verb}: {message}");
            // A fresh instance serves the next call as if nothing happened.
            let ok = attack(&plugin, "none").unwrap_or_else(|e| panic!("after {verb}: {e}"));
            assert_eq!(ok[0].tensor.to_vec::<f32>().expect("f32"), vec![1.0; 64]);
        }
    }

    #[test]
    fn a_plugins_own_words_reach_the_log_not_the_client() {
        let plugin = load("hostile");
        let error = attack(&plugin, "panic").expect_err("a panic");
        assert!(error.to_string().contains("panics on purpose"), "the log line: {error}");
        let client = error.message();
        assert!(!client.contains("panics on purpose") && !client.contains(".rs"), "the client's: {client}");
        assert!(client.contains("plugin 'hostile' 6.6.6") && client.contains("server log"), "{client}");
        let exposing = PluginEngine::new(&PluginsConfig { expose_plugin_errors: true, ..PluginsConfig::default() })
            .expect("engine");
        let error = exposing.shown(Error::plugin_said(PluginFault::Trap, "p trapped", Some("words".into())));
        assert_eq!(error.message(), "p trapped (it said: words)");
    }

    #[test]
    fn the_sandbox_grants_no_files_sockets_or_environment() {
        let plugin = load("hostile");
        for (verb, says) in [("file", "failed"), ("socket:127.0.0.1:9", "failed"), ("env", "0 variables")] {
            let (fault, message) = fault_of(attack(&plugin, verb));
            assert_eq!(fault, PluginFault::Failed, "{verb}: {message}");
            assert!(message.contains(says), "{verb}: {message}");
        }
    }

    #[test]
    fn a_plugin_describes_itself_and_a_component_of_another_kind_is_refused() {
        let plugin = load("identity");
        assert_eq!(plugin.world(), World::Preprocessor);
        assert!(plugin.label().starts_with("plugin 'identity'"), "{}", plugin.label());
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/plugins/bad_imports.wasm");
        let err = Plugin::load_file(engine(), &path, PluginLimits::default(), None).err().expect("refused");
        assert_eq!(err.code(), crate::error::Code::InvalidArgument);
        assert!(err.message().contains("imports what the host does not provide"), "{err}");
        let err = Plugin::load(engine(), b"not wasm at all", PluginLimits::default(), None).err().expect("refused");
        assert_eq!(err.code(), crate::error::Code::InvalidArgument, "{err}");
        assert!(err.message().contains("not a WebAssembly file"), "{err}");
        let core_module = b"\0asm\x01\0\0\0";
        let err = Plugin::load(engine(), core_module, PluginLimits::default(), None).err().expect("refused");
        assert!(err.message().contains("core WebAssembly module, not a component"), "{err}");
        let err = Plugin::load_file(engine(), Path::new("/nonexistent.wasm"), PluginLimits::default(), None)
            .err()
            .expect("refused");
        assert!(err.message().contains("cdylib"), "{err}");
    }
}
