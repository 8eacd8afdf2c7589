#!/usr/bin/env python3
"""Writes a TF Serving warmup file of Classify, Regress and MultiInference
records for the census model, the way TF Serving's documentation makes one
(tf.io.TFRecordWriter over PredictionLog records from the official
tensorflow_serving.apis modules), so a test can check that sluice replays a
file TF Serving would.

Usage: make_warmup.py OUT_FILE [--signature NAME]

Records, in order:
  0  classify_log: 3 examples in an ExampleList
  1  regress_log: 2 examples with a context (ExampleListWithContext),
     signature "regression"
  2  multi_inference_log: a classify task and a regress task on 2 examples

--signature NAME puts NAME as record 0's signature_name (a file that names
a signature the model lacks, to see the version refused).

Run with .cache/tf-venv/bin/python (tensorflow and tensorflow-serving-api).
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf
from tensorflow_serving.apis import (
    classification_pb2,
    inference_pb2,
    input_pb2,
    model_pb2,
    prediction_log_pb2,
    regression_pb2,
)


def person(age, hours=None, country=None):
    feature = {"age": tf.train.Feature(float_list=tf.train.FloatList(value=[age]))}
    if hours is not None:
        feature["hours"] = tf.train.Feature(float_list=tf.train.FloatList(value=[hours]))
    if country is not None:
        feature["country"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[country]))
    return tf.train.Example(features=tf.train.Features(feature=feature))


def listed(examples):
    inp = input_pb2.Input()
    inp.example_list.examples.extend(examples)
    return inp


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--signature", default=None)
    args = parser.parse_args()

    records = []
    classify = classification_pb2.ClassificationRequest(
        model_spec=model_pb2.ModelSpec(name="census"),
        input=listed([person(31.0, 40.0, 2), person(62.0), person(19.0, 12.5)]),
    )
    if args.signature is not None:
        classify.model_spec.signature_name = args.signature
    records.append(prediction_log_pb2.PredictionLog(classify_log=prediction_log_pb2.ClassifyLog(request=classify)))

    regress = regression_pb2.RegressionRequest(model_spec=model_pb2.ModelSpec(name="census", signature_name="regression"))
    regress.input.example_list_with_context.context.CopyFrom(person(0.0, 35.0))
    regress.input.example_list_with_context.examples.extend([person(44.0), person(27.0, 60.0)])
    records.append(prediction_log_pb2.PredictionLog(regress_log=prediction_log_pb2.RegressLog(request=regress)))

    multi = inference_pb2.MultiInferenceRequest(input=listed([person(50.0, 20.0, 1), person(23.0)]))
    multi.tasks.add(model_spec=model_pb2.ModelSpec(name="census", signature_name="classification"),
                    method_name="tensorflow/serving/classify")
    multi.tasks.add(model_spec=model_pb2.ModelSpec(name="census", signature_name="regression"),
                    method_name="tensorflow/serving/regress")
    records.append(
        prediction_log_pb2.PredictionLog(multi_inference_log=prediction_log_pb2.MultiInferenceLog(request=multi))
    )

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with tf.io.TFRecordWriter(args.out) as writer:
        for record in records:
            writer.write(record.SerializeToString())
    print(f"wrote {len(records)} records to {args.out}")


if __name__ == "__main__":
    main()
