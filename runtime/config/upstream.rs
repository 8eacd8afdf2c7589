//! `[models.upstream]`: a model whose inference is forwarded to TF Serving
//! instances instead of run in ONNX Runtime. The backend that reads it is
//! `infer::tfserving`.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::Invalid;
use crate::invalid;

/// Where and how a model's requests are forwarded.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// `host:port` of each TF Serving instance (its gRPC port).
    pub endpoints: Vec<String>,
    /// The model's name upstream; default: the model's name here.
    pub model_name: Option<String>,
    /// Forward to this version only; default: the versions the model's
    /// `version_policy` picks among those the upstream serves.
    pub version: Option<i64>,
    /// Forward to the version this label names upstream (followed as it
    /// moves); exclusive with `version`.
    pub version_label: Option<String>,
    /// The upstream signature to call.
    pub signature_name: String,
    /// The longest a forwarded call may take, in milliseconds; a client's
    /// earlier deadline is passed on instead.
    pub timeout_ms: u64,
    /// How long connecting to an upstream may take, in milliseconds.
    pub connect_timeout_ms: u64,
    /// Calls in flight to one upstream at most; more wait for another.
    pub max_in_flight: usize,
    /// HTTP/2 connections to each upstream: one connection multiplexes
    /// streams but is served by one of the upstream's threads.
    pub channels: usize,
    /// The largest message sent to or accepted from an upstream, in bytes.
    pub max_message_bytes: usize,
    /// Milliseconds between health checks (GetModelStatus) of each upstream.
    pub health_check_ms: u64,
    /// Consecutive failures (health checks or unreachable calls) after
    /// which an upstream is ejected; one passing health check returns it.
    pub eject_after_failures: u32,
    /// A call the upstream was lost under (connection reset or closed
    /// before it answered) is sent once more to another healthy upstream
    /// while the deadline allows. Predict, Classify and Regress have no
    /// side effects, so a second run is safe; turn it off for a model
    /// whose upstream does something a repeat would do twice.
    pub retry_lost_calls: bool,
    /// TLS to the upstreams (TF Serving's `--ssl_config_file` on their
    /// side); plaintext when absent.
    pub tls: Option<UpstreamTls>,
}

/// `[models.upstream.tls]`: how the upstreams are verified, and the
/// certificate this server shows them when they verify clients.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTls {
    /// The CA certificates the upstreams' certificates are signed by, PEM.
    pub ca_file: PathBuf,
    /// This server's client certificate chain, PEM (with `key_file`), for
    /// upstreams started with `client_verify`.
    pub cert_file: Option<PathBuf>,
    /// Its private key, PEM.
    pub key_file: Option<PathBuf>,
    /// The name the upstreams' certificates carry, when it is not the
    /// endpoint's host.
    pub domain: Option<String>,
}

impl UpstreamTls {
    /// Makes relative paths relative to `base`.
    pub fn resolve(&mut self, base: &Path) {
        for path in [Some(&mut self.ca_file), self.cert_file.as_mut(), self.key_file.as_mut()].into_iter().flatten() {
            if path.is_relative() {
                *path = base.join(&*path);
            }
        }
    }
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            endpoints: Vec::new(),
            model_name: None,
            version: None,
            version_label: None,
            signature_name: "serving_default".to_string(),
            timeout_ms: 10_000,
            connect_timeout_ms: 1_000,
            max_in_flight: 256,
            channels: 4,
            max_message_bytes: 64 << 20,
            health_check_ms: 1_000,
            eject_after_failures: 3,
            retry_lost_calls: true,
            tls: None,
        }
    }
}

impl UpstreamConfig {
    /// Checks the values; `key` names the table in errors.
    pub fn check(&self, key: &str) -> Result<(), Invalid> {
        if self.endpoints.is_empty() {
            return Err(invalid!("{key}.endpoints is empty: list the TF Serving instances as \"host:port\""));
        }
        for endpoint in &self.endpoints {
            let valid = endpoint
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
            if !valid {
                return Err(invalid!("{key}.endpoints: \"{endpoint}\" is not host:port"));
            }
        }
        if self.version.is_some() && self.version_label.is_some() {
            return Err(invalid!("{key}: set version or version_label, not both"));
        }
        for (name, value) in [
            ("timeout_ms", self.timeout_ms),
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("max_in_flight", self.max_in_flight as u64),
            ("channels", self.channels as u64),
            ("health_check_ms", self.health_check_ms),
            ("eject_after_failures", u64::from(self.eject_after_failures)),
        ] {
            if value == 0 {
                return Err(invalid!("{key}.{name} = 0: must be at least 1"));
            }
        }
        super::check_at_most(&format!("{key}.max_in_flight"), self.max_in_flight, super::MAX_COUNT)?;
        super::check_at_most(&format!("{key}.channels"), self.channels, super::MAX_THREADS)?;
        if let Some(tls) = &self.tls {
            if tls.cert_file.is_some() != tls.key_file.is_some() {
                return Err(invalid!(
                    "{key}.tls: cert_file and key_file go together (a client certificate and its key)"
                ));
            }
        }
        if self.max_message_bytes < 1024 {
            return Err(invalid!("{key}.max_message_bytes = {}: must be at least 1024", self.max_message_bytes));
        }
        Ok(())
    }
}
