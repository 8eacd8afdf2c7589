//! The TF Serving backend: a model version whose batches are forwarded, as
//! `PredictRequest`s, to the TF Serving instances a team already runs
//! ([`fleet`]), so feature fetch, sandboxed preprocessing, batching and
//! admission run in front of models that stay in TensorFlow.
//!
//! A version's signature is the upstream's (GetModelMetadata, read when the
//! version loads): inputs and outputs by name, dtype and shape, so the
//! pipeline in front is checked against what the upstream takes exactly as
//! it is against an ONNX model. A batch travels as one request: its parts
//! joined along dimension 0 (and padded to an allowed batch size), tensors
//! as packed `tensor_content`, the version pinned, the batch's deadline
//! passed on as the call's.

pub mod fleet;

use std::sync::Arc;

use futures::future::BoxFuture;

use self::fleet::Fleet;
use super::{Backend, Batch};
use crate::config::OutputEncoding;
use crate::error::{Error, Result};
use crate::proto::tensorflow::serving::{PredictRequest, SignatureDefMap};
use crate::tensor::batch::join_rows;
use crate::tensor::proto::{decode, encode, signature_of_def, SIGNATURE_DEF_FIELD, SIGNATURE_DEF_MAP_TYPE};
use crate::tensor::spec::Signature;
use crate::tensor::Tensor;

/// One version of a model, served by its upstreams.
pub struct TfServingBackend {
    fleet: Arc<Fleet>,
    version: i64,
    // Shared with each call's future, not copied into it.
    signature: Arc<Signature>,
    label: Arc<str>,
}

impl TfServingBackend {
    /// `version` of the fleet's model, its signature read from the
    /// upstream. `label` names it in errors.
    pub async fn connect(fleet: Arc<Fleet>, version: i64, label: &str) -> Result<TfServingBackend> {
        let metadata = fleet.metadata(version).await.map_err(|e| e.context(label))?;
        let any = metadata.metadata.get(SIGNATURE_DEF_FIELD).ok_or_else(|| {
            Error::unavailable(format!(
                "{label}: {} answered GetModelMetadata without a signature_def",
                fleet.describe()
            ))
        })?;
        if any.type_url != SIGNATURE_DEF_MAP_TYPE {
            return Err(Error::unavailable(format!(
                "{label}: {}: the signature_def metadata is a {}, expected {SIGNATURE_DEF_MAP_TYPE}",
                fleet.describe(),
                any.type_url
            )));
        }
        let map: SignatureDefMap = prost::Message::decode(any.value.as_slice()).map_err(|e| {
            Error::unavailable(format!(
                "{label}: {}: the signature_def metadata does not decode: {e}",
                fleet.describe()
            ))
        })?;
        let name = fleet.signature_name();
        let def = map.signature_def.get(name).ok_or_else(|| {
            let mut names: Vec<&str> = map.signature_def.keys().map(String::as_str).collect();
            names.sort_unstable();
            Error::failed_precondition(format!(
                "{label}: {} have no signature '{name}'; signatures: [{}]",
                fleet.describe(),
                names.join(", ")
            ))
        })?;
        let signature = signature_of_def(def)
            .map_err(|e| e.context(format_args!("{label}: {}: signature '{name}'", fleet.describe())))?;
        Ok(TfServingBackend { fleet, version, signature: Arc::new(signature), label: label.into() })
    }
}

impl Backend for TfServingBackend {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn run(&self, batch: Batch) -> BoxFuture<'static, Result<Vec<Tensor>>> {
        let request = self.request(&batch);
        let (fleet, signature, label) = (self.fleet.clone(), self.signature.clone(), self.label.clone());
        Box::pin(async move {
            let request = request?;
            let mut response = fleet.predict(request, batch.deadline).await?;
            let max = fleet.max_message_bytes();
            signature
                .outputs
                .iter()
                .map(|spec| {
                    let proto = response.outputs.remove(&spec.name).ok_or_else(|| {
                        Error::internal(format!(
                            "{label}: {} answered without output '{}'",
                            fleet.describe(),
                            spec.name
                        ))
                    })?;
                    decode(&spec.name, proto, max).map_err(|e| {
                        Error::internal(format!("{label}: {} answered a bad output: {}", fleet.describe(), e.message()))
                    })
                })
                .collect()
        })
    }
}

impl TfServingBackend {
    /// The batch as one PredictRequest: each input's parts joined (and
    /// padded), packed.
    fn request(&self, batch: &Batch) -> Result<PredictRequest> {
        let mut inputs = std::collections::HashMap::with_capacity(self.signature.inputs.len());
        for (i, spec) in self.signature.inputs.iter().enumerate() {
            let parts: Vec<&Tensor> = batch.requests.iter().filter_map(|r| r.get(i)).collect();
            let joined = join_rows(&parts, batch.padded_rows)?;
            inputs.insert(spec.name.clone(), encode(&joined, OutputEncoding::TensorContent));
        }
        Ok(PredictRequest { model_spec: Some(self.fleet.spec(Some(self.version))), inputs, output_filter: Vec::new() })
    }
}
