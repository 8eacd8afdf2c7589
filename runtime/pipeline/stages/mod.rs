//! The stages a pipeline runs around its model: the built-in transforms,
//! one file each ([`image_normalize`], [`softmax`], [`argmax`], [`top_k`],
//! with what the postprocess ones share in [`classes`]), the steps that
//! join models in a graph ([`combine`]), and the plugin adapter
//! ([`plugin`]).
//!
//! [`build`] turns a stage's configured kind (`config::StageKind`) into a
//! running [`Stage`]. Adding a built-in stage is a variant (with its config)
//! in `config/stage.rs` and its file here, registered by one arm of
//! [`build`]; `docs/ARCHITECTURE.md` walks through it.

pub mod argmax;
pub mod canary;
mod classes;
pub mod combine;
pub mod image_normalize;
pub mod plugin;
pub mod softmax;
pub mod top_k;

use std::sync::Arc;

use self::plugin::{PluginPlace, PluginStage};
use crate::config::StageKind;
use crate::error::{Error, Result};
use crate::pipeline::stage::Stage;
use crate::plugin::registry::PluginRegistry;
use crate::tensor::spec::Signature;

/// Builds the stage `kind` describes, checked against `model` (the latest
/// version's signature) and, for a plugin, every version of the model.
pub fn build(
    kind: &StageKind,
    model: &Signature,
    place: &PluginPlace<'_>,
    registry: Option<&Arc<PluginRegistry>>,
) -> Result<Arc<dyn Stage>> {
    if let StageKind::Plugin(name) = kind {
        let registry = registry
            .ok_or_else(|| Error::internal("a plugin stage was built without a plugin registry, this is a bug"))?;
        return Ok(PluginStage::build(name, place, registry)?);
    }
    built_in(kind, model)?.ok_or_else(|| Error::internal("a plugin is no built-in stage, this is a bug"))
}

/// The built-in stage `kind` describes, checked against `model`; `None`
/// for a plugin, which needs a registry ([`build`]).
pub fn built_in(kind: &StageKind, model: &Signature) -> Result<Option<Arc<dyn Stage>>> {
    Ok(Some(match kind {
        StageKind::ImageNormalize(config) => Arc::new(image_normalize::ImageNormalize::new(config, model)?),
        StageKind::Softmax(config) => Arc::new(softmax::Softmax::new(config, model)?),
        StageKind::Argmax(config) => Arc::new(argmax::Argmax::new(config, model)?),
        StageKind::TopK(config) => Arc::new(top_k::TopK::new(config, model)?),
        // The graph built-ins read what their step gives them, passed as
        // the outputs of `model` (what a postprocess stage reads).
        StageKind::TopRows(config) => Arc::new(combine::TopRows::new(config, &model.outputs)?),
        StageKind::Gather(_) => Arc::new(combine::Gather::new(&model.outputs)?),
        StageKind::Blend(config) => Arc::new(combine::Blend::new(config, &model.outputs)?),
        StageKind::Dot(_) => Arc::new(combine::Dot::new(&model.outputs)?),
        StageKind::Concat(config) => Arc::new(combine::Concat::new(config, &model.outputs)?),
        StageKind::Plugin(_) => return Ok(None),
    }))
}

/// What the built-in stages' tests share: a classifier signature, logits,
/// and running a stage with no deadline.
#[cfg(test)]
pub(crate) mod testing {
    use crate::error::Result;
    use crate::pipeline::deadline::Deadline;
    use crate::pipeline::stage::{never_gone, Stage, StageCx};
    use crate::tensor::spec::{Signature, TensorSpec};
    use crate::tensor::{DType, NamedTensor, Tensor};

    pub trait ProcessNow {
        fn process_now(&self, inputs: Vec<NamedTensor>) -> Result<Vec<NamedTensor>>;
    }

    impl<S: Stage> ProcessNow for S {
        fn process_now(&self, inputs: Vec<NamedTensor>) -> Result<Vec<NamedTensor>> {
            self.process(inputs, &StageCx::new(Deadline::NONE, &never_gone, 1 << 30))
        }
    }

    pub fn classifier(classes: i64) -> Signature {
        Signature {
            inputs: vec![TensorSpec::new("image", DType::F32, vec![-1, 3, 2, 2])],
            outputs: vec![TensorSpec::new("logits", DType::F32, vec![-1, classes])],
        }
    }

    pub fn logits(rows: &[&[f32]]) -> Vec<NamedTensor> {
        let cols = rows[0].len() as i64;
        let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        vec![NamedTensor::new("logits", Tensor::from_values(vec![rows.len() as i64, cols], &flat))]
    }
}
