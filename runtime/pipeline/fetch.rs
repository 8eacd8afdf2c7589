//! The feature-fetch stage: the first of a pipeline's stages. It reads
//! entity keys from a request input, looks them up in a feature table
//! (`feature/`: embedded or Redis), and adds one tensor per fetched feature
//! to the request's tensors for the next stage.
//!
//! Lookups run in the request's own task: they wait on memory or on the
//! network, not on a CPU, so they take no worker thread. The stage's bound
//! is its admission (`queue_capacity` requests fetching at once; more are
//! refused at once); a Redis table adds the bounded queue of its
//! coalescer. Keys are checked before any lookup (count, length), and
//! every tensor the stage builds is sized against `max_tensor_bytes`
//! before it is allocated.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use super::admission::Admission;
use super::deadline::Deadline;
use super::priority::Priority;
use crate::config::features::{FeatureFetchConfig, FeatureSpec, StoreErrorPolicy};
use crate::config::TrafficConfig;
use crate::error::{Code, Error, Result};
use crate::feature::{value, Column, ColumnValues, FeatureStore, FeatureTables, Found, Keys};
use crate::metrics::{Metrics, QueueMetrics};
use crate::tensor::spec::{fits, TensorSpec};
use crate::tensor::{tensor_bytes, DType, NamedTensor, Tensor, TensorData};
use prometheus_client::metrics::counter::Counter;

/// The tensor a graph pipeline's feature fetch adds: a boolean scalar,
/// true when a lookup fell back on `on_store_error` (its store down or
/// too slow), for a fallback step's `when`.
pub const FELL_BACK: &str = "feature_fetch.fell_back";

/// A pipeline's feature-fetch stage.
pub struct FeatureFetch {
    /// "the feature fetch of pipeline 'recommend'", for messages.
    label: String,
    lookups: Vec<Lookup>,
    on_store_error: StoreErrorPolicy,
    max_keys: usize,
    max_key_bytes: usize,
    admission: Admission,
    metrics: QueueMetrics,
}

/// One lookup: keys from one tensor, features from one table.
struct Lookup {
    keys: TensorSpec,
    store: Arc<dyn FeatureStore>,
    /// Feature indexes in the table's schema, in `features` order.
    wanted: Vec<usize>,
    features: Vec<Fetched>,
    /// Lookups answered by the pipeline's fallback; none when it fails.
    fallbacks: Option<Counter>,
}

impl Lookup {
    /// The tensors it makes: per feature, the key shape followed by the
    /// feature's shape.
    fn outputs(&self) -> Vec<TensorSpec> {
        self.features
            .iter()
            .map(|f| {
                TensorSpec::new(
                    f.tensor.clone(),
                    f.spec.dtype,
                    self.keys.shape.iter().chain(&f.spec.shape).copied().collect(),
                )
            })
            .collect()
    }
}

/// One feature a lookup fetches and the tensor it becomes.
struct Fetched {
    tensor: String,
    feature: String,
    spec: FeatureSpec,
    default: Option<Tensor>,
}

impl FeatureFetch {
    /// The stage `config` describes for pipeline `pipeline`, over `tables`.
    pub fn build(
        config: &FeatureFetchConfig,
        pipeline: &str,
        tables: &FeatureTables,
        metrics: &Metrics,
        traffic: &TrafficConfig,
    ) -> Result<FeatureFetch> {
        let mut lookups = Vec::with_capacity(config.lookups.len());
        for (i, lookup) in config.lookups.iter().enumerate() {
            let store = tables.get(&lookup.table)?.clone();
            let schema = store.schema();
            let mut wanted = Vec::with_capacity(lookup.features.len());
            let mut features = Vec::with_capacity(lookup.features.len());
            for fetched in &lookup.features {
                let at = schema.index(&fetched.feature).ok_or_else(|| {
                    Error::invalid_argument(format!(
                        "lookups[{i}]: table '{}' has no feature '{}'",
                        lookup.table, fetched.feature
                    ))
                })?;
                let spec = schema.features[at].1.clone();
                let what = format!("lookups[{i}] feature '{}' default", fetched.feature);
                let default = fetched.default.as_ref().map(|d| value::default_of(&spec, d, &what)).transpose()?;
                wanted.push(at);
                features.push(Fetched {
                    tensor: fetched.tensor_name().to_string(),
                    feature: fetched.feature.clone(),
                    spec,
                    default,
                });
            }
            let keys = TensorSpec::new(lookup.keys.clone(), lookup.key_dtype, lookup.key_shape.clone());
            let fallbacks = (config.on_store_error != StoreErrorPolicy::Fail)
                .then(|| metrics.feature_fallbacks(&lookup.table, store.kind().name(), config.on_store_error.name()));
            lookups.push(Lookup { keys, store, wanted, features, fallbacks });
        }
        // A lookup reading keys an earlier lookup made: those must be keys
        // of its dtype and shape, checked now rather than by the model.
        for (i, lookup) in lookups.iter().enumerate() {
            let made = lookups[..i].iter().flat_map(Lookup::outputs).find(|spec| spec.name == lookup.keys.name);
            if let Some(made) = made {
                fits(&made, &lookup.keys)
                    .map_err(|e| e.context(format_args!("lookups[{i}] reads keys that an earlier lookup makes")))?;
            }
        }
        let label = format!("the feature fetch of pipeline '{pipeline}'");
        let metrics = metrics.queue(&format!("{pipeline}/feature_fetch"));
        let admission =
            Admission::new(label.clone(), config.queue_capacity, traffic, metrics.full.clone(), metrics.depth.clone());
        Ok(FeatureFetch {
            label,
            lookups,
            on_store_error: config.on_store_error,
            max_keys: config.max_keys,
            max_key_bytes: config.max_key_bytes,
            admission,
            metrics,
        })
    }

    /// What clients give it: each lookup's keys, unless an earlier lookup
    /// makes them.
    pub fn key_inputs(&self) -> Vec<TensorSpec> {
        let mut inputs: Vec<TensorSpec> = Vec::new();
        for (i, lookup) in self.lookups.iter().enumerate() {
            let made_earlier =
                self.lookups[..i].iter().any(|l| l.features.iter().any(|f| f.tensor == lookup.keys.name));
            if !made_earlier && !inputs.iter().any(|s| s.name == lookup.keys.name) {
                inputs.push(lookup.keys.clone());
            }
        }
        inputs
    }

    /// The tensors it adds: per feature, the key shape followed by the
    /// feature's shape.
    pub fn outputs(&self) -> Vec<TensorSpec> {
        self.lookups.iter().flat_map(Lookup::outputs).collect()
    }

    /// Runs every lookup on one request: `tensors` with the fetched ones
    /// added.
    pub async fn run(
        &self,
        tensors: Vec<NamedTensor>,
        deadline: Deadline,
        priority: Priority,
        max_tensor_bytes: usize,
    ) -> Result<Vec<NamedTensor>> {
        self.run_telling(tensors, deadline, priority, max_tensor_bytes).await.map(|(tensors, _)| tensors)
    }

    /// [`FeatureFetch::run`], also telling whether a lookup fell back on
    /// `on_store_error` (its store down or too slow): a graph pipeline
    /// can run a fallback model on it ([`FELL_BACK`]).
    pub async fn run_telling(
        &self,
        mut tensors: Vec<NamedTensor>,
        deadline: Deadline,
        priority: Priority,
        max_tensor_bytes: usize,
    ) -> Result<(Vec<NamedTensor>, bool)> {
        let _admitted = self.admission.try_admit(priority, deadline)?;
        if deadline.expired() {
            self.metrics.expired.inc();
            return Err(Error::deadline_exceeded(&format!("before {}", self.label)));
        }
        let started = Instant::now();
        let mut fell_back = false;
        for lookup in &self.lookups {
            let (fetched, fallback) = self.fetch(lookup, &tensors, deadline, max_tensor_bytes).await?;
            fell_back |= fallback;
            tensors.extend(fetched);
        }
        self.metrics.busy.observe(started.elapsed().as_secs_f64());
        Ok((tensors, fell_back))
    }

    async fn fetch(
        &self,
        lookup: &Lookup,
        tensors: &[NamedTensor],
        deadline: Deadline,
        max_tensor_bytes: usize,
    ) -> Result<(Vec<NamedTensor>, bool)> {
        let name = &lookup.keys.name;
        let keys_tensor = &tensors
            .iter()
            .find(|t| &t.name == name)
            .ok_or_else(|| {
                Error::internal(format!("{}: no tensor '{name}' holds the keys, this is a bug", self.label))
            })?
            .tensor;
        // Sized before anything is allocated: the keys' count is the
        // client's number.
        for f in &lookup.features {
            let shape: Vec<i64> = keys_tensor.shape().iter().chain(&f.spec.shape).copied().collect();
            tensor_bytes(f.spec.dtype, &shape, max_tensor_bytes, &format!("feature tensor '{}'", f.tensor))?;
        }
        let ints;
        let keys = match keys_tensor.data() {
            TensorData::Strings(strings) => Keys::Strings(strings),
            TensorData::Fixed(_) if keys_tensor.dtype() == DType::I64 => {
                ints = keys_tensor.to_vec::<i64>().unwrap_or_default();
                Keys::Ints(&ints)
            }
            TensorData::Fixed(_) => {
                return Err(Error::invalid_argument(format!(
                    "input '{name}' is {}; keys are {}",
                    keys_tensor.dtype(),
                    lookup.keys.dtype
                )))
            }
        };
        self.check_keys(name, keys)?;
        let table = lookup.store.schema().table.as_str();
        let found = deadline
            .run(
                &format!("in {} (table '{table}')", self.label),
                lookup.store.lookup(keys, &lookup.wanted, deadline.instant()),
            )
            .await;
        let fell_back = found.is_err();
        let mut found = match found.or_else(|error| self.fall_back(lookup, keys, error)) {
            Ok(found) => found,
            Err(error) => return Err(error.context(format_args!("{} (table '{table}')", self.label))),
        };
        let mut out = Vec::with_capacity(lookup.features.len());
        for (column, f) in found.iter_mut().zip(&lookup.features) {
            if let Some(missed) = column.present.iter().position(|&p| !p) {
                let Some(default) = &f.default else {
                    return Err(Error::not_found(format!(
                        "feature table '{table}' has no '{}' for key \"{}\" (input '{name}', position {missed}); \
                         {} sets no default for it",
                        f.feature,
                        keys.display(missed),
                        self.label
                    )));
                };
                for i in missed..keys.len() {
                    if !column.present[i] {
                        value::put(column, i, default);
                    }
                }
            }
            let shape: Vec<i64> = keys_tensor.shape().iter().chain(&f.spec.shape).copied().collect();
            let values = std::mem::replace(&mut column.values, ColumnValues::Fixed(Vec::new()));
            let data = match values {
                ColumnValues::Fixed(bytes) => TensorData::Fixed(Bytes::from(bytes)),
                ColumnValues::Strings(strings) => TensorData::Strings(strings),
            };
            out.push(NamedTensor::new(f.tensor.clone(), Tensor::from_parts_unchecked(f.spec.dtype, shape, data)));
        }
        Ok((out, fell_back))
    }

    /// What a lookup whose store failed with `error` answers instead, as
    /// `on_store_error` says: columns of misses that the features'
    /// defaults fill (`defaults`), or what the store last read for each
    /// key (`last_seen`). The error stands when the policy is `fail`, when
    /// it is not the store being down or busy (a malformed value), or when
    /// a key would be left with neither a value nor a default.
    fn fall_back(&self, lookup: &Lookup, keys: Keys<'_>, error: Error) -> Result<Found> {
        if !matches!(error.code(), Code::Unavailable | Code::ResourceExhausted) {
            return Err(error);
        }
        let found: Found = match self.on_store_error {
            StoreErrorPolicy::Fail => return Err(error),
            StoreErrorPolicy::Defaults => lookup.features.iter().map(|f| Column::empty(&f.spec, keys.len())).collect(),
            StoreErrorPolicy::LastSeen => match lookup.store.last_seen(keys, &lookup.wanted) {
                Some(found) => found?,
                None => return Err(error),
            },
        };
        for (column, f) in found.iter().zip(&lookup.features) {
            if f.default.is_some() {
                continue;
            }
            if let Some(missed) = column.present.iter().position(|&p| !p) {
                let kept =
                    if self.on_store_error == StoreErrorPolicy::LastSeen { "no last-seen value and " } else { "" };
                return Err(error.context(format_args!(
                    "key \"{}\" has {kept}no default for '{}' to fall back on",
                    keys.display(missed),
                    f.feature
                )));
            }
        }
        if let Some(fallbacks) = &lookup.fallbacks {
            fallbacks.inc();
        }
        Ok(found)
    }

    /// Every key is short enough and not empty, and there are not too many.
    fn check_keys(&self, name: &str, keys: Keys<'_>) -> Result<()> {
        if keys.len() > self.max_keys {
            return Err(Error::invalid_argument(format!(
                "input '{name}' holds {} keys; {} takes at most {} per lookup (max_keys)",
                keys.len(),
                self.label,
                self.max_keys
            )));
        }
        if let Keys::Strings(strings) = keys {
            for (i, key) in strings.iter().enumerate() {
                if key.is_empty() || key.len() > self.max_key_bytes {
                    return Err(Error::invalid_argument(format!(
                        "input '{name}' key {i} is {} bytes long; keys are 1 to {} bytes (max_key_bytes)",
                        key.len(),
                        self.max_key_bytes
                    )));
                }
            }
        }
        Ok(())
    }
}
