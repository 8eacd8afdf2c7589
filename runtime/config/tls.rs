//! `[server.tls]` and TF Serving's `--ssl_config_file`: TLS (and mutual
//! TLS) on the gRPC, REST and admin ports. The PEM files it names are read
//! by `server::tls`, which also reloads them when they change.

use std::path::PathBuf;

use serde::Deserialize;

use crate::error::Invalid;
use crate::invalid;

/// Where the server's certificate, its key and the client CA come from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// The server's certificate chain, PEM (leaf first).
    pub cert_file: Option<PathBuf>,
    /// The server's private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// The CA certificates that sign client certificates, PEM.
    pub client_ca_file: Option<PathBuf>,
    /// TF Serving's `SSLConfig` in text format (`server_key`,
    /// `server_cert`, `custom_ca`, `client_verify`, the PEM blocks inline),
    /// instead of the three files.
    pub ssl_config_file: Option<PathBuf>,
    /// Clients must present a certificate signed by the client CA; others
    /// are refused in the handshake.
    pub client_verify: bool,
    /// Seconds between checks of the files for changes; a change is read
    /// and served to new connections (open ones keep theirs). 0: never.
    pub reload_interval_secs: u64,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            cert_file: None,
            key_file: None,
            client_ca_file: None,
            ssl_config_file: None,
            client_verify: false,
            reload_interval_secs: 10,
        }
    }
}

impl TlsConfig {
    /// TF Serving's `--ssl_config_file FILE`.
    pub fn from_ssl_config_file(path: PathBuf) -> TlsConfig {
        TlsConfig { ssl_config_file: Some(path), ..TlsConfig::default() }
    }

    /// The files it reads, to watch for changes.
    pub fn files(&self) -> Vec<&PathBuf> {
        [&self.cert_file, &self.key_file, &self.client_ca_file, &self.ssl_config_file].into_iter().flatten().collect()
    }

    /// Makes relative paths relative to `base`.
    pub fn resolve(&mut self, base: &std::path::Path) {
        for path in [&mut self.cert_file, &mut self.key_file, &mut self.client_ca_file, &mut self.ssl_config_file]
            .into_iter()
            .flatten()
        {
            if path.is_relative() {
                *path = base.join(&*path);
            }
        }
    }

    /// Checks that it names one source, whole.
    pub fn check(&self) -> Result<(), Invalid> {
        let files = self.cert_file.is_some() || self.key_file.is_some() || self.client_ca_file.is_some();
        match (&self.ssl_config_file, files) {
            (Some(_), true) => {
                return Err(invalid!(
                    "server.tls: ssl_config_file and cert_file/key_file/client_ca_file are both set; give one"
                ))
            }
            (Some(_), false) => return Ok(()),
            (None, _) => {}
        }
        if self.cert_file.is_none() || self.key_file.is_none() {
            return Err(invalid!(
                "server.tls: cert_file and key_file are both needed (or ssl_config_file, TF Serving's SSLConfig)"
            ));
        }
        if self.client_verify && self.client_ca_file.is_none() {
            return Err(invalid!(
                "server.tls.client_verify = true needs client_ca_file: the CA client certificates must be signed by"
            ));
        }
        if !self.client_verify && self.client_ca_file.is_some() {
            return Err(invalid!(
                "server.tls.client_ca_file is set but client_verify is false: set client_verify = true to require \
                 client certificates, or drop client_ca_file"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_must_be_whole_and_single() {
        let files =
            TlsConfig { cert_file: Some("c.pem".into()), key_file: Some("k.pem".into()), ..TlsConfig::default() };
        files.check().unwrap();
        TlsConfig::from_ssl_config_file("ssl.config".into()).check().unwrap();
        let cases = [
            (TlsConfig { key_file: None, ..files.clone() }, "cert_file and key_file are both needed"),
            (TlsConfig { client_verify: true, ..files.clone() }, "client_verify = true needs client_ca_file"),
            (TlsConfig { client_ca_file: Some("ca.pem".into()), ..files.clone() }, "client_verify is false"),
            (TlsConfig { ssl_config_file: Some("s".into()), ..files.clone() }, "both set"),
        ];
        for (config, expected) in cases {
            let err = config.check().unwrap_err();
            assert!(err.0.contains(expected), "{err} lacks {expected}");
        }
    }
}
