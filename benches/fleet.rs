//! Rolling restarts under load, measured: three replicas of the release
//! server behind HAProxy (`tests/common/fleet.rs`, the same fleet
//! `tests/fleet.rs` checks), gRPC clients on the MLP and REST clients
//! through the balancer. First a steady phase, then rolling restarts
//! (SIGTERM, wait for the exit, start again, wait until HAProxy has it
//! back; the next replica) until at least `--min_requests` were answered
//! during them. Reports the requests and failures of each phase and the
//! p50/p99 during the rollout against steady. Everything shares this
//! machine's cores: the replicas, HAProxy and the clients.
//!
//! ```text
//! cargo bench --bench fleet [-- --steady_seconds 10 --min_requests 100000 --clients 8]
//! ```

mod support;

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};
use sluice::cli::bench::client::RestClient;
use sluice::proto::tensorflow::serving::prediction_service_client::PredictionServiceClient;
use support::arg;
use support::fleet::{Balancer, Replica};

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const STEADY: u8 = 0;
const ROLLOUT: u8 = 1;
const DONE: u8 = 2;

/// Each phase's latencies of answered requests, and its failures.
#[derive(Default)]
struct Phase {
    answered: Vec<Duration>,
    failed: Vec<String>,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted.get(((sorted.len().max(1) - 1) as f64 * p).round() as usize).copied().unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let steady_seconds: u64 = arg("--steady_seconds").unwrap_or(10);
    let min_requests: usize = arg("--min_requests").unwrap_or(100_000);
    let clients: usize = arg("--clients").unwrap_or(8);
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("sluice.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ndrain_delay_secs = 1\ndrain_timeout_secs = 5\n{}",
            support::fixtures::example_model_table("mlp")
                .replace("$ROOT", &support::fixtures::root().display().to_string())
        ),
    )
    .expect("write config");
    let mut replicas: Vec<Replica> = (0..3).map(|_| Replica::new()).collect();
    for replica in &mut replicas {
        replica.start(&config);
    }
    let balancer = Balancer::start(&replicas);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let phase = Arc::new(AtomicU8::new(STEADY));
    let phases: Arc<Mutex<[Phase; 2]>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    runtime.block_on(balancer.wait_up(3));
    let x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut tasks = Vec::new();
    for client in 0..clients {
        let (phase, phases, stop, x) = (phase.clone(), phases.clone(), stop.clone(), x.clone());
        let grpc = format!("http://127.0.0.1:{}", balancer.grpc);
        let rest = format!("127.0.0.1:{}", balancer.http);
        tasks.push(runtime.spawn(async move {
            // One in four clients speaks REST.
            let over_rest = client % 4 == 3;
            let mut predict = PredictionServiceClient::connect(grpc).await.expect("connect to the balancer");
            let mut rest = RestClient::new(&rest).expect("client");
            let request = support::mlp_predict(&x);
            let body = Bytes::from(format!("{{\"instances\": [{x:?}]}}"));
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let result = if over_rest {
                    match rest.call(Method::POST, "/v1/models/mlp:predict", &[], body.clone()).await {
                        Ok(response) if response.status == StatusCode::OK => Ok(()),
                        Ok(response) => Err(format!("REST {}: {}", response.status, response.text())),
                        Err(e) => Err(format!("REST: {e}")),
                    }
                } else {
                    predict
                        .predict(request.clone())
                        .await
                        .map(drop)
                        .map_err(|s| format!("gRPC {:?}: {}", s.code(), s.message()))
                };
                let took = started.elapsed();
                let at = phase.load(Ordering::Relaxed);
                if at == DONE {
                    continue;
                }
                let mut phases = phases.lock().expect("phases");
                match result {
                    Ok(()) => phases[at as usize].answered.push(took),
                    Err(why) => phases[at as usize].failed.push(why),
                }
            }
        }));
    }
    std::thread::sleep(Duration::from_secs(steady_seconds));
    phase.store(ROLLOUT, Ordering::Relaxed);
    let rollout_started = Instant::now();
    let mut rounds = 0;
    while phases.lock().expect("phases")[1].answered.len() < min_requests {
        for replica in &mut replicas {
            replica.signal(libc::SIGTERM);
            let status = replica.exited();
            assert!(status.success(), "a replica exited {status:?} after SIGTERM");
            replica.start(&config);
            runtime.block_on(balancer.wait_up(3));
        }
        rounds += 1;
    }
    let rollout = rollout_started.elapsed();
    phase.store(DONE, Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        runtime.block_on(task).expect("client");
    }
    let mut phases = phases.lock().expect("phases");
    for phase in phases.iter_mut() {
        phase.answered.sort();
    }
    let (steady, rolling) = (&phases[0], &phases[1]);
    println!(
        "\nRolling restarts behind HAProxy 2.6: 3 release replicas (MLP), {clients} clients ({} gRPC, {} REST), \
         {rounds} rounds of restarts in {:.1} s\n",
        clients - clients / 4,
        clients / 4,
        rollout.as_secs_f64()
    );
    println!("| phase | answered | failed | req/s | p50 ms | p99 ms |");
    println!("|---|---|---|---|---|---|");
    for (name, phase, seconds) in
        [("steady", steady, steady_seconds as f64), ("rolling restarts", rolling, rollout.as_secs_f64())]
    {
        println!(
            "| {name} | {} | {} | {:.0} | {:.2} | {:.2} |",
            phase.answered.len(),
            phase.failed.len(),
            phase.answered.len() as f64 / seconds,
            ms(percentile(&phase.answered, 0.5)),
            ms(percentile(&phase.answered, 0.99))
        );
    }
    println!(
        "\nduring the rollout / steady: p99 {:.2}x, req/s {:.2}x; failures: {:?}",
        ms(percentile(&rolling.answered, 0.99)) / ms(percentile(&steady.answered, 0.99)),
        (rolling.answered.len() as f64 / rollout.as_secs_f64())
            / (steady.answered.len() as f64 / steady_seconds as f64),
        rolling.failed.iter().chain(&steady.failed).take(5).collect::<Vec<_>>()
    );
}
