//! Generated code for the protos in `proto/`: TensorFlow's tensor types and
//! TF Serving's PredictionService and ModelService, and the Open Inference
//! Protocol's (KServe v2) GRPCInferenceService (messages, clients and
//! servers), at their package names and field numbers.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// `tensorflow.*`: tensors, shapes, dtypes, signatures.
pub mod tensorflow {
    include!(concat!(env!("OUT_DIR"), "/tensorflow.rs"));

    /// `tensorflow.serving.*`: the serving APIs.
    pub mod serving {
        include!(concat!(env!("OUT_DIR"), "/tensorflow.serving.rs"));
    }

    /// `tensorflow.error.*`: canonical error codes.
    pub mod error {
        include!(concat!(env!("OUT_DIR"), "/tensorflow.error.rs"));
    }
}

/// `inference.*`: the Open Inference Protocol (KServe v2).
pub mod inference {
    include!(concat!(env!("OUT_DIR"), "/inference.rs"));
}

/// The encoded file descriptor set of every proto, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sluice_descriptor.bin"));
