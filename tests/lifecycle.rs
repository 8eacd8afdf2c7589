//! Starting the server: clear start-up errors (missing ONNX Runtime, broken
//! config) and the help text. Shutdown is in `operations.rs`.

mod common;

use std::process::Command;

use common::*;

fn sluice() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
    command.env_remove("ORT_DYLIB_PATH");
    command
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
        .args(["serve", "--port", "0", "--rest_api_port", "0", "--model_name", "mlp", "--model_base_path"])
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
        .args([
            "serve",
            "--port",
            "0",
            "--rest_api_port",
            "0",
            "--onnxruntime_library",
            "/nowhere/libonnxruntime.so",
            "--model_name",
            "mlp",
        ])
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
        let output = sluice()
            .args(["serve", "--port", "0", "--rest_api_port", "0", "--model_config_file"])
            .arg(&path)
            .output()
            .expect("run");
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
