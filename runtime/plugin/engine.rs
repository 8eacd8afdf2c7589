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
use super::state::{BoundedPollData, HostState};
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
    /// `[plugins] expose_plugin_errors`: a plugin's own words go to the
    /// client too.
    expose_errors: bool,
    limits: CompileLimits,
    /// True while a compilation runs (one at a time).
    compiling: Arc<AtomicBool>,
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
        // WASI's own `wasi:io/poll` can block the calling thread for as
        // long as the guest asks (a `sleep`), out of reach of epochs; ours
        // gives up at the call's deadline.
        linker.allow_shadowing(true);
        wasmtime_wasi::p2::bindings::sync::io::poll::add_to_linker::<HostState, BoundedPollData>(
            &mut linker,
            HostState::bounded_poll,
        )
        .map_err(|e| Error::internal(format!("linking the bounded poll failed: {e:#}")))?;
        linker.allow_shadowing(false);
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
            expose_errors: config.expose_plugin_errors,
            limits: CompileLimits::from(config),
            compiling: Arc::new(AtomicBool::new(false)),
            stop_ticker,
            ticker: Some(ticker),
        })
    }

    /// `error` as clients will see it: with the plugin's own words moved
    /// into its message when `expose_plugin_errors` is on.
    pub fn shown(&self, error: Error) -> Error {
        match error {
            Error::Plugin { fault, message, detail: Some(said) } if self.expose_errors => {
                Error::plugin(fault, format!("{message} (it said: {said})"))
            }
            other => other,
        }
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
    /// were compiled and accepted before with these engine settings.
    ///
    /// Compiling is untrusted work: the component's structure is checked
    /// against [`CompileLimits`] first (functions, code size, memories,
    /// tables), one compilation runs at a time (another is refused at
    /// once, not queued), and a compilation that overruns its time budget
    /// is abandoned — the caller gets an error while the thread finishes in
    /// the background, still holding the one compile slot. Nothing is
    /// written to the cache here: only [`PluginEngine::remember`] writes,
    /// once a plugin has passed every check.
    pub fn compile(&self, wasm: &[u8]) -> Result<Component> {
        if let Some(path) = self.cache_path(&super::store::sha256_hex(wasm)) {
            if path.is_file() {
                // SAFETY: the file is one this server wrote into its own
                // cache directory, named by the hash of the source and the
                // engine settings; wasmtime checks its header and version.
                match unsafe { Component::deserialize_file(&self.engine, &path) } {
                    Ok(component) => return Ok(component),
                    Err(e) => tracing::warn!(path = %path.display(), "cached plugin unusable, compiling again: {e:#}"),
                }
            }
        }
        check_structure(wasm, &self.limits)?;
        self.compile_bounded(wasm)
    }

    /// Writes an accepted plugin's compiled code to the cache (when there
    /// is one), keeping the cache within its bounds by evicting the oldest
    /// entries.
    pub fn remember(&self, sha256: &str, component: &Component) {
        let Some(path) = self.cache_path(sha256) else { return };
        if path.is_file() {
            return;
        }
        match component.serialize() {
            Ok(bytes) => {
                if let Err(e) = crate::plugin::store::write_atomically(&path, &bytes) {
                    tracing::warn!(path = %path.display(), "cannot cache the compiled plugin: {e}");
                }
            }
            Err(e) => tracing::warn!("cannot serialize the compiled plugin: {e:#}"),
        }
        if let Some(dir) = &self.cache_dir {
            evict(dir, CACHE_MAX_ENTRIES, CACHE_MAX_BYTES);
        }
    }

    fn cache_path(&self, sha256: &str) -> Option<PathBuf> {
        let dir = self.cache_dir.as_ref()?;
        let mut settings = std::collections::hash_map::DefaultHasher::new();
        self.engine.precompile_compatibility_hash().hash(&mut settings);
        Some(dir.join(format!("{sha256}-{:016x}.cwasm", settings.finish())))
    }

    /// Compiles on a thread of its own, within the time budget.
    fn compile_bounded(&self, wasm: &[u8]) -> Result<Component> {
        if wasm.len() >= 8 && wasm[..4] == *b"\0asm" && wasm[4..8] == [1, 0, 0, 0] {
            return Err(Error::invalid_argument(
                "this is a core WebAssembly module, not a component; build the plugin with \
                 `cargo build --target wasm32-wasip2 --release`",
            ));
        }
        if self.compiling.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return Err(Error::resource_exhausted(
                "another plugin is being compiled; plugins compile one at a time, retry in a few seconds",
            ));
        }
        let (done, answer) = std::sync::mpsc::channel();
        let engine = self.engine.clone();
        let wasm = wasm.to_vec();
        let slot = self.compiling.clone();
        let spawned = crate::threads::spawn_background("wasm-compile".into(), move || {
            let compiled = Component::new(&engine, &wasm);
            slot.store(false, Ordering::Release);
            let _ = done.send(compiled);
        });
        if let Err(e) = spawned {
            self.compiling.store(false, Ordering::Release);
            return Err(Error::internal(format!("starting the compiler thread failed: {e}")));
        }
        let budget = self.limits.compile_time;
        match answer.recv_timeout(budget) {
            Ok(compiled) => {
                compiled.map_err(|e| Error::invalid_argument(format!("not a valid WebAssembly component: {e:#}")))
            }
            Err(_) => Err(Error::resource_exhausted(format!(
                "compiling the plugin took longer than its budget of {} s and was abandoned",
                budget.as_secs()
            ))),
        }
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

/// What a component may contain before it is compiled, and how long
/// compiling it may take: compiling is untrusted work too.
#[derive(Debug, Clone)]
pub struct CompileLimits {
    /// Functions, over all its core modules.
    pub max_functions: u64,
    /// Bytes of code, over all its core modules.
    pub max_code_bytes: u64,
    /// Initial pages of any memory it declares (the engine's memory cap).
    pub max_memory_pages: u64,
    /// Initial elements of any table it declares.
    pub max_table_elements: u64,
    /// Core modules it nests.
    pub max_modules: u64,
    /// Wall time one compilation may take.
    pub compile_time: Duration,
}

impl From<&PluginsConfig> for CompileLimits {
    fn from(config: &PluginsConfig) -> Self {
        CompileLimits {
            max_functions: MAX_FUNCTIONS,
            max_code_bytes: MAX_CODE_BYTES,
            max_memory_pages: config.max_memory_mib.saturating_mul(16),
            max_table_elements: MAX_TABLE_ELEMENTS,
            max_modules: MAX_MODULES,
            compile_time: COMPILE_TIME,
        }
    }
}

/// Functions a plugin may define (a Rust plugin with std has a few
/// thousand; the compile bomb that showed the need had 250,000).
pub const MAX_FUNCTIONS: u64 = 20_000;
/// Bytes of function bodies a plugin may carry.
pub const MAX_CODE_BYTES: u64 = 8 << 20;
/// Elements a declared table may start with.
pub const MAX_TABLE_ELEMENTS: u64 = 100_000;
/// Core modules a component may nest.
pub const MAX_MODULES: u64 = 16;
/// Wall time one compilation may take.
pub const COMPILE_TIME: Duration = Duration::from_secs(10);
/// Compiled plugins kept in the cache.
pub const CACHE_MAX_ENTRIES: usize = 64;
/// Bytes of compiled plugins kept in the cache.
pub const CACHE_MAX_BYTES: u64 = 256 << 20;

/// Reads a component's structure and refuses it when it exceeds `limits`,
/// before any compilation.
pub fn check_structure(wasm: &[u8], limits: &CompileLimits) -> Result<()> {
    use wasmparser::Payload;
    let (mut functions, mut code, mut modules) = (0u64, 0u64, 0u64);
    let invalid =
        |e: wasmparser::BinaryReaderError| Error::invalid_argument(format!("not a valid WebAssembly component: {e}"));
    let over = |what: &str, n: u64, max: u64| {
        Error::invalid_argument(format!("it has {n} {what}; a plugin may have at most {max}"))
    };
    // What people hand in by mistake, named before a parser error would.
    match wasm.get(..8) {
        Some([0, b'a', b's', b'm', _, _, 1, 0]) => {}
        Some([0, b'a', b's', b'm', ..]) => {
            return Err(Error::invalid_argument(
                "a core WebAssembly module, not a component: build the plugin for wasm32-wasip2 \
                 (wasm32-unknown-unknown and wasm32-wasip1 build modules)",
            ))
        }
        _ => {
            let start: String = wasm.iter().take(8).map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ");
            return Err(Error::invalid_argument(format!(
                "not a WebAssembly file: it starts with [{start}], not \\0asm; a plugin is the .wasm component \
                 cargo builds for wasm32-wasip2"
            )));
        }
    }
    for payload in wasmparser::Parser::new(0).parse_all(wasm) {
        match payload.map_err(invalid)? {
            Payload::ModuleSection { .. } => modules += 1,
            Payload::FunctionSection(reader) => functions += u64::from(reader.count()),
            Payload::CodeSectionStart { size, .. } => code += u64::from(size),
            Payload::MemorySection(reader) => {
                for memory in reader {
                    let memory = memory.map_err(invalid)?;
                    if memory.initial > limits.max_memory_pages {
                        return Err(Error::invalid_argument(format!(
                            "it declares a memory of {} pages to start with; at most {} (plugins.max_memory_mib)",
                            memory.initial, limits.max_memory_pages
                        )));
                    }
                }
            }
            Payload::TableSection(reader) => {
                for table in reader {
                    let table = table.map_err(invalid)?;
                    if table.ty.initial > limits.max_table_elements {
                        return Err(Error::invalid_argument(format!(
                            "it declares a table of {} elements; at most {}",
                            table.ty.initial, limits.max_table_elements
                        )));
                    }
                }
            }
            _ => {}
        }
        if functions > limits.max_functions {
            return Err(over("functions", functions, limits.max_functions));
        }
        if code > limits.max_code_bytes {
            return Err(over("bytes of code", code, limits.max_code_bytes));
        }
        if modules > limits.max_modules {
            return Err(over("core modules", modules, limits.max_modules));
        }
    }
    Ok(())
}

/// Keeps `dir` within `max_entries` files and `max_bytes`, removing the
/// least recently written first.
fn evict(dir: &std::path::Path, max_entries: usize, max_bytes: u64) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            let path = e.path();
            (meta.is_file() && path.extension().is_some_and(|x| x == "cwasm"))
                .then(|| (meta.modified().unwrap_or(std::time::UNIX_EPOCH), meta.len(), path))
        })
        .collect();
    files.sort();
    let mut total: u64 = files.iter().map(|(_, size, _)| size).sum();
    let mut count = files.len();
    for (_, size, path) in files {
        if count <= max_entries && total <= max_bytes {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            count -= 1;
            total = total.saturating_sub(size);
        }
    }
}
