//! What taking `tf.Example`s costs against taking the same rows as
//! tensors, side by side: for a batch of N census examples (four features:
//! `age`, `hours`, `extra` ×3, `country`), the server's whole edge work
//! from the request bytes to the model's input tensors —
//!
//! - `classify`: decode a `ClassificationRequest` (its examples stay
//!   serialized, as TF Serving's `lazy` fields), parse them straight from
//!   the request buffer (`tensor::example`), one tensor per input;
//! - `predict typed`: decode a `PredictRequest` of the same four inputs in
//!   typed fields (`float_val`, `int64_val`: what TF clients send by
//!   default), and each tensor;
//! - `predict content`: the same in `tensor_content`.
//!
//! ```text
//! cargo bench --bench examples
//! ```

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use prost::Message;
use sluice::config::examples::{DefaultValue, ExampleFeature, ExamplesConfig, FeatureDefault};
use sluice::config::OutputEncoding;
use sluice::proto::tensorflow::serving::{input, ClassificationRequest, ExampleList, Input, ModelSpec, PredictRequest};
use sluice::tensor::example::{example, float_feature, int64_feature, ExampleBatch, ExampleColumns};
use sluice::tensor::proto::{decode, encode};
use sluice::tensor::spec::{Signature, TensorSpec};
use sluice::tensor::{DType, Tensor};

const LIMIT: usize = 1 << 30;

fn spec(name: &str, dtype: DType, width: i64) -> TensorSpec {
    TensorSpec { name: name.into(), dtype, shape: vec![-1, width], unknown_rank: false }
}

fn columns() -> (ExampleColumns, Signature) {
    let feature = ExampleFeature::named;
    let config = ExamplesConfig {
        max_examples: 1 << 16,
        predict_input: "examples".into(),
        features: vec![
            feature("age", None),
            feature("hours", Some(FeatureDefault::One(DefaultValue::Float(40.0)))),
            feature("extra", Some(FeatureDefault::One(DefaultValue::Float(0.0)))),
            feature("country", Some(FeatureDefault::One(DefaultValue::Int(0)))),
        ],
        classify: None,
        regress: None,
    };
    let signature = Signature {
        inputs: vec![
            spec("age", DType::F32, 1),
            spec("hours", DType::F32, 1),
            spec("extra", DType::F32, 3),
            spec("country", DType::I64, 1),
        ],
        outputs: vec![spec("probabilities", DType::F32, 3)],
    };
    let columns = ExampleColumns::new(&config, &signature, &"census").expect("the bench config fits");
    (columns, signature)
}

fn requests(rows: usize) -> (Bytes, Bytes, Bytes) {
    let examples = (0..rows)
        .map(|i| {
            let i = i as f32;
            example([
                ("age".to_string(), float_feature(vec![20.0 + i])),
                ("hours".to_string(), float_feature(vec![35.0 + i * 0.5])),
                ("extra".to_string(), float_feature(vec![0.1 * i, -0.5, 0.25])),
                ("country".to_string(), int64_feature(vec![(i as i64) % 5])),
            ])
        })
        .map(|example| Bytes::from(example.encode_to_vec()))
        .collect();
    let spec = Some(ModelSpec { name: "census".into(), ..Default::default() });
    let classify = ClassificationRequest {
        model_spec: spec.clone(),
        input: Some(Input { kind: Some(input::Kind::ExampleList(ExampleList { examples })) }),
    };
    let n = rows as i64;
    let tensors = [
        ("age", Tensor::from_values(vec![n, 1], &(0..rows).map(|i| 20.0 + i as f32).collect::<Vec<_>>())),
        ("hours", Tensor::from_values(vec![n, 1], &(0..rows).map(|i| 35.0 + i as f32 * 0.5).collect::<Vec<_>>())),
        (
            "extra",
            Tensor::from_values(vec![n, 3], &(0..rows).flat_map(|i| [0.1 * i as f32, -0.5, 0.25]).collect::<Vec<_>>()),
        ),
        ("country", Tensor::from_values(vec![n, 1], &(0..rows).map(|i| (i % 5) as i64).collect::<Vec<_>>())),
    ];
    let predict = |encoding| {
        let request = PredictRequest {
            model_spec: spec.clone(),
            inputs: tensors.iter().map(|(name, t)| (name.to_string(), encode(t, encoding))).collect(),
            output_filter: vec![],
        };
        Bytes::from(request.encode_to_vec())
    };
    (
        Bytes::from(classify.encode_to_vec()),
        predict(OutputEncoding::TypedFields),
        predict(OutputEncoding::TensorContent),
    )
}

fn parse_classify(columns: &ExampleColumns, bytes: Bytes) -> Vec<Tensor> {
    let request = ClassificationRequest::decode(bytes).expect("decode");
    let Some(input::Kind::ExampleList(list)) = request.input.and_then(|i| i.kind) else { panic!("an example list") };
    columns.parse(ExampleBatch { examples: &list.examples, context: None }, LIMIT).expect("parse")
}

fn decode_predict(bytes: Bytes) -> Vec<Tensor> {
    let request = PredictRequest::decode(bytes).expect("decode");
    request.inputs.into_iter().map(|(name, proto)| decode(&name, proto, LIMIT).expect("tensor")).collect()
}

fn edge(c: &mut Criterion) {
    let (columns, _) = columns();
    let mut group = c.benchmark_group("examples");
    for rows in [1usize, 32, 256] {
        let (classify, typed, content) = requests(rows);
        // The same values either way.
        let parsed = parse_classify(&columns, classify.clone());
        let mut decoded = decode_predict(content.clone());
        decoded.sort_by_key(|t| t.shape().to_vec());
        assert_eq!(parsed.iter().map(Tensor::len).sum::<usize>(), decoded.iter().map(Tensor::len).sum::<usize>());
        group.throughput(Throughput::Elements(rows as u64));
        group.bench_with_input(BenchmarkId::new("classify", rows), &classify, |b, bytes| {
            b.iter(|| parse_classify(&columns, bytes.clone()))
        });
        group.bench_with_input(BenchmarkId::new("predict typed", rows), &typed, |b, bytes| {
            b.iter(|| decode_predict(bytes.clone()))
        });
        group.bench_with_input(BenchmarkId::new("predict content", rows), &content, |b, bytes| {
            b.iter(|| decode_predict(bytes.clone()))
        });
    }
    group.finish();
}

criterion_group!(benches, edge);
criterion_main!(benches);
