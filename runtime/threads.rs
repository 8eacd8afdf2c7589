//! The threads that do CPU work, and their scheduling priority against
//! the network threads (tokio's workers: transport, admission, refusals,
//! health probes). Two kinds start here:
//!
//! - **compute threads** serve requests: inference sessions (and the
//!   intra-op pools ONNX Runtime makes from them, through the session's
//!   thread manager), pipelined stage workers, and the load thread that
//!   builds them. They run `server.compute_nice` nice steps below the
//!   network threads: 0 by default, the same priority.
//! - **background threads** do work no request waits on: graph
//!   optimisation, plugin compiles, feature table reloads. They always run
//!   at least [`BACKGROUND_NICE`] steps below, so a load or a compile
//!   under traffic takes only the CPU serving leaves.
//!
//! Why compute_nice is a choice, not a default: on a saturated CPU a
//! refusal or a health probe needs some tens of µs, and at one priority
//! it waits behind timeslices of inference (refusal p99 of 50 ms and more
//! at 2× capacity). With compute below, the network threads run first and
//! those answers come in a few ms — but the network threads then also
//! handle fewer requests per wake-up, which on two shared cores cost up to
//! a third of peak throughput (docs/RELIABILITY.md, Overload).
//!
//! On Linux a nice value belongs to a thread, so each thread sets its own
//! as it starts, relative to the network threads'; a thread it creates
//! inherits it. Raising one's own nice value needs no privilege; lowering
//! it back would, which is why a background thread must not start
//! threads that serve.

use std::sync::atomic::{AtomicI32, Ordering};
use std::thread::JoinHandle;

/// How far below the network threads background work runs, whatever
/// `server.compute_nice` says: it must never slow serving down.
pub const BACKGROUND_NICE: i32 = 10;

/// The network threads' nice value; `i32::MIN` until the server sets it,
/// and then threads are placed relative to the thread that starts them.
static NETWORK_NICE: AtomicI32 = AtomicI32::new(i32::MIN);
/// Steps below it for compute threads.
static COMPUTE_STEPS: AtomicI32 = AtomicI32::new(0);

/// Compute threads started from now on run `steps` nice steps below the
/// calling thread (`server.compute_nice`; 0 runs them alike). The server
/// calls it once, from a network thread, before it loads anything.
pub fn set_compute_nice(steps: i32) {
    NETWORK_NICE.store(own_nice(), Ordering::Relaxed);
    COMPUTE_STEPS.store(steps.clamp(0, 19), Ordering::Relaxed);
}

/// Starts a thread that serves requests — an inference session, a pool
/// thread of one, a stage worker — at the compute priority.
pub fn spawn_compute<F, T>(name: String, work: F) -> std::io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    spawn_below(name, COMPUTE_STEPS.load(Ordering::Relaxed), work)
}

/// Starts a thread that serves high-priority requests only (a session
/// kept for them) at the network threads' priority, above the compute
/// threads when `server.compute_nice` puts those below.
pub fn spawn_high_priority<F, T>(name: String, work: F) -> std::io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    spawn_below(name, 0, work)
}

/// Starts a thread for background work no request waits on — graph
/// optimisation, a plugin compile, a feature table reload — at least
/// [`BACKGROUND_NICE`] steps below the network threads. It must not start
/// threads that serve: those would inherit its priority.
pub fn spawn_background<F, T>(name: String, work: F) -> std::io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    spawn_below(name, COMPUTE_STEPS.load(Ordering::Relaxed).max(BACKGROUND_NICE), work)
}

/// Runs blocking CPU work `work` on the calling thread, from async code.
/// On tokio's multi-thread runtime the runtime first moves its other
/// tasks to another worker (`block_in_place`); on a single-threaded
/// runtime (a gRPC core's, `server.grpc_threads = "per_core"`) there is no
/// other worker to move them to, and the work just runs.
pub fn run_blocking_here<T>(work: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(work),
        _ => work(),
    }
}

/// Lowers the calling thread to the priority [`spawn_background`] gives:
/// for threads a library starts for background work (the plugin
/// compiler's pool).
pub fn lower_to_background() {
    set_own_nice(background_nice());
}

fn background_nice() -> i32 {
    let base = match NETWORK_NICE.load(Ordering::Relaxed) {
        i32::MIN => own_nice(),
        nice => nice,
    };
    (base + COMPUTE_STEPS.load(Ordering::Relaxed).max(BACKGROUND_NICE)).min(19)
}

fn spawn_below<F, T>(name: String, steps: i32, work: F) -> std::io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let base = match NETWORK_NICE.load(Ordering::Relaxed) {
        i32::MIN => own_nice(),
        nice => nice,
    };
    let nice = (base + steps).min(19);
    // The thread is at its priority when this returns: whatever looks at
    // it next (a scheduler, /proc, a test) sees the priority it runs at,
    // not its creator's for the moment before its first line.
    let (placed, at_priority) = std::sync::mpsc::sync_channel(1);
    let handle = std::thread::Builder::new().name(name).spawn(move || {
        set_own_nice(nice);
        let _ = placed.send(());
        work()
    })?;
    let _ = at_priority.recv();
    Ok(handle)
}

/// Sets the calling thread's nice value. A failure (a sandbox that forbids
/// it, or a value below its creator's) leaves it at its creator's
/// priority, which only costs the preference: logged, not fatal.
fn set_own_nice(nice: i32) {
    #[cfg(target_os = "linux")]
    if own_nice() != nice {
        // SAFETY: setpriority(2) on the calling thread: `who` 0 is the
        // caller, and on Linux PRIO_PROCESS names a thread.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } != 0 {
            tracing::warn!(
                nice,
                "could not set a thread's priority ({}); it runs at its creator's",
                std::io::Error::last_os_error()
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = nice;
}

/// The calling thread's nice value (Linux; 0 elsewhere).
pub fn own_nice() -> i32 {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getpriority(2) on the calling thread, as above. It
        // cannot fail for the caller, so -1 is a nice value, not an error.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }
    }
    #[cfg(not(target_os = "linux"))]
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nice_of_a_compute_thread() -> i32 {
        spawn_compute("compute-test".into(), own_nice).expect("spawn").join().expect("join")
    }

    fn nice_of_a_background_thread() -> i32 {
        spawn_background("background-test".into(), own_nice).expect("spawn").join().expect("join")
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn compute_and_background_threads_run_their_steps_below_the_server_and_pass_them_on() {
        let base = own_nice();
        set_compute_nice(7);
        let (compute, background) = (nice_of_a_compute_thread(), nice_of_a_background_thread());
        // A thread a compute thread creates inherits its priority (as ONNX
        // Runtime's pool threads do), and a compute thread started from a
        // compute thread does not go lower still.
        let (plain, nested) = spawn_compute("compute-test".into(), || {
            (std::thread::spawn(own_nice).join().expect("join"), nice_of_a_compute_thread())
        })
        .expect("spawn")
        .join()
        .expect("join");
        set_compute_nice(12);
        let (deeper, background_at_least) = (nice_of_a_compute_thread(), nice_of_a_background_thread());
        set_compute_nice(0);
        let (alike, background_alone) = (nice_of_a_compute_thread(), nice_of_a_background_thread());
        assert_eq!((compute, background), ((base + 7).min(19), (base + 10).min(19)));
        assert_eq!((plain, nested), (compute, compute));
        assert_eq!((deeper, background_at_least), ((base + 12).min(19), (base + 12).min(19)));
        assert_eq!((alike, background_alone), (base, (base + 10).min(19)));
        assert_eq!(own_nice(), base, "the caller's own priority is untouched");
    }
}
