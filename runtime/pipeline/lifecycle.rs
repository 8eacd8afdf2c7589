//! Versions coming and going while requests run: repository polling,
//! config reloads, and the switch from one version to the next with no
//! failed request.
//!
//! A version that enters its model's policy is loaded off the serving
//! path (`models::Loader`: a thread of its own, a bound on loads at once),
//! warmed up, checked against every pipeline over the model (a version
//! whose signature no longer fits a pipeline's stages fails its load), and
//! only then published to the model's table. A version that leaves the
//! policy is taken out of the table first — new requests go elsewhere —
//! then drained: the requests already on it finish, and it is unloaded
//! when the last one lets go. Old versions leave only once every version
//! the policy wants is serving, so a failed load leaves the serving
//! version in place. One change runs at a time.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use super::inference::InferenceStage;
use super::served::{ServedModel, ServedVersion};
use super::Pipeline;
use crate::config::{LifecycleConfig, ModelConfig};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::models::repository;
use crate::models::status::VersionState;
use crate::models::storage::Storage;
use crate::models::{place_of, LoadSettings, Loader, ModelVersion, Source};

/// How long listing a model's base path may take: past it the poll gives
/// up on that path until the listing returns.
const LISTING_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a withdrawn version is checked for requests still on it.
const DRAIN_POLL: Duration = Duration::from_millis(10);

/// What identifies a model file's content cheaply: a failed version is
/// tried again whenever its file changes.
type FileStamp = (Option<SystemTime>, u64);

/// A version whose load failed: the file it failed on, and when it is
/// tried again on the same file (`lifecycle.max_load_retries`, as TF
/// Serving retries: a SavedModel whose `variables/` were still arriving
/// loads on a later try, though `saved_model.pb` has not changed).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Failure {
    stamp: FileStamp,
    retries_left: u32,
    retry_at: Instant,
}

/// How failed loads are tried again.
#[derive(Debug, Clone, Copy)]
struct RetryPolicy {
    retries: u32,
    interval: Duration,
}

/// Loads, publishes, drains and unloads versions.
pub struct ModelManager {
    loader: Loader,
    metrics: Arc<Metrics>,
    drain_timeout: Duration,
    /// One reconcile or reload at a time: each reads the table, loads,
    /// and writes it back.
    changing: tokio::sync::Mutex<()>,
    /// Versions whose load failed, by model.
    failed: Mutex<BTreeMap<(String, i64), Failure>>,
    retry: RetryPolicy,
    /// `lifecycle.allow_version_labels_for_unavailable_models`.
    labels_may_wait: bool,
    /// Base paths being listed now, and since when.
    listing: Arc<Mutex<BTreeMap<PathBuf, Instant>>>,
    /// Base paths in object stores, mirrored to local disk.
    storage: Arc<Storage>,
    /// How long apart two listings of an object store are, at start-up,
    /// to see which versions finished uploading: one poll.
    settle: Duration,
}

impl ModelManager {
    /// A manager loading with `lifecycle`'s settings.
    pub fn new(
        lifecycle: &LifecycleConfig,
        settings: LoadSettings,
        storage: Arc<Storage>,
        metrics: Arc<Metrics>,
        drain_timeout: Duration,
    ) -> ModelManager {
        ModelManager {
            loader: Loader::new(lifecycle.max_concurrent_loads, settings, metrics.clone()),
            metrics,
            drain_timeout,
            changing: tokio::sync::Mutex::new(()),
            failed: Mutex::new(BTreeMap::new()),
            retry: RetryPolicy {
                retries: lifecycle.max_load_retries,
                interval: Duration::from_millis(lifecycle.load_retry_interval_ms),
            },
            labels_may_wait: lifecycle.allow_version_labels_for_unavailable_models,
            listing: Arc::default(),
            storage,
            settle: Duration::from_secs(lifecycle.file_system_poll_wait_seconds.max(1)),
        }
    }

    /// The object-store mirrors: a poll is due when a download ends.
    pub fn storage(&self) -> &Arc<Storage> {
        &self.storage
    }

    /// Where loads report.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Holds off other changes while the caller makes several.
    pub(super) async fn exclusive(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.changing.lock().await
    }

    /// Brings `model` to what its repository and policy say now. `strict`
    /// (start-up, reloads): a missing repository, a missing version or a
    /// failed load is an error, and labels must name serving versions.
    /// Otherwise (polling) failures are recorded in the version's status
    /// and logged, and serving goes on.
    ///
    /// `pipelines` are those over `model` now: a version is checked
    /// against each before it serves, and leaves their signatures when it
    /// is unloaded. The caller owns them (`Endpoints`), so the model needs
    /// no way back to them.
    pub(super) async fn reconcile(
        &self,
        model: &Arc<ServedModel>,
        pipelines: &[Arc<Pipeline>],
        strict: bool,
    ) -> Result<()> {
        let config = model.config();
        let context = |e: Error| e.context(format_args!("model '{}'", config.name));
        let found = match self.discover(model, &config, strict).await {
            Ok(found) => found,
            Err(error) if !strict => {
                tracing::warn!(model = %config.name, "repository poll failed: {error}");
                return Ok(());
            }
            Err(error) => return Err(context(error)),
        };
        let wanted = if strict {
            repository::select(&found, &config.version_policy, &place_of(&config)).map_err(context)?
        } else {
            repository::select_present(&found, &config.version_policy)
        };
        let serving = model.table();
        let mut complete = true;
        for (&version, source) in &wanted {
            if serving.versions.contains_key(&version) {
                continue;
            }
            let stamp = stamp(source);
            let key = (config.name.clone(), version);
            let before = self.failed_before(&key).filter(|failure| failure.stamp == stamp);
            if !strict && before.is_some_and(|failure| failure.retries_left == 0 || Instant::now() < failure.retry_at) {
                complete = false;
                continue;
            }
            match self.bring_in(model, pipelines, &config, version, source.clone()).await {
                Ok(()) => {
                    self.failed.lock().unwrap_or_else(PoisonError::into_inner).remove(&key);
                }
                Err(error) => {
                    // A try again on the same file spends one retry; a
                    // changed file starts the count afresh.
                    let retries_left =
                        before.map_or(self.retry.retries, |failure| failure.retries_left.saturating_sub(1));
                    let retry_at = Instant::now() + self.retry.interval;
                    if retries_left > 0 && !strict {
                        tracing::error!(
                            model = %config.name,
                            version,
                            retries_left,
                            retry_in_ms = self.retry.interval.as_millis() as u64,
                            "version not loaded, to be tried again: {error}"
                        );
                    } else {
                        tracing::error!(model = %config.name, version, "version not loaded: {error}");
                    }
                    model.status().fail(version, error.clone());
                    let failure = Failure { stamp, retries_left, retry_at };
                    self.failed.lock().unwrap_or_else(PoisonError::into_inner).insert(key, failure);
                    if strict {
                        return Err(error);
                    }
                    complete = false;
                }
            }
        }
        check_labels(model, &config.version_labels, strict, self.labels_may_wait)?;
        model.set_labels(config.version_labels.clone());
        if !complete {
            // Availability first: what serves keeps serving until every
            // version the policy wants does.
            return Ok(());
        }
        for version in model.table().versions.keys().copied().filter(|v| !wanted.contains_key(v)).collect::<Vec<_>>() {
            self.retire(model, version, pipelines.to_vec());
        }
        Ok(())
    }

    fn failed_before(&self, key: &(String, i64)) -> Option<Failure> {
        self.failed.lock().unwrap_or_else(PoisonError::into_inner).get(key).copied()
    }

    /// Loads, warms up, checks and publishes one version.
    async fn bring_in(
        &self,
        model: &Arc<ServedModel>,
        pipelines: &[Arc<Pipeline>],
        config: &ModelConfig,
        version: i64,
        source: Source,
    ) -> Result<()> {
        model.status().set(version, VersionState::Start);
        let loaded =
            self.loader.load(config, version, source, || model.status().set(version, VersionState::Loading)).await?;
        let mut signatures = Vec::with_capacity(pipelines.len());
        for pipeline in pipelines {
            signatures.push(pipeline.signature_over(&loaded).map_err(|e| {
                e.context(format_args!("version {version} does not fit pipeline '{}'", pipeline.name()))
            })?);
        }
        for (pipeline, signature) in pipelines.iter().zip(signatures) {
            match signature {
                Some(signature) => pipeline.add_signature(version, signature),
                // A step's model of a graph: what it answers may change.
                None => pipeline.forget_answers(),
            }
        }
        let inference = InferenceStage::start(loaded.clone(), config, &self.metrics);
        model.publish(Arc::new(ServedVersion::new(loaded, inference)));
        tracing::info!(model = %config.name, version, "available: serving requests");
        Ok(())
    }

    /// Takes `version` out of the table now; drains and unloads it in the
    /// background, then takes its signature out of `pipelines`.
    pub(super) fn retire(&self, model: &Arc<ServedModel>, version: i64, pipelines: Vec<Arc<Pipeline>>) {
        let Some(served) = model.withdraw(version) else { return };
        tracing::info!(model = model.name(), version, "unloading: no new requests; draining in-flight ones");
        let (model, timeout) = (model.clone(), self.drain_timeout);
        tokio::spawn(async move {
            drain(&served, timeout).await;
            let loaded: Arc<ModelVersion> = served.loaded().clone();
            // The inference stage (and its batcher) go first, then the
            // pipelines' signatures; the sessions go with the last
            // reference to the loaded version.
            drop(served);
            for pipeline in pipelines {
                pipeline.remove_signature(model.name(), version);
            }
            drop(loaded);
            model.status().set(version, VersionState::End);
            tracing::info!(model = model.name(), version, "unloaded");
        });
    }
}

/// Waits until no request holds `served` (the caller's reference is the
/// last), up to `timeout`; past it the version is let go anyway and is
/// freed when its last request finishes.
async fn drain(served: &Arc<ServedVersion>, timeout: Duration) {
    let started = tokio::time::Instant::now();
    while Arc::strong_count(served) > 1 {
        if started.elapsed() >= timeout {
            tracing::warn!(
                model = served.model(),
                version = served.version(),
                in_flight = Arc::strong_count(served) - 1,
                "drain timeout reached; the version is freed when its last requests finish"
            );
            return;
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
}

/// Labels must name versions that serve (TF Serving refuses a label on a
/// version that is not AVAILABLE), except, with `may_wait`, a label the
/// model does not have yet (TF Serving's
/// `--allow_version_labels_for_unavailable_models`). While polling, a
/// label whose version left is kept and refused per request, with the
/// reason.
fn check_labels(model: &ServedModel, labels: &BTreeMap<String, i64>, strict: bool, may_wait: bool) -> Result<()> {
    if !strict {
        return Ok(());
    }
    let table = model.table();
    let serving: BTreeSet<i64> = table.versions.keys().copied().collect();
    for (label, version) in labels {
        if may_wait && !table.labels.contains_key(label) {
            continue;
        }
        if !serving.contains(version) {
            let list: Vec<String> = serving.iter().map(i64::to_string).collect();
            let state = model.status().get(*version).map_or("never seen in the repository", |s| s.state.name());
            return Err(Error::failed_precondition(format!(
                "model '{}': version_labels.{label} = {version}, but version {version} is not AVAILABLE \
                 ({state}); available versions: [{}]",
                model.name(),
                list.join(", ")
            )));
        }
    }
    Ok(())
}

/// What a version comes from changing: a file's time and size; for an
/// upstream, a 30 s window, so a version that failed there is tried again
/// every 30 s rather than at every poll.
fn stamp(source: &Source) -> FileStamp {
    match source {
        Source::File(file) => std::fs::metadata(file).map_or((None, 0), |m| (m.modified().ok(), m.len())),
        Source::Upstream(_) => {
            let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
            (None, now / 30)
        }
    }
}

/// The versions `model` could serve now: its repository's, or what its
/// upstreams serve.
impl ModelManager {
    /// The versions `model` offers: its upstreams', or its base path's
    /// (for an object store, those downloaded whole; a version whose
    /// download failed is recorded in its status as a failed load is).
    async fn discover(&self, model: &ServedModel, config: &ModelConfig, strict: bool) -> Result<BTreeMap<i64, Source>> {
        Ok(match model.upstream() {
            Some(fleet) => fleet.versions().await?.into_iter().map(|v| (v, Source::Upstream(fleet.clone()))).collect(),
            None if crate::config::is_object_store_url(&config.base_path) => {
                let repository = self.storage.repository(&config.name, &config.base_path)?;
                let serving: BTreeSet<i64> = model.table().versions.keys().copied().collect();
                let found = repository.discover(&serving, &config.version_policy, strict, self.settle).await?;
                for (version, error) in found.failed {
                    model.status().fail(version, error);
                }
                found.versions.into_iter().map(|(v, file)| (v, Source::File(file))).collect()
            }
            None => self.list(&config.base_path).await?.into_iter().map(|(v, file)| (v, Source::File(file))).collect(),
        })
    }

    /// Lists `base_path` on a blocking thread, for at most
    /// [`LISTING_TIMEOUT`]: a hung network mount holds that thread, not a
    /// runtime's, and while it does, later polls of the same path are
    /// skipped rather than stacking more threads on it.
    async fn list(&self, base_path: &Path) -> Result<BTreeMap<i64, PathBuf>> {
        let path = base_path.to_path_buf();
        {
            let mut listing = self.listing.lock().unwrap_or_else(PoisonError::into_inner);
            // Models sharing a base path list it at once at start-up: only
            // a listing older than the bound is a hung one.
            match listing.get(&path) {
                Some(started) if started.elapsed() >= LISTING_TIMEOUT => {
                    return Err(Error::unavailable(format!(
                        "a listing of {} started {} s ago has not returned (a hung network mount?); serving \
                         goes on with the versions loaded",
                        path.display(),
                        started.elapsed().as_secs()
                    )));
                }
                Some(_) => {}
                None => {
                    listing.insert(path.clone(), Instant::now());
                }
            }
        }
        let listing = self.listing.clone();
        let task = tokio::task::spawn_blocking(move || {
            let found = repository::discover(&path);
            listing.lock().unwrap_or_else(PoisonError::into_inner).remove(&path);
            found
        });
        match tokio::time::timeout(LISTING_TIMEOUT, task).await {
            Ok(Ok(found)) => found,
            Ok(Err(_)) => Err(Error::internal("listing the model repository panicked")),
            Err(_) => Err(Error::unavailable(format!(
                "listing {} took more than {} s (a hung network mount?); serving goes on with the versions loaded",
                base_path.display(),
                LISTING_TIMEOUT.as_secs()
            ))),
        }
    }
}
