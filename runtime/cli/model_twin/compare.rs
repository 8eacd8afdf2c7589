//! What a twin's answers differ by from the SavedModel's: per output, the
//! largest absolute and relative difference and the share of rows over
//! tolerance, and the differences of the two signatures as clients see
//! them.
//!
//! Floating-point values agree when `|twin - saved| <= atol + rtol *
//! |saved|` (numpy's `allclose`, the SavedModel as the reference);
//! integers, booleans and strings must be equal, since a class id or a
//! vocabulary index off by one is wrong, not close. A row is over
//! tolerance when any of its values is.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::tensor::spec::{Signature, TensorSpec};
use crate::tensor::{format_shape, DType, Tensor};

/// How far a twin's value may be from the SavedModel's.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Tolerance {
    /// Relative to the SavedModel's value.
    pub rtol: f64,
    /// Absolute.
    pub atol: f64,
}

/// What one output differed by over every compared request.
#[derive(Debug, Clone, Serialize)]
pub struct OutputDiff {
    /// The signature it is an output of.
    pub signature: String,
    /// The output's name.
    pub output: String,
    /// Its dtype in the SavedModel (`DT_FLOAT`, …).
    pub dtype: String,
    /// Rows compared (dimension 0 of each answer; 1 for a scalar).
    pub rows: u64,
    /// Rows with a value over tolerance (or of another shape).
    pub rows_over: u64,
    /// The largest `|twin - saved|` of a number; `None` for strings.
    pub max_abs: Option<f64>,
    /// The largest `|twin - saved| / |saved|` where `saved` is not zero.
    pub max_rel: Option<f64>,
    /// The first row over tolerance, as "request R row I: saved V, twin W".
    pub first_over: Option<String>,
}

impl OutputDiff {
    fn new(signature: &str, spec: &TensorSpec) -> OutputDiff {
        let numeric = spec.dtype != DType::String;
        OutputDiff {
            signature: signature.to_string(),
            output: spec.name.clone(),
            dtype: spec.dtype.to_string(),
            rows: 0,
            rows_over: 0,
            max_abs: numeric.then_some(0.0),
            max_rel: numeric.then_some(0.0),
            first_over: None,
        }
    }

    /// The share of rows over tolerance, 0 to 1.
    pub fn share_over(&self) -> f64 {
        if self.rows == 0 {
            0.0
        } else {
            self.rows_over as f64 / self.rows as f64
        }
    }

    /// Adds one request's answer: `saved` from the SavedModel, `twin` from
    /// the twin, for the request `request` names.
    pub fn add(&mut self, saved: &Tensor, twin: &Tensor, tolerance: Tolerance, request: &str) {
        let rows = if saved.shape().is_empty() { 1 } else { saved.rows() };
        self.rows += rows as u64;
        if saved.shape() != twin.shape() || saved.dtype() != twin.dtype() {
            self.rows_over += rows as u64;
            self.note_first(|| {
                format!(
                    "request {request}: the SavedModel answered {} {}, the twin {} {}",
                    saved.dtype(),
                    format_shape(saved.shape()),
                    twin.dtype(),
                    format_shape(twin.shape())
                )
            });
            return;
        }
        let per_row = saved.len().checked_div(rows).unwrap_or(0);
        // Elements over tolerance: a complex element is two numbers.
        let width = if matches!(saved.dtype(), DType::Complex64 | DType::Complex128) { 2 } else { 1 };
        let over: Vec<usize> = match (numbers(saved), numbers(twin)) {
            (Some((a, exact)), Some((b, _))) => {
                let close = self.add_numbers(&a, &b, exact, tolerance);
                // Integers compare by their bytes: as f64, two int64 values
                // above 2^53 may round to the same number.
                let over = if exact { unequal_elements(saved, twin) } else { close };
                let mut elements: Vec<usize> = over.into_iter().map(|i| i / width).collect();
                elements.dedup();
                elements
            }
            _ => strings_over(saved, twin),
        };
        let mut rows_over = std::collections::BTreeSet::new();
        for &element in &over {
            rows_over.insert(element.checked_div(per_row).unwrap_or(0));
        }
        self.rows_over += rows_over.len() as u64;
        if let Some(&element) = over.first() {
            let row = element.checked_div(per_row).unwrap_or(0);
            self.note_first(|| {
                format!("request {request} row {row}: saved {}, twin {}", shown(saved, element), shown(twin, element))
            });
        }
    }

    /// Updates the largest differences; answers the elements over.
    fn add_numbers(&mut self, saved: &[f64], twin: &[f64], exact: bool, tolerance: Tolerance) -> Vec<usize> {
        let mut over = Vec::new();
        for (i, (&a, &b)) in saved.iter().zip(twin).enumerate() {
            if a == b || (a.is_nan() && b.is_nan()) {
                continue;
            }
            let abs = (b - a).abs();
            let abs = if abs.is_nan() { f64::INFINITY } else { abs };
            if let Some(max) = self.max_abs.as_mut() {
                *max = max.max(abs);
            }
            if a != 0.0 {
                if let Some(max) = self.max_rel.as_mut() {
                    *max = max.max(abs / a.abs());
                }
            }
            if exact || a.is_nan() || b.is_nan() || abs > tolerance.atol + tolerance.rtol * a.abs() {
                over.push(i);
            }
        }
        over
    }

    fn note_first(&mut self, first: impl FnOnce() -> String) {
        if self.first_over.is_none() {
            self.first_over = Some(first());
        }
    }
}

/// The elements of two fixed-width tensors of one dtype whose bytes differ.
fn unequal_elements(saved: &Tensor, twin: &Tensor) -> Vec<usize> {
    let size = saved.dtype().size().unwrap_or(1).max(1);
    match (saved.bytes(), twin.bytes()) {
        (Some(a), Some(b)) => {
            a.chunks(size).zip(b.chunks(size)).enumerate().filter(|(_, (a, b))| a != b).map(|(i, _)| i).collect()
        }
        _ => (0..saved.len()).collect(),
    }
}

/// The elements of two string (or otherwise unequal-typed) tensors that
/// differ.
fn strings_over(saved: &Tensor, twin: &Tensor) -> Vec<usize> {
    match (saved.strings(), twin.strings()) {
        (Some(a), Some(b)) => a.iter().zip(b).enumerate().filter(|(_, (a, b))| a != b).map(|(i, _)| i).collect(),
        _ => (0..saved.len()).collect(),
    }
}

/// One element of `tensor` for a message.
fn shown(tensor: &Tensor, element: usize) -> String {
    if let Some(strings) = tensor.strings() {
        return strings.get(element).map_or("?".into(), |s| format!("{:?}", String::from_utf8_lossy(s)));
    }
    let width = if matches!(tensor.dtype(), DType::Complex64 | DType::Complex128) { 2 } else { 1 };
    // Single-precision values print in their own shortest form (5.1, not
    // 5.099999904632568).
    let single = matches!(tensor.dtype(), DType::F32 | DType::F16 | DType::BF16 | DType::Complex64);
    let number = |x: Option<&f64>| match x {
        Some(&x) if single => (x as f32).to_string(),
        Some(x) => x.to_string(),
        None => "?".into(),
    };
    match numbers(tensor) {
        Some((values, _)) if width == 2 => {
            let (re, im) = (number(values.get(2 * element)), number(values.get(2 * element + 1)));
            format!("{re}{}{}i", if im.starts_with('-') { "" } else { "+" }, im)
        }
        Some((values, _)) => number(values.get(element)),
        None => "?".into(),
    }
}

/// The values of a numeric tensor as `f64` (a complex value as its two
/// parts), and whether they must match exactly (not floating-point).
/// `None` for strings.
fn numbers(tensor: &Tensor) -> Option<(Vec<f64>, bool)> {
    fn all<T: bytemuck::Pod>(tensor: &Tensor, to: impl Fn(T) -> f64) -> Option<Vec<f64>> {
        let bytes = tensor.bytes()?;
        Some(bytemuck::pod_collect_to_vec::<u8, T>(bytes).into_iter().map(to).collect())
    }
    let values = match tensor.dtype() {
        DType::F32 | DType::Complex64 => all::<f32>(tensor, f64::from)?,
        DType::F64 | DType::Complex128 => all::<f64>(tensor, |x| x)?,
        DType::F16 => all::<half::f16>(tensor, f64::from)?,
        DType::BF16 => all::<half::bf16>(tensor, f64::from)?,
        DType::I8 => all::<i8>(tensor, f64::from)?,
        DType::I16 => all::<i16>(tensor, f64::from)?,
        DType::I32 => all::<i32>(tensor, f64::from)?,
        // Beyond 2^53 two neighbours may be one f64: equality is checked on
        // the bytes (`unequal_elements`), the f64 only measures how far.
        DType::I64 => all::<i64>(tensor, |x| x as f64)?,
        DType::U8 | DType::Bool => all::<u8>(tensor, f64::from)?,
        DType::U16 => all::<u16>(tensor, f64::from)?,
        DType::U32 => all::<u32>(tensor, f64::from)?,
        DType::U64 => all::<u64>(tensor, |x| x as f64)?,
        DType::String => return None,
    };
    let floating = matches!(
        tensor.dtype(),
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::Complex64 | DType::Complex128
    );
    Some((values, !floating))
}

/// Every output of `signature` (the one `key` names), none compared yet.
pub fn outputs(key: &str, signature: &Signature) -> Vec<OutputDiff> {
    signature.outputs.iter().map(|spec| OutputDiff::new(key, spec)).collect()
}

/// How the twin's signature differs from the SavedModel's as a client sees
/// it: names, dtypes and shapes of inputs and outputs (not their order,
/// which clients never see). Empty when they agree.
pub fn signature_differences(saved: &Signature, twin: &Signature) -> Vec<String> {
    let mut differences = Vec::new();
    for (kind, a, b) in [("input", &saved.inputs, &twin.inputs), ("output", &saved.outputs, &twin.outputs)] {
        let twins: BTreeMap<&str, &TensorSpec> = b.iter().map(|spec| (spec.name.as_str(), spec)).collect();
        for spec in a {
            match twins.get(spec.name.as_str()) {
                None => differences.push(format!("{kind} '{}' ({spec}) is not in the twin", spec.name)),
                Some(other) if other.dtype != spec.dtype => differences.push(format!(
                    "{kind} '{}': {} in the SavedModel, {} in the twin",
                    spec.name, spec.dtype, other.dtype
                )),
                // ONNX Runtime reports a scalar as it reports an unknown
                // rank (no dimensions), so a scalar reads as any rank.
                Some(other) if other.unknown_rank && !spec.unknown_rank && spec.shape.is_empty() => {}
                Some(other) if other.shape != spec.shape || other.unknown_rank != spec.unknown_rank => differences
                    .push(format!(
                        "{kind} '{}': shape {} in the SavedModel, {} in the twin",
                        spec.name,
                        shape_of(spec),
                        shape_of(other)
                    )),
                Some(_) => {}
            }
        }
        let saved_names: std::collections::BTreeSet<&str> = a.iter().map(|spec| spec.name.as_str()).collect();
        for spec in b.iter().filter(|spec| !saved_names.contains(spec.name.as_str())) {
            differences.push(format!("the twin has an {kind} '{}' ({spec}) the SavedModel has not", spec.name));
        }
    }
    differences
}

fn shape_of(spec: &TensorSpec) -> String {
    if spec.unknown_rank {
        "(any)".into()
    } else {
        format_shape(&spec.shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIGHT: Tolerance = Tolerance { rtol: 1e-4, atol: 1e-5 };

    fn spec(name: &str, dtype: DType) -> TensorSpec {
        TensorSpec::new(name, dtype, vec![-1, 2])
    }

    #[test]
    fn floats_within_tolerance_pass_and_a_row_over_it_is_named() {
        let mut diff = OutputDiff::new("s", &spec("y", DType::F32));
        let saved = Tensor::from_values(vec![3, 2], &[1.0f32, 2.0, 0.0, 1e3, -4.0, 5.0]);
        let close = Tensor::from_values(vec![3, 2], &[1.00001f32, 2.0, 0.000001, 1e3, -4.0, 5.0]);
        diff.add(&saved, &close, TIGHT, "w0");
        assert_eq!((diff.rows, diff.rows_over), (3, 0));
        let off = Tensor::from_values(vec![3, 2], &[1.0f32, 2.0, 0.0, 1e3, -4.0, 5.1]);
        diff.add(&saved, &off, TIGHT, "w1");
        assert_eq!((diff.rows, diff.rows_over), (6, 1));
        assert!((diff.max_abs.unwrap() - 0.1).abs() < 1e-5, "{diff:?}");
        assert!((diff.max_rel.unwrap() - 0.02).abs() < 1e-5, "{diff:?}");
        let first = diff.first_over.as_deref().unwrap();
        assert!(first.starts_with("request w1 row 2: saved 5, twin 5.1"), "{first}");
        assert!((diff.share_over() - 1.0 / 6.0).abs() < 1e-9);
    }

    #[test]
    fn integers_and_strings_must_be_equal() {
        let mut ids = OutputDiff::new("s", &spec("ids", DType::I64));
        ids.add(&Tensor::from_values(vec![2], &[10i64, 20]), &Tensor::from_values(vec![2], &[10i64, 21]), TIGHT, "0");
        assert_eq!((ids.rows, ids.rows_over), (2, 1));
        let mut words = OutputDiff::new("s", &spec("upper", DType::String));
        let saved = Tensor::from_strings(vec![2], vec!["A".into(), "B".into()]).unwrap();
        let twin = Tensor::from_strings(vec![2], vec!["A".into(), "b".into()]).unwrap();
        words.add(&saved, &twin, TIGHT, "0");
        assert_eq!((words.rows_over, words.max_abs), (1, None));
        assert!(words.first_over.as_deref().unwrap().contains("saved \"B\", twin \"b\""), "{words:?}");
    }

    #[test]
    fn another_shape_is_every_row_over() {
        let mut diff = OutputDiff::new("s", &spec("y", DType::F32));
        diff.add(
            &Tensor::from_values(vec![2, 1], &[1f32, 2.0]),
            &Tensor::from_values(vec![1, 2], &[1f32, 2.0]),
            TIGHT,
            "7",
        );
        assert_eq!(diff.rows_over, 2);
        assert!(diff.first_over.unwrap().contains("DT_FLOAT [2, 1], the twin DT_FLOAT [1, 2]"));
    }

    #[test]
    fn large_integers_differing_by_one_are_caught() {
        let mut ids = OutputDiff::new("s", &spec("ids", DType::I64));
        let big = (1i64 << 60) + 1;
        ids.add(&Tensor::from_values(vec![1], &[big]), &Tensor::from_values(vec![1], &[big + 1]), TIGHT, "0");
        assert_eq!(ids.rows_over, 1, "{ids:?}");
    }

    #[test]
    fn a_complex_value_is_one_element_of_its_row() {
        let mut diff = OutputDiff::new("s", &spec("z", DType::Complex64));
        // Two rows of two complex values; row 1's second value differs in
        // both parts.
        let saved = Tensor::from_bytes(
            DType::Complex64,
            vec![2, 2],
            bytemuck::cast_slice(&[1f32, 0.0, 2.0, 0.0, 3.0, 0.0, 4.0, 0.0]).to_vec().into(),
        )
        .unwrap();
        let twin = Tensor::from_bytes(
            DType::Complex64,
            vec![2, 2],
            bytemuck::cast_slice(&[1f32, 0.0, 2.0, 0.0, 3.0, 0.0, 5.0, 1.0]).to_vec().into(),
        )
        .unwrap();
        diff.add(&saved, &twin, TIGHT, "0");
        assert_eq!((diff.rows, diff.rows_over), (2, 1), "{diff:?}");
        assert!(diff.first_over.as_deref().unwrap().starts_with("request 0 row 1: saved 4+0i, twin 5+1i"), "{diff:?}");
    }

    #[test]
    fn nan_agrees_with_nan_only() {
        let mut diff = OutputDiff::new("s", &spec("y", DType::F32));
        let saved = Tensor::from_values(vec![2], &[f32::NAN, 1.0]);
        diff.add(&saved, &Tensor::from_values(vec![2], &[f32::NAN, 1.0]), TIGHT, "0");
        assert_eq!(diff.rows_over, 0);
        diff.add(&saved, &Tensor::from_values(vec![2], &[0.0f32, 1.0]), TIGHT, "1");
        assert_eq!(diff.rows_over, 1);
    }

    #[test]
    fn signatures_differ_by_name_dtype_and_shape_not_order() {
        let saved = Signature {
            inputs: vec![spec("a", DType::F32), spec("b", DType::I64)],
            outputs: vec![spec("y", DType::F32)],
        };
        let reordered = Signature {
            inputs: vec![spec("b", DType::I64), spec("a", DType::F32)],
            outputs: vec![spec("y", DType::F32)],
        };
        assert!(signature_differences(&saved, &reordered).is_empty());
        let other = Signature {
            inputs: vec![spec("a", DType::F64), TensorSpec::new("b", DType::I64, vec![1, 2])],
            outputs: vec![spec("output_0", DType::F32)],
        };
        let found = signature_differences(&saved, &other);
        assert_eq!(found.len(), 4, "{found:?}");
        assert!(found[0].contains("input 'a': DT_FLOAT in the SavedModel, DT_DOUBLE in the twin"), "{found:?}");
        assert!(found[1].contains("shape [-1, 2] in the SavedModel, [1, 2] in the twin"), "{found:?}");
        assert!(found[2].contains("output 'y'") && found[2].contains("not in the twin"), "{found:?}");
        assert!(found[3].contains("the twin has an output 'output_0'"), "{found:?}");
    }
}
