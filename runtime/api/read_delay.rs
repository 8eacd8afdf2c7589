//! CoDel's rule over the wait before the server reads a call: once every
//! call has waited more than [`READ_DELAY_TARGET`] for
//! [`READ_DELAY_INTERVAL`], a call that waited more meets a standing
//! queue and is refused unread; one call read within the target ends the
//! spell. A burst that drains within the interval is served whole.
//!
//! Two places feed it. On the gRPC port each stream's wait is timed from
//! its arrival to its handler's first poll (`api/grpc/push_back.rs`). An HTTP/1.1 call is read inside its
//! connection's own task, so no gap before it can be timed; there a probe
//! task on the runtime wakes every [`PROBE_PERIOD`] and times how late it
//! runs, the wait any task of that runtime meets ([`RunQueue`]), and the
//! REST API refuses a call unread while that delay stands.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// The delay a call may meet before it is read without counting as a
/// standing queue: CoDel's target.
pub const READ_DELAY_TARGET: Duration = Duration::from_millis(5);

/// How long every call must have met more than the target before calls
/// are refused for it: CoDel's interval, longer than a burst takes to
/// drain.
pub const READ_DELAY_INTERVAL: Duration = Duration::from_millis(100);

/// CoDel's view of the delay before calls are read: since when every call
/// has waited more than [`READ_DELAY_TARGET`] (microseconds from `origin`;
/// 0 while the last call waited less). Shared by every connection and
/// core; a race only blurs the edge of a spell.
#[derive(Debug)]
pub struct ReadDelay {
    origin: Instant,
    above_since: AtomicU64,
}

impl Default for ReadDelay {
    fn default() -> ReadDelay {
        ReadDelay::new()
    }
}

impl ReadDelay {
    /// No spell yet.
    pub fn new() -> ReadDelay {
        ReadDelay { origin: Instant::now(), above_since: AtomicU64::new(0) }
    }

    /// Whether a call that waited `waited` before it could be read, at
    /// `now`, meets a standing queue and is to be refused.
    pub fn standing(&self, waited: Duration, now: Instant) -> bool {
        if waited <= READ_DELAY_TARGET {
            self.above_since.store(0, Ordering::Relaxed);
            return false;
        }
        let at = u64::try_from(now.saturating_duration_since(self.origin).as_micros()).unwrap_or(u64::MAX).max(1);
        match self.above_since.compare_exchange(0, at, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => false,
            Err(since) => at.saturating_sub(since) >= READ_DELAY_INTERVAL.as_micros() as u64,
        }
    }
}

/// What a call refused for waiting `waited` before it was read is told.
pub fn overloaded(waited: Duration) -> String {
    format!(
        "the server is overloaded: this call waited {} ms before the server could read it (calls have queued longer \
         than {} ms for over {} ms); retry later or at another replica",
        waited.as_millis(),
        READ_DELAY_TARGET.as_millis(),
        READ_DELAY_INTERVAL.as_millis()
    )
}

/// How often the run-queue probe wakes: a spell of [`READ_DELAY_INTERVAL`]
/// holds twenty samples, and an idle server wakes 200 times a second.
pub const PROBE_PERIOD: Duration = Duration::from_millis(5);

/// The wait of the runtime that serves REST, as its probe last measured
/// it, and whether it stands.
#[derive(Debug)]
pub struct RunQueue {
    delay: ReadDelay,
    /// The probe's last lateness, in microseconds.
    last_micros: AtomicU64,
    standing: AtomicBool,
}

impl RunQueue {
    /// Starts a probe on the current runtime; it ends when the last
    /// holder of the answer drops it.
    pub fn probe() -> Arc<RunQueue> {
        let queue = Arc::new(RunQueue {
            delay: ReadDelay::new(),
            last_micros: AtomicU64::new(0),
            standing: AtomicBool::new(false),
        });
        tokio::spawn(probe(Arc::downgrade(&queue)));
        queue
    }

    /// How long a task waits to run now, when that wait has stood above
    /// the target for an interval; `None` otherwise.
    pub fn standing(&self) -> Option<Duration> {
        self.standing.load(Ordering::Relaxed).then(|| Duration::from_micros(self.last_micros.load(Ordering::Relaxed)))
    }

    fn record(&self, late: Duration, now: Instant) {
        self.last_micros.store(u64::try_from(late.as_micros()).unwrap_or(u64::MAX), Ordering::Relaxed);
        self.standing.store(self.delay.standing(late, now), Ordering::Relaxed);
    }
}

/// Sleeps a period at a time; how late it wakes past each period's end is
/// the time its task, woken by the timer, waited to run.
async fn probe(queue: Weak<RunQueue>) {
    loop {
        let due = tokio::time::Instant::now() + PROBE_PERIOD;
        tokio::time::sleep_until(due).await;
        let now = tokio::time::Instant::now();
        let Some(queue) = queue.upgrade() else { return };
        queue.record(now.saturating_duration_since(due), now.into_std());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_read_delay_standing_for_an_interval_refuses_and_one_short_wait_ends_it() {
        let delay = ReadDelay::new();
        let t0 = delay.origin + Duration::from_secs(1);
        let ms = Duration::from_millis;
        let long = ms(20);
        // A burst: long waits, but not for an interval yet.
        assert!(!delay.standing(long, t0));
        assert!(!delay.standing(long, t0 + ms(50)));
        // Standing for the interval: refused.
        assert!(delay.standing(long, t0 + ms(100)));
        assert!(delay.standing(ms(6), t0 + ms(105)));
        // One call read within the target ends the spell.
        assert!(!delay.standing(ms(1), t0 + ms(110)));
        assert!(!delay.standing(long, t0 + ms(120)));
        assert!(!delay.standing(long, t0 + ms(200)));
        assert!(delay.standing(long, t0 + ms(220)));
    }

    #[tokio::test]
    async fn the_probe_sees_a_runtime_that_cannot_keep_up_and_lets_go_when_it_can() {
        let queue = RunQueue::probe();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(queue.standing(), None, "an idle runtime");
        // This single-threaded runtime busy for 20 ms at a time, 10 times:
        // each wake of the probe comes late.
        for _ in 0..10 {
            std::thread::sleep(Duration::from_millis(20));
            tokio::task::yield_now().await;
        }
        let waited = queue.standing().expect("a standing delay after 200 ms of 20 ms stalls");
        assert!(waited > READ_DELAY_TARGET, "{waited:?}");
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(queue.standing(), None, "one timely wake ends the spell");
    }
}
