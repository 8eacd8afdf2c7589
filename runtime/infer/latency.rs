//! What one model version's runs cost at each batch size: seeded by its
//! warmup, then learned from every batch it runs. The auto batcher plans
//! with it (`pipeline/batcher/auto.rs`); `/metrics` shows it.
//!
//! Each batch size run so far keeps a moving average of its run time;
//! sizes not run yet are estimated from their neighbours (linearly between
//! two, and with no further gain per row beyond the largest), so a plan
//! can weigh any size before the model has run it. The estimate never
//! falls as the size grows: noise that says a larger batch is faster than
//! a smaller one is ignored, which keeps the curve safe to search.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

/// How much one new run moves a size's average: about the last ten runs
/// count, so a change in the model's speed shows within a few batches.
const WEIGHT: f64 = 0.2;

/// The learned curve of one model version.
#[derive(Debug, Default)]
pub struct LatencyCurve {
    /// Batch size (rows run, padding included) → seconds per run.
    points: Mutex<BTreeMap<usize, f64>>,
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
        if rows == 0 || !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        let mut points = self.points.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        points.entry(rows).and_modify(|average| *average += WEIGHT * (seconds - *average)).or_insert(seconds);
        self.published.store(Arc::new(monotone(&points)));
    }

    /// A warmup run of `rows` rows took `seconds`. Warmup runs each size
    /// more than once and the first run of a shape pays for ONNX Runtime's
    /// lazy set-up, so the fastest warmup run is the one kept.
    pub fn seed(&self, rows: usize, seconds: f64) {
        if rows == 0 || !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        let mut points = self.points.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        points.entry(rows).and_modify(|best| *best = best.min(seconds)).or_insert(seconds);
        self.published.store(Arc::new(monotone(&points)));
    }

    /// The curve as of the last run.
    pub fn snapshot(&self) -> Arc<CurveSnapshot> {
        self.published.load_full()
    }
}

/// The points, each raised to the highest time of any smaller size.
fn monotone(points: &BTreeMap<usize, f64>) -> CurveSnapshot {
    let mut highest = 0.0f64;
    let points = points
        .iter()
        .map(|(&rows, &seconds)| {
            highest = highest.max(seconds);
            (rows, highest)
        })
        .collect();
    CurveSnapshot { points }
}

/// A copy of a [`LatencyCurve`], non-decreasing in the batch size.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CurveSnapshot {
    points: Vec<(usize, f64)>,
}

impl CurveSnapshot {
    /// A snapshot of the given (size, seconds) points, for tests and tools.
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
            // Larger than anything run: no cheaper per row than the largest.
            (Some(&(size, seconds)), None) => Some(seconds * rows as f64 / size as f64),
            (None, None) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_interpolate_and_extrapolate_conservatively() {
        let curve = CurveSnapshot::from_points(&[(2, 0.002), (8, 0.005)]);
        assert_eq!(curve.estimate(2), Some(0.002));
        assert_eq!(curve.estimate(1), Some(0.002));
        assert!((curve.estimate(4).unwrap() - 0.003).abs() < 1e-12);
        assert!((curve.estimate(16).unwrap() - 0.010).abs() < 1e-12);
        assert_eq!(CurveSnapshot::default().estimate(4), None);
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
    fn a_larger_batch_is_never_estimated_faster() {
        let curve = CurveSnapshot::from_points(&[(1, 0.003), (4, 0.001), (8, 0.004)]);
        assert_eq!(curve.estimate(4), Some(0.003));
        assert!(curve.estimate(2).unwrap() >= curve.estimate(1).unwrap());
    }
}
