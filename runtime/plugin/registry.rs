//! The plugin registry: uploaded plugin versions, persisted, and the
//! pipeline stages that run them, swapped while they serve.
//!
//! On disk, in `[plugins] dir`: `store/blobs/SHA256.wasm` (content
//! addressed: two uploads of the same bytes share a file) and
//! `store/manifests/NAME.json` (the plugin's team, its versions and the
//! active one). Every file is written atomically, so a crash leaves the
//! old state or the new one. On start, a manifest's active version is used
//! when its blob still has its hash; otherwise the error is logged and the
//! stage falls back to `NAME.wasm`, so the server starts anyway.
//!
//! `NAME.wasm` in `[plugins] dir` is version 0 of plugin NAME: listed
//! with the stored versions, active while no upload has been activated,
//! and a rollback target like any other (it is read from the directory
//! each time, never copied into the store).
//!
//! Nothing is stored or swapped before the upload passed every check:
//! compiles, right world, `describe` answers, its sample runs under the
//! real limits, and it fits every pipeline stage that runs it.
//!
//! With `[plugins.shared]`, the store is shared by every replica through
//! Redis ([`super::shared`]): a change is recorded there first (only if no
//! other replica changed the registry since this one last read it), then
//! applied here; every replica follows each change ([`PluginRegistry::sync`])
//! and starts from the shared state. The local store is then the replica's
//! cache of it.

mod access;
mod audit;
mod canary;
mod replicas;
mod storage;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use self::storage::read_manifest;

pub use self::access::Caller;
pub use self::audit::MAX_LISTED as MAX_AUDIT_LISTED;
pub use self::storage::active_upload;
pub use super::manifest::{CanaryVersion, Manifest, StoredVersion};
use super::shared::SharedRegistry;
use super::store::{remove_stale_temporaries, write_atomically};
use super::{Plugin, PluginEngine, PluginsConfig};
use crate::config::check_name;
use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// A place in a pipeline that runs a plugin: what the registry needs from
/// a pipeline stage to check an upload against it and to swap it, without
/// knowing what a pipeline is. `pipeline::stages::plugin` implements it.
pub trait PluginSlot: Send + Sync {
    /// The pipeline the slot belongs to.
    fn pipeline(&self) -> &str;
    /// The team that owns that pipeline; `None`: admins only.
    fn team(&self) -> Option<&str>;
    /// Checks that `plugin` may serve here: the right world, the slot's
    /// interface, and it fits every version of the pipeline's model.
    fn accepts(&self, plugin: &Plugin) -> Result<()>;
    /// Serves new requests with `plugin`, the registry's `version` of it,
    /// from now on (checked first).
    fn swap(&self, plugin: Arc<Plugin>, version: u32) -> Result<()>;
    /// The plugin serving now: the registry's version of it, what it
    /// declares (`name version`) and the SHA-256 of its bytes.
    fn running(&self) -> (u32, String, String);
    /// Serves `percent` of new requests with `plugin` (the registry's
    /// `version` of it), beside the active one, or stops the canary
    /// (`None`); its calls are counted in `metrics`.
    fn set_canary(&self, canary: Option<(Arc<Plugin>, u32, f64)>, metrics: &Metrics) -> Result<()>;
    /// The canary running here: its version and percent.
    fn canary(&self) -> Option<(u32, f64)>;
}

/// The version number of `NAME.wasm` in the plugin directory.
pub const FILE_VERSION: u32 = 0;

/// What a pipeline's plugin stage runs now.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Running {
    /// The pipeline.
    pub pipeline: String,
    /// Its team.
    pub team: Option<String>,
    /// The plugin's name in the registry.
    pub plugin: String,
    /// The active version (0: `NAME.wasm` in the plugin directory).
    pub version: Option<u32>,
    /// What the plugin declares itself to be.
    pub declared: String,
    /// The SHA-256 of the bytes serving.
    pub sha256: String,
    /// The canary beside it, while one runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryVersion>,
}

/// The slots running one plugin.
type Slots = Vec<Arc<dyn PluginSlot>>;

struct State {
    manifests: BTreeMap<String, Manifest>,
    /// The slots running each plugin, by plugin name.
    bindings: BTreeMap<String, Slots>,
}

/// Stored plugin versions and the stages that run them.
pub struct PluginRegistry {
    engine: Arc<PluginEngine>,
    config: PluginsConfig,
    metrics: Arc<Metrics>,
    blobs: PathBuf,
    manifests: PathBuf,
    // Taken briefly, never over plugin code, the network or the disk:
    // `changing` keeps changes serial, and each publishes under this lock
    // once its I/O is done (`record`). Requests never take it: stages
    // swap through `PluginStage`.
    state: Mutex<State>,
    /// The registry every replica shares, when configured.
    shared: Option<SharedRegistry>,
    /// The shared registry's revision this replica has applied.
    revision: AtomicU64,
    /// One change or sync at a time: both read the shared registry, load
    /// plugins and swap stages. Held on blocking threads only.
    changing: Mutex<()>,
    /// A sync is queued and not yet started.
    sync_queued: AtomicBool,
}

impl PluginRegistry {
    /// Opens the store in `[plugins] dir` (creating it) and reads every
    /// manifest; a manifest that cannot be read, or whose active blob no
    /// longer has its hash, is logged and left out.
    pub fn open(engine: Arc<PluginEngine>, config: &PluginsConfig, metrics: Arc<Metrics>) -> Result<PluginRegistry> {
        let dir = config.dir.as_ref().ok_or_else(|| {
            Error::invalid_argument("the plugin registry needs [plugins] dir, where it stores plugins")
        })?;
        let store = dir.join("store");
        let blobs = store.join("blobs");
        let manifests_dir = store.join("manifests");
        for d in [&blobs, &manifests_dir] {
            std::fs::create_dir_all(d)
                .map_err(|e| Error::internal(format!("cannot create the plugin store {}: {e}", d.display())))?;
            let removed = remove_stale_temporaries(d);
            if removed > 0 {
                tracing::warn!(dir = %d.display(), removed, "removed files a write cut short (a crash) left behind");
            }
        }
        let mut manifests = BTreeMap::new();
        let entries = std::fs::read_dir(&manifests_dir)
            .map_err(|e| Error::internal(format!("cannot read {}: {e}", manifests_dir.display())))?;
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            match read_manifest(&path) {
                Ok(manifest) => {
                    manifests.insert(manifest.name.clone(), manifest);
                }
                Err(e) => tracing::error!(path = %path.display(), "plugin manifest refused, left out: {e}"),
            }
        }
        let shared = match &config.shared {
            None => None,
            Some(shared) => {
                let runtime = tokio::runtime::Handle::try_current()
                    .map_err(|e| Error::internal(format!("the shared plugin registry needs the async runtime: {e}")))?;
                Some(SharedRegistry::new(shared, runtime)?)
            }
        };
        let registry = PluginRegistry {
            engine,
            config: config.clone(),
            metrics,
            blobs,
            manifests: manifests_dir,
            state: Mutex::new(State { manifests, bindings: BTreeMap::new() }),
            shared,
            revision: AtomicU64::new(0),
            changing: Mutex::new(()),
            sync_queued: AtomicBool::new(false),
        };
        Ok(registry)
    }

    /// The shared registry's revision this replica serves (0 without one).
    pub fn revision(&self) -> u64 {
        self.revision.load(Ordering::Acquire)
    }

    /// The registry's state. No plugin code ever runs while it is held
    /// (validation and loading happen outside), and its data is consistent
    /// between statements, so a panic elsewhere cannot leave it half
    /// changed: a poisoned lock is taken over instead of failing every
    /// later admin call.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What a stage of a pipeline owned by `team` may start `name` from,
    /// best first, each with its version and where it came from: the
    /// active version and then the versions active before it, when they
    /// are intact and belong to the same team (a pipeline never runs
    /// another team's upload), then `NAME.wasm` in the plugin directory
    /// (version 0). The stage takes the first that loads, so a stored
    /// version that fails at start-up falls back instead of failing the
    /// server.
    pub fn initial_sources(&self, name: &str, team: Option<&str>) -> Result<Vec<(u32, String, Vec<u8>)>> {
        let order: Vec<(u32, Option<StoredVersion>)> = {
            let state = self.lock();
            state
                .manifests
                .get(name)
                .filter(|m| {
                    let same_team = m.team.as_deref() == team;
                    if !same_team {
                        tracing::error!(
                            plugin = name,
                            owner = m.team.as_deref().unwrap_or("-"),
                            pipeline_team = team.unwrap_or("-"),
                            "the stored plugin belongs to another team; the pipeline runs {name}.wasm"
                        );
                    }
                    same_team
                })
                .map(|m| {
                    m.active
                        .into_iter()
                        .chain(m.history.iter().rev().copied())
                        .map(|version| (version, m.versions.iter().find(|v| v.version == version).cloned()))
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut sources = Vec::new();
        for (version, stored) in order {
            match stored {
                Some(stored) => match self.read_blob(&stored) {
                    Ok(bytes) => sources.push((version, format!("stored version {version}"), bytes)),
                    Err(e) => tracing::error!(
                        plugin = name,
                        version,
                        "stored plugin refused, falling back to {name}.wasm or an earlier stored version: {e}"
                    ),
                },
                None if version == FILE_VERSION => {
                    if let Ok((path, bytes)) = self.file_of(name) {
                        sources.push((FILE_VERSION, format!("{} (version 0)", path.display()), bytes));
                    }
                }
                None => {}
            }
        }
        if !sources.iter().any(|(version, ..)| *version == FILE_VERSION) {
            match self.file_of(name) {
                Ok((path, bytes)) => sources.push((FILE_VERSION, format!("{} (version 0)", path.display()), bytes)),
                Err(e) if sources.is_empty() => return Err(e),
                Err(e) => tracing::warn!(plugin = name, "no fallback: {e}"),
            }
        }
        Ok(sources)
    }

    /// What every pipeline's plugin stage runs now, for `caller`.
    pub fn running(&self, caller: &Caller) -> Vec<Running> {
        let state = self.lock();
        let mut running = Vec::new();
        for (name, slots) in &state.bindings {
            for slot in slots.iter().filter(|slot| caller.may(slot.team())) {
                // What the slot loaded, which a fallback at start-up may
                // have made differ from the manifest's active version.
                let (version, declared, sha256) = slot.running();
                running.push(Running {
                    pipeline: slot.pipeline().to_string(),
                    team: slot.team().map(str::to_string),
                    plugin: name.clone(),
                    version: Some(version),
                    declared,
                    sha256,
                    canary: slot.canary().map(|(version, percent)| CanaryVersion { version, percent }),
                });
            }
        }
        running
    }

    /// Loads `bytes` as plugin `name` with its configured limits.
    /// Plugin code runs here (describe, the sample): a panic while loading
    /// is this plugin's failure, never the caller's.
    pub fn load(&self, name: &str, bytes: &[u8]) -> Result<Plugin> {
        guarded(|| Plugin::load(&self.engine, bytes, self.config.limits_of(name), Some((&self.metrics, name))))
    }

    /// Records that `slot` runs plugin `name`, so that activations reach it.
    /// Records that `slot` runs plugin `name`, so that activations reach it,
    /// and starts the plugin's canary there when one runs (a replica that
    /// starts mid-canary joins it; one that cannot load it logs why and
    /// serves the active version).
    pub fn bind(&self, name: &str, slot: Arc<dyn PluginSlot>) -> Result<()> {
        let manifest = {
            let mut state = self.lock();
            state.bindings.entry(name.to_string()).or_default().push(slot.clone());
            state.manifests.get(name).cloned()
        };
        if let Some(manifest) = manifest.filter(|m| m.canary.is_some() && m.team.as_deref() == slot.team()) {
            if let Err(error) = self.apply_canary(&manifest, &[slot]) {
                tracing::error!(plugin = name, "the plugin's canary is not served here: {error}");
            }
        }
        Ok(())
    }

    /// The plugin `pipeline` runs, for uploads addressed to a pipeline.
    pub fn plugin_of_pipeline(&self, pipeline: &str) -> Result<String> {
        let state = self.lock();
        let names: Vec<&String> = state
            .bindings
            .iter()
            .filter(|(_, bindings)| bindings.iter().any(|b| b.pipeline() == pipeline))
            .map(|(name, _)| name)
            .collect();
        match names.as_slice() {
            [one] => Ok((*one).clone()),
            [] => Err(Error::not_found(format!("pipeline '{pipeline}' runs no plugin (or does not exist)"))),
            many => Err(Error::invalid_argument(format!(
                "pipeline '{pipeline}' runs several plugins {many:?}; upload to /admin/v1/plugins/NAME instead"
            ))),
        }
    }

    /// Checks an upload without storing anything: it compiles, answers
    /// `describe`, runs its sample (or zeros shaped like its inputs) under
    /// the real limits, and fits every slot in `slots`. Runs plugin code:
    /// never called with the registry's lock held, and a panic in it is an
    /// error, not a crash.
    fn validate(&self, name: &str, bytes: &[u8], slots: &[Arc<dyn PluginSlot>]) -> Result<Plugin> {
        // Counted nowhere while it is checked: a refused upload's calls
        // are not the serving plugin's (`sluice_plugin_uploads_total`
        // counts the uploads); one that passes is counted once it serves.
        let detached = guarded(|| Plugin::load(&self.engine, bytes, self.config.limits_of(name), None));
        let checked = detached.and_then(|plugin| {
            guarded(|| {
                if plugin.description().sample.is_none() {
                    let max_bytes = super::memory_bytes(plugin.limits());
                    let zeros = super::zeros(&plugin.description().inputs, max_bytes)?;
                    plugin.call(zeros).map_err(|e| e.context("on zeros shaped like its declared inputs"))?;
                }
                for slot in slots {
                    slot.accepts(&plugin).map_err(|e| e.context(format_args!("for pipeline '{}'", slot.pipeline())))?;
                }
                Ok(())
            })?;
            Ok(plugin)
        });
        checked.map_err(|e| e.into_unprocessable(format_args!("plugin '{name}' refused")))
    }

    /// What `caller` may change of `name`: its manifest, if it has one, and
    /// the slots running it.
    fn to_change(&self, caller: &Caller, name: &str) -> Result<(Option<Manifest>, Slots)> {
        let state = self.lock();
        self.authorize(&state, caller, name)?;
        Ok((state.manifests.get(name).cloned(), state.bindings.get(name).cloned().unwrap_or_default()))
    }

    /// The version serving now: the active one, or, when nothing was
    /// activated, the file (version 0) when there is one.
    fn active_version(&self, manifest: &Manifest) -> Option<u32> {
        manifest.active.or_else(|| self.file_version(&manifest.name).map(|_| FILE_VERSION))
    }

    /// `sluice_plugin_uploads_total{outcome}`.
    fn uploads(&self, outcome: &'static str) -> prometheus_client::metrics::counter::Counter {
        self.metrics.plugin_uploads.get_or_create_owned(&crate::metrics::OutcomeLabels { outcome })
    }

    /// Validates and stores `bytes` as the next version of `name`.
    pub fn upload(&self, caller: &Caller, name: &str, bytes: &[u8]) -> Result<StoredVersion> {
        check_name("plugin name", name)?;
        let _one = self.changing.lock().unwrap_or_else(PoisonError::into_inner);
        self.sync_locked()?;
        let (_, slots) = self.to_change(caller, name)?;
        let plugin = self.validate(name, bytes, &slots).inspect_err(|_| {
            self.uploads("refused").inc();
        })?;
        self.uploads("accepted").inc();
        let mut manifest = {
            let state = self.lock();
            // Checked again: the registry may have changed while validating.
            self.authorize(&state, caller, name)?;
            state.manifests.get(name).cloned().unwrap_or_else(|| Manifest {
                name: name.to_string(),
                team: if caller.admin {
                    state.bindings.get(name).and_then(|b| b.first()?.team().map(str::to_string))
                } else {
                    caller.team.clone()
                },
                active: None,
                history: Vec::new(),
                versions: Vec::new(),
                canary: None,
            })
        };
        let description = plugin.description();
        let sha256 = plugin.sha256().to_string();
        let blob = self.blob_path(&sha256);
        if self.read_blob_at(&blob, &sha256).is_err() {
            write_atomically(&blob, bytes).map_err(|e| Error::internal(format!("storing {}: {e}", blob.display())))?;
        }
        let stored = StoredVersion {
            version: manifest.versions.iter().map(|v| v.version).max().unwrap_or(0) + 1,
            sha256,
            size: bytes.len() as u64,
            declared: format!("{} {}", description.name, description.version),
            uploaded_at: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            uploaded_by: caller.token_id.clone(),
        };
        manifest.versions.push(stored.clone());
        if let Some(shared) = &self.shared {
            shared.put_blob(&stored.sha256, bytes)?;
        }
        let record = audit_record(caller, "upload", name, Some(stored.version), None, &stored.sha256);
        drop(self.record(caller, &manifest, &record)?);
        plugin.accepted();
        self.audit(&record);
        Ok(stored)
    }

    /// Makes `version` of `name` the one every stage running it serves new
    /// requests with.
    pub fn activate(&self, caller: &Caller, name: &str, version: u32) -> Result<Manifest> {
        let _one = self.changing.lock().unwrap_or_else(PoisonError::into_inner);
        self.sync_locked()?;
        let (manifest, slots) = self.to_change(caller, name)?;
        let manifest = self.or_file_only(name, manifest, &slots)?;
        let manifest = self.switch(caller, manifest, &slots, version, true)?;
        Ok(self.with_file(manifest))
    }

    /// Returns `name` to the version active before the current one.
    pub fn rollback(&self, caller: &Caller, name: &str) -> Result<Manifest> {
        let _one = self.changing.lock().unwrap_or_else(PoisonError::into_inner);
        self.sync_locked()?;
        let (manifest, slots) = self.to_change(caller, name)?;
        let mut manifest = self.or_file_only(name, manifest, &slots)?;
        // Version 0 whose file is gone is skipped, not a dead end.
        let has_file = self.file_version(name).is_some();
        let version = loop {
            match manifest.history.pop() {
                Some(FILE_VERSION) if !has_file => continue,
                Some(version) => break version,
                None => {
                    return Err(Error::failed_precondition(format!(
                        "plugin '{name}' has no earlier active version to roll back to"
                    )))
                }
            }
        };
        let manifest = self.switch(caller, manifest, &slots, version, false)?;
        Ok(self.with_file(manifest))
    }

    /// Loads `version` for every slot, swaps them all, and records it.
    /// Every slot's plugin is loaded (outside the lock) before any is
    /// swapped, so a failure changes nothing.
    fn switch(
        &self,
        caller: &Caller,
        mut manifest: Manifest,
        slots: &[Arc<dyn PluginSlot>],
        version: u32,
        remember: bool,
    ) -> Result<Manifest> {
        let name = manifest.name.clone();
        let bytes = self.version_bytes(&manifest, version)?;
        let loaded = self.load_for(&name, &bytes, slots)?;
        let previous = self.active_version(&manifest);
        manifest.active = Some(version);
        // A new active version ends any canary: promoted, or overtaken.
        let had_canary = manifest.canary.take().is_some();
        if remember {
            if let Some(previous) = previous.filter(|&p| p != version) {
                manifest.history.push(previous);
            }
        }
        let action = if remember { "activate" } else { "rollback" };
        let record = audit_record(caller, action, &name, Some(version), previous, "");
        let state = self.record(caller, &manifest, &record)?;
        for (slot, plugin) in slots.iter().zip(loaded) {
            plugin.accepted();
            slot.swap(plugin, version)?;
            if had_canary || slot.canary().is_some() {
                slot.set_canary(None, &self.metrics)?;
            }
            tracing::info!(plugin = %name, version, pipeline = %slot.pipeline(), token_id = %caller.token_id, "swapped");
        }
        if had_canary {
            self.show_canary(&name, None);
        }
        drop(state);
        self.audit(&record);
        Ok(manifest)
    }

    /// Records a change of `manifest`: authorizes `caller` again (the
    /// registry may have changed while a version loaded), commits it to the
    /// shared registry and writes it to disk, then puts it in the state
    /// and answers the state, still locked, for the swaps that go with it.
    /// The Redis round trips and the fsync run with no lock held:
    /// `changing` keeps other changes out, and readers (listings, status,
    /// a reload binding its stages) see the registry as it was until the
    /// change is recorded, instead of waiting on the network and the disk.
    fn record(
        &self,
        caller: &Caller,
        manifest: &Manifest,
        record: &serde_json::Value,
    ) -> Result<MutexGuard<'_, State>> {
        self.authorize(&self.lock(), caller, &manifest.name)?;
        self.commit_shared(manifest, record.clone())?;
        self.write_manifest(manifest)?;
        let mut state = self.lock();
        state.manifests.insert(manifest.name.clone(), manifest.clone());
        Ok(state)
    }

    /// The bytes of `version` of the plugin `manifest` describes (0: its
    /// file in the plugin directory).
    fn version_bytes(&self, manifest: &Manifest, version: u32) -> Result<Vec<u8>> {
        let name = &manifest.name;
        if version == FILE_VERSION {
            return Ok(self
                .file_of(name)
                .map_err(|e| Error::not_found(format!("plugin '{name}' has no version 0: {}", e.message())))?
                .1);
        }
        let stored = manifest.versions.iter().find(|v| v.version == version).cloned().ok_or_else(|| {
            let have: Vec<String> = manifest.versions.iter().map(|v| v.version.to_string()).collect();
            Error::not_found(format!("plugin '{name}' has no version {version} (versions: {})", have.join(", ")))
        })?;
        self.read_blob(&stored)
    }

    /// `bytes` checked once against every slot, then loaded once per slot
    /// (each its own warm instances). Runs plugin code: never with the
    /// state's lock held.
    fn load_for(&self, name: &str, bytes: &[u8], slots: &[Arc<dyn PluginSlot>]) -> Result<Vec<Arc<Plugin>>> {
        let checked = self.validate(name, bytes, slots)?.counted_as(&self.metrics, name);
        let mut loaded = vec![Arc::new(checked)];
        for _ in slots.iter().skip(1) {
            loaded.push(Arc::new(
                self.load(name, bytes).map_err(|e| e.into_unprocessable(format_args!("plugin '{name}' refused")))?,
            ));
        }
        Ok(loaded)
    }

    /// Deletes an inactive version (and its blob, unless another version
    /// has the same bytes).
    pub fn delete(&self, caller: &Caller, name: &str, version: u32) -> Result<Manifest> {
        let _one = self.changing.lock().unwrap_or_else(PoisonError::into_inner);
        self.sync_locked()?;
        let state = self.lock();
        self.authorize(&state, caller, name)?;
        let mut manifest = state.manifests.get(name).cloned().ok_or_else(|| no_plugin(name))?;
        if version == FILE_VERSION {
            return Err(Error::failed_precondition(format!(
                "version 0 of plugin '{name}' is {name}.wasm in [plugins] dir; remove the file there to remove it"
            )));
        }
        if manifest.active == Some(version) {
            return Err(Error::failed_precondition(format!(
                "version {version} of plugin '{name}' is active; activate another version first"
            )));
        }
        let at = manifest
            .versions
            .iter()
            .position(|v| v.version == version)
            .ok_or_else(|| Error::not_found(format!("plugin '{name}' has no version {version}")))?;
        let removed = manifest.versions.remove(at);
        manifest.history.retain(|&v| v != version);
        let shared = state
            .manifests
            .values()
            .flat_map(|m| m.versions.iter().filter(move |v| m.name != name || v.version != version))
            .any(|v| v.sha256 == removed.sha256);
        drop(state);
        let record = audit_record(caller, "delete", name, Some(version), None, &removed.sha256);
        drop(self.record(caller, &manifest, &record)?);
        if !shared {
            let _ = std::fs::remove_file(self.blob_path(&removed.sha256));
        }
        self.audit(&record);
        Ok(self.with_file(manifest))
    }

    /// The manifests `caller` may see.
    /// Every plugin a pipeline runs or that was uploaded, version 0
    /// included, as far as `caller` may see.
    pub fn list(&self, caller: &Caller) -> Result<Vec<Manifest>> {
        let manifests: Vec<Manifest> = {
            let state = self.lock();
            let mut all: BTreeMap<String, Manifest> = state.manifests.clone();
            for (name, slots) in &state.bindings {
                all.entry(name.clone()).or_insert_with(|| Manifest {
                    name: name.clone(),
                    team: slots.first().and_then(|s| s.team().map(str::to_string)),
                    active: None,
                    history: Vec::new(),
                    versions: Vec::new(),
                    canary: None,
                });
            }
            all.into_values().filter(|m| caller.may(m.team.as_deref())).collect()
        };
        Ok(manifests.into_iter().map(|m| self.with_file(m)).collect())
    }

    /// A plugin with no upload yet whose file a pipeline runs: a manifest
    /// of version 0 alone, owned by the pipeline's team.
    fn or_file_only(&self, name: &str, manifest: Option<Manifest>, slots: &Slots) -> Result<Manifest> {
        match manifest {
            Some(manifest) => Ok(manifest),
            None if !slots.is_empty() || self.file_version(name).is_some() => Ok(Manifest {
                name: name.to_string(),
                team: slots.first().and_then(|s| s.team().map(str::to_string)),
                active: None,
                history: Vec::new(),
                versions: Vec::new(),
                canary: None,
            }),
            None => Err(no_plugin(name)),
        }
    }

    /// One manifest, when `caller` may see it.
    pub fn show(&self, caller: &Caller, name: &str) -> Result<Manifest> {
        let state = self.lock();
        let slots = state.bindings.get(name).cloned().unwrap_or_default();
        let file_only = match state.manifests.get(name) {
            Some(_) => None,
            None => Some(self.or_file_only(name, None, &slots)?),
        };
        let manifest = file_only.as_ref().or_else(|| state.manifests.get(name)).ok_or_else(|| no_plugin(name))?;
        if !caller.may(manifest.team.as_deref()) {
            return Err(Error::PermissionDenied(format!("plugin '{name}' belongs to another team")));
        }
        let manifest = manifest.clone();
        drop(state);
        Ok(self.with_file(manifest))
    }
}

fn no_plugin(name: &str) -> Error {
    Error::not_found(format!("no plugin '{name}' has been uploaded"))
}

/// The change as the shared registry's audit list keeps it: when, who
/// (token id and team, never the token), what, which versions, and the
/// replica that made it.
fn audit_record(
    caller: &Caller,
    action: &str,
    plugin: &str,
    version: Option<u32>,
    previous: Option<u32>,
    sha256: &str,
) -> serde_json::Value {
    serde_json::json!({
        "at": SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        "action": action,
        "plugin": plugin,
        "version": version,
        "previous": previous,
        "sha256": sha256,
        "token_id": caller.token_id,
        "team": caller.team,
        "admin": caller.admin,
        "replica": std::env::var("HOSTNAME").unwrap_or_default(),
    })
}

/// Runs `work`, which runs plugin code, turning a panic in it into an
/// error: checking or loading one team's plugin never takes down the
/// admin call or the start-up of another pipeline.
fn guarded<T>(work: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or_else(|_| {
        Err(Error::internal("it made sluice panic while it was checked or loaded (a bug in sluice)"))
    })
}
