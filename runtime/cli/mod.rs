//! `sluice serve`'s flags ([`serve_args`]) and the commands besides
//! `serve`: `sluice bench` ([`bench`]), `sluice
//! plugin check`, `new` and `push`/`list`/… ([`plugin_check`],
//! [`plugin_new`], [`plugin_push`]), `sluice
//! config check` ([`config_check`]), `sluice features load`
//! ([`features_load`]), `sluice warmup make` ([`warmup_make`]) and
//! `sluice model twin` ([`model_twin`]). They
//! sit above the library: they use
//! it, nothing in it uses them.

pub mod bench;
pub mod config_check;
pub mod config_convert;
pub mod features_load;
pub mod model_twin;
pub mod plugin_check;
pub mod plugin_new;
pub mod plugin_push;
pub mod serve_args;
pub mod warmup_make;
