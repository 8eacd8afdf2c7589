//! Batching parameters, as TF Serving names them, read from TOML or from
//! TF Serving's own `--batching_parameters_file` (protobuf text format), so
//! a TF Serving user can bring their file unchanged; and sluice's auto
//! mode, which needs no parameter but a latency target.

use std::path::Path;

use serde::Deserialize;

use crate::error::{ConfigError, Invalid};
use crate::invalid;

/// How a batch's size and wait are chosen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BatchingMode {
    /// As TF Serving: wait up to `batch_timeout_micros` for up to
    /// `max_batch_size` rows.
    #[default]
    Fixed,
    /// Learned: the batcher measures the model at each batch size and the
    /// arrival rate, and chooses each batch's size and wait so that
    /// queueing plus inference stays within `latency_target_ms`.
    Auto,
}

/// How requests to one model version are batched.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchingParameters {
    /// Fixed (TF Serving's parameters) or auto.
    pub mode: BatchingMode,
    /// Auto mode: what a request may spend waiting for its batch and
    /// running in it, in milliseconds. Default 10.
    pub latency_target_ms: Option<u64>,
    /// Most rows in one batch; larger requests are split. In auto mode,
    /// the most the batcher may choose.
    pub max_batch_size: usize,
    /// Fixed mode: how long the first request of a batch waits for others,
    /// when a batch thread is free. 0: take what is there. Default 1000.
    pub batch_timeout_micros: Option<u64>,
    /// Batches' worth of rows that may wait; beyond that, requests are
    /// refused with RESOURCE_EXHAUSTED.
    pub max_enqueued_batches: usize,
    /// Batches run at once. 0: one per ONNX Runtime session.
    pub num_batch_threads: usize,
    /// Batch sizes the model runs at; a batch is padded up to the next one.
    /// Empty: any size. When set, must increase and end at max_batch_size.
    pub allowed_batch_sizes: Vec<usize>,
}

impl Default for BatchingParameters {
    fn default() -> Self {
        BatchingParameters {
            mode: BatchingMode::Fixed,
            latency_target_ms: None,
            max_batch_size: 32,
            batch_timeout_micros: None,
            max_enqueued_batches: 16,
            num_batch_threads: 0,
            allowed_batch_sizes: Vec::new(),
        }
    }
}

/// The keys of TF Serving's BatchingParameters that sluice reads.
const KEYS: &[&str] = &[
    "max_batch_size",
    "batch_timeout_micros",
    "max_enqueued_batches",
    "num_batch_threads",
    "allowed_batch_sizes",
    "max_execution_batch_size",
    "enable_large_batch_splitting",
    "pad_variable_length_inputs",
];

/// Keys TF Serving knows that change nothing here, accepted so its files
/// load as they are: a thread pool's name is only a label.
const IGNORED_KEYS: &[&str] = &["thread_pool_name"];

/// Fixed mode's wait when none is given, as TF Serving's default.
const DEFAULT_TIMEOUT_MICROS: u64 = 1000;

/// Auto mode's latency target when none is given.
const DEFAULT_LATENCY_TARGET_MS: u64 = 10;

/// The longest latency target accepted: beyond it a client has long given up.
const MAX_LATENCY_TARGET_MS: u64 = 60_000;

impl BatchingParameters {
    /// Auto mode with its defaults: what `--enable_batching` gives
    /// without a parameters file.
    pub fn auto() -> BatchingParameters {
        BatchingParameters { mode: BatchingMode::Auto, ..BatchingParameters::default() }
    }

    /// Fixed mode: how long a batch's first request waits for others.
    pub fn timeout_micros(&self) -> u64 {
        self.batch_timeout_micros.unwrap_or(DEFAULT_TIMEOUT_MICROS)
    }

    /// Auto mode: the latency target.
    pub fn latency_target(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.latency_target_ms.unwrap_or(DEFAULT_LATENCY_TARGET_MS))
    }

    /// Checks ranges and the allowed sizes; `key` prefixes the messages.
    pub fn check(&self, key: &str) -> Result<(), Invalid> {
        match (self.mode, self.batch_timeout_micros, self.latency_target_ms) {
            (BatchingMode::Auto, Some(micros), _) => {
                return Err(invalid!(
                    "{key}.batch_timeout_micros = {micros}: mode = \"auto\" chooses each batch's wait itself; \
                     leave batch_timeout_micros out, or set mode = \"fixed\""
                ));
            }
            (BatchingMode::Fixed, _, Some(ms)) => {
                return Err(invalid!(
                    "{key}.latency_target_ms = {ms}: only mode = \"auto\" batches to a latency target; \
                     set mode = \"auto\" (and leave batch_timeout_micros out)"
                ));
            }
            (BatchingMode::Auto, None, Some(ms)) if ms == 0 || ms > MAX_LATENCY_TARGET_MS => {
                return Err(invalid!(
                    "{key}.latency_target_ms = {ms}: must be between 1 and {MAX_LATENCY_TARGET_MS} milliseconds"
                ));
            }
            _ => {}
        }
        // Their product bounds the batch queue in rows: a count the
        // batcher's semaphore can hold.
        super::check_between(&format!("{key}.max_batch_size"), self.max_batch_size, 1, super::MAX_COUNT)?;
        super::check_between(&format!("{key}.max_enqueued_batches"), self.max_enqueued_batches, 1, super::MAX_COUNT)?;
        super::check_at_most(&format!("{key}.num_batch_threads"), self.num_batch_threads, super::MAX_THREADS)?;
        if let Some(&last) = self.allowed_batch_sizes.last() {
            if self.allowed_batch_sizes.windows(2).any(|w| w[0] >= w[1]) || self.allowed_batch_sizes[0] == 0 {
                return Err(invalid!(
                    "{key}.allowed_batch_sizes = {:?}: sizes must be positive and strictly increasing",
                    self.allowed_batch_sizes
                ));
            }
            if last != self.max_batch_size {
                return Err(invalid!(
                    "{key}.allowed_batch_sizes = {:?}: the last size must equal max_batch_size ({})",
                    self.allowed_batch_sizes,
                    self.max_batch_size
                ));
            }
        }
        Ok(())
    }

    /// The batch size to run `rows` at: the next allowed size, or `rows`.
    pub fn padded_size(&self, rows: usize) -> usize {
        self.allowed_batch_sizes.iter().copied().find(|&s| s >= rows).unwrap_or(rows)
    }

    /// Reads a parameters file: TOML when it ends in `.toml`, otherwise TF
    /// Serving's text format. Errors name the file, the key and what is
    /// allowed.
    pub fn from_file(path: &Path) -> Result<BatchingParameters, ConfigError> {
        let source = path.display().to_string();
        let error = |message: String| ConfigError { source: source.clone(), message };
        let text = std::fs::read_to_string(path).map_err(|e| error(format!("cannot read: {e}")))?;
        let params = if path.extension().is_some_and(|e| e == "toml") {
            toml::from_str::<BatchingParameters>(&text).map_err(|e| error(e.to_string().trim_end().to_string()))?
        } else {
            BatchingParameters::from_text_format(&text).map_err(|e| error(e.0))?
        };
        params.check("batching").map_err(|e| error(e.0))?;
        Ok(params)
    }

    /// Parses TF Serving's text format:
    ///
    /// ```text
    /// max_batch_size { value: 32 }
    /// batch_timeout_micros { value: 1000 }
    /// allowed_batch_sizes: 8
    /// allowed_batch_sizes: 32
    /// ```
    ///
    /// Of TF Serving's newer keys, `max_execution_batch_size` (the largest
    /// batch run, with `enable_large_batch_splitting`) is the batch size
    /// here, where larger requests are always split; a `false`
    /// `enable_large_batch_splitting` and `pad_variable_length_inputs:
    /// true` are named in a warning, since sluice always splits and never
    /// pads (requests whose other dimensions differ run in batches of
    /// their own).
    pub fn from_text_format(text: &str) -> Result<BatchingParameters, Invalid> {
        let mut params = BatchingParameters::default();
        let mut allowed = Vec::new();
        let mut max_execution_batch_size = None;
        let mut tokens = Tokens::new(text);
        while let Some((line, key)) = tokens.next_token()? {
            let Token::Ident(key) = key else {
                return Err(invalid!("line {line}: expected a field name, found {key}"));
            };
            if IGNORED_KEYS.contains(&key.as_str()) {
                tokens.skip_value(line, &key)?;
                continue;
            }
            if !KEYS.contains(&key.as_str()) {
                return Err(invalid!(
                    "line {line}: unknown key '{key}'; allowed keys: {} (and, ignored: {})",
                    KEYS.join(", "),
                    IGNORED_KEYS.join(", ")
                ));
            }
            let value = tokens.value(line, &key)?;
            let number = |what: &str| -> Result<u64, Invalid> {
                value.parse::<u64>().map_err(|_| invalid!("line {line}: {key} = {value:?}: expected {what}"))
            };
            match key.as_str() {
                "max_batch_size" => params.max_batch_size = number("a positive integer")? as usize,
                "batch_timeout_micros" => {
                    params.batch_timeout_micros = Some(number("microseconds, an integer >= 0")?);
                }
                "max_enqueued_batches" => params.max_enqueued_batches = number("a positive integer")? as usize,
                "num_batch_threads" => params.num_batch_threads = number("an integer >= 0")? as usize,
                "allowed_batch_sizes" => allowed.push(number("a positive integer")? as usize),
                "max_execution_batch_size" => max_execution_batch_size = Some(number("a positive integer")? as usize),
                "enable_large_batch_splitting" | "pad_variable_length_inputs" => {
                    let on = match value.as_str() {
                        "true" | "1" => true,
                        "false" | "0" => false,
                        _ => return Err(invalid!("line {line}: {key} = {value:?}: expected true or false")),
                    };
                    if on == (key == "pad_variable_length_inputs") {
                        tracing::warn!(
                            "batching parameters line {line}: {key}: {value} has no effect in sluice: larger \
                             requests are always split into batches of max_batch_size, and requests whose \
                             other dimensions differ run in batches of their own, unpadded"
                        );
                    }
                }
                _ => unreachable!("key checked against KEYS above"),
            }
        }
        params.allowed_batch_sizes = allowed;
        if let Some(size) = max_execution_batch_size {
            // TF Serving's max_batch_size is then the largest request it
            // splits; here requests of any size are split, into batches
            // of at most this.
            params.max_batch_size = size;
        }
        Ok(params)
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Scalar(String),
    Colon,
    Open,
    Close,
}

impl std::fmt::Display for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Token::Ident(s) | Token::Scalar(s) => write!(f, "'{s}'"),
            Token::Colon => f.write_str("':'"),
            Token::Open => f.write_str("'{'"),
            Token::Close => f.write_str("'}'"),
        }
    }
}

/// A tokenizer for the small part of protobuf text format the parameters
/// file uses: `key: scalar`, `key { value: scalar }`, `#` comments.
struct Tokens<'a> {
    rest: &'a str,
    line: usize,
}

impl<'a> Tokens<'a> {
    fn new(text: &'a str) -> Self {
        Tokens { rest: text, line: 1 }
    }

    fn next_token(&mut self) -> Result<Option<(usize, Token)>, Invalid> {
        loop {
            let trimmed = self.rest.trim_start_matches([' ', '\t', '\r', ',', ';']);
            self.rest = trimmed;
            if let Some(after) = self.rest.strip_prefix('\n') {
                self.line += 1;
                self.rest = after;
            } else if self.rest.starts_with('#') {
                let end = self.rest.find('\n').unwrap_or(self.rest.len());
                self.rest = &self.rest[end..];
            } else {
                break;
            }
        }
        let line = self.line;
        let Some(c) = self.rest.chars().next() else { return Ok(None) };
        let (token, len) = match c {
            ':' => (Token::Colon, 1),
            '{' => (Token::Open, 1),
            '}' => (Token::Close, 1),
            '"' | '\'' => {
                let end = self.rest[1..].find(c).ok_or_else(|| invalid!("line {line}: unterminated string"))?;
                (Token::Scalar(self.rest[1..=end].to_string()), end + 2)
            }
            c if c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.' => {
                let len = self
                    .rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.'))
                    .unwrap_or(self.rest.len());
                let word = &self.rest[..len];
                let token = if c.is_ascii_alphabetic() || c == '_' {
                    Token::Ident(word.to_string())
                } else {
                    Token::Scalar(word.to_string())
                };
                (token, len)
            }
            other => return Err(invalid!("line {line}: unexpected character {other:?}")),
        };
        self.rest = &self.rest[len..];
        Ok(Some((line, token)))
    }

    fn expect_next(&mut self, line: usize, key: &str) -> Result<Token, Invalid> {
        self.next_token()?.map(|(_, t)| t).ok_or_else(|| invalid!("line {line}: {key} has no value"))
    }

    /// The scalar of `key: scalar` or `key [:] { value: scalar }`.
    fn value(&mut self, line: usize, key: &str) -> Result<String, Invalid> {
        let mut token = self.expect_next(line, key)?;
        if token == Token::Colon {
            token = self.expect_next(line, key)?;
        }
        match token {
            Token::Scalar(s) | Token::Ident(s) => Ok(s),
            Token::Open => {
                let inner = self.expect_next(line, key)?;
                if inner != Token::Ident("value".into()) {
                    return Err(invalid!("line {line}: {key} {{ … }} must hold 'value: N', found {inner}"));
                }
                let value = self.value(line, key)?;
                match self.expect_next(line, key)? {
                    Token::Close => Ok(value),
                    other => Err(invalid!("line {line}: expected '}}' after {key}'s value, found {other}")),
                }
            }
            other => Err(invalid!("line {line}: {key}: expected a value, found {other}")),
        }
    }

    fn skip_value(&mut self, line: usize, key: &str) -> Result<(), Invalid> {
        self.value(line, key).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_tf_serving_text_format() {
        let text = r#"
            # from a TF Serving deployment
            max_batch_size { value: 64 }
            batch_timeout_micros { value: 500 }
            max_enqueued_batches { value: 100 }
            num_batch_threads { value: 4 }
            thread_pool_name { value: "batch_pool" }
            allowed_batch_sizes: 16
            allowed_batch_sizes: 32
            allowed_batch_sizes: 64
            pad_variable_length_inputs: false
        "#;
        let params = BatchingParameters::from_text_format(text).unwrap();
        assert_eq!(
            params,
            BatchingParameters {
                mode: BatchingMode::Fixed,
                latency_target_ms: None,
                max_batch_size: 64,
                batch_timeout_micros: Some(500),
                max_enqueued_batches: 100,
                num_batch_threads: 4,
                allowed_batch_sizes: vec![16, 32, 64],
            }
        );
        assert!(params.check("batching").is_ok());
        assert_eq!(params.padded_size(1), 16);
        assert_eq!(params.padded_size(17), 32);
        assert_eq!(params.padded_size(64), 64);
    }

    #[test]
    fn tf_servings_newer_keys_are_read() {
        let text = "max_batch_size { value: 512 }\nenable_large_batch_splitting { value: true }\n\
                    max_execution_batch_size { value: 64 }\nallowed_batch_sizes: 32\nallowed_batch_sizes: 64\n\
                    pad_variable_length_inputs: true\n";
        let params = BatchingParameters::from_text_format(text).unwrap();
        assert_eq!(params.max_batch_size, 64, "the largest batch run");
        assert!(params.check("batching").is_ok());
        let err = BatchingParameters::from_text_format("pad_variable_length_inputs: maybe").unwrap_err();
        assert!(err.0.contains("pad_variable_length_inputs = \"maybe\": expected true or false"), "{err}");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let err = BatchingParameters::from_text_format("max_batch_sise { value: 8 }").unwrap_err();
        assert!(err.0.contains("unknown key 'max_batch_sise'"), "{err}");
        assert!(err.0.contains("max_batch_size, batch_timeout_micros"), "{err}");
        let err = BatchingParameters::from_text_format("max_batch_size { value: -3 }").unwrap_err();
        assert!(err.0.contains("max_batch_size"), "{err}");
        assert!(err.0.contains("positive integer"), "{err}");
        let err = BatchingParameters::from_text_format("max_batch_size { size: 3 }").unwrap_err();
        assert!(err.0.contains("value: N"), "{err}");
    }

    #[test]
    fn auto_mode_takes_a_target_and_no_timeout() {
        let auto: BatchingParameters = toml::from_str("mode = \"auto\"\nlatency_target_ms = 25").unwrap();
        assert_eq!(auto.mode, BatchingMode::Auto);
        assert!(auto.check("b").is_ok());
        assert_eq!(auto.latency_target(), std::time::Duration::from_millis(25));
        assert_eq!(BatchingParameters::auto().latency_target(), std::time::Duration::from_millis(10));
        let both: BatchingParameters = toml::from_str("mode = \"auto\"\nbatch_timeout_micros = 500").unwrap();
        let err = both.check("models.cnn.batching").unwrap_err();
        assert!(err.0.contains("models.cnn.batching.batch_timeout_micros = 500"), "{err}");
        assert!(err.0.contains("mode = \"auto\" chooses"), "{err}");
        let fixed: BatchingParameters = toml::from_str("latency_target_ms = 5").unwrap();
        assert!(fixed.check("b").unwrap_err().0.contains("only mode = \"auto\""));
        let zero: BatchingParameters = toml::from_str("mode = \"auto\"\nlatency_target_ms = 0").unwrap();
        assert!(zero.check("b").unwrap_err().0.contains("between 1 and 60000"));
        let err = toml::from_str::<BatchingParameters>("mode = \"fast\"").unwrap_err().to_string();
        assert!(err.contains("fixed") && err.contains("auto"), "{err}");
    }

    #[test]
    fn allowed_sizes_must_increase_and_end_at_the_maximum() {
        let mut params = BatchingParameters { allowed_batch_sizes: vec![8, 4, 32], ..Default::default() };
        assert!(params.check("b").unwrap_err().0.contains("strictly increasing"));
        params.allowed_batch_sizes = vec![8, 16];
        assert!(params.check("b").unwrap_err().0.contains("must equal max_batch_size (32)"));
        // A bound a queue of rows can count.
        let huge = BatchingParameters { max_batch_size: usize::MAX, ..Default::default() };
        let err = huge.check("b").unwrap_err().0;
        assert!(err.contains("b.max_batch_size = 18446744073709551615: must be between 1 and 1048576"), "{err}");
        let deep = BatchingParameters { max_enqueued_batches: 1 << 40, ..Default::default() };
        assert!(deep.check("b").unwrap_err().0.contains("max_enqueued_batches"));
        let wide = BatchingParameters { num_batch_threads: 1 << 40, ..Default::default() };
        assert!(wide.check("b").unwrap_err().0.contains("num_batch_threads = 1099511627776: must be at most 1024"));
    }
}
