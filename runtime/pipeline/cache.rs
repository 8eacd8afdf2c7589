//! A pipeline's response cache: the answer to a request kept by the model
//! version and the inputs that produced it, so the same request again skips
//! the stages and the model.
//!
//! The key is a hash of the version and of every input tensor (dtype, shape,
//! bytes), after the feature fetch, so fetched features are part of it. The
//! hash only finds the entry: the entry keeps the inputs it was made from
//! and is served only when they are equal, byte for byte, to the request's,
//! so a collision costs a miss, never another input's answer. Entries are
//! weighed in bytes (inputs and outputs) and bounded by `cache.max_mib`
//! (moka, least recently used first), and expire after `cache.ttl_secs`.
//!
//! Each pipeline has its own cache, so no entry is shared across pipelines;
//! it is emptied whenever what answers changes: a model version loaded or
//! unloaded, a plugin swapped or a canary started or ended. While a plugin
//! canary runs, the answer depends on the side a request is dealt, so the
//! cache is bypassed (counted as such).

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use crate::config::CacheConfig;
pub use crate::metrics::CacheHandles;
use crate::metrics::Metrics;
use crate::tensor::{Tensor, TensorData};

/// How a key is made from a version and its inputs; replaceable so tests
/// can force collisions.
pub type KeyHasher = Box<dyn Fn(i64, &[Tensor]) -> u64 + Send + Sync>;

/// One kept answer, with what it was made from.
struct Cached {
    version: i64,
    inputs: Vec<Tensor>,
    outputs: Vec<Tensor>,
}

/// The response cache of one pipeline.
pub struct ResponseCache {
    entries: moka::sync::Cache<u64, Arc<Cached>>,
    key: KeyHasher,
    /// Bumped by every clear: an answer made before one is not kept after.
    generation: AtomicU64,
    hits: Counter,
    misses: Counter,
    bypassed: Counter,
    bytes: Gauge,
}

impl ResponseCache {
    /// A cache as `config` says, counted in `sluice_response_cache_*`
    /// under `pipeline`.
    pub fn new(config: &CacheConfig, pipeline: &str, metrics: &Metrics) -> ResponseCache {
        // Keys of a hasher seeded at random: a client cannot aim
        // collisions at another's entries (they would only cost misses,
        // since entries keep their inputs), and foldhash takes a fraction
        // of SipHash's time over a whole request's inputs.
        let state = foldhash::quality::RandomState::default();
        let key: KeyHasher = Box::new(move |version, inputs| {
            let mut hasher = state.build_hasher();
            hash_inputs(&mut hasher, version, inputs);
            hasher.finish()
        });
        let handles = metrics.response_cache(pipeline);
        ResponseCache::with_key(config, key, handles)
    }

    /// A cache keyed by `key`.
    pub fn with_key(config: &CacheConfig, key: KeyHasher, handles: CacheHandles) -> ResponseCache {
        // Bytes are counted in as entries go in and out as moka removes
        // them (evicted, expired, replaced or cleared), whenever it does.
        let bytes = handles.bytes.clone();
        let entries = moka::sync::Cache::builder()
            .max_capacity(config.max_mib.saturating_mul(1 << 20))
            .weigher(|_key: &u64, entry: &Arc<Cached>| entry.weight())
            .time_to_live(Duration::from_secs(config.ttl_secs))
            .eviction_listener(move |_key, entry: Arc<Cached>, _cause| {
                bytes.dec_by(i64::from(entry.weight()));
            })
            .build();
        ResponseCache {
            entries,
            key,
            generation: AtomicU64::new(0),
            hits: handles.hits,
            misses: handles.misses,
            bypassed: handles.bypassed,
            bytes: handles.bytes,
        }
    }

    /// The answer kept for exactly these inputs to `version`, if any.
    pub fn get(&self, version: i64, inputs: &[Tensor]) -> Option<Vec<Tensor>> {
        let key = (self.key)(version, inputs);
        let found = self.entries.get(&key).filter(|entry| entry.version == version && entry.inputs == inputs);
        match found {
            Some(entry) => {
                self.hits.inc();
                Some(entry.outputs.clone())
            }
            None => {
                self.misses.inc();
                None
            }
        }
    }

    /// What [`ResponseCache::put`] needs from before the answer was made.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Keeps `outputs` as the answer of `version` to `inputs` (tensors share
    /// their buffers with the request's: nothing is copied), unless the
    /// cache was cleared since `generation` was read (the answer may come
    /// from what was replaced). An entry under the same key is replaced.
    pub fn put(&self, generation: u64, version: i64, inputs: Vec<Tensor>, outputs: Vec<Tensor>) {
        if self.generation() != generation {
            return;
        }
        let key = (self.key)(version, &inputs);
        let entry = Arc::new(Cached { version, inputs, outputs });
        self.bytes.inc_by(i64::from(entry.weight()));
        self.entries.insert(key, entry);
    }

    /// Counts a request that could not use the cache.
    pub fn bypass(&self) {
        self.bypassed.inc();
    }

    /// Forgets every entry: what answers has changed.
    pub fn clear(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.entries.invalidate_all();
    }

    /// Entries kept now (after pending evictions are applied).
    pub fn len(&self) -> u64 {
        self.entries.run_pending_tasks();
        self.entries.entry_count()
    }

    /// True when nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Cached {
    /// Bytes it keeps, roughly: tensor bytes and a fixed cost per tensor
    /// (an entry beyond 4 GiB weighs 4 GiB: it fills any cache anyway).
    fn weight(&self) -> u32 {
        let bytes = self.inputs.iter().chain(&self.outputs).map(|t| tensor_weight(t) + 64).sum::<usize>() + 64;
        u32::try_from(bytes).unwrap_or(u32::MAX)
    }
}

fn tensor_weight(tensor: &Tensor) -> usize {
    match tensor.data() {
        TensorData::Fixed(bytes) => bytes.len(),
        TensorData::Strings(strings) => strings.iter().map(|s| s.len() + 16).sum(),
    }
}

/// Feeds a version and its inputs to `hasher`: dtype, shape and bytes of
/// each, with lengths, so different splits of the same bytes differ.
pub fn hash_inputs(hasher: &mut impl Hasher, version: i64, inputs: &[Tensor]) {
    version.hash(hasher);
    inputs.len().hash(hasher);
    for tensor in inputs {
        tensor.dtype().hash(hasher);
        tensor.shape().hash(hasher);
        match tensor.data() {
            TensorData::Fixed(bytes) => bytes[..].hash(hasher),
            TensorData::Strings(strings) => {
                strings.len().hash(hasher);
                for s in strings {
                    s[..].hash(hasher);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn handles() -> CacheHandles {
        CacheHandles {
            hits: Counter::default(),
            misses: Counter::default(),
            bypassed: Counter::default(),
            bytes: Gauge::default(),
        }
    }

    /// A cache whose keys collide on purpose: every input lands in one of
    /// `buckets` keys.
    fn colliding(buckets: u64) -> ResponseCache {
        let config = CacheConfig { max_mib: 16, ttl_secs: 60 };
        let key: KeyHasher = Box::new(move |version, inputs| {
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            hash_inputs(&mut hasher, version, inputs);
            hasher.finish() % buckets
        });
        ResponseCache::with_key(&config, key, handles())
    }

    fn answer_of(version: i64, input: &Tensor) -> Vec<Tensor> {
        // Any function of the inputs: what the "model" answers.
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        hash_inputs(&mut hasher, version, std::slice::from_ref(input));
        vec![Tensor::from_values(vec![1], &[hasher.finish() as i64])]
    }

    fn input() -> impl Strategy<Value = Tensor> {
        prop_oneof![
            prop::collection::vec(-3.0f32..3.0, 0..6).prop_map(|v| Tensor::from_values(vec![v.len() as i64], &v)),
            prop::collection::vec(0i64..4, 0..6).prop_map(|v| Tensor::from_values(vec![1, v.len() as i64], &v)),
            prop::collection::vec(prop::collection::vec(any::<u8>(), 0..3), 0..3).prop_map(|v| {
                let strings = v.into_iter().map(bytes::Bytes::from).collect::<Vec<_>>();
                Tensor::from_strings(vec![strings.len() as i64], strings).unwrap()
            }),
        ]
    }

    proptest! {
        /// Under forced collisions (two keys for every input there is), the
        /// cache answers a request only with the answer made for exactly
        /// its inputs and version.
        #[test]
        fn never_answers_with_another_inputs_answer(
            ops in prop::collection::vec((0i64..2, input(), any::<bool>()), 1..60)
        ) {
            let cache = colliding(2);
            for (version, input, store) in ops {
                if store {
                    cache.put(0, version, vec![input.clone()], answer_of(version, &input));
                }
                if let Some(found) = cache.get(version, std::slice::from_ref(&input)) {
                    prop_assert_eq!(found, answer_of(version, &input));
                }
            }
        }
    }

    #[test]
    fn hits_after_a_put_misses_after_a_clear_and_counts_both() {
        let cache = colliding(1 << 32);
        let x = Tensor::from_values(vec![2], &[1.0f32, 2.0]);
        assert!(cache.get(1, std::slice::from_ref(&x)).is_none());
        cache.put(0, 1, vec![x.clone()], answer_of(1, &x));
        assert_eq!(cache.get(1, std::slice::from_ref(&x)), Some(answer_of(1, &x)));
        assert!(cache.get(2, std::slice::from_ref(&x)).is_none(), "another version is another answer");
        cache.clear();
        assert!(cache.get(1, std::slice::from_ref(&x)).is_none());
        assert_eq!((cache.hits.get(), cache.misses.get()), (1, 3));
    }

    #[test]
    fn stays_within_its_bytes() {
        let config = CacheConfig { max_mib: 1, ttl_secs: 60 };
        let cache =
            ResponseCache::with_key(&config, Box::new(|v, i| v as u64 ^ i.len() as u64 ^ rand_key(i)), handles());
        for i in 0..200u32 {
            let big = Tensor::from_values(vec![4096], &vec![i as f32; 4096]);
            cache.put(0, 0, vec![big], Vec::new());
        }
        cache.len();
        assert!(cache.entries.weighted_size() <= 1 << 20, "{} bytes kept", cache.entries.weighted_size());
        assert_eq!(cache.bytes.get() as u64, cache.entries.weighted_size(), "the gauge follows what moka keeps");
        assert!(cache.len() >= 30, "it keeps what fits: {}", cache.len());
        cache.clear();
        cache.len();
        assert_eq!(cache.bytes.get(), 0, "a clear empties the gauge as entries go");
    }

    fn rand_key(inputs: &[Tensor]) -> u64 {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        hash_inputs(&mut hasher, 0, inputs);
        hasher.finish()
    }
}
