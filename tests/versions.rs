//! Model versions coming and going while the real server serves: a new
//! version found by repository polling is loaded, warmed up and served, and
//! the old one drained, with clients calling all along and none failing; a
//! broken version fails with its reason while the serving one stays;
//! TF Serving warmup files; config reloads over gRPC
//! (HandleReloadConfigRequest), the admin API and the config file poll.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::fixtures::*;
use common::*;
use http::{Method, StatusCode};
use prost::Message;
use sluice::cli::bench::client::RestClient;
use sluice::proto::tensorflow::serving::file_system_storage_path_source_config::servable_version_policy::{
    PolicyChoice, Specific,
};
use sluice::proto::tensorflow::serving::file_system_storage_path_source_config::ServableVersionPolicy;
use sluice::proto::tensorflow::serving::{
    model_server_config, prediction_log, GetModelStatusRequest, LogCollectorConfig, LoggingConfig, ModelConfig,
    ModelConfigList, ModelServerConfig, PredictLog, PredictionLog, ReloadConfigRequest, SamplingConfig,
};
use tonic::Code;

/// A model repository in a temporary directory.
struct Repository {
    dir: tempfile::TempDir,
}

impl Repository {
    fn new() -> Repository {
        Repository { dir: tempfile::tempdir().expect("temp dir") }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Puts `file` in as `version`, whole: written beside the repository's
    /// versions and renamed into place, as a deploy tool would.
    fn add(&self, version: i64, model: &[u8]) -> PathBuf {
        let staging = self.path().join(format!(".staging-{version}"));
        std::fs::create_dir_all(&staging).expect("staging dir");
        std::fs::write(staging.join("model.onnx"), model).expect("write model");
        let dir = self.path().join(version.to_string());
        std::fs::rename(&staging, &dir).expect("rename into place");
        dir
    }

    /// Puts example model `name` `example` in as `version`, with a warmup
    /// file when `warmup` is given.
    fn add_example(&self, version: i64, name: &str, example: i64, warmup: Option<&[u8]>) -> PathBuf {
        let staging = self.path().join(format!(".staging-{version}"));
        std::fs::create_dir_all(staging.join("assets.extra")).expect("staging dir");
        std::fs::copy(example_model(name, example), staging.join("model.onnx")).expect("copy model");
        if let Some(warmup) = warmup {
            std::fs::write(staging.join("assets.extra/tf_serving_warmup_requests"), warmup).expect("warmup file");
        }
        let dir = self.path().join(version.to_string());
        std::fs::rename(&staging, &dir).expect("rename into place");
        dir
    }
}

fn serve_polled(repository: &Repository) -> Server {
    let base = repository.path().to_str().expect("utf-8 path");
    Server::start(&["--model_name", "mlp", "--model_base_path", base, "--file_system_poll_wait_seconds", "1"])
}

/// (version, state, error message) of each version GetModelStatus reports.
async fn statuses(server: &Server, model: &str) -> Vec<(i64, String, String)> {
    server
        .model_status(model)
        .await
        .into_iter()
        .map(|s| {
            let state = match s.state {
                10 => "START",
                20 => "LOADING",
                30 => "AVAILABLE",
                40 => "UNLOADING",
                50 => "END",
                _ => "UNKNOWN",
            };
            (s.version, state.to_string(), s.status.map(|s| s.error_message).unwrap_or_default())
        })
        .collect()
}

/// Waits until GetModelStatus reports `want` (version, state) for each.
async fn wait_for_states(server: &Server, model: &str, want: &[(i64, &str)]) -> Vec<(i64, String, String)> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let got = statuses(server, model).await;
        let matches = want.iter().all(|(v, state)| got.iter().any(|(gv, gs, _)| gv == v && gs == state));
        if matches {
            return got;
        }
        assert!(std::time::Instant::now() < deadline, "waited 60 s for {want:?}; status is {got:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn mlp_request(seed: u64) -> sluice::proto::tensorflow::serving::PredictRequest {
    predict_request("mlp", vec![("x", f32_content(&[1, 64], &values(seed, 64)))])
}

/// The model file of each test version: three MLPs with different weights.
fn mlp_file(version: i64) -> PathBuf {
    match version {
        3 => root().join("tests/fixtures/models/mlp/3/model.onnx"),
        v => example_model("mlp", v),
    }
}

fn version_of(response: &sluice::proto::tensorflow::serving::PredictResponse) -> i64 {
    use sluice::proto::tensorflow::serving::model_spec::VersionChoice;
    match response.model_spec.as_ref().and_then(|s| s.version_choice.clone()) {
        Some(VersionChoice::Version(v)) => v,
        _ => -1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn versions_come_and_go_under_load_with_no_failed_request_and_every_answer_from_an_available_version() {
    let repository = Repository::new();
    std::fs::create_dir_all(repository.path().join("1")).expect("version 1");
    std::fs::copy(mlp_file(1), repository.path().join("1/model.onnx")).expect("copy version 1");
    let config = tempfile::NamedTempFile::new().expect("config file");
    std::fs::write(
        config.path(),
        format!(
            "[[models]]\nname = \"mlp\"\nbase_path = \"{}\"\nversion_policy = \"all\"\n",
            repository.path().display()
        ),
    )
    .expect("write config");
    let server = Server::start(&[
        "--model_config_file",
        config.path().to_str().expect("utf-8"),
        "--file_system_poll_wait_seconds",
        "1",
    ]);

    // Each client sends one input over and over; what every version must
    // answer to it is known beforehand, from ONNX Runtime run directly.
    const CLIENTS: u64 = 4;
    let inputs: Vec<Vec<f32>> = (0..CLIENTS).map(|c| values(100 + c, 64)).collect();
    let mut want = std::collections::BTreeMap::new();
    for version in 1..=3 {
        for (c, x) in inputs.iter().enumerate() {
            let (_, logits) =
                reference(&mlp_file(version), vec![("x", RefInput::F32(vec![1, 64], x.clone()))], "logits");
            want.insert((version, c), logits);
        }
    }
    let want = Arc::new(want);

    // The states each version is seen in, in order, by a status poller.
    let stop = Arc::new(AtomicBool::new(false));
    let walked: Arc<Mutex<std::collections::BTreeMap<i64, Vec<String>>>> = Arc::default();
    let poller = {
        let (stop, walked, mut models) = (stop.clone(), walked.clone(), server.model_client().await);
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let request = GetModelStatusRequest { model_spec: spec("mlp", None) };
                if let Ok(response) = models.get_model_status(request).await {
                    let mut walked = walked.lock().expect("lock");
                    for status in response.into_inner().model_version_status {
                        let states = walked.entry(status.version).or_default();
                        let state = format!("{}", status.state);
                        if states.last() != Some(&state) {
                            states.push(state);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    // (client, version, right answer) of every call; errors by message.
    type Seen = Vec<Result<(usize, i64, bool), String>>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let mut clients = Vec::new();
    for (c, x) in inputs.iter().cloned().enumerate() {
        let (stop, seen, want) = (stop.clone(), seen.clone(), want.clone());
        let mut client = server.predict_client().await;
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let request = predict_request("mlp", vec![("x", f32_content(&[1, 64], &x))]);
                let outcome = match client.predict(request).await {
                    Ok(response) => {
                        let response = response.into_inner();
                        let version = version_of(&response);
                        let got = f32_values(&response.outputs["logits"]);
                        let right = want.get(&(version, c)).is_some_and(|w| {
                            w.len() == got.len() && w.iter().zip(&got).all(|(a, b)| (a - b).abs() <= 1e-5)
                        });
                        Ok((c, version, right))
                    }
                    Err(status) => Err(format!("{:?}: {}", status.code(), status.message())),
                };
                seen.lock().expect("lock").push(outcome);
            }
        }));
    }
    let answered_by = |version: i64, from: usize| {
        let seen = seen.lock().expect("lock");
        seen[from.min(seen.len())..].iter().filter(|o| matches!(o, Ok((_, v, _)) if *v == version)).count()
    };
    let at_least = |version: i64, from: usize| {
        let n = answered_by(version, from);
        if n >= 50 {
            Ok(())
        } else {
            Err(format!("{n} answers from version {version}"))
        }
    };
    eventually("answers from version 1", || at_least(1, 0)).await;

    // Versions 2 and 3 appear; the latest serves.
    repository.add(2, &std::fs::read(mlp_file(2)).expect("read version 2"));
    wait_for_states(&server, "mlp", &[(1, "AVAILABLE"), (2, "AVAILABLE")]).await;
    repository.add(3, &std::fs::read(mlp_file(3)).expect("read version 3"));
    wait_for_states(&server, "mlp", &[(1, "AVAILABLE"), (2, "AVAILABLE"), (3, "AVAILABLE")]).await;
    let mark = seen.lock().expect("lock").len();
    eventually("answers from version 3", || at_least(3, mark)).await;

    // Version 1 leaves the repository: drained and unloaded.
    std::fs::remove_dir_all(repository.path().join("1")).expect("remove version 1");
    wait_for_states(&server, "mlp", &[(1, "END"), (2, "AVAILABLE"), (3, "AVAILABLE")]).await;
    let mark = seen.lock().expect("lock").len();
    eventually("answers after version 1 left", || at_least(3, mark)).await;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.expect("client task");
    }
    poller.await.expect("poller");

    let seen = std::mem::take(&mut *seen.lock().expect("lock"));
    let failed: Vec<&String> = seen.iter().filter_map(|o| o.as_ref().err()).collect();
    let from = |v: i64| seen.iter().filter(|o| matches!(o, Ok((_, version, _)) if *version == v)).count();
    eprintln!(
        "{} answers: {} from version 1, {} from version 2, {} from version 3",
        seen.len(),
        from(1),
        from(2),
        from(3)
    );
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {:?}",
        failed.len(),
        seen.len(),
        &failed[..failed.len().min(5)]
    );
    let wrong: Vec<_> = seen.iter().flatten().filter(|(_, _, right)| !right).collect();
    assert!(
        wrong.is_empty(),
        "{} answers did not match their version's model: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
    // Each client's answers move forward only: a version answers only
    // while it is the latest AVAILABLE one.
    for c in 0..CLIENTS as usize {
        let versions: Vec<i64> =
            seen.iter().flatten().filter(|(client, ..)| *client == c).map(|(_, v, _)| *v).collect();
        assert!(versions.windows(2).all(|w| w[0] <= w[1]), "client {c} went back to an older version");
    }
    // Status walked forward through the states: START 10, LOADING 20,
    // AVAILABLE 30, UNLOADING 40, END 50.
    let walked = walked.lock().expect("lock").clone();
    eprintln!("states seen: {walked:?}");
    for (version, states) in &walked {
        let numbers: Vec<i32> = states.iter().map(|s| s.parse().expect("state number")).collect();
        assert!(numbers.windows(2).all(|w| w[0] < w[1]), "version {version} went back: {states:?}");
    }
    assert_eq!(walked[&1].last().map(String::as_str), Some("50"), "{walked:?}");
    assert_eq!(walked[&3].last().map(String::as_str), Some("30"), "{walked:?}");
    assert_eq!(server.metric(r#"sluice_model_versions{model="mlp",state="AVAILABLE"}"#).await, 2.0);
    assert_eq!(server.metric(r#"sluice_model_versions{model="mlp",state="END"}"#).await, 1.0);
    let warmed = server.wait_for_log("warmed up").await;
    assert!(warmed.contains("zeros at batch sizes [1]"), "{warmed}");
}

#[tokio::test]
async fn a_broken_version_fails_with_its_reason_and_the_serving_one_stays() {
    let repository = Repository::new();
    repository.add_example(1, "mlp", 1, None);
    let server = serve_polled(&repository);
    wait_for_states(&server, "mlp", &[(1, "AVAILABLE")]).await;

    let whole = std::fs::read(mlp_file(2)).expect("read model");
    repository.add(3, &whole[..whole.len() / 2]);
    let status = wait_for_states(&server, "mlp", &[(1, "AVAILABLE"), (3, "END")]).await;
    let (_, _, error) = status.iter().find(|(v, ..)| *v == 3).expect("version 3");
    assert!(error.contains("version 3") && error.contains("model.onnx"), "{error}");
    let response = server.predict_client().await.predict(mlp_request(1)).await.expect("version 1 still serves");
    assert_eq!(response.into_inner().outputs["logits"].tensor_shape, shape(&[1, 10]));

    // The REST status says the same, in TF Serving's JSON.
    let text = http_get(server.http, "/v1/models/mlp").await;
    let json: serde_json::Value = serde_json::from_str(&text).expect("status JSON");
    let versions = json["model_version_status"].as_array().expect("versions");
    let three = versions.iter().find(|v| v["version"] == "3").expect("version 3");
    assert_eq!(three["state"], "END", "{text}");
    assert_ne!(three["status"]["error_code"], "OK", "{text}");
    assert!(three["status"]["error_message"].as_str().is_some_and(|m| m.contains("model.onnx")), "{text}");

    // Asking for it names why it is not there.
    let err = server
        .predict_client()
        .await
        .predict(predict_request_at("mlp", 3))
        .await
        .expect_err("version 3 does not serve");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(err.message().contains("load failed"), "{}", err.message());

    // Fixed on disk (a new file), it is tried again and takes over.
    std::fs::copy(example_model("mlp", 2), repository.path().join("3/model.onnx")).expect("fix version 3");
    wait_for_states(&server, "mlp", &[(1, "END"), (3, "AVAILABLE")]).await;
    let response = server.predict_client().await.predict(predict_request_at("mlp", 3)).await.expect("version 3");
    assert_eq!(response.into_inner().outputs["logits"].tensor_shape, shape(&[1, 10]));
}

fn predict_request_at(model: &str, version: i64) -> sluice::proto::tensorflow::serving::PredictRequest {
    let mut request = mlp_request(5);
    request.model_spec = spec(model, Some(version));
    request
}

/// A TF Serving warmup file: one Predict record per batch size.
fn warmup_file(input: &str, batches: &[i64]) -> Vec<u8> {
    let records: Vec<Vec<u8>> = batches
        .iter()
        .map(|&rows| {
            let request =
                predict_request("mlp", vec![(input, f32_typed(&[rows, 64], &values(rows as u64, 64 * rows as usize)))]);
            let log = PredictionLog {
                log_metadata: None,
                log_type: Some(prediction_log::LogType::PredictLog(PredictLog {
                    request: Some(request),
                    response: None,
                })),
            };
            log.encode_to_vec()
        })
        .collect();
    tfrecord_by_hand(&records)
}

/// TFRecord framing as TensorFlow writes it, spelled out here rather than
/// taken from sluice: length (u64 LE), its masked CRC-32C, the data, the
/// data's masked CRC-32C.
fn tfrecord_by_hand(records: &[Vec<u8>]) -> Vec<u8> {
    let masked = |data: &[u8]| {
        let crc = crc32c::crc32c(data);
        crc.rotate_right(15).wrapping_add(0xa282_ead8).to_le_bytes()
    };
    let mut out = Vec::new();
    for data in records {
        let length = (data.len() as u64).to_le_bytes();
        out.extend_from_slice(&length);
        out.extend_from_slice(&masked(&length));
        out.extend_from_slice(data);
        out.extend_from_slice(&masked(data));
    }
    out
}

#[tokio::test]
async fn tf_serving_warmup_files_run_before_a_version_serves_and_a_bad_one_fails_it() {
    let repository = Repository::new();
    let dir = repository.add_example(1, "mlp", 1, Some(&warmup_file("x", &[1, 2, 5])));
    let server = serve_polled(&repository);
    let warmed = server.wait_for_log("warmed up").await;
    assert!(warmed.contains("requests=3"), "{warmed}");
    assert!(warmed.contains(&dir.join("assets.extra/tf_serving_warmup_requests").display().to_string()), "{warmed}");

    // A warmup request the model cannot take fails the version; the
    // serving one stays.
    repository.add_example(2, "mlp", 2, Some(&warmup_file("nope", &[1])));
    let status = wait_for_states(&server, "mlp", &[(1, "AVAILABLE"), (2, "END")]).await;
    let (_, _, error) = status.iter().find(|(v, ..)| *v == 2).expect("version 2");
    assert!(error.contains("warmup") && error.contains("record 0") && error.contains("'nope'"), "{error}");

    // A file that is not a TFRecord file is named as such.
    let mut damaged = warmup_file("x", &[1]);
    damaged[10] ^= 0xff;
    repository.add_example(4, "mlp", 2, Some(&damaged));
    let status = wait_for_states(&server, "mlp", &[(1, "AVAILABLE"), (4, "END")]).await;
    let (_, _, error) = status.iter().find(|(v, ..)| *v == 4).expect("version 4");
    assert!(error.contains("checksum") && error.contains("TFRecord"), "{error}");
    server.predict_client().await.predict(mlp_request(2)).await.expect("version 1 still serves");
}

fn reload_request(models: Vec<ModelConfig>) -> ReloadConfigRequest {
    ReloadConfigRequest {
        config: Some(ModelServerConfig {
            config: Some(model_server_config::Config::ModelConfigList(ModelConfigList { config: models })),
        }),
    }
}

fn model_config(name: &str, base: &Path, versions: &[i64], labels: &[(&str, i64)]) -> ModelConfig {
    ModelConfig {
        name: name.to_string(),
        base_path: base.display().to_string(),
        model_platform: "tensorflow".to_string(),
        model_version_policy: Some(ServableVersionPolicy {
            policy_choice: Some(PolicyChoice::Specific(Specific { versions: versions.to_vec() })),
        }),
        version_labels: labels.iter().map(|(l, v)| (l.to_string(), *v)).collect(),
        ..ModelConfig::default()
    }
}

#[tokio::test]
async fn grpc_config_reloads_add_and_remove_models_and_change_policies_and_labels() {
    let config = tempfile::NamedTempFile::new().expect("temp file");
    let mlp = root().join("examples/models/mlp");
    let cnn = root().join("examples/models/cnn");
    std::fs::write(
        config.path(),
        format!(
            "model_config_list {{\n  config {{\n    name: \"mlp\"\n    base_path: \"{}\"\n    model_platform: \"tensorflow\"\n    \
             model_version_policy {{ all {{}} }}\n    version_labels {{ key: \"stable\" value: 1 }}\n  }}\n}}\n",
            mlp.display()
        ),
    )
    .expect("write config");
    let server = Server::start(&["--model_config_file", config.path().to_str().expect("utf-8")]);
    let mut models = server.model_client().await;
    wait_for_states(&server, "mlp", &[(1, "AVAILABLE"), (2, "AVAILABLE")]).await;

    // A label on a version that is not AVAILABLE is refused; nothing changes.
    let err = models
        .handle_reload_config_request(reload_request(vec![model_config("mlp", &mlp, &[1, 2], &[("canary", 7)])]))
        .await
        .expect_err("label on version 7");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("canary") && err.message().contains("version 7"), "{}", err.message());
    assert!(err.message().contains("not AVAILABLE"), "{}", err.message());

    // A request log without a place, or at a rate past 1, is named.
    let mut logging = model_config("mlp", &mlp, &[1, 2], &[]);
    logging.logging_config = Some(LoggingConfig {
        log_collector_config: Some(LogCollectorConfig { r#type: String::new(), filename_prefix: String::new() }),
        sampling_config: Some(SamplingConfig { sampling_rate: 0.5 }),
    });
    let err = models.handle_reload_config_request(reload_request(vec![logging.clone()])).await.expect_err("logging");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("logging_config.log_collector_config.filename_prefix is missing"),
        "{}",
        err.message()
    );
    let logs = tempfile::tempdir().expect("log dir");
    logging.logging_config = Some(LoggingConfig {
        log_collector_config: Some(LogCollectorConfig {
            r#type: String::new(),
            filename_prefix: logs.path().join("mlp").display().to_string(),
        }),
        sampling_config: Some(SamplingConfig { sampling_rate: 3.0 }),
    });
    let err = models.handle_reload_config_request(reload_request(vec![logging])).await.expect_err("logging");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("logging.sampling_rate = 3: must be between 0 and 1"), "{}", err.message());
    let err = models.handle_reload_config_request(ReloadConfigRequest { config: None }).await.expect_err("empty");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");

    // Add cnn; narrow mlp to version 1, labelled.
    let response = models
        .handle_reload_config_request(reload_request(vec![
            model_config("mlp", &mlp, &[1], &[("stable", 1)]),
            model_config("cnn", &cnn, &[1], &[]),
        ]))
        .await
        .expect("reload")
        .into_inner();
    assert_eq!(response.status.map(|s| s.error_code), Some(0));
    wait_for_states(&server, "mlp", &[(1, "AVAILABLE"), (2, "END")]).await;
    wait_for_states(&server, "cnn", &[(1, "AVAILABLE")]).await;
    let mut stable = mlp_request(3);
    stable.model_spec = Some(sluice::proto::tensorflow::serving::ModelSpec {
        name: "mlp".into(),
        version_choice: Some(sluice::proto::tensorflow::serving::model_spec::VersionChoice::VersionLabel(
            "stable".into(),
        )),
        ..Default::default()
    });
    server.predict_client().await.predict(stable.clone()).await.expect("mlp at label stable");
    let image = predict_request("cnn", vec![("image", f32_content(&[1, 3, 32, 32], &values(4, 3 * 32 * 32)))]);
    server.predict_client().await.predict(image.clone()).await.expect("cnn, added by the reload");

    // While traffic flows to mlp, one reload removes cnn and adds the same
    // network as "classifier": mlp does not notice.
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = {
        let (stop, mut client, request) = (stop.clone(), server.predict_client().await, stable.clone());
        tokio::spawn(async move {
            let (mut ok, mut failed) = (0, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                match client.predict(request.clone()).await {
                    Ok(_) => ok += 1,
                    Err(status) => failed.push(format!("{:?}: {}", status.code(), status.message())),
                }
            }
            (ok, failed)
        })
    };
    models
        .handle_reload_config_request(reload_request(vec![
            model_config("mlp", &mlp, &[1], &[("stable", 1)]),
            model_config("classifier", &cnn, &[1], &[]),
        ]))
        .await
        .expect("reload: cnn out, classifier in");
    let mut classify = image.clone();
    classify.model_spec = spec("classifier", None);
    server.predict_client().await.predict(classify).await.expect("classifier, added by the reload");
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let (ok, failed) = traffic.await.expect("traffic");
    assert!(ok > 0 && failed.is_empty(), "{ok} mlp requests answered, {} failed: {failed:?}", failed.len());
    let err = server.predict_client().await.predict(image).await.expect_err("cnn removed");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let err = models
        .get_model_status(GetModelStatusRequest { model_spec: spec("cnn", None) })
        .await
        .expect_err("cnn removed");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
}

const OPS: &str = "ops-secret";
const TEAM: &str = "team-secret";

#[tokio::test]
async fn the_admin_api_and_the_config_file_poll_reload_models() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mlp = root().join("examples/models/mlp");
    let cnn = root().join("examples/models/cnn");
    let config = dir.path().join("sluice.toml");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugins dir");
    let toml = |models: &str| {
        format!(
            "[plugins]\ndir = \"{}\"\n[admin]\nenabled = true\n\
             [[admin.tokens]]\nid = \"ops\"\nrole = \"admin\"\nsha256 = \"{}\"\n\
             [[admin.tokens]]\nid = \"ml-ci\"\nteam = \"ml\"\nrole = \"team\"\nsha256 = \"{}\"\n{models}",
            plugins.display(),
            sha256_hex(OPS.as_bytes()),
            sha256_hex(TEAM.as_bytes())
        )
    };
    let mlp_only = format!("[[models]]\nname = \"mlp\"\nbase_path = \"{}\"\n", mlp.display());
    std::fs::write(&config, toml(&mlp_only)).expect("write config");
    let server = Server::start(&[
        "--model_config_file",
        config.to_str().expect("utf-8"),
        "--model_config_file_poll_wait_seconds",
        "1",
    ]);

    let body = format!(
        "model_config_list {{ config {{ name: \"mlp\" base_path: \"{}\" }} config {{ name: \"cnn\" base_path: \"{}\" }} }}",
        mlp.display(),
        cnn.display()
    );
    let mut client = RestClient::new(&server.http.to_string()).expect("client");
    let call = |token: Option<&str>| {
        let authorization = token.map(|t| format!("Bearer {t}"));
        (authorization, body.clone())
    };
    for (token, status) in [(None, StatusCode::UNAUTHORIZED), (Some(TEAM), StatusCode::FORBIDDEN)] {
        let (authorization, body) = call(token);
        let headers: Vec<(&str, &str)> = authorization.iter().map(|a| ("authorization", a.as_str())).collect();
        let response =
            client.call(Method::POST, "/admin/v1/models/config", &headers, Bytes::from(body)).await.expect("call");
        assert_eq!(response.status, status, "{}", response.text());
    }
    // With the admin API on, the gRPC reload takes an admin token too.
    let err = server
        .model_client()
        .await
        .handle_reload_config_request(reload_request(vec![model_config("mlp", &mlp, &[1], &[])]))
        .await
        .expect_err("no token");
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");

    let (authorization, body) = call(Some(OPS));
    let headers = [("authorization", authorization.as_deref().expect("token"))];
    let response =
        client.call(Method::POST, "/admin/v1/models/config", &headers, Bytes::from(body)).await.expect("call");
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    let outcome: serde_json::Value = serde_json::from_str(&response.text()).expect("JSON");
    assert_eq!(outcome["added"], serde_json::json!(["cnn"]), "{outcome}");
    wait_for_states(&server, "cnn", &[(1, "AVAILABLE")]).await;

    // A broken body is refused with the reason, and nothing changes.
    let response = client
        .call(
            Method::POST,
            "/admin/v1/models/config",
            &headers,
            Bytes::from_static(b"model_config_list { config { name: \"x\" } }"),
        )
        .await
        .expect("call");
    assert_eq!(response.status, StatusCode::BAD_REQUEST, "{}", response.text());
    assert!(response.text().contains("base_path is missing"), "{}", response.text());

    // The config file poll: the file still lists mlp only, but it has not
    // changed since start, so cnn stays; once it changes, it is applied.
    // A poll of the unchanged file is counted: wait for one after the
    // reload, then cnn must still be there.
    let unchanged = r#"sluice_model_config_file_polls_total{outcome="unchanged"}"#;
    let polls_before = server.metric(unchanged).await;
    server.wait_for_metric(unchanged, polls_before + 1.0).await;
    wait_for_states(&server, "cnn", &[(1, "AVAILABLE")]).await;
    assert_eq!(server.metric(r#"sluice_model_config_file_polls_total{outcome="applied"}"#).await, 0.0);
    std::fs::write(&config, toml(&format!("{mlp_only}version_labels = {{ stable = 2 }}\n"))).expect("rewrite");
    server.wait_for_log("model config file applied").await;
    let err = server
        .model_client()
        .await
        .get_model_status(GetModelStatusRequest { model_spec: spec("cnn", None) })
        .await
        .expect_err("cnn removed by the file");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    // A file that does not parse is refused and mlp keeps serving.
    std::fs::write(&config, "[[models]]\nname = 3\n").expect("rewrite");
    server.wait_for_log("model config file refused").await;
    server.predict_client().await.predict(mlp_request(9)).await.expect("mlp still serves");
}

#[tokio::test]
async fn a_tf_serving_text_config_serves_the_same_as_its_toml_twin() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mlp = root().join("examples/models/mlp");
    let text = dir.path().join("models.config");
    std::fs::write(
        &text,
        format!(
            "model_config_list {{ config {{ name: \"mlp\" base_path: \"{}\" model_platform: \"tensorflow\" \
             model_version_policy {{ specific {{ versions: 1 versions: 2 }} }} \
             version_labels {{ key: \"stable\" value: 1 }} version_labels {{ key: \"canary\" value: 2 }} }} }}",
            mlp.display()
        ),
    )
    .expect("write text config");
    let toml = dir.path().join("sluice.toml");
    std::fs::write(
        &toml,
        format!(
            "[[models]]\nname = \"mlp\"\nbase_path = \"{}\"\nversion_policy = {{ specific = [1, 2] }}\n\
             version_labels = {{ stable = 1, canary = 2 }}\n",
            mlp.display()
        ),
    )
    .expect("write TOML config");
    let servers = [text, toml].map(|path| Server::start(&["--model_config_file", path.to_str().expect("utf-8")]));
    let mut answers = Vec::new();
    for server in &servers {
        let status = wait_for_states(server, "mlp", &[(1, "AVAILABLE"), (2, "AVAILABLE")]).await;
        let mut labelled = Vec::new();
        for label in ["stable", "canary"] {
            let mut request = mlp_request(11);
            request.model_spec = Some(sluice::proto::tensorflow::serving::ModelSpec {
                name: "mlp".into(),
                version_choice: Some(sluice::proto::tensorflow::serving::model_spec::VersionChoice::VersionLabel(
                    label.into(),
                )),
                ..Default::default()
            });
            let response = server.predict_client().await.predict(request).await.expect("predict").into_inner();
            labelled.push((version_of(&response), f32_values(&response.outputs["logits"])));
        }
        answers.push((status, labelled));
    }
    assert_eq!(answers[0], answers[1], "the text config and its TOML twin serve differently");
    assert_eq!(answers[0].1.iter().map(|(v, _)| *v).collect::<Vec<_>>(), vec![1, 2]);
}

#[tokio::test]
async fn optimised_graphs_are_made_once_per_model_file_and_reused_after_a_restart() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = dir.path().join("optimized");
    std::fs::create_dir_all(&cache).expect("cache dir");
    // Open to everyone: the server makes it owner-only before trusting it.
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let config = dir.path().join("sluice.toml");
    std::fs::write(
        &config,
        format!(
            "[lifecycle]\noptimized_model_cache_dir = \"{}\"\n[[models]]\nname = \"mlp\"\nbase_path = \"{}\"\n",
            cache.display(),
            root().join("examples/models/mlp").display()
        ),
    )
    .expect("write config");
    let start = || Server::start(&["--model_config_file", config.to_str().expect("utf-8")]);
    let cached = |outcome: &str| format!(r#"sluice_optimized_model_cache_total{{outcome="{outcome}"}}"#);

    let first = start();
    assert_eq!(first.metric(&cached("miss")).await, 1.0);
    assert_eq!(first.metric(&cached("hit")).await, 0.0);
    let answer = first.predict_client().await.predict(mlp_request(21)).await.expect("predict").into_inner();
    drop(first);
    let files: Vec<String> = std::fs::read_dir(&cache)
        .expect("read cache")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files.len(), 1, "one optimised graph, no partial files: {files:?}");
    assert!(files[0].ends_with("-ort1.31.1-Cpu.onnx"), "{files:?}");
    let mode = std::fs::metadata(&cache).expect("cache dir").permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "the cache directory is owner-only");

    let second = start();
    assert_eq!(second.metric(&cached("hit")).await, 1.0);
    assert_eq!(second.metric(&cached("miss")).await, 0.0);
    let again = second.predict_client().await.predict(mlp_request(21)).await.expect("predict").into_inner();
    assert_eq!(f32_values(&again.outputs["logits"]), f32_values(&answer.outputs["logits"]));
    let (_, want) =
        reference(&example_model("mlp", 2), vec![("x", RefInput::F32(vec![1, 64], values(21, 64)))], "logits");
    assert_close(&f32_values(&again.outputs["logits"]), &want, 1e-5, "logits from the cached graph");
    drop(second);

    // A cached graph damaged on disk is thrown away and made again.
    let damaged = cache.join(&files[0]);
    std::fs::write(&damaged, b"not a graph").expect("damage");
    let third = start();
    assert_eq!(third.metric(&cached("off")).await, 1.0, "the damaged graph is not used");
    third.predict_client().await.predict(mlp_request(21)).await.expect("predict after a damaged cache");
    assert!(!damaged.exists() || std::fs::read(&damaged).expect("read") != b"not a graph");
}

#[tokio::test]
async fn with_tf_servings_flag_a_new_label_may_name_a_version_not_yet_available() {
    let config = tempfile::NamedTempFile::new().expect("temp file");
    let mlp = root().join("examples/models/mlp");
    std::fs::write(
        config.path(),
        format!(
            "model_config_list {{ config {{ name: \"mlp\" base_path: \"{}\" model_platform: \"tensorflow\" \
             model_version_policy {{ all {{}} }} version_labels {{ key: \"stable\" value: 1 }} }} }}\n",
            mlp.display()
        ),
    )
    .expect("write config");
    let server = Server::start(&[
        "--model_config_file",
        config.path().to_str().expect("utf-8"),
        "--allow_version_labels_for_unavailable_models",
    ]);
    let mut models = server.model_client().await;
    wait_for_states(&server, "mlp", &[(1, "AVAILABLE"), (2, "AVAILABLE")]).await;
    // A new label on version 7, which is not there: accepted.
    let labels = [("stable", 1), ("next", 7)];
    models
        .handle_reload_config_request(reload_request(vec![model_config("mlp", &mlp, &[1, 2], &labels)]))
        .await
        .expect("a new label may wait for its version");
    // Requests through it are refused, naming why, until version 7 serves.
    let mut request = mlp_request(3);
    request.model_spec = Some(sluice::proto::tensorflow::serving::ModelSpec {
        name: "mlp".into(),
        signature_name: String::new(),
        version_choice: Some(sluice::proto::tensorflow::serving::model_spec::VersionChoice::VersionLabel(
            "next".into(),
        )),
    });
    let refused = server.predict_client().await.predict(request).await.expect_err("version 7 is not there");
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    assert!(refused.message().contains("points at version 7, which is not available"), "{}", refused.message());
    // Moving a label the model already has onto such a version is still
    // refused: it would take serving traffic away.
    let err = models
        .handle_reload_config_request(reload_request(vec![model_config("mlp", &mlp, &[1, 2], &[("stable", 7)])]))
        .await
        .expect_err("stable must keep naming an available version");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    server.predict_client().await.predict(mlp_request(2)).await.expect("still serving");
}

#[tokio::test]
async fn a_reload_that_fails_on_a_new_model_leaves_every_kept_model_as_it_was() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mlp = root().join("examples/models/mlp");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugins dir");
    let config = dir.path().join("sluice.toml");
    let admin = format!(
        "[plugins]\ndir = \"{}\"\n[admin]\nenabled = true\n[[admin.tokens]]\nid = \"ops\"\nrole = \"admin\"\nsha256 = \"{}\"\n",
        plugins.display(),
        sha256_hex(OPS.as_bytes())
    );
    let mlp_table = |label: i64| {
        format!(
            "[[models]]\nname = \"mlp\"\nbase_path = \"{}\"\nversion_policy = \"all\"\nversion_labels = {{ stable = {label} }}\n",
            mlp.display()
        )
    };
    std::fs::write(&config, format!("{admin}{}", mlp_table(1))).expect("write config");
    let server = Server::start(&["--model_config_file", config.to_str().expect("utf-8")]);
    wait_for_states(&server, "mlp", &[(1, "AVAILABLE"), (2, "AVAILABLE")]).await;
    // The kept model's label moves, and a new model comes whose examples
    // table fills an input the model does not have: its pipeline cannot
    // be built, after the kept model would have changed.
    let census = format!(
        "[[models]]\nname = \"census\"\nbase_path = \"{}\"\n[models.examples]\nfeatures = [ {{ name = \"age\", input = \"no_such_input\" }} ]\n",
        root().join("tests/fixtures/models/census").display()
    );
    let body = format!("{}{census}", mlp_table(2));
    let mut client = RestClient::new(&server.http.to_string()).expect("client");
    let authorization = format!("Bearer {OPS}");
    let headers = [("authorization", authorization.as_str())];
    let response =
        client.call(Method::POST, "/admin/v1/models/config", &headers, Bytes::from(body)).await.expect("call");
    assert_eq!(response.status, StatusCode::BAD_REQUEST, "{}", response.text());
    assert!(response.text().contains("examples"), "{}", response.text());
    // Nothing changed: `stable` still names version 1, census is not served.
    let mut request = mlp_request(4);
    request.model_spec = Some(sluice::proto::tensorflow::serving::ModelSpec {
        name: "mlp".into(),
        signature_name: String::new(),
        version_choice: Some(sluice::proto::tensorflow::serving::model_spec::VersionChoice::VersionLabel(
            "stable".into(),
        )),
    });
    let answer = server.predict_client().await.predict(request).await.expect("stable").into_inner();
    assert_eq!(
        answer.model_spec.and_then(|s| s.version_choice),
        Some(sluice::proto::tensorflow::serving::model_spec::VersionChoice::Version(1)),
        "the label the failed reload would have moved"
    );
    let err = server
        .model_client()
        .await
        .get_model_status(GetModelStatusRequest { model_spec: spec("census", None) })
        .await
        .expect_err("census was not added");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
}
