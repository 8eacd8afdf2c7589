//! Forwarding to a real TensorFlow upstream: `tests/tfserving/upstream.py`,
//! a gRPC server built on TensorFlow and the official
//! `tensorflow-serving-api` servicer classes, serving SavedModels with the
//! example MLP's weights (`scripts/setup` installs both into `.cache/`).
//! Answers equal TensorFlow's own for the same final tensors — plain, and
//! behind feature fetch and a WASM plugin — TensorFlow's refusals and its
//! version-label wording come through, the client's deadline is passed on,
//! and an upstream failing its health checks is ejected.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use sluice::proto::tensorflow::serving::prediction_service_client::PredictionServiceClient;
use sluice::proto::tensorflow::serving::PredictRequest;
use tonic::Code;

/// A TensorFlow upstream serving the MLP's SavedModels (versions 1 and 2).
fn tensorflow(extra: &[&str]) -> ServerProcess {
    let python = root().join(".cache/tf-venv/bin/python");
    let models = root().join(".cache/tf-savedmodels/mlp");
    assert!(
        python.exists() && models.exists(),
        "the TensorFlow upstream needs {} and {}: run scripts/setup",
        python.display(),
        models.display()
    );
    let mut command = Command::new(python);
    command
        .arg(root().join("tests/tfserving/upstream.py"))
        .args(["--port", "0", "--model_name", "mlp", "--model_base_path"])
        .arg(&models)
        .args(extra);
    // Importing TensorFlow takes seconds, more on a busy machine.
    ServerProcess::spawn(command, "tensorflow", "upstream: serving gRPC on ", Duration::from_secs(180), false)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn front(upstream: &ServerProcess, model_extra: &str, upstream_extra: &str, extra: &str) -> Server {
    Server::with_config(&format!(
        "[[models]]\nname = \"mlp\"\n{model_extra}\n[models.upstream]\nendpoints = [\"{}\"]\nhealth_check_ms = 100\n\
         eject_after_failures = 2\n{upstream_extra}\n{extra}",
        upstream.addr
    ))
}

fn request(model: &str, x: &[f32], rows: i64) -> PredictRequest {
    predict_request(model, vec![("x", f32_content(&[rows, 64], x))])
}

/// Runs `sluice serve` with `config`, which must fail to start; answers its
/// output (killed, failing the test, if it is still up after 60 s).
fn refused_start(config: &std::path::Path) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--host", "127.0.0.1", "--port", "0", "--rest_api_port", "0", "--model_config_file"])
        .arg(config)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run sluice");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().expect("output");
            panic!("sluice started with a config it should refuse: {}", String::from_utf8_lossy(&output.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// What TensorFlow answers for `x`, asked directly.
async fn tensorflow_answer(upstream: &ServerProcess, x: &[f32], rows: i64) -> Vec<f32> {
    let mut client = PredictionServiceClient::connect(upstream.url()).await.expect("connect to TensorFlow");
    let response = client.predict(request("mlp", x, rows)).await.expect("TensorFlow answers").into_inner();
    f32_values(&response.outputs["logits"])
}

#[tokio::test]
async fn forwarded_answers_are_tensorflows_own() {
    let upstream = tensorflow(&[]);
    let server = front(&upstream, "version_policy = \"all\"", "", "");
    let mut versions: Vec<(i64, i32)> = server.model_status("mlp").await.iter().map(|s| (s.version, s.state)).collect();
    versions.sort_unstable();
    assert_eq!(versions, vec![(1, 30), (2, 30)], "TensorFlow's versions, AVAILABLE here");

    let x = values(21, 64 * 3);
    let mut client = server.predict_client().await;
    let response = client.predict(request("mlp", &x, 3)).await.expect("forwarded").into_inner();
    assert_eq!(f32_values(&response.outputs["logits"]), tensorflow_answer(&upstream, &x, 3).await);
    assert_eq!(dims(&response.outputs["logits"]), vec![3, 10]);
    // And the same as ONNX Runtime on the ONNX file the weights came from.
    let (_, onnx) = reference(&example_model("mlp", 2), vec![("x", RefInput::F32(vec![3, 64], x.clone()))], "logits");
    assert_close(&f32_values(&response.outputs["logits"]), &onnx, 1e-5, "TensorFlow vs ONNX Runtime");

    // Version 1 by number is TensorFlow's version 1.
    let mut one = request("mlp", &x, 3);
    one.model_spec = spec("mlp", Some(1));
    let answer = client.predict(one).await.expect("version 1").into_inner();
    let (_, onnx) = reference(&example_model("mlp", 1), vec![("x", RefInput::F32(vec![3, 64], x))], "logits");
    assert_close(&f32_values(&answer.outputs["logits"]), &onnx, 1e-5, "version 1");
}

#[tokio::test]
async fn feature_fetch_and_a_wasm_plugin_in_front_of_tensorflow_send_it_the_same_tensors() {
    let upstream = tensorflow(&[]);
    // A table of 64-float vectors by id; the pipeline fetches an id's
    // vector, the scale plugin doubles it, TensorFlow scores it.
    let dir = tempfile::tempdir().expect("temp dir");
    let rows: Vec<(String, Vec<f32>)> = (0..3).map(|i| (format!("user{i}"), values(30 + i, 64))).collect();
    let mut csv = String::from("id,x\n");
    for (id, x) in &rows {
        let cells: Vec<String> = x.iter().map(f32::to_string).collect();
        csv.push_str(&format!("{id},{}\n", cells.join(" ")));
    }
    let table = dir.path().join("vectors.csv");
    std::fs::write(&table, csv).expect("write table");
    let server = front(
        &upstream,
        "",
        "",
        &format!(
            "[plugins]\ndir = \"{plugins}\"\n\
             [features.tables.vectors]\nfile = \"{table}\"\nkey = \"id\"\nfeatures.x = {{ dtype = \"float32\", shape = [64] }}\n\
             [[pipelines]]\nname = \"scored\"\nmodel = \"mlp\"\npreprocess = {{ plugin = \"scale\" }}\n\
             [pipelines.feature_fetch]\n[[pipelines.feature_fetch.lookups]]\nkeys = \"id\"\ntable = \"vectors\"\n\
             features = [{{ feature = \"x\", tensor = \"x\" }}]\n",
            plugins = root().join("target/plugins").display(),
            table = table.display(),
        ),
    );
    let ids: Vec<&str> = rows.iter().map(|(id, _)| id.as_str()).collect();
    let response = server
        .predict_client()
        .await
        .predict(predict_request("scored", vec![("id", string_tensor(&[3], &ids))]))
        .await
        .expect("scored")
        .into_inner();
    // The final tensors, made by hand: the table's rows, doubled.
    let finals: Vec<f32> = rows.iter().flat_map(|(_, x)| x.iter().map(|v| v * 2.0)).collect();
    assert_eq!(f32_values(&response.outputs["logits"]), tensorflow_answer(&upstream, &finals, 3).await);
}

#[tokio::test]
async fn tensorflows_refusals_and_deadlines_come_through() {
    // A pinned version TensorFlow does not have: the start fails with
    // TensorFlow's own words, naming the upstream.
    let upstream = tensorflow(&["--delay_ms", "400"]);
    let config = tempfile::NamedTempFile::new().expect("config");
    std::fs::write(
        config.path(),
        format!("[[models]]\nname = \"mlp\"\n[models.upstream]\nendpoints = [\"{}\"]\nversion = 7\n", upstream.addr),
    )
    .expect("write");
    let output = refused_start(config.path());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("Servable not found for request: Specific(mlp, 7)"), "{stderr}");
    assert!(stderr.contains(&format!("upstream {}", upstream.addr)), "{stderr}");

    // A label TensorFlow does not know: its INVALID_ARGUMENT wording.
    std::fs::write(
        config.path(),
        format!(
            "[[models]]\nname = \"mlp\"\n[models.upstream]\nendpoints = [\"{}\"]\nversion_label = \"beta\"\n",
            upstream.addr
        ),
    )
    .expect("write");
    let output = refused_start(config.path());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("Unrecognized servable version label: beta"), "{stderr}");

    // The client's deadline is passed on: TensorFlow takes 400 ms, the
    // client gives 100; the answer is DEADLINE_EXCEEDED, not a late one.
    let server = front(&upstream, "", "", "");
    let x = values(5, 64);
    // Sent without a client-side timer, so the answer is the server's.
    let message = prost::Message::encode_to_vec(&request("mlp", &x, 1));
    let (code, message) = raw_grpc_call(
        server.grpc,
        "/tensorflow.serving.PredictionService/Predict",
        &message,
        &[("grpc-timeout", "100m")],
    )
    .await;
    assert_eq!(code, Code::DeadlineExceeded as i32, "{message}");
    // Passed while waiting for TensorFlow, or (on a loaded machine) before
    // TensorFlow started on it, which it then says.
    assert!(message.contains("waiting for upstream") || message.contains("the request was not run"), "{message}");
    // Without one, the call waits for TensorFlow.
    server.predict_client().await.predict(request("mlp", &x, 1)).await.expect("a patient client is answered");
}

#[tokio::test]
async fn a_tensorflow_upstream_failing_its_health_checks_is_ejected() {
    let upstream = tensorflow(&["--fail_status_after", "3"]);
    let server = front(&upstream, "", "", "[lifecycle]\nfile_system_poll_wait_seconds = 0\n");
    server.predict_client().await.predict(request("mlp", &values(1, 64), 1)).await.expect("served before");
    let healthy = format!(r#"sluice_upstream_healthy{{model="mlp",upstream="{}"}}"#, upstream.addr);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while server.metric(&healthy).await != 0.0 {
        assert!(std::time::Instant::now() < deadline, "never ejected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let err = server.predict_client().await.predict(request("mlp", &values(1, 64), 1)).await.expect_err("ejected");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains("failing GetModelStatus"), "{}", err.message());
}

#[tokio::test]
async fn a_tensorflow_upstream_behind_mutual_tls_is_reached_with_this_servers_certificate() {
    let pki = common::pki::Pki::new();
    let upstream = tensorflow(&[
        "--ssl_cert",
        &pki.arg("server.pem"),
        "--ssl_key",
        &pki.arg("server.key"),
        "--client_ca",
        &pki.arg("ca.pem"),
    ]);
    let tls = format!(
        "[models.upstream.tls]\nca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
        pki.arg("ca.pem"),
        pki.arg("client.pem"),
        pki.arg("client.key")
    );
    let server = front(&upstream, "", "", &tls);
    let x = values(31, 64 * 2);
    let mut client = server.predict_client().await;
    let response = client.predict(request("mlp", &x, 2)).await.expect("forwarded over mutual TLS").into_inner();
    let (_, onnx) = reference(&example_model("mlp", 2), vec![("x", RefInput::F32(vec![2, 64], x))], "logits");
    assert_close(&f32_values(&response.outputs["logits"]), &onnx, 1e-5, "TensorFlow over TLS vs ONNX Runtime");

    // A client certificate without its key is refused at the config check.
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("half.toml");
    std::fs::write(
        &config,
        format!(
            "[[models]]\nname = \"mlp\"\n[models.upstream]\nendpoints = [\"{}\"]\n[models.upstream.tls]\nca_file = \"{}\"\ncert_file = \"{}\"\n",
            upstream.addr,
            pki.arg("ca.pem"),
            pki.arg("client.pem")
        ),
    )
    .expect("write");
    let output = refused_start(&config);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("upstream.tls: cert_file and key_file go together"), "{stderr}");
}

/// A front forwarding `mlp` to `upstreams`, with `upstream_extra` keys.
fn front_of(upstreams: &[&ServerProcess], upstream_extra: &str) -> Server {
    let list: Vec<String> = upstreams.iter().map(|u| format!("\"{}\"", u.addr)).collect();
    Server::with_config(&format!(
        "[[models]]\nname = \"mlp\"\n[models.upstream]\nendpoints = [{}]\nhealth_check_ms = 100\n\
         eject_after_failures = 2\n{upstream_extra}\n",
        list.join(", ")
    ))
}

/// Calls that each take TensorFlow 400 ms, `n` at once; the upstream(s)
/// killed 150 ms in. What the client got, by code.
async fn killed_under(
    server: &Server,
    n: usize,
    kill: impl FnOnce(),
) -> std::collections::BTreeMap<String, Vec<String>> {
    let x = values(9, 64);
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..n {
        let mut client = server.predict_client().await;
        let request = request("mlp", &x, 1);
        calls.spawn(async move { client.predict(request).await.map(|_| ()) });
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    kill();
    let mut outcomes = std::collections::BTreeMap::<String, Vec<String>>::new();
    while let Some(done) = calls.join_next().await {
        let (code, message) = match done.expect("a call panicked") {
            Ok(()) => ("Ok".to_string(), String::new()),
            Err(status) => (format!("{:?}", status.code()), status.message().to_string()),
        };
        outcomes.entry(code).or_default().push(message);
    }
    outcomes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_killed_mid_call_is_unavailable_and_a_second_one_takes_the_calls() {
    // One upstream, killed under 4 calls: each is UNAVAILABLE naming it,
    // never INTERNAL.
    let only = tensorflow(&["--delay_ms", "400"]);
    let address = only.addr.to_string();
    let server = front_of(&[&only], "");
    server.predict_client().await.predict(request("mlp", &values(1, 64), 1)).await.expect("served before");
    let outcomes = killed_under(&server, 4, move || drop(only)).await;
    assert_eq!(outcomes.keys().collect::<Vec<_>>(), vec!["Unavailable"], "{outcomes:?}");
    for message in &outcomes["Unavailable"] {
        assert!(message.contains(&format!("upstream {address}")), "{message}");
    }

    // Two upstreams, one killed under 8 calls: those it held are sent to
    // the other, and every call is answered.
    let (a, b) = (tensorflow(&["--delay_ms", "400"]), tensorflow(&["--delay_ms", "400"]));
    let server = front_of(&[&a, &b], "");
    server.predict_client().await.predict(request("mlp", &values(1, 64), 1)).await.expect("served before");
    let outcomes = killed_under(&server, 8, move || drop(a)).await;
    assert_eq!(outcomes.keys().collect::<Vec<_>>(), vec!["Ok"], "{outcomes:?}");
    drop(b);
}
