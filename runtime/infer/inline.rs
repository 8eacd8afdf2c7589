//! The rule for running a batch on the thread that decoded its request
//! instead of handing it to an inference thread: only when the backend's
//! own measurements say the run costs less than a budget
//! (`server.inline_inference_micros`).
//!
//! A hand-off to an inference thread and back costs two thread wake-ups,
//! each tens of microseconds of CPU on a virtual machine, several times
//! what a small model's `Session::run` costs. Running such a model inline
//! removes both, at the price of holding a network thread for the run; the
//! budget is that price, made explicit: anything dearer, or not yet
//! measured, runs on the inference threads as before.
//!
//! [`RunCosts`] keeps what a run of each size class (1, 2, 3–4, 5–8, …
//! input elements, padding included: what a run's cost grows with, where
//! rows would let a one-row request of millions of elements pass for a
//! cheap one) took on whichever thread ran it: the model's compute alone,
//! without the queueing and wake-ups that the batcher's latency curve
//! includes. It is read and written on every request, so it is a row of
//! atomics, with no lock and no allocation; two racing updates lose one
//! sample, which a moving average does not miss.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Size classes: 1, 2, 3–4, …, 2^38+1–2^39 elements, and everything
/// larger (more than any tensor the server accepts).
const CLASSES: usize = 41;

/// How much one run moves its class's average: about the last ten count.
const WEIGHT: f64 = 0.2;

/// Moving averages of run time per size class.
#[derive(Debug)]
pub struct RunCosts {
    /// Seconds as `f64` bits; 0 while the class has not run.
    seconds: [AtomicU64; CLASSES],
}

impl Default for RunCosts {
    fn default() -> Self {
        RunCosts { seconds: std::array::from_fn(|_| AtomicU64::new(0)) }
    }
}

fn class(elements: usize) -> usize {
    let bits = (usize::BITS - elements.max(1).saturating_sub(1).leading_zeros()) as usize;
    bits.min(CLASSES - 1)
}

impl RunCosts {
    /// A run of `elements` input elements took `seconds`.
    pub fn record(&self, elements: usize, seconds: f64) {
        if !seconds.is_finite() || seconds <= 0.0 {
            return;
        }
        let slot = &self.seconds[class(elements)];
        let average = f64::from_bits(slot.load(Ordering::Relaxed));
        let next = if average > 0.0 { average + WEIGHT * (seconds - average) } else { seconds };
        slot.store(next.to_bits(), Ordering::Relaxed);
    }

    /// What a run of `elements` input elements costs, as measured; `None`
    /// before its size class has run.
    pub fn estimate(&self, elements: usize) -> Option<f64> {
        let seconds = f64::from_bits(self.seconds[class(elements)].load(Ordering::Relaxed));
        (seconds > 0.0).then_some(seconds)
    }
}

/// Whether a batch may run on the caller's thread.
#[derive(Debug, Default)]
pub struct InlineRule {
    /// The most a run may cost to run inline, in seconds; 0: never.
    budget: f64,
    costs: RunCosts,
}

impl InlineRule {
    /// Batches measured to cost at most `budget` run inline; a zero
    /// budget turns inline runs off.
    pub fn new(budget: Duration) -> InlineRule {
        InlineRule { budget: budget.as_secs_f64(), costs: RunCosts::default() }
    }

    /// Whether a batch of `elements` input elements is measured to cost
    /// no more than the budget. A size never run is not known to be cheap.
    pub fn allows(&self, elements: usize) -> bool {
        self.budget > 0.0 && self.costs.estimate(elements).is_some_and(|seconds| seconds <= self.budget)
    }

    /// A run of `elements` input elements took `seconds`, on whichever
    /// thread.
    pub fn record(&self, elements: usize, seconds: f64) {
        self.costs.record(elements, seconds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_are_powers_of_two() {
        let classes: Vec<usize> = [0, 1, 2, 3, 4, 5, 8, 9, 16, 17, 1 << 16, (1 << 16) + 1, 1 << 40, usize::MAX]
            .into_iter()
            .map(class)
            .collect();
        assert_eq!(classes, vec![0, 0, 1, 2, 2, 3, 3, 4, 4, 5, 16, 17, 40, 40]);
    }

    #[test]
    fn a_wide_request_is_not_run_inline_on_what_a_narrow_one_cost() {
        let rule = InlineRule::new(Duration::from_micros(50));
        // `[1, 8]` floats: cheap.
        for _ in 0..10 {
            rule.record(8, 3e-6);
        }
        assert!(rule.allows(8));
        // `[1, 2_000_000]` (8 MB, under max_tensor_bytes): one row too,
        // but never measured, so it goes to the inference threads.
        assert!(!rule.allows(2_000_000));
        // Measured dear, it stays there.
        rule.record(2_000_000, 4e-3);
        assert!(!rule.allows(2_000_000));
        assert!(rule.allows(8));
    }

    #[test]
    fn only_sizes_measured_under_the_budget_run_inline() {
        let rule = InlineRule::new(Duration::from_micros(50));
        // Nothing measured yet: not inline.
        assert!(!rule.allows(1));
        rule.record(1, 4e-6);
        assert!(rule.allows(1));
        // Another size class has not run: not inline.
        assert!(!rule.allows(2));
        rule.record(32, 800e-6);
        assert!(!rule.allows(32));
        // 17..=32 share a class.
        assert!(!rule.allows(17));
    }

    #[test]
    fn a_model_that_slows_down_leaves_the_inline_path_and_a_fast_one_joins_it() {
        let rule = InlineRule::new(Duration::from_micros(50));
        // The first run of a shape pays for ONNX Runtime's lazy set-up.
        rule.record(1, 2e-3);
        assert!(!rule.allows(1));
        for _ in 0..30 {
            rule.record(1, 5e-6);
        }
        assert!(rule.allows(1));
        for _ in 0..5 {
            rule.record(1, 1e-3);
        }
        assert!(!rule.allows(1));
    }

    #[test]
    fn a_zero_budget_never_runs_inline() {
        let rule = InlineRule::new(Duration::ZERO);
        rule.record(1, 1e-9);
        assert!(!rule.allows(1));
    }
}
