"""KServe Python ModelServer serving the example MLP with ONNX Runtime.

A benchmark peer for sluice: one `kserve.Model` named `mlp`, answering the
KServe v2 protocol over gRPC (inference.GRPCInferenceService) and REST, in
one process (workers=1). Started by `scripts/bench-peers serve kserve`:

    python benches/peers/kserve_mlp.py --model_path PATH/model.onnx \
        --grpc_port P --http_port Q

Every other flag of kserve.model_server is accepted too. Once the gRPC
ServerReady/ModelReady and REST model-ready answer, it prints on stdout:

    peer-ready kserve http=127.0.0.1:Q grpc=127.0.0.1:P

Per-request logging (KServe's gRPC LoggingInterceptor line, its latency
and trace lines, uvicorn's access line; all INFO) is switched off once ready unless --request_logging true,
so the peer pays for no log write per request (sluice writes none either).
ONNX Runtime: one session, PEER_ORT_THREADS intra-op threads (default 1).
Inference runs inline in `predict` (synchronous), as KServe's own
predictors do.
"""

import argparse
import logging
import os
import sys

import numpy as np
import onnxruntime as ort

import kserve
from kserve import InferOutput, InferRequest, InferResponse, model_server
from kserve.errors import InvalidInput
from kserve.utils import utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ready import announce_when_ready  # noqa: E402


class OnnxMLP(kserve.Model):
    def __init__(self, name: str, path: str):
        super().__init__(name)
        self.path = path
        self.session = None
        self.load()

    def load(self) -> bool:
        options = ort.SessionOptions()
        threads = int(os.environ.get("PEER_ORT_THREADS", "1"))
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            self.path, options, providers=["CPUExecutionProvider"]
        )
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.ready = True
        return self.ready

    def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        feeds = {}
        for name in self.input_names:
            tensor = payload.get_input_by_name(name)
            if tensor is None:
                raise InvalidInput(f"missing input '{name}'")
            feeds[name] = np.ascontiguousarray(tensor.as_numpy(), dtype=np.float32)
        results = self.session.run(self.output_names, feeds)
        outputs = [
            InferOutput(name=n, shape=list(r.shape), datatype="FP32", data=r)
            for n, r in zip(self.output_names, results)
        ]
        return answer(self.name, payload, outputs)


def answer(model_name: str, payload: InferRequest, outputs) -> InferResponse:
    """The response to `payload` with `outputs` (numpy data), as both peers
    send it."""
    # gRPC: numpy outputs always go out in raw_output_contents, and
    # use_binary_outputs must stay False there (kserve 0.21's to_grpc
    # tests `infer_output.data` for truth when it is True, which fails
    # on an array). REST: binary outputs when the request asks for them.
    return InferResponse(
        # REST requests without an id carry None, which the response
        # model rejects; gRPC ones carry "" and keep it.
        response_id=payload.id if payload.id is not None else utils.generate_uuid(),
        model_name=model_name,
        infer_outputs=outputs,
        use_binary_outputs=False if payload.from_grpc else payload.use_binary_outputs,
    )


def main() -> None:
    parser = argparse.ArgumentParser(parents=[model_server.parser])
    parser.add_argument(
        "--model_path",
        default=os.environ.get("PEER_MODEL"),
        help="the ONNX file (default: $PEER_MODEL)",
    )
    parser.add_argument(
        "--request_logging",
        default=False,
        type=lambda x: utils.strtobool(x),
        help="keep KServe's per-request INFO log lines after start-up",
    )
    parser.set_defaults(model_name="mlp", enable_latency_logging=False)
    args, _ = parser.parse_known_args()
    if not args.model_path:
        parser.error("--model_path (or PEER_MODEL) is required")

    model = OnnxMLP(args.model_name, args.model_path)

    def quiet():
        if not args.request_logging:
            for name in ("kserve", "kserve.trace", "uvicorn.access"):
                logging.getLogger(name).setLevel(logging.WARNING)

    announce_when_ready(
        "kserve", args.grpc_port, args.http_port, args.model_name, on_ready=quiet
    )
    kserve.ModelServer(
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        workers=1,
        enable_latency_logging=args.enable_latency_logging or args.request_logging,
    ).start([model])


if __name__ == "__main__":
    main()
