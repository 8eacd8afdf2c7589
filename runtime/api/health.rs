//! The server's phase — loading, ready, draining — and everything that
//! reports it: HTTP readiness (`/readyz`), `grpc.health.v1` with a status
//! per served name, and the refusal REST requests get while the server is
//! not ready.
//!
//! Liveness and readiness differ on purpose: a loading or draining server
//! is alive (restarting it would not help) but must not get traffic.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use super::context::ServingState;
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

/// The phase, shared by the HTTP and gRPC sides, and what is served once
/// loading is done.
pub struct Lifecycle {
    phase: Arc<PhaseCell>,
    serving: OnceLock<ServingState>,
    reporter: HealthReporter,
}

impl Lifecycle {
    /// A server that has just started loading; `reporter` is the gRPC
    /// health service's handle.
    pub fn new(reporter: HealthReporter) -> Arc<Lifecycle> {
        Arc::new(Lifecycle {
            phase: Arc::new(PhaseCell(AtomicU8::new(Phase::Loading as u8))),
            serving: OnceLock::new(),
            reporter,
        })
    }

    /// The phase now.
    pub fn phase(&self) -> Phase {
        self.phase.get()
    }

    /// The shared cell, for what must refuse requests while draining.
    pub fn phase_cell(&self) -> Arc<PhaseCell> {
        self.phase.clone()
    }

    /// Loading is done: `state` serves from now on, and every name it
    /// serves reports SERVING (the empty name is the whole server, as the
    /// health protocol defines).
    pub async fn ready(&self, state: ServingState) {
        // Set once: a second call would be a bug in `server`, and the first
        // state stays authoritative.
        let _ = self.serving.set(state);
        self.report(ServingStatus::Serving).await;
        let became_ready = self.phase.0.compare_exchange(
            Phase::Loading as u8,
            Phase::Ready as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if became_ready.is_err() {
            // A shutdown arrived while loading: stay draining.
            self.report(ServingStatus::NotServing).await;
        }
    }

    /// Shutdown has begun: readiness turns false, every name reports
    /// NOT_SERVING, and REST predictions are refused.
    pub async fn drain(&self) {
        self.phase.0.store(Phase::Draining as u8, Ordering::Release);
        self.report(ServingStatus::NotServing).await;
    }

    /// Reports `status` for every served name and for the whole server
    /// (the empty name, as the health protocol defines).
    async fn report(&self, status: ServingStatus) {
        if let Some(state) = self.serving.get() {
            for pipeline in state.endpoints.all() {
                self.reporter.set_service_status(pipeline.name(), status).await;
            }
            for (name, _) in state.endpoints.failed() {
                self.reporter.set_service_status(name, ServingStatus::NotServing).await;
            }
        }
        self.reporter.set_service_status("", status).await;
    }

    /// What serves requests, or UNAVAILABLE with the reason while loading
    /// or draining.
    pub fn serving(&self) -> Result<&ServingState> {
        self.phase.check_ready()?;
        self.serving.get().ok_or_else(|| Error::internal("the server is ready but has nothing to serve"))
    }
}
