//! `image_normalize`: u8 images, rows × height × width × channels, into
//! the model's normalised f32 input, with the SDK's transform (the one the
//! `image-normalize` plugin runs too).

use sluice_sdk::transforms::{image_normalize_into, ImageNormalize as Params};

use crate::config::stage::ImageNormalizeConfig;
use crate::error::{Error, Result};
use crate::pipeline::stage::{Stage, StageCx, StageIo};
use crate::tensor::spec::{Signature, TensorSpec};
use crate::tensor::{format_shape, tensor_bytes, DType, NamedTensor, Tensor};

use super::classes::first_input;

/// Rows image_normalize converts between two checks of its request.
const ROWS_PER_PIECE: usize = 16;

/// u8 images into the model's normalised f32 input, with the SDK's
/// transform (the one the `image-normalize` plugin runs too).
pub struct ImageNormalize {
    params: Params,
    io: StageIo,
}

impl ImageNormalize {
    /// Checked against the model: it must take one f32 rows × C × H × W input.
    pub fn new(config: &ImageNormalizeConfig, model: &Signature) -> Result<ImageNormalize> {
        let spec = match model.inputs.as_slice() {
            [only] if only.dtype == DType::F32 && only.shape.len() == 4 => only,
            _ => {
                let found: Vec<String> = model.inputs.iter().map(ToString::to_string).collect();
                return Err(Error::invalid_argument(format!(
                    "image_normalize feeds a model with one DT_FLOAT input of rows × channels × height × width; this model has {found:?}"
                )));
            }
        };
        let (channels, height, width) = (spec.shape[1], spec.shape[2], spec.shape[3]);
        if channels <= 0 || height <= 0 || width <= 0 {
            return Err(Error::invalid_argument(format!(
                "image_normalize needs the model's channels, height and width fixed; input '{}' is {}",
                spec.name,
                format_shape(&spec.shape)
            )));
        }
        let c = channels as usize;
        let mean = if config.mean.is_empty() { vec![0.0; c] } else { config.mean.clone() };
        let std = if config.std.is_empty() { vec![1.0; c] } else { config.std.clone() };
        if mean.len() != c || std.len() != c {
            return Err(Error::invalid_argument(format!(
                "image_normalize: mean and std need {c} values (the model's channels); got {} and {}",
                mean.len(),
                std.len()
            )));
        }
        if std.contains(&0.0) || config.scale == 0.0 {
            return Err(Error::invalid_argument("image_normalize: std and scale must not be 0"));
        }
        Ok(ImageNormalize {
            params: Params { height: height as usize, width: width as usize, mean, std, scale: config.scale },
            io: StageIo {
                name: "image_normalize".into(),
                inputs: vec![TensorSpec::new(config.input.clone(), DType::U8, vec![-1, -1, -1, channels])],
                outputs: vec![spec.clone()],
            },
        })
    }
}

impl Stage for ImageNormalize {
    fn io(&self) -> &StageIo {
        &self.io
    }
    fn process(&self, inputs: Vec<NamedTensor>, cx: &StageCx<'_>) -> Result<Vec<NamedTensor>> {
        let image = first_input(&self.io, &inputs)?;
        let pixels = image.bytes().ok_or_else(|| Error::internal("image_normalize: input is not DT_UINT8"))?;
        let &[rows, in_h, in_w, channels] = image.shape() else {
            return Err(Error::internal("image_normalize: input is not rank 4"));
        };
        if in_h == 0 || in_w == 0 {
            return Err(Error::invalid_argument(format!(
                "input '{}' has an empty image ({in_h} × {in_w})",
                self.io.inputs[0].name
            )));
        }
        let (h, w) = (self.params.height as i64, self.params.width as i64);
        let shape = vec![rows, channels, h, w];
        // The output's size comes from the client's row count: bound it
        // before allocating, and work in pieces so that a request whose
        // client left or whose deadline passed stops using the CPU.
        let bytes = tensor_bytes(DType::F32, &shape, cx.max_tensor_bytes, "image_normalize output")?;
        let row_values = (channels * h * w) as usize;
        let row_pixels = (in_h * in_w * channels) as usize;
        let mut out = vec![0f32; bytes / 4];
        for (piece, (dst, src)) in
            out.chunks_mut(row_values * ROWS_PER_PIECE).zip(pixels.chunks(row_pixels * ROWS_PER_PIECE)).enumerate()
        {
            if piece > 0 {
                cx.check("in the image_normalize stage")?;
            }
            let n = dst.len() / row_values.max(1);
            image_normalize_into(&self.params, src, n, in_h as usize, in_w as usize, dst);
        }
        Ok(vec![NamedTensor::new(self.io.outputs[0].name.clone(), Tensor::from_values(shape, &out))])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::stages::testing::{classifier, ProcessNow};
    use bytes::Bytes;

    use crate::pipeline::deadline::Deadline;
    use crate::pipeline::stage::never_gone;
    #[test]
    fn image_normalize_transposes_scales_and_resizes() {
        let config =
            ImageNormalizeConfig { input: "pixels".into(), mean: vec![0.5; 3], std: vec![0.5; 3], scale: 255.0 };
        let stage = ImageNormalize::new(&config, &classifier(4)).unwrap();
        // One 2×2 image, HWC: channel c of pixel p is 10*p + c.
        let hwc: Vec<u8> = (0..4u8).flat_map(|p| (0..3u8).map(move |c| 10 * p + c)).collect();
        let out =
            stage.process_now(vec![NamedTensor::new("pixels", Tensor::from_values(vec![1, 2, 2, 3], &hwc))]).unwrap();
        assert_eq!(out[0].name, "image");
        assert_eq!(out[0].tensor.shape(), &[1, 3, 2, 2]);
        let v = out[0].tensor.to_vec::<f32>().unwrap();
        // NCHW: v[c*4 + p] = ((10p + c)/255 - 0.5) / 0.5.
        for c in 0..3 {
            for p in 0..4 {
                let want = ((10 * p + c) as f32 / 255.0 - 0.5) / 0.5;
                assert!((v[c * 4 + p] - want).abs() < 1e-6, "c={c} p={p}");
            }
        }
        // A 4×4 image of one value resizes to 2×2 of that value.
        let flat = vec![51u8; 4 * 4 * 3];
        let out =
            stage.process_now(vec![NamedTensor::new("pixels", Tensor::from_values(vec![1, 4, 4, 3], &flat))]).unwrap();
        assert!(out[0].tensor.to_vec::<f32>().unwrap().iter().all(|&x| (x - (0.2 - 0.5) / 0.5).abs() < 1e-6));
    }

    #[test]
    fn image_normalize_sizes_its_output_against_the_limit_before_allocating() {
        let config = ImageNormalizeConfig { input: "pixels".into(), mean: vec![], std: vec![], scale: 255.0 };
        let stage = ImageNormalize::new(&config, &classifier(4)).unwrap();
        // 20 million 1×1 images would become 20M × 3 × 2 × 2 f32 = 960 MB.
        let rows = 20_000_000i64;
        let pixels =
            Tensor::from_bytes(DType::U8, vec![rows, 1, 1, 3], Bytes::from(vec![7u8; rows as usize * 3])).unwrap();
        let cx = StageCx::new(Deadline::NONE, &never_gone, 64 << 20);
        let err = stage.process(vec![NamedTensor::new("pixels", pixels)], &cx).unwrap_err();
        assert_eq!(err.code(), crate::error::Code::ResourceExhausted);
        assert!(err.message().contains("server.max_tensor_bytes"), "{err}");
        assert!(err.message().contains("960000000"), "{err}");
    }

    #[test]
    fn image_normalize_stops_when_its_client_has_gone() {
        let config = ImageNormalizeConfig { input: "pixels".into(), mean: vec![], std: vec![], scale: 255.0 };
        let stage = ImageNormalize::new(&config, &classifier(4)).unwrap();
        let pixels = Tensor::from_values(vec![64, 2, 2, 3], &vec![1u8; 64 * 12]);
        let gone = || true;
        let cx = StageCx::new(Deadline::NONE, &gone, 1 << 30);
        let err = stage.process(vec![NamedTensor::new("pixels", pixels)], &cx).unwrap_err();
        assert!(matches!(err, Error::Cancelled(_)), "{err}");
    }
}
