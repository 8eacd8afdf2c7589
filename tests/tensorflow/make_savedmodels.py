#!/usr/bin/env python3
"""Builds the SavedModels sluice's TensorFlow backend is tested with, and
what TensorFlow's own Python API answers for each, for the tests to compare
against.

Models (TF Serving's layout, OUT_DIR/NAME/VERSION/saved_model.pb):
  keras_mlp/1  a Keras MLP (Dense 16 relu, Dense 3) exported with
               `model.export`: `features` float32 [None, 8] in.
  keras_mlp/2  the same architecture, other weights (a version switch).
  vocab/1      a tf.Module with a StaticHashTable vocabulary: `words`
               string [None] in; `ids` int64 [None] (unknown words -1) and
               `upper` string [None] (the words upper-cased) out.
  multi/1      a tf.Module with several signatures: serving_default
               (`x` float32 [None, 4] -> `doubled`), `total` (`x` ->
               `sum` float32 [None]), `scaled` (`x`, `factor` float32
               [] -> `y`).
  dtypes/1     one input and one output of each dtype TF Serving serves
               besides float32/string: float64, float16, bfloat16, int8,
               int16, int32, int64, uint8, uint16, uint32, uint64, bool.
  complex/1    complex64 and complex128 in and out: serving_default
               (`c64` complex64 [None, 2] and `c128` complex128 [None, 2]
               in; `times_i` (c64 × i), `conjugate` (of c128) and
               `magnitude` (|c64|, float32) out), and `from_parts` (`re`,
               `im` float32 [None] in, `z` complex64 out).
  resource/1   a signature that returns a resource handle (refused by
               name at load).
  lookup/1     a StaticHashTable alone: `words` string [None] in; `ids`
               int64 [None] (unknown words -1) and `score` float32 [None]
               (ids / 4) out (vocab/1 also upper-cases, an op whose ONNX
               form needs a locale).
  hashed/1     `words` string [None] hashed into 1000 buckets
               (StringToHashBucketFast, an op tf2onnx cannot convert
               without its contrib ops): `sluice model twin` refuses it.

OUT_DIR/expected.json holds, per model, every signature as TensorFlow's
MetaGraphDef declares it (what `saved_model_cli show` prints) and cases:
inputs and the outputs TensorFlow computed for them, running the loaded
SavedModel's signature functions in process.

Usage: make_savedmodels.py OUT_DIR
Run through scripts/setup, which provides the pinned tensorflow-cpu in
.cache/tf-venv.
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from tensorflow.python.tools import saved_model_utils

DTYPES = {
    "float64": tf.float64,
    "float16": tf.float16,
    "bfloat16": tf.bfloat16,
    "int8": tf.int8,
    "int16": tf.int16,
    "int32": tf.int32,
    "int64": tf.int64,
    "uint8": tf.uint8,
    "uint16": tf.uint16,
    "uint32": tf.uint32,
    "uint64": tf.uint64,
    "bool": tf.bool,
}


def keras_mlp(path, seed):
    tf.keras.utils.set_random_seed(seed)
    inputs = tf.keras.Input(shape=(8,), name="features", dtype="float32")
    hidden = tf.keras.layers.Dense(16, activation="relu")(inputs)
    outputs = tf.keras.layers.Dense(3, name="scores")(hidden)
    model = tf.keras.Model(inputs, outputs)
    model.export(path, verbose=False)


class Vocab(tf.Module):
    def __init__(self):
        super().__init__()
        keys = tf.constant(["apple", "banana", "cherry", "durian"])
        values = tf.constant([10, 20, 30, 40], dtype=tf.int64)
        self.table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(keys, values), -1)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="words")])
    def serve(self, words):
        return {"ids": self.table.lookup(words), "upper": tf.strings.upper(words)}


class Multi(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def doubled(self, x):
        return {"doubled": x * 2.0}

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def total(self, x):
        return {"sum": tf.reduce_sum(x, axis=1)}

    @tf.function(
        input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x"), tf.TensorSpec([], tf.float32, name="factor")]
    )
    def scaled(self, x, factor):
        return {"y": x * factor}


def dtypes_module():
    specs = [tf.TensorSpec([None, 3], dtype, name=name) for name, dtype in DTYPES.items()]

    class Dtypes(tf.Module):
        @tf.function(input_signature=specs)
        def serve(self, *args):
            out = {}
            for (name, dtype), value in zip(DTYPES.items(), args):
                if dtype == tf.bool:
                    out["not_" + name] = tf.logical_not(value)
                elif dtype.is_floating:
                    out["twice_" + name] = value * tf.constant(2, dtype)
                else:
                    out["plus_" + name] = value + tf.constant(1, dtype)
            return out

    return Dtypes()


class Complex(tf.Module):
    @tf.function(
        input_signature=[
            tf.TensorSpec([None, 2], tf.complex64, name="c64"),
            tf.TensorSpec([None, 2], tf.complex128, name="c128"),
        ]
    )
    def serve(self, c64, c128):
        return {
            "times_i": c64 * tf.constant(1j, tf.complex64),
            "conjugate": tf.math.conj(c128),
            "magnitude": tf.abs(c64),
        }

    @tf.function(
        input_signature=[tf.TensorSpec([None], tf.float32, name="re"), tf.TensorSpec([None], tf.float32, name="im")]
    )
    def from_parts(self, re, im):
        return {"z": tf.complex(re, im)}


class Resource(tf.Module):
    def __init__(self):
        super().__init__()
        self.v = tf.Variable([1.0, 2.0])

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def serve(self, x):
        return {"handle": self.v.handle, "y": x + 1.0}


class Lookup(Vocab):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="words")])
    def serve(self, words):
        ids = self.table.lookup(words)
        return {"ids": ids, "score": tf.cast(ids, tf.float32) / 4.0}


class Hashed(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="words")])
    def serve(self, words):
        return {"bucket": tf.strings.to_hash_bucket_fast(words, 1000)}


def signatures_of(path):
    meta = saved_model_utils.get_meta_graph_def(path, "serve")
    out = {}
    for key, sig in meta.signature_def.items():
        def infos(m):
            return {
                alias: {
                    "name": info.name,
                    "dtype": int(info.dtype),
                    "shape": None if info.tensor_shape.unknown_rank else [d.size for d in info.tensor_shape.dim],
                }
                for alias, info in m.items()
            }

        out[key] = {"method_name": sig.method_name, "inputs": infos(sig.inputs), "outputs": infos(sig.outputs)}
    return out


def encode(value):
    """A tensor as JSON: dtype name, shape, values (strings as text,
    16-bit floats as float32 numbers)."""
    array = value.numpy()
    dtype = value.dtype.name
    if value.dtype == tf.string:
        values = [v.decode("utf-8") for v in array.reshape(-1)]
    elif value.dtype in (tf.float16, tf.bfloat16):
        values = [float(v) for v in tf.cast(value, tf.float32).numpy().reshape(-1)]
    elif value.dtype == tf.bool:
        values = [bool(v) for v in array.reshape(-1)]
    elif value.dtype.is_complex:
        # (real, imaginary) pairs, flattened, as scomplex_val carries them.
        values = [float(part) for v in array.reshape(-1) for part in (v.real, v.imag)]
    elif value.dtype.is_floating:
        values = [float(v) for v in array.reshape(-1)]
    else:
        values = [int(v) for v in array.reshape(-1)]
    return {"dtype": dtype, "shape": list(array.shape), "values": values}


def cases(path, signature, inputs_list):
    fn = tf.saved_model.load(path).signatures[signature]
    out = []
    for inputs in inputs_list:
        outputs = fn(**inputs)
        out.append(
            {
                "signature": signature,
                "inputs": {k: encode(v) for k, v in inputs.items()},
                "outputs": {k: encode(v) for k, v in outputs.items()},
            }
        )
    return out


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(7)
    expected = {}

    for version, seed in ((1, 1), (2, 2)):
        keras_mlp(os.path.join(out_dir, "keras_mlp", str(version)), seed)
    mlp_cases = []
    for version in (1, 2):
        path = os.path.join(out_dir, "keras_mlp", str(version))
        for rows in (1, 5):
            x = tf.constant(rng.standard_normal((rows, 8)).astype(np.float32))
            case = cases(path, "serving_default", [{"features": x}])[0]
            case["version"] = version
            mlp_cases.append(case)
    expected["keras_mlp"] = {"signatures": signatures_of(os.path.join(out_dir, "keras_mlp", "1")), "cases": mlp_cases}

    path = os.path.join(out_dir, "vocab", "1")
    vocab = Vocab()
    tf.saved_model.save(vocab, path, signatures={"serving_default": vocab.serve})
    expected["vocab"] = {
        "signatures": signatures_of(path),
        "cases": cases(
            path,
            "serving_default",
            [{"words": tf.constant(["banana", "kiwi", "apple", "", "durian"])}, {"words": tf.constant(["cherry"])}],
        ),
    }

    path = os.path.join(out_dir, "multi", "1")
    multi = Multi()
    tf.saved_model.save(
        multi, path, signatures={"serving_default": multi.doubled, "total": multi.total, "scaled": multi.scaled}
    )
    x = tf.constant(rng.standard_normal((3, 4)).astype(np.float32))
    expected["multi"] = {
        "signatures": signatures_of(path),
        "cases": cases(path, "serving_default", [{"x": x}])
        + cases(path, "total", [{"x": x}])
        + cases(path, "scaled", [{"x": x, "factor": tf.constant(-1.5)}]),
    }

    path = os.path.join(out_dir, "dtypes", "1")
    module = dtypes_module()
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    inputs = {}
    for name, dtype in DTYPES.items():
        if dtype == tf.bool:
            inputs[name] = tf.constant([[True, False, True], [False, False, True]])
        elif dtype.is_floating:
            inputs[name] = tf.cast(tf.constant([[0.5, -1.25, 3.0], [1e3, 0.0, -7.5]]), dtype)
        elif dtype.is_unsigned:
            inputs[name] = tf.constant([[0, 1, 2], [100, 7, 9]], dtype)
        else:
            inputs[name] = tf.constant([[-3, 0, 5], [100, -100, 9]], dtype)
    expected["dtypes"] = {"signatures": signatures_of(path), "cases": cases(path, "serving_default", [inputs])}

    path = os.path.join(out_dir, "complex", "1")
    module = Complex()
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve, "from_parts": module.from_parts})
    inputs = {
        "c64": tf.constant([[1 + 2j, -0.5 + 0j], [3 - 4j, 0 + 1.25j]], tf.complex64),
        "c128": tf.constant([[1e-3 + 2j, -7 - 1j], [0.1 + 0.2j, 5 + 0j]], tf.complex128),
    }
    parts = {"re": tf.constant([1.5, -2.0, 0.0]), "im": tf.constant([0.25, 0.0, -3.0])}
    expected["complex"] = {
        "signatures": signatures_of(path),
        "cases": cases(path, "serving_default", [inputs]) + cases(path, "from_parts", [parts]),
    }

    path = os.path.join(out_dir, "resource", "1")
    resource = Resource()
    tf.saved_model.save(resource, path, signatures={"serving_default": resource.serve})
    expected["resource"] = {"signatures": signatures_of(path), "cases": []}

    path = os.path.join(out_dir, "lookup", "1")
    lookup = Lookup()
    tf.saved_model.save(lookup, path, signatures={"serving_default": lookup.serve})
    expected["lookup"] = {
        "signatures": signatures_of(path),
        "cases": cases(path, "serving_default", [{"words": tf.constant(["banana", "kiwi", "apple"])}]),
    }

    path = os.path.join(out_dir, "hashed", "1")
    hashed = Hashed()
    tf.saved_model.save(hashed, path, signatures={"serving_default": hashed.serve})
    expected["hashed"] = {
        "signatures": signatures_of(path),
        "cases": cases(path, "serving_default", [{"words": tf.constant(["apple", "kiwi"])}]),
    }

    with open(os.path.join(out_dir, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
    print(f"built {', '.join(sorted(expected))} into {out_dir}")


if __name__ == "__main__":
    main()
