//! Properties of the tensor conversions and of batching, for any dtype
//! and shape (proptest): every wire form gives back exactly the tensor it
//! was made from — TensorProto (typed fields and `tensor_content`), TF
//! Serving's JSON, the KServe v2 raw form, ONNX Runtime values — and a
//! batch joined from any mix of requests splits back into each request's
//! own rows.

use bytes::Bytes;
use proptest::prelude::*;
use sluice::config::OutputEncoding;
use sluice::tensor::batch::{concat_rows, split_rows};
use sluice::tensor::json::{tensor_from_json, tensor_to_json};
use sluice::tensor::{proto, v2, DType, Tensor};

/// Every fixed-width dtype: the SDK's list of dtypes less strings.
fn fixed() -> Vec<DType> {
    DType::WIT_ORDER.iter().copied().filter(|d| d.size().is_some()).collect()
}

fn count(shape: &[i64]) -> usize {
    shape.iter().product::<i64>() as usize
}

/// A shape of rank 0 to 4, dimensions 0 to 4.
fn shape() -> impl Strategy<Value = Vec<i64>> {
    prop::collection::vec(0i64..5, 0..5)
}

/// Bytes for `n` values of `dtype`: any bits (NaNs included) unless
/// `finite`, booleans 0 or 1.
fn values(dtype: DType, n: usize, finite: bool) -> BoxedStrategy<Vec<u8>> {
    match dtype {
        DType::Bool => prop::collection::vec(0u8..2, n).boxed(),
        DType::F32 if finite => {
            prop::collection::vec(-1e30f32..1e30, n).prop_map(|v| bytemuck::cast_slice(&v).to_vec()).boxed()
        }
        DType::F64 if finite => {
            prop::collection::vec(-1e300f64..1e300, n).prop_map(|v| bytemuck::cast_slice(&v).to_vec()).boxed()
        }
        DType::F16 if finite => prop::collection::vec(-60000f32..60000.0, n)
            .prop_map(|v| v.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect())
            .boxed(),
        DType::BF16 if finite => prop::collection::vec(-1e30f32..1e30, n)
            .prop_map(|v| v.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect())
            .boxed(),
        dtype => prop::collection::vec(any::<u8>(), n * dtype.size().unwrap_or(1)).boxed(),
    }
}

/// Any fixed-width tensor.
fn fixed_tensor(finite: bool) -> impl Strategy<Value = Tensor> {
    (prop::sample::select(fixed()), shape()).prop_flat_map(move |(dtype, shape)| {
        let n = count(&shape);
        values(dtype, n, finite).prop_map(move |bytes| {
            Tensor::from_bytes(dtype, shape.clone(), Bytes::from(bytes)).expect("a valid tensor")
        })
    })
}

/// Any string tensor (UTF-8 without NUL when `text`: what ONNX Runtime's
/// string tensors hold).
fn string_tensor(text: bool) -> impl Strategy<Value = Tensor> {
    shape().prop_flat_map(move |shape| {
        let n = count(&shape);
        let element: BoxedStrategy<Vec<u8>> = if text {
            "[^\\x00]{0,8}".prop_map(String::into_bytes).boxed()
        } else {
            prop::collection::vec(any::<u8>(), 0..8).boxed()
        };
        prop::collection::vec(element, n).prop_map(move |strings| {
            Tensor::from_strings(shape.clone(), strings.into_iter().map(Bytes::from).collect()).expect("a valid tensor")
        })
    })
}

/// Bitwise equality (NaN payloads included).
fn same(a: &Tensor, b: &Tensor) -> bool {
    a.dtype() == b.dtype() && a.shape() == b.shape() && a.data() == b.data()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn tensor_proto_round_trips_in_both_encodings(tensor in prop_oneof![fixed_tensor(false), string_tensor(false)]) {
        for encoding in [OutputEncoding::TypedFields, OutputEncoding::TensorContent] {
            let back = proto::decode("t", proto::encode(&tensor, encoding), 1 << 30).expect("decodes");
            prop_assert!(same(&back, &tensor), "{encoding:?}: {tensor:?} came back as {back:?}");
        }
    }

    #[test]
    fn kserve_raw_contents_round_trip(tensor in prop_oneof![fixed_tensor(false), string_tensor(false)]) {
        let raw = v2::encode_raw(&tensor);
        let back = v2::decode_raw(tensor.dtype(), tensor.shape().to_vec(), raw, 1 << 30, "t").expect("decodes");
        prop_assert!(same(&back, &tensor));
    }

    #[test]
    fn kserve_json_data_round_trips(tensor in prop_oneof![fixed_tensor(true), string_tensor(true)]) {
        let data = tensor_to_json(&v2::flat(&tensor));
        let back = v2::decode_json(tensor.dtype(), tensor.shape().to_vec(), &data, 1 << 30, "t").expect("decodes");
        prop_assert!(same(&back, &tensor), "{tensor:?} → {data} → {back:?}");
    }

    #[test]
    fn tf_serving_json_round_trips_where_json_can_hold_the_shape(
        tensor in prop_oneof![fixed_tensor(true), string_tensor(false)]
            .prop_filter("JSON arrays cannot say how long an empty dimension's rows are", |t| !t.shape().contains(&0))
    ) {
        let json = tensor_to_json(&tensor);
        let back = tensor_from_json(&json, tensor.dtype(), "t").expect("decodes");
        prop_assert!(same(&back, &tensor), "{tensor:?} → {json} → {back:?}");
    }

    #[test]
    fn a_batch_of_any_requests_splits_back_into_each_requests_rows(
        (dtype, inner, rows) in (prop::sample::select(fixed()), prop::collection::vec(1i64..4, 0..3), prop::collection::vec(1usize..5, 1..6)),
        seed in any::<u64>(),
    ) {
        let parts: Vec<Tensor> = rows
            .iter()
            .enumerate()
            .map(|(i, &r)| {
                let shape: Vec<i64> = std::iter::once(r as i64).chain(inner.iter().copied()).collect();
                let n = count(&shape) * dtype.size().unwrap_or(1);
                let bytes: Vec<u8> = (0..n)
                    .map(|j| if dtype == DType::Bool { ((seed as usize + i + j) % 2) as u8 } else { (seed as usize).wrapping_add(i * 131 + j) as u8 })
                    .collect();
                Tensor::from_bytes(dtype, shape, Bytes::from(bytes)).expect("a part")
            })
            .collect();
        let joined = concat_rows(&parts).expect("joins");
        prop_assert_eq!(joined.shape()[0] as usize, rows.iter().sum::<usize>());
        let pieces = split_rows(&joined, &rows, "t").expect("splits");
        prop_assert_eq!(pieces.len(), parts.len());
        for (piece, part) in pieces.iter().zip(&parts) {
            prop_assert!(same(piece, part));
        }
    }
}

#[test]
fn onnx_runtime_values_round_trip_for_every_dtype() {
    // ONNX Runtime needs its library; one runner, many cases.
    sluice::infer::onnx::library::environment(None).expect("ONNX Runtime library (run scripts/setup)");
    let config = ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    runner
        .run(&prop_oneof![fixed_tensor(false), string_tensor(true)], |tensor| {
            let value = sluice::tensor::onnx::to_value(&tensor).expect("to a value");
            let back = sluice::tensor::onnx::from_value(&value).expect("from a value");
            prop_assert!(same(&back, &tensor), "{tensor:?} came back as {back:?}");
            Ok(())
        })
        .expect("every tensor round-trips through ONNX Runtime");
    // What ONNX Runtime cannot hold is refused as the client's input, never
    // truncated.
    let nul = Tensor::from_strings(vec![2], vec![Bytes::from("ok"), Bytes::from_static(b"a\0b")]).expect("tensor");
    let err = sluice::tensor::onnx::to_value(&nul).err().map(|e| e.message()).unwrap_or_default();
    assert!(err.contains("NUL byte"), "{err}");
}
