//! What TLS costs, side by side in one run: the same build
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

mod support;

use std::path::Path;
use std::time::Duration;

use sluice::cli::bench::client::tls_config;
use support::{arg, interleaved_rounds, pool, print_against_first, sluice, Side};

fn config(root: &Path, tls: &str) -> String {
    format!(
        "{tls}\n[[models]]\nname = \"mlp\"\nbase_path = \"{}\"\nonnx = {{ sessions = 2, intra_op_threads = 1 }}\n",
        root.join("examples/models/mlp").display()
    )
}

fn main() {
    let duration = Duration::from_secs(arg("--duration").unwrap_or(5));
    let rounds: usize = arg("--rounds").unwrap_or(3);
    let root = support::fixtures::root();
    let dir = tempfile::tempdir().expect("temp dir");
    let pki = support::pki::Pki::new();
    let runtime = support::runtime();
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
            Side::new(name, server, target, tls)
        })
        .collect();
    let requests = pool(&runtime, &sides[0].target, "mlp");
    interleaved_rounds(&runtime, &mut sides, &requests, rounds, duration);
    print_against_first(&sides, "plaintext");
}
