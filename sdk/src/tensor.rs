//! Tensors as plugins see them: typed views and builders over the bytes
//! that cross the plugin boundary.

use std::borrow::Cow;

pub use crate::dtype::DType;
use crate::PluginError;

/// Only the ten primitive numbers below are elements: tensors are viewed
/// as `[T]` in place (`Tensor::values`, `Tensor::new`), which is sound only
/// for types with no padding and no invalid bit patterns. A type outside
/// the crate (`bool`, a struct) cannot implement [`Element`].
mod sealed {
    pub trait Sealed {}
}

/// A fixed-width element type a tensor can be viewed as: one of `f32`,
/// `f64`, `i8`–`i64`, `u8`–`u64` (sealed: booleans have their own
/// accessors, since not every byte is a valid `bool`).
///
/// ```compile_fail
/// use sluice_sdk::{DType, Element};
/// #[derive(Clone, Copy)]
/// struct Flag(bool);
/// impl Element for Flag {
///     const DTYPE: DType = DType::U8;
///     fn read(bytes: &[u8]) -> Self { Flag(bytes[0] != 0) }
///     fn write(self, out: &mut Vec<u8>) { out.push(self.0 as u8) }
/// }
/// ```
pub trait Element: Copy + 'static + sealed::Sealed {
    /// Its dtype.
    const DTYPE: DType;
    /// Reads one element from little-endian bytes (exactly `size` of them).
    fn read(bytes: &[u8]) -> Self;
    /// Appends the element's little-endian bytes.
    fn write(self, out: &mut Vec<u8>);
}

macro_rules! element {
    ($($ty:ty => $dtype:ident),*) => {$(
        impl sealed::Sealed for $ty {}
        impl Element for $ty {
            const DTYPE: DType = DType::$dtype;
            fn read(bytes: &[u8]) -> Self {
                let mut raw = [0u8; std::mem::size_of::<$ty>()];
                raw.copy_from_slice(bytes);
                <$ty>::from_le_bytes(raw)
            }
            fn write(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
element!(f32 => F32, f64 => F64, i8 => I8, i16 => I16, i32 => I32, i64 => I64, u8 => U8, u16 => U16, u32 => U32, u64 => U64);

/// A declared input or output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// Its name.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Dimensions; -1 where any size goes.
    pub shape: Vec<i64>,
}

impl TensorSpec {
    /// A spec.
    pub fn new(name: impl Into<String>, dtype: DType, shape: &[i64]) -> Self {
        TensorSpec { name: name.into(), dtype, shape: shape.to_vec() }
    }

    /// Why `tensor` does not fit this spec, if it does not.
    pub fn mismatch(&self, tensor: &Tensor) -> Option<String> {
        if tensor.name != self.name {
            return Some(format!("tensor '{}' where '{}' was expected", tensor.name, self.name));
        }
        if tensor.dtype != self.dtype {
            return Some(format!("'{}' is {}, but {} was declared", self.name, tensor.dtype, self.dtype));
        }
        let fits = tensor.shape.len() == self.shape.len()
            && tensor.shape.iter().zip(&self.shape).all(|(&got, &want)| want < 0 || got == want);
        if !fits {
            return Some(format!("'{}' has shape {:?}, but {:?} was declared", self.name, tensor.shape, self.shape));
        }
        None
    }
}

/// A named tensor whose bytes always match its shape and dtype.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    name: String,
    dtype: DType,
    shape: Vec<i64>,
    data: Vec<u8>,
    strings: Vec<Vec<u8>>,
}

fn element_count(shape: &[i64]) -> Result<usize, PluginError> {
    shape.iter().try_fold(1usize, |n, &d| {
        usize::try_from(d)
            .ok()
            .and_then(|d| n.checked_mul(d))
            .ok_or_else(|| PluginError::internal(format!("invalid shape {shape:?}")))
    })
}

impl Tensor {
    /// A tensor of `T` values; fails when the shape does not hold exactly
    /// `values.len()` elements.
    pub fn new<T: Element>(name: impl Into<String>, shape: Vec<i64>, values: &[T]) -> Result<Tensor, PluginError> {
        let name = name.into();
        let count = element_count(&shape)?;
        if count != values.len() {
            return Err(PluginError::internal(format!(
                "tensor '{name}': shape {shape:?} holds {count} values, {} given",
                values.len()
            )));
        }
        let data = if cfg!(target_endian = "little") {
            // SAFETY: `values` is a live slice of one of the ten primitive
            // numbers `Element` is sealed to, which have no padding, so
            // every byte of it is initialised and viewing it as bytes is
            // valid; on a little-endian target those bytes are already the
            // wire's order.
            unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values)) }.to_vec()
        } else {
            let mut data = Vec::with_capacity(std::mem::size_of_val(values));
            for &v in values {
                v.write(&mut data);
            }
            data
        };
        Ok(Tensor { name, dtype: T::DTYPE, shape, data, strings: Vec::new() })
    }

    /// A boolean tensor.
    pub fn from_bools(name: impl Into<String>, shape: Vec<i64>, values: &[bool]) -> Result<Tensor, PluginError> {
        let mut t = Tensor::new(name, shape, &values.iter().map(|&b| b as u8).collect::<Vec<u8>>())?;
        t.dtype = DType::Bool;
        Ok(t)
    }

    /// A string tensor.
    pub fn from_strings(
        name: impl Into<String>,
        shape: Vec<i64>,
        strings: Vec<Vec<u8>>,
    ) -> Result<Tensor, PluginError> {
        let name = name.into();
        let count = element_count(&shape)?;
        if count != strings.len() {
            return Err(PluginError::internal(format!(
                "tensor '{name}': shape {shape:?} holds {count} strings, {} given",
                strings.len()
            )));
        }
        Ok(Tensor { name, dtype: DType::String, shape, data: Vec::new(), strings })
    }

    /// A tensor from its raw parts, checked (used for what crosses the
    /// plugin boundary).
    pub fn from_parts(
        name: String,
        dtype: DType,
        shape: Vec<i64>,
        data: Vec<u8>,
        strings: Vec<Vec<u8>>,
    ) -> Result<Tensor, PluginError> {
        let count = element_count(&shape)?;
        let ok = match dtype.size() {
            Some(size) => data.len() == count * size && strings.is_empty(),
            None => strings.len() == count && data.is_empty(),
        };
        if !ok {
            return Err(PluginError::internal(format!(
                "tensor '{name}': {} bytes and {} strings do not match shape {shape:?} of {dtype:?}",
                data.len(),
                strings.len()
            )));
        }
        Ok(Tensor { name, dtype, shape, data, strings })
    }

    /// The raw parts.
    pub fn into_parts(self) -> (String, DType, Vec<i64>, Vec<u8>, Vec<Vec<u8>>) {
        (self.name, self.dtype, self.shape, self.data, self.strings)
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Its shape.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// Dimension 0 (1 for scalars).
    pub fn rows(&self) -> usize {
        self.shape.first().map_or(1, |&d| d as usize)
    }

    /// The raw little-endian bytes of a fixed-width tensor.
    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    /// The elements of a string tensor.
    pub fn strings(&self) -> &[Vec<u8>] {
        &self.strings
    }

    fn expect_dtype(&self, dtype: DType) -> Result<(), PluginError> {
        if self.dtype == dtype {
            Ok(())
        } else {
            Err(PluginError::invalid_input(format!("'{}' is {}, but {} is needed", self.name, self.dtype, dtype)))
        }
    }

    /// The values as `T`, borrowed when the bytes are aligned for `T`.
    pub fn values<T: Element>(&self) -> Result<Cow<'_, [T]>, PluginError> {
        self.expect_dtype(T::DTYPE)?;
        let size = std::mem::size_of::<T>();
        if cfg!(target_endian = "little") && (self.data.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()) {
            // SAFETY: the bytes are aligned for T (checked just above),
            // their length is a multiple of size_of::<T>() (checked at
            // construction), every bit pattern is a valid T because
            // `Element` is sealed to primitive numbers, and the host's byte
            // order is the wire's (little-endian).
            let view = unsafe { std::slice::from_raw_parts(self.data.as_ptr().cast::<T>(), self.data.len() / size) };
            return Ok(Cow::Borrowed(view));
        }
        Ok(Cow::Owned(self.data.chunks_exact(size).map(T::read).collect()))
    }

    /// The values of a boolean tensor.
    pub fn bools(&self) -> Result<Vec<bool>, PluginError> {
        self.expect_dtype(DType::Bool)?;
        Ok(self.data.iter().map(|&b| b != 0).collect())
    }

    /// The elements of a string tensor as text (invalid UTF-8 is an input error).
    pub fn texts(&self) -> Result<Vec<&str>, PluginError> {
        self.expect_dtype(DType::String)?;
        self.strings
            .iter()
            .enumerate()
            .map(|(i, s)| {
                std::str::from_utf8(s)
                    .map_err(|_| PluginError::invalid_input(format!("'{}' element {i} is not UTF-8", self.name)))
            })
            .collect()
    }
}

/// The tensors a plugin was called with, by name.
#[derive(Debug, Clone)]
pub struct Inputs(Vec<Tensor>);

impl Inputs {
    /// Wraps tensors.
    pub fn new(tensors: Vec<Tensor>) -> Inputs {
        Inputs(tensors)
    }

    /// The tensor called `name`, or an input error naming it.
    pub fn get(&self, name: &str) -> Result<&Tensor, PluginError> {
        self.0.iter().find(|t| t.name == name).ok_or_else(|| {
            let names: Vec<&str> = self.0.iter().map(|t| t.name.as_str()).collect();
            PluginError::invalid_input(format!("missing input '{name}' (got {names:?})"))
        })
    }

    /// Every tensor.
    pub fn all(&self) -> &[Tensor] {
        &self.0
    }

    /// The tensors, owned.
    pub fn into_vec(self) -> Vec<Tensor> {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_round_trip_and_checks() {
        let t = Tensor::new("x", vec![2, 2], &[1.0f32, 2.0, 3.0, 4.0]).unwrap();
        assert_eq!(&*t.values::<f32>().unwrap(), &[1.0, 2.0, 3.0, 4.0]);
        assert!(t.values::<i32>().is_err());
        assert!(Tensor::new("x", vec![3], &[1u8]).is_err());
        assert!(Tensor::from_parts("y".into(), DType::I16, vec![2], vec![0; 3], vec![]).is_err());
        let spec = TensorSpec::new("x", DType::F32, &[-1, 2]);
        assert_eq!(spec.mismatch(&t), None);
        assert!(TensorSpec::new("x", DType::F32, &[-1, 3]).mismatch(&t).is_some());
        // Dtypes are named as the server names them, in every message.
        let wrong = TensorSpec::new("x", DType::F64, &[-1, 2]).mismatch(&t).unwrap();
        assert_eq!(wrong, "'x' is DT_FLOAT, but DT_DOUBLE was declared");
        let err = t.values::<i32>().unwrap_err();
        assert!(format!("{err:?}").contains("'x' is DT_FLOAT, but DT_INT32 is needed"), "{err:?}");
    }

    #[test]
    fn inputs_name_what_is_missing() {
        let inputs = Inputs::new(vec![Tensor::new("a", vec![1], &[1u8]).unwrap()]);
        let err = inputs.get("b").unwrap_err();
        assert_eq!(err, PluginError::invalid_input("missing input 'b' (got [\"a\"])"));
    }
}
