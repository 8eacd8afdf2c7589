//! Traffic control settings: a pipeline's response cache (`cache`), its
//! rate quota (`quota`), and `[traffic]`: how request priorities share
//! admission, each team's quotas over all its pipelines, and when a canary
//! plugin version is rolled back on its own.
//!
//! What reads them: `pipeline::cache`, `pipeline::admission`,
//! `pipeline::stages::canary`.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{check_between, check_name, MAX_COUNT};
use crate::error::Invalid;
use crate::invalid;

/// A pipeline's (or a directly served model's) response cache: answers kept
/// by their inputs, so a repeated request skips the stages and the model.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheConfig {
    /// The most MiB the kept answers (and the inputs they are checked
    /// against) may take; the least used go first.
    #[serde(default = "default_cache_mib")]
    pub max_mib: u64,
    /// An answer is served from the cache for at most this long.
    #[serde(default = "default_cache_ttl")]
    pub ttl_secs: u64,
}

fn default_cache_mib() -> u64 {
    64
}

fn default_cache_ttl() -> u64 {
    300
}

/// The most MiB one cache may hold.
const MAX_CACHE_MIB: u64 = 1 << 20;

/// A week: longer is a config mistake, not a cache.
const MAX_CACHE_TTL_SECS: u64 = 7 * 24 * 3600;

impl CacheConfig {
    /// Checks the values; `key` names it in errors.
    pub fn check(&self, key: &str) -> Result<(), Invalid> {
        if self.max_mib == 0 || self.max_mib > MAX_CACHE_MIB {
            return Err(invalid!("{key}.max_mib = {}: must be between 1 and {MAX_CACHE_MIB}", self.max_mib));
        }
        if self.ttl_secs == 0 || self.ttl_secs > MAX_CACHE_TTL_SECS {
            return Err(invalid!("{key}.ttl_secs = {}: must be between 1 and {MAX_CACHE_TTL_SECS}", self.ttl_secs));
        }
        Ok(())
    }
}

/// A quota: how many requests per second, with what burst, and how many at
/// once. A request past it is refused with RESOURCE_EXHAUSTED naming it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaConfig {
    /// Requests admitted per second, on average.
    pub requests_per_second: Option<u32>,
    /// Requests admitted at once above the average rate (default: one
    /// second's worth).
    pub burst: Option<u32>,
    /// Requests admitted and not yet answered at once.
    pub max_in_flight: Option<usize>,
}

impl QuotaConfig {
    /// Checks the values; `key` names it in errors.
    pub fn check(&self, key: &str) -> Result<(), Invalid> {
        if self.requests_per_second.is_none() && self.max_in_flight.is_none() {
            return Err(invalid!("{key}: set requests_per_second, max_in_flight or both"));
        }
        if let Some(rate) = self.requests_per_second {
            check_between(&format!("{key}.requests_per_second"), rate as usize, 1, MAX_COUNT)?;
        }
        match (self.burst, self.requests_per_second) {
            (Some(_), None) => return Err(invalid!("{key}.burst is set without requests_per_second")),
            (Some(burst), Some(_)) => check_between(&format!("{key}.burst"), burst as usize, 1, MAX_COUNT)?,
            _ => {}
        }
        if let Some(max) = self.max_in_flight {
            check_between(&format!("{key}.max_in_flight"), max, 1, MAX_COUNT)?;
        }
        Ok(())
    }

    /// The burst: as configured, else one second's worth of requests.
    pub fn burst_or_default(&self) -> Option<u32> {
        self.requests_per_second.map(|rate| self.burst.unwrap_or(rate))
    }
}

/// A model version canary: requests that name no version (the latest) go to
/// the version `label` points at for `percent` of them, and the rest to the
/// version `stable` points at. Both are labels so that promotion is one
/// label move, and so that the rest never follows "the highest version",
/// which is the canary itself whenever the canary is the newer one.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelCanary {
    /// A `version_labels` name: the canary's version.
    pub label: String,
    /// The percent of versionless requests it gets, in (0, 100).
    pub percent: f64,
    /// A `version_labels` name: the version the other requests get.
    #[serde(default = "ModelCanary::default_stable")]
    pub stable: String,
}

impl ModelCanary {
    fn default_stable() -> String {
        "stable".into()
    }

    /// Checks it against the model's labels; `key` names it in errors.
    pub fn check(&self, key: &str, labels: &BTreeMap<String, i64>) -> Result<(), Invalid> {
        let known = || labels.keys().map(String::as_str).collect::<Vec<&str>>();
        if !labels.contains_key(&self.label) {
            return Err(invalid!("{key}.label = \"{}\": not among version_labels {:?}", self.label, known()));
        }
        if !labels.contains_key(&self.stable) {
            return Err(invalid!(
                "{key}.stable = \"{}\": not among version_labels {:?}; the requests the canary does not take go \
                 to the version this label names (set `stable` to another label to choose it)",
                self.stable,
                known()
            ));
        }
        if self.stable == self.label {
            return Err(invalid!(
                "{key}.stable = \"{}\": the same label as {key}.label; name the version the other requests get",
                self.stable
            ));
        }
        if !(self.percent > 0.0 && self.percent < 100.0) {
            return Err(invalid!("{key}.percent = {}: expected more than 0 and less than 100", self.percent));
        }
        Ok(())
    }
}

/// `[traffic]`: priorities, team quotas, canary rollbacks.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrafficConfig {
    /// The share of each admission's places kept for high-priority
    /// requests: normal and low ones are refused past the rest.
    #[serde(default)]
    pub high_priority_reserve: f64,
    /// The share of each admission's places low-priority requests may
    /// fill; the rest is kept for normal and high ones.
    #[serde(default = "default_low_share")]
    pub low_priority_share: f64,
    /// Each team's quota over all its pipelines (`[traffic.teams.NAME]`).
    #[serde(default)]
    pub teams: BTreeMap<String, QuotaConfig>,
    /// When a canary plugin version is rolled back on its own.
    #[serde(default)]
    pub canary: CanaryPolicy,
}

impl Default for TrafficConfig {
    fn default() -> Self {
        TrafficConfig {
            high_priority_reserve: 0.0,
            low_priority_share: default_low_share(),
            teams: BTreeMap::new(),
            canary: CanaryPolicy::default(),
        }
    }
}

fn default_low_share() -> f64 {
    0.5
}

/// `[traffic.canary]`: a canary is compared with the stable version over
/// its last `window_requests` calls (and the stable version's calls in the
/// same time), and rolled back when it is worse by more than the margins.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CanaryPolicy {
    /// The canary calls one judgement covers; no judgement before the
    /// canary has made this many.
    #[serde(default = "default_window_requests")]
    pub window_requests: usize,
    /// Rolled back when the canary's error rate exceeds the stable
    /// version's by more than this (0.05: five points).
    #[serde(default = "default_error_margin")]
    pub max_error_rate_increase: f64,
    /// Rolled back when the canary's p99 call time exceeds the stable
    /// version's by more than this factor.
    #[serde(default = "default_p99_ratio")]
    pub max_p99_ratio: f64,
    /// p99s below this many milliseconds are not compared: over a window of
    /// a hundred calls a p99 is nearly the slowest call, and a scheduler
    /// hiccup of a few milliseconds is noise, not a regression.
    #[serde(default = "default_p99_floor_ms")]
    pub p99_floor_ms: f64,
}

impl Default for CanaryPolicy {
    fn default() -> Self {
        CanaryPolicy {
            window_requests: default_window_requests(),
            max_error_rate_increase: default_error_margin(),
            max_p99_ratio: default_p99_ratio(),
            p99_floor_ms: default_p99_floor_ms(),
        }
    }
}

fn default_window_requests() -> usize {
    100
}

fn default_error_margin() -> f64 {
    0.05
}

fn default_p99_ratio() -> f64 {
    3.0
}

fn default_p99_floor_ms() -> f64 {
    5.0
}

/// The most canary calls one window may cover.
const MAX_WINDOW_REQUESTS: usize = 100_000;

impl TrafficConfig {
    /// Checks the values.
    pub fn check(&self) -> Result<(), Invalid> {
        let share = |key: &str, value: f64| {
            if !(0.0..=1.0).contains(&value) {
                return Err(invalid!("traffic.{key} = {value}: must be between 0 and 1"));
            }
            Ok(())
        };
        share("high_priority_reserve", self.high_priority_reserve)?;
        share("low_priority_share", self.low_priority_share)?;
        if self.high_priority_reserve >= 1.0 {
            return Err(invalid!(
                "traffic.high_priority_reserve = {}: must be below 1, or only high-priority requests would be admitted",
                self.high_priority_reserve
            ));
        }
        for (team, quota) in &self.teams {
            check_name("traffic.teams key", team)?;
            quota.check(&format!("traffic.teams.{team}"))?;
        }
        let canary = &self.canary;
        check_between("traffic.canary.window_requests", canary.window_requests, 1, MAX_WINDOW_REQUESTS)?;
        share("canary.max_error_rate_increase", canary.max_error_rate_increase)?;
        if !(canary.max_p99_ratio >= 1.0 && canary.max_p99_ratio.is_finite()) {
            return Err(invalid!("traffic.canary.max_p99_ratio = {}: must be at least 1", canary.max_p99_ratio));
        }
        if !(canary.p99_floor_ms >= 0.0 && canary.p99_floor_ms.is_finite()) {
            return Err(invalid!("traffic.canary.p99_floor_ms = {}: must be 0 or more", canary.p99_floor_ms));
        }
        Ok(())
    }
}

/// Checks a pipeline's (or model's) own traffic settings; `key` names it.
pub fn check_endpoint(key: &str, cache: Option<&CacheConfig>, quota: Option<&QuotaConfig>) -> Result<(), Invalid> {
    if let Some(cache) = cache {
        cache.check(&format!("{key}.cache"))?;
    }
    if let Some(quota) = quota {
        quota.check(&format!("{key}.quota"))?;
    }
    Ok(())
}

/// The most places a share of `capacity` leaves, at least one: a share so
/// small it rounds to nothing still admits one request at a time.
pub fn places(capacity: usize, share: f64) -> usize {
    ((capacity as f64 * share).floor() as usize).clamp(1, capacity.max(1))
}
