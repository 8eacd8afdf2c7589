//! Running a plugin natively, under the checks the host makes: inputs must
//! fit what the plugin declares, and outputs must be exactly what it
//! declares (names in order, dtypes, shapes, byte lengths). `cargo test`
//! of a plugin crate needs no WebAssembly and no host.

use crate::{Inputs, PluginError, PluginInfo, Postprocessor, Preprocessor, Tensor};

/// Calls a preprocessor as the host would.
pub fn run_preprocessor<P: Preprocessor>(inputs: Vec<Tensor>) -> Result<Vec<Tensor>, PluginError> {
    run(P::describe(), inputs, P::preprocess)
}

/// Calls a postprocessor as the host would.
pub fn run_postprocessor<P: Postprocessor>(inputs: Vec<Tensor>) -> Result<Vec<Tensor>, PluginError> {
    run(P::describe(), inputs, P::postprocess)
}

/// Calls a preprocessor with its declared sample.
pub fn run_preprocessor_sample<P: Preprocessor>() -> Result<Vec<Tensor>, PluginError> {
    let sample = P::describe().sample.ok_or_else(|| PluginError::internal("the plugin declares no sample"))?;
    run_preprocessor::<P>(sample)
}

/// Calls a postprocessor with its declared sample.
pub fn run_postprocessor_sample<P: Postprocessor>() -> Result<Vec<Tensor>, PluginError> {
    let sample = P::describe().sample.ok_or_else(|| PluginError::internal("the plugin declares no sample"))?;
    run_postprocessor::<P>(sample)
}

fn run(
    info: PluginInfo,
    inputs: Vec<Tensor>,
    call: fn(Inputs) -> Result<Vec<Tensor>, PluginError>,
) -> Result<Vec<Tensor>, PluginError> {
    for spec in &info.inputs {
        let tensor = inputs
            .iter()
            .find(|t| t.name() == spec.name)
            .ok_or_else(|| PluginError::invalid_input(format!("missing input '{}'", spec.name)))?;
        if let Some(why) = spec.mismatch(tensor) {
            return Err(PluginError::invalid_input(why));
        }
    }
    let outputs = call(Inputs::new(inputs))?;
    check_outputs(&info, &outputs)?;
    Ok(outputs)
}

/// The host's check of what a plugin returned.
pub fn check_outputs(info: &PluginInfo, outputs: &[Tensor]) -> Result<(), PluginError> {
    let names: Vec<&str> = outputs.iter().map(|t| t.name()).collect();
    let declared: Vec<&str> = info.outputs.iter().map(|s| s.name.as_str()).collect();
    if names != declared {
        return Err(PluginError::internal(format!(
            "plugin '{}' {} returned outputs {names:?}, but declares {declared:?}",
            info.name, info.version
        )));
    }
    for (tensor, spec) in outputs.iter().zip(&info.outputs) {
        if let Some(why) = spec.mismatch(tensor) {
            return Err(PluginError::internal(format!("plugin '{}' {}: {why}", info.name, info.version)));
        }
    }
    Ok(())
}
