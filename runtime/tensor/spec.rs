//! Signatures — the inputs and outputs of a model, a stage or a pipeline,
//! with dtypes and shapes — and the checks of tensors against them: a
//! client's inputs against what the pipeline takes, a producer's declared
//! tensor against what its consumer takes, and a plugin's outputs against
//! what it declared.

use std::fmt;

use super::{format_shape, DType, NamedTensor, Tensor};
use crate::error::{Error, Result};

/// The signature key TF Serving clients use by default.
pub const DEFAULT_SIGNATURE: &str = "serving_default";

/// The method name TF Serving reports for predict signatures.
pub const PREDICT_METHOD: &str = "tensorflow/serving/predict";

/// The method name of classification signatures (Classify).
pub const CLASSIFY_METHOD: &str = "tensorflow/serving/classify";

/// The method name of regression signatures (Regress).
pub const REGRESS_METHOD: &str = "tensorflow/serving/regress";

/// The key of a model's classification signature, as TensorFlow's
/// exporters name it.
pub const CLASSIFY_SIGNATURE: &str = "classification";

/// The key of a model's regression signature.
pub const REGRESS_SIGNATURE: &str = "regression";

/// One input or output of a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// Name clients use in `inputs` / `outputs`.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Dimensions; -1 where any size is accepted.
    pub shape: Vec<i64>,
    /// The rank is not known: any shape is accepted, and `shape` is empty
    /// (TF Serving's `unknown_rank: true`).
    pub unknown_rank: bool,
}

impl TensorSpec {
    /// A spec of known rank.
    pub fn new(name: impl Into<String>, dtype: DType, shape: Vec<i64>) -> TensorSpec {
        TensorSpec { name: name.into(), dtype, shape, unknown_rank: false }
    }

    /// A concrete shape this spec takes for a made-up request of `rows`
    /// rows: fixed dimensions as declared, a free dimension 0 `rows`,
    /// other free dimensions 1.
    pub fn shape_with_rows(&self, rows: i64) -> Vec<i64> {
        self.shape
            .iter()
            .enumerate()
            .map(|(axis, &d)| match (axis, d) {
                (_, d) if d >= 0 => d,
                (0, _) => rows,
                _ => 1,
            })
            .collect()
    }
}

impl fmt::Display for TensorSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.unknown_rank {
            write!(f, "{} {} (any shape)", self.name, self.dtype)
        } else {
            write!(f, "{} {} {}", self.name, self.dtype, format_shape(&self.shape))
        }
    }
}

/// The inputs and outputs of a model (or of a pipeline's entry point).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    /// Inputs, in the order the engine takes them.
    pub inputs: Vec<TensorSpec>,
    /// Outputs, in the order the engine returns them.
    pub outputs: Vec<TensorSpec>,
}

impl Signature {
    /// The one input of a signature that parses `tf.Example`s itself (a
    /// classification or regression signature): a string tensor of
    /// serialized examples. Otherwise an error saying what it takes
    /// instead, after `who` ("signature \"classification\" of model …")
    /// and before what would feed it (`fed_by`: "Classify", …).
    pub fn serialized_examples_input(&self, who: &dyn fmt::Display, fed_by: &str) -> Result<&TensorSpec> {
        match self.inputs.as_slice() {
            [input] if input.dtype == DType::String => Ok(input),
            inputs => {
                let names: Vec<String> = inputs.iter().map(|spec| spec.to_string()).collect();
                Err(Error::invalid_argument(format!(
                    "{who} takes [{}]; {fed_by} feeds one string tensor of serialized tf.Examples",
                    names.join(", ")
                )))
            }
        }
    }

    /// True when every input and output has a dynamic dimension 0: the
    /// model takes any number of rows, so requests can be batched together.
    /// Inputs of unknown rank share no known batch dimension.
    pub fn is_batched(&self) -> bool {
        self.inputs.iter().chain(&self.outputs).all(|spec| !spec.unknown_rank && spec.shape.first() == Some(&-1))
    }

    /// Index of the output called `name`.
    pub fn output_index(&self, name: &str) -> Option<usize> {
        self.outputs.iter().position(|o| o.name == name)
    }

    fn input_names(&self) -> String {
        let names: Vec<&str> = self.inputs.iter().map(|i| i.name.as_str()).collect();
        format!("[{}]", names.join(", "))
    }

    fn output_names(&self) -> String {
        let names: Vec<&str> = self.outputs.iter().map(|o| o.name.as_str()).collect();
        format!("[{}]", names.join(", "))
    }

    /// Checks that the request names exactly this signature's inputs, before
    /// any of them is decoded. `owner` names the model in messages.
    pub fn check_input_names<'a>(
        &self,
        owner: &dyn fmt::Display,
        names: impl Iterator<Item = &'a str> + Clone,
    ) -> Result<()> {
        if names.clone().next().is_none() {
            return Err(Error::invalid_argument(format!(
                "the request has no inputs; {owner} expects {}",
                self.input_names()
            )));
        }
        for name in names.clone() {
            if !self.inputs.iter().any(|i| i.name == name) {
                return Err(Error::invalid_argument(format!(
                    "unexpected input '{name}'; {owner} expects {}",
                    self.input_names()
                )));
            }
        }
        for spec in &self.inputs {
            if !names.clone().any(|n| n == spec.name) {
                return Err(Error::invalid_argument(format!(
                    "missing input '{}' ({} {}); {owner} expects {}",
                    spec.name,
                    spec.dtype,
                    format_shape(&spec.shape),
                    self.input_names()
                )));
            }
        }
        Ok(())
    }

    /// Checks that inputs (in signature order) of a batched signature agree
    /// on their number of rows, and that there is at least one.
    pub fn check_rows(&self, owner: &dyn fmt::Display, tensors: &[Tensor]) -> Result<()> {
        let specs = &self.inputs;
        let Some(first) = tensors.first() else { return Ok(()) };
        let rows = first.rows();
        if rows == 0 {
            return Err(Error::invalid_argument(format!(
                "input '{}' has 0 rows (shape {}); a request must carry at least one row",
                specs[0].name,
                format_shape(first.shape())
            )));
        }
        for (spec, tensor) in specs.iter().zip(tensors).skip(1) {
            if tensor.rows() != rows {
                return Err(Error::invalid_argument(format!(
                    "input '{}' has {} rows but input '{}' has {rows}; every input of {owner} shares dimension 0 (the batch)",
                    spec.name,
                    tensor.rows(),
                    specs[0].name
                )));
            }
        }
        Ok(())
    }

    /// Resolves an `output_filter` to output indexes; empty means all.
    pub fn resolve_output_filter(&self, owner: &dyn fmt::Display, filter: &[String]) -> Result<Vec<usize>> {
        if filter.is_empty() {
            return Ok((0..self.outputs.len()).collect());
        }
        let mut indexes = Vec::with_capacity(filter.len());
        for name in filter {
            let index = self.output_index(name).ok_or_else(|| {
                Error::invalid_argument(format!(
                    "output_filter names '{name}', which is not an output of {owner}; outputs are {}",
                    self.output_names()
                ))
            })?;
            if indexes.contains(&index) {
                return Err(Error::invalid_argument(format!("output_filter names '{name}' twice")));
            }
            indexes.push(index);
        }
        Ok(indexes)
    }
}

/// Checks one tensor against its spec: dtype, rank, fixed dimensions.
pub fn check_tensor(owner: &dyn fmt::Display, role: &str, spec: &TensorSpec, tensor: &Tensor) -> Result<()> {
    if tensor.dtype() != spec.dtype {
        return Err(Error::invalid_argument(format!(
            "{role} '{}' has dtype {}, but {owner} expects {}",
            spec.name,
            tensor.dtype(),
            spec.dtype
        )));
    }
    if spec.unknown_rank {
        return Ok(());
    }
    let shape = tensor.shape();
    if shape.len() != spec.shape.len() {
        return Err(Error::invalid_argument(format!(
            "{role} '{}' has shape {} (rank {}), but {owner} expects rank {}: {}",
            spec.name,
            format_shape(shape),
            shape.len(),
            spec.shape.len(),
            format_shape(&spec.shape)
        )));
    }
    for (axis, (&got, &want)) in shape.iter().zip(&spec.shape).enumerate() {
        if want >= 0 && got != want {
            return Err(Error::invalid_argument(format!(
                "{role} '{}' has dimension {axis} = {got} (shape {}), but {owner} expects {want} (shape {})",
                spec.name,
                format_shape(shape),
                format_shape(&spec.shape)
            )));
        }
    }
    Ok(())
}

/// A producer's declared tensor fits a consumer's: the same dtype and rank,
/// and dimensions equal wherever both are fixed.
pub fn fits(given: &TensorSpec, wanted: &TensorSpec) -> Result<()> {
    let dims_fit = wanted.unknown_rank
        || given.shape.len() == wanted.shape.len()
            && given.shape.iter().zip(&wanted.shape).all(|(&g, &w)| g < 0 || w < 0 || g == w);
    if given.dtype != wanted.dtype || !dims_fit {
        return Err(Error::invalid_argument(format!(
            "'{}' is {} {}, but {} {} is expected",
            wanted.name,
            given.dtype,
            format_shape(&given.shape),
            wanted.dtype,
            format_shape(&wanted.shape)
        )));
    }
    Ok(())
}

/// Checks that what an untrusted producer (a plugin) returned is exactly
/// what it declared: the same names in the same order, dtypes and shapes
/// that fit. `owner` names the producer in messages.
pub fn check_outputs(owner: &dyn fmt::Display, declared: &[TensorSpec], outputs: &[NamedTensor]) -> Result<()> {
    struct AsDeclared<'a>(&'a dyn fmt::Display);
    impl fmt::Display for AsDeclared<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "{} (as declared)", self.0)
        }
    }
    if outputs.len() != declared.len() || outputs.iter().zip(declared).any(|(o, d)| o.name != d.name) {
        let got: Vec<&str> = outputs.iter().map(|o| o.name.as_str()).collect();
        let want: Vec<&str> = declared.iter().map(|d| d.name.as_str()).collect();
        return Err(Error::invalid_argument(format!("{owner} returned outputs {got:?}, but declared {want:?}")));
    }
    for (output, spec) in outputs.iter().zip(declared) {
        check_tensor(&AsDeclared(owner), "output", spec, &output.tensor)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig() -> Signature {
        Signature {
            inputs: vec![
                TensorSpec::new("dense", DType::F32, vec![-1, 3]),
                TensorSpec::new("ids", DType::I64, vec![-1, 2]),
            ],
            outputs: vec![TensorSpec::new("score", DType::F32, vec![-1, 1])],
        }
    }

    fn inputs(dense_rows: i64, ids_rows: i64) -> Vec<Tensor> {
        let dense = Tensor::from_values(vec![dense_rows, 3], &vec![0f32; dense_rows as usize * 3]);
        let ids = Tensor::from_values(vec![ids_rows, 2], &vec![0i64; ids_rows as usize * 2]);
        vec![dense, ids]
    }

    #[test]
    fn mismatched_rows_dims_and_dtypes_are_named() {
        let s = sig();
        let err = s.check_rows(&"model 'rec'", &inputs(2, 3)).unwrap_err();
        assert!(err.message().contains("input 'ids' has 3 rows"), "{err}");
        assert!(s.check_rows(&"model 'rec'", &inputs(2, 2)).is_ok());

        let wide = Tensor::from_values(vec![1, 4], &[0f32; 4]);
        let err = check_tensor(&"model 'rec'", "input", &s.inputs[0], &wide).unwrap_err();
        assert!(err.message().contains("dimension 1 = 4"), "{err}");
        assert!(err.message().contains("expects 3"), "{err}");

        let ints = Tensor::from_values(vec![1, 2], &[0i32; 2]);
        let err = check_tensor(&"model 'rec'", "input", &s.inputs[1], &ints).unwrap_err();
        assert!(err.message().contains("dtype DT_INT32"), "{err}");
        assert!(err.message().contains("expects DT_INT64"), "{err}");
    }

    #[test]
    fn names_are_checked_before_decoding() {
        let s = sig();
        let none: Vec<String> = vec![];
        assert!(s
            .check_input_names(&"m", none.iter().map(String::as_str))
            .unwrap_err()
            .message()
            .contains("no inputs"));
        let extra = ["dense".to_string(), "ids".to_string(), "zzz".to_string()];
        assert!(s
            .check_input_names(&"m", extra.iter().map(String::as_str))
            .unwrap_err()
            .message()
            .contains("unexpected input 'zzz'"));
        let missing = ["dense".to_string()];
        assert!(s
            .check_input_names(&"m", missing.iter().map(String::as_str))
            .unwrap_err()
            .message()
            .contains("missing input 'ids'"));
    }

    #[test]
    fn output_filter_resolves_and_rejects_unknown_and_duplicates() {
        let s = sig();
        assert_eq!(s.resolve_output_filter(&"m", &[]).unwrap(), vec![0]);
        assert_eq!(s.resolve_output_filter(&"m", &["score".into()]).unwrap(), vec![0]);
        assert!(s.resolve_output_filter(&"m", &["nope".into()]).is_err());
        assert!(s.resolve_output_filter(&"m", &["score".into(), "score".into()]).is_err());
    }
}
