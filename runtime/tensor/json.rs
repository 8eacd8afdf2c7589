//! [`Tensor`] ⇄ JSON, as TF Serving's REST API writes tensors: nested
//! arrays whose nesting is the shape, numbers for numeric dtypes, `true` /
//! `false` for booleans, strings — or `{"b64": "…"}` for bytes that are not
//! text — for `DT_STRING`.
//!
//! Decoding checks what a client controls: the array is rectangular, each
//! value has the dtype's kind and fits its range, and base64 is valid. The
//! errors name the tensor and the position of the bad value.

use base64::Engine;
use bytes::Bytes;
use serde_json::Value;

use super::{DType, Tensor, TensorData};
use crate::error::{Error, Result};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// The shape of a nested JSON array, and its leaves in row-major order.
/// `{"b64": …}` objects are leaves.
/// `what` names the tensor in errors; it is only formatted when there is one.
pub fn flatten<'a>(value: &'a Value, what: &dyn std::fmt::Display) -> Result<(Vec<i64>, Vec<&'a Value>)> {
    fn walk<'a>(
        value: &'a Value,
        depth: usize,
        shape: &mut Vec<i64>,
        leaves: &mut Vec<&'a Value>,
        what: &dyn std::fmt::Display,
    ) -> Result<()> {
        match value {
            Value::Array(items) => {
                if depth == shape.len() {
                    if !leaves.is_empty() {
                        return Err(Error::invalid_argument(format!(
                            "{what}: the array is ragged: a list appears where other rows have a value"
                        )));
                    }
                    shape.push(items.len() as i64);
                } else if depth > shape.len() || shape[depth] != items.len() as i64 {
                    return Err(Error::invalid_argument(format!(
                        "{what}: the array is ragged: a list of {} where {} were expected at depth {depth}",
                        items.len(),
                        shape.get(depth).map_or_else(|| "a value".to_string(), |n| n.to_string())
                    )));
                }
                for item in items {
                    walk(item, depth + 1, shape, leaves, what)?;
                }
                Ok(())
            }
            leaf => {
                if depth != shape.len() {
                    return Err(Error::invalid_argument(format!(
                        "{what}: the array is ragged: a value appears at depth {depth}, where lists of depth {} are",
                        shape.len()
                    )));
                }
                leaves.push(leaf);
                Ok(())
            }
        }
    }
    let mut shape = Vec::new();
    let mut leaves = Vec::new();
    walk(value, 0, &mut shape, &mut leaves, what)?;
    Ok((shape, leaves))
}

/// The leaves of `value` as a tensor of `dtype`, with `shape`.
pub fn tensor_from_leaves(dtype: DType, shape: Vec<i64>, leaves: &[&Value], what: &str) -> Result<Tensor> {
    let bad = |i: usize, leaf: &Value, expected: &str| {
        Error::invalid_argument(format!("{what}: value {i} is {leaf}, but {dtype} needs {expected}"))
    };
    macro_rules! ints {
        ($ty:ty, $range:expr) => {{
            let mut out: Vec<$ty> = Vec::with_capacity(leaves.len());
            for (i, leaf) in leaves.iter().enumerate() {
                let n = leaf
                    .as_i64()
                    .and_then(|n| <$ty>::try_from(n).ok())
                    .or_else(|| leaf.as_u64().and_then(|n| <$ty>::try_from(n).ok()))
                    .ok_or_else(|| bad(i, leaf, concat!("an integer in ", $range)))?;
                out.push(n);
            }
            Tensor::from_values(shape, &out)
        }};
    }
    let float = |i: usize, leaf: &Value| leaf.as_f64().ok_or_else(|| bad(i, leaf, "a number"));
    Ok(match dtype {
        DType::F32 => {
            let v =
                leaves.iter().enumerate().map(|(i, l)| float(i, l).map(|x| x as f32)).collect::<Result<Vec<_>>>()?;
            Tensor::from_values(shape, &v)
        }
        DType::F64 => Tensor::from_values(
            shape,
            &leaves.iter().enumerate().map(|(i, l)| float(i, l)).collect::<Result<Vec<_>>>()?,
        ),
        DType::F16 => {
            let v = leaves
                .iter()
                .enumerate()
                .map(|(i, l)| float(i, l).map(half::f16::from_f64))
                .collect::<Result<Vec<_>>>()?;
            Tensor::from_values(shape, &v)
        }
        DType::BF16 => {
            let v = leaves
                .iter()
                .enumerate()
                .map(|(i, l)| float(i, l).map(half::bf16::from_f64))
                .collect::<Result<Vec<_>>>()?;
            Tensor::from_values(shape, &v)
        }
        DType::I8 => ints!(i8, "-128..=127"),
        DType::I16 => ints!(i16, "-32768..=32767"),
        DType::I32 => ints!(i32, "the int32 range"),
        DType::I64 => ints!(i64, "the int64 range"),
        DType::U8 => ints!(u8, "0..=255"),
        DType::U16 => ints!(u16, "0..=65535"),
        DType::U32 => ints!(u32, "the uint32 range"),
        DType::U64 => ints!(u64, "the uint64 range"),
        DType::Bool => {
            let v = leaves
                .iter()
                .enumerate()
                .map(|(i, l)| l.as_bool().ok_or_else(|| bad(i, l, "true or false")))
                .collect::<Result<Vec<_>>>()?;
            Tensor::from_bools(shape, &v)
        }
        DType::String => {
            let mut strings = Vec::with_capacity(leaves.len());
            for (i, leaf) in leaves.iter().enumerate() {
                strings.push(match leaf {
                    Value::String(s) => Bytes::from(s.clone()),
                    Value::Object(map) if map.len() == 1 && map.contains_key("b64") => {
                        let text = map["b64"].as_str().ok_or_else(|| bad(i, leaf, "{\"b64\": \"<base64>\"}"))?;
                        Bytes::from(B64.decode(text).map_err(|e| {
                            Error::invalid_argument(format!("{what}: value {i} has invalid base64 ({e})"))
                        })?)
                    }
                    other => return Err(bad(i, other, "a string or {\"b64\": \"<base64>\"}")),
                });
            }
            Tensor::from_strings(shape, strings)?
        }
    })
}

/// A JSON array (nested as deep as the shape) as a tensor of `dtype`.
pub fn tensor_from_json(value: &Value, dtype: DType, what: &str) -> Result<Tensor> {
    let (shape, leaves) = flatten(value, &what)?;
    tensor_from_leaves(dtype, shape, &leaves, what)
}

/// A tensor (or one row of it) written as TF Serving writes tensors:
/// nested arrays, floats in their shortest form (an f32 prints as `0.1`,
/// not `0.10000000149011612`), strings as text or `{"b64": …}`. It
/// serialises straight from the tensor's bytes, without building a JSON
/// tree first.
pub struct JsonView<'a> {
    tensor: &'a Tensor,
    dims: &'a [i64],
    from: usize,
}

impl<'a> JsonView<'a> {
    /// The whole tensor (a bare value for rank 0).
    pub fn whole(tensor: &'a Tensor) -> Self {
        JsonView { tensor, dims: tensor.shape(), from: 0 }
    }

    /// Row `row` along dimension 0.
    pub fn row(tensor: &'a Tensor, row: usize) -> Self {
        let dims = tensor.shape().get(1..).unwrap_or(&[]);
        let stride: usize = dims.iter().map(|&d| d as usize).product();
        JsonView { tensor, dims, from: row * stride }
    }

    fn element<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let i = self.from;
        let bytes = match self.tensor.data() {
            TensorData::Strings(strings) => {
                let s = &strings[i];
                return match std::str::from_utf8(s) {
                    Ok(text) => serializer.serialize_str(text),
                    Err(_) => {
                        let mut map = serializer.serialize_map(Some(1))?;
                        map.serialize_entry("b64", &B64.encode(s))?;
                        map.end()
                    }
                };
            }
            TensorData::Fixed(bytes) => bytes,
        };
        let size = self.tensor.dtype().size().unwrap_or(1);
        let raw = &bytes[i * size..(i + 1) * size];
        fn le<T: bytemuck::Pod>(raw: &[u8]) -> T {
            bytemuck::pod_read_unaligned(raw)
        }
        match self.tensor.dtype() {
            DType::F32 => serializer.serialize_f32(le::<f32>(raw)),
            DType::F64 => serializer.serialize_f64(le::<f64>(raw)),
            DType::F16 => serializer.serialize_f32(le::<half::f16>(raw).to_f32()),
            DType::BF16 => serializer.serialize_f32(le::<half::bf16>(raw).to_f32()),
            DType::I8 => serializer.serialize_i8(le::<i8>(raw)),
            DType::I16 => serializer.serialize_i16(le::<i16>(raw)),
            DType::I32 => serializer.serialize_i32(le::<i32>(raw)),
            DType::I64 => serializer.serialize_i64(le::<i64>(raw)),
            DType::U8 => serializer.serialize_u8(raw[0]),
            DType::U16 => serializer.serialize_u16(le::<u16>(raw)),
            DType::U32 => serializer.serialize_u32(le::<u32>(raw)),
            DType::U64 => serializer.serialize_u64(le::<u64>(raw)),
            DType::Bool => serializer.serialize_bool(raw[0] != 0),
            // Strings returned above; a string dtype always holds strings.
            DType::String => serializer.serialize_unit(),
        }
    }
}

impl serde::Serialize for JsonView<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let Some((&n, rest)) = self.dims.split_first() else {
            return self.element(serializer);
        };
        let stride: usize = rest.iter().map(|&d| d as usize).product();
        let mut seq = serializer.serialize_seq(Some(n as usize))?;
        for i in 0..n as usize {
            seq.serialize_element(&JsonView { tensor: self.tensor, dims: rest, from: self.from + i * stride })?;
        }
        seq.end()
    }
}

/// A tensor as a JSON tree (a scalar for rank 0).
pub fn tensor_to_json(tensor: &Tensor) -> Value {
    serde_json::to_value(JsonView::whole(tensor)).unwrap_or(Value::Null)
}

/// Row `row` (along dimension 0) of a tensor as a JSON tree.
pub fn row_to_json(tensor: &Tensor, row: usize) -> Value {
    serde_json::to_value(JsonView::row(tensor, row)).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nested_arrays_round_trip() {
        let t = tensor_from_json(&json!([[1.5, 2.0], [3.0, -4.0]]), DType::F32, "x").unwrap();
        assert_eq!(t.shape(), &[2, 2]);
        assert_eq!(tensor_to_json(&t), json!([[1.5, 2.0], [3.0, -4.0]]));
        assert_eq!(row_to_json(&t, 1), json!([3.0, -4.0]));
        let t = tensor_from_json(&json!([1, 2, 3]), DType::I64, "ids").unwrap();
        assert_eq!(t.to_vec::<i64>().unwrap(), vec![1, 2, 3]);
        let t = tensor_from_json(&json!(7), DType::I32, "scalar").unwrap();
        assert_eq!(t.shape(), &[] as &[i64]);
        assert_eq!(tensor_to_json(&t), json!(7));
    }

    #[test]
    fn strings_and_base64() {
        let t = tensor_from_json(&json!(["a", {"b64": "/wA="}]), DType::String, "s").unwrap();
        assert_eq!(t.strings().unwrap()[1], Bytes::from_static(b"\xff\x00"));
        assert_eq!(tensor_to_json(&t), json!(["a", {"b64": "/wA="}]));
        let err = tensor_from_json(&json!([{"b64": "***"}]), DType::String, "s").unwrap_err();
        assert!(err.message().contains("invalid base64"), "{err}");
    }

    #[test]
    fn bad_values_and_ragged_arrays_are_named() {
        let err = tensor_from_json(&json!([[1.0, 2.0], [3.0]]), DType::F32, "input 'x'").unwrap_err();
        assert!(err.message().contains("ragged"), "{err}");
        let err = tensor_from_json(&json!([1.0, "two"]), DType::F32, "input 'x'").unwrap_err();
        assert!(err.message().contains("value 1 is \"two\""), "{err}");
        assert!(err.message().contains("DT_FLOAT needs a number"), "{err}");
        let err = tensor_from_json(&json!([300]), DType::U8, "input 'img'").unwrap_err();
        assert!(err.message().contains("0..=255"), "{err}");
        let err = tensor_from_json(&json!([1.5]), DType::I64, "input 'ids'").unwrap_err();
        assert!(err.message().contains("integer"), "{err}");
    }
}
