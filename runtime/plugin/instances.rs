//! Where a call's instance comes from and where it goes afterwards.
//!
//! By default every call gets a fresh instance from the pool and the
//! instance is torn down when the call ends, so no call sees what another
//! left. With `reuse_instance`, a healthy instance goes back to a pool of
//! this plugin's own (per pipeline stage, never shared between pipelines),
//! and an instance that failed is never reused.
//!
//! Preparing instances ahead of time on a background thread and tearing
//! them down on another was measured and dropped: on two vCPUs the extra
//! threads compete with the calls for the cores, and both a request's
//! latency and the calls' throughput got worse (docs/BENCHMARKS.md).

use std::sync::{Arc, Mutex};

use wasmtime::Store;

use super::bindings::post::{Postprocessor, PostprocessorPre};
use super::bindings::pre::{Preprocessor, PreprocessorPre};
use super::engine::{self, PluginEngine};
use super::state::HostState;
use super::PluginLimits;

/// The instance-to-be of a plugin: its component, linked.
#[derive(Clone)]
pub enum Pre {
    /// A preprocessor.
    Preprocessor(PreprocessorPre<HostState>),
    /// A postprocessor.
    Postprocessor(PostprocessorPre<HostState>),
}

/// An instance of either world.
pub enum Instance {
    /// A preprocessor.
    Preprocessor(Preprocessor),
    /// A postprocessor.
    Postprocessor(Postprocessor),
}

/// An instance with its store.
pub struct Live {
    /// The store, holding the instance's state.
    pub store: Store<HostState>,
    /// The instance.
    pub instance: Instance,
}

/// The instances of one plugin.
pub struct Instances {
    engine: Arc<PluginEngine>,
    pre: Pre,
    limits: PluginLimits,
    label: Arc<str>,
    warm: Mutex<Vec<Live>>,
}

impl Instances {
    /// Instances of `pre`, labelled `label` in logs, with `limits`.
    pub fn new(engine: &Arc<PluginEngine>, pre: Pre, limits: PluginLimits, label: Arc<str>) -> Instances {
        Instances { engine: engine.clone(), pre, limits, label, warm: Mutex::new(Vec::new()) }
    }

    /// An instance for one call, armed with the call's limits: a kept one
    /// when instances are reused, else a fresh one.
    pub fn take(&self) -> wasmtime::Result<Live> {
        let kept = if self.limits.reuse_instance { self.warm.lock().ok().and_then(|mut w| w.pop()) } else { None };
        let mut live = match kept {
            Some(live) => live,
            None => self.create()?,
        };
        self.arm(&mut live.store)?;
        Ok(live)
    }

    /// Hands an instance back after a call: a healthy one is kept when
    /// instances are reused; anything else is torn down here.
    pub fn give_back(&self, live: Live, healthy: bool) {
        if healthy && self.limits.reuse_instance {
            if let Ok(mut warm) = self.warm.lock() {
                warm.push(live);
            }
        }
    }

    fn create(&self) -> wasmtime::Result<Live> {
        let memory = (self.limits.memory_mib as usize) << 20;
        let mut store = Store::new(self.engine.engine(), HostState::new(self.label.clone(), memory));
        store.limiter(|state| &mut state.limiter);
        // Instantiation runs no guest code for these components, but arm
        // the store anyway: nothing may run unbounded.
        self.arm(&mut store)?;
        let instance = match &self.pre {
            Pre::Preprocessor(pre) => Instance::Preprocessor(pre.instantiate(&mut store)?),
            Pre::Postprocessor(pre) => Instance::Postprocessor(pre.instantiate(&mut store)?),
        };
        Ok(Live { store, instance })
    }

    /// Sets the store's time limit (and fuel) for one call.
    fn arm(&self, store: &mut Store<HostState>) -> wasmtime::Result<()> {
        let ticks = self.limits.timeout_ms.div_ceil(engine::TICK.as_millis() as u64).max(1);
        store.set_epoch_deadline(ticks);
        // The same budget for time spent blocked in host calls.
        store.data_mut().deadline =
            std::time::Instant::now().checked_add(std::time::Duration::from_millis(self.limits.timeout_ms));
        if self.engine.fuel() {
            store.set_fuel(self.limits.fuel.unwrap_or(u64::MAX))?;
        }
        Ok(())
    }
}
