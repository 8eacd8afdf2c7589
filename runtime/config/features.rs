//! Feature tables and how pipelines fetch from them: the `[features]` table
//! (each feature table, embedded from a file or kept in Redis, with its
//! schema; the Redis connection) and a pipeline's
//! `[pipelines.feature_fetch]` (which request input holds the keys, which
//! table, which features become which tensors, what a miss does). The
//! stores that read this are in `feature/`; the stage in
//! `pipeline/fetch.rs`. `docs/FEATURES.md` explains every key.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::redis_access::{RedisAccess, RedisTls};
use crate::error::Invalid;
use crate::invalid;
use sluice_sdk::DType;

/// The `[features]` table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeaturesConfig {
    /// The Redis server of the tables with `store = "redis"`.
    pub redis: Option<RedisConfig>,
    /// Feature tables, by name.
    #[serde(default)]
    pub tables: BTreeMap<String, TableConfig>,
}

/// How sluice talks to Redis: one multiplexed connection that reconnects
/// by itself, lookups of concurrent requests coalesced into pipelined
/// round trips, and a local cache in front.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://HOST:PORT[/DB]` (or `rediss://`, `redis+unix://`).
    pub url: String,
    /// The ACL user (`AUTH user password`).
    #[serde(default)]
    pub username: Option<String>,
    /// A file holding the password (its first line), so the config need
    /// not; never logged.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// An environment variable holding the password.
    #[serde(default)]
    pub password_env: Option<String>,
    /// TLS for a `rediss://` URL: `{ ca_file, cert_file, key_file }`.
    #[serde(default)]
    pub tls: Option<RedisTls>,

    /// The longest one round trip may take when the requests in it have
    /// no earlier deadline.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// The longest a connection attempt may take.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// How long a round trip waits for more lookups to join it. 0: it
    /// takes what is waiting and goes; lookups still coalesce while
    /// earlier round trips are in flight.
    #[serde(default)]
    pub batch_window_us: u64,
    /// The most keys one round trip carries.
    #[serde(default = "default_max_keys_per_round_trip")]
    pub max_keys_per_round_trip: usize,
    /// Round trips in flight at once; lookups arriving meanwhile wait and
    /// go together in the next.
    #[serde(default = "default_round_trips_in_flight")]
    pub max_round_trips_in_flight: usize,
    /// Lookups that may wait for a round trip; more are refused with
    /// RESOURCE_EXHAUSTED.
    #[serde(default = "default_queue_capacity")]
    pub queue_capacity: usize,
    /// Entities kept in the local cache; 0 turns it off.
    #[serde(default = "default_cache_entries")]
    pub cache_entries: u64,
    /// How long a cached entity (or a cached miss) is served before Redis
    /// is asked again.
    #[serde(default = "default_cache_ttl_ms")]
    pub cache_ttl_ms: u64,
    /// Round trips in a row that fail (an error, or no answer in time)
    /// before Redis is held down: lookups then fail at once, or fall back
    /// as each pipeline's `on_store_error` says, until a probe finds it
    /// back. 0: never held down.
    #[serde(default = "default_breaker_failures")]
    pub breaker_failures: u32,
    /// How often Redis is probed (one `PING`) while it is held down.
    #[serde(default = "default_probe_interval_ms")]
    pub probe_interval_ms: u64,
}

impl RedisConfig {
    /// Who connects, and how.
    pub fn access(&self) -> RedisAccess {
        RedisAccess {
            username: self.username.clone(),
            password_file: self.password_file.clone(),
            password_env: self.password_env.clone(),
            tls: self.tls.clone(),
        }
    }
}

fn default_timeout_ms() -> u64 {
    100
}
fn default_connect_timeout_ms() -> u64 {
    1000
}
fn default_max_keys_per_round_trip() -> usize {
    1024
}
fn default_round_trips_in_flight() -> usize {
    4
}
fn default_queue_capacity() -> usize {
    4096
}
fn default_cache_entries() -> u64 {
    100_000
}
fn default_cache_ttl_ms() -> u64 {
    1000
}
fn default_breaker_failures() -> u32 {
    5
}
fn default_probe_interval_ms() -> u64 {
    500
}

/// Where a table's rows are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// In the server's memory, loaded from `file` and reloaded when it
    /// changes.
    #[default]
    Embedded,
    /// In Redis: one hash per entity (`docs/FEATURES.md`).
    Redis,
}

impl StoreKind {
    /// As the config spells it (and metrics label it).
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Embedded => "embedded",
            StoreKind::Redis => "redis",
        }
    }
}

/// One feature table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableConfig {
    /// Where its rows are.
    #[serde(default)]
    pub store: StoreKind,
    /// Embedded: the file (`.csv`, or `.jsonl` / `.ndjson`: one JSON object
    /// per line).
    pub file: Option<PathBuf>,
    /// Embedded: the column (CSV) or field (JSON lines) holding the key.
    #[serde(default = "default_key_column")]
    pub key: String,
    /// Embedded: how often the file is checked for a new version, in
    /// milliseconds; 0 loads it once.
    #[serde(default = "default_reload_interval_ms")]
    pub reload_interval_ms: u64,
    /// Redis: the prefix of each entity's hash (`PREFIX` + key). Default:
    /// the table's name and a colon.
    pub prefix: Option<String>,
    /// Redis: entities whose last value read is kept (bounded, without
    /// expiry), for pipelines whose `on_store_error` is `last_seen`. 0:
    /// none kept.
    #[serde(default)]
    pub last_seen_entries: u64,
    /// Its features, by name: what each entity holds.
    pub features: BTreeMap<String, FeatureSpec>,
}

fn default_key_column() -> String {
    "key".to_string()
}

fn default_reload_interval_ms() -> u64 {
    1000
}

impl TableConfig {
    /// The Redis hash prefix of table `name`.
    pub fn redis_prefix(&self, name: &str) -> String {
        self.prefix.clone().unwrap_or_else(|| format!("{name}:"))
    }
}

/// What one entity holds for one feature: `shape` values of `dtype`
/// (`[]`: one value).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureSpec {
    /// Element type.
    #[serde(deserialize_with = "dtype_by_name")]
    pub dtype: DType,
    /// Shape of one entity's value.
    #[serde(default)]
    pub shape: Vec<i64>,
}

impl FeatureSpec {
    /// Values per entity.
    pub fn elements(&self) -> usize {
        // Saturating: a shape too large to count is refused by the check.
        self.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d.max(0) as usize)).unwrap_or(usize::MAX)
    }
}

pub(crate) fn dtype_by_name<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<DType, D::Error> {
    let name = String::deserialize(deserializer)?;
    DType::parse(&name).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "unknown dtype \"{name}\"; expected float32, float64, float16, bfloat16, int8..int64, uint8..uint64, \
             bool or string"
        ))
    })
}

/// A pipeline's `[pipelines.feature_fetch]`: the first stage, before
/// preprocessing.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureFetchConfig {
    /// Requests fetching at once; more are refused with RESOURCE_EXHAUSTED.
    #[serde(default = "default_fetch_queue")]
    pub queue_capacity: usize,
    /// What a store that is down or too slow does to a request: `fail`
    /// (UNAVAILABLE), `defaults` (every feature gets its default) or
    /// `last_seen` (each key gets the value last read for it, a key
    /// without one its default).
    #[serde(default)]
    pub on_store_error: StoreErrorPolicy,
    /// The most keys one request may give per lookup.
    #[serde(default = "default_max_keys")]
    pub max_keys: usize,
    /// The longest key, in bytes (int64 keys are written in decimal).
    #[serde(default = "default_max_key_bytes")]
    pub max_key_bytes: usize,
    /// The lookups, in order; each reads one input and one table.
    pub lookups: Vec<LookupConfig>,
}

fn default_fetch_queue() -> usize {
    1024
}
fn default_max_keys() -> usize {
    1024
}
fn default_max_key_bytes() -> usize {
    256
}

/// What a store error does to the requests it hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreErrorPolicy {
    /// The request fails with UNAVAILABLE.
    #[default]
    Fail,
    /// The request goes on with every feature's default (a feature without
    /// one fails it).
    Defaults,
    /// Each key gets the value its table last read for it (kept for
    /// `last_seen_entries` entities), a key without one its feature's
    /// default; a key with neither fails the request.
    LastSeen,
}

impl StoreErrorPolicy {
    /// As the config spells it, and metrics label the fallback.
    pub fn name(self) -> &'static str {
        match self {
            StoreErrorPolicy::Fail => "fail",
            StoreErrorPolicy::Defaults => "defaults",
            StoreErrorPolicy::LastSeen => "last_seen",
        }
    }
}

/// One lookup: keys from a request input, features from a table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LookupConfig {
    /// The request input holding the keys.
    pub keys: String,
    /// `string` or `int64` (written in decimal to look up).
    #[serde(default = "default_key_dtype", deserialize_with = "dtype_by_name")]
    pub key_dtype: DType,
    /// `[-1]` (one key per row) or `[-1, N]` (N keys per row; -1: any).
    #[serde(default = "default_key_shape")]
    pub key_shape: Vec<i64>,
    /// The table.
    pub table: String,
    /// The features, each becoming one tensor of shape key shape + feature
    /// shape.
    pub features: Vec<FetchedFeature>,
}

fn default_key_dtype() -> DType {
    DType::String
}

fn default_key_shape() -> Vec<i64> {
    vec![-1]
}

/// One feature a lookup fetches.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FetchedFeature {
    /// The feature's name in the table.
    pub feature: String,
    /// The tensor it becomes; default: the feature's name.
    pub tensor: Option<String>,
    /// What a key without it gets: one value (repeated) or the full value.
    /// Unset: a miss fails the request with NOT_FOUND naming the key.
    pub default: Option<toml::Value>,
}

impl FetchedFeature {
    /// The name of the tensor it becomes.
    pub fn tensor_name(&self) -> &str {
        self.tensor.as_deref().unwrap_or(&self.feature)
    }
}

impl FeaturesConfig {
    /// Checks the tables and the Redis settings.
    pub fn check(&self) -> Result<(), Invalid> {
        if let Some(redis) = &self.redis {
            if !["redis://", "rediss://", "redis+unix://", "unix://"].iter().any(|s| redis.url.starts_with(s)) {
                return Err(invalid!(
                    "features.redis.url = \"{}\": expected redis://HOST:PORT[/DB], rediss://… or redis+unix://PATH",
                    super::redis_access::redacted(&redis.url)
                ));
            }
            redis.access().check("features.redis", &redis.url)?;
            for (key, value) in [
                ("timeout_ms", redis.timeout_ms as usize),
                ("connect_timeout_ms", redis.connect_timeout_ms as usize),
                ("max_keys_per_round_trip", redis.max_keys_per_round_trip),
                ("max_round_trips_in_flight", redis.max_round_trips_in_flight),
                ("queue_capacity", redis.queue_capacity),
                ("probe_interval_ms", redis.probe_interval_ms as usize),
            ] {
                if value == 0 {
                    return Err(invalid!("features.redis.{key} = 0: must be at least 1"));
                }
            }
            for (key, value) in [
                ("max_round_trips_in_flight", redis.max_round_trips_in_flight),
                ("queue_capacity", redis.queue_capacity),
            ] {
                super::check_at_most(&format!("features.redis.{key}"), value, super::MAX_COUNT)?;
            }
        }
        for (name, table) in &self.tables {
            let key = format!("features.tables.{name}");
            super::check_name(&key, name)?;
            match table.store {
                StoreKind::Embedded => {
                    if table.file.is_none() {
                        return Err(invalid!("{key}: store = \"embedded\" needs file = \"PATH\" (.csv or .jsonl)"));
                    }
                    if table.prefix.is_some() {
                        return Err(invalid!("{key}.prefix is for store = \"redis\"; this table is embedded"));
                    }
                    if table.last_seen_entries > 0 {
                        return Err(invalid!(
                            "{key}.last_seen_entries is for store = \"redis\"; an embedded table is never down"
                        ));
                    }
                }
                StoreKind::Redis => {
                    if self.redis.is_none() {
                        return Err(invalid!(
                            "{key}: store = \"redis\" needs [features.redis] url = \"redis://HOST:PORT\""
                        ));
                    }
                    if table.file.is_some() {
                        return Err(invalid!(
                            "{key}.file is for store = \"embedded\"; load a file into Redis with \
                             `sluice features load FILE --config CONFIG --table {name}`"
                        ));
                    }
                }
            }
            if table.features.is_empty() {
                return Err(invalid!("{key}.features is empty: declare each feature's dtype and shape"));
            }
            for (feature, spec) in &table.features {
                let feature_key = format!("{key}.features.{feature}");
                super::check_name(&feature_key, feature)?;
                if table.store == StoreKind::Embedded && feature == &table.key {
                    return Err(invalid!("{feature_key}: the key column '{}' is not a feature", table.key));
                }
                if let Some(d) = spec.shape.iter().find(|&&d| d < 1) {
                    return Err(invalid!(
                        "{feature_key}.shape = {:?}: dimension {d}; a feature's shape is fixed, every dimension >= 1",
                        spec.shape
                    ));
                }
                if spec.shape.len() > 4 || spec.elements() > 1 << 20 {
                    return Err(invalid!(
                        "{feature_key}.shape = {:?}: at most 4 dimensions and 2^20 values per entity",
                        spec.shape
                    ));
                }
            }
        }
        Ok(())
    }
}

impl FeatureFetchConfig {
    /// Checks it against the tables; `key` is `pipelines[i].feature_fetch`.
    pub fn check(&self, key: &str, features: &FeaturesConfig) -> Result<(), Invalid> {
        if self.lookups.is_empty() {
            return Err(invalid!("{key}.lookups is empty: add a lookup (keys, table, features)"));
        }
        for (name, value) in [
            ("queue_capacity", self.queue_capacity),
            ("max_keys", self.max_keys),
            ("max_key_bytes", self.max_key_bytes),
        ] {
            if value == 0 {
                return Err(invalid!("{key}.{name} = 0: must be at least 1"));
            }
            if name == "queue_capacity" {
                super::check_at_most(&format!("{key}.{name}"), value, super::MAX_COUNT)?;
            }
        }
        let mut tensors = std::collections::HashSet::new();
        for (i, lookup) in self.lookups.iter().enumerate() {
            let key = format!("{key}.lookups[{i}]");
            if !matches!(lookup.key_dtype, DType::String | DType::I64) {
                return Err(invalid!("{key}.key_dtype = \"{}\": keys are string or int64", lookup.key_dtype));
            }
            let shape_ok = match lookup.key_shape.as_slice() {
                [-1] => true,
                [-1, n] => *n == -1 || *n >= 1,
                _ => false,
            };
            if !shape_ok {
                return Err(invalid!(
                    "{key}.key_shape = {:?}: expected [-1] (one key per row) or [-1, N] (N keys per row, -1: any)",
                    lookup.key_shape
                ));
            }
            let table = features.tables.get(&lookup.table).ok_or_else(|| {
                let names: Vec<&str> = features.tables.keys().map(String::as_str).collect();
                invalid!("{key}.table = \"{}\": no such table; [features.tables]: {names:?}", lookup.table)
            })?;
            if lookup.features.is_empty() {
                return Err(invalid!("{key}.features is empty: name the features to fetch"));
            }
            // An embedded table is never down: nothing to keep for it.
            if self.on_store_error == StoreErrorPolicy::LastSeen
                && table.store == StoreKind::Redis
                && table.last_seen_entries == 0
            {
                return Err(invalid!(
                    "{key}: on_store_error = \"last_seen\", but table '{}' keeps no last-seen values; set \
                     features.tables.{}.last_seen_entries (a Redis table) to how many entities to keep",
                    lookup.table,
                    lookup.table
                ));
            }
            for (j, fetched) in lookup.features.iter().enumerate() {
                let feature_key = format!("{key}.features[{j}]");
                if !table.features.contains_key(&fetched.feature) {
                    let names: Vec<&str> = table.features.keys().map(String::as_str).collect();
                    return Err(invalid!(
                        "{feature_key}.feature = \"{}\": table '{}' has no such feature; its features: {names:?}",
                        fetched.feature,
                        lookup.table
                    ));
                }
                let tensor = fetched.tensor_name();
                super::check_name(&format!("{feature_key}.tensor"), tensor)?;
                if !tensors.insert(tensor.to_string()) {
                    return Err(invalid!(
                        "{feature_key}: tensor '{tensor}' is made twice in this pipeline's feature_fetch"
                    ));
                }
                // A later lookup may read it as its keys; this one or an
                // earlier one reading it would read the client's input.
                if let Some(j) = self.lookups[..=i].iter().position(|l| l.keys == tensor) {
                    return Err(invalid!(
                        "{feature_key}: tensor '{tensor}' is also lookups[{j}].keys, an input clients send; \
                         name it differently"
                    ));
                }
            }
        }
        Ok(())
    }
}
