//! The server's phase — loading, ready, draining — and everything that
//! reports it: HTTP readiness (`/readyz`), `grpc.health.v1` with a status
//! per served name, and the refusal REST requests get while the server is
//! not ready.
//!
//! Liveness and readiness differ on purpose: a loading or draining server
//! is alive (restarting it would not help) but must not get traffic.

use std::sync::{Arc, OnceLock};

use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use super::context::ServingState;
pub use super::phase::{Phase, PhaseCell};
use crate::error::{Error, Result};

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
        Arc::new(Lifecycle { phase: Arc::new(PhaseCell::loading()), serving: OnceLock::new(), reporter })
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
        if !self.phase.become_ready() {
            // A shutdown arrived while loading: stay draining.
            self.report(ServingStatus::NotServing).await;
        }
    }

    /// Shutdown has begun: readiness turns false and every name reports
    /// NOT_SERVING, while calls are still served (the drain delay).
    pub async fn leave(&self) {
        self.phase.leave();
        self.report(ServingStatus::NotServing).await;
    }

    /// New calls are refused from now on: readiness false, every name
    /// NOT_SERVING, REST predictions refused, in-flight ones finish.
    pub async fn drain(&self) {
        self.phase.drain();
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
        self.phase.check_serving()?;
        self.serving.get().ok_or_else(|| Error::internal("the server is ready but has nothing to serve"))
    }
}
