"""Calls the example CNN through gRPC's own Python client (grpcio) and
prints, as JSON, how many calls ended with each status code and one
message per code.

    refused.py MODE TARGET WAVES WAVE

MODE `plain`: one channel to TARGET, retries off, so a refused stream is
seen as the client's own status. MODE `retry`: TARGET lists several
servers (`ipv4:127.0.0.1:A,127.0.0.1:B`), balanced round robin, with a
retry policy on UNAVAILABLE and RESOURCE_EXHAUSTED: what a fleet's
clients are configured with. WAVES waves of WAVE calls at once; in
`plain` mode each finished call is replaced at once, for at least one
second, so refusals stand without the pauses between waves (the server
pushes back only once it has refused for 100 ms without a pause, and on
a loaded machine the client's pause between waves can be longer than
the refusals of a wave).
"""

import json
import sys

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc


def main():
    mode, target, waves, wave = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if mode == "retry":
        config = {
            "loadBalancingConfig": [{"round_robin": {}}],
            "methodConfig": [{
                "name": [{"service": "inference.GRPCInferenceService"}],
                "retryPolicy": {
                    "maxAttempts": 5,
                    "initialBackoff": "0.01s",
                    "maxBackoff": "0.2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE", "RESOURCE_EXHAUSTED"],
                },
            }],
        }
        # The authority gRPC makes from an address list ("A,B") is no valid
        # :authority (hyper's HTTP/2 resets every stream of it with
        # PROTOCOL_ERROR): name one, as a DNS target would.
        options = [
            ("grpc.service_config", json.dumps(config)),
            ("grpc.enable_retries", 1),
            ("grpc.default_authority", "localhost"),
        ]
    else:
        options = [("grpc.enable_retries", 0)]
    channel = grpc.insecure_channel(target, options=options)
    grpc.channel_ready_future(channel).result(timeout=30)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    image = np.random.default_rng(1).random((1, 3, 32, 32), dtype=np.float32)
    request = service_pb2.ModelInferRequest(model_name="cnn")
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = "image", "FP32"
    tensor.shape.extend([1, 3, 32, 32])
    request.raw_input_contents.append(image.tobytes())
    codes, messages = {}, {}
    if mode == "plain":
        keep_in_flight(stub, request, waves * wave, wave, codes, messages)
        print(json.dumps({"codes": codes, "messages": messages}))
        return
    for _ in range(waves):
        calls = [stub.ModelInfer.future(request, timeout=30) for _ in range(wave)]
        for call in calls:
            try:
                call.result()
                code = "OK"
            except grpc.RpcError as error:
                code = error.code().name
                messages.setdefault(code, error.details())
            codes[code] = codes.get(code, 0) + 1
    print(json.dumps({"codes": codes, "messages": messages}))


def keep_in_flight(stub, request, total, in_flight, codes, messages):
    """At least `total` calls and one second of calls, `in_flight` at a
    time, each finished one replaced at once."""
    import threading
    import time

    lock = threading.Lock()
    deadline = time.monotonic() + 1.0
    sent = [0]

    def worker():
        while True:
            with lock:
                if sent[0] >= total and time.monotonic() >= deadline:
                    return
                sent[0] += 1
            try:
                stub.ModelInfer(request, timeout=30)
                code = "OK"
            except grpc.RpcError as error:
                code = error.code().name
                with lock:
                    messages.setdefault(code, error.details())
            with lock:
                codes[code] = codes.get(code, 0) + 1

    threads = [threading.Thread(target=worker) for _ in range(in_flight)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
