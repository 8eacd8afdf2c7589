//! Reading `tf.Example`s off the wire into one version's inputs: one
//! walk over each serialized example finds the features the inputs read
//! (the others are skipped unread), and each feature's lists are checked
//! and converted as prost would merge them, into the input's dtype.

use bytes::Bytes;

use super::{Column, ExampleBatch, ExampleColumns, Values};
use crate::config::examples::FeatureKind;
use crate::error::{Error, Result};
use crate::tensor::protowire::{read_varint, Fields, WireError, WireValue};
use crate::tensor::{format_shape, tensor_bytes, DType, Tensor, TensorData};

/// One feature's values as an example gives them: the kind, and where in
/// the `tf.train.Feature`'s bytes the lists of that kind start (a message
/// given twice is merged, so a later list of the same kind adds to the
/// earlier one, and a list of another kind replaces it).
#[derive(Debug, Clone, Copy)]
struct Given<'a> {
    kind: FeatureKind,
    feature: &'a [u8],
    from: usize,
    count: usize,
}

impl ExampleColumns {
    /// One tensor per input (in signature order, named by
    /// [`Self::input_names`]): row `i` from example `i`, each feature
    /// taken from the example, else the context, else the default.
    /// `limit` bounds each tensor's bytes. One walk over each example finds
    /// the features the inputs read; the others are skipped unread.
    pub fn parse(&self, batch: ExampleBatch<'_>, limit: usize) -> Result<Vec<Tensor>> {
        let rows = batch.examples.len();
        self.check_count(rows)?;
        let width = self.columns.len();
        let mut context = vec![None; width];
        if let Some(bytes) = batch.context {
            self.scan(bytes, &mut context).map_err(|e| {
                Error::invalid_argument(format!("the context is not a valid serialized tf.Example: {e}"))
            })?;
        }
        let mut found = vec![None; rows * width];
        for (i, (example, found)) in batch.examples.iter().zip(found.chunks_mut(width)).enumerate() {
            self.scan(example, found).map_err(|e| {
                Error::invalid_argument(format!("example {i} is not a valid serialized tf.Example: {e}"))
            })?;
        }
        self.columns
            .iter()
            .enumerate()
            .map(|(index, column)| column.parse(batch, |row| found[row * width + index], context[index], limit))
            .collect()
    }

    /// Finds in one serialized example the `tf.train.Feature` of each
    /// column's feature (the last one given, as a map keeps it).
    fn scan<'a>(&self, example: &'a [u8], found: &mut [Option<&'a [u8]>]) -> std::result::Result<(), WireError> {
        for field in Fields::new(example) {
            let features = match field? {
                (1, WireValue::Bytes(features)) => features,
                (1, _) => return Err(WireError("its features are of the wrong wire type")),
                _ => continue,
            };
            for entry in Fields::new(features) {
                let entry = match entry? {
                    (1, WireValue::Bytes(entry)) => entry,
                    (1, _) => return Err(WireError("a feature entry is of the wrong wire type")),
                    _ => continue,
                };
                let (mut name, mut value): (&[u8], &[u8]) = (&[], &[]);
                for part in Fields::new(entry) {
                    match part? {
                        (1, WireValue::Bytes(given)) => name = given,
                        (2, WireValue::Bytes(given)) => value = given,
                        (1 | 2, _) => return Err(WireError("a feature entry is of the wrong wire type")),
                        _ => {}
                    }
                }
                std::str::from_utf8(name).map_err(|_| WireError("a feature name is not UTF-8"))?;
                if let Some(index) = self.columns.iter().position(|c| c.feature.as_bytes() == name) {
                    found[index] = Some(value);
                }
            }
        }
        Ok(())
    }
}

impl Column {
    /// The column's tensor: row `i` from `own(i)` (example `i`'s
    /// `tf.train.Feature` of this feature, when it has one), else from
    /// `context`'s, else the default.
    fn parse<'a>(
        &self,
        batch: ExampleBatch<'a>,
        own: impl Fn(usize) -> Option<&'a [u8]>,
        context: Option<&[u8]>,
        limit: usize,
    ) -> Result<Tensor> {
        let rows = batch.examples.len();
        let mut shape = Vec::with_capacity(self.shape.len() + 1);
        shape.push(rows as i64);
        shape.extend_from_slice(&self.shape);
        tensor_bytes(self.dtype, &shape, limit, &format!("input '{}' parsed from tf.Examples", self.input))?;
        let context = match (context, batch.context) {
            (Some(feature), Some(source)) => self
                .given(feature)
                .map_err(|e| {
                    Error::invalid_argument(format!("the context's feature '{}' is not valid: {e}", self.feature))
                })?
                .map(|given| (given, source)),
            _ => None,
        };
        let pick = |row: usize| -> Result<Option<(Given<'_>, &Bytes)>> {
            let mine = match own(row) {
                Some(feature) => self.given(feature).map_err(|e| {
                    Error::invalid_argument(format!("example {row}: feature '{}' is not valid: {e}", self.feature))
                })?,
                None => None,
            };
            Ok(mine.map(|given| (given, &batch.examples[row])).or(context))
        };
        let data = match self.dtype.size() {
            Some(size) => {
                let mut out = Vec::with_capacity(rows * self.count * size);
                for row in 0..rows {
                    match (pick(row)?, &self.default) {
                        (Some((given, _)), _) => self.put_fixed(given, &mut out, row)?,
                        (None, Some(Values::Fixed(default))) => out.extend_from_slice(default),
                        (None, _) => return Err(self.missing(row)),
                    }
                }
                TensorData::Fixed(Bytes::from(out))
            }
            None => {
                let mut out = Vec::with_capacity(rows * self.count);
                for row in 0..rows {
                    match (pick(row)?, &self.default) {
                        (Some((given, source)), _) => self.put_strings(given, source, &mut out, row)?,
                        (None, Some(Values::Strings(default))) => out.extend(default.iter().cloned()),
                        (None, _) => return Err(self.missing(row)),
                    }
                }
                TensorData::Strings(out)
            }
        };
        Ok(Tensor::from_parts_unchecked(self.dtype, shape, data))
    }

    /// What a serialized `tf.train.Feature` gives: its kind and value
    /// count; `None` when it gives no values (or no kind), which counts as
    /// not giving the feature, as in TensorFlow.
    fn given<'a>(&self, feature: &'a [u8]) -> std::result::Result<Option<Given<'a>>, WireError> {
        let (mut kind, mut from) = (None, 0);
        let mut fields = Fields::new(feature);
        loop {
            let at = fields.position();
            let Some(field) = fields.next() else { break };
            let this = match field? {
                (1, WireValue::Bytes(_)) => FeatureKind::Bytes,
                (2, WireValue::Bytes(_)) => FeatureKind::Float,
                (3, WireValue::Bytes(_)) => FeatureKind::Int64,
                (1..=3, _) => return Err(WireError("a list of the wrong wire type")),
                _ => continue,
            };
            if kind != Some(this) {
                (kind, from) = (Some(this), at);
            }
        }
        let Some(kind) = kind else { return Ok(None) };
        let mut count = 0usize;
        for_each_list(feature, from, kind, |list| {
            count += count_values(kind, list)?;
            Ok(())
        })?;
        Ok((count > 0 || self.count == 0).then_some(Given { kind, feature, from, count }))
    }

    /// Appends one example's fixed-width values, converted to the dtype.
    fn put_fixed(&self, given: Given<'_>, out: &mut Vec<u8>, example: usize) -> Result<()> {
        if given.kind != self.kind {
            return Err(self.wrong_kind(given.kind, example));
        }
        self.check_count(given.count, example)?;
        let out_of_range = |v: i64, why: &str| {
            Error::invalid_argument(format!(
                "example {example}: feature '{}' value {v} {why} (input '{}' is {})",
                self.feature, self.input, self.dtype
            ))
        };
        let mut failed = None;
        for_each_list(given.feature, given.from, given.kind, |list| {
            for field in Fields::new(list) {
                match (given.kind, field?) {
                    (FeatureKind::Float, (1, WireValue::Bytes(packed))) => {
                        for chunk in packed.chunks_exact(4) {
                            let v = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
                            push_f32(self.dtype, v, out);
                        }
                    }
                    (FeatureKind::Float, (1, WireValue::Fixed32(bits))) => {
                        push_f32(self.dtype, f32::from_bits(bits), out)
                    }
                    (FeatureKind::Int64, (1, WireValue::Bytes(packed))) => {
                        let mut pos = 0;
                        while pos < packed.len() {
                            let v = read_varint(packed, &mut pos)? as i64;
                            if let Err(why) = push_int(self.dtype, v, out) {
                                failed.get_or_insert_with(|| out_of_range(v, why));
                            }
                        }
                    }
                    (FeatureKind::Int64, (1, WireValue::Varint(v))) => {
                        if let Err(why) = push_int(self.dtype, v as i64, out) {
                            failed.get_or_insert_with(|| out_of_range(v as i64, why));
                        }
                    }
                    _ => {}
                }
            }
            Ok(())
        })
        .map_err(|e| Error::invalid_argument(format!("example {example}: feature '{}': {e}", self.feature)))?;
        failed.map_or(Ok(()), Err)
    }

    /// Appends one example's strings: slices of the buffer they came in.
    fn put_strings(&self, given: Given<'_>, source: &Bytes, out: &mut Vec<Bytes>, example: usize) -> Result<()> {
        if given.kind != FeatureKind::Bytes {
            return Err(self.wrong_kind(given.kind, example));
        }
        self.check_count(given.count, example)?;
        for_each_list(given.feature, given.from, given.kind, |list| {
            for field in Fields::new(list) {
                if let (1, WireValue::Bytes(value)) = field? {
                    out.push(source.slice_ref(value));
                }
            }
            Ok(())
        })
        .map_err(|e| Error::invalid_argument(format!("example {example}: feature '{}': {e}", self.feature)))
    }

    fn check_count(&self, given: usize, example: usize) -> Result<()> {
        if given != self.count {
            return Err(Error::invalid_argument(format!(
                "example {example}: feature '{}' has {given} values, but it takes {} (shape {} per example)",
                self.feature,
                self.count,
                format_shape(&self.shape)
            )));
        }
        Ok(())
    }

    fn wrong_kind(&self, given: FeatureKind, example: usize) -> Error {
        Error::invalid_argument(format!(
            "example {example}: feature '{}' is a {}, but input '{}' ({}) takes a {}",
            self.feature,
            given.list_name(),
            self.input,
            self.dtype,
            self.kind.list_name()
        ))
    }

    fn missing(&self, example: usize) -> Error {
        Error::invalid_argument(format!(
            "example {example}: feature '{}' is missing and has no default (input '{}' takes {} {})",
            self.feature,
            self.input,
            self.kind.list_name(),
            format_shape(&self.shape)
        ))
    }
}
/// The `tf.train.Feature` field number of each kind's list.
fn list_field(kind: FeatureKind) -> u32 {
    match kind {
        FeatureKind::Bytes => 1,
        FeatureKind::Float => 2,
        FeatureKind::Int64 => 3,
    }
}
/// Calls `each` with every list message of `kind` in a serialized
/// `tf.train.Feature`, from byte `from` on.
fn for_each_list<'a>(
    feature: &'a [u8],
    from: usize,
    kind: FeatureKind,
    mut each: impl FnMut(&'a [u8]) -> std::result::Result<(), WireError>,
) -> std::result::Result<(), WireError> {
    let wanted = list_field(kind);
    for field in Fields::new(&feature[from..]) {
        if let (number, WireValue::Bytes(list)) = field? {
            if number == wanted {
                each(list)?;
            }
        }
    }
    Ok(())
}

/// The values one list message of `kind` holds, its encoding checked.
fn count_values(kind: FeatureKind, list: &[u8]) -> std::result::Result<usize, WireError> {
    let mut count = 0usize;
    for field in Fields::new(list) {
        count += match (kind, field?) {
            (FeatureKind::Float, (1, WireValue::Bytes(packed))) if packed.len() % 4 == 0 => packed.len() / 4,
            (FeatureKind::Float, (1, WireValue::Bytes(_))) => {
                return Err(WireError("packed floats whose length is not a multiple of 4"))
            }
            (FeatureKind::Float, (1, WireValue::Fixed32(_))) => 1,
            (FeatureKind::Int64, (1, WireValue::Bytes(packed))) => {
                let (mut pos, mut n) = (0, 0);
                while pos < packed.len() {
                    read_varint(packed, &mut pos)?;
                    n += 1;
                }
                n
            }
            (FeatureKind::Int64, (1, WireValue::Varint(_))) => 1,
            (FeatureKind::Bytes, (1, WireValue::Bytes(_))) => 1,
            (_, (1, _)) => return Err(WireError("a value of the wrong wire type")),
            _ => 0,
        };
    }
    Ok(count)
}

/// Appends a float32 the wire gave: its bits as they are for float32 (a
/// signalling NaN stays one), converted for the other float dtypes.
fn push_f32(dtype: DType, v: f32, out: &mut Vec<u8>) {
    match dtype {
        DType::F32 => out.extend_from_slice(&v.to_le_bytes()),
        _ => push_float(dtype, f64::from(v), out),
    }
}

/// Appends `v` as one element of `dtype` (a float dtype).
pub(super) fn push_float(dtype: DType, v: f64, out: &mut Vec<u8>) {
    match dtype {
        DType::F64 => out.extend_from_slice(&v.to_le_bytes()),
        DType::F16 => out.extend_from_slice(&half::f16::from_f64(v).to_le_bytes()),
        DType::BF16 => out.extend_from_slice(&half::bf16::from_f64(v).to_le_bytes()),
        _ => out.extend_from_slice(&(v as f32).to_le_bytes()),
    }
}

/// Appends `v` as one element of `dtype` (an integer or bool dtype), or
/// says why it does not fit.
pub(super) fn push_int(dtype: DType, v: i64, out: &mut Vec<u8>) -> std::result::Result<(), &'static str> {
    const OUT_OF_RANGE: &str = "is out of range";
    match dtype {
        DType::I64 => out.extend_from_slice(&v.to_le_bytes()),
        DType::I32 => out.extend_from_slice(&i32::try_from(v).map_err(|_| OUT_OF_RANGE)?.to_le_bytes()),
        DType::I16 => out.extend_from_slice(&i16::try_from(v).map_err(|_| OUT_OF_RANGE)?.to_le_bytes()),
        DType::I8 => out.extend_from_slice(&i8::try_from(v).map_err(|_| OUT_OF_RANGE)?.to_le_bytes()),
        DType::U8 => out.extend_from_slice(&u8::try_from(v).map_err(|_| OUT_OF_RANGE)?.to_le_bytes()),
        DType::U16 => out.extend_from_slice(&u16::try_from(v).map_err(|_| OUT_OF_RANGE)?.to_le_bytes()),
        DType::U32 => out.extend_from_slice(&u32::try_from(v).map_err(|_| OUT_OF_RANGE)?.to_le_bytes()),
        DType::U64 => out.extend_from_slice(&u64::try_from(v).map_err(|_| OUT_OF_RANGE)?.to_le_bytes()),
        DType::Bool => match v {
            0 | 1 => out.push(v as u8),
            _ => return Err("is not a boolean (0 or 1)"),
        },
        _ => return Err("has no integer dtype to go to"),
    }
    Ok(())
}
