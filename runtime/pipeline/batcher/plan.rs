//! How each batch is formed: how many rows it waits for, the most it may
//! take, and when it closes whatever it holds. Fixed mode follows TF
//! Serving's parameters; auto mode ([`AutoPolicy`]) learns them.
//!
//! Auto mode plans from two measurements: the model version's latency at
//! each batch size (its [`LatencyCurve`]: seeded by warmup, updated after
//! every batch) and the rate at which rows arrive (a moving average over
//! a quarter of a second). For each batch:
//!
//! - **cap**: the largest batch whose run takes at most half the latency
//!   target, and no larger than the curve's most efficient size (past it
//!   a batch costs more per row: larger only adds latency). Under saturation a request waits for a running batch to end
//!   and then runs in the next, so two runs must fit in the target. Under
//!   overload batches are this large: the most throughput the target
//!   allows. The cap does not shrink as a backlog ages: smaller batches
//!   would only drain it more slowly. When more rows wait than the cap
//!   (a backlog: the target is already lost for some of them), a batch
//!   may grow to **backlog_cap**, the largest whose run fits the whole
//!   target, to drain it sooner.
//! - **want**: the smallest batch with which the batch threads keep up
//!   with the arrivals (`threads × want / latency(want) ≥ rate`). The
//!   batch closes as soon as it holds that many rows. While single rows
//!   keep up, nothing waits: a free thread runs what is there, and under
//!   load batches grow by themselves while threads are busy. Waiting
//!   starts only where running what is there would fall behind.
//! - **close**: when `want` is not there yet, the batch waits about twice
//!   the time the arrival rate needs to bring the missing rows, never
//!   past the moment its oldest request could no longer wait for a
//!   running batch and run its own within the target.
//!
//! Every choice is a pure function of the curve, the rate and the clock
//! (tokio's, so tests run it on paused time).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{BatchingMode, BatchingParameters};
use crate::infer::latency::{CurveSnapshot, LatencyCurve};

/// How one batch is formed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    /// The batch closes once it holds this many rows.
    pub want: usize,
    /// The most rows it may take, when more are waiting as it leaves.
    pub cap: usize,
    /// The most rows it may take when more than `cap` are waiting.
    pub backlog_cap: usize,
    /// It closes at this instant whatever it holds.
    pub close_at: Instant,
    /// Rows per second arriving, as the plan measured it (0 in fixed mode,
    /// which does not measure it).
    pub arrival_rate: f64,
}

/// The policy of one batcher.
pub enum Policy {
    /// TF Serving's: up to `max_batch_size` rows, waiting `timeout`.
    Fixed { max_batch_size: usize, timeout: Duration },
    /// Learned from the model's latency and the arrival rate.
    Auto(AutoPolicy),
}

impl Policy {
    /// The policy `params` describe, for a batcher running `threads`
    /// batches at once.
    pub fn new(params: &BatchingParameters, threads: usize) -> Policy {
        match params.mode {
            BatchingMode::Fixed => Policy::Fixed {
                max_batch_size: params.max_batch_size,
                timeout: Duration::from_micros(params.timeout_micros()),
            },
            BatchingMode::Auto => Policy::Auto(AutoPolicy::new(params, threads)),
        }
    }

    /// `rows` rows arrived at `now`.
    pub fn arrived(&self, now: Instant, rows: usize) {
        if let Policy::Auto(auto) = self {
            auto.arrived(now, rows);
        }
    }

    /// The plan for a batch that holds `rows` rows, the oldest of which
    /// arrived at `oldest`.
    pub fn plan(&self, curve: &LatencyCurve, now: Instant, oldest: Instant, rows: usize) -> Plan {
        match self {
            Policy::Fixed { max_batch_size, timeout } => {
                let max = *max_batch_size;
                Plan { want: max, cap: max, backlog_cap: max, close_at: oldest + *timeout, arrival_rate: 0.0 }
            }
            Policy::Auto(auto) => auto.plan(&curve.snapshot(), now, oldest, rows),
        }
    }
}

/// How long a batch waits for its missing rows, in units of the time the
/// arrival rate needs to bring them.
const FILL_SLACK: f64 = 2.0;

/// The shortest span the arrival rate is measured over.
const RATE_WINDOW: Duration = Duration::from_millis(10);

/// The arrival rate's memory: a step in load is 95 % seen after three.
const RATE_TIME_CONSTANT: Duration = Duration::from_millis(250);

/// Auto mode: batch sizes and waits chosen to a latency target.
pub struct AutoPolicy {
    /// The target, the largest batch and the padding.
    params: BatchingParameters,
    threads: usize,
    arrivals: ArrivalRate,
}

impl AutoPolicy {
    /// The policy for `params` (auto mode) with `threads` batches at once.
    pub fn new(params: &BatchingParameters, threads: usize) -> AutoPolicy {
        AutoPolicy { params: params.clone(), threads: threads.max(1), arrivals: ArrivalRate::new() }
    }

    /// `rows` rows arrived at `now`.
    pub fn arrived(&self, now: Instant, rows: usize) {
        self.arrivals.record(now, rows);
    }

    /// Rows per second arriving, as measured at `now`.
    pub fn rate(&self, now: Instant) -> f64 {
        self.arrivals.rate(now)
    }

    /// Seconds a batch of `rows` rows is expected to take (at its padded
    /// size).
    fn cost(&self, curve: &CurveSnapshot, rows: usize) -> Option<f64> {
        curve.estimate(self.params.padded_size(rows))
    }

    /// The plan for a batch holding `rows` rows whose oldest arrived at
    /// `oldest` (see the module's documentation).
    pub fn plan(&self, curve: &CurveSnapshot, now: Instant, oldest: Instant, rows: usize) -> Plan {
        let max_batch_size = self.params.max_batch_size.max(1);
        let target = self.params.latency_target();
        let rows = rows.clamp(1, max_batch_size);
        let rate = self.rate(now);
        let close_now = |cap: usize| Plan { want: rows, cap, backlog_cap: cap, close_at: now, arrival_rate: rate };
        if curve.is_empty() {
            // Nothing measured yet: run what is there and learn from it.
            return close_now(max_batch_size);
        }
        // (A hair of slack, so that a size costing exactly half is not lost
        // to rounding in the fitted line.)
        let half = target.as_secs_f64() / 2.0 * (1.0 + 1e-9);
        let within_half = |n: usize| self.cost(curve, n).is_some_and(|s| s <= half);
        // The cost grows with the size (the curve is monotone), so the
        // largest size within the budget is found by bisection.
        let efficient = curve.efficient_rows().unwrap_or(max_batch_size).clamp(1, max_batch_size);
        let cap = largest(1, efficient, within_half).unwrap_or(1).max(rows);
        let whole = target.as_secs_f64() * (1.0 + 1e-9);
        let within_target = |n: usize| self.cost(curve, n).is_some_and(|s| s <= whole);
        let backlog_cap = largest(cap, efficient, within_target).unwrap_or(cap);
        if rate <= 0.0 {
            return Plan { backlog_cap, ..close_now(cap) };
        }
        let needed = rate / self.threads as f64;
        let keeps_up = |n: usize| self.cost(curve, n).is_some_and(|s| s <= 0.0 || n as f64 / s >= needed);
        let want = smallest(1, cap, keeps_up).unwrap_or(cap);
        if rows >= want {
            return Plan { want, cap, backlog_cap, close_at: now, arrival_rate: rate };
        }
        let fill = Duration::from_secs_f64((want - rows) as f64 / rate * FILL_SLACK).min(target);
        let run = Duration::from_secs_f64(self.cost(curve, want).unwrap_or(0.0));
        let latest = oldest + target.saturating_sub(run * 2);
        Plan { want, cap, backlog_cap, close_at: (now + fill).min(latest).max(now), arrival_rate: rate }
    }
}

/// The largest `n` in `low..=high` for which `ok` holds, when `ok` holds
/// for every size below any size where it holds.
fn largest(low: usize, high: usize, ok: impl Fn(usize) -> bool) -> Option<usize> {
    if low > high || !ok(low) {
        return None;
    }
    let (mut yes, mut no) = (low, high.saturating_add(1));
    while no - yes > 1 {
        let mid = yes + (no - yes) / 2;
        if ok(mid) {
            yes = mid;
        } else {
            no = mid;
        }
    }
    Some(yes)
}

/// The smallest `n` in `low..=high` for which `ok` holds, when `ok` holds
/// for every size above any size where it holds: one past the largest
/// where it does not.
fn smallest(low: usize, high: usize, ok: impl Fn(usize) -> bool) -> Option<usize> {
    if low > high || !ok(high) {
        return None;
    }
    Some(largest(low, high, |n| !ok(n)).map_or(low, |n| n + 1))
}

/// The arrival rate, a moving average over windows of at least
/// [`RATE_WINDOW`], kept in atomics: every request of every network
/// thread records its rows here, so a lock would be taken once per
/// request across the cores. Whoever first sees a window over closes it
/// (a compare-and-swap on its start); rows recorded meanwhile count in
/// the window they raced with, which an average over 250 ms absorbs.
struct ArrivalRate {
    /// What times are counted from.
    base: Instant,
    /// The open window's start, in microseconds since `base`, plus one
    /// (0: no window yet).
    window_start: AtomicU64,
    window_rows: AtomicU64,
    /// Rows per second, an `f64`'s bits.
    rate: AtomicU64,
}

impl ArrivalRate {
    fn new() -> ArrivalRate {
        ArrivalRate {
            base: Instant::now(),
            window_start: AtomicU64::new(0),
            window_rows: AtomicU64::new(0),
            rate: AtomicU64::new(0f64.to_bits()),
        }
    }

    fn record(&self, now: Instant, rows: usize) {
        self.fold(now);
        self.window_rows.fetch_add(rows as u64, Ordering::Relaxed);
    }

    fn rate(&self, now: Instant) -> f64 {
        self.fold(now);
        f64::from_bits(self.rate.load(Ordering::Relaxed))
    }

    fn fold(&self, now: Instant) {
        let at = u64::try_from(now.saturating_duration_since(self.base).as_micros()).unwrap_or(u64::MAX - 1) + 1;
        let start = self.window_start.load(Ordering::Acquire);
        if start == 0 {
            let _ = self.window_start.compare_exchange(0, at, Ordering::AcqRel, Ordering::Relaxed);
            return;
        }
        let elapsed = Duration::from_micros(at.saturating_sub(start));
        if elapsed < RATE_WINDOW {
            return;
        }
        // One closer per window.
        if self.window_start.compare_exchange(start, at, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return;
        }
        let rows = self.window_rows.swap(0, Ordering::AcqRel);
        let seconds = elapsed.as_secs_f64();
        let sample = rows as f64 / seconds;
        let weight = 1.0 - (-seconds / RATE_TIME_CONSTANT.as_secs_f64()).exp();
        let rate = f64::from_bits(self.rate.load(Ordering::Relaxed));
        self.rate.store((rate + weight * (sample - rate)).to_bits(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model that takes `fixed_ms` + `per_row_ms` per row, measured at
    /// a few sizes.
    fn curve(fixed_ms: f64, per_row_ms: f64) -> CurveSnapshot {
        let points: Vec<(usize, f64)> =
            [1, 2, 4, 8, 16, 32, 64, 128].iter().map(|&n| (n, (fixed_ms + per_row_ms * n as f64) / 1e3)).collect();
        CurveSnapshot::from_points(&points)
    }

    fn policy(target_ms: u64, max_batch_size: usize, threads: usize) -> AutoPolicy {
        let params =
            BatchingParameters { latency_target_ms: Some(target_ms), max_batch_size, ..BatchingParameters::auto() };
        AutoPolicy::new(&params, threads)
    }

    /// Feeds `rate` rows per second, one row at a time, for `span`.
    async fn feed(policy: &AutoPolicy, rate: f64, span: Duration) {
        let gap = Duration::from_secs_f64(1.0 / rate);
        let end = Instant::now() + span;
        while Instant::now() < end {
            policy.arrived(Instant::now(), 1);
            tokio::time::advance(gap).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn sparse_traffic_never_waits() {
        let policy = policy(10, 32, 1);
        let curve = curve(1.0, 0.1);
        feed(&policy, 20.0, Duration::from_secs(2)).await;
        let now = Instant::now();
        let plan = policy.plan(&curve, now, now, 1);
        assert_eq!(plan.want, 1, "{plan:?}");
        assert_eq!(plan.close_at, now, "{plan:?}");
        // Nothing measured yet: nothing waits either.
        let plan = policy.plan(&CurveSnapshot::default(), now, now, 1);
        assert_eq!(plan.close_at, now);
    }

    #[tokio::test(start_paused = true)]
    async fn batches_grow_with_load_until_the_target_binds() {
        let policy = policy(10, 64, 1);
        let curve = curve(1.0, 0.1);
        // 500 rows/s: single rows keep up (909/s), nothing waits.
        feed(&policy, 500.0, Duration::from_secs(1)).await;
        let now = Instant::now();
        assert_eq!(policy.plan(&curve, now, now, 1).close_at, now);
        let mut last = 1;
        for rate in [2000.0, 3000.0, 3500.0] {
            feed(&policy, rate, Duration::from_secs(1)).await;
            let now = Instant::now();
            let plan = policy.plan(&curve, now, now, 1);
            assert!(plan.want > last, "at {rate} rows/s: {plan:?} (before: {last})");
            // It keeps up: want rows per run of the model.
            let seconds = (1.0 + 0.1 * plan.want as f64) / 1e3;
            assert!(plan.want as f64 / seconds >= rate * 0.9, "at {rate}: {plan:?}");
            assert!(plan.close_at > now && plan.close_at <= now + Duration::from_millis(10), "{plan:?}");
            last = plan.want;
        }
        // 1 ms + 0.1 ms/row within half of 10 ms: at most 40 rows.
        assert_eq!(policy.plan(&curve, Instant::now(), Instant::now(), 1).cap, 40);
        // Beyond what the model can do within the target (8000 rows/s at
        // 40 rows): the biggest batch the target allows, and no more.
        let policy = self::policy(10, 256, 1);
        feed(&policy, 20_000.0, Duration::from_secs(1)).await;
        let now = Instant::now();
        let plan = policy.plan(&curve, now, now, 1);
        assert_eq!((plan.want, plan.cap), (40, 40), "{plan:?}");
        // With a backlog it may take what runs within the whole target.
        assert_eq!(plan.backlog_cap, 90, "{plan:?}");
        // A backlog whose oldest request is already late still runs the
        // biggest batches: smaller ones would drain it more slowly.
        let plan = policy.plan(&curve, now, now - Duration::from_millis(30), 1);
        assert_eq!((plan.cap, plan.close_at), (40, now), "{plan:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_step_in_load_is_followed_within_a_second() {
        let policy = policy(10, 64, 1);
        let curve = curve(1.0, 0.1);
        feed(&policy, 200.0, Duration::from_secs(2)).await;
        let before = policy.plan(&curve, Instant::now(), Instant::now(), 1).want;
        assert_eq!(before, 1);
        feed(&policy, 5000.0, Duration::from_millis(750)).await;
        let rate = policy.rate(Instant::now());
        assert!(rate > 0.9 * 5000.0, "{rate}");
        let after = policy.plan(&curve, Instant::now(), Instant::now(), 1).want;
        assert!(after >= 5, "{after}");
        // And back down.
        feed(&policy, 200.0, Duration::from_millis(1500)).await;
        assert_eq!(policy.plan(&curve, Instant::now(), Instant::now(), 1).want, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slower_model_gets_smaller_batches() {
        let policy = policy(10, 64, 1);
        feed(&policy, 20_000.0, Duration::from_secs(1)).await;
        let now = Instant::now();
        let fast = policy.plan(&curve(1.0, 0.1), now, now, 1);
        let slow = policy.plan(&curve(1.0, 0.4), now, now, 1);
        assert_eq!(fast.cap, 40);
        // 1 ms + 0.4 ms/row within half of 10 ms: 10 rows.
        assert_eq!(slow.cap, 10, "{slow:?}");
        // The learned curve moves as runs slow down.
        let learned = LatencyCurve::new();
        for &n in &[1usize, 8, 32] {
            learned.seed(n, (1.0 + 0.1 * n as f64) / 1e3);
        }
        assert_eq!(policy.plan(&learned.snapshot(), now, now, 1).cap, 40);
        for _ in 0..30 {
            for n in [8usize, 32] {
                learned.record(n, (1.0 + 0.4 * n as f64) / 1e3);
            }
        }
        let shrunk = policy.plan(&learned.snapshot(), now, now, 1);
        assert!(shrunk.cap <= 12, "{shrunk:?}");
    }

    proptest::proptest! {
        /// Whatever the curve, the rate and the batch's age, a plan is
        /// coherent: it wants at least a row and no more than it may take,
        /// takes no more than the maximum (or what the batch already
        /// holds), and closes between now and one target from now.
        #[test]
        fn every_plan_is_coherent(
            points in proptest::collection::vec((1usize..600, 1e-6f64..1.0), 0..12),
            max_batch_size in 1usize..512,
            target_ms in 1u64..1000,
            threads in 1usize..8,
            held in 1usize..512,
            gap_us in 1u64..100_000,
            arrivals in 0usize..50,
            age_ms in 0u64..2000,
        ) {
            let params = BatchingParameters {
                latency_target_ms: Some(target_ms),
                max_batch_size,
                ..BatchingParameters::auto()
            };
            let policy = AutoPolicy::new(&params, threads);
            let start = Instant::now();
            let mut now = start;
            for _ in 0..arrivals {
                policy.arrived(now, 1);
                now += Duration::from_micros(gap_us);
            }
            let curve = CurveSnapshot::from_points(&points);
            let rows = held.min(max_batch_size);
            let oldest = now.checked_sub(Duration::from_millis(age_ms)).unwrap_or(start);
            let plan = policy.plan(&curve, now, oldest, rows);
            proptest::prop_assert!(plan.want >= 1 && plan.want <= plan.cap, "{plan:?}");
            proptest::prop_assert!(plan.cap <= plan.backlog_cap && plan.backlog_cap <= max_batch_size, "{plan:?}");
            proptest::prop_assert!(plan.cap >= rows, "{plan:?}");
            proptest::prop_assert!(plan.close_at >= now, "{plan:?}");
            proptest::prop_assert!(plan.close_at <= now + Duration::from_millis(target_ms), "{plan:?}");
        }
    }

    #[test]
    fn bisections_find_the_edges() {
        assert_eq!(largest(1, 100, |n| n <= 37), Some(37));
        assert_eq!(largest(1, 100, |_| true), Some(100));
        assert_eq!(largest(1, 100, |_| false), None);
        assert_eq!(smallest(1, 100, |n| n >= 37), Some(37));
        assert_eq!(smallest(1, 100, |_| true), Some(1));
        assert_eq!(smallest(1, 100, |_| false), None);
    }
}
