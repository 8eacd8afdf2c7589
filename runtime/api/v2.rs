//! What the Open Inference Protocol's (KServe v2) two codecs share — gRPC
//! `inference.GRPCInferenceService` (`api/grpc/inference.rs`) and REST
//! `/v2/…` (`api/rest/v2.rs`): version strings, server and model metadata,
//! readiness, and running an inference through the same `RequestBuilder`
//! and pipeline as TF Serving's Predict. A v2 model name is a sluice
//! endpoint name: a model or a pipeline.

use crate::error::{Error, Result};
use crate::models::VersionChoice;
use crate::pipeline::deadline::Deadline;
use crate::pipeline::priority::Priority;
use crate::pipeline::{Endpoints, Target};
use crate::tensor::spec::TensorSpec;
use crate::tensor::v2::{datatype, dtype_of};
use crate::tensor::{DType, Tensor};

/// The server's name in server metadata.
pub const SERVER_NAME: &str = "sluice";

/// The server's version in server metadata.
pub const SERVER_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The protocol extensions served: raw bytes over HTTP.
pub const EXTENSIONS: &[&str] = &["binary_tensor_data"];

/// The platform a model reports: what runs it.
pub const PLATFORM: &str = "onnxruntime_onnx";

/// A v2 version string: empty for the version the server picks, else a
/// version number.
pub fn version_choice(version: &str) -> Result<VersionChoice<'_>> {
    if version.is_empty() {
        return Ok(VersionChoice::Latest);
    }
    version.parse().map(VersionChoice::Number).map_err(|_| {
        Error::invalid_argument(format!("model version \"{version}\" is not a version number; give digits or nothing"))
    })
}

/// One tensor as model metadata gives it.
pub struct TensorMetadata {
    /// Its name.
    pub name: String,
    /// Its v2 datatype.
    pub datatype: &'static str,
    /// Its shape, -1 where any size goes (and `[-1]` for any rank).
    pub shape: Vec<i64>,
}

impl TensorMetadata {
    fn of(spec: &TensorSpec) -> TensorMetadata {
        TensorMetadata {
            name: spec.name.clone(),
            datatype: datatype(spec.dtype),
            shape: if spec.unknown_rank { vec![-1] } else { spec.shape.clone() },
        }
    }
}

/// A model's metadata: what clients send and get for the version asked.
pub struct ModelMetadata {
    /// The name asked for.
    pub name: String,
    /// Every loaded version.
    pub versions: Vec<String>,
    /// The inputs clients send.
    pub inputs: Vec<TensorMetadata>,
    /// The outputs they get.
    pub outputs: Vec<TensorMetadata>,
}

/// The metadata of `target`.
pub fn model_metadata(target: &Target) -> Result<ModelMetadata> {
    let signature = target.signature();
    Ok(ModelMetadata {
        name: target.pipeline.name().to_string(),
        versions: target.pipeline.model().versions().iter().map(|v| v.version().to_string()).collect(),
        inputs: signature.inputs.iter().map(TensorMetadata::of).collect(),
        outputs: signature.outputs.iter().map(TensorMetadata::of).collect(),
    })
}

/// True when `name` (at `version`) is served and takes requests.
pub fn model_ready(endpoints: &Endpoints, name: &str, version: &str) -> Result<bool> {
    let choice = version_choice(version)?;
    Ok(endpoints.named(name).is_ok_and(|pipeline| pipeline.model().resolve(choice).is_ok()))
}

/// One input as a v2 request gives it: its datatype and shape, and its
/// values in whatever form the codec received (typed, raw, JSON).
pub struct GivenInput<V> {
    /// The input's name.
    pub name: String,
    /// Its v2 datatype, as given.
    pub datatype: String,
    /// Its shape, as given.
    pub shape: Vec<i64>,
    /// Its values, not yet decoded.
    pub values: V,
}

/// Runs an inference: every input's name is checked before any is
/// decoded, then each datatype against the signature, then `decode` turns
/// the values into a tensor of that dtype and shape (sized against
/// `max_tensor_bytes`; `what` names the input). Answers the outputs asked
/// for (all when empty), in the order asked, or signature order.
pub async fn infer<V>(
    target: &Target,
    inputs: Vec<GivenInput<V>>,
    outputs: &[String],
    deadline: Deadline,
    priority: Priority,
    decode: impl Fn(DType, Vec<i64>, V, usize, &str) -> Result<Tensor>,
) -> Result<Vec<(String, Tensor)>> {
    let mut builder = target.request(inputs.iter().map(|input| input.name.as_str()), outputs, deadline, priority)?;
    let limit = target.pipeline.max_tensor_bytes();
    for input in inputs {
        let spec = builder.signature().inputs.iter().find(|spec| spec.name == input.name).ok_or_else(|| {
            Error::internal(format!("input '{}' passed the name check but has no spec, this is a bug", input.name))
        })?;
        let what = format!("input '{}'", input.name);
        if spec.dtype.is_complex() {
            return Err(crate::tensor::v2::no_complex(&what, spec.dtype));
        }
        check_datatype(spec, &input.datatype)?;
        let dtype = dtype_of(&input.datatype, &what)?;
        let tensor = decode(dtype, input.shape, input.values, limit, &what)?;
        builder.put(&input.name, tensor)?;
    }
    let outputs = builder.finish()?.run().await?;
    if let Some((name, tensor)) = outputs.iter().find(|(_, t)| t.dtype().is_complex()) {
        return Err(crate::tensor::v2::no_complex(&format!("output '{name}'"), tensor.dtype()));
    }
    Ok(outputs)
}

/// Checks a datatype a client gave against the spec's: the error names
/// both, as v2 clients expect to be told.
fn check_datatype(spec: &TensorSpec, given: &str) -> Result<()> {
    let wanted = datatype(spec.dtype);
    if given == wanted {
        Ok(())
    } else {
        Err(Error::invalid_argument(format!(
            "input '{}' has datatype {given}, but the model takes {wanted}",
            spec.name
        )))
    }
}

/// The error for an output asking for the classification extension.
/// The request's `priority` parameter (Triton's numbering: 1 the highest,
/// 0 the default), when it gives one; `value` is what it holds, if an
/// unsigned integer.
pub fn priority_parameter(given: bool, value: Option<u64>, shown: &dyn std::fmt::Display) -> Result<Option<Priority>> {
    match (given, value) {
        (false, _) => Ok(None),
        (true, Some(level)) => Ok(Some(Priority::from_level(level))),
        (true, None) => Err(Error::invalid_argument(format!(
            "parameters.priority is {shown}; expected an unsigned integer (1 is the highest, 0 the default)"
        ))),
    }
}

pub fn classification_refused(output: &str) -> Error {
    Error::unimplemented(format!(
        "output '{output}' asks for the classification extension, which sluice does not serve; use a top_k stage"
    ))
}
