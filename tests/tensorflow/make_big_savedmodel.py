#!/usr/bin/env python3
"""Builds a SavedModel that holds one large variable, for the TensorFlow
backend's load/unload memory benchmark (benches/tensorflow_memory.rs).

Usage: make_big_savedmodel.py OUT_DIR [--mib 50]

OUT_DIR/1 is the SavedModel: `x` float32 [None, 4] in, `y` float32
[None, 4] out, y = x * w[:4] + sum(w[4:8]), where w is a float32 variable
of MIB mebibytes (the part every load must read and every unload must
free). Run with .cache/tf-venv/bin/python.
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf


class Big(tf.Module):
    def __init__(self, mib):
        super().__init__()
        self.w = tf.Variable(tf.random.stateless_uniform([mib * 262144], seed=[1, 2]))

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def serve(self, x):
        return {"y": x * self.w[:4] + tf.reduce_sum(self.w[4:8])}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--mib", type=int, default=50)
    args = parser.parse_args()
    model = Big(args.mib)
    path = os.path.join(args.out, "1")
    tf.saved_model.save(model, path, signatures={"serving_default": model.serve})
    print(f"built a SavedModel with a {args.mib} MiB variable in {path}")


if __name__ == "__main__":
    main()
