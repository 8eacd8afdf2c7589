//! ONNX Runtime's optimised graphs, made off the serving path and kept on
//! disk.
//!
//! Graph optimisation is most of the cost of loading a model. It is done
//! once per model file, ONNX Runtime version and provider, in a throwaway
//! session on a thread of low priority (nice 10), which writes the
//! optimised graph to the cache; the serving sessions then load that graph
//! with optimisation off, quickly, on a thread of normal priority, so the
//! threads that will serve requests do not inherit the low priority. A
//! version loaded once before (a rollback, a restart) finds its graph in
//! the cache and skips optimising altogether.
//!
//! The cache directory must be the server's own (owner-only permissions):
//! a graph planted by another user would run in the server.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use ort::environment::Environment;
use ort::session::builder::GraphOptimizationLevel;
use sha2::{Digest, Sha256};

use super::library::ORT_VERSION;
use super::register_execution_provider;
use crate::config::onnx::OnnxOptions;
use crate::error::{Error, Result};

/// Whether a load found its optimised graph in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Found: nothing was optimised.
    Hit,
    /// Optimised now and stored.
    Miss,
}

/// The graph to load `model` from, with optimisation off: the cached one,
/// or one optimised now and cached. `None` when the cache directory cannot
/// be used (said in the log): the caller optimises in place.
pub fn prepare(
    environment: &'static Environment,
    dir: &Path,
    model: &Path,
    options: &OnnxOptions,
) -> Result<Option<(PathBuf, CacheOutcome)>> {
    if let Err(error) = crate::private_files::ensure_private_dir(dir, "optimised model cache") {
        tracing::warn!("{error}; optimising in place instead");
        return Ok(None);
    }
    let file = dir.join(format!("{}-ort{ORT_VERSION}-{:?}.onnx", content_hash(model)?, options.execution_provider));
    if file.exists() {
        match crate::private_files::check_trusted_file(&file) {
            Ok(()) => return Ok(Some((file, CacheOutcome::Hit))),
            Err(refused) => {
                tracing::warn!("optimised model cache: {refused}; optimising again");
                discard(&file);
            }
        }
    }
    static TEMPORARY: AtomicU64 = AtomicU64::new(0);
    let partial =
        dir.join(format!(".partial-{}-{}.onnx", std::process::id(), TEMPORARY.fetch_add(1, Ordering::Relaxed)));
    let (model, options, out) = (model.to_path_buf(), options.clone(), partial.clone());
    // In the background: a load under traffic takes the CPU serving leaves.
    let optimised =
        crate::threads::spawn_background("optimise".into(), move || optimise(environment, &model, &options, &out))
            .map_err(|e| Error::internal(format!("starting the optimising thread failed: {e}")))?
            .join()
            .map_err(|_| Error::internal("the optimising thread panicked"));
    let result = optimised.and_then(|r| r).and_then(|()| {
        // Whole or not at all: a crash mid-write leaves a partial file
        // that no load ever takes.
        // Owner-only, as loads check (`private_files::check_trusted_file`).
        std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o600))
            .and_then(|()| std::fs::rename(&partial, &file))
            .map_err(|e| Error::internal(format!("storing the optimised graph {}: {e}", file.display())))
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result.map(|()| Some((file, CacheOutcome::Miss)))
}

/// The level to load a graph from [`prepare`] with.
pub const LOAD_LEVEL: GraphOptimizationLevel = GraphOptimizationLevel::Disable;

fn optimise(environment: &'static Environment, model: &Path, options: &OnnxOptions, out: &Path) -> Result<()> {
    let convert = |e: ort::Error<ort::session::builder::SessionBuilder>| {
        Error::internal(format!("configuring ONNX Runtime failed: {}", e.message()))
    };
    let builder = ort::session::Session::builder(environment)
        .map_err(|e| Error::internal(format!("creating an ONNX Runtime session failed: {}", e.message())))?
        .with_optimization_level(GraphOptimizationLevel::Level3)
        .map_err(convert)?
        .with_intra_threads(1)
        .map_err(convert)?
        .with_optimized_model_path(out)
        .map_err(convert)?;
    let mut builder = register_execution_provider(builder, options)?;
    let session = builder
        .commit_from_file(model)
        .map_err(|e| Error::internal(format!("ONNX Runtime could not load {}: {}", model.display(), e.message())))?;
    drop(session);
    Ok(())
}

/// The first 16 bytes of the file's SHA-256, in hex.
fn content_hash(model: &Path) -> Result<String> {
    let cannot = |e: std::io::Error| Error::invalid_argument(format!("cannot read {}: {e}", model.display()));
    let mut file = std::fs::File::open(model).map_err(cannot)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buffer).map_err(cannot)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok(hex::encode(&hasher.finalize()[..16]))
}

/// Removes a cached graph that would not load, so the next load makes it
/// again.
pub fn discard(file: &Path) {
    if let Err(e) = std::fs::remove_file(file) {
        tracing::warn!(file = %file.display(), "cannot remove a cached graph that did not load: {e}");
    }
}
