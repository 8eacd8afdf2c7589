//! WebAssembly plugins through the real server: the example plugins end to
//! end against the same transforms computed here, and a hostile plugin
//! whose every attack must fail that one request — with the right code and
//! a message naming the plugin, its version and the cause — while the
//! server, the other pipelines and the same pipeline keep serving.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::fixtures::example_model_table;
use common::*;
use sluice::proto::tensorflow::serving::PredictRequest;
use sluice::proto::tensorflow::{DataType, TensorProto};
use tonic::Code;

fn plugin_dir() -> String {
    let dir = root().join("target/plugins");
    assert!(
        dir.join("hostile.wasm").is_file() && dir.join("image_normalize.wasm").is_file(),
        "the plugins are not built: run scripts/build-plugins (scripts/test does)"
    );
    dir.display().to_string()
}

fn config() -> String {
    format!(
        r#"
[plugins]
dir = "{dir}"

[plugins.limits.hostile]
timeout_ms = 50
memory_mib = 64

{mlp_table}

{cnn_table}

{recommender_table}

[[pipelines]]
name = "classify"
model = "cnn"
preprocess = {{ plugin = "image_normalize", workers = 2 }}
postprocess = {{ plugin = "topk_labels" }}

[[pipelines]]
name = "recommend"
model = "recommender"
preprocess = {{ plugin = "feature_transform" }}

[[pipelines]]
name = "hostile"
model = "mlp"
team = "evil"
preprocess = {{ plugin = "hostile", workers = 2 }}

[[pipelines]]
name = "identity"
model = "mlp"
team = "good"
preprocess = {{ plugin = "identity" }}
"#,
        recommender_table = example_model_table("recommender"),
        cnn_table = example_model_table("cnn"),
        mlp_table = example_model_table("mlp"),
        dir = plugin_dir()
    )
}

fn u8_tensor(dims: &[i64], bytes: Vec<u8>) -> TensorProto {
    TensorProto {
        dtype: DataType::DtUint8 as i32,
        tensor_shape: shape(dims),
        tensor_content: Bytes::from(bytes),
        ..Default::default()
    }
}

const CIFAR: [&str; 10] = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"];

#[tokio::test]
async fn images_through_image_normalize_the_cnn_and_topk_labels_match_the_native_computation() {
    let server = Server::with_config(&config());
    let mut client = server.predict_client().await;
    let (rows, h, w) = (3usize, 40usize, 48usize);
    let pixels: Vec<u8> = values(11, rows * h * w * 3).iter().map(|v| ((v + 1.0) * 127.5) as u8).collect();
    let response = client
        .predict(predict_request(
            "classify",
            vec![("pixels", u8_tensor(&[rows as i64, h as i64, w as i64, 3], pixels.clone()))],
        ))
        .await
        .expect("classify")
        .into_inner();

    // The same, here: resize + normalise (the SDK's transform, which the
    // plugin also compiles), the CNN in ONNX Runtime, softmax, top 3.
    let params = sluice_sdk::transforms::ImageNormalize {
        height: 32,
        width: 32,
        mean: vec![0.485, 0.456, 0.406],
        std: vec![0.229, 0.224, 0.225],
        scale: 255.0,
    };
    let image = sluice_sdk::transforms::image_normalize(&params, &pixels, rows, h, w);
    let (_, logits) = reference(
        &example_model("cnn", 1),
        vec![("image", RefInput::F32(vec![rows as i64, 3, 32, 32], image))],
        "logits",
    );
    let scores = f32_values(&response.outputs["scores"]);
    let classes = &response.outputs["classes"].int64_val;
    let labels = &response.outputs["labels"].string_val;
    for (r, row) in logits.chunks(10).enumerate() {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exp: Vec<f32> = row.iter().map(|v| (v - max).exp()).collect();
        let sum: f32 = exp.iter().sum();
        let mut order: Vec<usize> = (0..10).collect();
        order.sort_by(|&a, &b| exp[b].partial_cmp(&exp[a]).unwrap().then(a.cmp(&b)));
        for (j, &class) in order[..3].iter().enumerate() {
            assert_eq!(classes[r * 3 + j], class as i64, "row {r} rank {j}");
            assert!((scores[r * 3 + j] - exp[class] / sum).abs() < 1e-5, "row {r} rank {j}");
            assert_eq!(labels[r * 3 + j], Bytes::from(CIFAR[class]));
        }
    }
}

#[tokio::test]
async fn features_through_feature_transform_and_the_recommender_match_the_native_computation() {
    let server = Server::with_config(&config());
    let mut client = server.predict_client().await;
    let rows = 4usize;
    let raw: Vec<f32> = values(21, rows * 13).iter().map(|v| (v + 1.0) * 60.0).collect();
    let users: Vec<String> = (0..rows * 4).map(|i| format!("user-{}", i * 7919 % 1013)).collect();
    let user_refs: Vec<&str> = users.iter().map(String::as_str).collect();
    let response = client
        .predict(predict_request(
            "recommend",
            vec![
                ("raw_dense", f32_content(&[rows as i64, 13], &raw)),
                ("user_ids", string_tensor(&[rows as i64, 4], &user_refs)),
            ],
        ))
        .await
        .expect("recommend")
        .into_inner();
    let score = recommend_by_hand(&raw, &users);
    assert_close(&f32_values(&response.outputs["score"]), &score, 1e-5, "recommendation scores");
}

fn attack(name: &str, rows: i64) -> PredictRequest {
    predict_request(
        "hostile",
        vec![
            ("attack", string_tensor(&[1], &[name])),
            ("x", f32_content(&[rows, 64], &values(rows as u64, rows as usize * 64))),
        ],
    )
}

struct Attack {
    name: String,
    codes: Vec<Code>,
    /// In the client's answer.
    says: Vec<&'static str>,
    /// The plugin's own words: in the server log, never in the answer.
    logs: Vec<&'static str>,
}

fn attacks(socket: &str) -> Vec<Attack> {
    let a = |name: &str, codes: Vec<Code>, says: Vec<&'static str>| Attack {
        name: name.to_string(),
        codes,
        says,
        logs: vec![],
    };
    let said = |name: &str, says: Vec<&'static str>, logs: Vec<&'static str>| Attack {
        name: name.to_string(),
        codes: vec![Code::Internal],
        says,
        logs,
    };
    vec![
        a("loop", vec![Code::ResourceExhausted], vec!["exceeded its time limit of 50 ms"]),
        a("memory", vec![Code::ResourceExhausted], vec!["memory past its limit of 64 MiB"]),
        a("recursion", vec![Code::Internal], vec!["recursion"]),
        a("unreachable", vec![Code::Internal], vec!["unreachable"]),
        said("panic", vec!["unreachable code", "server log"], vec!["panics on purpose"]),
        said("file", vec!["failed", "server log"], vec!["opening /etc/passwd failed"]),
        said("env", vec!["failed", "server log"], vec!["environment: 0 variables []; arguments: []"]),
        said(&format!("socket:{socket}"), vec!["failed", "server log"], vec![]),
        said("clock", vec!["failed", "server log"], vec!["Ok(0) since the epoch"]),
        a("wrong-shape", vec![Code::Internal], vec!["dimension 1 = 63"]),
        a("bad-length", vec![Code::Internal], vec!["malformed tensor", "10 bytes"]),
        a("wrong-name", vec![Code::Internal], vec!["returned outputs [\"y\"]"]),
        a("wrong-dtype", vec![Code::Internal], vec!["DT_INT32"]),
        a("huge", vec![Code::Internal, Code::ResourceExhausted], vec![]),
        a("invalid", vec![Code::InvalidArgument], vec!["rejected the input", "refuses this input"]),
        // Blocking in a host call is bounded by the same time limit.
        a("sleep", vec![Code::ResourceExhausted], vec!["blocked in a host call", "time limit of 50 ms"]),
        // Plugin text is capped, with a visible mark.
        a("big-error", vec![Code::InvalidArgument], vec!["truncated: "]),
    ]
}

#[tokio::test]
async fn every_hostile_attack_fails_its_request_alone_and_everything_keeps_serving() {
    let server = Server::with_config(&config());
    let mut client = server.predict_client().await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
    listener.set_nonblocking(true).expect("nonblocking");
    let socket = listener.local_addr().expect("addr").to_string();

    for attack_case in attacks(&socket) {
        let started = Instant::now();
        let status = client.predict(attack(&attack_case.name, 2)).await.expect_err(&attack_case.name);
        let elapsed = started.elapsed();
        assert!(
            attack_case.codes.contains(&status.code()),
            "{}: {:?} {}",
            attack_case.name,
            status.code(),
            status.message()
        );
        assert!(status.message().contains("plugin 'hostile' 6.6.6"), "{}: {}", attack_case.name, status.message());
        for fragment in &attack_case.says {
            assert!(
                status.message().contains(fragment),
                "{}: {:?} not in {}",
                attack_case.name,
                fragment,
                status.message()
            );
        }
        for words in &attack_case.logs {
            assert!(!status.message().contains(words), "{}: the plugin's words reached the client", attack_case.name);
            let id = status.metadata().get("x-request-id").and_then(|v| v.to_str().ok()).expect("a request id");
            // The plugin's words, and the failure itself, under the id.
            let mut seen: Vec<String> = Vec::new();
            let (line, failure) = eventually("the plugin's words and the failure in the log", || {
                seen.extend(server.log());
                let line = seen.iter().find(|l| l.contains(words)).cloned();
                let failure = seen.iter().find(|l| l.contains(id) && l.contains("request failed")).cloned();
                line.zip(failure).ok_or_else(|| format!("{seen:?}"))
            })
            .await;
            assert!(line.contains(id), "{}: the log line does not carry the request id {id}: {line}", attack_case.name);
            assert!(failure.contains("WARN"), "{}: a plugin's failure is a warning: {failure}", attack_case.name);

            // The answer names the id the words are logged under.
            assert!(
                status.message().contains(&format!("under request id {id}")),
                "{}: the answer does not give the id: {}",
                attack_case.name,
                status.message()
            );
        }
        // Stopped, not left running: far inside any client's patience.
        assert!(elapsed < Duration::from_secs(2), "{} took {elapsed:?}", attack_case.name);
        assert!(status.message().len() < 4096, "{}: a {} byte message", attack_case.name, status.message().len());

        // The same pipeline, another pipeline and the bare model all serve.
        let ok = client.predict(attack("none", 2)).await.unwrap_or_else(|e| panic!("after {}: {e}", attack_case.name));
        assert_eq!(dims(&ok.into_inner().outputs["logits"]), vec![2, 10]);
        let identity = predict_request("identity", vec![("x", f32_content(&[1, 64], &values(5, 64)))]);
        client.predict(identity).await.unwrap_or_else(|e| panic!("identity after {}: {e}", attack_case.name));
        let direct = predict_request("mlp", vec![("x", f32_content(&[1, 64], &values(6, 64)))]);
        client.predict(direct).await.unwrap_or_else(|e| panic!("mlp after {}: {e}", attack_case.name));
    }
    assert!(listener.accept().is_err(), "the plugin must not have reached the test's socket");

    // Chatty plugins are capped, not failed.
    for chatty in ["log-flood", "stdout-flood", "log-forge"] {
        let ok = client.predict(attack(chatty, 1)).await.unwrap_or_else(|e| panic!("{chatty}: {e}"));
        assert_eq!(dims(&ok.into_inner().outputs["logits"]), vec![1, 10]);
    }
    // What a plugin logs stays on its own line: it cannot forge another.
    let forged = server.wait_for_log("plugin activate team=admin").await;
    assert!(forged.contains("fine\\n"), "the line break is escaped: {forged}");
    assert!(
        !server.log().iter().any(|l| l.trim_start().starts_with("INFO sluice::audit")),
        "a plugin forged an audit line: {:?}",
        server.log()
    );
    let metrics = server.metrics().await;
    let calls: Vec<&str> = metrics.lines().filter(|l| l.starts_with("sluice_plugin_calls_total")).collect();
    let count = |outcome: &str| {
        // Labelled by the name the pipeline gives it, never by what the
        // plugin declares.
        metric_value(&metrics, &format!(r#"sluice_plugin_calls_total{{plugin="hostile",outcome="{outcome}"}}"#))
    };
    // `huge` may run out of time before it is caught returning too many rows.
    assert!(count("timeout") >= 2.0, "{calls:#?}");
    for (outcome, expected) in [("out_of_memory", 1.0), ("stack_overflow", 1.0), ("invalid_input", 2.0), ("trap", 2.0)]
    {
        assert_eq!(count(outcome), expected, "{outcome}: {calls:#?}");
    }
}

#[tokio::test]
async fn hostile_attacks_from_many_clients_at_once_leave_the_good_requests_answered() {
    let server = std::sync::Arc::new(Server::with_config(&config()));
    let mut tasks = Vec::new();
    for i in 0..24u64 {
        let server = server.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = server.predict_client().await;
            let name = ["loop", "memory", "panic", "none"][i as usize % 4];
            (name, client.predict(attack(name, 1)).await)
        }));
    }
    for task in tasks {
        let (name, result) = task.await.expect("task");
        match name {
            "none" => {
                result.unwrap_or_else(|e| panic!("a good request failed among attacks: {e}"));
            }
            _ => assert!(result.is_err(), "{name} succeeded"),
        }
    }
}

#[tokio::test]
async fn a_plugin_importing_what_the_host_lacks_is_refused_with_the_imports_listed() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["plugin", "check"])
        .arg(root().join("target/plugins/bad_imports.wasm"))
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("evil:plugin/exfiltrate"), "{stderr}");
    assert!(stderr.contains("does not provide"), "{stderr}");
    // wasi:http, which JavaScript toolchains import by default: refused,
    // with the flag that drops it.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["plugin", "check"])
        .arg(root().join("target/plugins/bad_imports_http.wasm"))
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("wasi:http/outgoing-handler@0.3.0"), "{stderr}");
    assert!(stderr.contains("--disable http fetch-event"), "{stderr}");

    // Served, the plugin fails its own pipeline, never the server: the
    // pipeline answers UNAVAILABLE with the reason, the model serves.
    let server = Server::with_config(&format!(
        "[plugins]\ndir = \"{}\"\n[[models]]\nname = \"mlp\"\nbase_path = \"$ROOT/examples/models/mlp\"\n\
         [[pipelines]]\nname = \"p\"\nmodel = \"mlp\"\npreprocess = {{ plugin = \"bad_imports\" }}\n",
        plugin_dir()
    ));
    let mut client = server.predict_client().await;
    let status = client
        .predict(predict_request("p", vec![("x", f32_content(&[1, 64], &values(1, 64)))]))
        .await
        .expect_err("the pipeline of a plugin that cannot link does not serve");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{}", status.message());
    assert!(status.message().contains("pipeline 'p'"), "{}", status.message());
    assert!(status.message().contains("evil:plugin/exfiltrate"), "{}", status.message());
    client
        .predict(predict_request("mlp", vec![("x", f32_content(&[1, 64], &values(1, 64)))]))
        .await
        .expect("the model serves beside the failed pipeline");
    server.wait_for_log("pipeline not served").await;
}

#[test]
fn plugin_check_prints_the_declaration_time_and_peak_memory() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["plugin", "check"])
        .arg(root().join("target/plugins/feature_transform.wasm"))
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    for fragment in [
        "plugin 'feature-transform' 1.0.0 (preprocessor)",
        "raw_dense DT_FLOAT [-1, 13]",
        "ids DT_INT64",
        "peak memory",
        " ms",
        // What a call costs while serving, after the first.
        "ms a call in a kept instance (instances = \"reset\", the best of 5)",
    ] {
        assert!(stdout.contains(fragment), "{fragment:?} not in {stdout}");
    }
}

#[test]
fn plugin_check_stops_an_endless_loop_by_fuel_and_says_so() {
    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join("loop.json");
    let x = vec![0.0f32; 64];
    std::fs::write(&input, serde_json::json!({ "inputs": { "attack": ["loop"], "x": [x] } }).to_string())
        .expect("write input");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["plugin", "check"])
        .arg(root().join("target/plugins/hostile.wasm"))
        .arg("--input")
        .arg(&input)
        // A generous time limit: fuel, not the clock, must stop it.
        .args(["--fuel", "100000", "--timeout_ms", "10000"])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("ran out of fuel (100000 units)"), "{stderr}");
}

/// Runs `sluice plugin check` on a fixture.
fn plugin_check(file: &str) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["plugin", "check"])
        .arg(root().join("target/plugins").join(file))
        .output()
        .expect("run sluice plugin check")
}

#[test]
fn lying_declarations_are_refused_before_anything_is_sized_from_them() {
    plugin_dir();
    let cases = [
        // A negative dimension other than -1 is not a wildcard.
        ("liar_negative_dim.wasm", "dimension 1 = -2"),
        // 2^40 elements with no sample: never allocated as zeros.
        ("liar_huge_input.wasm", "dimension 0 = 1099511627776"),
        // Names are short and cannot carry a line break.
        ("liar_long_name.wasm", "truncated: "),
        ("liar_newline_name.wasm", "liar\\nsluice_forged_metric 1"),
    ];
    for (file, says) in cases {
        let output = plugin_check(file);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{file}: {stderr}");
        assert!(stderr.contains(says), "{file}: {stderr}");
        assert!(stderr.len() < 4096, "{file}: {} bytes of error", stderr.len());
    }
}

#[tokio::test]
async fn a_team_whose_plugin_burns_its_budget_leaves_another_teams_answers_right_and_prompt() {
    let server = std::sync::Arc::new(Server::with_config(&config()));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut attackers = Vec::new();
    for _ in 0..4 {
        let mut client = server.predict_client().await;
        let stop = stop.clone();
        attackers.push(tokio::spawn(async move {
            let mut sent = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = client.predict(attack("loop", 1)).await;
                sent += 1;
            }
            sent
        }));
    }
    let mut client = server.predict_client().await;
    let x = values(9, 64);
    let want = client
        .predict(predict_request("mlp", vec![("x", f32_content(&[1, 64], &x))]))
        .await
        .expect("the model alone")
        .into_inner();
    let mut slowest = Duration::ZERO;
    for _ in 0..20 {
        let started = Instant::now();
        let got = client
            .predict(predict_request("identity", vec![("x", f32_content(&[1, 64], &x))]))
            .await
            .expect("the well-behaved team is answered while the other burns its budget")
            .into_inner();
        slowest = slowest.max(started.elapsed());
        assert_eq!(f32_values(&got.outputs["logits"]), f32_values(&want.outputs["logits"]));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut attacks = 0;
    for attacker in attackers {
        attacks += attacker.await.expect("attacker");
    }
    assert!(attacks > 0, "the attackers ran");
    // A liveness bound, not a benchmark: the hostile team's calls run 50 ms
    // each, at most its share at once; a bystander never waits behind
    // seconds of them.
    assert!(slowest < Duration::from_secs(1), "the well-behaved team waited {slowest:?}");
}

/// `sluice ARGS…` from the repository root: exit code, stdout, stderr.
/// Each mistake an author makes against the example MLP, and what the
/// message must say: what the plugin produces beside what the model takes.
const MISTAKES: &[(&str, &[&str])] = &[
    ("wrong_name", &["produces no 'x'", "features DT_FLOAT [-1, 64]", "takes [x DT_FLOAT [-1, 64]]"]),
    ("wrong_dtype", &["'x' is DT_DOUBLE [-1, 64], but DT_FLOAT [-1, 64] is expected"]),
    ("wrong_shape", &["'x' is DT_FLOAT [-1, 63], but DT_FLOAT [-1, 64] is expected"]),
];

#[test]
fn plugin_check_against_the_model_names_each_mistake_side_by_side() {
    let (code, stdout, stderr) =
        run_sluice(&["plugin", "check", "target/plugins/identity.wasm", "--model", "examples/models/mlp"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("fits model 'mlp' (versions 1, 2) as its preprocessor"), "{stdout}");
    for (mistake, parts) in MISTAKES {
        let file = format!("target/plugins/mistake_{mistake}.wasm");
        let (code, _, stderr) = run_sluice(&["plugin", "check", &file, "--model", "examples/models/mlp"]);
        assert_eq!(code, Some(1), "{mistake} passed plugin check --model");
        for part in *parts {
            assert!(stderr.contains(part), "{mistake}: {part:?} not in {stderr}");
        }
        assert!(stderr.contains("plugin 'mistakes' 0.0.1 does not fit"), "{mistake}: {stderr}");
    }
    // --config --pipeline: the pipeline's model and the stage of the
    // plugin's world, with that plugin's limits.
    let (code, stdout, stderr) = run_sluice(&[
        "plugin",
        "check",
        "target/plugins/topk_labels.wasm",
        "--config",
        "examples/sluice.toml",
        "--pipeline",
        "classify-wasm",
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("fits model 'cnn' (versions 1) as its postprocessor"), "{stdout}");
}

#[test]
fn config_check_loads_every_plugin_and_refuses_one_that_does_not_fit() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (mistake, parts) in MISTAKES {
        let config = dir.path().join(format!("{mistake}.toml"));
        std::fs::write(
            &config,
            format!(
                "[plugins]\ndir = \"{plugins}\"\n[[models]]\nname = \"mlp\"\nbase_path = \"{mlp}\"\n\
                 [[pipelines]]\nname = \"scored\"\nmodel = \"mlp\"\npreprocess = {{ plugin = \"mistake_{mistake}\" }}\n",
                plugins = root().join("target/plugins").display(),
                mlp = root().join("examples/models/mlp").display()
            ),
        )
        .expect("write config");
        let (code, stdout, stderr) = run_sluice(&["config", "check", config.to_str().expect("utf-8")]);
        assert_eq!(code, Some(1), "{mistake}: config check printed {stdout}");
        assert!(stderr.contains("pipeline 'scored' preprocess plugin 'mistake_"), "{mistake}: {stderr}");
        for part in *parts {
            assert!(stderr.contains(part), "{mistake}: {part:?} not in {stderr}");
        }
    }
    let (code, stdout, stderr) = run_sluice(&["config", "check", "examples/sluice.toml"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("pipeline 'recommend' preprocess plugin 'feature_transform': plugin 'feature-transform' 1.0.0"),
        "{stdout}"
    );
    assert!(stdout.contains("fits model 'recommender' versions 1"), "{stdout}");
}

#[test]
fn plugin_check_input_gets_the_checks_a_request_gets() {
    let dir = tempfile::tempdir().expect("temp dir");
    let row = vec![0.0f32; 13];
    let cases = [
        (serde_json::json!({"raw_dense": [[1, 2, 3]], "user_ids": [["a", "b", "c", "d"]]}), "dimension 1 = 3"),
        (serde_json::json!({"raw_dense": [], "user_ids": []}), "rank 2"),
        (serde_json::json!({"raw_dense": [row]}), "missing input 'user_ids'"),
        (
            serde_json::json!({"raw_dense": [row, row], "user_ids": [["a", "b", "c", "d"]]}),
            "1 rows but input 'raw_dense' has 2",
        ),
    ];
    for (i, (inputs, says)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("{i}.json"));
        std::fs::write(&path, serde_json::json!({ "inputs": inputs }).to_string()).expect("write");
        let (code, _, stderr) = run_sluice(&[
            "plugin",
            "check",
            "target/plugins/feature_transform.wasm",
            "--input",
            path.to_str().expect("utf-8"),
        ]);
        assert_eq!(code, Some(1), "case {i} reached the plugin");
        assert!(stderr.contains(says), "case {i}: {says:?} not in {stderr}");
    }
}

#[test]
fn a_scaffolded_plugin_builds_for_webassembly_and_passes_plugin_check_as_generated() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (code, stdout, stderr) = run_sluice(&[
        "plugin",
        "new",
        "scaffolded",
        "--world",
        "preprocessor",
        "--model",
        "examples/models/mlp",
        "--dir",
        dir.path().to_str().expect("utf-8"),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("cargo wasm"), "{stdout}");
    let crate_dir = dir.path().join("scaffolded");
    let lib = std::fs::read_to_string(crate_dir.join("src/lib.rs")).expect("lib.rs");
    assert!(lib.contains("TensorSpec::new(\"x\", DType::F32, &[-1, 64])"), "fitted to the MLP's input:\n{lib}");
    // Built with the repository's target directory, so the SDK and its
    // dependencies are not compiled again.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    for args in [&["test", "--offline"][..], &["wasm", "--offline"][..]] {
        let output = std::process::Command::new(&cargo)
            .args(args)
            .current_dir(&crate_dir)
            .env("CARGO_TARGET_DIR", root().join("target"))
            .output()
            .expect("run cargo");
        assert!(output.status.success(), "cargo {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    }
    let wasm = root().join("target/wasm32-wasip2/release/scaffolded.wasm");
    let (code, stdout, stderr) =
        run_sluice(&["plugin", "check", wasm.to_str().expect("utf-8"), "--model", "examples/models/mlp"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("fits model 'mlp' (versions 1, 2) as its preprocessor"), "{stdout}");
}

/// What one call leaves in a plugin's memory, the next call must not see:
/// under the default instance policy (`reset`) each call starts from the
/// image frozen after warm-up. The same plugin with `instances = "reuse"`
/// shows the test would catch it.
#[tokio::test]
async fn what_one_call_leaves_in_memory_the_next_does_not_see_unless_instances_are_reused() {
    let plugins = tempfile::tempdir().expect("temp dir");
    for name in ["hostile", "kept", "fresh"] {
        std::fs::copy(root().join("target/plugins/hostile.wasm"), plugins.path().join(format!("{name}.wasm")))
            .expect("copy");
    }
    let config = format!(
        r#"
[plugins]
dir = "{dir}"

[plugins.limits.kept]
instances = "reuse"

[plugins.limits.fresh]
instances = "fresh"

{mlp_table}

[[pipelines]]
name = "hostile"
model = "mlp"
preprocess = {{ plugin = "hostile" }}

[[pipelines]]
name = "kept"
model = "mlp"
preprocess = {{ plugin = "kept" }}

[[pipelines]]
name = "fresh"
model = "mlp"
preprocess = {{ plugin = "fresh" }}
"#,
        mlp_table = example_model_table("mlp"),
        dir = plugins.path().display()
    );
    let server = Server::with_config(&config);
    let mut client = server.predict_client().await;
    let call = |pipeline: &str, what: &str| {
        let mut request = attack(what, 1);
        request.model_spec.as_mut().expect("spec").name = pipeline.to_string();
        request
    };
    for round in 0..3 {
        let secret = format!("card 4111-1111-1111-{round:04}");
        client.predict(call("hostile", &format!("remember:{secret}"))).await.expect("remember");
        let recalled = client.predict(call("hostile", "recall")).await.expect_err("recall answers with an error");
        assert_eq!(recalled.code(), Code::InvalidArgument);
        assert!(recalled.message().contains(r#"remembered: """#), "round {round}: {}", recalled.message());
        assert!(!recalled.message().contains("4111"), "round {round}: {}", recalled.message());

        client.predict(call("kept", &format!("remember:{secret}"))).await.expect("remember");
        let recalled = client.predict(call("kept", "recall")).await.expect_err("recall");
        assert!(recalled.message().contains(&secret), "reused instances keep state: {}", recalled.message());
    }
    // Between the calls, the plugin still answers as it should.
    let ok = client.predict(call("hostile", "none")).await.expect("none");
    assert_eq!(dims(&ok.into_inner().outputs["logits"]), vec![1, 10]);
    // A fresh instance per call forgets too, by making one per call.
    client.predict(call("fresh", "remember:secret")).await.expect("remember");
    let recalled = client.predict(call("fresh", "recall")).await.expect_err("recall");
    assert!(recalled.message().contains(r#"remembered: """#), "{}", recalled.message());

    // Seven calls, and the reset pipeline made its instance once (ahead of
    // the first call), as the reused one did; the fresh one made one per call.
    let made = |plugin: &str| format!(r#"sluice_plugin_instances_made_total{{plugin="{plugin}"}}"#);
    assert_eq!(server.metric(&made("hostile")).await, 1.0);
    assert_eq!(server.metric(&made("kept")).await, 1.0);
    assert!(server.metric(&made("fresh")).await >= 2.0);
}

#[tokio::test]
async fn a_plugin_that_drops_rows_fails_as_its_own_bad_output() {
    let server = Server::with_config(&format!(
        "[plugins]\ndir = \"{plugins}\"\n[[models]]\nname = \"mlp\"\nbase_path = \"{mlp}\"\n\
         [[pipelines]]\nname = \"short\"\nmodel = \"mlp\"\npreprocess = {{ plugin = \"mistake_drops_rows\" }}\n",
        plugins = root().join("target/plugins").display(),
        mlp = root().join("examples/models/mlp").display()
    ));
    let mut client = server.predict_client().await;
    let status = client
        .predict(predict_request("short", vec![("raw", f32_content(&[2, 64], &values(5, 128)))]))
        .await
        .expect_err("one row of two came back");
    assert_eq!(status.code(), tonic::Code::Internal, "{status:?}");
    assert!(status.message().contains("returned 1 rows in 'x' for a request of 2"), "{}", status.message());
    // Scored as the plugin's fault, not as a success the server then broke.
    let metrics = server.metrics().await;
    let count = |outcome: &str| {
        metric_value(
            &metrics,
            &format!(r#"sluice_plugin_calls_total{{plugin="mistake_drops_rows",outcome="{outcome}"}}"#),
        )
    };
    assert_eq!((count("bad_output"), count("ok")), (1.0, 0.0), "{metrics}");
}

#[test]
fn plugin_check_input_takes_nan_and_infinities_as_the_rest_api_does() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("nan.json");
    let row: Vec<String> =
        ["NaN", "Infinity", "-Infinity"].into_iter().map(String::from).chain((0..61).map(|_| "0.5".into())).collect();
    std::fs::write(&path, format!("{{\"inputs\": {{\"x\": [[{}]]}}}}", row.join(", "))).expect("write");
    let (code, stdout, stderr) =
        run_sluice(&["plugin", "check", "target/plugins/identity.wasm", "--input", path.to_str().expect("utf-8")]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("row 0 = [NaN,Infinity,-Infinity,0.5"), "{stdout}");
}

#[test]
fn plugin_check_keeps_compiled_code_for_the_next_check_unless_told_not_to() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = dir.path().join("cache");
    let cached = |cache: &std::path::Path| -> usize {
        std::fs::read_dir(cache)
            .map(|entries| entries.flatten().filter(|e| e.path().extension().is_some_and(|x| x == "cwasm")).count())
            .unwrap_or(0)
    };
    let check = |extra: &[&str]| {
        let mut args = vec!["plugin", "check", "target/plugins/identity.wasm"];
        args.extend_from_slice(extra);
        let (code, stdout, stderr) = run_sluice(&args);
        assert_eq!(code, Some(0), "{stdout}{stderr}");
        stdout
    };
    let cache_arg = cache.to_str().expect("utf-8");
    check(&["--cache_dir", cache_arg, "--no_cache"]);
    assert_eq!(cached(&cache), 0, "--no_cache keeps nothing");
    let first = check(&["--cache_dir", cache_arg]);
    assert_eq!(cached(&cache), 1, "a passed check keeps the compiled plugin");
    let second = check(&["--cache_dir", cache_arg]);
    assert_eq!(cached(&cache), 1, "the same bytes, the same entry");
    // The same report either way, but for the load time.
    let without_time = |out: &str| out.lines().skip(1).map(str::to_string).collect::<Vec<_>>();
    assert_eq!(without_time(&first).len(), without_time(&second).len(), "{first}\n{second}");
    // The directory is the server's kind: owner-only.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&cache).expect("cache dir").permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "mode {mode:o}");
}

#[test]
fn a_sample_that_runs_but_answers_wrong_is_named_as_such() {
    let (code, stdout, stderr) = run_sluice(&["plugin", "check", "target/plugins/mistake_sampled_drops_rows.wasm"]);
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(stderr.contains("its sample ran, but its outputs do not match what it declares"), "{stderr}");
    assert!(stderr.contains("returned 1 rows in 'x' for a request of 2"), "{stderr}");
    assert!(!stderr.contains("its sample failed"), "{stderr}");
}

#[test]
fn config_check_checks_the_uploaded_version_the_server_would_start_with() {
    let dir = tempfile::tempdir().expect("temp dir");
    let plugins = dir.path().join("plugins");
    let store = plugins.join("store");
    std::fs::create_dir_all(store.join("blobs")).expect("blobs");
    std::fs::create_dir_all(store.join("manifests")).expect("manifests");
    // Version 0, the file, is scale; the upload activated in the store is
    // identity, which is what the server starts with.
    std::fs::copy(root().join("target/plugins/scale.wasm"), plugins.join("pre.wasm")).expect("copy");
    let upload = std::fs::read(root().join("target/plugins/identity.wasm")).expect("identity");
    let sha = sluice::plugin::store::sha256_hex(&upload);
    std::fs::write(store.join("blobs").join(format!("{sha}.wasm")), &upload).expect("blob");
    let manifest = serde_json::json!({
        "name": "pre", "team": null, "active": 1, "history": [0],
        "versions": [{ "version": 1, "sha256": sha, "size": upload.len(), "declared": "identity",
                       "uploaded_at": 0, "uploaded_by": "ops" }]
    });
    std::fs::write(store.join("manifests/pre.json"), manifest.to_string()).expect("manifest");
    let config = dir.path().join("sluice.toml");
    std::fs::write(
        &config,
        format!(
            "[plugins]\ndir = \"{}\"\n[[models]]\nname = \"mlp\"\nbase_path = \"{}\"\n\
             [[pipelines]]\nname = \"p\"\nmodel = \"mlp\"\npreprocess = {{ plugin = \"pre\" }}\n",
            plugins.display(),
            root().join("examples/models/mlp").display()
        ),
    )
    .expect("config");
    let (code, stdout, stderr) = run_sluice(&["config", "check", config.to_str().expect("utf-8")]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("uploaded version 1, active in the store"), "{stdout}");
    assert!(stdout.contains(&sha[..12]), "the upload's hash, not the file's: {stdout}");
    // A damaged blob is named.
    std::fs::write(
        store.join("blobs").join(format!("{sha}.wasm")),
        std::fs::read(plugins.join("pre.wasm")).expect("scale"),
    )
    .expect("damage");
    let (code, _, stderr) = run_sluice(&["config", "check", config.to_str().expect("utf-8")]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("does not hash to its name") && stderr.contains("uploaded version 1"), "{stderr}");
}
