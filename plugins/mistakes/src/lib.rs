//! A test fixture: a preprocessor meant for the example MLP (`x`, f32,
//! `[batch, 64]`) that gets one thing wrong, as plugin authors do — its
//! output named `features` (wrong-name), f64 (wrong-dtype), or
//! `[batch, 63]` (wrong-shape). It runs and answers what it declares; only
//! the model does not fit. Or it fits, and drops the last row of every call
//! (drops-rows), which only the host's rows-in = rows-out check catches.

wit_bindgen::generate!({
    path: "../../sdk/wit",
    world: "preprocessor",
});

use sluice::plugin::types::{Dtype, TensorSpec};

struct Mistakes;

/// What it produces: (name, dtype, bytes per value, values per row).
fn output() -> (&'static str, Dtype, usize, i64) {
    if cfg!(feature = "wrong-name") {
        ("features", Dtype::F32, 4, 64)
    } else if cfg!(feature = "wrong-dtype") {
        ("x", Dtype::F64, 8, 64)
    } else if cfg!(feature = "wrong-shape") {
        ("x", Dtype::F32, 4, 63)
    } else {
        ("x", Dtype::F32, 4, 64)
    }
}

impl Guest for Mistakes {
    fn describe() -> PluginInfo {
        let (name, dtype, _, width) = output();
        PluginInfo {
            name: "mistakes".into(),
            version: "0.0.1".into(),
            inputs: vec![TensorSpec { name: "raw".into(), dtype: Dtype::F32, shape: vec![-1, 64] }],
            outputs: vec![TensorSpec { name: name.into(), dtype, shape: vec![-1, width] }],
            sample: cfg!(feature = "sampled-drops-rows").then(|| {
                vec![Tensor {
                    name: "raw".into(),
                    dtype: Dtype::F32,
                    shape: vec![2, 64],
                    data: vec![0u8; 2 * 64 * 4],
                    strings: Vec::new(),
                }]
            }),
        }
    }

    fn preprocess(inputs: Vec<Tensor>) -> Result<Vec<Tensor>, PluginError> {
        let raw = inputs.into_iter().next().ok_or(PluginError::InvalidInput("no raw".into()))?;
        let mut rows = raw.shape.first().copied().unwrap_or(1);
        if cfg!(feature = "drops-rows") {
            rows = (rows - 1).max(0);
        }
        let (name, dtype, size, width) = output();
        let data = vec![0u8; rows as usize * width as usize * size];
        Ok(vec![Tensor { name: name.into(), dtype, shape: vec![rows, width], data, strings: Vec::new() }])
    }
}

export!(Mistakes);
