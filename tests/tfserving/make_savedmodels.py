#!/usr/bin/env python3
"""Builds TensorFlow SavedModels of the example MLP for the TF Serving tests.

The weights are read from the ONNX example model
(examples/models/mlp/{1,2}/model.onnx), and the graph is rebuilt node by
node (Gemm, Relu) with each Gemm's transA/transB/alpha/beta as the file
sets them, so TensorFlow computes what ONNX Runtime computes.

Layout is TF Serving's: OUT_DIR/mlp/VERSION/{saved_model.pb,variables/}.
The `serving_default` signature takes `x` (float32 [None,64]) and returns
`logits` (float32 [None,10]).

Usage: make_savedmodels.py OUT_DIR [--no-check]

Unless --no-check is given, each SavedModel is loaded back and run on the
same random input as ONNX Runtime runs the ONNX file; the script prints the
largest absolute difference and fails if it is above 1e-5.

Run through scripts/setup, which provides the pinned tensorflow-cpu, onnx
and onnxruntime in .cache/tf-venv.
"""
import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import onnx
import tensorflow as tf
from onnx import numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ONNX_BASE = os.path.join(ROOT, "examples", "models")
MODEL = "mlp"
VERSIONS = (1, 2)
TOLERANCE = 1e-5


def attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


class OnnxMlp(tf.Module):
    """The ONNX graph's Gemm and Relu nodes, run in order by TensorFlow."""

    def __init__(self, model):
        super().__init__(name=None)
        graph = model.graph
        self.weights = {
            init.name: tf.Variable(numpy_helper.to_array(init), trainable=False, name=init.name)
            for init in graph.initializer
        }
        self.nodes = []
        for node in graph.node:
            if node.op_type not in ("Gemm", "Relu"):
                raise SystemExit(f"unsupported ONNX op {node.op_type} in {graph.name}")
            self.nodes.append((node.op_type, list(node.input), list(node.output), attrs(node)))
        self.input_name = graph.input[0].name
        self.output_name = graph.output[0].name

    def run(self, x):
        values = {self.input_name: x}

        def get(name):
            return self.weights[name] if name in self.weights else values[name]

        for op, inputs, outputs, a in self.nodes:
            if op == "Relu":
                values[outputs[0]] = tf.nn.relu(get(inputs[0]))
                continue
            # Gemm: Y = alpha * A' @ B' + beta * C (C optional, broadcast).
            y = tf.linalg.matmul(
                get(inputs[0]),
                get(inputs[1]),
                transpose_a=bool(a.get("transA", 0)),
                transpose_b=bool(a.get("transB", 0)),
            )
            alpha = a.get("alpha", 1.0)
            if alpha != 1.0:
                y = alpha * y
            if len(inputs) > 2 and inputs[2]:
                c = get(inputs[2])
                beta = a.get("beta", 1.0)
                y = y + (c if beta == 1.0 else beta * c)
            values[outputs[0]] = y
        return values[self.output_name]

    @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32, name="x")])
    def serve(self, x):
        return {"logits": self.run(x)}


def onnx_path(version):
    return os.path.join(ONNX_BASE, MODEL, str(version), "model.onnx")


def build(out_dir, version):
    model = onnx.load(onnx_path(version))
    module = OnnxMlp(model)
    dest = os.path.join(out_dir, MODEL, str(version))
    tf.saved_model.save(module, dest, signatures={"serving_default": module.serve})
    print(f"wrote {dest}")
    return dest


def check(dest, version):
    import onnxruntime as ort

    rng = np.random.default_rng(7 + version)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    session = ort.InferenceSession(onnx_path(version), providers=["CPUExecutionProvider"])
    (want,) = session.run(["logits"], {"x": x})
    got = tf.saved_model.load(dest).signatures["serving_default"](x=tf.constant(x))["logits"].numpy()
    diff = float(np.max(np.abs(got - want)))
    print(f"check {MODEL}/{version}: max abs diff vs onnxruntime = {diff:.3g}")
    if not diff <= TOLERANCE:
        raise SystemExit(f"{MODEL}/{version} differs from ONNX Runtime by {diff} (> {TOLERANCE})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--no-check", action="store_true", help="skip the ONNX Runtime comparison")
    args = parser.parse_args()
    for version in VERSIONS:
        dest = build(args.out_dir, version)
        if not args.no_check:
            check(dest, version)


if __name__ == "__main__":
    sys.exit(main())
