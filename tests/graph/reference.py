"""The example graph pipelines (examples/sluice.toml: rank, ensemble,
two_tower) computed here, their models run one after another by ONNX
Runtime's Python API, what sluice computes in one request.

Reads {"example": NAME, "inputs": {NAME: {"shape": [...], "values": [...]}}}
on stdin and writes {OUTPUT: {"shape": [...], "values": [...]}} on stdout.
"""
import json
import os
import sys

import numpy as np
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def session(name):
    path = os.path.join(ROOT, "examples", "models", name, "1", "model.onnx")
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"])


def run(name, feeds):
    sess = session(name)
    return sess.run(None, feeds)[0]


def top_rows(scores, k):
    """The k best rows by score, best first, ties to the lower row (as
    sluice's top_rows)."""
    flat = scores.reshape(-1)
    order = sorted(range(len(flat)), key=lambda i: (-flat[i], i))
    return order[: min(k, len(flat))]


def rank(inputs):
    candidates = inputs["candidates"]
    ids = inputs["item_ids"]
    coarse = run("ranker_coarse", {"features": candidates})
    best = top_rows(coarse, 8)
    fine = run("ranker_fine", {"features": candidates[best]})
    again = top_rows(fine, 8)
    return {"items": ids[best][again], "scores": fine[again]}


def ensemble(inputs):
    features = inputs["features"]
    coarse = run("ranker_coarse", {"features": features})
    fine = run("ranker_fine", {"features": features})
    return {"score": coarse * np.float32(0.3) + fine * np.float32(0.7)}


def two_tower(inputs):
    user = run("user_tower", {"user": inputs["user"]})
    items = run("item_tower", {"item": inputs["item"]})
    return {"scores": (items * user[0]).sum(axis=1, dtype=np.float32)}


def main():
    request = json.load(sys.stdin)
    inputs = {}
    for name, tensor in request["inputs"].items():
        dtype = np.int64 if tensor.get("dtype") == "int64" else np.float32
        inputs[name] = np.array(tensor["values"], dtype=dtype).reshape(tensor["shape"])
    outputs = {"rank": rank, "ensemble": ensemble, "two_tower": two_tower}[request["example"]](inputs)
    json.dump({k: {"shape": list(v.shape), "values": v.reshape(-1).tolist()} for k, v in outputs.items()}, sys.stdout)


if __name__ == "__main__":
    main()
