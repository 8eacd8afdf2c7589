#!/usr/bin/env python3
"""Calls a TF Serving gRPC endpoint (tests/tfserving/upstream.py, a real
tensorflow_model_server, or sluice in front of either) with the official
tensorflow-serving-api stubs and prints what comes back: for debugging.

Usage: probe.py HOST:PORT [--model_name mlp] [--onnx_base examples/models]

Predict results are compared with ONNX Runtime running
ONNX_BASE/NAME/VERSION/model.onnx on the same input (max abs difference);
then GetModelMetadata, GetModelStatus, and each error case, printed as
`case: CODE: message`.
"""
import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import grpc
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def predict_request(name, x, version=None, label=None, input_name="x", output_filter=()):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    if version is not None:
        request.model_spec.version.value = version
    if label is not None:
        request.model_spec.version_label = label
    request.inputs[input_name].CopyFrom(tf.make_tensor_proto(x))
    request.output_filter.extend(output_filter)
    return request


def onnx_logits(onnx_base, name, version, x):
    import onnxruntime as ort

    path = os.path.join(onnx_base, name, str(version), "model.onnx")
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(["logits"], {"x": x})[0]


def call(label, fn, request):
    try:
        response = fn(request, timeout=30)
    except grpc.RpcError as e:
        print(f"{label}: {e.code().name}: {e.details()!r}")
        return None
    return response


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address")
    parser.add_argument("--model_name", default="mlp")
    parser.add_argument("--onnx_base", default=os.path.join(ROOT, "examples", "models"))
    args = parser.parse_args()
    name = args.model_name

    channel = grpc.insecure_channel(args.address)
    predict = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    models = model_service_pb2_grpc.ModelServiceStub(channel)
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)

    for spec in [dict(), dict(version=1), dict(version=2), dict(label="stable"), dict(label="canary")]:
        response = call(f"predict {spec}", predict.Predict, predict_request(name, x, **spec))
        if response is None:
            continue
        got = tf.make_ndarray(response.outputs["logits"])
        version = response.model_spec.version.value
        fields = [f.name for f, _ in response.outputs["logits"].ListFields()]
        diff = float(np.max(np.abs(got - onnx_logits(args.onnx_base, name, version, x))))
        print(f"predict {spec}: OK: model_spec={{name: {response.model_spec.name!r}, "
              f"version: {version}, signature_name: {response.model_spec.signature_name!r}}} "
              f"logits shape {list(got.shape)} fields {fields}; max abs diff vs onnxruntime "
              f"{name}/{version} = {diff:.3g}")

    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = name
    request.metadata_field.append("signature_def")
    response = call("metadata", predict.GetModelMetadata, request)
    if response is not None:
        any_ = response.metadata["signature_def"]
        defs = get_model_metadata_pb2.SignatureDefMap()
        any_.Unpack(defs)
        print(f"metadata: OK: model_spec={{name: {response.model_spec.name!r}, "
              f"version: {response.model_spec.version.value}}} type_url {any_.type_url!r} "
              f"signatures {sorted(defs.signature_def)}")
        print("metadata serving_default:", defs.signature_def["serving_default"])

    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = name
    response = call("status", models.GetModelStatus, request)
    if response is not None:
        print("status: OK:", [(s.version, get_model_status_pb2.ModelVersionStatus.State.Name(s.state),
                                s.status.error_code, s.status.error_message)
                               for s in response.model_version_status])

    print("-- error cases")
    cases = [
        ("wrong model name", predict_request("nope", x)),
        ("wrong model name, version 1", predict_request("nope", x, version=1)),
        ("unknown version 7", predict_request(name, x, version=7)),
        ("unknown label 'beta'", predict_request(name, x, label="beta")),
        ("wrong input name 'y'", predict_request(name, x, input_name="y")),
        ("wrong inner dimension [3,63]", predict_request(name, x[:, :63])),
        ("rank 1 input [64]", predict_request(name, x[0])),
        ("int32 input", predict_request(name, x.astype(np.int32))),
        ("unknown output_filter", predict_request(name, x, output_filter=["probs"])),
    ]
    extra = predict_request(name, x)
    extra.inputs["y"].CopyFrom(tf.make_tensor_proto(x))
    cases.append(("extra input 'y'", extra))
    empty = predict_pb2.PredictRequest()
    empty.model_spec.name = name
    cases.append(("no inputs", empty))
    bad_sig = predict_request(name, x)
    bad_sig.model_spec.signature_name = "predict"
    cases.append(("unknown signature_name", bad_sig))
    for label, request in cases:
        if call(label, predict.Predict, request) is not None:
            print(f"{label}: OK (unexpected)")

    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = "nope"
    request.metadata_field.append("signature_def")
    call("metadata wrong model name", predict.GetModelMetadata, request)
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = name
    request.metadata_field.append("bogus")
    call("metadata field 'bogus'", predict.GetModelMetadata, request)
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "nope"
    call("status wrong model name", models.GetModelStatus, request)
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = name
    request.model_spec.version.value = 7
    call("status unknown version 7", models.GetModelStatus, request)
    return 0


if __name__ == "__main__":
    sys.exit(main())
