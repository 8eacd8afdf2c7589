//! `top_k`: the k best classes per row, with scores and labels.

use bytes::Bytes;

use crate::config::stage::TopKConfig;
use crate::error::{Error, Result};
use crate::pipeline::stage::{Stage, StageCx, StageIo};
use crate::tensor::spec::{Signature, TensorSpec};
use crate::tensor::{DType, NamedTensor, Tensor};

use super::classes::{class_rows, model_output, softmax_in_place, top_indexes};

/// The k best classes per row.
#[derive(Debug)]
pub struct TopK {
    k: usize,
    softmax: bool,
    labels: Option<Vec<Bytes>>,
    io: StageIo,
}

impl TopK {
    /// Checked against the model's signature; reads the labels file.
    pub fn new(config: &TopKConfig, model: &Signature) -> Result<TopK> {
        let (input, classes) = model_output(model, config.input.as_deref(), "top_k")?;
        if config.k == 0 || (classes > 0 && config.k as i64 > classes) {
            return Err(Error::invalid_argument(format!(
                "top_k: k = {} must be between 1 and the model's {classes} classes",
                config.k
            )));
        }
        let labels = match &config.labels {
            None => None,
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| Error::invalid_argument(format!("top_k: labels = {}: {e}", path.display())))?;
                let labels: Vec<Bytes> = text.lines().map(|l| Bytes::from(l.trim().to_string())).collect();
                if classes > 0 && labels.len() as i64 != classes {
                    return Err(Error::invalid_argument(format!(
                        "top_k: labels = {} has {} lines, but the model has {classes} classes",
                        path.display(),
                        labels.len()
                    )));
                }
                Some(labels)
            }
        };
        let k = config.k as i64;
        let mut outputs = vec![
            TensorSpec::new("scores", DType::F32, vec![-1, k]),
            TensorSpec::new("classes", DType::I64, vec![-1, k]),
        ];
        if labels.is_some() {
            outputs.push(TensorSpec::new("labels", DType::String, vec![-1, k]));
        }
        Ok(TopK {
            k: config.k,
            softmax: config.softmax,
            labels,
            io: StageIo { name: "top_k".into(), inputs: vec![input], outputs },
        })
    }
}

impl Stage for TopK {
    fn io(&self) -> &StageIo {
        &self.io
    }
    fn process(&self, inputs: Vec<NamedTensor>, _cx: &StageCx<'_>) -> Result<Vec<NamedTensor>> {
        let (rows, cols, mut values) = class_rows(&self.io, &inputs)?;
        let k = self.k.min(cols);
        let mut scores = Vec::with_capacity(rows * k);
        let mut classes = Vec::with_capacity(rows * k);
        let mut labels = Vec::with_capacity(if self.labels.is_some() { rows * k } else { 0 });
        for row in values.chunks_exact_mut(cols.max(1)) {
            if self.softmax {
                softmax_in_place(row);
            }
            for i in top_indexes(row, k) {
                scores.push(row[i]);
                classes.push(i as i64);
                if let Some(names) = &self.labels {
                    labels.push(names.get(i).cloned().unwrap_or_default());
                }
            }
        }
        let shape = vec![rows as i64, k as i64];
        let mut out = vec![
            NamedTensor::new("scores", Tensor::from_values(shape.clone(), &scores)),
            NamedTensor::new("classes", Tensor::from_values(shape.clone(), &classes)),
        ];
        if self.labels.is_some() {
            out.push(NamedTensor::new("labels", Tensor::from_strings(shape, labels)?));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::stages::testing::{classifier, logits, ProcessNow};

    #[test]
    fn top_k_picks_the_largest_per_row_with_labels() {
        let dir = tempfile::tempdir().unwrap();
        let labels = dir.path().join("labels.txt");
        std::fs::write(&labels, "cat\ndog\nbird\nfish\n").unwrap();
        let config = TopKConfig { input: None, k: 2, softmax: false, labels: Some(labels) };
        let stage = TopK::new(&config, &classifier(4)).unwrap();
        let out = stage.process_now(logits(&[&[0.1, 3.0, -1.0, 2.0], &[5.0, 5.0, 0.0, 1.0]])).unwrap();
        assert_eq!(out[0].tensor.to_vec::<f32>().unwrap(), vec![3.0, 2.0, 5.0, 5.0]);
        assert_eq!(out[1].tensor.to_vec::<i64>().unwrap(), vec![1, 3, 0, 1]);
        let names: Vec<&[u8]> = out[2].tensor.strings().unwrap().iter().map(|b| &b[..]).collect();
        assert_eq!(names, vec![&b"dog"[..], b"fish", b"cat", b"dog"]);
    }

    #[test]
    fn top_k_refuses_bad_k_and_label_counts() {
        let config = TopKConfig { input: None, k: 5, softmax: false, labels: None };
        assert!(TopK::new(&config, &classifier(4)).unwrap_err().message().contains("k = 5"));
        let dir = tempfile::tempdir().unwrap();
        let labels = dir.path().join("labels.txt");
        std::fs::write(&labels, "a\nb\n").unwrap();
        let config = TopKConfig { input: None, k: 1, softmax: false, labels: Some(labels) };
        assert!(TopK::new(&config, &classifier(4)).unwrap_err().message().contains("2 lines"));
    }
}
