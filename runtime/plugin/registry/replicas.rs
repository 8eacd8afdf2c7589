//! The registry across replicas (`[plugins.shared]`): waiting for the
//! shared state before serving, following each change another replica
//! makes, applying a manifest as the shared registry has it, and
//! recording a change there before it is applied here.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError, Weak};
use std::time::Duration;

use super::{PluginRegistry, Slots, FILE_VERSION};
use crate::config::check_name;
use crate::error::{Error, Result};
use crate::plugin::manifest::Manifest;
use crate::plugin::shared::SharedRegistry;
use crate::plugin::store::write_atomically;

impl PluginRegistry {
    /// Waits until this replica has the shared registry's plugins and
    /// manifests in its store, retrying while Redis does not answer: a new
    /// replica starts with every active plugin, and is not ready before.
    /// With `give_up_after`, a registry that has not answered by then is
    /// left to `follow` and the replica starts from its own store.
    /// Blocking.
    pub fn wait_for_shared(&self, give_up_after: Option<Duration>, stopping: impl Fn() -> bool) -> Result<()> {
        if self.shared.is_none() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let mut wait = Duration::from_millis(100);
        loop {
            match self.sync() {
                Ok(_) => {
                    tracing::info!(revision = self.revision(), "plugins in step with the shared registry");
                    return Ok(());
                }
                Err(Error::Unavailable(error)) if give_up_after.is_some_and(|after| started.elapsed() >= after) => {
                    tracing::error!(
                        waited_secs = started.elapsed().as_secs(),
                        "starting from this replica's own plugin store: the shared plugin registry has not \
                         answered ({error}); its plugins may be out of step with the other replicas' until it \
                         does (plugins.shared.start_wait_secs)"
                    );
                    return Ok(());
                }
                // Redis not answering: wait for it, not ready meanwhile.
                Err(error @ Error::Unavailable(_)) if !stopping() => {
                    tracing::warn!("waiting for the shared plugin registry before serving: {error}");
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(Duration::from_secs(2));
                }
                Err(error @ Error::Unavailable(_)) => return Err(error),
                // What it holds is bad (a corrupted blob): waiting would
                // not help. The stages fall back as with a bad local
                // store, and each later change retries.
                Err(error) => {
                    tracing::error!("starting without part of the shared plugin registry: {error}");
                    return Ok(());
                }
            }
        }
    }

    /// Follows the shared registry from now on: each change another
    /// replica makes is applied here (`sync` on a blocking thread, one at
    /// a time, never more than one queued).
    pub fn follow(self: &Arc<Self>) {
        let Some(shared) = &self.shared else { return };
        let registry: Weak<PluginRegistry> = Arc::downgrade(self);
        shared.watch(move || {
            let Some(registry) = registry.upgrade() else { return };
            if registry.sync_queued.swap(true, Ordering::AcqRel) {
                return;
            }
            tokio::task::spawn_blocking(move || {
                registry.sync_queued.store(false, Ordering::Release);
                if let Err(error) = registry.sync() {
                    tracing::warn!("plugins not in step with the shared registry: {error}");
                }
            });
        });
    }

    /// Applies the shared registry's changes since the revision this
    /// replica has: fetches missing blobs (checked against their hashes),
    /// writes the manifests here, and swaps every stage whose active
    /// version changed. Answers whether anything changed. Blocking.
    pub fn sync(&self) -> Result<bool> {
        let _one = self.changing.lock().unwrap_or_else(PoisonError::into_inner);
        self.sync_locked()
    }

    pub(super) fn sync_locked(&self) -> Result<bool> {
        let Some(shared) = &self.shared else { return Ok(false) };
        let snapshot = shared.snapshot().inspect_err(|_| {
            self.metrics.plugin_registry_sync_failures.inc();
        })?;
        if snapshot.revision == self.revision() {
            return Ok(false);
        }
        let (mut failed, mut unreachable) = (Vec::new(), false);
        for manifest in snapshot.manifests.values() {
            if let Err(error) = self.apply_shared(shared, manifest) {
                tracing::error!(plugin = %manifest.name, "shared plugin change not applied here: {error}");
                unreachable |= matches!(error, Error::Unavailable(_));
                failed.push(format!("{}: {error}", manifest.name));
            }
        }
        if !failed.is_empty() {
            self.metrics.plugin_registry_sync_failures.inc();
            let message = format!(
                "revision {} of the shared plugin registry could not be applied: {}",
                snapshot.revision,
                failed.join("; ")
            );
            return Err(if unreachable { Error::unavailable(message) } else { Error::internal(message) });
        }
        tracing::info!(from = self.revision(), to = snapshot.revision, "applied the shared plugin registry");
        self.set_revision(snapshot.revision);
        Ok(true)
    }

    pub(super) fn set_revision(&self, revision: u64) {
        self.revision.store(revision, Ordering::Release);
        self.metrics.plugin_registry_revision.set(i64::try_from(revision).unwrap_or(i64::MAX));
    }

    /// Makes one plugin here as the shared registry has it.
    pub(super) fn apply_shared(&self, shared: &SharedRegistry, manifest: &Manifest) -> Result<()> {
        check_name("name", &manifest.name)?;
        let name = &manifest.name;
        for version in &manifest.versions {
            let path = self.blob_path(&version.sha256);
            if self.read_blob_at(&path, &version.sha256).is_err() {
                let bytes = shared.blob(&version.sha256)?;
                write_atomically(&path, &bytes)
                    .map_err(|e| Error::internal(format!("storing {}: {e}", path.display())))?;
            }
        }
        let (local, slots) = {
            let state = self.lock();
            (state.manifests.get(name).cloned(), state.bindings.get(name).cloned().unwrap_or_default())
        };
        // A pipeline runs only its own team's uploads.
        let slots: Slots = slots.into_iter().filter(|slot| slot.team() == manifest.team.as_deref()).collect();
        let active = manifest.active.unwrap_or(FILE_VERSION);
        let behind: Slots = slots.iter().filter(|slot| slot.running().0 != active).cloned().collect();
        let wanted = manifest.canary.as_ref().map(|c| (c.version, c.percent));
        let canary_behind = slots.iter().any(|slot| slot.canary() != wanted);
        if local.as_ref() == Some(manifest) && behind.is_empty() && !canary_behind {
            return Ok(());
        }
        let mut loaded = Vec::with_capacity(behind.len());
        if !behind.is_empty() {
            let bytes = if active == FILE_VERSION {
                self.file_of(name)?.1
            } else {
                let stored =
                    manifest.versions.iter().find(|v| v.version == active).ok_or_else(|| {
                        Error::internal(format!("its active version {active} is not among its versions"))
                    })?;
                self.read_blob(stored)?
            };
            loaded.push(Arc::new(self.validate(name, &bytes, &behind)?.counted_as(&self.metrics, name)));
            for _ in behind.iter().skip(1) {
                loaded.push(Arc::new(self.load(name, &bytes)?));
            }
        }
        self.write_manifest(manifest)?;
        let mut state = self.lock();
        state.manifests.insert(name.clone(), manifest.clone());
        for (slot, plugin) in behind.iter().zip(loaded) {
            plugin.accepted();
            slot.swap(plugin, active)?;
            tracing::info!(plugin = %name, version = active, pipeline = %slot.pipeline(), "swapped, as the shared registry says");
        }
        drop(state);
        if canary_behind {
            self.apply_canary(manifest, &slots)?;
        }
        Ok(())
    }

    /// Records a change in the shared registry before it is applied here;
    /// nothing without one. Fails (and nothing changes) when another
    /// replica changed the registry since this one last synced.
    pub(super) fn commit_shared(&self, manifest: &Manifest, audit: serde_json::Value) -> Result<()> {
        let Some(shared) = &self.shared else { return Ok(()) };
        let revision = shared.commit(self.revision(), manifest, &audit)?;
        self.set_revision(revision);
        Ok(())
    }
}
