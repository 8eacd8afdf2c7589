//! `feature-transform`: raw features into the example recommender's inputs.
//!
//! - `raw_dense` (rows × 13 f32): features 0–7 are counts, `log1p` then
//!   standardised; features 8–12 are bucketised at 0, 1, 10, 100 and scaled
//!   to 0..1 → `dense` (rows × 13 f32).
//! - `user_ids` (rows × 4 strings): each id hashed (FNV-1a, 64-bit) into the
//!   embedding table's 1000 rows → `ids` (rows × 4 i64).

use sluice_sdk::{DType, Inputs, PluginError, PluginInfo, Preprocessor, Tensor, TensorSpec};

/// The plugin.
pub struct FeatureTransform;

/// Rows of the recommender's embedding table.
pub const TABLE_ROWS: u64 = 1000;
/// Mean and standard deviation of `log1p(count)` for the count features.
pub const LOG_MEAN: f32 = 1.0;
/// See [`LOG_MEAN`].
pub const LOG_STD: f32 = 2.0;
/// Bucket boundaries of the last five features.
pub const BOUNDARIES: [f32; 4] = [0.0, 1.0, 10.0, 100.0];

/// FNV-1a, 64-bit.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

/// One feature's transform.
pub fn transform(index: usize, x: f32) -> f32 {
    if index < 8 {
        ((x.max(0.0)).ln_1p() - LOG_MEAN) / LOG_STD
    } else {
        BOUNDARIES.iter().filter(|&&b| x >= b).count() as f32 / BOUNDARIES.len() as f32
    }
}

impl Preprocessor for FeatureTransform {
    fn describe() -> PluginInfo {
        PluginInfo::new("feature-transform", "1.0.0")
            .input(TensorSpec::new("raw_dense", DType::F32, &[-1, 13]))
            .input(TensorSpec::new("user_ids", DType::String, &[-1, 4]))
            .output(TensorSpec::new("dense", DType::F32, &[-1, 13]))
            .output(TensorSpec::new("ids", DType::I64, &[-1, 4]))
            .sample(vec![
                Tensor::new("raw_dense", vec![1, 13], &[1f32; 13]).expect("sample"),
                Tensor::from_strings(
                    "user_ids",
                    vec![1, 4],
                    vec![b"u1".to_vec(), b"u2".to_vec(), b"u3".to_vec(), b"u4".to_vec()],
                )
                .expect("sample"),
            ])
    }

    fn preprocess(inputs: Inputs) -> Result<Vec<Tensor>, PluginError> {
        let raw = inputs.get("raw_dense")?;
        let users = inputs.get("user_ids")?;
        if raw.rows() != users.rows() {
            return Err(PluginError::invalid_input(format!(
                "raw_dense has {} rows but user_ids has {}",
                raw.rows(),
                users.rows()
            )));
        }
        let values = raw.values::<f32>()?;
        if let Some(bad) = values.iter().position(|v| !v.is_finite()) {
            return Err(PluginError::invalid_input(format!("raw_dense value {bad} is {}", values[bad])));
        }
        let dense: Vec<f32> = values.iter().enumerate().map(|(i, &x)| transform(i % 13, x)).collect();
        let ids: Vec<i64> = users.strings().iter().map(|s| (fnv1a(s) % TABLE_ROWS) as i64).collect();
        Ok(vec![Tensor::new("dense", raw.shape().to_vec(), &dense)?, Tensor::new("ids", users.shape().to_vec(), &ids)?])
    }
}

sluice_sdk::export_preprocessor!(FeatureTransform);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::testing::{run_preprocessor, run_preprocessor_sample};

    #[test]
    fn transforms_features_and_hashes_ids() {
        let mut raw = vec![0f32; 13];
        raw[0] = 9.0;
        raw[12] = 50.0;
        let out = run_preprocessor::<FeatureTransform>(vec![
            Tensor::new("raw_dense", vec![1, 13], &raw).unwrap(),
            Tensor::from_strings("user_ids", vec![1, 4], vec![b"a".to_vec(), b"b".to_vec(), b"a".to_vec(), vec![]])
                .unwrap(),
        ])
        .unwrap();
        let dense = out[0].values::<f32>().unwrap();
        assert!((dense[0] - (10f32.ln() - 1.0) / 2.0).abs() < 1e-6);
        assert_eq!(dense[12], 0.75);
        let ids = out[1].values::<i64>().unwrap();
        assert_eq!(ids[0], ids[2]);
        assert!(ids.iter().all(|&i| (0..1000).contains(&i)));
        assert_eq!(ids[3], (fnv1a(b"") % 1000) as i64);
        assert!(run_preprocessor_sample::<FeatureTransform>().is_ok());
    }

    #[test]
    fn mismatched_rows_and_nan_are_input_errors() {
        let users = |n| Tensor::from_strings("user_ids", vec![n, 4], vec![b"u".to_vec(); 4 * n as usize]).unwrap();
        let err = run_preprocessor::<FeatureTransform>(vec![
            Tensor::new("raw_dense", vec![1, 13], &[0f32; 13]).unwrap(),
            users(2),
        ]);
        assert!(matches!(err, Err(PluginError::InvalidInput(m)) if m.contains("2")));
        let mut nan = [0f32; 13];
        nan[3] = f32::NAN;
        let err =
            run_preprocessor::<FeatureTransform>(vec![Tensor::new("raw_dense", vec![1, 13], &nan).unwrap(), users(1)]);
        assert!(matches!(err, Err(PluginError::InvalidInput(m)) if m.contains("value 3")));
    }
}
