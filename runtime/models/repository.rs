//! Model discovery on disk in TF Serving's layout, `BASE/VERSION/model.onnx`
//! or `BASE/VERSION/saved_model.pb` (a SavedModel), and the version policy
//! that picks which versions to load.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::config::VersionPolicy;
use crate::error::{Error, Result};

/// The file an ONNX version directory holds.
pub const MODEL_FILE: &str = "model.onnx";

/// The file a SavedModel version directory holds.
pub use crate::infer::tensorflow::SAVED_MODEL_FILE;

/// The versions found under `base_path`: each numeric subdirectory that
/// holds a `model.onnx` or a `saved_model.pb` (that file's path; ONNX when
/// both are there). Other entries (temporary directories of an upload in
/// progress, say) are ignored.
pub fn discover(base_path: &Path) -> Result<BTreeMap<i64, PathBuf>> {
    let entries = std::fs::read_dir(base_path)
        .map_err(|e| Error::not_found(format!("cannot read model base path {}: {e}", base_path.display())))?;
    let mut versions = BTreeMap::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::internal(format!("reading {}: {e}", base_path.display())))?;
        let name = entry.file_name();
        let Some(version) = name.to_str().and_then(|n| n.parse::<i64>().ok()).filter(|v| *v >= 0) else {
            continue;
        };
        match [MODEL_FILE, SAVED_MODEL_FILE].into_iter().map(|name| entry.path().join(name)).find(|f| f.is_file()) {
            Some(file) => {
                versions.insert(version, file);
            }
            None => tracing::warn!(
                path = %entry.path().display(),
                "version directory without {MODEL_FILE} or {SAVED_MODEL_FILE}; skipped"
            ),
        }
    }
    Ok(versions)
}

/// The versions to load under `policy`, from those found in `place` (a
/// base path, or upstreams).
pub fn select<V: Clone>(found: &BTreeMap<i64, V>, policy: &VersionPolicy, place: &str) -> Result<BTreeMap<i64, V>> {
    if found.is_empty() {
        return Err(Error::not_found(format!(
            "no versions under {place}: expected {place}/<version>/{MODEL_FILE} or {place}/<version>/{SAVED_MODEL_FILE}"
        )));
    }
    if let VersionPolicy::Specific(wanted) = policy {
        if let Some(v) = wanted.iter().find(|v| !found.contains_key(v)) {
            let have: Vec<String> = found.keys().map(i64::to_string).collect();
            return Err(Error::not_found(format!("version {v} is not under {place} (found: {})", have.join(", "))));
        }
    }
    Ok(select_present(found, policy))
}

/// The versions `policy` wants among those present, for polling: a
/// specific version not (yet) in the repository is skipped, not an error.
pub fn select_present<V: Clone>(found: &BTreeMap<i64, V>, policy: &VersionPolicy) -> BTreeMap<i64, V> {
    match policy {
        VersionPolicy::Specific(wanted) => {
            found.iter().filter(|(v, _)| wanted.contains(v)).map(|(v, p)| (*v, p.clone())).collect()
        }
        VersionPolicy::All => found.clone(),
        VersionPolicy::Latest(n) => found.iter().rev().take(*n).map(|(v, p)| (*v, p.clone())).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(versions: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for v in versions {
            std::fs::create_dir_all(dir.path().join(v)).unwrap();
            std::fs::write(dir.path().join(v).join(MODEL_FILE), b"x").unwrap();
        }
        std::fs::create_dir_all(dir.path().join("7")).unwrap(); // no model file
        std::fs::create_dir_all(dir.path().join("tmp-upload")).unwrap();
        dir
    }

    #[test]
    fn discovers_numeric_versions_with_a_model_file() {
        let dir = layout(&["1", "2", "10"]);
        let found = discover(dir.path()).unwrap();
        assert_eq!(found.keys().copied().collect::<Vec<_>>(), vec![1, 2, 10]);
    }

    #[test]
    fn policies_choose_versions() {
        let dir = layout(&["1", "2", "10"]);
        let found = discover(dir.path()).unwrap();
        let keys = |p: VersionPolicy| {
            select(&found, &p, &dir.path().display().to_string()).unwrap().keys().copied().collect::<Vec<_>>()
        };
        assert_eq!(keys(VersionPolicy::Latest(1)), vec![10]);
        assert_eq!(keys(VersionPolicy::Latest(2)), vec![2, 10]);
        assert_eq!(keys(VersionPolicy::All), vec![1, 2, 10]);
        assert_eq!(keys(VersionPolicy::Specific(vec![1])), vec![1]);
        let present = select_present(&found, &VersionPolicy::Specific(vec![2, 3]));
        assert_eq!(present.keys().copied().collect::<Vec<_>>(), vec![2]);
        let err = select(&found, &VersionPolicy::Specific(vec![3]), &dir.path().display().to_string()).unwrap_err();
        assert!(err.message().contains("version 3"), "{err}");
        assert!(err.message().contains("1, 2, 10"), "{err}");
    }

    #[test]
    fn empty_or_missing_base_path_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let found = discover(dir.path()).unwrap();
        assert!(select(&found, &VersionPolicy::All, &dir.path().display().to_string())
            .unwrap_err()
            .message()
            .contains("no versions"));
        assert!(discover(&dir.path().join("nope")).is_err());
    }
}
