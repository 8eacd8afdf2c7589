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
