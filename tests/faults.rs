//! Faults injected into the real server: the plugin store full or
//! read-only during an upload (a real tmpfs mounted over it), and SIGKILL
//! under load followed by a restart. For each: what the client sees, that
//! no accepted request is answered wrongly, and that service recovers
//! without manual repair.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::fixtures::*;
use common::*;
use http::{Method, StatusCode};
use serde_json::Value;
use sluice::cli::bench::client::RestClient;

const OPS: &str = "ops-secret";

/// A plugin directory (the store inside it) and a config serving pipeline
/// `scored` = features (identity) → MLP, with the admin API.
fn fixture(dir: &Path) -> PathBuf {
    fixture_caching_in(dir, &dir.join("compiled"))
}

/// [`fixture`], keeping compiled plugins in `cache`.
fn fixture_caching_in(dir: &Path, cache: &Path) -> PathBuf {
    let plugins = dir.join("plugins");
    std::fs::create_dir_all(plugins.join("store")).expect("plugins dir");
    std::fs::write(plugins.join("features.wasm"), plugin_bytes("identity")).expect("features.wasm");
    let config = dir.join("sluice.toml");
    std::fs::write(
        &config,
        format!(
            "[plugins]\ndir = \"{plugins}\"\ncache_dir = \"{cache}\"\n[admin]\nenabled = true\n[[admin.tokens]]\n\
             id = \"ops\"\nrole = \"admin\"\nsha256 = \"{hash}\"\n[[models]]\nname = \"mlp\"\nbase_path = \"{mlp}\"\n\
             [[pipelines]]\nname = \"scored\"\nmodel = \"mlp\"\npreprocess = {{ plugin = \"features\" }}\n",
            plugins = plugins.display(),
            cache = cache.display(),
            hash = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(OPS.as_bytes())),
            mlp = root().join("examples/models/mlp").display(),
        ),
    )
    .expect("write config");
    config
}

async fn admin(server: &Server, method: Method, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
    server.admin(method, path, Some(OPS), body).await
}

async fn scored(server: &Server, x: &[f32]) -> Result<Vec<f32>, tonic::Status> {
    let response =
        server.predict_client().await.predict(predict_request("scored", vec![("x", f32_content(&[1, 64], x))])).await?;
    Ok(f32_values(&response.into_inner().outputs["logits"]))
}

async fn direct(server: &Server, x: &[f32]) -> Vec<f32> {
    let request = predict_request("mlp", vec![("x", f32_content(&[1, 64], x))]);
    f32_values(&server.predict_client().await.predict(request).await.expect("mlp").into_inner().outputs["logits"])
}

/// Files in the store that are not whole blobs or manifests: temporaries a
/// failed or killed write left behind.
fn leftovers(store: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for sub in ["blobs", "manifests"] {
        for entry in std::fs::read_dir(store.join(sub)).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || name.ends_with(".tmp") {
                found.push(format!("{sub}/{name}"));
            }
        }
    }
    found
}

fn mount(args: &[&str]) -> bool {
    Command::new("mount").args(args).status().is_ok_and(|s| s.success())
}

/// Unmounts when dropped, so a failed test leaves no mount behind.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[tokio::test]
async fn a_full_or_read_only_plugin_store_refuses_uploads_changes_nothing_and_recovers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = fixture(dir.path());
    let store = dir.path().join("plugins/store");
    // A real file system of 48 KiB over the store: smaller than a plugin.
    if !mount(&["-t", "tmpfs", "-o", "size=48k", "tmpfs", store.to_str().expect("utf-8")]) {
        panic!("mounting a tmpfs needs root (CAP_SYS_ADMIN); this test injects a full disk with one");
    }
    let _mounted = Mounted(store.clone());
    let server = Server::start(&["--model_config_file", config.to_str().expect("utf-8")]);
    let x = values(8, 64);
    let doubled: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
    let (identity, scaled) = (direct(&server, &x).await, direct(&server, &doubled).await);

    // Full: the upload is refused with the reason; nothing changed.
    let (status, answer) =
        admin(&server, Method::PUT, "/admin/v1/plugins/features?activate=true", plugin_bytes("scale")).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{answer}");
    assert!(answer["error"].as_str().is_some_and(|e| e.contains("No space left")), "{answer}");
    assert_eq!(scored(&server, &x).await.expect("still serving"), identity);
    assert!(leftovers(&store).is_empty(), "partial files: {:?}", leftovers(&store));
    let (_, listed) = admin(&server, Method::GET, "/admin/v1/plugins/features", Vec::new()).await;
    assert_eq!(listed["versions"].as_array().map(Vec::len), Some(1), "only version 0: {listed}");

    // Read-only: the same.
    assert!(mount(&["-o", "remount,ro,size=16m", store.to_str().expect("utf-8")]), "remount read-only");
    let (status, answer) =
        admin(&server, Method::PUT, "/admin/v1/plugins/features?activate=true", plugin_bytes("scale")).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{answer}");
    assert!(answer["error"].as_str().is_some_and(|e| e.contains("Read-only file system")), "{answer}");
    assert_eq!(scored(&server, &x).await.expect("still serving"), identity);

    // Room again: the next upload works, with no repair in between.
    assert!(mount(&["-o", "remount,rw,size=16m", store.to_str().expect("utf-8")]), "remount writable");
    let (status, answer) =
        admin(&server, Method::PUT, "/admin/v1/plugins/features?activate=true", plugin_bytes("scale")).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(scored(&server, &x).await.expect("scale serves"), scaled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_under_load_loses_no_state_and_the_restart_serves_the_same_plugin_and_model() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = fixture(dir.path());
    let store = dir.path().join("plugins/store");
    let server = Server::start(&["--model_config_file", config.to_str().expect("utf-8")]);
    let x = values(9, 64);
    let doubled: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
    let scaled = direct(&server, &doubled).await;
    let (status, answer) =
        admin(&server, Method::PUT, "/admin/v1/plugins/features?activate=true", plugin_bytes("scale")).await;
    assert_eq!(status, StatusCode::OK, "{answer}");

    // Load from four clients, and uploads going on, when SIGKILL lands.
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let (stop, mut client, x, scaled) = (stop.clone(), server.predict_client().await, x.clone(), scaled.clone());
        clients.push(tokio::spawn(async move {
            let (mut right, mut failed) = (0, 0);
            while !stop.load(Ordering::Relaxed) {
                match client.predict(predict_request("scored", vec![("x", f32_content(&[1, 64], &x))])).await {
                    Ok(response) => {
                        assert_eq!(f32_values(&response.into_inner().outputs["logits"]), scaled, "a wrong answer");
                        right += 1;
                    }
                    Err(_) => {
                        failed += 1;
                        break;
                    }
                }
            }
            (right, failed)
        }));
    }
    let uploader = {
        let http = server.http.to_string();
        tokio::spawn(async move {
            let mut client = RestClient::new(&http).expect("client");
            let authorization = format!("Bearer {OPS}");
            for _ in 0..50 {
                let body = Bytes::from(plugin_bytes("identity"));
                let headers = [("authorization", authorization.as_str())];
                if client.call(Method::PUT, "/admin/v1/plugins/features", &headers, body).await.is_err() {
                    break;
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(server.pid() as libc::pid_t, libc::SIGKILL) }, 0);
    stop.store(true, Ordering::Relaxed);
    let mut answered = 0;
    for client in clients {
        let (right, _) = client.await.expect("client task");
        answered += right;
    }
    let _ = uploader.await;
    drop(server);
    assert!(answered > 0, "the load ran before the kill");

    // The restart serves the activated plugin and leaves no partial file
    // a write cut short by the kill may have left.
    let server = Server::start(&["--model_config_file", config.to_str().expect("utf-8")]);
    assert!(leftovers(&store).is_empty(), "partial files after the restart: {:?}", leftovers(&store));
    assert_eq!(scored(&server, &x).await.expect("restarted"), scaled, "the activated plugin survives SIGKILL");
    let (status, listed) = admin(&server, Method::GET, "/admin/v1/plugins/features", Vec::new()).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    assert_eq!(listed["active"], 1, "{listed}");
}

/// Compiled plugins in the cache directory, by file name.
fn compiled(cache: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(cache)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "cwasm"))
        .collect();
    files.sort();
    files
}

#[tokio::test]
async fn compiled_code_planted_in_the_plugin_cache_is_never_run() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = dir.path().join("compiled");
    let x = values(8, 64);
    let doubled: Vec<f32> = x.iter().map(|v| v * 2.0).collect();

    // A first server compiles and caches `identity` and then `scale`.
    let first = dir.path().join("first");
    let server = Server::start(&["--model_config_file", fixture_caching_in(&first, &cache).to_str().expect("utf-8")]);
    let (identity, scaled) = (direct(&server, &x).await, direct(&server, &doubled).await);
    assert_ne!(identity, scaled);
    assert_eq!(scored(&server, &x).await.expect("identity serves"), identity);
    let (status, answer) =
        admin(&server, Method::PUT, "/admin/v1/plugins/features?activate=true", plugin_bytes("scale")).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(scored(&server, &x).await.expect("scale serves"), scaled);
    drop(server);
    let identity_hash = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(plugin_bytes("identity")));
    let files = compiled(&cache);
    assert_eq!(files.len(), 2, "both plugins cached: {files:?}");
    let named =
        |file: &PathBuf| file.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&identity_hash));
    let (target, planted) = match (files.iter().find(|f| named(f)), files.iter().find(|f| !named(f))) {
        (Some(target), Some(planted)) => (target.clone(), planted.clone()),
        _ => panic!("one cached file is identity's ({identity_hash}): {files:?}"),
    };
    let mode = |path: &Path| std::fs::metadata(path).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode(&cache), 0o700, "the cache directory is owner-only");
    assert_eq!(mode(&target), 0o600, "cached code is owner-only");

    // While the directory stood open, someone replaced identity's compiled
    // code with other native code (here: scale's, so running it shows).
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).expect("open the cache");
    std::fs::copy(&planted, &target).expect("plant");
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o666)).expect("world-writable");

    // A server whose pipeline runs `identity` compiles it from its source,
    // and closes the directory again.
    let second = dir.path().join("second");
    let server = Server::start(&["--model_config_file", fixture_caching_in(&second, &cache).to_str().expect("utf-8")]);
    assert_eq!(scored(&server, &x).await.expect("identity serves"), identity, "the planted code ran");
    let warned = server.wait_for_log("others may write it (mode 666)").await;
    assert!(warned.contains(target.to_str().expect("utf-8")), "{warned}");
    assert_eq!(mode(&cache), 0o700, "the cache directory is owner-only again");
    eventually("identity cached again from its own source", || {
        if std::fs::metadata(&target).is_ok_and(|m| m.permissions().mode() & 0o777 == 0o600) {
            Ok(())
        } else {
            Err(format!("{} not rewritten", target.display()))
        }
    })
    .await;
}
