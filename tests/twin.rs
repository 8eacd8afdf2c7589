//! `sluice model twin`: SavedModels (the TensorFlow backend's test models,
//! `.cache/tf-backend-savedmodels/`) converted by the real tf2onnx that
//! `scripts/setup` installs, both models run through the server's own
//! backends on warmup, logged or made-up requests, and a verified twin
//! published as the next version while a server polling the base path
//! serves it under load.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::fixtures::copy_dir;
use common::*;
use prost::Message;
use serde_json::Value;
use sluice::proto::tensorflow::serving::{prediction_log, PredictLog, PredictResponse, PredictionLog};

fn savedmodel(name: &str) -> PathBuf {
    let dir = root().join(".cache/tf-backend-savedmodels").join(name).join("1");
    assert!(
        dir.join("saved_model.pb").is_file(),
        "{}: run scripts/setup (it builds the test SavedModels)",
        dir.display()
    );
    dir
}

/// A model base path of its own holding a copy of `name`'s version 1.
fn base_with(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let base = dir.path().join(name);
    copy_dir(&savedmodel(name), &base.join("1"));
    (dir, base)
}

/// `sluice model twin ARGS…` (CPU measured briefly): exit code, stdout,
/// stderr.
fn twin(args: &[&str]) -> (Option<i32>, String, String) {
    let mut all = vec!["model", "twin", "--cost-seconds", "0.2"];
    all.extend_from_slice(args);
    run_sluice(&all)
}

/// [`twin`] with `--json`: exit code, the report, stderr.
fn twin_json(args: &[&str]) -> (Option<i32>, Value, String) {
    let mut all = args.to_vec();
    all.push("--json");
    let (code, stdout, stderr) = twin(&all);
    let report = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}\n{stderr}"));
    (code, report, stderr)
}

/// A TFRecord file of Predict records (a request log or a warmup file).
fn write_log(path: &Path, requests: Vec<sluice::proto::tensorflow::serving::PredictRequest>) {
    let records: Vec<Vec<u8>> = requests
        .into_iter()
        .map(|request| {
            let log = PredictLog { request: Some(request), response: None };
            PredictionLog { log_metadata: None, log_type: Some(prediction_log::LogType::PredictLog(log)) }
                .encode_to_vec()
        })
        .collect();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).expect("mkdir");
    }
    std::fs::write(path, sluice::models::tfrecord::write(&records)).expect("write log");
}

/// A request of `rows` random rows of 8 features for the Keras MLP.
fn mlp_request(seed: u64, rows: usize) -> sluice::proto::tensorflow::serving::PredictRequest {
    predict_request("keras_mlp", vec![("features", f32_content(&[rows as i64, 8], &values(seed, rows * 8)))])
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into())
        .collect();
    names.sort();
    names
}

#[test]
fn a_keras_model_converts_and_verifies_on_its_warmup_and_logged_requests() {
    let (_dir, base) = base_with("keras_mlp");
    write_log(&base.join("1/assets.extra/tf_serving_warmup_requests"), (0..3).map(|s| mlp_request(s, 1)).collect());
    let log = base.parent().unwrap().join("logs/requests.tfrecord");
    let mut logged: Vec<_> = (0..40).map(|s| mlp_request(100 + s, 1 + s as usize % 5)).collect();
    // Another model's request in the same log is left out.
    logged.push(predict_request("other", vec![("x", f32_content(&[1, 2], &[1.0, 2.0]))]));
    write_log(&log, logged);
    let kept = base.parent().unwrap().join("twin.onnx");

    // A log that holds none of the model's requests is refused (before any
    // conversion), naming the model names it does hold.
    let (code, _, stderr) =
        twin(&[base.to_str().unwrap(), "--requests-from", log.to_str().unwrap(), "--model-name", "ranker"]);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("none of its 41 requests is a Predict request of model 'ranker'")
            && stderr.contains("model names in the log: 'keras_mlp', 'other'"),
        "{stderr}"
    );

    let (code, report, stderr) = twin_json(&[
        base.to_str().unwrap(),
        "--requests-from",
        log.to_str().unwrap(),
        "--output",
        kept.to_str().unwrap(),
        "--publish",
    ]);
    // Keras's export adds a 'serve' signature the log never calls: it is
    // converted but not verified, so it leaves the twin, and publishing
    // without it needs --drop-other-signatures.
    assert_eq!(code, Some(1), "{report:#}\n{stderr}");
    assert_eq!(report["verified"], true, "{report:#}");
    let not_twinned = report["not_twinned"][0].as_str().unwrap();
    assert!(not_twinned.starts_with("serve: converted, but no request of it could be compared"), "{report:#}");
    assert!(stderr.contains("not published") && stderr.contains("--drop-other-signatures"), "{stderr}");
    assert_eq!(report["published"], Value::Null);
    assert_eq!(report["version"], 1);
    assert!(report["converter"].as_str().unwrap().starts_with("tf2onnx 1.17.0"), "{report:#}");
    let requests = &report["requests"];
    assert_eq!((requests["warmup"].as_u64(), requests["logged"].as_u64()), (Some(3), Some(40)), "{requests}");
    assert_eq!((requests["logged_read"].as_u64(), requests["synthetic"].as_u64()), (Some(41), Some(0)), "{requests}");
    assert_eq!(report["signature_differences"], Value::Array(vec![]), "{report:#}");
    let outputs = report["outputs"].as_array().unwrap();
    assert_eq!(outputs.len(), 1, "{report:#}");
    // 3 warmup rows and 1 + 2 + 3 + 4 + 5 rows in each of 8 rounds.
    assert_eq!((outputs[0]["output"].as_str(), outputs[0]["rows"].as_u64()), (Some("output_0"), Some(3 + 8 * 15)));
    assert_eq!(outputs[0]["rows_over"], 0, "{report:#}");
    assert!(outputs[0]["max_abs"].as_f64().unwrap() < 1e-5, "{report:#}");
    let cost = report["cost"].as_array().unwrap();
    let batches: Vec<u64> = cost.iter().map(|row| row["batch"].as_u64().unwrap()).collect();
    assert_eq!(batches, vec![1, 32], "{report:#}");
    for row in cost {
        for backend in ["saved_model", "twin"] {
            assert!(row[backend]["cpu_us_per_request"].as_f64().unwrap() > 0.0, "{row}");
            assert!(row[backend]["wall_us_per_request"].as_f64().unwrap() > 0.0, "{row}");
        }
    }
    assert!(kept.is_file(), "--output keeps the converted model");
    assert_eq!(names_in(&base), vec!["1"], "a refused publish writes nothing into the base path");

    // A planted difference: the kept twin with one weight nudged.
    let planted = base.parent().unwrap().join("planted.onnx");
    let python = root().join(".cache/tf-venv/bin/python");
    let script = "import sys, onnx, numpy as np\n\
                  from onnx import numpy_helper\n\
                  m = onnx.load(sys.argv[1])\n\
                  t = next(t for t in m.graph.initializer if t.data_type == 1 and np.prod(t.dims) > 8)\n\
                  a = numpy_helper.to_array(t).copy()\n\
                  a.flat[0] += 0.5\n\
                  t.CopyFrom(numpy_helper.from_array(a, t.name))\n\
                  onnx.save(m, sys.argv[2])\n";
    let edited = Command::new(python).args(["-c", script]).arg(&kept).arg(&planted).output().expect("python");
    assert!(edited.status.success(), "{}", String::from_utf8_lossy(&edited.stderr));
    let (code, report, stderr) = twin_json(&[
        base.to_str().unwrap(),
        "--requests-from",
        log.to_str().unwrap(),
        "--onnx",
        planted.to_str().unwrap(),
        "--publish",
    ]);
    assert_eq!(code, Some(1), "a twin that differs fails the command: {report:#}");
    assert_eq!(report["verified"], false);
    let over = &report["outputs"][0];
    assert!(over["rows_over"].as_u64().unwrap() > 0 && over["max_abs"].as_f64().unwrap() > 1e-3, "{report:#}");
    assert!(over["first_over"].as_str().unwrap().starts_with("request "), "{report:#}");
    assert!(
        stderr.contains("the twin did not verify: output 'output_0':") && stderr.contains("rows over tolerance"),
        "{stderr}"
    );
    assert_eq!(report["published"], Value::Null);
    assert_eq!(names_in(&base), vec!["1"], "a twin that differs publishes nothing, and leaves no staging directory");
}

#[tokio::test]
async fn a_module_with_several_signatures_is_twinned_whole_and_served_on_every_signature() {
    let (_dir, base) = base_with("multi");
    // No warmup file, no log: made-up requests for every signature (the
    // scalar 'factor' too), said so.
    let (code, stdout, stderr) = tokio::task::spawn_blocking({
        let base = base.clone();
        move || twin(&[base.to_str().unwrap(), "--publish"])
    })
    .await
    .expect("twin");
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(
            "0 from the warmup file, 0 logged (of 0 in the log), 48 synthetic; 32 of them for other signatures"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("also twinned signatures scaled, total"), "{stdout}");
    assert!(
        stdout.contains("scaled: y") && stdout.contains("total: sum") && stdout.contains("CPU per request"),
        "{stdout}"
    );
    assert_eq!(names_in(&base), vec!["1", "2"]);
    assert_eq!(names_in(&base.join("2/signatures")), vec!["scaled.onnx", "total.onnx"]);
    let kept: Value =
        serde_json::from_slice(&std::fs::read(base.join("2/assets.extra/sluice_twin_report.json")).expect("report"))
            .expect("JSON");
    assert_eq!(kept["verified"], true, "the published version carries its report");
    assert_eq!(kept["published"].as_str().map(PathBuf::from), Some(base.join("2")));
    let outputs: Vec<(&str, &str, u64)> = kept["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (o["signature"].as_str().unwrap(), o["output"].as_str().unwrap(), o["rows_over"].as_u64().unwrap()))
        .collect();
    assert_eq!(outputs, vec![("serving_default", "doubled", 0), ("scaled", "y", 0), ("total", "sum", 0)]);

    // Served: every signature of the twin (version 2) answers as the
    // SavedModel (version 1) does, and its metadata lists them all.
    let config = base.parent().unwrap().join("sluice.toml");
    std::fs::write(
        &config,
        format!("[[models]]\nname = \"multi\"\nbase_path = \"{}\"\nversion_policy = \"all\"\n", base.display()),
    )
    .expect("config");
    let server = Server::start(&["--model_config_file", config.to_str().unwrap()]);
    let mut client = server.predict_client().await;
    let x = values(3, 12);
    for (signature, output) in [("", "doubled"), ("total", "sum"), ("scaled", "y")] {
        let mut answers = Vec::new();
        for version in [1, 2] {
            let mut inputs = vec![("x", f32_content(&[3, 4], &x))];
            if signature == "scaled" {
                inputs.push(("factor", f32_content(&[], &[-1.5])));
            }
            let mut request = predict_request("multi", inputs);
            request.model_spec = spec("multi", Some(version));
            if let Some(spec) = request.model_spec.as_mut() {
                spec.signature_name = signature.into();
            }
            let answer = client.predict(request).await.unwrap_or_else(|e| panic!("{signature} v{version}: {e:?}"));
            answers.push(f32_values(&answer.into_inner().outputs[output]));
        }
        assert!(!answers[0].is_empty());
        assert_close(&answers[1], &answers[0], 1e-5, &format!("signature '{signature}'"));
    }
    let mut keys: Vec<String> = server.signature_def_map("multi").await.signature_def.into_keys().collect();
    keys.sort();
    assert_eq!(keys, vec!["scaled", "serving_default", "total"], "the twin's metadata");

    // Version 2 exists now, so twinning version 1 again publishes nothing.
    let (code, _, stderr) = tokio::task::spawn_blocking({
        let base = base.clone();
        move || twin(&[base.to_str().unwrap(), "--version", "1", "--publish"])
    })
    .await
    .expect("twin");
    assert_eq!(code, Some(1));
    assert!(stderr.contains("2 exists"), "{stderr}");
}

/// A log of string requests for `model`, non-ASCII words among them.
fn words_log(base: &Path, model: &str) -> PathBuf {
    let log = base.parent().unwrap().join(format!("{model}.tfrecord"));
    let words = [["banana", "kiwi", "apple"], ["", "durian", "cherry"], ["APPLE", "apple", "ñandú"]];
    let requests = words.iter().map(|w| predict_request(model, vec![("words", string_tensor(&[3], w))])).collect();
    write_log(&log, requests);
    log
}

#[test]
fn a_lookup_table_model_converts_and_verifies_on_logged_words() {
    let (_dir, base) = base_with("lookup");
    // String inputs cannot be made up: without traffic it says what to give.
    let (code, _, stderr) = twin(&[base.to_str().unwrap()]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("input 'words' is DT_STRING") && stderr.contains("--requests-from"), "{stderr}");

    let log = words_log(&base, "lookup");
    let (code, report, stderr) = twin_json(&[base.to_str().unwrap(), "--requests-from", log.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{report:#}\n{stderr}");
    let outputs: Vec<(&str, &str, u64, u64)> = report["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["output"].as_str().unwrap(),
                o["dtype"].as_str().unwrap(),
                o["rows"].as_u64().unwrap(),
                o["rows_over"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(outputs, vec![("ids", "DT_INT64", 9, 0), ("score", "DT_FLOAT", 9, 0)], "{report:#}");
}

#[test]
fn a_string_op_whose_twin_computes_otherwise_is_caught() {
    // tf2onnx turns tf.strings.upper (ASCII only) into ONNX's
    // StringNormalizer, which needs the en_US.UTF-8 locale: where it is
    // missing the twin does not load; where it is there, the twin
    // upper-cases 'ñandú' as TensorFlow does not. Either way it is refused.
    let (_dir, base) = base_with("vocab");
    let log = words_log(&base, "vocab");
    let (code, stdout, stderr) = twin(&[base.to_str().unwrap(), "--requests-from", log.to_str().unwrap(), "--publish"]);
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    assert!(
        (stderr.contains("the twin of model 'vocab' version 1") && stderr.contains("StringNormalizer"))
            || stderr.contains("output 'upper': 1 of 9 rows over tolerance"),
        "{stdout}\n{stderr}"
    );
    assert_eq!(names_in(&base), vec!["1"]);
}

#[test]
fn an_op_onnx_has_no_form_for_is_refused_by_name() {
    let (_dir, base) = base_with("hashed");
    let log = base.parent().unwrap().join("hashed.tfrecord");
    write_log(&log, vec![predict_request("hashed", vec![("words", string_tensor(&[2], &["a", "b"]))])]);
    let (code, stdout, stderr) = twin(&[base.to_str().unwrap(), "--requests-from", log.to_str().unwrap(), "--publish"]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stderr.contains("tf2onnx could not convert signature 'serving_default'")
            && stderr.contains("ONNX has no form for the TensorFlow op StringToHashBucketFast (1)"),
        "{stderr}"
    );
    assert_eq!(names_in(&base), vec!["1"]);

    // tf.io.parse_example in the graph, as recommendation models have it:
    // the census classifier, with a warmup file of tf.Examples written as
    // TF Serving's docs write one.
    let dir = tempfile::tempdir().expect("temp dir");
    let census = dir.path().join("census");
    copy_dir(&root().join(".cache/tf-savedmodels/census/1"), &census.join("1"));
    let made = Command::new(root().join(".cache/tf-venv/bin/python"))
        .arg(root().join("tests/tfserving/make_warmup.py"))
        .arg(census.join("1/assets.extra/tf_serving_warmup_requests"))
        .output()
        .expect("make_warmup.py");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let (code, stdout, stderr) = twin(&[census.to_str().unwrap(), "--publish"]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stderr.contains("ONNX has no form for the TensorFlow op ParseExampleV2 (1)"), "{stderr}");
    assert_eq!(names_in(&census), vec!["1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_twin_published_under_load_takes_over_with_no_failed_request() {
    let (_dir, base) = base_with("keras_mlp");
    let config = base.parent().unwrap().join("sluice.toml");
    std::fs::write(&config, format!("[[models]]\nname = \"keras_mlp\"\nbase_path = \"{}\"\n", base.display()))
        .expect("config");
    let server =
        Server::start(&["--model_config_file", config.to_str().unwrap(), "--file_system_poll_wait_seconds", "1"]);

    // (client, version, first output value) of every call; errors by message.
    type Seen = Vec<Result<(usize, i64, Vec<f32>), String>>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for c in 0..4 {
        let (stop, seen) = (stop.clone(), seen.clone());
        let mut client = server.predict_client().await;
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let outcome = match client.predict(mlp_request(7 + c as u64, 1)).await {
                    Ok(response) => {
                        let response: PredictResponse = response.into_inner();
                        let version = response.model_spec.as_ref().and_then(|s| s.version_choice.clone());
                        let version = match version {
                            Some(sluice::proto::tensorflow::serving::model_spec::VersionChoice::Version(v)) => v,
                            _ => -1,
                        };
                        Ok((c, version, f32_values(&response.outputs["output_0"])))
                    }
                    Err(status) => Err(format!("{:?}: {}", status.code(), status.message())),
                };
                seen.lock().unwrap().push(outcome);
            }
        }));
    }
    let answers_from = |version: i64| {
        let n = seen.lock().unwrap().iter().filter(|o| matches!(o, Ok((_, v, _)) if *v == version)).count();
        if n >= 50 {
            Ok(())
        } else {
            Err(format!("{n} answers from version {version}"))
        }
    };
    eventually("answers from the SavedModel", || answers_from(1)).await;

    let published = {
        let base = base.clone();
        tokio::task::spawn_blocking(move || twin(&[base.to_str().unwrap(), "--publish"])).await.expect("twin")
    };
    assert_eq!(published.0, Some(0), "{}\n{}", published.1, published.2);
    assert!(published.1.contains("published"), "{}", published.1);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let states: Vec<(i64, i32)> =
            server.model_status("keras_mlp").await.iter().map(|s| (s.version, s.state)).collect();
        // AVAILABLE is 30, END 50: version 1 unloaded once the twin serves.
        if states.contains(&(2, 30)) && states.contains(&(1, 50)) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "waited 60 s for the twin to serve alone: {states:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mark = seen.lock().unwrap().len();
    eventually("answers from the twin", || {
        let n = seen.lock().unwrap()[mark..].iter().filter(|o| matches!(o, Ok((_, 2, _)))).count();
        if n >= 50 {
            Ok(())
        } else {
            Err(format!("{n} answers from version 2"))
        }
    })
    .await;
    // Keras's other signature, 'serve', was twinned too.
    let mut request = mlp_request(3, 2);
    if let Some(spec) = request.model_spec.as_mut() {
        spec.signature_name = "serve".into();
    }
    let answer = server.predict_client().await.predict(request).await.expect("'serve' on the twin").into_inner();
    assert_eq!(dims(&answer.outputs["output_0"]), vec![2, 3]);
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.expect("client");
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let failed: Vec<&String> = seen.iter().filter_map(|o| o.as_ref().err()).collect();
    assert!(failed.is_empty(), "{} of {} calls failed: {:?}", failed.len(), seen.len(), &failed[..failed.len().min(5)]);
    // Each client's answers from the twin are the SavedModel's.
    for c in 0..4 {
        let of = |version: i64| {
            seen.iter()
                .flatten()
                .find(|(client, v, _)| *client == c && *v == version)
                .map(|(_, _, values)| values.clone())
        };
        let (saved, twin) = (of(1).expect("an answer from version 1"), of(2).expect("an answer from version 2"));
        assert_close(&twin, &saved, 1e-4, &format!("client {c}"));
    }
}
