//! Fitting a pipeline's stages to each model version at build: what the
//! feature fetch and the preprocess stage take (or the model), what the
//! postprocess stage returns (or the model), and how `tf.Example`s fill
//! those inputs. This is the one check that the stages fit each other and
//! the model; requests rely on it.

use std::sync::Arc;

use super::fetch::FeatureFetch;
use super::stage::StageRunner;
use crate::config::ExamplesConfig;
use crate::error::{Error, Result};
use crate::models::ModelVersion;
use crate::tensor::example::ExampleColumns;
use crate::tensor::spec::{fits, Signature, TensorSpec};

/// What clients see of one model version behind a pipeline.
#[derive(Clone)]
pub struct EntryPoint {
    /// The inputs clients send and the outputs they receive.
    pub signature: Arc<Signature>,
    /// How `tf.Example`s fill those inputs; `None` when the pipeline takes
    /// none.
    pub examples: Option<Arc<ExampleColumns>>,
}

impl EntryPoint {
    /// `signature`, with `examples` checked against it.
    pub(super) fn new(
        signature: Signature,
        examples: Option<&ExamplesConfig>,
        owner: &dyn std::fmt::Display,
    ) -> Result<Self> {
        let examples =
            examples.map(|config| ExampleColumns::new(config, &signature, owner).map(Arc::new)).transpose()?;
        Ok(EntryPoint { signature: Arc::new(signature), examples })
    }
}

/// A pipeline's stages, for [`client_signature`].
pub(super) struct Stages<'a> {
    pub(super) fetch: Option<&'a FeatureFetch>,
    pub(super) pre: Option<&'a StageRunner>,
    pub(super) post: Option<&'a StageRunner>,
}

/// Checks the stages against one model version and returns what clients
/// see: what the feature fetch and the preprocess stage take (or the
/// model), what the postprocess stage returns (or the model). This is the
/// one check that the stages fit each other and the model; requests rely
/// on it.
pub(super) fn client_signature(version: &ModelVersion, stages: &Stages<'_>) -> Result<Signature> {
    let model = version.signature();
    let mut signature = model.clone();
    if let Some(pre) = stages.pre {
        for wanted in &model.inputs {
            let given = pre.stage().outputs().iter().find(|o| o.name == wanted.name).ok_or_else(|| {
                Error::invalid_argument(format!(
                    "preprocess ({}) does not produce '{}', an input of {version}",
                    pre.stage().name(),
                    wanted.name
                ))
            })?;
            fits(given, wanted).map_err(|e| e.context(format_args!("preprocess output feeding {version}")))?;
        }
        signature.inputs = pre.stage().inputs().to_vec();
    }
    if let Some(fetch) = stages.fetch {
        signature.inputs = fetch_inputs(fetch, &signature.inputs, stages.pre.map(|pre| pre.stage().name()), version)?;
    }
    if let Some(post) = stages.post {
        for wanted in post.stage().inputs() {
            let given = model.outputs.iter().find(|o| o.name == wanted.name).ok_or_else(|| {
                Error::invalid_argument(format!(
                    "postprocess ({}) reads '{}', which is not an output of {version}",
                    post.stage().name(),
                    wanted.name
                ))
            })?;
            fits(given, wanted).map_err(|e| e.context(format_args!("output of {version} feeding postprocess")))?;
        }
        signature.outputs = post.stage().outputs().to_vec();
    }
    Ok(signature)
}

/// What clients give a pipeline whose feature fetch feeds `next` (the
/// preprocess stage's inputs, or the model's): the lookups' keys, then
/// what `next` takes that no lookup makes. Every fetched tensor must be
/// taken by `next` and fit it.
fn fetch_inputs(
    fetch: &FeatureFetch,
    next: &[TensorSpec],
    pre: Option<&str>,
    version: &ModelVersion,
) -> Result<Vec<TensorSpec>> {
    let next_name = || pre.map_or_else(|| version.to_string(), |name| format!("preprocess ({name})"));
    let made = fetch.outputs();
    for given in &made {
        let wanted = next.iter().find(|w| w.name == given.name).ok_or_else(|| {
            Error::invalid_argument(format!(
                "feature_fetch makes '{}', which {} does not take; it takes {:?}",
                given.name,
                next_name(),
                next.iter().map(|s| s.name.as_str()).collect::<Vec<_>>()
            ))
        })?;
        fits(given, wanted).map_err(|e| e.context(format_args!("feature_fetch output feeding {}", next_name())))?;
    }
    let mut inputs = fetch.key_inputs();
    for key in &inputs {
        if let Some(wanted) = next.iter().find(|w| w.name == key.name) {
            fits(key, wanted).map_err(|e| e.context(format_args!("key input passed on to {}", next_name())))?;
        }
    }
    for wanted in next {
        if !made.iter().any(|m| m.name == wanted.name) && !inputs.iter().any(|i| i.name == wanted.name) {
            inputs.push(wanted.clone());
        }
    }
    Ok(inputs)
}
