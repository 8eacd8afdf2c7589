//! `softmax`: probabilities over the classes of one model output.

use crate::config::stage::ReduceConfig;
use crate::error::Result;
use crate::pipeline::stage::{Stage, StageCx, StageIo};
use crate::tensor::spec::{Signature, TensorSpec};
use crate::tensor::{DType, NamedTensor, Tensor};

use super::classes::{class_rows, reduce_io, softmax_in_place};

/// Softmax over classes.
pub struct Softmax {
    io: StageIo,
}

impl Softmax {
    /// Checked against the model's signature.
    pub fn new(config: &ReduceConfig, model: &Signature) -> Result<Softmax> {
        Ok(Softmax {
            io: reduce_io("softmax", config, model, |classes| {
                TensorSpec::new("probabilities", DType::F32, vec![-1, classes])
            })?,
        })
    }
}

impl Stage for Softmax {
    fn io(&self) -> &StageIo {
        &self.io
    }
    fn process(&self, inputs: Vec<NamedTensor>, _cx: &StageCx<'_>) -> Result<Vec<NamedTensor>> {
        let (rows, cols, mut values) = class_rows(&self.io, &inputs)?;
        for row in values.chunks_exact_mut(cols.max(1)) {
            softmax_in_place(row);
        }
        Ok(vec![NamedTensor::new("probabilities", Tensor::from_values(vec![rows as i64, cols as i64], &values))])
    }
}
