"""Calls sluice's Predict with TF Serving's official Python client
(tensorflow-serving-api's PredictionServiceStub, tensors made by
tf.make_tensor_proto, answers read by tf.make_ndarray) for every case of
expected.json, which TensorFlow's Python API computed by running each
SavedModel in process (tests/tensorflow/make_savedmodels.py), and compares:
exactly for integers, booleans and strings, floats to rtol 1e-6.

usage: predict_client.py HOST:PORT EXPECTED_JSON MODEL...
Prints one JSON line: {"cases": N, "passed": N, "failures": [...]}.
"""
import json
import sys

import grpc
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

DTYPES = {
    "float32": tf.float32, "float64": tf.float64, "float16": tf.float16, "bfloat16": tf.bfloat16,
    "int8": tf.int8, "int16": tf.int16, "int32": tf.int32, "int64": tf.int64,
    "uint8": tf.uint8, "uint16": tf.uint16, "uint32": tf.uint32, "uint64": tf.uint64,
    "bool": tf.bool, "string": tf.string, "complex64": tf.complex64, "complex128": tf.complex128,
}


def tensor(described):
    """A JSON-described tensor as a client builds it: an array of its dtype."""
    dtype, shape, values = described["dtype"], described["shape"], described["values"]
    if dtype.startswith("complex"):
        # (real, imaginary) pairs, flattened.
        values = [complex(r, i) for r, i in zip(values[0::2], values[1::2])]
    if dtype == "string":
        values = [v.encode() for v in values]
    return tf.make_tensor_proto(tf.reshape(tf.constant(values, dtype=DTYPES[dtype]), shape))


def flat(array, dtype):
    """An answer's values in expected.json's form."""
    values = np.asarray(array).reshape(-1)
    if dtype.startswith("complex"):
        return [float(x) for v in values for x in (v.real, v.imag)]
    if dtype == "string":
        return [v.decode() for v in values]
    if dtype == "bool":
        return [bool(v) for v in values]
    return [float(v) for v in values]


def same(got, want, dtype):
    if dtype.startswith("float") or dtype == "bfloat16" or dtype.startswith("complex"):
        return len(got) == len(want) and np.allclose(got, want, rtol=1e-6, atol=1e-7)
    return got == [type(g)(w) for g, w in zip(got, want)] and len(got) == len(want)


def main(target, expected_path, *models):
    expected = json.load(open(expected_path))
    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(target))
    cases = passed = 0
    failures = []
    for model in models:
        for case in expected[model]["cases"]:
            cases += 1
            what = f"{model} v{case.get('version')} {case['signature']}"
            request = predict_pb2.PredictRequest()
            request.model_spec.name = model
            request.model_spec.signature_name = case["signature"]
            if case.get("version") is not None:
                request.model_spec.version.value = case["version"]
            for name, described in case["inputs"].items():
                request.inputs[name].CopyFrom(tensor(described))
            try:
                response = stub.Predict(request, timeout=30)
            except grpc.RpcError as e:
                failures.append(f"{what}: {e.code()} {e.details()}")
                continue
            wrong = []
            if set(response.outputs) != set(case["outputs"]):
                wrong.append(f"outputs {sorted(response.outputs)} != {sorted(case['outputs'])}")
            for name, want in case["outputs"].items():
                if name not in response.outputs:
                    continue
                proto = response.outputs[name]
                array = tf.make_ndarray(proto)
                if list(array.shape) != want["shape"]:
                    wrong.append(f"{name}: shape {list(array.shape)} != {want['shape']}")
                if tf.dtypes.as_dtype(proto.dtype) != DTYPES[want["dtype"]]:
                    wrong.append(f"{name}: dtype {tf.dtypes.as_dtype(proto.dtype).name} != {want['dtype']}")
                got = flat(array, want["dtype"])
                if not same(got, want["values"], want["dtype"]):
                    wrong.append(f"{name}: {got} != {want['values']}")
            if wrong:
                failures.append(f"{what}: " + "; ".join(wrong))
            else:
                passed += 1
    print(json.dumps({"cases": cases, "passed": passed, "failures": failures}))


if __name__ == "__main__":
    main(*sys.argv[1:])
