//! The requests the load generator sends: read from a JSON file in TF
//! Serving's REST form, replayed from a request log, or made up from the
//! model's signature (GetModelMetadata) as a pool of distinct random
//! inputs.

use std::collections::HashMap;
use std::path::Path;

use bytes::Bytes;
use prost::Message;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use crate::config::OutputEncoding;
use crate::proto::tensorflow::serving::prediction_service_client::PredictionServiceClient;
use crate::proto::tensorflow::serving::{GetModelMetadataRequest, ModelSpec, PredictRequest, SignatureDefMap};
use crate::proto::tensorflow::TensorProto;
use crate::tensor::json::tensor_from_json;
use crate::tensor::proto::encode;
use crate::tensor::spec::TensorSpec;
use crate::tensor::{element_count, DType, Tensor};

/// Encoded requests to send, and the rows each carries.
pub struct RequestPool {
    /// Encoded `PredictRequest`s, sent round-robin.
    pub requests: Vec<Bytes>,
    /// Rows per request (dimension 0 of the first input; for a replayed
    /// log, the mean).
    pub rows: u64,
}

/// The model's input signature, from GetModelMetadata (over TLS with `tls`).
pub async fn input_specs(
    target: &str,
    spec: &ModelSpec,
    tls: Option<&tonic::transport::ClientTlsConfig>,
) -> anyhow::Result<Vec<TensorSpec>> {
    let channel = super::client::endpoint(target, tls)?
        .connect()
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect to {target}: {e}"))?;
    let mut client = PredictionServiceClient::new(channel);
    let response = client
        .get_model_metadata(GetModelMetadataRequest {
            model_spec: Some(spec.clone()),
            metadata_field: vec!["signature_def".into()],
        })
        .await
        .map_err(|e| anyhow::anyhow!("GetModelMetadata failed: {}: {}", e.code(), e.message()))?
        .into_inner();
    let any =
        response.metadata.get("signature_def").ok_or_else(|| anyhow::anyhow!("the metadata has no signature_def"))?;
    let map = SignatureDefMap::decode(any.value.as_slice()).map_err(|e| anyhow::anyhow!("bad signature_def: {e}"))?;
    let def =
        map.signature_def.get("serving_default").ok_or_else(|| anyhow::anyhow!("no serving_default signature"))?;
    let mut specs = Vec::new();
    for (name, info) in &def.inputs {
        let dtype = DType::from_tf(info.dtype).map_err(|e| anyhow::anyhow!("input {name}: {e}"))?;
        let shape = info.tensor_shape.as_ref().map(|s| s.dim.iter().map(|d| d.size).collect()).unwrap_or_default();
        specs.push(TensorSpec::new(name.clone(), dtype, shape));
    }
    specs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(specs)
}

fn encode_request(spec: &ModelSpec, inputs: HashMap<String, TensorProto>) -> Bytes {
    Bytes::from(PredictRequest { model_spec: Some(spec.clone()), inputs, output_filter: vec![] }.encode_to_vec())
}

/// `pool` distinct requests of `rows` rows with random values. Dynamic
/// dimensions other than the first are 1 unless `shapes` gives an input's
/// whole shape. Integers are drawn from 0..10, which any embedding table or
/// class index accepts.
pub fn random_pool(
    specs: &[TensorSpec],
    spec: &ModelSpec,
    rows: i64,
    shapes: &HashMap<String, Vec<i64>>,
    pool: usize,
    seed: u64,
) -> anyhow::Result<RequestPool> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut requests = Vec::with_capacity(pool);
    for _ in 0..pool.max(1) {
        let mut inputs = HashMap::new();
        for input in specs {
            let shape = shapes.get(&input.name).cloned().unwrap_or_else(|| input.shape_with_rows(rows));
            let n = element_count(&shape).map_err(|e| anyhow::anyhow!("input {}: {e}", input.name))?;
            let tensor = random_tensor(input.dtype, shape, n, &mut rng);
            inputs.insert(input.name.clone(), encode(&tensor, OutputEncoding::TensorContent));
        }
        requests.push(encode_request(spec, inputs));
    }
    let rows = specs
        .first()
        .and_then(|first| shapes.get(&first.name))
        .and_then(|shape| shape.first().copied())
        .unwrap_or(rows);
    Ok(RequestPool { requests, rows: rows.max(1) as u64 })
}

/// `n` random values of `dtype` in `shape` (of `n` elements): floats in
/// [-1, 1), integers in [0, 10), any byte, either boolean, short strings.
pub fn random_tensor(dtype: DType, shape: Vec<i64>, n: usize, rng: &mut impl Rng) -> Tensor {
    macro_rules! ints {
        ($ty:ty) => {
            Tensor::from_values(shape, &(0..n).map(|_| rng.random_range(0..10) as $ty).collect::<Vec<$ty>>())
        };
    }
    match dtype {
        DType::F32 => Tensor::from_values(shape, &(0..n).map(|_| rng.random_range(-1.0..1.0f32)).collect::<Vec<_>>()),
        DType::F64 => Tensor::from_values(shape, &(0..n).map(|_| rng.random_range(-1.0..1.0f64)).collect::<Vec<_>>()),
        DType::F16 => Tensor::from_values(
            shape,
            &(0..n).map(|_| half::f16::from_f32(rng.random_range(-1.0..1.0))).collect::<Vec<_>>(),
        ),
        DType::BF16 => Tensor::from_values(
            shape,
            &(0..n).map(|_| half::bf16::from_f32(rng.random_range(-1.0..1.0))).collect::<Vec<_>>(),
        ),
        DType::I8 => ints!(i8),
        DType::I16 => ints!(i16),
        DType::I32 => ints!(i32),
        DType::I64 => ints!(i64),
        DType::U8 => Tensor::from_values(shape, &(0..n).map(|_| rng.random::<u8>()).collect::<Vec<_>>()),
        DType::U16 => ints!(u16),
        DType::U32 => ints!(u32),
        DType::U64 => ints!(u64),
        DType::Bool => Tensor::from_bools(shape, &(0..n).map(|_| rng.random::<bool>()).collect::<Vec<_>>()),
        // (real, imaginary) pairs of floats.
        DType::Complex64 => {
            let parts: Vec<f32> = (0..2 * n).map(|_| rng.random_range(-1.0..1.0f32)).collect();
            Tensor::from_bytes(dtype, shape, Bytes::copy_from_slice(bytemuck::cast_slice(&parts)))
                .expect("2n floats for a shape of n complex elements")
        }
        DType::Complex128 => {
            let parts: Vec<f64> = (0..2 * n).map(|_| rng.random_range(-1.0..1.0f64)).collect();
            Tensor::from_bytes(dtype, shape, Bytes::copy_from_slice(bytemuck::cast_slice(&parts)))
                .expect("2n floats for a shape of n complex elements")
        }
        DType::String => {
            let strings = (0..n).map(|_| Bytes::from(format!("s{}", rng.random_range(0..1000)))).collect();
            Tensor::from_strings(shape, strings).expect("n strings for a shape of n elements")
        }
    }
}

/// The requests of a request log, and the names they call.
pub struct LoggedRequests {
    /// The requests, in logged order.
    pub pool: RequestPool,
    /// The names the requests call, in order of first appearance.
    pub models: Vec<String>,
}

/// The Predict requests of the request log at `path` (a file, a directory
/// or a `filename_prefix`), in logged order: sent to `model` when given,
/// else to the name each one called; to `version` when given, else to
/// whatever the server serves.
pub async fn from_request_log(
    path: &Path,
    max_bytes: u64,
    model: Option<&str>,
    version: Option<i64>,
) -> anyhow::Result<LoggedRequests> {
    let logged = crate::pipeline::request_log::read_logged(path, max_bytes).await.map_err(anyhow::Error::new)?;
    if logged.is_empty() {
        anyhow::bail!("{}: the request log holds no requests", path.display());
    }
    let mut models: Vec<String> = Vec::new();
    let mut total_rows = 0u64;
    let mut requests = Vec::with_capacity(logged.len());
    for mut request in logged {
        let mut spec = request.model_spec.take().unwrap_or_default();
        if let Some(model) = model {
            spec.name = model.to_string();
        }
        spec.version_choice = version.map(crate::proto::tensorflow::serving::model_spec::VersionChoice::Version);
        if !models.contains(&spec.name) {
            models.push(spec.name.clone());
        }
        // Rows: dimension 0 of the first input by name, as the server batches.
        let rows = request
            .inputs
            .iter()
            .min_by(|a, b| a.0.cmp(b.0))
            .and_then(|(_, t)| t.tensor_shape.as_ref()?.dim.first().map(|d| d.size))
            .unwrap_or(1);
        total_rows += rows.max(1) as u64;
        request.model_spec = Some(spec);
        requests.push(Bytes::from(request.encode_to_vec()));
    }
    let rows = (total_rows as f64 / requests.len() as f64).round().max(1.0) as u64;
    Ok(LoggedRequests { pool: RequestPool { requests, rows }, models })
}

/// One request from a JSON file in TF Serving's REST form: columnar
/// (`{"inputs": {"x": [[…]]}}`, or a bare array for a one-input model) or
/// row (`{"instances": [{"x": […]}, …]}`, or bare rows).
pub fn from_json_file(path: &Path, specs: &[TensorSpec], spec: &ModelSpec) -> anyhow::Result<RequestPool> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let body: Value = serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: not JSON: {e}", path.display()))?;
    let columns: Vec<(String, Value)> = if let Some(inputs) = body.get("inputs") {
        match inputs {
            Value::Object(map) => map.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            other => match specs {
                [only] => vec![(only.name.clone(), other.clone())],
                _ => anyhow::bail!("\"inputs\" is not an object, and the model has several inputs"),
            },
        }
    } else if let Some(Value::Array(instances)) = body.get("instances") {
        specs
            .iter()
            .map(|input| {
                let column = instances
                    .iter()
                    .map(|row| match row {
                        Value::Object(map) => map
                            .get(&input.name)
                            .cloned()
                            .ok_or_else(|| anyhow::anyhow!("an instance lacks '{}'", input.name)),
                        bare if specs.len() == 1 => Ok(bare.clone()),
                        _ => Err(anyhow::anyhow!("instances must be objects when the model has several inputs")),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok((input.name.clone(), Value::Array(column)))
            })
            .collect::<anyhow::Result<_>>()?
    } else {
        return Err(anyhow::anyhow!("{}: expected {{\"inputs\": …}} or {{\"instances\": […]}}", path.display()));
    };
    let mut inputs = HashMap::new();
    let mut rows = 1;
    for (name, value) in columns {
        let input =
            specs.iter().find(|s| s.name == name).ok_or_else(|| anyhow::anyhow!("the model has no input '{name}'"))?;
        let tensor = tensor_from_json(&value, input.dtype, &format!("input '{name}'")).map_err(anyhow::Error::new)?;
        rows = tensor.rows() as u64;
        inputs.insert(name, encode(&tensor, OutputEncoding::TensorContent));
    }
    Ok(RequestPool { requests: vec![encode_request(spec, inputs)], rows })
}

/// The same requests as TF Serving REST bodies in row form:
/// `{"instances": [{"input": row, …}, …]}`.
pub fn rest_bodies(requests: &[Bytes]) -> anyhow::Result<Vec<Bytes>> {
    use crate::tensor::json::JsonView;
    requests
        .iter()
        .map(|encoded| {
            let request = PredictRequest::decode(encoded.clone()).map_err(|e| anyhow::anyhow!("bad request: {e}"))?;
            let mut inputs = Vec::with_capacity(request.inputs.len());
            for (name, proto) in request.inputs {
                let tensor = crate::tensor::proto::decode(&name, proto, usize::MAX).map_err(anyhow::Error::new)?;
                inputs.push((name, tensor));
            }
            let rows = inputs.first().map_or(0, |(_, t)| t.rows());
            if let Some((name, _)) = inputs.iter().find(|(_, t)| t.rows() != rows || t.shape().is_empty()) {
                return Err(anyhow::anyhow!(
                    "input '{name}' does not have {rows} rows; the row form needs a batch dimension"
                ));
            }
            let instances: Vec<serde_json::Map<String, Value>> = (0..rows)
                .map(|r| {
                    inputs
                        .iter()
                        .map(|(name, t)| Ok((name.clone(), serde_json::to_value(JsonView::row(t, r))?)))
                        .collect::<Result<_, serde_json::Error>>()
                })
                .collect::<Result<_, _>>()
                .map_err(anyhow::Error::new)?;
            serde_json::to_vec(&serde_json::json!({ "instances": instances }))
                .map(Bytes::from)
                .map_err(anyhow::Error::new)
        })
        .collect()
}
