//! TF Serving's `PredictionService`: Predict, Classify, Regress,
//! MultiInference and GetModelMetadata.
//!
//! Predict is the edge where a client's request becomes a
//! `pipeline::ValidRequest`: the model spec is resolved to one loaded
//! version, the input names and `output_filter` are checked before
//! anything is decoded, each tensor is decoded and checked against the
//! signature as it is added, and only then does the request enter the
//! pipeline. Outputs are encoded in signature order, filtered by
//! `output_filter`. A Predict whose only input is the pipeline's
//! `examples.predict_input` (serialized `tf.Example`s) has it parsed into
//! the inputs first. Classify, Regress and MultiInference take
//! `tf.Example`s (`api::examples`).

use std::collections::HashMap;

use tonic::{Request, Response, Status};

use super::{context, required_spec, resolve, serve, version_choice};
use crate::api::context::{RequestContext, ServingState};
use crate::api::examples::{self, answered_spec, Task, TaskResult};
use crate::config::OutputEncoding;
use crate::error::Error;
use crate::pipeline::deadline::Deadline;
use crate::pipeline::priority::Priority;
use crate::pipeline::trace::current_step;
use crate::pipeline::Target;
use crate::proto::tensorflow::serving::prediction_service_server::PredictionService;
use crate::proto::tensorflow::serving::{
    inference_result, input, model_spec, ClassificationRequest, ClassificationResponse, GetModelMetadataRequest,
    GetModelMetadataResponse, InferenceResult, Input, ModelSpec, MultiInferenceRequest, MultiInferenceResponse,
    PredictRequest, PredictResponse, RegressionRequest, RegressionResponse, SignatureDefMap,
};
use crate::tensor::example::ExampleBatch;
use crate::tensor::proto::{decode, encode, SIGNATURE_DEF_FIELD, SIGNATURE_DEF_MAP_TYPE};
use crate::tensor::spec::DEFAULT_SIGNATURE;

/// The `PredictionService` implementation.
pub struct PredictionApi {
    state: ServingState,
}

impl PredictionApi {
    /// Serves the models in `state`.
    pub fn new(state: ServingState) -> Self {
        PredictionApi { state }
    }
}

/// The `model_spec` of a response: the name asked for, the version that
/// served, the signature used.
pub fn served_spec(name: &str, version: i64) -> ModelSpec {
    ModelSpec {
        name: name.to_string(),
        version_choice: Some(model_spec::VersionChoice::Version(version)),
        signature_name: DEFAULT_SIGNATURE.to_string(),
    }
}

#[tonic::async_trait]
impl PredictionService for PredictionApi {
    async fn predict(&self, request: Request<PredictRequest>) -> Result<Response<PredictResponse>, Status> {
        let cx = context(&self.state, "predict", &request, request.get_ref().model_spec.as_ref());
        let request = request.into_inner();
        let state = &self.state;
        serve(state, cx, async |cx| {
            let target = resolve(cx, state, request.model_spec.as_ref())?;
            predict(&target, request, cx.deadline, cx.priority()?, state.output_encoding).await
        })
        .await
    }

    async fn classify(
        &self,
        request: Request<ClassificationRequest>,
    ) -> Result<Response<ClassificationResponse>, Status> {
        let cx = context(&self.state, "classify", &request, request.get_ref().model_spec.as_ref());
        let request = request.into_inner();
        let state = &self.state;
        serve(state, cx, async |cx| {
            match one_task(cx, state, request.model_spec, request.input, Task::Classify).await? {
                (spec, TaskResult::Classification(result)) => {
                    Ok(ClassificationResponse { model_spec: Some(spec), result: Some(result) })
                }
                _ => Err(Error::internal("Classify answered with something else, this is a bug")),
            }
        })
        .await
    }

    async fn regress(&self, request: Request<RegressionRequest>) -> Result<Response<RegressionResponse>, Status> {
        let cx = context(&self.state, "regress", &request, request.get_ref().model_spec.as_ref());
        let request = request.into_inner();
        let state = &self.state;
        serve(state, cx, async |cx| {
            match one_task(cx, state, request.model_spec, request.input, Task::Regress).await? {
                (spec, TaskResult::Regression(result)) => {
                    Ok(RegressionResponse { model_spec: Some(spec), result: Some(result) })
                }
                _ => Err(Error::internal("Regress answered with something else, this is a bug")),
            }
        })
        .await
    }

    async fn multi_inference(
        &self,
        request: Request<MultiInferenceRequest>,
    ) -> Result<Response<MultiInferenceResponse>, Status> {
        let first = request.get_ref().tasks.first().and_then(|t| t.model_spec.as_ref());
        let cx = context(&self.state, "multi_inference", &request, first);
        let request = request.into_inner();
        let state = &self.state;
        serve(state, cx, async |cx| {
            let first = request.tasks.first().ok_or_else(|| {
                Error::invalid_argument("MultiInferenceRequest must specify at least one task (tasks is empty)")
            })?;
            let spec = required_spec(first.model_spec.as_ref())?;
            let target = cx.resolve(&state.endpoints, version_choice(spec), "")?;
            let mut tasks = Vec::with_capacity(request.tasks.len());
            let mut signatures: Vec<String> = Vec::with_capacity(request.tasks.len());
            for (i, task) in request.tasks.iter().enumerate() {
                let spec =
                    required_spec(task.model_spec.as_ref()).map_err(|e| e.context(format_args!("tasks[{i}]")))?;
                if spec.name != target.pipeline.name() {
                    return Err(Error::invalid_argument(format!(
                        "All ModelSpecs in a MultiInferenceRequest must access the same model name: tasks[{i}] \
                         names '{}', tasks[0] '{}'",
                        spec.name,
                        target.pipeline.name()
                    )));
                }
                let kind = Task::from_method(&task.method_name).map_err(|e| e.context(format_args!("tasks[{i}]")))?;
                let signature = kind.check_signature(&target, &spec.signature_name)?;
                // One signature per method: "", "serving_default" and
                // its own key all name it.
                if tasks.contains(&kind) {
                    return Err(Error::invalid_argument(format!(
                        "Duplicate evaluation of signature: \"{}\" (tasks[{i}] asks for {} again)",
                        kind.signature_key(),
                        kind.call()
                    )));
                }
                tasks.push(kind);
                signatures.push(signature);
            }
            let results = run_tasks(&target, request.input, &tasks, &signatures, cx).await?;
            let results = results
                .into_iter()
                .zip(signatures)
                .map(|(result, signature)| InferenceResult {
                    model_spec: Some(answered_spec(&target, signature)),
                    result: Some(match result {
                        TaskResult::Classification(r) => inference_result::Result::ClassificationResult(r),
                        TaskResult::Regression(r) => inference_result::Result::RegressionResult(r),
                    }),
                })
                .collect();
            Ok(MultiInferenceResponse { results })
        })
        .await
    }

    async fn get_model_metadata(
        &self,
        request: Request<GetModelMetadataRequest>,
    ) -> Result<Response<GetModelMetadataResponse>, Status> {
        let cx = context(&self.state, "get_model_metadata", &request, request.get_ref().model_spec.as_ref());
        let request = request.into_inner();
        let state = &self.state;
        serve(state, cx, async |cx| {
            let target = resolve(cx, state, request.model_spec.as_ref())?;
            let signature_name = request.model_spec.as_ref().map_or("", |spec| spec.signature_name.as_str());
            model_metadata(&target, &request.metadata_field, signature_name)
        })
        .await
    }
}

/// The target of a Classify or Regress call and the signature name its
/// answer echoes.
fn resolve_task(
    cx: &mut RequestContext,
    state: &ServingState,
    spec: Option<&ModelSpec>,
    task: Task,
) -> Result<(Target, String), Error> {
    let spec = required_spec(spec)?;
    let target = cx.resolve(&state.endpoints, version_choice(spec), "")?;
    let signature = task.check_signature(&target, &spec.signature_name)?;
    Ok((target, signature))
}

/// Classify or Regress: resolves the model, runs `task` on `input`, and
/// answers the spec the response names with the task's result.
async fn one_task(
    cx: &mut RequestContext,
    state: &ServingState,
    spec: Option<ModelSpec>,
    input: Option<Input>,
    task: Task,
) -> Result<(ModelSpec, TaskResult), Error> {
    let (target, signature) = resolve_task(cx, state, spec.as_ref(), task)?;
    let result = run_tasks(&target, input, &[task], std::slice::from_ref(&signature), cx).await?.pop();
    let result = result.ok_or_else(|| Error::internal("a task answered nothing, this is a bug"))?;
    Ok((answered_spec(&target, signature), result))
}

/// Runs `tasks` over the examples of `input`.
async fn run_tasks(
    target: &Target,
    input: Option<Input>,
    tasks: &[Task],
    signatures: &[String],
    cx: &RequestContext,
) -> Result<Vec<TaskResult>, Error> {
    let empty = || Error::invalid_argument("input is empty: set input.example_list or input.example_list_with_context");
    let (examples, context) = match input.and_then(|input| input.kind).ok_or_else(empty)? {
        input::Kind::ExampleList(list) => (list.examples, None),
        input::Kind::ExampleListWithContext(list) => (list.examples, Some(list.context)),
    };
    let batch = ExampleBatch { examples: &examples, context: context.as_ref() };
    examples::run(target, batch, tasks, signatures, cx.deadline, cx.priority()?).await
}

async fn predict(
    target: &Target,
    mut request: PredictRequest,
    deadline: Deadline,
    priority: Priority,
    encoding: OutputEncoding,
) -> Result<PredictResponse, Error> {
    let limit = target.pipeline.max_tensor_bytes();
    let examples = target
        .example_columns()
        .filter(|columns| request.inputs.len() == 1 && request.inputs.contains_key(columns.predict_input()));
    let valid = match examples {
        // Serialized tf.Examples in place of the inputs: parsed into them.
        Some(columns) => {
            let builder = target.request(columns.input_names(), &request.output_filter, deadline, priority)?;
            let name = columns.predict_input();
            let proto = request
                .inputs
                .remove(name)
                .ok_or_else(|| Error::internal("the examples input vanished, this is a bug"))?;
            let serialized = decode(name, proto, limit)?;
            let strings = match serialized.strings() {
                Some(strings) if serialized.shape().len() == 1 => strings,
                _ => {
                    return Err(Error::invalid_argument(format!(
                        "input '{name}' is {} {}; it takes serialized tf.Examples: DT_STRING [examples]",
                        serialized.dtype(),
                        crate::tensor::format_shape(serialized.shape())
                    )))
                }
            };
            let batch = ExampleBatch { examples: strings, context: None };
            examples::fill(builder, columns, batch, limit).map_err(|e| e.context(format_args!("input '{name}'")))?
        }
        None => {
            // Names first: nothing is decoded for a request that names the
            // wrong inputs or outputs.
            let mut builder = target.request(
                request.inputs.keys().map(String::as_str),
                &request.output_filter,
                deadline,
                priority,
            )?;
            for (name, proto) in request.inputs {
                let tensor = decode(&name, proto, limit)?;
                builder.put(&name, tensor)?;
            }
            builder.finish()?
        }
    };
    let outputs = valid.run().await?;
    let _encode = current_step("encode").entered();
    Ok(PredictResponse {
        model_spec: Some(served_spec(target.pipeline.name(), target.version.version())),
        outputs: outputs.into_iter().map(|(name, tensor)| (name, encode(&tensor, encoding))).collect(),
    })
}

fn model_metadata(target: &Target, fields: &[String], signature_name: &str) -> Result<GetModelMetadataResponse, Error> {
    if fields.is_empty() {
        return Err(Error::invalid_argument(format!("metadata_field is empty; ask for \"{SIGNATURE_DEF_FIELD}\"")));
    }
    if let Some(field) = fields.iter().find(|f| *f != SIGNATURE_DEF_FIELD) {
        return Err(Error::invalid_argument(format!(
            "metadata_field \"{field}\" is not supported; supported: \"{SIGNATURE_DEF_FIELD}\""
        )));
    }
    let signatures = SignatureDefMap { signature_def: examples::signature_defs(target).into_iter().collect() };
    let any = prost_types::Any {
        type_url: SIGNATURE_DEF_MAP_TYPE.to_string(),
        value: prost::Message::encode_to_vec(&signatures),
    };
    // TF Serving echoes the signature name the request gave (often none).
    let mut model_spec = served_spec(target.pipeline.name(), target.version.version());
    model_spec.signature_name = signature_name.to_string();
    Ok(GetModelMetadataResponse {
        model_spec: Some(model_spec),
        metadata: HashMap::from([(SIGNATURE_DEF_FIELD.to_string(), any)]),
    })
}
