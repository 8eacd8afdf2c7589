//! A TF Serving gRPC client calling sluice: asks the model for its
//! signature, builds an input of the right dtypes and shapes, calls Predict
//! and prints the outputs.
//!
//! ```text
//! cargo run --example predict -- --target http://127.0.0.1:8500 --model mlp --batch 2
//! ```

use std::collections::HashMap;

use anyhow::{bail, Context};
use clap::Parser;
use prost::Message;
use sluice::proto::tensorflow::serving::prediction_service_client::PredictionServiceClient;
use sluice::proto::tensorflow::serving::{GetModelMetadataRequest, ModelSpec, PredictRequest, SignatureDefMap};
use sluice::proto::tensorflow::{DataType, TensorProto};
use sluice::tensor::proto::encode_shape;

#[derive(Parser)]
struct Args {
    /// The server's gRPC address.
    #[arg(long, default_value = "http://127.0.0.1:8500")]
    target: String,
    /// The model to call.
    #[arg(long, default_value = "mlp")]
    model: String,
    /// Rows to send (the size of dimension 0).
    #[arg(long, default_value_t = 1)]
    batch: i64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut client = PredictionServiceClient::connect(args.target.clone())
        .await
        .with_context(|| format!("connecting to {}", args.target))?;
    let spec = ModelSpec { name: args.model.clone(), ..Default::default() };

    let metadata = client
        .get_model_metadata(GetModelMetadataRequest {
            model_spec: Some(spec.clone()),
            metadata_field: vec!["signature_def".into()],
        })
        .await?
        .into_inner();
    let any = metadata.metadata.get("signature_def").context("no signature_def in the metadata")?;
    let signatures = SignatureDefMap::decode(any.value.as_slice())?;
    let signature = signatures.signature_def.get("serving_default").context("no serving_default signature")?;

    let mut inputs = HashMap::new();
    for (name, info) in &signature.inputs {
        let dims: Vec<i64> = info
            .tensor_shape
            .as_ref()
            .map(|s| s.dim.iter().map(|d| if d.size < 0 { args.batch } else { d.size }).collect())
            .unwrap_or_default();
        let count: i64 = dims.iter().product();
        let mut tensor =
            TensorProto { dtype: info.dtype, tensor_shape: Some(encode_shape(&dims)), ..Default::default() };
        match DataType::try_from(info.dtype) {
            Ok(DataType::DtFloat) => tensor.float_val = (0..count).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect(),
            Ok(DataType::DtInt64) => tensor.int64_val = (0..count).map(|i| i * 37 % 1000).collect(),
            other => bail!("this example fills DT_FLOAT and DT_INT64 inputs only; input '{name}' is {other:?}"),
        }
        println!("input  {name}: {dims:?}");
        inputs.insert(name.clone(), tensor);
    }

    let response =
        client.predict(PredictRequest { model_spec: Some(spec), inputs, output_filter: vec![] }).await?.into_inner();
    if let Some(spec) = &response.model_spec {
        println!("served by model '{}' {:?}", spec.name, spec.version_choice);
    }
    for (name, tensor) in &response.outputs {
        let dims: Vec<i64> =
            tensor.tensor_shape.as_ref().map(|s| s.dim.iter().map(|d| d.size).collect()).unwrap_or_default();
        let values: Vec<f32> = if tensor.tensor_content.is_empty() {
            tensor.float_val.clone()
        } else {
            bytemuck::pod_collect_to_vec(&tensor.tensor_content)
        };
        println!("output {name}: {dims:?} {values:?}");
    }
    Ok(())
}
