//! `argmax`: the best class per row of one model output.

use crate::config::stage::ReduceConfig;
use crate::error::Result;
use crate::pipeline::stage::{Stage, StageCx, StageIo};
use crate::tensor::spec::{Signature, TensorSpec};
use crate::tensor::{DType, NamedTensor, Tensor};

use super::classes::{class_rows, reduce_io, top_indexes};

/// The index of the largest value per row.
pub struct Argmax {
    io: StageIo,
}

impl Argmax {
    /// Checked against the model's signature.
    pub fn new(config: &ReduceConfig, model: &Signature) -> Result<Argmax> {
        Ok(Argmax { io: reduce_io("argmax", config, model, |_| TensorSpec::new("classes", DType::I64, vec![-1]))? })
    }
}

impl Stage for Argmax {
    fn io(&self) -> &StageIo {
        &self.io
    }
    fn process(&self, inputs: Vec<NamedTensor>, _cx: &StageCx<'_>) -> Result<Vec<NamedTensor>> {
        let (rows, cols, values) = class_rows(&self.io, &inputs)?;
        let classes: Vec<i64> = values
            .chunks_exact(cols.max(1))
            .map(|row| top_indexes(row, 1).first().copied().unwrap_or(0) as i64)
            .collect();
        Ok(vec![NamedTensor::new("classes", Tensor::from_values(vec![rows as i64], &classes))])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::stages::softmax::Softmax;
    use crate::pipeline::stages::testing::{classifier, logits, ProcessNow};
    #[test]
    fn softmax_and_argmax() {
        let softmax = Softmax::new(&ReduceConfig::default(), &classifier(3)).unwrap();
        let out = softmax.process_now(logits(&[&[1.0, 2.0, 3.0]])).unwrap();
        let p = out[0].tensor.to_vec::<f32>().unwrap();
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(p[2] > p[1] && p[1] > p[0]);
        let argmax = Argmax::new(&ReduceConfig::default(), &classifier(3)).unwrap();
        let out = argmax.process_now(logits(&[&[1.0, 9.0, 3.0], &[7.0, 2.0, 3.0]])).unwrap();
        assert_eq!(out[0].tensor.to_vec::<i64>().unwrap(), vec![1, 0]);
    }
}
