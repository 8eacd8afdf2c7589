//! The plugin admin API against the real server: upload, activate, roll
//! back and restart; twenty swaps under load without a failed request;
//! every kind of refusal with its status and message and nothing changed;
//! a store corrupted between runs.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use common::fixtures::*;
use common::two_answers::TwoAnswerLoad;
use common::*;
use http::{Method, StatusCode};
use serde_json::Value;
use sluice::cli::bench::client::RestClient;

const ML: &str = "ml-secret";
const WEB: &str = "web-secret";
const OPS: &str = "ops-secret";

/// A plugin directory whose `features.wasm` is the identity plugin, and a
/// config serving pipeline `scored` (team ml) = features → MLP.
struct Fixture {
    dir: ConfigDir,
}

impl Fixture {
    fn new() -> Fixture {
        Fixture::with_admin("")
    }

    /// `admin` is extra keys of `[admin]`.
    fn with_admin(admin: &str) -> Fixture {
        let config = format!(
            "[plugins]\ndir = \"$PLUGINS\"\n[admin]\nenabled = true\nmax_upload_bytes = 4194304\n{admin}\n{}{}{}\n{}\n{}",
            admin_token("ml-ci", Some("ml"), ML),
            admin_token("web-ci", Some("web"), WEB),
            admin_token("ops", None, OPS),
            example_model_table("mlp"),
            pipeline_table("scored", "mlp", "team = \"ml\"\npreprocess = { plugin = \"features\", workers = 2 }"),
        );
        Fixture { dir: ConfigDir::new(&[("features", "identity")], &config) }
    }

    fn start(&self) -> Server {
        Server::serving(&self.dir)
    }

    fn store(&self) -> PathBuf {
        self.dir.plugins().join("store")
    }

    fn files_in_store(&self) -> Vec<String> {
        self.files_in(&["blobs", "manifests"])
    }

    /// Compiled plugins in the cache (`store/compiled`, the default).
    fn compiled(&self) -> Vec<String> {
        self.files_in(&["compiled"])
    }

    fn files_in(&self, subs: &[&str]) -> Vec<String> {
        let mut files = Vec::new();
        for &sub in subs {
            if let Ok(entries) = std::fs::read_dir(self.store().join(sub)) {
                files.extend(entries.flatten().map(|e| format!("{sub}/{}", e.file_name().to_string_lossy())));
            }
        }
        files.sort();
        files
    }
}

async fn admin(server: &Server, method: Method, path: &str, token: Option<&str>, body: Vec<u8>) -> (StatusCode, Value) {
    server.admin(method, path, token, body).await
}

async fn ok(server: &Server, method: Method, path: &str, token: &str, body: Vec<u8>) -> Value {
    let (status, answer) = admin(server, method.clone(), path, Some(token), body).await;
    assert_eq!(status, StatusCode::OK, "{method} {path}: {answer}");
    answer
}

/// `sluice plugin ARGS…` with `token` in SLUICE_TOKEN.
fn sluice_plugin(args: &[&str], token: &str) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("plugin")
        .args(args)
        .env("SLUICE_TOKEN", token)
        .output()
        .expect("run sluice plugin")
}

fn input() -> Vec<f32> {
    values(5, 64)
}

async fn logits(server: &Server, model: &str, x: &[f32]) -> Result<Vec<f32>, tonic::Status> {
    let mut client = server.predict_client().await;
    let response = client.predict(predict_request(model, vec![("x", f32_content(&[1, 64], x))])).await?;
    Ok(f32_values(&response.into_inner().outputs["logits"]))
}

/// What `scored` answers with the identity plugin and with the doubling one.
async fn references(server: &Server) -> (Vec<f32>, Vec<f32>) {
    let x = input();
    let doubled: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
    (logits(server, "mlp", &x).await.expect("mlp"), logits(server, "mlp", &doubled).await.expect("mlp"))
}

#[tokio::test]
async fn upload_activate_rollback_and_restart_keep_the_chosen_version() {
    let fixture = Fixture::new();
    let server = fixture.start();
    let (identity, doubled) = references(&server).await;
    assert_eq!(logits(&server, "scored", &input()).await.expect("scored"), identity, "features.wasm serves at first");

    let scale = plugin_bytes("scale");
    let uploaded = ok(&server, Method::PUT, "/admin/v1/plugins/features", ML, scale.clone()).await;
    assert_eq!(uploaded["version"], 1);
    assert_eq!(uploaded["sha256"], sha256_hex(&scale));
    assert_eq!(uploaded["declared"], "scale 1.0.0");
    assert_eq!(uploaded["active"], false);
    assert_eq!(logits(&server, "scored", &input()).await.expect("scored"), identity, "stored, not yet active");

    ok(&server, Method::POST, "/admin/v1/plugins/features/versions/1/activate", ML, vec![]).await;
    assert_eq!(logits(&server, "scored", &input()).await.expect("scored"), doubled, "version 1 (scale) serves");

    let second =
        ok(&server, Method::PUT, "/admin/v1/plugins/features?activate=true", ML, plugin_bytes("identity")).await;
    assert_eq!((second["version"].as_u64(), second["active"].as_bool()), (Some(2), Some(true)));
    assert_eq!(logits(&server, "scored", &input()).await.expect("scored"), identity, "version 2 (identity) serves");

    let rolled = ok(&server, Method::POST, "/admin/v1/plugins/features/rollback", ML, vec![]).await;
    assert_eq!(rolled["active"], 1);
    assert_eq!(logits(&server, "scored", &input()).await.expect("scored"), doubled, "rolled back to version 1");

    let shown = ok(&server, Method::GET, "/admin/v1/plugins/features", ML, vec![]).await;
    assert_eq!(shown["team"], "ml");
    assert_eq!(shown["versions"].as_array().map(Vec::len), Some(3), "version 0 (the file), 1 and 2");
    assert_eq!(shown["versions"][0]["uploaded_by"], "[plugins] dir");
    assert_eq!(shown["versions"][1]["uploaded_by"], "ml-ci");
    let listed = ok(&server, Method::GET, "/admin/v1/plugins", WEB, vec![]).await;
    assert_eq!(listed["plugins"], Value::Array(vec![]), "another team sees nothing of team ml's");

    let log = server.log_through("plugin rollback").await.join("\n");
    assert!(
        log.contains("plugin upload") && log.contains("plugin activate") && log.contains("plugin rollback"),
        "{log}"
    );
    assert!(log.contains("ml-ci"), "the audit log names the token id: {log}");
    // The first activation replaced version 0, the file, not nothing.
    let first_activation = log
        .lines()
        .find(|l| l.contains("plugin activate") && l.contains("version=1"))
        .unwrap_or_else(|| panic!("no activation of version 1 in {log}"));
    assert!(first_activation.contains("previous=0"), "{first_activation}");
    for secret in [ML, WEB, OPS] {
        assert!(!log.contains(secret), "a token appeared in the log");
    }
    // The admin API lists the changes, newest first, each with who made
    // it; a team sees its own team's, no more.
    let audit = ok(&server, Method::GET, "/admin/v1/audit", ML, vec![]).await;
    let actions: Vec<(&str, i64)> = audit["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| (e["action"].as_str().unwrap_or("?"), e["version"].as_i64().unwrap_or(-1)))
        .collect();
    assert_eq!(actions, [("rollback", 1), ("activate", 2), ("upload", 2), ("activate", 1), ("upload", 1)], "{audit}");
    assert_eq!(audit["entries"][3]["previous"], 0, "version 0 was serving: {audit}");
    assert_eq!(audit["entries"][0]["token_id"], "ml-ci", "{audit}");
    let two = ok(&server, Method::GET, "/admin/v1/audit?plugin=features&limit=2", ML, vec![]).await;
    assert_eq!(two["entries"].as_array().map(Vec::len), Some(2), "{two}");
    let other_team = ok(&server, Method::GET, "/admin/v1/audit", WEB, vec![]).await;
    assert_eq!(other_team["entries"], Value::Array(vec![]), "{other_team}");
    let (status, body) = admin(&server, Method::GET, "/admin/v1/audit?limit=0", Some(ML), vec![]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    // A refused upload is counted as an upload, and none of its calls as
    // the serving plugin's.
    let (status, _) =
        admin(&server, Method::PUT, "/admin/v1/plugins/features", Some(ML), plugin_bytes("mistake_sampled_drops_rows"))
            .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let metrics = server.metrics().await;
    assert_eq!(metric_value(&metrics, r#"sluice_plugin_uploads_total{outcome="accepted"}"#), 2.0, "{metrics}");
    assert_eq!(metric_value(&metrics, r#"sluice_plugin_uploads_total{outcome="refused"}"#), 1.0, "{metrics}");
    assert!(!metrics.contains(r#"sluice_plugin_calls_total{plugin="features",outcome="bad_output"}"#), "{metrics}");

    drop(server);
    let server = fixture.start();
    assert_eq!(
        logits(&server, "scored", &input()).await.expect("scored"),
        doubled,
        "after a restart, version 1 still serves"
    );
    let shown = ok(&server, Method::GET, "/admin/v1/plugins/features", OPS, vec![]).await;
    // Version 0 (the file, serving before the first activation) is what
    // a rollback returns to after 1 ← 2 was rolled back.
    assert_eq!((shown["active"].as_u64(), shown["history"].clone()), (Some(1), serde_json::json!([0])));

    // The command-line client: push to the pipeline (activates), then list.
    let server_url = format!("http://{}", server.http);
    let identity_file = plugin_file("identity");
    let push = ["push", identity_file.to_str().expect("utf-8"), "--pipeline", "scored", "--server", &server_url];
    let output = sluice_plugin(&push, ML);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("\"version\": 3") && stdout.contains("\"active\": true"), "{stdout}");
    assert_eq!(logits(&server, "scored", &input()).await.expect("scored"), identity, "the pushed version serves");
    let output = sluice_plugin(&["list", "--server", &server_url], WEB);
    assert!(output.status.success());
    assert!(!String::from_utf8_lossy(&output.stdout).contains("features"), "team web does not see team ml's plugin");
    let output = sluice_plugin(&push, WEB);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("403"), "{}", String::from_utf8_lossy(&output.stderr));

    // The rest of the admin API from the command line: show, activate,
    // rollback, delete — each answered as the API answers it.
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--server", &server_url]);
        let output = sluice_plugin(&all, ML);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        );
        (output.status.code(), stdout, stderr)
    };
    let (code, shown, stderr) = run(&["show", "features"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(shown.contains("\"active\": 3") && shown.contains("\"team\": \"ml\""), "{shown}");
    let (code, activated, stderr) = run(&["activate", "features", "1"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(activated.contains("\"active\": 1"), "{activated}");
    assert_eq!(logits(&server, "scored", &input()).await.expect("scored"), doubled, "version 1 (scale) serves");
    let (code, rolled, stderr) = run(&["rollback", "features"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(rolled.contains("\"active\": 3"), "{rolled}");
    assert_eq!(logits(&server, "scored", &input()).await.expect("scored"), identity, "back to version 3");
    let (code, _, stderr) = run(&["delete", "features", "3"]);
    assert_eq!(code, Some(1), "the active version cannot be deleted");
    assert!(stderr.contains("active"), "{stderr}");
    let (code, deleted, stderr) = run(&["delete", "features", "1"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!deleted.contains("\"version\": 1,"), "{deleted}");
}

#[tokio::test]
async fn the_plugin_directory_file_is_version_0_listed_served_and_a_rollback_target() {
    let fixture = Fixture::new();
    let server = fixture.start();
    let (identity, doubled) = references(&server).await;
    let file_sha = sha256_hex(&plugin_bytes("identity"));
    // Before any upload: listed, active, and what the pipeline runs.
    let listed = ok(&server, Method::GET, "/admin/v1/plugins", ML, vec![]).await;
    let features = listed["plugins"]
        .as_array()
        .and_then(|all| all.iter().find(|p| p["name"] == "features"))
        .unwrap_or_else(|| panic!("the served file is not listed: {listed}"));
    assert_eq!(features["active"], 0, "{features}");
    assert_eq!(features["versions"][0]["sha256"], file_sha.as_str());
    let running = ok(&server, Method::GET, "/admin/v1/pipelines", ML, vec![]).await;
    let scored = &running["pipelines"][0];
    assert_eq!(
        (scored["pipeline"].as_str(), scored["plugin"].as_str()),
        (Some("scored"), Some("features")),
        "{running}"
    );
    assert_eq!((scored["version"].as_u64(), scored["sha256"].as_str()), (Some(0), Some(file_sha.as_str())));
    assert_eq!(scored["declared"], "plugin 'identity' 1.0.0");
    let line = server.wait_for_log("plugin stage serving").await;
    for part in ["pipeline=\"scored\"", "version=0", &file_sha, "features.wasm (version 0)"] {
        assert!(line.contains(part), "{part:?} not in the start-up line {line}");
    }
    // An upload activated over it, then a rollback to the file.
    ok(&server, Method::PUT, "/admin/v1/plugins/features?activate=true", ML, plugin_bytes("scale")).await;
    assert_eq!(logits(&server, "scored", &input()).await.expect("scored"), doubled, "version 1 serves");
    let rolled = ok(&server, Method::POST, "/admin/v1/plugins/features/rollback", ML, vec![]).await;
    assert_eq!(rolled["active"], 0, "{rolled}");
    assert_eq!(logits(&server, "scored", &input()).await.expect("scored"), identity, "the file serves again");
    let running = ok(&server, Method::GET, "/admin/v1/pipelines", ML, vec![]).await;
    assert_eq!(running["pipelines"][0]["version"], 0);
    // And it stays chosen across a restart.
    drop(server);
    let server = fixture.start();
    assert_eq!(logits(&server, "scored", &input()).await.expect("scored"), identity, "version 0 after a restart");
}

#[tokio::test]
async fn twenty_swaps_under_load_fail_no_request_and_every_answer_is_one_version() {
    let fixture = Fixture::new();
    let server = fixture.start();
    let (identity, doubled) = references(&server).await;
    ok(&server, Method::PUT, "/admin/v1/plugins/features", ML, plugin_bytes("scale")).await;
    ok(&server, Method::PUT, "/admin/v1/plugins/features", ML, plugin_bytes("identity")).await;

    let load = TwoAnswerLoad::start(&server, "scored", &input(), [identity, doubled], 8).await;
    // Every client is sending before the first swap.
    load.wait_for(16).await;
    for swap in 0..20 {
        let version = 1 + swap % 2;
        ok(&server, Method::POST, &format!("/admin/v1/plugins/features/versions/{version}/activate"), ML, vec![]).await;
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let seen = load.stop().await;
    assert!(
        seen.failures.is_empty(),
        "{} requests failed during the swaps: {:?}",
        seen.failures.len(),
        seen.failures.first()
    );
    assert_eq!(seen.neither, 0, "an answer matched neither version");
    assert!(seen.answers[0] > 0 && seen.answers[1] > 0, "both versions served: {:?}", seen.answers);
    let shown = ok(&server, Method::GET, "/admin/v1/plugins/features", ML, vec![]).await;
    assert_eq!(shown["active"], 2);
}

/// Method, path, token, body; the status and a fragment of the message.
type Refusal<'a> = (Method, &'a str, Option<&'a str>, Vec<u8>, StatusCode, &'a str);

#[tokio::test]
async fn every_refusal_has_its_status_and_message_and_changes_nothing() {
    let fixture = Fixture::new();
    let server = fixture.start();
    let (identity, _) = references(&server).await;
    let features = "/admin/v1/plugins/features";
    let scale = plugin_bytes("scale");
    let compiled_before = fixture.compiled();
    let cases: Vec<Refusal> = vec![
        (Method::PUT, features, None, scale.clone(), StatusCode::UNAUTHORIZED, "no Authorization header"),
        (Method::PUT, features, Some("guess"), scale.clone(), StatusCode::UNAUTHORIZED, "the token is not valid"),
        (Method::GET, "/admin/v1/plugins", Some(""), vec![], StatusCode::UNAUTHORIZED, "not \"Bearer TOKEN\""),
        (
            Method::PUT,
            features,
            Some(WEB),
            scale.clone(),
            StatusCode::FORBIDDEN,
            "pipeline 'scored' runs it and belongs to team \"ml\"",
        ),
        (Method::PUT, "/admin/v1/plugins/..", Some(ML), scale.clone(), StatusCode::BAD_REQUEST, "names are 1 to 128"),
        (
            Method::PUT,
            "/admin/v1/plugins/a%2F..%2F..%2Fetc",
            Some(ML),
            scale.clone(),
            StatusCode::BAD_REQUEST,
            "\"a/../../etc\"",
        ),
        (
            Method::PUT,
            "/admin/v1/plugins/.hidden",
            Some(ML),
            scale.clone(),
            StatusCode::BAD_REQUEST,
            "not starting with '.'",
        ),
        (Method::PUT, features, Some(ML), vec![7u8; 5 << 20], StatusCode::PAYLOAD_TOO_LARGE, "admin.max_upload_bytes"),
        // Declared shapes are claims: 2^40 elements are refused, not
        // allocated as zeros (this upload once aborted the server).
        (
            Method::PUT,
            features,
            Some(ML),
            plugin_bytes("liar_huge_input"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "dimension 0 = 1099511627776",
        ),
        // A compile bomb (150,000 empty functions) is refused by its
        // structure, before anything is compiled.
        (
            Method::PUT,
            features,
            Some(ML),
            many_functions(150_000),
            StatusCode::UNPROCESSABLE_ENTITY,
            "150000 functions",
        ),
        // A name no pipeline runs belongs to no team: a team may claim one
        // only in its own namespace.
        (Method::PUT, "/admin/v1/plugins/unclaimed", Some(WEB), scale.clone(), StatusCode::FORBIDDEN, "'web.NAME'"),
        (Method::PUT, features, Some(ML), b"\0asm not really".to_vec(), StatusCode::UNPROCESSABLE_ENTITY, "refused"),
        (
            Method::PUT,
            features,
            Some(ML),
            plugin_bytes("topk_labels"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "it is a postprocessor, but the stage runs a preprocessor",
        ),
        (
            Method::PUT,
            features,
            Some(ML),
            plugin_bytes("hostile"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "on zeros shaped like its declared inputs",
        ),
        (
            Method::PUT,
            features,
            Some(ML),
            plugin_bytes("feature_transform"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "do not fit model 'mlp'",
        ),
        (Method::PUT, features, Some(ML), plugin_bytes("bad_imports"), StatusCode::UNPROCESSABLE_ENTITY, "imports"),
        // Nothing uploaded: the plugin is its file, version 0, alone.
        (
            Method::GET,
            "/admin/v1/plugins/ml.unknown",
            Some(ML),
            vec![],
            StatusCode::NOT_FOUND,
            "no plugin 'ml.unknown' has been uploaded",
        ),
        (
            Method::POST,
            "/admin/v1/plugins/features/versions/1/activate",
            Some(ML),
            vec![],
            StatusCode::NOT_FOUND,
            "has no version 1",
        ),
        (
            Method::POST,
            "/admin/v1/plugins/features/rollback",
            Some(OPS),
            vec![],
            StatusCode::BAD_REQUEST,
            "no earlier active version",
        ),
        (
            Method::PUT,
            "/admin/v1/pipelines/nope/plugin",
            Some(OPS),
            scale.clone(),
            StatusCode::NOT_FOUND,
            "pipeline 'nope'",
        ),
    ];
    let mut failures = Vec::new();
    for (method, path, token, body, status, fragment) in cases {
        let (got, answer) = admin(&server, method.clone(), path, token, body).await;
        let message = answer["error"].as_str().unwrap_or_default();
        if got != status || !message.contains(fragment) {
            failures
                .push(format!("{method} {path} as {token:?}: got {got} {answer}; expected {status} with {fragment:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(fixture.files_in_store(), Vec::<String>::new(), "nothing was stored");
    assert_eq!(fixture.compiled(), compiled_before, "a refused upload left compiled code in the cache");
    assert_eq!(logits(&server, "scored", &input()).await.expect("scored"), identity, "the pipeline is unchanged");

    // A version that is active cannot be deleted; an inactive one can.
    ok(&server, Method::PUT, "/admin/v1/plugins/features?activate=true", ML, scale.clone()).await;
    ok(&server, Method::PUT, features, ML, plugin_bytes("identity")).await;
    let (status, answer) =
        admin(&server, Method::DELETE, "/admin/v1/plugins/features/versions/1", Some(ML), vec![]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(answer["error"].as_str().unwrap_or_default().contains("is active"), "{answer}");
    let (status, _) = admin(&server, Method::DELETE, "/admin/v1/plugins/features/versions/2", Some(WEB), vec![]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let remaining = ok(&server, Method::DELETE, "/admin/v1/plugins/features/versions/2", ML, vec![]).await;
    let versions: Vec<u64> =
        remaining["versions"].as_array().expect("versions").iter().filter_map(|v| v["version"].as_u64()).collect();
    assert_eq!(versions, vec![0, 1], "version 0 is features.wasm in the plugin directory");
    let (status, answer) =
        admin(&server, Method::DELETE, "/admin/v1/plugins/features/versions/0", Some(ML), vec![]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(answer["error"].as_str().unwrap_or_default().contains("[plugins] dir"), "{answer}");
    assert_eq!(
        fixture.files_in_store(),
        vec!["blobs/".to_string() + &sha256_hex(&scale) + ".wasm", "manifests/features.json".into()]
    );
}

#[tokio::test]
async fn a_store_corrupted_between_runs_is_refused_in_the_log_and_the_server_starts() {
    let fixture = Fixture::new();
    let server = fixture.start();
    let (identity, doubled) = references(&server).await;
    let scale = plugin_bytes("scale");
    ok(&server, Method::PUT, "/admin/v1/plugins/features?activate=true", ML, scale.clone()).await;
    assert_eq!(logits(&server, "scored", &input()).await.expect("scored"), doubled);
    drop(server);

    // Flip bytes of the active blob, and leave a manifest that is not JSON.
    let blob = fixture.store().join("blobs").join(format!("{}.wasm", sha256_hex(&scale)));
    let mut bytes = std::fs::read(&blob).expect("blob");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&blob, bytes).expect("corrupt the blob");
    std::fs::write(fixture.store().join("manifests/other.json"), b"{ not json").expect("corrupt manifest");

    let server = fixture.start();
    // The lines are read from the server's stderr as it writes them.
    let mut lines = Vec::new();
    let log = eventually("the start-up's lines about the store", || {
        lines.extend(server.log());
        let log = lines.join("\n");
        let all = ["is corrupted: its SHA-256 is", "falling back to features.wasm", "plugin manifest refused"];
        if all.iter().all(|needle| log.contains(needle)) {
            Ok(log)
        } else {
            Err(log)
        }
    })
    .await;
    assert!(log.contains("falling back to features.wasm"), "{log}");
    assert!(log.contains("plugin manifest refused") && log.contains("other.json"), "{log}");
    assert_eq!(logits(&server, "scored", &input()).await.expect("scored"), identity, "features.wasm serves again");
    // Activating the corrupted version is refused; nothing swaps.
    let (status, answer) =
        admin(&server, Method::POST, "/admin/v1/plugins/features/versions/1/activate", Some(ML), vec![]).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{answer}");
    assert!(answer["error"].as_str().unwrap_or_default().contains("corrupted"), "{answer}");
    assert_eq!(logits(&server, "scored", &input()).await.expect("scored"), identity);
}

#[tokio::test]
async fn the_admin_api_can_have_a_port_of_its_own() {
    let fixture = Fixture::with_admin("port = 0");
    let server = fixture.start();
    let admin_addr = server.stdout_after("sluice: serving admin on ").expect("the admin address is printed");
    let mut on_rest = RestClient::new(&server.http.to_string()).expect("client");
    let authorization = format!("Bearer {ML}");
    let headers = [("authorization", authorization.as_str())];
    let response = on_rest.call(Method::GET, "/admin/v1/plugins", &headers, Bytes::new()).await.expect("call");
    assert_eq!(response.status, StatusCode::NOT_FOUND, "not on the REST port: {}", response.text());
    let mut on_admin = RestClient::new(&admin_addr).expect("client");
    let response = on_admin.call(Method::GET, "/admin/v1/plugins", &headers, Bytes::new()).await.expect("call");
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    let response = on_admin.call(Method::GET, "/v1/models/mlp", &headers, Bytes::new()).await.expect("call");
    assert_eq!(response.status, StatusCode::NOT_FOUND, "the admin port serves only the admin API");
}

/// A component carrying a module of `n` empty functions: the shape of a compile bomb.
fn many_functions(n: u32) -> Vec<u8> {
    functions(n, &[])
}

/// A component carrying a module of `n` functions, each running `body`
/// (instructions, without locals or the final `end`).
fn functions(n: u32, body: &[u8]) -> Vec<u8> {
    fn leb(mut v: u32, out: &mut Vec<u8>) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    fn section(id: u8, body: Vec<u8>, out: &mut Vec<u8>) {
        out.push(id);
        leb(body.len() as u32, out);
        out.extend(body);
    }
    let mut module = b"\0asm\x01\0\0\0".to_vec();
    section(1, vec![1, 0x60, 0, 0], &mut module);
    let mut functions = Vec::new();
    leb(n, &mut functions);
    functions.extend(std::iter::repeat_n(0u8, n as usize));
    section(3, functions, &mut module);
    let mut code = Vec::new();
    leb(n, &mut code);
    for _ in 0..n {
        leb(body.len() as u32 + 2, &mut code);
        code.push(0);
        code.extend(body);
        code.push(0x0b);
    }
    section(10, code, &mut module);
    // Inside a component, as a plugin would carry it: a bare core module
    // is refused before its structure is read.
    let mut component = b"\0asm\x0d\0\x01\0".to_vec();
    section(1, module, &mut component);
    component
}

/// A compile bomb inside the structure limits: 90,000 functions of 28
/// additions each, about 15 MB of code, that the compiler needs many CPU
/// seconds for.
fn compile_bomb() -> Vec<u8> {
    let body: Vec<u8> = std::iter::repeat_n([0x41, 0x00, 0x41, 0x01, 0x6a, 0x1a], 28).flatten().collect();
    functions(90_000, &body)
}

/// The server's child processes (its plugin compilers).
fn children(server: &Server) -> Vec<String> {
    let pid = server.pid();
    let mut children = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
        let listed = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        children.extend(listed.split_whitespace().map(str::to_string));
    }
    children
}

/// A server for compile bombs: a 32 MiB upload limit, the compile budget
/// `cpu_seconds`, no drain delay.
fn bomb_fixture(cpu_seconds: u64) -> ConfigDir {
    let config = format!(
        "[server]\ndrain_delay_secs = 0\ndrain_timeout_secs = 3\n[plugins]\ndir = \"$PLUGINS\"\ncompile_cpu_seconds = {cpu_seconds}\n\
         [admin]\nenabled = true\nmax_upload_bytes = 33554432\n{}\n{}\n{}",
        admin_token("ml-ci", Some("ml"), ML),
        example_model_table("mlp"),
        pipeline_table("scored", "mlp", "team = \"ml\"\npreprocess = { plugin = \"features\" }"),
    );
    ConfigDir::new(&[("features", "identity")], &config)
}

/// Compiling runs in a process of its own, so a compile bomb inside the
/// structure limits is stopped, and its memory goes with it: at its CPU
/// budget (429 naming the key), when its caller goes away, and at
/// shutdown, which it never holds up.
#[tokio::test]
async fn a_compile_bomb_is_stopped_at_its_budget_when_its_caller_leaves_and_at_shutdown() {
    let bomb = compile_bomb();
    let features = "/admin/v1/plugins/features";

    // Its budget: refused, naming the key; nothing left running; the
    // server's memory as before.
    let fixture = bomb_fixture(1);
    let server = Server::serving(&fixture);
    serves(&server).await;
    let before = server.rss_bytes();
    let (status, answer) = admin(&server, Method::PUT, features, Some(ML), bomb.clone()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{answer}");
    let message = answer.to_string();
    assert!(message.contains("budget of 1 CPU seconds (plugins.compile_cpu_seconds)"), "{message}");
    assert!(message.contains("was stopped"), "{message}");
    assert_eq!(children(&server), Vec::<String>::new(), "the compiler was stopped");
    let after = server.rss_bytes();
    assert!(
        after < before + (20 << 20),
        "the server's memory grew from {} to {} MiB for a refused compile",
        before >> 20,
        after >> 20
    );
    serves(&server).await;
    drop(server);

    // Its caller going away: stopped, not left to finish.
    let fixture = bomb_fixture(600);
    let server = Server::serving(&fixture);
    let upload = {
        let http = server.http;
        let bomb = bomb.clone();
        tokio::spawn(async move {
            let mut client = RestClient::new(&http.to_string()).expect("client");
            let authorization = format!("Bearer {ML}");
            let headers = [("authorization", authorization.as_str())];
            let _ = client.call(Method::PUT, features, &headers, Bytes::from(bomb)).await;
        })
    };
    eventually("the compiler to start", || if children(&server).is_empty() { Err("none".into()) } else { Ok(()) })
        .await;
    upload.abort();
    server.wait_for_log("the caller went away; its plugin's compilation was stopped").await;
    eventually("the compiler to be gone", || match children(&server) {
        c if c.is_empty() => Ok(()),
        c => Err(format!("{c:?}")),
    })
    .await;
    serves(&server).await;

    // Shutdown while one compiles: the server exits at once.
    let upload = {
        let http = server.http;
        tokio::spawn(async move {
            let mut client = RestClient::new(&http.to_string()).expect("client");
            let authorization = format!("Bearer {ML}");
            let headers = [("authorization", authorization.as_str())];
            client.call(Method::PUT, features, &headers, Bytes::from(bomb)).await.map(|r| r.status)
        })
    };
    eventually("the compiler to start", || if children(&server).is_empty() { Err("none".into()) } else { Ok(()) })
        .await;
    let compiler: Vec<String> = children(&server);
    let mut server = server;
    // SAFETY: kill(2) on the server's own pid.
    assert_eq!(unsafe { libc::kill(server.pid() as libc::pid_t, libc::SIGTERM) }, 0);
    let exited = server.wait(Duration::from_secs(30)).expect("the server exits while a plugin compiles");
    assert!(exited.success(), "{exited:?}");
    for pid in compiler {
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "compiler {pid} outlived the server");
    }
    let _ = upload.await;
}

async fn serves(server: &Server) {
    logits(server, "scored", &input()).await.expect("the pipeline serves");
}
