//! Starting and stopping the server.
//!
//! The order matters to operators: the HTTP port opens first, so liveness,
//! readiness (503 while loading) and metrics answer while models load and
//! warm up; the gRPC port opens once everything is ready. On SIGTERM,
//! readiness turns false and gRPC health reports NOT_SERVING at once while
//! every call is still served for the drain delay (load balancers still
//! send until they see it); then new calls are refused with UNAVAILABLE,
//! the gRPC port stops accepting and tells its connections to go away
//! (GOAWAY), in-flight requests finish (up to the drain timeout), the HTTP
//! port closes, and only then are the models released. Ctrl-C skips the
//! delay.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

mod connections;
mod cores;
pub mod telemetry;
pub mod tls;

use self::connections::Limits;
use self::tls::Tls;
use crate::api::admin_access::Admin;
use crate::api::context::ServingState;
use crate::api::grpc::push_back::{Gated, PushBack};
use crate::api::grpc::{InferenceApi, ModelStatusApi, PredictionApi};
use crate::api::health::Lifecycle;
use crate::api::rest::{self, RestState};
use crate::config::{Config, GrpcThreads};
use crate::error::{Error, Result};
use crate::feature::FeatureTables;
use crate::metrics::Metrics;
use crate::models::LoadSettings;
use crate::pipeline::admission::TrafficRules;
use crate::pipeline::lifecycle::ModelManager;
use crate::pipeline::stages::plugin::TeamShares;
use crate::pipeline::trace::TraceSampler;
use crate::pipeline::{BuildContext, Endpoints};
use crate::plugin::registry::PluginRegistry;
use crate::plugin::PluginEngine;
use crate::proto::inference::grpc_inference_service_server::GrpcInferenceServiceServer;
use crate::proto::tensorflow::serving::model_service_server::ModelServiceServer;
use crate::proto::tensorflow::serving::prediction_service_server::PredictionServiceServer;

/// Where a running server listens.
#[derive(Debug, Clone, Copy)]
pub struct Addresses {
    /// The gRPC port's address.
    pub grpc: SocketAddr,
    /// The HTTP port's address (REST, health, metrics).
    pub http: SocketAddr,
    /// The admin API's own port, when it has one.
    pub admin: Option<SocketAddr>,
}

/// What the server tells its caller as it starts.
pub trait Announce {
    /// The HTTP port (and the admin port, if any) is open: health and
    /// metrics answer while models load. gRPC is bound, not yet serving.
    fn http_open(&mut self, addresses: Addresses);
    /// Everything is loaded and both ports serve.
    fn ready(&mut self, addresses: Addresses);
}

/// What stops the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGTERM, an orchestrator's: not ready at once, serving on for the
    /// drain delay, then draining.
    Terminate,
    /// Ctrl-C, a person's: draining at once.
    Interrupt,
}

/// Loads everything `config` describes and serves it until `shutdown`
/// resolves, telling `announce` when each port opens.
pub async fn serve(
    config: Config,
    shutdown: impl Future<Output = Stop> + Send + 'static,
    mut announce: impl Announce,
) -> Result<()> {
    // Before anything loads: every compute thread takes it when it starts.
    crate::threads::set_compute_nice(config.server.compute_nice as i32);
    let metrics = Metrics::new();
    let (reporter, health_service) = tonic_health::server::health_reporter();
    let lifecycle = Lifecycle::new(reporter.clone());

    // Both ports are bound before anything loads, so a port in use fails
    // the start at once instead of after a long load.
    let grpc_listener = bind(&config.server.host, config.server.port).await?;
    let http_listener = bind(&config.server.host, config.server.rest_api_port).await?;
    let admin_listener = match (config.admin.enabled, config.admin.port) {
        (true, Some(port)) => Some(bind(&config.server.host, port).await?),
        _ => None,
    };
    // Certificates are read before anything serves: a bad one fails the
    // start, naming the file.
    let tls = config.server.tls.as_ref().map(|tls| Tls::load(tls, &metrics)).transpose()?;
    let addresses = Addresses {
        grpc: local_addr(&grpc_listener)?,
        http: local_addr(&http_listener)?,
        admin: admin_listener.as_ref().map(local_addr).transpose()?,
    };

    let (stopping_tx, stopping_rx) = watch::channel(false);
    if let Some(tls) = &tls {
        tls.watch(stopping_rx.clone());
        tracing::info!(client_verify = tls.verifies_clients(), "TLS on the gRPC, REST and admin ports");
    }
    tokio::spawn({
        let lifecycle = lifecycle.clone();
        let delay = Duration::from_secs(config.server.drain_delay_secs);
        async move {
            let stop = shutdown.await;
            // A plugin compiling now is an admin change on a replica that
            // is leaving: stopped at once, so it never holds the exit.
            crate::plugin::compiler::stop_all();
            if stop == Stop::Terminate && !delay.is_zero() {
                tracing::info!(
                    delay_secs = delay.as_secs(),
                    "shutting down: readiness off and gRPC health NOT_SERVING; serving on for the drain delay while \
                     load balancers take this replica out"
                );
                lifecycle.leave().await;
                tokio::time::sleep(delay).await;
            }
            tracing::info!("shutting down: refusing new requests, closing the ports, draining in-flight ones");
            lifecycle.drain().await;
            let _ = stopping_tx.send(true);
        }
    });

    let admin = if config.admin.enabled { Some(Admin::new(&config.admin)?) } else { None };
    let rest_state = RestState {
        lifecycle: lifecycle.clone(),
        metrics: metrics.clone(),
        max_body_bytes: config.server.max_message_bytes,
        max_json_values: config.server.max_json_values,
        // On the REST port unless it has a port of its own.
        admin: if admin_listener.is_some() { None } else { admin.clone() },
        request_timeout: config.server.rest_api_timeout_ms.map(Duration::from_millis),
        metrics_path: config.server.metrics_path.clone(),
        body_read_timeout: Duration::from_millis(config.server.body_read_timeout_ms),
        tracing: TraceSampler::new(&config.tracing),
        run_queue: crate::api::read_delay::RunQueue::probe(),
    };
    let (http_stop_tx, http_stop_rx) = watch::channel(false);
    let admin_server = admin_listener.map(|listener| {
        let state = RestState { admin: admin.clone(), ..rest_state.clone() };
        let limits = Limits::new(&config.server, &metrics, "admin");
        tokio::spawn(connections::serve(listener, rest::admin_router(state), limits, tls.clone(), http_stop_rx.clone()))
    });
    let mut http = tokio::spawn(connections::serve(
        http_listener,
        rest::router(rest_state),
        Limits::new(&config.server, &metrics, "http"),
        tls.clone(),
        http_stop_rx,
    ));
    announce.http_open(addresses);
    tracing::info!(http = %addresses.http, "HTTP port open (health, metrics); loading models");

    let (endpoints, plugins) = tokio::select! {
        loaded = load(&config, &metrics, stopping_rx.clone()) => loaded?,
        () = stopped(stopping_rx.clone()) => {
            tracing::info!("shutdown requested while loading; stopping");
            let _ = http_stop_tx.send(true);
            let _ = http.await;
            if let Some(admin_server) = admin_server {
                let _ = admin_server.await;
            }
            return Ok(());
        }
    };
    let state = ServingState {
        endpoints: endpoints.clone(),
        output_encoding: config.server.output_encoding,
        metrics: metrics.clone(),
        phase: lifecycle.phase_cell(),
        admin: admin.clone(),
        model_defaults: Arc::new(config.lifecycle.model_defaults.clone()),
        health: reporter,
        runtime: tokio::runtime::Handle::current(),
        tracing: TraceSampler::new(&config.tracing),
    };

    let max = config.server.max_message_bytes;
    let prediction = PredictionServiceServer::new(PredictionApi::new(state.clone()))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
    let model_service = ModelServiceServer::new(ModelStatusApi::new(state.clone()))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
    let inference = GrpcInferenceServiceServer::new(InferenceApi::new(state.clone()))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| Error::internal(format!("building gRPC reflection failed: {e}")))?;
    // tonic's own server would enforce `grpc-timeout` itself and answer
    // CANCELLED when it passes; served by axum, the routes leave deadlines
    // to sluice, which answers DEADLINE_EXCEEDED as gRPC clients expect.
    let grpc_routes = tonic::service::Routes::new(prediction)
        .add_service(model_service)
        .add_service(inference)
        .add_service(health_service)
        .add_service(reflection)
        .prepare()
        .into_axum_router()
        .layer(axum::middleware::map_response(crate::api::grpc::tf_serving_status));
    // TF Serving's --grpc_socket_path: the same services on a Unix socket.
    let unix = match &config.server.grpc_socket_path {
        None => None,
        Some(path) => {
            let _ = std::fs::remove_file(path);
            let listener = tokio::net::UnixListener::bind(path)
                .map_err(|e| Error::unavailable(format!("cannot listen on the Unix socket {}: {e}", path.display())))?;
            tracing::info!(socket = %path.display(), "gRPC on a Unix socket too");
            let limits = Limits::new(&config.server, &metrics, "grpc_socket");
            Some(tokio::spawn(connections::serve(listener, grpc_routes.clone(), limits, None, stopping_rx.clone())))
        }
    };

    if let Some(plugins) = &plugins {
        plugins.follow();
    }
    if let (Some(admin), Some(plugins)) = (&admin, plugins) {
        admin.attach(plugins);
    }
    lifecycle.ready(state.clone()).await;
    // The gRPC port accepts once everything serves (connections wait in
    // its backlog until then).
    let grpc_limits = Limits::new(&config.server, &metrics, "grpc");
    let push_back = config.server.push_back.then(|| PushBack::new(endpoints.clone(), state.phase.clone()));
    let grpc_routes = Gated::new(grpc_routes, push_back);
    let grpc: std::pin::Pin<Box<dyn Future<Output = ()> + Send>> = match config.server.grpc_threads {
        GrpcThreads::Shared => {
            Box::pin(connections::serve(grpc_listener, grpc_routes, grpc_limits, tls.clone(), stopping_rx.clone()))
        }
        GrpcThreads::PerCore => {
            let count = cores::count();
            tracing::info!(cores = count, "gRPC served by a runtime per core");
            Box::pin(
                cores::serve(grpc_listener, grpc_routes, grpc_limits, tls.clone(), stopping_rx.clone(), count).await?,
            )
        }
    };
    announce.ready(addresses);
    tracing::info!(grpc = %addresses.grpc, http = %addresses.http, "ready: serving");
    poll_repositories(&config, &state, stopping_rx.clone());
    poll_model_config_file(&config, &state, &metrics, stopping_rx.clone());

    let drain = Duration::from_secs(config.server.drain_timeout_secs);
    let drain_deadline = {
        let stopping_rx = stopping_rx.clone();
        async move {
            stopped(stopping_rx).await;
            tokio::time::sleep(drain).await;
        }
    };
    tokio::pin!(drain_deadline);
    let timed_out = tokio::select! {
        () = grpc => false,
        () = &mut drain_deadline => {
            tracing::warn!(timeout_secs = drain.as_secs(), "drain timeout reached; abandoning in-flight gRPC requests");
            true
        }
    };
    // REST requests in flight finish too, within what is left of the
    // drain; the port stays open until now so that readiness probes see
    // 503 rather than a refused connection.
    let _ = http_stop_tx.send(true);
    if !timed_out {
        tokio::select! {
            _ = &mut http => {}
            () = &mut drain_deadline => tracing::warn!(timeout_secs = drain.as_secs(), "drain timeout reached; abandoning in-flight REST requests"),
        }
    }
    http.abort();
    if let Some(admin_server) = admin_server {
        admin_server.abort();
    }
    if let Some(unix) = unix {
        unix.abort();
    }
    if let Some(path) = &config.server.grpc_socket_path {
        let _ = std::fs::remove_file(path);
    }
    drop(endpoints);
    // Request logs write and close their files (and upload them, for a log
    // in object storage) before the process ends.
    let _ = tokio::task::spawn_blocking(|| crate::pipeline::request_log::stop_all(Duration::from_secs(30))).await;
    tracing::info!("stopped");
    Ok(())
}

/// Loads the models, opens the plugin registry when a pipeline uses a
/// plugin or the admin API is on, opens the feature tables, and builds
/// every endpoint.
async fn load(
    config: &Config,
    metrics: &Arc<Metrics>,
    stopping: watch::Receiver<bool>,
) -> Result<(Arc<Endpoints>, Option<Arc<PluginRegistry>>)> {
    let settings = LoadSettings {
        library: config.onnxruntime.library.clone(),
        tensorflow_library: config.tensorflow.library.clone(),
        warmup: config.lifecycle.warmup,
        warmup_iterations: config.lifecycle.warmup_iterations,
        max_tensor_bytes: config.server.max_tensor_bytes,
        optimized_model_cache: config.lifecycle.optimized_model_cache(),
        inline_budget: Duration::from_micros(config.server.inline_inference_micros),
    };
    let storage = Arc::new(crate::models::storage::Storage::new(&config.storage, metrics.clone()));
    let manager = ModelManager::new(
        &config.lifecycle,
        settings,
        storage,
        metrics.clone(),
        Duration::from_secs(config.server.drain_timeout_secs),
    );
    let models = Endpoints::load_models(&config.models, &manager).await?;
    let uses_plugins = config.pipelines.iter().any(|p| p.uses_plugins());
    let plugins = if uses_plugins || config.admin.enabled {
        // Compiled plugins are cached on disk by default, next to the
        // store: a restart, and every activation of a version compiled
        // before, loads machine code instead of compiling again (tens of
        // milliseconds of both cores, which show in the p99 of a swap).
        let mut settings = config.plugins.clone();
        if settings.cache_dir.is_none() {
            settings.cache_dir = settings.dir.as_ref().map(|dir| dir.join("store").join("compiled"));
        }
        let engine = Arc::new(PluginEngine::new(&settings)?);
        Some(Arc::new(PluginRegistry::open(engine, &config.plugins, metrics.clone())?))
    } else {
        None
    };
    let features = FeatureTables::open(&config.features, metrics).await?;
    let (config, metrics) = (config.clone(), metrics.clone());
    let registry = plugins.clone();
    // Compiling plugins and starting stage threads is blocking work.
    let endpoints = tokio::task::spawn_blocking(move || {
        // A replica starts from the plugins every replica shares, and is
        // not ready before it has them.
        if let Some(registry) = &registry {
            let give_up_after = config.plugins.shared.as_ref().and_then(|shared| shared.start_wait_secs);
            registry.wait_for_shared(give_up_after.map(Duration::from_secs), || *stopping.borrow())?;
        }
        let team_shares = TeamShares::new(config.plugins.max_calls_per_team);
        let traffic = TrafficRules::new(&config.traffic, &metrics);
        let cx = BuildContext {
            registry: registry.as_ref(),
            metrics: &metrics,
            max_tensor_bytes: config.server.max_tensor_bytes,
            team_shares: &team_shares,
            features: &features,
            traffic: &traffic,
            inline_budget: Duration::from_micros(config.server.inline_inference_micros),
        };
        Endpoints::build(&config, models, manager, &cx, metrics.clone())
    })
    .await
    .map_err(|e| Error::internal(format!("building the pipelines failed: {e}")))??;
    // Mirrors a previous run left for models no longer configured go.
    endpoints.retain_mirrors();
    Ok((Arc::new(endpoints), plugins))
}

/// Re-reads every model's repository every
/// `lifecycle.file_system_poll_wait_seconds` until shutdown begins.
fn poll_repositories(config: &Config, state: &ServingState, stopping: watch::Receiver<bool>) {
    let seconds = config.lifecycle.file_system_poll_wait_seconds;
    if seconds == 0 {
        return;
    }
    let endpoints = state.endpoints.clone();
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(Duration::from_secs(seconds));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            // A download from an object store that ends is a poll now:
            // its version serves without waiting for the next tick.
            tokio::select! {
                _ = ticks.tick() => {}
                () = endpoints.storage().changed() => {}
                () = stopped(stopping.clone()) => return,
            }
            endpoints.poll().await;
        }
    });
}

/// Re-reads `--model_config_file` every
/// `lifecycle.model_config_file_poll_wait_seconds`; a changed file is
/// applied as a reload (its models only). A file that does not parse or
/// load is refused with a log line, and what serves keeps serving.
fn poll_model_config_file(
    config: &Config,
    state: &ServingState,
    metrics: &Arc<Metrics>,
    stopping: watch::Receiver<bool>,
) {
    let seconds = config.lifecycle.model_config_file_poll_wait_seconds;
    let Some(path) = config.lifecycle.model_config_file.clone().filter(|_| seconds > 0) else { return };
    let last = Arc::new(std::sync::Mutex::new(std::fs::read(&path).ok()));
    let state = state.clone();
    // Each poll's outcome is counted, so that "the file has not changed,
    // nothing was applied" can be seen, not only assumed after a wait.
    let polls = metrics.model_config_file_polls.clone();
    let counted = move |outcome: &'static str| {
        polls.get_or_create(&crate::metrics::OutcomeLabels { outcome }).inc();
    };
    every(Duration::from_secs(seconds), stopping, move || {
        let (path, last, state, counted) = (path.clone(), last.clone(), state.clone(), counted.clone());
        async move {
            let Ok(now) = std::fs::read(&path) else {
                tracing::warn!(file = %path.display(), "cannot read the model config file; keeping the models served");
                counted("unreadable");
                return;
            };
            if last.lock().map(|l| l.as_deref() == Some(now.as_slice())).unwrap_or(false) {
                counted("unchanged");
                return;
            }
            if let Ok(mut l) = last.lock() {
                *l = Some(now);
            }
            let result = async {
                let config = Config::from_file(&path)?;
                crate::api::reload::apply(&state, config.models).await
            }
            .await;
            match result {
                Ok(outcome) => {
                    counted("applied");
                    tracing::info!(file = %path.display(), added = ?outcome.added, removed = ?outcome.removed, "model config file applied")
                }
                Err(error) => {
                    counted("refused");
                    tracing::error!(file = %path.display(), "model config file refused; keeping the models served: {error}")
                }
            }
        }
    });
}

/// Runs `work` every `period` (waiting for each run to end) until
/// shutdown begins.
fn every<F, Fut>(period: Duration, stopping: watch::Receiver<bool>, work: F)
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            tokio::select! {
                _ = ticks.tick() => work().await,
                () = stopped(stopping.clone()) => return,
            }
        }
    });
}

/// Resolves once `rx` says stop.
async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

fn local_addr(listener: &TcpListener) -> Result<SocketAddr> {
    listener.local_addr().map_err(|e| Error::internal(format!("reading the bound address failed: {e}")))
}

async fn bind(host: &str, port: u16) -> Result<TcpListener> {
    TcpListener::bind((host, port))
        .await
        .map_err(|e| Error::unavailable(format!("cannot listen on {host}:{port}: {e}")))
}
