//! Where a call's instance comes from and where it goes afterwards.
//!
//! Under the default policy, `reset`, an instance is made once, warmed up
//! on the plugin's sample (or zeros shaped like its inputs), and its
//! memories frozen ([`super::memory`]); after each call every page the
//! call wrote is put back to the frozen image and the instance waits,
//! clean, in a pool of this plugin's own (per pipeline stage, never shared
//! between pipelines) for the next call. No call sees what another left,
//! and interpreters do not pay their instantiation per call. `fresh` makes
//! a new instance per call and drops it after; `reuse` keeps a used
//! instance as it is. An instance that failed is never kept.
//!
//! Preparing instances ahead of time on a background thread and tearing
//! them down on another was measured and dropped: on two vCPUs the extra
//! threads compete with the calls for the cores, and both a request's
//! latency and the calls' throughput got worse (docs/BENCHMARKS.md).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wasmtime::Store;

use super::bindings::post::{Postprocessor, PostprocessorPre};
use super::bindings::pre::{Preprocessor, PreprocessorPre};
use super::bindings::Tensor;
use super::engine::{self, PluginEngine};
use super::memory::{self, Frozen, Unfreezable};
use super::state::HostState;
use super::{InstancePolicy, PluginLimits};

/// Host resources (WASI streams, pollables) a reset instance may hold
/// beyond those it held when frozen before it is dropped instead of kept:
/// a guest that forgets handles (its memory, where it kept them, is reset)
/// must not grow the host's table call after call.
const SPARE_RESOURCES: usize = 16;

/// How long a kept instance may wait unused before it is dropped (all but
/// the most recently used one of a plugin).
const IDLE_KEPT: Duration = Duration::from_secs(60);

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

impl Instance {
    /// Calls `preprocess` or `postprocess`.
    pub fn run(
        &self,
        store: &mut Store<HostState>,
        inputs: &[Tensor],
    ) -> wasmtime::Result<Result<Vec<Tensor>, super::bindings::PluginError>> {
        match self {
            Instance::Preprocessor(i) => i.call_preprocess(store, inputs),
            Instance::Postprocessor(i) => i.call_postprocess(store, inputs),
        }
    }
}

/// An instance with its store.
pub struct Live {
    /// The store, holding the instance's state.
    pub store: Store<HostState>,
    /// The instance.
    pub instance: Instance,
    /// Its memories as frozen, under the `reset` policy.
    frozen: Option<Frozen>,
    /// Host resources it held when frozen.
    resources: usize,
    /// Its place among the engine's `max_instances`.
    _permit: engine::InstancePermit,
    /// When it was last handed back.
    idle_since: Instant,
}

/// The instances of one plugin.
pub struct Instances {
    engine: Arc<PluginEngine>,
    pre: Pre,
    limits: PluginLimits,
    label: Arc<str>,
    warm: Mutex<Vec<Live>>,
    /// What a new `reset` instance is warmed up on before it is frozen.
    warm_up: Vec<Tensor>,
    /// Set when this plugin's instances turned out not to be resettable
    /// here: it gets fresh instances from then on.
    reset_unsupported: AtomicBool,
    /// Counts the instances made (`sluice_plugin_instances_made_total`).
    made: prometheus_client::metrics::counter::Counter,
}

impl Instances {
    /// Instances of `pre`, labelled `label` in logs, with `limits`; `warm_up`
    /// is what a `reset` instance runs once before it is frozen.
    pub fn new(
        engine: &Arc<PluginEngine>,
        pre: Pre,
        limits: PluginLimits,
        label: Arc<str>,
        warm_up: Vec<Tensor>,
        made: prometheus_client::metrics::counter::Counter,
    ) -> Instances {
        Instances {
            engine: engine.clone(),
            pre,
            limits,
            label,
            warm: Mutex::new(Vec::new()),
            warm_up,
            reset_unsupported: AtomicBool::new(false),
            made,
        }
    }

    /// The policy in force: `reset` falls back to `fresh` where instances
    /// cannot be reset.
    pub fn policy(&self) -> InstancePolicy {
        match self.limits.instances {
            InstancePolicy::Reset if self.reset_unsupported.load(Ordering::Relaxed) => InstancePolicy::Fresh,
            policy => policy,
        }
    }

    /// Makes one instance ahead of the first call, under the `reset` and
    /// `reuse` policies, so that call does not pay for it (a Python
    /// plugin's takes milliseconds).
    pub fn prepare(&self) -> wasmtime::Result<()> {
        if self.policy() == InstancePolicy::Fresh {
            return Ok(());
        }
        let live = self.create(self.policy())?;
        // Kept only if the policy will take it: a reset instance that froze
        // (making it may have turned the policy to fresh).
        let takes = match self.policy() {
            InstancePolicy::Reset => live.frozen.is_some(),
            policy => policy == InstancePolicy::Reuse,
        };
        if takes {
            self.keep(live);
        }
        Ok(())
    }

    /// An instance for one call, armed with the call's limits: a kept one
    /// when there is one, else a new one.
    /// Counts the instances made from now on in `made`.
    pub fn count_made_in(&mut self, made: prometheus_client::metrics::counter::Counter) {
        self.made = made;
    }

    pub fn take(&self) -> wasmtime::Result<Live> {
        let policy = self.policy();
        let kept = match policy {
            InstancePolicy::Fresh => None,
            InstancePolicy::Reset | InstancePolicy::Reuse => self.warm.lock().ok().and_then(|mut w| w.pop()),
        };
        let mut live = match kept {
            Some(live) => live,
            None => self.create(policy)?,
        };
        self.arm(&mut live.store)?;
        live.store.data_mut().start_call();
        Ok(live)
    }

    /// Hands an instance back after a call: a healthy one is reset
    /// (`reset`) or left as it is (`reuse`) and kept; anything else is
    /// dropped here.
    pub fn give_back(&self, mut live: Live, healthy: bool) {
        if !healthy {
            return;
        }
        match self.policy() {
            InstancePolicy::Fresh => return,
            InstancePolicy::Reuse => {}
            InstancePolicy::Reset => {
                let Some(frozen) = &live.frozen else { return };
                match frozen.thaw(&memory::NoCallRunning::of(&mut live.store)) {
                    Ok(_) => {}
                    // A memory that grew cannot shrink: this instance goes,
                    // the next one is made at the frozen size again.
                    Err(Unfreezable::Grew) => return,
                    Err(Unfreezable::Unsupported(why) | Unfreezable::Broken(why)) => {
                        self.fall_back_to_fresh(&why);
                        return;
                    }
                }
                if live.store.data_mut().resources() > live.resources + SPARE_RESOURCES {
                    return;
                }
            }
        }
        self.keep(live);
    }

    /// Puts a clean instance in the pool, and drops those idle for longer
    /// than [`IDLE_KEPT`] beyond the first: a burst of calls must not hold
    /// its instances (their memory, and places among `max_instances` that
    /// other plugins need) for good.
    fn keep(&self, mut live: Live) {
        live.idle_since = Instant::now();
        let stale: Vec<Live> = match self.warm.lock() {
            Ok(mut warm) => {
                warm.push(live);
                // Popped from the end, so the front is the least recently used.
                let stale = warm.iter().take(warm.len() - 1).take_while(|l| l.idle_since.elapsed() > IDLE_KEPT).count();
                warm.drain(..stale).collect()
            }
            Err(_) => Vec::new(),
        };
        // Torn down outside the lock.
        drop(stale);
    }

    fn fall_back_to_fresh(&self, why: &str) {
        if !self.reset_unsupported.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                plugin = %self.label,
                "its instances cannot be reset between calls here ({why}); each call gets a fresh instance instead"
            );
        }
    }

    fn create(&self, policy: InstancePolicy) -> wasmtime::Result<Live> {
        let permit = self.engine.instance_permit()?;
        self.made.inc();
        let bytes = (self.limits.memory_mib as usize) << 20;
        let mut store = Store::new(self.engine.engine(), HostState::new(self.label.clone(), bytes));
        store.limiter(|state| &mut state.limiter);
        // Making an instance has a budget of its own, apart from the
        // calls': a language runtime's start-up is slower than its calls.
        self.arm_for_setup(&mut store)?;
        let (instance, memories) = memory::collect(|| match &self.pre {
            Pre::Preprocessor(pre) => pre.instantiate(&mut store).map(Instance::Preprocessor),
            Pre::Postprocessor(pre) => pre.instantiate(&mut store).map(Instance::Postprocessor),
        });
        let instance = instance.map_err(|e| self.setup_error("instantiating it", e))?;
        let mut live =
            Live { store, instance, frozen: None, resources: 0, _permit: permit, idle_since: Instant::now() };
        if policy != InstancePolicy::Reset {
            return Ok(live);
        }
        // The warm-up runs on the memories' first pages; what it leaves is
        // the plugin's own (its sample), never a client's.
        // Warm up before freezing: what an interpreter sets up on its first
        // call (caches, a grown heap) is then in the image, not redone, or
        // grown again, on every call.
        // Its own time budget: making the instance already spent some.
        self.arm_for_setup(&mut live.store)?;
        live.store.data_mut().start_call();
        let warmed = live.instance.run(&mut live.store, &self.warm_up);
        live.store.data().discard_output();
        if let Err(trap) = warmed {
            // The instance cannot be entered again; without a warm-up the
            // image would miss what the first call sets up.
            let why = self.setup_error("its warm-up run on its sample", trap);
            self.fall_back_to_fresh(&format!("{why:#}"));
            return self.create(InstancePolicy::Fresh);
        }
        match Frozen::freeze(memories, self.engine.keep_resident(), &memory::NoCallRunning::of(&mut live.store)) {
            Ok(frozen) => {
                live.resources = live.store.data_mut().resources();
                live.frozen = Some(frozen);
            }
            Err(Unfreezable::Grew) => {}
            Err(Unfreezable::Unsupported(why)) => self.fall_back_to_fresh(&why),
            // Its memory is gone: this instance must never run.
            Err(Unfreezable::Broken(why)) => {
                drop(live);
                self.fall_back_to_fresh(&why);
                return self.create(InstancePolicy::Fresh);
            }
        }
        Ok(live)
    }

    /// Sets the store's time limit for making an instance
    /// (`plugins.instantiate_timeout_ms`), with the call's fuel.
    fn arm_for_setup(&self, store: &mut Store<HostState>) -> wasmtime::Result<()> {
        self.arm(store)?;
        let budget = self.engine.instantiate_timeout();
        store.set_epoch_deadline((budget.as_millis() as u64).div_ceil(engine::TICK.as_millis() as u64).max(1));
        store.data_mut().deadline = std::time::Instant::now().checked_add(budget);
        Ok(())
    }

    /// An error of making an instance, the budget named when it ran out.
    fn setup_error(&self, step: &str, error: wasmtime::Error) -> wasmtime::Error {
        let out_of_time = matches!(error.downcast_ref::<wasmtime::Trap>(), Some(wasmtime::Trap::Interrupt))
            || error.downcast_ref::<super::state::BlockedPastDeadline>().is_some();
        if out_of_time {
            return wasmtime::Error::msg(format!(
                "{step} took longer than making an instance may (plugins.instantiate_timeout_ms = {} ms; a busy \
                 machine or a large language runtime may need more)",
                self.engine.instantiate_timeout().as_millis()
            ));
        }
        error.context(format!("{step} failed"))
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
