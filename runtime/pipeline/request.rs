//! What a request runs on ([`Target`]: a pipeline and the model version it
//! resolved to) and the one form in which a request enters the pipeline
//! ([`ValidRequest`]).
//!
//! The API edges build a `ValidRequest` through a [`RequestBuilder`], the
//! only way to make one: the input names and the `output_filter` are
//! checked when it starts, and then the request is admitted (or refused
//! with RESOURCE_EXHAUSTED), both before any tensor is decoded, so an
//! overloaded pipeline spends nothing on what it refuses; each decoded
//! tensor is checked against its spec as it is added, and the rows of
//! batched inputs when it finishes. Each check runs once; the pipeline
//! trusts what it is given.

use std::fmt;
use std::sync::Arc;

use super::admission::AdmissionPermit;
use super::deadline::Deadline;
use super::priority::Priority;
use super::request_log::LogEntry;
use super::{Endpoints, EntryPoint, Pipeline, ServedVersion};
use crate::error::{Error, Result};
use crate::models::VersionChoice;
use crate::tensor::example::ExampleColumns;
use crate::tensor::spec::{check_tensor, Signature, DEFAULT_SIGNATURE};
use crate::tensor::{format_shape, Tensor};

/// What a request runs on: a pipeline and the model version it resolved to.
#[derive(Clone)]
pub struct Target {
    /// The pipeline (a model served directly is a pipeline without stages).
    pub pipeline: Arc<Pipeline>,
    /// The version that serves the request; held until it is answered,
    /// so a version being replaced finishes what it took.
    pub version: Arc<ServedVersion>,
    /// What the client sends and receives with this version.
    signature: Arc<Signature>,
    /// How `tf.Example`s fill its inputs, when the pipeline takes them.
    examples: Option<Arc<ExampleColumns>>,
    /// The model's other signature the request named (a SavedModel's),
    /// run unbatched; `None`: the pipeline's own.
    other: Option<Arc<str>>,
}

/// True when requests to `pipeline` reach `version`'s model as they are:
/// the model served under its own name, with no stage around it.
fn serves_directly(pipeline: &Pipeline, version: &ServedVersion) -> bool {
    pipeline.name() == version.model() && !pipeline.has_stages()
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.serves_model_directly() {
            write!(f, "{}", self.version)
        } else {
            write!(f, "pipeline '{}' ({})", self.pipeline.name(), self.version)
        }
    }
}

impl Target {
    /// The pipeline called `name` and the version `choice` picks; checks
    /// the signature name too.
    pub fn resolve(
        endpoints: &Endpoints,
        name: &str,
        choice: VersionChoice<'_>,
        signature_name: &str,
    ) -> Result<Target> {
        let pipeline = endpoints.named(name)?;
        let version = pipeline.model().resolve(choice)?;
        let EntryPoint { signature, examples } = pipeline.entry_point(&version)?;
        // A model served directly answers its other signatures too.
        let direct = serves_directly(&pipeline, &version);
        if let Some(other) = version.loaded().backend().other_signature(signature_name).filter(|_| direct) {
            let signature = Arc::new(other.clone());
            return Ok(Target { pipeline, version, signature, examples: None, other: Some(Arc::from(signature_name)) });
        }
        if !signature_name.is_empty() && signature_name != DEFAULT_SIGNATURE {
            // The classification and regression signatures take
            // tf.Examples through Classify and Regress.
            let tasks = examples.as_ref().map_or(String::new(), |columns| {
                let mut tasks = String::new();
                if columns.classify().is_some() {
                    tasks.push_str(", classification (call Classify)");
                }
                if columns.regress().is_some() {
                    tasks.push_str(", regression (call Regress)");
                }
                tasks
            });
            // A SavedModel's other signatures, where they are served.
            let others = match version.loaded().backend().signature_defs().filter(|_| direct) {
                Some(defs) => defs
                    .keys()
                    .filter(|k| *k != DEFAULT_SIGNATURE && version.loaded().backend().other_signature(k).is_some())
                    .map(|k| format!(", {k}"))
                    .collect::<String>(),
                None => String::new(),
            };
            return Err(Error::failed_precondition(format!(
                "{version} has no signature '{signature_name}' for Predict; signatures: [{DEFAULT_SIGNATURE}{others}{tasks}]"
            )));
        }
        Ok(Target { pipeline, version, signature, examples, other: None })
    }

    /// True when the request reaches the model as it is (its own name, no
    /// stage around it).
    pub fn serves_model_directly(&self) -> bool {
        serves_directly(&self.pipeline, &self.version)
    }

    /// Every signature the model's own file declares (a SavedModel's),
    /// when the model is served directly.
    pub fn model_signature_defs(
        &self,
    ) -> Option<&std::collections::BTreeMap<String, crate::proto::tensorflow::SignatureDef>> {
        self.version.loaded().backend().signature_defs().filter(|_| self.serves_model_directly())
    }

    /// The same pipeline and version through the model's signature `key`
    /// (a SavedModel's): its main one for `""` and `serving_default`.
    pub fn with_signature(&self, key: &str) -> Result<Target> {
        if let Some(other) = self.version.loaded().backend().other_signature(key) {
            return Ok(Target {
                pipeline: self.pipeline.clone(),
                version: self.version.clone(),
                signature: Arc::new(other.clone()),
                examples: None,
                other: Some(Arc::from(key)),
            });
        }
        match key {
            "" | DEFAULT_SIGNATURE => Ok(Target { other: None, ..self.clone() }),
            _ => Err(Error::invalid_argument(format!("No signature was found with the name: \"{key}\" on {self}"))),
        }
    }

    /// What clients send and receive.
    pub fn signature(&self) -> &Signature {
        &self.signature
    }

    /// How `tf.Example`s fill its inputs, or why it takes none (naming
    /// `call`, the API that needs them).
    pub fn examples(&self, call: &str) -> Result<&ExampleColumns> {
        self.examples.as_deref().ok_or_else(|| {
            Error::invalid_argument(format!(
                "{self} takes no tf.Examples, so it cannot answer {call}; declare how features fill its inputs in \
                 the config's `examples` table"
            ))
        })
    }

    /// How `tf.Example`s fill its inputs, when the pipeline takes them.
    pub fn example_columns(&self) -> Option<&ExampleColumns> {
        self.examples.as_deref()
    }

    /// Starts a request that names `inputs` and asks for the outputs
    /// `output_filter` selects (all when empty): both are checked here,
    /// then the pipeline admits the request (as its `priority` may be) or
    /// refuses it, all before any tensor is decoded. The admission is held
    /// until the request is answered.
    pub fn request<'n>(
        &self,
        inputs: impl Iterator<Item = &'n str> + Clone,
        output_filter: &[String],
        deadline: Deadline,
        priority: Priority,
    ) -> Result<RequestBuilder<'_>> {
        let signature = self.signature();
        signature.check_input_names(self, inputs)?;
        let outputs = signature.resolve_output_filter(self, output_filter)?;
        let admitted = super::trace::current_step("admission")
            .in_scope(|| self.pipeline.admission.try_admit(priority, deadline))?;
        Ok(RequestBuilder {
            target: self,
            signature,
            slots: vec![None; signature.inputs.len()],
            outputs,
            deadline,
            priority,
            admitted,
        })
    }
}

/// A request whose inputs are exactly the target's, each checked against
/// its spec, in signature order: the only thing the pipeline runs.
pub struct ValidRequest {
    target: Target,
    inputs: Vec<Tensor>,
    /// Output indexes to answer with, in answer order.
    outputs: Vec<usize>,
    deadline: Deadline,
    priority: Priority,
    /// Its place in the pipeline's admission, freed once it is answered.
    admitted: AdmissionPermit,
}

impl ValidRequest {
    /// Runs the request through its pipeline; returns the outputs it asked
    /// for, by name, in signature order unless its filter ordered them.
    pub async fn run(self) -> Result<Vec<(String, Tensor)>> {
        let ValidRequest { target, inputs, outputs: selected, deadline, priority, mut admitted } = self;
        let signature = target.signature();
        // Sampled before it runs; the inputs are shared, not copied.
        let log = target.pipeline.model().request_log().as_ref().filter(|log| log.sample()).cloned();
        let logged_inputs = log.as_ref().map(|_| inputs.clone());
        // Bounding the whole wait by the deadline also drops the request
        // from whatever queue it is in: the queues skip requests whose
        // caller has gone.
        let outputs = match &target.other {
            None => {
                deadline
                    .run(
                        "while queued or running",
                        target.pipeline.predict(&target.version, signature, inputs, deadline, priority),
                    )
                    .await
            }
            Some(key) => {
                let backend = target.version.loaded().backend();
                deadline.run("while queued or running", backend.run_other(key, inputs)).await
            }
        };
        // The batch queue dropped it as stale (waited past its bound under
        // a standing queue): the admission let in more than the queue
        // serves in time. (A full batch queue is a burst's, not a sign
        // the places are too many.)
        if let Err(Error::LimitExceeded(_)) = &outputs {
            admitted.dropped_downstream();
        }
        let outputs = outputs?;
        if outputs.len() != signature.outputs.len() {
            return Err(Error::internal(format!(
                "{target} returned {} outputs, but its signature has {}",
                outputs.len(),
                signature.outputs.len()
            )));
        }
        // Only a logged request needs to know (its output_filter).
        let all_in_order = log.is_some() && selected.iter().copied().eq(0..signature.outputs.len());
        let mut taken: Vec<Option<Tensor>> = outputs.into_iter().map(Some).collect();
        let answer: Vec<(String, Tensor)> = selected
            .into_iter()
            .filter_map(|i| taken[i].take().map(|t| (signature.outputs[i].name.clone(), t)))
            .collect();
        if let (Some(log), Some(inputs)) = (log, logged_inputs) {
            log.submit(LogEntry {
                name: target.pipeline.name_label(),
                version: target.version.version(),
                signature: target.signature.clone(),
                inputs,
                output_filter: if all_in_order { Vec::new() } else { answer.iter().map(|(n, _)| n.clone()).collect() },
                outputs: answer.clone(),
            });
        }
        Ok(answer)
    }

    /// Its inputs, in signature order.
    pub fn inputs(&self) -> &[Tensor] {
        &self.inputs
    }
}

/// A request being validated: started by [`Target::request`], fed each
/// decoded input with [`RequestBuilder::put`], ended by
/// [`RequestBuilder::finish`].
pub struct RequestBuilder<'a> {
    target: &'a Target,
    signature: &'a Signature,
    slots: Vec<Option<Tensor>>,
    outputs: Vec<usize>,
    deadline: Deadline,
    priority: Priority,
    admitted: AdmissionPermit,
}

impl RequestBuilder<'_> {
    /// The signature the request is checked against.
    pub fn signature(&self) -> &Signature {
        self.signature
    }

    /// Adds input `name` (one of the names the request started with),
    /// checked against its spec: dtype, rank, fixed dimensions.
    pub fn put(&mut self, name: &str, tensor: Tensor) -> Result<()> {
        let index = self.signature.inputs.iter().position(|spec| spec.name == name).ok_or_else(|| {
            Error::internal(format!("input '{name}' was not among the request's names, this is a bug"))
        })?;
        check_tensor(self.target, "input", &self.signature.inputs[index], &tensor)?;
        if self.slots[index].replace(tensor).is_some() {
            return Err(Error::invalid_argument(format!("input '{name}' is given twice")));
        }
        Ok(())
    }

    /// Checks that every input is there and that batched inputs agree on
    /// their rows: the request is valid.
    pub fn finish(self) -> Result<ValidRequest> {
        let specs = &self.signature.inputs;
        let mut inputs = Vec::with_capacity(specs.len());
        for (spec, slot) in specs.iter().zip(self.slots) {
            let tensor = slot.ok_or_else(|| {
                Error::invalid_argument(format!(
                    "missing input '{}' ({} {}); {} expects it",
                    spec.name,
                    spec.dtype,
                    format_shape(&spec.shape),
                    self.target
                ))
            })?;
            inputs.push(tensor);
        }
        // A graph's inputs need not share their rows (one user, many
        // items): each model step checks the rows it is given.
        if self.signature.is_batched() && !self.target.pipeline.is_graph() {
            self.signature.check_rows(self.target, &inputs)?;
        }
        Ok(ValidRequest {
            target: self.target.clone(),
            inputs,
            outputs: self.outputs,
            deadline: self.deadline,
            priority: self.priority,
            admitted: self.admitted,
        })
    }
}
