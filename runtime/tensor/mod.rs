//! `Tensor` — a dtype, a shape and the values — and its conversions.
//!
//! A `Tensor` is what every stage of the pipeline passes along. Fixed-width
//! values are kept as little-endian bytes in one `Bytes` buffer, so a tensor
//! decoded from `tensor_content` shares the request's buffer, and splitting a
//! batch's output per request is a slice, not a copy. Strings are a list of
//! byte strings.
//!
//! Submodules convert to and from the wire and the engine:
//! [`proto`] (TensorFlow's `TensorProto`), [`onnx`] (ONNX Runtime values),
//! [`batch`] (joining requests into a batch and splitting it again),
//! [`json`] (TF Serving's REST form), [`v2`] (the Open Inference
//! Protocol's raw, typed and JSON forms); [`spec`] holds signatures and the
//! checks of tensors against them.

pub mod batch;
pub mod dtype;
pub mod example;
pub mod json;
pub mod onnx;
pub mod proto;
pub mod protowire;
pub mod spec;
pub mod v2;

use bytes::Bytes;

pub use self::dtype::DType;
use crate::error::{Error, Result};

/// The values of a tensor.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    /// Fixed-width values, little-endian, `element count × dtype size` bytes.
    Fixed(Bytes),
    /// One byte string per element (`DT_STRING`).
    Strings(Vec<Bytes>),
}

/// A dense tensor whose byte length always matches its shape and dtype.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    dtype: DType,
    shape: Vec<i64>,
    data: TensorData,
}

/// A tensor with the name it has in a request or a signature.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedTensor {
    /// Input or output name.
    pub name: String,
    /// The values.
    pub tensor: Tensor,
}

impl NamedTensor {
    /// Pairs a name with a tensor.
    pub fn new(name: impl Into<String>, tensor: Tensor) -> Self {
        NamedTensor { name: name.into(), tensor }
    }
}

/// Number of elements of `shape`, or why it is not a valid tensor shape:
/// a negative dimension, or a product that overflows.
pub fn element_count(shape: &[i64]) -> Result<usize> {
    let mut count: usize = 1;
    for (axis, &dim) in shape.iter().enumerate() {
        if dim < 0 {
            return Err(Error::invalid_argument(format!(
                "dimension {axis} is {dim} in shape {}; dimensions must be >= 0",
                format_shape(shape)
            )));
        }
        count = usize::try_from(dim).ok().and_then(|d| count.checked_mul(d)).ok_or_else(|| {
            Error::invalid_argument(format!(
                "shape {} has more elements than fit in memory (the product of its dimensions overflows)",
                format_shape(shape)
            ))
        })?;
    }
    Ok(count)
}

/// The bytes a tensor of `dtype` and `shape` takes in memory (a string
/// counts its handle), checked against `limit` before anything is
/// allocated: every tensor whose size comes from someone else's numbers —
/// a client's shape, a broadcast, a plugin's declaration — is sized here.
/// `what` names the tensor in the error, which names the limit.
pub fn tensor_bytes(dtype: DType, shape: &[i64], limit: usize, what: &str) -> Result<usize> {
    element_count(shape)?;
    // Zero dimensions count as one: a tensor of shape [2^40, 0] holds no
    // values, but whatever walks its structure (a JSON encoder writing
    // 2^40 empty rows) pays for the other dimensions.
    let nominal = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d.max(1)).ok()?));
    let size = dtype.size().unwrap_or(std::mem::size_of::<Bytes>());
    match nominal.and_then(|n| n.checked_mul(size)) {
        Some(bytes) if bytes <= limit => Ok(bytes),
        bytes => Err(Error::resource_exhausted(format!(
            "{what} of shape {} would take {} bytes, more than the limit of {limit} bytes per tensor \
             (server.max_tensor_bytes)",
            format_shape(shape),
            bytes.map_or_else(|| "more than 2^64".to_string(), |b| b.to_string())
        ))),
    }
}

/// `[2, 64]`, as shapes appear in messages.
pub fn format_shape(shape: &[i64]) -> String {
    let dims: Vec<String> = shape.iter().map(i64::to_string).collect();
    format!("[{}]", dims.join(", "))
}

/// A fixed-width element type with a TensorFlow and ONNX counterpart.
pub trait Element: bytemuck::Pod {
    /// The dtype of this element type.
    const DTYPE: DType;
}

macro_rules! element {
    ($($ty:ty => $dtype:ident),*) => {
        $(impl Element for $ty { const DTYPE: DType = DType::$dtype; })*
    };
}
element!(f32 => F32, f64 => F64, half::f16 => F16, half::bf16 => BF16, i8 => I8, i16 => I16,
    i32 => I32, i64 => I64, u8 => U8, u16 => U16, u32 => U32, u64 => U64);

impl Tensor {
    /// A fixed-width tensor from raw little-endian bytes, checked against
    /// the shape. Errors say what is wrong; the caller adds which tensor.
    pub fn from_bytes(dtype: DType, shape: Vec<i64>, bytes: Bytes) -> Result<Tensor> {
        let Some(size) = dtype.size() else {
            return Err(Error::invalid_argument(format!(
                "{dtype} values cannot be given as raw bytes; use string_val"
            )));
        };
        let count = element_count(&shape)?;
        let expected = count
            .checked_mul(size)
            .ok_or_else(|| Error::invalid_argument(format!("shape {} is too large", format_shape(&shape))))?;
        if bytes.len() != expected {
            return Err(Error::invalid_argument(format!(
                "tensor_content has {} bytes, but shape {} of {dtype} needs {count} × {size} = {expected} bytes",
                bytes.len(),
                format_shape(&shape),
            )));
        }
        if dtype == DType::Bool {
            if let Some(pos) = bytes.iter().position(|&b| b > 1) {
                return Err(Error::invalid_argument(format!(
                    "DT_BOOL byte {pos} is {}; booleans must be 0 or 1",
                    bytes[pos]
                )));
            }
        }
        Ok(Tensor { dtype, shape, data: TensorData::Fixed(bytes) })
    }

    /// A string tensor, checked against the shape.
    pub fn from_strings(shape: Vec<i64>, strings: Vec<Bytes>) -> Result<Tensor> {
        let count = element_count(&shape)?;
        if strings.len() != count {
            return Err(Error::invalid_argument(format!(
                "{} strings given, but shape {} needs {count}",
                strings.len(),
                format_shape(&shape)
            )));
        }
        Ok(Tensor { dtype: DType::String, shape, data: TensorData::Strings(strings) })
    }

    /// A tensor from typed values; panics if the shape does not match the
    /// count (for code that builds tensors itself, not for client input).
    pub fn from_values<T: Element>(shape: Vec<i64>, values: &[T]) -> Tensor {
        let count = element_count(&shape).expect("from_values: invalid shape, this is a bug");
        assert_eq!(count, values.len(), "from_values: shape does not match values, this is a bug");
        Tensor { dtype: T::DTYPE, shape, data: TensorData::Fixed(Bytes::copy_from_slice(bytemuck::cast_slice(values))) }
    }

    /// A boolean tensor from values; panics if the shape does not match.
    pub fn from_bools(shape: Vec<i64>, values: &[bool]) -> Tensor {
        let count = element_count(&shape).expect("from_bools: invalid shape, this is a bug");
        assert_eq!(count, values.len(), "from_bools: shape does not match values, this is a bug");
        Tensor {
            dtype: DType::Bool,
            shape,
            data: TensorData::Fixed(values.iter().map(|&b| b as u8).collect::<Vec<u8>>().into()),
        }
    }

    /// A tensor of zeros (empty strings, false) of this dtype and shape.
    pub fn zeros(dtype: DType, shape: Vec<i64>) -> Result<Tensor> {
        let count = element_count(&shape)?;
        let data = match dtype.size() {
            Some(size) => TensorData::Fixed(Bytes::from(vec![0u8; count * size])),
            None => TensorData::Strings(vec![Bytes::new(); count]),
        };
        Ok(Tensor { dtype, shape, data })
    }

    /// Builds a tensor whose parts the caller has already checked against
    /// each other (batch assembly, engine outputs).
    pub(crate) fn from_parts_unchecked(dtype: DType, shape: Vec<i64>, data: TensorData) -> Tensor {
        debug_assert!(
            match (&data, dtype.size()) {
                (TensorData::Fixed(b), Some(size)) =>
                    element_count(&shape).map(|n| n * size == b.len()).unwrap_or(false),
                (TensorData::Strings(s), None) => element_count(&shape).map(|n| n == s.len()).unwrap_or(false),
                _ => false,
            },
            "tensor parts disagree: {dtype} {shape:?}, this is a bug"
        );
        Tensor { dtype, shape, data }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape; every dimension is >= 0.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// The values.
    pub fn data(&self) -> &TensorData {
        &self.data
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.data {
            TensorData::Fixed(bytes) => bytes.len() / self.dtype.size().unwrap_or(1),
            TensorData::Strings(strings) => strings.len(),
        }
    }

    /// True when the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Dimension 0, the batch dimension of batched models; 1 for scalars.
    pub fn rows(&self) -> usize {
        self.shape.first().map_or(1, |&d| d as usize)
    }

    /// The raw little-endian bytes of a fixed-width tensor.
    pub fn bytes(&self) -> Option<&Bytes> {
        match &self.data {
            TensorData::Fixed(bytes) => Some(bytes),
            TensorData::Strings(_) => None,
        }
    }

    /// The strings of a `DT_STRING` tensor.
    pub fn strings(&self) -> Option<&[Bytes]> {
        match &self.data {
            TensorData::Strings(strings) => Some(strings),
            TensorData::Fixed(_) => None,
        }
    }

    /// The values as a vector of `T`, or `None` when the dtype is not `T`'s.
    pub fn to_vec<T: Element>(&self) -> Option<Vec<T>> {
        if self.dtype != T::DTYPE {
            return None;
        }
        let bytes = self.bytes()?;
        // An owned, aligned copy: the bytes may sit at any offset of a
        // network buffer.
        Some(bytemuck::pod_collect_to_vec(bytes))
    }

    /// The values of a `DT_BOOL` tensor.
    pub fn to_bools(&self) -> Option<Vec<bool>> {
        if self.dtype != DType::Bool {
            return None;
        }
        Some(self.bytes()?.iter().map(|&b| b != 0).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_count_rejects_negative_and_overflow() {
        assert_eq!(element_count(&[]), Ok(1));
        assert_eq!(element_count(&[2, 0, 5]), Ok(0));
        assert_eq!(element_count(&[3, 4]), Ok(12));
        let neg = element_count(&[2, -1]).unwrap_err();
        assert!(neg.message().contains("dimension 1 is -1"), "{neg}");
        let big = element_count(&[1 << 40, 1 << 40]).unwrap_err();
        assert!(big.message().contains("overflows"), "{big}");
    }

    #[test]
    fn from_bytes_checks_length_and_bools() {
        let err = Tensor::from_bytes(DType::F32, vec![2, 3], Bytes::from(vec![0u8; 20])).unwrap_err();
        assert!(err.message().contains("20 bytes"), "{err}");
        assert!(err.message().contains("24 bytes"), "{err}");
        let err = Tensor::from_bytes(DType::Bool, vec![2], Bytes::from(vec![1u8, 7])).unwrap_err();
        assert!(err.message().contains("byte 1 is 7"), "{err}");
        let ok = Tensor::from_bytes(DType::I16, vec![2], Bytes::from(vec![1u8, 0, 2, 0])).unwrap();
        assert_eq!(ok.to_vec::<i16>(), Some(vec![1, 2]));
        assert_eq!(ok.to_vec::<u16>(), None);
    }

    #[test]
    fn typed_round_trip() {
        let t = Tensor::from_values(vec![2, 2], &[1.5f32, -2.0, 3.25, 0.0]);
        assert_eq!(t.len(), 4);
        assert_eq!(t.rows(), 2);
        assert_eq!(t.to_vec::<f32>(), Some(vec![1.5, -2.0, 3.25, 0.0]));
    }
}
