//! Built-in stages: `image_normalize` before the model; `softmax`, `argmax`
//! and `top_k` after it. Each is configured in a pipeline's `preprocess` or
//! `postprocess` table (`config::stage`) and checked against the model when
//! the pipeline loads, so a mismatch is a start-up error, not a request
//! error.

use bytes::Bytes;
use sluice_sdk::transforms::{image_normalize_into, ImageNormalize as Params};

use crate::config::stage::{ImageNormalizeConfig, ReduceConfig, TopKConfig};
use crate::error::{Error, Result};
use crate::pipeline::stage::{Stage, StageCx};
use crate::tensor::spec::{Signature, TensorSpec};
use crate::tensor::{format_shape, tensor_bytes, DType, NamedTensor, Tensor};

/// Finds the model output a postprocess stage reads: named, or the only
/// one; it must be f32 rows × classes.
fn model_output(signature: &Signature, input: Option<&str>, stage: &str) -> Result<(String, i64)> {
    let spec = match input {
        Some(name) => signature.outputs.iter().find(|o| o.name == name).ok_or_else(|| {
            let names: Vec<&str> = signature.outputs.iter().map(|o| o.name.as_str()).collect();
            Error::invalid_argument(format!("{stage}: input = \"{name}\" is not a model output; outputs: {names:?}"))
        })?,
        None => match signature.outputs.as_slice() {
            [only] => only,
            many => {
                let names: Vec<&str> = many.iter().map(|o| o.name.as_str()).collect();
                return Err(Error::invalid_argument(format!(
                    "{stage}: the model has outputs {names:?}; set input to the one to read"
                )));
            }
        },
    };
    if spec.dtype != DType::F32 || spec.shape.len() != 2 {
        return Err(Error::invalid_argument(format!(
            "{stage}: model output '{}' is {} {}; {stage} reads DT_FLOAT rows × classes",
            spec.name,
            spec.dtype,
            format_shape(&spec.shape)
        )));
    }
    Ok((spec.name.clone(), spec.shape[1]))
}

fn take<'a>(inputs: &'a [NamedTensor], name: &str, stage: &str) -> Result<&'a Tensor> {
    inputs
        .iter()
        .find(|t| t.name == name)
        .map(|t| &t.tensor)
        .ok_or_else(|| Error::internal(format!("{stage}: input '{name}' is missing, this is a bug")))
}

/// Rows × classes of a rank-2 f32 tensor, as values.
fn rows_of(tensor: &Tensor, stage: &str) -> Result<(usize, usize, Vec<f32>)> {
    let values = tensor.to_vec::<f32>().ok_or_else(|| Error::internal(format!("{stage}: input is not DT_FLOAT")))?;
    let (rows, cols) = match tensor.shape() {
        [rows, cols] => (*rows as usize, *cols as usize),
        other => return Err(Error::internal(format!("{stage}: input has shape {other:?}, not rows × classes"))),
    };
    Ok((rows, cols, values))
}

fn softmax_in_place(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in row.iter_mut() {
        *v /= sum;
    }
}

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

/// The index of the largest value per row.
pub struct Argmax {
    inputs: Vec<TensorSpec>,
    outputs: Vec<TensorSpec>,
}

impl Argmax {
    /// Checked against the model's signature.
    pub fn new(config: &ReduceConfig, model: &Signature) -> Result<Argmax> {
        let (input, classes) = model_output(model, config.input.as_deref(), "argmax")?;
        Ok(Argmax {
            inputs: vec![TensorSpec { name: input, dtype: DType::F32, shape: vec![-1, classes], unknown_rank: false }],
            outputs: vec![TensorSpec {
                name: "classes".into(),
                dtype: DType::I64,
                shape: vec![-1],
                unknown_rank: false,
            }],
        })
    }
}

impl Stage for Argmax {
    fn name(&self) -> &str {
        "argmax"
    }
    fn inputs(&self) -> &[TensorSpec] {
        &self.inputs
    }
    fn outputs(&self) -> &[TensorSpec] {
        &self.outputs
    }
    fn process(&self, inputs: Vec<NamedTensor>, _cx: &StageCx<'_>) -> Result<Vec<NamedTensor>> {
        let (rows, cols, values) = rows_of(take(&inputs, &self.inputs[0].name, "argmax")?, "argmax")?;
        let classes: Vec<i64> = values
            .chunks_exact(cols.max(1))
            .map(|row| top_indexes(row, 1).first().copied().unwrap_or(0) as i64)
            .collect();
        Ok(vec![NamedTensor::new("classes", Tensor::from_values(vec![rows as i64], &classes))])
    }
}

/// Indexes of the `k` largest values, largest first; ties keep the lower
/// index first. NaN sorts below everything.
pub fn top_indexes(row: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..row.len()).collect();
    let key = |i: usize| if row[i].is_nan() { f32::NEG_INFINITY } else { row[i] };
    order.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
    order.truncate(k);
    order
}

/// The k best classes per row.
#[derive(Debug)]
pub struct TopK {
    k: usize,
    softmax: bool,
    labels: Option<Vec<Bytes>>,
    inputs: Vec<TensorSpec>,
    outputs: Vec<TensorSpec>,
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
            TensorSpec { name: "scores".into(), dtype: DType::F32, shape: vec![-1, k], unknown_rank: false },
            TensorSpec { name: "classes".into(), dtype: DType::I64, shape: vec![-1, k], unknown_rank: false },
        ];
        if labels.is_some() {
            outputs.push(TensorSpec {
                name: "labels".into(),
                dtype: DType::String,
                shape: vec![-1, k],
                unknown_rank: false,
            });
        }
        Ok(TopK {
            k: config.k,
            softmax: config.softmax,
            labels,
            inputs: vec![TensorSpec { name: input, dtype: DType::F32, shape: vec![-1, classes], unknown_rank: false }],
            outputs,
        })
    }
}

impl Stage for TopK {
    fn name(&self) -> &str {
        "top_k"
    }
    fn inputs(&self) -> &[TensorSpec] {
        &self.inputs
    }
    fn outputs(&self) -> &[TensorSpec] {
        &self.outputs
    }
    fn process(&self, inputs: Vec<NamedTensor>, _cx: &StageCx<'_>) -> Result<Vec<NamedTensor>> {
        let (rows, cols, mut values) = rows_of(take(&inputs, &self.inputs[0].name, "top_k")?, "top_k")?;
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

/// Rows image_normalize converts between two checks of its request.
const ROWS_PER_PIECE: usize = 16;

/// u8 images into the model's normalised f32 input, with the SDK's
/// transform (the one the `image-normalize` plugin runs too).
pub struct ImageNormalize {
    params: Params,
    inputs: Vec<TensorSpec>,
    outputs: Vec<TensorSpec>,
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
            inputs: vec![TensorSpec {
                name: config.input.clone(),
                dtype: DType::U8,
                shape: vec![-1, -1, -1, channels],
                unknown_rank: false,
            }],
            outputs: vec![spec.clone()],
        })
    }
}

impl Stage for ImageNormalize {
    fn name(&self) -> &str {
        "image_normalize"
    }
    fn inputs(&self) -> &[TensorSpec] {
        &self.inputs
    }
    fn outputs(&self) -> &[TensorSpec] {
        &self.outputs
    }
    fn process(&self, inputs: Vec<NamedTensor>, cx: &StageCx<'_>) -> Result<Vec<NamedTensor>> {
        let image = take(&inputs, &self.inputs[0].name, "image_normalize")?;
        let pixels = image.bytes().ok_or_else(|| Error::internal("image_normalize: input is not DT_UINT8"))?;
        let &[rows, in_h, in_w, channels] = image.shape() else {
            return Err(Error::internal("image_normalize: input is not rank 4"));
        };
        if in_h == 0 || in_w == 0 {
            return Err(Error::invalid_argument(format!(
                "input '{}' has an empty image ({in_h} × {in_w})",
                self.inputs[0].name
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
        Ok(vec![NamedTensor::new(self.outputs[0].name.clone(), Tensor::from_values(shape, &out))])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::deadline::Deadline;
    use crate::pipeline::stage::never_gone;

    trait ProcessNow {
        fn process_now(&self, inputs: Vec<NamedTensor>) -> Result<Vec<NamedTensor>>;
    }

    impl<S: Stage> ProcessNow for S {
        fn process_now(&self, inputs: Vec<NamedTensor>) -> Result<Vec<NamedTensor>> {
            self.process(inputs, &StageCx::new(Deadline::NONE, &never_gone, 1 << 30))
        }
    }

    fn classifier(classes: i64) -> Signature {
        Signature {
            inputs: vec![TensorSpec {
                name: "image".into(),
                dtype: DType::F32,
                shape: vec![-1, 3, 2, 2],
                unknown_rank: false,
            }],
            outputs: vec![TensorSpec {
                name: "logits".into(),
                dtype: DType::F32,
                shape: vec![-1, classes],
                unknown_rank: false,
            }],
        }
    }

    fn logits(rows: &[&[f32]]) -> Vec<NamedTensor> {
        let cols = rows[0].len() as i64;
        let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        vec![NamedTensor::new("logits", Tensor::from_values(vec![rows.len() as i64, cols], &flat))]
    }

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
