//! The wasmtime engine every plugin runs on: its settings, the epoch
//! ticker that enforces time limits, the linker that grants nothing, and
//! the on-disk cache of compiled components.

use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, OptLevel};

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
    /// `plugins.instantiate_timeout_ms`.
    instantiate_timeout: std::time::Duration,
    /// `[plugins] expose_plugin_errors`: a plugin's own words go to the
    /// client too.
    expose_errors: bool,
    limits: CompileLimits,
    /// True while a compilation runs (one at a time).
    compiling: Arc<AtomicBool>,
    /// The threads compilations run on, whose CPU time is the budget's.
    compiler: Arc<CompilerPool>,
    /// Bytes of compiled code the cache keeps.
    cache_max_bytes: u64,
    /// Plugin instances that may exist at once, over all plugins.
    max_instances: usize,
    /// Plugin instances that exist now.
    instances_alive: Arc<std::sync::atomic::AtomicUsize>,
    /// Bytes of written memory a reset instance restores by copying and
    /// keeps resident; beyond them, written pages are dropped.
    keep_resident: usize,
    stop_ticker: Arc<AtomicBool>,
    ticker: Option<JoinHandle<()>>,
}

impl PluginEngine {
    /// Builds the engine from the `[plugins]` settings and starts the epoch
    /// ticker.
    pub fn new(config: &PluginsConfig) -> Result<PluginEngine> {
        let wasm = engine_config(config.fuel);
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
            crate::private_files::ensure_private_dir(dir, "the plugin cache directory (plugins.cache_dir)")?;
        }
        Ok(PluginEngine {
            engine,
            linker,
            cache_dir: config.cache_dir.clone(),
            fuel: config.fuel,
            instantiate_timeout: std::time::Duration::from_millis(config.instantiate_timeout_ms),
            expose_errors: config.expose_plugin_errors,
            limits: CompileLimits::from(config),
            compiling: Arc::new(AtomicBool::new(false)),
            compiler: Arc::new(CompilerPool::new()?),
            cache_max_bytes: config.cache_max_mib.saturating_mul(1 << 20),
            max_instances: config.max_instances.max(1) as usize,
            instances_alive: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            keep_resident: usize::try_from(config.keep_resident_kib.saturating_mul(1024)).unwrap_or(usize::MAX),
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

    /// A place for one more instance, or an error when `max_instances`
    /// exist already: every instance holds address space and memory.
    pub fn instance_permit(&self) -> wasmtime::Result<InstancePermit> {
        let alive = &self.instances_alive;
        let taken =
            alive.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.max_instances).then_some(n + 1));
        match taken {
            Ok(_) => Ok(InstancePermit(alive.clone())),
            Err(n) => {
                Err(wasmtime::Error::msg(format!("{n} plugin instances exist, the most plugins.max_instances allows")))
            }
        }
    }

    /// Bytes of written memory a reset instance restores by copying
    /// (`plugins.keep_resident_kib`).
    pub fn keep_resident(&self) -> usize {
        self.keep_resident
    }

    /// Whether fuel is metered.
    pub fn fuel(&self) -> bool {
        self.fuel
    }

    /// How long making one instance may take (`plugins.instantiate_timeout_ms`).
    pub fn instantiate_timeout(&self) -> std::time::Duration {
        self.instantiate_timeout
    }

    /// Compiles a component, or loads it from the cache when these bytes
    /// were compiled and accepted before with these engine settings.
    ///
    /// Compiling is untrusted work: the component's structure is checked
    /// against [`CompileLimits`] first (functions, code size, memories,
    /// tables), one compilation runs at a time (another is refused at
    /// once, not queued), and a compilation that overruns its time budget
    /// is stopped: its process killed (`compiler.rs`), or, compiling on
    /// this process's threads, abandoned to finish in the background
    /// holding the one compile slot. Nothing is
    /// written to the cache here: only [`PluginEngine::remember`] writes,
    /// once a plugin has passed every check.
    pub fn compile(&self, wasm: &[u8]) -> Result<Component> {
        if let Some(path) = self.cache_path(&super::store::sha256_hex(wasm)) {
            if path.exists() {
                match crate::private_files::check_trusted_file(&path) {
                    // SAFETY: the file is in the server's own directory
                    // (owner-only, checked at start) and is a regular file
                    // of the server's user that no one else can write
                    // (checked just now), so this server wrote it, named by
                    // the hash of the source and the engine settings;
                    // wasmtime checks its header and version.
                    Ok(()) => match unsafe { Component::deserialize_file(&self.engine, &path) } {
                        Ok(component) => return Ok(component),
                        Err(e) => {
                            tracing::warn!(path = %path.display(), "cached plugin unusable, compiling again: {e:#}")
                        }
                    },
                    Err(refused) => {
                        tracing::warn!("compiled plugin cache: {refused}; compiling the upload instead");
                        let _ = std::fs::remove_file(&path);
                    }
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
        if crate::private_files::check_trusted_file(&path).is_ok() {
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
            evict(dir, CACHE_MAX_ENTRIES, self.cache_max_bytes);
        }
    }

    fn cache_path(&self, sha256: &str) -> Option<PathBuf> {
        let dir = self.cache_dir.as_ref()?;
        let mut settings = std::collections::hash_map::DefaultHasher::new();
        self.engine.precompile_compatibility_hash().hash(&mut settings);
        Some(dir.join(format!("{sha256}-{:016x}.cwasm", settings.finish())))
    }

    /// Compiles within the CPU budget: in a child process when this
    /// process is the server (`compiler.rs`: a compilation that can be
    /// stopped), else on the compiler's threads.
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
        let budget = self.limits.compile_cpu;
        if super::compiler::in_child_processes() {
            let compiled = super::compiler::compile(wasm, self.fuel, budget, budget.saturating_mul(WALL_PER_CPU))
                .unwrap_or_else(|| Err(Error::internal("no plugin compiler process is configured, this is a bug")));
            self.compiling.store(false, Ordering::Release);
            let compiled = compiled?;
            // SAFETY: these bytes are what this server's own executable,
            // run as its child with the same engine settings, wrote on a
            // pipe only this process reads; wasmtime checks their header,
            // its version and the settings they were compiled with.
            return unsafe { Component::deserialize(&self.engine, &compiled) }
                .map_err(|e| Error::internal(format!("loading the compiled plugin failed: {e:#}")));
        }
        let (done, answer) = std::sync::mpsc::channel();
        let engine = self.engine.clone();
        let wasm = wasm.to_vec();
        let slot = self.compiling.clone();
        let spent_before = self.compiler.cpu_time();
        self.compiler.pool.spawn(move || {
            // A panic in the compiler on an uploaded component fails that
            // upload; it must neither abort the process (rayon aborts on a
            // job's panic) nor keep the compile slot taken.
            let compiled = super::compiler::guarded(|| Component::new(&engine, &wasm));
            slot.store(false, Ordering::Release);
            let _ = done.send(compiled);
        });
        // CPU time, not wall time: on a busy server the compiler gets less
        // of the cores and takes longer, and that is not the plugin's
        // fault. Wall time is bounded too, generously, so a caller never
        // waits forever on a starved compiler.
        let started = Instant::now();
        let wall_limit = started + budget.saturating_mul(WALL_PER_CPU);
        loop {
            match answer.recv_timeout(Duration::from_millis(50)) {
                Ok(compiled) => {
                    return compiled
                        .map_err(|e| Error::invalid_argument(format!("not a valid WebAssembly component: {e:#}")))
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(Error::internal("the plugin compiler stopped without an answer"))
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            }
            let spent = self.compiler.cpu_time().saturating_sub(spent_before);
            if spent > budget {
                return Err(super::compiler::over_cpu_budget(budget, spent));
            }
            if Instant::now() > wall_limit {
                let wall = budget.saturating_mul(WALL_PER_CPU);
                return Err(super::compiler::over_wall_time(wall, spent, started.elapsed()));
            }
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

/// The engine settings plugins are compiled and run with, one place for
/// the server and its compiler processes (`compiler.rs`): code compiled
/// with other settings does not load.
pub fn engine_config(fuel: bool) -> Config {
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
    wasm.consume_fuel(fuel);
    // Deep recursion traps at this much native stack, well before the
    // thread's own stack is at risk.
    wasm.max_wasm_stack(512 << 10);
    // Instances are made on demand, and every linear memory is mapped
    // by sluice (`memory`), so a used instance can be put back the way
    // it was made instead of being made again for each call (the
    // `reset` instance policy). wasmtime's copy-on-write initial images
    // need its own mappings: data segments are copied in when an
    // instance is made, which the `reset` policy does rarely.
    wasm.allocation_strategy(InstanceAllocationStrategy::OnDemand);
    wasm.with_host_memory(Arc::new(super::memory::MappedMemories));
    wasm.memory_init_cow(false);
    // Each memory reserves the whole 4 GiB a 32-bit address can reach
    // (address space, not memory: only what the limiter allows is ever
    // committed), plus a guard, so compiled code needs no bounds check
    // on loads and stores. Reserving less makes plugins about twice as
    // slow (measured on image-normalize).
    wasm.memory_reservation(4 << 30);
    wasm.memory_guard_size(32 << 20);
    wasm
}

/// One instance's place among `max_instances`; given back when dropped.
pub struct InstancePermit(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for InstancePermit {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
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
    /// CPU time one compilation may take, over all its threads.
    pub compile_cpu: Duration,
}

impl From<&PluginsConfig> for CompileLimits {
    fn from(config: &PluginsConfig) -> Self {
        CompileLimits {
            max_functions: config.max_functions,
            max_code_bytes: config.max_code_mib.saturating_mul(1 << 20),
            max_memory_pages: config.max_memory_mib.saturating_mul(16),
            max_table_elements: MAX_TABLE_ELEMENTS,
            max_modules: config.max_modules,
            compile_cpu: Duration::from_secs(config.compile_cpu_seconds),
        }
    }
}

/// Elements a declared table may start with.
pub const MAX_TABLE_ELEMENTS: u64 = 100_000;
/// Compiled plugins kept in the cache.
pub const CACHE_MAX_ENTRIES: usize = 64;
/// How much longer than its CPU budget a compilation may take in wall
/// time, on a server whose cores are busy serving.
const WALL_PER_CPU: u32 = 10;

/// The threads plugins compile on (wasmtime compiles a component's
/// functions in parallel on the pool it is called from), and a way to read
/// how much CPU time they have spent.
struct CompilerPool {
    pool: rayon::ThreadPool,
    clocks: Arc<std::sync::Mutex<Vec<libc::clockid_t>>>,
}

impl CompilerPool {
    fn new() -> Result<CompilerPool> {
        let clocks = Arc::new(std::sync::Mutex::new(Vec::new()));
        let recorded = clocks.clone();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(std::thread::available_parallelism().map_or(1, |n| n.get()))
            .thread_name(|i| format!("wasm-compile-{i}"))
            // Jobs catch their own panics; this keeps any other one from
            // aborting the process.
            .panic_handler(|_| tracing::error!("a plugin compiler thread panicked"))
            .start_handler(move |_| {
                crate::threads::lower_to_background();
                let mut clock: libc::clockid_t = 0;
                // SAFETY: pthread_self is this live thread; `clock` is a
                // valid out-pointer.
                if unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) } == 0 {
                    if let Ok(mut clocks) = recorded.lock() {
                        clocks.push(clock);
                    }
                }
            })
            .build()
            .map_err(|e| Error::internal(format!("starting the plugin compiler threads failed: {e}")))?;
        Ok(CompilerPool { pool, clocks })
    }

    /// CPU time all the compiler's threads have spent since they started.
    fn cpu_time(&self) -> Duration {
        let Ok(clocks) = self.clocks.lock() else { return Duration::ZERO };
        clocks
            .iter()
            .map(|&clock| {
                let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
                // SAFETY: `now` is a valid out-pointer; a clock of a thread
                // that has exited makes the call fail, read as zero.
                if unsafe { libc::clock_gettime(clock, &mut now) } == 0 {
                    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
                } else {
                    Duration::ZERO
                }
            })
            .sum()
    }
}

/// Reads a component's structure and refuses it when it exceeds `limits`,
/// before any compilation.
pub fn check_structure(wasm: &[u8], limits: &CompileLimits) -> Result<()> {
    use wasmparser::Payload;
    let (mut functions, mut code, mut modules) = (0u64, 0u64, 0u64);
    let invalid =
        |e: wasmparser::BinaryReaderError| Error::invalid_argument(format!("not a valid WebAssembly component: {e}"));
    let over = |what: &str, n: u64, max: u64, key: &str| {
        Error::invalid_argument(format!("it has {n} {what}; a plugin may have at most {max} (plugins.{key})"))
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
            return Err(over("functions", functions, limits.max_functions, "max_functions"));
        }
        if code > limits.max_code_bytes {
            return Err(over("bytes of code", code, limits.max_code_bytes, "max_code_mib"));
        }
        if modules > limits.max_modules {
            return Err(over("core modules", modules, limits.max_modules, "max_modules"));
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
