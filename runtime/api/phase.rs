//! The server's phase — loading, ready, leaving, draining — as one atomic
//! every call reads without a lock. `health` moves it and reports it; the
//! request context serves calls only while it is `Ready` or `Leaving`.
//! Below both, so neither imports the other for it.

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
    /// Shutting down, first step: not ready (readiness 503, gRPC health
    /// NOT_SERVING) so that load balancers take the replica out, while
    /// every call they still send is served (`server.drain_delay_secs`).
    Leaving,
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

    /// Shutdown has begun: not ready, still serving. From loading it
    /// drains at once (nothing was ever served).
    pub fn leave(&self) {
        let _ = self.0.compare_exchange(Phase::Ready as u8, Phase::Leaving as u8, Ordering::AcqRel, Ordering::Acquire);
        if self.get() == Phase::Loading {
            self.drain();
        }
    }

    /// Shutdown has begun, or its delay is over: new calls are refused.
    pub fn drain(&self) {
        self.0.store(Phase::Draining as u8, Ordering::Release);
    }

    /// The phase now.
    pub fn get(&self) -> Phase {
        match self.0.load(Ordering::Acquire) {
            0 => Phase::Loading,
            1 => Phase::Ready,
            3 => Phase::Leaving,
            _ => Phase::Draining,
        }
    }

    /// UNAVAILABLE, with the reason, unless the server is ready: what
    /// readiness and health answer.
    pub fn check_ready(&self) -> Result<()> {
        match self.get() {
            Phase::Ready => Ok(()),
            Phase::Leaving | Phase::Draining => {
                Err(Error::unavailable("the server is shutting down; send requests to another replica"))
            }
            Phase::Loading => Err(Error::unavailable(
                "the server is still loading its models and pipelines; retry when /readyz answers 200",
            )),
        }
    }

    /// UNAVAILABLE, with the reason, unless the server serves calls: ready,
    /// or leaving (shutting down, but still serving what load balancers
    /// send before they see it).
    pub fn check_serving(&self) -> Result<()> {
        match self.get() {
            Phase::Leaving => Ok(()),
            _ => self.check_ready(),
        }
    }
}
