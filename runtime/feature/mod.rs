//! Feature stores: tables of per-entity features, looked up by key, many
//! keys per call.
//!
//! A [`FeatureStore`] is one table. Its one operation is batch-first: a call
//! looks up every key of one request (or, for Redis, of many requests at
//! once) and answers one [`Column`] per wanted feature, in the caller's key
//! order, with each miss marked. Two stores implement it:
//! [`embedded::EmbeddedStore`] (a file loaded into memory, reloaded when it
//! changes; the default, no server needed) and [`redis::RedisStore`]
//! (lookups of concurrent requests coalesced into pipelined round trips,
//! a local cache in front). [`value`] is the one place values are parsed
//! and encoded; [`file`] reads table files. The pipeline stage that uses
//! stores is `pipeline/fetch.rs`.

pub mod breaker;
pub mod embedded;
pub mod file;
pub mod redis;
pub mod value;

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use tokio::time::Instant;

use crate::config::features::{FeatureSpec, FeaturesConfig, StoreKind, TableConfig};
use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// A table's features, in a fixed order (by name), each with its dtype
/// and the shape of one entity's value.
#[derive(Debug, Clone)]
pub struct Schema {
    /// The table's name.
    pub table: String,
    /// Its features.
    pub features: Vec<(String, FeatureSpec)>,
}

impl Schema {
    /// The schema `[features.tables.NAME]` declares.
    pub fn of(name: &str, config: &TableConfig) -> Schema {
        Schema {
            table: name.to_string(),
            features: config.features.iter().map(|(n, spec)| (n.clone(), spec.clone())).collect(),
        }
    }

    /// The position of feature `name`.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.features.iter().position(|(n, _)| n == name)
    }
}

/// The keys of one lookup. Int64 keys are looked up as their decimal text,
/// so a table's keys are always text.
#[derive(Debug, Clone, Copy)]
pub enum Keys<'a> {
    /// Byte-string keys.
    Strings(&'a [Bytes]),
    /// Integer keys.
    Ints(&'a [i64]),
}

impl Keys<'_> {
    /// How many.
    pub fn len(&self) -> usize {
        match self {
            Keys::Strings(keys) => keys.len(),
            Keys::Ints(keys) => keys.len(),
        }
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Calls `f` with key `i` as bytes (an int64 written into a stack
    /// buffer, not allocated).
    pub fn with<R>(&self, i: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        match self {
            Keys::Strings(keys) => f(&keys[i]),
            Keys::Ints(keys) => f(itoa::Buffer::new().format(keys[i]).as_bytes()),
        }
    }

    /// Key `i` as text, for messages.
    pub fn display(&self, i: usize) -> String {
        self.with(i, |key| String::from_utf8_lossy(key).into_owned())
    }
}

/// The values of one feature for every key of a lookup: `keys × values per
/// entity` elements, zero (or empty strings) where the key was missed.
#[derive(Debug, Clone, PartialEq)]
pub enum ColumnValues {
    /// Fixed-width values, little-endian.
    Fixed(Vec<u8>),
    /// Byte strings.
    Strings(Vec<Bytes>),
}

/// One wanted feature's values for every key, and which keys had it.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    /// `present[i]`: key i had this feature.
    pub present: Vec<bool>,
    /// The values.
    pub values: ColumnValues,
}

impl Column {
    /// A column of `keys` misses for a feature of `spec`.
    pub fn empty(spec: &FeatureSpec, keys: usize) -> Column {
        let count = keys * spec.elements();
        let values = match spec.dtype.size() {
            Some(size) => ColumnValues::Fixed(vec![0; count * size]),
            None => ColumnValues::Strings(vec![Bytes::new(); count]),
        };
        Column { present: vec![false; keys], values }
    }
}

/// What a lookup found: one column per wanted feature, in the order asked.
pub type Found = Vec<Column>;

/// One feature table.
pub trait FeatureStore: Send + Sync {
    /// Its name and features.
    fn schema(&self) -> &Schema;

    /// `embedded` or `redis`, for messages and metrics.
    fn kind(&self) -> StoreKind;

    /// Looks up `keys`; answers one column for each feature index in
    /// `wanted`. A store that is down, or cannot answer before `deadline`
    /// (or its own timeout), answers UNAVAILABLE; a stored value that does
    /// not match the schema is an error naming the key, the feature and
    /// what was expected.
    fn lookup<'a>(
        &'a self,
        keys: Keys<'a>,
        wanted: &'a [usize],
        deadline: Option<Instant>,
    ) -> BoxFuture<'a, Result<Found>>;

    /// What the store last read for `keys` (a key it never read for: a
    /// miss), answered while it is down; `None` when it keeps nothing
    /// (`last_seen_entries`).
    fn last_seen(&self, _keys: Keys<'_>, _wanted: &[usize]) -> Option<Result<Found>> {
        None
    }
}

/// Every configured table, opened.
#[derive(Default)]
pub struct FeatureTables {
    tables: BTreeMap<String, Arc<dyn FeatureStore>>,
}

impl FeatureTables {
    /// Opens every table of `config`: embedded tables are loaded now (a
    /// table that cannot be loaded stops the start, as a model would);
    /// Redis tables connect in the background, so a Redis that is down
    /// makes their lookups fail, not the server.
    pub async fn open(config: &FeaturesConfig, metrics: &Metrics) -> Result<FeatureTables> {
        let redis = match &config.redis {
            Some(redis_config) if config.tables.values().any(|t| t.store == StoreKind::Redis) => {
                Some(redis::RedisClient::start(redis_config, metrics)?)
            }
            _ => None,
        };
        let mut tables: BTreeMap<String, Arc<dyn FeatureStore>> = BTreeMap::new();
        for (name, table) in &config.tables {
            let store: Arc<dyn FeatureStore> = match table.store {
                StoreKind::Embedded => {
                    let metrics = metrics.feature_table(name, StoreKind::Embedded.name());
                    let (name, table) = (name.clone(), table.clone());
                    Arc::new(
                        tokio::task::spawn_blocking(move || embedded::EmbeddedStore::open(&name, &table, metrics))
                            .await
                            .map_err(|e| Error::internal(format!("loading a feature table failed: {e}")))??,
                    )
                }
                StoreKind::Redis => {
                    let client = redis.as_ref().ok_or_else(|| {
                        Error::internal(format!(
                            "table '{name}' is in Redis, but no Redis is configured, this is a bug"
                        ))
                    })?;
                    let metrics = metrics.feature_table(name, StoreKind::Redis.name());
                    Arc::new(redis::RedisStore::new(name, table, client.clone(), config.redis.as_ref(), metrics))
                }
            };
            tables.insert(name.clone(), store);
        }
        Ok(FeatureTables { tables })
    }

    /// The table called `name`.
    pub fn get(&self, name: &str) -> Result<&Arc<dyn FeatureStore>> {
        self.tables.get(name).ok_or_else(|| {
            let names: Vec<&str> = self.tables.keys().map(String::as_str).collect();
            Error::not_found(format!("feature table '{name}' is not configured; tables: [{}]", names.join(", ")))
        })
    }
}
