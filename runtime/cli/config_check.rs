//! `sluice config check`: everything a config file refers to on disk,
//! checked without loading a model or compiling a plugin — model
//! repositories and the versions the policies pick, version labels,
//! plugin files, label files, embedded feature tables (read in full), the
//! ONNX Runtime library.
//!
//! The server makes the same checks while loading; this runs them in a
//! second, before a deploy, and reports what would be served.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::config::{Config, ConfigError, Invalid, Mode, StageKind};
use crate::feature;
use crate::invalid;
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
    check_files(&config).map_err(|e| e.in_file(source))
}

/// The on-disk checks of a parsed config; errors name the key and the value.
pub fn check_files(config: &Config) -> Result<Summary, Invalid> {
    let mut lines = Vec::new();
    if config.models.is_empty() {
        return Err(invalid!("no [[models]]: the file serves nothing; add a [[models]] table with name and base_path"));
    }
    for (i, model) in config.models.iter().enumerate() {
        let key = format!("models[{i}]");
        let base = &model.base_path;
        let at = || format!("{key}.base_path = \"{}\"", base.display());
        match std::fs::metadata(base) {
            Err(e) => return Err(invalid!("{}: {e}", at())),
            Ok(meta) if !meta.is_dir() => return Err(invalid!("{}: not a directory", at())),
            Ok(_) => {}
        }
        let found = repository::discover(base).map_err(|e| invalid!("{}: {}", at(), e.message()))?;
        let chosen = repository::select(&found, &model.version_policy, base)
            .map_err(|e| invalid!("{key}.version_policy: {}", e.message()))?;
        for (label, version) in &model.version_labels {
            if !chosen.contains_key(version) {
                let loaded: Vec<String> = chosen.keys().map(i64::to_string).collect();
                return Err(invalid!(
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
            return Err(invalid!("plugins.dir = \"{}\": not a directory", dir.display()));
        }
    }
    for (name, table) in &config.features.tables {
        let line = match &table.file {
            Some(path) => {
                let schema = feature::Schema::of(name, table);
                let data = feature::file::read(path, &schema, &table.key)
                    .map_err(|e| invalid!("features.tables.{name}.file: {}", e.message()))?;
                format!("feature table '{name}': embedded, {} rows from {}", data.len(), path.display())
            }
            None => format!(
                "feature table '{name}': redis {}, hashes {}KEY",
                config.features.redis.as_ref().map_or("", |r| r.url.as_str()),
                table.redis_prefix(name)
            ),
        };
        lines.push(line);
    }
    for (i, pipeline) in config.pipelines.iter().enumerate() {
        let mut stages = Vec::new();
        if let Some(fetch) = &pipeline.feature_fetch {
            let tables: Vec<&str> = fetch.lookups.iter().map(|l| l.table.as_str()).collect();
            stages.push(format!("feature fetch from {}", tables.join(", ")));
        }
        for (role, stage) in pipeline.stages() {
            let role = role.key();
            let key = format!("pipelines[{i}].{role}");
            match stage.kind() {
                Some(StageKind::Plugin(plugin)) => {
                    if let Some(dir) = &config.plugins.dir {
                        let file = dir.join(format!("{plugin}.wasm"));
                        if !file.is_file() {
                            return Err(invalid!(
                                "{key}.plugin = \"{plugin}\": {} does not exist; plugins are NAME.wasm files in plugins.dir",
                                file.display()
                            ));
                        }
                    }
                    stages.push(format!("{role} plugin {plugin}"));
                }
                Some(kind) => {
                    if let StageKind::TopK(top_k) = kind {
                        if let Some(labels) = &top_k.labels {
                            readable(labels)
                                .map_err(|e| invalid!("{key}.top_k.labels = \"{}\": {e}", labels.display()))?;
                        }
                    }
                    stages.push(format!("{role} {}", kind.name()));
                }
                None => {}
            }
        }
        lines.push(format!(
            "pipeline '{}': model '{}', {} mode{}{}",
            pipeline.name,
            pipeline.model,
            match pipeline.mode {
                Mode::Pipelined => "pipelined",
                Mode::Sequential => "sequential",
            },
            if stages.is_empty() { "" } else { ", " },
            stages.join(", ")
        ));
    }
    if let Some(library) = &config.onnxruntime.library {
        readable(library).map_err(|e| invalid!("onnxruntime.library = \"{}\": {e}", library.display()))?;
    }
    lines.push(format!(
        "server: gRPC on {host}:{}, HTTP on {host}:{}",
        config.server.port,
        config.server.rest_api_port,
        host = config.server.host
    ));
    Ok(Summary { lines })
}

fn readable(path: &PathBuf) -> anyhow::Result<()> {
    std::fs::File::open(path).map(drop).map_err(|e| anyhow::anyhow!("cannot be read: {e}"))
}
