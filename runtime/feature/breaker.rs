//! A circuit breaker for a feature store's connection: after
//! `open_after` failures in a row it opens, and every lookup that would
//! reach the store fails at once ([`Error::DependencyFailed`]) instead of
//! paying the store's timeout; a probe the store's client runs
//! (half-open: one small request every probe interval, never a client's)
//! closes it again. The outage is one WARN line when it begins and one
//! INFO line when it ends, with how long it lasted and how many lookups
//! it failed at once. A failure that opens nothing is a WARN line too, at
//! most one a second, counting the ones it did not log. The requests the
//! store fails are counted, not each logged.
//!
//! The request path reads one atomic while closed. Opening and closing
//! take a mutex, once per outage; while open, each lookup failed at once
//! takes it to copy the outage's message (uncontended: a failure costs
//! that copy, not a format).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use crate::error::{Error, Result};

/// One dependency's breaker.
pub struct Breaker {
    /// "the Redis feature store redis://host:6379", for messages.
    what: String,
    /// Failures in a row that open it; 0: it never opens.
    open_after: u32,
    probe_every: Duration,
    failures: AtomicU32,
    open: AtomicBool,
    /// Lookups failed at once during the current outage.
    failed_fast: AtomicU64,
    outage: Mutex<Outage>,
    /// When a failure was last logged; failures not logged since.
    last_line: Mutex<Option<Instant>>,
    unlogged: AtomicU64,
    down: Gauge,
    outages: Counter,
}

/// The current (or last) outage.
struct Outage {
    since: Instant,
    /// What the client tells a request failed at once: built when the
    /// breaker opens, so a failure costs a clone, not a format.
    message: String,
}

impl Breaker {
    /// A closed breaker for `what`, opening after `open_after` failures in
    /// a row, its probe every `probe_every`; `down` is 1 while open and
    /// `outages` counts openings.
    pub fn new(what: String, open_after: u32, probe_every: Duration, down: Gauge, outages: Counter) -> Breaker {
        Breaker {
            what,
            open_after,
            probe_every,
            failures: AtomicU32::new(0),
            open: AtomicBool::new(false),
            failed_fast: AtomicU64::new(0),
            outage: Mutex::new(Outage { since: Instant::now(), message: String::new() }),
            last_line: Mutex::new(None),
            unlogged: AtomicU64::new(0),
            down,
            outages,
        }
    }

    /// How often the client probes while it is open.
    pub fn probe_every(&self) -> Duration {
        self.probe_every
    }

    /// True while it is open.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// `Ok` while closed; while open, the error that fails `lookups` at
    /// once.
    pub fn check(&self, lookups: usize) -> Result<()> {
        if !self.is_open() {
            return Ok(());
        }
        self.failed_fast.fetch_add(lookups as u64, Ordering::Relaxed);
        let outage = self.outage.lock().unwrap_or_else(PoisonError::into_inner);
        Err(Error::dependency_failed(outage.message.clone()))
    }

    /// The store answered: the count of failures in a row starts again,
    /// and an open breaker closes (one line saying so). True when it was
    /// open.
    pub fn succeeded(&self) -> bool {
        // Read first: every answered round trip comes here, and a store
        // would take the cache line from the other cores each time.
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        if !self.open.load(Ordering::Acquire) {
            return false;
        }
        let outage = self.outage.lock().unwrap_or_else(PoisonError::into_inner);
        if !self.open.swap(false, Ordering::AcqRel) {
            return false;
        }
        self.down.set(0);
        let failed_fast = self.failed_fast.swap(0, Ordering::Relaxed);
        tracing::info!(
            down_for_ms = outage.since.elapsed().as_millis() as u64,
            failed_fast,
            "{} is back: lookups reach it again ({failed_fast} failed at once while it was down)",
            self.what
        );
        true
    }

    /// A request to the store failed for `why`. True when this failure
    /// opened the breaker: the caller starts its probe.
    pub fn failed(&self, why: &str) -> bool {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if self.open_after == 0 || failures < self.open_after || self.open.load(Ordering::Acquire) {
            self.log_failure(why);
            return false;
        }
        let mut outage = self.outage.lock().unwrap_or_else(PoisonError::into_inner);
        if self.open.load(Ordering::Acquire) {
            return false;
        }
        outage.since = Instant::now();
        outage.message = format!(
            "{} is down ({why}); lookups fail at once until a probe, every {:?}, finds it back",
            self.what, self.probe_every
        );
        self.failed_fast.store(0, Ordering::Relaxed);
        self.unlogged.store(0, Ordering::Relaxed);
        self.open.store(true, Ordering::Release);
        self.down.set(1);
        self.outages.inc();
        tracing::warn!(
            failures,
            "{} is down after {failures} failures in a row ({why}): lookups fail at once (or fall back, as each \
             pipeline's on_store_error says) until a probe every {:?} finds it back",
            self.what,
            self.probe_every
        );
        true
    }

    /// A line for a failure that opened nothing, at most one a second.
    fn log_failure(&self, why: &str) {
        self.unlogged.fetch_add(1, Ordering::Relaxed);
        let Ok(mut last) = self.last_line.try_lock() else { return };
        if last.is_some_and(|at| at.elapsed() < Duration::from_secs(1)) {
            return;
        }
        *last = Some(Instant::now());
        let unlogged = self.unlogged.swap(0, Ordering::Relaxed).saturating_sub(1);
        tracing::warn!(
            "{} failed a round trip: {why} ({unlogged} failures before it not logged: at most a line a second; \
             sluice_feature_errors_total counts each lookup failed)",
            self.what
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker(open_after: u32) -> Breaker {
        Breaker::new(
            "the test store".to_string(),
            open_after,
            Duration::from_millis(500),
            Gauge::default(),
            Counter::default(),
        )
    }

    #[test]
    fn it_opens_after_failures_in_a_row_and_a_success_between_them_starts_the_count_again() {
        let breaker = breaker(3);
        assert!(!breaker.failed("refused"));
        assert!(!breaker.failed("refused"));
        assert!(!breaker.succeeded(), "it was not open");
        assert!(!breaker.failed("refused"));
        assert!(!breaker.failed("refused"));
        assert!(breaker.check(1).is_ok());
        assert!(breaker.failed("connection refused"), "the third in a row opens it");
        assert!(!breaker.failed("refused"), "only the first opening starts a probe");
        let error = breaker.check(1).expect_err("open: lookups fail at once");
        assert!(matches!(error, Error::DependencyFailed(_)));
        let message = error.to_string();
        assert!(message.contains("the test store is down (connection refused)"), "{message}");
        assert_eq!(breaker.down.get(), 1);
        assert_eq!(breaker.outages.get(), 1);

        assert!(breaker.succeeded(), "a probe that answers closes it");
        assert!(breaker.check(1).is_ok());
        assert_eq!(breaker.down.get(), 0);
    }

    #[test]
    fn a_breaker_set_to_zero_never_opens() {
        let breaker = breaker(0);
        for _ in 0..100 {
            assert!(!breaker.failed("refused"));
        }
        assert!(breaker.check(1).is_ok());
    }
}
