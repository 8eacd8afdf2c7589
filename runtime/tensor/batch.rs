//! Joining several requests' tensors into one batch along dimension 0, and
//! splitting a batch's outputs back into per-request tensors.
//!
//! Joining copies each request's bytes once, straight into the buffer ONNX
//! Runtime reads, with zero rows appended as padding. Splitting slices the
//! output's shared buffer: no copy.

use ort::value::DynValue;

use super::{onnx, Tensor, TensorData};
use crate::error::{Error, Result};

/// Joins `parts` (same dtype, same dimensions after the first) along
/// dimension 0 and appends zero rows up to `padded_rows`, as one ONNX
/// Runtime value. The caller has validated the parts against the signature.
pub fn join_to_value(parts: &[&Tensor], padded_rows: usize) -> Result<DynValue> {
    let first = parts.first().ok_or_else(|| Error::internal("join of zero tensors, this is a bug"))?;
    let dtype = first.dtype();
    let inner: &[i64] = first.shape().get(1..).unwrap_or(&[]);
    let mut rows = 0usize;
    for part in parts {
        if part.dtype() != dtype || part.shape().get(1..).unwrap_or(&[]) != inner {
            return Err(Error::internal(format!(
                "batch parts disagree: {} {:?} vs {} {:?}, this is a bug",
                dtype,
                first.shape(),
                part.dtype(),
                part.shape()
            )));
        }
        rows += part.rows();
    }
    if rows > padded_rows {
        return Err(Error::internal(format!(
            "batch of {rows} rows exceeds its padded size {padded_rows}, this is a bug"
        )));
    }
    let mut shape = Vec::with_capacity(inner.len() + 1);
    shape.push(padded_rows as i64);
    shape.extend_from_slice(inner);
    let pad_rows = padded_rows - rows;
    match dtype.size() {
        Some(size) => {
            let row_elements: usize = inner.iter().map(|&d| d as usize).product();
            let chunks: Vec<&[u8]> = parts.iter().filter_map(|p| p.bytes().map(|b| &b[..])).collect();
            onnx::fixed_value(dtype, &shape, &chunks, pad_rows * row_elements * size)
        }
        None => {
            let row_elements: usize = inner.iter().map(|&d| d as usize).product();
            let strings: Vec<&bytes::Bytes> = parts.iter().filter_map(|p| p.strings()).flatten().collect();
            onnx::string_value(&shape, &strings, pad_rows * row_elements)
        }
    }
}

/// Splits `tensor` along dimension 0 into consecutive pieces of `rows`
/// rows each; rows left over (the padding) are dropped. `name` names the
/// output in the error raised when the model did not keep the batch
/// dimension.
pub fn split_rows(tensor: &Tensor, rows: &[usize], name: &str) -> Result<Vec<Tensor>> {
    let total_rows = tensor.shape().first().copied().unwrap_or(-1);
    let wanted: usize = rows.iter().sum();
    if total_rows < 0 || (total_rows as usize) < wanted {
        return Err(Error::internal(format!(
            "output '{name}' has shape {:?}, but the batch had {wanted} rows: the model does not keep \
             dimension 0 as the batch dimension, so it cannot be batched",
            tensor.shape()
        )));
    }
    let total_rows = total_rows as usize;
    let row_elements = tensor.len().checked_div(total_rows).unwrap_or(0);
    let mut pieces = Vec::with_capacity(rows.len());
    let mut start = 0usize;
    for &n in rows {
        let mut shape = tensor.shape().to_vec();
        shape[0] = n as i64;
        let (from, to) = (start * row_elements, (start + n) * row_elements);
        let data = match tensor.data() {
            TensorData::Fixed(bytes) => {
                let size = tensor.dtype().size().unwrap_or(1);
                TensorData::Fixed(bytes.slice(from * size..to * size))
            }
            TensorData::Strings(strings) => TensorData::Strings(strings[from..to].to_vec()),
        };
        pieces.push(Tensor::from_parts_unchecked(tensor.dtype(), shape, data));
        start += n;
    }
    Ok(pieces)
}

/// Joins tensors of the same dtype and inner dimensions along dimension 0
/// into one (one copy): the reassembly of a request that was split across
/// batches.
pub fn concat_rows(parts: &[Tensor]) -> Result<Tensor> {
    let first = parts.first().ok_or_else(|| Error::internal("concat of zero tensors, this is a bug"))?;
    if parts.len() == 1 {
        return Ok(first.clone());
    }
    let inner = first.shape().get(1..).unwrap_or(&[]);
    let mut rows = 0i64;
    for part in parts {
        if part.dtype() != first.dtype() || part.shape().get(1..).unwrap_or(&[]) != inner || part.shape().is_empty() {
            return Err(Error::internal(format!(
                "parts of a split request disagree: {:?} vs {:?}, this is a bug",
                first.shape(),
                part.shape()
            )));
        }
        rows += part.shape()[0];
    }
    let mut shape = first.shape().to_vec();
    shape[0] = rows;
    let data = match first.data() {
        TensorData::Fixed(_) => {
            let mut bytes = Vec::with_capacity(parts.iter().filter_map(|p| p.bytes()).map(|b| b.len()).sum());
            for part in parts.iter().filter_map(|p| p.bytes()) {
                bytes.extend_from_slice(part);
            }
            TensorData::Fixed(bytes.into())
        }
        TensorData::Strings(_) => {
            TensorData::Strings(parts.iter().filter_map(|p| p.strings()).flatten().cloned().collect())
        }
    };
    Ok(Tensor::from_parts_unchecked(first.dtype(), shape, data))
}

/// Joins a batch's parts along dimension 0 and appends zero rows (empty
/// strings) up to `padded_rows`, as one tensor: a batch for a backend that
/// takes tensors rather than ONNX Runtime values. One part already of the
/// padded size is passed on as it is, without a copy.
pub fn join_rows(parts: &[&Tensor], padded_rows: usize) -> Result<Tensor> {
    let first = parts.first().ok_or_else(|| Error::internal("a batch of zero requests, this is a bug"))?;
    if parts.len() == 1 && (padded_rows == 0 || first.rows() == padded_rows || first.shape().is_empty()) {
        return Ok((*first).clone());
    }
    let owned: Vec<Tensor> = parts.iter().map(|t| (*t).clone()).collect();
    let joined = concat_rows(&owned)?;
    let rows = joined.rows();
    if padded_rows <= rows {
        return Ok(joined);
    }
    let mut padding_shape = joined.shape().to_vec();
    padding_shape[0] = (padded_rows - rows) as i64;
    let padding = Tensor::zeros(joined.dtype(), padding_shape)?;
    concat_rows(&[joined, padding])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_is_zero_copy_and_drops_padding() {
        let t = Tensor::from_values(vec![4, 2], &[1i32, 2, 3, 4, 5, 6, 0, 0]);
        let pieces = split_rows(&t, &[1, 2], "y").unwrap();
        assert_eq!(pieces.len(), 2);
        assert_eq!(pieces[0].to_vec::<i32>().unwrap(), vec![1, 2]);
        assert_eq!(pieces[1].shape(), &[2, 2]);
        assert_eq!(pieces[1].to_vec::<i32>().unwrap(), vec![3, 4, 5, 6]);
        let base = t.bytes().unwrap().as_ptr();
        assert_eq!(pieces[1].bytes().unwrap().as_ptr(), base.wrapping_add(8));
    }

    #[test]
    fn concat_undoes_split() {
        let t = Tensor::from_values(vec![5, 2], &[1u16, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        let pieces = split_rows(&t, &[2, 2, 1], "y").unwrap();
        assert_eq!(concat_rows(&pieces).unwrap(), t);
        let s = Tensor::from_strings(vec![3], vec!["a".into(), "b".into(), "c".into()]).unwrap();
        assert_eq!(concat_rows(&split_rows(&s, &[1, 2], "s").unwrap()).unwrap(), s);
    }

    #[test]
    fn join_pads_with_zero_rows_and_passes_a_full_part_through() {
        let a = Tensor::from_values(vec![1, 2], &[1.0f32, 2.0]);
        let b = Tensor::from_values(vec![2, 2], &[3.0f32, 4.0, 5.0, 6.0]);
        let joined = join_rows(&[&a, &b], 4).unwrap();
        assert_eq!(joined.shape(), &[4, 2]);
        assert_eq!(joined.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0.0, 0.0]);
        let same = join_rows(&[&b], 2).unwrap();
        assert_eq!(same.bytes().unwrap().as_ptr(), b.bytes().unwrap().as_ptr());
    }

    #[test]
    fn split_refuses_outputs_without_batch_dimension() {
        let t = Tensor::from_values(vec![2], &[1.0f32, 2.0]);
        let err = split_rows(&t, &[2, 1], "logits").unwrap_err();
        assert!(err.message().contains("output 'logits'"), "{err}");
    }
}
