//! A fleet behind a real load balancer: three sluice replicas behind
//! HAProxy (Debian's package, installed by `scripts/setup`), gRPC over
//! HTTP/2 to the backends and REST over HTTP/1.1, health checks on
//! `/readyz` every 200 ms, a real Redis holding the shared plugin registry
//! and the feature table the pipeline reads. Under steady gRPC and REST
//! load, each replica in turn is sent SIGTERM, waited for, and started
//! again on the same ports: no request fails. Then one is SIGKILLed: only
//! calls in flight on it may fail, and once the balancer's checks have
//! taken it out, none does.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::fixtures::{admin_token, example_model_table, feature_fetch, pipeline_table, ConfigDir};
use common::fleet::{Balancer, Replica};
use common::redis::RedisServer;
use common::*;
use http::{Method, StatusCode};
use sluice::cli::bench::client::RestClient;
use sluice::proto::tensorflow::serving::prediction_service_client::PredictionServiceClient;
use sluice::proto::tensorflow::TensorProto;

const OPS: &str = "ops-secret";
const ENTITIES: usize = 20;

/// Entity `k`'s 64 features.
fn row(k: usize) -> Vec<f32> {
    (0..64).map(|i| ((k * 64 + i) as f32 * 0.37).sin()).collect()
}

/// What the load saw.
#[derive(Default)]
struct Outcomes {
    ok: AtomicU64,
    failed: Mutex<Vec<(Instant, String)>>,
}

impl Outcomes {
    fn record(&self, result: Result<(), String>) {
        match result {
            Ok(()) => {
                self.ok.fetch_add(1, Ordering::Relaxed);
            }
            Err(why) => self.failed.lock().expect("outcomes").push((Instant::now(), why)),
        }
    }

    fn failures(&self) -> Vec<(Instant, String)> {
        self.failed.lock().expect("outcomes").clone()
    }
}

fn key(k: usize) -> TensorProto {
    TensorProto {
        dtype: sluice::proto::tensorflow::DataType::DtString as i32,
        tensor_shape: shape(&[1]),
        string_val: vec![Bytes::from(format!("e{k}"))],
        ..Default::default()
    }
}

/// Clients through the balancer until `stop`: gRPC on the MLP and on the
/// pipeline that fetches its input from Redis, REST on the MLP; each
/// answer checked against the model run directly.
fn load(
    balancer: &Balancer,
    expected: Arc<Vec<Vec<f32>>>,
    stop: Arc<AtomicBool>,
    outcomes: Arc<Outcomes>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    let grpc = format!("http://127.0.0.1:{}", balancer.grpc);
    for client in 0..4 {
        let (grpc, expected, stop, outcomes) = (grpc.clone(), expected.clone(), stop.clone(), outcomes.clone());
        tasks.push(tokio::spawn(async move {
            let mut predict = PredictionServiceClient::connect(grpc).await.expect("connect to the balancer");
            let mut n = client;
            while !stop.load(Ordering::Relaxed) {
                let k = n % ENTITIES;
                let request = if n % 2 == 0 {
                    predict_request("mlp", vec![("x", f32_content(&[1, 64], &row(k)))])
                } else {
                    predict_request("fetched", vec![("key", key(k))])
                };
                let result = match predict.predict(with_timeout(request, Duration::from_secs(10))).await {
                    Ok(answer) => {
                        let logits = f32_values(&answer.into_inner().outputs["logits"]);
                        if logits == expected[k] {
                            Ok(())
                        } else {
                            Err(format!("gRPC: a wrong answer for entity {k}"))
                        }
                    }
                    Err(status) => Err(format!("gRPC {:?}: {}", status.code(), status.message())),
                };
                outcomes.record(result);
                n += 4;
            }
        }));
    }
    let rest = format!("127.0.0.1:{}", balancer.http);
    for client in 0..2 {
        let (rest, stop, outcomes) = (rest.clone(), stop.clone(), outcomes.clone());
        tasks.push(tokio::spawn(async move {
            let mut rest = RestClient::new(&rest).expect("client");
            let mut n = client;
            while !stop.load(Ordering::Relaxed) {
                let body = format!("{{\"instances\": [{:?}]}}", row(n % ENTITIES));
                let result = match rest.call(Method::POST, "/v1/models/mlp:predict", &[], Bytes::from(body)).await {
                    Ok(response) if response.status == StatusCode::OK => Ok(()),
                    Ok(response) => Err(format!("REST {}: {}", response.status, response.text())),
                    Err(e) => Err(format!("REST: {e}")),
                };
                outcomes.record(result);
                n += 2;
            }
        }));
    }
    tasks
}

// Several threads: the test waits for processes on its own, and the load
// and its clients' connections (which answer the servers' GOAWAY pings)
// must go on meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_rolling_restart_behind_haproxy_fails_no_request_and_a_killed_replica_only_its_calls_in_flight() {
    let redis = RedisServer::start();
    let mut csv = String::from("key,x\n");
    for k in 0..ENTITIES {
        let values: Vec<String> = row(k).iter().map(f32::to_string).collect();
        csv.push_str(&format!("e{k},{}\n", values.join(" ")));
    }
    let config = format!(
        "[server]\ndrain_delay_secs = 1\ndrain_timeout_secs = 5\n\
         [plugins]\ndir = \"$PLUGINS\"\n[plugins.shared]\nredis_url = \"{url}\"\nkey_prefix = \"fleet:\"\n\
         [admin]\nenabled = true\n{token}\n\
         [features.redis]\nurl = \"{url}\"\n\
         [features.tables.rows]\nstore = \"redis\"\nfeatures.x = {{ dtype = \"float32\", shape = [64] }}\n\
         {mlp}\n{fetched}",
        url = redis.url(),
        token = admin_token("ops", None, OPS),
        mlp = example_model_table("mlp"),
        fetched = pipeline_table(
            "fetched",
            "mlp",
            &format!(
                "preprocess = {{ plugin = \"features\" }}\n{}",
                feature_fetch("", &[("key", "rows", "[{ feature = \"x\" }]")])
            )
        ),
    );
    let dir = ConfigDir::new(&[("features", "identity")], &config);
    let rows = dir.plugins().join("rows.csv");
    std::fs::write(&rows, csv).expect("write rows.csv");
    let (code, stdout, stderr) = run_sluice(&[
        "features",
        "load",
        rows.to_str().expect("utf-8"),
        "--config",
        dir.config().to_str().expect("utf-8"),
        "--table",
        "rows",
    ]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");

    let mut replicas: Vec<Replica> = (0..3).map(|_| Replica::new()).collect();
    for replica in &mut replicas {
        replica.start(&dir.config());
    }
    // What each entity's answer is: the MLP run directly on one replica.
    let direct = format!("http://127.0.0.1:{}", replicas[0].grpc);
    let mut client = PredictionServiceClient::connect(direct).await.expect("connect");
    let mut expected = Vec::new();
    for k in 0..ENTITIES {
        let answer = client.predict(predict_request("mlp", vec![("x", f32_content(&[1, 64], &row(k)))])).await;
        expected.push(f32_values(&answer.expect("direct").into_inner().outputs["logits"]));
    }
    let expected = Arc::new(expected);
    drop(client);

    let balancer = Balancer::start(&replicas);
    balancer.wait_up(3).await;
    let stop = Arc::new(AtomicBool::new(false));
    let outcomes = Arc::new(Outcomes::default());
    let tasks = load(&balancer, expected, stop.clone(), outcomes.clone());
    let steady = Instant::now();
    while outcomes.ok.load(Ordering::Relaxed) < 300 {
        assert!(steady.elapsed() < Duration::from_secs(60), "the load never got going: {:?}", outcomes.failures());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The rolling restart: SIGTERM, wait for the exit, start again, wait
    // until the balancer has it back; the next one.
    for replica in &mut replicas {
        replica.signal(libc::SIGTERM);
        let status = replica.exited();
        assert!(status.success(), "a replica exited {status:?} after SIGTERM");
        replica.start(&dir.config());
        balancer.wait_up(3).await;
    }
    let during_rollout = outcomes.ok.load(Ordering::Relaxed);
    assert_eq!(outcomes.failures(), Vec::new(), "requests failed during the rolling restart");

    // SIGKILL: calls in flight on it may fail; once the balancer's checks
    // have taken it out, none does.
    replicas[1].signal(libc::SIGKILL);
    let _ = replicas[1].exited();
    balancer.wait_up(2).await;
    let out = Instant::now();
    let after_out = outcomes.ok.load(Ordering::Relaxed);
    while outcomes.ok.load(Ordering::Relaxed) < after_out + 300 {
        assert!(out.elapsed() < Duration::from_secs(60), "the load stalled: {:?}", outcomes.failures());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("load task");
    }
    let failures = outcomes.failures();
    assert!(failures.len() <= 6, "more failures than calls in flight on the killed replica: {failures:?}");
    assert!(
        failures.iter().all(|(at, _)| *at < out),
        "a call failed after the balancer took the replica out: {failures:?}"
    );
    eprintln!(
        "fleet: {during_rollout} requests answered through the rolling restart, 0 failed; SIGKILL of one replica: {} \
         failed ({:?}); {} answered in all",
        failures.len(),
        failures.iter().map(|(_, why)| why).collect::<Vec<_>>(),
        outcomes.ok.load(Ordering::Relaxed)
    );
}
