#!/usr/bin/env python3
"""Generates the example ONNX models served by sluice's quickstart and tests.

Run through `scripts/gen-models`, which provides the pinned `onnx` and
`numpy` packages. Weights come from fixed seeds, so running it again
reproduces the committed files byte for byte.

Layout is TF Serving's: BASE/NAME/VERSION/model.onnx.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8


def save(model, base, name, version, check=True):
    # The checker insists on a shape for every value; a model of unknown
    # rank (as tf2onnx writes them) has none, and ONNX Runtime runs it.
    if check:
        onnx.checker.check_model(model)
    path = os.path.join(base, name, str(version), "model.onnx")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    onnx.save(model, path)
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def make_model(graph):
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="sluice-gen-models",
    )
    model.ir_version = IR_VERSION
    return model


def init(name, array):
    return numpy_helper.from_array(array, name=name)


def mlp(seed):
    """[batch,64] f32 -> Gemm 64x32 -> Relu -> Gemm 32x10 -> [batch,10]."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((64, 32)) * 0.2).astype(np.float32)
    b1 = (rng.standard_normal(32) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((32, 10)) * 0.2).astype(np.float32)
    b2 = (rng.standard_normal(10) * 0.1).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["a1"]),
        helper.make_node("Gemm", ["a1", "w2", "b2"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [init("w1", w1), init("b1", b1), init("w2", w2), init("b2", b2)],
    )
    return make_model(graph)


def cnn(seed):
    """[batch,3,32,32] f32 -> 2x(Conv3x3 + Relu + MaxPool2) -> Gemm -> [batch,10].

    Large enough (about 5.6 M multiply-adds per image) that compute, not
    serving overhead, dominates at batch 32.
    """
    rng = np.random.default_rng(seed)
    c1 = (rng.standard_normal((32, 3, 3, 3)) * 0.2).astype(np.float32)
    c1b = (rng.standard_normal(32) * 0.05).astype(np.float32)
    c2 = (rng.standard_normal((64, 32, 3, 3)) * 0.06).astype(np.float32)
    c2b = (rng.standard_normal(64) * 0.05).astype(np.float32)
    fc = (rng.standard_normal((64 * 8 * 8, 10)) * 0.02).astype(np.float32)
    fcb = (rng.standard_normal(10) * 0.05).astype(np.float32)
    conv = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    pool = dict(kernel_shape=[2, 2], strides=[2, 2])
    nodes = [
        helper.make_node("Conv", ["image", "c1", "c1b"], ["x1"], **conv),
        helper.make_node("Relu", ["x1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], **pool),
        helper.make_node("Conv", ["p1", "c2", "c2b"], ["x2"], **conv),
        helper.make_node("Relu", ["x2"], ["r2"]),
        helper.make_node("MaxPool", ["r2"], ["p2"], **pool),
        helper.make_node("Flatten", ["p2"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "fc", "fcb"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [init("c1", c1), init("c1b", c1b), init("c2", c2), init("c2b", c2b),
         init("fc", fc), init("fcb", fcb)],
    )
    return make_model(graph)


def recommender(seed):
    """Two inputs of two dtypes: dense [batch,13] f32 and ids [batch,4] int64.

    ids index an embedding table of 1000 rows x 8 (Gather); the embeddings
    are flattened, joined with the dense features and scored by a small MLP
    ending in a sigmoid: score [batch,1].
    """
    rng = np.random.default_rng(seed)
    table = (rng.standard_normal((1000, 8)) * 0.3).astype(np.float32)
    w1 = (rng.standard_normal((13 + 32, 16)) * 0.2).astype(np.float32)
    b1 = (rng.standard_normal(16) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((16, 1)) * 0.3).astype(np.float32)
    b2 = np.zeros(1, dtype=np.float32)
    flat_shape = np.array([0, 32], dtype=np.int64)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0),
        helper.make_node("Reshape", ["emb", "flat_shape"], ["emb_flat"]),
        helper.make_node("Concat", ["dense", "emb_flat"], ["joined"], axis=1),
        helper.make_node("Gemm", ["joined", "w1", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["a1"]),
        helper.make_node("Gemm", ["a1", "w2", "b2"], ["z"]),
        helper.make_node("Sigmoid", ["z"], ["score"]),
    ]
    graph = helper.make_graph(
        nodes,
        "recommender",
        [
            helper.make_tensor_value_info("dense", TensorProto.FLOAT, ["batch", 13]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 4]),
        ],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch", 1])],
        [init("table", table), init("w1", w1), init("b1", b1), init("w2", w2),
         init("b2", b2), init("flat_shape", flat_shape)],
    )
    return make_model(graph)


def census(seed):
    """A tabular model of four named inputs, as a parsed tf.Example gives
    them: age [batch,1] f32, hours [batch,1] f32, extra [batch,3] f32 and
    country [batch,1] int64.

    country is cast to float and joined with the others ([batch,6]); one
    Gemm 6x3 + Softmax gives probabilities [batch,3], another Gemm 6x1
    gives value [batch,1]. A test fixture for Classify, Regress and
    MultiInference: weights ~ N(0, 0.03), so for age 18..90, hours 0..80,
    extra -1..1 and country 0..5 the softmax is far from saturated.
    """
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((6, 3)) * 0.03).astype(np.float32)
    b = (rng.standard_normal(3) * 0.03).astype(np.float32)
    v = (rng.standard_normal((6, 1)) * 0.03).astype(np.float32)
    c = (rng.standard_normal(1) * 0.03).astype(np.float32)
    nodes = [
        helper.make_node("Cast", ["country"], ["country_f"], to=TensorProto.FLOAT),
        helper.make_node("Concat", ["age", "hours", "extra", "country_f"], ["x"], axis=1),
        helper.make_node("Gemm", ["x", "w", "b"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
        helper.make_node("Gemm", ["x", "v", "c"], ["value"]),
    ]
    graph = helper.make_graph(
        nodes,
        "census",
        [
            helper.make_tensor_value_info("age", TensorProto.FLOAT, ["batch", 1]),
            helper.make_tensor_value_info("hours", TensorProto.FLOAT, ["batch", 1]),
            helper.make_tensor_value_info("extra", TensorProto.FLOAT, ["batch", 3]),
            helper.make_tensor_value_info("country", TensorProto.INT64, ["batch", 1]),
        ],
        [
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 3]),
            helper.make_tensor_value_info("value", TensorProto.FLOAT, ["batch", 1]),
        ],
        [init("w", w), init("b", b), init("v", v), init("c", c)],
    )
    return make_model(graph)


DTYPES = [
    ("f32", TensorProto.FLOAT),
    ("f64", TensorProto.DOUBLE),
    ("f16", TensorProto.FLOAT16),
    ("i8", TensorProto.INT8),
    ("i16", TensorProto.INT16),
    ("i32", TensorProto.INT32),
    ("i64", TensorProto.INT64),
    ("u8", TensorProto.UINT8),
    ("u16", TensorProto.UINT16),
    ("u32", TensorProto.UINT32),
    ("u64", TensorProto.UINT64),
    ("b", TensorProto.BOOL),
    ("s", TensorProto.STRING),
]


def dtypes():
    """Identity for one input of every dtype ONNX Runtime serves: in_X -> out_X.

    A test fixture: it proves each dtype survives TensorProto -> ONNX Runtime
    -> TensorProto unchanged.
    """
    nodes, inputs, outputs = [], [], []
    for suffix, dtype in DTYPES:
        nodes.append(helper.make_node("Identity", [f"in_{suffix}"], [f"out_{suffix}"]))
        inputs.append(helper.make_tensor_value_info(f"in_{suffix}", dtype, ["batch", "n"]))
        outputs.append(helper.make_tensor_value_info(f"out_{suffix}", dtype, ["batch", "n"]))
    return make_model(helper.make_graph(nodes, "dtypes", inputs, outputs))


def unshared():
    """Two inputs with no batch dimension in common: a [2] and b [n].

    a_twice = 2a ([2]); b_mean = the mean of b ([1]). A test fixture: a
    request is run exactly as sent, never padded to another input's rows
    (padding b to a's 2 rows once changed b_mean silently).
    """
    two = init("two", np.array([2.0], dtype=np.float32))
    nodes = [
        helper.make_node("Mul", ["a", "two"], ["a_twice"]),
        helper.make_node("ReduceMean", ["b"], ["b_mean"], keepdims=1),
    ]
    graph = helper.make_graph(
        nodes,
        "unshared",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n"]),
        ],
        [
            helper.make_tensor_value_info("a_twice", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("b_mean", TensorProto.FLOAT, [1]),
        ],
        [two],
    )
    return make_model(graph)


def anyrank():
    """An input of unknown rank (no shape at all, as tf2onnx writes models
    converted from TensorSpec(None)): y = x + 1, any rank."""
    one = init("one", np.array(1.0, dtype=np.float32))
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["y"])],
        "anyrank",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [one],
    )
    return make_model(graph)


def tfjson():
    """y = x (floats, any of them non-finite) and s_bytes = s (strings): a
    fixture for TF Serving's JSON, which writes outputs named *_bytes as
    {"b64": ...} and non-finite floats as NaN / Infinity / -Infinity."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Identity", ["s"], ["s_bytes"])],
        "tfjson",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("s", TensorProto.STRING, ["batch"]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("s_bytes", TensorProto.STRING, ["batch"]),
        ],
    )
    return make_model(graph)


def zipmap():
    """probabilities = ZipMap(x): a classifier's probabilities as one
    {class: probability} map per row, as skl2onnx and onnxmltools write
    classifiers by default; sluice refuses it, naming the converter option
    that writes a tensor instead."""
    maps = helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, []))
    )
    graph = helper.make_graph(
        [helper.make_node("ZipMap", ["x"], ["probabilities"], domain="ai.onnx.ml", classlabels_int64s=[0, 1, 2])],
        "zipmap",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_value_info("probabilities", maps)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("ai.onnx.ml", 1)]
    )
    model.ir_version = IR_VERSION
    return model


def ranker(seed, hidden):
    """features [N,16] f32 -> score [N,1]: one linear layer (hidden=0, a
    coarse ranker) or Gemm 16xH -> Relu -> Gemm Hx1 (a fine ranker)."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    if hidden == 0:
        inits += [init("w", (rng.standard_normal((16, 1)) * 0.3).astype(np.float32)),
                  init("b", np.zeros(1, dtype=np.float32))]
        nodes.append(helper.make_node("Gemm", ["features", "w", "b"], ["score"]))
    else:
        inits += [init("w1", (rng.standard_normal((16, hidden)) * 0.3).astype(np.float32)),
                  init("b1", (rng.standard_normal(hidden) * 0.1).astype(np.float32)),
                  init("w2", (rng.standard_normal((hidden, 1)) * 0.3).astype(np.float32)),
                  init("b2", np.zeros(1, dtype=np.float32))]
        nodes += [helper.make_node("Gemm", ["features", "w1", "b1"], ["h"]),
                  helper.make_node("Relu", ["h"], ["a"]),
                  helper.make_node("Gemm", ["a", "w2", "b2"], ["score"])]
    graph = helper.make_graph(
        nodes,
        "ranker",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch", 1])],
        inits,
    )
    return make_model(graph)


def tower(seed, width, name):
    """A two-tower model's tower: NAME [N,width] f32 -> Gemm widthx16 -> Tanh
    -> embedding [N,16]."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((width, 16)) * 0.3).astype(np.float32)
    b = (rng.standard_normal(16) * 0.1).astype(np.float32)
    nodes = [helper.make_node("Gemm", [name, "w", "b"], ["h"]), helper.make_node("Tanh", ["h"], ["embedding"])]
    graph = helper.make_graph(
        nodes,
        "tower",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", 16])],
        [init("w", w), init("b", b)],
    )
    return make_model(graph)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    examples = os.path.join(root, "examples", "models")
    fixtures = os.path.join(root, "tests", "fixtures", "models")
    save(mlp(1), examples, "mlp", 1)
    save(mlp(2), examples, "mlp", 2)
    # A third MLP, for tests that need three versions with different answers.
    save(mlp(5), fixtures, "mlp", 3)
    save(cnn(3), examples, "cnn", 1)
    # A second CNN, for benchmarks that switch versions of one shape.
    save(cnn(6), fixtures, "cnn", 2)
    save(recommender(4), examples, "recommender", 1)
    # Models joined in graph pipelines: a ranking cascade and an ensemble
    # (the two rankers) and a two-tower retrieval model.
    save(ranker(8, 0), examples, "ranker_coarse", 1)
    save(ranker(9, 64), examples, "ranker_fine", 1)
    save(tower(10, 8, "user"), examples, "user_tower", 1)
    save(tower(11, 12, "item"), examples, "item_tower", 1)
    save(dtypes(), fixtures, "dtypes", 1)
    save(unshared(), fixtures, "unshared", 1)
    save(anyrank(), fixtures, "anyrank", 1, check=False)
    save(tfjson(), fixtures, "tfjson", 1)
    save(census(7), fixtures, "census", 1)
    save(zipmap(), fixtures, "zipmap", 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
