#!/usr/bin/env python3
"""A real TensorFlow upstream that speaks TF Serving's gRPC API, for tests.

sluice's tests start it as a subprocess and point sluice at it, to prove
that requests forwarded to a TF Serving backend come back right. It loads
SavedModels with TensorFlow itself and serves them through the servicer
classes of the official `tensorflow-serving-api` package, answering like
tensorflow_model_server does (same status codes, same messages, outputs as
typed repeated fields unless --enable_serialization_as_tensor_content):

- Predict: model_spec.name, then version or version_label ("stable" is the
  lowest loaded version, "canary" the highest; no choice = the highest),
  input names and dtypes checked against the serving_default signature,
  output_filter honoured; errors raised by TensorFlow while running (a
  wrong inner dimension, say) come back with TensorFlow's code and message.
- GetModelMetadata: metadata_field "signature_def" -> the SavedModel's
  SignatureDefMap packed in an Any.
- ModelService.GetModelStatus: AVAILABLE for each loaded version.

Usage:
  upstream.py --port 0 --model_base_path DIR/mlp --model_name mlp
              [--delay_ms N] [--fail_status_after N]
              [--enable_serialization_as_tensor_content]

It binds 127.0.0.1 (port 0 = a free one) and, once it serves, prints one
line to stdout: `upstream: serving gRPC on 127.0.0.1:PORT`. Everything else
goes to stderr. SIGTERM or SIGINT stops it.

--delay_ms N sleeps N ms in each Predict (for deadline tests).
--fail_status_after N answers UNAVAILABLE to every GetModelStatus after the
first N (for health-check ejection tests).
"""
import argparse
import logging
import os
import signal
import sys
import threading
from concurrent import futures

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import grpc
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

log = logging.getLogger("upstream")
SIGNATURE = "serving_default"
INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
# TF's error codes are gRPC's, number for number.
TF_TO_GRPC = {code.value[0]: code for code in grpc.StatusCode}
# TensorProto fields that Tensor::AsProtoField fills, by numpy dtype name.
PROTO_FIELDS = {
    "float32": "float_val", "float64": "double_val", "int32": "int_val",
    "int16": "int_val", "int8": "int_val", "uint8": "int_val",
    "uint16": "int_val", "int64": "int64_val", "uint32": "uint32_val",
    "uint64": "uint64_val", "bool": "bool_val", "object": "string_val",
}


class Abort(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code, self.message = code, message


def dtype_string(enum):
    """TF's DataTypeString: DT_FLOAT is "float", not "float32"."""
    name = tf.as_dtype(enum).name
    return {"float32": "float", "float64": "double", "float16": "half"}.get(name, name)


class Version:
    def __init__(self, number, path):
        self.number = number
        self.model = tf.saved_model.load(path)
        self.function = self.model.signatures[SIGNATURE]
        saved = saved_model_pb2.SavedModel()
        with open(os.path.join(path, "saved_model.pb"), "rb") as f:
            saved.ParseFromString(f.read())
        # What TF Serving hands out: the MetaGraphDef's signatures, all of them.
        self.signature_defs = saved.meta_graphs[0].signature_def
        self.signature = self.signature_defs[SIGNATURE]


class Models:
    def __init__(self, name, base_path):
        self.name = name
        self.versions = {}
        for entry in sorted(os.listdir(base_path)):
            path = os.path.join(base_path, entry)
            if entry.isdigit() and os.path.isfile(os.path.join(path, "saved_model.pb")):
                log.info("loading %s version %s from %s", name, entry, path)
                self.versions[int(entry)] = Version(int(entry), path)
        if not self.versions:
            raise SystemExit(f"upstream: no SavedModel versions under {base_path}")

    def lookup(self, spec):
        """ServerCore::ServableRequestFromModelSpec + GetServableHandle."""
        if not spec.name:
            raise Abort(INVALID, "ModelSpec has no name specified.")
        which = spec.WhichOneof("version_choice")
        if which == "version_label":
            labels = {"stable": min(self.versions), "canary": max(self.versions)}
            if spec.name != self.name or spec.version_label not in labels:
                raise Abort(INVALID, f"Unrecognized servable version label: {spec.version_label}")
            number = labels[spec.version_label]
            request = f"Specific({spec.name}, {number})"
        elif which == "version":
            number = spec.version.value
            request = f"Specific({spec.name}, {number})"
        else:
            number = max(self.versions)
            request = f"Latest({spec.name})"
        if spec.name != self.name or number not in self.versions:
            raise Abort(NOT_FOUND, f"Servable not found for request: {request}")
        return self.versions[number]


def to_proto(array, as_content):
    """Tensor::AsProtoField (TF Serving's default) or AsProtoTensorContent."""
    field = PROTO_FIELDS.get(array.dtype.name)
    if as_content or field is None:
        return tf.make_tensor_proto(array)
    proto = tensor_pb2.TensorProto(
        dtype=tf.as_dtype(array.dtype).as_datatype_enum,
        tensor_shape=tf.TensorShape(array.shape).as_proto(),
    )
    getattr(proto, field).extend(array.ravel().tolist())
    return proto


def convert_inputs(signature, request):
    """PreProcessPrediction's checks, with TF Serving's messages."""
    sent, wanted = set(request.inputs), set(signature.inputs)
    if len(sent) != len(wanted):
        raise Abort(INVALID, (
            f"input size does not match signature: {len(sent)}!={len(wanted)} "
            f"len({{{','.join(sorted(sent))}}}) != len({{{','.join(sorted(wanted))}}}). "
            f"Sent extra: {{{','.join(sorted(sent - wanted))}}}. "
            f"Missing but required: {{{','.join(sorted(wanted - sent))}}}."))
    inputs = {}
    for index, alias in enumerate(sorted(wanted)):
        info = signature.inputs[alias]
        if alias not in request.inputs:
            raise Abort(INVALID, (
                f"Signature input alias: {alias}(feed name: {info.name}) not found in request "
                f"and no default value provided. Inputs expected to be in the request "
                f"{{{','.join(sorted(sent))}}}, or default input alias set: "))
        proto = request.inputs[alias]
        try:
            array = tf.make_ndarray(proto)
        except Exception:  # noqa: BLE001 - any malformed proto is a parse error
            raise Abort(INVALID, f"tensor parsing error: {alias}") from None
        if proto.dtype != info.dtype:
            raise Abort(INVALID, (
                f"Expects arg[{index}] to be {dtype_string(info.dtype)} "
                f"but {dtype_string(proto.dtype)} is provided"))
        inputs[alias] = tf.constant(array)
    return inputs


def output_aliases(signature, request):
    if not request.output_filter:
        return sorted(signature.outputs)
    seen = []
    for alias in request.output_filter:
        if alias not in signature.outputs:
            raise Abort(INVALID, (
                f"output tensor alias not found in signature: {alias} Outputs expected "
                f"to be in the set {{{','.join(sorted(signature.outputs))}}}."))
        if alias in seen:
            raise Abort(INVALID, f"duplicate output tensor alias: {alias}")
        seen.append(alias)
    return seen


def rpc(method):
    """Turns Abort and TensorFlow's own errors into gRPC statuses."""

    def wrapped(self, request, context):
        try:
            return method(self, request, context)
        except Abort as e:
            log.info("%s: %s %s", method.__name__, e.code.name, e.message)
            context.abort(e.code, e.message)
        except tf.errors.OpError as e:
            log.info("%s: TensorFlow error %s: %s", method.__name__, e.error_code, e.message)
            context.abort(TF_TO_GRPC.get(e.error_code, grpc.StatusCode.UNKNOWN), e.message)

    wrapped.__name__ = method.__name__
    return wrapped


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, models, delay_ms, as_content):
        self.models, self.delay_s, self.as_content = models, delay_ms / 1000.0, as_content

    @rpc
    def Predict(self, request, context):
        if self.delay_s:
            # Wakes early when the caller gives up or the server stops.
            cancelled = threading.Event()
            context.add_callback(cancelled.set)
            cancelled.wait(self.delay_s)
            if not context.is_active():
                return predict_pb2.PredictResponse()
        if not request.HasField("model_spec"):
            raise Abort(INVALID, "Missing ModelSpec")
        version = self.models.lookup(request.model_spec)
        name = request.model_spec.signature_name or SIGNATURE
        if name not in version.signature_defs:
            raise Abort(grpc.StatusCode.FAILED_PRECONDITION,
                        f'Serving signature key "{name}" not found.')
        signature = version.signature
        inputs = convert_inputs(signature, request)
        aliases = output_aliases(signature, request)
        outputs = version.function(**inputs)
        response = predict_pb2.PredictResponse()
        response.model_spec.name = request.model_spec.name
        response.model_spec.version.value = version.number
        response.model_spec.signature_name = name
        for alias in aliases:
            response.outputs[alias].CopyFrom(to_proto(outputs[alias].numpy(), self.as_content))
        return response

    @rpc
    def GetModelMetadata(self, request, context):
        if not request.HasField("model_spec"):
            raise Abort(INVALID, "Missing ModelSpec")
        if not request.metadata_field:
            raise Abort(INVALID, "GetModelMetadataRequest must specify at least one metadata_field")
        for field in request.metadata_field:
            if field != "signature_def":
                raise Abort(INVALID, f"Metadata field {field} is not supported")
        version = self.models.lookup(request.model_spec)
        defs = get_model_metadata_pb2.SignatureDefMap()
        for key, signature in version.signature_defs.items():
            defs.signature_def[key].CopyFrom(signature)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = self.models.name
        response.model_spec.version.value = version.number
        response.metadata["signature_def"].Pack(defs)
        return response


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, models, fail_after):
        self.models, self.fail_after = models, fail_after
        self.calls, self.lock = 0, threading.Lock()

    @rpc
    def GetModelStatus(self, request, context):
        with self.lock:
            self.calls += 1
            calls = self.calls
        if self.fail_after is not None and calls > self.fail_after:
            raise Abort(grpc.StatusCode.UNAVAILABLE,
                        f"upstream: failing GetModelStatus after {self.fail_after} calls "
                        "(--fail_status_after)")
        if not request.HasField("model_spec"):
            raise Abort(INVALID, "Missing ModelSpec")
        spec, name = request.model_spec, request.model_spec.name
        known = self.models.versions if name == self.models.name else {}
        if spec.HasField("version"):
            if spec.version.value not in known:
                raise Abort(NOT_FOUND, f"Could not find version {spec.version.value} of model {name}")
            numbers = [spec.version.value]
        else:
            if not known:
                raise Abort(NOT_FOUND, f"Could not find any versions of model {name}")
            numbers = sorted(known, reverse=True)
        response = get_model_status_pb2.GetModelStatusResponse()
        for number in numbers:
            status = response.model_version_status.add()
            status.version = number
            status.state = get_model_status_pb2.ModelVersionStatus.AVAILABLE
            status.status.error_code = 0
        return response


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model_base_path", required=True)
    parser.add_argument("--model_name", required=True)
    parser.add_argument("--delay_ms", type=int, default=0)
    parser.add_argument("--fail_status_after", type=int, default=None)
    parser.add_argument("--enable_serialization_as_tensor_content", action="store_true")
    parser.add_argument("--ssl_cert", help="serve TLS with this certificate chain (PEM file)")
    parser.add_argument("--ssl_key", help="and this private key (PEM file)")
    parser.add_argument("--client_ca", help="require client certificates signed by this CA (PEM file)")
    args = parser.parse_args()
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="upstream %(asctime)s %(levelname)s %(message)s")

    models = Models(args.model_name, args.model_base_path)
    # No SO_REUSEPORT: a port that is taken must fail here, not be shared.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8),
                         options=[("grpc.so_reuseport", 0)])
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
        PredictionService(models, args.delay_ms, args.enable_serialization_as_tensor_content),
        server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(
        ModelService(models, args.fail_status_after), server)
    try:
        if args.ssl_cert:
            def read(path):
                with open(path, "rb") as f:
                    return f.read()
            credentials = grpc.ssl_server_credentials(
                [(read(args.ssl_key), read(args.ssl_cert))],
                root_certificates=read(args.client_ca) if args.client_ca else None,
                require_client_auth=bool(args.client_ca),
            )
            port = server.add_secure_port(f"127.0.0.1:{args.port}", credentials)
        else:
            port = server.add_insecure_port(f"127.0.0.1:{args.port}")
    except RuntimeError:
        port = 0
    if port == 0:
        raise SystemExit(f"upstream: cannot bind 127.0.0.1:{args.port}")

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    log.info("model %s versions %s", models.name, sorted(models.versions))
    print(f"upstream: serving gRPC on 127.0.0.1:{port}", flush=True)
    while not stop.wait(1):
        pass
    log.info("stopping")
    server.stop(grace=1).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
