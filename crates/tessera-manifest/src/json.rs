//! Checked access to raw JSON: every read either yields a value of the expected type or records
//! an error at the exact JSON pointer, so one pass reports every problem without panicking.

use serde_json::{Map, Value};

use crate::error::Diag;

/// A location inside one manifest file: file name plus JSON pointer.
#[derive(Debug, Clone)]
pub(crate) struct Loc {
    pub file: &'static str,
    pub path: String,
}

impl Loc {
    /// The whole document of `file`.
    pub fn root(file: &'static str) -> Self {
        Self {
            file,
            path: String::new(),
        }
    }

    /// The member `key` of the object at this location (RFC 6901 escaping).
    pub fn key(&self, key: &str) -> Self {
        let escaped = key.replace('~', "~0").replace('/', "~1");
        Self {
            file: self.file,
            path: format!("{}/{escaped}", self.path),
        }
    }

    /// The element `i` of the array at this location.
    pub fn idx(&self, i: usize) -> Self {
        Self {
            file: self.file,
            path: format!("{}/{i}", self.path),
        }
    }

    /// Records an error at this location.
    pub fn err(&self, d: &mut Diag, message: impl Into<String>) {
        d.err(self.file, self.path.clone(), message);
    }
}

/// Human name of a JSON value's type, for "expected X, found Y" messages.
pub(crate) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A JSON object being read, with its location.
pub(crate) struct Obj<'v> {
    pub map: &'v Map<String, Value>,
    pub loc: Loc,
}

/// Reads `v` as an object, recording an error (mentioning `what`) when it is not one.
pub(crate) fn object<'v>(v: &'v Value, loc: &Loc, what: &str, d: &mut Diag) -> Option<Obj<'v>> {
    match v {
        Value::Object(map) => Some(Obj {
            map,
            loc: loc.clone(),
        }),
        other => {
            loc.err(
                d,
                format!(
                    "expected {what} (a JSON object), found {}",
                    type_name(other)
                ),
            );
            None
        }
    }
}

/// Reads `v` as an array, recording an error (mentioning `what`) when it is not one.
pub(crate) fn array<'v>(v: &'v Value, loc: &Loc, what: &str, d: &mut Diag) -> Option<&'v [Value]> {
    match v {
        Value::Array(items) => Some(items),
        other => {
            loc.err(
                d,
                format!("expected {what} (a JSON array), found {}", type_name(other)),
            );
            None
        }
    }
}

/// Edit distance, used to suggest the intended key for a typo.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = Vec::with_capacity(b.len() + 1);
        cur.push(i + 1);
        for (j, cb) in b.iter().enumerate() {
            let sub = prev.get(j).copied().unwrap_or(0) + usize::from(ca != *cb);
            let del = prev.get(j + 1).copied().unwrap_or(0) + 1;
            let ins = cur.get(j).copied().unwrap_or(0) + 1;
            cur.push(sub.min(del).min(ins));
        }
        prev = cur;
    }
    prev.last().copied().unwrap_or(0)
}

/// The closest candidate to `word`, when it is close enough to be a likely typo.
pub(crate) fn suggest<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let lower = word.to_lowercase();
    candidates
        .into_iter()
        .map(|c| (distance(&lower, &c.to_lowercase()), c))
        .filter(|(dist, c)| {
            let c = c.to_lowercase();
            let prefix =
                c.len().min(lower.len()) >= 3 && (c.starts_with(&lower) || lower.starts_with(&c));
            *dist <= 2.max(c.len() / 3) || prefix
        })
        .min_by_key(|(dist, _)| *dist)
        .map(|(_, c)| c)
}

/// " (did you mean \"x\"?)" or "".
pub(crate) fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> String {
    suggest(word, candidates)
        .map(|s| format!(" (did you mean \"{s}\"?)"))
        .unwrap_or_default()
}

impl<'v> Obj<'v> {
    /// Records an error for every key not in `allowed`, listing the allowed keys (catches typos).
    pub fn allow_keys(&self, allowed: &[&str], d: &mut Diag) {
        for key in self.map.keys() {
            if !allowed.contains(&key.as_str()) {
                let hint = did_you_mean(key, allowed.iter().copied());
                self.loc.key(key).err(
                    d,
                    format!(
                        "unknown key \"{key}\"{hint}; allowed keys are: {}",
                        allowed.join(", ")
                    ),
                );
            }
        }
    }

    /// The value of `key`, treating `null` as absent.
    pub fn get(&self, key: &str) -> Option<&'v Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn missing(&self, key: &str, what: &str, d: &mut Diag) {
        self.loc.err(
            d,
            format!("missing required key \"{key}\" ({what}); add it"),
        );
    }

    fn wrong(&self, key: &str, what: &str, found: &Value, d: &mut Diag) {
        self.loc.key(key).err(
            d,
            format!("\"{key}\" must be {what}, found {}", type_name(found)),
        );
    }

    /// A required string.
    pub fn req_str(&self, key: &str, d: &mut Diag) -> Option<&'v str> {
        match self.get(key) {
            None => {
                self.missing(key, "a string", d);
                None
            }
            Some(v) => self.as_str(key, v, d),
        }
    }

    /// An optional string (`null` or absent gives `None`).
    pub fn opt_str(&self, key: &str, d: &mut Diag) -> Option<&'v str> {
        self.get(key).and_then(|v| self.as_str(key, v, d))
    }

    fn as_str(&self, key: &str, v: &'v Value, d: &mut Diag) -> Option<&'v str> {
        match v {
            Value::String(s) => Some(s),
            other => {
                self.wrong(key, "a string", other, d);
                None
            }
        }
    }

    /// A required boolean.
    pub fn req_bool(&self, key: &str, d: &mut Diag) -> Option<bool> {
        match self.get(key) {
            None => {
                self.missing(key, "true or false", d);
                None
            }
            Some(v) => self.as_bool(key, v, d),
        }
    }

    /// An optional boolean with a default.
    pub fn opt_bool(&self, key: &str, default: bool, d: &mut Diag) -> bool {
        self.get(key)
            .and_then(|v| self.as_bool(key, v, d))
            .unwrap_or(default)
    }

    fn as_bool(&self, key: &str, v: &Value, d: &mut Diag) -> Option<bool> {
        match v {
            Value::Bool(b) => Some(*b),
            other => {
                self.wrong(key, "true or false", other, d);
                None
            }
        }
    }

    /// A required non-negative integer that fits in `u32`.
    pub fn req_u32(&self, key: &str, d: &mut Diag) -> Option<u32> {
        let Some(v) = self.get(key) else {
            self.missing(key, "a non-negative integer", d);
            return None;
        };
        match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(n) => Some(n),
            None => {
                self.loc.key(key).err(
                    d,
                    format!("\"{key}\" must be a non-negative integer below 2^32, found {v}"),
                );
                None
            }
        }
    }

    /// An optional number that must be finite and strictly positive (timeouts).
    pub fn opt_positive(&self, key: &str, d: &mut Diag) -> Option<f64> {
        let v = self.get(key)?;
        match v.as_f64() {
            Some(n) if n.is_finite() && n > 0.0 => Some(n),
            _ => {
                self.loc.key(key).err(
                    d,
                    format!("\"{key}\" must be a number greater than 0, found {v}"),
                );
                None
            }
        }
    }

    /// An optional array of strings.
    pub fn opt_str_list(&self, key: &str, d: &mut Diag) -> Vec<(usize, &'v str)> {
        let Some(v) = self.get(key) else {
            return Vec::new();
        };
        let loc = self.loc.key(key);
        let Some(items) = array(v, &loc, &format!("\"{key}\""), d) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            match item {
                Value::String(s) if !s.trim().is_empty() => out.push((i, s.as_str())),
                other => loc.idx(i).err(
                    d,
                    format!(
                        "each entry of \"{key}\" must be a non-empty string, found {}",
                        type_name(other)
                    ),
                ),
            }
        }
        out
    }
}

/// True for `PascalCase` identifiers (agent names, React components).
pub(crate) fn is_pascal_case(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_uppercase())
        && chars.all(|c| c.is_ascii_alphanumeric())
}

/// True for `snake_case` identifiers (tool functions, variables).
pub(crate) fn is_snake_case(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// True for identifiers usable as `${name}` in conditions.
pub(crate) fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}
