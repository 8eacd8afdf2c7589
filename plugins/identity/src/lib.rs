//! `identity`: returns its input unchanged. The smallest possible plugin,
//! used to measure what calling a plugin costs.

use sluice_sdk::{DType, Inputs, PluginError, PluginInfo, Preprocessor, Tensor, TensorSpec};

/// The plugin.
pub struct Identity;

impl Preprocessor for Identity {
    fn describe() -> PluginInfo {
        PluginInfo::new("identity", "1.0.0")
            .input(TensorSpec::new("x", DType::F32, &[-1, 64]))
            .output(TensorSpec::new("x", DType::F32, &[-1, 64]))
            .sample(vec![Tensor::new("x", vec![1, 64], &[0f32; 64]).expect("sample")])
    }

    fn preprocess(inputs: Inputs) -> Result<Vec<Tensor>, PluginError> {
        Ok(inputs.into_vec())
    }
}

sluice_sdk::export_preprocessor!(Identity);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_its_input() {
        let x = Tensor::new("x", vec![2, 64], &[1.5f32; 128]).unwrap();
        assert_eq!(sluice_sdk::testing::run_preprocessor::<Identity>(vec![x.clone()]).unwrap(), vec![x]);
    }
}
