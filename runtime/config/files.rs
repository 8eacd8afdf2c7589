//! `sluice config check`: everything a config file refers to on disk,
//! checked without loading a model or compiling a plugin — model
//! repositories and the versions the policies pick, version labels,
//! plugin files, label files, the ONNX Runtime library.
//!
//! The server makes the same checks while loading; this runs them in a
//! second, before a deploy, and reports what would be served.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::{Config, ConfigError};
use crate::models::repository;

/// What a valid config serves, one line per model and pipeline.
#[derive(Debug)]
pub struct Summary {
    lines: Vec<String>,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for line in &self.lines {
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}

/// Reads, parses and checks `path`, then checks everything it refers to.
pub fn check(path: &Path) -> Result<Summary, ConfigError> {
    let config = Config::from_file(path)?;
    let source = path.display().to_string();
    check_files(&config).map_err(|message| ConfigError { source, message })
}

/// The on-disk checks of a parsed config; errors name the key and the value.
pub fn check_files(config: &Config) -> Result<Summary, String> {
    let mut lines = Vec::new();
    if config.models.is_empty() {
        return Err("no [[models]]: the file serves nothing; add a [[models]] table with name and base_path".into());
    }
    for (i, model) in config.models.iter().enumerate() {
        let key = format!("models[{i}]");
        let base = &model.base_path;
        let at = || format!("{key}.base_path = \"{}\"", base.display());
        match std::fs::metadata(base) {
            Err(e) => return Err(format!("{}: {e}", at())),
            Ok(meta) if !meta.is_dir() => return Err(format!("{}: not a directory", at())),
            Ok(_) => {}
        }
        let found = repository::discover(base).map_err(|e| format!("{}: {}", at(), e.message()))?;
        let chosen = repository::select(&found, &model.version_policy, base)
            .map_err(|e| format!("{key}.version_policy: {}", e.message()))?;
        for (label, version) in &model.version_labels {
            if !chosen.contains_key(version) {
                let loaded: Vec<String> = chosen.keys().map(i64::to_string).collect();
                return Err(format!(
                    "{key}.version_labels.{label} = {version}: version {version} is not among the versions loaded ({})",
                    loaded.join(", ")
                ));
            }
        }
        let versions: Vec<String> = chosen.keys().map(i64::to_string).collect();
        let mut line = format!("model '{}': versions {}", model.name, versions.join(", "));
        if !model.version_labels.is_empty() {
            let labels: Vec<String> = model.version_labels.iter().map(|(l, v)| format!("{l}={v}")).collect();
            let _ = write!(line, "; labels {}", labels.join(", "));
        }
        if let Some(batching) = &model.batching {
            let _ = write!(line, "; batching up to {} rows", batching.max_batch_size);
        }
        lines.push(line);
    }
    if let Some(dir) = &config.plugins.dir {
        if !dir.is_dir() {
            return Err(format!("plugins.dir = \"{}\": not a directory", dir.display()));
        }
    }
    for (i, pipeline) in config.pipelines.iter().enumerate() {
        let mut stages = Vec::new();
        for (role, stage) in [("preprocess", &pipeline.preprocess), ("postprocess", &pipeline.postprocess)] {
            let Some(stage) = stage else { continue };
            let key = format!("pipelines[{i}].{role}");
            if let (Some(plugin), Some(dir)) = (&stage.plugin, &config.plugins.dir) {
                let file = dir.join(format!("{plugin}.wasm"));
                if !file.is_file() {
                    return Err(format!(
                        "{key}.plugin = \"{plugin}\": {} does not exist; plugins are NAME.wasm files in plugins.dir",
                        file.display()
                    ));
                }
                stages.push(format!("{role} plugin {plugin}"));
            }
            if let Some(labels) = stage.top_k.as_ref().and_then(|t| t.labels.as_ref()) {
                readable(labels).map_err(|e| format!("{key}.top_k.labels = \"{}\": {e}", labels.display()))?;
            }
            for (name, on) in [
                ("image_normalize", stage.image_normalize.is_some()),
                ("softmax", stage.softmax.is_some()),
                ("argmax", stage.argmax.is_some()),
                ("top_k", stage.top_k.is_some()),
            ] {
                if on {
                    stages.push(format!("{role} {name}"));
                }
            }
        }
        lines.push(format!(
            "pipeline '{}': model '{}', {} mode{}{}",
            pipeline.name,
            pipeline.model,
            match pipeline.mode {
                crate::pipeline::Mode::Pipelined => "pipelined",
                crate::pipeline::Mode::Sequential => "sequential",
            },
            if stages.is_empty() { "" } else { ", " },
            stages.join(", ")
        ));
    }
    if let Some(library) = &config.onnxruntime.library {
        readable(library).map_err(|e| format!("onnxruntime.library = \"{}\": {e}", library.display()))?;
    }
    lines.push(format!(
        "server: gRPC on {host}:{}, HTTP on {host}:{}",
        config.server.port,
        config.server.rest_api_port,
        host = config.server.host
    ));
    Ok(Summary { lines })
}

fn readable(path: &PathBuf) -> Result<(), String> {
    std::fs::File::open(path).map(drop).map_err(|e| format!("cannot be read: {e}"))
}
