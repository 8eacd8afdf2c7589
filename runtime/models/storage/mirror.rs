//! One model's repository in an object store, mirrored into the local
//! cache so that the rest of the lifecycle reads it as any directory.
//!
//! Each poll lists the store once. A version is *complete* when its
//! listing (names, sizes, ETags) is the same as at the previous poll, or
//! at once when it holds the completion marker: object stores have no
//! atomic rename, and a version read while its upload runs is the failure
//! TF Serving is known for. A complete version the policy wants is
//! downloaded in the background into a hidden directory, each object read
//! on the precondition that its ETag is still the listed one and checked
//! against its listed size, then renamed into place: only whole versions
//! are ever seen by the loader. (An S3 ETag is not always the object's
//! MD5: not for multipart uploads, nor under SSE-KMS or SSE-C encryption;
//! so it is used as a version tag, never compared with the bytes.) The store
//! being down changes nothing that serves; it is logged once per outage.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, ObjectStore};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use super::store::redact;
use super::Shared;
use crate::config::VersionPolicy;
use crate::error::{Error, Result};
use crate::metrics::{ModelNameLabels, StorageLabels};
use crate::models::repository::{self, MODEL_FILE, SAVED_MODEL_FILE};

/// The most objects one listing may hold: a prefix pointed at the wrong
/// place (a bucket's root) is refused rather than held in memory.
const MAX_LISTED_OBJECTS: usize = 200_000;

/// The longest a failed download waits before it is tried again.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// One object of a version, relative to the version's directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Object {
    /// Its path inside the version (`variables/variables.index`).
    path: String,
    /// Its key in the store.
    location: String,
    size: u64,
    e_tag: Option<String>,
}

/// What a version holds in the store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Listing {
    objects: Vec<Object>,
}

impl Listing {
    /// Its bytes in all; saturating, so that sizes a broken or hostile
    /// store lists cannot wrap around to a small number that fits.
    fn bytes(&self) -> u64 {
        self.objects.iter().fold(0u64, |sum, o| sum.saturating_add(o.size))
    }

    fn has(&self, path: &str) -> bool {
        self.objects.iter().any(|o| o.path == path)
    }

    /// Whether it holds a model a version directory is served from.
    fn has_model(&self) -> bool {
        self.has(MODEL_FILE) || self.has(SAVED_MODEL_FILE)
    }
}

/// A failed download, and when it is tried again.
struct Failure {
    listing: Listing,
    attempts: u32,
    retry_at: Instant,
}

/// Since when the store cannot be listed.
struct Outage {
    since: Instant,
    polls: u64,
}

#[derive(Default)]
struct State {
    /// The last listing that succeeded and when it was taken; None before
    /// the first.
    listed: Option<(Instant, BTreeMap<i64, Listing>)>,
    /// Versions whole on disk, with what they were downloaded from.
    downloaded: BTreeMap<i64, Listing>,
    downloading: BTreeSet<i64>,
    failures: BTreeMap<i64, Failure>,
    /// Download failures not yet reported to the lifecycle.
    unreported: Vec<(i64, Error)>,
    outage: Option<Outage>,
}

/// What a poll of the repository found.
pub struct Discovered {
    /// Versions whole on disk and still in the store: their model file.
    pub versions: BTreeMap<i64, PathBuf>,
    /// Versions whose download failed since the last poll.
    pub failed: Vec<(i64, Error)>,
}

struct RepositoryMetrics {
    unreachable: Gauge,
    list_errors: Counter,
    download_errors: Counter,
    downloaded: Counter,
    download_failures: Counter,
    refused: Counter,
    bytes: Counter,
}

/// A model's base path in an object store and its local mirror.
pub struct Repository {
    model: String,
    url: String,
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    /// The mirror: `VERSION/` directories and their `.VERSION.listing`.
    local: PathBuf,
    shared: Arc<Shared>,
    state: Mutex<State>,
    metrics: RepositoryMetrics,
    /// Held for the repository's life: one process per mirror.
    _lock: std::fs::File,
}

impl Repository {
    /// The mirror of `url` for `model` in `local`; versions a previous run
    /// downloaded whole are taken up again, anything else there removed.
    pub(super) fn new(
        model: &str,
        url: &str,
        opened: super::store::Opened,
        local: PathBuf,
        shared: Arc<Shared>,
    ) -> Result<Repository> {
        std::fs::create_dir_all(&local)
            .map_err(|e| Error::unavailable(format!("cannot create the model cache {}: {e}", local.display())))?;
        let lock = lock(&local)?;
        let downloaded = take_up(&local);
        shared.cache_bytes.fetch_add(downloaded.values().map(Listing::bytes).sum(), Ordering::Relaxed);
        shared.metrics.storage_cache_bytes.set(shared.cache_bytes.load(Ordering::Relaxed) as i64);
        let metrics = &shared.metrics;
        let labels = |outcome| StorageLabels { model: model.to_string(), outcome };
        let metrics = RepositoryMetrics {
            unreachable: metrics.storage_unreachable.get_or_create_owned(&ModelNameLabels { model: model.to_string() }),
            list_errors: metrics.storage_errors.get_or_create_owned(&labels("list")),
            download_errors: metrics.storage_errors.get_or_create_owned(&labels("download")),
            downloaded: metrics.storage_downloads.get_or_create_owned(&labels("ok")),
            download_failures: metrics.storage_downloads.get_or_create_owned(&labels("failed")),
            refused: metrics.storage_downloads.get_or_create_owned(&labels("refused")),
            bytes: metrics.storage_downloaded_bytes.get_or_create_owned(&ModelNameLabels { model: model.to_string() }),
        };
        Ok(Repository {
            model: model.to_string(),
            url: url.to_string(),
            store: opened.store,
            prefix: opened.prefix,
            local,
            shared,
            state: Mutex::new(State { downloaded, ..State::default() }),
            metrics,
            _lock: lock,
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Lists the store and brings the mirror towards what `policy` wants:
    /// complete versions it wants are downloaded (in the background; with
    /// `strict`, at start-up and in reloads, before this returns, and a
    /// store that cannot be listed or a version that cannot be downloaded
    /// is an error). `serving` are never evicted. `settle` is how long
    /// after a first listing a second one is taken to see which versions
    /// are complete, when there is no earlier poll to compare with.
    pub async fn discover(
        self: &Arc<Self>,
        serving: &BTreeSet<i64>,
        policy: &VersionPolicy,
        strict: bool,
        settle: Duration,
    ) -> Result<Discovered> {
        let mut listed = match self.list().await {
            Ok(listed) => listed,
            Err(error) => {
                self.unreachable(&error);
                if strict {
                    return Err(error);
                }
                // Nothing changes while the store is away.
                let mut state = self.state();
                let known: BTreeSet<i64> = state.listed.iter().flat_map(|(_, l)| l.keys().copied()).collect();
                let versions = self.on_disk(&state, &known);
                return Ok(Discovered { versions, failed: std::mem::take(&mut state.unreported) });
            }
        };
        self.reachable();
        let present: BTreeSet<i64> = listed.keys().copied().collect();
        let earlier = self.state().listed.as_ref().map(|(at, _)| at.elapsed());
        if !strict && earlier.is_some_and(|age| age < settle / 2) {
            // A poll soon after the last (a download just ended): two
            // listings this close prove nothing about an upload in
            // progress, so this one only shows what is on disk now. (Half
            // a poll: regular polls come a poll apart, give or take how
            // long each listing took.)
            let mut state = self.state();
            let versions = self.on_disk(&state, &present);
            return Ok(Discovered { versions, failed: std::mem::take(&mut state.unreported) });
        }
        let mut previous = self.state().listed.replace((Instant::now(), listed.clone())).map(|(_, l)| l);
        if previous.is_none() && self.shared.marker.is_none() {
            // Completeness needs two listings: take the second now.
            tokio::time::sleep(settle).await;
            previous = Some(std::mem::replace(&mut listed, self.list().await.inspect_err(|e| self.unreachable(e))?));
            self.state().listed = Some((Instant::now(), listed.clone()));
        }
        let complete = complete(&listed, previous.as_ref(), self.shared.marker.as_deref());
        // A version on disk that the store now lists differently (rewritten
        // in place, or a copy a previous run left) is fetched again, unless
        // it serves: a served version is not changed under its requests.
        let stale: Vec<i64> = {
            let state = self.state();
            state
                .downloaded
                .iter()
                .filter(|(v, had)| complete.get(v).is_some_and(|now| now != *had) && !serving.contains(v))
                .map(|(v, _)| *v)
                .collect()
        };
        for version in stale {
            self.remove(version).await;
        }
        let wanted = if strict {
            repository::select(&complete, policy, &self.url)?
        } else {
            repository::select_present(&complete, policy)
        };
        self.evict(&listed, &wanted, serving).await;
        if strict {
            // A reload wants what a poll may be downloading now: it waits
            // for that download (bounded by the store's timeouts) rather
            // than failing to find the version.
            while wanted.keys().any(|v| self.state().downloading.contains(v)) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let missing: Vec<(i64, Listing)> = {
            let state = self.state();
            wanted
                .iter()
                .filter(|(v, _)| !state.downloaded.contains_key(v) && !state.downloading.contains(v))
                .filter(|(v, listing)| {
                    strict
                        || !state.failures.get(v).is_some_and(|f| f.listing == **listing && Instant::now() < f.retry_at)
                })
                .map(|(v, l)| (*v, l.clone()))
                .collect()
        };
        // What a download may not evict to make room: what serves, what is
        // wanted, and what of this poll's versions on disk the policy picks
        // (the lifecycle may be about to load it).
        let mut keep: BTreeSet<i64> = serving.iter().chain(wanted.keys()).copied().collect();
        let on_disk = self.on_disk(&self.state(), &present);
        keep.extend(repository::select_present(&on_disk, policy).keys());
        let keep = Arc::new(keep);
        for (version, listing) in missing {
            self.state().downloading.insert(version);
            if strict {
                let downloaded = self.download(version, &listing, &keep).await;
                self.finish(version, listing, downloaded.clone(), false);
                downloaded?;
            } else {
                let (repository, keep) = (self.clone(), keep.clone());
                tokio::spawn(async move {
                    let downloaded = repository.download(version, &listing, &keep).await;
                    repository.finish(version, listing, downloaded, true);
                    repository.shared.changed.notify_one();
                });
            }
        }
        let mut state = self.state();
        let versions = self.on_disk(&state, &present);
        Ok(Discovered { versions, failed: std::mem::take(&mut state.unreported) })
    }

    /// The versions whole on disk among `present`: their model file.
    fn on_disk(&self, state: &State, present: &BTreeSet<i64>) -> BTreeMap<i64, PathBuf> {
        state
            .downloaded
            .keys()
            .filter(|v| present.contains(v))
            .filter_map(|&v| {
                let dir = self.local.join(v.to_string());
                [MODEL_FILE, SAVED_MODEL_FILE].into_iter().map(|f| dir.join(f)).find(|f| f.is_file()).map(|f| (v, f))
            })
            .collect()
    }

    /// Lists every object under the prefix, by version; a failure is counted.
    async fn list(&self) -> Result<BTreeMap<i64, Listing>> {
        list(self.store.as_ref(), &self.prefix, &self.url, self.shared.timeout).await.inspect_err(|_| {
            self.metrics.list_errors.inc();
        })
    }

    /// Removes versions no longer in the store and not serving; then, while
    /// the cache is over its bound, versions neither wanted nor serving,
    /// oldest first.
    async fn evict(&self, listed: &BTreeMap<i64, Listing>, wanted: &BTreeMap<i64, Listing>, serving: &BTreeSet<i64>) {
        let mut gone: Vec<i64> = {
            let state = self.state();
            state.downloaded.keys().copied().filter(|v| !listed.contains_key(v) && !serving.contains(v)).collect()
        };
        let over = self.shared.cache_bytes.load(Ordering::Relaxed).saturating_sub(self.shared.cache_max);
        if over > 0 {
            let state = self.state();
            let mut freed = 0;
            for (version, listing) in &state.downloaded {
                if freed >= over {
                    break;
                }
                if !wanted.contains_key(version) && !serving.contains(version) && !gone.contains(version) {
                    gone.push(*version);
                    freed += listing.bytes();
                }
            }
        }
        for version in gone {
            self.remove(version).await;
        }
    }

    /// The mirror's directory.
    pub(super) fn local(&self) -> &Path {
        &self.local
    }

    /// Empties the mirror of a model no longer served from here (removed,
    /// or given another base path): its files go and its bytes leave the
    /// cache's count. Versions still draining were loaded from these files
    /// and no longer need them.
    pub(super) fn purge(&self) {
        let versions: Vec<Listing> = std::mem::take(&mut self.state().downloaded).into_values().collect();
        for listing in versions {
            self.shared.release(listing.bytes());
        }
        if let Err(e) = std::fs::remove_dir_all(&self.local) {
            tracing::warn!(model = %self.model, "cannot remove {} from the model cache: {e}", self.local.display());
        }
        tracing::info!(model = %self.model, "model cache of {} removed: no model is served from it", self.url);
    }

    /// Takes `version` out of the mirror.
    async fn remove(&self, version: i64) {
        let Some(listing) = self.state().downloaded.remove(&version) else { return };
        let dir = self.local.join(version.to_string());
        let _ = tokio::fs::remove_file(manifest(&self.local, version)).await;
        if let Err(e) = tokio::fs::remove_dir_all(&dir).await {
            tracing::warn!(model = %self.model, version, "cannot remove {} from the model cache: {e}", dir.display());
        }
        self.shared.release(listing.bytes());
        tracing::info!(model = %self.model, version, "evicted from the model cache");
    }

    /// Downloads `version` whole into the mirror, or nothing.
    async fn download(&self, version: i64, listing: &Listing, keep: &BTreeSet<i64>) -> Result<()> {
        let bytes = listing.bytes();
        if !self.shared.reserve(bytes) {
            // Make room from this model's versions nobody needs, then try once more.
            let spare: Vec<i64> = {
                let state = self.state();
                state.downloaded.keys().copied().filter(|v| !keep.contains(v)).collect()
            };
            for old in spare {
                self.remove(old).await;
            }
            if !self.shared.reserve(bytes) {
                self.metrics.refused.inc();
                return Err(Error::resource_exhausted(format!(
                    "version {version} of {} needs {} MiB; the model cache holds {} MiB of versions in use and \
                     storage.cache_max_gib = {} allows {} MiB",
                    self.url,
                    bytes >> 20,
                    self.shared.cache_bytes.load(Ordering::Relaxed) >> 20,
                    self.shared.cache_max as f64 / f64::from(1u32 << 30),
                    self.shared.cache_max >> 20
                )));
            }
        }
        let started = Instant::now();
        let partial = self.local.join(format!(".partial-{version}-{:08x}", rand::random::<u32>()));
        let fetched = async {
            tokio::fs::create_dir_all(&partial).await.map_err(|e| local_error(&partial, &e))?;
            futures::future::try_join_all(listing.objects.iter().map(|object| self.fetch(object, &partial))).await?;
            let text = serde_json::to_vec(listing).map_err(|e| Error::internal(format!("writing a manifest: {e}")))?;
            let manifest = manifest(&self.local, version);
            tokio::fs::write(&manifest, text).await.map_err(|e| local_error(&manifest, &e))?;
            let dir = self.local.join(version.to_string());
            let _ = tokio::fs::remove_dir_all(&dir).await;
            tokio::fs::rename(&partial, &dir).await.map_err(|e| local_error(&dir, &e))
        }
        .await;
        match fetched {
            Ok(()) => {
                self.metrics.downloaded.inc();
                tracing::info!(
                    model = %self.model,
                    version,
                    objects = listing.objects.len(),
                    mib = bytes as f64 / f64::from(1u32 << 20),
                    elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                    "downloaded from {}",
                    self.url
                );
                Ok(())
            }
            Err(error) => {
                let _ = tokio::fs::remove_dir_all(&partial).await;
                self.shared.release(bytes);
                self.metrics.download_failures.inc();
                Err(error.context(format_args!("downloading version {version} from {}", self.url)))
            }
        }
    }

    /// Records how a download ended; a failure is reported to the next
    /// poll when `report` (a background download: nobody awaited it).
    fn finish(&self, version: i64, listing: Listing, downloaded: Result<()>, report: bool) {
        let mut state = self.state();
        state.downloading.remove(&version);
        match downloaded {
            Ok(()) => {
                state.failures.remove(&version);
                state.downloaded.insert(version, listing);
            }
            Err(error) => {
                let attempts =
                    state.failures.get(&version).filter(|f| f.listing == listing).map_or(0, |f| f.attempts) + 1;
                let backoff = Duration::from_secs(1 << attempts.min(6)).min(MAX_BACKOFF);
                tracing::error!(
                    model = %self.model,
                    version,
                    attempts,
                    retry_in_s = backoff.as_secs(),
                    "version not downloaded; what serves goes on serving: {error}"
                );
                state.failures.insert(version, Failure { listing, attempts, retry_at: Instant::now() + backoff });
                if report {
                    state.unreported.push((version, error));
                }
            }
        }
    }

    /// Downloads one object into `dir`, checked against its listing.
    async fn fetch(&self, object: &Object, dir: &Path) -> Result<()> {
        let _permit =
            self.shared.downloads.acquire().await.map_err(|_| Error::unavailable("the server is stopping"))?;
        let url = format!(
            "{}/{}",
            self.url.trim_end_matches('/'),
            object.location.strip_prefix(self.prefix.as_ref()).unwrap_or(&object.location).trim_start_matches('/')
        );
        let location = ObjectPath::parse(&object.location)
            .map_err(|e| Error::invalid_argument(format!("{url}: not a valid object path: {e}")))?;
        // A version changed between the listing and the read is refused
        // by the store itself (If-Match), not found later by its bytes.
        let options = GetOptions { if_match: object.e_tag.clone(), ..GetOptions::default() };
        let timeout = self.shared.timeout;
        let stalled = || Error::unavailable(format!("{url}: no bytes for {} s", timeout.as_secs()));
        let result = tokio::time::timeout(timeout, self.store.get_opts(&location, options))
            .await
            .map_err(|_| stalled())?
            .map_err(|e| self.store_error("downloading", &url, &e))?;
        let mut stream = result.into_stream();
        let file = dir.join(&object.path);
        if let Some(parent) = file.parent() {
            tokio::fs::create_dir_all(parent).await.map_err(|e| local_error(parent, &e))?;
        }
        let mut out = tokio::fs::File::create(&file).await.map_err(|e| local_error(&file, &e))?;
        let mut written = 0u64;
        while let Some(chunk) = tokio::time::timeout(timeout, stream.next()).await.map_err(|_| stalled())? {
            let chunk = chunk.map_err(|e| self.store_error("downloading", &url, &e))?;
            written += chunk.len() as u64;
            if written > object.size {
                return Err(Error::unavailable(format!(
                    "{url}: more than the {} bytes listed came; the object changed during the download",
                    object.size
                )));
            }
            if let Some(bandwidth) = &self.shared.bandwidth {
                bandwidth.take(chunk.len()).await;
            }
            out.write_all(&chunk).await.map_err(|e| local_error(&file, &e))?;
            self.metrics.bytes.inc_by(chunk.len() as u64);
        }
        out.flush().await.map_err(|e| local_error(&file, &e))?;
        if written != object.size {
            return Err(Error::unavailable(format!("{url}: {written} bytes came, {} listed", object.size)));
        }
        Ok(())
    }

    /// A download error, counted, with no secret in it.
    fn store_error(&self, operation: &str, url: &str, error: &object_store::Error) -> Error {
        self.metrics.download_errors.inc();
        store_error(operation, url, error)
    }

    /// Notes a failed listing: logged once per outage.
    fn unreachable(&self, error: &Error) {
        let mut state = self.state();
        match &mut state.outage {
            Some(outage) => outage.polls += 1,
            None => {
                state.outage = Some(Outage { since: Instant::now(), polls: 1 });
                self.metrics.unreachable.set(1);
                tracing::warn!(
                    model = %self.model,
                    "the model's object store cannot be listed; loaded versions keep serving, and it is listed \
                     again every poll: {error}"
                );
            }
        }
    }

    /// Notes a listing that worked: the end of an outage, if there was one.
    fn reachable(&self) {
        if let Some(outage) = self.state().outage.take() {
            self.metrics.unreachable.set(0);
            tracing::info!(
                model = %self.model,
                down_s = outage.since.elapsed().as_secs_f64(),
                failed_polls = outage.polls,
                "the model's object store {} can be listed again",
                self.url
            );
        }
    }
}

/// Lists every object under `prefix` of `store` (the base path `url`),
/// by version; each page must come within `timeout`.
async fn list(
    store: &dyn ObjectStore,
    prefix: &ObjectPath,
    url: &str,
    timeout: Duration,
) -> Result<BTreeMap<i64, Listing>> {
    let mut stream = store.list(Some(prefix));
    let mut versions: BTreeMap<i64, Listing> = BTreeMap::new();
    let mut count = 0usize;
    loop {
        let item = tokio::time::timeout(timeout, stream.next())
            .await
            .map_err(|_| Error::unavailable(format!("listing {url}: no answer within {} s", timeout.as_secs())))?;
        let Some(item) = item else { break };
        let meta = item.map_err(|e| store_error("listing", url, &e))?;
        count += 1;
        if count > MAX_LISTED_OBJECTS {
            return Err(Error::resource_exhausted(format!(
                "listing {url}: more than {MAX_LISTED_OBJECTS} objects under it; point the base path at one model's \
                 directory"
            )));
        }
        let Some(parts) = meta.location.prefix_match(prefix) else { continue };
        let parts: Vec<String> = parts.map(|p| p.as_ref().to_string()).collect();
        let [version, inside @ ..] = parts.as_slice() else { continue };
        // Only a version's own spelling: `05` or `+5` beside `5` would
        // merge two folders into one listing.
        let Some(version) = version.parse::<i64>().ok().filter(|v| *v >= 0 && v.to_string() == *version) else {
            continue;
        };
        // A directory placeholder (`1/`), or a name that could leave the
        // version's directory on disk, is not downloaded.
        if inside.is_empty() || inside.iter().any(|p| p.is_empty() || p == "." || p == "..") {
            continue;
        }
        versions.entry(version).or_default().objects.push(Object {
            path: inside.join("/"),
            location: meta.location.as_ref().to_string(),
            size: meta.size,
            e_tag: meta.e_tag,
        });
    }
    for listing in versions.values_mut() {
        listing.objects.sort_by(|a, b| a.path.cmp(&b.path));
        // A "folder" a console made (`1/variables/`, an empty object) is
        // a directory on disk, not a file beside its contents.
        let folders: BTreeSet<String> = listing
            .objects
            .iter()
            .filter(|o| {
                o.size == 0 && listing.objects.iter().any(|other| other.path.starts_with(&format!("{}/", o.path)))
            })
            .map(|o| o.path.clone())
            .collect();
        listing.objects.retain(|o| !folders.contains(&o.path));
        listing.objects.dedup_by(|a, b| a.path == b.path);
    }
    Ok(versions)
}

/// The versions holding a model under `url`, from one listing: what
/// `sluice config check` reports (without downloading, and without the
/// second listing that tells a complete upload).
pub async fn versions_in(url: &str, timeout: Duration) -> Result<BTreeMap<i64, u64>> {
    let opened = super::store::open(url, timeout)?;
    let listed = list(opened.store.as_ref(), &opened.prefix, &super::store::shown(url), timeout).await?;
    Ok(listed.into_iter().filter(|(_, l)| l.has_model()).map(|(v, l)| (v, l.bytes())).collect())
}

/// A store error with no secret in it.
fn store_error(operation: &str, url: &str, error: &object_store::Error) -> Error {
    Error::unavailable(format!("{operation} {url}: {}", redact(&error.to_string())))
}

/// Whether another process holds the mirror `local` (its lock is taken).
pub(super) fn held_elsewhere(local: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(file) = std::fs::File::open(local.join(".lock")) else { return false };
    // SAFETY: flock on a descriptor this function owns; closing it drops
    // the lock taken here, if any.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) != 0 }
}

/// Locks the mirror `local` for this process: another process mirroring
/// into the same directory would remove this one's downloads in progress.
fn lock(local: &Path) -> Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let path = local.join(".lock");
    let file = std::fs::File::create(&path).map_err(|e| local_error(&path, &e))?;
    // SAFETY: flock on a descriptor this function owns; no memory is shared.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(Error::unavailable(format!(
            "the model cache {} is in use by another sluice process: give each its own storage.cache_dir",
            local.display()
        )));
    }
    Ok(file)
}

/// The versions of `listed` whose upload is complete: with a `marker`,
/// those holding it; otherwise those listed the same at the `previous`
/// poll. Either way a version must hold a model file.
fn complete(
    listed: &BTreeMap<i64, Listing>,
    previous: Option<&BTreeMap<i64, Listing>>,
    marker: Option<&str>,
) -> BTreeMap<i64, Listing> {
    listed
        .iter()
        .filter(|(_, listing)| listing.has_model())
        .filter(|(version, listing)| match marker {
            Some(marker) => listing.has(marker),
            None => previous.and_then(|p| p.get(version)) == Some(*listing),
        })
        .map(|(v, l)| (*v, l.clone()))
        .collect()
}

/// Where the listing a version was downloaded from is kept.
fn manifest(local: &Path, version: i64) -> PathBuf {
    local.join(format!(".{version}.listing"))
}

/// The versions a previous run left whole in `local` (a directory and its
/// manifest); partial downloads and anything unexplained are removed.
fn take_up(local: &Path) -> BTreeMap<i64, Listing> {
    let mut whole = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(local) else { return whole };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().to_string();
        let version = name.parse::<i64>().ok().filter(|v| *v >= 0);
        let listing = version
            .and_then(|v| std::fs::read(manifest(local, v)).ok())
            .and_then(|text| serde_json::from_slice::<Listing>(&text).ok());
        // Every file there at its listed size: a crash between the writes
        // and the rename's reaching the disk leaves none taken up half.
        let intact = |listing: &Listing| {
            listing.objects.iter().all(|o| std::fs::metadata(path.join(&o.path)).is_ok_and(|m| m.len() == o.size))
        };
        match (version, listing) {
            (Some(version), Some(listing)) if path.is_dir() && intact(&listing) => {
                whole.insert(version, listing);
            }
            _ if name.ends_with(".listing") || name == ".lock" => {}
            _ => {
                let _ = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
            }
        }
    }
    whole
}

fn local_error(path: &Path, error: &std::io::Error) -> Error {
    Error::unavailable(format!("writing the model cache {}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(files: &[(&str, u64, &str)]) -> Listing {
        let objects = files
            .iter()
            .map(|(path, size, tag)| Object {
                path: path.to_string(),
                location: format!("m/1/{path}"),
                size: *size,
                e_tag: Some(tag.to_string()),
            })
            .collect();
        Listing { objects }
    }

    #[test]
    fn a_version_is_complete_once_listed_the_same_twice_or_once_marked() {
        let uploading = listing(&[("model.onnx", 10, "a")]);
        let more = listing(&[("assets/x", 1, "b"), ("model.onnx", 10, "a")]);
        let rewritten = listing(&[("assets/x", 1, "c"), ("model.onnx", 10, "a")]);
        let first = BTreeMap::from([(1, uploading.clone())]);
        assert!(complete(&first, None, None).is_empty(), "one listing proves nothing");
        assert!(complete(&BTreeMap::from([(1, more.clone())]), Some(&first), None).is_empty(), "a file arrived");
        let again = BTreeMap::from([(1, rewritten.clone())]);
        assert!(complete(&again, Some(&BTreeMap::from([(1, more.clone())])), None).is_empty(), "an ETag changed");
        assert_eq!(complete(&again, Some(&again), None).keys().collect::<Vec<_>>(), [&1], "the same twice");
        let no_model = BTreeMap::from([(2, listing(&[("assets/x", 1, "b")]))]);
        assert!(complete(&no_model, Some(&no_model), None).is_empty(), "a version holds a model");
        let marked = BTreeMap::from([(1, listing(&[("_SUCCESS", 0, "d"), ("model.onnx", 10, "a")]))]);
        assert_eq!(complete(&marked, None, Some("_SUCCESS")).len(), 1, "the marker needs no second listing");
        assert!(complete(&again, Some(&again), Some("_SUCCESS")).is_empty(), "with a marker, only the marker");
    }

    #[test]
    fn a_previous_runs_whole_versions_are_taken_up_and_the_rest_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let local = dir.path();
        let listing = Listing {
            objects: vec![Object {
                path: "model.onnx".into(),
                location: "m/1/model.onnx".into(),
                size: 3,
                e_tag: None,
            }],
        };
        std::fs::create_dir_all(local.join("1")).expect("1");
        std::fs::write(local.join("1/model.onnx"), b"abc").expect("model");
        std::fs::write(manifest(local, 1), serde_json::to_vec(&listing).expect("json")).expect("manifest");
        std::fs::create_dir_all(local.join("2")).expect("2 without a manifest");
        std::fs::create_dir_all(local.join(".partial-3-0000abcd")).expect("partial");
        // A crash left version 4's file short of its listed size.
        std::fs::create_dir_all(local.join("4")).expect("4");
        std::fs::write(local.join("4/model.onnx"), b"a").expect("short");
        std::fs::write(manifest(local, 4), serde_json::to_vec(&listing).expect("json")).expect("manifest");
        let whole = take_up(local);
        assert_eq!(whole.into_iter().collect::<Vec<_>>(), vec![(1, listing)]);
        for gone in ["2", ".partial-3-0000abcd", "4"] {
            assert!(!local.join(gone).exists(), "{gone} was not removed");
        }
    }

    #[tokio::test]
    async fn a_listing_skips_folder_placeholders_and_versions_not_spelled_as_numbers() {
        use object_store::memory::InMemory;
        use object_store::{ObjectStoreExt, PutPayload};
        let store = InMemory::new();
        for (key, bytes) in [
            ("m/1/model.onnx", &b"onnx"[..]),
            ("m/1/variables", b""),
            ("m/1/variables/variables.index", b"ix"),
            ("m/05/model.onnx", b"other"),
            ("m/+6/model.onnx", b"other"),
            ("m/notes.txt", b"not a version"),
        ] {
            store.put(&ObjectPath::from(key), PutPayload::from_static(bytes)).await.expect("put");
        }
        let listed = list(&store, &ObjectPath::from("m"), "mem://m", Duration::from_secs(5)).await.expect("list");
        assert_eq!(listed.keys().collect::<Vec<_>>(), [&1], "only version 1 is spelled as a version");
        let paths: Vec<&str> = listed[&1].objects.iter().map(|o| o.path.as_str()).collect();
        assert_eq!(paths, ["model.onnx", "variables/variables.index"], "the folder object is not a file");
        let huge = Listing {
            objects: (0..2)
                .map(|i| Object { path: format!("f{i}"), location: String::new(), size: u64::MAX / 2 + 1, e_tag: None })
                .collect(),
        };
        assert_eq!(huge.bytes(), u64::MAX, "listed sizes cannot wrap around to fit the cache");
    }
}
