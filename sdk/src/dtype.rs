//! Element types: the one definition the host (`sluice`) and plugins share.
//!
//! `DType` is every TensorFlow dtype TF Serving serves that is not
//! quantized, a resource or a variant (those are refused at the edge with
//! a message naming them). Its first variants are in the order of the WIT
//! `dtype` enum, so the conversion from either side's generated WIT type
//! is an index; the complex types come after them and are not in the
//! plugin interface: a model may take or give them, a plugin cannot
//! ([`DType::in_plugin_interface`]). Adding them there would change the
//! `sluice:plugin` world every built plugin is checked against.

use std::fmt;

/// The element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float (`DT_FLOAT`).
    F32,
    /// 64-bit float (`DT_DOUBLE`).
    F64,
    /// IEEE 754 half (`DT_HALF`).
    F16,
    /// bfloat16 (`DT_BFLOAT16`).
    BF16,
    /// `DT_INT8`.
    I8,
    /// `DT_INT16`.
    I16,
    /// `DT_INT32`.
    I32,
    /// `DT_INT64`.
    I64,
    /// `DT_UINT8`.
    U8,
    /// `DT_UINT16`.
    U16,
    /// `DT_UINT32`.
    U32,
    /// `DT_UINT64`.
    U64,
    /// `DT_BOOL`, one byte per value, 0 or 1.
    Bool,
    /// `DT_STRING`: byte strings of any length.
    String,
    /// `DT_COMPLEX64`: pairs of 32-bit floats (real, imaginary).
    Complex64,
    /// `DT_COMPLEX128`: pairs of 64-bit floats (real, imaginary).
    Complex128,
}

impl DType {
    /// Bytes per element; `None` for strings.
    pub const fn size(self) -> Option<usize> {
        Some(match self {
            DType::I8 | DType::U8 | DType::Bool => 1,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 | DType::Complex64 => 8,
            DType::Complex128 => 16,
            DType::String => return None,
        })
    }

    /// Every dtype, in the WIT `dtype` enum's order (and this enum's).
    pub const WIT_ORDER: [DType; 14] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::Bool,
        DType::String,
    ];

    /// True for `DT_COMPLEX64` and `DT_COMPLEX128`.
    pub const fn is_complex(self) -> bool {
        matches!(self, DType::Complex64 | DType::Complex128)
    }

    /// True when a plugin can take or give it: every dtype but the complex
    /// ones, which the WIT `dtype` enum does not have.
    pub const fn in_plugin_interface(self) -> bool {
        !self.is_complex()
    }

    /// The dtype at `index` of the WIT `dtype` enum: how either side's
    /// generated WIT type (`wit_dtype as u8`) becomes a `DType`.
    pub fn from_wit_index(index: u8) -> Option<DType> {
        DType::WIT_ORDER.get(usize::from(index)).copied()
    }

    /// Every dtype, in TensorFlow's enum order.
    pub const ALL: [DType; 16] = [
        DType::F32,
        DType::F64,
        DType::I32,
        DType::U8,
        DType::I16,
        DType::I8,
        DType::String,
        DType::Complex64,
        DType::I64,
        DType::Bool,
        DType::BF16,
        DType::U16,
        DType::Complex128,
        DType::F16,
        DType::U32,
        DType::U64,
    ];

    /// TensorFlow's `DataType` number.
    pub const fn to_tf(self) -> i32 {
        match self {
            DType::F32 => 1,
            DType::F64 => 2,
            DType::I32 => 3,
            DType::U8 => 4,
            DType::I16 => 5,
            DType::I8 => 6,
            DType::String => 7,
            DType::Complex64 => 8,
            DType::I64 => 9,
            DType::Bool => 10,
            DType::BF16 => 14,
            DType::U16 => 17,
            DType::Complex128 => 18,
            DType::F16 => 19,
            DType::U32 => 22,
            DType::U64 => 23,
        }
    }

    /// The dtype for a TensorFlow `DataType` number, or why it is not served.
    pub fn from_tf(number: i32) -> Result<DType, UnservedDType> {
        Ok(match number {
            1 => DType::F32,
            2 => DType::F64,
            3 => DType::I32,
            4 => DType::U8,
            5 => DType::I16,
            6 => DType::I8,
            7 => DType::String,
            8 => DType::Complex64,
            9 => DType::I64,
            10 => DType::Bool,
            14 => DType::BF16,
            17 => DType::U16,
            18 => DType::Complex128,
            19 => DType::F16,
            22 => DType::U32,
            23 => DType::U64,
            other => return Err(UnservedDType(other)),
        })
    }

    /// TensorFlow's name, as clients know it: `DT_FLOAT`, `DT_INT64`, …
    pub const fn tf_name(self) -> &'static str {
        match self {
            DType::F32 => "DT_FLOAT",
            DType::F64 => "DT_DOUBLE",
            DType::F16 => "DT_HALF",
            DType::BF16 => "DT_BFLOAT16",
            DType::I8 => "DT_INT8",
            DType::I16 => "DT_INT16",
            DType::I32 => "DT_INT32",
            DType::I64 => "DT_INT64",
            DType::U8 => "DT_UINT8",
            DType::U16 => "DT_UINT16",
            DType::U32 => "DT_UINT32",
            DType::U64 => "DT_UINT64",
            DType::Bool => "DT_BOOL",
            DType::String => "DT_STRING",
            DType::Complex64 => "DT_COMPLEX64",
            DType::Complex128 => "DT_COMPLEX128",
        }
    }

    /// The dtype for a TensorFlow name (`DT_FLOAT`) or a short one (`float32`, `f32`).
    pub fn parse(name: &str) -> Option<DType> {
        let lower = name.to_ascii_lowercase();
        let short = lower.strip_prefix("dt_").unwrap_or(&lower);
        Some(match short {
            "float" | "float32" | "f32" => DType::F32,
            "double" | "float64" | "f64" => DType::F64,
            "half" | "float16" | "f16" => DType::F16,
            "bfloat16" | "bf16" => DType::BF16,
            "int8" | "i8" => DType::I8,
            "int16" | "i16" => DType::I16,
            "int32" | "i32" => DType::I32,
            "int64" | "i64" => DType::I64,
            "uint8" | "u8" => DType::U8,
            "uint16" | "u16" => DType::U16,
            "uint32" | "u32" => DType::U32,
            "uint64" | "u64" => DType::U64,
            "bool" => DType::Bool,
            "string" | "bytes" => DType::String,
            "complex64" | "c64" => DType::Complex64,
            "complex128" | "c128" => DType::Complex128,
            _ => return None,
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.tf_name())
    }
}

/// A TensorFlow dtype number sluice does not serve; its message names it
/// and lists those served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnservedDType(pub i32);

impl fmt::Display for UnservedDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            0 => f.write_str("DT_INVALID (0): the dtype field is not set"),
            other => {
                write!(f, "{} ({other}) is not supported; supported: {}", tf_name_of_unserved(other), supported_list())
            }
        }
    }
}

impl std::error::Error for UnservedDType {}

fn supported_list() -> String {
    DType::ALL.iter().map(|d| d.tf_name()).collect::<Vec<_>>().join(", ")
}

fn tf_name_of_unserved(number: i32) -> &'static str {
    match number {
        11 => "DT_QINT8",
        12 => "DT_QUINT8",
        13 => "DT_QINT32",
        15 => "DT_QINT16",
        16 => "DT_QUINT16",
        20 => "DT_RESOURCE",
        21 => "DT_VARIANT",
        _ => "unknown dtype",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tf_numbers_round_trip() {
        for dtype in DType::ALL {
            assert_eq!(DType::from_tf(dtype.to_tf()), Ok(dtype));
            assert_eq!(DType::parse(dtype.tf_name()), Some(dtype));
            if dtype.in_plugin_interface() {
                assert_eq!(DType::from_wit_index(dtype as u8), Some(dtype));
            } else {
                assert_eq!(DType::from_wit_index(dtype as u8), None);
            }
        }
    }

    #[test]
    fn unserved_dtypes_are_named() {
        let err = DType::from_tf(20).unwrap_err().to_string();
        assert!(err.contains("DT_RESOURCE"), "{err}");
        assert!(err.contains("DT_FLOAT") && err.contains("DT_COMPLEX64"), "{err}");
        assert!(DType::from_tf(0).unwrap_err().to_string().contains("not set"));
    }
}
