//! The gRPC port served thread-per-core (`server.grpc_threads = "per_core"`):
//! one single-threaded tokio runtime per core, each accepting on its own
//! socket bound to the same port with SO_REUSEPORT, so the kernel spreads
//! connections over the cores and every call of a connection stays on the
//! thread that reads it.
//!
//! On tokio's work-stealing runtime a call read on one worker often wakes
//! a second, parked worker to steal the task it spawned; on a virtual
//! machine each such wake-up is a futex call and a context switch that
//! cost more than a small model's inference (docs/BENCHMARKS.md, issue
//! 35). Here nothing wakes another thread unless a batch really goes to
//! an inference thread. The cost is balance: one connection is served by
//! one core, so a client that sends everything over a single HTTP/2
//! connection gets one core's worth of network work (its inference still
//! runs on the inference threads).
//!
//! Everything else — the HTTP port, loading, batching tasks, reloads —
//! stays on the shared runtime; the per-core runtimes only serve calls.

use std::future::Future;
use std::net::SocketAddr;

use tokio::sync::{oneshot, watch};

use super::connections::{self, Limits};
use crate::error::{Error, Result};

/// How many cores the gRPC port is served by.
pub fn count() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `count` sockets listening on `host:port` together (port 0: the first
/// picks one, the others join it). Bound now, served later by [`serve`].
pub fn bind(host: &str, port: u16, count: usize) -> Result<Vec<std::net::TcpListener>> {
    let unavailable = |e: std::io::Error| Error::unavailable(format!("cannot listen on {host}:{port}: {e}"));
    let mut addr: SocketAddr = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
        .map_err(unavailable)?
        .next()
        .ok_or_else(|| Error::unavailable(format!("cannot listen on {host}:{port}: the host resolves to nothing")))?;
    let mut listeners = Vec::with_capacity(count);
    for _ in 0..count.max(1) {
        let socket = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)
            .map_err(unavailable)?;
        // Only sockets of the same user may join the port.
        socket.set_reuse_port(true).map_err(unavailable)?;
        socket.set_reuse_address(true).map_err(unavailable)?;
        socket.set_nonblocking(true).map_err(unavailable)?;
        socket.bind(&addr.into()).map_err(unavailable)?;
        socket.listen(1024).map_err(unavailable)?;
        let listener: std::net::TcpListener = socket.into();
        addr = listener.local_addr().map_err(unavailable)?;
        listeners.push(listener);
    }
    Ok(listeners)
}

/// Serves `router` on each listener from a thread of its own running a
/// single-threaded runtime, until `stop` says so. Returns once every core
/// accepts connections, with a future that resolves once every core has
/// finished its connections.
pub async fn serve(
    listeners: Vec<std::net::TcpListener>,
    router: axum::Router,
    limits: Limits,
    stop: watch::Receiver<bool>,
) -> Result<impl Future<Output = ()>> {
    let mut listening = Vec::with_capacity(listeners.len());
    let mut finished = Vec::with_capacity(listeners.len());
    for (core, listener) in listeners.into_iter().enumerate() {
        let (accepting, accepting_rx) = oneshot::channel::<Result<()>>();
        let (done, finished_rx) = oneshot::channel::<()>();
        let (router, limits, stop) = (router.clone(), limits.clone(), stop.clone());
        std::thread::Builder::new()
            .name(format!("grpc-core-{core}"))
            .spawn(move || {
                let started = tokio::runtime::Builder::new_current_thread().enable_all().build().and_then(|runtime| {
                    let listener = runtime.block_on(async { tokio::net::TcpListener::from_std(listener) })?;
                    Ok((runtime, listener))
                });
                let (runtime, listener) = match started {
                    Ok(started) => started,
                    Err(e) => {
                        let _ = accepting.send(Err(Error::internal(format!("gRPC core {core} cannot start: {e}"))));
                        return;
                    }
                };
                let _ = accepting.send(Ok(()));
                runtime.block_on(connections::serve(listener, router, limits, stop));
                let _ = done.send(());
            })
            .map_err(|e| Error::internal(format!("starting gRPC core thread {core} failed: {e}")))?;
        listening.push(accepting_rx);
        finished.push(finished_rx);
    }
    for core in listening {
        core.await.map_err(|_| Error::internal("a gRPC core thread stopped while starting"))??;
    }
    Ok(async move {
        for core in finished {
            let _ = core.await;
        }
    })
}
