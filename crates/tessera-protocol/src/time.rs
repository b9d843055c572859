//! RFC 3339 timestamps without a date-time dependency: events need only "now, in UTC".

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

/// The current UTC time as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn rfc3339_now() -> String {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    format_unix_millis(since.as_millis() as i64)
}

/// Formats milliseconds since the Unix epoch (UTC) as [`rfc3339_now`] does.
pub fn format_unix_millis(ms: i64) -> String {
    let mut out = String::with_capacity(24);
    write_unix_millis(&mut out, ms);
    out
}

/// Appends [`format_unix_millis`]`(ms)` to `out` (no allocation when `out` has room). Uses
/// Howard Hinnant's days-to-civil algorithm, exact for the proleptic Gregorian calendar.
pub fn write_unix_millis(out: &mut String, ms: i64) {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    // Writing to a String cannot fail.
    let _ = write!(
        out,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        sod / 3600,
        (sod % 3600) / 60,
        sod % 60
    );
}

#[cfg(test)]
mod tests {
    use super::format_unix_millis;

    #[test]
    fn formats_known_instants() {
        assert_eq!(format_unix_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            format_unix_millis(951_782_400_123),
            "2000-02-29T00:00:00.123Z"
        );
        assert_eq!(
            format_unix_millis(1_790_000_000_000),
            "2026-09-21T14:13:20.000Z"
        );
    }
}
