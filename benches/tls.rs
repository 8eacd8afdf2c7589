//! What TLS costs (issue 31), side by side in one run: the same build
//! serving the MLP unbatched (batch-1 requests, 64 streams over 4
//! connections, closed loop) in plaintext, in TLS and in mutual TLS, loaded
//! in turn, `--rounds` times over (interleaved, so drift on a noisy machine
//! hits every side alike). Reports each side's median requests per second
//! and server CPU per request, against plaintext. Connections are opened
//! once per run: this is the cost of encrypting the traffic, not of
//! handshakes.
//!
//! ```text
//! cargo bench --bench tls [-- --duration 5 --rounds 3]
//! ```

#[allow(dead_code)]
#[path = "../tests/common/pki.rs"]
mod pki;
#[allow(dead_code)]
#[path = "../tests/common/process.rs"]
mod process;
mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use process::ServerProcess;
use sluice::cli::bench::client::tls_config;
use sluice::cli::bench::load::{self, LoadPlan};
use support::{arg, cpu_seconds, pool, sluice};

fn config(root: &Path, tls: &str) -> String {
    format!(
        "{tls}\n[[models]]\nname = \"mlp\"\nbase_path = \"{}\"\nonnx = {{ sessions = 2, intra_op_threads = 1 }}\n",
        root.join("examples/models/mlp").display()
    )
}

struct Side {
    name: &'static str,
    server: ServerProcess,
    target: String,
    tls: Option<tonic::transport::ClientTlsConfig>,
    rps: Vec<f64>,
    cpu_us: Vec<f64>,
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

fn main() {
    let duration = Duration::from_secs(arg("--duration").unwrap_or(5));
    let rounds: usize = arg("--rounds").unwrap_or(3);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("temp dir");
    let pki = pki::Pki::new();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let server_tls = format!("cert_file = \"{}\"\nkey_file = \"{}\"\n", pki.arg("server.pem"), pki.arg("server.key"));
    let mutual = format!("{server_tls}client_ca_file = \"{}\"\nclient_verify = true\n", pki.arg("ca.pem"));
    let variants: [(&str, Option<String>, bool); 3] =
        [("plaintext", None, false), ("TLS", Some(server_tls), false), ("mutual TLS", Some(mutual), true)];
    let mut sides: Vec<Side> = variants
        .into_iter()
        .enumerate()
        .map(|(i, (name, tls, client_cert))| {
            let table = tls.as_ref().map(|t| format!("[server.tls]\n{t}")).unwrap_or_default();
            let path = dir.path().join(format!("tls{i}.toml"));
            std::fs::write(&path, config(&root, &table)).expect("write config");
            let server = sluice(&path, &[]);
            let port = server.addr.port();
            let (target, tls) = match tls {
                None => (format!("http://127.0.0.1:{port}"), None),
                Some(_) => {
                    let identity = client_cert.then(|| (pki.path("client.pem"), pki.path("client.key")));
                    let config =
                        tls_config(&pki.path("ca.pem"), identity.as_ref().map(|(c, k)| (c.as_path(), k.as_path())))
                            .expect("client TLS");
                    (format!("https://localhost:{port}"), Some(config))
                }
            };
            Side { name, server, target, tls, rps: Vec::new(), cpu_us: Vec::new() }
        })
        .collect();
    let requests = pool(&runtime, &sides[0].target, "mlp");
    for round in 0..rounds {
        for side in &mut sides {
            let plan = |duration| LoadPlan {
                warmup: Duration::ZERO,
                tls: side.tls.clone(),
                ..LoadPlan::closed(&side.target, 64, duration)
            };
            let run = |duration| runtime.block_on(load::run(&plan(duration), requests.requests.clone(), requests.rows));
            run(Duration::from_secs(1)).expect("warm-up");
            let before = cpu_seconds(Some(side.server.pid()));
            let summary = run(duration).expect("load");
            let cpu = cpu_seconds(Some(side.server.pid())) - before;
            let cpu_us = cpu * 1e6 / summary.requests.max(1) as f64;
            eprintln!(
                "round {round}, {}: {:.0} req/s, {cpu_us:.1} µs server CPU per request, {} errors",
                side.name,
                summary.requests_per_second,
                summary.requests - summary.ok
            );
            assert_eq!(summary.requests, summary.ok, "{} failed requests", side.name);
            side.rps.push(summary.requests_per_second);
            side.cpu_us.push(cpu_us);
        }
    }
    let (base_rps, base_cpu) = (median(&sides[0].rps), median(&sides[0].cpu_us));
    println!(
        "| side | req/s (median of {rounds}) | server CPU per request | throughput vs plaintext | CPU vs plaintext |"
    );
    println!("|---|---|---|---|---|");
    for side in &sides {
        let (rps, cpu) = (median(&side.rps), median(&side.cpu_us));
        println!("| {} | {rps:.0} | {cpu:.1} µs | {:.3}× | {:+.1} µs |", side.name, rps / base_rps, cpu - base_cpu);
    }
}
