//! Generating load: a closed loop (each of N workers sends its next request
//! when the last one is answered) or an open loop (requests start at a
//! constant rate whatever the server does, and latency counts from the
//! moment a request was due, so a slow server cannot hide queueing by
//! slowing the client down — no coordinated omission).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::Semaphore;

use super::client::{LoadClient, RawPredictClient, RestClient};
use super::stats::{code_name, Recorder, Summary};

/// How to load the target.
#[derive(Debug, Clone)]
pub struct LoadPlan {
    /// `http://host:port`.
    pub target: String,
    /// HTTP/2 connections, shared round-robin by the workers.
    pub connections: usize,
    /// Closed loop: workers; open loop: the most requests in flight.
    pub concurrency: usize,
    /// Open loop at this many requests per second; closed loop when unset.
    pub rps: Option<f64>,
    /// Measured time.
    pub duration: Duration,
    /// Load before measuring starts, not counted.
    pub warmup: Duration,
    /// Deadline sent with each request (`grpc-timeout`).
    pub timeout: Option<Duration>,
    /// Print a progress line each second on stderr.
    pub progress: bool,
    /// REST instead of gRPC: the path to POST JSON bodies to
    /// (`/v1/models/NAME:predict`); `target` is then the HTTP port.
    pub rest_path: Option<String>,
    /// The gRPC method the encoded requests go to (e.g.
    /// `/inference.GRPCInferenceService/ModelInfer` for KServe v2 bytes);
    /// TF Serving's Predict when unset.
    pub grpc_method: Option<String>,
    /// TLS to an `https://` gRPC target: the CA its certificate is
    /// checked against, and a client certificate when it verifies clients.
    pub tls: Option<tonic::transport::ClientTlsConfig>,
    /// The priority every request asks for (`x-sluice-priority`), gRPC only.
    pub priority: Option<String>,
}

impl LoadPlan {
    /// A closed loop of `concurrency` Predict calls to `target` over 4
    /// connections for `duration`, after 2 s of warm-up, with no deadline:
    /// what most runs are, changed field by field for the others.
    pub fn closed(target: &str, concurrency: usize, duration: Duration) -> LoadPlan {
        LoadPlan {
            target: target.to_string(),
            connections: 4,
            concurrency,
            rps: None,
            duration,
            warmup: Duration::from_secs(2),
            timeout: None,
            progress: false,
            rest_path: None,
            grpc_method: None,
            tls: None,
            priority: None,
        }
    }
}

struct Shared {
    requests: Vec<Bytes>,
    rows: u64,
    timeout: Option<Duration>,
    /// When counting starts (after the warm-up) and stops.
    measure_from: Instant,
    until: Instant,
    total: Mutex<Recorder>,
    /// Since the last progress line.
    interval: Mutex<Recorder>,
    /// When the last progress line was printed (the measuring's start
    /// before the first).
    last_line: Mutex<Instant>,
}

impl Shared {
    fn record(&self, due: Instant, result: Result<Bytes, tonic::Status>) {
        if due < self.measure_from {
            return;
        }
        let latency = due.elapsed();
        let failed = result.err().map(|status| code_name(status.code()));
        for recorder in [&self.total, &self.interval] {
            if let Ok(mut recorder) = recorder.lock() {
                match failed {
                    None => recorder.ok(latency, self.rows),
                    Some(code) => recorder.error(code, latency),
                }
            }
        }
    }
}

/// Runs `plan` with the encoded `requests` (sent round-robin, each of
/// `rows` rows) and returns what was measured.
pub async fn run(plan: &LoadPlan, requests: Vec<Bytes>, rows: u64) -> anyhow::Result<Summary> {
    if requests.is_empty() {
        anyhow::bail!("no requests to send");
    }
    let mut clients = Vec::with_capacity(plan.connections.max(1));
    match &plan.rest_path {
        None => {
            for _ in 0..plan.connections.max(1) {
                let mut client = RawPredictClient::connect(&plan.target, plan.tls.as_ref()).await?;
                if let Some(method) = &plan.grpc_method {
                    client = client.calling(method)?;
                }
                if let Some(priority) = &plan.priority {
                    client = client.with_priority(priority)?;
                }
                clients.push(LoadClient::Grpc(client));
            }
        }
        // Each worker's clone opens its own HTTP/1.1 connection; an open
        // loop keeps a pool of them (`open_loop`).
        Some(path) => {
            clients.push(LoadClient::Rest { client: RestClient::new(&plan.target)?, path: path.as_str().into() });
        }
    }
    let start = Instant::now();
    let shared = Arc::new(Shared {
        requests,
        rows,
        timeout: plan.timeout,
        measure_from: start + plan.warmup,
        until: start + plan.warmup + plan.duration,
        total: Mutex::new(Recorder::default()),
        interval: Mutex::new(Recorder::default()),
        last_line: Mutex::new(start + plan.warmup),
    });
    let progress = plan.progress.then(|| tokio::spawn(progress_lines(shared.clone())));
    match plan.rps {
        None => closed_loop(plan, &shared, clients).await,
        Some(rps) => open_loop(plan, &shared, clients, rps).await,
    }
    if let Some(progress) = progress {
        progress.abort();
        // The last stretch since the last line: what finished after it
        // (the run's last partial second, and calls answered after the
        // end), so the lines add up to the run.
        let stretch = shared.last_line.lock().map(|at| at.elapsed()).unwrap_or_default();
        let rest = shared.interval.lock().map(|mut r| std::mem::take(&mut *r)).unwrap_or_default();
        if rest.requests() > 0 {
            progress_line("end", &rest.summary(stretch), stretch);
        }
    }
    let total = shared.total.lock().map_err(|_| anyhow::anyhow!("a worker panicked"))?.clone();
    Ok(total.summary(plan.duration))
}

async fn closed_loop(plan: &LoadPlan, shared: &Arc<Shared>, clients: Vec<LoadClient>) {
    let mut workers = Vec::with_capacity(plan.concurrency);
    for worker in 0..plan.concurrency.max(1) {
        let mut client = clients[worker % clients.len()].clone();
        let shared = shared.clone();
        workers.push(tokio::spawn(async move {
            let mut next = worker;
            while Instant::now() < shared.until {
                let request = shared.requests[next % shared.requests.len()].clone();
                next += 1;
                let due = Instant::now();
                let result = client.predict(request, shared.timeout).await;
                shared.record(due, result);
            }
        }));
    }
    for worker in workers {
        let _ = worker.await;
    }
}

/// A call of an open loop, whose deadline runs from when it was due, as a
/// real caller's does: what waited in this client (its connection's
/// stream limit, the in-flight limit) is sent with only the time left, and
/// is abandoned as DEADLINE_EXCEEDED once none is, so an answer that came
/// too late is never counted as served.
async fn due_call(
    client: &mut LoadClient,
    request: Bytes,
    due: Instant,
    timeout: Option<Duration>,
) -> Result<Bytes, tonic::Status> {
    let Some(timeout) = timeout else { return client.predict(request, None).await };
    let left = (due + timeout).saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(tonic::Status::deadline_exceeded("the deadline passed before the request could be sent"));
    }
    match tokio::time::timeout(left, client.predict(request, Some(left))).await {
        Ok(result) => result,
        Err(_) => Err(tonic::Status::deadline_exceeded("the deadline passed before the answer came")),
    }
}

/// Idle HTTP/1.1 connections of an open loop. HTTP/1.1 carries one call
/// at a time, so a REST call takes an idle connection or opens one (at
/// most the in-flight limit of them), and gives it back once answered.
/// A call abandoned at its deadline drops its connection, as a caller
/// that gives up closes its socket.
struct IdleConnections {
    idle: Mutex<Vec<LoadClient>>,
}

impl IdleConnections {
    fn take(&self, fresh: &LoadClient) -> LoadClient {
        self.idle.lock().ok().and_then(|mut idle| idle.pop()).unwrap_or_else(|| fresh.clone())
    }

    fn give_back(&self, client: LoadClient, result: &Result<Bytes, tonic::Status>) {
        let abandoned = matches!(result, Err(status) if status.code() == tonic::Code::DeadlineExceeded);
        if !abandoned {
            if let Ok(mut idle) = self.idle.lock() {
                idle.push(client);
            }
        }
    }
}

async fn open_loop(plan: &LoadPlan, shared: &Arc<Shared>, clients: Vec<LoadClient>, rps: f64) {
    let interval = Duration::from_secs_f64(1.0 / rps.max(1e-3));
    let in_flight = Arc::new(Semaphore::new(plan.concurrency.max(1)));
    let rest = plan.rest_path.is_some().then(|| Arc::new(IdleConnections { idle: Mutex::new(Vec::new()) }));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0u64.. {
        let due = start + interval.mul_f64(i as f64);
        if due >= shared.until {
            break;
        }
        tokio::time::sleep_until(due.into()).await;
        // When the limit of requests in flight is reached, the wait counts
        // in the latency: the request was due at `due`.
        let Ok(permit) = in_flight.clone().acquire_owned().await else { break };
        let template = &clients[i as usize % clients.len()];
        let mut client = match &rest {
            Some(idle) => idle.take(template),
            None => template.clone(),
        };
        let (shared, rest) = (shared.clone(), rest.clone());
        tasks.spawn(async move {
            let request = shared.requests[i as usize % shared.requests.len()].clone();
            let result = due_call(&mut client, request, due, shared.timeout).await;
            if let Some(idle) = rest {
                idle.give_back(client, &result);
            }
            shared.record(due, result);
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

/// A line a second of what was answered in it, counted from the end of
/// the warm-up (whose calls are not counted), so that the lines and the
/// final `end` line add up to the run's total.
async fn progress_lines(shared: Arc<Shared>) {
    let measure_from = shared.measure_from;
    if Instant::now() < measure_from {
        eprintln!("[warm-up] {:.1} s, not counted", (measure_from - Instant::now()).as_secs_f64());
    }
    let mut ticker = tokio::time::interval_at((measure_from + Duration::from_secs(1)).into(), Duration::from_secs(1));
    loop {
        let tick = ticker.tick().await.into_std();
        let interval = match shared.interval.lock() {
            Ok(mut recorder) => std::mem::take(&mut *recorder),
            Err(_) => return,
        };
        let stretch = match shared.last_line.lock() {
            Ok(mut last) => tick.saturating_duration_since(std::mem::replace(&mut *last, tick)),
            Err(_) => return,
        };
        let label = format!("{:>4.0} s", (tick - measure_from).as_secs_f64());
        progress_line(&label, &interval.summary(stretch), stretch);
    }
}

/// One progress line: the calls answered over `stretch`.
fn progress_line(label: &str, s: &Summary, stretch: Duration) {
    eprintln!(
        "[{label}] {:>7} answered in {:.2} s: {:>9.1} req/s  p50 {:>8.3} ms  p99 {:>8.3} ms  errors {:<6}",
        s.requests,
        stretch.as_secs_f64(),
        s.requests_per_second,
        s.p50_ms,
        s.p99_ms,
        s.requests - s.ok
    );
}
