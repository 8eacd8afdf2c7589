"""Drives sluice with the official KServe v2 / Triton Python clients
(tritonclient, gRPC and HTTP) for tests/kserve.rs.

Usage: clients.py CASES.json GRPC_ADDR HTTP_ADDR > REPORT.json

The Rust test writes the cases and asserts on the report; this script only
calls the server and writes down what the clients got, so every check
lives in one place. For each inference case it calls four ways:

- grpc_raw:    InferInput.set_data_from_numpy (raw_input_contents)
- grpc_typed:  a ModelInferRequest with typed InferTensorContents, sent
               through the client's own generated stub
- http_json:   JSON data in, JSON data out
- http_binary: the binary tensor extension both ways

and reports each output's datatype, shape and values (BYTES as base64),
or the error's code and message.
"""

import base64
import json
import sys

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

TYPED_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    # No typed form exists; sent as fp32 (a client's natural mistake), the
    # server must say to send raw contents.
    "FP16": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def array(tensor):
    """A case's input as the numpy array the clients take."""
    if tensor["datatype"] == "BYTES":
        values = [base64.b64decode(v) for v in tensor["data"]]
        return np.array(values, dtype=np.object_).reshape(tensor["shape"])
    return np.array(tensor["data"], dtype=triton_to_np_dtype(tensor["datatype"])).reshape(tensor["shape"])


def values(result_array, datatype):
    """An output's values, flat, as JSON can hold them."""
    flat = result_array.reshape(-1)
    if datatype == "BYTES":
        return [base64.b64encode(v if isinstance(v, bytes) else str(v).encode()).decode() for v in flat]
    if datatype == "BOOL":
        return [bool(v) for v in flat]
    return [v.item() for v in flat]


def error(e):
    if isinstance(e, grpc.RpcError):
        return {"ok": False, "code": str(e.code()), "message": e.details()}
    if isinstance(e, InferenceServerException):
        return {"ok": False, "code": str(e.status()), "message": e.message()}
    return {"ok": False, "code": type(e).__name__, "message": str(e)}


def outputs_of(result, names, datatypes):
    return {
        "ok": True,
        "outputs": {
            name: {
                "datatype": datatypes[name],
                "shape": list(result.as_numpy(name).shape),
                "data": values(result.as_numpy(name), datatypes[name]),
            }
            for name in names
        },
    }


def grpc_raw(client, case):
    inputs = []
    for tensor in case["inputs"]:
        given = grpcclient.InferInput(tensor["name"], tensor["shape"], tensor["datatype"])
        given.set_data_from_numpy(array(tensor))
        inputs.append(given)
    outputs = [grpcclient.InferRequestedOutput(name) for name in case["outputs"]] or None
    result = client.infer(case["model"], inputs, model_version=case["version"], outputs=outputs, request_id="case")
    response = result.get_response()
    assert response.id == "case", f"the request id came back as {response.id!r}"
    datatypes = {o.name: o.datatype for o in response.outputs}
    return outputs_of(result, [o.name for o in response.outputs], datatypes)


def grpc_typed(client, case):
    request = service_pb2.ModelInferRequest(model_name=case["model"], model_version=case["version"], id="typed")
    for tensor in case["inputs"]:
        given = request.inputs.add(name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"])
        field = getattr(given.contents, TYPED_FIELD[tensor["datatype"]])
        if tensor["datatype"] == "BYTES":
            field.extend(base64.b64decode(v) for v in tensor["data"])
        else:
            field.extend(tensor["data"])
    for name in case["outputs"]:
        request.outputs.add(name=name)
    response = client._client_stub.ModelInfer(request)
    result = grpcclient.InferResult(response)
    datatypes = {o.name: o.datatype for o in response.outputs}
    return outputs_of(result, [o.name for o in response.outputs], datatypes)


def http_call(client, case, binary):
    inputs = []
    for tensor in case["inputs"]:
        given = httpclient.InferInput(tensor["name"], tensor["shape"], tensor["datatype"])
        given.set_data_from_numpy(array(tensor), binary_data=binary)
        inputs.append(given)
    outputs = [httpclient.InferRequestedOutput(name, binary_data=binary) for name in case["outputs"]]
    if not outputs and not binary:
        # No outputs named: the client asks for binary ones; name them all
        # to get JSON.
        metadata = client.get_model_metadata(case["model"], model_version=case["version"])
        outputs = [httpclient.InferRequestedOutput(o["name"], binary_data=False) for o in metadata["outputs"]]
    result = client.infer(
        case["model"], inputs, model_version=case["version"], outputs=outputs or None, request_id="case"
    )
    response = result.get_response()
    assert response.get("id") == "case", f"the request id came back as {response.get('id')!r}"
    if not binary:
        assert all("data" in o for o in response["outputs"]), "JSON outputs were asked for"
    datatypes = {o["name"]: o["datatype"] for o in response["outputs"]}
    return outputs_of(result, [o["name"] for o in response["outputs"]], datatypes)


def attempt(call, *args):
    try:
        return call(*args)
    except Exception as e:  # noqa: BLE001 - every failure is reported
        return error(e)


def main():
    cases_path, grpc_addr, http_addr = sys.argv[1:4]
    with open(cases_path) as f:
        cases = json.load(f)
    grpc_client = grpcclient.InferenceServerClient(grpc_addr)
    http_client = httpclient.InferenceServerClient(http_addr)
    report = {
        "grpc": {
            "live": grpc_client.is_server_live(),
            "ready": grpc_client.is_server_ready(),
            "metadata": grpc_client.get_server_metadata(as_json=True),
        },
        "http": {
            "live": http_client.is_server_live(),
            "ready": http_client.is_server_ready(),
            "metadata": http_client.get_server_metadata(),
        },
        "models": {},
        "infer": [],
    }
    for name in cases["models"]:
        report["models"][name] = {
            "grpc_ready": grpc_client.is_model_ready(name),
            "http_ready": http_client.is_model_ready(name),
            "grpc": attempt(lambda: grpc_client.get_model_metadata(name, as_json=True)),
            "http": attempt(lambda: http_client.get_model_metadata(name)),
        }
    for case in cases["infer"]:
        entry = {
            "grpc_raw": attempt(grpc_raw, grpc_client, case),
            "http_binary": attempt(http_call, http_client, case, True),
        }
        if not case.get("raw_only"):
            entry["grpc_typed"] = attempt(grpc_typed, grpc_client, case)
            entry["http_json"] = attempt(http_call, http_client, case, False)
        report["infer"].append(entry)
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
