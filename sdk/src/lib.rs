//! `sluice-sdk`: write sluice preprocessing and postprocessing plugins in
//! Rust, build them to WebAssembly, and test them natively.
//!
//! A plugin is a type that implements [`Preprocessor`] (tensors from the
//! client in, model inputs out) or [`Postprocessor`] (model outputs in, the
//! answer out), exported with [`export_preprocessor!`] or
//! [`export_postprocessor!`]. Tensors come with typed views and builders,
//! so a plugin never does byte arithmetic; errors are one [`PluginError`];
//! [`testing`] runs a plugin natively under the same checks the host makes.
//!
//! ```ignore
//! use sluice_sdk::{DType, Inputs, PluginError, PluginInfo, Preprocessor, Tensor, TensorSpec};
//!
//! struct Scale;
//!
//! impl Preprocessor for Scale {
//!     fn describe() -> PluginInfo {
//!         PluginInfo::new("scale", "1.0.0")
//!             .input(TensorSpec::new("raw", DType::F32, &[-1, 64]))
//!             .output(TensorSpec::new("x", DType::F32, &[-1, 64]))
//!     }
//!
//!     fn preprocess(inputs: Inputs) -> Result<Vec<Tensor>, PluginError> {
//!         let raw = inputs.get("raw")?;
//!         let x: Vec<f32> = raw.values::<f32>()?.iter().map(|v| v / 255.0).collect();
//!         Ok(vec![Tensor::new("x", raw.shape().to_vec(), &x)?])
//!     }
//! }
//!
//! sluice_sdk::export_preprocessor!(Scale);
//! ```

#![deny(missing_docs)]

mod dtype;
mod tensor;
pub mod testing;
pub mod transforms;

use std::fmt;
use std::sync::OnceLock;

pub use self::dtype::{DType, UnservedDType};
pub use self::tensor::{Element, Inputs, Tensor, TensorSpec};

#[doc(hidden)]
pub use wit_bindgen as __wit_bindgen;

include!(concat!(env!("OUT_DIR"), "/export_macros.rs"));

/// Why a plugin call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginError {
    /// The input was wrong; the client gets INVALID_ARGUMENT with this message.
    InvalidInput(String),
    /// The plugin failed; the client gets INTERNAL.
    Internal(String),
}

impl PluginError {
    /// The input was wrong.
    pub fn invalid_input(message: impl Into<String>) -> Self {
        PluginError::InvalidInput(message.into())
    }

    /// The plugin failed.
    pub fn internal(message: impl Into<String>) -> Self {
        PluginError::Internal(message.into())
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PluginError::InvalidInput(m) => write!(f, "invalid input: {m}"),
            PluginError::Internal(m) => write!(f, "internal error: {m}"),
        }
    }
}

impl std::error::Error for PluginError {}

/// What a plugin says about itself: its name and version, what it takes
/// and returns, and a sample input to try it with.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginInfo {
    /// The plugin's name.
    pub name: String,
    /// Its version, as its author numbers them.
    pub version: String,
    /// The tensors it takes.
    pub inputs: Vec<TensorSpec>,
    /// The tensors it returns, in order.
    pub outputs: Vec<TensorSpec>,
    /// Inputs to try it with before it serves.
    pub sample: Option<Vec<Tensor>>,
}

impl PluginInfo {
    /// A plugin with no inputs or outputs yet.
    pub fn new(name: impl Into<String>, version: impl Into<String>) -> Self {
        PluginInfo { name: name.into(), version: version.into(), inputs: Vec::new(), outputs: Vec::new(), sample: None }
    }

    /// Adds an input.
    pub fn input(mut self, spec: TensorSpec) -> Self {
        self.inputs.push(spec);
        self
    }

    /// Adds an output.
    pub fn output(mut self, spec: TensorSpec) -> Self {
        self.outputs.push(spec);
        self
    }

    /// Sets the sample input.
    pub fn sample(mut self, sample: Vec<Tensor>) -> Self {
        self.sample = Some(sample);
        self
    }
}

/// Runs before the model.
pub trait Preprocessor {
    /// Name, version, inputs, outputs.
    fn describe() -> PluginInfo;
    /// Turns the client's tensors into the model's inputs.
    fn preprocess(inputs: Inputs) -> Result<Vec<Tensor>, PluginError>;
}

/// Runs after the model.
pub trait Postprocessor {
    /// Name, version, inputs, outputs.
    fn describe() -> PluginInfo;
    /// Turns the model's outputs into the answer.
    fn postprocess(inputs: Inputs) -> Result<Vec<Tensor>, PluginError>;
}

/// Log levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Details.
    Debug,
    /// Normal events.
    Info,
    /// Something odd.
    Warn,
    /// Something wrong.
    Error,
}

static LOGGER: OnceLock<fn(Level, &str)> = OnceLock::new();

#[doc(hidden)]
pub fn __set_logger(logger: fn(Level, &str)) {
    let _ = LOGGER.set(logger);
}

/// Writes a line to the host's log (to stderr when run natively). The host
/// caps how much a call may log.
pub fn log(level: Level, message: &str) {
    match LOGGER.get() {
        Some(logger) => logger(level, message),
        None => eprintln!("[{level:?}] {message}"),
    }
}
