//! TF Serving's Classify, Regress and MultiInference over `tf.Example`s,
//! shared by the gRPC and REST codecs: the signature a call names checked
//! against its method, the examples parsed into the target's inputs
//! (`tensor::example`) and run as one request through the pipeline, and
//! the outputs the `examples` config names turned into TF Serving's
//! `ClassificationResult` and `RegressionResult`, with its checks.
//!
//! A MultiInference of several tasks on one model runs the model once:
//! every task's outputs come from the same run.

use crate::config::examples::{ClassifyOutputs, RegressOutput};
use crate::error::{Error, Result};
use crate::pipeline::deadline::Deadline;
use crate::pipeline::priority::Priority;
use crate::pipeline::{RequestBuilder, Target, ValidRequest};
use crate::proto::tensorflow::serving::{
    model_spec, Class, ClassificationResult, Classifications, ModelSpec, Regression, RegressionResult,
};
use crate::proto::tensorflow::SignatureDef;
use crate::tensor::example::{ExampleBatch, ExampleColumns};
use crate::tensor::proto::signature_def_of;
use crate::tensor::spec::{
    Signature, TensorSpec, CLASSIFY_METHOD, CLASSIFY_SIGNATURE, DEFAULT_SIGNATURE, PREDICT_METHOD, REGRESS_METHOD,
    REGRESS_SIGNATURE,
};
use crate::tensor::{DType, Tensor};

/// What one task asks of the examples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    /// Classes and scores per example.
    Classify,
    /// One value per example.
    Regress,
}

impl Task {
    /// The task a MultiInference `method_name` asks for.
    pub fn from_method(method: &str) -> Result<Task> {
        match method {
            CLASSIFY_METHOD => Ok(Task::Classify),
            REGRESS_METHOD => Ok(Task::Regress),
            other => Err(Error::invalid_argument(format!(
                "Unsupported signature method_name: \"{other}\"; expected \"{CLASSIFY_METHOD}\" or \
                 \"{REGRESS_METHOD}\""
            ))),
        }
    }

    /// The call's name, for messages.
    pub fn call(self) -> &'static str {
        match self {
            Task::Classify => "Classify",
            Task::Regress => "Regress",
        }
    }

    /// The method name of this task's signatures.
    pub fn method(self) -> &'static str {
        match self {
            Task::Classify => CLASSIFY_METHOD,
            Task::Regress => REGRESS_METHOD,
        }
    }

    /// The signature key of this task's signature.
    pub fn signature_key(self) -> &'static str {
        match self {
            Task::Classify => CLASSIFY_SIGNATURE,
            Task::Regress => REGRESS_SIGNATURE,
        }
    }

    /// Checks that `target` serves this task under `signature_name`, and
    /// answers the name the response echoes (TF Serving echoes
    /// `serving_default` for an empty one). The default key names the
    /// task's signature too, as an Estimator's `serving_default` does.
    pub fn check_signature(self, target: &Target, signature_name: &str) -> Result<String> {
        if let Some(defs) = graph_signatures(target) {
            // The SavedModel's own signature, as TF Serving finds it.
            let key = if signature_name.is_empty() { DEFAULT_SIGNATURE } else { signature_name };
            let def = defs.get(key).ok_or_else(|| {
                Error::invalid_argument(format!("No signature was found with the name: \"{key}\" on {target}"))
            })?;
            if def.method_name != self.method() {
                return Err(Error::invalid_argument(format!(
                    "Expected {} signature method_name to be {}. Was: {} (signature \"{key}\" of {target})",
                    self.signature_key(),
                    self.method(),
                    def.method_name
                )));
            }
            return Ok(key.to_string());
        }
        let columns = target.examples(self.call())?;
        let served = match self {
            Task::Classify => columns.classify().is_some(),
            Task::Regress => columns.regress().is_some(),
        };
        if !served {
            return Err(Error::invalid_argument(format!(
                "{target} has no {} signature, so it cannot answer {}; declare examples.{} in its config",
                self.signature_key(),
                self.call(),
                match self {
                    Task::Classify => "classify (scores, classes or labels)",
                    Task::Regress => "regress (output)",
                }
            )));
        }
        match signature_name {
            "" | DEFAULT_SIGNATURE => Ok(DEFAULT_SIGNATURE.to_string()),
            name if name == self.signature_key() => Ok(name.to_string()),
            name => Err(Error::invalid_argument(format!(
                "No signature was found with the name: \"{name}\" for {} on {target}; use \"{}\" (or \
                 \"{DEFAULT_SIGNATURE}\")",
                self.call(),
                self.signature_key()
            ))),
        }
    }
}

/// The answer to one task.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskResult {
    /// Classify's.
    Classification(ClassificationResult),
    /// Regress's.
    Regression(RegressionResult),
}

/// A SavedModel served directly without an `examples` config: its own
/// signatures, which take serialized `tf.Example`s and parse them in the
/// graph.
pub fn graph_signatures(target: &Target) -> Option<&std::collections::BTreeMap<String, SignatureDef>> {
    target.model_signature_defs().filter(|_| target.example_columns().is_none())
}

/// Runs `batch` through `target` once and answers each of `tasks` (whose
/// signatures the caller has checked, `signatures` their keys) from the
/// same outputs; a SavedModel's own signatures each run on the examples
/// themselves.
pub async fn run(
    target: &Target,
    batch: ExampleBatch<'_>,
    tasks: &[Task],
    signatures: &[String],
    deadline: Deadline,
    priority: Priority,
) -> Result<Vec<TaskResult>> {
    if graph_signatures(target).is_some() {
        return run_in_graph(target, batch, tasks, signatures, deadline, priority).await;
    }
    let call = tasks.first().map_or("Classify", |t| t.call());
    let columns = target.examples(call)?;
    // Sized before admission, parsed after it: a refused request costs
    // nothing but the count.
    columns.check_count(batch.examples.len())?;
    let wanted = wanted_outputs(columns, tasks);
    let builder = target.request(columns.input_names(), &wanted, deadline, priority)?;
    let outputs = fill(builder, columns, batch, target.pipeline.max_tensor_bytes())?.run().await?;
    let rows = batch.examples.len();
    let find = |name: &str| -> Result<&Tensor> {
        outputs.iter().find(|(n, _)| n == name).map(|(_, t)| t).ok_or_else(|| {
            Error::internal(format!("{target} did not return output '{name}', which its examples config names"))
        })
    };
    tasks
        .iter()
        .map(|task| match task {
            Task::Classify => {
                let config =
                    columns.classify().ok_or_else(|| Error::internal("classify checked but unset, this is a bug"))?;
                classification(target, config, rows, &find).map(TaskResult::Classification)
            }
            Task::Regress => {
                let config =
                    columns.regress().ok_or_else(|| Error::internal("regress checked but unset, this is a bug"))?;
                regression(target, config, rows, &find).map(TaskResult::Regression)
            }
        })
        .collect()
}

/// Classify and Regress on a SavedModel's own signatures, as TF Serving
/// runs them: the serialized examples (`ExampleBatch::merged`) fed as one
/// string tensor to the signature's one input; `classes` / `scores`
/// (classification) or `outputs` (regression) read back.
async fn run_in_graph(
    target: &Target,
    batch: ExampleBatch<'_>,
    tasks: &[Task],
    keys: &[String],
    deadline: Deadline,
    priority: Priority,
) -> Result<Vec<TaskResult>> {
    let serialized = batch.merged(target.pipeline.max_tensor_bytes())?;
    let rows = serialized.len();
    let mut results = Vec::with_capacity(tasks.len());
    for (task, key) in tasks.iter().zip(keys) {
        let graph = target.with_signature(key)?;
        let signature = graph.signature();
        let who = format!("signature \"{key}\" of {target}");
        let input = signature.serialized_examples_input(&who, task.call())?.name.clone();
        let tensor = Tensor::from_strings(vec![rows as i64], serialized.clone())?;
        let mut builder = graph.request(std::iter::once(input.as_str()), &[], deadline, priority)?;
        builder.put(&input, tensor)?;
        let outputs = builder.finish()?.run().await?;
        let find = |name: &str| -> Result<&Tensor> {
            outputs.iter().find(|(n, _)| n == name).map(|(_, t)| t).ok_or_else(|| {
                Error::internal(format!("signature \"{key}\" of {target} did not return output '{name}'"))
            })
        };
        let has = |name: &str| signature.outputs.iter().any(|spec| spec.name == name).then(|| name.to_string());
        results.push(match task {
            Task::Classify => {
                let config = ClassifyOutputs { scores: has("scores"), classes: has("classes"), labels: None };
                if config.scores.is_none() && config.classes.is_none() {
                    return Err(Error::invalid_argument(format!(
                        "signature \"{key}\" of {target} returns neither classes nor scores"
                    )));
                }
                TaskResult::Classification(classification(&graph, &config, rows, &find)?)
            }
            Task::Regress => {
                let config = RegressOutput { output: "outputs".to_string() };
                TaskResult::Regression(regression(&graph, &config, rows, &find)?)
            }
        });
    }
    Ok(results)
}

/// Parses `batch` into the inputs of a request started with
/// `columns.input_names()` (so admitted before anything is parsed), and
/// finishes it; `limit` bounds each tensor's bytes.
pub fn fill(
    mut builder: RequestBuilder<'_>,
    columns: &ExampleColumns,
    batch: ExampleBatch<'_>,
    limit: usize,
) -> Result<ValidRequest> {
    let tensors = columns.parse(batch, limit)?;
    for (name, tensor) in columns.input_names().zip(tensors) {
        builder.put(name, tensor)?;
    }
    builder.finish()
}

/// The outputs `tasks` read, each once.
fn wanted_outputs(columns: &ExampleColumns, tasks: &[Task]) -> Vec<String> {
    let mut wanted: Vec<String> = Vec::new();
    let mut add = |name: &Option<String>| {
        if let Some(name) = name {
            if !wanted.contains(name) {
                wanted.push(name.clone());
            }
        }
    };
    for task in tasks {
        match task {
            Task::Classify => {
                if let Some(classify) = columns.classify() {
                    add(&classify.scores);
                    add(&classify.classes);
                }
            }
            Task::Regress => add(&columns.regress().map(|r| r.output.clone())),
        }
    }
    wanted
}

/// TF Serving's classification answer: for each example, each column of
/// `scores` with its class name (from `classes`, or the configured labels,
/// or empty).
fn classification<'t>(
    target: &Target,
    config: &ClassifyOutputs,
    rows: usize,
    find: &impl Fn(&str) -> Result<&'t Tensor>,
) -> Result<ClassificationResult> {
    let scores = config.scores.as_deref().map(find).transpose()?;
    let classes = config.classes.as_deref().map(find).transpose()?;
    let mut width = None;
    for (name, tensor) in [(config.scores.as_deref(), scores), (config.classes.as_deref(), classes)] {
        let (Some(name), Some(tensor)) = (name, tensor) else { continue };
        let shape = tensor.shape();
        if shape.len() != 2 || shape[0] as usize != rows {
            return Err(Error::internal(format!(
                "{target} returned output '{name}' of shape {}; Classify expects [{rows}, classes] for {rows} examples",
                crate::tensor::format_shape(shape)
            )));
        }
        if width.is_some_and(|w| w != shape[1]) {
            return Err(Error::internal(format!(
                "{target}: Classify's scores and classes disagree on the number of classes ({} vs {})",
                width.unwrap_or_default(),
                shape[1]
            )));
        }
        width = Some(shape[1]);
    }
    let width = width.unwrap_or(0) as usize;
    let score_values = scores.map(|t| t.to_vec::<f32>()).transpose_dtype(target, "scores", "float32")?;
    let class_names = classes.map(|t| t.strings()).transpose_dtype(target, "classes", "string")?;
    if let Some(labels) = &config.labels {
        if labels.len() != width {
            return Err(Error::internal(format!(
                "{target} returned {width} score columns, but examples.classify.labels names {}",
                labels.len()
            )));
        }
    }
    let classifications = (0..rows)
        .map(|row| Classifications {
            classes: (0..width)
                .map(|col| {
                    let at = row * width + col;
                    let label = match (&class_names, &config.labels) {
                        (Some(names), _) => String::from_utf8_lossy(&names[at]).into_owned(),
                        (None, Some(labels)) => labels[col].clone(),
                        (None, None) => String::new(),
                    };
                    Class { label, score: score_values.as_ref().map_or(0.0, |s| s[at]) }
                })
                .collect(),
        })
        .collect();
    Ok(ClassificationResult { classifications })
}

/// TF Serving's regression answer: one value per example from a `[batch]`
/// or `[batch, 1]` float32 output.
fn regression<'t>(
    target: &Target,
    config: &RegressOutput,
    rows: usize,
    find: &impl Fn(&str) -> Result<&'t Tensor>,
) -> Result<RegressionResult> {
    let tensor = find(&config.output)?;
    let shape = tensor.shape();
    let fits =
        shape.first().is_some_and(|&d| d as usize == rows) && (shape.len() == 1 || (shape.len() == 2 && shape[1] == 1));
    if !fits {
        return Err(Error::internal(format!(
            "{target} returned output '{}' of shape {}; Regress expects [{rows}] or [{rows}, 1]",
            config.output,
            crate::tensor::format_shape(shape)
        )));
    }
    let values = Some(tensor.to_vec::<f32>()).transpose_dtype(target, &config.output, "float32")?.unwrap_or_default();
    Ok(RegressionResult { regressions: values.into_iter().map(|value| Regression { value }).collect() })
}

/// An output read as a dtype it must have: a model that answers with
/// another is the server's problem, not the client's.
trait DtypeOf<T> {
    fn transpose_dtype(self, target: &Target, name: &str, dtype: &str) -> Result<Option<T>>;
}

impl<T> DtypeOf<T> for Option<Option<T>> {
    fn transpose_dtype(self, target: &Target, name: &str, dtype: &str) -> Result<Option<T>> {
        match self {
            None => Ok(None),
            Some(Some(values)) => Ok(Some(values)),
            Some(None) => Err(Error::internal(format!("{target} returned output '{name}' that is not {dtype}"))),
        }
    }
}

/// The `model_spec` of an answer: the name asked for, the version that
/// served, the signature name as TF Serving echoes it.
pub fn answered_spec(target: &Target, signature_name: String) -> ModelSpec {
    ModelSpec {
        name: target.pipeline.name().to_string(),
        version_choice: Some(model_spec::VersionChoice::Version(target.version.version())),
        signature_name,
    }
}

/// Every signature GetModelMetadata lists for `target`, as TensorFlow's
/// `SignatureDef`s: a model served directly whose file declares its own (a
/// SavedModel's MetaGraphDef) reports those unchanged, as TF Serving does;
/// anything else reports [`signatures`].
pub fn signature_defs(target: &Target) -> Vec<(String, SignatureDef)> {
    if let Some(defs) = target.model_signature_defs() {
        return defs.iter().map(|(key, def)| (key.clone(), def.clone())).collect();
    }
    signatures(target)
        .into_iter()
        .map(|(key, signature, method)| (key.to_string(), signature_def_of(&signature, method)))
        .collect()
}

/// Every signature `target` serves, as GetModelMetadata lists them: its
/// own under `serving_default` (predict), and the classification and
/// regression signatures its `examples` config declares, in TensorFlow's
/// form (serialized examples in, `classes`/`scores` or `outputs` out).
pub fn signatures(target: &Target) -> Vec<(&'static str, Signature, &'static str)> {
    let mut all = vec![(DEFAULT_SIGNATURE, target.signature().clone(), PREDICT_METHOD)];
    let Some(columns) = target.example_columns() else { return all };
    let output = |name: &str| target.signature().outputs.iter().find(|spec| spec.name == name);
    let inputs = vec![TensorSpec::new(CLASSIFY_INPUTS, DType::String, vec![-1])];
    if let Some(classify) = columns.classify() {
        let width = [&classify.scores, &classify.classes]
            .into_iter()
            .flatten()
            .filter_map(|name| output(name).and_then(|s| s.shape.get(1).copied()))
            .find(|&d| d >= 0)
            .or(classify.labels.as_ref().map(|l| l.len() as i64))
            .unwrap_or(-1);
        let mut outputs = Vec::new();
        if classify.classes.is_some() || classify.labels.is_some() {
            outputs.push(TensorSpec::new("classes", DType::String, vec![-1, width]));
        }
        if classify.scores.is_some() {
            outputs.push(TensorSpec::new("scores", DType::F32, vec![-1, width]));
        }
        all.push((CLASSIFY_SIGNATURE, Signature { inputs: inputs.clone(), outputs }, CLASSIFY_METHOD));
    }
    if let Some(regress) = columns.regress() {
        let shape = output(&regress.output).map_or(vec![-1, 1], |s| s.shape.clone());
        let outputs = vec![TensorSpec::new("outputs", DType::F32, shape)];
        all.push((REGRESS_SIGNATURE, Signature { inputs, outputs }, REGRESS_METHOD));
    }
    all
}

/// The input name of TensorFlow's classification and regression
/// signatures.
const CLASSIFY_INPUTS: &str = "inputs";
