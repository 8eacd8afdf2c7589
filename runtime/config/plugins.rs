//! The `[plugins]` table: where plugins are and the limits the host runs
//! them under. The host that reads it is `plugin`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::redis_access::{RedisAccess, RedisTls};
use crate::error::{Error, Result};

/// The `[plugins]` table: where plugins are and how the engine runs them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PluginsConfig {
    /// The directory of `NAME.wasm` files that pipelines name.
    pub dir: Option<PathBuf>,
    /// Where compiled plugins are cached; none when unset.
    pub cache_dir: Option<PathBuf>,
    /// Meter fuel, so that `fuel` limits apply (costs a few percent).
    pub fuel: bool,
    /// Plugin instances that may exist at once (the instance pool).
    pub max_instances: u32,
    /// Plugin calls one team's stages may run at once, over all its
    /// pipelines: a team whose plugin burns its whole time budget on every
    /// call gets this share of the cores, and the other teams the rest.
    /// Default: half the cores, at least 1.
    pub max_calls_per_team: usize,
    /// The largest `memory_mib` any plugin may be given.
    pub max_memory_mib: u64,
    /// Per `reset` instance: how much of the memory a call wrote is put
    /// back by copying the frozen image over it and kept mapped (KiB), so
    /// the next call writes it without page faults; written pages past it
    /// are dropped and fault in again.
    pub keep_resident_kib: u64,
    /// Functions a plugin may define, over all its core modules (a Rust
    /// plugin has hundreds, a Python one built by componentize-py ~13,000).
    pub max_functions: u64,
    /// MiB of function bodies a plugin may carry (Python: 6.3, JavaScript
    /// on SpiderMonkey: 8.8).
    pub max_code_mib: u64,
    /// Core modules a component may nest (Python: 14).
    pub max_modules: u64,
    /// CPU seconds one compilation may take, over all its threads
    /// (Python: ~9 on this machine): CPU time, so a busy server does not
    /// refuse what an idle one accepts.
    pub compile_cpu_seconds: u64,
    /// Milliseconds making one instance may take: instantiation and the
    /// warm-up run on the plugin's sample, apart from each call's
    /// `timeout_ms` (a language runtime's start-up is slower than its
    /// calls, and slower still on a busy machine).
    pub instantiate_timeout_ms: u64,
    /// MiB of compiled plugins kept in `cache_dir` (a compiled Python
    /// plugin is ~35 MiB); the least recently written go first.
    pub cache_max_mib: u64,
    /// Limits per plugin, by name; plugins not named get the defaults.
    pub limits: BTreeMap<String, PluginLimits>,
    /// Return a plugin's own words (its panic message, with source paths,
    /// its internal error text) to API clients too. Off: clients get the
    /// host's stable message and the request id, the log gets the words.
    /// For development.
    pub expose_plugin_errors: bool,
    /// The registry every replica shares (Redis); unset: this replica's
    /// uploads stay on its own disk.
    pub shared: Option<SharedRegistryConfig>,
}

/// `[plugins.shared]`: uploaded plugins and their activations shared by
/// every replica through Redis.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SharedRegistryConfig {
    /// `redis://[user:password@]host:port[/db]` (`rediss://` for TLS).
    pub redis_url: String,
    /// The ACL user (`AUTH user password`).
    pub username: Option<String>,
    /// A file holding the password (its first line), so the config need
    /// not; never logged.
    pub password_file: Option<PathBuf>,
    /// An environment variable holding the password.
    pub password_env: Option<String>,
    /// TLS for a `rediss://` URL: `{ ca_file, cert_file, key_file }`.
    pub tls: Option<RedisTls>,

    /// Prefix of every key, so several sluice fleets can share one Redis.
    pub key_prefix: String,
    /// Seconds between comparisons of the local revision with Redis's
    /// (changes normally arrive at once, by notification).
    pub reconcile_seconds: u64,
    /// How long one Redis call may take, in milliseconds.
    pub timeout_ms: u64,
    /// The largest plugin blob read from Redis, in MiB: a larger value is
    /// refused by its length (`STRLEN`) before it is read.
    pub max_blob_mib: u64,
    /// How long a starting replica waits for a registry that does not
    /// answer before it serves from its own store, in seconds (it follows
    /// the registry once it answers). None: it waits as long as it takes,
    /// so no replica ever serves plugins out of step with the others, at
    /// the cost of scale-ups and rollouts while Redis is down.
    pub start_wait_secs: Option<u64>,
}

impl SharedRegistryConfig {
    /// Who connects, and how.
    pub fn access(&self) -> RedisAccess {
        RedisAccess {
            username: self.username.clone(),
            password_file: self.password_file.clone(),
            password_env: self.password_env.clone(),
            tls: self.tls.clone(),
        }
    }
}

impl Default for SharedRegistryConfig {
    fn default() -> Self {
        SharedRegistryConfig {
            redis_url: "redis://127.0.0.1:6379".to_string(),
            key_prefix: "sluice:".to_string(),
            reconcile_seconds: 5,
            timeout_ms: 2000,
            max_blob_mib: 256,
            start_wait_secs: None,
            username: None,
            password_file: None,
            password_env: None,
            tls: None,
        }
    }
}

impl Default for PluginsConfig {
    fn default() -> Self {
        PluginsConfig {
            dir: None,
            cache_dir: None,
            fuel: false,
            max_instances: 256,
            max_calls_per_team: std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1)),
            max_memory_mib: 256,
            keep_resident_kib: 2048,
            max_functions: 100_000,
            max_code_mib: 16,
            max_modules: 32,
            compile_cpu_seconds: 60,
            instantiate_timeout_ms: 5000,
            cache_max_mib: 1024,
            limits: BTreeMap::new(),
            expose_plugin_errors: false,
            shared: None,
        }
    }
}

impl PluginsConfig {
    /// The compile limits are in range: each at least 1, and no more than
    /// what still bounds the work an upload can cause.
    pub fn check_compile_limits(&self) -> std::result::Result<(), super::Invalid> {
        let ranges: [(&str, u64, u64); 6] = [
            ("max_functions", self.max_functions, 1_000_000),
            ("instantiate_timeout_ms", self.instantiate_timeout_ms, 600_000),
            ("max_code_mib", self.max_code_mib, 256),
            ("max_modules", self.max_modules, 256),
            ("compile_cpu_seconds", self.compile_cpu_seconds, 3600),
            ("cache_max_mib", self.cache_max_mib, 1 << 20),
        ];
        for (key, value, max) in ranges {
            let value = usize::try_from(value).unwrap_or(usize::MAX);
            super::check_between(&format!("plugins.{key}"), value, 1, max as usize)?;
        }
        Ok(())
    }

    /// The limits of the plugin called `name`.
    pub fn limits_of(&self, name: &str) -> PluginLimits {
        self.limits.get(name).cloned().unwrap_or_default()
    }

    /// The file of the plugin called `name`.
    pub fn path_of(&self, name: &str) -> Result<PathBuf> {
        let dir = self.dir.as_ref().ok_or_else(|| {
            Error::invalid_argument(format!("plugin '{name}' is named, but [plugins] dir is not set"))
        })?;
        Ok(dir.join(format!("{name}.wasm")))
    }
}

/// What one call of a plugin may use.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "PluginLimitsKeys")]
pub struct PluginLimits {
    /// Wall time per call, in milliseconds.
    pub timeout_ms: u64,
    /// Linear memory per instance, over all its memories, in MiB.
    pub memory_mib: u64,
    /// Fuel (roughly, instructions) per call; needs `[plugins] fuel = true`.
    pub fuel: Option<u64>,
    /// Where each call's instance comes from: see [`InstancePolicy`].
    pub instances: InstancePolicy,
}

/// Where a plugin call's instance comes from. Whatever the policy, an
/// instance that failed is thrown away, and instances are never shared
/// between plugins or pipelines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InstancePolicy {
    /// An instance is made once, warmed up on the plugin's sample and
    /// frozen; after each call, every memory page the call wrote is
    /// dropped back to the frozen image and the instance serves the next
    /// call: no call sees what another left, without paying for an
    /// instance per call. Falls back to `fresh` where the kernel cannot
    /// (no `PAGEMAP_SCAN`, Linux < 6.7).
    #[default]
    Reset,
    /// A new instance per call.
    Fresh,
    /// A used instance serves the next call as it is: state persists
    /// between requests of the same pipeline.
    Reuse,
}

impl std::fmt::Display for InstancePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            InstancePolicy::Reset => "reset",
            InstancePolicy::Fresh => "fresh",
            InstancePolicy::Reuse => "reuse",
        })
    }
}

impl Default for PluginLimits {
    fn default() -> Self {
        PluginLimits { timeout_ms: 50, memory_mib: 64, fuel: None, instances: InstancePolicy::Reset }
    }
}

/// The keys a `[plugins.limits.NAME]` table may hold: today's, and the
/// names earlier releases used, accepted with a warning for at least one
/// release (CHANGELOG.md) so a config written for them still starts.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PluginLimitsKeys {
    timeout_ms: Option<u64>,
    memory_mib: Option<u64>,
    fuel: Option<u64>,
    instances: Option<InstancePolicy>,
    /// Before 0.1.0's `instances`: true is `instances = "reuse"`, false
    /// (a new instance per call) `instances = "fresh"`.
    reuse_instance: Option<bool>,
}

impl TryFrom<PluginLimitsKeys> for PluginLimits {
    type Error = String;

    fn try_from(keys: PluginLimitsKeys) -> Result<Self, String> {
        let defaults = PluginLimits::default();
        let instances = match (keys.instances, keys.reuse_instance) {
            (Some(_), Some(_)) => {
                return Err("reuse_instance and instances are both set: reuse_instance is the old name of \
                            instances; keep instances only"
                    .into())
            }
            (None, Some(reuse)) => {
                let policy = if reuse { InstancePolicy::Reuse } else { InstancePolicy::Fresh };
                tracing::warn!(
                    "plugins.limits: reuse_instance = {reuse} is deprecated; it reads as instances = \"{policy}\" \
                     (write that instead: the old name will be refused in a later release)"
                );
                policy
            }
            (instances, None) => instances.unwrap_or(defaults.instances),
        };
        Ok(PluginLimits {
            timeout_ms: keys.timeout_ms.unwrap_or(defaults.timeout_ms),
            memory_mib: keys.memory_mib.unwrap_or(defaults.memory_mib),
            fuel: keys.fuel.or(defaults.fuel),
            instances,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_old_reuse_instance_key_reads_as_instances() {
        let old: PluginLimits = toml::from_str("reuse_instance = true\ntimeout_ms = 20").unwrap();
        assert_eq!(old, PluginLimits { timeout_ms: 20, instances: InstancePolicy::Reuse, ..PluginLimits::default() });
        let fresh: PluginLimits = toml::from_str("reuse_instance = false").unwrap();
        assert_eq!(fresh.instances, InstancePolicy::Fresh);
        let both = toml::from_str::<PluginLimits>("reuse_instance = true\ninstances = \"reset\"").unwrap_err();
        assert!(both.to_string().contains("reuse_instance and instances are both set"), "{both}");
        let unknown = toml::from_str::<PluginLimits>("timeout = 3").unwrap_err();
        assert!(unknown.to_string().contains("unknown field `timeout`"), "{unknown}");
    }
}
