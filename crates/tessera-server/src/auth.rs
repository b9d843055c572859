//! Who is calling. See `SECURITY.md` for the whole policy.
//!
//! - Dev mode (no tenants and no JWT configured) maps every request to tenant `dev` and the
//!   user named by `X-User-Id`, exactly as before auth existed.
//! - Otherwise a request presents a credential: a tenant API key (compared by SHA-256 digest
//!   in constant time; the config holds digests only) or a JWT (only the configured
//!   algorithms; `exp`, `iss`, `aud` and `sub` required; tenant from a claim, user = `sub`).
//!   An API key names its user with `X-User-Id` (trusted within the key's tenant).
//! - The credential comes from `Authorization: Bearer …`; a browser opening a WebSocket
//!   (which cannot set headers) sends it as the subprotocol `bearer.<token>` next to
//!   `tessera.v1`, or redeems a single-use ticket from `POST /api/v1/ws-ticket` as `?ticket=`,
//!   so no long-lived credential ever appears in a URL.
//! - Tickets are this node's (a map in memory) on a single node, and the deployment's in
//!   cluster mode (`GlobalLimits`: issued on one node, redeemed once on any), behind one
//!   `TicketBook`.
//! - A request with an `Origin` header (a browser) must come from the server's own origin or
//!   one of `auth.allowed_origins`; requests without `Origin` (non-browser clients) pass.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::HttpRequest;
use anyhow::Context as _;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value, json};
use tessera_cluster::{GlobalLimits, TicketRedeemError};

use crate::config::{AuthConfig, JwtConfig, TenantConfig};

/// The subprotocol browsers offer and the server echoes.
pub const WS_PROTOCOL: &str = "tessera.v1";
/// Prefix of the subprotocol entry that carries a bearer token.
const BEARER_PROTOCOL_PREFIX: &str = "bearer.";
/// Longest user id accepted from a header or a claim.
const MAX_USER_CHARS: usize = 128;
/// Tickets held at once; beyond this the oldest are dropped (bounds memory under abuse).
const MAX_TICKETS: usize = 100_000;

/// The authenticated caller.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Tenant every read and write is scoped to.
    pub tenant: Arc<str>,
    /// User within the tenant.
    pub user: Arc<str>,
}

/// Why a request was refused (the texts are safe to show: they never echo a credential).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// No credential at all.
    Missing,
    /// A credential that did not verify (bad key, bad/expired JWT, spent ticket).
    Invalid,
    /// A browser calling from an origin that is not allowed.
    Origin,
}

/// A single-use WebSocket ticket.
#[derive(Debug)]
struct Ticket {
    tenant: Arc<str>,
    user: Arc<str>,
    chat_id: Arc<str>,
    expires: Instant,
}

/// Where tickets are kept between issue and redemption.
enum TicketBook {
    /// This node's memory (single node).
    Local(Mutex<HashMap<String, Ticket>>),
    /// The deployment's ticket bucket (cluster mode): any node redeems, once.
    Global(Box<GlobalLimits>),
}

impl std::fmt::Debug for TicketBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Local(_) => "TicketBook::Local",
            Self::Global(_) => "TicketBook::Global",
        })
    }
}

/// Seconds since the Unix epoch (ticket expiry in the global book, compared across nodes).
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Verifies JWTs with the configured keys only.
struct JwtVerifier {
    hs256: Option<DecodingKey>,
    rs256: Option<DecodingKey>,
    issuer: String,
    audience: String,
    tenant_claim: String,
    leeway_s: u64,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("hs256", &self.hs256.is_some())
            .field("rs256", &self.rs256.is_some())
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

impl JwtVerifier {
    fn new(config: &JwtConfig) -> anyhow::Result<Self> {
        let hs256 = config
            .hs256_secret
            .as_deref()
            .filter(|s| !s.is_empty())
            .map(|s| DecodingKey::from_secret(s.as_bytes()));
        let rs256 = match &config.rs256_public_key_file {
            Some(path) => {
                let pem = std::fs::read(path).with_context(|| {
                    format!("cannot read the JWT public key {}", path.display())
                })?;
                Some(DecodingKey::from_rsa_pem(&pem).with_context(|| {
                    format!("{} is not an RSA public key in PEM", path.display())
                })?)
            }
            None => None,
        };
        if hs256.is_none() && rs256.is_none() {
            anyhow::bail!(
                "[auth.jwt] needs hs256_secret (or TESSERA_JWT_SECRET) or rs256_public_key_file"
            );
        }
        if config.issuer.is_empty() || config.audience.is_empty() {
            anyhow::bail!("[auth.jwt] issuer and audience must not be empty");
        }
        Ok(Self {
            hs256,
            rs256,
            issuer: config.issuer.clone(),
            audience: config.audience.clone(),
            tenant_claim: config.tenant_claim.clone(),
            leeway_s: config.leeway_s,
        })
    }

    /// (tenant, user) of a valid token.
    fn verify(&self, token: &str) -> Result<(String, String), AuthError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| AuthError::Invalid)?;
        // The allow-list: the algorithm picks the key, and only configured keys exist, so
        // `none`, other algorithms and RS/HS confusion all fail here.
        let key = match header.alg {
            Algorithm::HS256 => self.hs256.as_ref(),
            Algorithm::RS256 => self.rs256.as_ref(),
            _ => None,
        }
        .ok_or(AuthError::Invalid)?;
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[&self.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.leeway = self.leeway_s;
        // RFC 7519 §4.1.5: a token is not accepted before its `nbf` (when it has one).
        validation.validate_nbf = true;
        let data = jsonwebtoken::decode::<Map<String, Value>>(token, key, &validation)
            .map_err(|_| AuthError::Invalid)?;
        let text = |name: &str| {
            data.claims
                .get(name)
                .and_then(Value::as_str)
                .filter(|v| !v.is_empty() && v.chars().count() <= MAX_USER_CHARS)
                .map(str::to_owned)
        };
        let tenant = text(&self.tenant_claim).ok_or(AuthError::Invalid)?;
        let user = text("sub").ok_or(AuthError::Invalid)?;
        Ok((tenant, user))
    }
}

/// Resolves callers from requests; shared by every worker.
#[derive(Debug)]
pub struct Authenticator {
    tenants: Vec<TenantConfig>,
    jwt: Option<JwtVerifier>,
    allowed_origins: Vec<String>,
    ticket_ttl: Duration,
    tickets: TicketBook,
}

impl Authenticator {
    /// Dev mode when `tenants` is empty and no JWT is configured. Fails when a configured
    /// JWT key cannot be loaded.
    pub fn new(tenants: Vec<TenantConfig>, auth: &AuthConfig) -> anyhow::Result<Self> {
        let jwt = auth.jwt.as_ref().map(JwtVerifier::new).transpose()?;
        Ok(Self {
            tenants,
            jwt,
            allowed_origins: auth
                .allowed_origins
                .iter()
                .map(|o| o.trim_end_matches('/').to_ascii_lowercase())
                .collect(),
            ticket_ttl: Duration::from_secs(auth.ticket_ttl_s.max(1)),
            tickets: TicketBook::Local(Mutex::new(HashMap::new())),
        })
    }

    /// Keeps tickets in the deployment's bucket (cluster mode) instead of this node's memory.
    pub fn with_global_tickets(mut self, limits: Box<GlobalLimits>) -> Self {
        self.tickets = TicketBook::Global(limits);
        self
    }

    /// True when no tenants and no JWT are configured.
    pub fn dev_mode(&self) -> bool {
        self.tenants.is_empty() && self.jwt.is_none()
    }

    /// The caller of a REST request (credential from `Authorization` only).
    pub fn caller(&self, req: &HttpRequest) -> Result<Caller, AuthError> {
        self.check_origin(req)?;
        if self.dev_mode() {
            return Ok(dev_caller(req));
        }
        let token = bearer_header(req).ok_or(AuthError::Missing)?;
        self.verify_token(token, req)
    }

    /// The caller of a WebSocket upgrade: `Authorization`, then a `bearer.<token>`
    /// subprotocol, then `ticket` (single use, bound to `chat_id`).
    pub async fn ws_caller(
        &self,
        req: &HttpRequest,
        chat_id: &str,
        ticket: Option<&str>,
    ) -> Result<Caller, AuthError> {
        self.check_origin(req)?;
        if let Some(ticket) = ticket {
            return self.redeem_ticket(ticket, chat_id).await;
        }
        if self.dev_mode() {
            return Ok(dev_caller(req));
        }
        let token = bearer_header(req)
            .or_else(|| bearer_protocol(req))
            .ok_or(AuthError::Missing)?;
        self.verify_token(token, req)
    }

    fn verify_token(&self, token: &str, req: &HttpRequest) -> Result<Caller, AuthError> {
        if let Some(jwt) = &self.jwt
            && token.split('.').count() == 3
        {
            let (tenant, user) = jwt.verify(token)?;
            if !self.tenants.is_empty() && !self.tenants.iter().any(|t| t.id == tenant) {
                return Err(AuthError::Invalid);
            }
            return Ok(Caller {
                tenant: Arc::from(tenant),
                user: Arc::from(user),
            });
        }
        let digest = sha256_hex(token.as_bytes());
        let tenant = self
            .tenants
            .iter()
            .find(|t| {
                t.api_key_sha256
                    .iter()
                    .any(|d| constant_time_eq(d.to_ascii_lowercase().as_bytes(), digest.as_bytes()))
            })
            .ok_or(AuthError::Invalid)?;
        Ok(Caller {
            tenant: Arc::from(tenant.id.as_str()),
            user: Arc::from(header_user(req)),
        })
    }

    /// Issues a single-use ticket for `caller` to open `chat_id`'s socket; returns it and
    /// its lifetime in seconds. `Invalid` when no randomness or the global book is unreachable.
    pub async fn issue_ticket(
        &self,
        caller: &Caller,
        chat_id: &str,
    ) -> Result<(String, u64), AuthError> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|_| AuthError::Invalid)?;
        let ticket: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        match &self.tickets {
            TicketBook::Local(tickets) => {
                let now = Instant::now();
                let mut tickets = tickets.lock().unwrap_or_else(|p| p.into_inner());
                tickets.retain(|_, t| t.expires > now);
                if tickets.len() >= MAX_TICKETS {
                    // Abuse: drop the ones closest to expiring.
                    let mut by_expiry: Vec<(String, Instant)> = tickets
                        .iter()
                        .map(|(k, t)| (k.clone(), t.expires))
                        .collect();
                    by_expiry.sort_by_key(|(_, e)| *e);
                    for (key, _) in by_expiry.into_iter().take(MAX_TICKETS / 10) {
                        tickets.remove(&key);
                    }
                }
                tickets.insert(
                    ticket.clone(),
                    Ticket {
                        tenant: caller.tenant.clone(),
                        user: caller.user.clone(),
                        chat_id: Arc::from(chat_id),
                        expires: now + self.ticket_ttl,
                    },
                );
            }
            TicketBook::Global(limits) => {
                // The bucket also expires it, but only roughly: the expiry is checked here.
                let claims = json!({
                    "tenant": &*caller.tenant,
                    "user": &*caller.user,
                    "expires_unix": unix_now() + self.ticket_ttl.as_secs(),
                });
                limits
                    .issue_ticket(&ticket, chat_id, claims)
                    .await
                    .map_err(|e| {
                        tracing::warn!(chat_id, error = %e, "cannot record a ticket");
                        AuthError::Invalid
                    })?;
            }
        }
        Ok((ticket, self.ticket_ttl.as_secs()))
    }

    async fn redeem_ticket(&self, ticket: &str, chat_id: &str) -> Result<Caller, AuthError> {
        match &self.tickets {
            TicketBook::Local(tickets) => {
                let mut tickets = tickets.lock().unwrap_or_else(|p| p.into_inner());
                // Removed whatever happens next: a ticket is spent by its first use.
                let found = tickets.remove(ticket).ok_or(AuthError::Invalid)?;
                if found.expires <= Instant::now() || *found.chat_id != *chat_id {
                    return Err(AuthError::Invalid);
                }
                Ok(Caller {
                    tenant: found.tenant,
                    user: found.user,
                })
            }
            TicketBook::Global(limits) => {
                let claims = limits.redeem_ticket(ticket, chat_id).await.map_err(|e| {
                    if let TicketRedeemError::Unavailable(e) = &e {
                        tracing::warn!(chat_id, error = %e, "cannot redeem a ticket");
                    }
                    AuthError::Invalid
                })?;
                let text = |key: &str| claims.get(key).and_then(Value::as_str).map(Arc::from);
                let expires = claims.get("expires_unix").and_then(Value::as_u64);
                match (text("tenant"), text("user"), expires) {
                    (Some(tenant), Some(user), Some(expires)) if unix_now() < expires => {
                        Ok(Caller { tenant, user })
                    }
                    _ => Err(AuthError::Invalid),
                }
            }
        }
    }

    /// Refuses browsers calling from a foreign origin (cross-site WebSocket hijacking, CSRF).
    fn check_origin(&self, req: &HttpRequest) -> Result<(), AuthError> {
        if self.dev_mode() {
            return Ok(());
        }
        let Some(origin) = req.headers().get("origin") else {
            return Ok(());
        };
        let origin = origin
            .to_str()
            .map_err(|_| AuthError::Origin)?
            .trim_end_matches('/')
            .to_ascii_lowercase();
        let info = req.connection_info();
        let own = format!("{}://{}", info.scheme(), info.host()).to_ascii_lowercase();
        if origin == own || self.allowed_origins.contains(&origin) {
            Ok(())
        } else {
            Err(AuthError::Origin)
        }
    }
}

fn ws_protocols(req: &HttpRequest) -> impl Iterator<Item = &str> {
    req.headers()
        .get_all("sec-websocket-protocol")
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

fn bearer_protocol(req: &HttpRequest) -> Option<&str> {
    ws_protocols(req)
        .find_map(|p| p.strip_prefix(BEARER_PROTOCOL_PREFIX))
        .filter(|t| !t.is_empty())
}

fn bearer_header(req: &HttpRequest) -> Option<&str> {
    req.headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

fn header_user(req: &HttpRequest) -> &str {
    req.headers()
        .get("x-user-id")
        .and_then(|v| v.to_str().ok())
        .filter(|u| !u.is_empty() && u.chars().count() <= MAX_USER_CHARS)
        .unwrap_or("dev-user")
}

fn dev_caller(req: &HttpRequest) -> Caller {
    Caller {
        tenant: Arc::from("dev"),
        user: Arc::from(header_user(req)),
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
pub(crate) mod tests {
    use super::*;
    use actix_web::test::TestRequest;
    use jsonwebtoken::{EncodingKey, Header};
    use serde_json::json;

    const SECRET: &str = "unit-test-hs256-secret-0123456789";

    pub(crate) fn authenticator() -> anyhow::Result<Authenticator> {
        let auth = AuthConfig {
            jwt: Some(JwtConfig {
                hs256_secret: Some(SECRET.into()),
                rs256_public_key_file: None,
                issuer: "issuer".into(),
                audience: "tessera".into(),
                tenant_claim: "tenant".into(),
                leeway_s: 0,
            }),
            allowed_origins: vec!["https://app.example".into()],
            ticket_ttl_s: 30,
        };
        let tenants = vec![TenantConfig {
            id: "acme".into(),
            api_key_sha256: vec![sha256_hex(b"acme-key")],
        }];
        Authenticator::new(tenants, &auth)
    }

    fn token(claims: Value, alg: Algorithm, secret: &str) -> String {
        jsonwebtoken::encode(
            &Header::new(alg),
            &claims,
            &EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap_or_default()
    }

    fn claims(exp_offset: i64) -> Value {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        json!({"sub": "alice", "tenant": "acme", "iss": "issuer", "aud": "tessera", "exp": now + exp_offset})
    }

    fn bearer(token: &str) -> actix_web::HttpRequest {
        TestRequest::default()
            .insert_header(("authorization", format!("Bearer {token}")))
            .to_http_request()
    }

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

    #[test]
    fn jwt_claims_are_checked_and_forgeries_refused() -> anyhow::Result<()> {
        let auth = authenticator()?;
        let good = token(claims(300), Algorithm::HS256, SECRET);
        let caller = auth
            .caller(&bearer(&good))
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        assert_eq!((&*caller.tenant, &*caller.user), ("acme", "alice"));

        let expired = token(claims(-300), Algorithm::HS256, SECRET);
        let wrong_key = token(claims(300), Algorithm::HS256, "another-secret");
        let mut wrong_iss = claims(300);
        wrong_iss["iss"] = json!("evil");
        let mut wrong_aud = claims(300);
        wrong_aud["aud"] = json!("other");
        let mut unknown_tenant = claims(300);
        unknown_tenant["tenant"] = json!("globex");
        let mut no_exp = claims(300);
        no_exp.as_object_mut().map(|o| o.remove("exp"));
        let hs384 = token(claims(300), Algorithm::HS384, SECRET);
        // alg "none": header {"alg":"none"} and an empty signature.
        let none = format!(
            "{}.{}.",
            base64_url(br#"{"alg":"none","typ":"JWT"}"#),
            base64_url(claims(300).to_string().as_bytes())
        );
        let cases = [
            ("expired", expired),
            ("wrong key", wrong_key),
            ("wrong iss", token(wrong_iss, Algorithm::HS256, SECRET)),
            ("wrong aud", token(wrong_aud, Algorithm::HS256, SECRET)),
            (
                "unknown tenant",
                token(unknown_tenant, Algorithm::HS256, SECRET),
            ),
            ("no exp", token(no_exp, Algorithm::HS256, SECRET)),
            ("HS384 not allowed", hs384),
            ("alg none", none),
            ("garbage", "a.b.c".to_owned()),
        ];
        for (name, token) in cases {
            assert_eq!(
                auth.caller(&bearer(&token)).err(),
                Some(AuthError::Invalid),
                "{name} must be refused"
            );
        }
        assert_eq!(
            auth.caller(&TestRequest::default().to_http_request()).err(),
            Some(AuthError::Missing)
        );
        Ok(())
    }

    /// Minimal unpadded base64url, enough to forge an `alg: none` token in a test.
    fn base64_url(bytes: &[u8]) -> String {
        const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
            for i in 0..=chunk.len() {
                out.push(char::from(ABC[((n >> (18 - 6 * i)) & 63) as usize]));
            }
        }
        out
    }

    #[actix_rt::test]
    async fn api_keys_origins_and_tickets() -> anyhow::Result<()> {
        let auth = authenticator()?;
        let req = TestRequest::default()
            .insert_header(("authorization", "Bearer acme-key"))
            .insert_header(("x-user-id", "bob"))
            .to_http_request();
        let caller = auth.caller(&req).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        assert_eq!((&*caller.tenant, &*caller.user), ("acme", "bob"));
        assert_eq!(auth.caller(&bearer("nope")).err(), Some(AuthError::Invalid));

        let foreign = TestRequest::default()
            .insert_header(("authorization", "Bearer acme-key"))
            .insert_header(("origin", "https://evil.example"))
            .to_http_request();
        assert_eq!(auth.caller(&foreign).err(), Some(AuthError::Origin));
        let allowed = TestRequest::default()
            .insert_header(("authorization", "Bearer acme-key"))
            .insert_header(("origin", "https://app.example"))
            .to_http_request();
        assert!(auth.caller(&allowed).is_ok());

        tickets_are_single_use_and_bound_to_their_chat(&auth, &auth, &caller).await?;

        let protocol = TestRequest::default()
            .insert_header(("sec-websocket-protocol", "tessera.v1, bearer.acme-key"))
            .to_http_request();
        assert!(auth.ws_caller(&protocol, "chat-1", None).await.is_ok());
        Ok(())
    }

    /// A ticket `issuer` issued for `caller` is redeemed by `redeemer` (the same node, or
    /// another node of a cluster) once, for its own chat only.
    pub(crate) async fn tickets_are_single_use_and_bound_to_their_chat(
        issuer: &Authenticator,
        redeemer: &Authenticator,
        caller: &Caller,
    ) -> anyhow::Result<()> {
        let (ticket, ttl) = issuer
            .issue_ticket(caller, "chat-1")
            .await
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        assert_eq!(ttl, 30);
        let plain = TestRequest::default().to_http_request();
        assert_eq!(
            redeemer
                .ws_caller(&plain, "chat-2", Some(&ticket))
                .await
                .err(),
            Some(AuthError::Invalid),
            "a ticket is bound to its chat (and spent by the failed try)"
        );
        assert_eq!(
            redeemer
                .ws_caller(&plain, "chat-1", Some(&ticket))
                .await
                .err(),
            Some(AuthError::Invalid),
            "spent by the failed try"
        );
        let (ticket, _) = issuer
            .issue_ticket(caller, "chat-1")
            .await
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let used = redeemer
            .ws_caller(&plain, "chat-1", Some(&ticket))
            .await
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        assert_eq!(
            (&*used.tenant, &*used.user),
            (&*caller.tenant, &*caller.user)
        );
        for node in [issuer, redeemer] {
            assert_eq!(
                node.ws_caller(&plain, "chat-1", Some(&ticket)).await.err(),
                Some(AuthError::Invalid),
                "single use, on every node"
            );
        }
        Ok(())
    }

    #[test]
    fn dev_mode_needs_no_credential() -> anyhow::Result<()> {
        let auth = Authenticator::new(Vec::new(), &AuthConfig::default())?;
        assert!(auth.dev_mode());
        let req = TestRequest::default()
            .insert_header(("x-user-id", "carol"))
            .insert_header(("origin", "https://anything.example"))
            .to_http_request();
        let caller = auth.caller(&req).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        assert_eq!((&*caller.tenant, &*caller.user), ("dev", "carol"));
        Ok(())
    }
}
