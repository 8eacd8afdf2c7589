//! `sluice plugin new NAME --world preprocessor|postprocessor [--model DIR]
//! [--lang rust|python|js]`: a plugin project that builds and passes
//! `sluice plugin check` as generated, declaring the model's inputs (a
//! preprocessor) or outputs (a postprocessor) when `--model` is given.
//!
//! - Rust: a crate — `Cargo.toml` with `cdylib`, `.cargo/config.toml` with
//!   the WebAssembly target's stack size and a `cargo wasm` alias, a
//!   `lib.rs`, and a test that runs its sample under the host's checks.
//! - Python and JavaScript: the project in `sdk/python/template` or
//!   `sdk/js/template` (built into this binary), with the SDK module and
//!   the WIT contract copied beside it, so it builds with nothing but its
//!   own script (componentize-py in a venv of its own; componentize-qjs
//!   from npm).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};

use crate::config::{ModelConfig, VersionPolicy};
use crate::metrics::Metrics;
use crate::models::load_selected;
use crate::tensor::spec::TensorSpec;
use crate::tensor::DType;

/// Which side of the model the plugin runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WorldArg {
    /// Before the model: turns what clients send into the model's inputs.
    Preprocessor,
    /// After the model: turns its outputs into the answer.
    Postprocessor,
}

/// The language the plugin is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Lang {
    /// A Rust crate on the sluice-sdk crate.
    Rust,
    /// Python, built by componentize-py.
    Python,
    /// JavaScript, built by componentize-qjs (QuickJS).
    Js,
}

/// The flags of `sluice plugin new`.
#[derive(Debug, Clone, Args)]
pub struct NewArgs {
    /// The plugin's name: the project's directory, the `.wasm` file and
    /// what pipelines name in `plugin = "…"` (letters, digits, `_`).
    pub name: String,
    /// Before or after the model.
    #[arg(long, value_enum)]
    pub world: WorldArg,
    /// A model directory (`VERSION/model.onnx`): the plugin is generated
    /// to fit its latest version.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The language: a Rust crate, or a Python or JavaScript project.
    #[arg(long, value_enum, default_value_t = Lang::Rust)]
    pub lang: Lang,
    /// Where to create the project (a new directory NAME inside it).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Rust only: the sluice-sdk crate to depend on (by path; it is not
    /// published). Default: the `sdk/` of the checkout this binary was
    /// built from. Python and JavaScript projects get the SDK module
    /// copied in.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/sdk"))]
    pub sdk: PathBuf,
}

/// Creates the crate; answers what was made and the next commands.
pub async fn create(args: &NewArgs) -> anyhow::Result<String> {
    let starts_with_letter = args.name.chars().next().is_some_and(|c| c.is_ascii_alphabetic());
    if !starts_with_letter || !args.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        bail!(
            "plugin name \"{}\": a letter, then letters, digits and '_' (it names the crate and the .wasm file)",
            args.name
        );
    }
    let root = args.dir.join(&args.name);
    if root.exists() {
        bail!("{} already exists; choose another name or --dir", root.display());
    }
    let specs = match &args.model {
        Some(dir) => Some(model_side(dir, args.world).await?),
        None => None,
    };
    if args.lang != Lang::Rust {
        return from_template(args, &root, specs.as_deref());
    }
    let sdk = std::fs::canonicalize(&args.sdk)
        .with_context(|| format!("--sdk {}: the sluice-sdk crate is not there", args.sdk.display()))?;
    std::fs::create_dir_all(root.join("src"))?;
    std::fs::create_dir_all(root.join(".cargo"))?;
    std::fs::write(root.join("Cargo.toml"), cargo_toml(&args.name, &sdk))?;
    std::fs::write(root.join(".cargo/config.toml"), CARGO_CONFIG)?;
    std::fs::write(root.join(".gitignore"), "/target\n")?;
    std::fs::write(root.join("src/lib.rs"), lib_rs(&args.name, args.world, specs.as_deref()))?;
    let check = match &args.model {
        Some(dir) => format!(" --model {}", dir.display()),
        None => String::new(),
    };
    Ok(format!(
        "created {root}\n  cd {root}\n  cargo test                      # runs its sample under the host's checks\n  \
         cargo wasm                      # builds target/wasm32-wasip2/release/{name}.wasm\n  \
         sluice plugin check target/wasm32-wasip2/release/{name}.wasm{check}",
        root = root.display(),
        name = args.name
    ))
}

/// A file of a Python or JavaScript project: its path in the project, its
/// text, and whether it is a script to run.
type TemplateFile = (&'static str, &'static str, bool);

/// The Python project: `sdk/python/template` with the SDK and the WIT.
const PYTHON: &[TemplateFile] = &[
    ("app.py", include_str!("../../sdk/python/template/app.py"), false),
    ("test_app.py", include_str!("../../sdk/python/template/test_app.py"), false),
    ("build.sh", include_str!("../../sdk/python/template/build.sh"), true),
    ("README.md", include_str!("../../sdk/python/template/README.md"), false),
    (".gitignore", include_str!("../../sdk/python/template/.gitignore"), false),
    ("sluice_plugin.py", include_str!("../../sdk/python/sluice_plugin.py"), false),
    ("wit/plugin.wit", include_str!("../../sdk/wit/plugin.wit"), false),
];

/// The JavaScript project: `sdk/js/template` with the SDK and the WIT.
const JS: &[TemplateFile] = &[
    ("app.js", include_str!("../../sdk/js/template/app.js"), false),
    ("test.mjs", include_str!("../../sdk/js/template/test.mjs"), false),
    ("package.json", include_str!("../../sdk/js/template/package.json"), false),
    ("README.md", include_str!("../../sdk/js/template/README.md"), false),
    (".gitignore", include_str!("../../sdk/js/template/.gitignore"), false),
    ("sluice_plugin.js", include_str!("../../sdk/js/sluice_plugin.js"), false),
    ("wit/plugin.wit", include_str!("../../sdk/wit/plugin.wit"), false),
];

/// Writes a Python or JavaScript project from its template.
fn from_template(args: &NewArgs, root: &Path, model: Option<&[TensorSpec]>) -> anyhow::Result<String> {
    let generic = [TensorSpec::new("x", DType::F32, vec![-1, -1])];
    let specs = model.unwrap_or(&generic);
    let (files, indent, none, next) = match args.lang {
        Lang::Python => (
            PYTHON,
            "        ",
            "None",
            "./build.sh test                 # runs the plugin on its sample in plain Python\n  \
             ./build.sh                      # builds NAME.wasm (componentize-py, in .venv)",
        ),
        Lang::Js => (
            JS,
            "    ",
            "null",
            "npm install && npm test         # runs the plugin on its sample in Node.js\n  \
             npm run build                   # builds NAME.wasm (componentize-qjs)",
        ),
        Lang::Rust => unreachable!("Rust plugins are crates, not templates"),
    };
    let lines = |specs: &[TensorSpec]| -> String {
        specs
            .iter()
            .map(|s| {
                let dims: Vec<String> = s.shape.iter().map(i64::to_string).collect();
                format!("{indent}spec({:?}, {:?}, [{}]),", s.name, wit_dtype(s.dtype), dims.join(", "))
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let world = match args.world {
        WorldArg::Preprocessor => "preprocessor",
        WorldArg::Postprocessor => "postprocessor",
    };
    for (path, text, executable) in files {
        let filled = text
            .replace("{{name}}", &args.name)
            .replace("{{world}}", world)
            .replace("{{inputs}}", &lines(specs))
            .replace("{{outputs}}", &lines(specs))
            .replace("{{sample}}", none);
        let target = root.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&target, filled).with_context(|| format!("writing {}", target.display()))?;
        if *executable {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    let check = match &args.model {
        Some(dir) => format!(" --model {}", dir.display()),
        None => String::new(),
    };
    Ok(format!(
        "created {root}\n  cd {root}\n  {next}\n  sluice plugin check {name}.wasm{check}",
        root = root.display(),
        next = next.replace("NAME", &args.name),
        name = args.name
    ))
}

/// A dtype as the WIT contract (and the Python and JavaScript SDKs) spell
/// it.
fn wit_dtype(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::I8 => "i8",
        DType::I16 => "i16",
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::U8 => "u8",
        DType::U16 => "u16",
        DType::U32 => "u32",
        DType::U64 => "u64",
        DType::Bool => "boolean",
        DType::String => "string",
        // Refused in model_side before any code is written.
        DType::Complex64 | DType::Complex128 => "unsupported",
    }
}

/// The tensors the plugin must produce (a preprocessor: the model's
/// inputs) or take (a postprocessor: its outputs), from the latest version.
async fn model_side(dir: &Path, world: WorldArg) -> anyhow::Result<Vec<TensorSpec>> {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("model").to_string();
    let config = ModelConfig { version_policy: VersionPolicy::Latest(1), ..ModelConfig::from_flags(name, dir.into()) };
    let metrics = Metrics::new();
    let versions = load_selected(&config, None, &Default::default(), &metrics).await?;
    let model = versions.last().cloned().ok_or_else(|| anyhow::anyhow!("{}: no version loaded", dir.display()))?;
    let signature = model.signature();
    let side = match world {
        WorldArg::Preprocessor => signature.inputs.clone(),
        WorldArg::Postprocessor => signature.outputs.clone(),
    };
    if let Some(spec) = side.iter().find(|s| !s.dtype.in_plugin_interface()) {
        anyhow::bail!(
            "{}: '{}' is {}, which the plugin interface does not carry (it has no complex types): a plugin \
             cannot sit on this side of the model",
            dir.display(),
            spec.name,
            spec.dtype
        );
    }
    Ok(side)
}

fn cargo_toml(name: &str, sdk: &Path) -> String {
    format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2021"
publish = false

# A plugin crate stands alone, even when created inside another workspace.
[workspace]

[lib]
# cdylib: the .wasm component sluice loads; rlib: `cargo test` natively.
crate-type = ["cdylib", "rlib"]

[dependencies]
sluice-sdk = {{ path = {sdk} }}

[profile.release]
# Small, fast components: no debug info, one codegen unit.
debug = false
strip = true
lto = true
codegen-units = 1
"#,
        // Quoted and escaped as TOML writes strings.
        sdk = toml::Value::String(sdk.display().to_string())
    )
}

const CARGO_CONFIG: &str = r#"# `cargo wasm` builds the component sluice loads.
[alias]
wasm = "build --release --target wasm32-wasip2"

# A small stack keeps the plugin's memory to a few pages, which the host
# resets quickly for each fresh instance.
[target.wasm32-wasip2]
rustflags = ["-C", "link-arg=-zstack-size=16384"]
"#;

fn specs_code(specs: &[TensorSpec]) -> String {
    let mut out = String::new();
    for spec in specs {
        let dims: Vec<String> = spec.shape.iter().map(i64::to_string).collect();
        let _ =
            writeln!(out, "        TensorSpec::new({:?}, DType::{:?}, &[{}]),", spec.name, spec.dtype, dims.join(", "));
    }
    out
}

fn lib_rs(name: &str, world: WorldArg, model: Option<&[TensorSpec]>) -> String {
    let generic = [TensorSpec::new("x", DType::F32, vec![-1, -1])];
    let specs = specs_code(model.unwrap_or(&generic));
    let (trait_name, function, export, side) = match world {
        WorldArg::Preprocessor => ("Preprocessor", "preprocess", "export_preprocessor", "the model's inputs"),
        WorldArg::Postprocessor => ("Postprocessor", "postprocess", "export_postprocessor", "the model's outputs"),
    };
    let source = if model.is_some() { side } else { "a placeholder: `x`, f32, any rows and columns" };
    format!(
        r#"//! `{name}`: a sluice {world} plugin.
//!
//! `describe` says what it takes and returns; `{function}` does the work.
//! As generated it takes and returns {source}, unchanged: change
//! `inputs()` to what it should take, and `{function}` to the transform.
//! The host checks every input against `inputs()` before calling it (at
//! least one row, names, dtypes, ranks, fixed dimensions; values such as
//! NaN are not checked) and every output against `outputs()` after.

use sluice_sdk::{{DType, Inputs, PluginError, PluginInfo, {trait_name}, Tensor, TensorSpec}};

/// The plugin.
pub struct Plugin;

/// What it takes.
fn inputs() -> Vec<TensorSpec> {{
    vec![
{specs}    ]
}}

/// What it returns: {side}.
fn outputs() -> Vec<TensorSpec> {{
    vec![
{specs}    ]
}}

impl {trait_name} for Plugin {{
    fn describe() -> PluginInfo {{
        let mut info = PluginInfo::new("{name}", "0.1.0");
        for spec in inputs() {{
            info = info.input(spec);
        }}
        for spec in outputs() {{
            info = info.output(spec);
        }}
        // Run by `sluice plugin check` and before every upload serves.
        match inputs().iter().map(zeros).collect::<Result<Vec<_>, _>>() {{
            Ok(sample) => info.sample(sample),
            Err(_) => info,
        }}
    }}

    fn {function}(inputs: Inputs) -> Result<Vec<Tensor>, PluginError> {{
        // The transform goes here. As generated, each output is the input
        // of the same name.
        outputs().iter().map(|spec| inputs.get(&spec.name).cloned()).collect()
    }}
}}

/// Zeros shaped like `spec` (one row where any size goes).
fn zeros(spec: &TensorSpec) -> Result<Tensor, PluginError> {{
    let shape: Vec<i64> = spec.shape.iter().map(|&d| d.max(1)).collect();
    let count = shape.iter().product::<i64>() as usize;
    match spec.dtype.size() {{
        Some(size) => Tensor::from_parts(spec.name.clone(), spec.dtype, shape, vec![0; count * size], Vec::new()),
        None => Tensor::from_parts(spec.name.clone(), spec.dtype, shape, Vec::new(), vec![Vec::new(); count]),
    }}
}}

sluice_sdk::{export}!(Plugin);

#[cfg(test)]
mod tests {{
    use super::*;

    #[test]
    fn its_sample_runs_under_the_hosts_checks() {{
        let answer = sluice_sdk::testing::run_{world}_sample::<Plugin>().expect("the sample runs");
        assert_eq!(answer.len(), outputs().len());
    }}
}}
"#,
        world = match world {
            WorldArg::Preprocessor => "preprocessor",
            WorldArg::Postprocessor => "postprocessor",
        }
    )
}
