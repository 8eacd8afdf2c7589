//! TF Serving's `--model_config_file`: a `ModelServerConfig` in protobuf
//! text format, read into sluice's own [`ModelConfig`]s so a TF Serving
//! user brings the file unchanged:
//!
//! ```text
//! model_config_list {
//!   config {
//!     name: "mlp"
//!     base_path: "/models/mlp"
//!     model_platform: "tensorflow"
//!     model_version_policy { specific { versions: 1 versions: 2 } }
//!     version_labels { key: "stable" value: 1 }
//!   }
//! }
//! ```
//!
//! Fields sluice does not serve are named in the error, never ignored.
//! The same reader takes TF Serving's `--monitoring_config_file`
//! ([`prometheus_path`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{LoggingConfig, ModelConfig, VersionPolicy};
use crate::error::Invalid;
use crate::invalid;
use crate::proto::tensorflow::serving::ModelServerConfig;

/// A parsed text-format message: its fields in order.
#[derive(Debug, Clone, PartialEq)]
enum Node {
    /// A scalar, unquoted (strings have their quotes and escapes removed).
    Scalar(String),
    /// A nested message.
    Message(Vec<(String, Node)>),
}

/// True when `text` looks like TF Serving's text format rather than TOML.
pub fn is_text_format(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .is_some_and(|l| l.starts_with("model_config_list"))
}

/// The metrics path a TF Serving `MonitoringConfig` enables
/// (`prometheus_config { enable: true path: "…" }`), if any.
pub fn prometheus_path(text: &str) -> Result<Option<String>, Invalid> {
    let fields = Parser { text: text.as_bytes(), at: 0, line: 1 }.message(true)?;
    let mut found = None;
    for (key, node) in fields {
        match (key.as_str(), node) {
            ("prometheus_config", Node::Message(config)) => {
                let (mut enable, mut path) = (false, None);
                for (field, value) in config {
                    match (field.as_str(), value) {
                        ("enable", Node::Scalar(v)) => enable = v == "true",
                        ("path", Node::Scalar(v)) => path = Some(v),
                        (other, _) => {
                            return Err(invalid!("prometheus_config.{other} is not served; expected enable, path"))
                        }
                    }
                }
                if enable {
                    found = Some(path.unwrap_or_else(|| "/monitoring/prometheus/metrics".to_string()));
                }
            }
            (other, _) => return Err(invalid!("{other} is not served; expected prometheus_config {{ enable path }}")),
        }
    }
    Ok(found)
}

/// TF Serving's `--ssl_config_file`: an `SSLConfig` in text format, the
/// PEM blocks inside it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SslConfig {
    /// The server's private key, PEM.
    pub server_key: String,
    /// The server's certificate chain, PEM.
    pub server_cert: String,
    /// The CA that signs client certificates, PEM (for `client_verify`).
    pub custom_ca: String,
    /// Clients must present a certificate signed by `custom_ca`.
    pub client_verify: bool,
}

/// Reads an `SSLConfig`: `server_key`, `server_cert`, `custom_ca`,
/// `client_verify`; any other field is named.
pub fn ssl_config(text: &str) -> Result<SslConfig, Invalid> {
    let fields = Parser { text: text.as_bytes(), at: 0, line: 1 }.message(true)?;
    let mut config = SslConfig::default();
    for (key, node) in fields {
        let Node::Scalar(value) = node else {
            return Err(invalid!(
                "{key} is a message; an SSLConfig holds server_key, server_cert, custom_ca, client_verify"
            ));
        };
        match key.as_str() {
            "server_key" => config.server_key = value,
            "server_cert" => config.server_cert = value,
            "custom_ca" => config.custom_ca = value,
            "client_verify" => {
                config.client_verify = match value.as_str() {
                    "true" | "1" => true,
                    "false" | "0" => false,
                    other => return Err(invalid!("client_verify = {other}: expected true or false")),
                }
            }
            other => {
                return Err(invalid!(
                    "{other} is not a field of SSLConfig; expected server_key, server_cert, custom_ca, client_verify"
                ))
            }
        }
    }
    Ok(config)
}

/// The models a `ModelServerConfig` lists; relative base paths are taken
/// from `base`.
pub fn parse(text: &str, base: &Path) -> Result<Vec<ModelConfig>, Invalid> {
    let fields = Parser { text: text.as_bytes(), at: 0, line: 1 }.message(true)?;
    let mut models = Vec::new();
    for (key, node) in fields {
        match (key.as_str(), node) {
            ("model_config_list", Node::Message(list)) => {
                for (key, node) in list {
                    match (key.as_str(), node) {
                        ("config", Node::Message(config)) => models.push(model(config, base, models.len())?),
                        (other, _) => return Err(invalid!("model_config_list.{other} is not served; expected config")),
                    }
                }
            }
            (other, _) => {
                return Err(invalid!(
                    "{other} is not served by sluice; a --model_config_file in TF Serving's text format holds \
                     model_config_list {{ config {{ … }} }}"
                ))
            }
        }
    }
    Ok(models)
}

fn model(fields: Vec<(String, Node)>, base: &Path, index: usize) -> Result<ModelConfig, Invalid> {
    let key = |field: &str| format!("model_config_list.config[{index}].{field}");
    let scalar = |field: &str, node: Node| match node {
        Node::Scalar(value) => Ok(value),
        Node::Message(_) => Err(invalid!("{} is a message; expected a value", key(field))),
    };
    let (mut name, mut base_path) = (None, None);
    let mut policy = VersionPolicy::default();
    let mut labels = BTreeMap::new();
    let mut logging = None;
    for (field, node) in fields {
        match field.as_str() {
            "logging_config" => logging = Some(logging_config(node, &key("logging_config"))?),
            "name" => name = Some(scalar("name", node)?),
            "base_path" => base_path = Some(PathBuf::from(scalar("base_path", node)?)),
            "model_platform" => check_platform(&scalar("model_platform", node)?, &key("model_platform"))?,
            "model_version_policy" => policy = version_policy(node, &key("model_version_policy"))?,
            "version_labels" => {
                let Node::Message(entry) = node else {
                    return Err(invalid!("{} must be {{ key: \"LABEL\" value: N }}", key("version_labels")));
                };
                let (mut label, mut version) = (None, None);
                for (k, v) in entry {
                    match (k.as_str(), v) {
                        ("key", Node::Scalar(s)) => label = Some(s),
                        ("value", Node::Scalar(s)) => version = Some(number(&s, &key("version_labels.value"))?),
                        (other, _) => return Err(invalid!("{}.{other} is not a field", key("version_labels"))),
                    }
                }
                match (label, version) {
                    (Some(label), Some(version)) => {
                        labels.insert(label, version);
                    }
                    _ => return Err(invalid!("{} needs both key and value", key("version_labels"))),
                }
            }
            other => {
                return Err(invalid!(
                    "{} is not served by sluice; served: name, base_path, model_platform, model_version_policy, \
                     version_labels, logging_config",
                    key(other)
                ))
            }
        }
    }
    let name = name.ok_or_else(|| invalid!("{} is missing", key("name")))?;
    let mut base_path = base_path.ok_or_else(|| invalid!("{} is missing", key("base_path")))?;
    if base_path.is_relative() {
        base_path = base.join(base_path);
    }
    let mut model = ModelConfig::from_flags(name, base_path);
    model.version_policy = policy;
    model.version_labels = labels;
    model.logging = logging.map(|mut logging: LoggingConfig| {
        if logging.filename_prefix.is_relative() {
            logging.filename_prefix = base.join(&logging.filename_prefix);
        }
        logging
    });
    Ok(model)
}

/// `logging_config { log_collector_config { type filename_prefix }
/// sampling_config { sampling_rate } }`.
fn logging_config(node: Node, key: &str) -> Result<LoggingConfig, Invalid> {
    let Node::Message(fields) = node else { return Err(invalid!("{key} must be a message")) };
    let (mut collector, mut prefix, mut rate) = (String::new(), None, 0.0);
    for (field, node) in fields {
        let Node::Message(inner) = node else {
            return Err(invalid!("{key}.{field} must be a message"));
        };
        for (name, value) in inner {
            let Node::Scalar(value) = value else {
                return Err(invalid!("{key}.{field}.{name} is a message; expected a value"));
            };
            match (field.as_str(), name.as_str()) {
                ("log_collector_config", "type") => collector = value,
                ("log_collector_config", "filename_prefix") => prefix = Some(PathBuf::from(value)),
                ("sampling_config", "sampling_rate") => {
                    rate = value.parse().map_err(|_| {
                        invalid!("{key}.sampling_config.sampling_rate = {value}: expected a number in [0, 1]")
                    })?
                }
                ("log_collector_config" | "sampling_config", other) => {
                    return Err(invalid!(
                        "{key}.{field}.{other} is not served; served: log_collector_config {{ type filename_prefix }}, \
                         sampling_config {{ sampling_rate }}"
                    ))
                }
                (other, _) => {
                    return Err(invalid!(
                        "{key}.{other} is not a field; expected log_collector_config, sampling_config"
                    ))
                }
            }
        }
    }
    let prefix = prefix.ok_or_else(|| invalid!("{key}.log_collector_config.filename_prefix is missing"))?;
    Ok(LoggingConfig::new(collector, prefix, rate))
}

/// The models a `ModelServerConfig` message lists (HandleReloadConfigRequest),
/// checked as the text format is: the same fields served, the same names
/// in errors.
pub fn from_proto(config: ModelServerConfig) -> Result<Vec<ModelConfig>, Invalid> {
    use crate::proto::tensorflow::serving::file_system_storage_path_source_config::servable_version_policy::PolicyChoice;
    use crate::proto::tensorflow::serving::model_server_config::Config as Kind;
    let list = match config.config {
        Some(Kind::ModelConfigList(list)) => list,
        Some(Kind::CustomModelConfig(_)) => {
            return Err(invalid!("custom_model_config is not served by sluice; send a model_config_list"))
        }
        None => return Err(invalid!("config is empty; send model_config_list {{ config {{ name base_path }} }}")),
    };
    let mut models = Vec::with_capacity(list.config.len());
    for (index, config) in list.config.into_iter().enumerate() {
        let key = |field: &str| format!("model_config_list.config[{index}].{field}");
        if config.name.is_empty() {
            return Err(invalid!("{} is missing", key("name")));
        }
        if config.base_path.is_empty() {
            return Err(invalid!("{} is missing", key("base_path")));
        }
        if !config.model_platform.is_empty() {
            check_platform(&config.model_platform, &key("model_platform"))?;
        }
        if config.model_type != 0 {
            return Err(invalid!(
                "{} is deprecated in TF Serving and not served; use model_platform",
                key("model_type")
            ));
        }
        let policy_key = key("model_version_policy");
        let policy = match config.model_version_policy.and_then(|p| p.policy_choice) {
            None => VersionPolicy::default(),
            Some(PolicyChoice::All(_)) => VersionPolicy::All,
            Some(PolicyChoice::Latest(latest)) if latest.num_versions == 0 => VersionPolicy::Latest(1),
            Some(PolicyChoice::Latest(latest)) => VersionPolicy::Latest(latest.num_versions as usize),
            Some(PolicyChoice::Specific(specific)) if specific.versions.is_empty() => {
                return Err(invalid!("{policy_key}.specific lists no versions"))
            }
            Some(PolicyChoice::Specific(specific)) => VersionPolicy::Specific(specific.versions),
        };
        let mut model = ModelConfig::from_flags(config.name, PathBuf::from(config.base_path));
        model.version_policy = policy;
        model.version_labels = config.version_labels.into_iter().collect();
        if let Some(logging) = config.logging_config {
            let prefix = logging.log_collector_config.as_ref().map(|c| c.filename_prefix.as_str()).unwrap_or("");
            if prefix.is_empty() {
                return Err(invalid!("{}.log_collector_config.filename_prefix is missing", key("logging_config")));
            }
            model.logging = Some(LoggingConfig::new(
                logging.log_collector_config.as_ref().map(|c| c.r#type.clone()).unwrap_or_default(),
                PathBuf::from(prefix),
                logging.sampling_config.map_or(0.0, |s| s.sampling_rate),
            ));
        }
        models.push(model);
    }
    Ok(models)
}

fn check_platform(platform: &str, key: &str) -> Result<(), Invalid> {
    if matches!(platform, "tensorflow" | "onnx") {
        return Ok(());
    }
    Err(invalid!(
        "{key} = \"{platform}\": sluice serves TensorFlow SavedModels and ONNX models (\"tensorflow\" and \"onnx\" \
         are accepted; each version directory holds saved_model.pb or model.onnx)"
    ))
}

fn version_policy(node: Node, key: &str) -> Result<VersionPolicy, Invalid> {
    let Node::Message(fields) = node else { return Err(invalid!("{key} must be a message")) };
    let [(kind, Node::Message(inner))] = fields.as_slice() else {
        return Err(invalid!("{key} must hold exactly one of latest, all, specific"));
    };
    match kind.as_str() {
        "all" => Ok(VersionPolicy::All),
        "latest" => {
            let n = match inner.as_slice() {
                [] => 1,
                [(field, Node::Scalar(n))] if field == "num_versions" => {
                    number(n, &format!("{key}.latest.num_versions"))?
                }
                _ => return Err(invalid!("{key}.latest holds only num_versions")),
            };
            if n < 1 {
                return Err(invalid!("{key}.latest.num_versions = {n}: must be at least 1"));
            }
            Ok(VersionPolicy::Latest(n as usize))
        }
        "specific" => {
            let mut versions = Vec::new();
            for (field, value) in inner {
                match (field.as_str(), value) {
                    ("versions", Node::Scalar(v)) => versions.push(number(v, &format!("{key}.specific.versions"))?),
                    (other, _) => return Err(invalid!("{key}.specific.{other} is not a field; expected versions")),
                }
            }
            if versions.is_empty() {
                return Err(invalid!("{key}.specific lists no versions"));
            }
            Ok(VersionPolicy::Specific(versions))
        }
        other => Err(invalid!("{key}.{other} is not a version policy; expected latest, all or specific")),
    }
}

fn number(text: &str, key: &str) -> Result<i64, Invalid> {
    text.parse().map_err(|_| invalid!("{key} = {text}: expected a whole number"))
}

/// A recursive-descent reader of the text format's subset that model
/// configs use: `name: value`, `name { … }`, `name: { … }`, comments.
struct Parser<'a> {
    text: &'a [u8],
    at: usize,
    line: usize,
}

impl Parser<'_> {
    fn message(&mut self, top: bool) -> Result<Vec<(String, Node)>, Invalid> {
        let mut fields = Vec::new();
        loop {
            self.skip_space();
            match self.peek() {
                None if top => return Ok(fields),
                None => return Err(invalid!("line {}: a '{{' is not closed", self.line)),
                Some(b'}') if !top => {
                    self.at += 1;
                    return Ok(fields);
                }
                Some(b'}') => return Err(invalid!("line {}: an unmatched '}}'", self.line)),
                Some(_) => {}
            }
            let name = self.ident()?;
            self.skip_space();
            let colon = self.peek() == Some(b':');
            if colon {
                self.at += 1;
                self.skip_space();
            }
            let node = if self.peek() == Some(b'{') {
                self.at += 1;
                Node::Message(self.message(false)?)
            } else if colon {
                Node::Scalar(self.scalar()?)
            } else {
                return Err(invalid!("line {}: expected ':' or '{{' after {name}", self.line));
            };
            fields.push((name, node));
            self.skip_space();
            if matches!(self.peek(), Some(b',' | b';')) {
                self.at += 1;
            }
        }
    }

    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn skip_space(&mut self) {
        while let Some(b) = self.peek() {
            match b {
                b'\n' => {
                    self.line += 1;
                    self.at += 1;
                }
                b'#' => {
                    while self.peek().is_some_and(|b| b != b'\n') {
                        self.at += 1;
                    }
                }
                b if b.is_ascii_whitespace() => self.at += 1,
                _ => return,
            }
        }
    }

    fn ident(&mut self) -> Result<String, Invalid> {
        let start = self.at;
        while self.peek().is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_') {
            self.at += 1;
        }
        if start == self.at {
            let found = self.peek().map_or("the end".to_string(), |b| format!("'{}'", b as char));
            return Err(invalid!("line {}: expected a field name, found {found}", self.line));
        }
        Ok(String::from_utf8_lossy(&self.text[start..self.at]).into_owned())
    }

    fn scalar(&mut self) -> Result<String, Invalid> {
        let quoted = matches!(self.peek(), Some(b'"' | b'\''));
        let mut text = self.one_scalar()?;
        // Adjacent strings are one ("-----BEGIN…\n" "MIIB…"), as in
        // protobuf's text format: how PEM blocks are written into one.
        loop {
            let (at, line) = (self.at, self.line);
            self.skip_space();
            if quoted && matches!(self.peek(), Some(b'"' | b'\'')) {
                text.push_str(&self.one_scalar()?);
            } else {
                (self.at, self.line) = (at, line);
                return Ok(text);
            }
        }
    }

    fn one_scalar(&mut self) -> Result<String, Invalid> {
        match self.peek() {
            Some(quote @ (b'"' | b'\'')) => {
                let opened = self.line;
                self.at += 1;
                let mut out = Vec::new();
                loop {
                    match self.peek() {
                        None => return Err(invalid!("line {opened}: a string is not closed")),
                        // A PEM block pasted as is spans lines.
                        Some(b'\n') => {
                            out.push(b'\n');
                            self.line += 1;
                            self.at += 1;
                        }
                        Some(b) if b == quote => {
                            self.at += 1;
                            break;
                        }
                        Some(b'\\') => {
                            let escaped = self.text.get(self.at + 1).copied();
                            out.push(match escaped {
                                Some(b'n') => b'\n',
                                Some(b't') => b'\t',
                                Some(other) => other,
                                None => return Err(invalid!("line {}: a string is not closed", self.line)),
                            });
                            self.at += 2;
                        }
                        Some(b) => {
                            out.push(b);
                            self.at += 1;
                        }
                    }
                }
                String::from_utf8(out).map_err(|_| invalid!("line {}: a string is not UTF-8", self.line))
            }
            _ => {
                let start = self.at;
                while self.peek().is_some_and(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'+')) {
                    self.at += 1;
                }
                if start == self.at {
                    return Err(invalid!("line {}: expected a value", self.line));
                }
                Ok(String::from_utf8_lossy(&self.text[start..self.at]).into_owned())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_tf_servings_model_config_list() {
        let text = r#"
# two models, as TF Serving's docs write them
model_config_list {
  config {
    name: 'mlp'
    base_path: "models/mlp"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 1 versions: 2 } }
    version_labels { key: 'stable' value: 1 }
    version_labels { key: 'canary' value: 2 }
  }
  config: {
    name: "cnn",
    base_path: "/abs/cnn",
    model_version_policy: { latest: { num_versions: 2 } }
  }
}
"#;
        assert!(is_text_format(text));
        let models = parse(text, Path::new("/base")).unwrap();
        assert_eq!(models.len(), 2);
        assert_eq!(models[0].name, "mlp");
        assert_eq!(models[0].base_path, Path::new("/base/models/mlp"));
        assert_eq!(models[0].version_policy, VersionPolicy::Specific(vec![1, 2]));
        assert_eq!(models[0].version_labels.get("canary"), Some(&2));
        assert_eq!(models[1].base_path, Path::new("/abs/cnn"));
        assert_eq!(models[1].version_policy, VersionPolicy::Latest(2));
    }

    #[test]
    fn fields_sluice_does_not_serve_are_named() {
        let err =
            parse("model_config_list { config { name: 'm' base_path: 'x' platform_config { } } }", Path::new("/"))
                .unwrap_err();
        assert!(err.0.contains("config[0].platform_config is not served"), "{err}");
        let err = parse(
            "model_config_list { config { name: 'm' base_path: 'x' logging_config { sampling_config { rate: 1 } } } }",
            Path::new("/"),
        )
        .unwrap_err();
        assert!(err.0.contains("logging_config.sampling_config.rate is not served"), "{err}");
        let err = parse(
            "model_config_list { config { name: 'm' base_path: 'x' logging_config { sampling_config { sampling_rate: 1 } } } }",
            Path::new("/"),
        )
        .unwrap_err();
        assert!(err.0.contains("filename_prefix is missing"), "{err}");
        let err = parse("custom_model_config { }", Path::new("/")).unwrap_err();
        assert!(err.0.contains("custom_model_config is not served"), "{err}");
        let err = parse(
            "model_config_list { config { name: 'm' base_path: 'x' model_platform: 'pytorch' } }",
            Path::new("/"),
        )
        .unwrap_err();
        assert!(err.0.contains("\"pytorch\""), "{err}");
        let err = parse("model_config_list { config { name: 'm' ", Path::new("/")).unwrap_err();
        assert!(err.0.contains("not closed"), "{err}");
    }

    #[test]
    fn reads_tf_servings_logging_config() {
        let text = r#"model_config_list { config {
            name: 'm' base_path: 'x'
            logging_config {
              log_collector_config { type: "" filename_prefix: "logs/m" }
              sampling_config { sampling_rate: 0.25 }
            }
        } }"#;
        let models = parse(text, Path::new("/base")).unwrap();
        let logging = models[0].logging.as_ref().unwrap();
        assert_eq!(logging.filename_prefix, Path::new("/base/logs/m"));
        assert_eq!(logging.sampling_rate, 0.25);
        assert_eq!(logging.collector, "");
    }

    #[test]
    fn reads_tf_servings_ssl_config_with_pem_blocks_in_every_form() {
        let text = "server_key: '-----BEGIN PRIVATE KEY-----\\nAAA\\n-----END PRIVATE KEY-----'\n\
                    server_cert: \"-----BEGIN CERTIFICATE-----\\n\" \"BBB\\n\"\n  \"-----END CERTIFICATE-----\"\n\
                    custom_ca: \"-----BEGIN CERTIFICATE-----\nCCC\n-----END CERTIFICATE-----\"\n\
                    client_verify: true";
        let config = ssl_config(text).unwrap();
        assert_eq!(config.server_key, "-----BEGIN PRIVATE KEY-----\nAAA\n-----END PRIVATE KEY-----");
        assert_eq!(config.server_cert, "-----BEGIN CERTIFICATE-----\nBBB\n-----END CERTIFICATE-----");
        assert_eq!(config.custom_ca, "-----BEGIN CERTIFICATE-----\nCCC\n-----END CERTIFICATE-----");
        assert!(config.client_verify);
        assert!(ssl_config("server_pem: 'x'").unwrap_err().0.contains("server_pem is not a field of SSLConfig"));
        assert!(ssl_config("client_verify: maybe").unwrap_err().0.contains("client_verify = maybe"));
        assert!(ssl_config("server_key: 'open").unwrap_err().0.contains("line 1: a string is not closed"));
    }

    #[test]
    fn reads_tf_servings_monitoring_config() {
        let text = "prometheus_config { enable: true, path: \"/metrics/tf\" }";
        assert_eq!(prometheus_path(text).unwrap(), Some("/metrics/tf".to_string()));
        assert_eq!(prometheus_path("prometheus_config { enable: false }").unwrap(), None);
        assert!(prometheus_path("statsd_config { }").is_err());
    }
}
