//! The audit trail of plugin changes: every upload, activation, rollback,
//! canary and deletion, as one record (who: token id and team, never the
//! token; what; which versions; when; which replica). Each is a line in the
//! `sluice::audit` log target, a line of this replica's
//! `store/audit.jsonl`, and, with `[plugins.shared]`, an entry of the
//! shared registry's audit list (written with the change itself). The
//! admin API lists them (`GET /admin/v1/audit`): from the shared list when
//! there is one, since it holds every replica's changes, else from this
//! replica's file.

use std::io::Write as _;
use std::path::PathBuf;

use serde_json::Value;

use super::{Caller, PluginRegistry};
use crate::error::{Error, Result};
use crate::plugin::store::write_atomically;

/// The local file's size past which its older half is dropped.
const MAX_LOCAL_BYTES: u64 = 4 << 20;

/// The most entries one listing answers.
pub const MAX_LISTED: usize = 10_000;

impl PluginRegistry {
    fn audit_file(&self) -> PathBuf {
        self.blobs.parent().map_or_else(|| self.blobs.join("audit.jsonl"), |store| store.join("audit.jsonl"))
    }

    /// Records a change: the log line and this replica's file.
    pub(super) fn audit(&self, record: &Value) {
        let text = |key: &str| record.get(key).and_then(Value::as_str).unwrap_or("-").to_string();
        let number = |key: &str| record.get(key).and_then(Value::as_i64).unwrap_or(-1);
        let admin = record.get("admin").and_then(Value::as_bool).unwrap_or(false);
        tracing::info!(
            target: "sluice::audit",
            action = %text("action"),
            team = %text("team"),
            token_id = %text("token_id"),
            admin,
            plugin = %text("plugin"),
            version = number("version"),
            previous = number("previous"),
            sha256 = %text("sha256"),
            "plugin {}",
            text("action")
        );
        if let Err(e) = self.append_local(record) {
            tracing::warn!(path = %self.audit_file().display(), "the local audit file was not written: {e}");
        }
    }

    fn append_local(&self, record: &Value) -> std::io::Result<()> {
        let path = self.audit_file();
        if std::fs::metadata(&path).is_ok_and(|m| m.len() > MAX_LOCAL_BYTES) {
            // Keep the newer half, written whole before it replaces the file.
            let text = std::fs::read_to_string(&path)?;
            let lines: Vec<&str> = text.lines().collect();
            let kept = lines[lines.len() / 2..].join("\n") + "\n";
            write_atomically(&path, kept.as_bytes())?;
        }
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
        file.write_all(format!("{record}\n").as_bytes())
    }

    /// The newest `limit` changes `caller` may see (an admin: all; a team:
    /// its own team's), of `plugin` when given, newest first; and where
    /// they were read.
    pub fn audit_entries(
        &self,
        caller: &Caller,
        plugin: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<Value>, &'static str)> {
        let limit = limit.clamp(1, MAX_LISTED);
        let (lines, source) = match &self.shared {
            // Read past `limit`: filtering may drop some.
            Some(shared) => (shared.audit(MAX_LISTED)?, "the shared registry (every replica)"),
            None => {
                let text = match std::fs::read_to_string(self.audit_file()) {
                    Ok(text) => text,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                    Err(e) => return Err(Error::internal(format!("reading the audit file: {e}"))),
                };
                (text.lines().rev().map(str::to_string).collect(), "this replica's store")
            }
        };
        let entries = lines
            .iter()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|entry| caller.may(entry.get("team").and_then(Value::as_str)))
            .filter(|entry| plugin.is_none_or(|p| entry.get("plugin").and_then(Value::as_str) == Some(p)))
            .take(limit)
            .collect();
        Ok((entries, source))
    }
}
