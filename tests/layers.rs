//! The runtime's layers, checked from its source: every `crate::X` path in
//! a top-level module of `runtime/` must point to a layer strictly below
//! it (so there is no import cycle, and no sideways import between
//! `models/` and `plugin/`); inside a folder, imports between its files
//! run one way too (a module's own file and its direct children aside);
//! and every source file opens with a `//!` paragraph saying what it owns.
//! `docs/ARCHITECTURE.md` draws the same layers.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module and its layer; a module may import only modules
/// of a lower layer. Keep in step with `runtime/lib.rs` and
/// `docs/ARCHITECTURE.md`.
const LAYERS: &[(&str, u32)] = &[
    ("error", 0),
    ("proto", 0),
    ("config", 1),
    ("metrics", 1),
    ("threads", 1),
    ("private_files", 1),
    ("tensor", 2),
    ("infer", 3),
    ("models", 4),
    ("plugin", 4),
    ("feature", 4),
    ("pipeline", 5),
    ("api", 6),
    ("server", 7),
    ("cli", 8),
];

/// Macros exported at the crate root, and the module that defines them.
const ROOT_MACROS: &[(&str, &str)] = &[("invalid", "error")];

fn runtime_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("runtime")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read runtime/") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to: `runtime/pipeline/stage.rs` →
/// `pipeline`; `None` for the crate roots.
fn module_of(file: &Path) -> Option<String> {
    let relative = file.strip_prefix(runtime_dir()).expect("under runtime/");
    let first = relative.components().next()?.as_os_str().to_str()?.to_string();
    match first.as_str() {
        "lib.rs" | "main.rs" => None,
        name => Some(name.trim_end_matches(".rs").to_string()),
    }
}

/// The modules `source` names through `crate::NAME`, outside comments.
fn imports(source: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in source.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let name: String = after.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            // `$crate::` inside a macro is the crate root, not a module.
            let preceded_by_dollar = at > 0 && rest.as_bytes()[at - 1] == b'$';
            if !name.is_empty() && !preceded_by_dollar {
                let module = ROOT_MACROS.iter().find(|(m, _)| *m == name).map_or(name.clone(), |(_, d)| d.to_string());
                found.insert(module);
            }
            rest = after;
        }
    }
    found
}

fn graph() -> BTreeMap<String, BTreeMap<String, Vec<String>>> {
    let mut files = Vec::new();
    rust_files(&runtime_dir(), &mut files);
    let mut graph: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    for file in files {
        let Some(module) = module_of(&file) else { continue };
        let source = std::fs::read_to_string(&file).expect("read source");
        let shown = file.strip_prefix(runtime_dir()).expect("under runtime/").display().to_string();
        let edges = graph.entry(module.clone()).or_default();
        for target in imports(&source) {
            if target != module {
                edges.entry(target).or_default().push(shown.clone());
            }
        }
    }
    graph
}

#[test]
fn every_import_points_down_a_layer() {
    let layer = |name: &str| LAYERS.iter().find(|(m, _)| *m == name).map(|(_, l)| *l);
    let mut wrong = Vec::new();
    for (module, edges) in graph() {
        let Some(own) = layer(&module) else {
            wrong.push(format!("runtime/{module} is not in LAYERS; give it a layer"));
            continue;
        };
        for (target, files) in edges {
            match layer(&target) {
                None => wrong.push(format!("{module} imports crate::{target}, which is not in LAYERS ({files:?})")),
                Some(theirs) if theirs >= own => wrong.push(format!(
                    "{module} (layer {own}) imports {target} (layer {theirs}) in {files:?}; imports must point down"
                )),
                Some(_) => {}
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn no_import_cycle_between_top_level_modules() {
    let graph = graph();
    // Depth-first search for a back edge; report the cycle it closes.
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeMap<String, Vec<String>>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flat_map(|edges| edges.keys()) {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, &graph, &mut Vec::new(), &mut done) {
            panic!("import cycle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_checker_sees_imports() {
    let found =
        imports("use crate::pipeline::Target;\n// use crate::api::x;\nlet e = crate::invalid!(\"x\");\n$crate::DType");
    assert_eq!(found, BTreeSet::from(["pipeline".to_string(), "error".to_string()]));
}

#[test]
fn every_source_file_says_what_it_owns() {
    let mut files = Vec::new();
    rust_files(&runtime_dir(), &mut files);
    let missing: Vec<String> = files
        .iter()
        .filter(|f| !std::fs::read_to_string(f).expect("read source").starts_with("//!"))
        .map(|f| f.display().to_string())
        .collect();
    assert!(missing.is_empty(), "files without a //! header: {missing:?}");
}

/// A source file's module path: `api/rest/admin.rs` → `[api, rest, admin]`,
/// `api/rest/mod.rs` → `[api, rest]`.
fn module_path(file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(runtime_dir()).expect("under runtime/");
    let mut parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if let Some(last) = parts.pop() {
        if last != "mod.rs" {
            parts.push(last.trim_end_matches(".rs").to_string());
        }
    }
    parts
}

/// The file a module path lives in: the longest prefix that is a file.
fn file_of(path: &[String]) -> Option<PathBuf> {
    (1..=path.len()).rev().find_map(|n| {
        let base = runtime_dir().join(path[..n].join("/"));
        let file = base.with_extension("rs");
        if file.is_file() {
            Some(file)
        } else if base.join("mod.rs").is_file() {
            Some(base.join("mod.rs"))
        } else {
            None
        }
    })
}

/// The module paths `source` (the file at `own`) names through `crate::`,
/// `super::` and `self::`, groups (`super::{a, b}`) included.
fn module_references(source: &str, own: &[String]) -> Vec<Vec<String>> {
    let ident = |s: &str| -> String { s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect() };
    let mut found = Vec::new();
    for line in source.lines() {
        let code = line.split("//").next().unwrap_or("");
        // `super` is the parent module whether the file is a module's
        // mod.rs or a leaf; `self` is the file's own module.
        for (prefix, base) in [
            ("crate::", Vec::new()),
            ("super::", own[..own.len().saturating_sub(1)].to_vec()),
            ("self::", own.to_vec()),
        ] {
            let mut rest = code;
            while let Some(at) = rest.find(prefix) {
                let before = rest[..at].chars().last();
                rest = &rest[at + prefix.len()..];
                if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$' || c == ':') {
                    continue;
                }
                let names: Vec<String> = match rest.strip_prefix('{') {
                    Some(group) => group.split('}').next().unwrap_or("").split(',').map(|n| ident(n.trim())).collect(),
                    None => {
                        let path: Vec<String> = rest.split("::").map(ident).take_while(|s| !s.is_empty()).collect();
                        vec![path.join("::")]
                    }
                };
                for name in names.into_iter().filter(|n| !n.is_empty()) {
                    let mut path = base.clone();
                    path.extend(name.split("::").map(str::to_string));
                    found.push(path);
                }
            }
        }
    }
    found
}

#[test]
fn imports_between_files_of_one_folder_run_one_way() {
    let mut files = Vec::new();
    rust_files(&runtime_dir(), &mut files);
    // file → files of the same top-level module it imports, leaving out a
    // module's own file (mod.rs) and its direct children: declaring a
    // child and a child using its parent's items is structure, not a circle.
    let mut graph: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for file in &files {
        let own = module_path(file);
        if own.is_empty() || module_of(file).is_none() {
            continue;
        }
        let is_mod = file.file_name().is_some_and(|n| n == "mod.rs");
        let source = std::fs::read_to_string(file).expect("read source");
        let parent_file = file_of(&own[..own.len() - 1]);
        for path in module_references(&source, &own) {
            let Some(target) = file_of(&path) else { continue };
            let same_top = module_path(&target).first() == own.first();
            let child_of_this = is_mod && module_path(&target).len() == own.len() + 1;
            let this_parent = parent_file.as_ref() == Some(&target);
            if &target != file && same_top && !child_of_this && !this_parent {
                graph.entry(file.clone()).or_default().insert(target);
            }
        }
    }
    fn visit(
        node: &PathBuf,
        graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        path: &mut Vec<PathBuf>,
        done: &mut BTreeSet<PathBuf>,
    ) -> Option<Vec<PathBuf>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.clone());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.clone());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.clone());
        None
    }
    let mut done = BTreeSet::new();
    let mut cycles = BTreeSet::new();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, &graph, &mut Vec::new(), &mut done) {
            let shown: Vec<String> =
                cycle.iter().map(|f| f.strip_prefix(runtime_dir()).unwrap_or(f).display().to_string()).collect();
            cycles.insert(shown.join(" -> "));
        }
    }
    let cycles: Vec<String> = cycles.into_iter().collect();
    assert!(cycles.is_empty(), "import circles between files of one folder:\n{}", cycles.join("\n"));
}

#[test]
fn the_file_checker_sees_imports_and_groups() {
    let own: Vec<String> = ["api", "context"].iter().map(|s| s.to_string()).collect();
    let found = module_references("use super::health::PhaseCell;\nuse super::{phase, rest::admin::Admin};", &own);
    let files: Vec<PathBuf> = found.iter().filter_map(|p| file_of(p)).collect();
    let shown: Vec<String> =
        files.iter().map(|f| f.strip_prefix(runtime_dir()).unwrap_or(f).display().to_string()).collect();
    assert_eq!(shown, vec!["api/health.rs", "api/phase.rs", "api/rest/mod.rs"]);
}
