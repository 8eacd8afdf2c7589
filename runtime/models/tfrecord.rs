//! TFRecord framing, as TensorFlow writes it: each record is its length
//! (u64, little-endian), the masked CRC-32C of those 8 bytes, the data,
//! and the masked CRC-32C of the data. Warmup files and request logs are
//! TFRecord files of `PredictionLog` records.

use std::io::Read;
use std::path::Path;

use crate::error::{Error, Result};

/// Bytes a record adds around its data.
pub const FRAME_OVERHEAD: usize = 16;

/// TensorFlow's CRC mask: a CRC stored next to data that is itself a CRC
/// would otherwise be easy to get right by accident.
pub fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// The records of a TFRecord file, every checksum checked; an error names
/// the record.
pub fn records(mut bytes: &[u8]) -> Result<Vec<&[u8]>> {
    let mut records = Vec::new();
    while !bytes.is_empty() {
        let at = records.len();
        let bad = |what: &str| Error::invalid_argument(format!("record {at}: {what}; not a TFRecord file?"));
        if bytes.len() < 12 {
            return Err(bad("the file ends inside a record header"));
        }
        let (length_bytes, rest) = bytes.split_at(8);
        let length = u64::from_le_bytes(length_bytes.try_into().map_err(|_| bad("short length"))?);
        let length_crc = u32::from_le_bytes(rest[..4].try_into().map_err(|_| bad("short checksum"))?);
        if masked_crc(length_bytes) != length_crc {
            return Err(bad("the checksum of its length is wrong"));
        }
        let rest = &rest[4..];
        let length = usize::try_from(length).ok().filter(|&n| n.checked_add(4).is_some_and(|end| end <= rest.len()));
        let Some(length) = length else {
            return Err(bad("its length runs past the end of the file"));
        };
        let (data, rest) = rest.split_at(length);
        let data_crc = u32::from_le_bytes(rest[..4].try_into().map_err(|_| bad("short checksum"))?);
        if masked_crc(data) != data_crc {
            return Err(bad("the checksum of its data is wrong"));
        }
        records.push(data);
        bytes = &rest[4..];
    }
    Ok(records)
}

/// Appends `data` to `out`, framed as one record.
pub fn frame(data: &[u8], out: &mut Vec<u8>) {
    let length = (data.len() as u64).to_le_bytes();
    out.extend_from_slice(&length);
    out.extend_from_slice(&masked_crc(&length).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
}

/// Frames `records` as a TFRecord file.
pub fn write(records: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(records.iter().map(|r| r.len() + FRAME_OVERHEAD).sum());
    for data in records {
        frame(data, &mut out);
    }
    out
}

/// Reads a whole file of at most `max_bytes`: a larger one is refused
/// before it is read into memory.
pub fn read_bounded(path: &Path, max_bytes: u64) -> Result<Vec<u8>> {
    let cannot = |e: std::io::Error| Error::invalid_argument(format!("cannot read it: {e}"));
    let file = std::fs::File::open(path).map_err(cannot)?;
    let mut bytes = Vec::new();
    file.take(max_bytes + 1).read_to_end(&mut bytes).map_err(cannot)?;
    if bytes.len() as u64 > max_bytes {
        return Err(Error::invalid_argument(format!("it is larger than {max_bytes} bytes")));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_is_castagnoli() {
        // The standard check value of CRC-32C.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn records_round_trip_and_damage_is_named() {
        let file = write(&[b"one".to_vec(), Vec::new(), b"three".to_vec()]);
        let parsed = records(&file).unwrap();
        assert_eq!(parsed, vec![&b"one"[..], &b""[..], &b"three"[..]]);
        let mut damaged = file.clone();
        damaged[13] ^= 1;
        assert!(records(&damaged).unwrap_err().message().contains("record 0"));
        let err = records(&file[..file.len() - 1]).unwrap_err();
        assert!(err.message().contains("record 2"), "{err}");
        let mut huge = file.clone();
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        huge[8..12].copy_from_slice(&masked_crc(&u64::MAX.to_le_bytes()).to_le_bytes());
        assert!(records(&huge).unwrap_err().message().contains("past the end"));
    }
}
