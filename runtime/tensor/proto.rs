//! TensorFlow's `TensorProto` ⇄ [`Tensor`].
//!
//! Decoding validates everything a client controls: the dtype, each
//! dimension, the element count (overflow included), the byte length of
//! `tensor_content`, the count and range of typed values, and values put in
//! a field that does not belong to the dtype. `tensor_content` is taken as a
//! slice of the request buffer, without a copy; typed values are copied once
//! into little-endian bytes. A single typed value fills the whole shape, as
//! in TensorFlow.

use bytes::Bytes;

use super::spec::{Signature, TensorSpec, PREDICT_METHOD};
use super::{element_count, format_shape, tensor_bytes, DType, Tensor, TensorData};
use crate::config::OutputEncoding;
use crate::error::{Error, Result};
use crate::proto::tensorflow::{
    tensor_info, tensor_shape_proto, SignatureDef, TensorInfo, TensorProto, TensorShapeProto,
};

/// The `metadata_field` (and key) of GetModelMetadata's signatures.
pub const SIGNATURE_DEF_FIELD: &str = "signature_def";

/// The `Any` type of GetModelMetadata's signatures.
pub const SIGNATURE_DEF_MAP_TYPE: &str = "type.googleapis.com/tensorflow.serving.SignatureDefMap";

/// Decodes the tensor a client sent as input `name`; a tensor that would
/// take more than `max_bytes` in memory (a single typed value broadcast to
/// a huge shape) is refused before anything is allocated.
pub fn decode(name: &str, proto: TensorProto, max_bytes: usize) -> Result<Tensor> {
    decode_inner(proto, max_bytes).map_err(|e| e.context(format_args!("input '{name}'")))
}

fn decode_inner(mut proto: TensorProto, max_bytes: usize) -> Result<Tensor> {
    let dtype = DType::from_tf(proto.dtype).map_err(|e| Error::invalid_argument(format!("dtype {e}")))?;
    let shape = decode_shape(proto.tensor_shape.take())?;
    let count = element_count(&shape)?;
    tensor_bytes(dtype, &shape, max_bytes, "the tensor")?;
    check_no_foreign_values(dtype, &proto)?;
    if dtype == DType::String {
        if !proto.tensor_content.is_empty() {
            return Err(Error::invalid_argument("DT_STRING values cannot travel in tensor_content; use string_val"));
        }
        let strings = expand_strings(std::mem::take(&mut proto.string_val), count, &shape)?;
        return Tensor::from_strings(shape, strings);
    }
    if !proto.tensor_content.is_empty() {
        return Tensor::from_bytes(dtype, shape, std::mem::take(&mut proto.tensor_content));
    }
    let bytes = typed_values_to_bytes(dtype, &proto, count, &shape)?;
    Tensor::from_bytes(dtype, shape, bytes)
}

fn decode_shape(shape: Option<TensorShapeProto>) -> Result<Vec<i64>> {
    // A missing shape is a scalar, as in TensorFlow.
    let Some(shape) = shape else { return Ok(Vec::new()) };
    if shape.unknown_rank {
        return Err(Error::invalid_argument("tensor_shape has unknown_rank set; a tensor value needs a known shape"));
    }
    Ok(shape.dim.into_iter().map(|d| d.size).collect())
}

/// The typed field that carries each dtype's values.
fn field_of(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float_val",
        DType::F64 => "double_val",
        DType::I8 | DType::I16 | DType::I32 | DType::U8 | DType::U16 => "int_val",
        DType::I64 => "int64_val",
        DType::U32 => "uint32_val",
        DType::U64 => "uint64_val",
        DType::Bool => "bool_val",
        DType::F16 | DType::BF16 => "half_val",
        DType::String => "string_val",
        DType::Complex64 => "scomplex_val",
        DType::Complex128 => "dcomplex_val",
    }
}

/// Values in a field that does not belong to the dtype are a client error
/// (typically a string sent where a number is expected), not something to
/// ignore.
fn check_no_foreign_values(dtype: DType, proto: &TensorProto) -> Result<()> {
    let fields: [(&str, usize); 13] = [
        ("float_val", proto.float_val.len()),
        ("double_val", proto.double_val.len()),
        ("int_val", proto.int_val.len()),
        ("string_val", proto.string_val.len()),
        ("scomplex_val", proto.scomplex_val.len()),
        ("int64_val", proto.int64_val.len()),
        ("bool_val", proto.bool_val.len()),
        ("dcomplex_val", proto.dcomplex_val.len()),
        ("half_val", proto.half_val.len()),
        ("resource_handle_val", proto.resource_handle_val.len()),
        ("variant_val", proto.variant_val.len()),
        ("uint32_val", proto.uint32_val.len()),
        ("uint64_val", proto.uint64_val.len()),
    ];
    let own = field_of(dtype);
    if let Some((field, _)) = fields.iter().find(|(field, len)| *len > 0 && *field != own) {
        let content = if dtype == DType::String { "" } else { " or tensor_content" };
        return Err(Error::invalid_argument(format!(
            "dtype is {dtype}, but values were given in {field}; {dtype} values go in {own}{content}"
        )));
    }
    Ok(())
}

/// `n` values for `count` elements: exactly `count`, or one that fills the
/// shape. Returns true when the one value is to be broadcast.
fn check_count(field: &str, n: usize, count: usize, shape: &[i64]) -> Result<bool> {
    if n == count {
        return Ok(false);
    }
    if n == 1 {
        return Ok(true);
    }
    if n == 0 {
        return Err(Error::invalid_argument(format!(
            "shape {} needs {count} values, but none were given; set tensor_content or {field}",
            format_shape(shape)
        )));
    }
    Err(Error::invalid_argument(format!(
        "{field} has {n} values, but shape {} needs {count} (or exactly 1, which fills the shape)",
        format_shape(shape)
    )))
}

fn expand_strings(values: Vec<Bytes>, count: usize, shape: &[i64]) -> Result<Vec<Bytes>> {
    if check_count("string_val", values.len(), count, shape)? {
        let value = values.into_iter().next().unwrap_or_default();
        return Ok(vec![value; count]);
    }
    Ok(values)
}

/// Copies `values` (or broadcasts the single one) into little-endian bytes.
fn expand<T: bytemuck::Pod>(field: &str, values: &[T], count: usize, shape: &[i64]) -> Result<Bytes> {
    let broadcast = check_count(field, values.len(), count, shape)?;
    let bytes: Vec<u8> = if broadcast {
        let one = bytemuck::bytes_of(&values[0]);
        let mut out = Vec::with_capacity(one.len() * count);
        for _ in 0..count {
            out.extend_from_slice(one);
        }
        out
    } else {
        bytemuck::cast_slice(values).to_vec()
    };
    Ok(Bytes::from(bytes))
}

/// Narrows int_val / half_val entries to the dtype's width, naming the first
/// value out of range.
fn narrow<T: TryFrom<i32> + bytemuck::Pod>(field: &str, dtype: DType, values: &[i32], range: &str) -> Result<Vec<T>> {
    values
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            T::try_from(v).map_err(|_| {
                Error::invalid_argument(format!("{field}[{i}] = {v} is out of range for {dtype} ({range})"))
            })
        })
        .collect()
}

fn typed_values_to_bytes(dtype: DType, proto: &TensorProto, count: usize, shape: &[i64]) -> Result<Bytes> {
    let field = field_of(dtype);
    match dtype {
        DType::F32 => expand(field, &proto.float_val, count, shape),
        DType::F64 => expand(field, &proto.double_val, count, shape),
        DType::I32 => expand(field, &proto.int_val, count, shape),
        DType::I64 => expand(field, &proto.int64_val, count, shape),
        DType::U32 => expand(field, &proto.uint32_val, count, shape),
        DType::U64 => expand(field, &proto.uint64_val, count, shape),
        DType::I16 => expand(field, &narrow::<i16>(field, dtype, &proto.int_val, "-32768..=32767")?, count, shape),
        DType::I8 => expand(field, &narrow::<i8>(field, dtype, &proto.int_val, "-128..=127")?, count, shape),
        DType::U8 => expand(field, &narrow::<u8>(field, dtype, &proto.int_val, "0..=255")?, count, shape),
        DType::U16 | DType::F16 | DType::BF16 => {
            let values = if dtype == DType::U16 { &proto.int_val } else { &proto.half_val };
            expand(field, &narrow::<u16>(field, dtype, values, "0..=65535")?, count, shape)
        }
        DType::Bool => {
            let bytes: Vec<u8> = proto.bool_val.iter().map(|&b| b as u8).collect();
            expand(field, &bytes, count, shape)
        }
        DType::Complex64 => expand(field, &pairs(field, dtype, &proto.scomplex_val)?, count, shape),
        DType::Complex128 => expand(field, &pairs(field, dtype, &proto.dcomplex_val)?, count, shape),
        DType::String => unreachable!("strings are decoded before typed values, this is a bug"),
    }
}

/// A complex field's numbers as (real, imaginary) pairs, one per element,
/// as TensorFlow lays them out.
fn pairs<T: bytemuck::Pod>(field: &str, dtype: DType, values: &[T]) -> Result<Vec<[T; 2]>> {
    if !values.len().is_multiple_of(2) {
        return Err(Error::invalid_argument(format!(
            "{field} holds {} numbers; {dtype} values are (real, imaginary) pairs, two numbers each",
            values.len()
        )));
    }
    Ok(values.chunks_exact(2).map(|pair| [pair[0], pair[1]]).collect())
}

/// The `TensorShapeProto` of a shape.
pub fn encode_shape(shape: &[i64]) -> TensorShapeProto {
    TensorShapeProto {
        dim: shape.iter().map(|&size| tensor_shape_proto::Dim { size, name: String::new() }).collect(),
        unknown_rank: false,
    }
}

/// Encodes an output tensor for a response.
pub fn encode(tensor: &Tensor, encoding: OutputEncoding) -> TensorProto {
    let mut proto = TensorProto {
        dtype: tensor.dtype().to_tf(),
        tensor_shape: Some(encode_shape(tensor.shape())),
        ..Default::default()
    };
    let bytes = match tensor.data() {
        TensorData::Strings(strings) => {
            proto.string_val = strings.clone();
            return proto;
        }
        TensorData::Fixed(bytes) => bytes,
    };
    if encoding == OutputEncoding::TensorContent {
        // Shares the buffer; the only copy is into the response frame.
        proto.tensor_content = bytes.clone();
        return proto;
    }
    fn le<T: bytemuck::Pod>(bytes: &Bytes) -> Vec<T> {
        bytemuck::pod_collect_to_vec(bytes)
    }
    match tensor.dtype() {
        DType::F32 => proto.float_val = le(bytes),
        DType::F64 => proto.double_val = le(bytes),
        DType::I32 => proto.int_val = le(bytes),
        DType::I64 => proto.int64_val = le(bytes),
        DType::U32 => proto.uint32_val = le(bytes),
        DType::U64 => proto.uint64_val = le(bytes),
        DType::I16 => proto.int_val = le::<i16>(bytes).into_iter().map(i32::from).collect(),
        DType::I8 => proto.int_val = le::<i8>(bytes).into_iter().map(i32::from).collect(),
        DType::U8 => proto.int_val = bytes.iter().map(|&b| i32::from(b)).collect(),
        DType::U16 => proto.int_val = le::<u16>(bytes).into_iter().map(i32::from).collect(),
        DType::F16 | DType::BF16 => proto.half_val = le::<u16>(bytes).into_iter().map(i32::from).collect(),
        DType::Bool => proto.bool_val = bytes.iter().map(|&b| b != 0).collect(),
        DType::Complex64 => proto.scomplex_val = le(bytes),
        DType::Complex128 => proto.dcomplex_val = le(bytes),
        DType::String => unreachable!("strings are encoded above, this is a bug"),
    }
    proto
}

/// A signature as TensorFlow's `SignatureDef`.
pub fn signature_def(signature: &Signature) -> SignatureDef {
    signature_def_of(signature, PREDICT_METHOD)
}

/// `signature` as a `SignatureDef` of `method` (TF Serving's method name).
pub fn signature_def_of(signature: &Signature, method: &str) -> SignatureDef {
    let info = |spec: &TensorSpec| {
        (
            spec.name.clone(),
            TensorInfo {
                encoding: Some(tensor_info::Encoding::Name(spec.name.clone())),
                dtype: spec.dtype.to_tf(),
                tensor_shape: Some(if spec.unknown_rank {
                    TensorShapeProto { dim: Vec::new(), unknown_rank: true }
                } else {
                    encode_shape(&spec.shape)
                }),
            },
        )
    };
    SignatureDef {
        inputs: signature.inputs.iter().map(info).collect(),
        outputs: signature.outputs.iter().map(info).collect(),
        method_name: method.to_string(),
        defaults: std::collections::HashMap::new(),
    }
}

/// The signature a TensorFlow `SignatureDef` describes (an upstream's
/// metadata): dtypes, dimensions (-1 where free), unknown ranks. Inputs and
/// outputs come in name order (a `SignatureDef` keeps them in maps).
pub fn signature_of_def(def: &SignatureDef) -> Result<Signature> {
    let specs = |role: &str, map: &std::collections::HashMap<String, TensorInfo>| -> Result<Vec<TensorSpec>> {
        let mut specs = map
            .iter()
            .map(|(name, info)| {
                let dtype = DType::from_tf(info.dtype)
                    .map_err(|e| Error::invalid_argument(format!("{role} '{name}' has dtype {e}")))?;
                let (shape, unknown_rank) = match &info.tensor_shape {
                    None => (Vec::new(), true),
                    Some(shape) if shape.unknown_rank => (Vec::new(), true),
                    Some(shape) => (shape.dim.iter().map(|d| if d.size < 0 { -1 } else { d.size }).collect(), false),
                };
                Ok(TensorSpec { name: name.clone(), dtype, shape, unknown_rank })
            })
            .collect::<Result<Vec<_>>>()?;
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(specs)
    };
    if def.inputs.is_empty() || def.outputs.is_empty() {
        return Err(Error::invalid_argument("the signature has no inputs or no outputs"));
    }
    Ok(Signature { inputs: specs("input", &def.inputs)?, outputs: specs("output", &def.outputs)? })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(dims: &[i64]) -> Option<TensorShapeProto> {
        Some(encode_shape(dims))
    }

    fn f32_proto(dims: &[i64], values: Vec<f32>) -> TensorProto {
        TensorProto { dtype: DType::F32.to_tf(), tensor_shape: shape(dims), float_val: values, ..Default::default() }
    }

    #[test]
    fn a_broadcast_past_the_tensor_limit_is_refused_before_allocating() {
        // One value filling 2^33 elements would be 32 GiB.
        let err = decode("x", f32_proto(&[1 << 20, 1 << 13], vec![1.0]), 1 << 20).unwrap_err();
        assert_eq!(err.code(), crate::error::Code::ResourceExhausted);
        assert!(err.message().contains("server.max_tensor_bytes"), "{err}");
        assert!(err.message().contains("input 'x'"), "{err}");
        let strings = TensorProto {
            dtype: DType::String.to_tf(),
            tensor_shape: Some(encode_shape(&[1 << 40])),
            string_val: vec![Bytes::from_static(b"a")],
            ..Default::default()
        };
        assert!(matches!(decode("s", strings, 1 << 20), Err(crate::error::Error::LimitExceeded(_))));
        assert!(decode("x", f32_proto(&[2, 2], vec![1.0]), 1 << 20).is_ok());
    }
    #[test]
    fn typed_values_decode_and_broadcast() {
        let t = decode("x", f32_proto(&[2, 2], vec![1.0, 2.0, 3.0, 4.0]), usize::MAX).unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
        let t = decode("x", f32_proto(&[2, 3], vec![7.0]), usize::MAX).unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![7.0; 6]);
        let err = decode("x", f32_proto(&[2, 3], vec![1.0, 2.0]), usize::MAX).unwrap_err();
        assert!(err.message().starts_with("input 'x': float_val has 2 values"), "{err}");
        let err = decode("x", f32_proto(&[2, 3], vec![]), usize::MAX).unwrap_err();
        assert!(err.message().contains("none were given"), "{err}");
    }

    #[test]
    fn tensor_content_is_shared_not_copied() {
        let content = Bytes::from(vec![0u8; 16]);
        let proto = TensorProto {
            dtype: DType::F32.to_tf(),
            tensor_shape: shape(&[4]),
            tensor_content: content.clone(),
            ..Default::default()
        };
        let t = decode("x", proto, usize::MAX).unwrap();
        assert_eq!(t.bytes().unwrap().as_ptr(), content.as_ptr());
    }

    #[test]
    fn foreign_field_and_range_errors_name_the_field() {
        let proto = TensorProto {
            dtype: DType::F32.to_tf(),
            tensor_shape: shape(&[1]),
            string_val: vec![Bytes::from_static(b"abc")],
            ..Default::default()
        };
        let err = decode("x", proto, usize::MAX).unwrap_err();
        assert!(err.message().contains("string_val"), "{err}");
        assert!(err.message().contains("float_val or tensor_content"), "{err}");

        let proto = TensorProto {
            dtype: DType::U8.to_tf(),
            tensor_shape: shape(&[2]),
            int_val: vec![3, 300],
            ..Default::default()
        };
        let err = decode("img", proto, usize::MAX).unwrap_err();
        assert!(err.message().contains("int_val[1] = 300"), "{err}");
        assert!(err.message().contains("DT_UINT8"), "{err}");
    }

    #[test]
    fn negative_dims_and_unknown_rank_are_refused() {
        let err = decode("x", f32_proto(&[-1, 2], vec![1.0]), usize::MAX).unwrap_err();
        assert!(err.message().contains("dimension 0 is -1"), "{err}");
        let proto = TensorProto {
            dtype: DType::F32.to_tf(),
            tensor_shape: Some(TensorShapeProto { dim: vec![], unknown_rank: true }),
            float_val: vec![1.0],
            ..Default::default()
        };
        assert!(decode("x", proto, usize::MAX).unwrap_err().message().contains("unknown_rank"));
    }

    #[test]
    fn every_dtype_round_trips_in_both_encodings() {
        let tensors = vec![
            Tensor::from_values(vec![3], &[1.5f32, -2.0, 0.0]),
            Tensor::from_values(vec![2], &[1e300f64, -1.0]),
            Tensor::from_values(vec![2], &[half::f16::from_f32(1.5), half::f16::from_f32(-3.0)]),
            Tensor::from_values(vec![2], &[half::bf16::from_f32(2.0), half::bf16::from_f32(0.5)]),
            Tensor::from_values(vec![2], &[-128i8, 127]),
            Tensor::from_values(vec![2], &[-32768i16, 32767]),
            Tensor::from_values(vec![2], &[i32::MIN, i32::MAX]),
            Tensor::from_values(vec![2], &[i64::MIN, i64::MAX]),
            Tensor::from_values(vec![2], &[0u8, 255]),
            Tensor::from_values(vec![2], &[0u16, 65535]),
            Tensor::from_values(vec![2], &[0u32, u32::MAX]),
            Tensor::from_values(vec![2], &[0u64, u64::MAX]),
            Tensor::from_bools(vec![3], &[true, false, true]),
            Tensor::from_strings(vec![2], vec![Bytes::from_static(b"a"), Bytes::from_static(b"\xff\x00")]).unwrap(),
        ];
        for tensor in tensors {
            for encoding in [OutputEncoding::TypedFields, OutputEncoding::TensorContent] {
                let back = decode("t", encode(&tensor, encoding), usize::MAX).unwrap();
                assert_eq!(back, tensor, "{} via {encoding:?}", tensor.dtype());
            }
        }
    }
}
