//! `sluice bench`: a load generator for any TF Serving Predict endpoint, in
//! the spirit of ghz.
//!
//! It loads a target in a closed loop (`--concurrency` workers) or an open
//! loop (`--rps`, latency counted from when each request was due), or in
//! steps of rising rate until the error rate or p99 crosses a limit — the
//! knee. Requests come from a JSON file, from a request log (replayed in
//! their recorded order and mix: varied inputs, as production sends them),
//! or are made up from the model's signature; they are encoded once and
//! sent as bytes ([`client`]).

pub mod batching;
pub mod client;
pub mod inputs;
pub mod load;
pub mod report;
pub mod stats;

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use self::load::LoadPlan;
use self::report::Step;
use crate::proto::tensorflow::serving::{model_spec, ModelSpec};

/// The flags of `sluice bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// The server's gRPC address.
    #[arg(long, default_value = "http://127.0.0.1:8500")]
    pub target: String,
    /// The model (or pipeline) to call; with --requests-from, default: the
    /// name each logged request called.
    #[arg(long, required_unless_present = "requests_from")]
    pub model: Option<String>,
    /// A model version to ask for.
    #[arg(long)]
    pub version: Option<i64>,
    /// Closed loop: concurrent workers. Open loop: most requests in flight.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// HTTP/2 connections the workers share.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Open loop: requests per second, whatever the server does.
    #[arg(long)]
    pub rps: Option<f64>,
    /// Measured time, e.g. 10s, 500ms, 2m.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Load before measuring, not counted.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Deadline sent with each request.
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// The priority every gRPC request asks for (`x-sluice-priority`):
    /// high, normal, low, or a level number (1 the highest).
    #[arg(long)]
    pub priority: Option<String>,
    /// Request from a JSON file in TF Serving's REST form ({"inputs": …} or {"instances": …}).
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// Replay a request log (TF Serving's `logging_config` files): a
    /// `.tfrecord` file, a directory of them, or the `filename_prefix` the
    /// log was written with. Each logged Predict request is sent once per
    /// round, in the order logged, at --rps, --concurrency or the --step
    /// plan; versions are not pinned unless --version is given.
    #[arg(long = "requests-from", conflicts_with = "input")]
    pub requests_from: Option<PathBuf>,
    /// With --requests-from: the most MiB of log files read.
    #[arg(long, default_value_t = 1024)]
    pub max_log_mib: u64,
    /// Without --input: rows per random request.
    #[arg(long, default_value_t = 1)]
    pub batch: i64,
    /// Without --input: the whole shape of an input, as NAME=1x224x224x3
    /// (repeatable); other inputs get --batch rows and 1 for other dynamic
    /// dimensions.
    #[arg(long = "shape", value_parser = parse_shape)]
    pub shapes: Vec<(String, Vec<i64>)>,
    /// Without --input: distinct random requests, sent in turn.
    #[arg(long, default_value_t = 16)]
    pub pool: usize,
    /// Step mode: start at --step-start-rps and raise the rate by
    /// --step-percent every --step-duration until a limit is crossed.
    #[arg(long)]
    pub step: bool,
    /// Step mode: the first rate.
    #[arg(long, default_value_t = 100.0)]
    pub step_start_rps: f64,
    /// Step mode: rate increase per step, in percent.
    #[arg(long, default_value_t = 25.0)]
    pub step_percent: f64,
    /// Step mode: the time of each step.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub step_duration: Duration,
    /// Step mode: stop when the share of failed requests exceeds this.
    #[arg(long, default_value_t = 0.01)]
    pub max_error_rate: f64,
    /// Step mode: stop when p99 exceeds this many milliseconds.
    #[arg(long)]
    pub max_p99_ms: Option<f64>,
    /// Step mode: the most steps.
    #[arg(long, default_value_t = 30)]
    pub max_steps: usize,
    /// TLS to an `https://` --target: the CA (PEM file) its certificate is
    /// checked against.
    #[arg(long = "ca-cert")]
    pub ca_cert: Option<PathBuf>,
    /// With --ca-cert: this client's certificate (PEM), for a server that
    /// verifies clients.
    #[arg(long = "client-cert", requires = "client_key", requires = "ca_cert")]
    pub client_cert: Option<PathBuf>,
    /// With --client-cert: its private key (PEM).
    #[arg(long = "client-key", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Send the requests to this REST address (`http://127.0.0.1:8501`)
    /// as TF Serving REST bodies in row form (`instances`), instead of gRPC
    /// to --target (which still answers GetModelMetadata). HTTP/1.1 carries
    /// one call at a time: a closed loop gives each worker a connection; an
    /// open loop (--rps) takes an idle one or opens one per call, at most
    /// --concurrency.
    #[arg(long)]
    pub rest: Option<String>,
    /// Step mode: write an HTML report with the throughput/latency chart.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// The server's metrics (`http://127.0.0.1:8501/metrics`), read at the
    /// end of the run to show what its auto batcher chose. Default: the
    /// --rest address's, when given.
    #[arg(long)]
    pub metrics: Option<String>,
}

/// `NAME=1x224x224x3`.
pub fn parse_shape(text: &str) -> anyhow::Result<(String, Vec<i64>)> {
    let (name, dims) = text.split_once('=').ok_or_else(|| anyhow::anyhow!("'{text}' is not NAME=DIMxDIM…"))?;
    let dims = dims
        .split('x')
        .map(|d| d.trim().parse::<i64>().ok().filter(|d| *d >= 0))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| anyhow::anyhow!("'{text}': dimensions are non-negative integers joined by 'x'"))?;
    Ok((name.to_string(), dims))
}

/// `10s`, `500ms`, `2m`, `250us`, or plain seconds.
pub fn parse_duration(text: &str) -> anyhow::Result<Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().map_err(|_| anyhow::anyhow!("'{text}' is not a duration like 10s, 500ms or 2m"))?;
    let seconds = match unit {
        "" | "s" => value,
        "ms" => value / 1e3,
        "us" | "µs" => value / 1e6,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        other => return Err(anyhow::anyhow!("unknown unit '{other}' in '{text}'; use h, m, s, ms or us")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| anyhow::anyhow!("'{text}': {e}"))
}

/// Runs `sluice bench` and prints its result.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let tls = match &args.ca_cert {
        None => None,
        Some(ca) => Some(client::tls_config(ca, args.client_cert.as_deref().zip(args.client_key.as_deref()))?),
    };
    let (model, pool) = match &args.requests_from {
        Some(log) => {
            let pool =
                inputs::from_request_log(log, args.max_log_mib << 20, args.model.as_deref(), args.version).await?;
            let model = match (&args.model, pool.models.as_slice()) {
                (Some(model), _) => model.clone(),
                (None, [only]) => only.clone(),
                (None, many) => many.join(","),
            };
            if !args.json {
                println!(
                    "replaying {} logged requests of {} from {}",
                    pool.pool.requests.len(),
                    pool.models.join(", "),
                    log.display()
                );
            }
            (model, pool.pool)
        }
        None => {
            let model = args.model.clone().unwrap_or_default();
            let spec = ModelSpec {
                name: model.clone(),
                version_choice: args.version.map(model_spec::VersionChoice::Version),
                signature_name: String::new(),
            };
            let specs = inputs::input_specs(&args.target, &spec, tls.as_ref()).await?;
            let pool = match &args.input {
                Some(path) => inputs::from_json_file(path, &specs, &spec)?,
                None => {
                    let shapes = args.shapes.iter().cloned().collect();
                    inputs::random_pool(&specs, &spec, args.batch, &shapes, args.pool, 42)?
                }
            };
            (model, pool)
        }
    };
    let (target, rest_path, requests) = match &args.rest {
        None => (args.target.clone(), None, pool.requests),
        Some(rest) => {
            if model.contains(',') {
                anyhow::bail!("--rest sends to one model; the log holds requests of {model}: give --model");
            }
            let path = match args.version {
                Some(v) => format!("/v1/models/{model}/versions/{v}:predict"),
                None => format!("/v1/models/{model}:predict"),
            };
            (rest.clone(), Some(path), inputs::rest_bodies(&pool.requests)?)
        }
    };
    let pool = inputs::RequestPool { requests, rows: pool.rows };
    let plan = LoadPlan {
        target,
        rest_path,
        grpc_method: None,
        tls,
        priority: args.priority.clone(),
        connections: args.connections,
        concurrency: args.concurrency,
        rps: args.rps,
        duration: args.duration,
        warmup: args.warmup,
        timeout: args.timeout,
        progress: !args.json,
    };
    let metrics_url = args.metrics.clone().or_else(|| args.rest.as_ref().map(|rest| format!("{rest}/metrics")));
    if !args.step {
        let summary = load::run(&plan, pool.requests, pool.rows).await?;
        let batching = auto_batching(metrics_url.as_deref(), &model).await;
        if args.json {
            let mut out = serde_json::to_value(&summary).map_err(anyhow::Error::new)?;
            if let Some(fields) = out.as_object_mut() {
                fields.insert("auto_batching".into(), serde_json::to_value(&batching).map_err(anyhow::Error::new)?);
            }
            println!("{}", serde_json::to_string_pretty(&out).map_err(anyhow::Error::new)?);
        } else {
            print!("{}{}", summary.text(), batching::text(&batching));
        }
        return Ok(());
    }
    let mut steps: Vec<Step> = Vec::new();
    let mut rate = args.step_start_rps;
    for index in 0..args.max_steps {
        let step_plan = LoadPlan {
            rps: Some(rate),
            duration: args.step_duration,
            warmup: if index == 0 { args.warmup } else { Duration::ZERO },
            ..plan.clone()
        };
        let summary = load::run(&step_plan, pool.requests.clone(), pool.rows).await?;
        let within_limits =
            summary.error_rate <= args.max_error_rate && args.max_p99_ms.is_none_or(|limit| summary.p99_ms <= limit);
        if !args.json {
            println!(
                "step {:>2}: offered {:>9.1} req/s  achieved {:>9.1} req/s  p50 {:>8.3} ms  p99 {:>8.3} ms  errors {:.2}%{}",
                index + 1,
                rate,
                summary.requests_per_second,
                summary.p50_ms,
                summary.p99_ms,
                summary.error_rate * 100.0,
                if within_limits { "" } else { "  <- limit crossed" }
            );
        }
        steps.push(Step { offered_rps: rate, summary, within_limits });
        if !within_limits {
            break;
        }
        rate *= 1.0 + args.step_percent / 100.0;
    }
    let knee = steps.iter().rev().find(|s| s.within_limits);
    let batching = auto_batching(metrics_url.as_deref(), &model).await;
    if args.json {
        let out = serde_json::json!({ "steps": steps, "knee": knee, "auto_batching": batching });
        println!("{}", serde_json::to_string_pretty(&out).map_err(anyhow::Error::new)?);
    } else {
        match knee {
            Some(k) => println!(
                "knee: {:.1} req/s achieved at p99 {:.3} ms (the highest step within the limits)",
                k.summary.requests_per_second, k.summary.p99_ms
            ),
            None => println!("knee: even the first step crossed a limit; start lower"),
        }
        print!("{}", batching::text(&batching));
    }
    if let Some(path) = &args.report {
        let title = format!("sluice bench: {model} at {}", args.target);
        std::fs::write(path, report::html(&title, &steps, args.max_p99_ms))
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
        if !args.json {
            println!("report: {}", path.display());
        }
    }
    Ok(())
}

/// The auto batchers of `model`, when the metrics can be read; a run's
/// figures stand without them, so a failure is only reported.
async fn auto_batching(metrics_url: Option<&str>, model: &str) -> Vec<batching::AutoBatching> {
    let Some(url) = metrics_url else { return Vec::new() };
    batching::fetch(url, model).await.unwrap_or_else(|error| {
        eprintln!("sluice bench: could not read the server's metrics at {url}: {error}");
        Vec::new()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("3d").unwrap_err().to_string().contains("unknown unit"));
        assert_eq!(parse_shape("image=1x224x224x3").unwrap(), ("image".into(), vec![1, 224, 224, 3]));
        assert!(parse_shape("image=1x-2").is_err());
    }
}
