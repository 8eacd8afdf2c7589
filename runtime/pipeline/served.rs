//! A served model as requests see it: the versions that take traffic now,
//! each with its inference stage, and the labels that name them.
//!
//! The table is one snapshot swapped whole when a version comes or goes
//! (`lifecycle`), so a request resolves against a consistent table without
//! a lock, and holds what it resolved to (an `Arc`) until it is answered:
//! a version taken out of the table keeps serving the requests already on
//! it, and is unloaded only once they are done.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};

use super::inference::InferenceStage;
use super::request_log::RequestLog;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::infer::tfserving::fleet::Fleet;
use crate::metrics::Metrics;
use crate::models::status::{ModelStatus, VersionState};
use crate::models::{ModelVersion, VersionChoice};

/// A version that takes traffic: the loaded model and its inference stage
/// (with the batcher, when batching is on).
pub struct ServedVersion {
    version: Arc<ModelVersion>,
    inference: InferenceStage,
}

impl ServedVersion {
    /// `version`, run through `inference`.
    pub fn new(version: Arc<ModelVersion>, inference: InferenceStage) -> ServedVersion {
        ServedVersion { version, inference }
    }

    /// The stage requests run through.
    pub fn inference(&self) -> &InferenceStage {
        &self.inference
    }

    /// The loaded version.
    pub fn loaded(&self) -> &Arc<ModelVersion> {
        &self.version
    }
}

impl fmt::Display for ServedVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.version.fmt(f)
    }
}

impl Deref for ServedVersion {
    type Target = ModelVersion;

    fn deref(&self) -> &ModelVersion {
        &self.version
    }
}

/// The versions taking traffic and the labels naming them.
#[derive(Default, Clone)]
pub(super) struct VersionTable {
    pub(super) versions: BTreeMap<i64, Arc<ServedVersion>>,
    pub(super) labels: BTreeMap<String, i64>,
}

/// One served model: its config, the versions taking traffic, what every
/// version seen is doing, and the pipelines that run it.
pub struct ServedModel {
    name: Arc<str>,
    config: ArcSwap<ModelConfig>,
    table: ArcSwap<VersionTable>,
    status: ModelStatus,
    /// The upstreams a forwarded model's versions are served by.
    upstream: Option<Arc<Fleet>>,
    /// Its request log, when `logging` is configured; swapped when a
    /// reload changes it.
    request_log: ArcSwapOption<RequestLog>,
    metrics: Arc<Metrics>,
}

impl ServedModel {
    /// A model with no version serving yet (connecting, lazily, to its
    /// upstreams when it is forwarded).
    pub fn new(config: ModelConfig, metrics: Arc<Metrics>) -> Result<Arc<ServedModel>> {
        let upstream = config.upstream.as_ref().map(|u| Fleet::start(&config.name, u, &metrics)).transpose()?;
        let request_log =
            config.logging.as_ref().map(|logging| RequestLog::start(&config.name, logging, &metrics)).transpose()?;
        Ok(Arc::new(ServedModel {
            upstream,
            request_log: ArcSwapOption::new(request_log),
            metrics: metrics.clone(),
            status: ModelStatus::new(&config.name, metrics),
            name: config.name.as_str().into(),
            config: ArcSwap::from_pointee(config),
            table: ArcSwap::from_pointee(VersionTable::default()),
        }))
    }

    /// The upstreams serving a forwarded model.
    pub fn upstream(&self) -> Option<&Arc<Fleet>> {
        self.upstream.as_ref()
    }

    /// The model's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The model's name, shared (metric labels).
    pub fn name_label(&self) -> Arc<str> {
        self.name.clone()
    }

    /// Its config now (a reload may change the policy, labels and path).
    pub fn config(&self) -> Arc<ModelConfig> {
        self.config.load_full()
    }

    /// What every version seen is doing.
    pub fn status(&self) -> &ModelStatus {
        &self.status
    }

    /// The versions taking traffic, lowest first.
    pub fn versions(&self) -> Vec<Arc<ServedVersion>> {
        self.table.load().versions.values().cloned().collect()
    }

    /// The loaded versions taking traffic, lowest first.
    pub fn loaded_versions(&self) -> Vec<Arc<ModelVersion>> {
        self.table.load().versions.values().map(|v| v.loaded().clone()).collect()
    }

    /// The highest version taking traffic.
    pub fn latest(&self) -> Result<Arc<ServedVersion>> {
        self.resolve(VersionChoice::Latest)
    }

    /// The version a request asks for.
    pub fn resolve(&self, choice: VersionChoice<'_>) -> Result<Arc<ServedVersion>> {
        let table = self.table.load();
        let available = || table.versions.keys().map(i64::to_string).collect::<Vec<_>>().join(", ");
        match choice {
            VersionChoice::Latest => {
                // Under a canary, versionless requests go to the canary
                // label's version for its share and to the stable label's
                // for the rest; when the chosen label's version is not
                // available, the stable one, then the highest available.
                let config = self.config.load();
                let labelled = |label: &str| table.labels.get(label).and_then(|v| table.versions.get(v)).cloned();
                let chosen = config.canary.as_ref().and_then(|canary| {
                    if rand::random::<f64>() * 100.0 < canary.percent {
                        labelled(&canary.label).or_else(|| labelled(&canary.stable))
                    } else {
                        labelled(&canary.stable)
                    }
                });
                chosen.or_else(|| table.versions.values().next_back().cloned()).ok_or_else(|| {
                    Error::unavailable(format!("model '{}' has no version available yet{}", self.name, self.why_none()))
                })
            }
            VersionChoice::Number(v) => table.versions.get(&v).cloned().ok_or_else(|| {
                Error::not_found(format!(
                    "model '{}' has no version {v} available{}; available versions: [{}]",
                    self.name,
                    self.state_of(v),
                    available()
                ))
            }),
            VersionChoice::Label(label) => {
                // TF Serving: "Unrecognized servable version label",
                // INVALID_ARGUMENT (400 over REST).
                let v = *table.labels.get(label).ok_or_else(|| {
                    let labels: Vec<&str> = table.labels.keys().map(String::as_str).collect();
                    Error::invalid_argument(format!(
                        "model '{}' has no version label '{label}'; labels: [{}]",
                        self.name,
                        labels.join(", ")
                    ))
                })?;
                table.versions.get(&v).cloned().ok_or_else(|| {
                    Error::not_found(format!(
                        "label '{label}' of model '{}' points at version {v}, which is not available{}; \
                         available versions: [{}]",
                        self.name,
                        self.state_of(v),
                        available()
                    ))
                })
            }
        }
    }

    /// " (it is LOADING)", " (its load failed: …)", or nothing.
    fn state_of(&self, version: i64) -> String {
        match self.status.get(version) {
            None => String::new(),
            Some(status) => match status.error {
                Some(error) => format!(" (its load failed: {error})"),
                None => format!(" (it is {})", status.state.name()),
            },
        }
    }

    /// Why no version serves, when a load failed.
    fn why_none(&self) -> String {
        let failed: Vec<String> =
            self.status.all().into_iter().filter_map(|(v, s)| s.error.map(|e| format!("version {v}: {e}"))).collect();
        if failed.is_empty() {
            String::new()
        } else {
            format!("; failed loads: {}", failed.join("; "))
        }
    }

    pub(super) fn table(&self) -> Arc<VersionTable> {
        self.table.load_full()
    }

    /// Serves as `config` from now on; a changed request log is started
    /// first, so a log that cannot start leaves everything as it was.
    pub(super) fn set_config(&self, config: ModelConfig) -> Result<()> {
        let log = self.request_log.load();
        if log.as_ref().map(|l| l.config()) != config.logging.as_ref() {
            let started =
                config.logging.as_ref().map(|l| RequestLog::start(&self.name, l, &self.metrics)).transpose()?;
            self.request_log.store(started);
        }
        self.config.store(Arc::new(config));
        Ok(())
    }

    /// Its request log, when requests are logged.
    pub fn request_log(&self) -> arc_swap::Guard<Option<Arc<RequestLog>>> {
        self.request_log.load()
    }

    /// Routes traffic to `version` from now on.
    pub(super) fn publish(&self, version: Arc<ServedVersion>) {
        let number = version.version();
        self.table.rcu(|table| {
            let mut table = VersionTable::clone(table);
            table.versions.insert(number, version.clone());
            table
        });
        self.status.set(number, VersionState::Available);
    }

    /// Stops routing new requests to `version`; the caller drains it.
    pub(super) fn withdraw(&self, version: i64) -> Option<Arc<ServedVersion>> {
        let mut taken = None;
        self.table.rcu(|table| {
            let mut table = VersionTable::clone(table);
            taken = table.versions.remove(&version);
            table
        });
        if taken.is_some() {
            self.status.set(version, VersionState::Unloading);
        }
        taken
    }

    /// Names versions with `labels`.
    pub(super) fn set_labels(&self, labels: BTreeMap<String, i64>) {
        self.table.rcu(|table| VersionTable { versions: table.versions.clone(), labels: labels.clone() });
    }
}
