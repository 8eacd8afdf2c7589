//! Where a request's inference runs, through the real server: a model
//! measured cheaper than `server.inline_inference_micros` runs on the
//! network thread that decoded the request, a dearer one only ever on its
//! inference threads, and both answer exactly what ONNX Runtime computes.
//! And with every core busy running a model, the server still answers its
//! health probe and refuses the excess with RESOURCE_EXHAUSTED.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::fixtures::example_model_table;
use common::*;
use tonic::Code;

const TOLERANCE: f32 = 1e-5;

fn runs(model: &str) -> String {
    format!(r#"sluice_model_runs_total{{model="{model}",version="1"}}"#)
}

fn inline_runs(model: &str) -> String {
    format!(r#"sluice_inline_runs_total{{model="{model}",version="1"}}"#)
}

fn cnn_image(rows: i64, seed: u64) -> Vec<f32> {
    values(seed, rows as usize * 3 * 32 * 32)
}

#[tokio::test]
async fn cheap_batches_run_inline_expensive_ones_never_and_both_answer_what_onnx_runtime_computes() {
    // The MLP runs in microseconds, the CNN at 16 rows in milliseconds:
    // both far from the 200 µs budget, on any machine.
    let server = Server::with_config(
        r#"
[server]
inline_inference_micros = 200

[[models]]
name = "mlp"
base_path = "$ROOT/examples/models/mlp"
version_policy = { specific = [1] }
onnx = { sessions = 1, intra_op_threads = 1 }

[[models]]
name = "mlp_auto"
base_path = "$ROOT/examples/models/mlp"
version_policy = { specific = [1] }
onnx = { sessions = 1, intra_op_threads = 1 }
batching = { mode = "auto", max_batch_size = 8 }

[[models]]
name = "cnn"
base_path = "$ROOT/examples/models/cnn"
onnx = { sessions = 1, intra_op_threads = 1 }
"#,
    );
    let mut client = server.predict_client().await;
    let mlp = example_model("mlp", 1);
    let inputs: Vec<Vec<f32>> = (0..4).map(|seed| values(seed, 64)).collect();
    let wanted: Vec<Vec<f32>> = inputs
        .iter()
        .map(|x| reference(&mlp, vec![("x", RefInput::F32(vec![1, 64], x.clone()))], "logits").1)
        .collect();
    let before = server.metrics().await;
    const CALLS: usize = 200;
    for model in ["mlp", "mlp_auto"] {
        for i in 0..CALLS {
            let x = &inputs[i % inputs.len()];
            let response =
                client.predict(predict_request(model, vec![("x", f32_content(&[1, 64], x))])).await.expect(model);
            let logits = &response.get_ref().outputs["logits"];
            assert_eq!(dims(logits), vec![1, 10]);
            assert_close(&f32_values(logits), &wanted[i % inputs.len()], TOLERANCE, &format!("{model} call {i}"));
        }
    }
    let cnn = example_model("cnn", 1);
    for seed in 0..20u64 {
        let image = cnn_image(16, seed);
        let response = client
            .predict(predict_request("cnn", vec![("image", f32_content(&[16, 3, 32, 32], &image))]))
            .await
            .expect("cnn");
        let (_, want) = reference(&cnn, vec![("image", RefInput::F32(vec![16, 3, 32, 32], image))], "logits");
        assert_close(&f32_values(&response.get_ref().outputs["logits"]), &want, TOLERANCE, &format!("cnn {seed}"));
    }
    let after = server.metrics().await;
    let moved = |series: &str| metric_value(&after, series) - metric_value(&before, series);
    for model in ["mlp", "mlp_auto"] {
        // Every call ran once, inline or not; the first ones, before the
        // size was measured, on the inference thread.
        assert_eq!(moved(&runs(model)), CALLS as f64, "{model}");
        let inline = moved(&inline_runs(model));
        assert!(inline > 0.0 && inline <= CALLS as f64, "{model}: {inline} of {CALLS} calls ran inline");
    }
    // The expensive model: every run on its inference thread.
    assert_eq!(moved(&runs("cnn")), 20.0);
    assert_eq!(metric_value(&after, &inline_runs("cnn")), 0.0, "a CNN batch never runs on a network thread");
}

#[tokio::test]
async fn inline_runs_are_off_at_a_zero_budget() {
    let server = Server::with_config(&format!("[server]\ninline_inference_micros = 0\n{}", example_model_table("mlp")));
    let mut client = server.predict_client().await;
    for seed in 0..50 {
        client
            .predict(predict_request("mlp", vec![("x", f32_content(&[1, 64], &values(seed, 64)))]))
            .await
            .expect("mlp");
    }
    let text = server.metrics().await;
    assert!(metric_value(&text, r#"sluice_model_runs_total{model="mlp",version="2"}"#) >= 50.0, "{text}");
    assert_eq!(metric_value(&text, r#"sluice_inline_runs_total{model="mlp",version="2"}"#), 0.0);
}

#[tokio::test]
async fn a_cpu_saturated_by_inference_still_answers_health_and_refuses_the_excess() {
    // Two sessions keep both cores busy; four requests admitted at once.
    let server = Arc::new(Server::with_config(
        r#"
[[models]]
name = "cnn"
base_path = "$ROOT/examples/models/cnn"
max_in_flight = 4
onnx = { sessions = 2, intra_op_threads = 1 }
"#,
    ));
    let until = Instant::now() + Duration::from_secs(3);
    let mut flood = Vec::new();
    for task in 0..32u64 {
        let mut client = server.predict_client().await;
        flood.push(tokio::spawn(async move {
            let (mut answered, mut refused, mut pushed_back) = (0usize, 0usize, 0usize);
            let mut seed = task * 1000;
            while Instant::now() < until {
                seed += 1;
                let image = cnn_image(8, seed);
                let request = predict_request("cnn", vec![("image", f32_content(&[8, 3, 32, 32], &image))]);
                // A deadline far beyond what a refusal may take: a refusal
                // must come as RESOURCE_EXHAUSTED (read and refused) or
                // UNAVAILABLE (refused on its stream once the refusals are
                // sustained), never as this deadline.
                match client.predict(with_timeout(request, Duration::from_secs(10))).await {
                    Ok(response) => {
                        assert_eq!(dims(&response.get_ref().outputs["logits"]), vec![8, 10]);
                        answered += 1;
                    }
                    Err(status) if status.code() == Code::Unavailable => pushed_back += 1,
                    Err(status) => {
                        assert_eq!(status.code(), Code::ResourceExhausted, "{}", status.message());
                        assert!(
                            status.message().contains("the request queue of model 'cnn' is full"),
                            "{}",
                            status.message()
                        );
                        refused += 1;
                    }
                }
            }
            (answered, refused, pushed_back)
        }));
    }
    let mut probes = 0;
    while Instant::now() < until {
        let probe = tokio::time::timeout(Duration::from_secs(5), http_get(server.http, "/healthz")).await;
        assert!(probe.is_ok(), "/healthz did not answer within 5 s while the CPU was saturated");
        probes += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (mut answered, mut refused, mut pushed_back) = (0, 0, 0);
    for task in flood {
        let (a, r, p) = task.await.expect("flood task");
        answered += a;
        refused += r;
        pushed_back += p;
    }
    assert!(probes >= 5, "{probes} probes");
    assert!(answered > 0, "the model served through the flood");
    assert!(refused > 0, "32 callers against 4 places: the excess is refused, first with the reason");
    let counted = server.metric(r#"sluice_rejections_total{queue="cnn/admission",reason="queue_full"}"#).await;
    assert_eq!(counted, refused as f64);
    let counted = server.metric(r#"sluice_rejections_total{queue="cnn/admission",reason="refused_stream"}"#).await;
    assert_eq!(counted, pushed_back as f64);
    // And it keeps serving.
    let image = cnn_image(1, 99);
    let response = server
        .predict_client()
        .await
        .predict(predict_request("cnn", vec![("image", f32_content(&[1, 3, 32, 32], &image))]))
        .await
        .expect("after the flood");
    let (_, want) =
        reference(&example_model("cnn", 1), vec![("image", RefInput::F32(vec![1, 3, 32, 32], image))], "logits");
    assert_close(&f32_values(&response.get_ref().outputs["logits"]), &want, TOLERANCE, "after the flood");
}

#[tokio::test]
async fn both_grpc_thread_layouts_serve_every_connection_the_same_answers() {
    let config = r#"
[[models]]
name = "mlp"
base_path = "$ROOT/examples/models/mlp"
version_policy = { specific = [1] }
onnx = { sessions = 2, intra_op_threads = 1 }
"#;
    let per_core = Server::with_config(config);
    let shared = Server::with_config(&format!("[server]\ngrpc_threads = \"shared\"\n{config}"));
    let mlp = example_model("mlp", 1);
    for server in [&per_core, &shared] {
        // Several connections, so that per core they land on different
        // runtimes; each call checked against ONNX Runtime.
        let mut calls = Vec::new();
        for connection in 0..6u64 {
            let mut client = server.predict_client().await;
            let mlp = mlp.clone();
            calls.push(tokio::spawn(async move {
                for i in 0..10u64 {
                    let x = values(connection * 100 + i, 64);
                    let response = client
                        .predict(predict_request("mlp", vec![("x", f32_content(&[1, 64], &x))]))
                        .await
                        .expect("predict");
                    let (_, want) = reference(&mlp, vec![("x", RefInput::F32(vec![1, 64], x))], "logits");
                    assert_close(&f32_values(&response.get_ref().outputs["logits"]), &want, TOLERANCE, "mlp");
                }
            }));
        }
        for call in calls {
            call.await.expect("connection");
        }
    }
}
