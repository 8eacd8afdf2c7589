//! The `sluice` binary: command-line parsing, logging, and the subcommands.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use sluice::config::{BatchingParameters, GrpcThreads, OutputEncoding};
use sluice::config::{Config, ModelConfig};

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// sluice: a model-serving runtime with a TF-Serving-compatible API.
#[derive(Parser)]
#[command(name = "sluice", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,

    /// Log filter, e.g. `info` or `sluice=debug,info` (RUST_LOG syntax).
    /// ONNX Runtime's own log is kept to warnings unless named.
    #[arg(long = "log_level", alias = "log-level", global = true, env = "SLUICE_LOG", default_value = "info,ort=warn")]
    log_level: String,

    /// Log format: text for people, json for log pipelines.
    #[arg(long = "log_format", alias = "log-format", global = true, env = "SLUICE_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
}

#[derive(Subcommand)]
enum Command {
    /// Serve models over TF Serving's gRPC API.
    Serve(ServeArgs),
    /// Load a Predict endpoint (sluice or TF Serving) and report throughput
    /// and latency percentiles.
    Bench(sluice::cli::bench::BenchArgs),
    /// Work with WebAssembly plugins: new, check, push, list, show,
    /// activate, rollback, delete.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Work with configuration files.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Work with feature tables.
    #[command(subcommand)]
    Features(FeaturesCommand),
    /// Work with TF Serving warmup files.
    #[command(subcommand)]
    Warmup(WarmupCommand),
}

#[derive(Subcommand)]
enum WarmupCommand {
    /// Write a model version's warmup file
    /// (assets.extra/tf_serving_warmup_requests) from a request log, each
    /// request checked against the version and run through it.
    Make(sluice::cli::warmup_make::MakeArgs),
}

#[derive(Subcommand)]
enum FeaturesCommand {
    /// Write a table file (CSV or JSON lines) into Redis in the format the
    /// Redis feature store reads, with the schema the config declares.
    Load(sluice::cli::features_load::LoadArgs),
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Check a config file without serving: its syntax and values, and
    /// everything it refers to on disk (model versions, labels, plugin and
    /// label files). Prints what would be served; exits 1 on an error.
    Check {
        /// The TOML file (`--model_config_file`).
        file: PathBuf,
    },
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Load a plugin as the server would, print what it declares, and run a
    /// sample under the real limits, with its time and peak memory.
    Check(sluice::cli::plugin_check::CheckArgs),
    /// Create a plugin project (a Rust crate, or Python or JavaScript with
    /// --lang) that builds and passes `plugin check` as generated, fitted to
    /// a model with --model.
    New(sluice::cli::plugin_new::NewArgs),
    /// Upload a plugin to a running server (admin API) and, by default,
    /// activate it for the pipeline. The token comes from SLUICE_TOKEN.
    Push(sluice::cli::plugin_push::PushArgs),
    /// List the plugins the token may see, with versions and the active one.
    List(sluice::cli::plugin_push::ServerArgs),
    /// Show one plugin: its team, stored versions, the active one and the
    /// history rollback returns through.
    Show(sluice::cli::plugin_push::NameArgs),
    /// Activate a stored version: every stage running the plugin switches
    /// to it without a failed request.
    Activate(sluice::cli::plugin_push::VersionArgs),
    /// Go back to the version active before the current one.
    Rollback(sluice::cli::plugin_push::NameArgs),
    /// Delete a stored version that is not active.
    Delete(sluice::cli::plugin_push::VersionArgs),
}

/// Flags named as TF Serving names them, so its users feel at home. Flags
/// override the config file.
#[derive(Args)]
struct ServeArgs {
    /// gRPC port (PredictionService, ModelService). 0 picks a free port;
    /// the bound address is printed on stdout.
    #[arg(long, env = "SLUICE_PORT")]
    port: Option<u16>,

    /// HTTP port: TF Serving's REST API (/v1/models/…), KServe v2's REST API,
    /// health (/healthz, /readyz), Prometheus metrics
    /// (/monitoring/prometheus/metrics, /metrics) and, unless it has a port
    /// of its own, the admin API. 0 picks a free port; the bound address is
    /// printed on stdout.
    #[arg(long = "rest_api_port", env = "SLUICE_REST_API_PORT")]
    rest_api_port: Option<u16>,

    /// Address to bind.
    #[arg(long, env = "SLUICE_HOST")]
    host: Option<String>,

    /// Name of a single model to serve (with --model_base_path).
    #[arg(long = "model_name", requires = "model_base_path")]
    model_name: Option<String>,

    /// Directory of the single model: one subdirectory per version holding
    /// model.onnx (BASE/1/model.onnx, BASE/2/model.onnx, …). The highest
    /// version is served.
    #[arg(long = "model_base_path", requires = "model_name")]
    model_base_path: Option<PathBuf>,

    /// TOML file describing the server and every model it serves
    /// (see examples/sluice.toml).
    #[arg(long = "model_config_file", conflicts_with = "model_name")]
    model_config_file: Option<PathBuf>,

    /// Batch requests to every model that has no batching of its own in the
    /// config file: as --batching_parameters_file says, or, without one,
    /// in auto mode (batch sizes and waits learned to a 10 ms target).
    /// (`--enable_batching` or `--enable_batching=true`, as TF Serving.)
    #[arg(long = "enable_batching", num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    enable_batching: bool,

    /// Batching parameters: TF Serving's text format file (max_batch_size
    /// { value: 32 } …) or, ending in .toml, the TOML form.
    #[arg(long = "batching_parameters_file", requires = "enable_batching")]
    batching_parameters_file: Option<PathBuf>,

    /// Path of libonnxruntime.so.*; by default looked for in .ort/ (installed
    /// by scripts/setup), $ORT_DYLIB_PATH and the system library directories.
    #[arg(long = "onnxruntime_library", env = "ORT_DYLIB_PATH")]
    onnxruntime_library: Option<PathBuf>,

    /// How numeric outputs are written: typed fields (float_val, …; TF
    /// Serving's default) or packed tensor_content (faster).
    #[arg(long = "output_encoding", value_enum)]
    output_encoding: Option<OutputEncoding>,

    /// ONNX Runtime sessions (inference threads) per model version, for the
    /// model given by --model_name.
    #[arg(long = "sessions")]
    sessions: Option<usize>,

    /// Threads inside one ONNX Runtime run, for the model given by --model_name.
    #[arg(long = "intra_op_threads")]
    intra_op_threads: Option<usize>,

    /// Seconds in-flight requests get to finish after SIGTERM or Ctrl-C.
    #[arg(long = "drain_timeout", env = "SLUICE_DRAIN_TIMEOUT")]
    drain_timeout: Option<u64>,

    /// Nice steps the compute threads (inference, pipelined stages) run
    /// below the network threads, 0–19 (`server.compute_nice`; default 0,
    /// alike). Above 0 refusals and probes stay fast on a saturated CPU,
    /// at a cost in peak throughput.
    #[arg(long = "compute_nice", env = "SLUICE_COMPUTE_NICE")]
    compute_nice: Option<usize>,

    /// The most a batch may cost, in microseconds, to run on the network
    /// thread that decoded it rather than on an inference thread, 0–1000
    /// (`server.inline_inference_micros`; default 50, 0: never).
    #[arg(long = "inline_inference_micros", env = "SLUICE_INLINE_INFERENCE_MICROS")]
    inline_inference_micros: Option<u64>,

    /// Which threads serve the gRPC port: per-core (a single-threaded
    /// runtime per core, the default) or shared (`server.grpc_threads`).
    #[arg(long = "grpc_threads", value_enum, env = "SLUICE_GRPC_THREADS")]
    grpc_threads: Option<GrpcThreads>,

    /// Export request traces over OTLP/gRPC to this collector
    /// (`http://collector:4317`; `tracing.otlp_endpoint`).
    #[arg(long = "otlp_endpoint", env = "SLUICE_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,

    /// The share of requests without a W3C traceparent that are traced,
    /// 0–1 (`tracing.sampling_ratio`; default 0.01).
    #[arg(long = "trace_sampling_ratio", env = "SLUICE_TRACE_SAMPLING_RATIO")]
    trace_sampling_ratio: Option<f64>,

    #[command(flatten)]
    tf_serving: TfServingFlags,
}

/// The other flags TF Serving's own test harness passes to every server it
/// starts, so the same command line starts sluice. `docs/CONFIG.md` says
/// what each does here.
#[derive(Args)]
struct TfServingFlags {
    /// Also serve gRPC on this Unix socket.
    #[arg(long = "grpc_socket_path")]
    grpc_socket_path: Option<PathBuf>,

    /// gRPC channel arguments, `key=value,…`: grpc.max_receive_message_length
    /// and grpc.max_send_message_length set the message limit; others are
    /// named in a warning and ignored.
    #[arg(long = "grpc_channel_arguments")]
    grpc_channel_arguments: Option<String>,

    /// The deadline of each REST request, in milliseconds.
    #[arg(long = "rest_api_timeout_in_ms")]
    rest_api_timeout_in_ms: Option<u64>,

    /// Accepted; REST is served by the async runtime's threads.
    #[arg(long = "rest_api_num_threads")]
    rest_api_num_threads: Option<u64>,

    /// ONNX Runtime intra-op threads for every model, unless
    /// --tensorflow_intra_op_parallelism says otherwise.
    #[arg(long = "tensorflow_session_parallelism")]
    tensorflow_session_parallelism: Option<usize>,

    /// ONNX Runtime intra-op threads (threads inside one run) for every model.
    #[arg(long = "tensorflow_intra_op_parallelism")]
    tensorflow_intra_op_parallelism: Option<usize>,

    /// ONNX Runtime sessions (runs at once) per model version.
    #[arg(long = "tensorflow_inter_op_parallelism")]
    tensorflow_inter_op_parallelism: Option<usize>,

    /// Warm every new version up before it serves: its TF Serving warmup
    /// file (assets.extra/tf_serving_warmup_requests) when it has one,
    /// else zeros at each batch size it runs. On by default.
    #[arg(long = "enable_model_warmup", num_args = 0..=1, default_missing_value = "true")]
    enable_model_warmup: Option<bool>,

    /// Seconds between re-reads of each model's base path: new versions in
    /// the policy are loaded, warmed up and served, old ones drained and
    /// unloaded. Default 1; 0: versions are read at start-up only.
    #[arg(long = "file_system_poll_wait_seconds")]
    file_system_poll_wait_seconds: Option<u64>,

    /// Seconds between re-reads of --model_config_file; a change adds and
    /// removes models and changes policies and labels. 0 (default): read
    /// at start-up only.
    #[arg(long = "model_config_file_poll_wait_seconds")]
    model_config_file_poll_wait_seconds: Option<u64>,

    /// Versions loading at once across every model (lifecycle.max_concurrent_loads).
    #[arg(long = "num_load_threads")]
    num_load_threads: Option<usize>,

    /// TF Serving's MonitoringConfig (text format):
    /// `prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }`;
    /// the metrics then answer on that path too.
    #[arg(long = "monitoring_config_file")]
    monitoring_config_file: Option<PathBuf>,

    /// TF Serving's SSLConfig (text format: server_key, server_cert,
    /// custom_ca, client_verify, the PEM blocks inline): TLS, and with
    /// client_verify mutual TLS, on the gRPC, REST and admin ports
    /// (`server.tls`); the file is re-read when it changes.
    #[arg(long = "ssl_config_file")]
    ssl_config_file: Option<PathBuf>,
}

impl TfServingFlags {
    fn apply(self, config: &mut Config) -> anyhow::Result<()> {
        if let Some(path) = self.grpc_socket_path {
            config.server.grpc_socket_path = Some(path);
        }
        if let Some(arguments) = &self.grpc_channel_arguments {
            for argument in arguments.split(',').map(str::trim).filter(|a| !a.is_empty()) {
                let (key, value) = argument.split_once('=').unwrap_or((argument, ""));
                match key {
                    "grpc.max_receive_message_length" | "grpc.max_send_message_length" => {
                        let bytes: usize = value.parse().with_context(|| {
                            format!("--grpc_channel_arguments: {key}={value}: expected a number of bytes")
                        })?;
                        config.server.max_message_bytes = config.server.max_message_bytes.max(bytes);
                    }
                    other => tracing::warn!("--grpc_channel_arguments: {other} has no equivalent in sluice; ignored"),
                }
            }
        }
        if let Some(ms) = self.rest_api_timeout_in_ms {
            config.server.rest_api_timeout_ms = Some(ms);
        }
        // Kept as defaults, so models a config reload adds get them too.
        let defaults = &mut config.lifecycle.model_defaults;
        defaults.intra_op_threads =
            self.tensorflow_intra_op_parallelism.or(self.tensorflow_session_parallelism).filter(|&n| n > 0);
        defaults.sessions = self.tensorflow_inter_op_parallelism.filter(|&n| n > 0);
        if let Some(seconds) = self.file_system_poll_wait_seconds {
            config.lifecycle.file_system_poll_wait_seconds = seconds;
        }
        if let Some(seconds) = self.model_config_file_poll_wait_seconds {
            config.lifecycle.model_config_file_poll_wait_seconds = seconds;
        }
        if let Some(warmup) = self.enable_model_warmup {
            config.lifecycle.warmup = warmup;
        }
        if let Some(threads) = self.num_load_threads.filter(|&n| n > 0) {
            config.lifecycle.max_concurrent_loads = threads;
        }
        if let Some(path) = &self.monitoring_config_file {
            config.server.metrics_path = prometheus_path(path)?;
        }
        if let Some(path) = &self.ssl_config_file {
            config.server.tls = Some(sluice::config::TlsConfig::from_ssl_config_file(path.clone()));
        }
        Ok(())
    }
}

/// The metrics path a TF Serving MonitoringConfig file enables, if any.
fn prometheus_path(path: &std::path::Path) -> anyhow::Result<Option<String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("--monitoring_config_file {}", path.display()))?;
    sluice::config::tf_model_config::prometheus_path(&text)
        .map_err(|e| anyhow::anyhow!("--monitoring_config_file {}: {e}", path.display()))
}

impl ServeArgs {
    fn into_config(self) -> anyhow::Result<Config> {
        let mut config = match &self.model_config_file {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        if let (Some(name), Some(base_path)) = (self.model_name, self.model_base_path) {
            let mut model = ModelConfig::from_flags(name, base_path);
            if let Some(sessions) = self.sessions {
                model.onnx.sessions = sessions;
            }
            if let Some(threads) = self.intra_op_threads {
                model.onnx.intra_op_threads = threads;
            }
            config.models.push(model);
        }
        if self.enable_batching {
            let params = match &self.batching_parameters_file {
                Some(path) => BatchingParameters::from_file(path).map_err(anyhow::Error::msg)?,
                // No parameters to tune: the batcher learns them.
                None => BatchingParameters::auto(),
            };
            config.lifecycle.model_defaults.batching = Some(params);
        }
        config.lifecycle.model_config_file.clone_from(&self.model_config_file);
        if let Some(port) = self.port {
            config.server.port = port;
        }
        if let Some(port) = self.rest_api_port {
            config.server.rest_api_port = port;
        }
        if let Some(host) = self.host {
            config.server.host = host;
        }
        if let Some(library) = self.onnxruntime_library {
            config.onnxruntime.library = Some(library);
        }
        if let Some(encoding) = self.output_encoding {
            config.server.output_encoding = encoding;
        }
        if let Some(drain) = self.drain_timeout {
            config.server.drain_timeout_secs = drain;
        }
        if let Some(nice) = self.compute_nice {
            config.server.compute_nice = nice;
        }
        if let Some(micros) = self.inline_inference_micros {
            config.server.inline_inference_micros = micros;
        }
        if let Some(threads) = self.grpc_threads {
            config.server.grpc_threads = threads;
        }
        if let Some(endpoint) = self.otlp_endpoint {
            config.tracing.otlp_endpoint = Some(endpoint);
        }
        if let Some(ratio) = self.trace_sampling_ratio {
            config.tracing.sampling_ratio = ratio;
        }
        self.tf_serving.apply(&mut config)?;
        let defaults = config.lifecycle.model_defaults.clone();
        for model in &mut config.models {
            defaults.apply(model);
        }
        if config.lifecycle.model_config_file_poll_wait_seconds > 0 && config.lifecycle.model_config_file.is_none() {
            anyhow::bail!(
                "--model_config_file_poll_wait_seconds needs --model_config_file: there is no file to re-read"
            );
        }
        config.check().map_err(|message| anyhow::anyhow!("command line: {message}"))?;
        if config.models.is_empty() {
            anyhow::bail!("nothing to serve: pass --model_name and --model_base_path, or --model_config_file");
        }
        Ok(config)
    }
}

/// Installs the log (text or JSON lines on stderr, filtered by `filter`)
/// and, when `tracing` names a collector, the trace exporter, whose handle
/// must live until the end. Call it inside the async runtime.
fn init_logging(
    filter: &str,
    format: &str,
    tracing: Option<&sluice::config::TracingConfig>,
) -> anyhow::Result<Option<sluice::server::telemetry::Telemetry>> {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let filter = tracing_subscriber::EnvFilter::try_new(filter).with_context(|| format!("--log_level {filter}"))?;
    let log = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(std::io::stderr().is_terminal());
    let log = if format == "json" { log.json().boxed() } else { log.boxed() };
    let (traces, telemetry) = match tracing {
        Some(config) => match sluice::server::telemetry::layer(config)? {
            Some((layer, telemetry)) => (Some(layer), Some(telemetry)),
            None => (None, None),
        },
        None => (None, None),
    };
    tracing_subscriber::registry().with(log.with_filter(filter)).with(traces).try_init()?;
    Ok(telemetry)
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!("cannot listen for Ctrl-C: {e}");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("Ctrl-C received"),
        () = terminate => tracing::info!("SIGTERM received"),
    }
}

/// Lines on stdout that scripts and tests wait for: the HTTP port as soon
/// as it opens (health and metrics answer while models load), the gRPC
/// port once everything is ready.
struct StdoutAnnounce;

impl sluice::server::Announce for StdoutAnnounce {
    fn http_open(&mut self, addresses: sluice::server::Addresses) {
        println!("sluice: serving HTTP on {}", addresses.http);
        if let Some(admin) = addresses.admin {
            println!("sluice: serving admin on {admin}");
        }
    }

    fn ready(&mut self, addresses: sluice::server::Addresses) {
        println!("sluice: serving gRPC on {}", addresses.grpc);
    }
}

async fn serve(config: Config) -> anyhow::Result<()> {
    sluice::server::serve(config, shutdown_signal(), StdoutAnnounce).await?;
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("sluice: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // A server's config is read before its log starts, as it says whether
    // traces are exported; what reading it logs goes to a plain log.
    let (command, server_config) = match cli.command {
        Command::Serve(args) => {
            let early = tracing_subscriber::fmt().with_writer(std::io::stderr).finish();
            match tracing::subscriber::with_default(early, || args.into_config()) {
                Ok(config) => (None, Some(config)),
                Err(e) => {
                    eprintln!("sluice: {e:#}");
                    return ExitCode::FAILURE;
                }
            }
        }
        other => (Some(other), None),
    };
    // Kept to the end, and dropped before the runtime: it flushes traces.
    let _telemetry = {
        let _in_runtime = runtime.enter();
        match init_logging(&cli.log_level, &cli.log_format, server_config.as_ref().map(|c| &c.tracing)) {
            Ok(telemetry) => telemetry,
            Err(e) => {
                eprintln!("sluice: {e:#}");
                return ExitCode::from(2);
            }
        }
    };
    let serving = server_config.is_some();
    let result = runtime.block_on(async {
        let Some(command) = command else {
            return match server_config {
                Some(config) => serve(config).await,
                None => Err(anyhow::anyhow!("no command and no server config, this is a bug")),
            };
        };
        match command {
            Command::Serve(_) => Err(anyhow::anyhow!("serve is started above, this is a bug")),
            Command::Bench(args) => sluice::cli::bench::run(args).await,
            Command::Plugin(PluginCommand::Check(args)) => {
                let report = tokio::task::spawn_blocking(move || sluice::cli::plugin_check::run(&args))
                    .await
                    .map_err(|e| anyhow::anyhow!("the check panicked: {e}"))??;
                print!("{report}");
                Ok(())
            }
            Command::Plugin(PluginCommand::New(args)) => {
                println!("{}", sluice::cli::plugin_new::create(&args).await?);
                Ok(())
            }
            Command::Plugin(PluginCommand::Push(args)) => {
                println!("{}", sluice::cli::plugin_push::push(&args).await?);
                Ok(())
            }
            Command::Plugin(PluginCommand::List(args)) => {
                println!("{}", sluice::cli::plugin_push::list(&args).await?);
                Ok(())
            }
            Command::Plugin(PluginCommand::Show(args)) => {
                println!("{}", sluice::cli::plugin_push::show(&args).await?);
                Ok(())
            }
            Command::Plugin(PluginCommand::Activate(args)) => {
                println!("{}", sluice::cli::plugin_push::activate(&args).await?);
                Ok(())
            }
            Command::Plugin(PluginCommand::Rollback(args)) => {
                println!("{}", sluice::cli::plugin_push::rollback(&args).await?);
                Ok(())
            }
            Command::Plugin(PluginCommand::Delete(args)) => {
                println!("{}", sluice::cli::plugin_push::delete(&args).await?);
                Ok(())
            }
            Command::Features(FeaturesCommand::Load(args)) => {
                println!("{}", sluice::cli::features_load::load(&args).await?);
                Ok(())
            }
            Command::Warmup(WarmupCommand::Make(args)) => {
                println!("{}", sluice::cli::warmup_make::make(&args).await?);
                Ok(())
            }
            Command::Config(ConfigCommand::Check { file }) => {
                let summary = sluice::cli::config_check::check(&file).await?;
                println!("{}: ok", file.display());
                print!("{summary}");
                Ok(())
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A server's failure also goes to its log (JSON for log
            // pipelines); a command's is for the person who typed it.
            if serving {
                tracing::error!("{e:#}");
            }
            eprintln!("sluice: {e:#}");
            ExitCode::FAILURE
        }
    }
}
