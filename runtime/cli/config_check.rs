//! `sluice config check`: everything a config file refers to on disk —
//! TLS certificates and keys (read, and the key matched to the
//! certificate), model repositories and the versions the policies pick, version labels,
//! plugin files, label files, embedded feature tables (read in full), the
//! ONNX Runtime library — and then every configured plugin loaded as the
//! server loads it and checked against the versions of its model the
//! server would load (the check an upload gets).
//!
//! The server makes the same checks while loading; this runs them in a
//! second, before a deploy, and reports what would be served.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use crate::config::{Config, ConfigError, ExamplesConfig, Invalid, Mode, ModelConfig, StageKind, StageRole};
use crate::feature;
use crate::invalid;
use crate::metrics::Metrics;
use crate::models::load_selected;
use crate::models::repository::{self, SAVED_MODEL_FILE};
use crate::pipeline::stages::plugin::plugin_fits;
use crate::plugin::{Plugin, PluginEngine, World};
use crate::tensor::example::ExampleColumns;

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

/// Reads, parses and checks `path`, then checks everything it refers to,
/// plugins against their models last. Runs on a blocking thread: it
/// compiles plugins and loads models.
pub async fn check(path: &Path) -> Result<Summary, ConfigError> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let config = Config::from_file(&path)?;
        let source = path.display().to_string();
        let mut summary = check_files(&config).map_err(|e| e.in_file(source.clone()))?;
        summary.lines.extend(check_examples(&config).map_err(|e| e.in_file(source.clone()))?);
        summary.lines.extend(check_graphs(&config).map_err(|e| e.in_file(source.clone()))?);
        summary.lines.extend(check_plugins(&config).map_err(|e| e.in_file(source))?);
        Ok(summary)
    })
    .await
    .map_err(|e| ConfigError { source: "config check".into(), message: format!("the check failed: {e}") })?
}

/// A model in an object store: listed once with the server's
/// credentials (wrong ones are named here, with the bucket and the
/// operation), and its policy and labels checked against the versions
/// that hold a model. Nothing is downloaded.
fn check_object_store(config: &Config, key: &str, model: &ModelConfig) -> Result<String, Invalid> {
    let real = model.base_path.display().to_string();
    let url = crate::models::storage::shown(&real);
    let runtime =
        tokio::runtime::Handle::try_current().map_err(|e| invalid!("no async runtime to list {url} on: {e}"))?;
    let timeout = std::time::Duration::from_secs(config.storage.request_timeout_secs);
    let found = runtime
        .block_on(crate::models::storage::versions_in(&real, timeout))
        .map_err(|e| invalid!("{key}.base_path = \"{url}\": {}", e.message()))?;
    let chosen = repository::select(&found, &model.version_policy, &url)
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
    let versions: Vec<String> =
        chosen.iter().map(|(v, bytes)| format!("{v} ({:.1} MiB)", *bytes as f64 / 1048576.0)).collect();
    Ok(format!("model '{}': versions {} in {url} (downloaded when served)", model.name, versions.join(", ")))
}

/// Every `examples` table checked against the versions of its model the
/// server would load, as the server checks it: models served under their
/// own name, and pipelines without stages (a pipeline with stages is
/// checked against what its stages take when the server builds it).
fn check_examples(config: &Config) -> Result<Vec<String>, Invalid> {
    let mut wanted: Vec<(String, &ModelConfig, &ExamplesConfig)> = config
        .models
        .iter()
        .filter_map(|m| m.examples.as_ref().map(|e| (format!("model '{}'", m.name), m, e)))
        .collect();
    for pipeline in config.pipelines.iter().filter(|p| p.feature_fetch.is_none() && p.stages().next().is_none()) {
        let (Some(examples), Some(model)) =
            (&pipeline.examples, config.models.iter().find(|m| m.name == pipeline.model))
        else {
            continue;
        };
        wanted.push((format!("pipeline '{}'", pipeline.name), model, examples));
    }
    let mut lines = Vec::new();
    if wanted.is_empty() {
        return Ok(lines);
    }
    let metrics = Metrics::new();
    let runtime =
        tokio::runtime::Handle::try_current().map_err(|e| invalid!("no async runtime to load models on: {e}"))?;
    for (owner, model, examples) in wanted {
        if model.upstream.is_some() {
            continue;
        }
        let versions = runtime
            .block_on(load_selected(model, config.onnxruntime.library.as_deref(), &config.storage, &metrics))
            .map_err(|e| invalid!("{owner}: loading its model: {}", e.message()))?;
        for version in &versions {
            ExampleColumns::new(examples, version.signature(), version.as_ref())
                .map_err(|e| invalid!("{owner}: {}", e.message()))?;
        }
        let tasks: Vec<&str> = [("Classify", examples.classify.is_some()), ("Regress", examples.regress.is_some())]
            .into_iter()
            .filter_map(|(name, on)| on.then_some(name))
            .collect();
        lines.push(format!(
            "{owner}: tf.Examples fill its {} inputs{}",
            examples.features.len(),
            if tasks.is_empty() { String::new() } else { format!(" ({})", tasks.join(", ")) }
        ));
    }
    Ok(lines)
}

/// Every graph pipeline fitted as the server fits it (`pipeline::graph::plan`):
/// the versions of its models the server would load, its plugins as the
/// server would load them, its built-ins built; each version of its own
/// model in turn. A graph with a feature fetch is fitted when the server
/// builds it, with its tables open.
fn check_graphs(config: &Config) -> Result<Vec<String>, Invalid> {
    let graphs: Vec<_> = config.pipelines.iter().filter(|p| p.is_graph()).collect();
    let mut lines = Vec::new();
    if graphs.is_empty() {
        return Ok(lines);
    }
    let metrics = Metrics::new();
    let runtime =
        tokio::runtime::Handle::try_current().map_err(|e| invalid!("no async runtime to load models on: {e}"))?;
    let mut loaded: std::collections::BTreeMap<&str, Vec<Arc<crate::models::ModelVersion>>> = Default::default();
    let engine = if graphs.iter().any(|p| p.uses_plugins()) {
        Some(Arc::new(PluginEngine::new(&config.plugins).map_err(|e| invalid!("plugins: {}", e.message()))?))
    } else {
        None
    };
    for pipeline in graphs {
        let owner = format!("pipeline '{}'", pipeline.name);
        if pipeline.feature_fetch.is_some() {
            lines.push(format!(
                "{owner}: {} steps, fitted when the server opens its feature tables",
                pipeline.steps.len()
            ));
            continue;
        }
        for name in pipeline.models() {
            if loaded.contains_key(name) {
                continue;
            }
            let model = config
                .models
                .iter()
                .find(|m| m.name == name)
                .ok_or_else(|| invalid!("{owner}: model '{name}' is not configured"))?;
            if model.upstream.is_some() {
                return Err(invalid!(
                    "{owner}: model '{name}' is forwarded to TF Serving; a graph step runs a model served here"
                ));
            }
            let versions = runtime
                .block_on(load_selected(model, config.onnxruntime.library.as_deref(), &config.storage, &metrics))
                .map_err(|e| invalid!("{owner}: loading model '{name}': {}", e.message()))?;
            loaded.insert(name, versions);
        }
        let own = loaded.get(pipeline.model.as_str()).cloned().unwrap_or_default();
        let mut fitted = None;
        for chosen in &own {
            let mut signature_of =
                |step: &crate::config::ModelStep| -> crate::error::Result<crate::tensor::spec::Signature> {
                    let versions = loaded.get(step.model.as_str()).map(Vec::as_slice).unwrap_or_default();
                    let labelled = step.version_label.as_ref().map(|label| {
                        config
                            .models
                            .iter()
                            .find(|m| m.name == step.model)
                            .and_then(|m| m.version_labels.get(label).copied())
                    });
                    let wanted = match (step.version, labelled) {
                        (Some(number), _) => Some(number),
                        (None, Some(None)) => {
                            return Err(crate::error::Error::invalid_argument(format!(
                                "version_label = \"{}\": model '{}' has no such label",
                                step.version_label.as_deref().unwrap_or_default(),
                                step.model
                            )))
                        }
                        (None, Some(Some(number))) => Some(number),
                        (None, None) if step.model == pipeline.model => Some(chosen.version()),
                        (None, None) => None,
                    };
                    let version = match wanted {
                        Some(number) => versions.iter().find(|v| v.version() == number),
                        None => versions.iter().max_by_key(|v| v.version()),
                    };
                    version.map(|v| v.signature().clone()).ok_or_else(|| {
                        crate::error::Error::invalid_argument(format!(
                            "model '{}' would load no version {}",
                            step.model,
                            wanted.map_or("at all".to_string(), |n| n.to_string())
                        ))
                    })
                };
            let mut stage_of = |step: &crate::config::StepConfig,
                                kind: &StageKind,
                                reads: Vec<crate::tensor::spec::TensorSpec>|
             -> crate::error::Result<(String, Vec<_>, Vec<_>)> {
                let given = crate::tensor::spec::Signature { inputs: Vec::new(), outputs: reads };
                if let Some(stage) = crate::pipeline::stages::built_in(kind, &given)? {
                    return Ok((stage.name().to_string(), stage.inputs().to_vec(), stage.outputs().to_vec()));
                }
                let StageKind::Plugin(name) = kind else {
                    return Err(crate::error::Error::internal("a built-in was not built, this is a bug"));
                };
                let engine =
                    engine.as_ref().ok_or_else(|| crate::error::Error::internal("no plugin engine, this is a bug"))?;
                let (plugin, _) = load_configured_plugin(config, engine, name)
                    .map_err(|e| crate::error::Error::invalid_argument(format!("step '{}'{e}", step.name)))?;
                let description = plugin.description();
                Ok((format!("plugin {}", plugin.label()), description.inputs.clone(), description.outputs.clone()))
            };
            let plan = crate::pipeline::graph::plan(pipeline, None, &mut signature_of, &mut stage_of).map_err(|e| {
                invalid!("{owner} with model '{}' version {}: {}", pipeline.model, chosen.version(), e.message())
            })?;
            fitted = Some(plan);
        }
        let Some(plan) = fitted else {
            return Err(invalid!("{owner}: model '{}' would load no version", pipeline.model));
        };
        let list = |specs: &[crate::tensor::spec::TensorSpec]| {
            specs.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
        };
        let steps: Vec<String> = pipeline
            .steps
            .iter()
            .zip(&plan.steps)
            .map(|(step, fitted)| match (step.model(), &fitted.stage) {
                (Some(model), _) => format!("{} (model {})", step.name, model.model),
                (None, Some(stage)) => format!("{} ({stage})", step.name),
                (None, None) => step.name.clone(),
            })
            .collect();
        lines.push(format!(
            "{owner}: steps {} fit versions {} of model '{}'; clients send [{}] and get [{}]",
            steps.join(", "),
            own.iter().map(|v| v.version().to_string()).collect::<Vec<_>>().join(", "),
            pipeline.model,
            list(&plan.inputs),
            list(&plan.outputs)
        ));
    }
    Ok(lines)
}

/// Plugin `name` as the server would start it: an upload activated in the
/// store (checked to hash to its name), else `NAME.wasm` in the plugins
/// dir; with which of the two it is. An error is the rest of a message
/// after its key: `": …"`, or `" (which): …"` once the source is known.
fn load_configured_plugin(
    config: &Config,
    engine: &Arc<PluginEngine>,
    name: &str,
) -> std::result::Result<(Plugin, String), String> {
    let file = config.plugins.path_of(name).map_err(|e| format!(": {}", e.message()))?;
    let uploaded = match &config.plugins.dir {
        Some(dir) => crate::plugin::registry::active_upload(dir, name).map_err(|e| format!(": {e}"))?,
        None => None,
    };
    let (path, which) = match &uploaded {
        Some((version, blob)) => (blob.clone(), format!("uploaded version {version}, active in the store")),
        None => (file, "version 0, the file".to_string()),
    };
    let plugin = Plugin::load_file(engine, &path, config.plugins.limits_of(name), None)
        .map_err(|e| format!(" ({which}): {e}"))?;
    if uploaded.is_some() && path.file_stem().and_then(|s| s.to_str()) != Some(plugin.sha256()) {
        return Err(format!(
            " ({which}): {} does not hash to its name (sha256 {}): the stored blob is damaged",
            path.display(),
            plugin.sha256()
        ));
    }
    Ok((plugin, which))
}

/// Every pipeline's plugins, loaded from `[plugins] dir` with their
/// configured limits and checked against the pipeline's model: one line
/// each with what the plugin declares it is and its sha256.
fn check_plugins(config: &Config) -> Result<Vec<String>, Invalid> {
    let mut needed = Vec::new();
    for pipeline in &config.pipelines {
        for (role, stage) in pipeline.stages() {
            if let Some(StageKind::Plugin(name)) = stage.kind() {
                needed.push((pipeline, role, name));
            }
        }
    }
    if needed.is_empty() {
        return Ok(Vec::new());
    }
    let engine = Arc::new(PluginEngine::new(&config.plugins).map_err(|e| invalid!("plugins: {}", e.message()))?);
    let models: Vec<ModelConfig> =
        config.models.iter().filter(|m| needed.iter().any(|(p, ..)| p.model == m.name)).cloned().collect();
    let metrics = Metrics::new();
    let runtime =
        tokio::runtime::Handle::try_current().map_err(|e| invalid!("no async runtime to load models on: {e}"))?;
    let mut loaded = std::collections::BTreeMap::new();
    for model in &models {
        let versions = runtime
            .block_on(load_selected(model, config.onnxruntime.library.as_deref(), &config.storage, &metrics))
            .map_err(|e| invalid!("loading the models the plugins feed: {}", e.message()))?;
        loaded.insert(model.name.clone(), versions);
    }
    let mut lines = Vec::new();
    for (pipeline, role, name) in needed {
        let key = format!("pipeline '{}' {} plugin '{name}'", pipeline.name, role.key());
        // What the server would start with: an upload activated in the
        // store, else the file (version 0).
        let (plugin, which) = load_configured_plugin(config, &engine, name).map_err(|e| invalid!("{key}{e}"))?;
        let model = loaded
            .get(&pipeline.model)
            .ok_or_else(|| invalid!("{key}: model '{}' is not configured", pipeline.model))?;
        let world = match role {
            StageRole::Preprocess => World::Preprocessor,
            StageRole::Postprocess => World::Postprocessor,
        };
        plugin_fits(&plugin, world, model).map_err(|e| invalid!("{key} ({}): {}", plugin.label(), e.message()))?;
        let versions: Vec<String> = model.iter().map(|v| v.version().to_string()).collect();
        let shared = if config.plugins.shared.is_some() {
            "; with [plugins.shared] the shared registry's active version serves"
        } else {
            ""
        };
        lines.push(format!(
            "{key}: {} (sha256 {}, {which}{shared}) fits model '{}' versions {}",
            plugin.label(),
            &plugin.sha256()[..12],
            pipeline.model,
            versions.join(", ")
        ));
    }
    Ok(lines)
}

/// The on-disk checks of a parsed config; errors name the key and the value.
pub fn check_files(config: &Config) -> Result<Summary, Invalid> {
    let mut lines = Vec::new();
    if config.models.is_empty() {
        return Err(invalid!("no [[models]]: the file serves nothing; add a [[models]] table with name and base_path"));
    }
    if let Some(tls) = &config.server.tls {
        crate::server::tls::check(tls).map_err(|e| invalid!("{}", e.message()))?;
        lines.push(format!(
            "TLS on every port{}",
            if tls.client_verify { ", client certificates required" } else { "" }
        ));
    }
    for (i, model) in config.models.iter().enumerate() {
        let key = format!("models[{i}]");
        if let Some(upstream) = &model.upstream {
            // Reached only when serving: the upstreams are another team's
            // servers, and a config check must not depend on them.
            lines.push(format!("{key}: model '{}' forwarded to TF Serving at {:?}", model.name, upstream.endpoints));
            continue;
        }
        let base = &model.base_path;
        let at = || format!("{key}.base_path = \"{}\"", base.display());
        if crate::config::is_object_store_url(base) {
            lines.push(check_object_store(config, &key, model)?);
            continue;
        }
        match std::fs::metadata(base) {
            Err(e) => return Err(invalid!("{}: {e}", at())),
            Ok(meta) if !meta.is_dir() => return Err(invalid!("{}: not a directory", at())),
            Ok(_) => {}
        }
        let found = repository::discover(base).map_err(|e| invalid!("{}: {}", at(), e.message()))?;
        let chosen = repository::select(&found, &model.version_policy, &base.display().to_string())
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
        // A SavedModel is read as TensorFlow would load it (its tags, its
        // signatures' dtypes) and the library looked for, without
        // starting TensorFlow.
        let mut saved_model_signatures = BTreeSet::new();
        for (version, file) in &chosen {
            if file.file_name().is_some_and(|name| name == SAVED_MODEL_FILE) {
                let dir = file.parent().unwrap_or(Path::new("."));
                let library = config.tensorflow.library.as_deref();
                let served = crate::infer::tensorflow::inspect::check(dir, &model.tensorflow.tags, library)
                    .map_err(|e| invalid!("model '{}' version {version}: {}", model.name, e.message()))?;
                saved_model_signatures.extend(served);
            }
        }
        let versions: Vec<String> = chosen.keys().map(i64::to_string).collect();
        let mut line = format!("model '{}': versions {}", model.name, versions.join(", "));
        if !saved_model_signatures.is_empty() {
            let keys: Vec<&str> = saved_model_signatures.iter().map(String::as_str).collect();
            let _ = write!(line, "; SavedModel signatures {}", keys.join(", "));
        }
        if !model.version_labels.is_empty() {
            let labels: Vec<String> = model.version_labels.iter().map(|(l, v)| format!("{l}={v}")).collect();
            let _ = write!(line, "; labels {}", labels.join(", "));
        }
        if let Some(batching) = &model.batching {
            let _ = write!(line, "; batching up to {} rows", batching.max_batch_size);
        }
        if let Some(cache) = &model.cache {
            let _ = write!(line, "; response cache {} MiB for {} s", cache.max_mib, cache.ttl_secs);
        }
        if let Some(quota) = &model.quota {
            let mut parts = Vec::new();
            if let Some(rate) = quota.requests_per_second {
                parts.push(format!("{rate} req/s (burst {})", quota.burst_or_default().unwrap_or(rate)));
            }
            if let Some(in_flight) = quota.max_in_flight {
                parts.push(format!("{in_flight} in flight"));
            }
            let _ = write!(line, "; quota {}", parts.join(", "));
        }
        if let Some(canary) = &model.canary {
            let _ = write!(
                line,
                "; canary: {}% to label '{}', the rest to '{}'",
                canary.percent, canary.label, canary.stable
            );
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
