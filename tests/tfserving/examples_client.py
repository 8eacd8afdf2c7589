#!/usr/bin/env python3
"""TF Serving's Classify, Regress, MultiInference and Predict on tf.Example
inputs, as the official client sees them, against a running sluice.

A Rust integration test runs it with .cache/tf-venv/bin/python:

  examples_client.py --grpc HOST:PORT --rest http://HOST:PORT \\
                     --model census --savedmodel DIR/census/1

sluice serves the census ONNX fixture (tests/fixtures/models/census/1); DIR
is the TF SavedModel of the same weights that tests/tfserving/
make_savedmodels.py builds (.cache/tf-savedmodels). Requests are built with
the official tensorflow_serving.apis modules, tf.train.Example and
tf.make_tensor_proto only; REST goes through urllib. The expected answers
come from the SavedModel itself, loaded in-process and called on the same
serialized examples, so the reference is TensorFlow's own parsing (required
`age`; defaults for `hours`, `extra`, `country`) and TF Serving's output
format.

Cases (each prints `ok CASE` or `FAIL CASE: DETAIL`):
  classify_list       Classify, no signature_name, 16 examples, some missing
                      optional features; response model_spec echoed with
                      signature_name "serving_default"
  classify_context    ExampleListWithContext; an example's own feature wins
                      over the context's (TF Serving concatenates the
                      serialized context and example)
  regress             Regress, signature "regression"
  multi               MultiInference: a classify and a regress task
  predict_examples    Predict (no signature_name: sluice parses the
                      `examples` input in front of its serving_default
                      signature) with a string tensor of serialized
                      examples; compared with the SavedModel's "predict"
                      signature, which takes the same input
  rest_classify       POST :classify, TF Serving's JSON (with and without
  rest_regress        a context); POST :regress
  error_*             gRPC status code and words of the message for a
                      missing required feature, a wrong feature type, a
                      wrong feature length, an empty example list, an
                      unknown model

The last line is `examples_client: N cases ok`; the exit code is 1 if any
case failed.

--cases A,B runs only those cases (the SavedModel served by sluice's own
TensorFlow backend answers the gRPC ones that do not need its examples
config).

--self-check (no --grpc / --rest needed) runs every case against an
in-process stand-in server (gRPC and REST on 127.0.0.1) that answers from
the SavedModel, to prove the requests, expectations and comparisons work
without sluice.
"""
import argparse
import json
import os
import sys
import threading
import urllib.error
import urllib.request
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import grpc
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import (
    classification_pb2,
    inference_pb2,
    input_pb2,
    model_pb2,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

TIMEOUT_S = 30
RTOL, ATOL = 1e-5, 1e-6
CLASSIFY = "tensorflow/serving/classify"
REGRESS = "tensorflow/serving/regress"
INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
# The census model's tf.Example features and their kinds.
KINDS = {"age": "float", "hours": "float", "extra": "float", "country": "int64"}


class Failure(Exception):
    """A case's answer differs from what TF Serving would give."""


def check(condition, detail):
    if not condition:
        raise Failure(detail)


def check_close(what, got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    check(got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}")
    if not np.allclose(got, want, rtol=RTOL, atol=ATOL):
        diff = np.max(np.abs(got - want))
        raise Failure(f"{what}: max abs diff {diff:.3g}; got {got.tolist()}, expected {want.tolist()}")


# ---------------------------------------------------------------- examples


def feature(name, values):
    """A tf.train.Feature of KINDS[name]; a Feature passes through."""
    if isinstance(values, tf.train.Feature):
        return values
    if KINDS[name] == "int64":
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))
    return tf.train.Feature(float_list=tf.train.FloatList(value=[float(v) for v in values]))


def example(features):
    """A tf.train.Example of {name: list of values or tf.train.Feature}."""
    return tf.train.Example(
        features=tf.train.Features(feature={k: feature(k, v) for k, v in features.items()})
    )


def random_examples(rng, n):
    """n examples; some omit hours, some extra, some country (defaults apply)."""
    examples = []
    for i in range(n):
        features = {"age": [rng.uniform(18, 90)]}
        if i % 3 != 1:
            features["hours"] = [rng.uniform(0, 80)]
        if i % 4 != 2:
            features["extra"] = rng.uniform(-1, 1, 3)
        if i % 5 != 3:
            features["country"] = [rng.integers(0, 6)]
        examples.append(example(features))
    return examples


def serialize(examples, context=None):
    """What TF Serving feeds the model: each example's bytes, after the
    context's when there is one (so the example's features win)."""
    prefix = context.SerializeToString() if context is not None else b""
    return [prefix + e.SerializeToString() for e in examples]


def example_input(examples, context=None):
    inp = input_pb2.Input()
    if context is None:
        inp.example_list.SetInParent()
        inp.example_list.examples.extend(examples)
    else:
        inp.example_list_with_context.context.CopyFrom(context)
        inp.example_list_with_context.examples.extend(examples)
    return inp


def spec(model, signature=None):
    s = model_pb2.ModelSpec(name=model)
    if signature is not None:
        s.signature_name = signature
    return s


# ---------------------------------------------------------------- expected


class SavedModel:
    """The census SavedModel, called on serialized examples."""

    def __init__(self, path):
        self.loaded = tf.saved_model.load(path)
        self.signatures = self.loaded.signatures

    def run(self, signature, serialized, key="inputs"):
        return self.signatures[signature](**{key: tf.constant(serialized, dtype=tf.string)})

    def classify(self, serialized, signature="classification"):
        """(labels [N][3] as str, scores [N,3])."""
        out = self.run(signature, serialized)
        labels = [[c.decode() for c in row] for row in out["classes"].numpy()]
        return labels, out["scores"].numpy()

    def regress(self, serialized):
        return self.run("regression", serialized)["outputs"].numpy().reshape(-1)

    def rejects(self, serialized):
        try:
            self.run("classification", serialized)
        except tf.errors.InvalidArgumentError:
            return True
        return False


def check_spec(got, model, signature):
    check(got.name == model, f"model_spec.name = {got.name!r}, expected {model!r}")
    check(
        got.signature_name == signature,
        f"model_spec.signature_name = {got.signature_name!r}, expected {signature!r}",
    )


def check_classification(result, labels, scores):
    got = result.classifications
    check(len(got) == len(labels), f"{len(got)} classifications, expected {len(labels)}")
    for i, classes in enumerate(got):
        got_labels = [c.label for c in classes.classes]
        check(got_labels == labels[i], f"classifications[{i}] labels {got_labels}, expected {labels[i]}")
        check_close(f"classifications[{i}] scores", [c.score for c in classes.classes], scores[i])


def check_regression(result, values):
    got = [r.value for r in result.regressions]
    check(len(got) == len(values), f"{len(got)} regressions, expected {len(values)}")
    check_close("regressions", got, values)


# ---------------------------------------------------------------- cases


class Context:
    def __init__(self, stub, rest, model, saved_model):
        self.stub, self.rest, self.model, self.sm = stub, rest, model, saved_model

    def post(self, verb, body):
        request = urllib.request.Request(
            f"{self.rest}/v1/models/{self.model}:{verb}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as e:
            raise Failure(f"HTTP {e.code}: {e.read().decode(errors='replace')}") from None


def case_classify_list(ctx):
    examples = random_examples(np.random.default_rng(1), 16)
    labels, scores = ctx.sm.classify(serialize(examples))
    request = classification_pb2.ClassificationRequest(
        model_spec=spec(ctx.model), input=example_input(examples)
    )
    response = ctx.stub.Classify(request, timeout=TIMEOUT_S)
    check_spec(response.model_spec, ctx.model, "serving_default")
    check_classification(response.result, labels, scores)


def case_classify_context(ctx):
    rng = np.random.default_rng(2)
    context = example({"country": [4], "hours": [12.5]})
    examples = []
    for i in range(8):
        features = {"age": [rng.uniform(18, 90)], "extra": rng.uniform(-1, 1, 3)}
        if i == 5:
            features["hours"] = [71.0]  # overrides the context's 12.5
        examples.append(example(features))
    serialized = serialize(examples, context)
    labels, scores = ctx.sm.classify(serialized)
    # The concatenation really does let the example win.
    merged = ctx.sm.classify([e.SerializeToString() for e in merged_examples(context, examples)])
    check(np.allclose(merged[1], scores), "context + example bytes differ from merged features")
    request = classification_pb2.ClassificationRequest(
        model_spec=spec(ctx.model, "classification"), input=example_input(examples, context)
    )
    response = ctx.stub.Classify(request, timeout=TIMEOUT_S)
    check_spec(response.model_spec, ctx.model, "classification")
    check_classification(response.result, labels, scores)


def merged_examples(context, examples):
    merged = []
    for e in examples:
        m = tf.train.Example()
        m.CopyFrom(context)
        for name, f in e.features.feature.items():
            m.features.feature[name].CopyFrom(f)
        merged.append(m)
    return merged


def case_regress(ctx):
    examples = random_examples(np.random.default_rng(3), 16)
    values = ctx.sm.regress(serialize(examples))
    request = regression_pb2.RegressionRequest(
        model_spec=spec(ctx.model, "regression"), input=example_input(examples)
    )
    response = ctx.stub.Regress(request, timeout=TIMEOUT_S)
    check_spec(response.model_spec, ctx.model, "regression")
    check_regression(response.result, values)


def case_multi(ctx):
    examples = random_examples(np.random.default_rng(4), 12)
    serialized = serialize(examples)
    labels, scores = ctx.sm.classify(serialized)
    values = ctx.sm.regress(serialized)
    request = inference_pb2.MultiInferenceRequest(
        tasks=[
            inference_pb2.InferenceTask(model_spec=spec(ctx.model, "classification"), method_name=CLASSIFY),
            inference_pb2.InferenceTask(model_spec=spec(ctx.model, "regression"), method_name=REGRESS),
        ],
        input=example_input(examples),
    )
    response = ctx.stub.MultiInference(request, timeout=TIMEOUT_S)
    check(len(response.results) == 2, f"{len(response.results)} results, expected 2")
    first, second = response.results
    check_spec(first.model_spec, ctx.model, "classification")
    check_spec(second.model_spec, ctx.model, "regression")
    check(first.WhichOneof("result") == "classification_result",
          f"results[0] holds {first.WhichOneof('result')}, expected classification_result")
    check(second.WhichOneof("result") == "regression_result",
          f"results[1] holds {second.WhichOneof('result')}, expected regression_result")
    check_classification(first.classification_result, labels, scores)
    check_regression(second.regression_result, values)


def case_predict_examples(ctx):
    examples = random_examples(np.random.default_rng(5), 10)
    serialized = serialize(examples)
    _, scores = ctx.sm.classify(serialized)
    values = ctx.sm.regress(serialized).reshape(-1, 1)
    request = predict_pb2.PredictRequest(model_spec=spec(ctx.model, ""))
    request.inputs["examples"].CopyFrom(tf.make_tensor_proto(serialized, dtype=tf.string))
    response = ctx.stub.Predict(request, timeout=TIMEOUT_S)
    check_spec(response.model_spec, ctx.model, "serving_default")
    for name in ("probabilities", "value"):
        check(name in response.outputs, f"no output {name!r} in {sorted(response.outputs)}")
    check_close("probabilities", tf.make_ndarray(response.outputs["probabilities"]), scores)
    check_close("value", tf.make_ndarray(response.outputs["value"]), values)


# TF Serving's JSON form of examples. Integers for the float features (age
# 41) check that sluice takes a JSON integer for a float feature; TF
# Serving's own parser makes it an int64_list, which the float feature
# then rejects.
REST_EXAMPLES = [
    {"age": 41, "hours": 38.5, "extra": [0.1, -0.2, 0.3], "country": 2},
    {"age": 63.5, "country": 1},
    {"age": 27, "extra": [-1, 0.5, 0.25]},
    {"age": 35.25, "hours": 60, "country": 5},
    {"age": [88], "hours": [0], "extra": [0.75, 0.75, -0.75], "country": [0]},
]
REST_CONTEXT = {"country": 3}


def json_example(features):
    """The tf.train.Example a JSON example stands for, by the model's kinds."""
    return example({k: v if isinstance(v, list) else [v] for k, v in features.items()})


def case_rest_classify(ctx):
    examples = [json_example(e) for e in REST_EXAMPLES]
    for context in (None, REST_CONTEXT):
        body = {"signature_name": "classification", "examples": REST_EXAMPLES}
        what = "without context"
        if context is not None:
            body["context"] = context
            what = "with context"
        serialized = serialize(examples, json_example(context) if context else None)
        labels, scores = ctx.sm.classify(serialized)
        answer = ctx.post("classify", body)
        check(isinstance(answer, dict) and "result" in answer, f"{what}: no 'result' in {answer}")
        result = answer["result"]
        check(len(result) == len(labels), f"{what}: {len(result)} results, expected {len(labels)}")
        for i, row in enumerate(result):
            check([c[0] for c in row] == labels[i], f"{what}: result[{i}] labels {row}, expected {labels[i]}")
            check_close(f"{what}: result[{i}] scores", [c[1] for c in row], scores[i])


def case_rest_regress(ctx):
    examples = [json_example(e) for e in REST_EXAMPLES]
    values = ctx.sm.regress(serialize(examples))
    answer = ctx.post("regress", {"signature_name": "regression", "examples": REST_EXAMPLES})
    check(isinstance(answer, dict) and "result" in answer, f"no 'result' in {answer}")
    check_close("result", answer["result"], values)


def expect_error(call, request, code, words):
    try:
        call(request, timeout=TIMEOUT_S)
    except grpc.RpcError as e:
        details = e.details() or ""
        check(e.code() == code, f"status {e.code().name} ({details!r}), expected {code.name}")
        missing = [w for w in words if w.lower() not in details.lower()]
        check(not missing, f"message {details!r} lacks {missing}")
        return
    raise Failure(f"succeeded, expected {code.name}")


def classify_request(ctx, examples, model=None):
    return classification_pb2.ClassificationRequest(
        model_spec=spec(model or ctx.model, "classification"), input=example_input(examples)
    )


def case_error_missing_age(ctx):
    examples = random_examples(np.random.default_rng(6), 4)
    del examples[2].features.feature["age"]
    check(ctx.sm.rejects(serialize(examples)), "the SavedModel accepts it")
    expect_error(ctx.stub.Classify, classify_request(ctx, examples), INVALID, ["age", "2"])


def case_error_age_bytes(ctx):
    bad = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"41"]))
    examples = [example({"age": [30.0]}), example({"age": bad})]
    check(ctx.sm.rejects(serialize(examples)), "the SavedModel accepts it")
    expect_error(ctx.stub.Classify, classify_request(ctx, examples), INVALID, ["age"])


def case_error_extra_length(ctx):
    examples = [example({"age": [30.0], "extra": [0.5, -0.5]})]
    check(ctx.sm.rejects(serialize(examples)), "the SavedModel accepts it")
    expect_error(ctx.stub.Classify, classify_request(ctx, examples), INVALID, ["extra"])


def case_error_empty(ctx):
    expect_error(ctx.stub.Classify, classify_request(ctx, []), INVALID, [])


def case_error_unknown_model(ctx):
    examples = [example({"age": [30.0]})]
    expect_error(ctx.stub.Classify, classify_request(ctx, examples, model="nope"), NOT_FOUND, [])


CASES = [
    ("classify_list", case_classify_list),
    ("classify_context", case_classify_context),
    ("regress", case_regress),
    ("multi", case_multi),
    ("predict_examples", case_predict_examples),
    ("rest_classify", case_rest_classify),
    ("rest_regress", case_rest_regress),
    ("error_missing_age", case_error_missing_age),
    ("error_age_bytes", case_error_age_bytes),
    ("error_extra_length", case_error_extra_length),
    ("error_empty_list", case_error_empty),
    ("error_unknown_model", case_error_unknown_model),
]


def run_cases(ctx, only=None):
    ok = 0
    cases = [(name, case) for name, case in CASES if only is None or name in only]
    for name, case in cases:
        try:
            case(ctx)
        except Failure as e:
            print(f"FAIL {name}: {e}", flush=True)
        except grpc.RpcError as e:
            print(f"FAIL {name}: {e.code().name}: {e.details()}", flush=True)
        except Exception as e:  # noqa: BLE001 - a broken case is a failed case
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
        else:
            ok += 1
            print(f"ok {name}", flush=True)
    failed = len(cases) - ok
    print(f"examples_client: {ok} cases ok" + (f", {failed} failed" if failed else ""), flush=True)
    return 1 if failed else 0


# ---------------------------------------------------------------- self-check
#
# A stand-in for the server, answering from the SavedModel as TF Serving
# answers from it, so --self-check exercises every request, expectation and
# comparison above without sluice.


class StandIn(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, model, sm):
        self.model, self.sm = model, sm

    def _signature(self, model_spec, context):
        if model_spec.name != self.model:
            context.abort(NOT_FOUND, f"Servable not found for request: Latest({model_spec.name})")
        return model_spec.signature_name or "serving_default"

    def _serialized(self, inp, context):
        kind = inp.WhichOneof("kind")
        if kind == "example_list":
            serialized = serialize(inp.example_list.examples)
        elif kind == "example_list_with_context":
            with_context = inp.example_list_with_context
            serialized = serialize(with_context.examples, with_context.context)
        else:
            serialized = []
        if not serialized:
            context.abort(INVALID, "Input is empty")
        return serialized

    def _run(self, signature, serialized, context, key="inputs"):
        try:
            return self.sm.run(signature, serialized, key)
        except tf.errors.InvalidArgumentError as e:
            bad = next(i for i in range(len(serialized)) if self.sm.rejects(serialized[i:i + 1]))
            context.abort(INVALID, f"example {bad}: {e.message}")

    def _result(self, out, method, response_result):
        if method == CLASSIFY:
            for labels, scores in zip(out["classes"].numpy(), out["scores"].numpy()):
                row = response_result.classifications.add()
                for label, score in zip(labels, scores):
                    row.classes.add(label=label.decode(), score=score)
        else:
            for value in out["outputs"].numpy().reshape(-1):
                response_result.regressions.add(value=value)

    def _answer(self, request, response, method, context):
        signature = self._signature(request.model_spec, context)
        out = self._run(signature, self._serialized(request.input, context), context)
        response.model_spec.CopyFrom(spec(self.model, signature))
        self._result(out, method, response.result)
        return response

    def Classify(self, request, context):
        return self._answer(request, classification_pb2.ClassificationResponse(), CLASSIFY, context)

    def Regress(self, request, context):
        return self._answer(request, regression_pb2.RegressionResponse(), REGRESS, context)

    def MultiInference(self, request, context):
        serialized = self._serialized(request.input, context)
        response = inference_pb2.MultiInferenceResponse()
        for task in request.tasks:
            signature = self._signature(task.model_spec, context)
            result = response.results.add(model_spec=spec(self.model, signature))
            out = self._run(signature, serialized, context)
            field = "classification_result" if task.method_name == CLASSIFY else "regression_result"
            self._result(out, task.method_name, getattr(result, field))
        return response

    def Predict(self, request, context):
        signature = self._signature(request.model_spec, context)
        serialized = list(tf.make_ndarray(request.inputs["examples"]))
        # sluice's serving_default takes the examples as the SavedModel's
        # "predict" signature does.
        out = self._run("predict", serialized, context, key="examples")
        response = predict_pb2.PredictResponse(model_spec=spec(self.model, signature))
        for name, value in out.items():
            response.outputs[name].CopyFrom(tf.make_tensor_proto(value.numpy()))
        return response


def stand_in_rest(model, sm):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            context = json_example(body["context"]) if "context" in body else None
            serialized = serialize([json_example(e) for e in body["examples"]], context)
            signature = body.get("signature_name", "serving_default")
            if self.path == f"/v1/models/{model}:classify":
                labels, scores = sm.classify(serialized, signature)
                result = [[[l, float(s)] for l, s in zip(ls, ss)] for ls, ss in zip(labels, scores)]
            else:
                result = [float(v) for v in sm.regress(serialized)]
            data = json.dumps({"result": result}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def self_check(model, sm):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(StandIn(model, sm), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    rest = stand_in_rest(model, sm)
    print(f"self-check: stand-in server on 127.0.0.1:{port} (gRPC), "
          f"127.0.0.1:{rest.server_address[1]} (REST)", flush=True)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            return run_cases(Context(stub, f"http://127.0.0.1:{rest.server_address[1]}", model, sm))
    finally:
        rest.shutdown()
        server.stop(None)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grpc", help="sluice's gRPC address, HOST:PORT")
    parser.add_argument("--rest", help="sluice's REST base URL, http://HOST:PORT")
    parser.add_argument("--model", default="census")
    parser.add_argument("--savedmodel", required=True, help="the census SavedModel, DIR/census/1")
    parser.add_argument("--cases", help="comma-separated case names to run (default: all)")
    parser.add_argument("--self-check", action="store_true",
                        help="run against an in-process stand-in server instead of sluice")
    args = parser.parse_args()
    sm = SavedModel(args.savedmodel)
    if args.self_check:
        return self_check(args.model, sm)
    if not args.grpc or not args.rest:
        parser.error("--grpc and --rest are required (or --self-check)")
    with grpc.insecure_channel(args.grpc) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        only = set(args.cases.split(",")) if args.cases else None
        return run_cases(Context(stub, args.rest.rstrip("/"), args.model, sm), only)


if __name__ == "__main__":
    sys.exit(main())
