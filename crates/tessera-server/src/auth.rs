//! Who is calling. Dev mode (no tenants configured) maps every request to tenant `dev`; with
//! tenants configured, a request must present one of the tenant's API keys as
//! `Authorization: Bearer <key>`. The user is named by `X-User-Id` (trusted within the tenant
//! that holds the key). Keys are compared by SHA-256 digest in constant time: the config never holds them.

use std::sync::Arc;

use actix_web::HttpRequest;

use crate::config::TenantConfig;

/// The authenticated caller.
#[derive(Debug, Clone)]
pub struct Caller {
    pub tenant: Arc<str>,
    pub user: Arc<str>,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    Missing,
    Invalid,
}

/// Resolves callers from requests.
#[derive(Debug, Clone)]
pub struct Authenticator {
    tenants: Vec<TenantConfig>,
}

impl Authenticator {
    /// Dev mode when `tenants` is empty.
    pub fn new(tenants: Vec<TenantConfig>) -> Self {
        Self { tenants }
    }

    /// True when no tenants are configured.
    pub fn dev_mode(&self) -> bool {
        self.tenants.is_empty()
    }

    /// The caller of `req`.
    pub fn caller(&self, req: &HttpRequest) -> Result<Caller, AuthError> {
        let user = req
            .headers()
            .get("x-user-id")
            .and_then(|v| v.to_str().ok())
            .filter(|u| !u.is_empty() && u.len() <= 128)
            .unwrap_or("dev-user");
        if self.dev_mode() {
            return Ok(Caller {
                tenant: Arc::from("dev"),
                user: Arc::from(user),
            });
        }
        let key = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or(AuthError::Missing)?;
        let digest = sha256_hex(key.as_bytes());
        let tenant = self
            .tenants
            .iter()
            .find(|t| {
                t.api_key_sha256
                    .iter()
                    .any(|d| constant_time_eq(d.as_bytes(), digest.as_bytes()))
            })
            .ok_or(AuthError::Invalid)?;
        Ok(Caller {
            tenant: Arc::from(tenant.id.as_str()),
            user: Arc::from(user),
        })
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// SHA-256 of `data` as lowercase hex: how API keys appear in the config.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::sha256_hex;

    #[test]
    fn sha256_matches_known_vectors() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
