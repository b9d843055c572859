//! Checked conversions between Rust integers and SQLite's signed 64-bit INTEGER, and the clock.
//!
//! WHY: nothing read from the file is trusted; a negative or oversized number becomes
//! [`StoreError::Corrupt`] instead of a panic or a silent wrap.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::{JsonText, StoreError};

/// A caller's u64 as an SQLite INTEGER.
pub(crate) fn u64_to_sql(v: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(v)
        .map_err(|_| StoreError::InvalidInput(format!("{what} {v} exceeds the storable range")))
}

/// A stored INTEGER as u64.
pub(crate) fn sql_to_u64(v: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| StoreError::Corrupt(format!("{what} is negative: {v}")))
}

/// A stored INTEGER as u32.
pub(crate) fn sql_to_u32(v: i64, what: &str) -> Result<u32, StoreError> {
    u32::try_from(v).map_err(|_| StoreError::Corrupt(format!("{what} out of range: {v}")))
}

/// Parse stored JSON text.
pub(crate) fn json_from_sql(text: &str, what: &str) -> Result<serde_json::Value, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

/// [`json_from_sql`] kept as text: checked to be one JSON document, not parsed into a tree.
pub(crate) fn json_text_from_sql(text: String, what: &str) -> Result<JsonText, StoreError> {
    JsonText::from_text(text).map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

/// Wall clock, Unix milliseconds (0 if the clock is before 1970).
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
