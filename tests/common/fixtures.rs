//! What the tests' configs and plugin directories are made of: the plugins
//! `scripts/build-plugins` built, their hashes, admin tokens as the config
//! stores them, and the `[[models]]` tables of the example models.

use std::path::PathBuf;

use super::root;

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

/// The `[[models]]` table of example model `name` (`examples/models/NAME`),
/// with one ONNX Runtime session of one thread.
pub fn example_model_table(name: &str) -> String {
    format!(
        "[[models]]\nname = \"{name}\"\nbase_path = \"{}\"\nonnx = {{ sessions = 1, intra_op_threads = 1 }}\n",
        root().join("examples/models").join(name).display()
    )
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
