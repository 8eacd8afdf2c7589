//! The path of a request from admission to the answer.
//!
//! [`admission`] bounds how many requests wait at once, and [`deadline`]
//! carries the client's deadline through every stage.

pub mod admission;
pub mod deadline;
