//! `sluice plugin check`: load a plugin as the server would, say what it
//! declares, and run a sample under the real limits, reporting time and
//! peak memory — before it goes anywhere near a server. With `--model` or
//! `--config … --pipeline …` it also makes the check an upload gets: the
//! plugin fits every version of the real model. Inputs given with
//! `--input` pass the checks the server makes on requests first.

use std::fmt::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use crate::config::{Config, ModelConfig, StageKind, StageRole, VersionPolicy};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::models::load_selected;
use crate::pipeline::stages::plugin::plugin_fits;
use crate::plugin::{memory_bytes, zeros, Plugin, PluginEngine, PluginLimits, PluginsConfig, World};
use crate::tensor::json::{tensor_from_json, JsonView};
use crate::tensor::spec::{check_tensor, Signature, TensorSpec};
use crate::tensor::{format_shape, NamedTensor, Tensor};

/// The flags of `sluice plugin check`.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// The plugin, a `.wasm` component.
    pub file: PathBuf,
    /// A JSON file of inputs, columnar as TF Serving's REST API writes them:
    /// {"inputs": {"NAME": [[…]]}}. Default: the plugin's declared sample,
    /// or zeros shaped from its declared inputs.
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// Time limit per call, in milliseconds.
    #[arg(long = "timeout_ms", default_value_t = PluginLimits::default().timeout_ms)]
    pub timeout_ms: u64,
    /// Memory limit, in MiB.
    #[arg(long = "memory_mib", default_value_t = PluginLimits::default().memory_mib)]
    pub memory_mib: u64,
    /// Fuel limit per call (turns fuel metering on).
    #[arg(long)]
    pub fuel: Option<u64>,
    /// Check it against this model (a directory of versions,
    /// `VERSION/model.onnx`; every version in it): a preprocessor's
    /// outputs must feed its inputs, a postprocessor's inputs must be its
    /// outputs.
    #[arg(long, conflicts_with = "config")]
    pub model: Option<PathBuf>,
    /// Check it as the plugin of `--pipeline` in this config: that
    /// pipeline's model (the versions its policy loads) and that plugin's
    /// configured limits.
    #[arg(long, requires = "pipeline")]
    pub config: Option<PathBuf>,
    /// The pipeline of `--config` the plugin is for.
    #[arg(long, requires = "config")]
    pub pipeline: Option<String>,
    /// Where compiled plugins are kept between checks, keyed by the
    /// component's hash and the engine's settings as the server keys them
    /// (owner-only). Default: `$XDG_CACHE_HOME/sluice/plugin-check` (or
    /// `~/.cache/…`); a plugin checked before starts at once.
    #[arg(long = "cache_dir")]
    pub cache_dir: Option<PathBuf>,
    /// Compile every time; keep nothing.
    #[arg(long = "no_cache")]
    pub no_cache: bool,
}

/// Where compiled plugins are kept between checks, unless told otherwise.
fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))?;
    Some(base.join("sluice").join("plugin-check"))
}

/// Where the plugin will run: the model it must fit, and, for a
/// pipeline, its plugin stages (world and configured limits).
struct Target {
    model: ModelConfig,
    library: Option<PathBuf>,
    stages: Vec<(World, PluginLimits)>,
}

fn target(args: &CheckArgs) -> Result<Option<Target>> {
    if let Some(dir) = &args.model {
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("model").to_string();
        // Every version in the directory: any of them may come to serve.
        let model = ModelConfig { version_policy: VersionPolicy::All, ..ModelConfig::from_flags(name, dir.clone()) };
        return Ok(Some(Target { model, library: None, stages: Vec::new() }));
    }
    let (Some(path), Some(pipeline)) = (&args.config, &args.pipeline) else { return Ok(None) };
    let config = Config::from_file(path)?;
    let pipeline = config.pipelines.iter().find(|p| &p.name == pipeline).ok_or_else(|| {
        let names: Vec<&str> = config.pipelines.iter().map(|p| p.name.as_str()).collect();
        Error::not_found(format!("{}: no pipeline '{pipeline}'; pipelines: {names:?}", path.display()))
    })?;
    let stages: Vec<(World, PluginLimits)> = pipeline
        .stages()
        .filter_map(|(role, stage)| match stage.kind() {
            Some(StageKind::Plugin(name)) => Some((
                match role {
                    StageRole::Preprocess => World::Preprocessor,
                    StageRole::Postprocess => World::Postprocessor,
                },
                config.plugins.limits_of(name),
            )),
            _ => None,
        })
        .collect();
    if stages.is_empty() {
        return Err(Error::invalid_argument(format!("pipeline '{}' runs no plugin", pipeline.name)));
    }
    let model = config.models.iter().find(|m| m.name == pipeline.model).cloned().ok_or_else(|| {
        Error::internal(format!(
            "pipeline '{}' names model '{}', which the config check allows only when it exists",
            pipeline.name, pipeline.model
        ))
    })?;
    Ok(Some(Target { model, library: config.onnxruntime.library.clone(), stages }))
}

/// Loads the target's model and checks the plugin against it; answers
/// the line to print.
fn check_fit(plugin: &Plugin, target: &Target) -> Result<String> {
    // A pipeline's stage of the plugin's own world; a model alone takes
    // the plugin on the side its world says.
    let world = match target.stages.as_slice() {
        [] => plugin.world(),
        stages => stages.iter().find(|(w, _)| *w == plugin.world()).map_or(stages[0].0, |(w, _)| *w),
    };
    let metrics = Metrics::new();
    let storage = crate::config::StorageConfig::default();
    let load = load_selected(&target.model, target.library.as_deref(), &storage, &metrics);
    // The check runs on a blocking thread of the command's runtime.
    let model = tokio::runtime::Handle::try_current()
        .map_err(|e| Error::internal(format!("no async runtime to load the model on: {e}")))?
        .block_on(load)?;
    plugin_fits(plugin, world, &model).map_err(|e| e.context(format_args!("{} does not fit", plugin.label())))?;
    let versions: Vec<String> = model.iter().map(|v| v.version().to_string()).collect();
    Ok(format!("fits model '{}' (versions {}) as its {world}", target.model.name, versions.join(", ")))
}

fn describe_specs(specs: &[TensorSpec]) -> String {
    specs.iter().map(|s| format!("  {} {} {}", s.name, s.dtype, format_shape(&s.shape))).collect::<Vec<_>>().join("\n")
}

/// Inputs from a JSON file, checked as the server checks a request's
/// before a plugin sees them: every declared input and no other, dtypes,
/// ranks and fixed dimensions, and for batched inputs at least one row,
/// the same in each. Floats may be bare `NaN`, `Infinity`, `-Infinity`.
fn from_json(path: &PathBuf, specs: &[TensorSpec]) -> Result<Vec<NamedTensor>> {
    let text = std::fs::read(path).map_err(|e| Error::invalid_argument(format!("{}: {e}", path.display())))?;
    // Bare NaN, Infinity and -Infinity, as the REST API takes them (and
    // Python's json.dumps writes them): what production sent can be
    // replayed here.
    let body: serde_json::Value = crate::tensor::json::parse(&crate::tensor::json::accept_non_finite(&text))
        .map_err(|e| Error::invalid_argument(format!("{}: not JSON: {e}", path.display())))?;
    let inputs = body.get("inputs").and_then(|v| v.as_object()).ok_or_else(|| {
        Error::invalid_argument(format!("{}: expected {{\"inputs\": {{\"NAME\": […]}}}}", path.display()))
    })?;
    let mut tensors = Vec::with_capacity(inputs.len());
    for (name, value) in inputs {
        let spec = specs.iter().find(|s| &s.name == name).ok_or_else(|| {
            Error::invalid_argument(format!(
                "the plugin has no input '{name}'; it declares:\n{}",
                describe_specs(specs)
            ))
        })?;
        let tensor = tensor_from_json(value, spec.dtype, &format!("input '{name}'"))?;
        check_tensor(&"the plugin", "input", spec, &tensor)?;
        tensors.push(NamedTensor::new(name.clone(), tensor));
    }
    let signature = Signature { inputs: specs.to_vec(), outputs: Vec::new() };
    signature.check_input_names(&"the plugin", tensors.iter().map(|t| t.name.as_str()))?;
    let batched: Vec<TensorSpec> = specs.iter().filter(|s| s.shape.first() == Some(&-1)).cloned().collect();
    let in_order: Vec<Tensor> = batched
        .iter()
        .filter_map(|spec| tensors.iter().find(|t| t.name == spec.name).map(|t| t.tensor.clone()))
        .collect();
    Signature { inputs: batched, outputs: Vec::new() }.check_rows(&"the plugin", &in_order)?;
    Ok(tensors)
}

/// Calls made after the first to say what a call costs while serving.
const STEADY_CALLS: u32 = 5;

/// Runs the check and returns the report to print.
pub fn run(args: &CheckArgs) -> Result<String> {
    let cache_dir = if args.no_cache { None } else { args.cache_dir.clone().or_else(default_cache_dir) };
    if let Some(parent) = cache_dir.as_deref().and_then(std::path::Path::parent) {
        // The cache directory itself is made owner-only by the engine.
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::invalid_argument(format!("cannot make {}: {e}", parent.display())))?;
    }
    let config = PluginsConfig { fuel: args.fuel.is_some(), max_instances: 4, cache_dir, ..PluginsConfig::default() };
    let engine = Arc::new(PluginEngine::new(&config)?);
    let loading = std::time::Instant::now();
    let limits = PluginLimits {
        timeout_ms: args.timeout_ms,
        memory_mib: args.memory_mib,
        fuel: args.fuel,
        instances: crate::plugin::InstancePolicy::default(),
    };
    let target = target(args)?;
    let stages = target.as_ref().map_or(&[][..], |t| &t.stages[..]);
    let mut plugin = Plugin::load_file(&engine, &args.file, stages.first().map_or(limits, |s| s.1.clone()), None)?;
    // Loaded again with the limits of the stage of its world, when a
    // pipeline runs two plugins with different limits.
    if let Some((_, limits)) = stages.iter().find(|(w, _)| *w == plugin.world()) {
        if limits != plugin.limits() {
            plugin = Plugin::load_file(&engine, &args.file, limits.clone(), None)?;
        }
    }
    let loaded_in = loading.elapsed();
    let d = plugin.description();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} ({}), sha256 {}, loaded in {:.2} s",
        plugin.label(),
        plugin.world(),
        plugin.sha256(),
        loaded_in.as_secs_f64()
    );
    let _ = writeln!(out, "inputs:\n{}\noutputs:\n{}", describe_specs(&d.inputs), describe_specs(&d.outputs));
    let (inputs, source) = match (&args.input, &d.sample) {
        (Some(path), _) => (from_json(path, &d.inputs)?, format!("{}", path.display())),
        (None, Some(sample)) => (sample.clone(), "its declared sample".to_string()),
        (None, None) => {
            (zeros(&d.inputs, memory_bytes(plugin.limits()))?, "zeros shaped from its declared inputs".to_string())
        }
    };
    if let Some(target) = &target {
        let _ = writeln!(out, "{}", check_fit(&plugin, target)?);
    }
    let (outputs, stats) = plugin.call_measured(inputs.clone())?;
    let _ = writeln!(
        out,
        "ran {source} in {:.3} ms, peak memory {:.1} MiB (limits: {} ms, {} MiB{})",
        stats.elapsed.as_secs_f64() * 1e3,
        stats.peak_memory as f64 / (1 << 20) as f64,
        plugin.limits().timeout_ms,
        plugin.limits().memory_mib,
        plugin.limits().fuel.map(|f| format!(", {f} fuel")).unwrap_or_default()
    );
    // What serving costs: a kept instance, as the pipeline's stage has
    // once it runs. The first call above may have paid for making it.
    let policy = plugin.limits().instances;
    if policy != crate::plugin::InstancePolicy::Fresh {
        let mut best = Duration::MAX;
        for _ in 0..STEADY_CALLS {
            best = best.min(plugin.call_measured(inputs.clone())?.1.elapsed);
        }
        let _ = writeln!(
            out,
            "then {:.3} ms a call in a kept instance (instances = \"{policy}\", the best of {STEADY_CALLS})",
            best.as_secs_f64() * 1e3
        );
    }
    for output in &outputs {
        let t = &output.tensor;
        // As the REST API writes it: NaN and the infinities by name.
        let mut preview = if t.shape().is_empty() || t.rows() == 0 {
            "null".to_string()
        } else {
            serde_json::to_string(&JsonView::row(t, 0).output(&output.name)).unwrap_or_default()
        };
        if preview.len() > 200 {
            let mut cut = 200;
            while !preview.is_char_boundary(cut) {
                cut -= 1;
            }
            preview.truncate(cut);
            preview.push('…');
        }
        let _ = writeln!(out, "  {} {} {}: row 0 = {preview}", output.name, t.dtype(), format_shape(t.shape()));
    }
    // Passed: the next check of the same bytes loads its compiled code.
    plugin.accepted();
    Ok(out)
}
