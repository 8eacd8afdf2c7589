//! The `sluice` binary: the command line (`serve`'s flags are
//! `cli::serve_args`), logging and traces, signals, and the subcommands.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use sluice::config::Config;

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

// Parsed once at start-up: the variants' sizes cost nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Serve models over TF Serving's gRPC API.
    Serve(sluice::cli::serve_args::ServeArgs),
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
    /// Work with model versions.
    #[command(subcommand)]
    Model(ModelCommand),
}

#[derive(Subcommand)]
enum ModelCommand {
    /// Convert a SavedModel version to ONNX (tf2onnx), run both on its
    /// warmup and logged requests, report per output how far the answers
    /// differ and each one's CPU per request, and with --publish write the
    /// verified twin as the next version. Exits 1 when it does not verify.
    Twin(sluice::cli::model_twin::TwinArgs),
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
    /// Turn TF Serving's text config files (models.config, batching and
    /// monitoring files) into one sluice TOML file, printed.
    Convert(sluice::cli::config_convert::ConvertArgs),
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
    /// to it without a failed request; with --canary PERCENT, start it
    /// beside the active one for that share of the calls.
    Activate(sluice::cli::plugin_push::ActivateArgs),
    /// Make the running canary the active version.
    Promote(sluice::cli::plugin_push::NameArgs),
    /// End the running canary: the active version serves every call again.
    EndCanary(sluice::cli::plugin_push::NameArgs),
    /// Go back to the version active before the current one.
    Rollback(sluice::cli::plugin_push::NameArgs),
    /// Delete a stored version that is not active.
    Delete(sluice::cli::plugin_push::VersionArgs),
    /// The server's plugin compiler: reads a component on stdin and writes
    /// its compiled code on stdout. Run by sluice itself, one process per
    /// compilation, so that a compilation can be stopped.
    #[command(hide = true)]
    CompileWorker {
        /// `plugins.fuel` of the server.
        #[arg(long)]
        fuel: bool,
    },
}

/// What the log needs kept until the end: the trace exporter (it flushes
/// traces) and the log writer's thread (it flushes lines).
struct LogHandles {
    _telemetry: Option<sluice::server::telemetry::Telemetry>,
    _writer: tracing_appender::non_blocking::WorkerGuard,
}

/// Installs the log (text or JSON lines on stderr, filtered by `filter`,
/// written by a thread of its own so that no network thread ever waits on
/// stderr) and, when `tracing` names a collector, the trace exporter.
/// Call it inside the async runtime.
fn init_logging(
    filter: &str,
    format: &str,
    tracing: Option<&sluice::config::TracingConfig>,
) -> anyhow::Result<LogHandles> {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let mut filter = tracing_subscriber::EnvFilter::try_new(filter).with_context(|| format!("--log_level {filter}"))?;
    // The object-store client logs each retry at INFO; a store outage is
    // one line from the mirror instead (name `object_store` in the level
    // to see them).
    if !filter.to_string().contains("object_store") {
        filter = filter.add_directive("object_store=warn".parse().context("the object_store log directive")?);
    }
    // Lossy: past 128k lines waiting, lines are dropped rather than a
    // request held.
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .thread_name("sluice-log")
        .finish(std::io::stderr());
    let log = tracing_subscriber::fmt::layer().with_writer(writer).with_ansi(std::io::stderr().is_terminal());
    let log = if format == "json" { log.json().boxed() } else { log.boxed() };
    let (traces, telemetry) = match tracing {
        Some(config) => match sluice::server::telemetry::layer(config)? {
            Some((layer, telemetry)) => (Some(layer), Some(telemetry)),
            None => (None, None),
        },
        None => (None, None),
    };
    tracing_subscriber::registry().with(log.with_filter(filter)).with(traces).try_init()?;
    Ok(LogHandles { _telemetry: telemetry, _writer: guard })
}

/// Resolves on SIGTERM or Ctrl-C, saying which.
async fn shutdown_signal() -> sluice::server::Stop {
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
        () = ctrl_c => {
            tracing::info!("Ctrl-C received");
            sluice::server::Stop::Interrupt
        }
        () = terminate => {
            tracing::info!("SIGTERM received");
            sluice::server::Stop::Terminate
        }
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
    if let Command::Plugin(PluginCommand::CompileWorker { fuel }) = cli.command {
        return sluice::plugin::compiler::worker(&sluice::plugin::engine::engine_config(fuel));
    }
    // Plugins this process compiles (uploads, start-up, `plugin check`)
    // compile in children of this very executable: `/proc/self/exe` runs
    // it even after a deploy replaced the file.
    sluice::plugin::compiler::use_child_processes(PathBuf::from("/proc/self/exe"));
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
        Command::Serve(args) if args.version => {
            println!("sluice {} (TF Serving's gRPC and REST APIs)", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
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
    // Kept to the end, and dropped before the runtime: it flushes traces
    // and log lines.
    let _log = {
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
            Command::Plugin(PluginCommand::CompileWorker { .. }) => {
                Err(anyhow::anyhow!("compile-worker is run above, this is a bug"))
            }
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
            Command::Plugin(PluginCommand::Promote(args)) => {
                println!("{}", sluice::cli::plugin_push::promote(&args).await?);
                Ok(())
            }
            Command::Plugin(PluginCommand::EndCanary(args)) => {
                println!("{}", sluice::cli::plugin_push::end_canary(&args).await?);
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
            Command::Model(ModelCommand::Twin(args)) => {
                let outcome = sluice::cli::model_twin::twin(&args).await?;
                println!("{}", outcome.shown);
                if outcome.verified {
                    Ok(())
                } else {
                    Err(anyhow::anyhow!("the twin did not verify: {}", outcome.problems.join("; ")))
                }
            }
            Command::Config(ConfigCommand::Convert(args)) => {
                print!("{}", sluice::cli::config_convert::convert(&args)?);
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
