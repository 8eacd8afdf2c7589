//! Model repositories in object storage: the `[storage]` table (where
//! downloaded versions are kept, how fast and how many download at once,
//! what marks a version complete) and which base paths are object-store
//! URLs. The machinery that reads it is `models::storage`.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The URL schemes a model base path may have besides a local directory.
pub const OBJECT_STORE_SCHEMES: &[&str] = &["s3", "gs", "az", "abfs", "abfss", "http", "https"];

/// Whether `base_path` names an object store (`s3://bucket/models/m`,
/// `gs://…`, `az://…`, `abfs(s)://…`, `http(s)://…`) rather than a
/// local directory.
pub fn is_object_store_url(base_path: &Path) -> bool {
    base_path
        .to_str()
        .and_then(|path| path.split_once("://"))
        .is_some_and(|(scheme, _)| OBJECT_STORE_SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()))
}

/// The `[storage]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// Where versions downloaded from object stores are kept (owner-only),
    /// one directory per base path. Unset: a directory of this user's in
    /// the system's temporary directory.
    pub cache_dir: Option<PathBuf>,
    /// The most the cache may hold, in GiB: versions no longer served are
    /// evicted first; a version that would not fit beside the served ones
    /// is not downloaded (its status says so).
    pub cache_max_gib: f64,
    /// Objects downloading at once, across every model.
    pub max_concurrent_downloads: usize,
    /// Download bandwidth across every model, in MiB/s; unset: unbounded.
    pub max_download_mib_per_sec: Option<f64>,
    /// The name of an object that marks a version's upload complete
    /// (`_SUCCESS`, `DONE`): when set, a version is downloaded once that
    /// object is in it, and never before. Unset: once its listing (names,
    /// sizes, ETags) is the same in two polls in a row.
    pub completion_marker: Option<String>,
    /// Seconds one request to the store may take (a listing page, an
    /// object's download is bounded by its size and the bandwidth instead).
    pub request_timeout_secs: u64,
}

impl StorageConfig {
    /// Where downloaded versions are kept.
    pub fn cache_dir(&self) -> PathBuf {
        self.cache_dir.clone().unwrap_or_else(|| {
            // SAFETY: geteuid has no preconditions.
            let uid = unsafe { libc::geteuid() };
            std::env::temp_dir().join(format!("sluice-model-storage-{uid}"))
        })
    }

    /// `cache_max_gib` in bytes.
    pub fn cache_max_bytes(&self) -> u64 {
        (self.cache_max_gib * (1u64 << 30) as f64) as u64
    }
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            cache_dir: None,
            cache_max_gib: 50.0,
            max_concurrent_downloads: 8,
            max_download_mib_per_sec: None,
            completion_marker: None,
            request_timeout_secs: 30,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_store_urls_are_told_from_directories() {
        for url in ["s3://bucket/models/m", "gs://b/m", "az://c/m", "abfss://c@a.dfs.core.windows.net/m", "HTTPS://h/m"]
        {
            assert!(is_object_store_url(Path::new(url)), "{url}");
        }
        for path in ["/models/m", "models/m", "file:/x", "ftp://h/m", "s3:/bucket"] {
            assert!(!is_object_store_url(Path::new(path)), "{path}");
        }
    }
}
