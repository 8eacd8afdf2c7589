//! [`Tensor`] in the Open Inference Protocol (KServe v2): datatype names
//! (`FP32`, `BYTES`, …), raw contents (the gRPC `raw_*_contents` and the
//! HTTP binary extension), typed contents (`InferTensorContents`), and the
//! JSON `data` of the REST API.
//!
//! Raw contents are the values row-major with no padding: fixed-size types
//! little-endian, `BYTES` as a 4-byte little-endian length and the bytes
//! per element ([`encode_strings`], [`decode_strings`]). Every tensor is
//! sized against the limit from its declared shape before anything is
//! allocated, and every count is checked against the shape.

use bytes::{Buf, Bytes};
use serde_json::Value;

use super::json::{flatten, tensor_from_leaves};
use super::{element_count, format_shape, tensor_bytes, DType, Tensor, TensorData};
use crate::error::{Error, Result};
use crate::proto::inference::InferTensorContents;

/// Every v2 datatype and the dtype it is.
const DATATYPES: &[(&str, DType)] = &[
    ("BOOL", DType::Bool),
    ("UINT8", DType::U8),
    ("UINT16", DType::U16),
    ("UINT32", DType::U32),
    ("UINT64", DType::U64),
    ("INT8", DType::I8),
    ("INT16", DType::I16),
    ("INT32", DType::I32),
    ("INT64", DType::I64),
    ("FP16", DType::F16),
    ("BF16", DType::BF16),
    ("FP32", DType::F32),
    ("FP64", DType::F64),
    ("BYTES", DType::String),
];

/// The dtype of v2 datatype `name`; `what` names the tensor in the error.
pub fn dtype_of(name: &str, what: &str) -> Result<DType> {
    DATATYPES.iter().find(|(n, _)| *n == name).map(|(_, d)| *d).ok_or_else(|| {
        let names: Vec<&str> = DATATYPES.iter().map(|(n, _)| *n).collect();
        Error::invalid_argument(format!("{what}: datatype \"{name}\" is not a v2 datatype; expected one of {names:?}"))
    })
}

/// The v2 datatype of `dtype`.
pub fn datatype(dtype: DType) -> &'static str {
    match dtype {
        // KServe v2 has no complex datatype: metadata says what the model
        // takes in the v2 style, and requests cannot give it
        // ([`no_complex`]).
        DType::Complex64 => "COMPLEX64",
        DType::Complex128 => "COMPLEX128",
        _ => DATATYPES.iter().find(|(_, d)| *d == dtype).map_or("BYTES", |(n, _)| n),
    }
}

/// KServe v2 has no complex datatype, so no v2 request can give a complex
/// input nor an answer carry a complex output: refused naming the tensor
/// and where such a model is served.
pub fn no_complex(what: &str, dtype: DType) -> Error {
    Error::Unimplemented(format!(
        "{what} is {dtype}: KServe v2 has no complex datatype; call the model over TF Serving's gRPC Predict, \
         which carries complex values"
    ))
}

/// A declared shape, checked (no negative dimension) and sized against
/// `limit` before anything is allocated.
fn checked_shape(dtype: DType, shape: &[i64], limit: usize, what: &str) -> Result<usize> {
    if let Some(d) = shape.iter().find(|&&d| d < 0) {
        return Err(Error::invalid_argument(format!(
            "{what}: shape {} has dimension {d}; dimensions are >= 0",
            format_shape(shape)
        )));
    }
    tensor_bytes(dtype, shape, limit, what)?;
    element_count(shape)
}

/// Byte strings as raw `BYTES` contents.
pub fn encode_strings(strings: &[Bytes]) -> Vec<u8> {
    let mut out = Vec::with_capacity(strings.iter().map(|s| s.len() + 4).sum());
    for s in strings {
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        out.extend_from_slice(s);
    }
    out
}

/// `count` byte strings from raw `BYTES` contents (slices of `raw`, not
/// copies), or what is wrong with them.
pub fn decode_strings(raw: &Bytes, count: usize) -> std::result::Result<Vec<Bytes>, String> {
    let mut rest = raw.clone();
    let mut strings = Vec::with_capacity(count.min(raw.len() / 4));
    for n in 0..count {
        if rest.remaining() < 4 {
            return Err(format!(
                "ends before element {n} of {count}; each element is a 4-byte little-endian length and its bytes"
            ));
        }
        let len = rest.get_u32_le() as usize;
        if rest.remaining() < len {
            return Err(format!("element {n} says {len} bytes, but only {} remain", rest.remaining()));
        }
        strings.push(rest.split_to(len));
    }
    if rest.has_remaining() {
        return Err(format!("has {} bytes after its {count} elements", rest.remaining()));
    }
    Ok(strings)
}

/// A tensor from raw contents.
pub fn decode_raw(dtype: DType, shape: Vec<i64>, raw: Bytes, limit: usize, what: &str) -> Result<Tensor> {
    let count = checked_shape(dtype, &shape, limit, what)?;
    if dtype == DType::String {
        let strings = decode_strings(&raw, count)
            .map_err(|problem| Error::invalid_argument(format!("{what}: the raw BYTES contents {problem}")))?;
        return Tensor::from_strings(shape, strings);
    }
    Tensor::from_bytes(dtype, shape, raw).map_err(|e| {
        Error::invalid_argument(format!(
            "{what}: raw contents: {}",
            e.message().replace("tensor_content", "the raw data")
        ))
    })
}

/// A tensor's raw contents: its bytes as they are (no copy), or its
/// strings length-prefixed.
pub fn encode_raw(tensor: &Tensor) -> Bytes {
    match tensor.data() {
        TensorData::Fixed(bytes) => bytes.clone(),
        TensorData::Strings(strings) => Bytes::from(encode_strings(strings)),
    }
}

/// The typed-contents fields a message sets, for messages.
fn fields_set(c: &InferTensorContents) -> Vec<&'static str> {
    [
        ("bool_contents", c.bool_contents.len()),
        ("int_contents", c.int_contents.len()),
        ("int64_contents", c.int64_contents.len()),
        ("uint_contents", c.uint_contents.len()),
        ("uint64_contents", c.uint64_contents.len()),
        ("fp32_contents", c.fp32_contents.len()),
        ("fp64_contents", c.fp64_contents.len()),
        ("bytes_contents", c.bytes_contents.len()),
    ]
    .into_iter()
    .filter(|(_, n)| *n > 0)
    .map(|(name, _)| name)
    .collect()
}

/// A tensor from typed contents: the field the datatype uses, holding
/// exactly the shape's element count, and no other field.
pub fn decode_contents(
    dtype: DType,
    shape: Vec<i64>,
    contents: InferTensorContents,
    limit: usize,
    what: &str,
) -> Result<Tensor> {
    let count = checked_shape(dtype, &shape, limit, what)?;
    let field = match dtype {
        DType::Bool => "bool_contents",
        DType::I8 | DType::I16 | DType::I32 => "int_contents",
        DType::I64 => "int64_contents",
        DType::U8 | DType::U16 | DType::U32 => "uint_contents",
        DType::U64 => "uint64_contents",
        DType::F32 => "fp32_contents",
        DType::F64 => "fp64_contents",
        DType::String => "bytes_contents",
        DType::F16 | DType::BF16 => {
            return Err(Error::invalid_argument(format!(
                "{what}: {} has no typed contents; send it in raw_input_contents",
                datatype(dtype)
            )))
        }
        DType::Complex64 | DType::Complex128 => return Err(no_complex(what, dtype)),
    };
    let set = fields_set(&contents);
    if set.iter().any(|f| *f != field) || (count > 0 && set.is_empty()) {
        return Err(Error::invalid_argument(format!(
            "{what}: {} values go in {field}, but the contents set {set:?}",
            datatype(dtype)
        )));
    }
    let wrong_count = |given: usize| {
        Error::invalid_argument(format!(
            "{what}: {field} holds {given} values, but shape {} needs {count}",
            format_shape(&shape)
        ))
    };
    macro_rules! narrow {
        ($values:expr, $ty:ty) => {{
            let values = $values;
            if values.len() != count {
                return Err(wrong_count(values.len()));
            }
            let mut out: Vec<$ty> = Vec::with_capacity(count);
            for (i, &v) in values.iter().enumerate() {
                out.push(<$ty>::try_from(v).map_err(|_| {
                    Error::invalid_argument(format!(
                        "{what}: value {i} is {v}, out of the range of {}",
                        datatype(dtype)
                    ))
                })?);
            }
            Tensor::from_values(shape, &out)
        }};
    }
    macro_rules! same {
        ($values:expr) => {{
            let values = $values;
            if values.len() != count {
                return Err(wrong_count(values.len()));
            }
            Tensor::from_values(shape, &values)
        }};
    }
    Ok(match dtype {
        DType::Bool => {
            if contents.bool_contents.len() != count {
                return Err(wrong_count(contents.bool_contents.len()));
            }
            Tensor::from_bools(shape, &contents.bool_contents)
        }
        DType::I8 => narrow!(contents.int_contents, i8),
        DType::I16 => narrow!(contents.int_contents, i16),
        DType::I32 => same!(contents.int_contents),
        DType::I64 => same!(contents.int64_contents),
        DType::U8 => narrow!(contents.uint_contents, u8),
        DType::U16 => narrow!(contents.uint_contents, u16),
        DType::U32 => same!(contents.uint_contents),
        DType::U64 => same!(contents.uint64_contents),
        DType::F32 => same!(contents.fp32_contents),
        DType::F64 => same!(contents.fp64_contents),
        DType::String => {
            if contents.bytes_contents.len() != count {
                return Err(wrong_count(contents.bytes_contents.len()));
            }
            Tensor::from_strings(shape, contents.bytes_contents)?
        }
        DType::F16 | DType::BF16 | DType::Complex64 | DType::Complex128 => {
            return Err(Error::internal("a datatype without typed contents got past the check, this is a bug"))
        }
    })
}

/// A tensor from the JSON `data` of a REST request: flat or nested, its
/// element count that of the declared shape.
pub fn decode_json(dtype: DType, shape: Vec<i64>, data: &Value, limit: usize, what: &str) -> Result<Tensor> {
    let count = checked_shape(dtype, &shape, limit, what)?;
    let leaves = match data {
        Value::Array(_) => flatten(data, &what)?.1,
        one => vec![one],
    };
    if leaves.len() != count {
        return Err(Error::invalid_argument(format!(
            "{what}: data holds {} values, but shape {} needs {count}",
            leaves.len(),
            format_shape(&shape)
        )));
    }
    tensor_from_leaves(dtype, shape, &leaves, what)
}

/// The tensor with its values as one flat list, for JSON `data`.
pub fn flat(tensor: &Tensor) -> Tensor {
    Tensor::from_parts_unchecked(tensor.dtype(), vec![tensor.len() as i64], tensor.data().clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_and_typed_contents_agree_and_bad_ones_say_why() {
        let typed = InferTensorContents { fp32_contents: vec![1.0, -2.5], ..Default::default() };
        let a = decode_contents(DType::F32, vec![1, 2], typed, 1 << 20, "x").unwrap();
        let b = decode_raw(DType::F32, vec![1, 2], encode_raw(&a), 1 << 20, "x").unwrap();
        assert_eq!(a, b);
        let strings = Tensor::from_strings(vec![2], vec![Bytes::from("ab"), Bytes::new()]).unwrap();
        assert_eq!(decode_raw(DType::String, vec![2], encode_raw(&strings), 1 << 20, "s").unwrap(), strings);
        let err = decode_raw(DType::String, vec![3], encode_raw(&strings), 1 << 20, "s").unwrap_err();
        assert!(err.message().contains("before element 2"), "{err}");
        let int8 = InferTensorContents { int_contents: vec![1, 300], ..Default::default() };
        let err = decode_contents(DType::I8, vec![2], int8, 1 << 20, "x").unwrap_err();
        assert!(err.message().contains("value 1 is 300"), "{err}");
        let mixed = InferTensorContents { fp32_contents: vec![1.0], int64_contents: vec![1], ..Default::default() };
        let err = decode_contents(DType::F32, vec![1], mixed, 1 << 20, "x").unwrap_err();
        assert!(err.message().contains("int64_contents"), "{err}");
        let short = InferTensorContents { fp32_contents: vec![1.0], ..Default::default() };
        let err = decode_contents(DType::F32, vec![2, 1], short, 1 << 20, "x").unwrap_err();
        assert!(err.message().contains("holds 1 values") && err.message().contains("needs 2"), "{err}");
        let err = decode_raw(DType::F32, vec![1 << 40], Bytes::new(), 1 << 20, "x").unwrap_err();
        assert_eq!(err.code(), crate::error::Code::ResourceExhausted);
        assert!(dtype_of("FLOAT", "x").unwrap_err().message().contains("FP32"));
    }

    #[test]
    fn json_data_may_be_flat_or_nested() {
        let flat_data = serde_json::json!([1, 2, 3, 4]);
        let nested = serde_json::json!([[1, 2], [3, 4]]);
        let a = decode_json(DType::I64, vec![2, 2], &flat_data, 1 << 20, "x").unwrap();
        assert_eq!(a, decode_json(DType::I64, vec![2, 2], &nested, 1 << 20, "x").unwrap());
        let err = decode_json(DType::I64, vec![3], &flat_data, 1 << 20, "x").unwrap_err();
        assert!(err.message().contains("4 values"), "{err}");
    }
}
