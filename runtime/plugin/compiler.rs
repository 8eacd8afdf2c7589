//! Plugin compilation in a child process: the `sluice` binary runs
//! `sluice plugin compile-worker`, which reads a component on stdin,
//! compiles it with the server's engine settings and writes the compiled
//! code on stdout. Compiling an uploaded component is untrusted work that
//! a thread cannot be made to stop; a process can. So a compilation that
//! passes its CPU budget (`plugins.compile_cpu_seconds`, also the child's
//! `RLIMIT_CPU`) or its wall-time bound, an upload whose client went away
//! ([`cancelled_by`]) and the server's shutdown ([`stop_all`]) each kill
//! the child at once, and whatever memory the compiler took goes with it.
//! The child dies with the server too (`PR_SET_PDEATHSIG`).
//!
//! A process that never called [`use_child_processes`] (a library user,
//! the crate's own unit tests) compiles on its own threads instead
//! (`engine.rs`).

use std::cell::RefCell;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// The executable compilations run in, once [`use_child_processes`] set it.
static WORKER: OnceLock<PathBuf> = OnceLock::new();

/// Set by [`stop_all`]: the server is stopping, and no compilation is
/// worth waiting for.
static STOPPING: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// The cancellation of the work this thread runs for a caller
    /// ([`cancelled_by`]).
    static CANCEL: RefCell<Option<Arc<AtomicBool>>> = const { RefCell::new(None) };
}

/// The most compiled code a child may hand back.
const MAX_COMPILED_BYTES: u64 = 1 << 30;
/// How much of the child's stderr is kept for a message.
const MAX_MESSAGE_BYTES: u64 = 16 << 10;
/// How often the parent looks at the child.
const POLL: Duration = Duration::from_millis(10);

/// From now on, this process compiles plugins in child processes of
/// `exe` (the `sluice` binary, which has the `compile-worker` command).
pub fn use_child_processes(exe: PathBuf) {
    let _ = WORKER.set(exe);
}

/// True when compilations run in child processes.
pub fn in_child_processes() -> bool {
    WORKER.get().is_some()
}

/// Kills every compilation running and refuses new ones: the server is
/// shutting down.
pub fn stop_all() {
    STOPPING.store(true, Ordering::Release);
}

/// Runs `work` on this thread with `cancel` as its cancellation: a
/// compilation it starts is killed once `cancel` is set (the caller of an
/// admin request went away).
pub fn cancelled_by<T>(cancel: Arc<AtomicBool>, work: impl FnOnce() -> T) -> T {
    struct Reset(Option<Arc<AtomicBool>>);
    impl Drop for Reset {
        fn drop(&mut self) {
            CANCEL.with(|c| *c.borrow_mut() = self.0.take());
        }
    }
    let _reset = Reset(CANCEL.with(|c| c.borrow_mut().replace(cancel)));
    work()
}

/// Sets its flag when dropped: an async caller holds it while the blocking
/// work it waits for runs, so a caller that goes away cancels that work.
#[derive(Default)]
pub struct CancelOnDrop(Arc<AtomicBool>);

impl CancelOnDrop {
    /// The flag, for [`cancelled_by`].
    pub fn token(&self) -> Arc<AtomicBool> {
        self.0.clone()
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Why a child was killed, for the caller's message.
enum Killed {
    Cpu(Duration),
    Wall(Duration, Duration),
    Cancelled,
    Stopping,
    TooLarge,
}

/// Compiles `wasm` in a child process with the engine settings that
/// `fuel` selects, within `cpu` seconds of CPU and `wall` of wall time;
/// answers the compiled code, for `Component::deserialize`. `None` when
/// this process does not compile in children.
pub fn compile(wasm: &[u8], fuel: bool, cpu: Duration, wall: Duration) -> Option<Result<Vec<u8>>> {
    let exe = WORKER.get()?;
    Some(compile_with(exe, wasm, fuel, cpu, wall))
}

fn compile_with(exe: &PathBuf, wasm: &[u8], fuel: bool, cpu: Duration, wall: Duration) -> Result<Vec<u8>> {
    if STOPPING.load(Ordering::Acquire) {
        return Err(Error::unavailable("the server is shutting down; plugins are not compiled any more"));
    }
    let cancel = CANCEL.with(|c| c.borrow().clone());
    let mut command = Command::new(exe);
    command.args(["plugin", "compile-worker"]);
    if fuel {
        command.arg("--fuel");
    }
    command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).env("SLUICE_LOG", "off");
    // A second past the budget: the poll below stops it at the budget,
    // the kernel's limit is the backstop.
    let cpu_limit = cpu.as_secs().max(1) + 1;
    let server = std::process::id() as libc::pid_t;
    // SAFETY: between fork and exec the closure makes only
    // async-signal-safe system calls on plain integers and static
    // C strings, and allocates nothing.
    unsafe {
        use std::os::unix::process::CommandExt;
        command.pre_exec(move || {
            // The kernel's own bound on the CPU it spends (SIGXCPU past
            // the soft limit, SIGKILL past the hard one), no core dump,
            // and its death with the server's (unless the server is
            // already gone).
            let cpu = libc::rlimit { rlim_cur: cpu_limit, rlim_max: cpu_limit + 1 };
            let core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            if libc::setrlimit(libc::RLIMIT_CPU, &cpu) != 0 || libc::setrlimit(libc::RLIMIT_CORE, &core) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() != server {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            // The first process the out-of-memory killer takes: a
            // compilation that eats the machine's memory dies, not the
            // server beside it.
            let adj = libc::open(c"/proc/self/oom_score_adj".as_ptr(), libc::O_WRONLY);
            if adj >= 0 {
                libc::write(adj, b"1000".as_ptr().cast(), 4);
                libc::close(adj);
            }
            // Below the serving threads, as the in-process compiler is.
            libc::setpriority(libc::PRIO_PROCESS, 0, 10);
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .map_err(|e| Error::internal(format!("starting the plugin compiler ({}) failed: {e}", exe.display())))?;
    let pid = child.id();
    let stopped = |child: &mut std::process::Child, why: String| {
        let _ = child.kill();
        let _ = child.wait();
        Error::internal(why)
    };
    let (Some(mut stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(stopped(&mut child, "the plugin compiler's pipes were not opened, this is a bug".into()));
    };
    let input = wasm.to_vec();
    let over = Arc::new(AtomicBool::new(false));
    let thread = |name: &str| std::thread::Builder::new().name(format!("plugin-compiler-{name}"));
    let threads = thread("in").spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let threads = threads.and_then(|writer| {
        let over = over.clone();
        let reader = thread("out").spawn(move || {
            let mut compiled = Vec::new();
            let read = stdout.take(MAX_COMPILED_BYTES + 1).read_to_end(&mut compiled);
            if compiled.len() as u64 > MAX_COMPILED_BYTES {
                over.store(true, Ordering::Release);
            }
            read.map(|_| compiled)
        })?;
        let messages = thread("err").spawn(move || {
            let mut message = Vec::new();
            let _ = stderr.take(MAX_MESSAGE_BYTES).read_to_end(&mut message);
            String::from_utf8_lossy(&message).trim().to_string()
        })?;
        Ok((writer, reader, messages))
    });
    let (writer, reader, messages) = match threads {
        Ok(threads) => threads,
        Err(e) => return Err(stopped(&mut child, format!("starting the plugin compiler's pipe threads failed: {e}"))),
    };
    let started = Instant::now();
    let mut last_spent = Duration::ZERO;
    let mut killed = loop {
        match child.try_wait() {
            Ok(Some(_)) => break None,
            Ok(None) => {}
            Err(e) => return Err(stopped(&mut child, format!("waiting for the plugin compiler failed: {e}"))),
        }
        let spent = cpu_time(pid);
        last_spent = spent;
        let reason = if STOPPING.load(Ordering::Acquire) {
            Some(Killed::Stopping)
        } else if cancel.as_ref().is_some_and(|c| c.load(Ordering::Acquire)) {
            Some(Killed::Cancelled)
        } else if spent > cpu {
            Some(Killed::Cpu(spent))
        } else if started.elapsed() > wall {
            Some(Killed::Wall(started.elapsed(), spent))
        } else if over.load(Ordering::Acquire) {
            Some(Killed::TooLarge)
        } else {
            None
        };
        if let Some(reason) = reason {
            let _ = child.kill();
            break Some(reason);
        }
        std::thread::sleep(POLL);
    };
    let status = child.wait();
    // What the poll last read: an exited child's /proc entry is gone.
    let spent = last_spent;
    let _ = writer.join();
    let compiled = reader.join().unwrap_or_else(|_| Ok(Vec::new()));
    let message = messages.join().unwrap_or_default();
    // Its output passed the cap: the child then died on a closed pipe,
    // which is not what to report.
    if over.load(Ordering::Acquire) {
        killed = Some(Killed::TooLarge);
    }
    match killed {
        Some(Killed::Cpu(spent)) => return Err(over_cpu_budget(cpu, spent)),
        Some(Killed::Wall(took, spent)) => return Err(over_wall_time(wall, spent, took)),
        // No one hears these answers: the log says what happened.
        Some(Killed::Cancelled) => {
            let message = "the caller went away; its plugin's compilation was stopped";
            tracing::info!("{message}");
            return Err(Error::Cancelled(message.into()));
        }
        Some(Killed::Stopping) => {
            let message = "the server is shutting down; the plugin's compilation was stopped";
            tracing::info!("{message}");
            return Err(Error::unavailable(message));
        }
        Some(Killed::TooLarge) => {
            return Err(Error::resource_exhausted(format!(
                "the plugin's compiled code is over {} MiB, the most a plugin's may be; it was refused",
                MAX_COMPILED_BYTES >> 20
            )))
        }
        None => {}
    }
    let status = status.map_err(|e| Error::internal(format!("waiting for the plugin compiler failed: {e}")))?;
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(0), _) => {
            compiled.map_err(|e| Error::internal(format!("reading the compiled plugin from its compiler failed: {e}")))
        }
        (Some(INVALID), _) => Err(Error::invalid_argument(format!("not a valid WebAssembly component: {message}"))),
        // The kernel's CPU limit.
        (_, Some(libc::SIGXCPU)) => Err(over_cpu_budget(cpu, spent)),
        // Not this server's kill: the system's, and on Linux that is the
        // out-of-memory killer, which takes the compiler first.
        (_, Some(libc::SIGKILL)) => Err(Error::resource_exhausted(format!(
            "compiling the plugin was killed by the system after {:.1} CPU s, most likely for using too much \
             memory; it was refused",
            spent.as_secs_f64()
        ))),
        _ => Err(Error::internal(format!("the plugin compiler failed ({status}): {message}"))),
    }
}

/// The worker's exit code for a component that does not compile; its
/// stderr says why. Not 1 or 2, which a failing start (clap's bad
/// arguments, a panic's 101 aside) exits with: those are the server's
/// faults, not the upload's.
const INVALID: i32 = 65;

/// A compilation over its CPU budget (`spent` so far), in one wording
/// wherever it is compiled.
pub fn over_cpu_budget(budget: Duration, spent: Duration) -> Error {
    Error::resource_exhausted(format!(
        "compiling the plugin took more than its budget of {} CPU seconds (plugins.compile_cpu_seconds) and was \
         stopped ({:.1} CPU s spent)",
        budget.as_secs(),
        spent.as_secs_f64()
    ))
}

/// A compilation over its wall-time bound (`wall`, 10 × the CPU budget),
/// `took` so far with `spent` of CPU.
pub fn over_wall_time(wall: Duration, spent: Duration, took: Duration) -> Error {
    Error::resource_exhausted(format!(
        "compiling the plugin took more than {} s of wall time (10 × plugins.compile_cpu_seconds; {:.1} CPU s \
         spent in {:.1} s: the server is too busy to compile it) and was stopped",
        wall.as_secs(),
        spent.as_secs_f64(),
        took.as_secs_f64()
    ))
}

/// Runs a compilation, a panic in the compiler on an uploaded component
/// becoming that upload's failure.
pub fn guarded<T>(compile: impl FnOnce() -> wasmtime::Result<T>) -> wasmtime::Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(compile))
        .unwrap_or_else(|_| Err(wasmtime::Error::msg("the compiler panicked on it")))
}

/// CPU time process `pid` (all its threads) has spent, from
/// `/proc/PID/stat`; zero when it cannot be read.
fn cpu_time(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return Duration::ZERO };
    // The command name, in parentheses, may hold spaces: count fields
    // after its closing one. utime and stime are fields 14 and 15.
    let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else { return Duration::ZERO };
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields.get(11..13).map_or(0, |f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum());
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis(ticks.saturating_mul(1000) / per_second)
}

/// `sluice plugin compile-worker`: reads a component on stdin, compiles it
/// with `settings` (the server's: `engine::engine_config`), writes the
/// compiled code on stdout. Exit 0 when it compiled, [`INVALID`] (with
/// the reason on stderr) when it does not.
pub fn worker(settings: &wasmtime::Config) -> ExitCode {
    let mut wasm = Vec::new();
    if let Err(e) = std::io::stdin().lock().read_to_end(&mut wasm) {
        eprintln!("reading the component failed: {e}");
        return ExitCode::FAILURE;
    }
    let engine = match wasmtime::Engine::new(settings) {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!("creating the WebAssembly engine failed: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let compiled = guarded(|| engine.precompile_component(&wasm));
    match compiled {
        Ok(bytes) => match std::io::stdout().lock().write_all(&bytes) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("writing the compiled code failed: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprint!("{e:#}");
            ExitCode::from(INVALID as u8)
        }
    }
}
