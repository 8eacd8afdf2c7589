//! What each fuzz target does with its input, shared by the `cargo fuzz`
//! targets (`fuzz/fuzz_targets/`) and by the regression test that replays
//! every committed corpus and crash file (`tests/fuzz_regressions.rs`).
//!
//! Each function takes untrusted bytes through one decoder or check the
//! server runs on client, config, plugin or admin input. None may panic
//! or allocate past its limit; where a round trip exists, it must hold.

#![allow(dead_code)]

use bytes::Bytes;
use prost::Message;
use sluice::proto::tensorflow::serving::PredictionLog;
use sluice::proto::tensorflow::TensorProto;
use sluice::tensor::spec::{check_outputs, TensorSpec};
use sluice::tensor::{DType, NamedTensor, Tensor};

/// The most bytes one decoded tensor may take here, as
/// `server.max_tensor_bytes` bounds it in the server.
const LIMIT: usize = 1 << 20;

/// One target: what it does with its input.
pub type Target = fn(&[u8]);

/// Every target, by name, for the regression test.
pub const TARGETS: &[(&str, Target)] = &[
    ("tensor_proto", tensor_proto),
    ("rest_json", rest_json),
    ("config_toml", config_toml),
    ("tf_text_config", tf_text_config),
    ("batching_parameters", batching_parameters),
    ("v2_raw", v2_raw),
    ("plugin_outputs", plugin_outputs),
    ("admin_input", admin_input),
    ("warmup_file", warmup_file),
    ("tf_examples", tf_examples),
];

/// A gRPC TensorProto: decoded as an input is; a tensor that decodes
/// re-encodes to the same values.
pub fn tensor_proto(data: &[u8]) {
    let Ok(proto) = TensorProto::decode(data) else { return };
    let Ok(tensor) = sluice::tensor::proto::decode("x", proto, LIMIT) else { return };
    for encoding in [sluice::config::OutputEncoding::TypedFields, sluice::config::OutputEncoding::TensorContent] {
        let again = sluice::tensor::proto::decode("x", sluice::tensor::proto::encode(&tensor, encoding), LIMIT)
            .expect("a decoded tensor re-encodes and decodes");
        assert_eq!(again, tensor, "round trip through {encoding:?}");
    }
}

/// A REST JSON body: counted before parsing, non-finite numbers allowed as
/// TF Serving writes them, then each value decoded as a tensor of every
/// dtype.
pub fn rest_json(data: &[u8]) {
    if sluice::tensor::json::check_json_bounds(data, 10_000, "fuzz").is_err() {
        return;
    }
    let body = sluice::tensor::json::accept_non_finite(data);
    let Ok(value) = sluice::tensor::json::parse::<serde_json::Value>(&body) else { return };
    let candidates: Vec<&serde_json::Value> = match &value {
        serde_json::Value::Object(map) => map.values().collect(),
        other => vec![other],
    };
    for candidate in candidates {
        for dtype in DType::ALL {
            if let Ok(tensor) = sluice::tensor::json::tensor_from_json(candidate, dtype, "fuzz") {
                let _ = sluice::tensor::json::tensor_to_json(&tensor);
            }
        }
    }
}

/// A sluice TOML config.
pub fn config_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = sluice::config::Config::from_toml(text, "fuzz.toml", std::path::Path::new("/fuzz"));
}

/// TF Serving's text-format ModelServerConfig and MonitoringConfig.
pub fn tf_text_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = sluice::config::tf_model_config::parse(text, std::path::Path::new("/fuzz"));
    let _ = sluice::config::tf_model_config::prometheus_path(text);
    let _ = sluice::config::Config::from_text(text, "fuzz", std::path::Path::new("/fuzz"));
}

/// TF Serving's batching parameters file.
pub fn batching_parameters(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(params) = sluice::config::BatchingParameters::from_text_format(text) {
        if params.check("fuzz").is_ok() {
            for rows in [0, 1, params.max_batch_size] {
                assert!(params.padded_size(rows) >= rows, "padding never shrinks a batch");
            }
        }
    }
}

/// A KServe v2 raw input: a datatype, a shape and raw bytes.
pub fn v2_raw(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else { return };
    let dtype = DType::ALL[usize::from(selector) % DType::ALL.len()];
    let (shape, raw) = shape_and_rest(rest);
    if let Ok(tensor) = sluice::tensor::v2::decode_raw(dtype, shape, Bytes::copy_from_slice(raw), LIMIT, "fuzz") {
        let encoded = sluice::tensor::v2::encode_raw(&tensor);
        let again = sluice::tensor::v2::decode_raw(dtype, tensor.shape().to_vec(), encoded, LIMIT, "fuzz")
            .expect("a decoded tensor re-encodes");
        assert_eq!(again, tensor);
    }
}

/// What a plugin returns: tensors of any dtype, shape and bytes, checked
/// against what it declared, as the host checks them.
pub fn plugin_outputs(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else { return };
    let dtype = DType::ALL[usize::from(selector) % DType::ALL.len()];
    let (shape, bytes) = shape_and_rest(rest);
    let tensor = if dtype == DType::String {
        let strings: Vec<Bytes> = bytes.split(|&b| b == 0).map(Bytes::copy_from_slice).collect();
        Tensor::from_strings(shape.clone(), strings)
    } else {
        Tensor::from_bytes(dtype, shape.clone(), Bytes::copy_from_slice(bytes))
    };
    let Ok(tensor) = tensor else { return };
    let declared = [
        TensorSpec { name: "y".into(), dtype, shape: vec![-1, 4], unknown_rank: false },
        TensorSpec { name: "y".into(), dtype: DType::F32, shape: vec![-1], unknown_rank: false },
        TensorSpec { name: "y".into(), dtype, shape: Vec::new(), unknown_rank: true },
    ];
    for spec in declared {
        let _ = check_outputs(&"fuzz", std::slice::from_ref(&spec), &[NamedTensor::new("y", tensor.clone())]);
    }
}

/// The admin API's names and the manifests in the plugin store.
pub fn admin_input(data: &[u8]) {
    if let Ok(name) = std::str::from_utf8(data) {
        if sluice::config::check_name("fuzz", name).is_ok() {
            assert!(!name.contains('/') && !name.starts_with('.'), "a checked name is safe as a file name");
        }
    }
    let _ = serde_json::from_slice::<sluice::plugin::registry::Manifest>(data);
}

/// A TF Serving warmup file: TFRecord framing of PredictionLog records.
pub fn warmup_file(data: &[u8]) {
    let Ok(records) = sluice::models::tfrecord::records(data) else { return };
    for record in records {
        let _ = PredictionLog::decode(record);
    }
    let framed = sluice::models::tfrecord::write(
        &sluice::models::tfrecord::records(data).unwrap_or_default().iter().map(|r| r.to_vec()).collect::<Vec<_>>(),
    );
    assert_eq!(framed, data, "records re-frame to the same file");
}

/// A shape (first byte: rank up to 4; then one byte per dimension) and
/// the bytes after it.
fn shape_and_rest(data: &[u8]) -> (Vec<i64>, &[u8]) {
    let Some((&rank, rest)) = data.split_first() else { return (Vec::new(), data) };
    let rank = usize::from(rank % 5).min(rest.len());
    let shape = rest[..rank].iter().map(|&d| i64::from(d) - 1).collect();
    (shape, &rest[rank..])
}

/// A Classify/Regress `Input` (`ExampleList` or `ExampleListWithContext`)
/// parsed into tensors by a config with every kind of feature (floats,
/// narrowed integers, bools, strings; defaults and required ones), and the
/// same bytes as one serialized `tf.Example` for Predict's `examples`
/// input. Errors are fine; a panic, a tensor of the wrong row count, or a
/// tensor past the limit is not.
pub fn tf_examples(data: &[u8]) {
    use sluice::config::examples::{DefaultValue, ExampleFeature, ExamplesConfig, FeatureDefault};
    use sluice::proto::tensorflow::serving::{input, Input};
    use sluice::tensor::example::{ExampleBatch, ExampleColumns};
    use sluice::tensor::spec::Signature;

    let feature = ExampleFeature::named;
    let config = ExamplesConfig {
        max_examples: 64,
        predict_input: "examples".into(),
        features: vec![
            feature("a", None),
            feature("b", Some(FeatureDefault::Each(vec![DefaultValue::Float(1.5), DefaultValue::Float(2.5)]))),
            feature("c", Some(FeatureDefault::One(DefaultValue::Int(7)))),
            feature("d", Some(FeatureDefault::One(DefaultValue::Text("none".into())))),
            feature("e", Some(FeatureDefault::One(DefaultValue::Int(1)))),
        ],
        classify: None,
        regress: None,
    };
    let spec = |name: &str, dtype: DType, shape: &[i64]| TensorSpec {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
        unknown_rank: false,
    };
    let signature = Signature {
        inputs: vec![
            spec("a", DType::F32, &[-1, 1]),
            spec("b", DType::F64, &[-1, 2]),
            spec("c", DType::I32, &[-1]),
            spec("d", DType::String, &[-1, 1]),
            spec("e", DType::Bool, &[-1]),
        ],
        outputs: vec![],
    };
    let columns = ExampleColumns::new(&config, &signature, &"fuzz").expect("the fuzz config fits");
    let check = |rows: usize, parsed: sluice::error::Result<Vec<Tensor>>| {
        let Ok(tensors) = parsed else { return };
        assert_eq!(tensors.len(), signature.inputs.len());
        for (tensor, spec) in tensors.iter().zip(&signature.inputs) {
            assert_eq!(tensor.rows(), rows, "rows of {}", spec.name);
            assert_eq!(tensor.dtype(), spec.dtype);
            sluice::tensor::spec::check_tensor(&"fuzz", "input", spec, tensor).expect("a parsed tensor fits its input");
        }
    };
    if let Ok(Input { kind: Some(kind) }) = Input::decode(data) {
        let (examples, context) = match kind {
            input::Kind::ExampleList(list) => (list.examples, None),
            input::Kind::ExampleListWithContext(list) => (list.examples, Some(list.context)),
        };
        let batch = ExampleBatch { examples: &examples, context: context.as_ref() };
        let parsed = columns.parse(batch, LIMIT);
        same_as_prost(&examples, context.as_ref(), &parsed);
        check(examples.len(), parsed);
    }
    let serialized = [Bytes::copy_from_slice(data)];
    let parsed = columns.parse(ExampleBatch { examples: &serialized, context: None }, LIMIT);
    same_as_prost(&serialized, None, &parsed);
    check(1, parsed);
}

/// The parse reads examples in place; prost decodes them whole. Where
/// prost decodes every example (and the context), the parse must not call
/// them malformed, and what it reads of `a` (float32, required) and `c`
/// (int32, default 7) must be what the decoded messages hold.
fn same_as_prost(examples: &[Bytes], context: Option<&Bytes>, parsed: &sluice::error::Result<Vec<Tensor>>) {
    use sluice::proto::tensorflow::{feature, Example};
    let decoded: Result<Vec<Example>, _> = examples.iter().map(|e| Example::decode(e.clone())).collect();
    let context = context.map(|c| Example::decode(c.clone()));
    let (Ok(decoded), Some(Ok(_)) | None) = (decoded, &context) else { return };
    let tensors = match parsed {
        Ok(tensors) => tensors,
        Err(e) => {
            assert!(
                !e.message().contains("not a valid serialized") && !e.message().contains("is not valid"),
                "prost decodes what the parse calls malformed: {e}"
            );
            return;
        }
    };
    let context = context.and_then(Result::ok);
    let lookup = |example: &Example, name: &str| -> Option<feature::Kind> {
        let kind = example.features.as_ref()?.feature.get(name)?.kind.clone()?;
        let empty = match &kind {
            feature::Kind::BytesList(l) => l.value.is_empty(),
            feature::Kind::FloatList(l) => l.value.is_empty(),
            feature::Kind::Int64List(l) => l.value.is_empty(),
        };
        (!empty).then_some(kind)
    };
    let value = |example: &Example, name: &str| {
        lookup(example, name).or_else(|| context.as_ref().and_then(|c| lookup(c, name)))
    };
    let a: Vec<f32> = decoded
        .iter()
        .map(|e| match value(e, "a") {
            Some(feature::Kind::FloatList(l)) => l.value[0],
            other => panic!("the parse succeeded, but prost reads a as {other:?}"),
        })
        .collect();
    let parsed_a = tensors[0].to_vec::<f32>().expect("a is float32");
    assert!(a.iter().zip(&parsed_a).all(|(x, y)| x.to_bits() == y.to_bits()), "a: {a:?} vs {parsed_a:?}");
    let c: Vec<i32> = decoded
        .iter()
        .map(|e| match value(e, "c") {
            Some(feature::Kind::Int64List(l)) => l.value[0] as i32,
            None => 7,
            other => panic!("the parse succeeded, but prost reads c as {other:?}"),
        })
        .collect();
    assert_eq!(tensors[2].to_vec::<i32>().expect("c is int32"), c);
}
