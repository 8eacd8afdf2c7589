//! `image-normalize`: u8 images (rows × height × width × 3, any size) into
//! the example CNN's input (rows × 3 × 32 × 32 f32), resized bilinearly and
//! normalised with ImageNet's per-channel mean and standard deviation.

use sluice_sdk::transforms::{image_normalize, ImageNormalize as Params};
use sluice_sdk::{DType, Inputs, PluginError, PluginInfo, Preprocessor, Tensor, TensorSpec};

/// The plugin.
pub struct ImageNormalize;

/// The transform's parameters: the CNN's input size, ImageNet statistics.
pub fn params() -> Params {
    Params { height: 32, width: 32, mean: vec![0.485, 0.456, 0.406], std: vec![0.229, 0.224, 0.225], scale: 255.0 }
}

impl Preprocessor for ImageNormalize {
    fn describe() -> PluginInfo {
        PluginInfo::new("image-normalize", "1.0.0")
            .input(TensorSpec::new("pixels", DType::U8, &[-1, -1, -1, 3]))
            .output(TensorSpec::new("image", DType::F32, &[-1, 3, 32, 32]))
            .sample(vec![Tensor::new("pixels", vec![1, 32, 32, 3], &[128u8; 32 * 32 * 3]).expect("sample")])
    }

    fn preprocess(inputs: Inputs) -> Result<Vec<Tensor>, PluginError> {
        let pixels = inputs.get("pixels")?;
        let &[rows, height, width, _] = pixels.shape() else {
            return Err(PluginError::invalid_input("pixels must be rows × height × width × 3"));
        };
        if height < 1 || width < 1 {
            return Err(PluginError::invalid_input(format!("pixels has an empty image ({height} × {width})")));
        }
        let values = pixels.values::<u8>()?;
        let out = image_normalize(&params(), &values, rows as usize, height as usize, width as usize);
        Ok(vec![Tensor::new("image", vec![rows, 3, 32, 32], &out)?])
    }
}

sluice_sdk::export_preprocessor!(ImageNormalize);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::testing::{run_preprocessor, run_preprocessor_sample};

    #[test]
    fn normalises_and_transposes() {
        let mut hwc = vec![0u8; 32 * 32 * 3];
        hwc[0] = 255; // pixel (0, 0), red
        let out =
            run_preprocessor::<ImageNormalize>(vec![Tensor::new("pixels", vec![1, 32, 32, 3], &hwc).unwrap()]).unwrap();
        let image = out[0].values::<f32>().unwrap();
        assert!((image[0] - (1.0 - 0.485) / 0.229).abs() < 1e-5);
        assert!((image[32 * 32] - (0.0 - 0.456) / 0.224).abs() < 1e-5, "green plane starts at 1024");
    }

    #[test]
    fn resizes_any_size_and_rejects_empty_images() {
        let big = Tensor::new("pixels", vec![2, 64, 48, 3], &vec![7u8; 2 * 64 * 48 * 3]).unwrap();
        let out = run_preprocessor::<ImageNormalize>(vec![big]).unwrap();
        assert_eq!(out[0].shape(), &[2, 3, 32, 32]);
        let empty = Tensor::new("pixels", vec![1, 0, 4, 3], &[0u8; 0]).unwrap();
        assert!(matches!(run_preprocessor::<ImageNormalize>(vec![empty]), Err(PluginError::InvalidInput(_))));
        assert!(run_preprocessor_sample::<ImageNormalize>().is_ok());
    }

    #[test]
    fn wrong_dtype_is_an_input_error() {
        let floats = Tensor::new("pixels", vec![1, 2, 2, 3], &[0f32; 12]).unwrap();
        assert!(matches!(run_preprocessor::<ImageNormalize>(vec![floats]), Err(PluginError::InvalidInput(_))));
    }
}
