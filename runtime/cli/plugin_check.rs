//! `sluice plugin check`: load a plugin as the server would, say what it
//! declares, and run a sample under the real limits, reporting time and
//! peak memory — before it goes anywhere near a server.

use std::fmt::Write;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use crate::error::{Error, Result};
use crate::plugin::{memory_bytes, zeros, Plugin, PluginEngine, PluginLimits, PluginsConfig};
use crate::tensor::json::{row_to_json, tensor_from_json};
use crate::tensor::spec::TensorSpec;
use crate::tensor::{format_shape, NamedTensor};

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
}

fn describe_specs(specs: &[TensorSpec]) -> String {
    specs.iter().map(|s| format!("  {} {} {}", s.name, s.dtype, format_shape(&s.shape))).collect::<Vec<_>>().join("\n")
}

fn from_json(path: &PathBuf, specs: &[TensorSpec]) -> Result<Vec<NamedTensor>> {
    let text =
        std::fs::read_to_string(path).map_err(|e| Error::invalid_argument(format!("{}: {e}", path.display())))?;
    let body: serde_json::Value = serde_json::from_str(&text)
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
        tensors.push(NamedTensor::new(name.clone(), tensor_from_json(value, spec.dtype, &format!("input '{name}'"))?));
    }
    Ok(tensors)
}

/// Runs the check and returns the report to print.
pub fn run(args: &CheckArgs) -> Result<String> {
    let config = PluginsConfig { fuel: args.fuel.is_some(), max_instances: 4, ..PluginsConfig::default() };
    let engine = Arc::new(PluginEngine::new(&config)?);
    let limits = PluginLimits {
        timeout_ms: args.timeout_ms,
        memory_mib: args.memory_mib,
        fuel: args.fuel,
        reuse_instance: false,
    };
    let plugin = Plugin::load_file(&engine, &args.file, limits, None)?;
    let d = plugin.description();
    let mut out = String::new();
    let _ = writeln!(out, "{} ({}), sha256 {}", plugin.label(), plugin.world(), plugin.sha256());
    let _ = writeln!(out, "inputs:\n{}\noutputs:\n{}", describe_specs(&d.inputs), describe_specs(&d.outputs));
    let (inputs, source) = match (&args.input, &d.sample) {
        (Some(path), _) => (from_json(path, &d.inputs)?, format!("{}", path.display())),
        (None, Some(sample)) => (sample.clone(), "its declared sample".to_string()),
        (None, None) => {
            (zeros(&d.inputs, memory_bytes(plugin.limits()))?, "zeros shaped from its declared inputs".to_string())
        }
    };
    let (outputs, stats) = plugin.call_measured(inputs)?;
    let _ = writeln!(
        out,
        "ran {source} in {:.3} ms, peak memory {:.1} MiB (limits: {} ms, {} MiB{})",
        stats.elapsed.as_secs_f64() * 1e3,
        stats.peak_memory as f64 / (1 << 20) as f64,
        args.timeout_ms,
        args.memory_mib,
        args.fuel.map(|f| format!(", {f} fuel")).unwrap_or_default()
    );
    for output in &outputs {
        let t = &output.tensor;
        let first = if t.shape().is_empty() || t.rows() == 0 { serde_json::Value::Null } else { row_to_json(t, 0) };
        let mut preview = first.to_string();
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
    Ok(out)
}
