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

use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;

use crate::api::grpc::{ModelStatusApi, PredictionApi, ServingState};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::models::ModelRegistry;
use crate::proto::tensorflow::serving::model_service_server::ModelServiceServer;
use crate::proto::tensorflow::serving::prediction_service_server::PredictionServiceServer;

/// Where a running server listens.
#[derive(Debug, Clone, Copy)]
pub struct Addresses {
    /// The gRPC port's address.
    pub grpc: SocketAddr,
}

/// Loads everything `config` describes and serves it until `shutdown`
/// resolves; `on_ready` is called with the bound addresses once the server
/// accepts requests.
pub async fn serve(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_ready: impl FnOnce(Addresses),
) -> Result<()> {
    let registry = Arc::new(ModelRegistry::load(&config.models, config.onnxruntime.library.as_deref()).await?);
    let state = ServingState { registry: registry.clone(), output_encoding: config.server.output_encoding };

    let grpc_listener = bind(&config.server.host, config.server.port).await?;
    let addresses = Addresses {
        grpc: grpc_listener
            .local_addr()
            .map_err(|e| Error::internal(format!("reading the bound address failed: {e}")))?,
    };

    let max = config.server.max_message_bytes;
    let prediction = PredictionServiceServer::new(PredictionApi::new(state.clone()))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
    let model_service = ModelServiceServer::new(ModelStatusApi::new(state.clone()))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);

    // Nagle's algorithm holds small responses for up to 40 ms on loopback.
    let incoming = TcpIncoming::from(grpc_listener).with_nodelay(Some(true));

    let (stopping_tx, mut stopping_rx) = tokio::sync::watch::channel(false);
    let grpc = tonic::transport::Server::builder()
        .add_service(prediction)
        .add_service(model_service)
        .serve_with_incoming_shutdown(incoming, async move {
            shutdown.await;
            tracing::info!("shutting down: no new connections, draining in-flight requests");
            let _ = stopping_tx.send(true);
        });

    on_ready(addresses);
    tracing::info!(grpc = %addresses.grpc, "serving");

    let drain = Duration::from_secs(config.server.drain_timeout_secs);
    let drain_deadline = async move {
        let _ = stopping_rx.wait_for(|stopping| *stopping).await;
        tokio::time::sleep(drain).await;
    };
    tokio::select! {
        result = grpc => result.map_err(|e| Error::internal(format!("the gRPC server failed: {e}")))?,
        () = drain_deadline => tracing::warn!(timeout_secs = drain.as_secs(), "drain timeout reached; abandoning in-flight requests"),
    }
    drop(registry);
    tracing::info!("stopped");
    Ok(())
}

async fn bind(host: &str, port: u16) -> Result<TcpListener> {
    TcpListener::bind((host, port))
        .await
        .map_err(|e| Error::unavailable(format!("cannot listen on {host}:{port}: {e}")))
}
