//! What the integration tests share: starting the real `sluice` binary on a
//! free port, gRPC clients, tensor builders, and ONNX Runtime run directly
//! (not through sluice) as the reference for model outputs.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use sluice::proto::tensorflow::serving::model_service_client::ModelServiceClient;
use sluice::proto::tensorflow::serving::prediction_service_client::PredictionServiceClient;
use sluice::proto::tensorflow::serving::{model_spec, ModelSpec, PredictRequest};
use sluice::proto::tensorflow::{tensor_shape_proto, DataType, TensorProto, TensorShapeProto};
use tonic::transport::Channel;

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `examples/models/NAME/VERSION/model.onnx`.
pub fn example_model(name: &str, version: i64) -> PathBuf {
    root().join("examples/models").join(name).join(version.to_string()).join("model.onnx")
}

/// A running `sluice serve`, killed when dropped.
pub struct Server {
    child: Child,
    /// The gRPC address it printed.
    pub grpc: SocketAddr,
    stderr: mpsc::Receiver<String>,
}

impl Server {
    /// Starts `sluice serve --host 127.0.0.1 --port 0 ARGS…` and waits for
    /// its ready line.
    pub fn start(args: &[&str]) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
        command
            .arg("serve")
            .args(["--host", "127.0.0.1", "--port", "0"])
            .args(args)
            .current_dir(root())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        unsafe_kill_with_parent(&mut command);
        let mut child = command.spawn().expect("spawn sluice");
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        let (err_tx, err_rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[sluice] {line}");
                let _ = err_tx.send(line);
            }
        });
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("sluice: serving gRPC on ") {
                    let _ = ready_tx.send(addr.trim().to_string());
                }
            }
        });
        let addr = match ready_rx.recv_timeout(Duration::from_secs(120)) {
            Ok(addr) => addr,
            Err(_) => {
                let _ = child.kill();
                let status = child.wait().ok();
                let log: Vec<String> = err_rx.try_iter().collect();
                panic!("sluice did not become ready (exit: {status:?}); stderr:\n{}", log.join("\n"));
            }
        };
        Server { child, grpc: addr.parse().expect("address"), stderr: err_rx }
    }

    /// Serves the three example models, every version.
    pub fn examples() -> Server {
        Server::start(&["--model_config_file", "tests/fixtures/examples.toml"])
    }

    /// `http://ADDR` of the gRPC port.
    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// A new Predict client on its own connection.
    pub async fn predict_client(&self) -> PredictionServiceClient<Channel> {
        PredictionServiceClient::connect(self.grpc_url())
            .await
            .expect("connect")
            .max_decoding_message_size(256 << 20)
            .max_encoding_message_size(256 << 20)
    }

    /// A new ModelService client.
    pub async fn model_client(&self) -> ModelServiceClient<Channel> {
        ModelServiceClient::connect(self.grpc_url()).await.expect("connect")
    }

    /// The process id, for sending signals.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the process to exit and returns its status.
    pub fn wait(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let until = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < until {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Log lines written so far.
    pub fn log(&self) -> Vec<String> {
        self.stderr.try_iter().collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Makes the child die with the test process, even when a test aborts
/// without unwinding.
fn unsafe_kill_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe, as pre_exec requires.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

/// A shape proto.
pub fn shape(dims: &[i64]) -> Option<TensorShapeProto> {
    Some(TensorShapeProto {
        dim: dims.iter().map(|&size| tensor_shape_proto::Dim { size, name: String::new() }).collect(),
        unknown_rank: false,
    })
}

/// An f32 tensor in tensor_content.
pub fn f32_content(dims: &[i64], values: &[f32]) -> TensorProto {
    TensorProto {
        dtype: DataType::DtFloat as i32,
        tensor_shape: shape(dims),
        tensor_content: Bytes::copy_from_slice(bytemuck::cast_slice(values)),
        ..Default::default()
    }
}

/// An f32 tensor in float_val.
pub fn f32_typed(dims: &[i64], values: &[f32]) -> TensorProto {
    TensorProto {
        dtype: DataType::DtFloat as i32,
        tensor_shape: shape(dims),
        float_val: values.to_vec(),
        ..Default::default()
    }
}

/// An i64 tensor in tensor_content.
pub fn i64_content(dims: &[i64], values: &[i64]) -> TensorProto {
    TensorProto {
        dtype: DataType::DtInt64 as i32,
        tensor_shape: shape(dims),
        tensor_content: Bytes::copy_from_slice(bytemuck::cast_slice(values)),
        ..Default::default()
    }
}

/// An i64 tensor in int64_val.
pub fn i64_typed(dims: &[i64], values: &[i64]) -> TensorProto {
    TensorProto {
        dtype: DataType::DtInt64 as i32,
        tensor_shape: shape(dims),
        int64_val: values.to_vec(),
        ..Default::default()
    }
}

/// A model spec, optionally with a version.
pub fn spec(name: &str, version: Option<i64>) -> Option<ModelSpec> {
    Some(ModelSpec {
        name: name.to_string(),
        version_choice: version.map(model_spec::VersionChoice::Version),
        signature_name: String::new(),
    })
}

/// A Predict request.
pub fn predict_request(model: &str, inputs: Vec<(&str, TensorProto)>) -> PredictRequest {
    PredictRequest {
        model_spec: spec(model, None),
        inputs: inputs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        output_filter: vec![],
    }
}

/// The f32 values of an output, from tensor_content or float_val.
pub fn f32_values(tensor: &TensorProto) -> Vec<f32> {
    if tensor.tensor_content.is_empty() {
        tensor.float_val.clone()
    } else {
        bytemuck::pod_collect_to_vec(&tensor.tensor_content)
    }
}

/// The dimensions of an output.
pub fn dims(tensor: &TensorProto) -> Vec<i64> {
    tensor.tensor_shape.as_ref().map(|s| s.dim.iter().map(|d| d.size).collect()).unwrap_or_default()
}

/// Deterministic pseudo-random values in [-1, 1), different for each seed.
pub fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Deterministic ids in [0, limit).
pub fn ids(seed: u64, n: usize, limit: i64) -> Vec<i64> {
    values(seed, n).into_iter().map(|v| (((v + 1.0) / 2.0) * limit as f32) as i64 % limit).collect()
}

/// An input for the reference run.
pub enum RefInput {
    /// f32 values and shape.
    F32(Vec<i64>, Vec<f32>),
    /// i64 values and shape.
    I64(Vec<i64>, Vec<i64>),
}

/// Runs `model` directly in ONNX Runtime (not through sluice) and returns
/// the f32 output called `output` and its shape.
pub fn reference(model: &Path, inputs: Vec<(&str, RefInput)>, output: &str) -> (Vec<i64>, Vec<f32>) {
    let environment =
        sluice::infer::onnx::library::environment(None).expect("ONNX Runtime library (run scripts/setup)");
    let mut session =
        ort::session::Session::builder(environment).expect("builder").commit_from_file(model).expect("load model");
    let values: Vec<(String, ort::session::SessionInputValue<'static>)> = inputs
        .into_iter()
        .map(|(name, input)| {
            let value: ort::value::DynValue = match input {
                RefInput::F32(shape, v) => ort::value::Tensor::from_array((shape, v)).expect("tensor").into_dyn(),
                RefInput::I64(shape, v) => ort::value::Tensor::from_array((shape, v)).expect("tensor").into_dyn(),
            };
            (name.to_string(), value.into())
        })
        .collect();
    let outputs = session.run(values).expect("reference run");
    let (shape, data) = outputs[output].try_extract_tensor::<f32>().expect("f32 output");
    (shape.to_vec(), data.to_vec())
}

/// Asserts two f32 slices agree within `tolerance`.
pub fn assert_close(got: &[f32], want: &[f32], tolerance: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tolerance, "{what}: element {i}: got {g}, want {w} (tolerance {tolerance})");
    }
}
