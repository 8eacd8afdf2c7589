#!/usr/bin/env python3
"""A Keras CNN of the benchmark CNN's size (examples/models/cnn: image
float32 [batch, 3, 32, 32] -> 2 x (Conv 3x3 + ReLU + MaxPool 2) with 32 and
64 filters -> Dense 10), exported as a SavedModel for benches/twin.rs.
The image comes in channels first, as the ONNX example takes it, and is
transposed for TensorFlow's CPU convolutions (channels last).

Usage: make_cnn.py OUT_DIR   (writes OUT_DIR/1/saved_model.pb)
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf

tf.keras.utils.set_random_seed(7)
image = tf.keras.Input(shape=(3, 32, 32), name="image", dtype="float32")
x = tf.keras.layers.Permute((2, 3, 1))(image)
x = tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu")(x)
x = tf.keras.layers.MaxPooling2D(2)(x)
x = tf.keras.layers.Conv2D(64, 3, padding="same", activation="relu")(x)
x = tf.keras.layers.MaxPooling2D(2)(x)
x = tf.keras.layers.Flatten()(x)
logits = tf.keras.layers.Dense(10, name="logits")(x)
tf.keras.Model(image, logits).export(os.path.join(sys.argv[1], "1"), verbose=False)
