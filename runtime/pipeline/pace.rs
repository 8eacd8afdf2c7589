//! How fast a pipeline answers, learned by its admission, so that the
//! admission can bound its queue by time rather than by count.
//!
//! Every answered request reports when it was admitted. Completions are
//! counted over windows of at least [`WINDOW`]; a window in which the
//! pipeline was pressed (a request was refused in it, or half its places
//! were in use at its end) measures what the pipeline *can* serve, its
//! service rate, and the fastest answer of the window measures its
//! service time. A window that was not pressed measures only what it was
//! offered, and teaches nothing: the rate stays unknown until the first
//! overload, and then keeps what the last one measured.
//!
//! The service time is the lowest such fastest answer of the last
//! [`SERVICE_MEMORY`], not an average of them: under a standing queue
//! even a window's fastest answer waited, and averaging it in would let
//! the queue feed the estimate that sizes it (more places, longer waits, a
//! slower "fastest" answer, more places), until the batch queue drops
//! what it admitted as stale. A lower one is taken at once; a higher one
//! only once the lowest is older than the memory (the model slowed down).
//!
//! From the two, Little's law gives the places that hold at most `bound`
//! of queueing (`rate × (service + bound)`) and the wait a request
//! admitted now should expect (`in_use / rate`). Everything here is a
//! handful of atomics: a refusal must cost almost nothing.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

// Tokio's clock (the system's unless a test pauses it), as deadlines use.
use tokio::time::Instant;

/// The shortest window a rate is measured over.
pub const WINDOW: Duration = Duration::from_millis(50);

/// Completions a window needs before it measures, unless it has lasted
/// [`LONGEST_WINDOW`] (a slow model answers a few a second).
const FEWEST_COMPLETIONS: u64 = 16;

/// The longest a window waits for [`FEWEST_COMPLETIONS`].
const LONGEST_WINDOW: Duration = Duration::from_secs(1);

/// How long the lowest service time measured is kept before a higher one
/// replaces it.
pub const SERVICE_MEMORY: Duration = Duration::from_secs(10);

/// The learned service rate and time of one admission.
#[derive(Debug)]
pub struct Pace {
    epoch: Instant,
    /// Nanoseconds from `epoch` to the current window's start.
    window_start: AtomicU64,
    completions: AtomicU64,
    /// A request was refused in the current window.
    pressed: AtomicBool,
    /// The fastest answer of the current window, in nanoseconds.
    fastest: AtomicU64,
    /// Requests answered per second while pressed (f64 bits); 0: unknown.
    rate: AtomicU64,
    /// Nanoseconds an unqueued request takes: the lowest fastest answer
    /// of a pressed window within [`SERVICE_MEMORY`].
    service: AtomicU64,
    /// When `service` was measured, in nanoseconds from `epoch`.
    service_at: AtomicU64,
}

impl Default for Pace {
    fn default() -> Self {
        Pace::new()
    }
}

impl Pace {
    /// Nothing learned yet.
    pub fn new() -> Pace {
        Pace {
            epoch: Instant::now(),
            window_start: AtomicU64::new(0),
            completions: AtomicU64::new(0),
            pressed: AtomicBool::new(false),
            fastest: AtomicU64::new(u64::MAX),
            rate: AtomicU64::new(0),
            service: AtomicU64::new(0),
            service_at: AtomicU64::new(0),
        }
    }

    fn nanos_since_epoch(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// A request was refused: the current window was pressed.
    pub fn refused(&self) {
        if !self.pressed.load(Ordering::Relaxed) {
            self.pressed.store(true, Ordering::Relaxed);
        }
    }

    /// A request admitted at `admitted` was answered; `in_use` places are
    /// still taken of the `limit` the admission allows now.
    pub fn answered(&self, admitted: Instant, in_use: usize, limit: usize) {
        let now = Instant::now();
        let took = u64::try_from(now.saturating_duration_since(admitted).as_nanos()).unwrap_or(u64::MAX);
        self.fastest.fetch_min(took, Ordering::Relaxed);
        let completions = self.completions.fetch_add(1, Ordering::Relaxed) + 1;
        let start = self.window_start.load(Ordering::Relaxed);
        let now_nanos = self.nanos_since_epoch(now);
        let elapsed = now_nanos.saturating_sub(start);
        let long_enough = elapsed >= WINDOW.as_nanos() as u64
            && (completions >= FEWEST_COMPLETIONS || elapsed >= LONGEST_WINDOW.as_nanos() as u64);
        // One answer closes the window; the others go on counting.
        if !long_enough
            || self.window_start.compare_exchange(start, now_nanos, Ordering::AcqRel, Ordering::Relaxed).is_err()
        {
            return;
        }
        let completions = self.completions.swap(0, Ordering::AcqRel);
        let fastest = self.fastest.swap(u64::MAX, Ordering::AcqRel);
        let pressed = self.pressed.swap(false, Ordering::AcqRel) || in_use.saturating_mul(2) >= limit.max(2);
        if !pressed || completions == 0 {
            return;
        }
        let measured = completions as f64 / (elapsed as f64 / 1e9);
        let old = f64::from_bits(self.rate.load(Ordering::Relaxed));
        let rate = if old > 0.0 { (old + measured) / 2.0 } else { measured };
        self.rate.store(rate.to_bits(), Ordering::Relaxed);
        let old_service = self.service.load(Ordering::Relaxed);
        let age = now_nanos.saturating_sub(self.service_at.load(Ordering::Relaxed));
        if old_service == 0 || fastest <= old_service || age >= SERVICE_MEMORY.as_nanos() as u64 {
            self.service.store(fastest, Ordering::Relaxed);
            self.service_at.store(now_nanos, Ordering::Relaxed);
        }
    }

    /// Requests answered per second while pressed; `None` until the first
    /// pressed window.
    pub fn rate(&self) -> Option<f64> {
        let rate = f64::from_bits(self.rate.load(Ordering::Relaxed));
        (rate > 0.0).then_some(rate)
    }

    /// How long an unqueued request takes, once learned.
    pub fn service_time(&self) -> Option<Duration> {
        self.rate().map(|_| Duration::from_nanos(self.service.load(Ordering::Relaxed)))
    }

    /// The places that hold at most `bound` of queueing at the learned
    /// rate, at least 1 and at most `cap`; `cap` until a rate is learned.
    pub fn places(&self, bound: Duration, cap: usize) -> usize {
        let Some(rate) = self.rate() else { return cap };
        let service = Duration::from_nanos(self.service.load(Ordering::Relaxed));
        let places = (rate * (service + bound).as_secs_f64()).ceil();
        if places >= cap as f64 {
            cap
        } else {
            (places as usize).max(1)
        }
    }

    /// What a request admitted now behind `in_use` others should expect
    /// to take, once a rate is learned.
    pub fn expected(&self, in_use: usize) -> Option<Duration> {
        let rate = self.rate()?;
        let service = Duration::from_nanos(self.service.load(Ordering::Relaxed));
        Some(service.max(Duration::from_secs_f64(in_use as f64 / rate)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers `count` requests over `over`, each having taken `took`,
    /// with `in_use` places taken of `limit`.
    async fn answer(pace: &Pace, count: u32, over: Duration, took: Duration, in_use: usize, limit: usize) {
        for _ in 0..count {
            tokio::time::advance(over / count).await;
            pace.answered(Instant::now() - took, in_use, limit);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn learns_only_while_pressed() {
        let pace = Pace::new();
        // 1000 answers a second with few places in use: an offered rate,
        // not a service rate.
        answer(&pace, 200, Duration::from_millis(200), Duration::from_millis(1), 2, 100).await;
        assert_eq!(pace.rate(), None);
        assert_eq!(pace.places(Duration::from_millis(10), 100), 100, "nothing learned: the count bounds");
        assert_eq!(pace.expected(50), None);
        // Pressed: a refusal, then 2000 answers a second.
        pace.refused();
        answer(&pace, 400, Duration::from_millis(200), Duration::from_millis(2), 60, 100).await;
        let rate = pace.rate().expect("learned");
        assert!((1500.0..2500.0).contains(&rate), "{rate}");
        assert_eq!(pace.service_time(), Some(Duration::from_millis(2)));
        // 2000/s × (2 ms + 10 ms) = 24 places.
        let places = pace.places(Duration::from_millis(10), 100);
        assert!((18..=30).contains(&places), "{places}");
        assert_eq!(pace.places(Duration::from_secs(10), 100), 100, "never above the count");
        // 100 ahead at 2000/s: 50 ms.
        let expected = pace.expected(100).expect("learned");
        assert!(expected > Duration::from_millis(35) && expected < Duration::from_millis(70), "{expected:?}");
        assert_eq!(pace.expected(0), Some(Duration::from_millis(2)), "never less than the service time");
    }

    #[tokio::test(start_paused = true)]
    async fn a_standing_queue_does_not_inflate_the_service_time_that_sizes_it() {
        let pace = Pace::new();
        pace.refused();
        answer(&pace, 400, Duration::from_millis(200), Duration::from_millis(2), 60, 100).await;
        assert_eq!(pace.service_time(), Some(Duration::from_millis(2)));
        // Under a standing queue even the fastest answers waited: 12 ms.
        for _ in 0..10 {
            pace.refused();
            answer(&pace, 100, Duration::from_millis(100), Duration::from_millis(12), 90, 100).await;
        }
        assert_eq!(pace.service_time(), Some(Duration::from_millis(2)), "the queue's wait is not service");
        // Past the memory, the model is taken to have slowed down.
        tokio::time::advance(SERVICE_MEMORY).await;
        pace.refused();
        answer(&pace, 100, Duration::from_millis(100), Duration::from_millis(12), 90, 100).await;
        assert_eq!(pace.service_time(), Some(Duration::from_millis(12)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_model_is_measured_over_longer_windows() {
        let pace = Pace::new();
        pace.refused();
        // 5 a second, all places in use: one window of a second.
        answer(&pace, 6, Duration::from_millis(1200), Duration::from_millis(200), 4, 4).await;
        let rate = pace.rate().expect("learned after a second");
        assert!((3.0..7.0).contains(&rate), "{rate}");
        assert!(pace.places(Duration::from_millis(50), 64) >= 1);
    }
}
