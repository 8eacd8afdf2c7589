//! The stages a pipeline runs around its model: the built-in transforms
//! ([`builtin`]) and the plugin adapter ([`plugin`]).
//!
//! [`build`] turns a stage's configured kind (`config::StageKind`) into a
//! running [`Stage`]. Adding a built-in stage is a variant (with its config)
//! in `config/stage.rs` and its implementation here, registered by one arm
//! of [`build`]; `docs/ARCHITECTURE.md` walks through it.

pub mod builtin;
pub mod plugin;

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
    Ok(match kind {
        StageKind::ImageNormalize(config) => Arc::new(builtin::ImageNormalize::new(config, model)?),
        StageKind::Softmax(config) => Arc::new(builtin::Softmax::new(config, model)?),
        StageKind::Argmax(config) => Arc::new(builtin::Argmax::new(config, model)?),
        StageKind::TopK(config) => Arc::new(builtin::TopK::new(config, model)?),
        StageKind::Plugin(name) => {
            let registry = registry
                .ok_or_else(|| Error::internal("a plugin stage was built without a plugin registry, this is a bug"))?;
            PluginStage::build(name, place, registry)?
        }
    })
}
