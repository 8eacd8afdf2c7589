//! Accepting connections, with the limits a hostile or broken client meets
//! before any handler runs: at most `max_connections` open (more are
//! closed at once), headers bounded in size and read within
//! `header_read_timeout_ms` (a slow-loris client is cut off and holds
//! nothing), at most `max_concurrent_streams` HTTP/2 streams per
//! connection, and HTTP/2 keep-alive pings that close connections whose
//! peer is gone. With `max_connection_age_ms`, a connection is told to go
//! away at that age (as gRPC servers do), so long-lived clients spread to
//! replicas added since. One loop serves every port (gRPC, REST, admin,
//! the Unix socket), HTTP/1.1 and HTTP/2 alike, in TLS when the port has
//! it (the handshake, bounded by the same header timeout, on the
//! connection's own task).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulConnection;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use super::tls::{self, Tls};
use crate::api::grpc::push_back::Gated;
use crate::config::ServerConfig;
use crate::metrics::Metrics;

/// The limits every connection is served under.
#[derive(Clone)]
pub struct Limits {
    connections: Arc<Semaphore>,
    max_concurrent_streams: u32,
    max_header_bytes: usize,
    header_read_timeout: Duration,
    max_age: Option<MaxAge>,
    open: Gauge,
    accepted: Counter,
    refused: Counter,
    handshake_failures: Counter,
}

/// How long a connection lives.
#[derive(Clone)]
struct MaxAge {
    /// When it is told to go away (jittered per connection).
    age: Duration,
    /// How long its calls then get before it is closed; None: all they take.
    grace: Option<Duration>,
    /// Connections told so.
    aged: Counter,
}

impl Limits {
    /// The limits `config` sets, counted in `metrics` under `port` (one
    /// connection budget per port, so a flood on one port leaves the
    /// others their own).
    pub fn new(config: &ServerConfig, metrics: &Metrics, port: &'static str) -> Limits {
        Limits {
            connections: Arc::new(Semaphore::new(config.max_connections)),
            max_concurrent_streams: config.max_concurrent_streams,
            max_header_bytes: config.max_header_bytes,
            header_read_timeout: Duration::from_millis(config.header_read_timeout_ms),
            max_age: config.max_connection_age_ms.map(|age| MaxAge {
                age: Duration::from_millis(age),
                grace: config.max_connection_age_grace_ms.map(Duration::from_millis),
                aged: metrics.connections_aged.get_or_create_owned(&crate::metrics::PortLabels { port }),
            }),
            open: metrics.connections_open.get_or_create_owned(&crate::metrics::PortLabels { port }),
            accepted: metrics.connections_accepted.get_or_create_owned(&crate::metrics::PortLabels { port }),
            refused: metrics.connections_refused.get_or_create_owned(&crate::metrics::PortLabels { port }),
            handshake_failures: metrics
                .tls_handshake_failures
                .get_or_create_owned(&crate::metrics::PortLabels { port }),
        }
    }

    fn builder(&self) -> Builder<TokioExecutor> {
        let mut builder = Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_read_timeout)
            // hyper answers 431 to headers that do not fit the buffer.
            .max_buf_size(self.max_header_bytes.max(8192));
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(self.max_concurrent_streams)
            .max_header_list_size(u32::try_from(self.max_header_bytes).unwrap_or(u32::MAX))
            .keep_alive_interval(Some(Duration::from_secs(30)))
            .keep_alive_timeout(Duration::from_secs(20));
        builder
    }
}

/// A connection's other end, for log lines.
pub trait Peer {
    /// Its address, as a log line gives it.
    fn peer(&self) -> String;
}

impl Peer for tokio::net::TcpStream {
    fn peer(&self) -> String {
        self.peer_addr().map_or_else(|_| "an unknown address".to_string(), |addr| addr.to_string())
    }
}

impl Peer for tokio::net::UnixStream {
    fn peer(&self) -> String {
        "the Unix socket".to_string()
    }
}

/// Failed TLS handshakes logged a second, at WARN: enough to see who
/// fails and why, bounded so a scanner cannot flood the log.
static HANDSHAKE_FAILURE_LINES: crate::api::context::LineBudget = crate::api::context::LineBudget::new(5);

/// Logs a failed handshake with the peer and the reason, within the
/// budget; the metric counts them all.
fn log_handshake_failure(peer: &str, why: &dyn std::fmt::Display) {
    if let Some(skipped) = HANDSHAKE_FAILURE_LINES.take() {
        let skipped = if skipped == 0 {
            String::new()
        } else {
            format!(" ({skipped} before it not logged: at most 5 lines a second; sluice_tls_handshake_failures_total counts every one)")
        };
        tracing::warn!(peer, "TLS handshake failed: {why}{skipped}");
    }
}

/// Something connections are accepted from.
pub trait Listener: Send + 'static {
    /// A connection.
    type Io: AsyncRead + AsyncWrite + Peer + Unpin + Send + 'static;
    /// The next connection; errors are logged and the loop goes on.
    fn accept(&mut self) -> impl Future<Output = std::io::Result<Self::Io>> + Send;
}

impl Listener for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;

    async fn accept(&mut self) -> std::io::Result<Self::Io> {
        let (stream, _) = tokio::net::TcpListener::accept(self).await?;
        // Nagle's algorithm holds small responses for up to 40 ms on loopback.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::warn!("cannot set TCP_NODELAY: {e}");
        }
        Ok(stream)
    }
}

impl Listener for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;

    async fn accept(&mut self) -> std::io::Result<Self::Io> {
        tokio::net::UnixListener::accept(self).await.map(|(stream, _)| stream)
    }
}

/// Serves `router` on `listener` until `stop` says so; then stops
/// accepting, lets the connections finish what they have (HTTP/2 gets a
/// GOAWAY, idle HTTP/1.1 connections close), and resolves once they have.
pub async fn serve(
    listener: impl Listener,
    router: impl Into<Gated>,
    limits: Limits,
    tls: Option<Arc<Tls>>,
    stop: watch::Receiver<bool>,
) {
    let connections = Connections::new(router.into(), &limits, tls);
    accept(listener, &limits, stop, |io, place| connections.serve(io, place, || ())).await;
    connections.finish().await;
}

/// Closes a connection whose handshake was refused so that the client
/// reads the TLS alert saying why (certificate required, unknown CA): a
/// close with the client's request still unread would reset the
/// connection, and the client would see only that. Bounded: half a
/// second of reading, then the connection is dropped.
async fn linger<I: AsyncRead + AsyncWrite + Unpin>(mut io: I) {
    if tokio::io::AsyncWriteExt::shutdown(&mut io).await.is_ok() {
        drain(&mut io).await;
    }
}

/// Reads and discards what the client sends until it closes, for half a
/// second at most.
async fn drain<I: AsyncRead + Unpin>(io: &mut I) {
    let mut discard = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_millis(500), async {
        while matches!(tokio::io::AsyncReadExt::read(io, &mut discard).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// The TLS handshake of one connection, bounded by the header timeout.
struct Handshake {
    acceptor: tokio_rustls::TlsAcceptor,
    timeout: Duration,
    failures: Counter,
}

impl Handshake {
    /// What the client opened with: a TLS session, plaintext (served
    /// the refusal), or nothing to serve (no valid certificate, no
    /// handshake in time).
    async fn run<I>(self, mut io: I) -> Opened<I>
    where
        I: AsyncRead + AsyncWrite + Peer + Unpin,
    {
        let peer = io.peer();
        // The opening bytes tell TLS from a plaintext client.
        let mut first = vec![0u8; 64];
        let opened = tokio::time::timeout(self.timeout, tokio::io::AsyncReadExt::read(&mut io, &mut first)).await;
        let Ok(Ok(n @ 1..)) = opened else {
            self.failures.inc();
            let why = match opened {
                Err(_) => format!("nothing sent within {} ms", self.timeout.as_millis()),
                Ok(Err(e)) => format!("reading the first bytes failed: {e}"),
                Ok(Ok(_)) => "the connection closed before sending anything".to_string(),
            };
            log_handshake_failure(&peer, &why);
            return Opened::Refused;
        };
        first.truncate(n);
        let io = tls::Prefixed::new(first.clone(), io);
        if !tls::is_tls(&first) {
            self.failures.inc();
            log_handshake_failure(&peer, &"a plaintext client on a TLS port (answered that the port serves TLS)");
            return Opened::Plaintext(io);
        }
        match tokio::time::timeout(self.timeout, self.acceptor.accept(io).into_fallible()).await {
            Ok(Ok(stream)) => Opened::Tls(Box::new(stream)),
            // A client without a valid certificate: refused before any
            // request is read, and given the time to read the alert.
            Ok(Err((e, io))) => {
                self.failures.inc();
                log_handshake_failure(&peer, &e);
                linger(io).await;
                Opened::Refused
            }
            Err(_) => {
                self.failures.inc();
                log_handshake_failure(&peer, &format!("not done within {} ms", self.timeout.as_millis()));
                Opened::Refused
            }
        }
    }
}

/// What a connection to a TLS port opened with.
enum Opened<I> {
    /// A TLS session: served (boxed: it is large, and made once a connection).
    Tls(Box<tokio_rustls::server::TlsStream<tls::Prefixed<I>>>),
    /// Plaintext: each request is told the port serves TLS.
    Plaintext(tls::Prefixed<I>),
    /// Nothing to serve.
    Refused,
}

/// A connection's place under `max_connections`, freed when it closes.
pub type Place = OwnedSemaphorePermit;

/// Accepts connections from `listener` until `stop` says so, and hands
/// each, with its place under the connection limit, to `handle`; over the
/// limit a connection is closed at once, before a byte is read.
pub async fn accept<L: Listener>(
    mut listener: L,
    limits: &Limits,
    mut stop: watch::Receiver<bool>,
    mut handle: impl FnMut(L::Io, Place),
) {
    let stopping = async move {
        let _ = stop.wait_for(|stop| *stop).await;
    };
    tokio::pin!(stopping);
    loop {
        let io = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(io) => io,
                Err(e) => {
                    // Out of file descriptors, say: back off instead of spinning.
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stopping => break,
        };
        let Ok(place) = limits.connections.clone().try_acquire_owned() else {
            limits.refused.inc();
            drop(io);
            continue;
        };
        limits.accepted.inc();
        handle(io, place);
    }
}

/// The connections served on one runtime: each a task of that runtime,
/// all of them watched for a graceful shutdown.
pub struct Connections {
    router: Gated,
    builder: Builder<TokioExecutor>,
    /// Turned true when the server stops; closed once every connection
    /// (each holding a receiver) has.
    stop: watch::Sender<bool>,
    max_age: Option<MaxAge>,
    open: Gauge,
    tls: Option<Arc<Tls>>,
    handshake_timeout: Duration,
    handshake_failures: Counter,
}

impl Connections {
    /// Connections to `router`, served under `limits`, in TLS with `tls`.
    pub fn new(router: Gated, limits: &Limits, tls: Option<Arc<Tls>>) -> Connections {
        Connections {
            router,
            builder: limits.builder(),
            stop: watch::Sender::new(false),
            max_age: limits.max_age.clone(),
            open: limits.open.clone(),
            tls,
            handshake_timeout: limits.header_read_timeout,
            handshake_failures: limits.handshake_failures.clone(),
        }
    }

    /// Serves `io` on the current runtime until it closes; then frees its
    /// place and calls `closed`.
    pub fn serve<I>(&self, io: I, place: Place, closed: impl FnOnce() + Send + 'static)
    where
        I: AsyncRead + AsyncWrite + Peer + Unpin + Send + 'static,
    {
        // Called by hyper as each stream arrives (push_back.rs).
        let service = self.router.clone();
        let open = self.open.clone();
        open.inc();
        let (stop, max_age) = (self.stop.subscribe(), self.max_age.clone());
        let Some(tls) = &self.tls else {
            let connection = self.builder.serve_connection_with_upgrades(TokioIo::new(io), service).into_owned();
            tokio::spawn(async move {
                // Errors here are the client's (reset, garbage, timeouts).
                if let Err(e) = serve_until_closed(connection, stop, max_age).await {
                    tracing::debug!("connection closed: {e}");
                }
                open.dec();
                drop(place);
                closed();
            });
            return;
        };
        let (acceptor, builder) = (tls.acceptor(), self.builder.clone());
        let (timeout, failures) = (self.handshake_timeout, self.handshake_failures.clone());
        tokio::spawn(async move {
            let handshake = Handshake { acceptor, timeout, failures };
            let served = match handshake.run(io).await {
                Opened::Tls(stream) => {
                    let connection = builder.serve_connection_with_upgrades(TokioIo::new(*stream), service);
                    serve_until_closed(connection.into_owned(), stop, max_age).await
                }
                Opened::Plaintext(io) => {
                    let refuse = hyper::service::service_fn(|request| async move {
                        Ok::<_, std::convert::Infallible>(tls::plaintext_refusal(&request))
                    });
                    let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), refuse);
                    serve_until_closed(connection.into_owned(), stop, None).await
                }
                Opened::Refused => Ok(()),
            };
            if let Err(e) = served {
                tracing::debug!("connection closed: {e}");
            }
            open.dec();
            drop(place);
            closed();
        });
    }

    /// Lets every connection finish what it has (HTTP/2 gets a GOAWAY,
    /// idle HTTP/1.1 connections close); resolves once all have closed.
    pub async fn finish(self) {
        self.stop.send_replace(true);
        self.stop.closed().await;
    }
}

/// Serves `connection` until it closes. It is told to go away (HTTP/2
/// GOAWAY, letting its calls finish; HTTP/1.1 closed after the current
/// request) when `stop` turns true or, with `max_age`, at its age; an
/// aged connection still open `grace` after is closed.
async fn serve_until_closed<C: GracefulConnection>(
    connection: C,
    mut stop: watch::Receiver<bool>,
    max_age: Option<MaxAge>,
) -> Result<(), C::Error> {
    let mut connection = std::pin::pin!(connection);
    // ±10 %, as gRPC's servers jitter it: connections opened together (a
    // client's restart, a scale-up) do not all go away together.
    let jittered = max_age.as_ref().map_or(Duration::MAX, |max| max.age.mul_f64(0.9 + 0.2 * rand::random::<f64>()));
    let age = tokio::time::sleep(jittered);
    let mut age = std::pin::pin!(age);
    let grace = tokio::time::sleep(Duration::MAX);
    let mut grace = std::pin::pin!(grace);
    let mut going_away = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => return result,
            _ = stop.wait_for(|&stopping| stopping), if !going_away => {
                going_away = true;
                connection.as_mut().graceful_shutdown();
            }
            () = &mut age, if !going_away => {
                going_away = true;
                connection.as_mut().graceful_shutdown();
                if let Some(max) = &max_age {
                    max.aged.inc();
                    if let Some(after) = max.grace {
                        grace.as_mut().reset(tokio::time::Instant::now() + after);
                    }
                }
            }
            // Dropping the connection closes it, calls and all.
            () = &mut grace => return Ok(()),
        }
    }
}
