//! What the postprocess built-ins share: finding the model output they
//! read (f32 rows × classes), its values, softmax and the top indexes.

use crate::config::stage::ReduceConfig;
use crate::error::{Error, Result};
use crate::pipeline::stage::StageIo;
use crate::tensor::spec::{Signature, TensorSpec};
use crate::tensor::{format_shape, DType, NamedTensor, Tensor};

/// Finds the model output a postprocess stage reads: named, or the only
/// one; it must be f32 rows × classes. Returns the stage's input spec and
/// the classes (-1 where the model leaves them free).
pub(super) fn model_output(signature: &Signature, input: Option<&str>, stage: &str) -> Result<(TensorSpec, i64)> {
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
    let classes = spec.shape[1];
    Ok((TensorSpec::new(spec.name.clone(), DType::F32, vec![-1, classes]), classes))
}

/// The interface of a stage that reads one model output of f32 rows ×
/// classes and returns the one `output` makes from the classes.
pub(super) fn reduce_io(
    stage: &str,
    config: &ReduceConfig,
    model: &Signature,
    output: impl FnOnce(i64) -> TensorSpec,
) -> Result<StageIo> {
    let (input, classes) = model_output(model, config.input.as_deref(), stage)?;
    Ok(StageIo { name: stage.to_string(), inputs: vec![input], outputs: vec![output(classes)] })
}

/// The tensor a one-input stage reads.
pub(super) fn first_input<'a>(io: &StageIo, inputs: &'a [NamedTensor]) -> Result<&'a Tensor> {
    let (name, stage) = (&io.inputs[0].name, &io.name);
    inputs
        .iter()
        .find(|t| &t.name == name)
        .map(|t| &t.tensor)
        .ok_or_else(|| Error::internal(format!("{stage}: input '{name}' is missing, this is a bug")))
}

/// Rows × classes of a stage's rank-2 f32 input, as values.
pub(super) fn class_rows(io: &StageIo, inputs: &[NamedTensor]) -> Result<(usize, usize, Vec<f32>)> {
    let (tensor, stage) = (first_input(io, inputs)?, &io.name);
    let values = tensor.to_vec::<f32>().ok_or_else(|| Error::internal(format!("{stage}: input is not DT_FLOAT")))?;
    let (rows, cols) = match tensor.shape() {
        [rows, cols] => (*rows as usize, *cols as usize),
        other => return Err(Error::internal(format!("{stage}: input has shape {other:?}, not rows × classes"))),
    };
    // A graph may hand a client's tensor straight to a built-in.
    if cols == 0 && rows > 0 {
        return Err(Error::invalid_argument(format!(
            "{stage}: input '{}' has shape [{rows}, 0]: rows of no classes",
            io.inputs[0].name
        )));
    }
    Ok((rows, cols, values))
}

pub(super) fn softmax_in_place(row: &mut [f32]) {
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

/// Indexes of the `k` largest values, largest first; ties keep the lower
/// index first. NaN sorts below everything.
pub fn top_indexes(row: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..row.len()).collect();
    let key = |i: usize| if row[i].is_nan() { f32::NEG_INFINITY } else { row[i] };
    order.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
    order.truncate(k);
    order
}
