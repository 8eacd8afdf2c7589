//! What seeing requests costs, side by side in one run: the
//! same build serving the MLP (batch 1, 64 streams over 4 connections,
//! closed loop) plain, with its request log at sampling 0.01 and 1.0, and
//! with traces at 1% and 100% exported to an OTLP collector running in
//! this process. Each server is loaded in turn, `--rounds` times over
//! (`support::interleaved_rounds`); the report gives each side's median
//! requests per second and server CPU per request, and their ratios to the
//! plain server.
//!
//! ```text
//! cargo bench --bench observe [-- --duration 5 --rounds 3]
//! ```

mod support;

use std::path::Path;
use std::time::Duration;

use support::otlp::Collector;
use support::{arg, interleaved_rounds, pool, print_against_first, sluice, Side};

fn config(root: &Path, logging: Option<(&Path, f64)>, tracing: Option<(&str, f64)>) -> String {
    let mut text = String::new();
    if let Some((endpoint, ratio)) = tracing {
        text += &format!("[tracing]\notlp_endpoint = \"{endpoint}\"\nsampling_ratio = {ratio}\n\n");
    }
    text += &format!(
        "[[models]]\nname = \"mlp\"\nbase_path = \"{}\"\nonnx = {{ sessions = 2, intra_op_threads = 1 }}\n",
        root.join("examples/models/mlp").display()
    );
    if let Some((prefix, rate)) = logging {
        text += &format!("logging = {{ filename_prefix = \"{}\", sampling_rate = {rate} }}\n", prefix.display());
    }
    text
}

fn main() {
    let duration = Duration::from_secs(arg("--duration").unwrap_or(5));
    let rounds: usize = arg("--rounds").unwrap_or(3);
    let root = support::fixtures::root();
    let dir = tempfile::tempdir().expect("temp dir");
    let runtime = support::runtime();
    let (collector, endpoint) = runtime.block_on(Collector::start(false));
    let variants: Vec<(&str, Option<f64>, Option<f64>)> = vec![
        ("plain", None, None),
        ("request log at 0.01", Some(0.01), None),
        ("request log at 1.0", Some(1.0), None),
        ("traces at 1%", None, Some(0.01)),
        ("traces at 100%", None, Some(1.0)),
    ];
    let mut sides: Vec<Side> = variants
        .into_iter()
        .enumerate()
        .map(|(i, (name, log, trace))| {
            let prefix = dir.path().join(format!("logs{i}/mlp"));
            let text = config(&root, log.map(|rate| (prefix.as_path(), rate)), trace.map(|r| (endpoint.as_str(), r)));
            let path = dir.path().join(format!("observe{i}.toml"));
            std::fs::write(&path, text).expect("write config");
            let server = sluice(&path, &[]);
            let target = server.url();
            Side::new(name, server, target, None)
        })
        .collect();
    let requests = pool(&runtime, &sides[0].target, "mlp");
    interleaved_rounds(&runtime, &mut sides, &requests, rounds, duration);
    print_against_first(&sides, "plain");
    println!("spans received by the collector: {}", collector.count());
    for (i, side) in sides.iter().enumerate() {
        let bytes: u64 = std::fs::read_dir(dir.path().join(format!("logs{i}")))
            .map(|files| files.filter_map(|f| f.ok()?.metadata().ok()).map(|m| m.len()).sum())
            .unwrap_or(0);
        if bytes > 0 {
            println!("{}: {:.1} MiB of request log written", side.name, bytes as f64 / (1 << 20) as f64);
        }
    }
}
