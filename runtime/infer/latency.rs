//! What one model version's runs cost at each batch size: seeded by its
//! warmup, then learned from every batch it runs. The auto batcher plans
//! with it (`pipeline/batcher/plan.rs`); `/metrics` shows it.
//!
//! Each batch size run so far keeps a moving average of its run time, and
//! sizes between two measured ones are interpolated: the curve keeps what
//! the model really does, including batches that get dearer per row past
//! some size (a CNN whose activations outgrow the cache does). A size not
//! run for many batches is forgotten, so one slow run under a burst of
//! contention cannot pin the estimate forever. Beyond the largest size
//! remembered, the cost grows by the cost per row of a straight line
//! fitted through the recent sizes: an optimistic guess, which lets the
//! batcher try a larger size and learn what it really costs.
//! The estimate never falls as the size grows.
//!
//! The snapshot also names the most efficient size: the smallest whose
//! rows per second are within 3 % of the best measured while serving (or
//! of the next size to try, twice the largest served). Larger batches
//! than that only add latency.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

/// How much one new run moves its size's average: about the last ten
/// runs of that size count.
const WEIGHT: f64 = 0.2;

/// How many runs a size's point keeps its weight in the fitted line: a
/// size last run this many batches ago counts 1/e as much as one run now.
const RECENCY_RUNS: f64 = 200.0;

/// A size not run for this many batches is forgotten (while two others
/// are remembered).
const FORGET_AFTER_RUNS: u64 = 1000;

/// Sizes within this share of the best rows per second count as the best.
const EFFICIENT_WITHIN: f64 = 0.97;

/// Below this weight in all, a fitted line is not trusted.
const MIN_FIT_WEIGHT: f64 = 0.05;

#[derive(Debug, Clone, Copy)]
struct Point {
    seconds: f64,
    /// The run count when this size last ran.
    last_run: u64,
    /// Whether it ran while serving, not only in warmup.
    served: bool,
}

#[derive(Debug, Default)]
struct Points {
    by_size: BTreeMap<usize, Point>,
    runs: u64,
}

/// The learned curve of one model version.
#[derive(Debug, Default)]
pub struct LatencyCurve {
    points: Mutex<Points>,
    /// The curve as of the last run, published for planners to read
    /// without a lock or a copy (one copy per batch, none per request).
    published: ArcSwap<CurveSnapshot>,
}

impl LatencyCurve {
    /// An empty curve: nothing known until warmup or the first run.
    pub fn new() -> LatencyCurve {
        LatencyCurve::default()
    }

    /// A run of `rows` rows took `seconds`.
    pub fn record(&self, rows: usize, seconds: f64) {
        self.update(rows, seconds, true, |average| *average += WEIGHT * (seconds - *average));
    }

    /// A warmup run of `rows` rows took `seconds`. Warmup runs each size
    /// more than once and the first run of a shape pays for ONNX Runtime's
    /// lazy set-up, so the fastest warmup run is the one kept.
    pub fn seed(&self, rows: usize, seconds: f64) {
        self.update(rows, seconds, false, |best| *best = best.min(seconds));
    }

    fn update(&self, rows: usize, seconds: f64, served: bool, merge: impl FnOnce(&mut f64)) {
        if rows == 0 || !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        let mut points = self.points.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        points.runs += 1;
        let now = points.runs;
        points
            .by_size
            .entry(rows)
            .and_modify(|point| {
                merge(&mut point.seconds);
                point.last_run = now;
                point.served |= served;
            })
            .or_insert(Point { seconds, last_run: now, served });
        self.published.store(Arc::new(CurveSnapshot::of(&points)));
    }

    /// The curve as of the last run.
    pub fn snapshot(&self) -> Arc<CurveSnapshot> {
        self.published.load_full()
    }
}

/// A copy of a [`LatencyCurve`] to plan with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CurveSnapshot {
    /// Each remembered size's average, raised to the highest of any
    /// smaller size, so that it never falls as the size grows.
    points: Vec<(usize, f64)>,
    /// Seconds per row beyond the largest remembered size.
    per_row: Option<f64>,
    /// The most efficient batch size; 0 while nothing is known.
    efficient_rows: usize,
}

impl CurveSnapshot {
    fn of(points: &Points) -> CurveSnapshot {
        let fresh = |point: &Point| points.runs.saturating_sub(point.last_run) <= FORGET_AFTER_RUNS;
        let remembered = points.by_size.values().filter(|p| fresh(p)).count();
        let mut highest = 0.0f64;
        let monotone = points
            .by_size
            .iter()
            .filter(|(_, point)| remembered < 2 || fresh(point))
            .map(|(&rows, point)| {
                highest = highest.max(point.seconds);
                (rows, highest)
            })
            .collect();
        let mut snapshot = CurveSnapshot { points: monotone, per_row: fitted_per_row(points), efficient_rows: 0 };
        let served: Vec<usize> =
            points.by_size.iter().filter(|(_, p)| p.served && fresh(p)).map(|(&rows, _)| rows).collect();
        snapshot.efficient_rows = snapshot.most_efficient(&served);
        snapshot
    }

    /// The smallest size whose rows per second are within
    /// [`EFFICIENT_WITHIN`] of the best among `sizes` (recently served
    /// sizes) and the next size to try. Warmup's figures alone do not
    /// decide it: taken while every model warms up at once, they can make
    /// batching look useless; so it takes two sizes seen while serving.
    fn most_efficient(&self, sizes: &[usize]) -> usize {
        let (Some(&largest), true) = (sizes.last(), sizes.len() >= 2) else { return 0 };
        let candidates = sizes.iter().copied().chain(std::iter::once(largest.saturating_mul(2)));
        let rate = |rows: usize| self.estimate(rows).map_or(0.0, |s| if s > 0.0 { rows as f64 / s } else { f64::MAX });
        let best = candidates.clone().map(rate).fold(0.0, f64::max);
        candidates.filter(|&rows| rate(rows) >= EFFICIENT_WITHIN * best).min().unwrap_or(largest)
    }

    /// The most efficient batch size (see the module's documentation);
    /// `None` until two sizes have run while serving.
    pub fn efficient_rows(&self) -> Option<usize> {
        (self.efficient_rows > 0).then_some(self.efficient_rows)
    }

    /// A snapshot of (size, seconds) points, all equally recent, for tests
    /// and tools.
    pub fn from_points(points: &[(usize, f64)]) -> CurveSnapshot {
        let curve = LatencyCurve::new();
        for &(rows, seconds) in points {
            curve.record(rows, seconds);
        }
        CurveSnapshot::clone(&curve.snapshot())
    }

    /// True before any run was seen.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// The sizes measured and their seconds per run.
    pub fn points(&self) -> &[(usize, f64)] {
        &self.points
    }

    /// Seconds a run of `rows` rows is expected to take; `None` while
    /// nothing is known.
    pub fn estimate(&self, rows: usize) -> Option<f64> {
        let at = self.points.partition_point(|&(size, _)| size < rows);
        match (at.checked_sub(1).and_then(|below| self.points.get(below)), self.points.get(at)) {
            (_, Some(&(size, seconds))) if size == rows => Some(seconds),
            // Smaller than anything run: no faster than the smallest.
            (None, Some(&(_, seconds))) => Some(seconds),
            (Some(&(low, low_s)), Some(&(high, high_s))) => {
                let t = (rows - low) as f64 / (high - low) as f64;
                Some(low_s + t * (high_s - low_s))
            }
            // Larger than anything remembered: along the fitted line's
            // slope, or, without one, no cheaper per row than the largest.
            (Some(&(size, seconds)), None) => Some(match self.per_row {
                Some(per_row) => seconds + per_row * (rows - size) as f64,
                None => seconds * rows as f64 / size as f64,
            }),
            (None, None) => None,
        }
    }
}

/// The slope (seconds per row, at least 0) of the weighted least-squares
/// line through the points, weights falling with how long ago each size
/// ran; `None` without two recent sizes.
fn fitted_per_row(points: &Points) -> Option<f64> {
    let (mut w, mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for (&rows, point) in &points.by_size {
        let age = points.runs.saturating_sub(point.last_run) as f64;
        let weight = (-age / RECENCY_RUNS).exp();
        let x = rows as f64;
        w += weight;
        sx += weight * x;
        sy += weight * point.seconds;
        sxx += weight * x * x;
        sxy += weight * x * point.seconds;
    }
    if points.by_size.len() < 2 || w < MIN_FIT_WEIGHT {
        return None;
    }
    let (mean_x, mean_y) = (sx / w, sy / w);
    let variance = sxx / w - mean_x * mean_x;
    // All the weight on one size: no slope to be learned from the points.
    if variance < 0.25 {
        return None;
    }
    Some(((sxy / w - mean_x * mean_y) / variance).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_interpolate_and_extend_along_the_line() {
        let curve = CurveSnapshot::from_points(&[(2, 0.002), (8, 0.005)]);
        assert!((curve.estimate(2).unwrap() - 0.002).abs() < 1e-9);
        assert!((curve.estimate(4).unwrap() - 0.003).abs() < 1e-9);
        assert!((curve.estimate(16).unwrap() - 0.009).abs() < 1e-9);
        assert_eq!(curve.estimate(1), Some(0.002));
        assert_eq!(CurveSnapshot::default().estimate(4), None);
        // One size only: no cheaper per row beyond it.
        let one = CurveSnapshot::from_points(&[(8, 0.004)]);
        assert!((one.estimate(16).unwrap() - 0.008).abs() < 1e-12);
    }

    #[test]
    fn runs_move_the_average_and_warmup_keeps_the_fastest() {
        let curve = LatencyCurve::new();
        curve.seed(4, 0.010);
        curve.seed(4, 0.004);
        curve.seed(4, 0.006);
        assert_eq!(curve.snapshot().estimate(4), Some(0.004));
        for _ in 0..40 {
            curve.record(4, 0.008);
        }
        let now = curve.snapshot().estimate(4).unwrap();
        assert!((now - 0.008).abs() < 1e-4, "{now}");
    }

    #[test]
    fn a_size_not_run_for_long_stops_pinning_the_estimate() {
        let curve = LatencyCurve::new();
        // Warmup: 1 ms + 0.1 ms per row.
        for n in [1usize, 2, 4, 8, 16, 32] {
            curve.seed(n, 1e-3 + 1e-4 * n as f64);
        }
        // One batch of 32 under heavy contention, then it is not chosen again.
        curve.record(32, 0.050);
        let pinned = curve.snapshot().estimate(32).unwrap();
        for _ in 0..1000 {
            for n in [1usize, 4, 8] {
                curve.record(n, 1e-3 + 1e-4 * n as f64);
            }
        }
        let now = curve.snapshot().estimate(32).unwrap();
        assert!(now < pinned && (now - 4.2e-3).abs() < 0.5e-3, "{pinned} then {now}");
    }

    #[test]
    fn the_efficient_size_is_where_rows_per_second_stop_growing() {
        // Linear: each size is more efficient than the last; the next to
        // try is twice the largest.
        let linear = CurveSnapshot::from_points(&[(1, 0.001), (8, 0.0015), (16, 0.002)]);
        assert_eq!(linear.efficient_rows(), Some(32));
        // Dearer per row past 8 rows (a cache outgrown): 8 is the size.
        let knee = CurveSnapshot::from_points(&[(1, 0.001), (4, 0.0012), (8, 0.0018), (16, 0.0050), (32, 0.012)]);
        assert_eq!(knee.efficient_rows(), Some(8));
        assert_eq!(CurveSnapshot::default().efficient_rows(), None);
    }

    #[test]
    fn a_larger_batch_is_never_estimated_faster() {
        let curve = CurveSnapshot::from_points(&[(1, 0.003), (4, 0.001), (8, 0.004)]);
        for n in 1..16 {
            assert!(curve.estimate(n + 1).unwrap() >= curve.estimate(n).unwrap(), "{n}");
        }
    }
}
