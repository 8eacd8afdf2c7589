//! Compiles the protos in proto/ into Rust (prost messages, tonic client and
//! server) with protox, so that no `protoc` binary is needed, and saves the
//! file descriptor set for gRPC server reflection.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "tensorflow_serving/apis/prediction_service.proto",
    "tensorflow_serving/apis/model_service.proto",
    "tensorflow_serving/apis/prediction_log.proto",
    "kserve/grpc_predict_v2.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let fds = protox::compile(PROTOS, ["proto"])?;
    std::fs::write(out_dir.join("sluice_descriptor.bin"), prost::Message::encode_to_vec(&fds))?;
    tonic_prost_build::configure()
        // Tensor bytes decode as `Bytes` slices of the request buffer:
        // no copy between the wire and the tensor.
        .bytes(".")
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
