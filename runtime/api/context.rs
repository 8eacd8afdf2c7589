//! What every call of the client APIs shares, gRPC or REST: the state
//! they serve ([`ServingState`]) and one [`RequestContext`] per call — its
//! id, deadline and tracing span, the target it resolved to, and the
//! metering of its outcome.
//!
//! An RPC handler is then one function: make a context, resolve what the
//! request names through it, do the work, and [`RequestContext::finish`].

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use rand::Rng;

use tonic_health::server::HealthReporter;

use super::admin_access::Admin;
use super::phase::PhaseCell;
use crate::config::{ModelDefaults, OutputEncoding};
use crate::error::{Error, Result};
use crate::metrics::{LatencyLabels, Metrics, RequestLabels};
use crate::models::VersionChoice;
use crate::pipeline::deadline::Deadline;
use crate::pipeline::priority::Priority;
use crate::pipeline::trace::{self, TraceSampler};
use crate::pipeline::{Endpoints, Target};

/// The header (and gRPC metadata key) carrying a request's id.
pub const REQUEST_ID: &str = "x-request-id";

/// What the client APIs serve once the server is ready.
#[derive(Clone)]
pub struct ServingState {
    /// Every name clients can call.
    pub endpoints: Arc<Endpoints>,
    /// How numeric outputs are written in gRPC answers.
    pub output_encoding: OutputEncoding,
    /// Request counts and latencies.
    pub metrics: Arc<Metrics>,
    /// Ready or draining: calls that arrive on an open connection while
    /// the server drains are refused.
    pub phase: Arc<PhaseCell>,
    /// The admin API, when it is on: a config reload then needs an admin
    /// token.
    pub admin: Option<Arc<Admin>>,
    /// What the command line gives every model, including ones a reload
    /// adds.
    pub model_defaults: Arc<ModelDefaults>,
    /// The gRPC health service's handle: names a reload adds or removes
    /// are reported.
    pub health: HealthReporter,
    /// The shared runtime, where work that outlives a call (a reload's
    /// loads and batching tasks) runs.
    pub runtime: tokio::runtime::Handle,
    /// Which calls are traced.
    pub tracing: TraceSampler,
}

/// A request's id: the client's `x-request-id` when it sent a usable one
/// (1 to 64 visible ASCII characters), otherwise a new random one.
pub fn request_id(given: Option<&str>) -> String {
    match given {
        Some(id) if !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_graphic()) => id.to_string(),
        _ => format!("{:016x}", rand::rng().random::<u64>()),
    }
}

/// The most failed requests logged a second.
pub const FAILURE_LINES_PER_SECOND: u32 = 10;

/// The failure lines of the whole process.
static FAILURE_LINES: LineBudget = LineBudget::new(FAILURE_LINES_PER_SECOND);

/// Plugin failure lines a second, at WARN: what an author needs to see
/// (the plugin's own words), bounded so a plugin failing every call cannot
/// flood the log.
pub const PLUGIN_FAILURE_LINES_PER_SECOND: u32 = 50;

/// The plugin failure lines of the whole process.
static PLUGIN_FAILURE_LINES: LineBudget = LineBudget::new(PLUGIN_FAILURE_LINES_PER_SECOND);

/// A budget of log lines a second, shared by every thread, that counts
/// what it refuses: a handful of atomics, so a line refused costs nothing.
pub struct LineBudget {
    per_second: u32,
    /// The second (since the process's first use) the budget is for.
    second: AtomicU64,
    used: AtomicU32,
    skipped: AtomicU64,
}

impl LineBudget {
    /// `per_second` lines a second.
    pub const fn new(per_second: u32) -> LineBudget {
        LineBudget { per_second, second: AtomicU64::new(0), used: AtomicU32::new(0), skipped: AtomicU64::new(0) }
    }

    /// `Some(lines skipped since the last one written)` when a line may be
    /// written now; `None` (counted) when this second's lines are spent.
    pub fn take(&self) -> Option<u64> {
        static EPOCH: OnceLock<Instant> = OnceLock::new();
        let now = EPOCH.get_or_init(Instant::now).elapsed().as_secs() + 1;
        let second = self.second.load(Ordering::Relaxed);
        if second != now && self.second.compare_exchange(second, now, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            self.used.store(0, Ordering::Relaxed);
        }
        if self.used.fetch_add(1, Ordering::Relaxed) >= self.per_second {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.skipped.swap(0, Ordering::Relaxed))
    }
}

/// One call of a client API, from its arrival to its answer.
pub struct RequestContext {
    /// The request's id, logged on every line of its span and returned.
    pub id: String,
    /// When the answer stops being worth sending.
    pub deadline: Deadline,
    /// The span every line logged for the request carries.
    pub span: tracing::Span,
    /// A traced request's trace span (a child of `span` for the log, the
    /// caller's span's child in the trace); none for the others.
    pub trace: tracing::Span,
    /// What the request asked for (`model_spec.name`), for metrics of
    /// requests that resolved to nothing.
    name: String,
    /// Its priority, or why the one it gave is not one.
    priority: Result<Priority>,
    metrics: Arc<Metrics>,
    api: &'static str,
    entrypoint: &'static str,
    started: Instant,
    target: Option<Target>,
}

impl RequestContext {
    /// Starts an `api` call (`predict`, `get_model_metadata`, …) that came
    /// in through `entrypoint` (`grpc`, `rest`) asking for `name`, traced
    /// when `sampler` picks it (`carrier`: its W3C trace context).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        metrics: &Arc<Metrics>,
        api: &'static str,
        entrypoint: &'static str,
        id: Option<&str>,
        name: &str,
        deadline: Deadline,
        sampler: &TraceSampler,
        carrier: &dyn opentelemetry::propagation::Extractor,
    ) -> RequestContext {
        let id = request_id(id);
        let span = tracing::info_span!("request", id = %id, model = name);
        let trace = sampler.request_span(api, entrypoint, name, carrier, &span);
        RequestContext {
            id,
            deadline,
            span,
            trace,
            name: name.to_string(),
            priority: Ok(Priority::Normal),
            metrics: metrics.clone(),
            api,
            entrypoint,
            started: Instant::now(),
            target: None,
        }
    }

    /// The same call, with the priority its `x-sluice-priority` header (or
    /// metadata) gives; a malformed one fails the call when it is used.
    pub fn with_priority_header(mut self, header: Option<&[u8]>) -> RequestContext {
        self.priority = Priority::from_header(header);
        self
    }

    /// The request's priority; INVALID_ARGUMENT when the header it gave
    /// is not one.
    pub fn priority(&self) -> Result<Priority> {
        self.priority.clone()
    }

    /// Sets the priority a request's body gives (KServe v2's `priority`
    /// parameter), which overrides the header.
    pub fn set_priority(&mut self, priority: Priority) {
        self.priority = Ok(priority);
    }

    /// Resolves what the request names to a pipeline and a version, and
    /// remembers it for the request's metrics.
    pub fn resolve(
        &mut self,
        endpoints: &Endpoints,
        choice: VersionChoice<'_>,
        signature_name: &str,
    ) -> Result<Target> {
        let target = Target::resolve(endpoints, &self.name, choice, signature_name)?;
        if trace::is_traced(&self.trace) {
            self.trace.record("sluice.version", target.version.version());
        }
        self.target = Some(target.clone());
        Ok(target)
    }

    /// Records the outcome: counted by model, pipeline, API, entry point
    /// and status, and timed.
    pub fn finish<T>(self, result: &Result<T>) {
        let _in_request = self.span.enter();
        let elapsed = self.started.elapsed().as_secs_f64();
        if let Err(e) = result {
            // Expected outcomes of load (refusals, deadlines that passed,
            // callers that left) are worth a line, a few a second: under
            // overload each writing one would spend the core the serving
            // needs. Metrics count them all. Other failures (a plugin's
            // error, a bad request) are each a line: they carry what an
            // author needs, and they do not come in floods the server makes.
            let refusal = matches!(
                e.code(),
                crate::error::Code::ResourceExhausted
                    | crate::error::Code::Unavailable
                    | crate::error::Code::DeadlineExceeded
                    | crate::error::Code::Cancelled
            );
            // A plugin's failure is its author's to fix: a warning, with
            // the plugin's own words, a bounded number a second.
            let plugin = matches!(e, Error::Plugin { .. });
            // A failed dependency logs its own failures: its outage once
            // when it begins and once when it ends, other failures a line
            // a second. The requests they fail are counted, not each a
            // line.
            let reported = matches!(e, Error::DependencyFailed(_));
            let (line, per_second) = match (plugin, refusal) {
                _ if reported => (None, 0),
                (true, _) => (PLUGIN_FAILURE_LINES.take(), PLUGIN_FAILURE_LINES_PER_SECOND),
                (false, true) => (FAILURE_LINES.take(), FAILURE_LINES_PER_SECOND),
                (false, false) => (Some(0), 0),
            };
            let skipped_note = |skipped: u64| {
                if skipped == 0 {
                    String::new()
                } else {
                    format!(
                        " ({skipped} failures before it were not logged: at most {per_second} lines a second; \
                         sluice_requests_total counts every one)"
                    )
                }
            };
            match line {
                Some(skipped) if plugin => {
                    tracing::warn!(code = %e.code(), api = self.api, "request failed: {e}{}", skipped_note(skipped))
                }
                Some(skipped) => {
                    tracing::info!(code = %e.code(), api = self.api, "request failed: {e}{}", skipped_note(skipped))
                }
                None => {}
            }
            trace::record_error(&self.trace, &format_args!("{}: {e}", e.code()));
        }
        // The common case, a request that reached its pipeline: handles
        // resolved when the pipeline was built, no label lookup.
        let target = self.target.as_ref();
        // Latency is of successful requests only, as TF Serving records
        // it: refusals answered in microseconds would pull the quantiles
        // down exactly when the server is overloaded. Failures are counted
        // by code.
        let handles = target.and_then(|t| t.pipeline.request_handles().get(self.api, self.entrypoint));
        if let (Some(handle), Ok(_)) = (&handles, result) {
            handle.record_ok(elapsed);
            return;
        }
        let code = match result {
            Ok(_) => "OK",
            Err(e) => e.code().as_str(),
        };
        // Shared names and static strings: counting a request allocates
        // nothing once its series exists.
        let (model, pipeline) = match target {
            Some(t) => (t.version.model_label(), t.pipeline.name_label()),
            None => {
                let name = self.metrics.unresolved_name(&self.name);
                (name.clone(), name)
            }
        };
        let labels =
            RequestLabels { model_name: model, pipeline, api: self.api, entrypoint: self.entrypoint, status: code };
        self.metrics.requests.get_or_create(&labels).inc();
        self.metrics.tf_serving.record_failure(&labels.model_name, self.api, self.entrypoint, code);
        if handles.is_none() && result.is_ok() {
            let latency = LatencyLabels {
                model_name: labels.model_name,
                pipeline: labels.pipeline,
                api: labels.api,
                entrypoint: labels.entrypoint,
            };
            self.metrics.request_latency.get_or_create(&latency).observe(elapsed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_budget_writes_a_few_a_second_and_counts_the_rest() {
        let budget = LineBudget::new(3);
        let taken: Vec<Option<u64>> = (0..6).map(|_| budget.take()).collect();
        assert_eq!(taken[..3], [Some(0), Some(0), Some(0)]);
        assert_eq!(taken[3..], [None, None, None]);
        // A new second: the first line says how many were skipped.
        budget.second.store(0, Ordering::Relaxed);
        assert_eq!(budget.take(), Some(3));
        assert_eq!(budget.take(), Some(0));
    }

    #[test]
    fn request_ids_are_taken_when_sane_and_made_otherwise() {
        assert_eq!(request_id(Some("abc-123")), "abc-123");
        assert_eq!(request_id(None).len(), 16);
        assert_eq!(request_id(Some("has space")).len(), 16);
        assert_eq!(request_id(Some(&"x".repeat(65))).len(), 16);
        assert_ne!(request_id(None), request_id(None));
    }
}
