//! The chat's secret vault: values of UI tools' secret fields (e.g. the API key the Generator
//! collects). They live only here — never in the transcript, events, logs or the model's
//! context — and are wiped when the chat ends.

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
}
