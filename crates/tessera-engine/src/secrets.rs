//! The chat's secret vault: values of UI tools' secret fields (e.g. the API key the Generator
//! collects). They live only here — never in the transcript, events, logs, metrics or the
//! model's context — and are wiped when the chat ends.
//!
//! - In memory: [`SecretVault`], whose `Debug` redacts and whose values are overwritten on
//!   wipe and drop.
//! - At rest: sealed with ChaCha20-Poly1305 under the server's [`VaultKey`] (a random nonce
//!   per write; the chat id is the associated data, so a sealed blob copied to another chat
//!   does not open) and stored by the chat store, so a chat waiting on the user keeps its
//!   secrets across a restart. Completing the chat deletes the blob.
//! - In use: a tool sees only the secrets its manifest entry names in `uses_secrets`
//!   ([`scope_secrets`] wraps every tool with that filter).

use std::sync::Arc;

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use futures::future::BoxFuture;
use serde_json::{Map, Value};
use tessera_store::ChatStore;
use tessera_tools::{SecretView, Tool, ToolContext, ToolError};

/// Format byte of a sealed vault, so the format can change later.
const SEAL_VERSION: u8 = 1;
/// ChaCha20-Poly1305 nonce length.
const NONCE_LEN: usize = 12;

/// Why a vault could not be sealed or opened. The texts never contain a secret.
#[derive(Debug, thiserror::Error)]
pub enum VaultError {
    /// The system random source failed.
    #[error("no randomness available: {0}")]
    Random(String),
    /// Encryption failed (cannot happen with a valid key; kept for completeness).
    #[error("the vault could not be sealed")]
    Seal,
    /// Wrong key, another chat's blob, or tampered/truncated bytes.
    #[error("the sealed vault does not open with this key (key changed, or data tampered)")]
    Open,
}

/// The 256-bit key that seals every chat's vault. `Debug` never shows it.
pub struct VaultKey(ChaCha20Poly1305);

impl VaultKey {
    /// A key from 32 bytes (from config, e.g. `TESSERA_SECRET_KEY`).
    pub fn new(bytes: [u8; 32]) -> Self {
        Self(ChaCha20Poly1305::new(Key::from_slice(&bytes)))
    }

    /// 32 random bytes, for a per-process key when none is configured.
    pub fn random_bytes() -> Result<[u8; 32], VaultError> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| VaultError::Random(e.to_string()))?;
        Ok(bytes)
    }

    /// `version || nonce || ciphertext` of `plain`, bound to `chat_id`.
    pub fn seal(&self, chat_id: &str, plain: &[u8]) -> Result<Vec<u8>, VaultError> {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|e| VaultError::Random(e.to_string()))?;
        let aad = aad(chat_id);
        let sealed = self
            .0
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: plain,
                    aad: &aad,
                },
            )
            .map_err(|_| VaultError::Seal)?;
        let mut out = Vec::with_capacity(1 + NONCE_LEN + sealed.len());
        out.push(SEAL_VERSION);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// The plaintext of a blob made by [`Self::seal`] for the same chat.
    pub fn open(&self, chat_id: &str, sealed: &[u8]) -> Result<Vec<u8>, VaultError> {
        let (version, rest) = sealed.split_first().ok_or(VaultError::Open)?;
        if *version != SEAL_VERSION || rest.len() < NONCE_LEN {
            return Err(VaultError::Open);
        }
        let (nonce, body) = rest.split_at(NONCE_LEN);
        let aad = aad(chat_id);
        self.0
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: body,
                    aad: &aad,
                },
            )
            .map_err(|_| VaultError::Open)
    }
}

fn aad(chat_id: &str) -> Vec<u8> {
    let mut aad = b"tessera-vault-v1:".to_vec();
    aad.extend_from_slice(chat_id.as_bytes());
    aad
}

impl std::fmt::Debug for VaultKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("VaultKey(<redacted>)")
    }
}

/// A secret string whose `Debug` never shows the value and whose bytes are overwritten on wipe.
pub struct SecretString(String);

impl SecretString {
    /// The value, for a tool that declared it needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    fn wipe(&mut self) {
        // Overwrite in place before freeing, so the value does not linger in freed memory.
        let mut bytes = std::mem::take(&mut self.0).into_bytes();
        bytes.iter_mut().for_each(|b| *b = 0);
        std::hint::black_box(&bytes);
    }
}

impl std::fmt::Debug for SecretString {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretString(<{} bytes redacted>)", self.0.len())
    }
}

impl Drop for SecretString {
    fn drop(&mut self) {
        self.wipe();
    }
}

/// Named secrets of one chat.
#[derive(Debug, Default)]
pub struct SecretVault {
    entries: Vec<(String, SecretString)>,
}

impl SecretVault {
    /// Stores (or replaces) secrets by field name.
    pub fn store(&mut self, secrets: Vec<(String, String)>) {
        for (name, value) in secrets {
            self.entries.retain(|(n, _)| *n != name);
            self.entries.push((name, SecretString(value)));
        }
    }

    /// The secret named `name`, if collected.
    pub fn get(&self, name: &str) -> Option<&SecretString> {
        self.entries.iter().find(|(n, _)| n == name).map(|(_, s)| s)
    }

    /// Number of secrets held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no secret is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Forgets every secret.
    pub fn wipe(&mut self) {
        self.entries.clear();
    }

    /// A read-only copy for tool contexts (narrowed per tool by [`scope_secrets`]); `None`
    /// when the vault is empty.
    pub fn view(&self) -> Option<SecretView> {
        (!self.is_empty()).then(|| {
            SecretView::new(
                self.entries
                    .iter()
                    .map(|(n, s)| (n.clone(), s.expose().to_owned()))
                    .collect(),
            )
        })
    }

    /// The vault sealed for `chat_id`.
    pub fn seal(&self, key: &VaultKey, chat_id: &str) -> Result<Vec<u8>, VaultError> {
        let map: Map<String, Value> = self
            .entries
            .iter()
            .map(|(n, s)| (n.clone(), Value::String(s.expose().to_owned())))
            .collect();
        let mut plain = serde_json::to_vec(&map).map_err(|_| VaultError::Seal)?;
        let sealed = key.seal(chat_id, &plain);
        plain.iter_mut().for_each(|b| *b = 0);
        std::hint::black_box(&plain);
        sealed
    }

    /// The secrets of a sealed vault of `chat_id`.
    pub fn unseal(
        key: &VaultKey,
        chat_id: &str,
        sealed: &[u8],
    ) -> Result<Vec<(String, String)>, VaultError> {
        let mut plain = key.open(chat_id, sealed)?;
        let parsed: Result<Map<String, Value>, _> = serde_json::from_slice(&plain);
        plain.iter_mut().for_each(|b| *b = 0);
        std::hint::black_box(&plain);
        let map = parsed.map_err(|_| VaultError::Open)?;
        Ok(map
            .into_iter()
            .filter_map(|(n, v)| match v {
                Value::String(s) => Some((n, s)),
                _ => None,
            })
            .collect())
    }
}

/// Writes the sealed vault of `chat_id` to the store (or nothing without store or key).
/// Errors are logged without any value.
pub fn save(
    store: Option<&Arc<dyn ChatStore>>,
    key: Option<&VaultKey>,
    chat_id: &str,
    vault: &SecretVault,
) -> Option<BoxFuture<'static, ()>> {
    let (store, key) = (store?.clone(), key?);
    let chat = chat_id.to_owned();
    let sealed = match vault.seal(key, chat_id) {
        Ok(sealed) => sealed,
        Err(e) => {
            tracing::warn!(chat_id = %chat, error = %e, "secrets not persisted");
            return None;
        }
    };
    Some(Box::pin(async move {
        if let Err(e) = store.put_secrets(&chat, sealed).await {
            tracing::warn!(chat_id = %chat, error = %e, "secrets not persisted");
        }
    }))
}

/// Deletes the sealed vault of `chat_id` (the chat ended).
pub fn forget(store: Option<&Arc<dyn ChatStore>>, chat_id: &str) -> Option<BoxFuture<'static, ()>> {
    let store = store?.clone();
    let chat = chat_id.to_owned();
    Some(Box::pin(async move {
        if let Err(e) = store.delete_secrets(&chat).await {
            tracing::warn!(chat_id = %chat, error = %e, "sealed secrets not deleted");
        }
    }))
}

/// Loads and opens the sealed vault of `chat_id` after a restart. A blob that does not open
/// (the key changed, e.g. a dev-mode per-process key) is dropped: the chat continues
/// without its secrets.
pub fn load(
    store: Option<&Arc<dyn ChatStore>>,
    key: Option<Arc<VaultKey>>,
    chat_id: &str,
) -> Option<BoxFuture<'static, Vec<(String, String)>>> {
    let (store, key) = (store?.clone(), key?);
    let chat = chat_id.to_owned();
    Some(Box::pin(async move {
        let sealed = match store.load_secrets(&chat).await {
            Ok(Some(sealed)) => sealed,
            Ok(None) => return Vec::new(),
            Err(e) => {
                tracing::warn!(chat_id = %chat, error = %e, "sealed secrets not loaded");
                return Vec::new();
            }
        };
        match SecretVault::unseal(&key, &chat, &sealed) {
            Ok(secrets) => secrets,
            Err(e) => {
                tracing::warn!(chat_id = %chat, error = %e, "sealed secrets dropped");
                let _ = store.delete_secrets(&chat).await;
                Vec::new()
            }
        }
    }))
}

/// Wraps a tool so it sees only the secrets named in `allowed` (its `uses_secrets`).
pub fn scope_secrets(tool: Arc<dyn Tool>, allowed: &[String]) -> Arc<dyn Tool> {
    Arc::new(ScopedSecrets {
        inner: tool,
        allowed: allowed.to_vec(),
    })
}

/// See [`scope_secrets`].
struct ScopedSecrets {
    inner: Arc<dyn Tool>,
    allowed: Vec<String>,
}

impl Tool for ScopedSecrets {
    fn invoke(
        &self,
        args: Map<String, Value>,
        mut ctx: ToolContext,
    ) -> BoxFuture<'static, Result<Value, ToolError>> {
        ctx.secrets = ctx.secrets.and_then(|view| view.only(&self.allowed));
        self.inner.invoke(args, ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_values() {
        let mut vault = SecretVault::default();
        vault.store(vec![("apiKey".into(), "sk-canary-123".into())]);
        let shown = format!("{vault:?}");
        assert!(!shown.contains("sk-canary-123"), "{shown}");
        assert_eq!(
            vault.get("apiKey").map(SecretString::expose),
            Some("sk-canary-123")
        );
        vault.wipe();
        assert!(vault.is_empty());
    }

    #[test]
    fn sealed_vault_hides_values_and_opens_only_for_its_chat_and_key() -> Result<(), VaultError> {
        let key = VaultKey::new([7; 32]);
        let mut vault = SecretVault::default();
        vault.store(vec![("apiKey".into(), "sk-canary-sealed".into())]);
        let sealed = vault.seal(&key, "chat-a")?;
        assert!(
            !sealed
                .windows(b"sk-canary".len())
                .any(|w| w == b"sk-canary"),
            "the value is not in clear"
        );
        assert_eq!(
            SecretVault::unseal(&key, "chat-a", &sealed)?,
            vec![("apiKey".to_owned(), "sk-canary-sealed".to_owned())]
        );
        assert!(
            SecretVault::unseal(&key, "chat-b", &sealed).is_err(),
            "bound to its chat"
        );
        assert!(
            SecretVault::unseal(&VaultKey::new([8; 32]), "chat-a", &sealed).is_err(),
            "another key does not open it"
        );
        let mut tampered = sealed.clone();
        if let Some(last) = tampered.last_mut() {
            *last ^= 1;
        }
        assert!(SecretVault::unseal(&key, "chat-a", &tampered).is_err());
        assert!(SecretVault::unseal(&key, "chat-a", &[]).is_err());
        assert_ne!(
            vault.seal(&key, "chat-a")?,
            sealed,
            "a fresh nonce per seal"
        );
        assert!(!format!("{key:?}").contains('7'));
        Ok(())
    }

    #[test]
    fn tools_see_only_the_secrets_they_declare() -> Result<(), ToolError> {
        struct Echo;
        impl Tool for Echo {
            fn invoke(
                &self,
                _args: Map<String, Value>,
                ctx: ToolContext,
            ) -> BoxFuture<'static, Result<Value, ToolError>> {
                let seen = ctx
                    .secrets
                    .as_ref()
                    .map(|s| (s.contains("apiKey"), s.contains("other")));
                Box::pin(async move { Ok(serde_json::json!(seen)) })
            }
        }
        let mut vault = SecretVault::default();
        vault.store(vec![
            ("apiKey".into(), "k".into()),
            ("other".into(), "o".into()),
        ]);
        let ctx = ToolContext {
            chat_id: "c".into(),
            app_id: "t".into(),
            user_id: "u".into(),
            workflow_name: "w".into(),
            turn_idempotency_key: "k".into(),
            agent_name: "a".into(),
            secrets: vault.view(),
        };
        assert!(
            !ctx.to_json().to_string().contains("apiKey"),
            "the context JSON never carries secrets"
        );
        let declared = scope_secrets(Arc::new(Echo), &["apiKey".to_owned()]);
        let undeclared = scope_secrets(Arc::new(Echo), &[]);
        let run =
            |tool: Arc<dyn Tool>| futures::executor::block_on(tool.invoke(Map::new(), ctx.clone()));
        assert_eq!(run(declared)?, serde_json::json!([true, false]));
        assert_eq!(run(undeclared)?, Value::Null, "no secrets at all");
        Ok(())
    }
}
