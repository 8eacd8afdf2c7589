//! Protobuf's wire format read in place: the fields of a message as a
//! stream of (number, value) over its bytes, values borrowed, nothing
//! decoded that is not asked for. `tensor::example` reads `tf.Example`s
//! with it straight from the request buffer, where decoding each example
//! into a message would build a map of owned names and lists first.
//!
//! It accepts what prost accepts on the paths it reads: varints of up to
//! ten bytes, every wire type (groups skipped, nested to a bounded depth),
//! and refuses truncated input.

/// Why bytes are not a valid message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireError(pub &'static str);

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// One field's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireValue<'a> {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 1.
    Fixed64(u64),
    /// Wire type 2: bytes, a string, a message or packed values.
    Bytes(&'a [u8]),
    /// Wire type 5.
    Fixed32(u32),
    /// Wire types 3 and 4: a group, skipped whole.
    Group,
}

/// The fields of one message, in the order they are on the wire.
pub struct Fields<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// How deep groups may nest before the bytes are refused (prost's limit).
const MAX_GROUP_DEPTH: usize = 100;

impl<'a> Fields<'a> {
    /// The fields of the message `buf` holds.
    pub fn new(buf: &'a [u8]) -> Self {
        Fields { buf, pos: 0 }
    }

    /// Where the next field starts.
    pub fn position(&self) -> usize {
        self.pos
    }

    fn varint(&mut self) -> Result<u64, WireError> {
        read_varint(self.buf, &mut self.pos)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self.pos.checked_add(n).filter(|&end| end <= self.buf.len()).ok_or(WireError("truncated"))?;
        let taken = &self.buf[self.pos..end];
        self.pos = end;
        Ok(taken)
    }

    /// Skips a group whose start (field `number`) was just read, nested
    /// groups included, up to its end.
    fn skip_group(&mut self, number: u32) -> Result<(), WireError> {
        let mut open = vec![number];
        while let Some(&innermost) = open.last() {
            let key = self.varint()?;
            let (field, wire_type) = split_key(key)?;
            match wire_type {
                0 => drop(self.varint()?),
                1 => drop(self.take(8)?),
                2 => {
                    let len = usize::try_from(self.varint()?).map_err(|_| WireError("a length past memory"))?;
                    self.take(len)?;
                }
                3 if open.len() < MAX_GROUP_DEPTH => open.push(field),
                3 => return Err(WireError("groups nested too deep")),
                4 if field == innermost => drop(open.pop()),
                4 => return Err(WireError("a group ends that did not start")),
                5 => drop(self.take(4)?),
                _ => return Err(WireError("an invalid wire type")),
            }
        }
        Ok(())
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, WireValue<'a>), WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.buf.len() {
            return None;
        }
        let field = (|| {
            let (number, wire_type) = split_key(self.varint()?)?;
            let value = match wire_type {
                0 => WireValue::Varint(self.varint()?),
                1 => WireValue::Fixed64(u64::from_le_bytes(
                    self.take(8)?.try_into().map_err(|_| WireError("truncated"))?,
                )),
                2 => {
                    let len = usize::try_from(self.varint()?).map_err(|_| WireError("a length past memory"))?;
                    WireValue::Bytes(self.take(len)?)
                }
                3 => {
                    self.skip_group(number)?;
                    WireValue::Group
                }
                4 => return Err(WireError("a group ends that did not start")),
                5 => WireValue::Fixed32(u32::from_le_bytes(
                    self.take(4)?.try_into().map_err(|_| WireError("truncated"))?,
                )),
                _ => return Err(WireError("an invalid wire type")),
            };
            Ok((number, value))
        })();
        if field.is_err() {
            // Nothing after a malformed field can be trusted.
            self.pos = self.buf.len();
        }
        Some(field)
    }
}

/// A key's field number and wire type.
fn split_key(key: u64) -> Result<(u32, u8), WireError> {
    let number = u32::try_from(key >> 3).map_err(|_| WireError("a field number out of range"))?;
    if number == 0 {
        return Err(WireError("field number 0"));
    }
    Ok((number, (key & 7) as u8))
}

/// Reads one varint at `pos` (at most ten bytes), moving `pos` past it.
pub fn read_varint(buf: &[u8], pos: &mut usize) -> Result<u64, WireError> {
    let mut value = 0u64;
    for i in 0..10 {
        let byte = *buf.get(*pos).ok_or(WireError("truncated"))?;
        *pos += 1;
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            if i == 9 && byte > 1 {
                return Err(WireError("a varint past 64 bits"));
            }
            return Ok(value);
        }
    }
    Err(WireError("a varint past 64 bits"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn reads_what_prost_writes_and_refuses_what_is_cut_short() {
        let message = crate::proto::tensorflow::TensorShapeProto {
            dim: vec![crate::proto::tensorflow::tensor_shape_proto::Dim { size: -3, name: "n".into() }],
            unknown_rank: true,
        };
        let bytes = message.encode_to_vec();
        let fields: Vec<_> = Fields::new(&bytes).collect::<Result<_, _>>().expect("valid");
        assert_eq!(fields.len(), 2);
        let WireValue::Bytes(dim) = fields[0].1 else { panic!("dim is a message") };
        let dim: Vec<_> = Fields::new(dim).collect::<Result<_, _>>().expect("valid dim");
        assert_eq!(dim[0], (1, WireValue::Varint(-3i64 as u64)));
        assert_eq!(dim[1], (2, WireValue::Bytes(b"n")));
        assert_eq!(fields[1], (3, WireValue::Varint(1)));
        // Cut inside the dim message, and between a key and its value.
        for cut in [1, 3, bytes.len() - 1] {
            let outcome: Result<Vec<_>, _> = Fields::new(&bytes[..cut]).collect();
            assert_eq!(outcome, Err(WireError("truncated")), "cut at {cut}");
        }
        // Groups are skipped whole, nested ones too; a stray end is refused.
        let group = [0x0b, 0x13, 0x08, 0x01, 0x14, 0x0c, 0x18, 0x05];
        let fields: Vec<_> = Fields::new(&group).collect::<Result<_, _>>().expect("groups");
        assert_eq!(fields, vec![(1, WireValue::Group), (3, WireValue::Varint(5))]);
        assert!(Fields::new(&[0x0c]).next().expect("one").is_err());
        assert!(Fields::new(&[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f])
            .next()
            .expect("one")
            .is_err());
        assert!(Fields::new(&[0x00]).next().expect("one").is_err(), "field 0");
    }
}
