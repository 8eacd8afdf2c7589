//! `scale`: doubles its input. The same interface as `identity` with a
//! different answer, so a test or a benchmark can swap one for the other
//! under load and tell, from each answer, which version served it.
//!
//! Built with the `flaky` feature it is a bad release: it passes every
//! upload check (zeros) but fails on rows whose first value is above 1, as
//! a canary that must be rolled back.

use sluice_sdk::{DType, Inputs, PluginError, PluginInfo, Preprocessor, Tensor, TensorSpec};

/// The plugin.
pub struct Scale;

impl Preprocessor for Scale {
    fn describe() -> PluginInfo {
        PluginInfo::new("scale", if cfg!(feature = "flaky") { "1.0.1-flaky" } else { "1.0.0" })
            .input(TensorSpec::new("x", DType::F32, &[-1, 64]))
            .output(TensorSpec::new("x", DType::F32, &[-1, 64]))
    }

    fn preprocess(inputs: Inputs) -> Result<Vec<Tensor>, PluginError> {
        let x = inputs.get("x")?;
        if cfg!(feature = "flaky") && x.values::<f32>()?.chunks(64).any(|row| row.first().is_some_and(|&v| v > 1.0)) {
            return Err(PluginError::Internal("the flaky release fails on this row".into()));
        }
        let doubled: Vec<f32> = x.values::<f32>()?.iter().map(|v| v * 2.0).collect();
        Ok(vec![Tensor::new("x", x.shape().to_vec(), &doubled)?])
    }
}

sluice_sdk::export_preprocessor!(Scale);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_its_input() {
        let x = Tensor::new("x", vec![1, 64], &[1.5f32; 64]).unwrap();
        let out = sluice_sdk::testing::run_preprocessor::<Scale>(vec![x]).unwrap();
        assert_eq!(&*out[0].values::<f32>().unwrap(), &[3.0f32; 64][..]);
    }
}
