//! Feature values: parsed from a table file (a JSON value or a CSV cell)
//! or a configured default, and the one stored format in Redis.
//!
//! Redis format (stable; `docs/FEATURES.md`): a numeric or boolean feature
//! is its values' little-endian bytes, exactly `values × dtype size` of
//! them (a float32 feature of shape `[13]` is 52 bytes); a string feature
//! is, per value, its length as a 4-byte little-endian integer and then
//! its bytes — the Open Inference Protocol's raw form (`tensor::v2`). Binary rather than decimal text: exact, compact, and read
//! with one length check instead of a parse per value.

use bytes::Bytes;
use serde_json::Value;

use super::{Column, ColumnValues};
use crate::config::features::FeatureSpec;
use crate::error::{Error, Result};
use crate::tensor::json::{flatten, tensor_from_leaves};
use crate::tensor::v2::{decode_strings, encode_raw};
use crate::tensor::{format_shape, Tensor, TensorData};

/// A feature value from JSON: nested arrays as deep as the feature's shape
/// (or one value for a scalar feature).
pub fn from_json(spec: &FeatureSpec, value: &Value, what: &str) -> Result<Tensor> {
    let (shape, leaves) = flatten(value, &what)?;
    if shape != spec.shape {
        return Err(Error::invalid_argument(format!(
            "{what}: the value has shape {}, but the feature is {} {}",
            format_shape(&shape),
            spec.dtype,
            format_shape(&spec.shape)
        )));
    }
    tensor_from_leaves(spec.dtype, shape, &leaves, what)
}

/// A feature value from a CSV cell: its values separated by whitespace, in
/// row-major order (`0.5 1 2`); strings cannot hold whitespace here (use
/// JSON lines for those).
pub fn from_text(spec: &FeatureSpec, cell: &str, what: &str) -> Result<Tensor> {
    let tokens: Vec<&str> = cell.split_whitespace().collect();
    if tokens.len() != spec.elements() {
        return Err(Error::invalid_argument(format!(
            "{what}: {} values in \"{}\", but the feature is {} {} ({} values)",
            tokens.len(),
            truncated(cell),
            spec.dtype,
            format_shape(&spec.shape),
            spec.elements()
        )));
    }
    let leaves: Vec<Value> = tokens
        .iter()
        .map(|&token| match spec.dtype.size() {
            // Numbers and booleans as JSON reads them; anything else (NaN,
            // inf, a typo) as a string, which the dtype check names.
            Some(_) => serde_json::from_str::<Value>(token)
                .ok()
                .filter(|v| !v.is_string())
                .unwrap_or_else(|| Value::String(token.to_string())),
            None => Value::String(token.to_string()),
        })
        .collect();
    let leaves: Vec<&Value> = leaves.iter().collect();
    tensor_from_leaves(spec.dtype, spec.shape.clone(), &leaves, what)
}

/// A configured default: one value (repeated to the feature's shape) or the
/// full value.
pub fn default_of(spec: &FeatureSpec, value: &toml::Value, what: &str) -> Result<Tensor> {
    let json = serde_json::to_value(value)
        .map_err(|e| Error::invalid_argument(format!("{what}: cannot be read as a value: {e}")))?;
    if json.is_array() {
        return from_json(spec, &json, what);
    }
    let one = tensor_from_leaves(spec.dtype, vec![], &[&json], what)?;
    let count = spec.elements();
    let data = match one.data() {
        TensorData::Fixed(bytes) => TensorData::Fixed(bytes.repeat(count).into()),
        TensorData::Strings(strings) => TensorData::Strings(vec![strings[0].clone(); count]),
    };
    Ok(Tensor::from_parts_unchecked(spec.dtype, spec.shape.clone(), data))
}

/// Writes `value` (already of the feature's dtype and shape) as key `i`'s
/// value in `column`.
pub fn put(column: &mut Column, i: usize, value: &Tensor) {
    match (&mut column.values, value.data()) {
        (ColumnValues::Fixed(out), TensorData::Fixed(bytes)) => {
            out[i * bytes.len()..(i + 1) * bytes.len()].copy_from_slice(bytes);
        }
        (ColumnValues::Strings(out), TensorData::Strings(strings)) => {
            out[i * strings.len()..(i + 1) * strings.len()].clone_from_slice(strings);
        }
        _ => {}
    }
    column.present[i] = true;
}

/// The Redis form of a feature value: the v2 raw form (strings
/// length-prefixed), one encoding for both.
pub fn encode(value: &Tensor) -> Vec<u8> {
    encode_raw(value).to_vec()
}

/// Reads a value stored in Redis into key `i` of `column`; the error says
/// what was wrong with it (the caller names the key and the feature).
pub fn decode_into(
    spec: &FeatureSpec,
    stored: &Bytes,
    column: &mut Column,
    i: usize,
) -> std::result::Result<(), String> {
    let count = spec.elements();
    match &mut column.values {
        ColumnValues::Fixed(out) => {
            let size = spec.dtype.size().unwrap_or(1);
            let expected = count * size;
            if stored.len() != expected {
                return Err(format!(
                    "holds {} bytes, but {} {} is {count} × {size} = {expected} little-endian bytes",
                    stored.len(),
                    spec.dtype,
                    format_shape(&spec.shape)
                ));
            }
            if spec.dtype == crate::tensor::DType::Bool {
                if let Some(at) = stored.iter().position(|&b| b > 1) {
                    return Err(format!("byte {at} is {}; booleans are 0 or 1", stored[at]));
                }
            }
            out[i * expected..(i + 1) * expected].copy_from_slice(stored);
        }
        ColumnValues::Strings(out) => {
            let strings = decode_strings(stored, count)?;
            out[i * count..(i + 1) * count].clone_from_slice(&strings);
        }
    }
    column.present[i] = true;
    Ok(())
}

fn truncated(text: &str) -> String {
    match text.char_indices().nth(64) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DType;

    fn spec(dtype: DType, shape: &[i64]) -> FeatureSpec {
        FeatureSpec { dtype, shape: shape.to_vec() }
    }

    #[test]
    fn text_json_and_defaults_agree() {
        let f = spec(DType::F32, &[3]);
        let a = from_text(&f, "0.5 1 -2", "x").unwrap();
        let b = from_json(&f, &serde_json::json!([0.5, 1, -2]), "x").unwrap();
        assert_eq!(a, b);
        let d = default_of(&f, &toml::Value::Float(0.25), "x").unwrap();
        assert_eq!(d.to_vec::<f32>().unwrap(), vec![0.25; 3]);
        let s = spec(DType::String, &[2]);
        assert_eq!(from_text(&s, "a b", "x").unwrap().strings().unwrap(), &[Bytes::from("a"), Bytes::from("b")]);
    }

    #[test]
    fn bad_values_say_what_was_expected() {
        let f = spec(DType::I64, &[2]);
        let err = from_text(&f, "1 2 3", "items row 4 feature 'n'").unwrap_err();
        assert!(err.message().contains("3 values") && err.message().contains("row 4"), "{err}");
        let err = from_text(&f, "1 x", "here").unwrap_err();
        assert!(err.message().contains("\"x\""), "{err}");
        let err = from_json(&f, &serde_json::json!([[1, 2]]), "here").unwrap_err();
        assert!(err.message().contains("shape [1, 2]"), "{err}");
    }

    #[test]
    fn redis_values_round_trip_and_bad_ones_are_named() {
        for (f, value) in [
            (spec(DType::F32, &[2]), Tensor::from_values(vec![2], &[1.5f32, -3.0])),
            (spec(DType::String, &[2]), Tensor::from_strings(vec![2], vec![Bytes::from("ab"), Bytes::new()]).unwrap()),
        ] {
            let stored = Bytes::from(encode(&value));
            let mut column = Column::empty(&f, 2);
            decode_into(&f, &stored, &mut column, 1).unwrap();
            assert_eq!(column.present, vec![false, true]);
            let mut check = Column::empty(&f, 2);
            put(&mut check, 1, &value);
            assert_eq!(column, check);
            let mut column = Column::empty(&f, 1);
            let short = stored.slice(..stored.len() - 1);
            assert!(decode_into(&f, &short, &mut column, 0).is_err());
            let mut long = stored.to_vec();
            long.push(0);
            assert!(decode_into(&f, &Bytes::from(long), &mut column, 0).is_err());
        }
        let f = spec(DType::F32, &[13]);
        let err = decode_into(&f, &Bytes::from_static(b"1.0"), &mut Column::empty(&f, 1), 0).unwrap_err();
        assert!(err.contains("3 bytes") && err.contains("52"), "{err}");
    }
}
