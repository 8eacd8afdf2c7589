//! Model repositories in object storage: a base path such as
//! `s3://bucket/models/ranker` is mirrored, version by version, into a
//! bounded local cache (`[storage]`), and the lifecycle loads versions
//! from the mirror as from any directory. This module owns what every
//! mirror shares: the cache directory and its bound, the downloads at
//! once, the bandwidth, and the signal that a download finished (so a
//! version serves without waiting for the next poll).

mod mirror;
mod store;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sha2::Digest;
use tokio::sync::{Notify, Semaphore};

pub use self::mirror::{versions_in, Discovered, Repository};
pub use self::store::{read_log_objects, read_object, redact, shown, write_object};
use crate::config::StorageConfig;
use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// What every mirror shares.
struct Shared {
    cache_dir: std::path::PathBuf,
    cache_max: u64,
    /// Bytes of versions on disk or downloading.
    cache_bytes: AtomicU64,
    downloads: Semaphore,
    bandwidth: Option<Bandwidth>,
    marker: Option<String>,
    timeout: Duration,
    /// Told when a background download ends.
    changed: Notify,
    metrics: Arc<Metrics>,
}

impl Shared {
    /// Counts `bytes` into the cache when they fit.
    fn reserve(&self, bytes: u64) -> bool {
        let fits = self
            .cache_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|total| *total <= self.cache_max)
            })
            .is_ok();
        self.metrics.storage_cache_bytes.set(self.cache_bytes.load(Ordering::Relaxed) as i64);
        fits
    }

    fn release(&self, bytes: u64) {
        let _ =
            self.cache_bytes.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| Some(held.saturating_sub(bytes)));
        self.metrics.storage_cache_bytes.set(self.cache_bytes.load(Ordering::Relaxed) as i64);
    }
}

/// Paces downloads to a rate shared by all: each chunk takes the next
/// slot of time its size needs, and waits until the slot has passed.
struct Bandwidth {
    bytes_per_second: f64,
    next: Mutex<tokio::time::Instant>,
}

impl Bandwidth {
    async fn take(&self, bytes: usize) {
        let until = {
            let mut next = self.next.lock().unwrap_or_else(PoisonError::into_inner);
            let start = (*next).max(tokio::time::Instant::now());
            *next = start + Duration::from_secs_f64(bytes as f64 / self.bytes_per_second);
            *next
        };
        tokio::time::sleep_until(until).await;
    }
}

/// Every model's object-store repository, one mirror per model and URL.
pub struct Storage {
    shared: Arc<Shared>,
    repositories: Mutex<HashMap<(String, String), Arc<Repository>>>,
}

impl Storage {
    /// Mirrors kept under `config`'s cache; nothing is touched until a
    /// model's base path is an object store.
    pub fn new(config: &StorageConfig, metrics: Arc<Metrics>) -> Storage {
        Storage {
            shared: Arc::new(Shared {
                cache_dir: config.cache_dir(),
                cache_max: config.cache_max_bytes(),
                cache_bytes: AtomicU64::new(0),
                downloads: Semaphore::new(config.max_concurrent_downloads),
                bandwidth: config.max_download_mib_per_sec.map(|mib| Bandwidth {
                    bytes_per_second: mib * f64::from(1u32 << 20),
                    next: Mutex::new(tokio::time::Instant::now()),
                }),
                marker: config.completion_marker.clone(),
                timeout: Duration::from_secs(config.request_timeout_secs),
                changed: Notify::new(),
                metrics,
            }),
            repositories: Mutex::default(),
        }
    }

    /// The mirror of `url` for `model`, opened on first use.
    pub fn repository(&self, model: &str, url: &Path) -> Result<Arc<Repository>> {
        let url =
            url.to_str().ok_or_else(|| Error::invalid_argument(format!("model '{model}': base path is not UTF-8")))?;
        let key = (model.to_string(), url.to_string());
        let mut repositories = self.repositories.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(repository) = repositories.get(&key) {
            return Ok(repository.clone());
        }
        crate::private_files::ensure_private_dir(&self.shared.cache_dir, "the model cache (storage.cache_dir)")?;
        let opened = store::open(url, self.shared.timeout)?;
        // One directory per model and store: readable, and unique (the
        // same bucket name at another endpoint is another store).
        let mut hasher = sha2::Sha256::new();
        // The model's own name too: `a.b` and `a_b` read the same below.
        hasher.update(model.as_bytes());
        hasher.update(b"\n");
        hasher.update(url.as_bytes());
        for name in [
            "S3_ENDPOINT",
            "AWS_ENDPOINT",
            "AWS_ENDPOINT_URL",
            "STORAGE_EMULATOR_HOST",
            "GOOGLE_BASE_URL",
            "AZURITE_BLOB_STORAGE_URL",
        ] {
            hasher.update(format!("\n{name}={}", std::env::var(name).unwrap_or_default()).as_bytes());
        }
        let digest = hex::encode(&hasher.finalize()[..6]);
        let name: String =
            model.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
        let local = self.shared.cache_dir.join(format!("{name}-{digest}"));
        let repository = Arc::new(Repository::new(model, &shown(url), opened, local, self.shared.clone())?);
        repositories.insert(key, repository.clone());
        Ok(repository)
    }

    /// Keeps the mirrors of the models `served` (name and base path) and
    /// purges the rest: models a reload removed or moved, and directories
    /// a previous run left for models no longer configured (unless another
    /// process holds them). Called at start-up and after each reload.
    pub fn retain(&self, served: &[(String, std::path::PathBuf)]) {
        let keys: std::collections::HashSet<(String, String)> =
            served.iter().map(|(name, path)| (name.clone(), path.display().to_string())).collect();
        let mut repositories = self.repositories.lock().unwrap_or_else(PoisonError::into_inner);
        let gone: Vec<(String, String)> = repositories.keys().filter(|k| !keys.contains(*k)).cloned().collect();
        for key in gone {
            if let Some(repository) = repositories.remove(&key) {
                repository.purge();
            }
        }
        let live: Vec<std::path::PathBuf> = repositories.values().map(|r| r.local().to_path_buf()).collect();
        drop(repositories);
        let Ok(entries) = std::fs::read_dir(&self.shared.cache_dir) else { return };
        for entry in entries.flatten() {
            let dir = entry.path();
            // Only a mirror (it has the lock file a mirror makes): a cache_dir
            // pointed at a directory with other things in it keeps them.
            let mirror = dir.join(".lock").is_file();
            if mirror && dir.is_dir() && !live.contains(&dir) && !mirror::held_elsewhere(&dir) {
                tracing::info!("removing {} from the model cache: no configured model uses it", dir.display());
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }

    /// Resolves when a background download has ended: the versions on
    /// disk changed, and a poll now serves the new one without waiting.
    pub async fn changed(&self) {
        self.shared.changed.notified().await;
    }
}
