//! What each version of a model is doing — START, LOADING, AVAILABLE,
//! UNLOADING, END — and why a version that failed did, as TF Serving's
//! GetModelStatus reports them.
//!
//! A failed version stays in the table (END with its error) so operators
//! can read why; only the most recent ended versions are kept, so a
//! repository that churns for months does not grow the table without end.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::error::Error;
use crate::metrics::Metrics;

/// Ended versions kept for status, beyond the ones still loaded.
const ENDED_KEPT: usize = 16;

/// Where a version is in its life, with TF Serving's names and numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionState {
    /// Seen in the repository; waiting for a loading slot.
    Start,
    /// Loading and warming up.
    Loading,
    /// Serving requests.
    Available,
    /// Taking no new requests; in-flight ones finishing.
    Unloading,
    /// Unloaded, or failed (with the error).
    End,
}

impl VersionState {
    /// TF Serving's name (`ModelVersionStatus.State`).
    pub fn name(self) -> &'static str {
        match self {
            VersionState::Start => "START",
            VersionState::Loading => "LOADING",
            VersionState::Available => "AVAILABLE",
            VersionState::Unloading => "UNLOADING",
            VersionState::End => "END",
        }
    }

    /// TF Serving's number (`ModelVersionStatus.State`).
    pub fn number(self) -> i32 {
        match self {
            VersionState::Start => 10,
            VersionState::Loading => 20,
            VersionState::Available => 30,
            VersionState::Unloading => 40,
            VersionState::End => 50,
        }
    }
}

/// One version's state, and the error that ended it if one did.
#[derive(Debug, Clone, PartialEq)]
pub struct VersionStatus {
    /// The state.
    pub state: VersionState,
    /// Why a load failed.
    pub error: Option<Error>,
}

/// The state of every version of one model that was seen, mirrored in
/// `sluice_model_versions`.
pub struct ModelStatus {
    model: String,
    versions: Mutex<BTreeMap<i64, VersionStatus>>,
    metrics: Arc<Metrics>,
}

/// Every state, in the order a version walks through them.
pub const STATES: [VersionState; 5] =
    [VersionState::Start, VersionState::Loading, VersionState::Available, VersionState::Unloading, VersionState::End];

impl ModelStatus {
    /// No version seen yet of `model`.
    pub fn new(model: &str, metrics: Arc<Metrics>) -> ModelStatus {
        ModelStatus { model: model.to_string(), versions: Mutex::new(BTreeMap::new()), metrics }
    }

    /// Records that `version` is now in `state` (clearing an old error).
    pub fn set(&self, version: i64, state: VersionState) {
        self.put(version, VersionStatus { state, error: None });
    }

    /// Records that loading `version` failed.
    pub fn fail(&self, version: i64, error: Error) {
        self.metrics.lifecycle(&self.model).failures.inc();
        self.put(version, VersionStatus { state: VersionState::End, error: Some(error) });
    }

    /// The status of `version`, if it was seen.
    pub fn get(&self, version: i64) -> Option<VersionStatus> {
        self.lock().get(&version).cloned()
    }

    /// Every version seen, lowest first.
    pub fn all(&self) -> Vec<(i64, VersionStatus)> {
        self.lock().iter().map(|(v, s)| (*v, s.clone())).collect()
    }

    fn put(&self, version: i64, status: VersionStatus) {
        let mut versions = self.lock();
        versions.insert(version, status);
        let ended: Vec<i64> = versions.iter().filter(|(_, s)| s.state == VersionState::End).map(|(v, _)| *v).collect();
        for old in ended.iter().take(ended.len().saturating_sub(ENDED_KEPT)) {
            versions.remove(old);
        }
        let counts = STATES.map(|state| (state.name(), versions.values().filter(|s| s.state == state).count() as i64));
        self.metrics.set_version_states(&self.model, &counts);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<i64, VersionStatus>> {
        // The map holds plain values: a panic elsewhere leaves it whole.
        self.versions.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_latest_ended_versions_only() {
        let status = ModelStatus::new("m", Metrics::new());
        status.set(1000, VersionState::Available);
        for v in 0..40 {
            status.fail(v, Error::internal("broken"));
        }
        let all = status.all();
        assert_eq!(all.len(), ENDED_KEPT + 1);
        assert_eq!(all[0].0, 40 - ENDED_KEPT as i64);
        assert_eq!(status.get(1000).map(|s| s.state), Some(VersionState::Available));
        assert!(status.get(0).is_none());
    }
}
