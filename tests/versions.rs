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
use common::*;
use http::{Method, StatusCode};
use prost::Message;
use sluice::cli::bench::client::RestClient;
use sluice::models::warmup::tfrecord;
use sluice::proto::tensorflow::serving::file_system_storage_path_source_config::servable_version_policy::{
    PolicyChoice, Specific,
};
use sluice::proto::tensorflow::serving::file_system_storage_path_source_config::ServableVersionPolicy;
use sluice::proto::tensorflow::serving::{
    model_server_config, prediction_log, GetModelStatusRequest, ModelConfig, ModelConfigList, ModelServerConfig,
    PredictLog, PredictionLog, ReloadConfigRequest,
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
    let response = server
        .model_client()
        .await
        .get_model_status(GetModelStatusRequest { model_spec: spec(model, None) })
        .await
        .expect("GetModelStatus")
        .into_inner();
    response
        .model_version_status
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_version_replaces_the_old_one_under_load_with_no_failed_request() {
    let repository = Repository::new();
    repository.add_example(1, "mlp", 1, None);
    let server = serve_polled(&repository);
    wait_for_states(&server, "mlp", &[(1, "AVAILABLE")]).await;

    // Clients call all along; each answer's version and outcome is kept.
    let stop = Arc::new(AtomicBool::new(false));
    let seen: Arc<Mutex<Vec<Result<i64, String>>>> = Arc::default();
    let mut clients = Vec::new();
    for c in 0..4u64 {
        let (stop, seen, mut client) = (stop.clone(), seen.clone(), server.predict_client().await);
        clients.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let outcome = match client.predict(mlp_request(c * 1_000_000 + i)).await {
                    Ok(response) => {
                        Ok(response.into_inner().model_spec.and_then(|s| s.version_choice).map_or(-1, |choice| {
                            match choice {
                                sluice::proto::tensorflow::serving::model_spec::VersionChoice::Version(v) => v,
                                _ => -1,
                            }
                        }))
                    }
                    Err(status) => Err(format!("{:?}: {}", status.code(), status.message())),
                };
                seen.lock().expect("lock").push(outcome);
            }
        }));
    }
    eventually("answers from version 1", || {
        let n = seen.lock().expect("lock").iter().filter(|o| o == &&Ok(1)).count();
        if n >= 50 {
            Ok(())
        } else {
            Err(format!("{n} so far"))
        }
    })
    .await;

    repository.add_example(2, "mlp", 2, None);
    let status = wait_for_states(&server, "mlp", &[(1, "END"), (2, "AVAILABLE")]).await;
    assert!(status.iter().all(|(_, _, error)| error.is_empty()), "{status:?}");
    let switched = seen.lock().expect("lock").len();
    eventually("answers from version 2 after the switch", || {
        let n = seen.lock().expect("lock")[switched..].iter().filter(|o| o == &&Ok(2)).count();
        if n >= 50 {
            Ok(())
        } else {
            Err(format!("{n} so far"))
        }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.expect("client task");
    }

    let seen = std::mem::take(&mut *seen.lock().expect("lock"));
    let from = |v: i64| seen.iter().filter(|o| o == &&Ok(v)).count();
    eprintln!("{} answers during the switch: {} from version 1, {} from version 2", seen.len(), from(1), from(2));
    let failed: Vec<&String> = seen.iter().filter_map(|o| o.as_ref().err()).collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed during the switch: {:?}",
        failed.len(),
        seen.len(),
        &failed[..failed.len().min(5)]
    );
    // Once version 1 had ended, nothing answered from it.
    assert!(seen[switched..].iter().all(|o| o == &Ok(2)), "an answer after version 1 ended came from it");
    let warmed = server.wait_for_log("warmed up").await;
    assert!(warmed.contains("zeros at batch sizes [1]"), "{warmed}");

    // The answers are version 2's: ONNX Runtime run directly agrees.
    let response = server.predict_client().await.predict(mlp_request(7)).await.expect("predict").into_inner();
    let (_, want) =
        reference(&example_model("mlp", 2), vec![("x", RefInput::F32(vec![1, 64], values(7, 64)))], "logits");
    assert_close(&f32_values(&response.outputs["logits"]), &want, 1e-5, "version 2's logits");
}

#[tokio::test]
async fn a_broken_version_fails_with_its_reason_and_the_serving_one_stays() {
    let repository = Repository::new();
    repository.add_example(1, "mlp", 1, None);
    let server = serve_polled(&repository);
    wait_for_states(&server, "mlp", &[(1, "AVAILABLE")]).await;

    repository.add(3, b"this is not an ONNX model");
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
                log_metadata: Bytes::new(),
                log_type: Some(prediction_log::LogType::PredictLog(PredictLog {
                    request: Some(request),
                    response: None,
                })),
            };
            log.encode_to_vec()
        })
        .collect();
    tfrecord::write(&records)
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

    // Fields sluice does not serve are named.
    let mut logging = model_config("mlp", &mlp, &[1, 2], &[]);
    logging.logging_config = Bytes::from_static(&[10, 0]);
    let err = models.handle_reload_config_request(reload_request(vec![logging])).await.expect_err("logging");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("logging_config"), "{}", err.message());
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
    server.predict_client().await.predict(stable).await.expect("mlp at label stable");
    let image = predict_request("cnn", vec![("image", f32_content(&[1, 3, 32, 32], &values(4, 3 * 32 * 32)))]);
    server.predict_client().await.predict(image.clone()).await.expect("cnn, added by the reload");

    // Remove cnn: it stops being served.
    models
        .handle_reload_config_request(reload_request(vec![model_config("mlp", &mlp, &[1], &[])]))
        .await
        .expect("reload without cnn");
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

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(<sha2::Sha256 as sha2::Digest>::digest(bytes))
}

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
    tokio::time::sleep(Duration::from_millis(1500)).await;
    wait_for_states(&server, "cnn", &[(1, "AVAILABLE")]).await;
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
