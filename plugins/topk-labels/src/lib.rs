//! `topk-labels`: the example CNN's logits (rows × 10) into the three most
//! likely classes per row: softmax probabilities, class indexes and CIFAR-10
//! label strings.

use sluice_sdk::{DType, Inputs, PluginError, PluginInfo, Postprocessor, Tensor, TensorSpec};

/// The plugin.
pub struct TopKLabels;

/// How many classes to return.
pub const K: usize = 3;

/// The CIFAR-10 classes, in index order.
pub const LABELS: [&str; 10] =
    ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"];

/// Softmax of one row.
pub fn softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f32> = row.iter().map(|v| (v - max).exp()).collect();
    let sum: f32 = exp.iter().sum();
    exp.iter().map(|v| v / sum).collect()
}

/// Indexes of the `k` largest values, largest first, ties to the lower index.
pub fn top(row: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..row.len()).collect();
    order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    order.truncate(k);
    order
}

impl Postprocessor for TopKLabels {
    fn describe() -> PluginInfo {
        PluginInfo::new("topk-labels", "1.0.0")
            .input(TensorSpec::new("logits", DType::F32, &[-1, 10]))
            .output(TensorSpec::new("scores", DType::F32, &[-1, K as i64]))
            .output(TensorSpec::new("classes", DType::I64, &[-1, K as i64]))
            .output(TensorSpec::new("labels", DType::String, &[-1, K as i64]))
            .sample(vec![Tensor::new("logits", vec![1, 10], &[0.5f32; 10]).expect("sample")])
    }

    fn postprocess(inputs: Inputs) -> Result<Vec<Tensor>, PluginError> {
        let logits = inputs.get("logits")?;
        let values = logits.values::<f32>()?;
        let rows = logits.rows();
        let (mut scores, mut classes, mut labels) = (Vec::new(), Vec::new(), Vec::new());
        for row in values.chunks_exact(10) {
            let p = softmax(row);
            for i in top(&p, K) {
                scores.push(p[i]);
                classes.push(i as i64);
                labels.push(LABELS[i].as_bytes().to_vec());
            }
        }
        let shape = vec![rows as i64, K as i64];
        Ok(vec![
            Tensor::new("scores", shape.clone(), &scores)?,
            Tensor::new("classes", shape.clone(), &classes)?,
            Tensor::from_strings("labels", shape, labels)?,
        ])
    }
}

sluice_sdk::export_postprocessor!(TopKLabels);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::testing::{run_postprocessor, run_postprocessor_sample};

    #[test]
    fn picks_the_three_most_likely_with_labels() {
        let mut row = [0f32; 10];
        row[3] = 5.0;
        row[7] = 4.0;
        row[1] = 3.0;
        let out = run_postprocessor::<TopKLabels>(vec![Tensor::new("logits", vec![1, 10], &row).unwrap()]).unwrap();
        assert_eq!(&*out[1].values::<i64>().unwrap(), &[3, 7, 1]);
        assert_eq!(out[2].strings(), &[b"cat".to_vec(), b"horse".to_vec(), b"automobile".to_vec()]);
        let scores = out[0].values::<f32>().unwrap();
        assert!(scores[0] > scores[1] && scores[1] > scores[2]);
        assert!((softmax(&row).iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(run_postprocessor_sample::<TopKLabels>().is_ok());
    }

    #[test]
    fn the_wrong_class_count_is_refused() {
        let err = run_postprocessor::<TopKLabels>(vec![Tensor::new("logits", vec![1, 9], &[0f32; 9]).unwrap()]);
        assert!(matches!(err, Err(PluginError::InvalidInput(_))));
    }
}
