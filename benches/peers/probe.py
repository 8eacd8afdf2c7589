"""Closed-loop ModelInfer load probe: a sanity check, not the measurement
(the Rust load generator makes that). N requests in flight on one grpc.aio
channel, for S seconds (at most 5), all sending the same pre-encoded
request (MLP, raw_input_contents, FP32 [1,64]); prints req/s.

    python benches/peers/probe.py GRPC_ADDR [--concurrency N] [--seconds S]

Runs in any venv with grpcio, numpy and a copy of the v2 proto (kserve's,
tritonclient's or MLServer's). The Python client is itself CPU-bound on a
small machine, so the figure is a lower bound for the server.
"""

import argparse
import asyncio
import os
import sys
import time

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import v2  # noqa: E402


async def run(addr: str, concurrency: int, seconds: float):
    request = v2.request_bytes(1)
    async with grpc.aio.insecure_channel(addr) as channel:
        ident = lambda b: b  # noqa: E731
        infer = channel.unary_unary(
            v2.METHOD, request_serializer=ident, response_deserializer=ident
        )
        v2.output(await infer(request, timeout=10))  # warm-up, and a sanity parse
        done = 0
        errors = 0
        deadline = time.monotonic() + seconds

        async def worker():
            nonlocal done, errors
            while time.monotonic() < deadline:
                try:
                    await infer(request, timeout=10)
                    done += 1
                except grpc.aio.AioRpcError:
                    errors += 1

        start = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done, errors, time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("addr")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    seconds = min(args.seconds, 5.0)
    done, errors, elapsed = asyncio.run(run(args.addr, args.concurrency, seconds))
    print(
        f"probe {args.addr}: {done / elapsed:.0f} req/s "
        f"({done} ok, {errors} errors, {args.concurrency} in flight, {elapsed:.1f} s)"
    )


if __name__ == "__main__":
    main()
