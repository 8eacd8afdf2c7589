//! Fuzz target `rest_json`: see `fuzz/harness.rs`.
#![no_main]

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::rest_json(data));
