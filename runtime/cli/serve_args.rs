//! `sluice serve`'s command line: TF Serving's flags, named as TF Serving
//! names them, and the few of sluice's own, turned into one checked
//! [`Config`] (flags override the config file). `main` parses them and
//! serves what [`ServeArgs::into_config`] answers.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::config::{BatchingParameters, Config, GrpcThreads, ModelConfig, OutputEncoding};

/// Flags named as TF Serving names them, so its users feel at home. Flags
/// override the config file.
#[derive(Args)]
pub struct ServeArgs {
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

    /// Path of TensorFlow's library, for SavedModels: libtensorflow_cc.so.2
    /// (the tensorflow-cpu wheel's) or libtensorflow.so.2; by default
    /// looked for in .cache/tf-venv/ (scripts/setup --tensorflow),
    /// $TENSORFLOW_LIBRARY and the system library directories.
    #[arg(long = "tensorflow_library", env = "TENSORFLOW_LIBRARY")]
    tensorflow_library: Option<PathBuf>,

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

    /// Seconds after SIGTERM during which the server reports not ready
    /// (readiness 503, gRPC health NOT_SERVING) yet still serves every call,
    /// before it closes its ports and drains (`server.drain_delay_secs`,
    /// default 5; Ctrl-C skips it).
    #[arg(long = "drain_delay", env = "SLUICE_DRAIN_DELAY")]
    drain_delay: Option<u64>,

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

    /// Refuse gRPC calls to a saturated pipeline on their HTTP/2 stream
    /// (REFUSED_STREAM) before reading them (`server.push_back`; default
    /// true).
    #[arg(long = "push_back", env = "SLUICE_PUSH_BACK", num_args = 0..=1, default_missing_value = "true")]
    push_back: Option<bool>,

    /// Export request traces over OTLP/gRPC to this collector
    /// (`http://collector:4317`; `tracing.otlp_endpoint`).
    #[arg(long = "otlp_endpoint", env = "SLUICE_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,

    /// The share of requests without a W3C traceparent that are traced,
    /// 0–1 (`tracing.sampling_ratio`; default 0.01).
    #[arg(long = "trace_sampling_ratio", env = "SLUICE_TRACE_SAMPLING_RATIO")]
    trace_sampling_ratio: Option<f64>,

    /// Print sluice's version and exit (TF Serving's `--version`).
    #[arg(long = "version")]
    pub version: bool,

    #[command(flatten)]
    tf_serving: TfServingFlags,

    #[command(flatten)]
    tf_serving_without_effect: TfServingFlagsWithoutEffect,
}

/// The other flags TF Serving's own test harness passes to every server it
/// starts, so the same command line starts sluice. `docs/CONFIG.md` says
/// what each does here.
#[derive(Args)]
pub struct TfServingFlags {
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

    /// ONNX Runtime's and TensorFlow's intra-op threads for every model,
    /// unless --tensorflow_intra_op_parallelism says otherwise.
    #[arg(long = "tensorflow_session_parallelism")]
    tensorflow_session_parallelism: Option<usize>,

    /// Intra-op threads (threads inside one op) for every model: ONNX
    /// Runtime's per session, TensorFlow's per SavedModel version.
    #[arg(long = "tensorflow_intra_op_parallelism")]
    tensorflow_intra_op_parallelism: Option<usize>,

    /// ONNX Runtime sessions (runs at once) per model version; for
    /// SavedModels, TensorFlow's inter-op threads (ops at once in a run).
    #[arg(long = "tensorflow_inter_op_parallelism")]
    tensorflow_inter_op_parallelism: Option<usize>,

    /// The tags of the MetaGraph to load from each SavedModel,
    /// comma-separated (TF Serving's flag; default "serve").
    #[arg(long = "saved_model_tags", value_delimiter = ',')]
    saved_model_tags: Option<Vec<String>>,

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

    /// A label may name a version not AVAILABLE yet when the model has no
    /// such label so far (`lifecycle.allow_version_labels_for_unavailable_models`).
    #[arg(long = "allow_version_labels_for_unavailable_models", num_args = 0..=1, default_missing_value = "true")]
    allow_version_labels_for_unavailable_models: Option<bool>,

    /// Times a version whose load failed is tried again while polling,
    /// besides when its file changes (`lifecycle.max_load_retries`, default 5).
    #[arg(long = "max_num_load_retries")]
    max_num_load_retries: Option<u32>,

    /// Microseconds between those tries (`lifecycle.load_retry_interval_ms`;
    /// default one minute; at least 10 ms).
    #[arg(long = "load_retry_interval_micros")]
    load_retry_interval_micros: Option<u64>,

    /// How often each warmup request runs (`lifecycle.warmup_iterations`;
    /// 0 keeps the default, 1).
    #[arg(long = "num_request_iterations_for_warmup")]
    num_request_iterations_for_warmup: Option<usize>,

    /// Predict answers carry numbers packed in tensor_content
    /// (`server.output_encoding = "tensor_content"`).
    #[arg(long = "enable_serialization_as_tensor_content", num_args = 0..=1, default_missing_value = "true")]
    enable_serialization_as_tensor_content: Option<bool>,

    /// Accepted: sluice keeps no file system caches to flush after loading.
    #[arg(long = "flush_filesystem_caches", num_args = 0..=1, default_missing_value = "true")]
    flush_filesystem_caches: Option<bool>,

    /// Accepted: the standard gRPC health service is always on.
    #[arg(long = "enable_grpc_healthcheck_service", num_args = 0..=1, default_missing_value = "true")]
    enable_grpc_healthcheck_service: Option<bool>,

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
        set(&mut config.server.grpc_socket_path, self.grpc_socket_path.map(Some));
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
                    "grpc.max_connection_age_ms" | "grpc.max_connection_age_grace_ms" => {
                        let millis: u64 = value.parse().with_context(|| {
                            format!("--grpc_channel_arguments: {key}={value}: expected milliseconds")
                        })?;
                        // gRPC's INT_MAX means "no limit".
                        let millis = (millis < i32::MAX as u64).then_some(millis);
                        match key {
                            "grpc.max_connection_age_ms" => config.server.max_connection_age_ms = millis,
                            _ => config.server.max_connection_age_grace_ms = millis,
                        }
                    }
                    other => tracing::warn!("--grpc_channel_arguments: {other} has no equivalent in sluice; ignored"),
                }
            }
        }
        set(&mut config.server.rest_api_timeout_ms, self.rest_api_timeout_in_ms.map(Some));
        // Kept as defaults, so models a config reload adds get them too.
        let defaults = &mut config.lifecycle.model_defaults;
        defaults.intra_op_threads =
            self.tensorflow_intra_op_parallelism.or(self.tensorflow_session_parallelism).filter(|&n| n > 0);
        defaults.sessions = self.tensorflow_inter_op_parallelism.filter(|&n| n > 0);
        defaults.tensorflow_intra_op_threads = defaults.intra_op_threads;
        defaults.tensorflow_inter_op_threads = defaults.sessions;
        defaults.saved_model_tags = self.saved_model_tags.clone();
        set(&mut config.lifecycle.file_system_poll_wait_seconds, self.file_system_poll_wait_seconds);
        set(&mut config.lifecycle.model_config_file_poll_wait_seconds, self.model_config_file_poll_wait_seconds);
        set(&mut config.lifecycle.warmup, self.enable_model_warmup);
        if let Some(threads) = self.num_load_threads.filter(|&n| n > 0) {
            config.lifecycle.max_concurrent_loads = threads;
        }
        set(
            &mut config.lifecycle.allow_version_labels_for_unavailable_models,
            self.allow_version_labels_for_unavailable_models,
        );
        set(&mut config.lifecycle.max_load_retries, self.max_num_load_retries);
        if let Some(micros) = self.load_retry_interval_micros {
            // TensorFlow retries at once for 0; a poll's pace is the floor here.
            config.lifecycle.load_retry_interval_ms = micros.div_ceil(1000).max(10);
        }
        if let Some(iterations) = self.num_request_iterations_for_warmup.filter(|&n| n > 0) {
            config.lifecycle.warmup_iterations = iterations;
        }
        if self.enable_serialization_as_tensor_content == Some(true) {
            config.server.output_encoding = OutputEncoding::TensorContent;
        }
        if let Some(path) = &self.monitoring_config_file {
            config.server.metrics_path = prometheus_path(path)?;
        }
        if let Some(path) = &self.ssl_config_file {
            config.server.tls = Some(crate::config::TlsConfig::from_ssl_config_file(path.clone()));
        }
        Ok(())
    }
}

/// TF Serving's flags that have no equivalent in sluice (TensorFlow's own
/// runtime, TPUs, TFLite, its thread pools): accepted, so that a TF
/// Serving command line starts sluice unchanged, and named in one warning
/// when given. docs/CONFIG.md says why each has no effect.
macro_rules! flags_without_effect {
    ($($field:ident),* $(,)?) => {
        /// TF Serving's flags without an effect here.
        #[derive(Args)]
        pub struct TfServingFlagsWithoutEffect {
            $(
                #[arg(long = stringify!($field), hide = true, num_args = 0..=1, default_missing_value = "true")]
                $field: Option<String>,
            )*
        }

        impl TfServingFlagsWithoutEffect {
            /// `--name=value` of each one given.
            fn given(&self) -> Vec<String> {
                let mut given = Vec::new();
                $(
                    if let Some(value) = &self.$field {
                        given.push(format!("--{}={value}", stringify!($field)));
                    }
                )*
                given
            }
        }
    };
}

flags_without_effect!(
    enable_signature_method_name_check,
    enable_per_model_batching_parameters,
    enable_profiler,
    grpc_max_threads,
    mixed_precision,
    num_tflite_interpreters_per_pool,
    num_tflite_pools,
    num_unload_threads,
    per_process_gpu_memory_fraction,
    platform_config_file,
    prefer_tflite_model,
    remove_unused_fields_from_bundle_metagraph,
    rest_api_enable_cors_support,
    skip_initialize_tpu,
    tensorflow_session_config_file,
    thread_pool_factory_config_file,
    use_alts_credentials,
    xla_cpu_compilation_enabled,
    xla_gpu_compilation_enabled,
);

/// A flag given overrides what the config file set.
fn set<T>(slot: &mut T, flag: Option<T>) {
    if let Some(value) = flag {
        *slot = value;
    }
}

/// The metrics path a TF Serving MonitoringConfig file enables, if any.
fn prometheus_path(path: &std::path::Path) -> anyhow::Result<Option<String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("--monitoring_config_file {}", path.display()))?;
    crate::config::tf_model_config::prometheus_path(&text)
        .map_err(|e| anyhow::anyhow!("--monitoring_config_file {}: {e}", path.display()))
}

impl ServeArgs {
    /// The config these flags (and the file they name) describe, checked.
    pub fn into_config(self) -> anyhow::Result<Config> {
        let mut config = match &self.model_config_file {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        if let (Some(name), Some(base_path)) = (self.model_name, self.model_base_path) {
            let mut model = ModelConfig::from_flags(name, base_path);
            set(&mut model.onnx.sessions, self.sessions);
            set(&mut model.onnx.intra_op_threads, self.intra_op_threads);
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
        set(&mut config.server.port, self.port);
        set(&mut config.server.rest_api_port, self.rest_api_port);
        set(&mut config.server.host, self.host);
        set(&mut config.onnxruntime.library, self.onnxruntime_library.map(Some));
        set(&mut config.tensorflow.library, self.tensorflow_library.map(Some));
        set(&mut config.server.output_encoding, self.output_encoding);
        set(&mut config.server.drain_timeout_secs, self.drain_timeout);
        set(&mut config.server.drain_delay_secs, self.drain_delay);
        set(&mut config.server.compute_nice, self.compute_nice);
        set(&mut config.server.inline_inference_micros, self.inline_inference_micros);
        set(&mut config.server.grpc_threads, self.grpc_threads);
        set(&mut config.server.push_back, self.push_back);
        set(&mut config.tracing.otlp_endpoint, self.otlp_endpoint.map(Some));
        set(&mut config.tracing.sampling_ratio, self.trace_sampling_ratio);
        self.tf_serving.apply(&mut config)?;
        let without_effect = self.tf_serving_without_effect.given();
        if !without_effect.is_empty() {
            tracing::warn!(
                "TF Serving flags with no effect in sluice, accepted and ignored: {} (docs/CONFIG.md says why)",
                without_effect.join(" ")
            );
        }
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
