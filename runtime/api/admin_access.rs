//! Who may use the admin API: the configured tokens, kept as SHA-256
//! hashes and matched in constant time, and the plugin registry the API
//! acts on once it is loaded. The request context, config reloads and the
//! admin routes (`rest/admin.rs`) all authenticate through it, so it sits
//! below them.

use std::sync::{Arc, OnceLock};

use axum::http::{header, HeaderMap};
use subtle::ConstantTimeEq;

use crate::config::{AdminConfig, Role, TokenConfig};
use crate::error::{Error, Result};
use crate::plugin::registry::{Caller, PluginRegistry};

/// The admin API's state: the registry (once loaded) and the tokens.
pub struct Admin {
    registry: OnceLock<Arc<PluginRegistry>>,
    tokens: Vec<([u8; 32], TokenConfig)>,
    max_upload_bytes: usize,
}

impl Admin {
    /// The admin API for `config`; it answers 503 until
    /// [`Admin::attach`] gives it the registry.
    pub fn new(config: &AdminConfig) -> Result<Arc<Admin>> {
        let mut tokens = Vec::with_capacity(config.tokens.len());
        for token in &config.tokens {
            let mut hash = [0u8; 32];
            hex::decode_to_slice(&token.sha256, &mut hash).map_err(|e| {
                Error::invalid_argument(format!("admin token '{}': sha256 is not 64 hex digits: {e}", token.id))
            })?;
            tokens.push((hash, token.clone()));
        }
        Ok(Arc::new(Admin { registry: OnceLock::new(), tokens, max_upload_bytes: config.max_upload_bytes }))
    }

    /// The registry is open: the API serves.
    pub fn attach(&self, registry: Arc<PluginRegistry>) {
        let _ = self.registry.set(registry);
    }

    /// The registry, once loaded.
    pub(crate) fn registry(&self) -> Result<Arc<PluginRegistry>> {
        self.registry.get().cloned().ok_or_else(|| Error::unavailable("the server is still loading; retry shortly"))
    }

    /// The largest plugin upload accepted, in bytes.
    pub fn max_upload_bytes(&self) -> usize {
        self.max_upload_bytes
    }

    /// The caller a request's bearer token identifies.
    pub(crate) fn authenticate(&self, headers: &HeaderMap) -> Result<Caller> {
        let unauthenticated = |message: &str| Error::Unauthenticated(message.to_string());
        let value = headers
            .get(header::AUTHORIZATION)
            .ok_or_else(|| unauthenticated("no Authorization header; send Authorization: Bearer TOKEN"))?;
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .filter(|t| !t.is_empty())
            .ok_or_else(|| unauthenticated("the Authorization header is not \"Bearer TOKEN\""))?;
        let digest: [u8; 32] = <sha2::Sha256 as sha2::Digest>::digest(token.as_bytes()).into();
        // Every hash is compared, matched or not, so the time taken says
        // nothing about which token (if any) is close.
        let mut found = None;
        for (hash, config) in &self.tokens {
            if bool::from(hash.ct_eq(&digest)) {
                found = Some(config);
            }
        }
        let config = found.ok_or_else(|| {
            tracing::warn!(target: "sluice::audit", "admin call with an unknown token refused");
            unauthenticated("the token is not valid")
        })?;
        Ok(Caller { token_id: config.id.clone(), team: config.team.clone(), admin: config.role == Role::Admin })
    }
}
