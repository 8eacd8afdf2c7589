//! What can be known of a SavedModel without TensorFlow: its
//! `saved_model.pb` read with prost, the MetaGraph its tags pick, and each
//! signature checked as the backend checks it at load (a dtype sluice does
//! not serve, a sparse tensor); and whether TensorFlow's library would be
//! found. `sluice config check` runs this before a deploy, in milliseconds,
//! where a load would start TensorFlow.

use std::collections::BTreeSet;
use std::path::Path;

use prost::Message;

use super::library;
use super::SAVED_MODEL_FILE;
use crate::error::{Error, Result};
use crate::proto::tensorflow::{tensor_info, SavedModel};
use crate::tensor::proto::signature_of_def;

/// The key of the signature TensorFlow adds for its init op, not served.
const INIT_OP_SIGNATURE: &str = "__saved_model_init_op";

/// Checks the SavedModel in `dir` as a load with `tags` would, without
/// loading it, and that TensorFlow's library is found (`library` as the
/// flag or config gives it). Answers the signatures it serves.
pub fn check(dir: &Path, tags: &[String], library: Option<&Path>) -> Result<Vec<String>> {
    if !library::candidates(library).iter().any(|path| path.is_file()) {
        return Err(library::missing(library));
    }
    let file = dir.join(SAVED_MODEL_FILE);
    let bytes = std::fs::read(&file).map_err(|e| Error::invalid_argument(format!("{}: {e}", file.display())))?;
    let saved = SavedModel::decode(bytes.as_slice())
        .map_err(|e| Error::invalid_argument(format!("{}: not a SavedModel: {e}", file.display())))?;
    let wanted: BTreeSet<&str> = tags.iter().map(String::as_str).collect();
    let tag_sets: Vec<BTreeSet<&str>> = saved
        .meta_graphs
        .iter()
        .map(|meta| meta.meta_info_def.iter().flat_map(|info| info.tags.iter().map(String::as_str)).collect())
        .collect();
    let Some(at) = tag_sets.iter().position(|set| *set == wanted) else {
        let available: Vec<String> = tag_sets.iter().map(|set| format!("{set:?}")).collect();
        return Err(Error::invalid_argument(format!(
            "{}: no MetaGraph has exactly the tags {wanted:?} (tensorflow.tags / --saved_model_tags); it has {}",
            file.display(),
            available.join(", ")
        )));
    };
    let mut served = Vec::new();
    for (key, def) in &saved.meta_graphs[at].signature_def {
        if key == INIT_OP_SIGNATURE {
            continue;
        }
        let context = |e: Error| e.context(format_args!("signature '{key}'"));
        signature_of_def(def).map_err(context)?;
        for (role, map) in [("input", &def.inputs), ("output", &def.outputs)] {
            for (name, info) in map {
                if !matches!(info.encoding, Some(tensor_info::Encoding::Name(_))) {
                    return Err(context(Error::invalid_argument(format!(
                        "{role} '{name}' is a sparse or composite tensor, which sluice does not serve"
                    ))));
                }
            }
        }
        served.push(key.clone());
    }
    Ok(served)
}
