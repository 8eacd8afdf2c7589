//! Compute threads: every thread that does CPU work for requests or loads
//! starts here — inference sessions (and the intra-op pools ONNX Runtime
//! makes from them), pipelined stage workers, model loads and graph
//! optimisation, plugin compiles, feature table reloads — at a lower
//! scheduling priority than the network threads (tokio's workers).
//!
//! Why: when the CPU is saturated, a refusal, a health probe or the
//! transport of an accepted request needs some tens of µs of CPU, and
//! without a preference it waits behind other threads' timeslices of
//! compute; that is what made refusals take hundreds of milliseconds at
//! 2× capacity (docs/RELIABILITY.md, Overload). With compute threads
//! `server.compute_nice` steps below, the kernel runs network threads
//! first, and compute still gets all the CPU they leave.
//!
//! On Linux a nice value belongs to a thread, so each compute thread sets
//! its own, to the process's nice value plus the increment; a thread it
//! creates inherits it, which is how ONNX Runtime's pool threads get it
//! (sessions are built on a load thread). Raising one's own nice value
//! needs no privilege; lowering it back would, so a compute thread stays
//! one.

use std::sync::atomic::{AtomicI32, Ordering};
use std::thread::JoinHandle;

/// Nice value of compute threads; `i32::MIN` until the server sets it,
/// and then they start at whatever priority their creator has.
static COMPUTE_NICE: AtomicI32 = AtomicI32::new(i32::MIN);

/// Compute threads started from now on run `increment` nice steps below
/// the calling thread (`server.compute_nice`; 0 runs them alike). The
/// server calls it once, from a network thread, before it loads anything.
pub fn set_compute_nice(increment: i32) {
    let nice = (own_nice() + increment.clamp(0, 19)).min(19);
    COMPUTE_NICE.store(nice, Ordering::Relaxed);
}

/// Starts a compute thread named `name` running `work`, at the compute
/// priority.
pub fn spawn_compute<F, T>(name: String, work: F) -> std::io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let nice = COMPUTE_NICE.load(Ordering::Relaxed);
    std::thread::Builder::new().name(name).spawn(move || {
        if nice != i32::MIN {
            set_own_nice(nice);
        }
        work()
    })
}

/// Sets the calling thread's nice value. A failure (a sandbox that forbids
/// it) leaves the thread at its creator's priority, which only costs the
/// preference: logged, not fatal.
fn set_own_nice(nice: i32) {
    #[cfg(target_os = "linux")]
    if own_nice() != nice {
        // SAFETY: setpriority(2) on the calling thread: `who` 0 is the
        // caller, and on Linux PRIO_PROCESS names a thread.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } != 0 {
            tracing::warn!(
                nice,
                "could not lower a compute thread's priority ({}); it runs at its creator's",
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

    #[test]
    #[cfg(target_os = "linux")]
    fn compute_threads_run_their_increment_below_the_server_and_pass_it_on() {
        let base = own_nice();
        set_compute_nice(7);
        let inside = nice_of_a_compute_thread();
        // A thread a compute thread creates inherits its priority (as ONNX
        // Runtime's pool threads do), and a compute thread started from a
        // compute thread does not go lower still.
        let (plain, nested) = spawn_compute("compute-test".into(), || {
            (std::thread::spawn(own_nice).join().expect("join"), nice_of_a_compute_thread())
        })
        .expect("spawn")
        .join()
        .expect("join");
        set_compute_nice(0);
        let alike = nice_of_a_compute_thread();
        assert_eq!(inside, (base + 7).min(19));
        assert_eq!((plain, nested), (inside, inside));
        assert_eq!(alike, base);
        assert_eq!(own_nice(), base, "the caller's own priority is untouched");
    }
}
