//! Resident memory over load/unload cycles of a SavedModel under traffic:
//! a version holding a 50 MiB variable replaced by a new
//! version of the same files, again and again, while clients call it;
//! the growth from the first cycle to the last must stay under one
//! version's size, and no call may fail.
//!
//! ```text
//! cargo bench --bench tensorflow_memory [-- --cycles 50 --mib 50]
//! ```
//!
//! The SavedModel is built once by `tests/tensorflow/make_big_savedmodel.py`
//! (TensorFlow's Python in `.cache/tf-venv`) into
//! `.cache/tf-memory-savedmodel-MIB/`. Each version directory links its
//! files, published whole (made aside, renamed in); the server (policy
//! latest, a 1 s poll) loads it, warms it up, switches to it and unloads
//! the one before.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sluice::proto::tensorflow::serving::prediction_service_client::PredictionServiceClient;
use sluice::proto::tensorflow::serving::{ModelSpec, PredictRequest};
use sluice::proto::tensorflow::{tensor_shape_proto, DataType, TensorProto, TensorShapeProto};
use support::{arg, sluice, wait_switched};

/// The SavedModel with a `mib` MiB variable, built when missing.
fn big_savedmodel(root: &Path, mib: u64) -> PathBuf {
    let dir = root.join(format!(".cache/tf-memory-savedmodel-{mib}"));
    if !dir.join("1/saved_model.pb").is_file() {
        let status = Command::new(root.join(".cache/tf-venv/bin/python"))
            .arg(root.join("tests/tensorflow/make_big_savedmodel.py"))
            .arg(&dir)
            .args(["--mib", &mib.to_string()])
            .status()
            .expect("run make_big_savedmodel.py (scripts/setup installs .cache/tf-venv)");
        assert!(status.success(), "building the SavedModel failed");
    }
    dir.join("1")
}

/// Version `n`: the SavedModel's files linked into a directory made aside
/// and renamed into place.
fn publish(repository: &Path, model: &Path, n: i64) {
    let staging = repository.join(format!(".staging-{n}"));
    std::fs::create_dir_all(&staging).expect("staging dir");
    for entry in std::fs::read_dir(model).expect("read the SavedModel") {
        let entry = entry.expect("entry");
        std::os::unix::fs::symlink(entry.path(), staging.join(entry.file_name())).expect("link");
    }
    std::fs::rename(&staging, repository.join(n.to_string())).expect("rename into place");
}

fn request() -> PredictRequest {
    let x = TensorProto {
        dtype: DataType::DtFloat as i32,
        tensor_shape: Some(TensorShapeProto {
            dim: [2, 4].iter().map(|&size| tensor_shape_proto::Dim { size, name: String::new() }).collect(),
            unknown_rank: false,
        }),
        float_val: vec![0.5; 8],
        ..Default::default()
    };
    PredictRequest {
        model_spec: Some(ModelSpec { name: "big".into(), ..Default::default() }),
        inputs: [("x".to_string(), x)].into(),
        output_filter: Vec::new(),
    }
}

fn main() {
    let cycles: i64 = arg("--cycles").unwrap_or(50);
    let mib: u64 = arg("--mib").unwrap_or(50);
    let root = support::fixtures::root();
    let model = big_savedmodel(&root, mib);
    let dir = tempfile::tempdir().expect("temp dir");
    let repository = dir.path().join("big");
    std::fs::create_dir_all(&repository).expect("repository");
    publish(&repository, &model, 1);
    let config = dir.path().join("sluice.toml");
    let table = support::fixtures::model_table("big", &repository, "tensorflow = { run_threads = 1 }");
    std::fs::write(&config, format!("{}{table}", support::SERVER_TABLE)).expect("config");
    let server = sluice(&config, &["--file_system_poll_wait_seconds", "1"]);
    let target = server.url();
    let runtime = support::runtime();

    // Traffic throughout: 4 clients calling in a closed loop.
    let stop = Arc::new(AtomicBool::new(false));
    let (answered, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (stop, answered, failed, target) = (stop.clone(), answered.clone(), failed.clone(), target.clone());
            runtime.spawn(async move {
                let mut client = PredictionServiceClient::connect(target).await.expect("connect");
                while !stop.load(Ordering::Relaxed) {
                    match client.predict(request()).await {
                        Ok(_) => answered.fetch_add(1, Ordering::Relaxed),
                        Err(status) => {
                            eprintln!("call failed: {status:?}");
                            failed.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            })
        })
        .collect();

    let mut samples = Vec::new();
    let mut switch_times = Vec::new();
    for n in 2..2 + cycles {
        publish(&repository, &model, n);
        switch_times.push(runtime.block_on(wait_switched(&target, "big", n)));
        // The unloaded version's directory goes, as a deploy tool would
        // remove it: nothing may still read it.
        std::fs::remove_dir_all(repository.join((n - 1).to_string())).expect("remove the old version");
        let cycle = n - 1;
        if cycle == 1 || cycle % 10 == 0 || cycle == cycles {
            std::thread::sleep(Duration::from_millis(500));
            let rss = server.rss_bytes().expect("rss");
            eprintln!("after cycle {cycle}: resident {:.1} MiB", rss as f64 / (1 << 20) as f64);
            samples.push((cycle, rss));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        runtime.block_on(client).expect("client task");
    }
    let answered = answered.load(Ordering::Relaxed);
    let failed = failed.load(Ordering::Relaxed);
    let mib_of = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    let (first, last) = (samples[0].1, samples[samples.len() - 1].1);
    let growth = mib_of(last) - mib_of(first);
    let mut sorted = switch_times.clone();
    sorted.sort();
    println!("\n| after cycle | resident MiB |");
    println!("|---|---|");
    for (cycle, rss) in &samples {
        println!("| {cycle} | {:.1} |", mib_of(*rss));
    }
    println!(
        "\n{cycles} load/unload cycles of a SavedModel with a {mib} MiB variable under traffic: resident memory \
         {:.1} -> {:.1} MiB, growth {growth:.1} MiB ({:.2}x one version's variable; target < 1x); \
         {answered} calls answered, {failed} failed; a switch took {:.2} s at the median",
        mib_of(first),
        mib_of(last),
        growth / mib as f64,
        sorted[sorted.len() / 2].as_secs_f64()
    );
    assert_eq!(failed, 0, "no call may fail while versions come and go");
}
