//! Building `tf.Example`s in code: the REST API's JSON examples become
//! these before they are read as the wire's are, and tests make theirs.

use bytes::Bytes;

use crate::proto::tensorflow::{feature, Example, Feature};

/// A feature of floats, for building examples in code.
pub fn float_feature(values: Vec<f32>) -> Feature {
    Feature { kind: Some(feature::Kind::FloatList(crate::proto::tensorflow::FloatList { value: values })) }
}

/// A feature of integers, for building examples in code.
pub fn int64_feature(values: Vec<i64>) -> Feature {
    Feature { kind: Some(feature::Kind::Int64List(crate::proto::tensorflow::Int64List { value: values })) }
}

/// A feature of byte strings, for building examples in code.
pub fn bytes_feature(values: Vec<Bytes>) -> Feature {
    Feature { kind: Some(feature::Kind::BytesList(crate::proto::tensorflow::BytesList { value: values })) }
}

/// An example of `features`, for building examples in code.
pub fn example(features: impl IntoIterator<Item = (String, Feature)>) -> Example {
    Example { features: Some(crate::proto::tensorflow::Features { feature: features.into_iter().collect() }) }
}
