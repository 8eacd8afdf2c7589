//! sluice: a model-serving runtime.
//!
//! The layers, top to bottom; each imports only layers below it (the test
//! `tests/layers.rs` fails on any import that points up or sideways):
//!
//! - [`cli`]: commands other than `serve` (`bench`, `plugin check/push`,
//!   `config check`); nothing in the library imports it.
//! - [`server`]: starts and stops everything below.
//! - [`api`]: thin codecs — TF Serving's gRPC and REST APIs, the plugin
//!   admin API, health — that turn a client's request into one validated
//!   [`pipeline::ValidRequest`] and its answer back into bytes.
//! - [`pipeline`]: admission, feature fetch, the stages (built-in
//!   transforms and the plugin adapter), the dynamic batcher, the
//!   inference stage.
//! - [`models`], [`plugin`] and [`feature`]: the loaded model versions; the
//!   WebAssembly host and the plugin registry; the feature stores. None
//!   imports another.
//! - [`infer`]: the backends that run a batch through a model.
//! - [`tensor`]: tensors, signatures and their wire conversions.
//! - [`config`], [`metrics`], [`threads`], [`private_files`], [`error`],
//!   [`proto`]: types and services every layer shares (`threads` starts
//!   the compute threads, below the network threads' priority;
//!   `private_files` checks the caches whose files run as native code);
//!   they import none of the above.
//!
//! `docs/ARCHITECTURE.md` follows one request through these files.

pub mod api;
pub mod cli;
pub mod config;
pub mod error;
pub mod feature;
pub mod infer;
pub mod metrics;
pub mod models;
pub mod pipeline;
pub mod plugin;
pub mod private_files;
pub mod proto;
pub mod server;
pub mod tensor;
pub mod threads;
