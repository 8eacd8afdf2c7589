//! The Redis feature store: one hash per entity (`PREFIX` + key), one field
//! per feature, values in the format of [`super::value`].
//!
//! Lookups are coalesced. Each table's [`RedisStore`] answers what its
//! local cache holds (moka: bounded in entries, with a TTL; misses are
//! cached too) and sends the rest to the one [`RedisClient`] of the server,
//! through a bounded queue. A single task takes what is waiting — every
//! request's keys, of every table — removes duplicates, and sends them as
//! one pipelined round trip of `HMGET`s; while up to
//! `max_round_trips_in_flight` trips are out, new lookups wait and go
//! together in the next. A trip is bounded by the latest deadline of its
//! requests, capped by `timeout_ms`; each request stops waiting just
//! before its own deadline (answering UNAVAILABLE, not a passed
//! deadline), so a short deadline never fails the others in its trip.
//!
//! The connection is redis' `ConnectionManager`, which reconnects by
//! itself; the first connection is made in the background, so a Redis
//! that is down when sluice starts fails lookups, not the start. A
//! [`Breaker`] watches the round trips: after `breaker_failures` in a
//! row, Redis is held down and lookups that the local cache cannot answer
//! fail at once instead of each paying `timeout_ms`, until a `PING` every
//! `probe_interval_ms` answers. A table with `last_seen_entries` keeps the
//! last row read for that many entities, what a pipeline with
//! `on_store_error = "last_seen"` is answered from while Redis is down.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use futures::future::BoxFuture;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;

use super::breaker::Breaker;
use super::{value, Column, FeatureStore, Found, Keys, Schema};
use crate::config::features::{RedisConfig, StoreKind, TableConfig};
use crate::config::redis_access::redacted;
use crate::error::{Error, Result};
use crate::metrics::{FeatureMetrics, Metrics};

/// One entity as Redis answered it: each of the table's features, in
/// schema order, or `None` where the hash has no such field (or no hash).
type Row = Arc<[Option<Bytes>]>;

/// The server's one Redis connection and the task that coalesces lookups.
#[derive(Clone)]
pub struct RedisClient {
    queue: mpsc::Sender<Pending>,
    capacity: usize,
    url: Arc<str>,
    breaker: Arc<Breaker>,
}

/// One table's lookup waiting for a round trip.
struct Pending {
    table: Arc<TableRef>,
    /// Full Redis keys (prefix + key).
    keys: Vec<Bytes>,
    deadline: Option<Instant>,
    reply: oneshot::Sender<Result<Vec<std::result::Result<Row, String>>>>,
}

/// What a round trip needs to know of a table.
struct TableRef {
    /// The fields to read: the table's features, in schema order.
    fields: Vec<Bytes>,
    /// The most bytes each field's value may hold: exactly a fixed-width
    /// value's size, or [`MAX_STRING_BYTES`] per string. A larger value is
    /// refused, never kept in the cache.
    max_bytes: Vec<usize>,
    metrics: FeatureMetrics,
}

/// The longest string one element of a string feature may hold in Redis.
pub const MAX_STRING_BYTES: usize = 64 << 10;

/// The connection, once made, and the last error while it is not.
struct Connection {
    manager: ArcSwapOption<ConnectionManager>,
    last_error: Mutex<String>,
    url: Arc<str>,
    breaker: Arc<Breaker>,
    /// How long a probe waits for its `PONG`.
    probe_timeout: Duration,
    /// A PING is out to see whether a trip cut short by its clients'
    /// deadlines was Redis' fault.
    pinging: AtomicBool,
}

impl RedisClient {
    /// Starts connecting to `config.url` in the background and starts the
    /// coalescing task.
    pub fn start(config: &RedisConfig, metrics: &Metrics) -> Result<RedisClient> {
        let client = config.access().client("features.redis", &config.url).map_err(|e| Error::invalid_argument(e.0))?;
        // Logged and put in messages: without its credentials.
        let url: Arc<str> = redacted(&config.url).into();
        let (down, outages) = metrics.feature_store(StoreKind::Redis.name());
        let breaker = Arc::new(Breaker::new(
            format!("the Redis feature store {url}"),
            config.breaker_failures,
            Duration::from_millis(config.probe_interval_ms),
            down,
            outages,
        ));
        let connection = Arc::new(Connection {
            manager: ArcSwapOption::empty(),
            last_error: Mutex::new("not connected yet".to_string()),
            url: url.clone(),
            breaker: breaker.clone(),
            probe_timeout: Duration::from_millis(config.connect_timeout_ms.max(config.timeout_ms)),
            pinging: AtomicBool::new(false),
        });
        tokio::spawn(connect(client, config.clone(), connection.clone()));
        let (queue, waiting) = mpsc::channel(config.queue_capacity);
        tokio::spawn(coalesce(waiting, connection, config.clone()));
        Ok(RedisClient { queue, capacity: config.queue_capacity, url, breaker })
    }
}

impl Connection {
    /// A round trip failed for `why`; when that holds Redis down, the
    /// probe starts.
    fn failed(self: &Arc<Self>, why: &str) {
        if self.breaker.failed(why) {
            tokio::spawn(probe(self.clone()));
        }
    }

    /// A trip that the clients' own short deadlines cut off says nothing
    /// about Redis; one `PING` given the whole `timeout` does, and counts
    /// as a round trip would. Without it, a Redis that silently stops
    /// answering is never held down while every client's deadline is
    /// short. One at a time.
    fn ping_in_background(self: &Arc<Self>, timeout: Duration) {
        if self.pinging.swap(true, Ordering::AcqRel) {
            return;
        }
        let connection = self.clone();
        tokio::spawn(async move {
            match connection.ping(timeout).await {
                Some(Ok(())) => {
                    connection.breaker.succeeded();
                }
                Some(Err(why)) => connection.failed(&why),
                None => {}
            }
            connection.pinging.store(false, Ordering::Release);
        });
    }

    /// One `PING`, answered within `timeout` or why not; `None` before
    /// the first connection is made.
    async fn ping(&self, timeout: Duration) -> Option<std::result::Result<(), String>> {
        let mut manager = ConnectionManager::clone(&*self.manager.load_full()?);
        let ping = redis::cmd("PING");
        Some(match tokio::time::timeout(timeout, ping.query_async::<()>(&mut manager)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err(format!("no answer to a PING within {timeout:?}")),
        })
    }
}

/// While Redis is held down: one `PING` every probe interval, never a
/// client's lookup, until one answers. The `ConnectionManager` reconnects
/// on the way, so the first answer means lookups reach Redis again.
async fn probe(connection: Arc<Connection>) {
    loop {
        tokio::time::sleep(connection.breaker.probe_every()).await;
        // A round trip already out when it opened may have closed it.
        if !connection.breaker.is_open() {
            return;
        }
        if let Some(Ok(())) = connection.ping(connection.probe_timeout).await {
            connection.breaker.succeeded();
            return;
        }
    }
}

/// Makes the first connection, retrying until Redis answers; from then on
/// the `ConnectionManager` reconnects by itself.
async fn connect(client: redis::Client, config: RedisConfig, connection: Arc<Connection>) {
    let manager_config = ConnectionManagerConfig::new()
        .set_connection_timeout(Duration::from_millis(config.connect_timeout_ms))
        .set_response_timeout(Duration::from_millis(config.timeout_ms.max(config.connect_timeout_ms)))
        .set_number_of_retries(1)
        .set_max_delay(500);
    let mut wait = Duration::from_millis(100);
    loop {
        match ConnectionManager::new_with_config(client.clone(), manager_config.clone()).await {
            Ok(manager) => {
                tracing::info!(url = %connection.url, "connected to the Redis feature store");
                connection.manager.store(Some(Arc::new(manager)));
                // Lookups made before the first connection may have held
                // Redis down; it answers now.
                connection.breaker.succeeded();
                return;
            }
            Err(error) => {
                let message = error.to_string();
                let mut last = connection.last_error.lock().unwrap_or_else(PoisonError::into_inner);
                if *last != message {
                    tracing::warn!(url = %connection.url, "cannot connect to the Redis feature store, retrying: {message}");
                    *last = message;
                }
            }
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(2));
    }
}

/// Takes waiting lookups and sends them in round trips, at most
/// `max_round_trips_in_flight` at once.
async fn coalesce(mut waiting: mpsc::Receiver<Pending>, connection: Arc<Connection>, config: RedisConfig) {
    let in_flight = Arc::new(Semaphore::new(config.max_round_trips_in_flight));
    let window = Duration::from_micros(config.batch_window_us);
    let cap = Duration::from_millis(config.timeout_ms);
    loop {
        let Ok(permit) = in_flight.clone().acquire_owned().await else { return };
        let Some(first) = waiting.recv().await else { return };
        let mut keys = first.keys.len();
        let mut batch = vec![first];
        if !window.is_zero() {
            let until = Instant::now() + window;
            while keys < config.max_keys_per_round_trip {
                tokio::select! {
                    next = waiting.recv() => match next {
                        Some(pending) => { keys += pending.keys.len(); batch.push(pending); }
                        None => break,
                    },
                    () = tokio::time::sleep_until(until) => break,
                }
            }
        }
        while keys < config.max_keys_per_round_trip {
            let Ok(pending) = waiting.try_recv() else { break };
            keys += pending.keys.len();
            batch.push(pending);
        }
        let connection = connection.clone();
        tokio::spawn(async move {
            round_trip(&connection, batch, cap).await;
            drop(permit);
        });
    }
}

/// One pipelined round trip for `batch`: each distinct key once. Requests
/// whose deadline has passed are answered at once and left out; the trip
/// is bounded by the latest deadline of the others (each request stops
/// waiting at its own, in [`RedisStore`]), capped by `timeout_ms`, so one
/// client's short deadline never fails the requests it shares a trip with.
async fn round_trip(connection: &Arc<Connection>, mut batch: Vec<Pending>, cap: Duration) {
    batch.retain(|pending| !pending.reply.is_closed());
    let now = Instant::now();
    let (expired, live): (Vec<Pending>, Vec<Pending>) =
        batch.into_iter().partition(|p| p.deadline.is_some_and(|at| at <= now));
    for pending in expired {
        let _ = pending.reply.send(Err(Error::deadline_exceeded("while waiting for a Redis round trip")));
    }
    let batch = live;
    if batch.is_empty() {
        return;
    }
    // Lookups queued before Redis was held down fail as those after do.
    if let Err(down) = connection.breaker.check(batch.len()) {
        return fail(batch, &down);
    }
    let latest = batch.iter().map(|p| p.deadline).max_by_key(|d| d.unwrap_or_else(far_future)).flatten();
    let budget = latest.map_or(cap, |at| at.saturating_duration_since(now).min(cap));
    let Some(manager) = connection.manager.load_full() else {
        let last = connection.last_error.lock().unwrap_or_else(PoisonError::into_inner).clone();
        connection.failed(&format!("not connected: {last}"));
        return fail(
            batch,
            &Error::dependency_failed(format!("Redis feature store {}: not connected ({last})", connection.url)),
        );
    };
    // Distinct (table, key) pairs, in first-seen order.
    let mut distinct: HashMap<(usize, Bytes), usize> = HashMap::new();
    let mut order: Vec<(Arc<TableRef>, Bytes)> = Vec::new();
    let mut slots: Vec<Vec<usize>> = Vec::with_capacity(batch.len());
    for pending in &batch {
        let table = Arc::as_ptr(&pending.table) as usize;
        slots.push(
            pending
                .keys
                .iter()
                .map(|key| {
                    *distinct.entry((table, key.clone())).or_insert_with(|| {
                        order.push((pending.table.clone(), key.clone()));
                        order.len() - 1
                    })
                })
                .collect(),
        );
    }
    // Sized up front: growing each command's buffer showed in profiles.
    let mut pipe = redis::Pipeline::with_capacity(order.len());
    for (table, key) in &order {
        let bytes = 5 + key.len() + table.fields.iter().map(|f| f.len()).sum::<usize>();
        let mut command = redis::Cmd::with_capacity(2 + table.fields.len(), bytes);
        command.arg("HMGET").arg(key.as_ref());
        for field in &table.fields {
            command.arg(field.as_ref());
        }
        pipe.add_command(command);
    }
    // Counted once per table in the trip, with that table's distinct keys.
    let mut tables: Vec<(&Arc<TableRef>, usize)> = Vec::new();
    for (table, _) in &order {
        match tables.iter_mut().find(|(t, _)| Arc::ptr_eq(t, table)) {
            Some((_, keys)) => *keys += 1,
            None => tables.push((table, 1)),
        }
    }
    for (table, keys) in tables {
        table.metrics.round_trips.inc();
        table.metrics.round_trip_keys.observe(keys as f64);
    }
    let mut manager = (*manager).clone();
    let answer = tokio::time::timeout(budget, manager.req_packed_commands(&pipe, 0, order.len())).await;
    let values = match answer {
        Ok(Ok(values)) if values.len() == order.len() => {
            connection.breaker.succeeded();
            values
        }
        Ok(Ok(values)) => {
            let message = format!(
                "Redis feature store {} answered {} replies to {} commands",
                connection.url,
                values.len(),
                order.len()
            );
            return fail(batch, &Error::unavailable(message));
        }
        Ok(Err(error)) => {
            let why = error.to_string();
            connection.failed(&why);
            return fail(batch, &Error::dependency_failed(format!("Redis feature store {}: {why}", connection.url)));
        }
        // No answer in at least half of `timeout_ms` is Redis failing; in
        // less, the clients' own short deadlines were (a trip of hurried
        // requests must not hold Redis down for everyone).
        Err(_) if budget >= cap / 2 => {
            let why = format!("no answer to {} keys within {budget:?}", order.len());
            connection.failed(&why);
            return fail(batch, &Error::dependency_failed(format!("Redis feature store {}: {why}", connection.url)));
        }
        Err(_) => {
            connection.ping_in_background(cap);
            let message = format!(
                "Redis feature store {} did not answer {} keys within {budget:?}, what the requests' deadlines left",
                connection.url,
                order.len()
            );
            return fail(batch, &Error::unavailable(message));
        }
    };
    let rows: Vec<std::result::Result<Row, String>> =
        values.into_iter().zip(&order).map(|(value, (table, _))| row_of(value, table)).collect();
    for (pending, slots) in batch.into_iter().zip(slots) {
        let answer = slots.iter().map(|&at| rows[at].clone()).collect();
        let _ = pending.reply.send(Ok(answer));
    }
}

/// One `HMGET` reply as a row, or what was wrong with it.
fn row_of(value: redis::Value, table: &TableRef) -> std::result::Result<Row, String> {
    match value {
        redis::Value::Array(items) if items.len() == table.fields.len() => items
            .into_iter()
            .zip(&table.max_bytes)
            .zip(&table.fields)
            .map(|((item, &max), field)| match item {
                redis::Value::Nil => Ok(None),
                redis::Value::BulkString(bytes) if bytes.len() > max => Err(format!(
                    "field '{}' holds {} bytes, more than the {max} its feature's value can take",
                    String::from_utf8_lossy(field),
                    bytes.len()
                )),
                redis::Value::BulkString(bytes) => Ok(Some(Bytes::from(bytes))),
                other => Err(format!("a field holds {other:?}, not a string")),
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map(Row::from),
        redis::Value::ServerError(error) => {
            Err(format!("Redis answered {} {}; each entity is a hash", error.code(), error.details().unwrap_or("")))
        }
        other => Err(format!("Redis answered {other:?} to HMGET")),
    }
}

fn fail(batch: Vec<Pending>, error: &Error) {
    for pending in batch {
        let _ = pending.reply.send(Err(error.clone()));
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86400 * 365)
}

/// One table in Redis.
pub struct RedisStore {
    schema: Schema,
    prefix: Bytes,
    client: RedisClient,
    table: Arc<TableRef>,
    cache: Option<moka::sync::Cache<Bytes, Row>>,
    /// The last row read for each of up to `last_seen_entries` entities,
    /// without expiry: answers while Redis is down.
    last_seen: Option<moka::sync::Cache<Bytes, Row>>,
}

impl RedisStore {
    /// Table `name`, read through `client`.
    pub fn new(
        name: &str,
        config: &TableConfig,
        client: RedisClient,
        redis: Option<&RedisConfig>,
        metrics: FeatureMetrics,
    ) -> RedisStore {
        let schema = Schema::of(name, config);
        let fields = schema.features.iter().map(|(name, _)| Bytes::copy_from_slice(name.as_bytes())).collect();
        let max_bytes = schema
            .features
            .iter()
            .map(|(_, spec)| match spec.dtype.size() {
                Some(size) => size.saturating_mul(spec.elements()),
                None => spec.elements().saturating_mul(4 + MAX_STRING_BYTES),
            })
            .collect();
        let cache = redis.filter(|r| r.cache_entries > 0).map(|r| {
            moka::sync::Cache::builder()
                .max_capacity(r.cache_entries)
                .time_to_live(Duration::from_millis(r.cache_ttl_ms.max(1)))
                .build()
        });
        // Least recently used out first: a cache that refused new keys
        // (moka's default admission) would keep stale entities over ones
        // the traffic reads now.
        let last_seen = (config.last_seen_entries > 0).then(|| {
            moka::sync::Cache::builder()
                .max_capacity(config.last_seen_entries)
                .eviction_policy(moka::policy::EvictionPolicy::lru())
                .build()
        });
        RedisStore {
            schema,
            prefix: Bytes::from(config.redis_prefix(name)),
            client,
            table: Arc::new(TableRef { fields, max_bytes, metrics }),
            cache,
            last_seen,
        }
    }

    /// Key `i`'s hash in Redis: the prefix and the key.
    fn full_key(&self, keys: Keys<'_>, i: usize) -> Bytes {
        keys.with(i, |key| {
            let mut full = Vec::with_capacity(self.prefix.len() + key.len());
            full.extend_from_slice(&self.prefix);
            full.extend_from_slice(key);
            Bytes::from(full)
        })
    }

    /// Writes `row` as key `i` of the wanted columns.
    fn fill(&self, row: &Row, i: usize, keys: Keys<'_>, wanted: &[usize], found: &mut Found) -> Result<bool> {
        let mut any = false;
        for (column, &f) in found.iter_mut().zip(wanted) {
            if let Some(stored) = &row[f] {
                let (feature, spec) = &self.schema.features[f];
                value::decode_into(spec, stored, column, i).map_err(|problem| {
                    Error::failed_precondition(format!(
                        "feature table '{}' (redis): key \"{}\" (hash {}{}), field '{feature}': the stored value {problem}",
                        self.schema.table,
                        keys.display(i),
                        String::from_utf8_lossy(&self.prefix),
                        keys.display(i),
                    ))
                })?;
                any = true;
            }
        }
        Ok(any)
    }

    async fn lookup_now(&self, keys: Keys<'_>, wanted: &[usize], deadline: Option<Instant>) -> Result<Found> {
        let metrics = &self.table.metrics;
        let mut found: Found = wanted.iter().map(|&f| Column::empty(&self.schema.features[f].1, keys.len())).collect();
        let mut hits = 0u64;
        let mut asked: Vec<usize> = Vec::new();
        let mut full_keys: Vec<Bytes> = Vec::new();
        for i in 0..keys.len() {
            let full = self.full_key(keys, i);
            match self.cache.as_ref().and_then(|cache| cache.get(&full)) {
                Some(row) => {
                    metrics.cache_hits.inc();
                    hits += self.fill(&row, i, keys, wanted, &mut found)? as u64;
                }
                None => {
                    asked.push(i);
                    full_keys.push(full);
                }
            }
        }
        if self.cache.is_some() {
            metrics.cache_misses.inc_by(asked.len() as u64);
        }
        if !asked.is_empty() {
            // Held down: at once, not after `timeout_ms`.
            self.client.breaker.check(1)?;
            let (reply, answer) = oneshot::channel();
            let pending = Pending { table: self.table.clone(), keys: full_keys.clone(), deadline, reply };
            self.client.queue.try_send(pending).map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => Error::queue_full(
                    &format!("the lookup queue of the Redis feature store {}", self.client.url),
                    self.client.capacity,
                ),
                mpsc::error::TrySendError::Closed(_) => {
                    Error::unavailable(format!("the Redis feature store {} has stopped", self.client.url))
                }
            })?;
            let answered = async {
                answer.await.map_err(|_| {
                    Error::unavailable(format!("the Redis feature store {} dropped a lookup", self.client.url))
                })?
            };
            let rows = match deadline {
                None => answered.await?,
                // Stops waiting a little before the deadline, so the
                // request hears why instead of a bare DEADLINE_EXCEEDED.
                Some(at) => {
                    let left = at.saturating_duration_since(Instant::now());
                    let budget = left.saturating_sub((left / 10).min(Duration::from_millis(5)));
                    tokio::time::timeout(budget, answered).await.map_err(|_| {
                        Error::unavailable(format!(
                            "the Redis feature store {} did not answer before the request's deadline",
                            self.client.url
                        ))
                    })??
                }
            };
            for ((i, full), row) in asked.into_iter().zip(full_keys).zip(rows) {
                let row = row.map_err(|problem| {
                    Error::failed_precondition(format!(
                        "feature table '{}' (redis): key \"{}\" (hash {}): {problem}",
                        self.schema.table,
                        keys.display(i),
                        String::from_utf8_lossy(&full)
                    ))
                })?;
                hits += self.fill(&row, i, keys, wanted, &mut found)? as u64;
                if let Some(last_seen) = &self.last_seen {
                    // An entity gone from Redis is gone from what an
                    // outage answers too.
                    if row.iter().any(Option::is_some) {
                        last_seen.insert(full.clone(), row.clone());
                    } else {
                        last_seen.invalidate(&full);
                    }
                }
                if let Some(cache) = &self.cache {
                    cache.insert(full, row);
                }
            }
        }
        metrics.hits.inc_by(hits);
        metrics.misses.inc_by(keys.len() as u64 - hits);
        Ok(found)
    }
}

impl FeatureStore for RedisStore {
    fn schema(&self) -> &Schema {
        &self.schema
    }

    fn kind(&self) -> StoreKind {
        StoreKind::Redis
    }

    fn last_seen(&self, keys: Keys<'_>, wanted: &[usize]) -> Option<Result<Found>> {
        let kept = self.last_seen.as_ref()?;
        let mut found: Found = wanted.iter().map(|&f| Column::empty(&self.schema.features[f].1, keys.len())).collect();
        for i in 0..keys.len() {
            if let Some(row) = kept.get(&self.full_key(keys, i)) {
                if let Err(error) = self.fill(&row, i, keys, wanted, &mut found) {
                    return Some(Err(error));
                }
            }
        }
        Some(Ok(found))
    }

    fn lookup<'a>(
        &'a self,
        keys: Keys<'a>,
        wanted: &'a [usize],
        deadline: Option<Instant>,
    ) -> BoxFuture<'a, Result<Found>> {
        Box::pin(async move {
            let started = std::time::Instant::now();
            let metrics = &self.table.metrics;
            metrics.lookups.inc();
            let result = self.lookup_now(keys, wanted, deadline).await;
            if result.is_err() {
                metrics.errors.inc();
            }
            metrics.seconds.observe(started.elapsed().as_secs_f64());
            result
        })
    }
}
