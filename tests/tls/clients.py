"""The official clients over TLS, for tests/tls.rs.

  python clients.py ADDR CASES

CASES is a JSON list of {"kind": "tfserving" | "triton", "ca": PATH,
"cert": PATH?, "key": PATH?}: TF Serving's Python client
(tensorflow-serving-api) or tritonclient's gRPC client (KServe v2), each
sending one MLP request over TLS (with a client certificate when cert and
key are given). Prints one JSON list, an answer per case:
{"ok": true, "first": <first logit>} or {"ok": false, "code": ..., "details": ...}.
One process for every case: importing TensorFlow takes seconds.
"""

import json
import sys

import numpy as np


def read(path):
    with open(path, "rb") as f:
        return f.read()


def tfserving(addr, ca, cert, key):
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    credentials = grpc.ssl_channel_credentials(
        root_certificates=read(ca),
        private_key=read(key) if key else None,
        certificate_chain=read(cert) if cert else None,
    )
    channel = grpc.secure_channel(addr, credentials)
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "mlp"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.full((1, 64), 0.5, dtype=np.float32)))
    try:
        response = stub.Predict(request, timeout=20)
    except grpc.RpcError as e:
        return {"ok": False, "code": e.code().name, "details": e.details()}
    return {"ok": True, "first": float(tf.make_ndarray(response.outputs["logits"]).flatten()[0])}


def triton(addr, ca, cert, key):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    try:
        client = grpcclient.InferenceServerClient(
            url=addr,
            ssl=True,
            root_certificates=ca,
            private_key=key,
            certificate_chain=cert,
        )
        x = grpcclient.InferInput("x", [1, 64], "FP32")
        x.set_data_from_numpy(np.full((1, 64), 0.5, dtype=np.float32))
        result = client.infer("mlp", [x], client_timeout=20)
    except InferenceServerException as e:
        return {"ok": False, "code": str(e.status()), "details": e.message()}
    return {"ok": True, "first": float(result.as_numpy("logits").flatten()[0])}


def main():
    addr, cases = sys.argv[1], json.loads(sys.argv[2])
    clients = {"tfserving": tfserving, "triton": triton}
    answers = [clients[c["kind"]](addr, c["ca"], c.get("cert"), c.get("key")) for c in cases]
    print(json.dumps(answers))


if __name__ == "__main__":
    main()
