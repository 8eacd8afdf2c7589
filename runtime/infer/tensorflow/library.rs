//! Finding and loading TensorFlow's C library, once per process.
//!
//! Only a server that serves a SavedModel loads it: a version directory
//! with `saved_model.pb` asks for it on its first load, and a missing
//! library fails that version (named, with how to get it) while every ONNX
//! model serves. The library comes from the `tensorflow-cpu` PyPI wheel,
//! whose `tensorflow/libtensorflow_cc.so.2` exports the whole C API
//! (`scripts/setup` installs it into `.cache/tf-venv/`), or from
//! TensorFlow's C release (`libtensorflow.so.2`).

use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::ffi::Api;
use crate::error::{Error, Result};

/// The environment variable naming the library, like the flag.
pub const LIBRARY_ENV: &str = "TENSORFLOW_LIBRARY";

const WHEEL_LIBRARY: &str = "libtensorflow_cc.so.2";
const C_LIBRARY: &str = "libtensorflow.so.2";

static API: OnceLock<Result<Api>> = OnceLock::new();

/// The places searched, in order. A path given explicitly (the flag, the
/// config or `TENSORFLOW_LIBRARY`) is the only one. Otherwise the wheel in
/// `.cache/tf-venv/` of the current directory and of the directories above
/// the executable (a checkout's `target/` sits below it), then the system
/// library directories.
pub fn candidates(explicit: Option<&Path>) -> Vec<PathBuf> {
    if let Some(path) = explicit {
        return vec![path.to_path_buf()];
    }
    if let Some(path) = std::env::var_os(LIBRARY_ENV) {
        return vec![PathBuf::from(path)];
    }
    let mut paths = Vec::new();
    for root in search_roots() {
        let lib = root.join(".cache/tf-venv/lib");
        let Ok(entries) = std::fs::read_dir(&lib) else { continue };
        let mut pythons: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        pythons.sort();
        for python in pythons {
            let path = python.join("site-packages/tensorflow").join(WHEEL_LIBRARY);
            if !paths.contains(&path) {
                paths.push(path);
            }
        }
    }
    for dir in ["/usr/local/lib", "/usr/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu"] {
        paths.push(Path::new(dir).join(C_LIBRARY));
        paths.push(Path::new(dir).join(WHEEL_LIBRARY));
    }
    paths
}

/// The directories whose `.cache/tf-venv/` may hold TensorFlow: the
/// current one and those above the executable (a checkout's `target/`
/// sits below it).
pub fn search_roots() -> Vec<PathBuf> {
    let mut roots = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        roots.push(cwd);
    }
    if let Ok(exe) = std::env::current_exe() {
        roots.extend(exe.ancestors().skip(1).take(6).map(Path::to_path_buf));
    }
    roots
}

/// The process-wide C API, loading the library on first use. Later calls
/// return the same one whatever path they pass.
pub fn api(explicit: Option<&Path>) -> Result<&'static Api> {
    API.get_or_init(|| load(explicit)).as_ref().map_err(Error::clone)
}

/// The error of a SavedModel version when no candidate exists: where it
/// looked and how to get the library.
pub fn missing(explicit: Option<&Path>) -> Error {
    let list: Vec<String> = candidates(explicit).iter().map(|p| format!("  {}", p.display())).collect();
    Error::unavailable(format!(
            "this version is a TensorFlow SavedModel, and TensorFlow's library ({WHEEL_LIBRARY} from the \
             tensorflow-cpu wheel, or {C_LIBRARY}) was not found; looked in:\n{}\n\
             run scripts/setup to install it (pip install tensorflow-cpu into .cache/tf-venv), or pass --tensorflow_library PATH (or set {LIBRARY_ENV})",
            list.join("\n")
    ))
}

fn load(explicit: Option<&Path>) -> Result<Api> {
    let searched = candidates(explicit);
    let Some(path) = searched.iter().find(|p| p.is_file()) else {
        return Err(missing(explicit));
    };
    let path = path.canonicalize().unwrap_or_else(|_| path.clone());
    // SAFETY: loading runs the library's initialisers; TensorFlow's are
    // its op and kernel registrations, which have no preconditions.
    let library = unsafe { libloading::Library::new(&path) }
        .map_err(|e| Error::unavailable(format!("loading TensorFlow from {} failed: {e}", path.display())))?;
    // SAFETY: the file is TensorFlow's library (by name, where it was
    // looked for); the declared signatures are those of its C API.
    let api = unsafe { Api::resolve(library) }
        .map_err(|e| Error::unavailable(format!("{} is not TensorFlow's C API: {e}", path.display())))?;
    // SAFETY: TF_Version returns a static NUL-terminated string.
    let version = unsafe { CStr::from_ptr((api.version)()) }.to_string_lossy().into_owned();
    tracing::info!(library = %path.display(), %version, "loaded TensorFlow");
    Ok(api)
}
