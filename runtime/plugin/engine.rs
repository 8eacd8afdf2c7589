//! The wasmtime engine every plugin runs on: its settings, the epoch
//! ticker that enforces time limits, the linker that grants nothing, and
//! the on-disk cache of compiled components.

use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, OptLevel, PoolingAllocationConfig};

use super::bindings::pre::Preprocessor;
use super::state::HostState;
use super::PluginsConfig;
use crate::error::{Error, Result};

/// How often the epoch advances: the resolution of plugin time limits.
pub const TICK: Duration = Duration::from_millis(1);

/// The import namespaces the linker provides: WASI 0.2 (every capability
/// behind it is off) and sluice's log.
const PROVIDED: &[&str] = &[
    "wasi:io/",
    "wasi:clocks/",
    "wasi:random/",
    "wasi:cli/",
    "wasi:filesystem/",
    "wasi:sockets/",
    "sluice:plugin/log@",
    "sluice:plugin/types@",
];

/// The engine, its linker and its cache.
pub struct PluginEngine {
    engine: Engine,
    linker: Linker<HostState>,
    cache_dir: Option<PathBuf>,
    fuel: bool,
    stop_ticker: Arc<AtomicBool>,
    ticker: Option<JoinHandle<()>>,
}

impl PluginEngine {
    /// Builds the engine from the `[plugins]` settings and starts the epoch
    /// ticker.
    pub fn new(config: &PluginsConfig) -> Result<PluginEngine> {
        let mut wasm = Config::new();
        // Cranelift, optimising for speed: plugins are compiled once and
        // called per request.
        wasm.cranelift_opt_level(OptLevel::Speed);
        wasm.wasm_component_model(true);
        // Time limits: the ticker bumps the epoch every TICK; a call traps
        // when it passes its deadline. Far cheaper than fuel.
        wasm.epoch_interruption(true);
        // Fuel counts instructions, for deterministic limits; it costs a
        // few percent, so it is on only when asked for.
        wasm.consume_fuel(config.fuel);
        // Deep recursion traps at this much native stack, well before the
        // thread's own stack is at risk.
        wasm.max_wasm_stack(512 << 10);
        // A fresh instance per request must cost microseconds: instances
        // come from a preallocated pool, and the first `keep_resident_kib`
        // of linear memory are reset by zeroing them instead of unmapping
        // them and faulting them in again, page by page, on the next use
        // (measured: 0.5 ms of page faults for a plugin using 1.5 MiB).
        let mut pool = PoolingAllocationConfig::default();
        let instances = config.max_instances.max(1);
        let max_memory = (config.max_memory_mib.max(1) as usize) << 20;
        pool.total_component_instances(instances)
            .total_core_instances(instances * 8)
            .total_memories(instances * 2)
            .total_tables(instances * 8)
            .max_memories_per_component(4)
            .max_tables_per_component(16)
            .max_memory_size(max_memory)
            .linear_memory_keep_resident((config.keep_resident_kib as usize) << 10)
            .table_keep_resident(64 << 10);
        wasm.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        // Each memory reserves the whole 4 GiB a 32-bit address can reach
        // (address space, not memory: only what the limiter allows is ever
        // committed), plus a guard, so compiled code needs no bounds check
        // on loads and stores. Reserving less makes plugins about twice as
        // slow (measured on image-normalize).
        wasm.memory_reservation(4 << 30);
        wasm.memory_guard_size(32 << 20);
        let engine = Engine::new(&wasm)
            .map_err(|e| Error::internal(format!("creating the WebAssembly engine failed: {e:#}")))?;

        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(|e| Error::internal(format!("linking WASI failed: {e:#}")))?;
        Preprocessor::add_to_linker::<_, HasSelf<HostState>>(&mut linker, |state| state)
            .map_err(|e| Error::internal(format!("linking the log import failed: {e:#}")))?;

        let stop_ticker = Arc::new(AtomicBool::new(false));
        let ticker = {
            let engine = engine.clone();
            let stop = stop_ticker.clone();
            std::thread::Builder::new()
                .name("wasm-epoch".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(TICK);
                        engine.increment_epoch();
                    }
                })
                .map_err(|e| Error::internal(format!("starting the epoch ticker failed: {e}")))?
        };
        if let Some(dir) = &config.cache_dir {
            std::fs::create_dir_all(dir).map_err(|e| {
                Error::internal(format!("cannot create the plugin cache directory {}: {e}", dir.display()))
            })?;
        }
        Ok(PluginEngine {
            engine,
            linker,
            cache_dir: config.cache_dir.clone(),
            fuel: config.fuel,
            stop_ticker,
            ticker: Some(ticker),
        })
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The linker: WASI with nothing granted, and the log import.
    pub fn linker(&self) -> &Linker<HostState> {
        &self.linker
    }

    /// Whether fuel is metered.
    pub fn fuel(&self) -> bool {
        self.fuel
    }

    /// Compiles a component, or loads it from the cache when these bytes
    /// were compiled before with these engine settings.
    pub fn compile(&self, wasm: &[u8]) -> Result<Component> {
        let Some(dir) = &self.cache_dir else { return self.compile_fresh(wasm) };
        let mut settings = std::collections::hash_map::DefaultHasher::new();
        self.engine.precompile_compatibility_hash().hash(&mut settings);
        let key = format!("{}-{:016x}.cwasm", super::store::sha256_hex(wasm), settings.finish());
        let path = dir.join(key);
        if path.is_file() {
            // SAFETY: the file is one this server wrote into its own cache
            // directory, named by the hash of the source and the engine
            // settings; wasmtime checks its header and version on load.
            match unsafe { Component::deserialize_file(&self.engine, &path) } {
                Ok(component) => return Ok(component),
                Err(e) => tracing::warn!(path = %path.display(), "cached plugin unusable, compiling again: {e:#}"),
            }
        }
        let component = self.compile_fresh(wasm)?;
        match component.serialize() {
            Ok(bytes) => {
                if let Err(e) = crate::plugin::store::write_atomically(&path, &bytes) {
                    tracing::warn!(path = %path.display(), "cannot cache the compiled plugin: {e}");
                }
            }
            Err(e) => tracing::warn!("cannot serialize the compiled plugin: {e:#}"),
        }
        Ok(component)
    }

    fn compile_fresh(&self, wasm: &[u8]) -> Result<Component> {
        if wasm.len() >= 8 && wasm[..4] == *b"\0asm" && wasm[4..8] == [1, 0, 0, 0] {
            return Err(Error::invalid_argument(
                "this is a core WebAssembly module, not a component; build the plugin with \
                 `cargo build --target wasm32-wasip2 --release`",
            ));
        }
        Component::new(&self.engine, wasm)
            .map_err(|e| Error::invalid_argument(format!("not a valid WebAssembly component: {e:#}")))
    }

    /// Imports of `component` that the linker does not provide.
    pub fn missing_imports(&self, component: &Component) -> Vec<String> {
        component
            .component_type()
            .imports(&self.engine)
            .map(|(name, _)| name.to_string())
            .filter(|name| {
                !PROVIDED.iter().any(|p| name.starts_with(p)) || (name.starts_with("wasi:") && !name.contains("@0.2."))
            })
            .collect()
    }

    /// Names the component exports.
    pub fn exports(&self, component: &Component) -> Vec<String> {
        component.component_type().exports(&self.engine).map(|(name, _)| name.to_string()).collect()
    }
}

impl Drop for PluginEngine {
    fn drop(&mut self) {
        self.stop_ticker.store(true, Ordering::Relaxed);
        if let Some(ticker) = self.ticker.take() {
            let _ = ticker.join();
        }
    }
}
