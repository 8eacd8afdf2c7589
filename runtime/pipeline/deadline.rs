//! A request's deadline, carried through every stage.
//!
//! Clients set it with gRPC's `grpc-timeout` header; each stage checks it
//! before starting work, so a request that can no longer be answered in
//! time is answered DEADLINE_EXCEEDED and never reaches the model.

use std::future::Future;
use std::time::Duration;

// Tokio's clock (the system's, unless a test pauses it), so that deadlines
// can be tested with paused time.
use tokio::time::Instant;

use crate::error::{Error, Result};

/// When a request stops being worth answering; `None` means never.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Deadline(Option<Instant>);

impl Deadline {
    /// No deadline.
    pub const NONE: Deadline = Deadline(None);

    /// A deadline `timeout` from now.
    pub fn after(timeout: Duration) -> Deadline {
        Deadline(Instant::now().checked_add(timeout))
    }

    /// The instant, if any.
    pub fn instant(&self) -> Option<Instant> {
        self.0
    }

    /// True once the deadline has passed.
    pub fn expired(&self) -> bool {
        self.0.is_some_and(|at| Instant::now() >= at)
    }

    /// `Ok` while there is time left; otherwise the error a client gets,
    /// saying `where` the request was.
    pub fn check(&self, at: &str) -> Result<()> {
        if self.expired() {
            Err(Error::deadline_exceeded(at))
        } else {
            Ok(())
        }
    }

    /// Awaits `work`, or gives up with DEADLINE_EXCEEDED when the deadline
    /// passes first.
    pub async fn run<T>(&self, at: &str, work: impl Future<Output = Result<T>>) -> Result<T> {
        match self.0 {
            None => work.await,
            Some(at_instant) => {
                tokio::time::timeout_at(at_instant, work).await.unwrap_or_else(|_| Err(Error::deadline_exceeded(at)))
            }
        }
    }

    /// The deadline from a `grpc-timeout` header value, if present and
    /// well formed (gRPC: up to 8 digits and a unit, H M S m u n).
    pub fn from_grpc_timeout(value: Option<&str>) -> Deadline {
        value.and_then(parse_grpc_timeout).map_or(Deadline::NONE, Deadline::after)
    }
}

/// Parses a `grpc-timeout` value such as `250m` or `5S`.
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount.checked_mul(3600)?),
        "M" => Duration::from_secs(amount.checked_mul(60)?),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;

    #[test]
    fn parses_grpc_timeouts() {
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_grpc_timeout("100u"), Some(Duration::from_micros(100)));
        assert_eq!(parse_grpc_timeout("m"), None);
        assert_eq!(parse_grpc_timeout("10x"), None);
        assert_eq!(parse_grpc_timeout("123456789S"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_expires_when_its_time_has_passed() {
        let deadline = Deadline::after(Duration::from_millis(250));
        assert!(deadline.check("early").is_ok());
        tokio::time::advance(Duration::from_millis(249)).await;
        assert!(!deadline.expired());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(deadline.expired());
        let slow = deadline.run("while running", std::future::pending::<Result<()>>());
        assert!(matches!(slow.await, Err(Error::DeadlineExceeded { .. })));
    }

    #[test]
    fn expired_deadline_is_refused() {
        // A deadline of zero has passed the moment it is made.
        let past = Deadline::after(Duration::ZERO);
        let err = past.check("in the batch queue").unwrap_err();
        assert_eq!(err.code(), Code::DeadlineExceeded);
        assert!(err.message().contains("in the batch queue"));
        assert!(Deadline::NONE.check("anywhere").is_ok());
    }
}
