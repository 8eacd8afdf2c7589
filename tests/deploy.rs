//! The deployment files (`deploy/`, `.dockerignore`) checked against the
//! code and against each other, so that a renamed route, metric, flag or
//! port, or a moved source directory, fails here instead of in a cluster.
//!
//! Only `std`, and plain line-based reading of the Dockerfiles, YAML and
//! TOML: the files are written in a regular style, and a check that cannot
//! find what it looks for fails and says so rather than passing silently.
//! It also builds standalone:
//! `CARGO_MANIFEST_DIR=$PWD rustc --edition 2021 --test tests/deploy.rs -o /tmp/deploy-test && /tmp/deploy-test`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    let path = root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: cannot read: {e}", path.display()))
}

const DOCKERFILES: [&str; 2] = ["deploy/Dockerfile", "deploy/Dockerfile.gpu"];
const DEPLOYMENT: &str = "deploy/k8s/base/deployment.yaml";
const SERVICES: &str = "deploy/k8s/base/service.yaml";
const SERVICE_MONITOR: &str = "deploy/k8s/base/servicemonitor.yaml";
const HPA: &str = "deploy/k8s/base/hpa.yaml";
const ADAPTER_RULES: &str = "deploy/k8s/prometheus-adapter-rules.yaml";
const REST_ROUTES: &str = "runtime/api/rest/mod.rs";
const METRICS: &str = "runtime/metrics.rs";
const CONFIG_DEFAULTS: &str = "runtime/config/server.rs";
/// Where the command line is defined: the binary's global flags and
/// `serve`'s flags.
const MAIN: &str = "runtime/main.rs and runtime/cli/serve_args.rs";

/// The source of the command line.
fn command_line() -> String {
    read("runtime/main.rs") + &read("runtime/cli/serve_args.rs")
}
/// Each Kubernetes config with the Deployment files that run it (the base
/// and the overlay's patches, later ones overriding earlier ones).
const K8S_CONFIGS: [(&str, &[&str]); 3] = [
    ("deploy/k8s/base/sluice.toml", &[DEPLOYMENT]),
    ("deploy/k8s/overlays/gpu/sluice.toml", &[DEPLOYMENT, "deploy/k8s/overlays/gpu/deployment-gpu.yaml"]),
    ("deploy/k8s/overlays/bucket/sluice.toml", &[DEPLOYMENT, "deploy/k8s/overlays/bucket/deployment-bucket.yaml"]),
];
/// The config baked into the image as /etc/sluice/sluice.toml.
const IMAGE_CONFIG: &str = "deploy/sluice.toml";
const IMAGE_CONFIG_DIR: &str = "/etc/sluice";

// ---------------------------------------------------------------------------
// Small readers.

/// A line without its `#` comment (none of these files puts `#` in a value),
/// and whether anything is left.
fn code(line: &str) -> Option<&str> {
    let text = match line.find('#') {
        Some(at) => &line[..at],
        None => line,
    };
    let text = text.trim_end();
    (!text.trim().is_empty()).then_some(text)
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

fn unquote(value: &str) -> &str {
    value.trim().trim_matches('"').trim_matches('\'')
}

/// `key: value` on a YAML line (after any `- `), when the key is `key`.
fn yaml_value<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let text = line.trim_start().trim_start_matches("- ").trim_start();
    let rest = text.strip_prefix(key)?.strip_prefix(':')?;
    Some(unquote(rest))
}

/// The Dockerfile's instructions, continuation lines joined and comment
/// lines dropped, as Docker reads them.
fn instructions(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with('#') {
            continue;
        }
        let (part, continued) = match line.trim_end().strip_suffix('\\') {
            Some(part) => (part, true),
            None => (line, false),
        };
        current.push_str(part);
        current.push(' ');
        if !continued {
            if !current.trim().is_empty() {
                out.push(current.trim().to_string());
            }
            current.clear();
        }
    }
    out
}

/// A COPY or ADD from the build context: its sources and its destination.
struct ContextCopy {
    sources: Vec<String>,
    dest: String,
}

fn context_copies(dockerfile: &str) -> Vec<ContextCopy> {
    let mut copies = Vec::new();
    for instruction in instructions(&read(dockerfile)) {
        let mut words = instruction.split_whitespace();
        let verb = words.next().unwrap_or("").to_ascii_uppercase();
        if verb != "COPY" && verb != "ADD" {
            continue;
        }
        let words: Vec<&str> = words.collect();
        if words.iter().any(|w| w.starts_with("--from")) {
            continue;
        }
        let args: Vec<String> = words.iter().filter(|w| !w.starts_with("--")).map(|w| w.to_string()).collect();
        let args: Vec<String> = if args.first().is_some_and(|a| a.starts_with('[')) {
            args.join(" ").split('"').skip(1).step_by(2).map(str::to_string).collect()
        } else {
            args
        };
        assert!(args.len() >= 2, "{dockerfile}: `{instruction}` has no source and destination");
        let (dest, sources) = args.split_last().expect("checked above");
        copies.push(ContextCopy { sources: sources.to_vec(), dest: dest.clone() });
    }
    copies
}

/// `*`, `?` within one path segment and `**` across segments, as
/// .dockerignore patterns use them.
fn glob(pattern: &[&str], path: &[&str]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((&"**", rest)) => (0..=path.len()).any(|skip| glob(rest, &path[skip..])),
        Some((segment, rest)) => path
            .split_first()
            .is_some_and(|(name, tail)| segment_matches(segment.as_bytes(), name.as_bytes()) && glob(rest, tail)),
    }
}

fn segment_matches(pattern: &[u8], name: &[u8]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|skip| segment_matches(rest, &name[skip..])),
        Some((b'?', rest)) => !name.is_empty() && segment_matches(rest, &name[1..]),
        Some((c, rest)) => name.first() == Some(c) && segment_matches(rest, &name[1..]),
    }
}

/// Whether .dockerignore leaves `path` (relative to the repository) out of
/// the build context: the last pattern matching it or a directory above it
/// decides, `!` patterns putting it back.
fn docker_ignored(patterns: &[String], path: &str) -> bool {
    let path: Vec<&str> = path.trim_start_matches("./").split('/').filter(|s| !s.is_empty() && *s != ".").collect();
    let mut ignored = false;
    for pattern in patterns {
        let (negated, pattern) = match pattern.strip_prefix('!') {
            Some(p) => (true, p),
            None => (false, pattern.as_str()),
        };
        let pattern: Vec<&str> = pattern.trim_start_matches('/').split('/').filter(|s| !s.is_empty()).collect();
        if (1..=path.len()).any(|n| glob(&pattern, &path[..n])) {
            ignored = !negated;
        }
    }
    ignored
}

fn dockerignore_patterns() -> Vec<String> {
    read(".dockerignore")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// The files a kustomization.yaml refers to, by section: `resources`,
/// `components`, `patches` (their `path`), and generators' `files`/`envs`.
fn kustomization_refs(text: &str) -> Vec<(String, String)> {
    let mut refs = Vec::new();
    let mut section = String::new();
    let mut in_files = false;
    for line in text.lines() {
        let Some(line) = code(line) else { continue };
        let trimmed = line.trim_start();
        if indent(line) == 0 && !trimmed.starts_with("- ") {
            section = trimmed.split(':').next().unwrap_or("").to_string();
            in_files = false;
            continue;
        }
        match section.as_str() {
            "resources" | "components" | "patchesStrategicMerge" => {
                if let Some(item) = trimmed.strip_prefix("- ") {
                    refs.push((section.clone(), unquote(item).to_string()));
                }
            }
            "patches" => {
                if let Some(path) = yaml_value(line, "path") {
                    refs.push((section.clone(), path.to_string()));
                }
            }
            "configMapGenerator" | "secretGenerator" => {
                let item = trimmed.trim_start_matches("- ");
                if item.starts_with("files:") || item.starts_with("envs:") {
                    in_files = true;
                } else if item.contains(':') {
                    in_files = false;
                } else if in_files {
                    // `key=path` names the key; the file is after `=`.
                    let file = unquote(item).rsplit('=').next().unwrap_or("");
                    refs.push((section.clone(), file.to_string()));
                }
            }
            _ => {}
        }
    }
    refs
}

fn kustomizations(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: cannot list: {e}", dir.display()));
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            kustomizations(&path, out);
        } else if path.file_name().is_some_and(|n| n == "kustomization.yaml") {
            out.push(path);
        }
    }
}

/// A flat view of a TOML config: `table.key` → value, for the keys of
/// `[table]` headers (array tables keep their first entry's values only,
/// which no check here reads).
fn toml_values(text: &str) -> BTreeMap<String, String> {
    let mut values = BTreeMap::new();
    let mut table = String::new();
    for line in text.lines() {
        let Some(line) = code(line) else { continue };
        let line = line.trim();
        if line.starts_with('[') {
            table = line.trim_matches(|c| c == '[' || c == ']').trim().to_string();
            continue;
        }
        if let Some((key, value)) = line.split_once('=') {
            values.entry(format!("{table}.{}", key.trim())).or_insert_with(|| value.trim().to_string());
        }
    }
    values
}

/// Every `key = "value"` of `key` in a TOML text, inline tables included.
fn toml_strings(text: &str, key: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in text.lines() {
        let Some(line) = code(line) else { continue };
        let mut rest = line;
        while let Some(at) = rest.find(key) {
            let before = rest[..at].chars().last();
            let after = rest[at + key.len()..].trim_start();
            rest = &rest[at + key.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.') {
                continue;
            }
            if let Some(value) = after.strip_prefix('=').map(str::trim_start).and_then(|v| v.strip_prefix('"')) {
                if let Some(end) = value.find('"') {
                    found.push(value[..end].to_string());
                }
            }
        }
    }
    found
}

/// A number the code sets in `ServerConfig::default()`, e.g. `port: 8500,`.
fn code_default(field: &str) -> u64 {
    let text = read(CONFIG_DEFAULTS);
    text.lines()
        .filter_map(|l| l.trim().strip_prefix(&format!("{field}: ")))
        .find_map(|v| v.trim_end_matches(',').parse().ok())
        .unwrap_or_else(|| {
            panic!("{CONFIG_DEFAULTS}: no numeric default `{field}: N,` found; has ServerConfig::default changed?")
        })
}

/// What the Deployment files (base first, then patches) say, line by line.
#[derive(Default)]
struct Deployment {
    grace: Option<u64>,
    pre_stop_sleep: Option<u64>,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    ports: BTreeMap<String, u64>,
    /// `(probe, path)`.
    probes: Vec<(String, String)>,
}

fn deployment(files: &[&str]) -> Deployment {
    let mut d = Deployment::default();
    for file in files {
        let text = read(file);
        // The probe, and the `args`/`env` list, that the current line is
        // inside of: a block ends at the first line indented no deeper
        // than its key (list items may sit at the key's own indent).
        let mut probe: Option<(String, usize)> = None;
        let mut list: Option<(String, usize)> = None;
        let mut last_name: Option<String> = None;
        let mut in_pre_stop = false;
        for line in text.lines() {
            let Some(line) = code(line) else { continue };
            let at = indent(line);
            let item = line.trim_start().starts_with("- ");
            let ends =
                |block: &Option<(String, usize)>| block.as_ref().is_some_and(|(_, i)| at < *i || (at == *i && !item));
            if ends(&probe) {
                probe = None;
            }
            if ends(&list) {
                list = None;
            }
            let text = line.trim_start().trim_start_matches("- ").trim_start();
            if let Some(key) = text.strip_suffix(':').filter(|k| !k.contains(' ')) {
                if key.ends_with("Probe") {
                    probe = Some((key.to_string(), at));
                } else if key == "args" || key == "env" {
                    list = Some((key.to_string(), at));
                } else if key == "preStop" {
                    in_pre_stop = true;
                }
                continue;
            }
            if let Some(v) = yaml_value(line, "terminationGracePeriodSeconds") {
                d.grace = Some(
                    v.parse().unwrap_or_else(|_| panic!("{file}: terminationGracePeriodSeconds '{v}' is not a number")),
                );
            }
            if in_pre_stop {
                if let Some(command) = yaml_value(line, "command") {
                    let words: Vec<&str> =
                        command.trim_matches(|c| c == '[' || c == ']').split(',').map(unquote).collect();
                    assert!(
                        words.first().is_some_and(|w| w.ends_with("sleep")),
                        "{file}: the preStop hook runs {command}; the checks here expect a sleep"
                    );
                    d.pre_stop_sleep = words.get(1).and_then(|s| s.parse().ok());
                    in_pre_stop = false;
                } else if let Some(seconds) = yaml_value(line, "seconds") {
                    // The kubelet's own `sleep` action.
                    d.pre_stop_sleep = seconds.parse().ok();
                    in_pre_stop = false;
                }
            }
            let list_key = list.as_ref().map(|(k, _)| k.as_str());
            if list_key == Some("args") && item {
                d.args.push(unquote(text).to_string());
            }
            if let Some(name) = yaml_value(line, "name") {
                last_name = Some(name.to_string());
            }
            if let (Some("env"), Some(value), Some(name)) = (list_key, yaml_value(line, "value"), &last_name) {
                d.env.insert(name.clone(), value.to_string());
            }
            if let (Some(port), Some(name)) = (yaml_value(line, "containerPort"), &last_name) {
                let port = port
                    .parse()
                    .unwrap_or_else(|_| panic!("{file}: containerPort '{port}' of '{name}' is not a number"));
                d.ports.insert(name.clone(), port);
            }
            if let (Some((probe, _)), Some(path)) = (&probe, yaml_value(line, "path")) {
                d.probes.push((probe.clone(), path.to_string()));
            }
        }
    }
    d
}

/// The value of `--flag` in the container's args (`--flag=V` or `--flag V`).
fn flag(args: &[String], name: &str) -> Option<String> {
    let long = format!("--{name}");
    args.iter().enumerate().find_map(|(i, arg)| match arg.strip_prefix(&long) {
        Some(rest) if rest.starts_with('=') => Some(rest[1..].to_string()),
        Some("") => args.get(i + 1).cloned(),
        _ => None,
    })
}

// ---------------------------------------------------------------------------
// The checks.

#[test]
fn dockerfile_copy_sources_exist_and_are_in_the_build_context() {
    let patterns = dockerignore_patterns();
    for dockerfile in DOCKERFILES {
        let copies = context_copies(dockerfile);
        assert!(!copies.is_empty(), "{dockerfile}: no COPY from the build context found; is the file there?");
        for copy in copies {
            for source in &copy.sources {
                assert!(
                    !source.contains('*'),
                    "{dockerfile}: COPY {source}: globs are not checked here; name the path"
                );
                assert!(
                    root().join(source).exists(),
                    "{dockerfile}: COPY {source} -> {}: {source} does not exist in the repository",
                    copy.dest
                );
                assert!(
                    !docker_ignored(&patterns, source),
                    "{dockerfile}: COPY {source} -> {}: .dockerignore excludes {source} from the build context",
                    copy.dest
                );
            }
        }
    }
}

#[test]
fn dockerignore_leaves_out_build_outputs_and_downloads() {
    let patterns = dockerignore_patterns();
    for path in ["target", "target/release/sluice", ".ort", ".ort/1.31.1", ".cache", ".git", "plugins/target"] {
        assert!(docker_ignored(&patterns, path), ".dockerignore: {path} is sent to the builder; exclude it");
    }
    // The Dockerfiles themselves are read by the builder, but what they
    // build from must stay in the context.
    for path in ["Cargo.toml", "Cargo.lock", "runtime/main.rs", ".cargo/config.toml"] {
        assert!(!docker_ignored(&patterns, path), ".dockerignore: {path} is excluded, but the image is built from it");
    }
}

#[test]
fn dockerfiles_expose_the_ports_the_configs_serve_on() {
    let mut ports = vec![code_default("port"), code_default("rest_api_port")];
    for (config, _) in K8S_CONFIGS {
        let values = toml_values(&read(config));
        if let Some(port) = values.get("admin.port") {
            ports.push(port.parse().unwrap_or_else(|_| panic!("{config}: [admin] port = {port} is not a number")));
        }
    }
    for dockerfile in DOCKERFILES {
        let exposed: Vec<u64> = instructions(&read(dockerfile))
            .iter()
            .filter_map(|i| i.strip_prefix("EXPOSE "))
            .flat_map(|ports| {
                ports.split_whitespace().filter_map(|p| p.split('/').next()?.parse().ok()).collect::<Vec<_>>()
            })
            .collect();
        for port in &ports {
            assert!(
                exposed.contains(port),
                "{dockerfile}: port {port} is served (config defaults or [admin] port) but not in EXPOSE {exposed:?}"
            );
        }
    }
}

#[test]
fn kustomization_entries_exist() {
    let mut files = Vec::new();
    kustomizations(&root().join("deploy/k8s"), &mut files);
    assert!(
        files.len() >= 3,
        "deploy/k8s: expected the base and two overlays, found {} kustomization.yaml",
        files.len()
    );
    for file in files {
        let dir = file.parent().expect("a file has a directory");
        let shown = file.strip_prefix(root()).unwrap_or(&file).display().to_string();
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{shown}: cannot read: {e}"));
        let refs = kustomization_refs(&text);
        assert!(refs.iter().any(|(s, _)| s == "resources"), "{shown}: no resources: entries found");
        for (section, entry) in refs {
            let target = dir.join(&entry);
            if target.is_dir() {
                assert!(
                    target.join("kustomization.yaml").is_file(),
                    "{shown}: {section}: {entry} is a directory without a kustomization.yaml"
                );
            } else {
                assert!(target.is_file(), "{shown}: {section}: {entry} does not exist");
            }
        }
    }
}

#[test]
fn probe_and_scrape_paths_are_routes_of_the_rest_api() {
    let routes = read(REST_ROUTES);
    let is_route = |path: &str| routes.contains(&format!(".route(\"{path}\""));
    let d = deployment(&[DEPLOYMENT]);
    assert!(!d.probes.is_empty(), "{DEPLOYMENT}: no httpGet probe paths found");
    for (probe, path) in &d.probes {
        assert!(is_route(path), "{DEPLOYMENT}: {probe} GETs {path}, which {REST_ROUTES} does not route");
        // A draining or loading server is alive but not ready: liveness on
        // /readyz would restart every pod at each rollout.
        let expected = if probe == "livenessProbe" { "/healthz" } else { "/readyz" };
        assert_eq!(path, expected, "{DEPLOYMENT}: {probe} should GET {expected}, not {path}");
    }
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        assert!(d.probes.iter().any(|(p, _)| p == probe), "{DEPLOYMENT}: no {probe} with an httpGet path");
    }
    let monitor = read(SERVICE_MONITOR);
    let paths: Vec<&str> = monitor.lines().filter_map(code).filter_map(|l| yaml_value(l, "path")).collect();
    assert!(!paths.is_empty(), "{SERVICE_MONITOR}: no scrape path found");
    for path in paths {
        assert!(is_route(path), "{SERVICE_MONITOR}: scrapes {path}, which {REST_ROUTES} does not route");
    }
}

/// Registered metric families of runtime/metrics.rs: name → `Counter`,
/// `Gauge` or `Histogram`, from the rows of its `metric_families!` table
/// (`field: Type = constructor,` then `"name" => "help";`).
fn registered_metrics() -> BTreeMap<String, String> {
    let text = read(METRICS);
    let table = text
        .split("\nmetric_families! {")
        .nth(1)
        .and_then(|rest| rest.split("\n}\n").next())
        .unwrap_or_else(|| panic!("{METRICS}: no `metric_families! {{` table found; has the registry moved?"));
    let mut metrics = BTreeMap::new();
    let mut kind: Option<&str> = None;
    for line in table.lines().map(str::trim) {
        if line.starts_with("///") {
            continue;
        }
        if let Some((_, rest)) = line
            .split_once(": ")
            .filter(|(field, _)| !field.is_empty() && field.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        {
            kind = ["Histogram", "Counter", "Gauge"]
                .into_iter()
                .find(|k| rest.split(" = ").next().unwrap_or("").contains(k));
        } else if let Some(name) =
            line.strip_prefix('"').filter(|l| l.contains("\" =>")).and_then(|l| l.split('"').next())
        {
            let kind =
                kind.take().unwrap_or_else(|| panic!("{METRICS}: no counter, gauge or histogram type before {name}"));
            metrics.insert(name.to_string(), kind.to_string());
        }
    }
    assert!(metrics.len() >= 5, "{METRICS}: found only {} metric families; has the registry moved?", metrics.len());
    metrics
}

/// Asserts that series `name`, which `file` uses, is a family `registered`
/// holds, of the kind its suffix implies: prometheus-client writes a
/// counter's samples with `_total`, a histogram's as `_bucket`, `_sum` and
/// `_count`.
fn assert_registered(file: &str, name: &str, registered: &BTreeMap<String, String>) {
    let (family, kind) = if let Some(family) = name.strip_suffix("_total") {
        (family, "Counter")
    } else if let Some(family) = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)) {
        (family, "Histogram")
    } else {
        (name, "Gauge")
    };
    match registered.get(family) {
        Some(actual) => assert_eq!(
            actual, kind,
            "{file}: series {name} implies a {kind} named {family}, but {METRICS} registers {family} as a {actual}"
        ),
        None => {
            panic!("{file}: series {name}: {METRICS} registers no metric {family} (it has {:?})", registered.keys())
        }
    }
}

#[test]
fn adapter_and_hpa_metrics_are_what_the_code_exports() {
    let registered = registered_metrics();
    let rules = read(ADAPTER_RULES);
    let mut series = Vec::new();
    let mut exposed = Vec::new();
    for line in rules.lines().filter_map(code) {
        if let Some(query) = yaml_value(line, "seriesQuery") {
            series.push(query.split('{').next().unwrap_or("").trim().to_string());
        }
        if let Some(pattern) = yaml_value(line, "matches") {
            series.push(pattern.trim_start_matches('^').trim_end_matches('$').to_string());
        }
        if let Some(name) = yaml_value(line, "as") {
            exposed.push(name.to_string());
        }
    }
    assert!(!series.is_empty(), "{ADAPTER_RULES}: no seriesQuery found");
    for name in &series {
        assert_registered(ADAPTER_RULES, name, &registered);
    }
    // The QPS rule counts every inference API the server counts requests
    // under (runtime/metrics.rs APIS), and only those: metadata and status
    // calls stay out.
    let inference = ["predict", "classify", "regress", "multi_inference", "model_infer"];
    let apis = rules
        .split("api=~\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("{ADAPTER_RULES}: no api=~\"…\" matcher"));
    let mut counted: Vec<&str> = apis.split('|').collect();
    counted.sort_unstable();
    let mut wanted = inference.to_vec();
    wanted.sort_unstable();
    assert_eq!(counted, wanted, "{ADAPTER_RULES}: the QPS rule's APIs");
    let metrics_code = read(METRICS);
    for api in inference {
        assert!(metrics_code.contains(&format!("    \"{api}\",")), "{METRICS}: APIS lacks {api}");
    }
    let hpa = read(HPA);
    let used: Vec<&str> = hpa
        .lines()
        .filter_map(code)
        .filter(|l| l.trim_start().starts_with("name: sluice_"))
        .filter_map(|l| yaml_value(l, "name"))
        .collect();
    assert!(used.len() >= 2, "{HPA}: expected the QPS and queue-wait Pods metrics, found {used:?}");
    for name in used {
        assert!(
            exposed.iter().any(|e| e == name),
            "{HPA}: metric {name} is not defined by any rule's `as:` in {ADAPTER_RULES} ({exposed:?})"
        );
    }
}

#[test]
fn grace_period_outlasts_the_pre_stop_sleep_and_the_drain() {
    let main = command_line();
    for (config, files) in K8S_CONFIGS {
        let d = deployment(files);
        let grace = d.grace.unwrap_or_else(|| panic!("{files:?}: no terminationGracePeriodSeconds (the default 30 s is the drain timeout's default: no margin)"));
        let sleep = d.pre_stop_sleep.unwrap_or_else(|| panic!("{files:?}: no preStop sleep found"));
        // What the server will use, in its own order: the flag, its
        // environment variable, the config file, the code's default.
        let seconds = |name: &str, env: &str, key: &str| -> (u64, String) {
            assert!(
                main.contains(&format!("long = \"{name}\"")) && main.contains(&format!("env = \"{env}\"")),
                "{MAIN}: the --{name} flag or {env} has moved; update this test"
            );
            let (value, source) = if let Some(v) = flag(&d.args, name) {
                (v, format!("--{name}"))
            } else if let Some(v) = d.env.get(env) {
                (v.clone(), env.to_string())
            } else if let Some(v) = toml_values(&read(config)).get(&format!("server.{key}")) {
                (v.clone(), format!("{config} {key}"))
            } else {
                (code_default(key).to_string(), format!("the default in {CONFIG_DEFAULTS}"))
            };
            let value: u64 =
                value.parse().unwrap_or_else(|_| panic!("{files:?}: {name} '{value}' ({source}) is not a number"));
            (value, source)
        };
        let (delay, delay_source) = seconds("drain_delay", "SLUICE_DRAIN_DELAY", "drain_delay_secs");
        let (drain, source) = seconds("drain_timeout", "SLUICE_DRAIN_TIMEOUT", "drain_timeout_secs");
        assert!(
            grace > sleep + delay + drain,
            "{files:?}: terminationGracePeriodSeconds {grace} must exceed the preStop sleep ({sleep} s) plus the drain delay ({delay} s, from {delay_source}) plus the drain timeout ({drain} s, from {source}), or the kubelet kills requests still draining"
        );
    }
}

#[test]
fn ports_agree_between_configs_deployment_and_services() {
    let services = read(SERVICES);
    for (config, files) in K8S_CONFIGS {
        let d = deployment(files);
        let values = toml_values(&read(config));
        let effective = |flag_name: &str, key: &str| -> u64 {
            let value = flag(&d.args, flag_name)
                .or_else(|| values.get(&format!("server.{key}")).cloned())
                .unwrap_or_else(|| code_default(key).to_string());
            value.parse().unwrap_or_else(|_| panic!("{config}: server.{key} = {value} is not a number"))
        };
        let mut expected =
            vec![("grpc", effective("port", "port")), ("http", effective("rest_api_port", "rest_api_port"))];
        if values.get("admin.enabled").map(String::as_str) == Some("true") {
            if let Some(port) = values.get("admin.port") {
                expected.push((
                    "admin",
                    port.parse().unwrap_or_else(|_| panic!("{config}: [admin] port = {port} is not a number")),
                ));
            }
        }
        for (name, port) in &expected {
            assert_eq!(
                d.ports.get(*name),
                Some(port),
                "{files:?}: containerPort '{name}' should be {port}, the port {config} serves it on (container ports: {:?})",
                d.ports
            );
        }
    }
    // Each Service port targets a container port by name or number and
    // keeps the container's number, so clients use the documented ports.
    let d = deployment(&[DEPLOYMENT]);
    let mut checked = 0;
    for doc in services.split("\n---") {
        let mut port: Option<u64> = None;
        for line in doc.lines().filter_map(code) {
            if let Some(p) = yaml_value(line, "port") {
                port = Some(p.parse().unwrap_or_else(|_| panic!("{SERVICES}: port '{p}' is not a number")));
            }
            if let Some(target) = yaml_value(line, "targetPort") {
                let container = d
                    .ports
                    .get(target)
                    .copied()
                    .or_else(|| target.parse().ok().filter(|n| d.ports.values().any(|p| p == n)));
                let container = container.unwrap_or_else(|| {
                    panic!("{SERVICES}: targetPort {target} is no containerPort of {DEPLOYMENT} ({:?})", d.ports)
                });
                assert_eq!(
                    port,
                    Some(container),
                    "{SERVICES}: the Service port for targetPort {target} should be {container}, the container's port"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 2, "{SERVICES}: expected the REST and gRPC Service ports, found {checked} targetPort entries");
    let monitor = read(SERVICE_MONITOR);
    for port in monitor.lines().filter_map(code).filter_map(|l| yaml_value(l, "port")) {
        assert!(
            services.contains(&format!("name: {port}")),
            "{SERVICE_MONITOR}: scrapes port '{port}', which no Service in {SERVICES} names"
        );
    }
    assert!(
        services.contains("clusterIP: None"),
        "{SERVICES}: the gRPC Service must be headless (clusterIP: None) for client-side balancing"
    );
}

#[test]
fn deployment_flags_and_variables_are_the_binarys() {
    let main = command_line();
    let d = deployment(&[DEPLOYMENT]);
    assert_eq!(
        d.args.first().map(String::as_str),
        Some("serve"),
        "{DEPLOYMENT}: the container's args should start with the `serve` subcommand"
    );
    for arg in d.args.iter().filter(|a| a.starts_with("--")) {
        let name = arg.trim_start_matches("--").split('=').next().unwrap_or("");
        assert!(
            main.contains(&format!("long = \"{name}\"")) || main.contains(&format!("    {name}: ")),
            "{DEPLOYMENT}: --{name} is not a flag of {MAIN}"
        );
    }
    for name in d.env.keys() {
        assert!(
            main.contains(&format!("env = \"{name}\"")),
            "{DEPLOYMENT}: environment variable {name} is read nowhere in {MAIN}"
        );
    }
}

/// Where the image puts a path of the default config, as a repository path:
/// the COPY whose destination holds it.
fn image_source(copies: &[ContextCopy], path: &str) -> Option<PathBuf> {
    copies.iter().find_map(|copy| {
        let dest = copy.dest.trim_end_matches('/');
        let rest = path.strip_prefix(dest)?;
        let source = root().join(&copy.sources[0]);
        match rest.strip_prefix('/') {
            _ if rest.is_empty() => Some(source),
            Some(below) => Some(source.join(below)),
            None => None,
        }
    })
}

#[test]
fn the_image_holds_what_its_configs_name() {
    for dockerfile in DOCKERFILES {
        let copies = context_copies(dockerfile);
        let text = read(dockerfile);
        assert!(
            text.contains(&format!("COPY {IMAGE_CONFIG} {IMAGE_CONFIG_DIR}/sluice.toml")),
            "{dockerfile}: should install {IMAGE_CONFIG} as {IMAGE_CONFIG_DIR}/sluice.toml"
        );
        let config = read(IMAGE_CONFIG);
        let mut paths = Vec::new();
        for key in ["base_path", "file", "labels"] {
            paths.extend(toml_strings(&config, key));
        }
        assert!(!paths.is_empty(), "{IMAGE_CONFIG}: no base_path found");
        for path in paths {
            let absolute = if path.starts_with('/') { path.clone() } else { format!("{IMAGE_CONFIG_DIR}/{path}") };
            let source = image_source(&copies, &absolute).unwrap_or_else(|| {
                panic!("{IMAGE_CONFIG}: \"{path}\" ({absolute}) is put in the image by no COPY of {dockerfile}")
            });
            assert!(
                source.exists(),
                "{IMAGE_CONFIG}: \"{path}\" comes from {} in {dockerfile}, which does not exist",
                source.display()
            );
        }
        // Every plugin a config runs is shipped in /plugins by the image's
        // plugin stage (Kubernetes mounts only the store over it).
        let built = text.lines().find_map(|l| l.trim().strip_prefix("for p in ")).unwrap_or_else(|| {
            panic!("{dockerfile}: the `for p in …` loop that copies the built plugins was not found")
        });
        let built: Vec<&str> = built.split(';').next().unwrap_or("").split_whitespace().collect();
        for config in [IMAGE_CONFIG, K8S_CONFIGS[0].0, K8S_CONFIGS[1].0] {
            for plugin in toml_strings(&read(config), "plugin") {
                assert!(
                    built.contains(&plugin.as_str()),
                    "{config}: runs plugin '{plugin}', which {dockerfile} does not build into /plugins ({built:?})"
                );
                let crate_dir = format!("plugins/{}", plugin.replace('_', "-"));
                assert!(root().join(&crate_dir).is_dir(), "{config}: plugin '{plugin}' has no crate {crate_dir}");
            }
        }
    }
}

#[test]
fn alert_rules_use_only_series_the_code_exports() {
    const RULES: &str = "deploy/k8s/base/prometheus-rules.yaml";
    const RUNBOOKS: &str = "docs/RUNBOOKS.md";
    const METRICS_DOC: &str = "docs/METRICS.md";
    const TF_SERVING_METRICS: &str = "runtime/metrics/tf_serving.rs";

    /// Every whole `sluice_[a-z_]+` name in `text` (not the tail of a
    /// longer identifier).
    fn series_names(text: &str) -> Vec<String> {
        let mut names = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find("sluice_") {
            let inside = rest[..at].chars().last().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
            let tail = &rest[at..];
            let end = tail.find(|c: char| !(c.is_ascii_lowercase() || c == '_')).unwrap_or(tail.len());
            if !inside {
                names.push(tail[..end].to_string());
            }
            rest = &tail[end..];
        }
        names
    }

    /// A heading's anchor as GitHub makes it: lower case, spaces to `-`,
    /// punctuation other than `-` and `_` dropped.
    fn anchor(heading: &str) -> String {
        heading
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                '-' | '_' => Some(c),
                c if c.is_alphanumeric() => Some(c.to_ascii_lowercase()),
                _ => None,
            })
            .collect()
    }

    // The `expr:` of every rule: one line, or a `|`/`>` block of the lines
    // indented deeper than the key.
    let rules = read(RULES);
    let mut exprs: Vec<String> = Vec::new();
    let mut block: Option<usize> = None;
    for line in rules.lines() {
        if let Some(key_indent) = block {
            if line.trim().is_empty() || indent(line) > key_indent {
                let expr = exprs.last_mut().expect("a block follows its key");
                expr.push_str(line.trim());
                expr.push('\n');
                continue;
            }
            block = None;
        }
        let Some(line) = code(line) else { continue };
        if let Some(value) = yaml_value(line, "expr") {
            if value.starts_with('|') || value.starts_with('>') {
                block = Some(indent(line));
                exprs.push(String::new());
            } else {
                exprs.push(value.to_string());
            }
        }
    }
    let alerts = rules.lines().filter_map(code).filter(|l| yaml_value(l, "alert").is_some()).count();
    assert!(alerts >= 12, "{RULES}: expected the alerts of docs/RELIABILITY.md's failure modes, found {alerts}");
    assert_eq!(exprs.len(), alerts, "{RULES}: {alerts} alerts but {} `expr:` values", exprs.len());
    for expr in &exprs {
        assert!(!expr.trim().is_empty(), "{RULES}: an empty `expr:`");
    }

    // Each sluice_* series is a registered family, of the kind its suffix
    // implies.
    let registered = registered_metrics();
    let mut checked = 0;
    for expr in &exprs {
        for name in series_names(expr) {
            assert_registered(RULES, &name, &registered);
            checked += 1;
        }
    }
    assert!(checked >= alerts, "{RULES}: only {checked} sluice_* series found in {alerts} alerts' expressions");

    // Every alert links a heading of the runbooks.
    let mut headings = Vec::new();
    let mut fenced = false;
    for line in read(RUNBOOKS).lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            headings.push(anchor(line.trim_start_matches('#').trim()));
        }
    }
    assert!(!headings.is_empty(), "{RUNBOOKS}: no headings found");
    let urls: Vec<&str> =
        rules.lines().filter_map(|l| l.trim_start().strip_prefix("runbook_url:")).map(unquote).collect();
    assert_eq!(urls.len(), alerts, "{RULES}: every alert needs a runbook_url ({alerts} alerts, {} urls)", urls.len());
    for url in urls {
        let (page, fragment) =
            url.split_once('#').unwrap_or_else(|| panic!("{RULES}: runbook_url {url} names no section (#anchor)"));
        assert!(page.ends_with(RUNBOOKS), "{RULES}: runbook_url {url} does not point at {RUNBOOKS}");
        assert!(
            headings.iter().any(|h| h == fragment),
            "{RULES}: runbook_url {url}: {RUNBOOKS} has no heading with anchor #{fragment} (it has {headings:?})"
        );
    }

    // The reference lists every family, under the name its samples carry.
    let doc = read(METRICS_DOC);
    let documented = series_names(&doc);
    for (family, kind) in &registered {
        let exposed = match kind.as_str() {
            "Counter" => format!("{family}_total"),
            "Histogram" => format!("{family}_bucket"),
            _ => family.clone(),
        };
        assert!(
            documented.contains(&exposed),
            "{METRICS_DOC}: {METRICS} registers the {kind} {family}, exported as {exposed}, which is not listed"
        );
    }
    let tf_code = read(TF_SERVING_METRICS);
    let tf_code = tf_code.split("#[cfg(test)]").next().unwrap_or("");
    let tf_names: Vec<&str> =
        tf_code.split("\":tensorflow:").skip(1).filter_map(|rest| rest.split('"').next()).collect();
    assert!(tf_names.len() >= 5, "{TF_SERVING_METRICS}: found only {} TF Serving families", tf_names.len());
    for name in tf_names {
        assert!(
            doc.contains(&format!("`:tensorflow:{name}")),
            "{METRICS_DOC}: TF Serving's family :tensorflow:{name} ({TF_SERVING_METRICS}) is not listed"
        );
    }
}
