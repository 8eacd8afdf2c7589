"""KServe Python ModelServer doing the example ranking cascade in one
`predict`: two ONNX Runtime sessions (examples/models/ranker_coarse and
ranker_fine) with the shortlist and the re-rank in numpy between them, as a
team writes it today in its own aggregation service.

A benchmark peer for sluice's graph pipelines (benches/graph.rs): one
`kserve.Model` named `rank` answering KServe v2 gRPC, in one process
(workers=1):

    python benches/peers/kserve_cascade.py --grpc_port P --http_port Q

Inputs `candidates` FP32 [N,16] and `item_ids` INT64 [N]; outputs `items`
INT64 [k] and `scores` FP32 [k,1], k = min(8, N): what sluice's `rank`
pipeline answers. Prints `peer-ready kserve http=... grpc=...` once ready;
per-request logging is off, as for the MLP peer.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kserve_mlp import answer  # noqa: E402
from ready import announce_when_ready  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K = 8


def session(name):
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(os.environ.get("PEER_ORT_THREADS", "1"))
    options.inter_op_num_threads = 1
    path = os.path.join(ROOT, "examples", "models", name, "1", "model.onnx")
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def top_rows(scores, k):
    # Best first, ties to the lower row, as sluice's top_rows.
    flat = scores.reshape(-1)
    return np.lexsort((np.arange(len(flat)), -flat))[: min(k, len(flat))]


class Cascade(kserve.Model):
    def __init__(self, name):
        super().__init__(name)
        self.coarse = session("ranker_coarse")
        self.fine = session("ranker_fine")
        self.ready = True

    def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        candidates = payload.get_input_by_name("candidates")
        ids = payload.get_input_by_name("item_ids")
        if candidates is None or ids is None:
            raise InvalidInput("inputs 'candidates' and 'item_ids' are required")
        features = np.ascontiguousarray(candidates.as_numpy(), dtype=np.float32)
        item_ids = ids.as_numpy().astype(np.int64)
        coarse = self.coarse.run(None, {"features": features})[0]
        best = top_rows(coarse, K)
        fine = self.fine.run(None, {"features": features[best]})[0]
        again = top_rows(fine, K)
        items = item_ids[best][again]
        scores = fine[again]
        outputs = [
            InferOutput(name="items", shape=list(items.shape), datatype="INT64", data=items),
            InferOutput(name="scores", shape=list(scores.shape), datatype="FP32", data=scores),
        ]
        return answer(self.name, payload, outputs)


def main() -> None:
    parser = argparse.ArgumentParser(parents=[model_server.parser])
    parser.set_defaults(model_name="rank", enable_latency_logging=False)
    args, _ = parser.parse_known_args()
    model = Cascade(args.model_name)

    def quiet():
        for name in ("kserve", "kserve.trace", "uvicorn.access"):
            logging.getLogger(name).setLevel(logging.WARNING)

    announce_when_ready("kserve", args.grpc_port, args.http_port, args.model_name, on_ready=quiet)
    kserve.ModelServer(http_port=args.http_port, grpc_port=args.grpc_port, workers=1).start([model])


if __name__ == "__main__":
    main()
