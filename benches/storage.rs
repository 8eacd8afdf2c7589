//! Versions published through an object store, measured against moto's
//! S3 server (the emulator `tests/storage.rs` uses), all on this machine:
//!
//! - **publish to serve**: from the last object of a version landing (its
//!   completion marker, or its last file without one) to the version
//!   serving, against the repository poll;
//! - **p99 while publishing**: a closed loop of 8 gRPC streams on the CNN,
//!   steady against the same load while versions arrive through the store
//!   (downloaded, loaded, warmed up, switched to), in one run on one server;
//! - **download throughput**: one large object fetched by sluice's mirror
//!   against boto3's `download_file` of the same object from the same
//!   server, side by side.
//!
//! ```text
//! cargo bench --bench storage [-- --duration 10 --switches 3 --blob_mib 256]
//! ```

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use sluice::cli::bench::load::LoadPlan;
use sluice::cli::bench::stats::Summary;
use support::object_stores::{Kind, ObjectStoreServer};
use support::{arg, pool, run, wait_switched};

/// The two CNNs versions alternate between (same shape, other weights).
fn cnn_file(root: &Path, n: i64) -> std::path::PathBuf {
    if n % 2 == 1 {
        root.join("examples/models/cnn/1/model.onnx")
    } else {
        root.join("tests/fixtures/models/cnn/2/model.onnx")
    }
}

/// Puts `body` as `key` of bucket `models` with one plain HTTP/1.1 PUT
/// (moto takes unsigned requests): the publisher costs the machine next
/// to nothing, where an SDK process would take a core while the server is
/// measured. Returns when the store has answered.
fn put(port: u16, key: &str, body: &[u8]) -> Instant {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to moto");
    let head = format!(
        "PUT /models/{key} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body)).expect("send the object");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("moto's answer");
    let landed = Instant::now();
    assert!(answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200"), "PUT {key}: {answer}");
    landed
}

/// Puts version `n` in the store, the marker (or, without one, a small
/// last file) after the model; returns when the last object landed.
fn publish(port: u16, root: &Path, n: i64, marker: bool) -> Instant {
    put(port, &format!("cnn/{n}/model.onnx"), &std::fs::read(cnn_file(root, n)).expect("model"));
    let last = if marker { format!("cnn/{n}/_SUCCESS") } else { format!("cnn/{n}/assets/published.txt") };
    put(port, &last, format!("version {n}").as_bytes())
}

fn server(store: &ObjectStoreServer, dir: &Path, marker: bool) -> support::process::ServerProcess {
    let config = format!(
        "[storage]\ncache_dir = \"{}\"\n{}\n[[models]]\nname = \"cnn\"\nbase_path = \"s3://models/cnn\"\n\
         onnx = {{ sessions = 2, intra_op_threads = 1 }}\n",
        dir.join("cache").display(),
        if marker { "completion_marker = \"_SUCCESS\"" } else { "" }
    );
    let path = dir.join("sluice.toml");
    std::fs::write(&path, config).expect("config");
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"));
    command
        .args(["serve", "--host", "127.0.0.1", "--port", "0", "--rest_api_port", "0"])
        .args(["--file_system_poll_wait_seconds", "1", "--model_config_file"])
        .arg(&path)
        .envs(store.env());
    support::process::ServerProcess::spawn(
        command,
        "sluice",
        "sluice: serving gRPC on ",
        Duration::from_secs(120),
        false,
    )
    .expect("sluice")
}

/// Seconds boto3 takes to download `key` to `to` (its own client, timed in
/// Python): with `download_file` (its transfer manager: concurrent ranged
/// GETs) and with one `get_object` stream written out, as the mirror does.
fn boto3_seconds(store: &ObjectStoreServer, key: &str, to: &Path) -> (f64, f64) {
    let script = format!(
        "import boto3, shutil, time\n\
         s3 = boto3.client('s3', endpoint_url='http://127.0.0.1:{}', aws_access_key_id='a', \
         aws_secret_access_key='b', region_name='us-east-1')\n\
         start = time.perf_counter()\n\
         s3.download_file('models', '{key}', '{to}')\n\
         managed = time.perf_counter() - start\n\
         start = time.perf_counter()\n\
         with open('{to}', 'wb') as out:\n    shutil.copyfileobj(s3.get_object(Bucket='models', Key='{key}')['Body'], out, 1 << 20)\n\
         print(managed, time.perf_counter() - start)\n",
        store.port,
        to = to.display()
    );
    let output = std::process::Command::new(support::fixtures::root().join(".cache/storage-venv/bin/python"))
        .args(["-c", &script])
        .output()
        .expect("python");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    let mut seconds = text.split_whitespace().map(|s| s.parse::<f64>().expect("seconds"));
    (seconds.next().expect("download_file"), seconds.next().expect("get_object"))
}

fn main() {
    let duration = Duration::from_secs(arg("--duration").unwrap_or(10));
    let switches: i64 = arg("--switches").unwrap_or(3);
    let blob_mib: usize = arg("--blob_mib").unwrap_or(256);
    let root = support::fixtures::root();
    let runtime = support::runtime();

    // Publish to serve, with a marker and by stable listing (1 s polls).
    let mut latencies = Vec::new();
    for marker in [true, false] {
        let store = ObjectStoreServer::start(Kind::S3);
        store.bucket("models");
        publish(store.port, &root, 1, marker);
        let dir = tempfile::tempdir().expect("temp dir");
        let server = server(&store, dir.path(), marker);
        let target = server.url();
        let mut took = Vec::new();
        for n in 2..5 {
            let landed = publish(store.port, &root, n, marker);
            runtime.block_on(wait_switched(&target, "cnn", n));
            took.push(landed.elapsed());
        }
        latencies.push((if marker { "completion marker" } else { "stable listing (two polls)" }, took));
    }

    // p99 while versions arrive through the store, against steady.
    let store = ObjectStoreServer::start(Kind::S3);
    store.bucket("models");
    publish(store.port, &root, 1, true);
    let dir = tempfile::tempdir().expect("temp dir");
    let server = server(&store, dir.path(), true);
    let target = server.url();
    let requests = pool(&runtime, &target, "cnn");
    let plan = LoadPlan::closed(&target, 8, duration);
    let steady: Summary = run(&runtime, &plan, &requests, "steady");
    let publisher = {
        let target = target.clone();
        let root = root.clone();
        let port = store.port;
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            std::thread::sleep(Duration::from_secs(2));
            let every = duration / (switches as u32 + 1);
            for n in 2..2 + switches {
                std::thread::sleep(every.saturating_sub(Duration::from_secs(1)));
                publish(port, &root, n, true);
                runtime.block_on(wait_switched(&target, "cnn", n));
            }
        })
    };
    let publishing = run(&runtime, &plan, &requests, "publishing through the store");
    publisher.join().expect("publisher");
    assert_eq!(publishing.ok, publishing.requests, "no request may fail while versions are published");

    // Download throughput: one large object, sluice's mirror vs boto3.
    let blob = dir.path().join("blob.bin");
    let bytes: Vec<u8> = (0..blob_mib << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(&blob, &bytes).expect("blob");
    drop(bytes);
    let n = 2 + switches;
    store.put("models", &format!("cnn/{n}/assets/blob.bin"), &blob);
    let _ = server.log();
    publish(store.port, &root, n, true);
    runtime.block_on(wait_switched(&target, "cnn", n));
    let line = server
        .log()
        .into_iter()
        .find(|l| l.contains("downloaded from") && l.contains(&format!("version={n}")))
        .expect("the download's log line");
    let field = |name: &str| -> f64 {
        line.split(&format!("{name}="))
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect(name)
    };
    let sluice_seconds = field("elapsed_ms") / 1e3;
    // What the mirror wrote is the object, byte for byte.
    let mirrored = support::object_stores::files(&dir.path().join("cache"))
        .into_iter()
        .find(|f| f.ends_with(format!("{n}/assets/blob.bin")))
        .expect("the mirrored blob");
    assert!(
        std::fs::read(&mirrored).expect("read the mirrored blob") == std::fs::read(&blob).expect("blob"),
        "the mirrored blob differs"
    );
    let mib = field("mib");
    let (managed, stream) = boto3_seconds(&store, &format!("cnn/{n}/assets/blob.bin"), &dir.path().join("boto3.bin"));
    let sluice_mib_s = mib / sluice_seconds;

    println!();
    println!("| publish to serve | each of 3 versions | mean |");
    println!("|---|---|---|");
    for (how, took) in &latencies {
        let each: Vec<String> = took.iter().map(|d| format!("{:.2} s", d.as_secs_f64())).collect();
        let mean = took.iter().map(Duration::as_secs_f64).sum::<f64>() / took.len() as f64;
        println!("| {how} | {} | {mean:.2} s |", each.join(", "));
    }
    println!();
    println!("| run | p99 ms | req/s | failed |");
    println!("|---|---|---|---|");
    for (label, s) in [("steady", &steady), ("publishing through the store", &publishing)] {
        println!("| {label} | {:.3} | {:.0} | {} |", s.p99_ms, s.requests_per_second, s.requests - s.ok);
    }
    println!("p99 ratio publishing / steady: {:.2}×", publishing.p99_ms / steady.p99_ms);
    println!();
    println!("| download of {mib:.0} MiB from the local S3 server | MiB/s | sluice ÷ it |");
    println!("|---|---|---|");
    println!("| sluice's mirror (one GET per object, If-Match and size checked) | {sluice_mib_s:.0} | 1.00× |");
    for (how, seconds) in
        [("boto3 download_file (transfer manager)", managed), ("boto3 get_object, one stream", stream)]
    {
        let rate = blob_mib as f64 / seconds;
        println!("| {how} | {rate:.0} | {:.2}× |", sluice_mib_s / rate);
    }
}
