//! Fuzz target `config_toml`: see `fuzz/harness.rs`.
#![no_main]

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::config_toml(data));
