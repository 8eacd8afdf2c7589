//! A plugin canary: a second version of a stage's plugin serving a share of
//! its calls, each side's calls counted, and the judgement that rolls the
//! canary back when it does worse than the stable version.
//!
//! A call is dealt to a side by the request's canary key when the pipeline
//! names one (`canary_key`: the same key value always lands on the same
//! side, on every replica, as the hash has fixed keys), otherwise at random.
//!
//! The judge keeps each side's last `window_requests` calls (outcome and
//! time). Once the canary's window is full, after each canary call, its
//! error rate is compared with the stable side's and its p99 with the
//! stable p99 (both above `p99_floor_ms`); past either margin it fails.
//! It fails earlier when its errors alone already exceed what a full window
//! could hold within the margin, so a version that fails every call is
//! stopped after a handful of calls, not a window of them.

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;

use crate::config::CanaryPolicy;
use crate::metrics::{CanaryLabels, Metrics};
use crate::plugin::Plugin;
use crate::tensor::{NamedTensor, TensorData};

/// Shares are dealt in ten-thousandths (0.01 percent).
const SHARE_SCALE: u32 = 10_000;

/// A canary version running beside a stage's stable one.
pub struct Canary {
    /// The canary's plugin (this stage's own instances of it).
    pub plugin: Arc<Plugin>,
    /// Its registry version.
    pub version: u32,
    /// The percent of calls it gets.
    pub percent: f64,
    share: u32,
    judge: Mutex<Judge>,
    counts: [SideCounts; 2],
}

/// Which side a call was dealt to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The active version.
    Stable = 0,
    /// The canary version.
    Canary = 1,
}

struct SideCounts {
    ok: Counter,
    error: Counter,
}

/// Why a canary failed its judgement.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict(pub String);

impl Canary {
    /// A canary of `plugin` (registry `version`) taking `percent` of the
    /// calls of `pipeline`'s stage, whose stable side runs `stable`; its
    /// calls are counted in `sluice_canary_calls`.
    pub fn new(
        plugin: Arc<Plugin>,
        version: u32,
        percent: f64,
        stable: u32,
        names: (&str, &str),
        policy: &CanaryPolicy,
        metrics: &Metrics,
    ) -> Canary {
        let (pipeline, name) = names;
        let side = |side: &'static str, version: u32| {
            let counter = |outcome| {
                metrics.canary_calls.get_or_create_owned(&CanaryLabels {
                    pipeline: pipeline.to_string(),
                    plugin: name.to_string(),
                    version: version.to_string(),
                    side,
                    outcome,
                })
            };
            SideCounts { ok: counter("ok"), error: counter("error") }
        };
        Canary {
            plugin,
            version,
            percent,
            share: share_of(percent),
            judge: Mutex::new(Judge::new(policy)),
            counts: [side("stable", stable), side("canary", version)],
        }
    }

    /// The side a call goes to: by the hash of `key`'s values when the
    /// request has that input, else at random.
    pub fn deal(&self, inputs: &[NamedTensor], key: Option<&str>) -> Side {
        let point = key
            .and_then(|key| inputs.iter().find(|t| t.name == key))
            .map_or_else(|| rand::random::<u32>() % SHARE_SCALE, sticky_point);
        if point < self.share {
            Side::Canary
        } else {
            Side::Stable
        }
    }

    /// Records one call's outcome on `side`; answers the verdict when the
    /// canary has just failed its judgement.
    pub fn record(&self, side: Side, ok: bool, took: Duration) -> Option<Verdict> {
        let counts = &self.counts[side as usize];
        if ok { &counts.ok } else { &counts.error }.inc();
        let mut judge = self.judge.lock().unwrap_or_else(PoisonError::into_inner);
        judge.record(side, ok, took);
        if side == Side::Canary {
            judge.verdict()
        } else {
            None
        }
    }
}

/// `percent` in ten-thousandths of the calls.
fn share_of(percent: f64) -> u32 {
    ((percent * f64::from(SHARE_SCALE) / 100.0).round() as u32).min(SHARE_SCALE)
}

/// Where a key lands in `0..SHARE_SCALE`: the same for the same values,
/// on every replica (fixed hash keys).
fn sticky_point(key: &NamedTensor) -> u32 {
    #[allow(deprecated)]
    let mut hasher = std::hash::SipHasher::new();
    match key.tensor.data() {
        TensorData::Fixed(bytes) => bytes[..].hash(&mut hasher),
        TensorData::Strings(strings) => strings.iter().for_each(|s| s[..].hash(&mut hasher)),
    }
    (hasher.finish() % u64::from(SHARE_SCALE)) as u32
}

/// Each side's recent calls, and the margins.
struct Judge {
    window: usize,
    max_error_rate_increase: f64,
    max_p99_ratio: f64,
    p99_floor: Duration,
    sides: [Window; 2],
}

#[derive(Default)]
struct Window {
    calls: VecDeque<(bool, Duration)>,
    errors: usize,
}

impl Window {
    fn push(&mut self, ok: bool, took: Duration, cap: usize) {
        if self.calls.len() == cap {
            if let Some((false, _)) = self.calls.pop_front() {
                self.errors -= 1;
            }
        }
        self.calls.push_back((ok, took));
        if !ok {
            self.errors += 1;
        }
    }

    fn error_rate(&self) -> f64 {
        if self.calls.is_empty() {
            return 0.0;
        }
        self.errors as f64 / self.calls.len() as f64
    }

    fn p99(&self) -> Duration {
        let mut times: Vec<Duration> = self.calls.iter().map(|&(_, took)| took).collect();
        if times.is_empty() {
            return Duration::ZERO;
        }
        let at = (times.len() * 99).div_ceil(100).saturating_sub(1);
        *times.select_nth_unstable(at).1
    }
}

impl Judge {
    fn new(policy: &CanaryPolicy) -> Judge {
        Judge {
            window: policy.window_requests.max(1),
            max_error_rate_increase: policy.max_error_rate_increase,
            max_p99_ratio: policy.max_p99_ratio,
            p99_floor: Duration::from_secs_f64(policy.p99_floor_ms / 1000.0),
            sides: [Window::default(), Window::default()],
        }
    }

    fn record(&mut self, side: Side, ok: bool, took: Duration) {
        self.sides[side as usize].push(ok, took, self.window);
    }

    fn verdict(&self) -> Option<Verdict> {
        let [stable, canary] = &self.sides;
        let allowed = stable.error_rate() + self.max_error_rate_increase;
        // More errors than a full window could hold within the margin:
        // no need to wait for the window.
        if canary.errors as f64 > allowed * self.window as f64 {
            return Some(self.error_verdict(canary, stable));
        }
        if canary.calls.len() < self.window {
            return None;
        }
        if canary.error_rate() > allowed {
            return Some(self.error_verdict(canary, stable));
        }
        let (canary_p99, stable_p99) = (canary.p99(), stable.p99());
        if canary_p99 > self.p99_floor
            && !stable.calls.is_empty()
            && canary_p99.as_secs_f64() > stable_p99.max(self.p99_floor).as_secs_f64() * self.max_p99_ratio
        {
            return Some(Verdict(format!(
                "its p99 call time {:.2} ms over its last {} calls is more than {}x the stable version's {:.2} ms",
                canary_p99.as_secs_f64() * 1000.0,
                canary.calls.len(),
                self.max_p99_ratio,
                stable_p99.as_secs_f64() * 1000.0
            )));
        }
        None
    }

    fn error_verdict(&self, canary: &Window, stable: &Window) -> Verdict {
        Verdict(format!(
            "{} of its last {} calls failed ({:.1}%), against {:.1}% of the stable version's last {}; the margin \
             is {:.1} points",
            canary.errors,
            canary.calls.len(),
            canary.error_rate() * 100.0,
            stable.error_rate() * 100.0,
            stable.calls.len(),
            self.max_error_rate_increase * 100.0
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Tensor;

    fn judge(window: usize) -> Judge {
        Judge::new(&CanaryPolicy {
            window_requests: window,
            max_error_rate_increase: 0.05,
            max_p99_ratio: 2.0,
            p99_floor_ms: 1.0,
        })
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_failing_canary_is_stopped_within_the_errors_a_window_allows() {
        let mut j = judge(100);
        for _ in 0..200 {
            j.record(Side::Stable, true, MS);
        }
        let mut failed = 0;
        loop {
            j.record(Side::Canary, false, MS);
            failed += 1;
            if let Some(Verdict(why)) = j.verdict() {
                assert!(why.contains("6 of its last 6 calls failed"), "{why}");
                break;
            }
            assert!(failed < 100, "never rolled back");
        }
        assert_eq!(failed, 6, "5% of a window of 100 is 5 errors allowed");
    }

    #[test]
    fn a_canary_as_good_as_stable_is_kept_and_a_slow_one_is_not() {
        let mut j = judge(50);
        for i in 0..500 {
            j.record(Side::Stable, i % 50 != 0, 3 * MS);
            j.record(Side::Canary, i % 50 != 1, 3 * MS);
            assert_eq!(j.verdict(), None, "call {i}");
        }
        for _ in 0..50 {
            j.record(Side::Canary, true, 10 * MS);
        }
        let why = j.verdict().expect("a canary 3x slower fails").0;
        assert!(why.contains("p99 call time 10.00 ms"), "{why}");
    }

    #[test]
    fn fast_calls_below_the_floor_are_not_compared() {
        let mut j = judge(10);
        for _ in 0..10 {
            j.record(Side::Stable, true, Duration::from_micros(20));
            j.record(Side::Canary, true, Duration::from_micros(200));
        }
        assert_eq!(j.verdict(), None);
    }

    #[test]
    fn keys_deal_the_same_side_every_time_and_shares_hold() {
        let plugin_free_share = share_of(5.0);
        assert_eq!(plugin_free_share, 500);
        let key = |id: i64| NamedTensor::new("user", Tensor::from_values(vec![1], &[id]));
        let canary = (0..10_000).filter(|&id| sticky_point(&key(id)) < plugin_free_share).count();
        assert!((400..=600).contains(&canary), "{canary} of 10000 keys");
        assert_eq!(sticky_point(&key(42)), sticky_point(&key(42)));
    }
}
