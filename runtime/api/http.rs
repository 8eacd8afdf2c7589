//! The HTTP port (TF Serving's `--rest_api_port`): Prometheus metrics at
//! TF Serving's path and at `/metrics`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use super::metrics::Metrics;

/// The OpenMetrics text format prometheus-client writes.
const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The routes of the HTTP port.
pub fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/metrics", get(scrape))
        .route("/monitoring/prometheus/metrics", get(scrape))
        .with_state(metrics)
}

async fn scrape(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], metrics.encode())
}
