//! `examples`: how a model or pipeline takes TensorFlow's `tf.Example`s —
//! which feature fills which input, with what per-example shape and
//! default — and which of its outputs TF Serving's Classify and Regress
//! answer with.
//!
//! What reads it: `tensor::example` (the parse), `pipeline` (checked
//! against every version's signature), `api` (Classify, Regress,
//! MultiInference, and Predict's serialized `examples` input).

use std::collections::HashSet;

use serde::Deserialize;

use super::{check_between, MAX_COUNT};
use crate::error::Invalid;
use crate::invalid;

/// How `tf.Example`s become the inputs of a model or pipeline.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExamplesConfig {
    /// The most examples one request may carry; more are refused before
    /// anything is parsed.
    #[serde(default = "default_max_examples")]
    pub max_examples: usize,
    /// The Predict input that may carry serialized `tf.Example`s (a
    /// `DT_STRING` vector, one per row) in place of the inputs.
    #[serde(default = "default_predict_input")]
    pub predict_input: String,
    /// One entry per input: the feature that fills it.
    pub features: Vec<ExampleFeature>,
    /// The outputs Classify answers with; Classify is refused when absent.
    pub classify: Option<ClassifyOutputs>,
    /// The output Regress answers with; Regress is refused when absent.
    pub regress: Option<RegressOutput>,
}

/// One `tf.Example` feature and the input it fills (TensorFlow's
/// `FixedLenFeature`: every example gives exactly `shape`'s values, or
/// none and the default applies).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExampleFeature {
    /// The feature's name in `tf.Example.features`.
    pub name: String,
    /// The input it fills; the feature's name when unset.
    pub input: Option<String>,
    /// The feature's kind; what the input's dtype implies when unset, and
    /// checked against it when set.
    pub kind: Option<FeatureKind>,
    /// The shape of one example's values; the input's shape without its
    /// batch dimension when unset (which must then be fully known).
    pub shape: Option<Vec<i64>>,
    /// The values of an example without this feature: one value (given to
    /// every element) or exactly `shape`'s count. Unset: the feature is
    /// required.
    pub default: Option<FeatureDefault>,
}

impl ExampleFeature {
    /// The feature `name` filling the input of the same name, its kind and
    /// shape the input's.
    pub fn named(name: &str, default: Option<FeatureDefault>) -> Self {
        ExampleFeature { name: name.to_string(), input: None, kind: None, shape: None, default }
    }

    /// The input this feature fills.
    pub fn input_name(&self) -> &str {
        self.input.as_deref().unwrap_or(&self.name)
    }
}

/// The three kinds of values a `tf.train.Feature` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FeatureKind {
    /// `float_list`: 32-bit floats.
    Float,
    /// `int64_list`.
    Int64,
    /// `bytes_list`: byte strings.
    Bytes,
}

impl FeatureKind {
    /// The name TensorFlow's `tf.train.Feature` gives it.
    pub fn list_name(self) -> &'static str {
        match self {
            FeatureKind::Float => "float_list",
            FeatureKind::Int64 => "int64_list",
            FeatureKind::Bytes => "bytes_list",
        }
    }
}

/// One default value as TOML writes it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum DefaultValue {
    /// An integer (also a valid float default).
    Int(i64),
    /// A float.
    Float(f64),
    /// A string (for `bytes` features).
    Text(String),
}

/// A feature's default: one value, or one per element.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum FeatureDefault {
    /// Given to every element.
    One(DefaultValue),
    /// One per element, in row-major order.
    Each(Vec<DefaultValue>),
}

impl FeatureDefault {
    /// The values as written.
    pub fn values(&self) -> &[DefaultValue] {
        match self {
            FeatureDefault::One(value) => std::slice::from_ref(value),
            FeatureDefault::Each(values) => values,
        }
    }
}

/// Where Classify's answer comes from: scores, class names, or both (TF
/// Serving's `scores` and `classes` outputs of a classification signature).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassifyOutputs {
    /// A float32 output `[batch, classes]`: each class's score.
    pub scores: Option<String>,
    /// A string output `[batch, classes]`: each class's name.
    pub classes: Option<String>,
    /// The class names, when the model outputs none: label `i` names
    /// column `i` of `scores`.
    pub labels: Option<Vec<String>>,
}

/// Where Regress's answer comes from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegressOutput {
    /// A float32 output `[batch]` or `[batch, 1]`.
    pub output: String,
}

fn default_max_examples() -> usize {
    1024
}

fn default_predict_input() -> String {
    "examples".to_string()
}

/// The most values one feature of one example may hold.
pub const MAX_FEATURE_VALUES: usize = 1 << 20;

impl ExamplesConfig {
    /// Checks what needs no signature; `key` names it in errors.
    /// `pipeline::Pipeline` checks the rest against each version.
    pub fn check(&self, key: &str) -> Result<(), Invalid> {
        check_between(&format!("{key}.max_examples"), self.max_examples, 1, MAX_COUNT)?;
        if self.features.is_empty() {
            return Err(invalid!("{key}.features is empty: map at least one tf.Example feature to an input"));
        }
        let (mut names, mut inputs) = (HashSet::new(), HashSet::new());
        for (i, feature) in self.features.iter().enumerate() {
            let key = format!("{key}.features[{i}]");
            if feature.name.is_empty() {
                return Err(invalid!("{key}.name is empty: give the tf.Example feature's name"));
            }
            if !names.insert(feature.name.as_str()) {
                return Err(invalid!("{key}.name = \"{}\": another feature has the same name", feature.name));
            }
            if !inputs.insert(feature.input_name()) {
                return Err(invalid!(
                    "{key}.input = \"{}\": another feature fills the same input; one feature per input",
                    feature.input_name()
                ));
            }
            let count = match &feature.shape {
                Some(shape) => Some(shape_values(&key, shape)?),
                None => None,
            };
            if let (Some(default), Some(count)) = (&feature.default, count) {
                let given = default.values().len();
                if given != 1 && given != count {
                    return Err(invalid!(
                        "{key}.default has {given} values: give 1 (for every element) or {count} (shape's count)"
                    ));
                }
            }
            if let Some(FeatureDefault::Each(values)) = &feature.default {
                if values.is_empty() {
                    return Err(invalid!("{key}.default = []: give at least one value, or no default"));
                }
            }
        }
        if let Some(classify) = &self.classify {
            classify.check(&format!("{key}.classify"))?;
        }
        if self.classify.is_none() && self.regress.is_none() && self.predict_input.is_empty() {
            return Err(invalid!("{key}: set classify, regress or predict_input, or nothing takes tf.Examples"));
        }
        Ok(())
    }
}

/// The values one example's feature of `shape` holds, checked.
fn shape_values(key: &str, shape: &[i64]) -> Result<usize, Invalid> {
    let mut count = 1usize;
    for &dim in shape {
        let dim = usize::try_from(dim)
            .map_err(|_| invalid!("{key}.shape = {shape:?}: dimensions must be >= 0 (a feature has a fixed length)"))?;
        count = count.saturating_mul(dim);
    }
    if count > MAX_FEATURE_VALUES {
        return Err(invalid!("{key}.shape = {shape:?}: {count} values, more than {MAX_FEATURE_VALUES} per example"));
    }
    Ok(count)
}

impl ClassifyOutputs {
    fn check(&self, key: &str) -> Result<(), Invalid> {
        if self.scores.is_none() && self.classes.is_none() {
            return Err(invalid!("{key}: set scores, classes or both (the outputs Classify answers with)"));
        }
        if let Some(labels) = &self.labels {
            if self.classes.is_some() {
                return Err(invalid!("{key}: classes and labels are both set; the class names come from one"));
            }
            if self.scores.is_none() {
                return Err(invalid!("{key}.labels needs scores: label i names column i of the scores"));
            }
            if labels.is_empty() {
                return Err(invalid!("{key}.labels is empty: give one name per score column"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ExamplesConfig, String> {
        let config: ExamplesConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        config.check("models[0].examples").map_err(|e| e.0)?;
        Ok(config)
    }

    #[test]
    fn reads_features_defaults_and_outputs() {
        let config = parse(
            r#"
            features = [
              { name = "age" },
              { name = "hours", default = 40 },
              { name = "extra", shape = [3], default = [0.0, 0.5, 1] },
              { name = "tag", input = "tags", kind = "bytes", shape = [], default = "none" },
            ]
            classify = { scores = "probabilities", labels = ["low", "mid", "high"] }
            regress = { output = "value" }
            "#,
        )
        .expect("valid");
        assert_eq!(config.max_examples, 1024);
        assert_eq!(config.predict_input, "examples");
        assert_eq!(config.features[1].default, Some(FeatureDefault::One(DefaultValue::Int(40))));
        assert_eq!(config.features[2].default.as_ref().map(|d| d.values().len()), Some(3));
        assert_eq!(config.features[3].input_name(), "tags");
        assert_eq!(config.features[3].kind, Some(FeatureKind::Bytes));
    }

    #[test]
    fn refuses_what_cannot_work() {
        let cases = [
            ("features = []", "features is empty"),
            ("features = [{ name = \"a\" }, { name = \"a\", input = \"b\" }]", "same name"),
            ("features = [{ name = \"a\" }, { name = \"b\", input = \"a\" }]", "same input"),
            ("features = [{ name = \"a\", shape = [-1] }]", "fixed length"),
            ("features = [{ name = \"a\", shape = [2], default = [1, 2, 3] }]", "give 1"),
            ("features = [{ name = \"a\", shape = [1048577] }]", "more than"),
            ("max_examples = 0\nfeatures = [{ name = \"a\" }]", "max_examples = 0"),
            ("features = [{ name = \"a\" }]\nclassify = {}", "set scores, classes"),
            ("features = [{ name = \"a\" }]\nclassify = { classes = \"c\", labels = [\"x\"] }", "both set"),
            ("features = [{ name = \"a\" }]\nclassify = { scores = \"s\", labels = [] }", "labels is empty"),
            ("features = [{ name = \"a\", kind = \"double\" }]", "unknown variant"),
        ];
        for (text, expected) in cases {
            let err = parse(text).expect_err(text);
            assert!(err.contains(expected), "{text}: {err}");
        }
    }
}
