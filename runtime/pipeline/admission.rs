//! Admission: the bound on how many requests a queue holds at once.
//!
//! Backpressure is a type here: a request gets an [`AdmissionPermit`] or a
//! RESOURCE_EXHAUSTED error naming the queue, at once, never a wait. The
//! permit is released when the request is answered (or dropped), so the
//! bound covers waiting and running requests alike.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{Error, Result};

/// A bounded entrance to a queue.
pub struct Admission {
    name: String,
    capacity: usize,
    permits: Arc<Semaphore>,
    rejected: Counter,
    in_flight: Gauge,
}

/// Proof that a request was admitted; dropping it frees the place.
#[derive(Debug)]
pub struct AdmissionPermit {
    _permit: OwnedSemaphorePermit,
    in_flight: Gauge,
}

impl Drop for AdmissionPermit {
    fn drop(&mut self) {
        self.in_flight.dec();
    }
}

impl Admission {
    /// An entrance for `capacity` requests at once; `name` appears in the
    /// error a refused request gets ("the request queue of model 'cnn'");
    /// `rejected` counts the refusals, `in_flight` shows the requests
    /// admitted and not yet answered (what a drain waits for).
    pub fn new(name: impl Into<String>, capacity: usize, rejected: Counter, in_flight: Gauge) -> Admission {
        Admission { name: name.into(), capacity, permits: Arc::new(Semaphore::new(capacity)), rejected, in_flight }
    }

    /// Admits a request, or refuses it at once when the queue is full.
    pub fn try_admit(&self) -> Result<AdmissionPermit> {
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                self.in_flight.inc();
                Ok(AdmissionPermit { _permit: permit, in_flight: self.in_flight.clone() })
            }
            Err(_) => Err(self.refused()),
        }
    }

    /// Refuses, as [`Admission::try_admit`] would, when no request could be
    /// admitted now; admits nothing either way. A check an API makes
    /// before it reads a request's body (a request that passes it is
    /// still admitted, or refused, by `try_admit` later).
    pub fn refuse_if_full(&self) -> Result<()> {
        if self.permits.available_permits() > 0 {
            return Ok(());
        }
        Err(self.refused())
    }

    /// Counts a refusal and says why.
    fn refused(&self) -> Error {
        self.rejected.inc();
        Error::queue_full(&self.name, self.capacity)
    }

    /// Requests admitted and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.capacity - self.permits.available_permits()
    }

    /// Requests refused so far.
    pub fn rejected(&self) -> u64 {
        self.rejected.get()
    }

    /// The most requests admitted at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;

    #[test]
    fn refuses_beyond_capacity_and_frees_on_drop() {
        let gauge = Gauge::default();
        let admission = Admission::new("queue of model 'm'", 2, Counter::default(), gauge.clone());
        assert!(admission.refuse_if_full().is_ok());
        let a = admission.try_admit().unwrap();
        let _b = admission.try_admit().unwrap();
        assert_eq!(admission.refuse_if_full().unwrap_err().code(), Code::ResourceExhausted);
        let err = admission.try_admit().unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted);
        assert!(err.message().contains("queue of model 'm'"), "{err}");
        assert_eq!(admission.rejected(), 2, "the check and the admission each count their refusal");
        assert_eq!(admission.in_flight(), 2);
        assert_eq!(gauge.get(), 2);
        drop(a);
        assert_eq!(gauge.get(), 1);
        assert!(admission.try_admit().is_ok());
    }
}
