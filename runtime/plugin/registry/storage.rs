//! The registry's files: `NAME.wasm` as version 0, content-addressed blobs
//! checked against their hashes when read, and manifests written
//! atomically and checked when read.

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use super::{PluginRegistry, FILE_VERSION};
use crate::config::check_name;
use crate::error::{Error, Result};
use crate::plugin::manifest::{Manifest, StoredVersion};
use crate::plugin::store::{sha256_hex, write_atomically};

impl PluginRegistry {
    /// `NAME.wasm` in the plugin directory: version 0.
    pub(super) fn file_of(&self, name: &str) -> Result<(PathBuf, Vec<u8>)> {
        let path = self.config.path_of(name)?;
        let bytes = std::fs::read(&path)
            .map_err(|e| Error::invalid_argument(format!("cannot read plugin {}: {e}", path.display())))?;
        Ok((path, bytes))
    }

    /// Version 0 as a stored version is described: the file's hash, size
    /// and time; `None` when there is no file.
    pub(super) fn file_version(&self, name: &str) -> Option<StoredVersion> {
        let (path, bytes) = self.file_of(name).ok()?;
        let modified = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
        Some(StoredVersion {
            version: FILE_VERSION,
            sha256: sha256_hex(&bytes),
            size: bytes.len() as u64,
            declared: format!("{}", path.display()),
            uploaded_at: modified.and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map_or(0, |d| d.as_secs()),
            uploaded_by: "[plugins] dir".to_string(),
        })
    }

    /// A manifest as clients see it: version 0 (the file) among the
    /// versions, and active while nothing else is.
    pub(super) fn with_file(&self, mut manifest: Manifest) -> Manifest {
        if let Some(file) = self.file_version(&manifest.name) {
            manifest.versions.insert(0, file);
            if manifest.active.is_none() {
                manifest.active = Some(FILE_VERSION);
            }
        }
        manifest
    }

    pub(super) fn blob_path(&self, sha256: &str) -> PathBuf {
        self.blobs.join(format!("{sha256}.wasm"))
    }

    pub(super) fn read_blob(&self, stored: &StoredVersion) -> Result<Vec<u8>> {
        self.read_blob_at(&self.blob_path(&stored.sha256), &stored.sha256)
    }

    /// The blob's bytes, refused when they no longer hash to its name.
    pub(super) fn read_blob_at(&self, path: &Path, sha256: &str) -> Result<Vec<u8>> {
        let bytes = std::fs::read(path).map_err(|e| Error::internal(format!("cannot read {}: {e}", path.display())))?;
        let actual = sha256_hex(&bytes);
        if actual != sha256 {
            return Err(Error::internal(format!(
                "{} is corrupted: its SHA-256 is {actual}, the manifest says {sha256}",
                path.display()
            )));
        }
        Ok(bytes)
    }

    pub(super) fn write_manifest(&self, manifest: &Manifest) -> Result<()> {
        let path = self.manifests.join(format!("{}.json", manifest.name));
        let bytes = serde_json::to_vec_pretty(manifest)
            .map_err(|e| Error::internal(format!("encoding the manifest failed: {e}")))?;
        write_atomically(&path, &bytes).map_err(|e| Error::internal(format!("writing {}: {e}", path.display())))
    }
}

pub(super) fn read_manifest(path: &Path) -> Result<Manifest> {
    let bytes = std::fs::read(path).map_err(|e| Error::internal(e.to_string()))?;
    let manifest: Manifest =
        serde_json::from_slice(&bytes).map_err(|e| Error::internal(format!("not a manifest: {e}")))?;
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
    if manifest.name != stem {
        return Err(Error::internal(format!("it names plugin '{}', but the file is {stem}.json", manifest.name)));
    }
    check_name("name", &manifest.name)?;
    if let Some(active) = manifest.active.filter(|&a| a != FILE_VERSION) {
        if !manifest.versions.iter().any(|v| v.version == active) {
            return Err(Error::internal(format!("active version {active} is not among its versions")));
        }
    }
    if let Some(bad) =
        manifest.versions.iter().find(|v| v.sha256.len() != 64 || !v.sha256.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return Err(Error::internal(format!("version {} has a malformed sha256 \"{}\"", bad.version, bad.sha256)));
    }
    Ok(manifest)
}

/// The version of plugin `name` that a server with `[plugins] dir =
/// plugins_dir` would start with from its own store, when one was uploaded
/// and activated: its number and its blob. `None`: no upload is active, so
/// `NAME.wasm` (version 0) serves. Read without opening the registry
/// (`sluice config check`); with `[plugins.shared]` the shared registry
/// decides at start instead.
pub fn active_upload(plugins_dir: &Path, name: &str) -> Result<Option<(u32, PathBuf)>> {
    let store = plugins_dir.join("store");
    let path = store.join("manifests").join(format!("{name}.json"));
    if !path.is_file() {
        return Ok(None);
    }
    let manifest = read_manifest(&path).map_err(|e| e.context(format_args!("{}", path.display())))?;
    let Some(active) = manifest.active.filter(|&v| v != FILE_VERSION) else { return Ok(None) };
    let stored = manifest
        .versions
        .iter()
        .find(|v| v.version == active)
        .ok_or_else(|| Error::internal(format!("{}: active version {active} is not stored", path.display())))?;
    Ok(Some((active, store.join("blobs").join(format!("{}.wasm", stored.sha256)))))
}
