//! The server's phase — loading, ready, draining — as one atomic every
//! call reads without a lock. `health` moves it and reports it; the
//! request context refuses calls while it is not `Ready`. Below both, so
//! neither imports the other for it.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::error::{Error, Result};

/// Where the server is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Listening for health and metrics; models and pipelines still loading.
    Loading,
    /// Every configured model and pipeline is loaded and warmed up.
    Ready,
    /// Shutting down: in-flight requests finish, new ones are refused.
    Draining,
}

/// The phase, readable from anywhere without a lock.
#[derive(Debug)]
pub struct PhaseCell(AtomicU8);

impl PhaseCell {
    /// A server that is loading.
    pub fn loading() -> PhaseCell {
        PhaseCell(AtomicU8::new(Phase::Loading as u8))
    }

    /// Loading is done: ready, unless a shutdown began meanwhile (then it
    /// stays draining and this answers false).
    pub fn become_ready(&self) -> bool {
        self.0.compare_exchange(Phase::Loading as u8, Phase::Ready as u8, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// Shutdown has begun.
    pub fn drain(&self) {
        self.0.store(Phase::Draining as u8, Ordering::Release);
    }

    /// The phase now.
    pub fn get(&self) -> Phase {
        match self.0.load(Ordering::Acquire) {
            0 => Phase::Loading,
            1 => Phase::Ready,
            _ => Phase::Draining,
        }
    }

    /// UNAVAILABLE, with the reason, unless the server is ready.
    pub fn check_ready(&self) -> Result<()> {
        match self.get() {
            Phase::Ready => Ok(()),
            Phase::Draining => Err(Error::unavailable("the server is shutting down; send requests to another replica")),
            Phase::Loading => Err(Error::unavailable(
                "the server is still loading its models and pipelines; retry when /readyz answers 200",
            )),
        }
    }
}
