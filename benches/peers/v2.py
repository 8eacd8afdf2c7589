"""KServe v2 gRPC ModelInfer helpers for check.py and probe.py.

The request is the one the Rust benches send (benches/kserve.rs): model
"mlp", one input "x" FP32 [rows, 64] carried in raw_input_contents, values
sin(0.37 i). It is encoded once and sent as bytes on a raw grpcio channel,
so every peer receives identical bytes. The message classes come from
whichever copy of the v2 proto (package `inference`) the venv has:
kserve's, tritonclient's or MLServer's.
"""

import math

import numpy as np

METHOD = "/inference.GRPCInferenceService/ModelInfer"


def messages():
    try:
        from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    except ImportError:
        try:
            from tritonclient.grpc import service_pb2 as pb
        except ImportError:
            from mlserver.grpc import dataplane_pb2 as pb
    return pb


def inputs(rows: int = 1) -> np.ndarray:
    return np.array(
        [math.sin(i * 0.37) for i in range(rows * 64)], dtype=np.float32
    ).reshape(rows, 64)


def request_bytes(rows: int = 1, model: str = "mlp") -> bytes:
    pb = messages()
    req = pb.ModelInferRequest(model_name=model)
    tensor = req.inputs.add()
    tensor.name, tensor.datatype = "x", "FP32"
    tensor.shape.extend([rows, 64])
    req.raw_input_contents.append(inputs(rows).tobytes())
    return req.SerializeToString()


def model_infer(channel):
    ident = lambda b: b  # noqa: E731
    return channel.unary_unary(METHOD, request_serializer=ident, response_deserializer=ident)


def output(response: bytes, name: str = "logits", form: list = None) -> np.ndarray:
    """The named output as a float32 array, from raw_output_contents or
    fp32_contents, whichever the peer answered in (appended to `form`)."""
    pb = messages()
    resp = pb.ModelInferResponse.FromString(response)
    for i, out in enumerate(resp.outputs):
        if out.name != name:
            continue
        if out.datatype != "FP32":
            raise ValueError(f"output {name} is {out.datatype}, not FP32")
        if len(resp.raw_output_contents) > i:
            data = np.frombuffer(resp.raw_output_contents[i], dtype="<f4")
            kind = "raw_output_contents"
        else:
            data = np.array(out.contents.fp32_contents, dtype=np.float32)
            kind = "fp32_contents"
        if form is not None:
            form.append(kind)
        return data.reshape(list(out.shape))
    raise ValueError(f"no output {name} in {[o.name for o in resp.outputs]}")
