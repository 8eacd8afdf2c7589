//! Running a plugin natively, under the checks the host makes. Inputs are
//! checked as the server checks a request before any plugin sees it:
//! exactly the declared names, each fitting its declared dtype, rank and
//! fixed dimensions, and inputs with a free first dimension (the batch)
//! holding at least one row, the same number in each. Outputs must be
//! exactly what it declares (names in order, dtypes, shapes, byte lengths)
//! with as many rows as it was given. `cargo test` of a plugin crate needs
//! no WebAssembly and no host.

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
    let rows = check_inputs(&info, &inputs)?;
    let outputs = call(Inputs::new(inputs))?;
    check_outputs(&info, &outputs)?;
    if let Some(rows) = rows {
        for (tensor, spec) in outputs.iter().zip(&info.outputs) {
            let got = tensor.shape().first().copied();
            if spec.shape.first() == Some(&-1) && got != Some(rows) {
                return Err(PluginError::internal(format!(
                    "plugin '{}' {} returned {} rows in '{}' for {rows} rows in; the host refuses that",
                    info.name,
                    info.version,
                    got.unwrap_or(0),
                    tensor.name()
                )));
            }
        }
    }
    Ok(outputs)
}

/// The server's checks of a request's tensors against what the plugin
/// declares; answers the rows of the batch, when it has one.
pub fn check_inputs(info: &PluginInfo, inputs: &[Tensor]) -> Result<Option<i64>, PluginError> {
    for tensor in inputs {
        if !info.inputs.iter().any(|spec| spec.name == tensor.name()) {
            let declared: Vec<&str> = info.inputs.iter().map(|s| s.name.as_str()).collect();
            return Err(PluginError::invalid_input(format!(
                "unexpected input '{}'; the plugin declares {declared:?}",
                tensor.name()
            )));
        }
    }
    let mut rows: Option<(i64, &str)> = None;
    for spec in &info.inputs {
        let mut given = inputs.iter().filter(|t| t.name() == spec.name);
        let tensor =
            given.next().ok_or_else(|| PluginError::invalid_input(format!("missing input '{}'", spec.name)))?;
        if given.next().is_some() {
            return Err(PluginError::invalid_input(format!("input '{}' is given twice", spec.name)));
        }
        if let Some(why) = spec.mismatch(tensor) {
            return Err(PluginError::invalid_input(why));
        }
        if spec.shape.first() == Some(&-1) {
            let n = tensor.shape().first().copied().unwrap_or(0);
            if n == 0 {
                return Err(PluginError::invalid_input(format!(
                    "input '{}' has 0 rows; the server never sends a request without rows",
                    spec.name
                )));
            }
            match rows {
                Some((r, first)) if r != n => {
                    return Err(PluginError::invalid_input(format!(
                        "input '{}' has {n} rows but input '{first}' has {r}; the server sends every batched input \
                         with the same rows",
                        spec.name
                    )))
                }
                None => rows = Some((n, spec.name.as_str())),
                _ => {}
            }
        }
    }
    Ok(rows.map(|(r, _)| r))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, TensorSpec};

    fn info() -> PluginInfo {
        PluginInfo::new("p", "1")
            .input(TensorSpec::new("a", DType::F32, &[-1, 3]))
            .input(TensorSpec::new("b", DType::F32, &[-1]))
            .output(TensorSpec::new("y", DType::F32, &[-1, 3]))
    }

    #[test]
    fn the_harness_refuses_what_the_server_never_sends() {
        let a = |rows: i64| Tensor::new("a", vec![rows, 3], &vec![0f32; rows as usize * 3]).unwrap();
        let b = |rows: i64| Tensor::new("b", vec![rows], &vec![0f32; rows as usize]).unwrap();
        assert_eq!(check_inputs(&info(), &[a(2), b(2)]), Ok(Some(2)));
        let cases = [
            (vec![a(0), b(0)], "0 rows"),
            (vec![a(2), b(1)], "1 rows but input 'a' has 2"),
            (vec![a(1)], "missing input 'b'"),
            (vec![a(1), b(1), Tensor::new("c", vec![1], &[0f32]).unwrap()], "unexpected input 'c'"),
            (vec![Tensor::new("a", vec![1, 4], &[0f32; 4]).unwrap(), b(1)], "a"),
        ];
        for (inputs, says) in cases {
            match check_inputs(&info(), &inputs) {
                Err(PluginError::InvalidInput(m)) => assert!(m.contains(says), "{says:?} not in {m}"),
                other => panic!("{says}: {other:?}"),
            }
        }
    }
}
