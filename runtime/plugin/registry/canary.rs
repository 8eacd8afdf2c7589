//! Canary rollouts in the registry: a stored version started beside the
//! active one on every stage running the plugin, taking a share of the
//! calls; promoted (made active) or ended by command, or rolled back on its
//! own when a stage sees it do worse than the stable version
//! (`pipeline::stages::canary` judges). Like every change, it is recorded
//! in the shared registry first, so every replica runs the same canary and
//! a rollback on one replica ends it on all.

use std::sync::{Arc, PoisonError};

use super::{audit_record, Caller, CanaryVersion, Manifest, PluginRegistry, PluginSlot, FILE_VERSION};
use crate::error::{Error, Result};
use crate::metrics::PluginNameLabels;

impl PluginRegistry {
    /// Starts `version` of `name` as a canary taking `percent` of the calls
    /// of every stage that runs it, beside the active version; replaces a
    /// canary already running.
    pub fn start_canary(&self, caller: &Caller, name: &str, version: u32, percent: f64) -> Result<Manifest> {
        if !(percent > 0.0 && percent < 100.0) {
            return Err(Error::invalid_argument(format!(
                "canary percent = {percent}: expected more than 0 and less than 100 (100 is an activation)"
            )));
        }
        let _one = self.changing.lock().unwrap_or_else(PoisonError::into_inner);
        self.sync_locked()?;
        let (manifest, slots) = self.to_change(caller, name)?;
        let mut manifest = self.or_file_only(name, manifest, &slots)?;
        if slots.is_empty() {
            return Err(Error::failed_precondition(format!(
                "no pipeline runs plugin '{name}': a canary needs a stage to share calls with"
            )));
        }
        let active = manifest.active.or_else(|| self.file_version(name).map(|_| FILE_VERSION));
        if active == Some(version) {
            return Err(Error::failed_precondition(format!(
                "version {version} of plugin '{name}' is the active one; a canary runs another version beside it"
            )));
        }
        let bytes = self.version_bytes(&manifest, version)?;
        let loaded = self.load_for(name, &bytes, &slots)?;
        manifest.canary = Some(CanaryVersion { version, percent });
        let mut record = audit_record(caller, "canary", name, Some(version), active, "");
        record["percent"] = serde_json::json!(percent);
        drop(self.record(caller, &manifest, &record)?);
        for (slot, plugin) in slots.iter().zip(loaded) {
            plugin.accepted();
            slot.set_canary(Some((plugin, version, percent)), &self.metrics)?;
            tracing::info!(plugin = name, version, percent, pipeline = slot.pipeline(), "canary started");
        }
        self.show_canary(name, Some(percent));
        self.audit(&record);
        Ok(self.with_file(manifest))
    }

    /// Makes the running canary of `name` the active version.
    pub fn promote(&self, caller: &Caller, name: &str) -> Result<Manifest> {
        let canary = self.show(caller, name)?.canary.ok_or_else(|| no_canary(name))?;
        self.activate(caller, name, canary.version)
    }

    /// Ends the canary of `name` by command: every stage serves the active
    /// version alone again.
    pub fn end_canary(&self, caller: &Caller, name: &str) -> Result<Manifest> {
        let _one = self.changing.lock().unwrap_or_else(PoisonError::into_inner);
        self.sync_locked()?;
        let (manifest, slots) = self.to_change(caller, name)?;
        let manifest = manifest.filter(|m| m.canary.is_some()).ok_or_else(|| no_canary(name))?;
        self.stop_canary(caller, manifest, &slots, "canary_end")
    }

    /// A stage saw the canary `version` of `name` fail its judgement (and
    /// stopped it there): ends it on every stage and replica, with a log
    /// line, an audit entry and `sluice_canary_rollbacks`. Runs on a thread
    /// of its own, as the stage's worker must go on serving.
    pub fn canary_failed(self: &Arc<Self>, name: &str, version: u32, pipeline: &str, why: &str) {
        let (registry, plugin, why, pipeline) = (self.clone(), name.to_string(), why.to_string(), pipeline.to_string());
        let spawned = std::thread::Builder::new().name("canary-rollback".into()).spawn(move || {
            let caller = Caller { token_id: "sluice (automatic rollback)".into(), team: None, admin: true };
            let _one = registry.changing.lock().unwrap_or_else(PoisonError::into_inner);
            if let Err(error) = registry.sync_locked() {
                tracing::warn!(plugin = %plugin, "rolling the canary back without the shared registry's latest: {error}");
            }
            let (manifest, slots) = {
                let state = registry.lock();
                (state.manifests.get(&plugin).cloned(), state.bindings.get(&plugin).cloned().unwrap_or_default())
            };
            // Another replica (or a command) may have ended it already.
            let Some(manifest) = manifest.filter(|m| m.canary.as_ref().is_some_and(|c| c.version == version)) else {
                for slot in slots.iter().filter(|slot| slot.canary().is_some_and(|(v, _)| v == version)) {
                    let _ = slot.set_canary(None, &registry.metrics);
                }
                return;
            };
            // Counted once, by the report that ends it (every stage of the
            // plugin may see the canary fail).
            tracing::error!(plugin = %plugin, version, pipeline = %pipeline, "canary rolled back: {why}");
            registry.metrics.canary_rollbacks.get_or_create(&PluginNameLabels { plugin: plugin.clone() }).inc();
            let action = format!("canary_rollback: {why}");
            if let Err(error) = registry.stop_canary(&caller, manifest, &slots, &action) {
                tracing::error!(plugin = %plugin, "the failed canary could not be recorded as rolled back: {error}");
                for slot in &slots {
                    let _ = slot.set_canary(None, &registry.metrics);
                }
            }
        });
        if let Err(error) = spawned {
            tracing::error!(plugin = name, "cannot start the canary rollback thread: {error}");
        }
    }

    /// Records that `manifest`'s canary ended (`action` says how), then
    /// stops it on `slots`.
    fn stop_canary(
        &self,
        caller: &Caller,
        mut manifest: Manifest,
        slots: &[Arc<dyn PluginSlot>],
        action: &str,
    ) -> Result<Manifest> {
        let name = manifest.name.clone();
        let ended = manifest.canary.take();
        let version = ended.as_ref().map(|c| c.version);
        let record = audit_record(caller, action, &name, version, manifest.active, "");
        drop(self.record(caller, &manifest, &record)?);
        for slot in slots {
            slot.set_canary(None, &self.metrics)?;
        }
        self.show_canary(&name, None);
        self.audit(&record);
        Ok(self.with_file(manifest))
    }

    /// Makes `slots` run `manifest`'s canary (or none), as another replica
    /// recorded it or as a stage binds. Loads plugin code: never with the
    /// state's lock held.
    pub(super) fn apply_canary(&self, manifest: &Manifest, slots: &[Arc<dyn PluginSlot>]) -> Result<()> {
        let wanted = manifest.canary.as_ref().map(|c| (c.version, c.percent));
        let behind: Vec<Arc<dyn PluginSlot>> = slots.iter().filter(|s| s.canary() != wanted).cloned().collect();
        if behind.is_empty() {
            return Ok(());
        }
        let Some(canary) = &manifest.canary else {
            for slot in &behind {
                slot.set_canary(None, &self.metrics)?;
            }
            self.show_canary(&manifest.name, None);
            return Ok(());
        };
        let bytes = self.version_bytes(manifest, canary.version)?;
        let loaded = self.load_for(&manifest.name, &bytes, &behind)?;
        for (slot, plugin) in behind.iter().zip(loaded) {
            plugin.accepted();
            slot.set_canary(Some((plugin, canary.version, canary.percent)), &self.metrics)?;
            tracing::info!(plugin = %manifest.name, version = canary.version, percent = canary.percent, pipeline = slot.pipeline(), "canary serving, as the shared registry says");
        }
        self.show_canary(&manifest.name, Some(canary.percent));
        Ok(())
    }

    /// `sluice_canary_percent` of `name`.
    pub(super) fn show_canary(&self, name: &str, percent: Option<f64>) {
        self.metrics
            .canary_percent
            .get_or_create(&PluginNameLabels { plugin: name.to_string() })
            .set(percent.unwrap_or(0.0));
    }
}

fn no_canary(name: &str) -> Error {
    Error::failed_precondition(format!(
        "plugin '{name}' runs no canary; start one with `sluice plugin activate {name} VERSION --canary PERCENT`"
    ))
}
