//! TF Serving's REST `:classify` and `:regress`: a body of `examples` (and
//! an optional `context`), each an object of feature name to value — a
//! number, a string, `{"b64": …}`, or a list of them — turned into
//! `tf.Example`s by the kinds the model's `examples` config gives its
//! features, run through `api::examples`, and answered as TF Serving does:
//! `{"result": [[["label", score], …], …]}` or `{"result": [value, …]}`.
//!
//! Numbers take the kind of the feature they fill, so `41` fills a float
//! feature (TF Serving would read it as an int64 list and refuse it);
//! features the parse does not read are ignored, as TensorFlow ignores
//! them. Every error names the example and the feature.

use base64::Engine;
use bytes::Bytes;
use prost::Message;
use serde_json::{json, Value};

use crate::api::context::RequestContext;
use crate::api::examples::{self, Task, TaskResult};
use crate::config::examples::FeatureKind;
use crate::error::{Error, Result};
use crate::models::VersionChoice;
use crate::pipeline::Endpoints;
use crate::proto::tensorflow::Example;
use crate::tensor::example::{bytes_feature, example, float_feature, int64_feature, ExampleBatch, ExampleColumns};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Answers one `:classify` or `:regress` body.
pub(super) async fn answer(
    cx: &mut RequestContext,
    endpoints: &Endpoints,
    choice: VersionChoice<'_>,
    task: Task,
    body: &[u8],
    max_json_values: usize,
) -> Result<Vec<u8>> {
    crate::tensor::json::check_json_bounds(body, max_json_values, "server.max_json_values")?;
    let request: Value = crate::tensor::json::parse(body)
        .map_err(|e| Error::invalid_argument(format!("the request body is not valid JSON: {e}")))?;
    let Value::Object(mut request) = request else {
        return Err(Error::invalid_argument("the request body is not a JSON object; send {\"examples\": [...]}"));
    };
    let signature_name = match request.remove("signature_name") {
        None => String::new(),
        Some(Value::String(name)) => name,
        Some(other) => {
            return Err(Error::invalid_argument(format!("\"signature_name\" is {other}; expected a string")))
        }
    };
    let target = cx.resolve(endpoints, choice, "")?;
    let signature = task.check_signature(&target, &signature_name)?;
    // A SavedModel's own signature parses the examples in its graph, so
    // the kinds come from the JSON, as TF Serving takes them; otherwise
    // from the examples config.
    let columns = match crate::api::examples::graph_signatures(&target) {
        Some(_) => None,
        None => Some(target.examples(task.call())?),
    };
    let Some(Value::Array(rows)) = request.remove("examples") else {
        return Err(Error::invalid_argument(
            "the request has no \"examples\" list; send {\"examples\": [{\"feature\": value, ...}, ...]}",
        ));
    };
    if let Some(columns) = columns {
        columns.check_count(rows.len())?;
    }
    let convert = |value: &Value, what: &str| match columns {
        Some(columns) => to_example(columns, value, what),
        None => to_example_by_json(value, what),
    };
    // Serialized, as gRPC clients send them: one parse serves both.
    let serialized = |example: Example| Bytes::from(example.encode_to_vec());
    let examples = rows
        .iter()
        .enumerate()
        .map(|(i, row)| convert(row, &format!("examples[{i}]")).map(serialized))
        .collect::<Result<Vec<Bytes>>>()?;
    let context = request.remove("context").map(|c| convert(&c, "context").map(serialized)).transpose()?;
    let batch = ExampleBatch { examples: &examples, context: context.as_ref() };
    let mut results =
        examples::run(&target, batch, &[task], std::slice::from_ref(&signature), cx.deadline, cx.priority()?).await?;
    let _encode = crate::pipeline::trace::current_step("encode").entered();
    let result = match results.pop() {
        Some(TaskResult::Classification(result)) => Value::Array(
            result
                .classifications
                .into_iter()
                .map(|c| Value::Array(c.classes.into_iter().map(|class| json!([class.label, class.score])).collect()))
                .collect(),
        ),
        Some(TaskResult::Regression(result)) => {
            Value::Array(result.regressions.into_iter().map(|r| json!(r.value)).collect())
        }
        None => return Err(Error::internal("the task answered nothing, this is a bug")),
    };
    serde_json::to_vec(&json!({ "result": result }))
        .map_err(|e| Error::internal(format!("writing the response failed: {e}")))
}

/// One example object as a `tf.Example`, each feature the parse reads in
/// its kind; `what` names it in errors.
fn to_example(columns: &ExampleColumns, value: &Value, what: &str) -> Result<Example> {
    let Value::Object(map) = value else {
        return Err(Error::invalid_argument(format!(
            "{what} is not an object; each example is {{\"feature\": value, ...}}"
        )));
    };
    let features = map
        .iter()
        .filter_map(|(name, value)| columns.feature_kind(name).map(|kind| (name, value, kind)))
        .map(|(name, value, kind)| {
            let what = format!("{what}.{name}");
            Ok((name.clone(), feature(value, kind, &what)?))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(example(features))
}

/// One example object as a `tf.Example` whose feature kinds come from the
/// JSON, as TF Serving's REST API reads them for a SavedModel: strings and
/// `{"b64": …}` are a bytes_list, whole numbers (no decimal point) an
/// int64_list, any other number a float_list (a list with one such is
/// floats throughout).
fn to_example_by_json(value: &Value, what: &str) -> Result<Example> {
    let Value::Object(map) = value else {
        return Err(Error::invalid_argument(format!(
            "{what} is not an object; each example is {{\"feature\": value, ...}}"
        )));
    };
    let features = map
        .iter()
        .map(|(name, value)| {
            let values: &[Value] = match value {
                Value::Array(values) => values,
                one => std::slice::from_ref(one),
            };
            let kind = if values.iter().any(|v| v.is_string() || v.is_object()) {
                FeatureKind::Bytes
            } else if values.iter().all(|v| v.is_i64() || v.is_u64()) {
                FeatureKind::Int64
            } else {
                FeatureKind::Float
            };
            let what = format!("{what}.{name}");
            Ok((name.clone(), feature(value, kind, &what)?))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(example(features))
}

/// A feature value (one value or a flat list) as a `tf.train.Feature` of
/// `kind`.
fn feature(value: &Value, kind: FeatureKind, what: &str) -> Result<crate::proto::tensorflow::Feature> {
    let values: &[Value] = match value {
        Value::Array(values) => values,
        one => std::slice::from_ref(one),
    };
    let bad = |i: usize, v: &Value, expected: &str| {
        Error::invalid_argument(format!("{what}: value {i} is {v}; the feature takes {expected}"))
    };
    Ok(match kind {
        FeatureKind::Float => float_feature(
            values
                .iter()
                .enumerate()
                .map(|(i, v)| v.as_f64().map(|f| f as f32).ok_or_else(|| bad(i, v, "numbers (a float_list)")))
                .collect::<Result<_>>()?,
        ),
        FeatureKind::Int64 => int64_feature(
            values
                .iter()
                .enumerate()
                .map(|(i, v)| v.as_i64().ok_or_else(|| bad(i, v, "whole numbers (an int64_list)")))
                .collect::<Result<_>>()?,
        ),
        FeatureKind::Bytes => bytes_feature(
            values
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) => Ok(Bytes::copy_from_slice(s.as_bytes())),
                    Value::Object(map) if map.len() == 1 => match map.get("b64") {
                        Some(Value::String(text)) => B64.decode(text).map(Bytes::from).map_err(|e| {
                            Error::invalid_argument(format!("{what}: value {i} has invalid base64 ({e})"))
                        }),
                        _ => Err(bad(i, v, "strings or {\"b64\": \"<base64>\"} (a bytes_list)")),
                    },
                    other => Err(bad(i, other, "strings or {\"b64\": \"<base64>\"} (a bytes_list)")),
                })
                .collect::<Result<_>>()?,
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_config_the_json_says_the_kind_as_tf_serving_reads_it() {
        let example = to_example_by_json(
            &json!({"age": 41.5, "country": 3, "mixed": [1, 2.5], "name": "x", "raw": {"b64": "Yg=="}}),
            "examples[0]",
        )
        .expect("example");
        let expected = super::example([
            ("age".to_string(), float_feature(vec![41.5])),
            ("country".to_string(), int64_feature(vec![3])),
            ("mixed".to_string(), float_feature(vec![1.0, 2.5])),
            ("name".to_string(), bytes_feature(vec![Bytes::from("x")])),
            ("raw".to_string(), bytes_feature(vec![Bytes::from("b")])),
        ]);
        assert_eq!(example, expected);
        let err = to_example_by_json(&json!({"age": [1, true]}), "examples[3]").unwrap_err();
        assert!(err.message().contains("examples[3].age: value 1 is true"), "{err}");
    }

    #[test]
    fn values_take_the_feature_kind() {
        let f = feature(&json!(41), FeatureKind::Float, "examples[0].age").expect("float");
        assert_eq!(f, float_feature(vec![41.0]));
        let f = feature(&json!([1, 2]), FeatureKind::Int64, "x").expect("ints");
        assert_eq!(f, int64_feature(vec![1, 2]));
        let f = feature(&json!(["a", {"b64": "Yg=="}]), FeatureKind::Bytes, "x").expect("bytes");
        assert_eq!(f, bytes_feature(vec![Bytes::from("a"), Bytes::from("b")]));
        let err = feature(&json!([1.5]), FeatureKind::Int64, "examples[2].country").unwrap_err();
        assert!(
            err.message().contains("examples[2].country: value 0 is 1.5; the feature takes whole numbers"),
            "{err}"
        );
        let err = feature(&json!("x"), FeatureKind::Float, "examples[1].age").unwrap_err();
        assert!(err.message().contains("examples[1].age: value 0 is \"x\""), "{err}");
        let err = feature(&json!({"b64": "%%"}), FeatureKind::Bytes, "e").unwrap_err();
        assert!(err.message().contains("invalid base64"), "{err}");
    }
}
