//! How every Redis connection is made (the feature store's, the shared
//! plugin registry's): the URL, an AUTH/ACL user and a password read from
//! a file or the environment (so the config need not hold it), and TLS
//! (`rediss://`) with the CA Redis's certificate is signed by and, when
//! Redis verifies clients, this server's certificate. URLs are logged
//! without their credentials.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::Invalid;
use crate::invalid;

/// `tls` of a Redis connection: for `rediss://` URLs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisTls {
    /// The CA Redis's certificate is signed by, PEM; the system's roots
    /// when absent.
    pub ca_file: Option<PathBuf>,
    /// This server's client certificate, PEM (with `key_file`), for a
    /// Redis started with `tls-auth-clients yes`.
    pub cert_file: Option<PathBuf>,
    /// Its private key, PEM.
    pub key_file: Option<PathBuf>,
}

/// Who connects to Redis, and how: what `[features.redis]` and
/// `[plugins.shared]` share besides the URL.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisAccess {
    /// The ACL user (`AUTH user password`); `default` when absent.
    pub username: Option<String>,
    /// A file holding the password (its first line); read at start.
    pub password_file: Option<PathBuf>,
    /// An environment variable holding the password.
    pub password_env: Option<String>,
    /// TLS settings for a `rediss://` URL.
    pub tls: Option<RedisTls>,
}

impl RedisAccess {
    /// Makes relative paths relative to `base`.
    pub fn resolve(&mut self, base: &Path) {
        let tls = self.tls.as_mut();
        let tls_paths = tls.into_iter().flat_map(|t| [t.ca_file.as_mut(), t.cert_file.as_mut(), t.key_file.as_mut()]);
        for path in std::iter::once(self.password_file.as_mut()).chain(tls_paths).flatten() {
            if path.is_relative() {
                *path = base.join(&*path);
            }
        }
    }

    /// Checks the combination; `key` names the table in errors.
    pub fn check(&self, key: &str, url: &str) -> Result<(), Invalid> {
        if self.password_file.is_some() && self.password_env.is_some() {
            return Err(invalid!("{key}: password_file and password_env are both set; give one"));
        }
        if let Some(tls) = &self.tls {
            if !url.starts_with("rediss://") {
                return Err(invalid!("{key}.tls is set but the URL is not rediss://: {}", redacted(url)));
            }
            if tls.cert_file.is_some() != tls.key_file.is_some() {
                return Err(invalid!("{key}.tls: cert_file and key_file go together"));
            }
        }
        Ok(())
    }

    /// A client for `url` with these credentials and TLS settings; errors
    /// name `key` and never the password.
    pub fn client(&self, key: &str, url: &str) -> Result<redis::Client, Invalid> {
        use redis::IntoConnectionInfo;
        let mut info = url.into_connection_info().map_err(|e| invalid!("{key} url = \"{}\": {e}", redacted(url)))?;
        if let Some(username) = &self.username {
            info.redis.username = Some(username.clone());
        }
        if let Some(password) = self.password(key)? {
            info.redis.password = Some(password);
        }
        let Some(tls) = &self.tls else {
            return redis::Client::open(info).map_err(|e| invalid!("{key} url = \"{}\": {e}", redacted(url)));
        };
        let read =
            |path: &Path| std::fs::read(path).map_err(|e| invalid!("{key}.tls: cannot read {}: {e}", path.display()));
        let client_tls = match (&tls.cert_file, &tls.key_file) {
            (Some(cert), Some(key_file)) => {
                Some(redis::ClientTlsConfig { client_cert: read(cert)?, client_key: read(key_file)? })
            }
            _ => None,
        };
        let root_cert = tls.ca_file.as_deref().map(read).transpose()?;
        redis::Client::build_with_tls(info, redis::TlsCertificates { client_tls, root_cert })
            .map_err(|e| invalid!("{key}.tls ({}): {e}", redacted(url)))
    }

    fn password(&self, key: &str) -> Result<Option<String>, Invalid> {
        if let Some(path) = &self.password_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| invalid!("{key}.password_file: cannot read {}: {e}", path.display()))?;
            let password = text.lines().next().unwrap_or("").to_string();
            if password.is_empty() {
                return Err(invalid!("{key}.password_file: {} is empty", path.display()));
            }
            return Ok(Some(password));
        }
        if let Some(name) = &self.password_env {
            let password = std::env::var(name)
                .map_err(|_| invalid!("{key}.password_env: the environment has no {name} (or it is not UTF-8)"))?;
            return Ok(Some(password));
        }
        Ok(None)
    }
}

/// `url` without its user and password, for logs and messages.
pub fn redacted(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((_, host)) => format!("{scheme}://***@{host}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_show_and_bad_combinations_are_named() {
        assert_eq!(redacted("redis://user:s3cret@host:6379/0"), "redis://***@host:6379/0");
        assert_eq!(redacted("rediss://host:6380"), "rediss://host:6380");
        let both =
            RedisAccess { password_file: Some("p".into()), password_env: Some("P".into()), ..RedisAccess::default() };
        assert!(both.check("features.redis", "redis://h:1").unwrap_err().0.contains("both set"));
        let tls = RedisAccess {
            tls: Some(RedisTls { ca_file: None, cert_file: Some("c".into()), key_file: None }),
            ..RedisAccess::default()
        };
        assert!(tls.check("k", "redis://h:1").unwrap_err().0.contains("not rediss://"));
        assert!(tls.check("k", "rediss://h:1").unwrap_err().0.contains("go together"));
        let env = RedisAccess { password_env: Some("SLUICE_TEST_NO_SUCH_VAR".into()), ..RedisAccess::default() };
        let err = env.client("k", "redis://:inline@h:1").unwrap_err();
        assert!(err.0.contains("has no SLUICE_TEST_NO_SUCH_VAR") && !err.0.contains("inline"), "{err}");
    }
}
