//! What the tests' (and benches') configs and plugin directories are made
//! of: the plugins `scripts/build-plugins` built, their hashes, admin
//! tokens as the config stores them, the `[[models]]` and `[[pipelines]]`
//! tables, and a directory holding a config beside its plugins.

use std::path::{Path, PathBuf};

/// The repository's root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The SHA-256 of `bytes`, hex: how the registry names blobs and how the
/// config stores admin tokens.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(<sha2::Sha256 as sha2::Digest>::digest(bytes))
}

/// `target/plugins/NAME.wasm`, built by `scripts/build-plugins`.
pub fn plugin_file(name: &str) -> PathBuf {
    let path = root().join("target/plugins").join(format!("{name}.wasm"));
    assert!(path.is_file(), "{} is not built: run scripts/build-plugins (scripts/test does)", path.display());
    path
}

/// The bytes of [`plugin_file`].
pub fn plugin_bytes(name: &str) -> Vec<u8> {
    let path = plugin_file(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// An `[[admin.tokens]]` entry for `token`, stored as its hash: a team
/// token when `team` is given, an admin token otherwise.
pub fn admin_token(id: &str, team: Option<&str>, token: &str) -> String {
    let role = match team {
        Some(team) => format!("team = \"{team}\"\nrole = \"team\""),
        None => "role = \"admin\"".to_string(),
    };
    format!("[[admin.tokens]]\nid = \"{id}\"\n{role}\nsha256 = \"{}\"\n", sha256_hex(token.as_bytes()))
}

/// `examples/models/NAME`: an example model's repository.
pub fn example_dir(name: &str) -> PathBuf {
    root().join("examples/models").join(name)
}

/// The `[[models]]` table of example model `name` (`examples/models/NAME`),
/// with one ONNX Runtime session of one thread.
pub fn example_model_table(name: &str) -> String {
    model_table(name, &example_dir(name), "onnx = { sessions = 1, intra_op_threads = 1 }")
}

/// A `[[models]]` table: `name` served from `base_path`, with `keys` (TOML
/// lines) after them.
pub fn model_table(name: &str, base_path: &Path, keys: &str) -> String {
    format!("[[models]]\nname = \"{name}\"\nbase_path = \"{}\"\n{keys}\n", base_path.display())
}

/// A `[[pipelines]]` table: `name` in front of `model`, with `keys` (TOML
/// lines: team, stages, …).
pub fn pipeline_table(name: &str, model: &str, keys: &str) -> String {
    format!("[[pipelines]]\nname = \"{name}\"\nmodel = \"{model}\"\n{keys}\n")
}

/// A pipeline's `[pipelines.feature_fetch]` table: `keys` (TOML lines:
/// on_store_error, …), then one lookup per `(keys input, table, features)`,
/// `features` as the TOML array of the features it fetches.
pub fn feature_fetch(keys: &str, lookups: &[(&str, &str, &str)]) -> String {
    let mut text = format!("[pipelines.feature_fetch]\n{keys}\n");
    for (input, table, features) in lookups {
        text.push_str(&format!(
            "[[pipelines.feature_fetch.lookups]]\nkeys = \"{input}\"\ntable = \"{table}\"\nfeatures = {features}\n"
        ));
    }
    text
}

/// A temporary directory holding a plugin directory (`plugins/`) of built
/// plugins and a config (`sluice.toml`) that names it; removed when dropped.
pub struct ConfigDir {
    dir: tempfile::TempDir,
}

impl ConfigDir {
    /// `plugins`: each file stem the plugin directory holds and the built
    /// plugin it is a copy of. `config`: the config, with `$PLUGINS` for the
    /// plugin directory and `$ROOT` for the repository.
    pub fn new(plugins: &[(&str, &str)], config: &str) -> ConfigDir {
        let dir = tempfile::tempdir().expect("temp dir");
        let plugin_dir = dir.path().join("plugins");
        std::fs::create_dir_all(&plugin_dir).expect("plugins dir");
        for (stem, built) in plugins {
            std::fs::copy(plugin_file(built), plugin_dir.join(format!("{stem}.wasm"))).expect("copy a built plugin");
        }
        let text = config
            .replace("$PLUGINS", &plugin_dir.display().to_string())
            .replace("$ROOT", &root().display().to_string());
        std::fs::write(dir.path().join("sluice.toml"), text).expect("write config");
        ConfigDir { dir }
    }

    /// The directory itself.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Its config file.
    pub fn config(&self) -> PathBuf {
        self.dir.path().join("sluice.toml")
    }

    /// Its plugin directory.
    pub fn plugins(&self) -> PathBuf {
        self.dir.path().join("plugins")
    }
}

/// The `recommend` pipeline of the examples: feature_transform → the
/// recommender, with `recent` from table `users` and `stats` from table
/// `items` fetched first ([`EXAMPLE_FEATURE_TABLES`] or the Redis twins).
pub const RECOMMEND_PIPELINE: &str = r#"
[[pipelines]]
name = "recommend"
model = "recommender"
preprocess = { plugin = "feature_transform" }
[pipelines.feature_fetch]
[[pipelines.feature_fetch.lookups]]
keys = "user_id"
table = "users"
features = [{ feature = "recent", tensor = "user_ids", default = "" }]
[[pipelines.feature_fetch.lookups]]
keys = "item_id"
table = "items"
features = [{ feature = "stats", tensor = "raw_dense" }]
"#;

/// The example feature tables `users` and `items`, embedded, from
/// `examples/features` (`$ROOT`: the repository, as `Server::with_config`
/// and the tests' config writers replace it).
pub const EXAMPLE_FEATURE_TABLES: &str = r#"
[features.tables.users]
file = "$ROOT/examples/features/users.csv"
key = "user_id"
features.recent = { dtype = "string", shape = [4] }

[features.tables.items]
file = "$ROOT/examples/features/items.jsonl"
key = "item_id"
features.stats = { dtype = "float32", shape = [13] }
"#;

/// Copies the directory tree `from` to `to` (a model version, say).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &to.join(entry.file_name()));
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy");
        }
    }
}
