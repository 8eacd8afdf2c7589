//! Element types: the one [`DType`] is the SDK's (`sluice_sdk::DType`),
//! shared with plugins; this module adds what only the host needs, the
//! mapping to ONNX Runtime's element types. ONNX Runtime has complex
//! element types, but sluice builds and reads ONNX Runtime tensors of
//! plain element types only, so an ONNX model with a complex input or
//! output is refused at load (`from_ort`); SavedModels serve them.

pub use sluice_sdk::{DType, UnservedDType};

/// The ONNX Runtime element type of `dtype`.
pub fn to_ort(dtype: DType) -> ort::value::TensorElementType {
    use ort::value::TensorElementType as T;
    match dtype {
        DType::F32 => T::Float32,
        DType::F64 => T::Float64,
        DType::F16 => T::Float16,
        DType::BF16 => T::Bfloat16,
        DType::I8 => T::Int8,
        DType::I16 => T::Int16,
        DType::I32 => T::Int32,
        DType::I64 => T::Int64,
        DType::U8 => T::Uint8,
        DType::U16 => T::Uint16,
        DType::U32 => T::Uint32,
        DType::U64 => T::Uint64,
        DType::Bool => T::Bool,
        DType::String => T::String,
        DType::Complex64 => T::Complex64,
        DType::Complex128 => T::Complex128,
    }
}

/// The dtype of an ONNX Runtime element type, if sluice serves it.
pub fn from_ort(ty: ort::value::TensorElementType) -> Option<DType> {
    use ort::value::TensorElementType as T;
    Some(match ty {
        T::Float32 => DType::F32,
        T::Float64 => DType::F64,
        T::Float16 => DType::F16,
        T::Bfloat16 => DType::BF16,
        T::Int8 => DType::I8,
        T::Int16 => DType::I16,
        T::Int32 => DType::I32,
        T::Int64 => DType::I64,
        T::Uint8 => DType::U8,
        T::Uint16 => DType::U16,
        T::Uint32 => DType::U32,
        T::Uint64 => DType::U64,
        T::Bool => DType::Bool,
        T::String => DType::String,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ort_types_round_trip() {
        for dtype in DType::WIT_ORDER {
            assert_eq!(from_ort(to_ort(dtype)), Some(dtype));
        }
    }
}
