//! TLS and mutual TLS on every port, through the real server, with the
//! clients teams use: TF Serving's official Python client over
//! `grpc.ssl_channel_credentials` (with and without a client certificate),
//! tritonclient's gRPC client with SSL, and curl with `--cert`. A wrong
//! CA, an expired certificate and a plaintext client each get a clear
//! refusal; certificates rotate on disk with no failed request; TF
//! Serving's `--ssl_config_file` is read as TF Serving writes it. Every
//! certificate is made here (rcgen).

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::pki::Pki;
use common::*;
use serde_json::Value;

fn mlp_config(tls: &str) -> String {
    format!(
        r#"
[server.tls]
{tls}

[[models]]
name = "mlp"
base_path = "$ROOT/examples/models/mlp"
onnx = {{ sessions = 1, intra_op_threads = 1 }}
"#
    )
}

/// One request by an official client: `kind` (`tfserving`, `triton`),
/// trusting `ca`, with a client certificate and key when given.
fn case(kind: &str, ca: &str, cert: Option<(&str, &str)>) -> Value {
    let mut case = serde_json::json!({ "kind": kind, "ca": ca });
    if let Some((cert, key)) = cert {
        case["cert"] = cert.into();
        case["key"] = key.into();
    }
    case
}

/// The official clients' answers to `cases`, in one Python process of
/// `venv` (TF Serving's client is in the TensorFlow venv, tritonclient in
/// the KServe one), one `{"ok": …}` per case.
fn clients(venv: &str, addr: SocketAddr, cases: &[Value]) -> Vec<Value> {
    let python = root().join(venv).join("bin/python");
    assert!(python.exists(), "{} is missing: run scripts/setup", python.display());
    let output = Command::new(python)
        .arg(root().join("tests/tls/clients.py"))
        .arg(format!("localhost:{}", addr.port()))
        .arg(Value::Array(cases.to_vec()).to_string())
        .env("TF_CPP_MIN_LOG_LEVEL", "3")
        .output()
        .expect("run the clients");
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap_or_else(|_| {
        panic!("the clients printed no answers: {stdout}\n{}", String::from_utf8_lossy(&output.stderr))
    })
}

/// TF Serving's Python client's answers to `cases`.
fn tf_clients(addr: SocketAddr, cases: &[Value]) -> Vec<Value> {
    clients(".cache/tf-venv", addr, cases)
}

fn tf_client(addr: SocketAddr, ca: &str, cert: Option<(&str, &str)>) -> Value {
    tf_clients(addr, &[case("tfserving", ca, cert)]).remove(0)
}

/// curl's exit code, stdout and stderr.
fn curl(args: &[&str]) -> (i32, String, String) {
    let output = Command::new("curl").args(["-sS", "--max-time", "20"]).args(args).output().expect("run curl");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn https(addr: SocketAddr, path: &str) -> String {
    format!("https://localhost:{}{path}", addr.port())
}

fn metric(pki: &Pki, addr: SocketAddr, series: &str) -> f64 {
    let (code, body, stderr) = curl(&[
        "--cacert",
        &pki.arg("ca.pem"),
        "--cert",
        &pki.arg("client.pem"),
        "--key",
        &pki.arg("client.key"),
        &https(addr, "/metrics"),
    ]);
    assert_eq!(code, 0, "metrics over TLS: {stderr}");
    metric_value(&body, series)
}

#[test]
fn mutual_tls_serves_official_clients_with_certificates_and_refuses_the_rest() {
    let pki = Pki::new();
    let server = Server::with_config(&mlp_config(&format!(
        "cert_file = \"{}\"\nkey_file = \"{}\"\nclient_ca_file = \"{}\"\nclient_verify = true",
        pki.arg("server.pem"),
        pki.arg("server.key"),
        pki.arg("ca.pem")
    )));
    let (ca, cert, key) = (pki.arg("ca.pem"), pki.arg("client.pem"), pki.arg("client.key"));

    // TF Serving's client and tritonclient, each with its certificate; and
    // refused in the handshake: no certificate, one from another CA, a
    // client that does not trust the server's CA.
    let rogue = (pki.arg("rogue-client.pem"), pki.arg("rogue-client.key"));
    let answers = tf_clients(
        server.grpc,
        &[
            case("tfserving", &ca, Some((&cert, &key))),
            case("tfserving", &ca, None),
            case("tfserving", &ca, Some((&rogue.0, &rogue.1))),
            case("tfserving", &pki.arg("rogue-ca.pem"), Some((&cert, &key))),
        ],
    );
    let answer = &answers[0];
    assert_eq!(answer["ok"], true, "{answer}");
    for (refused, what) in answers[1..].iter().zip(["no client certificate", "another CA's", "an untrusted server"]) {
        assert_eq!(refused["ok"], false, "{what}: {refused}");
        assert_eq!(refused["code"], "UNAVAILABLE", "{what}: {refused}");
    }
    let triton = clients(".cache/kserve-venv", server.grpc, &[case("triton", &ca, Some((&cert, &key)))]).remove(0);
    assert_eq!(triton["ok"], true, "{triton}");
    let refused = clients(".cache/kserve-venv", server.grpc, &[case("triton", &ca, None)]).remove(0);
    assert_eq!(refused["ok"], false, "tritonclient without a certificate: {refused}");
    assert_eq!(triton["first"], answer["first"], "both protocols answer the same over TLS");
    // curl on the REST port, with its certificate.
    let (code, body, stderr) =
        curl(&["--cacert", &ca, "--cert", &cert, "--key", &key, &https(server.http, "/v1/models/mlp")]);
    assert_eq!(code, 0, "{stderr}");
    assert!(body.contains("AVAILABLE"), "{body}");

    let (code, _, stderr) = curl(&["--cacert", &ca, &https(server.http, "/v1/models/mlp")]);
    assert_ne!(code, 0, "curl without a client certificate must be refused");
    assert!(stderr.contains("alert") || stderr.contains("certificate"), "{stderr}");
    let (code, _, stderr) = curl(&["--cacert", &pki.arg("rogue-ca.pem"), &https(server.http, "/v1/models/mlp")]);
    assert_eq!(code, 60, "curl refuses an unknown issuer: {stderr}");
    // Plaintext against a TLS port: told so in its own protocol, nothing served.
    let (code, body, stderr) = curl(&["-i", &format!("http://127.0.0.1:{}/v1/models/mlp", server.http.port())]);
    assert_eq!(code, 0, "{stderr}");
    assert!(body.starts_with("HTTP/1.1 400") && body.contains("this port serves TLS"), "{body}");
    let plain = format!("http://127.0.0.1:{}", server.grpc.port());
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let refused = runtime.block_on(async {
        let mut client =
            sluice::proto::tensorflow::serving::prediction_service_client::PredictionServiceClient::connect(plain)
                .await
                .expect("the TCP connection opens");
        client
            .predict(predict_request("mlp", vec![("x", f32_content(&[1, 64], &values(1, 64)))]))
            .await
            .expect_err("a plaintext gRPC call on a TLS port")
    });
    assert!(format!("{refused:?}").contains("this port serves TLS"), "{refused:?}");

    // sluice bench loads it over mutual TLS, every request answered.
    let target = format!("https://localhost:{}", server.grpc.port());
    let (code, stdout, stderr) = run_sluice(&[
        "bench",
        "--target",
        &target,
        "--model",
        "mlp",
        "--ca-cert",
        &ca,
        "--client-cert",
        &cert,
        "--client-key",
        &key,
        "--duration",
        "1s",
        "--warmup",
        "0s",
        "--concurrency",
        "4",
        "--connections",
        "1",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let summary: Value = serde_json::from_str(&stdout).expect("bench prints JSON");
    assert!(summary["ok"].as_u64().unwrap_or(0) > 0 && summary["ok"] == summary["requests"], "{summary}");

    // Every refusal was counted, and the server still serves.
    assert!(metric(&pki, server.http, "sluice_tls_handshake_failures_total{port=\"grpc\"}") >= 3.0);
    assert!(metric(&pki, server.http, "sluice_tls_handshake_failures_total{port=\"http\"}") >= 2.0);
    // And logged, with who and why.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut lines = Vec::new();
    let failed = loop {
        lines.extend(server.log());
        if let Some(line) = lines.iter().find(|l| l.contains("TLS handshake failed")) {
            break line.clone();
        }
        assert!(std::time::Instant::now() < deadline, "no failed handshake logged: {lines:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(failed.contains("127.0.0.1:"), "the peer is named: {failed}");
    let again = tf_client(server.grpc, &ca, Some((&cert, &key)));
    assert_eq!(again["ok"], true, "{again}");
}

#[test]
fn tls_without_client_verify_serves_any_client_that_trusts_the_server() {
    let pki = Pki::new();
    let server = Server::with_config(&mlp_config(&format!(
        "cert_file = \"{}\"\nkey_file = \"{}\"",
        pki.arg("server.pem"),
        pki.arg("server.key")
    )));
    let answer = tf_client(server.grpc, &pki.arg("ca.pem"), None);
    assert_eq!(answer["ok"], true, "{answer}");
    let (code, body, stderr) = curl(&["--cacert", &pki.arg("ca.pem"), &https(server.http, "/v1/models/mlp/metadata")]);
    assert_eq!(code, 0, "{stderr}");
    assert!(body.contains("serving_default"), "{body}");
}

#[test]
fn an_expired_certificate_is_refused_by_clients_naming_it() {
    let pki = Pki::new();
    let server = Server::with_config(&mlp_config(&format!(
        "cert_file = \"{}\"\nkey_file = \"{}\"",
        pki.arg("expired.pem"),
        pki.arg("expired.key")
    )));
    let (code, _, stderr) = curl(&["--cacert", &pki.arg("ca.pem"), &https(server.http, "/v1/models/mlp")]);
    assert_eq!(code, 60, "{stderr}");
    assert!(stderr.contains("expired"), "curl names the expired certificate: {stderr}");
    let answer = tf_client(server.grpc, &pki.arg("ca.pem"), None);
    assert_eq!(answer["code"], "UNAVAILABLE", "{answer}");
}

/// The subject CN of the certificate the server presents now.
fn served_name(pki: &Pki, addr: SocketAddr) -> String {
    let (code, _, stderr) = curl(&["-v", "--cacert", &pki.arg("ca.pem"), &https(addr, "/v1/models/mlp")]);
    assert_eq!(code, 0, "{stderr}");
    stderr
        .lines()
        .find_map(|l| l.split("subject: ").nth(1))
        .and_then(|subject| subject.split("CN=").nth(1))
        .map(|cn| cn.split([',', ';']).next().unwrap_or(cn).trim().to_string())
        .unwrap_or_else(|| panic!("no subject in curl's output: {stderr}"))
}

#[test]
fn certificates_rotate_on_disk_with_no_failed_request() {
    let pki = Pki::new();
    let (cert, key) = (pki.path("live.pem"), pki.path("live.key"));
    std::fs::copy(pki.path("server.pem"), &cert).expect("copy");
    std::fs::copy(pki.path("server.key"), &key).expect("copy");
    let server = Server::with_config(&mlp_config(&format!(
        "cert_file = \"{}\"\nkey_file = \"{}\"\nreload_interval_secs = 1",
        cert.display(),
        key.display()
    )));
    assert_eq!(served_name(&pki, server.http), "server-a");

    // New connections, one after another, while the files change.
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let load = {
        let (stop, sent, failed) = (stop.clone(), sent.clone(), failed.clone());
        let (ca, url) = (pki.arg("ca.pem"), https(server.http, "/v1/models/mlp:predict"));
        let body = serde_json::json!({ "instances": [values(1, 64)] }).to_string();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let (code, out, err) = curl(&["--cacert", &ca, "-d", &body, &url]);
                sent.fetch_add(1, Ordering::Relaxed);
                if code != 0 || !out.contains("predictions") {
                    failed.fetch_add(1, Ordering::Relaxed);
                    eprintln!("failed during the rotation: {code} {out} {err}");
                }
            }
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    // A half-done rotation (the new certificate, the old key) is refused
    // and the current pair keeps serving; the whole pair is taken.
    std::fs::copy(pki.path("server-b.pem"), &cert).expect("rotate the certificate");
    // Once the server has seen the half-done pair and refused it:
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while metric(&pki, server.http, r#"sluice_tls_reloads_total{outcome="refused"}"#) < 1.0 {
        assert!(std::time::Instant::now() < deadline, "the half-done rotation was not refused in 20 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(served_name(&pki, server.http), "server-a", "a key that does not match is not served");
    std::fs::copy(pki.path("server-b.key"), &key).expect("rotate the key");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while served_name(&pki, server.http) != "server-b" {
        assert!(std::time::Instant::now() < deadline, "the new certificate is not served");
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    load.join().expect("load thread");
    assert!(sent.load(Ordering::Relaxed) >= 5, "too few requests during the rotation");
    assert_eq!(failed.load(Ordering::Relaxed), 0, "requests failed during the rotation");
    let series = "sluice_tls_reloads_total";
    let body = curl(&["--cacert", &pki.arg("ca.pem"), &https(server.http, "/metrics")]).1;
    assert!(metric_value(&body, &format!("{series}{{outcome=\"refused\"}}")) >= 1.0, "the half rotation is counted");
    assert!(metric_value(&body, &format!("{series}{{outcome=\"ok\"}}")) >= 1.0);
}

/// TF Serving's SSLConfig, the PEM blocks inline as its docs write them.
fn ssl_config(pki: &Pki, cert: &str, key: &str, client_verify: bool) -> PathBuf {
    let quote = |name: &str| {
        let pem = std::fs::read_to_string(pki.path(name)).expect("pem");
        format!("\"{}\"", pem.trim_end().replace('\n', "\\n"))
    };
    let text = format!(
        "server_key: {}\nserver_cert: {}\ncustom_ca: {}\nclient_verify: {client_verify}\n",
        quote(key),
        quote(cert),
        quote("ca.pem")
    );
    let path = pki.path("ssl.config");
    std::fs::write(&path, text).expect("write ssl config");
    path
}

#[test]
fn tf_servings_ssl_config_file_serves_mutual_tls_and_bad_files_are_named() {
    let pki = Pki::new();
    let config = ssl_config(&pki, "server.pem", "server.key", true);
    let mlp = root().join("examples/models/mlp");
    let server = Server::start(&[
        "--model_name",
        "mlp",
        "--model_base_path",
        mlp.to_str().expect("utf-8"),
        "--ssl_config_file",
        config.to_str().expect("utf-8"),
    ]);
    let (cert, key) = (pki.arg("client.pem"), pki.arg("client.key"));
    let answers = tf_clients(
        server.grpc,
        &[case("tfserving", &pki.arg("ca.pem"), Some((&cert, &key))), case("tfserving", &pki.arg("ca.pem"), None)],
    );
    assert_eq!(answers[0]["ok"], true, "{}", answers[0]);
    assert_eq!(answers[1]["code"], "UNAVAILABLE", "{}", answers[1]);
    // The start-up line says what the SSLConfig set, not the TOML default.
    let said = server.log().into_iter().find(|l| l.contains("TLS on the gRPC, REST and admin ports"));
    assert!(said.as_deref().is_some_and(|l| l.contains("client_verify=true")), "{said:?}");
    drop(server);

    // Files that do not make a server are refused before it serves, named.
    let mismatched = ssl_config(&pki, "server.pem", "client.key", false);
    let (code, _, stderr) = run_sluice(&[
        "serve",
        "--port",
        "0",
        "--rest_api_port",
        "0",
        "--model_name",
        "mlp",
        "--model_base_path",
        mlp.to_str().expect("utf-8"),
        "--ssl_config_file",
        mismatched.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("server_cert of --ssl_config_file") && stderr.contains("do not make a certificate and its key"),
        "{stderr}"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let cases = [
        (
            format!("cert_file = \"{}\"\nkey_file = \"{}\"", pki.arg("server.pem"), pki.arg("missing.key")),
            "cannot read",
        ),
        (
            format!("cert_file = \"{}\"\nkey_file = \"{}\"", pki.arg("server.key"), pki.arg("server.key")),
            "holds no certificate",
        ),
        (
            format!("cert_file = \"{}\"\nkey_file = \"{}\"", pki.arg("server.pem"), pki.arg("server.pem")),
            "not a PEM private key",
        ),
        (
            format!(
                "cert_file = \"{}\"\nkey_file = \"{}\"\nclient_verify = true",
                pki.arg("server.pem"),
                pki.arg("server.key")
            ),
            "needs client_ca_file",
        ),
    ];
    for (tls, expected) in cases {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, mlp_config(&tls).replace("$ROOT", &root().display().to_string())).expect("write");
        let (code, _, stderr) = run_sluice(&["config", "check", path.to_str().expect("utf-8")]);
        assert_eq!(code, Some(1), "{tls}");
        assert!(stderr.contains(expected), "{tls}: {stderr}");
    }
}
