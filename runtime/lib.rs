//! sluice: a model-serving runtime.
//!
//! A request enters through [`api`] (TF Serving's gRPC API), is validated
//! into [`tensor`]s against the model's signature, passes the bounded
//! queues of [`pipeline`], and is run by a backend from [`infer`] on a model
//! version that [`models`] loaded. [`server`] puts these together;
//! [`config`] describes them; [`error`] is the one error type all of them
//! return.

pub mod api;
pub mod bench;
pub mod config;
pub mod error;
pub mod infer;
pub mod models;
pub mod pipeline;
pub mod plugin;
pub mod proto;
pub mod server;
pub mod tensor;
