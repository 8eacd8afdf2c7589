"""Sends real KServe v2 gRPC ModelInfer requests to a running peer and
compares its outputs with ONNX Runtime run here on the same ONNX file.

    python benches/peers/check.py NAME GRPC_ADDR MODEL_ONNX

Needs grpcio, numpy, onnxruntime and a copy of the v2 proto (any peer venv).
Batch 1 (the benchmark's request: raw_input_contents, FP32 [1,64]) and
batch 3; tolerance 1e-5. Prints `check NAME OK ...` and exits 0, or the
difference and exits 1.
"""

import os
import sys

import grpc
import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import v2  # noqa: E402

TOLERANCE = 1e-5


def main() -> int:
    name, addr, model = sys.argv[1:4]
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    out_name = session.get_outputs()[0].name
    worst = 0.0
    forms = []
    with grpc.insecure_channel(addr) as channel:
        infer = v2.model_infer(channel)
        for rows in (1, 3):
            got = v2.output(infer(v2.request_bytes(rows), timeout=10), out_name, forms)
            want = session.run([out_name], {"x": v2.inputs(rows)})[0]
            if got.shape != want.shape:
                print(f"check {name} FAILED: shape {got.shape}, want {want.shape}")
                return 1
            diff = float(np.max(np.abs(got - want)))
            worst = max(worst, diff)
            if not diff <= TOLERANCE:
                print(f"check {name} FAILED: batch {rows}: max |diff| {diff:.3g} > {TOLERANCE}")
                print(f"  got  {got[0][:4]}\n  want {want[0][:4]}")
                return 1
    print(
        f"check {name} OK: ModelInfer at {addr}, batches 1 and 3, "
        f"{out_name} in {'/'.join(sorted(set(forms)))} equals onnxruntime "
        f"(max |diff| {worst:.3g} <= {TOLERANCE})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
