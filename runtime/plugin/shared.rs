//! The plugin registry every replica shares, in Redis: what one replica
//! uploads and activates, every replica serves.
//!
//! Keys, under `[plugins.shared] key_prefix`:
//! - `plugins:blob:SHA256` — a plugin's bytes, content-addressed (written
//!   once, never changed);
//! - `plugins:manifests` — a hash, plugin name → its manifest (JSON, the
//!   local store's format);
//! - `plugins:revision` — a counter every change increments;
//! - `plugins:audit` — the latest changes, newest first (JSON lines);
//! - channel `plugins:changes` — each change's new revision.
//!
//! A change is one Lua script, atomic in Redis: it applies only when the
//! revision is still the one the replica last read (otherwise another
//! replica changed the registry meanwhile, and the caller is told to
//! retry), writes the manifest, increments the revision, appends to the
//! audit list and publishes. Replicas follow through the channel, and also
//! on a timer and on every reconnect by comparing revisions, since a
//! subscriber that is disconnected misses messages.
//!
//! The local store stays the replica's cache: what it serves is always on
//! its own disk, so a Redis outage stops changes, not serving.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use futures::StreamExt;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::manifest::Manifest;
use super::store::sha256_hex;
use crate::config::plugins::SharedRegistryConfig;
use crate::config::redis_access::redacted;
use crate::error::{Error, Result};

/// Audit entries kept in Redis.
const AUDIT_KEPT: usize = 10_000;

/// Applies a change when the revision is the one expected:
/// KEYS = revision, manifests, audit; ARGV = expected revision, plugin
/// name, manifest JSON, audit JSON, channel. Answers the new revision, or
/// -1 when the registry moved on.
const COMMIT: &str = r"
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current ~= tonumber(ARGV[1]) then return -1 end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
local revision = redis.call('INCR', KEYS[1])
redis.call('LPUSH', KEYS[3], ARGV[4])
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[6]) - 1)
redis.call('PUBLISH', ARGV[5], revision)
return revision
";

/// Reads the revision and every manifest at once, unless the manifests
/// hold more than ARGV[1] bytes in all: then answers their size alone, so
/// a registry grown past any sane size is refused without being read.
/// KEYS = revision, manifests.
const SNAPSHOT: &str = r"
local size = 0
for _, field in ipairs(redis.call('HKEYS', KEYS[2])) do
  size = size + #field + redis.call('HSTRLEN', KEYS[2], field)
end
if size > tonumber(ARGV[1]) then return {'too-large', size} end
return {redis.call('GET', KEYS[1]) or '0', redis.call('HGETALL', KEYS[2])}
";

/// The registry as Redis has it at one revision.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The revision: how many changes were made.
    pub revision: u64,
    /// Every plugin's manifest.
    pub manifests: BTreeMap<String, Manifest>,
}

/// The connection to the shared registry.
pub struct SharedRegistry {
    config: SharedRegistryConfig,
    client: redis::Client,
    connection: tokio::sync::Mutex<Option<ConnectionManager>>,
    runtime: tokio::runtime::Handle,
    /// The last error, so a Redis that stays down is logged once.
    last_error: Mutex<String>,
}

impl SharedRegistry {
    /// A registry in the Redis `config` names; connects on first use.
    pub fn new(config: &SharedRegistryConfig, runtime: tokio::runtime::Handle) -> Result<SharedRegistry> {
        let client =
            config.access().client("plugins.shared", &config.redis_url).map_err(|e| Error::invalid_argument(e.0))?;
        Ok(SharedRegistry {
            config: config.clone(),
            client,
            connection: tokio::sync::Mutex::new(None),
            runtime,
            last_error: Mutex::new(String::new()),
        })
    }

    fn key(&self, name: &str) -> String {
        format!("{}plugins:{name}", self.config.key_prefix)
    }

    /// The channel changes are published on.
    pub fn channel(&self) -> String {
        self.key("changes")
    }

    /// Runs `work` on a connection, within the timeout. Called from
    /// blocking threads (admin calls, reconciles), never from the async
    /// runtime's.
    fn call<T>(
        &self,
        what: &str,
        work: impl AsyncFnOnce(&mut ConnectionManager) -> redis::RedisResult<T>,
    ) -> Result<T> {
        let timeout = Duration::from_millis(self.config.timeout_ms);
        let result = self.runtime.block_on(async {
            tokio::time::timeout(timeout, async {
                let mut guard = self.connection.lock().await;
                if guard.is_none() {
                    let config = ConnectionManagerConfig::new()
                        .set_connection_timeout(timeout)
                        .set_response_timeout(timeout)
                        .set_number_of_retries(1);
                    *guard = Some(ConnectionManager::new_with_config(self.client.clone(), config).await?);
                }
                let Some(connection) = guard.as_mut() else { unreachable!("set above") };
                work(connection).await
            })
            .await
        });
        let result = match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {} ms", self.config.timeout_ms)),
        };
        result.map_err(|message| {
            let mut last = self.last_error.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if *last != message {
                tracing::warn!(url = %redacted(&self.config.redis_url), "shared plugin registry: {what} failed: {message}");
                last.clone_from(&message);
            }
            Error::unavailable(format!(
                "the shared plugin registry (Redis at {}) did not answer: {what} failed: {message}",
                redacted(&self.config.redis_url)
            ))
        })
    }

    /// The registry now: revision and manifests, read together.
    pub fn snapshot(&self) -> Result<Snapshot> {
        let (revision_key, manifests_key) = (self.key("revision"), self.key("manifests"));
        let max = self.config.max_blob_mib << 20;
        let answer: redis::Value = self.call("reading the registry", async |c| {
            redis::cmd("EVAL").arg(SNAPSHOT).arg(2).arg(&revision_key).arg(&manifests_key).arg(max).query_async(c).await
        })?;
        let (revision, raw) = snapshot_of(answer, self.config.max_blob_mib)?;
        let mut manifests = BTreeMap::new();
        for (name, json) in raw {
            match serde_json::from_slice::<Manifest>(&json) {
                Ok(manifest) if manifest.name == name => {
                    manifests.insert(name, manifest);
                }
                Ok(manifest) => tracing::error!(
                    plugin = %name,
                    "shared plugin registry: the manifest under '{name}' names '{}'; left out",
                    manifest.name
                ),
                Err(e) => tracing::error!(plugin = %name, "shared plugin registry: manifest unreadable, left out: {e}"),
            }
        }
        Ok(Snapshot { revision: revision.unwrap_or(0), manifests })
    }

    /// The newest `limit` entries of the audit list, newest first, each
    /// as the JSON text it was written.
    pub fn audit(&self, limit: usize) -> Result<Vec<String>> {
        let key = self.key("audit");
        let last = i64::try_from(limit.max(1)).unwrap_or(i64::MAX) - 1;
        self.call("reading the audit list", async |c| {
            redis::cmd("LRANGE").arg(&key).arg(0).arg(last).query_async(c).await
        })
    }

    /// The bytes stored under `sha256`, refused unless they hash to it.
    pub fn blob(&self, sha256: &str) -> Result<Vec<u8>> {
        let key = self.key(&format!("blob:{sha256}"));
        // Its length first: a value Redis holds is read only when it can
        // be a plugin.
        let length: u64 =
            self.call("sizing a plugin", async |c| redis::cmd("STRLEN").arg(&key).query_async(c).await)?;
        let max = self.config.max_blob_mib << 20;
        if length > max {
            return Err(Error::resource_exhausted(format!(
                "the shared registry's blob {sha256} holds {length} bytes, more than plugins.shared.max_blob_mib \
                 ({} MiB); it is not read",
                self.config.max_blob_mib
            )));
        }
        let bytes: Option<Vec<u8>> =
            self.call("reading a plugin", async |c| redis::cmd("GET").arg(&key).query_async(c).await)?;
        let bytes =
            bytes.ok_or_else(|| Error::not_found(format!("the shared registry has no plugin blob {sha256}")))?;
        let actual = sha256_hex(&bytes);
        if actual != sha256 {
            return Err(Error::internal(format!(
                "the shared registry's blob {sha256} is corrupted: its bytes hash to {actual}"
            )));
        }
        Ok(bytes)
    }

    /// Stores `bytes` under their hash (once: blobs never change).
    pub fn put_blob(&self, sha256: &str, bytes: &[u8]) -> Result<()> {
        let key = self.key(&format!("blob:{sha256}"));
        let _: bool = self.call("storing a plugin", async |c| {
            redis::cmd("SET").arg(&key).arg(bytes).arg("NX").query_async::<Option<String>>(c).await.map(|r| r.is_some())
        })?;
        Ok(())
    }

    /// Writes `manifest` if the registry is still at `expected`; answers
    /// the new revision. `Aborted` when another replica changed it first.
    pub fn commit(&self, expected: u64, manifest: &Manifest, audit: &serde_json::Value) -> Result<u64> {
        let json = serde_json::to_vec(manifest).map_err(|e| Error::internal(format!("encoding a manifest: {e}")))?;
        let (revision, manifests, audit_key, channel) =
            (self.key("revision"), self.key("manifests"), self.key("audit"), self.channel());
        let audit = audit.to_string();
        let answer: i64 = self.call("recording the change", async |c| {
            redis::cmd("EVAL")
                .arg(COMMIT)
                .arg(3)
                .arg(&revision)
                .arg(&manifests)
                .arg(&audit_key)
                .arg(expected)
                .arg(&manifest.name)
                .arg(&json)
                .arg(&audit)
                .arg(&channel)
                .arg(AUDIT_KEPT)
                .query_async(c)
                .await
        })?;
        u64::try_from(answer).map_err(|_| {
            Error::Aborted(format!(
                "another replica changed the plugin registry at the same time (this replica had revision \
                 {expected}); nothing was changed here; retry"
            ))
        })
    }

    /// Calls `changed` whenever the registry may have changed: on each
    /// published change, on every (re)subscription (changes published
    /// while disconnected are lost), and every `reconcile_seconds`.
    pub fn watch(&self, changed: impl Fn() + Send + Sync + 'static) {
        let (client, channel) = (self.client.clone(), self.channel());
        let period = Duration::from_secs(self.config.reconcile_seconds.max(1));
        let changed = std::sync::Arc::new(changed);
        let on_timer = changed.clone();
        self.runtime.spawn(async move {
            let mut ticks = tokio::time::interval(period);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                on_timer();
            }
        });
        self.runtime.spawn(async move {
            let mut wait = Duration::from_millis(100);
            loop {
                match client.get_async_pubsub().await {
                    Ok(mut pubsub) => match pubsub.subscribe(&channel).await {
                        Ok(()) => {
                            wait = Duration::from_millis(100);
                            changed();
                            let mut messages = pubsub.on_message();
                            while messages.next().await.is_some() {
                                changed();
                            }
                            tracing::warn!("shared plugin registry: change notifications lost; reconnecting");
                        }
                        Err(e) => tracing::debug!("shared plugin registry: subscribing failed: {e}"),
                    },
                    Err(e) => tracing::debug!("shared plugin registry: connecting for notifications failed: {e}"),
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(2));
            }
        });
    }
}

/// A revision and the manifests' JSON by plugin name, as Redis holds them.
type RawSnapshot = (Option<u64>, BTreeMap<String, Vec<u8>>);

/// The revision and raw manifests of a SNAPSHOT answer.
fn snapshot_of(answer: redis::Value, max_mib: u64) -> Result<RawSnapshot> {
    use redis::FromRedisValue;
    let bad = |what: String| Error::unavailable(format!("the shared plugin registry answered {what}"));
    let redis::Value::Array(mut parts) = answer else {
        return Err(bad("something other than a snapshot".into()));
    };
    if parts.len() != 2 {
        return Err(bad(format!("{} parts for a snapshot", parts.len())));
    }
    let manifests = parts.pop().unwrap_or(redis::Value::Nil);
    let first = parts.pop().unwrap_or(redis::Value::Nil);
    if String::from_redis_value(&first).is_ok_and(|s| s == "too-large") {
        let size = u64::from_redis_value(&manifests).unwrap_or(0);
        return Err(Error::resource_exhausted(format!(
            "the shared registry's manifests hold {size} bytes, more than plugins.shared.max_blob_mib ({max_mib} MiB); \
             they are not read"
        )));
    }
    let revision = Option::<u64>::from_redis_value(&first).map_err(|e| bad(format!("a bad revision: {e}")))?;
    let raw =
        BTreeMap::<String, Vec<u8>>::from_redis_value(&manifests).map_err(|e| bad(format!("bad manifests: {e}")))?;
    Ok((revision, raw))
}
