//! Host bindings for the two plugin worlds, generated from `sdk/wit` — the
//! same file the guest SDK is generated from. The postprocessor world
//! reuses the preprocessor world's types, so a tensor is one Rust type on
//! the host whichever world it crosses.

#![allow(missing_docs, clippy::all)]

/// The `preprocessor` world.
pub mod pre {
    wasmtime::component::bindgen!({
        path: "sdk/wit",
        world: "preprocessor",
    });
}

/// The `postprocessor` world.
pub mod post {
    wasmtime::component::bindgen!({
        path: "sdk/wit",
        world: "postprocessor",
        with: {
            "sluice:plugin/types": super::pre::sluice::plugin::types,
            "sluice:plugin/log": super::pre::sluice::plugin::log,
        },
    });
}

pub use pre::sluice::plugin::log::Level;
pub use pre::sluice::plugin::types::{Dtype, PluginError, PluginInfo, Tensor, TensorSpec};
