//! `tf.Example`s to tensors: the parse behind Classify, Regress,
//! MultiInference and Predict's serialized `examples` input.
//!
//! [`ExampleColumns`] is a model's (or pipeline's) `examples` config
//! checked against one version's signature: for each input, the feature
//! that fills it, its kind, its per-example shape and its default, already
//! in the input's dtype. [`ExampleColumns::parse`] turns a list of examples
//! (and a context they share) into one batched tensor per input, as
//! TensorFlow's `parse_example` with `FixedLenFeature`s does. Sizes are
//! checked before anything is allocated: the number of examples against
//! `max_examples`, each tensor against the per-tensor byte limit, and each
//! example's values against the feature's fixed count.
//!
//! The config side is here (what fills each input, checked once per
//! version); reading the wire is `wire.rs`; building examples in code
//! (the REST API's JSON examples, tests) is `build.rs`.

mod build;
mod wire;

use wire::{push_float, push_int};

pub use build::{bytes_feature, example, float_feature, int64_feature};

use std::fmt;

use bytes::Bytes;

use super::spec::{Signature, TensorSpec};
use super::{format_shape, DType};
use crate::config::examples::{
    ClassifyOutputs, DefaultValue, ExampleFeature, ExamplesConfig, FeatureKind, RegressOutput,
};
use crate::error::{Error, Result};

/// How examples fill the inputs of one signature.
#[derive(Debug)]
pub struct ExampleColumns {
    columns: Vec<Column>,
    max_examples: usize,
    predict_input: String,
    classify: Option<ClassifyOutputs>,
    regress: Option<RegressOutput>,
}

/// One input and the feature that fills it.
#[derive(Debug)]
struct Column {
    feature: String,
    input: String,
    kind: FeatureKind,
    dtype: DType,
    /// One example's shape.
    shape: Vec<i64>,
    /// One example's value count.
    count: usize,
    /// One example's values when it lacks the feature, in `dtype`.
    default: Option<Values>,
}

/// Values of one feature, converted to the input's dtype.
#[derive(Debug, Clone)]
enum Values {
    Fixed(Vec<u8>),
    Strings(Vec<Bytes>),
}

/// The examples of one request, serialized as the wire carries them: TF
/// Serving's `ExampleList` or `ExampleListWithContext`, or Predict's
/// `examples` strings.
#[derive(Debug, Clone, Copy)]
pub struct ExampleBatch<'a> {
    /// Serialized `tf.Example`s, one row each.
    pub examples: &'a [Bytes],
    /// A serialized `tf.Example` whose features every example has unless
    /// it gives its own.
    pub context: Option<&'a Bytes>,
}

impl ExampleBatch<'_> {
    /// Each example as one serialized `tf.Example` (after the context's
    /// bytes, so its own features win, as a merge of the two messages
    /// does): what a graph that parses examples itself is fed. The context
    /// is copied in front of every example, so what that makes is bounded
    /// by `limit` bytes before it is made (a large context times many
    /// examples).
    pub fn merged(&self, limit: usize) -> Result<Vec<Bytes>> {
        let context_len = self.context.map_or(0, |c| c.len());
        let total = self.examples.iter().try_fold(0usize, |sum, e| sum.checked_add(e.len())?.checked_add(context_len));
        if total.is_none_or(|total| total > limit) {
            return Err(Error::invalid_argument(format!(
                "{} examples of {} bytes in all, each with the {context_len}-byte context, exceed the {limit} bytes \
                 one tensor may hold (server.max_tensor_bytes)",
                self.examples.len(),
                self.examples.iter().map(|e| e.len()).sum::<usize>(),
            )));
        }
        if self.examples.is_empty() {
            return Err(Error::invalid_argument("Input is empty: the example list holds no tf.Example"));
        }
        Ok(self
            .examples
            .iter()
            .map(|example| match self.context {
                Some(context) => [context.as_ref(), example.as_ref()].concat().into(),
                None => example.clone(),
            })
            .collect())
    }
}

/// The kind of values an input of `dtype` takes from a feature. A
/// complex input takes none (a `tf.train.Feature` has no complex list):
/// [`Column::new`] refuses it first.
fn kind_for(dtype: DType) -> FeatureKind {
    match dtype {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => FeatureKind::Float,
        DType::Complex64 | DType::Complex128 => FeatureKind::Float,
        DType::I64 | DType::I32 | DType::I16 | DType::I8 | DType::U8 | DType::U16 | DType::U32 | DType::U64 => {
            FeatureKind::Int64
        }
        DType::Bool => FeatureKind::Int64,
        DType::String => FeatureKind::Bytes,
    }
}
impl ExampleColumns {
    /// `config` checked against `signature` (whose owner `owner` names in
    /// errors): every input is filled by exactly one feature whose kind,
    /// shape and default fit it.
    pub fn new(config: &ExamplesConfig, signature: &Signature, owner: &dyn fmt::Display) -> Result<ExampleColumns> {
        let mut columns = Vec::with_capacity(signature.inputs.len());
        for spec in &signature.inputs {
            let feature = config.features.iter().find(|f| f.input_name() == spec.name).ok_or_else(|| {
                Error::invalid_argument(format!(
                    "examples: no feature fills input '{}' of {owner}; add {{ name = \"FEATURE\", input = \"{}\" }} \
                     to examples.features",
                    spec.name, spec.name
                ))
            })?;
            columns.push(Column::new(feature, spec, owner)?);
        }
        if let Some(extra) = config.features.iter().find(|f| !signature.inputs.iter().any(|s| s.name == f.input_name()))
        {
            let inputs: Vec<&str> = signature.inputs.iter().map(|s| s.name.as_str()).collect();
            return Err(Error::invalid_argument(format!(
                "examples: feature '{}' fills input '{}', which {owner} does not have; inputs: {inputs:?}",
                extra.name,
                extra.input_name()
            )));
        }
        if let Some(classify) = &config.classify {
            check_classify_outputs(classify, signature, owner)?;
        }
        if let Some(regress) = &config.regress {
            let spec = output(signature, &regress.output, "regress.output", owner)?;
            let fits = spec.dtype == DType::F32
                && !spec.unknown_rank
                && (spec.shape.len() == 1 || (spec.shape.len() == 2 && matches!(spec.shape[1], 1 | -1)));
            if !fits {
                return Err(Error::invalid_argument(format!(
                    "examples.regress.output '{}' of {owner} is {spec}; Regress needs float32 [batch] or [batch, 1]",
                    regress.output
                )));
            }
        }
        Ok(ExampleColumns {
            columns,
            max_examples: config.max_examples,
            predict_input: config.predict_input.clone(),
            classify: config.classify.clone(),
            regress: config.regress.clone(),
        })
    }

    /// The outputs Classify answers with, when it is served.
    pub fn classify(&self) -> Option<&ClassifyOutputs> {
        self.classify.as_ref()
    }

    /// The output Regress answers with, when it is served.
    pub fn regress(&self) -> Option<&RegressOutput> {
        self.regress.as_ref()
    }

    /// The inputs the parse fills, in signature order.
    pub fn input_names(&self) -> impl Iterator<Item = &str> + Clone {
        self.columns.iter().map(|c| c.input.as_str())
    }

    /// The Predict input that may carry serialized examples; empty when
    /// Predict takes none.
    pub fn predict_input(&self) -> &str {
        &self.predict_input
    }

    /// The kind of values the feature called `name` holds, when the parse
    /// reads it.
    pub fn feature_kind(&self, name: &str) -> Option<FeatureKind> {
        self.columns.iter().find(|c| c.feature == name).map(|c| c.kind)
    }

    /// The most examples one request may carry.
    pub fn max_examples(&self) -> usize {
        self.max_examples
    }

    /// Refuses `count` examples when there are none or too many, before
    /// any is parsed.
    pub fn check_count(&self, count: usize) -> Result<()> {
        if count == 0 {
            return Err(Error::invalid_argument(
                "input is empty: give at least one tf.Example (input.example_list.examples)",
            ));
        }
        if count > self.max_examples {
            return Err(Error::invalid_argument(format!(
                "{count} examples given, more than the {} one request may carry (examples.max_examples)",
                self.max_examples
            )));
        }
        Ok(())
    }
}

/// The output `name` of `signature`, or which ones there are.
fn output<'s>(signature: &'s Signature, name: &str, key: &str, owner: &dyn fmt::Display) -> Result<&'s TensorSpec> {
    signature.outputs.iter().find(|spec| spec.name == name).ok_or_else(|| {
        let outputs: Vec<&str> = signature.outputs.iter().map(|s| s.name.as_str()).collect();
        Error::invalid_argument(format!(
            "examples.{key} = \"{name}\": {owner} has no such output; outputs: {outputs:?}"
        ))
    })
}

/// Classify's outputs are `[batch, classes]` scores (float32) and class
/// names (strings), as TF Serving's classification signatures are.
fn check_classify_outputs(classify: &ClassifyOutputs, signature: &Signature, owner: &dyn fmt::Display) -> Result<()> {
    let mut columns = None;
    for (key, name, dtype) in
        [("classify.scores", &classify.scores, DType::F32), ("classify.classes", &classify.classes, DType::String)]
    {
        let Some(name) = name else { continue };
        let spec = output(signature, name, key, owner)?;
        if spec.dtype != dtype || spec.unknown_rank || spec.shape.len() != 2 {
            return Err(Error::invalid_argument(format!(
                "examples.{key} '{name}' of {owner} is {spec}; Classify needs {dtype} [batch, classes]"
            )));
        }
        match (columns, spec.shape[1]) {
            (Some(a), b) if b >= 0 && a != b => {
                return Err(Error::invalid_argument(format!(
                    "examples.classify: scores and classes of {owner} have {a} and {b} columns; they must agree"
                )))
            }
            (_, b) if b >= 0 => columns = Some(b),
            _ => {}
        }
    }
    if let (Some(labels), Some(columns)) = (&classify.labels, columns) {
        if labels.len() as i64 != columns {
            return Err(Error::invalid_argument(format!(
                "examples.classify.labels has {} names, but the scores of {owner} have {columns} columns",
                labels.len()
            )));
        }
    }
    Ok(())
}
impl Column {
    fn new(feature: &ExampleFeature, spec: &TensorSpec, owner: &dyn fmt::Display) -> Result<Column> {
        let here = || format!("examples: feature '{}' (input '{}' of {owner})", feature.name, spec.name);
        if spec.dtype.is_complex() {
            return Err(Error::invalid_argument(format!(
                "{}: the input is {}, and a tf.train.Feature has no complex list to fill it from",
                here(),
                spec.dtype
            )));
        }
        let kind = kind_for(spec.dtype);
        if let Some(declared) = feature.kind {
            if declared != kind {
                return Err(Error::invalid_argument(format!(
                    "{}: kind = \"{}\", but a {} input takes a {}",
                    here(),
                    declared.list_name().trim_end_matches("_list"),
                    spec.dtype,
                    kind.list_name()
                )));
            }
        }
        if spec.unknown_rank || spec.shape.is_empty() {
            return Err(Error::invalid_argument(format!(
                "{}: the input needs a batch dimension (rank >= 1), one row per example; it has {}",
                here(),
                if spec.unknown_rank { "an unknown rank".to_string() } else { "rank 0".to_string() }
            )));
        }
        let shape = match &feature.shape {
            Some(shape) => shape.clone(),
            None if spec.shape[1..].iter().all(|&d| d >= 0) => spec.shape[1..].to_vec(),
            None => {
                return Err(Error::invalid_argument(format!(
                    "{}: the input's shape {} leaves one example's shape open; give shape",
                    here(),
                    format_shape(&spec.shape)
                )))
            }
        };
        let fits = shape.len() + 1 == spec.shape.len()
            && shape.iter().zip(&spec.shape[1..]).all(|(&mine, &theirs)| theirs < 0 || mine == theirs);
        if !fits {
            return Err(Error::invalid_argument(format!(
                "{}: shape {} per example makes rows of {}, which do not fit the input's {}",
                here(),
                format_shape(&shape),
                format_shape(&[&[-1], shape.as_slice()].concat()),
                format_shape(&spec.shape)
            )));
        }
        let count = super::element_count(&shape)?;
        let default = match &feature.default {
            None => None,
            Some(default) => {
                let given = default.values();
                // Checked with the config, but a shape taken from the
                // signature is only known here.
                if given.len() != 1 && given.len() != count {
                    return Err(Error::invalid_argument(format!(
                        "{}: default has {} values, but one example of shape {} has {count}",
                        here(),
                        given.len(),
                        format_shape(&shape)
                    )));
                }
                let one = |i: usize| if given.len() == 1 { &given[0] } else { &given[i] };
                Some(convert_default(spec.dtype, count, one).map_err(|e| e.context(format_args!("{}", here())))?)
            }
        };
        Ok(Column {
            feature: feature.name.clone(),
            input: spec.name.clone(),
            kind,
            dtype: spec.dtype,
            shape,
            count,
            default,
        })
    }
}

/// One example's default values (`one(i)` is element `i`'s) in `dtype`.
fn convert_default<'v>(dtype: DType, count: usize, one: impl Fn(usize) -> &'v DefaultValue) -> Result<Values> {
    let kind = kind_for(dtype);
    if kind == FeatureKind::Bytes {
        return (0..count)
            .map(|i| match one(i) {
                DefaultValue::Text(text) => Ok(Bytes::copy_from_slice(text.as_bytes())),
                other => Err(Error::invalid_argument(format!("default {other:?} is not a string"))),
            })
            .collect::<Result<Vec<Bytes>>>()
            .map(Values::Strings);
    }
    let mut out = Vec::with_capacity(count * dtype.size().unwrap_or(0));
    for i in 0..count {
        match (kind, one(i)) {
            (FeatureKind::Float, DefaultValue::Float(v)) => push_float(dtype, *v, &mut out),
            (FeatureKind::Float, DefaultValue::Int(v)) => push_float(dtype, *v as f64, &mut out),
            (FeatureKind::Int64, DefaultValue::Int(v)) => push_int(dtype, *v, &mut out)
                .map_err(|why| Error::invalid_argument(format!("default {v} {why} for {dtype}")))?,
            (_, other) => {
                return Err(Error::invalid_argument(format!(
                    "default {other:?} is not a {} value",
                    kind.list_name().trim_end_matches("_list")
                )))
            }
        }
    }
    Ok(Values::Fixed(out))
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::tensorflow::Example;
    use prost::Message;

    /// Examples as the wire carries them.
    fn wire(examples: &[Example]) -> Vec<Bytes> {
        examples.iter().map(|e| Bytes::from(e.encode_to_vec())).collect()
    }

    fn spec(name: &str, dtype: DType, shape: &[i64]) -> TensorSpec {
        TensorSpec::new(name, dtype, shape.to_vec())
    }

    fn census() -> (ExamplesConfig, Signature) {
        let config: ExamplesConfig = toml::from_str(
            r#"
            features = [
              { name = "age" },
              { name = "hours", default = 40 },
              { name = "extra", default = [0.0, 0.5, 1.0] },
              { name = "country", default = 0 },
              { name = "tag", input = "tags", shape = [], default = "none" },
            ]
            "#,
        )
        .expect("config");
        let signature = Signature {
            inputs: vec![
                spec("age", DType::F32, &[-1, 1]),
                spec("hours", DType::F32, &[-1, 1]),
                spec("extra", DType::F32, &[-1, 3]),
                spec("country", DType::I64, &[-1, 1]),
                spec("tags", DType::String, &[-1]),
            ],
            outputs: vec![spec("p", DType::F32, &[-1, 3])],
        };
        (config, signature)
    }

    fn columns() -> ExampleColumns {
        let (config, signature) = census();
        ExampleColumns::new(&config, &signature, &"census").expect("fits")
    }

    #[test]
    fn parses_with_context_and_defaults() {
        let examples = vec![
            example([("age".into(), float_feature(vec![30.0])), ("hours".into(), float_feature(vec![20.0]))]),
            example([
                ("age".into(), float_feature(vec![50.0])),
                ("extra".into(), float_feature(vec![1.0, 2.0, 3.0])),
                ("tag".into(), bytes_feature(vec![Bytes::from_static(b"x")])),
            ]),
        ];
        let context =
            example([("hours".into(), float_feature(vec![10.0])), ("country".into(), int64_feature(vec![3]))]);
        let tensors = columns()
            .parse(
                ExampleBatch { examples: &wire(&examples), context: Some(&wire(std::slice::from_ref(&context))[0]) },
                1 << 20,
            )
            .expect("parse");
        assert_eq!(tensors[0].to_vec::<f32>(), Some(vec![30.0, 50.0]));
        // The example's own hours win over the context's.
        assert_eq!(tensors[1].to_vec::<f32>(), Some(vec![20.0, 10.0]));
        assert_eq!(tensors[2].to_vec::<f32>(), Some(vec![0.0, 0.5, 1.0, 1.0, 2.0, 3.0]));
        assert_eq!(tensors[2].shape(), &[2, 3]);
        assert_eq!(tensors[3].to_vec::<i64>(), Some(vec![3, 3]));
        assert_eq!(tensors[4].strings().map(|s| s.to_vec()), Some(vec![Bytes::from("none"), Bytes::from("x")]));
    }

    #[test]
    fn refuses_bad_examples_naming_index_and_feature() {
        let columns = columns();
        let good = || example([("age".into(), float_feature(vec![1.0]))]);
        let cases: Vec<(Example, &str)> = vec![
            (example([]), "example 1: feature 'age' is missing and has no default"),
            (example([("age".into(), int64_feature(vec![1]))]), "example 1: feature 'age' is a int64_list"),
            (
                example([("age".into(), float_feature(vec![1.0])), ("extra".into(), float_feature(vec![1.0, 2.0]))]),
                "example 1: feature 'extra' has 2 values, but it takes 3",
            ),
            (
                example([
                    ("age".into(), float_feature(vec![1.0])),
                    ("tag".into(), bytes_feature(vec![Bytes::new(), Bytes::new()])),
                ]),
                "feature 'tag' has 2 values, but it takes 1",
            ),
        ];
        for (bad, expected) in cases {
            let examples = vec![good(), bad];
            let err = columns.parse(ExampleBatch { examples: &wire(&examples), context: None }, 1 << 20).unwrap_err();
            assert_eq!(err.code(), crate::error::Code::InvalidArgument);
            assert!(err.message().contains(expected), "{err}");
        }
        let none = columns.parse(ExampleBatch { examples: &[], context: None }, 1 << 20).unwrap_err();
        assert!(none.message().contains("input is empty"), "{none}");
        let many = vec![good(); 1025];
        let err = columns.parse(ExampleBatch { examples: &wire(&many), context: None }, 1 << 20).unwrap_err();
        assert!(err.message().contains("more than the 1024"), "{err}");
        let small = vec![good(); 100];
        let err = columns.parse(ExampleBatch { examples: &wire(&small), context: None }, 64).unwrap_err();
        assert!(err.message().contains("max_tensor_bytes"), "{err}");
        let err = columns
            .parse(ExampleBatch { examples: &[Bytes::from_static(b"\xff\xff")], context: None }, 1 << 20)
            .unwrap_err();
        assert!(err.message().contains("example 0 is not a valid serialized tf.Example: truncated"), "{err}");
    }

    #[test]
    fn checks_config_against_signature() {
        let (mut config, signature) = census();
        config.features.pop();
        let err = ExampleColumns::new(&config, &signature, &"census").unwrap_err();
        assert!(err.message().contains("no feature fills input 'tags'"), "{err}");
        let (mut config, signature) = census();
        config.features[0].input = Some("nope".into());
        let err = ExampleColumns::new(&config, &signature, &"census").unwrap_err();
        assert!(err.message().contains("no feature fills input 'age'"), "{err}");
        let (mut config, signature) = census();
        config.features[2].shape = Some(vec![4]);
        let err = ExampleColumns::new(&config, &signature, &"census").unwrap_err();
        assert!(err.message().contains("do not fit the input's [-1, 3]"), "{err}");
        let (mut config, signature) = census();
        config.features[3].default = Some(crate::config::examples::FeatureDefault::One(DefaultValue::Float(0.5)));
        let err = ExampleColumns::new(&config, &signature, &"census").unwrap_err();
        assert!(err.message().contains("not a int64 value"), "{err}");
        let (mut config, signature) = census();
        config.features[0].kind = Some(FeatureKind::Bytes);
        let err = ExampleColumns::new(&config, &signature, &"census").unwrap_err();
        assert!(err.message().contains("takes a float_list"), "{err}");
        // A complex input: no feature list can fill it.
        let (config, mut signature) = census();
        signature.inputs[1].dtype = DType::Complex64;
        let err = ExampleColumns::new(&config, &signature, &"census").unwrap_err();
        assert!(err.message().contains("input 'hours'") && err.message().contains("no complex list"), "{err}");
    }

    /// Protobuf by hand: a key, then a varint, or a length and bytes.
    fn field(number: u32, wire_type: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        prost::encoding::encode_varint(u64::from(number << 3 | u32::from(wire_type)), &mut out);
        if wire_type == 2 {
            prost::encoding::encode_varint(payload.len() as u64, &mut out);
        }
        out.extend_from_slice(payload);
        out
    }

    fn entry(name: &str, feature: &[u8]) -> Vec<u8> {
        field(1, 2, &[field(1, 2, name.as_bytes()), field(2, 2, feature)].concat())
    }

    fn floats(values: &[f32]) -> Vec<u8> {
        let packed: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        field(2, 2, &field(1, 2, &packed))
    }

    #[test]
    fn reads_the_wire_as_prost_merges_it() {
        let columns = columns();
        let unpacked = field(2, 2, &[field(1, 5, &7.5f32.to_le_bytes()), field(9, 0, &[1])].concat());
        let features = [
            // Given twice: the last entry wins.
            entry("age", &floats(&[1.0])),
            entry("age", &unpacked),
            // Two float lists merge; an int64 list before them is replaced.
            entry("extra", &[field(3, 2, &field(1, 2, &[5])), floats(&[1.0]), floats(&[2.0, 3.0])].concat()),
            // Unknown fields and a group are skipped.
            field(7, 0, &[3]),
            [0x5b, 0x08, 0x01, 0x5c].to_vec(),
        ]
        .concat();
        let example = [field(1, 2, &features), field(5, 2, b"ignored")].concat();
        let bytes = Bytes::from(example);
        let decoded = Example::decode(bytes.clone()).expect("prost reads it too");
        let extra = &decoded.features.as_ref().expect("features").feature["extra"];
        assert_eq!(*extra, float_feature(vec![1.0, 2.0, 3.0]), "prost merges the lists the same way");
        let tensors = columns.parse(ExampleBatch { examples: &[bytes], context: None }, 1 << 20).expect("parses");
        assert_eq!(tensors[0].to_vec::<f32>(), Some(vec![7.5]));
        assert_eq!(tensors[2].to_vec::<f32>(), Some(vec![1.0, 2.0, 3.0]));
        // Cut anywhere inside, it is refused naming the example, never
        // read past its end.
        let whole = field(1, 2, &features);
        for cut in 1..whole.len() {
            let cut = Bytes::copy_from_slice(&whole[..cut]);
            if let Err(e) = columns.parse(ExampleBatch { examples: &[cut], context: None }, 1 << 20) {
                assert!(e.message().starts_with("example 0"), "{e}");
            }
        }
    }

    #[test]
    fn narrows_integers_with_a_range_check() {
        let config: ExamplesConfig = toml::from_str("features = [{ name = \"n\" }]").expect("config");
        let signature = Signature { inputs: vec![spec("n", DType::I32, &[-1])], outputs: vec![] };
        let columns = ExampleColumns::new(&config, &signature, &"m").expect("fits");
        let ok = vec![example([("n".into(), int64_feature(vec![-7]))])];
        let parsed = columns.parse(ExampleBatch { examples: &wire(&ok), context: None }, 1024).expect("parse");
        assert_eq!(parsed[0].to_vec::<i32>(), Some(vec![-7]));
        let big = vec![example([("n".into(), int64_feature(vec![1 << 40]))])];
        let err = columns.parse(ExampleBatch { examples: &wire(&big), context: None }, 1024).unwrap_err();
        assert!(err.message().contains("value 1099511627776 is out of range"), "{err}");
    }
}
