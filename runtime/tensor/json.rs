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
                    if depth == MAX_RANK {
                        return Err(Error::invalid_argument(format!(
                            "{what} has more than {MAX_RANK} dimensions, TensorFlow's most"
                        )));
                    }
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

/// JSON has no form for complex values, and TF Serving's REST API refuses
/// them both ways (UNIMPLEMENTED converting a request's, INVALID_ARGUMENT
/// writing an answer's): so does sluice's, naming the tensor.
fn no_complex_in_json(what: &str, dtype: DType) -> Error {
    Error::Unimplemented(format!(
        "{what} is {dtype}: JSON has no form for complex values (TF Serving's REST API refuses them too); call the \
         model over gRPC (Predict carries them in scomplex_val / dcomplex_val or tensor_content)"
    ))
}

/// Refuses, before a byte is written, an answer with a tensor JSON cannot
/// hold (complex values), naming it.
pub fn check_writable<'a>(tensors: impl IntoIterator<Item = (&'a str, &'a Tensor)>) -> Result<()> {
    for (name, tensor) in tensors {
        if tensor.dtype().is_complex() {
            return Err(Error::invalid_argument(format!(
                "output '{name}' is {}: JSON has no form for complex values (TF Serving's REST API cannot write \
                 them either); call the model over gRPC, or leave it out with output_filter",
                tensor.dtype()
            )));
        }
    }
    Ok(())
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
    let float = |i: usize, leaf: &Value| match leaf {
        Value::String(s) => non_finite(s).ok_or_else(|| bad(i, leaf, "a number")),
        _ => leaf.as_f64().ok_or_else(|| bad(i, leaf, "a number")),
    };
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
        DType::Complex64 | DType::Complex128 => return Err(no_complex_in_json(what, dtype)),
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

/// TensorFlow's most dimensions of one tensor (`TensorShape`'s limit): a
/// JSON tensor may nest this deep, as TF Serving accepts.
pub const MAX_RANK: usize = 254;

/// The deepest a JSON body may nest: a tensor of [`MAX_RANK`] dimensions
/// inside a request's own objects and lists (`{"instances": [{"x": …}]}`).
pub const MAX_JSON_DEPTH: usize = MAX_RANK + 6;

/// Refuses a JSON text holding more than `limit` values, or nesting deeper
/// than [`MAX_JSON_DEPTH`], before it is parsed: one pass over the bytes
/// counting the separators outside strings (`,`, `:`, `[`, `{`), an upper
/// bound of the values a parser would build, and the open brackets.
/// Parsed JSON takes tens of bytes per value, so a body within its size
/// limit could otherwise take gigabytes; the depth bound is what makes
/// [`parse`] (which has no recursion limit of its own) safe.
pub fn check_json_bounds(text: &[u8], limit: usize, key: &str) -> Result<()> {
    let (mut count, mut depth, mut in_string, mut escaped) = (1usize, 0usize, false, false);
    for &b in text {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b',' | b':' => count += 1,
            b'[' | b'{' => {
                count += 1;
                depth += 1;
                if depth > MAX_JSON_DEPTH {
                    return Err(Error::invalid_argument(format!(
                        "the JSON body nests more than {MAX_JSON_DEPTH} lists and objects deep; a tensor has at \
                         most {MAX_RANK} dimensions"
                    )));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if count > limit {
            return Err(Error::resource_exhausted(format!(
                "the JSON body holds more than {limit} values ({key}); send fewer, or binary data"
            )));
        }
    }
    Ok(())
}

/// Parses a JSON text that [`check_json_bounds`] has passed, without
/// serde_json's recursion limit of 128, which would refuse tensors of
/// high rank that TF Serving takes.
pub fn parse<T: serde::de::DeserializeOwned>(text: &[u8]) -> serde_json::Result<T> {
    let mut deserializer = serde_json::Deserializer::from_slice(text);
    deserializer.disable_recursion_limit();
    let parsed = T::deserialize(&mut deserializer).and_then(|value| deserializer.end().map(|()| value));
    // Bytes that are not UTF-8 outside a string read to serde_json as an
    // unexpected character; say what they are.
    parsed.map_err(|error| match std::str::from_utf8(text) {
        Err(bad) => <serde_json::Error as serde::de::Error>::custom(format!(
            "invalid UTF-8 at byte {} (JSON text is UTF-8)",
            bad.valid_up_to()
        )),
        Ok(_) => error,
    })
}

/// A tensor (or one row of it) written as TF Serving writes tensors:
/// nested arrays, floats in their shortest form (an f32 prints as `0.1`,
/// not `0.10000000149011612`), strings as text or `{"b64": …}`. It
/// serialises straight from the tensor's bytes, without building a JSON
/// tree first.
#[derive(Clone, Copy)]
pub struct JsonView<'a> {
    tensor: &'a Tensor,
    dims: &'a [i64],
    from: usize,
    /// Every string as `{"b64": …}` (TF Serving does this for outputs whose
    /// name ends in `_bytes`).
    binary: bool,
    /// Non-finite floats as TF Serving writes them (`NaN`, `Infinity`,
    /// `-Infinity`) instead of `null`; only for serde_json's writer.
    tf_floats: bool,
}

impl<'a> JsonView<'a> {
    /// The whole tensor (a bare value for rank 0).
    pub fn whole(tensor: &'a Tensor) -> Self {
        JsonView { tensor, dims: tensor.shape(), from: 0, binary: false, tf_floats: false }
    }

    /// As TF Serving's REST API writes output `name`: strings as
    /// `{"b64": …}` when the name ends in `_bytes`, non-finite floats as
    /// `NaN`, `Infinity`, `-Infinity`.
    pub fn output(self, name: &str) -> Self {
        JsonView { binary: name.ends_with("_bytes"), tf_floats: true, ..self }
    }

    /// Row `row` along dimension 0.
    pub fn row(tensor: &'a Tensor, row: usize) -> Self {
        let dims = tensor.shape().get(1..).unwrap_or(&[]);
        let stride: usize = dims.iter().map(|&d| d as usize).product();
        JsonView { tensor, dims, from: row * stride, binary: false, tf_floats: false }
    }

    fn element<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let i = self.from;
        let bytes = match self.tensor.data() {
            TensorData::Strings(strings) => {
                let s = &strings[i];
                return match std::str::from_utf8(s) {
                    Ok(text) if !self.binary => serializer.serialize_str(text),
                    _ => {
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
        let float = |x: f64, serializer: S| {
            if self.tf_floats && !x.is_finite() {
                // serde_json writes its raw-value token verbatim: TF
                // Serving's bare NaN / Infinity, which Python's json reads.
                let token = if x.is_nan() {
                    "NaN"
                } else if x > 0.0 {
                    "Infinity"
                } else {
                    "-Infinity"
                };
                use serde::ser::SerializeStruct;
                let mut raw = serializer.serialize_struct(RAW_VALUE_TOKEN, 1)?;
                raw.serialize_field(RAW_VALUE_TOKEN, token)?;
                raw.end()
            } else {
                serializer.serialize_f64(x)
            }
        };
        // Finite single-precision values print in their shortest f32 form.
        let single = |x: f32, serializer: S| {
            if x.is_finite() {
                serializer.serialize_f32(x)
            } else {
                float(f64::from(x), serializer)
            }
        };
        match self.tensor.dtype() {
            DType::F32 => single(le::<f32>(raw), serializer),
            DType::F64 => float(le::<f64>(raw), serializer),
            DType::F16 => single(le::<half::f16>(raw).to_f32(), serializer),
            DType::BF16 => single(le::<half::bf16>(raw).to_f32(), serializer),
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
            // Refused before anything is written (`check_writable`).
            DType::Complex64 | DType::Complex128 => {
                Err(serde::ser::Error::custom(format!("{} values have no JSON form", self.tensor.dtype())))
            }
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
            seq.serialize_element(&JsonView { dims: rest, from: self.from + i * stride, ..*self })?;
        }
        seq.end()
    }
}

/// serde_json's name for a value it writes verbatim (its `RawValue`).
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

/// What a request's JSON says for a non-finite float, after
/// [`accept_non_finite`] rewrote it.
const NON_FINITE: [(&str, f64); 3] =
    [("\u{0}NaN", f64::NAN), ("\u{0}Infinity", f64::INFINITY), ("\u{0}-Infinity", f64::NEG_INFINITY)];

fn non_finite(text: &str) -> Option<f64> {
    NON_FINITE.iter().find(|(token, _)| *token == text).map(|&(_, value)| value)
}

/// A request body with TF Serving's (and Python `json.dumps`'s) bare
/// `NaN`, `Infinity` and `-Infinity` rewritten as strings that
/// [`tensor_from_leaves`] reads back as those floats: serde_json refuses
/// the bare tokens. Text inside strings is left alone. Borrowed when there
/// is nothing to rewrite.
pub fn accept_non_finite(body: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let mentions = |needle: &[u8]| body.windows(needle.len()).any(|w| w == needle);
    if !mentions(b"NaN") && !mentions(b"Infinity") {
        return body.into();
    }
    let mut out = Vec::with_capacity(body.len() + 16);
    let (mut in_string, mut escaped, mut i) = (false, false, 0);
    while i < body.len() {
        let b = body[i];
        if in_string {
            out.push(b);
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        if b == b'"' {
            in_string = true;
            out.push(b);
            i += 1;
            continue;
        }
        let rest = &body[i..];
        let token = [&b"-Infinity"[..], b"Infinity", b"NaN"].into_iter().find(|t| rest.starts_with(t));
        match token {
            Some(token) => {
                out.extend_from_slice(b"\"\\u0000");
                out.extend_from_slice(token);
                out.push(b'"');
                i += token.len();
            }
            None => {
                out.push(b);
                i += 1;
            }
        }
    }
    out.into()
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
mod value_count_tests {
    use super::*;

    #[test]
    fn bytes_that_are_not_utf8_are_named_as_such() {
        let mut body = br#"{"instances": [1, "#.to_vec();
        body.push(0xff);
        body.extend_from_slice(b"]}");
        let error = parse::<serde_json::Value>(&body).expect_err("not UTF-8");
        assert!(error.to_string().contains("invalid UTF-8 at byte 18 (JSON text is UTF-8)"), "{error}");
        // Valid UTF-8 that is bad JSON keeps serde_json's own words.
        let error = parse::<serde_json::Value>(br#"{"instances": [1, }"#).expect_err("bad JSON");
        assert!(error.to_string().contains("expected value"), "{error}");
    }

    #[test]
    fn values_are_counted_outside_strings() {
        assert!(check_json_bounds(br#"{"a": [1, 2, 3]}"#, 6, "k").is_ok());
        assert!(check_json_bounds(br#"{"a": [1, 2, 3]}"#, 4, "k").is_err());
        assert!(check_json_bounds(br#"["a,b,c,d,e,\",f"]"#, 2, "k").is_ok());
    }

    #[test]
    fn deep_tensors_parse_up_to_tensorflow_rank_and_no_further() {
        let nested = |rank: usize| format!("{}1.5{}", "[".repeat(rank), "]".repeat(rank));
        // A rank-254 tensor inside a request's own objects.
        let body = format!("{{\"inputs\": {{\"x\": {}}}}}", nested(MAX_RANK));
        assert!(check_json_bounds(body.as_bytes(), 1 << 20, "k").is_ok());
        let value: Value = parse(body.as_bytes()).expect("deeper than serde_json's own limit of 128");
        let (shape, leaves) = flatten(&value["inputs"]["x"], &"x").expect("rank 254 flattens");
        assert_eq!((shape.len(), leaves.len()), (MAX_RANK, 1));
        let too_deep: Value = parse(nested(MAX_RANK + 1).as_bytes()).expect("parses");
        let err = flatten(&too_deep, &"input 'x'").unwrap_err();
        assert!(err.message().contains("input 'x' has more than 254 dimensions"), "{err}");
        let err = check_json_bounds(nested(MAX_JSON_DEPTH + 1).as_bytes(), 1 << 20, "k").unwrap_err();
        assert_eq!(err.code(), crate::error::Code::InvalidArgument);
        assert!(err.message().contains("nests more than 260"), "{err}");
        // Brackets inside strings do not count.
        let quoted = format!("[\"{}\"]", "[".repeat(10_000));
        assert!(check_json_bounds(quoted.as_bytes(), 1 << 20, "k").is_ok());
    }
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
