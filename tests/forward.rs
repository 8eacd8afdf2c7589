//! Inference forwarded to upstream TF Serving instances: here the upstreams
//! are other real sluice processes serving the example models (the real
//! TensorFlow upstream is in `forward_tensorflow.rs`). Answers equal to
//! calling the upstream directly, batching in front, balancing over two
//! upstreams, ejection and return, UNAVAILABLE when none is left, the
//! upstream's errors passed through, and a new upstream version that does
//! not fit the pipeline kept out of AVAILABLE with the reason.

mod common;

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use sluice::proto::tensorflow::serving::GetModelMetadataRequest;
use tonic::Code;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// A sluice serving `args` on gRPC port `port` (to be restarted on it).
fn upstream_on(port: u16, args: &[&str]) -> ServerProcess {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
    command
        .args(["serve", "--host", "127.0.0.1", "--port", &port.to_string(), "--rest_api_port", "0"])
        .args(args)
        .current_dir(root());
    ServerProcess::spawn(command, "upstream", "sluice: serving gRPC on ", Duration::from_secs(120), false)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn mlp_upstream(port: u16) -> ServerProcess {
    let mlp = root().join("examples/models/mlp");
    upstream_on(port, &["--model_name", "mlp", "--model_base_path", mlp.to_str().expect("utf-8")])
}

/// A front sluice forwarding model `mlp` to `endpoints`, with `extra`
/// config appended.
fn front(endpoints: &[u16], model_extra: &str, extra: &str) -> Server {
    let list: Vec<String> = endpoints.iter().map(|p| format!("\"127.0.0.1:{p}\"")).collect();
    Server::with_config(&format!(
        "[[models]]\nname = \"mlp\"\n{model_extra}\n[models.upstream]\nendpoints = [{}]\nhealth_check_ms = 100\n\
         eject_after_failures = 2\n{extra}",
        list.join(", ")
    ))
}

fn request(seed: u64, rows: i64) -> sluice::proto::tensorflow::serving::PredictRequest {
    predict_request("mlp", vec![("x", f32_content(&[rows, 64], &values(seed, 64 * rows as usize)))])
}

async fn direct(port: u16, seed: u64, rows: i64) -> Vec<f32> {
    let mut client = sluice::proto::tensorflow::serving::prediction_service_client::PredictionServiceClient::connect(
        format!("http://127.0.0.1:{port}"),
    )
    .await
    .expect("connect to the upstream");
    f32_values(&client.predict(request(seed, rows)).await.expect("direct predict").into_inner().outputs["logits"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forwarded_answers_equal_the_upstreams_own_and_batches_travel_as_one_call() {
    let port = free_port();
    let _upstream = mlp_upstream(port);
    let server = front(&[port], "batching = { max_batch_size = 16, batch_timeout_micros = 20000 }", "");

    // The upstream's version, signature and answers, as its own.
    let status = server.model_status("mlp").await;
    assert_eq!(status.iter().map(|s| (s.version, s.state)).collect::<Vec<_>>(), vec![(2, 30)]);
    let mut client = server.predict_client().await;
    let metadata = client
        .get_model_metadata(GetModelMetadataRequest {
            model_spec: spec("mlp", None),
            metadata_field: vec!["signature_def".into()],
        })
        .await
        .expect("metadata")
        .into_inner();
    let any = &metadata.metadata["signature_def"];
    let map: sluice::proto::tensorflow::serving::SignatureDefMap =
        prost::Message::decode(any.value.as_slice()).expect("signature map");
    let def = &map.signature_def["serving_default"];
    assert!(def.inputs.contains_key("x") && def.outputs.contains_key("logits"), "{def:?}");
    for seed in 0..3 {
        let response = client.predict(request(seed, 2)).await.expect("forwarded").into_inner();
        assert_eq!(f32_values(&response.outputs["logits"]), direct(port, seed, 2).await);
        let version = response.model_spec.and_then(|s| s.version_choice);
        assert_eq!(version, Some(sluice::proto::tensorflow::serving::model_spec::VersionChoice::Version(2)));
    }

    // Concurrent requests are batched in front: fewer upstream calls than
    // requests, every answer its own rows.
    let before = server
        .metric(&format!(r#"sluice_upstream_requests_total{{model="mlp",upstream="127.0.0.1:{port}",code="OK"}}"#))
        .await;
    let mut tasks = Vec::new();
    for seed in 10..42u64 {
        let mut client = server.predict_client().await;
        tasks.push(tokio::spawn(async move {
            let got = client.predict(request(seed, 1)).await.expect("batched").into_inner();
            (seed, f32_values(&got.outputs["logits"]))
        }));
    }
    for task in tasks {
        let (seed, got) = task.await.expect("task");
        assert_eq!(got, direct(port, seed, 1).await, "request {seed} got its own rows");
    }
    let calls = server
        .metric(&format!(r#"sluice_upstream_requests_total{{model="mlp",upstream="127.0.0.1:{port}",code="OK"}}"#))
        .await
        - before;
    assert!(calls < 32.0, "32 concurrent requests took {calls} upstream calls: batching did not happen");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_upstreams_share_the_load_and_one_that_dies_is_ejected_without_a_failed_request() {
    let (port_a, port_b) = (free_port(), free_port());
    let _a = mlp_upstream(port_a);
    let b = mlp_upstream(port_b);
    let server = front(&[port_a, port_b], "", "");
    let ok =
        |port: u16| format!(r#"sluice_upstream_requests_total{{model="mlp",upstream="127.0.0.1:{port}",code="OK"}}"#);
    let mut client = server.predict_client().await;
    for seed in 0..40 {
        client.predict(request(seed, 1)).await.expect("forwarded");
    }
    assert!(server.metric(&ok(port_a)).await > 0.0 && server.metric(&ok(port_b)).await > 0.0, "both take calls");

    // B dies: calls that cannot reach it go to A; none fails.
    drop(b);
    for seed in 0..40 {
        client.predict(request(seed, 1)).await.expect("no request fails while B is down");
    }
    server
        .wait_for_metric(
            &format!(r#"sluice_upstream_ejections_total{{model="mlp",upstream="127.0.0.1:{port_b}"}}"#),
            1.0,
        )
        .await;
    assert_eq!(
        server.metric(&format!(r#"sluice_upstream_healthy{{model="mlp",upstream="127.0.0.1:{port_b}"}}"#)).await,
        0.0
    );

    // B is back on its port: one passing health check returns it.
    let _b = mlp_upstream(port_b);
    server
        .wait_for_metric(&format!(r#"sluice_upstream_healthy{{model="mlp",upstream="127.0.0.1:{port_b}"}}"#), 1.0)
        .await;
    let before = server.metric(&ok(port_b)).await;
    for seed in 0..40 {
        client.predict(request(seed, 1)).await.expect("forwarded");
    }
    assert!(server.metric(&ok(port_b)).await > before, "B takes calls again");
}

#[tokio::test]
async fn with_no_upstream_left_calls_are_unavailable_naming_them() {
    let port = free_port();
    let upstream = mlp_upstream(port);
    let server = front(&[port], "", "");
    let mut client = server.predict_client().await;
    client.predict(request(1, 1)).await.expect("forwarded");

    drop(upstream);
    let err = client.predict(request(1, 1)).await.expect_err("no upstream");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains(&format!("127.0.0.1:{port}")), "{}", err.message());
}

#[tokio::test]
async fn the_upstreams_refusals_pass_through_with_its_words_and_its_address() {
    // The upstream runs pipeline `recommend-raw` (the feature_transform
    // plugin, then the recommender); the plugin refuses a NaN.
    let config = tempfile::NamedTempFile::new().expect("config");
    std::fs::write(
        config.path(),
        format!(
            "[plugins]\ndir = \"{plugins}\"\n[[models]]\nname = \"recommender\"\nbase_path = \"{model}\"\n\
             [[pipelines]]\nname = \"recommend-raw\"\nmodel = \"recommender\"\n\
             preprocess = {{ plugin = \"feature_transform\" }}\n",
            plugins = root().join("target/plugins").display(),
            model = root().join("examples/models/recommender").display(),
        ),
    )
    .expect("write");
    let port = free_port();
    let _upstream = upstream_on(port, &["--model_config_file", config.path().to_str().expect("utf-8")]);
    let server = Server::with_config(&format!(
        "[[models]]\nname = \"ranker\"\n[models.upstream]\nendpoints = [\"127.0.0.1:{port}\"]\n\
         model_name = \"recommend-raw\"\n"
    ));
    let mut raw = values(2, 13);
    let users = ["u1", "u2", "u3", "u4"];
    let ask = |raw: &[f32]| {
        predict_request(
            "ranker",
            vec![("raw_dense", f32_content(&[1, 13], raw)), ("user_ids", string_tensor(&[1, 4], &users))],
        )
    };
    let mut client = server.predict_client().await;
    client.predict(ask(&raw)).await.expect("forwarded through the upstream's pipeline");
    raw[3] = f32::NAN;
    let err = client.predict(ask(&raw)).await.expect_err("NaN");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains(&format!("upstream 127.0.0.1:{port}")), "{}", err.message());
    assert!(err.message().contains("'recommend-raw'"), "{}", err.message());
}

#[tokio::test]
async fn an_upstream_version_that_does_not_fit_the_pipeline_stays_out_with_the_reason() {
    // The upstream serves every version of a repository; version 1 is the
    // MLP, version 2 (added later) a CNN with other inputs.
    let repository = tempfile::tempdir().expect("repository");
    let copy = |version: &str, model: &Path| {
        std::fs::create_dir_all(repository.path().join(version)).expect("version dir");
        std::fs::copy(model, repository.path().join(version).join("model.onnx")).expect("copy model");
    };
    copy("1", &example_model("mlp", 1));
    let upstream_config = tempfile::NamedTempFile::new().expect("config");
    std::fs::write(
        upstream_config.path(),
        format!(
            "[[models]]\nname = \"mlp\"\nbase_path = \"{}\"\nversion_policy = \"all\"\n",
            repository.path().display()
        ),
    )
    .expect("write");
    let port = free_port();
    let _upstream = upstream_on(port, &["--model_config_file", upstream_config.path().to_str().expect("utf-8")]);
    let plugins = root().join("target/plugins");
    let server = front(
        &[port],
        "version_policy = \"all\"",
        &format!(
            "[plugins]\ndir = \"{}\"\n[[pipelines]]\nname = \"scored\"\nmodel = \"mlp\"\n\
             preprocess = {{ plugin = \"identity\" }}\n",
            plugins.display()
        ),
    );
    let mut scored = request(3, 1);
    scored.model_spec = spec("scored", None);
    let answer = server.predict_client().await.predict(scored.clone()).await.expect("scored").into_inner();
    assert_eq!(f32_values(&answer.outputs["logits"]), direct(port, 3, 1).await, "identity plugin, then the upstream");

    copy("2", &example_model("cnn", 1));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let error = loop {
        let status = server.model_status("mlp").await;
        if let Some(two) = status.iter().find(|s| s.version == 2 && s.state == 50) {
            break two.status.clone().expect("status").error_message;
        }
        assert!(std::time::Instant::now() < deadline, "version 2 never failed: {status:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(error.contains("does not fit pipeline 'scored'"), "{error}");
    server.predict_client().await.predict(scored).await.expect("version 1 keeps serving the pipeline");
}
