//! Starting and stopping the server: graceful shutdown, clear start-up
//! errors (missing ONNX Runtime, broken config), and the help text.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

fn sluice() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
    command.env_remove("ORT_DYLIB_PATH");
    command
}

#[tokio::test]
async fn sigterm_lets_in_flight_requests_finish_then_exits_zero() {
    let mut server =
        Server::start(&["--model_name", "cnn", "--model_base_path", "examples/models/cnn", "--sessions", "1"]);
    // Large requests that take a while in the one session.
    let mut in_flight = Vec::new();
    for i in 0..6u64 {
        let mut client = server.predict_client().await;
        in_flight.push(tokio::spawn(async move {
            let image = values(i, 512 * 3 * 32 * 32);
            client.predict(predict_request("cnn", vec![("image", f32_content(&[512, 3, 32, 32], &image))])).await
        }));
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    // SAFETY: sending a signal to our own child process.
    let rc = unsafe { libc::kill(server.pid() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    for task in in_flight {
        let response = task.await.expect("task").expect("an in-flight request must finish after SIGTERM");
        assert_eq!(dims(&response.into_inner().outputs["logits"]), vec![512, 10]);
    }
    let status = server.wait(Duration::from_secs(30)).expect("sluice exits after SIGTERM");
    assert!(status.success(), "exit status {status:?}");
    let log = server.log().join("\n");
    assert!(log.contains("SIGTERM received"), "{log}");
    assert!(log.contains("stopped"), "{log}");
}

#[test]
fn a_missing_onnxruntime_library_is_reported_with_every_place_looked_at() {
    // A copy of the binary outside the checkout finds no .ort/ above it.
    let dir = tempfile::tempdir().expect("temp dir");
    let exe = dir.path().join("sluice");
    std::fs::copy(env!("CARGO_BIN_EXE_sluice"), &exe).expect("copy binary");
    let model = root().join("examples/models/mlp");
    let output = Command::new(&exe)
        .env_remove("ORT_DYLIB_PATH")
        .current_dir(dir.path())
        .args(["serve", "--port", "0", "--model_name", "mlp", "--model_base_path"])
        .arg(&model)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    if stderr.contains("loaded ONNX Runtime") {
        // The system has its own copy in a standard directory; nothing to test.
        panic!("an ONNX Runtime library is installed system-wide; this test needs a machine without one:\n{stderr}");
    }
    assert!(!output.status.success());
    assert!(stderr.contains("libonnxruntime.so.1.31.1"), "{stderr}");
    assert!(stderr.contains(&dir.path().join(".ort").display().to_string()), "{stderr}");
    assert!(stderr.contains("scripts/setup"), "{stderr}");
    assert!(stderr.contains("--onnxruntime_library"), "{stderr}");

    let output = sluice()
        .args(["serve", "--port", "0", "--onnxruntime_library", "/nowhere/libonnxruntime.so", "--model_name", "mlp"])
        .arg("--model_base_path")
        .arg(&model)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("/nowhere/libonnxruntime.so"), "{stderr}");
}

#[test]
fn a_broken_config_stops_the_start_with_the_file_and_key_named() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cases = [
        ("[[models]]\nname = \"mlp\"\nbase_path = \"m\"\nversion_policy = \"newest\"\n", "version_policy"),
        ("[[models]]\nname = \"../mlp\"\nbase_path = \"m\"\n", "models[0].name"),
        ("[server]\nprot = 1\n", "prot"),
        ("[[models]]\nname = \"mlp\"\nbase_path = \"does-not-exist\"\n", "does-not-exist"),
    ];
    for (i, (text, key)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("broken-{i}.toml"));
        std::fs::write(&path, text).expect("write");
        let output = sluice().args(["serve", "--port", "0", "--model_config_file"]).arg(&path).output().expect("run");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "case {i} started");
        assert!(stderr.contains(key), "case {i}: {stderr}");
        if i < 3 {
            assert!(stderr.contains(&format!("broken-{i}.toml")), "case {i}: {stderr}");
        }
    }
}

#[test]
fn help_explains_every_tf_serving_flag() {
    let output = sluice().args(["serve", "--help"]).output().expect("run");
    let help = String::from_utf8_lossy(&output.stdout);
    for flag in ["--port", "--model_name", "--model_base_path", "--model_config_file", "--onnxruntime_library"] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}
