//! `[admin]`: the plugin admin API — whether it is on, its port, the
//! largest upload, and the bearer tokens (stored as SHA-256) with the team
//! and role each acts for.

use std::collections::HashSet;

use serde::Deserialize;

use super::check_name;
use crate::error::Invalid;
use crate::invalid;

/// The plugin admin API (on the REST port, under `/admin/v1/`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Serve the admin API at all.
    pub enabled: bool,
    /// A port of its own (for a network only deploy tooling reaches); 0
    /// picks a free one. Unset: the admin API is on the REST port.
    pub port: Option<u16>,
    /// Largest plugin upload accepted, in bytes.
    pub max_upload_bytes: usize,
    /// Who may call it.
    pub tokens: Vec<TokenConfig>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig { enabled: false, port: None, max_upload_bytes: 64 << 20, tokens: Vec::new() }
    }
}

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Its own team's plugins and pipelines.
    Team,
    /// Everything.
    Admin,
}

/// One bearer token, stored as the SHA-256 of the token, never the token.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// A name for the token, written in the audit log instead of the token.
    pub id: String,
    /// The team it acts for (required for the `team` role).
    pub team: Option<String>,
    /// What it may do.
    pub role: Role,
    /// `printf %s TOKEN | sha256sum`, 64 hex digits.
    pub sha256: String,
}

/// Checks the admin table; `plugins_dir` tells whether `[plugins] dir`
/// (where uploads are stored) is set.
pub(super) fn check(admin: &AdminConfig, plugins_dir: bool) -> Result<(), Invalid> {
    if !admin.enabled {
        return Ok(());
    }
    if !plugins_dir {
        return Err(Invalid("admin.enabled = true: set [plugins] dir, where uploaded plugins are stored".to_string()));
    }
    if admin.tokens.is_empty() {
        return Err(Invalid(
            "admin.enabled = true, but admin.tokens is empty: nobody could use the admin API".to_string(),
        ));
    }
    if admin.max_upload_bytes == 0 {
        return Err(Invalid("admin.max_upload_bytes = 0: must be at least 1".to_string()));
    }
    let mut ids = HashSet::new();
    for (i, token) in admin.tokens.iter().enumerate() {
        let key = format!("admin.tokens[{i}]");
        check_name(&format!("{key}.id"), &token.id)?;
        if !ids.insert(token.id.as_str()) {
            return Err(invalid!("{key}.id = \"{}\": another token has the same id", token.id));
        }
        if token.sha256.len() != 64 || !token.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(invalid!(
                "{key}.sha256 = \"{}\": expected 64 hex digits, the SHA-256 of the token (printf %s TOKEN | sha256sum)",
                token.sha256
            ));
        }
        match (token.role, &token.team) {
            (Role::Team, None) => return Err(invalid!("{key}: role = \"team\" needs team = \"NAME\"")),
            (_, Some(team)) => check_name(&format!("{key}.team"), team)?,
            (Role::Admin, None) => {}
        }
    }
    Ok(())
}
