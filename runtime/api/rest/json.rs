//! The JSON side of TF Serving's REST API: a predict body in row
//! (`instances`) or columnar (`inputs`) form decoded into tensors against
//! the signature, outputs written back as `predictions` or `outputs`, and
//! the status and metadata answers in TF Serving's (proto3 JSON) form.
//!
//! Every decoding error names the instance, the input and the value; the
//! checks that follow decoding are the ones gRPC requests get.

use serde_json::{json, Map, Value};

use super::ModelPath;
use crate::api::context::RequestContext;
use crate::error::{Error, Result};
use crate::models::VersionChoice;
use crate::pipeline::deadline::Deadline;
use crate::pipeline::priority::Priority;
use crate::pipeline::{status_of, Endpoints, Target, ValidRequest};
use crate::tensor::json::{flatten, tensor_from_leaves, JsonView};
use crate::tensor::spec::{Signature, TensorSpec};
use crate::tensor::{format_shape, tensor_bytes, DType, Tensor};

/// How the request's tensors were given; the answer uses the same form.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    /// `instances`: a list of rows, answered as `predictions`.
    Row,
    /// `inputs`: whole tensors, answered as `outputs`.
    Columnar,
}

pub(super) async fn predict(
    cx: &mut RequestContext,
    endpoints: &Endpoints,
    path: &ModelPath<'_>,
    body: &[u8],
    max_json_values: usize,
) -> Result<Vec<u8>> {
    crate::tensor::json::check_json_bounds(body, max_json_values, "server.max_json_values")?;
    let body = crate::tensor::json::accept_non_finite(body);
    let request: Value = crate::tensor::json::parse(&body)
        .map_err(|e| Error::invalid_argument(format!("the request body is not valid JSON: {e}")))?;
    let Value::Object(mut request) = request else {
        return Err(Error::invalid_argument(format!(
            "the request body is {}; expected a JSON object with \"instances\" or \"inputs\"",
            kind(&request)
        )));
    };
    let signature_name = match request.remove("signature_name") {
        None => String::new(),
        Some(Value::String(name)) => name,
        Some(other) => {
            return Err(Error::invalid_argument(format!("\"signature_name\" is {other}; expected a string")))
        }
    };
    let target = cx.resolve(endpoints, path.choice(), &signature_name)?;
    predict_on(&target, request, cx.deadline, cx.priority()?).await
}

async fn predict_on(
    target: &Target,
    mut request: Map<String, Value>,
    deadline: Deadline,
    priority: Priority,
) -> Result<Vec<u8>> {
    let (form, valid) = match (request.remove("instances"), request.remove("inputs")) {
        (Some(_), Some(_)) => {
            return Err(Error::invalid_argument(
                "the request has both \"instances\" and \"inputs\"; use one: \"instances\" (row form) or \"inputs\" (columnar form)",
            ))
        }
        (Some(instances), None) => (Form::Row, rows_to_request(target, &instances, deadline, priority)?),
        (None, Some(inputs)) => (Form::Columnar, columns_to_request(target, &inputs, deadline, priority)?),
        (None, None) => {
            return Err(Error::invalid_argument(
                "the request has neither \"instances\" nor \"inputs\"; send {\"instances\": [...]} or {\"inputs\": ...}",
            ))
        }
    };
    // Other top-level keys are ignored, as TF Serving ignores them.
    let outputs = valid.run().await?;
    crate::tensor::json::check_writable(outputs.iter().map(|(name, t)| (name.as_str(), t)))?;
    let _encode = crate::pipeline::trace::current_step("encode").entered();
    let written = match form {
        Form::Columnar => write_columnar(&outputs),
        Form::Row => write_rows(&outputs)?,
    };
    written.map_err(|e| Error::internal(format!("writing the response failed: {e}")))
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `inputs`: one tensor per input, or the bare tensor when the signature
/// has a single input.
fn columns_to_request(target: &Target, inputs: &Value, deadline: Deadline, priority: Priority) -> Result<ValidRequest> {
    let signature = target.signature();
    let named = match inputs {
        Value::Object(map) if !is_b64(map) => map.iter().map(|(k, v)| (k.as_str(), v)).collect::<Vec<_>>(),
        value => vec![(single_input(signature, "inputs")?.name.as_str(), value)],
    };
    let mut builder = target.request(named.iter().map(|(k, _)| *k), &[], deadline, priority)?;
    for (name, value) in named {
        let spec = input_spec(signature, name)?;
        let what = format!("input '{name}'");
        let (shape, leaves) = flatten(value, &what)?;
        builder.put(name, input_tensor(target, spec, shape, &leaves, &what)?)?;
    }
    builder.finish()
}

/// `instances`: a list of rows, each an object of inputs (or a bare value
/// when the signature has a single input), stacked along a new dimension 0.
fn rows_to_request(target: &Target, instances: &Value, deadline: Deadline, priority: Priority) -> Result<ValidRequest> {
    let signature = target.signature();
    let Value::Array(rows) = instances else {
        return Err(Error::invalid_argument(format!("\"instances\" is {}; expected a list of rows", kind(instances))));
    };
    if rows.is_empty() {
        return Err(Error::invalid_argument("\"instances\" is an empty list; send at least one row"));
    }
    let named_rows = matches!(&rows[0], Value::Object(map) if !is_b64(map));
    let mut columns: Vec<Column<'_>> = match &rows[0] {
        Value::Object(first) if named_rows => {
            first.keys().map(|k| Column { name: k.as_str(), row_shape: None, leaves: Vec::new() }).collect()
        }
        _ => vec![Column {
            name: single_input(signature, "instances")?.name.as_str(),
            row_shape: None,
            leaves: Vec::new(),
        }],
    };
    let mut builder = target.request(columns.iter().map(|c| c.name), &[], deadline, priority)?;
    for (i, row) in rows.iter().enumerate() {
        for Column { name, row_shape, leaves } in &mut columns {
            let value = match (named_rows, row) {
                (true, Value::Object(map)) => map.get(*name).ok_or_else(|| {
                    Error::invalid_argument(format!("instance {i} has no input '{name}', which instance 0 has"))
                })?,
                (true, other) => {
                    return Err(Error::invalid_argument(format!(
                    "instance {i} is {}, but instance 0 is an object of inputs; every instance must have the same form",
                    kind(other)
                )))
                }
                (false, value) => value,
            };
            let what = InstanceInput { instance: i, input: name };
            let (shape, row_leaves) = flatten(value, &what)?;
            match row_shape {
                None => *row_shape = Some(shape),
                Some(expected) if *expected != shape => {
                    return Err(Error::invalid_argument(format!(
                        "{what} has shape {}, but instance 0 has {}; every instance must have the same shape",
                        format_shape(&shape),
                        format_shape(expected)
                    )))
                }
                Some(_) => {}
            }
            leaves.extend(row_leaves);
        }
        if let (true, Value::Object(map)) = (named_rows, row) {
            if map.len() != columns.len() {
                let extra = map.keys().find(|k| !columns.iter().any(|c| c.name == k.as_str()));
                return Err(Error::invalid_argument(format!(
                    "instance {i} has input '{}', which instance 0 lacks; every instance must have the same inputs",
                    extra.map_or("?", String::as_str)
                )));
            }
        }
    }
    for Column { name, row_shape, leaves } in columns {
        let spec = input_spec(signature, name)?;
        let mut shape = vec![rows.len() as i64];
        shape.extend(row_shape.unwrap_or_default());
        let what = format!("input '{name}'");
        builder.put(name, input_tensor(target, spec, shape, &leaves, &what)?)?;
    }
    builder.finish()
}

/// An input's JSON leaves as a tensor of its spec's dtype, sized against
/// the pipeline's tensor limit first.
fn input_tensor(target: &Target, spec: &TensorSpec, shape: Vec<i64>, leaves: &[&Value], what: &str) -> Result<Tensor> {
    tensor_bytes(spec.dtype, &shape, target.pipeline.max_tensor_bytes(), what)?;
    tensor_from_leaves(spec.dtype, shape, leaves, what)
}

/// One input of the row form, gathered across instances: the shape of one
/// row, and every row's values in order.
struct Column<'a> {
    name: &'a str,
    row_shape: Option<Vec<i64>>,
    leaves: Vec<&'a Value>,
}

/// Names an input of one instance in errors, formatted only when needed.
struct InstanceInput<'a> {
    instance: usize,
    input: &'a str,
}

impl std::fmt::Display for InstanceInput<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "instance {}, input '{}'", self.instance, self.input)
    }
}

fn is_b64(map: &Map<String, Value>) -> bool {
    map.len() == 1 && map.contains_key("b64")
}

fn single_input<'s>(signature: &'s Signature, form: &str) -> Result<&'s TensorSpec> {
    match signature.inputs.as_slice() {
        [only] => Ok(only),
        inputs => {
            let names: Vec<&str> = inputs.iter().map(|i| i.name.as_str()).collect();
            Err(Error::invalid_argument(format!(
                "\"{form}\" gives a bare tensor, but the model has {} inputs {names:?}; name each input in an object",
                inputs.len()
            )))
        }
    }
}

fn input_spec<'s>(signature: &'s Signature, name: &str) -> Result<&'s TensorSpec> {
    signature
        .inputs
        .iter()
        .find(|spec| spec.name == name)
        .ok_or_else(|| Error::invalid_argument(format!("unexpected input '{name}'")))
}

/// `{"outputs": tensor}` for one output, `{"outputs": {name: tensor}}` for
/// several.
fn write_columnar(outputs: &[(String, Tensor)]) -> serde_json::Result<Vec<u8>> {
    #[derive(serde::Serialize)]
    struct Single<'a> {
        outputs: JsonView<'a>,
    }
    #[derive(serde::Serialize)]
    struct Named<'a> {
        outputs: NamedOutputs<'a>,
    }
    match outputs {
        [(name, only)] => serde_json::to_vec(&Single { outputs: JsonView::whole(only).output(name) }),
        many => serde_json::to_vec(&Named { outputs: NamedOutputs { outputs: many, row: None } }),
    }
}

/// `{"predictions": [row, …]}` for one output, `{"predictions": [{name:
/// row}, …]}` for several; every output must have the same number of rows.
fn write_rows(outputs: &[(String, Tensor)]) -> Result<serde_json::Result<Vec<u8>>> {
    let rows = outputs.first().map_or(0, |(_, t)| t.shape().first().copied().unwrap_or(0));
    if let Some((name, t)) = outputs.iter().find(|(_, t)| t.shape().first().copied() != Some(rows)) {
        return Err(Error::failed_precondition(format!(
            "output '{name}' has shape {}, which does not split into {rows} rows; use the columnar form (\"inputs\")",
            format_shape(t.shape())
        )));
    }
    let rows = rows as usize;
    #[derive(serde::Serialize)]
    struct Rows<T: serde::Serialize> {
        predictions: Vec<T>,
    }
    Ok(match outputs {
        [(name, only)] => {
            serde_json::to_vec(&Rows { predictions: (0..rows).map(|r| JsonView::row(only, r).output(name)).collect() })
        }
        many => serde_json::to_vec(&Rows {
            predictions: (0..rows).map(|r| NamedOutputs { outputs: many, row: Some(r) }).collect(),
        }),
    })
}

/// Outputs as a JSON object in signature order: whole tensors, or one row
/// of each.
struct NamedOutputs<'a> {
    outputs: &'a [(String, Tensor)],
    row: Option<usize>,
}

impl serde::Serialize for NamedOutputs<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.outputs.len()))?;
        for (name, tensor) in self.outputs {
            match self.row {
                Some(row) => map.serialize_entry(name, &JsonView::row(tensor, row).output(name))?,
                None => map.serialize_entry(name, &JsonView::whole(tensor).output(name))?,
            }
        }
        map.end()
    }
}

/// TF Serving's status answer (proto3 JSON: int64 as strings).
pub(super) fn status_json(endpoints: &Endpoints, name: &str, choice: VersionChoice<'_>) -> Result<Vec<u8>> {
    let versions = status_of(endpoints, name, choice)?;
    let statuses: Vec<Value> = versions
        .into_iter()
        .map(|(version, status)| {
            let (code, message) = match &status.error {
                None => ("OK", String::new()),
                Some(error) => (error.code().as_str(), error.to_string()),
            };
            json!({
                "version": version.to_string(),
                "state": status.state.name(),
                "status": { "error_code": code, "error_message": message },
            })
        })
        .collect();
    serde_json::to_vec(&json!({ "model_version_status": statuses }))
        .map_err(|e| Error::internal(format!("writing the status failed: {e}")))
}

/// TF Serving's metadata answer: every signature, in the JSON TF
/// Serving writes for a `SignatureDef` (dtype names, sizes as strings).
pub(super) fn metadata_json(target: &Target) -> Result<Vec<u8>> {
    use crate::proto::tensorflow::{tensor_info, TensorInfo};
    let tensors = |map: &std::collections::HashMap<String, TensorInfo>| -> Value {
        let mut names: Vec<&String> = map.keys().collect();
        names.sort();
        names
            .into_iter()
            .map(|key| {
                let info = &map[key];
                let shape = info.tensor_shape.clone().unwrap_or_default();
                let dims: Vec<Value> =
                    shape.dim.iter().map(|d| json!({ "size": d.size.to_string(), "name": d.name })).collect();
                let name = match &info.encoding {
                    Some(tensor_info::Encoding::Name(name)) => name.clone(),
                    _ => String::new(),
                };
                let dtype = DType::from_tf(info.dtype).map_or_else(|_| format!("DT_{}", info.dtype), |d| d.to_string());
                (
                    key.clone(),
                    json!({
                        "dtype": dtype,
                        "tensor_shape": { "dim": dims, "unknown_rank": shape.unknown_rank },
                        "name": name,
                    }),
                )
            })
            .collect::<Map<String, Value>>()
            .into()
    };
    let signatures: Map<String, Value> = crate::api::examples::signature_defs(target)
        .into_iter()
        .map(|(key, def)| {
            let def = json!({
                "inputs": tensors(&def.inputs),
                "outputs": tensors(&def.outputs),
                "method_name": def.method_name,
                "defaults": {},
            });
            (key, def)
        })
        .collect();
    let body = json!({
        "model_spec": {
            "name": target.pipeline.name(),
            "signature_name": "",
            "version": target.version.version().to_string(),
        },
        "metadata": {
            "signature_def": {
                "signature_def": signatures,
            }
        }
    });
    serde_json::to_vec(&body).map_err(|e| Error::internal(format!("writing the metadata failed: {e}")))
}
