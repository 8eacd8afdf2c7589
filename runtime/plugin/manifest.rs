//! What the registry records of one plugin — its manifest: the team that
//! owns it, every stored version and the active one. Kept in
//! `store/manifests/NAME.json` and, with `[plugins.shared]`, in Redis; both
//! the local registry ([`super::registry`]) and the shared one
//! ([`super::shared`]) read and write it, so it sits below both.

use serde::{Deserialize, Serialize};

/// One uploaded version.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StoredVersion {
    /// 1, 2, …: the registry's numbering, per plugin.
    pub version: u32,
    /// SHA-256 of the bytes, hex; the blob's name.
    pub sha256: String,
    /// Size in bytes.
    pub size: u64,
    /// What the plugin says it is: `name version`.
    pub declared: String,
    /// Seconds since the Unix epoch.
    pub uploaded_at: u64,
    /// The id of the token that uploaded it.
    pub uploaded_by: String,
}

/// A canary: a version serving a share of the calls beside the active one.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CanaryVersion {
    /// The canary version.
    pub version: u32,
    /// The percent of calls it gets, in (0, 100).
    pub percent: f64,
}

/// A plugin's manifest: its owner, its versions, the active one, and a
/// canary when one runs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    /// The plugin's name (what pipelines name in `plugin = "…"`).
    pub name: String,
    /// The team that owns it.
    pub team: Option<String>,
    /// The version stages run; none until one is activated.
    pub active: Option<u32>,
    /// Versions active before, most recent last: what rollback returns to.
    pub history: Vec<u32>,
    /// Every stored version.
    pub versions: Vec<StoredVersion>,
    /// The canary beside the active version, while one runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryVersion>,
}
