//! `sluice config check` on the shipped configs (valid) and on a corpus of
//! broken ones (tests/fixtures/configs/broken/*.toml): each broken file's
//! first line, `# expect: …`, is a fragment its error must contain — the
//! key and the value at fault.

use std::path::Path;
use std::process::Command;

fn check(file: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["config", "check"])
        .arg(file)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run sluice config check")
}

#[test]
fn every_broken_config_is_refused_with_the_file_and_the_key_named() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/configs/broken");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("the broken-config corpus")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 20, "the corpus has {} files", files.len());
    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read");
        let expected = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{} must start with '# expect: <fragment>'", file.display()));
        let output = check(file);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("?");
        if output.status.code() != Some(1) {
            failures.push(format!("{name}: exit {:?}, expected 1; stderr: {stderr}", output.status.code()));
        } else if !stderr.contains(expected) {
            failures.push(format!("{name}: stderr lacks {expected:?}:\n{stderr}"));
        } else if !stderr.contains(name) {
            failures.push(format!("{name}: stderr does not name the file:\n{stderr}"));
        } else if !output.stdout.is_empty() {
            failures.push(format!("{name}: a refused config printed on stdout"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn the_shipped_configs_pass_and_what_they_serve_is_listed() {
    let output = check(Path::new("tests/fixtures/examples.toml"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("tests/fixtures/examples.toml: ok"), "{stdout}");
    assert!(stdout.contains("model 'mlp': versions 1, 2; labels canary=2, stable=1"), "{stdout}");
    assert!(stdout.contains("model 'recommender': versions 1"), "{stdout}");

    // The example config needs the plugins scripts/build-plugins builds,
    // as `make run` does before serving it.
    let output = check(Path::new("examples/sluice.toml"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("pipeline '"), "{stdout}");
}

#[test]
fn tf_servings_config_files_convert_to_toml_that_serves_the_same() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let models = dir.path().join("models.config");
    std::fs::write(
        &models,
        format!(
            "model_config_list {{\n  config {{\n    name: \"mlp\"\n    base_path: \"{}\"\n    model_platform: \"tensorflow\"\n    \
             model_version_policy {{ specific {{ versions: 1 versions: 2 }} }}\n    version_labels {{ key: \"stable\" value: 1 }}\n    \
             logging_config {{ log_collector_config {{ type: \"\" filename_prefix: \"logs/mlp\" }} sampling_config {{ sampling_rate: 0.25 }} }}\n  }}\n  \
             config {{ name: \"cnn\" base_path: \"{}\" model_platform: \"tensorflow\" }}\n}}\n",
            root.join("examples/models/mlp").display(),
            root.join("examples/models/cnn").display()
        ),
    )
    .expect("write models.config");
    let batching = dir.path().join("batching.config");
    std::fs::write(&batching, "max_batch_size { value: 32 }\nbatch_timeout_micros { value: 500 }\nallowed_batch_sizes: 8\nallowed_batch_sizes: 32\n")
        .expect("write batching.config");
    let monitoring = dir.path().join("monitoring.config");
    std::fs::write(&monitoring, "prometheus_config { enable: true, path: \"/monitoring/prometheus/metrics\" }\n")
        .expect("write");
    let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["config", "convert", "--model_config_file"])
        .arg(&models)
        .arg("--batching_parameters_file")
        .arg(&batching)
        .arg("--monitoring_config_file")
        .arg(&monitoring)
        .output()
        .expect("run sluice config convert");
    let toml = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    for wanted in [
        "metrics_path = \"/monitoring/prometheus/metrics\"",
        "specific = [1, 2]",
        "stable = 1",
        "sampling_rate = 0.25",
        &format!("filename_prefix = \"{}\"", dir.path().canonicalize().expect("dir").join("logs/mlp").display()),
        "allowed_batch_sizes = [8, 32]",
        "batch_timeout_micros = 500",
    ] {
        assert!(toml.contains(wanted), "{wanted} missing from:\n{toml}");
    }
    let converted = dir.path().join("sluice.toml");
    std::fs::write(&converted, &toml).expect("write the TOML");
    // The same models, versions and labels as TF Serving's file says, and
    // the batching TF Serving would apply under --enable_batching.
    let summary = |file: &Path| {
        let output = check(file);
        assert!(output.status.success(), "{}: {}", file.display(), String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter(|l| l.starts_with("model "))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let original = summary(&models);
    let after = summary(&converted);
    assert_eq!(original.len(), 2, "{original:?}");
    for (before, after) in original.iter().zip(&after) {
        assert_eq!(format!("{before}; batching up to 32 rows"), *after);
    }
}

#[test]
fn the_summary_names_each_models_cache_quota_and_canary() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("sluice.toml");
    std::fs::write(
        &file,
        format!(
            "[[models]]\nname = \"ab\"\nbase_path = \"{}\"\nversion_policy = \"all\"\n\
             version_labels = {{ stable = 1, canary = 2 }}\ncanary = {{ label = \"canary\", percent = 5 }}\n\
             cache = {{ max_mib = 16, ttl_secs = 60 }}\nquota = {{ requests_per_second = 100, max_in_flight = 8 }}\n",
            Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/models/mlp").display()
        ),
    )
    .expect("write");
    let output = check(&file);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    for wanted in [
        "response cache 16 MiB for 60 s",
        "quota 100 req/s (burst 100), 8 in flight",
        "canary: 5% to label 'canary', the rest to 'stable'",
    ] {
        assert!(stdout.contains(wanted), "{wanted} missing from: {stdout}");
    }
}
