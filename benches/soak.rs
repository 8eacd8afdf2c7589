//! Soak: ten minutes (or `--duration`) of mixed traffic against the release
//! server while everything that can change does, sampling resident memory,
//! open file descriptors and threads.
//!
//! scripts/soak [-- --duration 600]
//!
//! Traffic, from four gRPC and two REST clients: good requests to the MLP
//! directly, through pipeline `scored` (a plugin, then the MLP) and
//! through pipeline `fetched` (a Redis feature fetch, then the MLP), and
//! bad ones (wrong shapes, unknown models, malformed JSON). Meanwhile: the
//! plugin is swapped every 5 s, a new model version appears every 20 s (the
//! old one drained and unloaded), and Redis is restarted every 30 s (and
//! refilled). Every good answer is checked against ONNX Runtime run
//! directly for the version it names; a wrong answer fails the run.
//! Growth is measured from the first sample after a minute of warm-up.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use sluice::cli::bench::client::RestClient;
use sluice::proto::tensorflow::serving::prediction_service_client::PredictionServiceClient;
use sluice::proto::tensorflow::serving::{model_spec, ModelSpec, PredictRequest};
use sluice::proto::tensorflow::{tensor_shape_proto, DataType, TensorProto, TensorShapeProto};
use support::fixtures::{admin_token, feature_fetch, model_table, pipeline_table, plugin_bytes, ConfigDir};
use support::{arg, sluice};

const TOKEN: &str = "soak-token";
const INPUTS: usize = 8;

fn input(i: usize) -> Vec<f32> {
    (0..64).map(|j| ((i * 64 + j) as f32 * 0.37).sin()).collect()
}

fn tensor(dims: &[i64], values: &[f32]) -> TensorProto {
    TensorProto {
        dtype: DataType::DtFloat as i32,
        tensor_shape: Some(TensorShapeProto {
            dim: dims.iter().map(|&size| tensor_shape_proto::Dim { size, name: String::new() }).collect(),
            unknown_rank: false,
        }),
        tensor_content: Bytes::copy_from_slice(bytemuck::cast_slice(values)),
        ..Default::default()
    }
}

fn request(model: &str, inputs: Vec<(&str, TensorProto)>) -> PredictRequest {
    PredictRequest {
        model_spec: Some(ModelSpec { name: model.into(), ..Default::default() }),
        inputs: inputs.into_iter().map(|(n, t)| (n.to_string(), t)).collect(),
        output_filter: Vec::new(),
    }
}

/// The MLP file a version number is published from.
fn mlp_file(root: &Path, version: i64) -> PathBuf {
    root.join(format!("examples/models/mlp/{}/model.onnx", 1 + (version % 2)))
}

/// ONNX Runtime run directly: logits of `x` through `file`.
fn reference(file: &Path, x: &[f32]) -> Vec<f32> {
    let environment = sluice::infer::onnx::library::environment(None).expect("ONNX Runtime library");
    let mut session =
        ort::session::Session::builder(environment).expect("builder").commit_from_file(file).expect("model");
    let value: ort::value::DynValue =
        ort::value::Tensor::from_array((vec![1i64, 64], x.to_vec())).expect("tensor").into_dyn();
    let inputs: Vec<(String, ort::session::SessionInputValue<'static>)> = vec![("x".to_string(), value.into())];
    let outputs = session.run(inputs).expect("run");
    outputs["logits"].try_extract_tensor::<f32>().expect("logits").1.to_vec()
}

fn publish(repository: &Path, root: &Path, version: i64) {
    let staging = repository.join(format!(".staging-{version}"));
    std::fs::create_dir_all(&staging).expect("staging");
    std::fs::copy(mlp_file(root, version), staging.join("model.onnx")).expect("copy");
    std::fs::rename(&staging, repository.join(version.to_string())).expect("rename");
    if version > 2 {
        let _ = std::fs::remove_dir_all(repository.join((version - 2).to_string()));
    }
}

fn fill_redis(redis: &support::redis::RedisServer) {
    for i in 0..INPUTS {
        let bytes: Vec<u8> = bytemuck::cast_slice(&input(i)).to_vec();
        let key = format!("vec:{i}");
        redis.command(&[b"HSET", key.as_bytes(), b"x", &bytes]);
    }
}

/// Resident memory (KiB), open file descriptors, threads of `pid`.
fn sample(pid: u32) -> (u64, usize, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.split_whitespace().next()?.parse().ok())
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    (field("VmRSS:").unwrap_or(0), fds, field("Threads:").unwrap_or(0))
}

fn main() {
    let duration = Duration::from_secs(arg("--duration").unwrap_or(600));
    let root = support::fixtures::root();
    let repository_dir = tempfile::tempdir().expect("temp dir");
    let repository = repository_dir.path().join("mlp");
    std::fs::create_dir_all(&repository).expect("repository");
    publish(&repository, &root, 1);
    let mut redis = support::redis::RedisServer::start();
    fill_redis(&redis);
    let fetch = feature_fetch(
        "on_store_error = \"defaults\"",
        &[("id", "vec", "[{ feature = \"x\", tensor = \"x\", default = 0.0 }]")],
    );
    let config = format!(
        "[plugins]\ndir = \"$PLUGINS\"\n[admin]\nenabled = true\n{}[features.redis]\nurl = \"{}\"\n\
         [features.tables.vec]\nstore = \"redis\"\nfeatures.x = {{ dtype = \"float32\", shape = [64] }}\n{}{}{}{fetch}",
        admin_token("soak", None, TOKEN),
        redis.url(),
        model_table("mlp", &repository, "onnx = { sessions = 2, intra_op_threads = 1 }"),
        pipeline_table("scored", "mlp", "preprocess = { plugin = \"features\" }"),
        pipeline_table("fetched", "mlp", ""),
    );
    let dir = ConfigDir::new(&[("features", "identity")], &config);
    let server = sluice(&dir.config(), &["--file_system_poll_wait_seconds", "1"]);
    let http = server.stdout_after("sluice: serving HTTP on ").expect("HTTP address");
    let target = server.url();
    let pid = server.pid();

    // What every version must answer: both MLP files, each input, the
    // input as sent and doubled (the scale plugin), and zeros (a feature
    // that Redis did not have while it restarted).
    let mut right: BTreeMap<(usize, usize), Vec<f32>> = BTreeMap::new();
    for file in 1..=2usize {
        let path = root.join(format!("examples/models/mlp/{file}/model.onnx"));
        for i in 0..INPUTS {
            right.insert((file, i), reference(&path, &input(i)));
            let doubled: Vec<f32> = input(i).iter().map(|v| v * 2.0).collect();
            right.insert((file, i + INPUTS), reference(&path, &doubled));
        }
        right.insert((file, 2 * INPUTS), reference(&path, &[0.0; 64]));
    }
    let right = Arc::new(right);
    let is_right = move |version: i64, got: &[f32], i: usize| {
        let file = 1 + (version % 2) as usize;
        [i, i + INPUTS, 2 * INPUTS].iter().any(|&k| {
            right.get(&(file, k)).is_some_and(|want| want.iter().zip(got).all(|(a, b)| (a - b).abs() <= 1e-4))
        })
    };
    let is_right = Arc::new(is_right);

    let runtime = support::runtime();
    let stop = Arc::new(AtomicBool::new(false));
    let (good, bad, wrong, failed) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut tasks = Vec::new();
    for c in 0..4usize {
        let (stop, good, bad, wrong, failed, target, is_right) =
            (stop.clone(), good.clone(), bad.clone(), wrong.clone(), failed.clone(), target.clone(), is_right.clone());
        tasks.push(runtime.spawn(async move {
            let mut client = PredictionServiceClient::connect(target).await.expect("connect");
            let mut n = c;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let i = n % INPUTS;
                let (call, model) = match n % 5 {
                    0 => (request("mlp", vec![("x", tensor(&[1, 63], &input(i)[..63]))]), None),
                    1 => (request("nope", vec![("x", tensor(&[1, 64], &input(i)))]), None),
                    2 => (request("scored", vec![("x", tensor(&[1, 64], &input(i)))]), Some(i)),
                    3 => {
                        let id = TensorProto {
                            dtype: DataType::DtString as i32,
                            tensor_shape: Some(TensorShapeProto {
                                dim: vec![tensor_shape_proto::Dim { size: 1, name: String::new() }],
                                unknown_rank: false,
                            }),
                            string_val: vec![Bytes::from(i.to_string())],
                            ..Default::default()
                        };
                        (request("fetched", vec![("id", id)]), Some(i))
                    }
                    _ => (request("mlp", vec![("x", tensor(&[1, 64], &input(i)))]), Some(i)),
                };
                match (client.predict(call).await, model) {
                    (Ok(response), Some(i)) => {
                        let response = response.into_inner();
                        let version = match response.model_spec.and_then(|s| s.version_choice) {
                            Some(model_spec::VersionChoice::Version(v)) => v,
                            _ => -1,
                        };
                        let got: Vec<f32> = response
                            .outputs
                            .get("logits")
                            .map(|t| bytemuck::pod_collect_to_vec::<u8, f32>(&t.tensor_content))
                            .filter(|v: &Vec<f32>| !v.is_empty())
                            .or_else(|| response.outputs.get("logits").map(|t| t.float_val.clone()))
                            .unwrap_or_default();
                        if is_right(version, &got, i) {
                            good.fetch_add(1, Ordering::Relaxed);
                        } else {
                            wrong.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    (Ok(_), None) => {
                        wrong.fetch_add(1, Ordering::Relaxed);
                    }
                    (Err(_), None) => {
                        bad.fetch_add(1, Ordering::Relaxed);
                    }
                    (Err(status), Some(_)) => {
                        eprintln!("a good request failed: {:?} {}", status.code(), status.message());
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for c in 0..2usize {
        let (stop, good, bad, wrong, http) = (stop.clone(), good.clone(), bad.clone(), wrong.clone(), http.clone());
        tasks.push(runtime.spawn(async move {
            let mut client = RestClient::new(&http).expect("client");
            let mut n = c;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let (body, ok) = if n % 2 == 0 {
                    (format!("{{\"instances\": [{:?}]}}", input(n % INPUTS)), true)
                } else {
                    ("{\"instances\": [[1, 2,".to_string(), false)
                };
                let Ok(answer) = client.call(Method::POST, "/v1/models/mlp:predict", &[], Bytes::from(body)).await
                else {
                    continue;
                };
                match (answer.status.is_success(), ok) {
                    (true, true) => good.fetch_add(1, Ordering::Relaxed),
                    (false, false) => bad.fetch_add(1, Ordering::Relaxed),
                    _ => wrong.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }

    let admin = |path: &str| {
        let http = http.clone();
        let path = path.to_string();
        runtime.block_on(async move {
            let mut client = RestClient::new(&http).expect("client");
            let authorization = format!("Bearer {TOKEN}");
            client.call(Method::POST, &path, &[("authorization", authorization.as_str())], Bytes::new()).await.ok()
        })
    };
    runtime
        .block_on(async {
            let mut client = RestClient::new(&http).expect("client");
            let authorization = format!("Bearer {TOKEN}");
            let body = Bytes::from(plugin_bytes("scale"));
            client
                .call(Method::PUT, "/admin/v1/plugins/features", &[("authorization", authorization.as_str())], body)
                .await
        })
        .expect("upload scale");

    let started = Instant::now();
    let mut samples: Vec<(u64, u64, usize, u64)> = Vec::new();
    let (mut swaps, mut versions, mut restarts, mut version) = (0u32, 0u32, 0u32, 1i64);
    let mut second = 0u64;
    while started.elapsed() < duration {
        std::thread::sleep(Duration::from_secs(1));
        second += 1;
        if second.is_multiple_of(5) {
            admin(&format!("/admin/v1/plugins/features/versions/{}/activate", swaps % 2));
            swaps += 1;
            let (rss, fds, threads) = sample(pid);
            samples.push((second, rss, fds, threads));
        }
        if second.is_multiple_of(20) {
            version += 1;
            publish(&repository, &root, version);
            versions += 1;
        }
        if second % 30 == 15 {
            redis.restart();
            fill_redis(&redis);
            restarts += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    runtime.block_on(async {
        for task in tasks {
            let _ = task.await;
        }
    });

    let warm = samples.iter().find(|s| s.0 >= 60).or(samples.first()).copied().unwrap_or_default();
    let last = samples.last().copied().unwrap_or_default();
    let growth = |a: f64, b: f64| if a > 0.0 { (b / a - 1.0) * 100.0 } else { 0.0 };
    println!();
    println!("| t (s) | resident MiB | open fds | threads |");
    println!("|---|---|---|---|");
    for (t, rss, fds, threads) in samples.iter().filter(|s| s.0.is_multiple_of(60) || s.0 == last.0) {
        println!("| {t} | {:.1} | {fds} | {threads} |", *rss as f64 / 1024.0);
    }
    println!(
        "\n{:.0} s: {} good answers (all checked), {} bad requests refused, {} wrong, {} good requests failed; \
         {swaps} plugin swaps, {versions} model versions, {restarts} Redis restarts",
        started.elapsed().as_secs_f64(),
        good.load(Ordering::Relaxed),
        bad.load(Ordering::Relaxed),
        wrong.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed)
    );
    println!(
        "growth after warm-up (t={} s → {} s): resident {:+.1} %, fds {:+.1} %, threads {:+.1} % (target ≤ 5 %)",
        warm.0,
        last.0,
        growth(warm.1 as f64, last.1 as f64),
        growth(warm.2 as f64, last.2 as f64),
        growth(warm.3 as f64, last.3 as f64)
    );
    assert_eq!(wrong.load(Ordering::Relaxed), 0, "wrong answers");
}
