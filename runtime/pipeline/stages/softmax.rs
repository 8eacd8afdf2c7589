//! `softmax`: probabilities over the classes of one model output.

use crate::config::stage::ReduceConfig;
use crate::error::Result;
use crate::pipeline::stage::{Stage, StageCx};
use crate::tensor::spec::{Signature, TensorSpec};
use crate::tensor::{DType, NamedTensor, Tensor};

use super::classes::{model_output, rows_of, softmax_in_place, take};

/// Softmax over classes.
pub struct Softmax {
    inputs: Vec<TensorSpec>,
    outputs: Vec<TensorSpec>,
}

impl Softmax {
    /// Checked against the model's signature.
    pub fn new(config: &ReduceConfig, model: &Signature) -> Result<Softmax> {
        let (input, classes) = model_output(model, config.input.as_deref(), "softmax")?;
        Ok(Softmax {
            inputs: vec![TensorSpec { name: input, dtype: DType::F32, shape: vec![-1, classes], unknown_rank: false }],
            outputs: vec![TensorSpec {
                name: "probabilities".into(),
                dtype: DType::F32,
                shape: vec![-1, classes],
                unknown_rank: false,
            }],
        })
    }
}

impl Stage for Softmax {
    fn name(&self) -> &str {
        "softmax"
    }
    fn inputs(&self) -> &[TensorSpec] {
        &self.inputs
    }
    fn outputs(&self) -> &[TensorSpec] {
        &self.outputs
    }
    fn process(&self, inputs: Vec<NamedTensor>, _cx: &StageCx<'_>) -> Result<Vec<NamedTensor>> {
        let (rows, cols, mut values) = rows_of(take(&inputs, &self.inputs[0].name, "softmax")?, "softmax")?;
        for row in values.chunks_exact_mut(cols.max(1)) {
            softmax_in_place(row);
        }
        Ok(vec![NamedTensor::new("probabilities", Tensor::from_values(vec![rows as i64, cols as i64], &values))])
    }
}
