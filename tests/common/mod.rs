//! What the integration tests share: starting the real `sluice` binary on a
//! free port, gRPC clients, tensor builders, and ONNX Runtime run directly
//! (not through sluice) as the reference for model outputs.

#![allow(dead_code)]

pub mod fixtures;
pub mod fleet;
pub mod object_stores;
pub mod otlp;
pub mod pki;
pub mod process;
pub mod redis;
pub mod two_answers;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub use self::fixtures::root;
pub use self::process::ServerProcess;
use bytes::Bytes;
use sluice::proto::tensorflow::serving::model_service_client::ModelServiceClient;
use sluice::proto::tensorflow::serving::prediction_service_client::PredictionServiceClient;
use sluice::proto::tensorflow::serving::{
    model_spec, GetModelStatusRequest, ModelSpec, ModelVersionStatus, PredictRequest,
};
use sluice::proto::tensorflow::{tensor_shape_proto, DataType, TensorProto, TensorShapeProto};
use tonic::transport::Channel;

/// `sluice ARGS…` run in the repository root: exit code, stdout, stderr.
pub fn run_sluice(args: &[&str]) -> (Option<i32>, String, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("run sluice");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `sluice serve` of the config file `config` on free ports, which must
/// refuse to start: exits 1. Its stderr, which says why.
pub fn serve_refused(config: &Path) -> String {
    let config = config.to_str().expect("a UTF-8 path");
    let (code, _, stderr) = run_sluice(&[
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--rest_api_port",
        "0",
        "--model_config_file",
        config,
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    stderr
}

/// `examples/models/NAME/VERSION/model.onnx`.
pub fn example_model(name: &str, version: i64) -> PathBuf {
    root().join("examples/models").join(name).join(version.to_string()).join("model.onnx")
}

/// A running `sluice serve`, killed when dropped.
pub struct Server {
    process: ServerProcess,
    /// The gRPC address it printed.
    pub grpc: SocketAddr,
    /// The HTTP address it printed.
    pub http: SocketAddr,
}

impl Server {
    /// Starts `sluice serve --host 127.0.0.1 --port 0 ARGS…` and waits for
    /// its ready line.
    pub fn start(args: &[&str]) -> Server {
        Server::start_within(args, Duration::from_secs(120))
    }

    /// [`Server::start`], waiting up to `timeout` for it to be ready (a
    /// config whose plugins compile for long on a cold cache).
    pub fn start_within(args: &[&str], timeout: Duration) -> Server {
        Server::start_with_env(args, &[], timeout)
    }

    /// [`Server::start_within`] with `env` set for the server (an object
    /// store's endpoint and credentials, say).
    pub fn start_with_env(args: &[&str], env: &[(String, String)], timeout: Duration) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
        command
            .arg("serve")
            .args(["--host", "127.0.0.1", "--port", "0", "--rest_api_port", "0"])
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir(root());
        let process = ServerProcess::spawn(command, "sluice", "sluice: serving gRPC on ", timeout, true)
            .unwrap_or_else(|e| panic!("{e}"));
        let http = process
            .stdout_after("sluice: serving HTTP on ")
            .and_then(|a| a.parse().ok())
            .expect("the HTTP address is printed before the gRPC one");
        Server { grpc: process.addr, http, process }
    }

    /// Serves the config `text` (written to a temporary file; relative
    /// paths in it are taken from the repository root).
    pub fn with_config(text: &str) -> Server {
        Server::with_config_within(text, Duration::from_secs(120))
    }

    /// [`Server::with_config`], waiting up to `timeout` for it to be ready.
    pub fn with_config_within(text: &str, timeout: Duration) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("sluice.toml");
        std::fs::write(&path, text.replace("$ROOT", &root().display().to_string())).expect("write config");
        let server = Server::start_within(&["--model_config_file", path.to_str().expect("utf-8 path")], timeout);
        drop(dir);
        server
    }

    /// Serves the config of `dir`.
    pub fn serving(dir: &fixtures::ConfigDir) -> Server {
        Server::start(&["--model_config_file", dir.config().to_str().expect("utf-8 path")])
    }

    /// Serves the three example models, every version.
    pub fn examples() -> Server {
        Server::start(&["--model_config_file", "tests/fixtures/examples.toml"])
    }

    /// `http://ADDR` of the gRPC port.
    pub fn grpc_url(&self) -> String {
        self.process.url()
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

    /// GetModelMetadata's `signature_def` of `model`, checked to be packed
    /// as TF Serving packs it.
    pub async fn signature_def_map(&self, model: &str) -> sluice::proto::tensorflow::serving::SignatureDefMap {
        let request = sluice::proto::tensorflow::serving::GetModelMetadataRequest {
            model_spec: spec(model, None),
            metadata_field: vec!["signature_def".into()],
        };
        let response = self.predict_client().await.get_model_metadata(request).await.expect("metadata").into_inner();
        let any = &response.metadata["signature_def"];
        assert_eq!(any.type_url, "type.googleapis.com/tensorflow.serving.SignatureDefMap");
        prost::Message::decode(any.value.as_slice()).expect("SignatureDefMap")
    }

    /// GetModelStatus of every version of `model`.
    pub async fn model_status(&self, model: &str) -> Vec<ModelVersionStatus> {
        self.model_client()
            .await
            .get_model_status(GetModelStatusRequest { model_spec: spec(model, None) })
            .await
            .expect("GetModelStatus")
            .into_inner()
            .model_version_status
    }

    /// Calls the admin API with `token` (none: no Authorization header);
    /// answers the status and the JSON body (null when it is not JSON).
    pub async fn admin(
        &self,
        method: http::Method,
        path: &str,
        token: Option<&str>,
        body: Vec<u8>,
    ) -> (http::StatusCode, serde_json::Value) {
        let mut client = sluice::cli::bench::client::RestClient::new(&self.http.to_string()).expect("client");
        let authorization = token.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = authorization.iter().map(|a| ("authorization", a.as_str())).collect();
        let response = client.call(method, path, &headers, Bytes::from(body)).await.expect("admin call");
        (response.status, serde_json::from_slice(&response.body).unwrap_or(serde_json::Value::Null))
    }

    /// The process id, for sending signals.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Waits until `series` reaches at least `at_least`, polling; fails
    /// with the last value seen if it has not within 30 seconds, instead
    /// of hanging the test.
    pub async fn wait_for_metric(&self, series: &str, at_least: f64) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let value = self.metric(series).await;
            if value >= at_least {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{series} stayed at {value} for 30 s; expected at least {at_least}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Waits until a line of the server's log contains `needle` and
    /// returns it; fails after 30 seconds with the lines seen.
    pub async fn wait_for_log(&self, needle: &str) -> String {
        eventually(&format!("a log line with {needle:?}"), || {
            let lines = self.log();
            lines.iter().find(|l| l.contains(needle)).cloned().ok_or(format!("{lines:?}"))
        })
        .await
    }

    /// The server's log lines since the last read, once one of them
    /// contains `needle` (stderr comes through a pipe, so a line the
    /// server wrote before answering may arrive after the answer); fails
    /// after 30 seconds with the lines seen.
    pub async fn log_through(&self, needle: &str) -> Vec<String> {
        let mut lines = Vec::new();
        eventually(&format!("a log line with {needle:?}"), || {
            lines.extend(self.log());
            if lines.iter().any(|l| l.contains(needle)) {
                Ok(std::mem::take(&mut lines))
            } else {
                Err(format!("{lines:?}"))
            }
        })
        .await
    }

    /// The server's resident memory, in bytes.
    pub fn rss_bytes(&self) -> u64 {
        self.process.rss_bytes().expect("the server's resident memory")
    }

    /// Waits for the process to exit and returns its status.
    pub fn wait(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        self.process.wait(timeout)
    }

    /// The Prometheus text of the metrics endpoint.
    pub async fn metrics(&self) -> String {
        http_get(self.http, "/metrics").await
    }

    /// The value of the metric line starting with `series` (name and
    /// labels exactly), or 0 when absent.
    pub async fn metric(&self, series: &str) -> f64 {
        metric_value(&self.metrics().await, series)
    }

    /// The rest of the first stdout line starting with `prefix`.
    pub fn stdout_after(&self, prefix: &str) -> Option<String> {
        self.process.stdout_after(prefix)
    }

    /// Log lines written since the last call.
    pub fn log(&self) -> Vec<String> {
        self.process.log()
    }
}

/// Calls a gRPC method over a bare HTTP/2 connection, with extra headers
/// (such as `grpc-timeout`), without any client-side deadline: the answer
/// is exactly what the server sent. Returns the grpc-status code and
/// message.
pub async fn raw_grpc_call(addr: SocketAddr, path: &str, message: &[u8], headers: &[(&str, &str)]) -> (i32, String) {
    use http_body_util::BodyExt;
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("h2 handshake");
    tokio::spawn(connection);
    let mut framed = Vec::with_capacity(message.len() + 5);
    framed.push(0u8);
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(message);
    let mut request = http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(http_body_util::Full::new(Bytes::from(framed))).expect("request");
    let response = sender.send_request(request).await.expect("send");
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.expect("body");
    let trailers = collected.trailers().cloned().unwrap_or_default();
    // A trailers-only answer carries the status in the headers.
    let status = trailers.get("grpc-status").or(parts.headers.get("grpc-status"));
    let message = trailers.get("grpc-message").or(parts.headers.get("grpc-message"));
    let code = status.and_then(|v| v.to_str().ok()?.parse().ok()).expect("grpc-status");
    let message = message.and_then(|v| v.to_str().ok()).map(percent_decode).unwrap_or_default();
    (code, message)
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&text[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A plain HTTP/1.1 GET on loopback, returning the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect http");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    let (head, body) = response.split_once("\r\n\r\n").expect("http response");
    assert!(head.starts_with("HTTP/1.1 200"), "GET {path}: {head}");
    body.to_string()
}

/// A plain HTTP/1.1 POST of a JSON `body` on loopback, returning the body
/// of the answer, whatever its status.
pub async fn http_post(addr: SocketAddr, path: &str, body: &str) -> String {
    http_post_with(addr, path, body, &[]).await
}

/// [`http_post`] with extra headers.
pub async fn http_post_with(addr: SocketAddr, path: &str, body: &str, headers: &[(&str, &str)]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect http");
    let extra: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n{extra}\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    let (_, body) = response.split_once("\r\n\r\n").expect("http response");
    body.to_string()
}

/// The value of the series `series` (e.g. `sluice_model_runs_total{model="cnn",version="1"}`)
/// in Prometheus text, or 0 when absent.
pub fn metric_value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series).and_then(|rest| rest.trim().split(' ').next()?.parse().ok()))
        .unwrap_or(0.0)
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
    in_content(DataType::DtFloat, dims, values)
}

/// An f32 tensor in float_val.
pub fn f32_typed(dims: &[i64], values: &[f32]) -> TensorProto {
    TensorProto { float_val: values.to_vec(), ..in_content::<f32>(DataType::DtFloat, dims, &[]) }
}

/// An i64 tensor in tensor_content.
pub fn i64_content(dims: &[i64], values: &[i64]) -> TensorProto {
    in_content(DataType::DtInt64, dims, values)
}

/// An i64 tensor in int64_val.
pub fn i64_typed(dims: &[i64], values: &[i64]) -> TensorProto {
    TensorProto { int64_val: values.to_vec(), ..in_content::<i64>(DataType::DtInt64, dims, &[]) }
}

/// A `dtype` tensor of shape `dims` with `values` in tensor_content.
fn in_content<T: bytemuck::Pod>(dtype: DataType, dims: &[i64], values: &[T]) -> TensorProto {
    TensorProto {
        dtype: dtype as i32,
        tensor_shape: shape(dims),
        tensor_content: Bytes::copy_from_slice(bytemuck::cast_slice(values)),
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

/// A Predict request with a deadline (the `grpc-timeout` header).
pub fn with_timeout<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
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

/// A `DT_STRING` tensor.
pub fn string_tensor(dims: &[i64], strings: &[&str]) -> TensorProto {
    TensorProto {
        dtype: DataType::DtString as i32,
        tensor_shape: shape(dims),
        string_val: strings.iter().map(|s| Bytes::copy_from_slice(s.as_bytes())).collect(),
        ..Default::default()
    }
}

/// FNV-1a, 64-bit: how the `feature_transform` plugin hashes ids.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// The example recommender's scores for raw features (rows × 13) and user
/// ids (rows × 4), computed here: the `feature_transform` plugin's
/// transform written out, then the model run directly in ONNX Runtime.
pub fn recommend_by_hand(raw: &[f32], users: &[String]) -> Vec<f32> {
    let rows = raw.len() / 13;
    let dense: Vec<f32> = raw
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            if i % 13 < 8 {
                ((x.max(0.0) + 1.0).ln() - 1.0) / 2.0
            } else {
                [0.0, 1.0, 10.0, 100.0].iter().filter(|&&b| x >= b).count() as f32 / 4.0
            }
        })
        .collect();
    let ids: Vec<i64> = users.iter().map(|u| (fnv1a(u.as_bytes()) % 1000) as i64).collect();
    let (_, score) = reference(
        &example_model("recommender", 1),
        vec![("dense", RefInput::F32(vec![rows as i64, 13], dense)), ("ids", RefInput::I64(vec![rows as i64, 4], ids))],
        "score",
    );
    score
}

/// Asserts two f32 slices agree within `tolerance`.
pub fn assert_close(got: &[f32], want: &[f32], tolerance: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tolerance, "{what}: element {i}: got {g}, want {w} (tolerance {tolerance})");
    }
}

/// Polls `check` until it gives a value; fails after 30 seconds with
/// `what` and what `check` last said, instead of hanging the test.
pub async fn eventually<T>(what: &str, mut check: impl FnMut() -> Result<T, String>) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match check() {
            Ok(value) => return value,
            Err(last) if std::time::Instant::now() >= deadline => panic!("waited 30 s for {what}; last: {last}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

/// Runs TF Serving's official Python client against `server` model `model`
/// (`tests/tfserving/examples_client.py`: Classify, Regress,
/// MultiInference and Predict over `tf.Example`s), its answers compared
/// with the census SavedModel `savedmodel` run in process by TensorFlow;
/// `cases` picks some of its cases (all when `None`). Asserts that the
/// `expected` number of cases passed.
pub fn assert_examples_client(server: &Server, model: &str, savedmodel: &Path, cases: Option<&str>, expected: usize) {
    let python = fixtures::root().join(".cache/tf-venv/bin/python");
    assert!(
        python.exists() && savedmodel.join("saved_model.pb").exists(),
        "the comparison needs {} and {}: run scripts/setup",
        python.display(),
        savedmodel.display()
    );
    let mut command = std::process::Command::new(python);
    command
        .arg(fixtures::root().join("tests/tfserving/examples_client.py"))
        .args(["--grpc", &server.grpc.to_string(), "--rest", &format!("http://{}", server.http)])
        .args(["--model", model, "--savedmodel"])
        .arg(savedmodel)
        .env("TF_CPP_MIN_LOG_LEVEL", "2");
    if let Some(cases) = cases {
        command.args(["--cases", cases]);
    }
    let output = command.output().expect("run examples_client.py");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains(&format!("examples_client: {expected} cases ok")),
        "examples_client.py failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
