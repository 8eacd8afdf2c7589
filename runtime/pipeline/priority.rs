//! A request's priority: what a client says about how much its answer
//! matters next to others', read once at the API edge.
//!
//! It is given as the `x-sluice-priority` header (gRPC metadata or HTTP
//! header) or, in KServe v2 requests, as the `priority` parameter, with
//! Triton's numbering: 1 is the highest, larger numbers are lower, 0 is the
//! default. Three levels are served: 1 is high, 2 (or the default) is
//! normal, 3 and beyond are low. Admission keeps places for the higher
//! levels (`[traffic]`), and every queue of the pipeline — stage queues and
//! batch queues — hands out high-priority requests first.

use std::fmt;

use crate::error::{Error, Result};

/// The header, and gRPC metadata key, that carries a request's priority.
pub const PRIORITY_HEADER: &str = "x-sluice-priority";

/// How much a request's answer matters next to others'.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    /// Served first, and admitted into the places kept for it.
    High = 0,
    /// What a request without a priority is.
    #[default]
    Normal = 1,
    /// Served last, and admitted only into a share of the places.
    Low = 2,
}

impl Priority {
    /// The levels, highest first.
    pub const ALL: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

    /// Its place in [`Priority::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }

    /// A level in Triton's numbering: 0 is the default, 1 the highest.
    pub fn from_level(level: u64) -> Priority {
        match level {
            0 | 2 => Priority::Normal,
            1 => Priority::High,
            _ => Priority::Low,
        }
    }

    /// The priority a header (or metadata value) gives: a name (`high`,
    /// `normal`, `low`) or a level number. Absent: normal.
    pub fn from_header(value: Option<&[u8]>) -> Result<Priority> {
        let Some(value) = value else { return Ok(Priority::Normal) };
        let text = std::str::from_utf8(value).unwrap_or("").trim();
        match text.to_ascii_lowercase().as_str() {
            "high" => Ok(Priority::High),
            "normal" | "" => Ok(Priority::Normal),
            "low" => Ok(Priority::Low),
            number => number.parse::<u64>().map(Priority::from_level).map_err(|_| {
                Error::invalid_argument(format!(
                    "{PRIORITY_HEADER} = \"{}\": expected high, normal, low, or a level number (1 is the highest, \
                     0 the default)",
                    String::from_utf8_lossy(&value[..value.len().min(64)])
                ))
            }),
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;

    #[test]
    fn names_and_levels_read_as_triton_numbers_them() {
        assert_eq!(Priority::from_header(None).unwrap(), Priority::Normal);
        assert_eq!(Priority::from_header(Some(b"HIGH")).unwrap(), Priority::High);
        assert_eq!(Priority::from_header(Some(b" low ")).unwrap(), Priority::Low);
        assert_eq!(Priority::from_header(Some(b"1")).unwrap(), Priority::High);
        assert_eq!(Priority::from_header(Some(b"0")).unwrap(), Priority::Normal);
        assert_eq!(Priority::from_header(Some(b"2")).unwrap(), Priority::Normal);
        assert_eq!(Priority::from_header(Some(b"9")).unwrap(), Priority::Low);
        let err = Priority::from_header(Some(b"urgent")).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().contains("x-sluice-priority = \"urgent\""), "{err}");
        assert!(Priority::High < Priority::Low);
    }
}
