//! The gRPC port served thread-per-core (`server.grpc_threads = "per_core"`):
//! one single-threaded tokio runtime per core, each serving the
//! connections it is dealt, so every call of a connection is read,
//! answered and written on one thread.
//!
//! On tokio's work-stealing runtime a call read on one worker often wakes
//! a second, parked worker to steal the task it spawned; on a virtual
//! machine each such wake-up is a futex call and a context switch that
//! cost more than a small model's inference (docs/BENCHMARKS.md, "What
//! one request costs"). Here nothing wakes another thread unless a batch
//! really goes to an inference thread.
//!
//! One acceptor, on the shared runtime, deals each new connection to the
//! core serving the fewest: balance does not depend on how the kernel
//! hashes a few connections over SO_REUSEPORT sockets (with four client
//! connections and two cores that put all four on one core in some runs),
//! and the hand-off costs one channel send per connection, not per call.
//! The cost of the layout is that one connection is one core's worth of
//! network work: a client that sends everything over a single HTTP/2
//! connection is served by one core (its inference still runs on the
//! inference threads when it is dear).
//!
//! Everything else — the HTTP port, loading, batching tasks, reloads —
//! stays on the shared runtime; the per-core runtimes only serve calls.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};

use super::connections::{self, Connections, Limits, Place};
use super::tls::Tls;
use crate::api::grpc::push_back::Gated;
use crate::error::{Error, Result};

/// How many cores the gRPC port is served by.
pub fn count() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// One core: where its connections are sent (a channel bounded by the
/// connection limit: each connection in it holds a place), and how many
/// it serves.
struct Core {
    connections: mpsc::UnboundedSender<(std::net::TcpStream, Place)>,
    open: Arc<AtomicUsize>,
}

/// Serves `router` on `listener` from `cores` threads, each running a
/// single-threaded runtime, until `stop` says so. Returns once every core
/// runs, with a future that resolves once every connection has finished.
pub async fn serve(
    listener: TcpListener,
    router: Gated,
    limits: Limits,
    tls: Option<Arc<Tls>>,
    stop: watch::Receiver<bool>,
    cores: usize,
) -> Result<impl Future<Output = ()>> {
    let mut dealt = Vec::with_capacity(cores);
    let mut starting = Vec::with_capacity(cores);
    let mut finished = Vec::with_capacity(cores);
    for core in 0..cores.max(1) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let (started, started_rx) = oneshot::channel::<Result<()>>();
        let (done, done_rx) = oneshot::channel::<()>();
        let open = Arc::new(AtomicUsize::new(0));
        let connections = Connections::new(router.clone(), &limits, tls.clone());
        let served = open.clone();
        std::thread::Builder::new()
            .name(format!("grpc-core-{core}"))
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = started.send(Err(Error::internal(format!("gRPC core {core} cannot start: {e}"))));
                        return;
                    }
                };
                let _ = started.send(Ok(()));
                runtime.block_on(serve_core(receiver, connections, served));
                let _ = done.send(());
            })
            .map_err(|e| Error::internal(format!("starting gRPC core thread {core} failed: {e}")))?;
        dealt.push(Core { connections: sender, open });
        starting.push(started_rx);
        finished.push(done_rx);
    }
    for core in starting {
        core.await.map_err(|_| Error::internal("a gRPC core thread stopped while starting"))??;
    }
    let acceptor = tokio::spawn(async move {
        connections::accept(listener, &limits, stop, |io, place| deal(&dealt, io, place)).await;
        // Dropping `dealt` closes every core's channel: each lets its
        // connections finish and stops.
    });
    Ok(async move {
        let _ = acceptor.await;
        for core in finished {
            let _ = core.await;
        }
    })
}

/// Sends a new connection to the core serving the fewest.
fn deal(cores: &[Core], io: tokio::net::TcpStream, place: Place) {
    let Some(core) = cores.iter().min_by_key(|core| core.open.load(Ordering::Relaxed)) else { return };
    // Registered with the acceptor's runtime until now; the core registers
    // it with its own.
    let stream = match io.into_std() {
        Ok(stream) => stream,
        Err(e) => return tracing::warn!("handing a connection to a gRPC core failed: {e}"),
    };
    core.open.fetch_add(1, Ordering::Relaxed);
    if core.connections.send((stream, place)).is_err() {
        core.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One core's loop: serves each connection it is sent until the acceptor
/// stops, then lets them finish.
async fn serve_core(
    mut received: mpsc::UnboundedReceiver<(std::net::TcpStream, Place)>,
    connections: Connections,
    open: Arc<AtomicUsize>,
) {
    while let Some((stream, place)) = received.recv().await {
        match tokio::net::TcpStream::from_std(stream) {
            Ok(io) => {
                let open = open.clone();
                connections.serve(io, place, move || {
                    open.fetch_sub(1, Ordering::Relaxed);
                });
            }
            Err(e) => {
                open.fetch_sub(1, Ordering::Relaxed);
                tracing::warn!("a gRPC core cannot serve a connection: {e}");
            }
        }
    }
    connections.finish().await;
}
