//! Starting and stopping the server: load the models, bind the ports,
//! serve until told to stop, then drain.
//!
//! Shutdown is graceful: when the shutdown future resolves, the listeners
//! stop accepting, in-flight requests finish (up to the drain timeout), and
//! only then are the models released.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use tokio::net::TcpListener;

use crate::api::grpc::{ModelStatusApi, PredictionApi, ServingState};
use crate::api::metrics::Metrics;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::models::ModelRegistry;
use crate::pipeline::{Endpoints, StageContext};
use crate::plugin::PluginEngine;
use crate::proto::tensorflow::serving::model_service_server::ModelServiceServer;
use crate::proto::tensorflow::serving::prediction_service_server::PredictionServiceServer;

/// Where a running server listens.
#[derive(Debug, Clone, Copy)]
pub struct Addresses {
    /// The gRPC port's address.
    pub grpc: SocketAddr,
    /// The HTTP port's address (metrics).
    pub http: SocketAddr,
}

/// Loads everything `config` describes and serves it until `shutdown`
/// resolves; `on_ready` is called with the bound addresses once the server
/// accepts requests.
pub async fn serve(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_ready: impl FnOnce(Addresses),
) -> Result<()> {
    let metrics = Metrics::new();
    let registry =
        Arc::new(ModelRegistry::load(&config.models, config.onnxruntime.library.as_deref(), &metrics).await?);
    let uses_plugins = config
        .pipelines
        .iter()
        .any(|p| [&p.preprocess, &p.postprocess].into_iter().flatten().any(|stage| stage.plugin.is_some()));
    let plugin_engine = if uses_plugins { Some(Arc::new(PluginEngine::new(&config.plugins)?)) } else { None };
    let stages = StageContext { plugins: &config.plugins, engine: plugin_engine.as_ref(), metrics: &metrics };
    let endpoints = Arc::new(Endpoints::build(&config, registry, &stages)?);
    let state = ServingState { endpoints: endpoints.clone(), output_encoding: config.server.output_encoding };

    let grpc_listener = bind(&config.server.host, config.server.port).await?;
    let http_listener = bind(&config.server.host, config.server.rest_api_port).await?;
    let local = |listener: &TcpListener| {
        listener.local_addr().map_err(|e| Error::internal(format!("reading the bound address failed: {e}")))
    };
    let addresses = Addresses { grpc: local(&grpc_listener)?, http: local(&http_listener)? };

    let max = config.server.max_message_bytes;
    let prediction = PredictionServiceServer::new(PredictionApi::new(state.clone()))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
    let model_service = ModelServiceServer::new(ModelStatusApi::new(state.clone()))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);

    // tonic's own server would enforce `grpc-timeout` itself and answer
    // CANCELLED when it passes; served by axum, the routes leave deadlines
    // to sluice, which answers DEADLINE_EXCEEDED as gRPC clients expect.
    let grpc_routes = tonic::service::Routes::new(prediction).add_service(model_service).prepare().into_axum_router();

    let (stopping_tx, mut stopping_rx) = tokio::sync::watch::channel(false);
    let stopping = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stopping| *stopping).await;
    };
    let http = axum::serve(http_listener, crate::api::http::router(metrics.clone()))
        .with_graceful_shutdown(stopping(stopping_rx.clone()));
    let http = tokio::spawn(async move {
        if let Err(e) = http.await {
            tracing::error!("the HTTP server failed: {e}");
        }
    });
    // Nagle's algorithm holds small responses for up to 40 ms on loopback.
    let grpc_listener = grpc_listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!("cannot set TCP_NODELAY: {e}");
        }
    });
    let grpc = axum::serve(grpc_listener, grpc_routes).with_graceful_shutdown(stopping(stopping_rx.clone()));
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutting down: no new connections, draining in-flight requests");
        let _ = stopping_tx.send(true);
    });

    on_ready(addresses);
    tracing::info!(grpc = %addresses.grpc, http = %addresses.http, "serving");

    let drain = Duration::from_secs(config.server.drain_timeout_secs);
    let drain_deadline = async move {
        let _ = stopping_rx.wait_for(|stopping| *stopping).await;
        tokio::time::sleep(drain).await;
    };
    tokio::select! {
        result = std::future::IntoFuture::into_future(grpc) => result.map_err(|e| Error::internal(format!("the gRPC server failed: {e}")))?,
        () = drain_deadline => tracing::warn!(timeout_secs = drain.as_secs(), "drain timeout reached; abandoning in-flight requests"),
    }
    http.abort();
    drop(endpoints);
    tracing::info!("stopped");
    Ok(())
}

async fn bind(host: &str, port: u16) -> Result<TcpListener> {
    TcpListener::bind((host, port))
        .await
        .map_err(|e| Error::unavailable(format!("cannot listen on {host}:{port}: {e}")))
}
