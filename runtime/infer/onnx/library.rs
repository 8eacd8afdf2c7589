//! Finding and loading the ONNX Runtime shared library, once per process.
//!
//! `ort` is built with `load-dynamic`: nothing is linked at build time, and
//! the library comes from the `onnxruntime` PyPI wheel that `scripts/setup`
//! unpacks into `.ort/<version>/`. Left to itself, `ort` would look for a
//! bare `libonnxruntime.so` and panic when it is missing, so the path is
//! resolved here first and a miss becomes an error listing every place
//! looked at.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ort::environment::Environment;

use crate::error::{Error, Result};

/// The ONNX Runtime release `ort` 2.0.0-rc.15 is built against (API 31);
/// `scripts/setup` installs the same one.
pub const ORT_VERSION: &str = "1.31.1";

static ENVIRONMENT: OnceLock<Result<Environment>> = OnceLock::new();

fn library_file() -> String {
    format!("libonnxruntime.so.{ORT_VERSION}")
}

/// The places searched, in order. A path given explicitly (the flag, the
/// config or `ORT_DYLIB_PATH`) is the only one: a user who names a library
/// wants that one, not a silent fallback. Otherwise `.ort/<version>/` in
/// the current directory and above the executable (a checkout's `target/`
/// sits below its `.ort/`), then the system library directories.
pub fn candidates(explicit: Option<&Path>) -> Vec<PathBuf> {
    if let Some(path) = explicit {
        return vec![path.to_path_buf()];
    }
    if let Some(path) = std::env::var_os("ORT_DYLIB_PATH") {
        return vec![PathBuf::from(path)];
    }
    let mut paths = Vec::new();
    let relative = Path::new(".ort").join(ORT_VERSION).join(library_file());
    let mut roots = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        roots.push(cwd);
    }
    if let Ok(exe) = std::env::current_exe() {
        roots.extend(exe.ancestors().skip(1).take(6).map(Path::to_path_buf));
    }
    for root in roots {
        let path = root.join(&relative);
        if !paths.contains(&path) {
            paths.push(path);
        }
    }
    for dir in ["/usr/local/lib", "/usr/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu"] {
        paths.push(Path::new(dir).join(library_file()));
        paths.push(Path::new(dir).join("libonnxruntime.so"));
    }
    paths
}

/// The process-wide ONNX Runtime environment, loading the library on first
/// use. Later calls return the same environment whatever path they pass.
pub fn environment(explicit: Option<&Path>) -> Result<&'static Environment> {
    let loaded = ENVIRONMENT.get_or_init(|| load(explicit));
    loaded.as_ref().map_err(Error::clone)
}

fn load(explicit: Option<&Path>) -> Result<Environment> {
    let searched = candidates(explicit);
    let Some(path) = searched.iter().find(|p| p.is_file()) else {
        let list: Vec<String> = searched.iter().map(|p| format!("  {}", p.display())).collect();
        return Err(Error::unavailable(format!(
            "the ONNX Runtime library ({}) was not found; looked in:\n{}\n\
             run scripts/setup to install it, or pass --onnxruntime_library PATH (or set ORT_DYLIB_PATH)",
            library_file(),
            list.join("\n")
        )));
    };
    let path = path.canonicalize().unwrap_or_else(|_| path.clone());
    let builder = ort::init_from(&path)
        .map_err(|e| Error::unavailable(format!("loading ONNX Runtime from {} failed: {e}", path.display())))?;
    let environment = builder
        .with_name("sluice")
        .with_telemetry(false)
        .build()
        .map_err(|e| Error::unavailable(format!("starting ONNX Runtime from {} failed: {e}", path.display())))?;
    tracing::info!(library = %path.display(), "loaded ONNX Runtime");
    Ok(environment)
}
