//! A test fixture: a preprocessor whose `describe` lies, in the way the
//! build feature picks — a negative dimension other than -1 (and outputs
//! of shape [2^40, 0] with no bytes), an input of 2^40 elements with no
//! sample, a 2 MiB name, a name that would forge a metric line. The host
//! must refuse each before sizing or printing anything from it.

wit_bindgen::generate!({
    path: "../../sdk/wit",
    world: "preprocessor",
});

use sluice::plugin::types::{Dtype, TensorSpec};

struct Liar;

fn spec(name: &str, shape: &[i64]) -> TensorSpec {
    TensorSpec { name: name.into(), dtype: Dtype::F32, shape: shape.to_vec() }
}

fn name() -> String {
    if cfg!(feature = "long-name") {
        "a".repeat(2 << 20)
    } else if cfg!(feature = "newline-name") {
        "liar\nsluice_forged_metric 1".to_string()
    } else {
        "liar".to_string()
    }
}

impl Guest for Liar {
    fn describe() -> PluginInfo {
        let (input, output) = if cfg!(feature = "negative-dim") {
            (spec("x", &[-1, 64]), spec("x", &[-1, -2]))
        } else if cfg!(feature = "huge-input") {
            (spec("x", &[1 << 40]), spec("x", &[1 << 40]))
        } else {
            (spec("x", &[-1, 64]), spec("x", &[-1, 64]))
        };
        PluginInfo { name: name(), version: "0.0.1".into(), inputs: vec![input], outputs: vec![output], sample: None }
    }

    fn preprocess(inputs: Vec<Tensor>) -> Result<Vec<Tensor>, PluginError> {
        let x = inputs.into_iter().next().ok_or(PluginError::InvalidInput("no x".into()))?;
        // Rows of nothing: shape [2^40, 0], zero bytes.
        Ok(vec![Tensor { shape: vec![1 << 40, 0], data: Vec::new(), ..x }])
    }
}

export!(Liar);
