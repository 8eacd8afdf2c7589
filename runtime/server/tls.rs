//! TLS on the listening ports (`[server.tls]`, TF Serving's
//! `--ssl_config_file`): the server's certificate and key, and, with
//! `client_verify`, the CA every client certificate must be signed by —
//! a client without one is refused in the handshake, before a byte of a
//! request is read.
//!
//! The files are checked for changes every `reload_interval_secs`; a
//! changed set that reads and fits together (the key matches the
//! certificate) serves every new connection from then on, while open
//! connections keep the session they have, so a rotation fails no request.
//! A set that does not read is refused with a log line and a count, and the
//! current one stays. A plaintext client on a TLS port is answered in its
//! own protocol (HTTP 400, or gRPC UNAVAILABLE) saying the port serves
//! TLS, instead of a connection that just drops.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use prometheus_client::metrics::counter::Counter;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;

use crate::config::tf_model_config;
use crate::config::TlsConfig;
use crate::error::{Error, Result};
use crate::metrics::{Metrics, OutcomeLabels};

/// The TLS settings every port serves new connections with.
pub struct Tls {
    config: TlsConfig,
    /// Whether clients must show a certificate, as the files say (the
    /// TOML's `client_verify`, or the SSLConfig's).
    verifies_clients: bool,
    current: ArcSwap<ServerConfig>,
    reloaded: Counter,
    refused: Counter,
}

impl Tls {
    /// Reads the certificate, key and client CA `config` names; an error
    /// names the file and what is wrong with it.
    pub fn load(config: &TlsConfig, metrics: &Metrics) -> Result<Arc<Tls>> {
        let server_config = read(config)?;
        let verifies_clients = pems(config)?.client_ca.is_some();
        let outcome = |outcome| metrics.tls_reloads.get_or_create_owned(&OutcomeLabels { outcome });
        Ok(Arc::new(Tls {
            config: config.clone(),
            verifies_clients,
            current: ArcSwap::from_pointee(server_config),
            reloaded: outcome("ok"),
            refused: outcome("refused"),
        }))
    }

    /// Whether clients must show a certificate signed by the client CA.
    pub fn verifies_clients(&self) -> bool {
        self.verifies_clients
    }

    /// What a new connection's handshake runs with.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current.load_full())
    }

    /// Watches the files until `stop`, serving a changed set once it reads.
    pub fn watch(self: &Arc<Self>, mut stop: watch::Receiver<bool>) {
        let interval = Duration::from_secs(self.config.reload_interval_secs);
        if interval.is_zero() {
            return;
        }
        let tls = self.clone();
        tokio::spawn(async move {
            let mut seen = tls.fingerprint();
            loop {
                tokio::select! {
                    () = tokio::time::sleep(interval) => {}
                    _ = stop.wait_for(|stop| *stop) => return,
                }
                let now = tls.fingerprint();
                if now == seen {
                    continue;
                }
                // A rotation may write the key after the certificate: a
                // set that does not fit is tried again when a file changes.
                seen = now;
                tls.reload();
            }
        });
    }

    /// Reads the files again now; keeps the current set when they do not read.
    pub fn reload(&self) {
        match read(&self.config) {
            Ok(config) => {
                self.current.store(Arc::new(config));
                self.reloaded.inc();
                tracing::info!(files = ?self.config.files(), "TLS certificates reloaded; new connections use them");
            }
            Err(e) => {
                self.refused.inc();
                tracing::error!(error = %e, "TLS certificates changed but do not load; the current ones stay");
            }
        }
    }

    /// Each file's modification time and length, to notice a change.
    fn fingerprint(&self) -> Vec<(PathBuf, Option<SystemTime>, u64)> {
        self.config
            .files()
            .into_iter()
            .map(|path| {
                let meta = std::fs::metadata(path).ok();
                (path.clone(), meta.as_ref().and_then(|m| m.modified().ok()), meta.map_or(0, |m| m.len()))
            })
            .collect()
    }
}

/// Reads and checks what `config` names, as a start would (`sluice config
/// check`).
pub fn check(config: &TlsConfig) -> Result<()> {
    read(config).map(|_| ())
}

/// The PEM blocks of a source: certificate chain, key, client CA (when
/// clients are verified), and where each came from, for messages.
struct Pems {
    cert: (Vec<u8>, String),
    key: (Vec<u8>, String),
    client_ca: Option<(Vec<u8>, String)>,
}

fn read_file(path: &Path) -> Result<(Vec<u8>, String)> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::invalid_argument(format!("server.tls: cannot read {}: {e}", path.display())))?;
    Ok((bytes, path.display().to_string()))
}

fn pems(config: &TlsConfig) -> Result<Pems> {
    if let Some(path) = &config.ssl_config_file {
        let (text, name) = read_file(path)?;
        let text = String::from_utf8(text)
            .map_err(|_| Error::invalid_argument(format!("--ssl_config_file {name}: not UTF-8 text")))?;
        let ssl = tf_model_config::ssl_config(&text)
            .map_err(|e| Error::invalid_argument(format!("--ssl_config_file {name}: {}", e.0)))?;
        let within = |field: &str| format!("{field} of --ssl_config_file {name}");
        let client_ca = match (ssl.client_verify, ssl.custom_ca.is_empty()) {
            (true, true) => {
                return Err(Error::invalid_argument(format!(
                    "--ssl_config_file {name}: client_verify is true but custom_ca is empty; give the CA that signs \
                     client certificates"
                )))
            }
            (true, false) => Some((ssl.custom_ca.into_bytes(), within("custom_ca"))),
            (false, _) => None,
        };
        return Ok(Pems {
            cert: (ssl.server_cert.into_bytes(), within("server_cert")),
            key: (ssl.server_key.into_bytes(), within("server_key")),
            client_ca,
        });
    }
    let missing = |key: &str| Error::invalid_argument(format!("server.tls.{key} is missing"));
    Ok(Pems {
        cert: read_file(config.cert_file.as_deref().ok_or_else(|| missing("cert_file"))?)?,
        key: read_file(config.key_file.as_deref().ok_or_else(|| missing("key_file"))?)?,
        client_ca: match (&config.client_ca_file, config.client_verify) {
            (Some(path), true) => Some(read_file(path)?),
            (None, true) => return Err(missing("client_ca_file")),
            _ => None,
        },
    })
}

fn certificates(pem: &[u8], from: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::invalid_argument(format!("{from}: not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(Error::invalid_argument(format!("{from}: holds no certificate (-----BEGIN CERTIFICATE-----)")));
    }
    Ok(certs)
}

/// The rustls settings of a source: the key must match the certificate;
/// HTTP/2 and HTTP/1.1 are offered (gRPC needs h2).
fn read(config: &TlsConfig) -> Result<ServerConfig> {
    let pems = pems(config)?;
    let certs = certificates(&pems.cert.0, &pems.cert.1)?;
    let key = PrivateKeyDer::from_pem_slice(&pems.key.0)
        .map_err(|e| Error::invalid_argument(format!("{}: not a PEM private key: {e}", pems.key.1)))?;
    // ring: a quick build with no C toolchain beyond cc. rustls marks it
    // deprecated for lacking post-quantum key exchange (X25519MLKEM768),
    // which needs the aws-lc-rs provider; TLS 1.3 with X25519 is served.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::internal(format!("TLS protocol versions: {e}")))?;
    let builder = match &pems.client_ca {
        None => builder.with_no_client_auth(),
        Some((pem, from)) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(pem, from)? {
                roots.add(cert).map_err(|e| Error::invalid_argument(format!("{from}: not a usable CA: {e}")))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| Error::invalid_argument(format!("{from}: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut server = builder.with_single_cert(certs, key).map_err(|e| {
        Error::invalid_argument(format!(
            "{} and {} do not make a certificate and its key: {e}",
            pems.cert.1, pems.key.1
        ))
    })?;
    server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(server)
}

/// The first byte of every TLS connection: a handshake record.
const HANDSHAKE_RECORD: u8 = 0x16;

/// What a plaintext client meets on a TLS port: an answer in its own
/// protocol saying so, rather than a connection that just drops.
const REFUSAL: &str = "this port serves TLS: connect with TLS (https://, grpc.secure_channel)";

/// True when `first`, the opening bytes of a connection, start a TLS
/// handshake.
pub fn is_tls(first: &[u8]) -> bool {
    first.first() == Some(&HANDSHAKE_RECORD)
}

/// The answer to every request of a plaintext client on a TLS port, in
/// its own protocol: a gRPC call gets UNAVAILABLE saying why (a
/// trailers-only response), anything else an HTTP 400 saying it.
pub fn plaintext_refusal<B>(request: &http::Request<B>) -> http::Response<http_body_util::Full<bytes::Bytes>> {
    let grpc = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    let response = if grpc {
        http::Response::builder()
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header("grpc-status", "14")
            // Visible ASCII without '%': a valid grpc-message as it is.
            .header("grpc-message", REFUSAL)
            .body(http_body_util::Full::new(bytes::Bytes::new()))
    } else {
        http::Response::builder()
            .status(http::StatusCode::BAD_REQUEST)
            .header(http::header::CONTENT_TYPE, "text/plain")
            .header(http::header::CONNECTION, "close")
            .body(http_body_util::Full::new(bytes::Bytes::from(format!("{REFUSAL}\n"))))
    };
    // Static parts only: building cannot fail.
    response.unwrap_or_default()
}

/// A connection whose opening bytes were read to tell TLS from plaintext,
/// handed on as if they had not been.
pub struct Prefixed<I> {
    prefix: Vec<u8>,
    at: usize,
    io: I,
}

impl<I> Prefixed<I> {
    /// `io`, whose first bytes `prefix` were read already.
    pub fn new(prefix: Vec<u8>, io: I) -> Prefixed<I> {
        Prefixed { prefix, at: 0, io }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Prefixed<I> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.at < this.prefix.len() {
            let n = buf.remaining().min(this.prefix.len() - this.at);
            buf.put_slice(&this.prefix[this.at..this.at + n]);
            this.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Prefixed<I> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn read_bytes_are_handed_on_first_and_plaintext_is_told_so() {
        let (client, server) = tokio::io::duplex(1024);
        let mut prefixed = Prefixed::new(b"he".to_vec(), server);
        let mut client = client;
        tokio::io::AsyncWriteExt::write_all(&mut client, b"llo").await.unwrap();
        let mut got = [0u8; 5];
        prefixed.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");
        assert!(is_tls(&[0x16, 3, 1]) && !is_tls(b"GET /"));
        let rest = plaintext_refusal(&http::Request::new(()));
        assert_eq!(rest.status(), http::StatusCode::BAD_REQUEST);
        let grpc = http::Request::builder().header("content-type", "application/grpc+proto").body(()).unwrap();
        let answer = plaintext_refusal(&grpc);
        assert_eq!(answer.headers()["grpc-status"], "14");
        assert!(answer.headers()["grpc-message"].to_str().unwrap().contains("serves TLS"));
    }
}
