//! [`Tensor`] ⇄ `TF_Tensor`.
//!
//! Into TensorFlow, the values of one tensor, or of several requests'
//! tensors joined into a batch and padded, are copied once into a buffer
//! TensorFlow allocated (aligned as its kernels want). Strings become
//! `TF_TString`s, which TensorFlow frees with the tensor. Out of it, each
//! output is copied once into a `Bytes` buffer that the response and the
//! per-request split share.

use std::ffi::{c_char, c_int};

use bytes::Bytes;

use super::ffi::{Api, Opaque, TString};
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};

/// A `TF_Tensor` this side owns: deleted when dropped.
pub struct TfTensor<'a> {
    api: &'a Api,
    raw: *mut Opaque,
}

impl<'a> TfTensor<'a> {
    /// Takes ownership of `raw` (non-null).
    pub fn own(api: &'a Api, raw: *mut Opaque) -> TfTensor<'a> {
        TfTensor { api, raw }
    }

    /// The handle, for `TF_SessionRun`'s inputs.
    pub fn raw(&self) -> *mut Opaque {
        self.raw
    }
}

impl Drop for TfTensor<'_> {
    fn drop(&mut self) {
        // SAFETY: `raw` is a tensor this value owns and nothing else frees.
        unsafe { (self.api.delete_tensor)(self.raw) }
    }
}

/// `parts` (the same input of each request in a batch) as one TensorFlow
/// tensor: one part exactly as sent when `padded_rows` is 0, else joined
/// along dimension 0 and padded with zero rows (empty strings) up to
/// `padded_rows`. The caller validated the parts against the signature.
pub fn batch_input<'a>(api: &'a Api, parts: &[&Tensor], padded_rows: usize) -> Result<TfTensor<'a>> {
    let first = parts.first().ok_or_else(|| Error::internal("a batch of zero requests, this is a bug"))?;
    let dtype = first.dtype();
    let shape: Vec<i64> = if parts.len() == 1 && (padded_rows == 0 || first.shape().is_empty()) {
        first.shape().to_vec()
    } else {
        let rows: usize = parts.iter().map(|p| p.rows()).sum();
        let mut shape = first.shape().to_vec();
        if shape.is_empty() {
            return Err(Error::internal("a batch of scalars, this is a bug"));
        }
        shape[0] = padded_rows.max(rows) as i64;
        shape
    };
    let elements = crate::tensor::element_count(&shape)?;
    let rank = c_int::try_from(shape.len()).map_err(|_| Error::internal("a tensor of absurd rank"))?;
    match dtype.size() {
        Some(size) => {
            let total = elements * size;
            // SAFETY: the shape has `rank` dimensions whose product times the
            // element size is `total`, as TF_AllocateTensor requires.
            let raw = unsafe { (api.allocate_tensor)(dtype.to_tf(), shape.as_ptr(), rank, total) };
            if raw.is_null() {
                return Err(Error::resource_exhausted(format!("TensorFlow could not allocate {total} bytes")));
            }
            let tensor = TfTensor::own(api, raw);
            // SAFETY: the tensor's buffer holds `total` bytes (just
            // allocated for them), is not shared yet, and u8 has no
            // invalid values.
            let dst = unsafe { std::slice::from_raw_parts_mut((api.tensor_data)(raw).cast::<u8>(), total) };
            let mut at = 0;
            for part in parts {
                let bytes = part.bytes().ok_or_else(|| Error::internal("fixed-size tensor without bytes"))?;
                let end = at + bytes.len();
                dst.get_mut(at..end)
                    .ok_or_else(|| Error::internal("batch parts larger than the batch, this is a bug"))?
                    .copy_from_slice(bytes);
                at = end;
            }
            dst[at..].fill(0);
            Ok(tensor)
        }
        None => {
            let strings: Vec<&Bytes> = parts.iter().filter_map(|p| p.strings()).flatten().collect();
            if strings.len() > elements {
                return Err(Error::internal("more strings than the batch holds, this is a bug"));
            }
            let total = elements * std::mem::size_of::<TString>();
            // SAFETY: as above, with TF_TString elements.
            let raw = unsafe { (api.allocate_tensor)(DType::String.to_tf(), shape.as_ptr(), rank, total) };
            if raw.is_null() {
                return Err(Error::resource_exhausted(format!("TensorFlow could not allocate {total} bytes")));
            }
            let tensor = TfTensor::own(api, raw);
            // SAFETY: TF_AllocateTensor of DT_STRING gives `elements`
            // default-initialised TF_TStrings; each is reinitialised (empty)
            // and then given its bytes, which TensorFlow copies.
            unsafe {
                let base = (api.tensor_data)(raw).cast::<TString>();
                for i in 0..elements {
                    let element = base.add(i);
                    (api.string_init)(element);
                    if let Some(bytes) = strings.get(i) {
                        (api.string_copy)(element, bytes.as_ptr().cast::<c_char>(), bytes.len());
                    }
                }
            }
            Ok(tensor)
        }
    }
}

/// Copies an output TensorFlow returned into a [`Tensor`]; `name` names
/// it in errors.
pub fn output(api: &Api, tensor: &TfTensor<'_>, name: &str) -> Result<Tensor> {
    let raw = tensor.raw();
    // SAFETY: `raw` is a live tensor TF_SessionRun returned.
    let (ty, rank) = unsafe { ((api.tensor_type)(raw), (api.num_dims)(raw)) };
    let dtype = DType::from_tf(ty)
        .map_err(|e| Error::internal(format!("output '{name}' is a tensor of {e}, which sluice does not serve")))?;
    // SAFETY: dimensions 0..rank exist.
    let shape: Vec<i64> = (0..rank).map(|d| unsafe { (api.dim)(raw, d) }).collect();
    let elements = crate::tensor::element_count(&shape)?;
    // SAFETY: as above.
    let (data, byte_size) = unsafe { ((api.tensor_data)(raw), (api.tensor_byte_size)(raw)) };
    match dtype.size() {
        Some(size) => {
            if byte_size != elements * size {
                return Err(Error::internal(format!(
                    "output '{name}' holds {byte_size} bytes for shape {shape:?} of {dtype}"
                )));
            }
            let bytes = if byte_size == 0 {
                Bytes::new()
            } else {
                // SAFETY: the tensor's buffer holds `byte_size` initialised
                // bytes and lives until `tensor` drops, after this copy.
                Bytes::copy_from_slice(unsafe { std::slice::from_raw_parts(data.cast::<u8>(), byte_size) })
            };
            Tensor::from_bytes(dtype, shape, bytes)
        }
        None => {
            let mut strings = Vec::with_capacity(elements);
            let base = data.cast::<TString>().cast_const();
            for i in 0..elements {
                // SAFETY: a DT_STRING tensor of `elements` elements holds that
                // many initialised TF_TStrings; each one's data pointer is
                // valid for its size while the tensor lives.
                let bytes = unsafe {
                    let element = base.add(i);
                    let size = (api.string_get_size)(element);
                    let pointer = (api.string_get_data_pointer)(element);
                    if size == 0 {
                        Bytes::new()
                    } else {
                        Bytes::copy_from_slice(std::slice::from_raw_parts(pointer.cast::<u8>(), size))
                    }
                };
                strings.push(bytes);
            }
            Tensor::from_strings(shape, strings)
        }
    }
}
