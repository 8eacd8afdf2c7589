#!/usr/bin/env python3
"""The models and reference answers of the GPU check (scripts/gpu-check).

Usage: make_fp16.py ROOT OUT_DIR

Copies the example CNN and MLP (ROOT/examples/models/{cnn,mlp}/1) to
OUT_DIR/{cnn,mlp}/1/model.onnx and makes their float16 twins,
OUT_DIR/{cnn_fp16,mlp_fp16}/1/model.onnx, with onnxconverter-common's
float16 converter (inputs and outputs kept float32, so clients send the
same requests). Checks each twin on the CPU against its float32 model in
ONNX Runtime (relative error within 1e-2 of the largest output), and
writes OUT_DIR/reference.json: for each model, a few inputs (REST's
columnar form) and the float32 outputs ONNX Runtime computes for them on
the CPU, which the run on the GPU machine checks its answers against
(fp32 within 1e-4, fp16 within 1e-2, relative to the largest output).

Run with the pinned venv scripts/gpu-check prepares (onnx,
onnxconverter-common, onnxruntime, numpy).
"""
import json
import os
import shutil
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnxconverter_common import float16

# Rows per reference request, per model.
ROWS = {"cnn": 4, "mlp": 8}


def run(path, feeds):
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def relative_error(got, want):
    scale = max(float(np.max(np.abs(want))), 1e-6)
    return float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) / scale


def main():
    root, out = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(11)
    reference = {}
    for name in ("cnn", "mlp"):
        source = os.path.join(root, "examples", "models", name, "1", "model.onnx")
        fp32 = os.path.join(out, name, "1", "model.onnx")
        fp16 = os.path.join(out, f"{name}_fp16", "1", "model.onnx")
        os.makedirs(os.path.dirname(fp32), exist_ok=True)
        os.makedirs(os.path.dirname(fp16), exist_ok=True)
        shutil.copyfile(source, fp32)
        model = onnx.load(source)
        onnx.save(float16.convert_float_to_float16(model, keep_io_types=True), fp16)
        session = ort.InferenceSession(fp32, providers=["CPUExecutionProvider"])
        feeds = {}
        for spec in session.get_inputs():
            shape = [ROWS[name] if (i == 0 or not isinstance(d, int)) else d for i, d in enumerate(spec.shape)]
            feeds[spec.name] = rng.standard_normal(shape).astype(np.float32)
        want = run(fp32, feeds)
        twin = run(fp16, feeds)
        for output, values in want.items():
            error = relative_error(twin[output], values)
            if error > 1e-2:
                sys.exit(f"{name}_fp16 output {output}: relative error {error:.2e} against float32 on the CPU")
            print(f"{name}_fp16 {output}: relative error {error:.2e} against float32 on the CPU (within 1e-2)")
        reference[name] = {
            "inputs": {k: v.tolist() for k, v in feeds.items()},
            "outputs": {k: v.tolist() for k, v in want.items()},
        }
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(reference, f)
    print(f"models and reference answers in {out}")


if __name__ == "__main__":
    main()
