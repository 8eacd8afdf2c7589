//! [`Tensor`] ⇄ ONNX Runtime values.
//!
//! Into ONNX Runtime, the values of one tensor, or of several requests'
//! tensors joined into a batch, are copied once into an aligned buffer that
//! ONNX Runtime then reads in place. Out of it, each output is copied once
//! into a `Bytes` buffer that the response and the per-request split share.

use bytes::Bytes;
use ort::value::{DynValue, Tensor as OrtTensor, ValueType};

use super::{DType, Element, Tensor, TensorData};
use crate::error::{Error, Result};

/// Builds an ONNX Runtime value of `dtype` and `shape` whose data is the
/// concatenation of `chunks` followed by `pad_bytes` zero bytes (the rows a
/// batch is padded with). The caller has checked that the lengths add up.
pub fn fixed_value(dtype: DType, shape: &[i64], chunks: &[&[u8]], pad_bytes: usize) -> Result<DynValue> {
    fn build<T: Element + ort::value::PrimitiveTensorElementType + std::fmt::Debug>(
        shape: &[i64],
        chunks: &[&[u8]],
        pad_bytes: usize,
    ) -> Result<DynValue> {
        let total: usize = chunks.iter().map(|c| c.len()).sum::<usize>() + pad_bytes;
        let size = std::mem::size_of::<T>();
        if !total.is_multiple_of(size) {
            return Err(Error::internal(format!(
                "a batch of {total} bytes is not whole {size}-byte elements, this is a bug"
            )));
        }
        let count = total / size;
        let mut values: Vec<T> = Vec::with_capacity(count);
        {
            let spare = &mut values.spare_capacity_mut()[..count];
            // SAFETY: `spare` is `count` possibly uninitialised `T`s, i.e.
            // `total` bytes, viewed as as many possibly uninitialised bytes
            // (MaybeUninit<u8> has no validity requirement, and nothing is
            // read through the view, only written).
            let dst: &mut [std::mem::MaybeUninit<u8>] =
                unsafe { std::slice::from_raw_parts_mut(spare.as_mut_ptr().cast(), total) };
            let mut at = 0;
            for chunk in chunks {
                for (byte, value) in dst[at..at + chunk.len()].iter_mut().zip(chunk.iter()) {
                    byte.write(*value);
                }
                at += chunk.len();
            }
            for byte in &mut dst[at..] {
                byte.write(0);
            }
        }
        // SAFETY: every byte of the first `count` elements was written
        // above, and `T: Pod` makes any bytes a valid `T`.
        unsafe { values.set_len(count) };
        let tensor = OrtTensor::from_array((shape.to_vec(), values)).map_err(ort_error)?;
        Ok(tensor.into_dyn())
    }
    match dtype {
        DType::F32 => build::<f32>(shape, chunks, pad_bytes),
        DType::F64 => build::<f64>(shape, chunks, pad_bytes),
        DType::F16 => build::<half::f16>(shape, chunks, pad_bytes),
        DType::BF16 => build::<half::bf16>(shape, chunks, pad_bytes),
        DType::I8 => build::<i8>(shape, chunks, pad_bytes),
        DType::I16 => build::<i16>(shape, chunks, pad_bytes),
        DType::I32 => build::<i32>(shape, chunks, pad_bytes),
        DType::I64 => build::<i64>(shape, chunks, pad_bytes),
        DType::U8 => build::<u8>(shape, chunks, pad_bytes),
        DType::U16 => build::<u16>(shape, chunks, pad_bytes),
        DType::U32 => build::<u32>(shape, chunks, pad_bytes),
        DType::U64 => build::<u64>(shape, chunks, pad_bytes),
        DType::Bool => {
            // Booleans were checked to be 0 or 1 when the tensor was built.
            let values: Vec<bool> = chunks
                .iter()
                .flat_map(|c| c.iter().map(|&b| b != 0))
                .chain(std::iter::repeat_n(false, pad_bytes))
                .collect();
            let tensor = OrtTensor::from_array((shape.to_vec(), values)).map_err(ort_error)?;
            Ok(tensor.into_dyn())
        }
        DType::String => Err(Error::internal("fixed_value called for DT_STRING, this is a bug")),
        DType::Complex64 | DType::Complex128 => Err(Error::internal(format!(
            "an ONNX Runtime input of {dtype}: models with complex inputs are refused at load, this is a bug"
        ))),
    }
}

/// Builds an ONNX Runtime string tensor. ONNX Runtime takes UTF-8 without
/// NUL bytes; anything else is refused with the element named.
pub fn string_value(shape: &[i64], strings: &[&Bytes], pad: usize) -> Result<DynValue> {
    // `ort` takes owned strings here and copies them again into ONNX
    // Runtime; string tensors are rare enough on the hot path for that.
    let mut texts: Vec<String> = Vec::with_capacity(strings.len() + pad);
    for (i, bytes) in strings.iter().enumerate() {
        let text = std::str::from_utf8(bytes).map_err(|e| {
            Error::invalid_argument(format!(
                "string element {i} is not valid UTF-8 ({e}); ONNX Runtime string tensors hold UTF-8 text"
            ))
        })?;
        if text.contains('\0') {
            return Err(Error::invalid_argument(format!(
                "string element {i} contains a NUL byte, which ONNX Runtime string tensors cannot hold"
            )));
        }
        texts.push(text.to_owned());
    }
    texts.resize(strings.len() + pad, String::new());
    let tensor = OrtTensor::from_string_array((shape.to_vec(), texts.as_slice())).map_err(ort_error)?;
    Ok(tensor.into_dyn())
}

/// One tensor as an ONNX Runtime value.
pub fn to_value(tensor: &Tensor) -> Result<DynValue> {
    match tensor.data() {
        TensorData::Fixed(bytes) => fixed_value(tensor.dtype(), tensor.shape(), &[bytes], 0),
        TensorData::Strings(strings) => {
            let refs: Vec<&Bytes> = strings.iter().collect();
            string_value(tensor.shape(), &refs, 0)
        }
    }
}

/// Copies an ONNX Runtime output into a [`Tensor`].
pub fn from_value(value: &DynValue) -> Result<Tensor> {
    let ValueType::Tensor { ty, .. } = value.dtype() else {
        return Err(Error::internal(format!("the model returned a {} where a tensor was expected", value.dtype())));
    };
    let dtype = super::dtype::from_ort(*ty).ok_or_else(|| {
        Error::internal(format!("the model returned a tensor of {ty:?}, which sluice does not serve"))
    })?;
    fn copy<T: Element + ort::value::PrimitiveTensorElementType>(value: &DynValue) -> Result<(Vec<i64>, Bytes)> {
        let (shape, data) = value.try_extract_tensor::<T>().map_err(ort_error)?;
        Ok((shape.to_vec(), Bytes::copy_from_slice(bytemuck::cast_slice(data))))
    }
    let (shape, data) = match dtype {
        DType::F32 => copy::<f32>(value)?,
        DType::F64 => copy::<f64>(value)?,
        DType::F16 => copy::<half::f16>(value)?,
        DType::BF16 => copy::<half::bf16>(value)?,
        DType::I8 => copy::<i8>(value)?,
        DType::I16 => copy::<i16>(value)?,
        DType::I32 => copy::<i32>(value)?,
        DType::I64 => copy::<i64>(value)?,
        DType::U8 => copy::<u8>(value)?,
        DType::U16 => copy::<u16>(value)?,
        DType::U32 => copy::<u32>(value)?,
        DType::U64 => copy::<u64>(value)?,
        DType::Bool => {
            let (shape, data) = value.try_extract_tensor::<bool>().map_err(ort_error)?;
            (shape.to_vec(), data.iter().map(|&b| b as u8).collect::<Vec<u8>>().into())
        }
        DType::Complex64 | DType::Complex128 => {
            return Err(Error::internal(format!(
                "an ONNX Runtime output of {dtype}: models with complex outputs are refused at load, this is a bug"
            )))
        }
        DType::String => {
            let (shape, strings) = value.try_extract_strings().map_err(ort_error)?;
            let strings = strings.into_iter().map(Bytes::from).collect();
            return Ok(Tensor::from_parts_unchecked(dtype, shape.to_vec(), TensorData::Strings(strings)));
        }
    };
    Ok(Tensor::from_parts_unchecked(dtype, shape, TensorData::Fixed(data)))
}

/// An ONNX Runtime error as the runtime's error. ONNX Runtime's own
/// INVALID_ARGUMENT (an index out of range in a Gather, say) is the client's
/// input; everything else is a failure inside the model.
pub fn ort_error<R>(error: ort::Error<R>) -> Error {
    match error.code() {
        ort::ErrorCode::InvalidArgument => {
            Error::invalid_argument(format!("the model rejected the input: {}", error.message()))
        }
        _ => Error::internal(format!("ONNX Runtime failed: {}", error.message())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_of_partial_elements_is_an_error_not_a_write_past_the_buffer() {
        let error = fixed_value(DType::F32, &[1], &[&[0u8; 3]], 0).expect_err("3 bytes are not an f32");
        assert!(error.to_string().contains("not whole 4-byte elements"), "{error}");
    }
}
