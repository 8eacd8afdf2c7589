#!/usr/bin/env python3
"""Builds TensorFlow SavedModels of the example MLP and the census fixture
for the TF Serving tests.

mlp: the weights are read from the ONNX example model
(examples/models/mlp/{1,2}/model.onnx), and the graph is rebuilt node by
node (Gemm, Relu) with each Gemm's transA/transB/alpha/beta as the file
sets them, so TensorFlow computes what ONNX Runtime computes. The
`serving_default` signature takes `x` (float32 [None,64]) and returns
`logits` (float32 [None,10]).

census: the weights are read from tests/fixtures/models/census/1/model.onnx
and the graph is built the TF1 way (Graph, Session, SavedModelBuilder), as
Estimators export: a string placeholder of serialized tf.Example is parsed
with tf.io.parse_example (age float [1] required; hours float [1] default
40; extra float [3] default 0; country int64 [1] default 0), then the ONNX
math (cast, concat, matmul + bias, softmax; matmul + bias). Signatures:
  classification, serving_default  tensorflow/serving/classify: inputs ->
                                   classes (low, mid, high per row), scores
  regression                       tensorflow/serving/regress: inputs ->
                                   outputs (value [N,1])
  predict                          examples -> probabilities, value

Layout is TF Serving's: OUT_DIR/NAME/VERSION/{saved_model.pb,variables/}.

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

CENSUS = "census"
CENSUS_ONNX = os.path.join(ROOT, "tests", "fixtures", "models", CENSUS, "1", "model.onnx")
CENSUS_CLASSES = [b"low", b"mid", b"high"]


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


def census_features():
    """The tf.Example features the census model parses, as Estimators'
    feature columns would declare them: `age` is required, the others have
    defaults."""
    return {
        "age": tf.io.FixedLenFeature([1], tf.float32),
        "hours": tf.io.FixedLenFeature([1], tf.float32, default_value=[40.0]),
        "extra": tf.io.FixedLenFeature([3], tf.float32, default_value=[0.0, 0.0, 0.0]),
        "country": tf.io.FixedLenFeature([1], tf.int64, default_value=[0]),
    }


def census_weights():
    """w [6,3], b [3], v [6,1], c [1] of the ONNX census graph, after
    checking the graph is the one this script rebuilds."""
    model = onnx.load(CENSUS_ONNX)
    ops = [(n.op_type, list(n.input), list(n.output), attrs(n)) for n in model.graph.node]
    want = [
        ("Cast", ["country"], ["country_f"]),
        ("Concat", ["age", "hours", "extra", "country_f"], ["x"]),
        ("Gemm", ["x", "w", "b"], ["logits"]),
        ("Softmax", ["logits"], ["probabilities"]),
        ("Gemm", ["x", "v", "c"], ["value"]),
    ]
    if [op[:3] for op in ops] != [(t, i, o) for t, i, o in want]:
        raise SystemExit(f"{CENSUS_ONNX}: not the graph this script rebuilds: {ops}")
    for op, _, _, a in ops:
        plain = {"Gemm": {}, "Softmax": {"axis": 1}, "Concat": {"axis": 1}}.get(op)
        if plain is not None and a != plain:
            raise SystemExit(f"{CENSUS_ONNX}: unexpected {op} attributes {a}")
    return {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}


def build_census(out_dir):
    weights = census_weights()
    dest = os.path.join(out_dir, CENSUS, "1")
    v1 = tf.compat.v1
    # The v1 signature helpers warn that they are v1 APIs; that is the point.
    tf.get_logger().setLevel("ERROR")
    graph = tf.Graph()
    with graph.as_default():
        serialized = v1.placeholder(tf.string, [None], name="serialized")
        parsed = tf.io.parse_example(serialized, census_features())
        x = tf.concat(
            [parsed["age"], parsed["hours"], parsed["extra"], tf.cast(parsed["country"], tf.float32)],
            axis=1,
        )
        var = {
            name: v1.Variable(array, trainable=False, name=name) for name, array in weights.items()
        }
        probabilities = tf.nn.softmax(tf.linalg.matmul(x, var["w"]) + var["b"], axis=1)
        value = tf.linalg.matmul(x, var["v"]) + var["c"]
        classes = tf.tile(tf.constant([CENSUS_CLASSES]), [tf.shape(serialized)[0], 1])
        sigs = v1.saved_model
        classification = sigs.classification_signature_def(serialized, classes, probabilities)
        signatures = {
            "classification": classification,
            "serving_default": classification,
            "regression": sigs.regression_signature_def(serialized, value),
            "predict": sigs.predict_signature_def(
                {"examples": serialized}, {"probabilities": probabilities, "value": value}
            ),
        }
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            builder = sigs.Builder(dest)
            builder.add_meta_graph_and_variables(
                sess, [sigs.tag_constants.SERVING], signature_def_map=signatures
            )
            builder.save()
    print(f"wrote {dest}")
    return dest


def census_example(features):
    """A tf.Example of a dict of feature name -> list of floats or ints."""
    feature = {}
    for name, values in features.items():
        if name == "country":
            feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=values))
        else:
            feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=values))
    return tf.train.Example(features=tf.train.Features(feature=feature))


def check_census(dest):
    import onnxruntime as ort

    rng = np.random.default_rng(11)
    n = 12
    rows = []
    for i in range(n):
        row = {"age": [float(rng.uniform(18, 90))]}
        if i % 3 != 1:
            row["hours"] = [float(rng.uniform(0, 80))]
        if i % 4 != 2:
            row["extra"] = [float(e) for e in rng.uniform(-1, 1, 3)]
        if i % 5 != 3:
            row["country"] = [int(rng.integers(0, 6))]
        rows.append(row)
    serialized = tf.constant([census_example(row).SerializeToString() for row in rows])
    # The values parse_example gives, defaults filled in by hand.
    feed = {
        "age": np.array([r["age"] for r in rows], np.float32),
        "hours": np.array([r.get("hours", [40.0]) for r in rows], np.float32),
        "extra": np.array([r.get("extra", [0.0, 0.0, 0.0]) for r in rows], np.float32),
        "country": np.array([r.get("country", [0]) for r in rows], np.int64),
    }
    session = ort.InferenceSession(CENSUS_ONNX, providers=["CPUExecutionProvider"])
    want_p, want_v = session.run(["probabilities", "value"], feed)
    loaded = tf.saved_model.load(dest)
    sig = loaded.signatures
    diffs = {}
    for name in ("classification", "serving_default"):
        out = sig[name](inputs=serialized)
        diffs[f"{name} scores"] = np.max(np.abs(out["scores"].numpy() - want_p))
        classes = out["classes"].numpy()
        if classes.shape != (n, 3) or any(list(r) != CENSUS_CLASSES for r in classes):
            raise SystemExit(f"{CENSUS}/1 {name}: classes {classes!r}")
    diffs["regression outputs"] = np.max(
        np.abs(sig["regression"](inputs=serialized)["outputs"].numpy() - want_v)
    )
    out = sig["predict"](examples=serialized)
    diffs["predict probabilities"] = np.max(np.abs(out["probabilities"].numpy() - want_p))
    diffs["predict value"] = np.max(np.abs(out["value"].numpy() - want_v))
    diff = float(max(diffs.values()))
    print(f"check {CENSUS}/1: max abs diff vs onnxruntime = {diff:.3g}")
    if not diff <= TOLERANCE:
        raise SystemExit(f"{CENSUS}/1 differs from ONNX Runtime: {diffs} (> {TOLERANCE})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--no-check", action="store_true", help="skip the ONNX Runtime comparison")
    args = parser.parse_args()
    for version in VERSIONS:
        dest = build(args.out_dir, version)
        if not args.no_check:
            check(dest, version)
    dest = build_census(args.out_dir)
    if not args.no_check:
        check_census(dest)


if __name__ == "__main__":
    sys.exit(main())
