"""Readiness announcer shared by the benchmark peers (KServe, MLServer).

Started as a daemon thread inside the peer's own server process. It polls,
over loopback, the peer's KServe v2 gRPC ServerReady and ModelReady(model)
and its REST /v2/models/<model>/ready, and once all three answer "ready"
prints exactly one line on stdout (flushed):

    peer-ready NAME http=127.0.0.1:HTTP_PORT grpc=127.0.0.1:GRPC_PORT

If the peer is not ready within `timeout` seconds it prints
`peer-failed NAME: not ready after Ns` and ends the whole process (exit 1),
so a parent waiting for the line never waits for ever.

It speaks gRPC with hand-encoded protobuf bytes (ServerReadyRequest is
empty; ModelReadyRequest is field 1 = name; both responses are field 1 =
bool ready), so it needs only grpcio, whatever stubs the peer ships.
"""

import os
import sys
import threading
import time
import urllib.request

import grpc

_SERVICE = "/inference.GRPCInferenceService/"

# Set once the ready line has been printed.
announced = threading.Event()


def _ready_response(raw: bytes) -> bool:
    # ServerReadyResponse / ModelReadyResponse: `bool ready = 1;` -> 08 01.
    return raw == b"\x08\x01"


def _model_ready_request(model: str) -> bytes:
    name = model.encode()
    assert len(name) < 128
    return b"\x0a" + bytes([len(name)]) + name


def _check(grpc_port: int, http_port: int, model: str) -> bool:
    target = f"127.0.0.1:{grpc_port}"
    with grpc.insecure_channel(target) as channel:
        ident = lambda b: b  # noqa: E731  (raw bytes both ways)
        server_ready = channel.unary_unary(
            _SERVICE + "ServerReady", request_serializer=ident, response_deserializer=ident
        )
        model_ready = channel.unary_unary(
            _SERVICE + "ModelReady", request_serializer=ident, response_deserializer=ident
        )
        if not _ready_response(server_ready(b"", timeout=2)):
            return False
        if not _ready_response(model_ready(_model_ready_request(model), timeout=2)):
            return False
    url = f"http://127.0.0.1:{http_port}/v2/models/{model}/ready"
    with urllib.request.urlopen(url, timeout=2) as resp:
        return resp.status == 200


def _watch(name, grpc_port, http_port, model, timeout, on_ready) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if _check(grpc_port, http_port, model):
                sys.stdout.write(
                    f"peer-ready {name} http=127.0.0.1:{http_port} grpc=127.0.0.1:{grpc_port}\n"
                )
                sys.stdout.flush()
                announced.set()
                if on_ready is not None:
                    on_ready()
                return
        except Exception:  # not listening yet, or not ready yet
            pass
        time.sleep(0.2)
    sys.stdout.write(f"peer-failed {name}: not ready after {timeout:.0f}s\n")
    sys.stdout.flush()
    os._exit(1)


def announce_when_ready(
    name: str,
    grpc_port: int,
    http_port: int,
    model: str = "mlp",
    timeout: float = 120.0,
    on_ready=None,
) -> None:
    """Starts the watcher thread; `on_ready()` runs (in it) after the line."""
    threading.Thread(
        target=_watch,
        args=(name, grpc_port, http_port, model, timeout, on_ready),
        daemon=True,
    ).start()
