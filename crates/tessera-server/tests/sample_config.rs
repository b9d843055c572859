//! `deploy/tessera.toml` stays true: it parses, its active values are the defaults, its
//! commented examples parse too, and it documents every key of the configuration structs.

use std::collections::BTreeSet;
use std::path::PathBuf;

use tessera_server::ServerConfig;

fn read(relative: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn sample() -> String {
    read("../../deploy/tessera.toml")
}

/// The sample with its optional examples (`# key = ...`, `# [section]`) switched on; the
/// multi-node keys (`## ...`) stay commented.
fn with_examples(text: &str) -> String {
    text.lines()
        .map(|line| match line.strip_prefix("# ") {
            Some(rest) if is_key_line(rest) || rest.starts_with('[') => rest,
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_key_line(line: &str) -> bool {
    line.split_once(" = ").is_some_and(|(key, _)| {
        key.starts_with(|c: char| c.is_ascii_lowercase())
            && key
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    })
}

#[test]
fn the_sample_parses_and_its_active_values_are_the_defaults() {
    let parsed: ServerConfig = toml::from_str(&sample()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        format!("{parsed:?}"),
        format!("{:?}", ServerConfig::default()),
        "an active value in deploy/tessera.toml differs from the default"
    );
}

#[test]
fn the_sample_examples_parse() {
    let parsed: ServerConfig =
        toml::from_str(&with_examples(&sample())).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(parsed.tenants.len(), 1);
    assert!(parsed.auth.jwt.is_some());
    assert!(parsed.llm.base_url.is_some());
}

#[test]
fn the_sample_documents_every_config_key() {
    let text = sample();
    let mut documented = BTreeSet::new();
    for line in text.lines() {
        let line = line.trim_start_matches('#').trim();
        if let Some((key, _)) = line.split_once(" = ").filter(|_| is_key_line(line)) {
            documented.insert(key.to_owned());
        }
        if let Some(section) = line.strip_prefix('[') {
            let section = section.trim_matches(|c| c == '[' || c == ']');
            documented.extend(section.split('.').map(str::to_owned));
        }
    }
    // Every `pub field:` of the configuration structs is a key.
    let source = read("src/config.rs");
    let keys: BTreeSet<String> = source
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub "))
        .filter_map(|l| l.split_once(':'))
        .map(|(name, _)| name.trim().to_owned())
        .filter(|name| name.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .collect();
    assert!(keys.len() > 30, "found the config fields: {keys:?}");
    let missing: Vec<&String> = keys.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "deploy/tessera.toml does not document {missing:?}"
    );
}
