//! Converting one signature of a SavedModel to ONNX with tf2onnx, run as
//! `python -m tf2onnx.convert` by a Python that has both TensorFlow and
//! tf2onnx (`scripts/setup` installs them, pinned, into
//! `.cache/tf-venv/`).
//!
//! tf2onnx exits 0 even when ops of the graph have no ONNX form: it logs
//! "Unsupported ops" and writes a model ONNX Runtime cannot load. So its
//! log is read, and such a conversion fails naming the ops.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::error::{Error, Result};

/// The environment variable naming the Python, like `--python`.
pub const PYTHON_ENV: &str = "SLUICE_TF2ONNX_PYTHON";

/// What converted the model, for the report.
#[derive(Debug, Clone)]
pub struct Converted {
    /// "tf2onnx 1.17.0 (TensorFlow 2.21.0)", as its log says.
    pub converter: String,
}

/// The Python to run tf2onnx with: `explicit`, else `SLUICE_TF2ONNX_PYTHON`,
/// else `.cache/tf-venv/bin/python` of the current directory or of a
/// directory above the executable (as TensorFlow's library is found).
pub fn python(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(path) = explicit.map(Path::to_path_buf).or_else(|| std::env::var_os(PYTHON_ENV).map(PathBuf::from)) {
        return Ok(path);
    }
    let searched: Vec<PathBuf> = crate::infer::tensorflow::library::search_roots()
        .into_iter()
        .map(|root| root.join(".cache/tf-venv/bin/python"))
        .collect();
    searched.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        let list: Vec<String> = searched.iter().map(|p| format!("  {}", p.display())).collect();
        Error::failed_precondition(format!(
            "no Python with tf2onnx was found; looked for:\n{}\nrun scripts/setup (it installs TensorFlow and \
             tf2onnx into .cache/tf-venv), or pass --python PATH (or set {PYTHON_ENV}) naming a Python that can \
             import tensorflow and tf2onnx",
            list.join("\n")
        ))
    })
}

/// Converts signature `signature` of the SavedModel in `dir` (loaded with
/// `tag`) to the ONNX file `output` at `opset`, in at most `timeout`.
pub async fn convert(
    python: &Path,
    dir: &Path,
    tag: &str,
    signature: &str,
    opset: u32,
    output: &Path,
    timeout: Duration,
) -> Result<Converted> {
    let mut command = tokio::process::Command::new(python);
    command
        .args(["-m", "tf2onnx.convert", "--saved-model"])
        .arg(dir)
        .args(["--tag", tag, "--signature_def", signature, "--opset", &opset.to_string(), "--output"])
        .arg(output)
        // TensorFlow's C++ start-up chatter is not the converter's words.
        .env("TF_CPP_MIN_LOG_LEVEL", "2")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = command.spawn().map_err(|e| {
        Error::failed_precondition(format!("cannot run {} (the Python with tf2onnx): {e}", python.display()))
    })?;
    let finished = tokio::time::timeout(timeout, child.wait_with_output()).await.map_err(|_| {
        Error::failed_precondition(format!(
            "tf2onnx did not finish converting {} within {} s (--convert-timeout-secs); it was stopped",
            dir.display(),
            timeout.as_secs()
        ))
    })?;
    let out = finished.map_err(|e| Error::internal(format!("waiting for tf2onnx failed: {e}")))?;
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let what = format!("tf2onnx could not convert signature '{signature}' of {}", dir.display());
    if let Some(ops) = unsupported_ops(&log) {
        return Err(Error::failed_precondition(format!(
            "{what}: ONNX has no form for the TensorFlow op{} {ops}{}",
            if ops.contains(',') { "s" } else { "" },
            nodes_of(&log)
        )));
    }
    if !out.status.success() || !output.is_file() {
        return Err(Error::failed_precondition(format!("{what}: {}", last_error(&log, out.status))));
    }
    Ok(Converted { converter: versions(&log) })
}

/// Declares on the ONNX model `file` the shapes of the outputs tf2onnx
/// left without one (it does for some ops, a lookup table's among them):
/// `shapes` holds each output's shape in the SavedModel's signature (-1
/// for any size). An output of known shape is left as tf2onnx wrote it, so
/// the signature comparison still sees any real difference. Answers the
/// outputs declared, as "ids [-1]".
pub async fn declare_missing_shapes(python: &Path, file: &Path, shapes: &[(String, Vec<i64>)]) -> Result<Vec<String>> {
    const SCRIPT: &str = "import json, sys, onnx\n\
        path, shapes = sys.argv[1], json.loads(sys.argv[2])\n\
        model = onnx.load(path)\n\
        done = []\n\
        for output in model.graph.output:\n\
        \x20   tensor = output.type.tensor_type\n\
        \x20   if output.name in shapes and not tensor.HasField('shape'):\n\
        \x20       for i, d in enumerate(shapes[output.name]):\n\
        \x20           dim = tensor.shape.dim.add()\n\
        \x20           if d >= 0: dim.dim_value = d\n\
        \x20           else: dim.dim_param = f'{output.name}_{i}'\n\
        \x20       done.append(output.name)\n\
        if done: onnx.save(model, path)\n\
        print(json.dumps(done))\n";
    let wanted: std::collections::BTreeMap<&str, &[i64]> =
        shapes.iter().map(|(name, shape)| (name.as_str(), shape.as_slice())).collect();
    let argument = serde_json::to_string(&wanted).map_err(|e| Error::internal(format!("shapes as JSON: {e}")))?;
    let out = tokio::process::Command::new(python)
        .args(["-c", SCRIPT])
        .arg(file)
        .arg(argument)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| Error::failed_precondition(format!("cannot run {}: {e}", python.display())))?;
    if !out.status.success() {
        return Err(Error::failed_precondition(format!(
            "declaring the output shapes tf2onnx left out of {} failed: {}",
            file.display(),
            last_error(&String::from_utf8_lossy(&out.stderr), out.status)
        )));
    }
    let declared: Vec<String> = serde_json::from_slice(&out.stdout).map_err(|e| {
        Error::internal(format!("the shape declaration answered {:?}: {e}", String::from_utf8_lossy(&out.stdout)))
    })?;
    Ok(declared
        .into_iter()
        .map(|name| {
            let shape = wanted.get(name.as_str()).map_or(String::new(), |s| crate::tensor::format_shape(s));
            format!("{name} {shape}")
        })
        .collect())
}

/// "StringToHashBucketFast (1), Foo (2)" from tf2onnx's
/// `Unsupported ops: Counter({'StringToHashBucketFast': 1, 'Foo': 2})`.
fn unsupported_ops(log: &str) -> Option<String> {
    let line = log.lines().find_map(|line| line.split_once("Unsupported ops: ").map(|(_, rest)| rest))?;
    let inner = line.trim().trim_start_matches("Counter(").trim_end_matches(')').trim_matches(|c| c == '{' || c == '}');
    let ops: Vec<String> = inner
        .split(',')
        .filter_map(|pair| {
            let (op, count) = pair.split_once(':')?;
            Some(format!("{} ({})", op.trim().trim_matches('\''), count.trim()))
        })
        .collect();
    Some(if ops.is_empty() { line.trim().to_string() } else { ops.join(", ") })
}

/// Where the unsupported ops sit in the graph, from tf2onnx's
/// `Tensorflow op [NODE: OP] is not supported` lines (the first three).
fn nodes_of(log: &str) -> String {
    let nodes: Vec<&str> = log
        .lines()
        .filter_map(|line| line.split_once("Tensorflow op [")?.1.split_once("] is not supported").map(|(node, _)| node))
        .take(3)
        .collect();
    if nodes.is_empty() {
        String::new()
    } else {
        format!(" (at {})", nodes.join("; "))
    }
}

/// The last error tf2onnx wrote: a Python exception's last line, else its
/// last ERROR line, else the exit status.
fn last_error(log: &str, status: std::process::ExitStatus) -> String {
    let lines: Vec<&str> = log.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let exception = lines.iter().rev().find(|line| {
        line.split_once(": ")
            .is_some_and(|(kind, _)| kind.ends_with("Error") || kind.ends_with("Exception") || kind.ends_with("Exit"))
    });
    let error = lines.iter().rev().find_map(|line| line.split_once(" - ERROR - ").map(|(_, message)| message));
    match (exception, error) {
        (Some(line), _) => (*line).to_string(),
        (None, Some(message)) => message.to_string(),
        (None, None) => format!("it exited with {status} and wrote no model"),
    }
}

/// "tf2onnx 1.17.0 (TensorFlow 2.21.0, onnx 1.19.1)" from its log's
/// `Using tensorflow=2.21.0, onnx=1.19.1, tf2onnx=1.17.0/2bb9ba` line.
fn versions(log: &str) -> String {
    let Some(line) = log.lines().find_map(|line| line.split_once("Using tensorflow=").map(|(_, rest)| rest)) else {
        return "tf2onnx".to_string();
    };
    let mut tensorflow = line.split(',').next().unwrap_or("?").trim().to_string();
    let value = |key: &str| {
        line.split(',').find_map(|part| part.trim().strip_prefix(key)).map(|v| v.split('/').next().unwrap_or(v).trim())
    };
    if tensorflow.is_empty() {
        tensorflow = "?".into();
    }
    format!(
        "tf2onnx {} (TensorFlow {tensorflow}, onnx {})",
        value("tf2onnx=").unwrap_or("?"),
        value("onnx=").unwrap_or("?")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_ops_are_named_with_where_they_sit() {
        let log = "2026 - ERROR - Tensorflow op [PartitionedCall/StringToHashBucketFast: StringToHashBucketFast] is \
                   not supported\n2026 - ERROR - Unsupported ops: Counter({'StringToHashBucketFast': 1, 'Foo': 2})\n";
        assert_eq!(unsupported_ops(log).as_deref(), Some("StringToHashBucketFast (1), Foo (2)"));
        assert_eq!(nodes_of(log), " (at PartitionedCall/StringToHashBucketFast: StringToHashBucketFast)");
        assert_eq!(unsupported_ops("all fine"), None);
    }

    #[test]
    fn the_converter_names_its_versions_and_its_last_error() {
        let log = "x - INFO - Using tensorflow=2.21.0, onnx=1.19.1, tf2onnx=1.17.0/2bb9ba\n";
        assert_eq!(versions(log), "tf2onnx 1.17.0 (TensorFlow 2.21.0, onnx 1.19.1)");
        let failed =
            "Traceback (most recent call last):\n  File \"x\"\nValueError: Specified signature not in model x\n";
        assert_eq!(
            last_error(failed, std::process::ExitStatus::default()),
            "ValueError: Specified signature not in model x"
        );
    }
}
