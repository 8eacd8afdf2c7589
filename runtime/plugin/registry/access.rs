//! Who may change which plugin: a token acts for its team (or, an admin
//! token, for all), on the plugins its team owns and that only its team's
//! pipelines run; a name no pipeline runs belongs to no team, and a team
//! may claim one only in its own namespace.

use super::{PluginRegistry, State};
use crate::error::{Error, Result};

/// Who is calling, as the admin API authenticated them.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The token's id (never the token), for the audit log.
    pub token_id: String,
    /// The team the token acts for.
    pub team: Option<String>,
    /// An admin token may do everything.
    pub admin: bool,
}

impl Caller {
    pub(super) fn may(&self, team: Option<&str>) -> bool {
        self.admin || (team.is_some() && team == self.team.as_deref())
    }
}

impl PluginRegistry {
    /// Checks that `caller` may change plugin `name`: its owner, and the
    /// owner of every pipeline running it.
    pub(super) fn authorize(&self, state: &State, caller: &Caller, name: &str) -> Result<()> {
        let denied = |what: String| {
            Error::PermissionDenied(format!(
                "token '{}' (team {:?}) may not change {what}",
                caller.token_id,
                caller.team.as_deref().unwrap_or("none")
            ))
        };
        if let Some(manifest) = state.manifests.get(name) {
            if !caller.may(manifest.team.as_deref()) {
                return Err(denied(format!(
                    "plugin '{name}', which belongs to team {:?}",
                    manifest.team.as_deref().unwrap_or("none")
                )));
            }
        }
        let bound = state.bindings.get(name).is_some_and(|b| !b.is_empty());
        if !caller.admin && !bound && !state.manifests.contains_key(name) {
            // A name no pipeline runs yet belongs to no team: a team may
            // claim one only in its own namespace, so it cannot squat a
            // name another team's pipeline will be configured with.
            let team = caller.team.as_deref().unwrap_or("none");
            if !name.starts_with(&format!("{team}.")) {
                return Err(denied(format!(
                    "plugin '{name}': no pipeline runs it, and a team may create only plugins named '{team}.NAME' \
                     (or the plugins its own pipelines run)"
                )));
            }
        }
        for binding in state.bindings.get(name).into_iter().flatten() {
            if !caller.may(binding.team()) {
                return Err(denied(format!(
                    "plugin '{name}': pipeline '{}' runs it and belongs to team {:?}",
                    binding.pipeline(),
                    binding.team().unwrap_or("none (admins only)")
                )));
            }
        }
        Ok(())
    }
}
