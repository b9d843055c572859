//! `tessera hash-key` and `tessera gen-secret-key`: the two values an operator puts in the
//! config (`tenants[].api_key_sha256`, `secrets.key_hex`), made by the binary itself so the
//! hashing and the key format cannot drift from what the server checks.

use std::io::Read as _;
use std::process::ExitCode;

use anyhow::Context as _;

/// Prints the SHA-256 hex of `key`, or of stdin (one trailing newline removed) without one.
pub fn hash_key(key: Option<String>) -> ExitCode {
    let key = match key {
        Some(k) => k,
        None => {
            let mut text = String::new();
            if let Err(e) = std::io::stdin().read_to_string(&mut text) {
                eprintln!("tessera hash-key: cannot read the key from stdin: {e}");
                return ExitCode::FAILURE;
            }
            strip_one_newline(&text).to_owned()
        }
    };
    if key.is_empty() {
        eprintln!("tessera hash-key: the key is empty");
        return ExitCode::FAILURE;
    }
    println!("{}", tessera_server::sha256_hex(key.as_bytes()));
    ExitCode::SUCCESS
}

/// `echo key | tessera hash-key` adds a newline that is not part of the key.
fn strip_one_newline(text: &str) -> &str {
    text.strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .unwrap_or(text)
}

/// Prints 32 random bytes as 64 hex characters, the format of `secrets.key_hex`.
pub fn gen_secret_key() -> ExitCode {
    match random_key_hex() {
        Ok(hex) => {
            println!("{hex}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tessera gen-secret-key: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn random_key_hex() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("no operating-system randomness")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_trailing_newline_is_not_part_of_the_key() {
        assert_eq!(strip_one_newline("k\n"), "k");
        assert_eq!(strip_one_newline("k\r\n"), "k");
        assert_eq!(strip_one_newline("k\n\n"), "k\n");
        assert_eq!(strip_one_newline("k"), "k");
    }

    #[test]
    fn generated_keys_parse_as_secret_keys_and_differ() -> anyhow::Result<()> {
        let a = random_key_hex()?;
        let b = random_key_hex()?;
        assert_ne!(a, b);
        let parsed = tessera_server::config::SecretsConfig { key_hex: Some(a) }.key()?;
        assert!(parsed.is_some());
        Ok(())
    }
}
