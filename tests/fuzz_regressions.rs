//! Every committed fuzz input — the corpus `scripts/fuzz` grew and each
//! crash it ever found (`fuzz/regressions/TARGET/`) — replayed through the
//! same harness the fuzz targets run, on every `make test`: a fixed crash
//! stays fixed without nightly or a fuzzing run.

#[path = "../fuzz/harness.rs"]
mod harness;

use std::path::Path;

#[test]
fn every_corpus_and_crash_input_passes_its_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut replayed = 0;
    let mut failed = Vec::new();
    for (target, run) in harness::TARGETS {
        for dir in ["corpus", "regressions"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else { continue };
            for entry in entries.flatten() {
                let data = std::fs::read(entry.path()).expect("read input");
                replayed += 1;
                if std::panic::catch_unwind(|| run(&data)).is_err() {
                    failed.push(entry.path().display().to_string());
                }
            }
        }
    }
    assert!(failed.is_empty(), "inputs that fail their target: {failed:?}");
    assert!(replayed >= harness::TARGETS.len(), "only {replayed} inputs: is fuzz/corpus there?");
}
