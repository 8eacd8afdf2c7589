//! The embedded feature store: a table file loaded into memory
//! ([`file::TableData`]), looked up without leaving the request's task,
//! and reloaded in the background when the file changes.
//!
//! A reload reads the whole new file beside the old table and swaps one
//! pointer: a lookup sees the old table or the new one, never a mix. A new
//! file that does not read (a bad row, a missing column) is refused with a
//! log line and a metric, and the old table keeps serving; the file is
//! tried again when it next changes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use futures::future::BoxFuture;
use tokio::time::Instant;

use super::file::{self, TableData};
use super::{Column, FeatureStore, Found, Keys, Schema};
use crate::config::features::{StoreKind, TableConfig};
use crate::error::{Error, Result};
use crate::metrics::FeatureMetrics;

/// A table kept in memory.
pub struct EmbeddedStore {
    shared: Arc<Shared>,
}

/// What the store and its reload thread share; the thread holds it weakly
/// and stops once the store is dropped.
struct Shared {
    schema: Schema,
    table: ArcSwap<TableData>,
    metrics: FeatureMetrics,
}

/// What identifies one version of a file: a new write changes one of them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileVersion {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

impl FileVersion {
    fn of(path: &Path) -> Option<FileVersion> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).ok()?;
        Some(FileVersion { modified: meta.modified().ok(), len: meta.len(), inode: meta.ino() })
    }
}

impl EmbeddedStore {
    /// Loads table `name` from its file (blocking) and, when
    /// `reload_interval_ms` is set, starts watching the file.
    pub fn open(name: &str, config: &TableConfig, metrics: FeatureMetrics) -> Result<EmbeddedStore> {
        let path = config.file.clone().ok_or_else(|| {
            Error::internal(format!("embedded table '{name}' has no file; the config check allows none, this is a bug"))
        })?;
        let schema = Schema::of(name, config);
        let version = FileVersion::of(&path);
        let table =
            file::read(&path, &schema, &config.key).map_err(|e| e.context(format_args!("feature table '{name}'")))?;
        tracing::info!(table = name, rows = table.len(), file = %path.display(), "feature table loaded");
        let shared = Arc::new(Shared { schema, table: ArcSwap::from_pointee(table), metrics });
        if config.reload_interval_ms > 0 {
            let watch = Watch {
                shared: Arc::downgrade(&shared),
                path,
                key: config.key.clone(),
                every: Duration::from_millis(config.reload_interval_ms),
                loaded: version,
            };
            crate::threads::spawn_background(format!("features-{name}"), move || watch.run())
                .map_err(|e| Error::internal(format!("starting the reload thread of table '{name}' failed: {e}")))?;
        }
        Ok(EmbeddedStore { shared })
    }
}

impl FeatureStore for EmbeddedStore {
    fn schema(&self) -> &Schema {
        &self.shared.schema
    }

    fn kind(&self) -> StoreKind {
        StoreKind::Embedded
    }

    fn lookup<'a>(&'a self, keys: Keys<'a>, wanted: &'a [usize], _: Option<Instant>) -> BoxFuture<'a, Result<Found>> {
        let started = std::time::Instant::now();
        let shared = &self.shared;
        let table = shared.table.load();
        let mut found: Found =
            wanted.iter().map(|&f| Column::empty(&shared.schema.features[f].1, keys.len())).collect();
        let mut hits = 0;
        for i in 0..keys.len() {
            if let Some(row) = keys.with(i, |key| table.row(key)) {
                hits += 1;
                for (column, &f) in found.iter_mut().zip(wanted) {
                    table.copy_into(row, f, column, i);
                }
            }
        }
        let metrics = &shared.metrics;
        metrics.lookups.inc();
        metrics.hits.inc_by(hits as u64);
        metrics.misses.inc_by((keys.len() - hits) as u64);
        metrics.seconds.observe(started.elapsed().as_secs_f64());
        Box::pin(std::future::ready(Ok(found)))
    }
}

/// The reload thread's state.
struct Watch {
    shared: Weak<Shared>,
    path: PathBuf,
    key: String,
    every: Duration,
    /// The version last loaded, or last refused (tried again only once the
    /// file changes).
    loaded: Option<FileVersion>,
}

/// How long a changed file must stay unchanged before it is read, so a
/// file being written in place is not read half written.
const SETTLE: Duration = Duration::from_millis(50);

impl Watch {
    fn run(mut self) {
        loop {
            std::thread::sleep(self.every);
            let Some(shared) = self.shared.upgrade() else { return };
            let version = FileVersion::of(&self.path);
            if version.is_none() || version == self.loaded {
                continue;
            }
            std::thread::sleep(SETTLE);
            if FileVersion::of(&self.path) != version {
                continue;
            }
            let table = &shared.schema.table;
            let read = file::read(&self.path, &shared.schema, &self.key);
            // Changed while being read (a slow writer): read again next time.
            if FileVersion::of(&self.path) != version {
                continue;
            }
            self.loaded = version;
            match read {
                Ok(data) => {
                    tracing::info!(table, rows = data.len(), file = %self.path.display(), "feature table reloaded");
                    shared.table.store(Arc::new(data));
                    shared.metrics.reloads.inc();
                }
                Err(error) => {
                    tracing::error!(
                        table,
                        file = %self.path.display(),
                        "feature table reload refused, the previous table keeps serving: {error}"
                    );
                    shared.metrics.refused_reloads.inc();
                }
            }
        }
    }
}
