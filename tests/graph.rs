//! Graph pipelines through the real server: the three examples of
//! `examples/sluice.toml` (a ranking cascade, an ensemble, a two-tower)
//! answer as their models run one after another by ONNX Runtime's Python
//! API (`tests/graph/reference.py`); two pipelines sharing a model share
//! its batches; a branch not taken runs no model; a failing step fails
//! its request, named; a cascade under load survives a hot swap of its
//! model; and `sluice config check` names what does not fit.

mod common;

use std::time::{Duration, Instant};

use common::fixtures::copy_dir;
use common::*;
use serde_json::{json, Value};
use sluice::proto::tensorflow::TensorProto;

/// Runs `example` of `tests/graph/reference.py` on `inputs` (name → dtype,
/// shape, values) and returns its outputs (name → shape, values).
fn python_reference(example: &str, inputs: &[(&str, &str, Vec<i64>, Vec<f64>)]) -> Value {
    use std::io::Write;
    let request = json!({
        "example": example,
        "inputs": inputs
            .iter()
            .map(|(name, dtype, shape, values)| (name.to_string(), json!({"dtype": dtype, "shape": shape, "values": values})))
            .collect::<serde_json::Map<String, Value>>(),
    });
    let mut child = std::process::Command::new(root().join(".cache/tf-venv/bin/python"))
        .arg(root().join("tests/graph/reference.py"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the tf-venv Python (run scripts/setup)");
    child.stdin.take().expect("stdin").write_all(request.to_string().as_bytes()).expect("write the request");
    let output = child.wait_with_output().expect("reference run");
    assert!(output.status.success(), "reference.py: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("reference JSON")
}

fn floats(value: &Value) -> Vec<f32> {
    value["values"].as_array().expect("values").iter().map(|v| v.as_f64().expect("number") as f32).collect()
}

fn close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-6, "{what}[{i}]: sluice {g}, ONNX Runtime in Python {w}");
    }
}

async fn predict(
    server: &Server,
    name: &str,
    inputs: Vec<(&str, TensorProto)>,
) -> Result<std::collections::HashMap<String, TensorProto>, tonic::Status> {
    let response = server.predict_client().await.predict(predict_request(name, inputs)).await?;
    Ok(response.into_inner().outputs)
}

fn as_f64(values: &[f32]) -> Vec<f64> {
    values.iter().map(|&v| v as f64).collect()
}

#[tokio::test]
async fn the_examples_answer_as_their_models_run_one_after_another_in_python() {
    let server = Server::start(&["--model_config_file", "examples/sluice.toml"]);
    for (round, candidates) in [(1u64, 40usize), (2, 5), (3, 8)] {
        // The cascade: coarse over every candidate, the best 8 to the fine
        // ranker, re-ranked by it (5 candidates: fewer than k).
        let features = values(round * 10, candidates * 16);
        let item_ids: Vec<i64> = (0..candidates as i64).map(|i| 1000 + i * 7).collect();
        let outputs = predict(
            &server,
            "rank",
            vec![
                ("candidates", f32_content(&[candidates as i64, 16], &features)),
                ("item_ids", i64_content(&[candidates as i64], &item_ids)),
            ],
        )
        .await
        .expect("rank");
        let want = python_reference(
            "rank",
            &[
                ("candidates", "float32", vec![candidates as i64, 16], as_f64(&features)),
                ("item_ids", "int64", vec![candidates as i64], item_ids.iter().map(|&i| i as f64).collect()),
            ],
        );
        let items: Vec<i64> = match &outputs["items"] {
            t if t.tensor_content.is_empty() => t.int64_val.clone(),
            t => bytemuck::pod_collect_to_vec(&t.tensor_content),
        };
        let want_items: Vec<i64> =
            want["items"]["values"].as_array().expect("items").iter().map(|v| v.as_i64().expect("id")).collect();
        assert_eq!(items, want_items, "round {round}: the cascade's items");
        assert_eq!(items.len(), candidates.min(8));
        close("rank scores", &f32_values(&outputs["scores"]), &floats(&want["scores"]));

        // The ensemble: both rankers at once, blended 0.3 / 0.7.
        let outputs =
            predict(&server, "ensemble", vec![("features", f32_content(&[candidates as i64, 16], &features))])
                .await
                .expect("ensemble");
        let want =
            python_reference("ensemble", &[("features", "float32", vec![candidates as i64, 16], as_f64(&features))]);
        assert_eq!(dims(&outputs["score"]), vec![candidates as i64, 1]);
        close("ensemble score", &f32_values(&outputs["score"]), &floats(&want["score"]));

        // The two-tower: one user, every candidate item, dot products.
        let user = values(round * 10 + 1, 8);
        let items = values(round * 10 + 2, candidates * 12);
        let outputs = predict(
            &server,
            "two_tower",
            vec![("user", f32_content(&[1, 8], &user)), ("item", f32_content(&[candidates as i64, 12], &items))],
        )
        .await
        .expect("two_tower");
        let want = python_reference(
            "two_tower",
            &[
                ("user", "float32", vec![1, 8], as_f64(&user)),
                ("item", "float32", vec![candidates as i64, 12], as_f64(&items)),
            ],
        );
        assert_eq!(dims(&outputs["scores"]), vec![candidates as i64]);
        close("two_tower scores", &f32_values(&outputs["scores"]), &floats(&want["scores"]));
    }
    // Metadata shows the graph's own signature.
    let defs = server.signature_def_map("rank").await;
    let def = &defs.signature_def["serving_default"];
    let mut inputs: Vec<&String> = def.inputs.keys().collect();
    inputs.sort();
    assert_eq!(inputs, ["candidates", "item_ids"]);
    let mut outputs: Vec<&String> = def.outputs.keys().collect();
    outputs.sort();
    assert_eq!(outputs, ["items", "scores"]);
    // Bad input is refused as at any pipeline: rows that disagree, a
    // missing input, a two-user request to the two-tower.
    let refused = predict(
        &server,
        "rank",
        vec![("candidates", f32_content(&[3, 16], &values(9, 48))), ("item_ids", i64_content(&[2], &[1, 2]))],
    )
    .await
    .expect_err("rows disagree");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("step 'shortlist'") && refused.message().contains("has 2 rows"), "{refused:?}");
    let refused = predict(&server, "rank", vec![("candidates", f32_content(&[3, 16], &values(9, 48)))])
        .await
        .expect_err("missing input");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("missing input 'item_ids'"), "{refused:?}");
    let refused = predict(
        &server,
        "two_tower",
        vec![("user", f32_content(&[2, 8], &values(1, 16))), ("item", f32_content(&[3, 12], &values(2, 36)))],
    )
    .await
    .expect_err("two users");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("'user'"), "{refused:?}");
}

const SHARED: &str = r#"
[[models]]
name = "ranker_coarse"
base_path = "$ROOT/examples/models/ranker_coarse"
batching = { max_batch_size = 4096, batch_timeout_micros = 20000 }

[[models]]
name = "ranker_fine"
base_path = "$ROOT/examples/models/ranker_fine"

[[pipelines]]
name = "ensemble"
model = "ranker_fine"
inputs = ["features"]
outputs = ["score"]
[[pipelines.steps]]
name = "coarse"
model = "ranker_coarse"
[[pipelines.steps]]
name = "fine"
model = "ranker_fine"
[[pipelines.steps]]
name = "blend"
blend = { weights = { coarse = 0.5, fine = 0.5 } }
inputs = { coarse = "coarse.score", fine = "fine.score" }
outputs = { blended = "score" }

# Per request, the client picks: the fine ranker when `premium` is true,
# else the coarse one; the other branch runs nothing.
[[pipelines]]
name = "switch"
model = "ranker_fine"
inputs = ["features", "premium"]
outputs = ["score"]
[[pipelines.steps]]
name = "fine"
model = "ranker_fine"
when = "premium"
outputs = { score = "score" }
[[pipelines.steps]]
name = "coarse"
model = "ranker_coarse"
unless = "premium"
outputs = { score = "score" }

# Rows picked by the client's own indexes: a bad index fails the step.
[[pipelines]]
name = "pick"
model = "ranker_coarse"
inputs = [{ name = "features", dtype = "float32", shape = [-1, 16] }, { name = "rows", dtype = "int64", shape = [-1] }]
outputs = ["score"]
[[pipelines.steps]]
name = "gather"
gather = {}
inputs = { values = "features", indices = "rows" }
[[pipelines.steps]]
name = "coarse"
model = "ranker_coarse"
inputs = { features = "gather.values" }
outputs = { score = "score" }
"#;

#[tokio::test]
async fn two_pipelines_sharing_a_model_share_its_batches() {
    let server = Server::with_config(SHARED);
    let features = values(7, 4 * 16);
    // The ensemble and direct callers of ranker_coarse at once: the
    // coarse model's 20 ms batch timeout gathers rows of both.
    let mut calls = Vec::new();
    for i in 0..24 {
        let server = &server;
        let features = features.clone();
        calls.push(async move {
            let name = if i % 2 == 0 { "ensemble" } else { "ranker_coarse" };
            predict(server, name, vec![("features", f32_content(&[4, 16], &features))]).await.expect("answered")
        });
    }
    let answers = futures::future::join_all(calls).await;
    let direct = f32_values(&answers[1]["score"]);
    let fine =
        predict(&server, "ranker_fine", vec![("features", f32_content(&[4, 16], &features))]).await.expect("fine");
    let blended: Vec<f32> = direct.iter().zip(f32_values(&fine["score"])).map(|(c, f)| c * 0.5 + f * 0.5).collect();
    close("ensemble", &f32_values(&answers[0]["score"]), &blended);
    let shared = server.metric("sluice_shared_batches_total{model=\"ranker_coarse\",version=\"1\"}").await;
    assert!(shared >= 1.0, "no batch of ranker_coarse held rows of both the ensemble and direct calls");
    // The fine ranker is not batched: its requests never share.
    assert_eq!(server.metric("sluice_shared_batches_total{model=\"ranker_fine\",version=\"1\"}").await, 0.0);
}

#[tokio::test]
async fn a_branch_not_taken_runs_no_model_and_a_failing_step_is_named() {
    let server = Server::with_config(SHARED);
    let features = values(3, 2 * 16);
    let runs = |model: &str| format!("sluice_model_runs_total{{model=\"{model}\",version=\"1\"}}");
    let premium = |on: bool| TensorProto {
        dtype: sluice::proto::tensorflow::DataType::DtBool as i32,
        bool_val: vec![on],
        ..Default::default()
    };
    let direct_coarse =
        predict(&server, "ranker_coarse", vec![("features", f32_content(&[2, 16], &features))]).await.expect("coarse");
    let (coarse_before, fine_before) =
        (server.metric(&runs("ranker_coarse")).await, server.metric(&runs("ranker_fine")).await);
    for _ in 0..5 {
        let outputs = predict(
            &server,
            "switch",
            vec![("features", f32_content(&[2, 16], &features)), ("premium", premium(false))],
        )
        .await
        .expect("switch, coarse side");
        close("switch (coarse)", &f32_values(&outputs["score"]), &f32_values(&direct_coarse["score"]));
    }
    assert_eq!(server.metric(&runs("ranker_fine")).await, fine_before, "the branch not taken ran its model");
    assert_eq!(server.metric(&runs("ranker_coarse")).await, coarse_before + 5.0);
    let skipped = "sluice_graph_steps_total{pipeline=\"switch\",step=\"fine\",outcome=\"skipped\"}";
    assert_eq!(server.metric(skipped).await, 5.0);
    let direct_fine =
        predict(&server, "ranker_fine", vec![("features", f32_content(&[2, 16], &features))]).await.expect("fine");
    let outputs =
        predict(&server, "switch", vec![("features", f32_content(&[2, 16], &features)), ("premium", premium(true))])
            .await
            .expect("switch, fine side");
    close("switch (fine)", &f32_values(&outputs["score"]), &f32_values(&direct_fine["score"]));

    // A step that fails fails the request, naming the step and why.
    let refused = predict(
        &server,
        "pick",
        vec![("features", f32_content(&[2, 16], &features)), ("rows", i64_content(&[2], &[1, 99]))],
    )
    .await
    .expect_err("row 99 of 2");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("step 'gather'") && refused.message().contains("row 99 of 'values'"),
        "{refused:?}"
    );
    let failed = "sluice_graph_steps_total{pipeline=\"pick\",step=\"gather\",outcome=\"failed\"}";
    assert_eq!(server.metric(failed).await, 1.0);
    // A negative index too; then the pipeline serves on.
    let refused = predict(
        &server,
        "pick",
        vec![("features", f32_content(&[2, 16], &features)), ("rows", i64_content(&[1], &[-1]))],
    )
    .await
    .expect_err("negative");
    assert!(refused.message().contains("index -1 is negative"), "{refused:?}");
    let outputs = predict(
        &server,
        "pick",
        vec![("features", f32_content(&[2, 16], &features)), ("rows", i64_content(&[3], &[1, 0, 1]))],
    )
    .await
    .expect("picked");
    let direct = f32_values(&direct_coarse["score"]);
    close("pick", &f32_values(&outputs["score"]), &[direct[1], direct[0], direct[1]]);
}

#[tokio::test]
async fn a_cascade_under_load_fails_no_request_while_both_its_models_are_swapped() {
    let repo = tempfile::tempdir().expect("temp dir");
    let fine = repo.path().join("ranker_fine");
    let coarse = repo.path().join("ranker_coarse");
    copy_dir(&root().join("examples/models/ranker_fine/1"), &fine.join("1"));
    copy_dir(&root().join("examples/models/ranker_coarse/1"), &coarse.join("1"));
    let config = format!(
        r#"
[lifecycle]
file_system_poll_wait_seconds = 1

[[models]]
name = "ranker_coarse"
base_path = "{}"
batching = {{ max_batch_size = 4096, batch_timeout_micros = 0 }}

[[models]]
name = "ranker_fine"
base_path = "{}"
batching = {{ max_batch_size = 1024, batch_timeout_micros = 0 }}

[[pipelines]]
name = "rank"
model = "ranker_fine"
inputs = ["candidates"]
outputs = ["scores"]
[[pipelines.steps]]
name = "coarse"
model = "ranker_coarse"
inputs = {{ features = "candidates" }}
[[pipelines.steps]]
name = "shortlist"
top_rows = {{ k = 4, by = "score" }}
inputs = {{ score = "coarse.score", features = "candidates" }}
[[pipelines.steps]]
name = "fine"
model = "ranker_fine"
inputs = {{ features = "shortlist.features" }}
outputs = {{ score = "scores" }}
"#,
        coarse.display(),
        fine.display()
    );
    let server = Server::with_config(&config);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for c in 0..4u64 {
        let (addr, stop) = (server.grpc, stop.clone());
        clients.push(tokio::spawn(async move {
            let mut client =
                sluice::proto::tensorflow::serving::prediction_service_client::PredictionServiceClient::connect(
                    format!("http://{addr}"),
                )
                .await
                .expect("connect");
            let (mut ok, mut failed) = (0u64, Vec::new());
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                let features = values(c * 1000 + i, 20 * 16);
                let request = predict_request("rank", vec![("candidates", f32_content(&[20, 16], &features))]);
                match client.predict(request).await {
                    Ok(answer) => {
                        assert_eq!(dims(&answer.into_inner().outputs["scores"]), vec![4, 1]);
                        ok += 1;
                    }
                    Err(status) => failed.push(status.to_string()),
                }
            }
            (ok, failed)
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The pipeline's own model (the version requests choose) and a step
    // model resolved per request, both replaced at once.
    copy_dir(&root().join("examples/models/ranker_fine/1"), &fine.join("2"));
    copy_dir(&root().join("examples/models/ranker_coarse/1"), &coarse.join("2"));
    let started = Instant::now();
    for model in ["ranker_fine", "ranker_coarse"] {
        loop {
            let status = server.model_status(model).await;
            let state = |v: i64| status.iter().find(|s| s.version == v).map(|s| s.state);
            // AVAILABLE is 30, END is 50 (TF Serving's ModelVersionStatus.State).
            if state(2) == Some(30) && state(1) == Some(50) {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(60), "{model} 2 did not replace 1: {status:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut total = 0;
    for client in clients {
        let (ok, failed) = client.await.expect("client");
        assert!(failed.is_empty(), "failed during the swap: {failed:?}");
        total += ok;
    }
    assert!(total > 0, "no request was answered");
    for model in ["ranker_fine", "ranker_coarse"] {
        let v2_runs = server.metric(&format!("sluice_model_runs_total{{model=\"{model}\",version=\"2\"}}")).await;
        assert!(v2_runs >= 1.0, "the cascade never reached {model} version 2");
    }
}

/// `sluice config check` on a graph `steps` over the two rankers.
fn check_graph(inputs: &str, outputs: &str, steps: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("sluice.toml");
    let text = format!(
        r#"
[[models]]
name = "ranker_coarse"
base_path = "{root}/examples/models/ranker_coarse"
[[models]]
name = "ranker_fine"
base_path = "{root}/examples/models/ranker_fine"
[[models]]
name = "user_tower"
base_path = "{root}/examples/models/user_tower"

[[pipelines]]
name = "g"
model = "ranker_fine"
inputs = {inputs}
outputs = {outputs}
{steps}
"#,
        root = root().display()
    );
    std::fs::write(&path, text).expect("write");
    let (code, stdout, stderr) = run_sluice(&["config", "check", path.to_str().expect("path")]);
    (code, format!("{stdout}{stderr}"))
}

#[test]
fn config_check_names_cycles_unknown_tensors_and_misfits() {
    let fine = "[[pipelines.steps]]\nname = \"fine\"\nmodel = \"ranker_fine\"\n";
    let (code, out) = check_graph(
        r#"["x"]"#,
        r#"["fine.score"]"#,
        &format!(
            "{fine}inputs = {{ features = \"coarse.score\" }}\n[[pipelines.steps]]\nname = \"coarse\"\nmodel = \"ranker_coarse\"\ninputs = {{ features = \"fine.score\" }}\n"
        ),
    );
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("cycle") && out.contains("\"fine\"") && out.contains("\"coarse\""), "{out}");

    let (code, out) = check_graph(r#"["features"]"#, r#"["fine.scor"]"#, fine);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("'fine.scor'") && out.contains("nothing makes"), "{out}");

    // The fine ranker fed the user tower's 16-wide embedding where it
    // takes 16 features: fits; fed the 8-wide user features: does not.
    let misfit = format!(
        "[[pipelines.steps]]\nname = \"user\"\nmodel = \"user_tower\"\n{fine}inputs = {{ features = \"user\" }}\n"
    );
    let (code, out) = check_graph(r#"["user"]"#, r#"["fine.score"]"#, &misfit);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("'user'") && (out.contains("[-1, 8]") || out.contains("16")), "{out}");

    let blend_misfit = format!(
        "[[pipelines.steps]]\nname = \"user\"\nmodel = \"user_tower\"\n{fine}[[pipelines.steps]]\nname = \"b\"\nblend = {{ weights = {{ a = 0.5, b = 0.5 }} }}\ninputs = {{ a = \"user.embedding\", b = \"fine.score\" }}\n"
    );
    let (code, out) = check_graph(r#"["user", "features"]"#, r#"["b.blended"]"#, &blend_misfit);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("step 'b'") && out.contains("one shape"), "{out}");

    let (code, out) = check_graph(r#"["features"]"#, r#"["fine.score"]"#, fine);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("pipeline 'g': steps fine (model ranker_fine)"), "{out}");
}

#[tokio::test]
async fn a_model_steps_share_of_its_models_admission_is_enforced_and_named() {
    // ranker_coarse admits one request at once; a graph that runs it twice
    // at once (its batch timeout holds the first run) is refused the
    // second place, naming the step and the model's queue.
    let server = Server::with_config(
        r#"
[[models]]
name = "ranker_coarse"
base_path = "$ROOT/examples/models/ranker_coarse"
max_in_flight = 1
batching = { max_batch_size = 64, batch_timeout_micros = 50000 }

[[pipelines]]
name = "twice"
model = "ranker_coarse"
inputs = ["features"]
outputs = ["a.score", "b.score"]
[[pipelines.steps]]
name = "a"
model = "ranker_coarse"
[[pipelines.steps]]
name = "b"
model = "ranker_coarse"
"#,
    );
    let features = values(5, 16);
    let refused = predict(&server, "twice", vec![("features", f32_content(&[1, 16], &features))])
        .await
        .expect_err("one place for two steps");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
    let message = refused.message();
    assert!(
        message.contains("ranker_coarse") && (message.contains("step 'a'") || message.contains("step 'b'")),
        "{message}"
    );
    // The model serves its direct callers on.
    predict(&server, "ranker_coarse", vec![("features", f32_content(&[1, 16], &features))]).await.expect("direct");
}

#[tokio::test]
async fn a_plugin_step_feeds_a_model_and_is_checked_like_any_step() {
    // The `scale` plugin (doubles `x`) before the MLP, beside the MLP on
    // the raw rows: one request, both answers.
    let dir = common::fixtures::ConfigDir::new(
        &[("scale", "scale")],
        r#"
[plugins]
dir = "$PLUGINS"

[[models]]
name = "mlp"
base_path = "$ROOT/examples/models/mlp"
version_policy = "all"

[[pipelines]]
name = "scaled"
model = "mlp"
inputs = ["x"]
outputs = ["raw", "doubled"]
[[pipelines.steps]]
name = "double"
plugin = "scale"
[[pipelines.steps]]
name = "on_doubled"
model = "mlp"
version = 1
inputs = { x = "double.x" }
outputs = { logits = "doubled" }
# The version the request chose (the latest, 2, when it names none).
[[pipelines.steps]]
name = "on_raw"
model = "mlp"
outputs = { logits = "raw" }
"#,
    );
    let server = Server::serving(&dir);
    let x = values(11, 2 * 64);
    let doubled_x: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
    let outputs = predict(&server, "scaled", vec![("x", f32_content(&[2, 64], &x))]).await.expect("scaled");
    let (_, raw) = reference(&example_model("mlp", 2), vec![("x", RefInput::F32(vec![2, 64], x.clone()))], "logits");
    let (_, doubled) =
        reference(&example_model("mlp", 1), vec![("x", RefInput::F32(vec![2, 64], doubled_x))], "logits");
    close("raw", &f32_values(&outputs["raw"]), &raw);
    close("doubled", &f32_values(&outputs["doubled"]), &doubled);
    // The step's own queue is counted under the pipeline and the step.
    assert!(server.metrics().await.contains("queue=\"scaled/double\""));
    let ran = "sluice_graph_steps_total{pipeline=\"scaled\",step=\"double\",outcome=\"ran\"}";
    assert_eq!(server.metric(ran).await, 1.0);

    // A plugin whose outputs do not fit what reads them stops the start,
    // named: `scale` makes `x` [-1, 64], the recommender reads `dense`
    // [-1, 13].
    let misfit = common::fixtures::ConfigDir::new(
        &[("scale", "scale")],
        r#"
[plugins]
dir = "$PLUGINS"

[[models]]
name = "recommender"
base_path = "$ROOT/examples/models/recommender"

[[pipelines]]
name = "wrong"
model = "recommender"
inputs = ["x", "ids"]
outputs = ["model.score"]
[[pipelines.steps]]
name = "double"
plugin = "scale"
[[pipelines.steps]]
name = "model"
model = "recommender"
inputs = { dense = "double.x" }
"#,
    );
    let (code, stdout, stderr) = run_sluice(&["config", "check", misfit.config().to_str().expect("utf-8 path")]);
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(stderr.contains("step 'model'") && stderr.contains("input 'dense' reads 'double.x'"), "{stderr}");
}
