//! Decoding and encoding a `[32, 64]` f32 `TensorProto`, against a plain
//! copy of its 8 KiB as the yardstick.
//!
//! Decoding a request held in a `Bytes` buffer takes `tensor_content` as a
//! slice of that buffer (asserted below): no copy at all. Encoding a
//! response copies the bytes once, into the output buffer. Typed fields
//! (`float_val`) cost a conversion on each side.
//!
//! ```text
//! cargo bench --bench tensor_codec
//! ```

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use prost::Message;
use sluice::config::OutputEncoding;
use sluice::proto::tensorflow::serving::{ModelSpec, PredictRequest};
use sluice::tensor::proto::{decode, encode};
use sluice::tensor::Tensor;

fn request(tensor: &Tensor, encoding: OutputEncoding) -> Bytes {
    let request = PredictRequest {
        model_spec: Some(ModelSpec { name: "mlp".into(), ..Default::default() }),
        inputs: [("x".to_string(), encode(tensor, encoding))].into_iter().collect(),
        output_filter: vec![],
    };
    Bytes::from(request.encode_to_vec())
}

fn codec(c: &mut Criterion) {
    let values: Vec<f32> = (0..32 * 64).map(|i| i as f32 * 0.5).collect();
    let tensor = Tensor::from_values(vec![32, 64], &values);
    let content_request = request(&tensor, OutputEncoding::TensorContent);
    let typed_request = request(&tensor, OutputEncoding::TypedFields);

    // The decoded tensor must point into the request buffer.
    let decoded = PredictRequest::decode(content_request.clone()).expect("decode");
    let proto = decoded.inputs.into_values().next().expect("input");
    let t = decode("x", proto, usize::MAX).expect("tensor");
    let start = content_request.as_ptr() as usize;
    let at = t.bytes().expect("fixed").as_ptr() as usize;
    assert!(at >= start && at < start + content_request.len(), "tensor_content was copied on decode");

    let mut group = c.benchmark_group("tensor [32,64] f32");
    group.throughput(Throughput::Bytes(8192));
    group.bench_function("memcpy 8 KiB (yardstick)", |b| {
        let src = vec![1u8; 8192];
        b.iter(|| std::hint::black_box(src.clone()))
    });
    group.bench_function("decode request, tensor_content", |b| {
        b.iter(|| {
            let request = PredictRequest::decode(content_request.clone()).expect("decode");
            let proto = request.inputs.into_values().next().expect("input");
            std::hint::black_box(decode("x", proto, usize::MAX).expect("tensor"))
        })
    });
    group.bench_function("decode request, float_val", |b| {
        b.iter(|| {
            let request = PredictRequest::decode(typed_request.clone()).expect("decode");
            let proto = request.inputs.into_values().next().expect("input");
            std::hint::black_box(decode("x", proto, usize::MAX).expect("tensor"))
        })
    });
    group.bench_function("encode output, tensor_content", |b| {
        b.iter(|| std::hint::black_box(encode(&tensor, OutputEncoding::TensorContent).encode_to_vec()))
    });
    group.bench_function("encode output, float_val", |b| {
        b.iter(|| std::hint::black_box(encode(&tensor, OutputEncoding::TypedFields).encode_to_vec()))
    });
    group.finish();
}

criterion_group!(benches, codec);
criterion_main!(benches);
