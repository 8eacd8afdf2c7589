"""Starts MLServer 1.7.1 on this folder (model `mlp`, onnx_runtime.py).

    python benches/peers/mlserver/serve.py --grpc-port P --http-port Q

(run by `scripts/bench-peers serve mlserver`). The ports may instead come
from MLSERVER_GRPC_PORT / MLSERVER_HTTP_PORT; settings.json names no port,
so MLServer's own environment variables set them (MLSERVER_* variables
override settings.json's defaults). It is the same as
`mlserver start benches/peers/mlserver` plus the ready line, printed on
stdout once the gRPC ServerReady/ModelReady and REST model-ready answer:

    peer-ready mlserver grpc=127.0.0.1:P http=127.0.0.1:Q

settings.json: parallel_workers 0, so inference runs in this one process
(no worker pool, nothing left behind when it is killed); metrics_endpoint
null, so no metrics server and no Prometheus gRPC interceptor; debug false,
so no per-request gRPC access log; host 127.0.0.1.
"""

import argparse
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(here))
import ready  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--grpc-port", type=int, default=os.environ.get("MLSERVER_GRPC_PORT"))
    parser.add_argument("--http-port", type=int, default=os.environ.get("MLSERVER_HTTP_PORT"))
    parser.add_argument("--model-path", default=os.environ.get("PEER_MODEL"))
    args = parser.parse_args()
    if not args.grpc_port or not args.http_port:
        parser.error("--grpc-port and --http-port (or MLSERVER_GRPC_PORT/MLSERVER_HTTP_PORT) are required")
    os.environ["MLSERVER_GRPC_PORT"] = str(args.grpc_port)
    os.environ["MLSERVER_HTTP_PORT"] = str(args.http_port)
    if args.model_path:
        os.environ["PEER_MODEL"] = os.path.abspath(args.model_path)

    from mlserver.cli.main import main as mlserver_main

    ready.announce_when_ready("mlserver", int(args.grpc_port), int(args.http_port), "mlp")
    sys.argv = ["mlserver", "start", here]
    try:
        mlserver_main()
    finally:
        # MLServer shuts down cleanly (status 0) when the model fails to
        # load; a peer that never became ready must not look like success.
        if not ready.announced.is_set():
            print("peer-failed mlserver: exited before it was ready", flush=True)
            os._exit(1)


if __name__ == "__main__":
    main()
