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
    let (hour, minute, second) = (sod / 3600, (sod % 3600) / 60, sod % 60);
    if !(0..=9999).contains(&year) {
        // Writing to a String cannot fail.
        let _ = write!(
            out,
            "{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{millis:03}Z"
        );
        return;
    }
    // WHY digits by hand: `write!` with widths took ~2,000 instructions a timestamp, and
    // every event has one (docs/performance-log.md, twenty-fifth session).
    let mut text = *b"0000-00-00T00:00:00.000Z";
    for (at, width, value) in [
        (0, 4, year),
        (5, 2, month),
        (8, 2, day),
        (11, 2, hour),
        (14, 2, minute),
        (17, 2, second),
        (20, 3, millis),
    ] {
        let mut rest = value;
        for digit in text[at..at + width].iter_mut().rev() {
            *digit = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
    }
    // Digits and `-T:.Z` only.
    out.push_str(std::str::from_utf8(&text).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::format_unix_millis;

    /// An independent reference: the date found by counting days a year and a month at a
    /// time, written with `format!`.
    fn reference(ms: i64) -> String {
        let secs = ms.div_euclid(1000);
        let days = secs.div_euclid(86_400);
        let sod = secs.rem_euclid(86_400);
        // Civil date by counting days from 1970-01-01, a year and a month at a time.
        let (mut year, mut left) = (1970i64, days);
        let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        let year_len = |y: i64| if leap(y) { 366 } else { 365 };
        while left < 0 {
            year -= 1;
            left += year_len(year);
        }
        while left >= year_len(year) {
            left -= year_len(year);
            year += 1;
        }
        let months = [
            31,
            if leap(year) { 29 } else { 28 },
            31,
            30,
            31,
            30,
            31,
            31,
            30,
            31,
            30,
            31,
        ];
        let mut month = 0;
        while left >= months[month] {
            left -= months[month];
            month += 1;
        }
        format!(
            "{year:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
            month + 1,
            left + 1,
            sod / 3600,
            (sod % 3600) / 60,
            sod % 60,
            ms.rem_euclid(1000)
        )
    }

    #[test]
    fn matches_a_day_counting_reference_across_centuries() {
        // Every 7,919,113 ms (a prime: hour, minute, second and millisecond all vary) from
        // 1899 to 2101, then the edges of the four-digit years.
        let mut ms = -2_240_524_800_000i64;
        while ms < 4_133_980_800_000 {
            assert_eq!(format_unix_millis(ms), reference(ms), "{ms}");
            ms += 7_919_113;
        }
        for ms in [
            -62_167_219_200_000,
            -62_167_219_200_001,
            253_402_300_799_999,
            253_402_300_800_000,
        ] {
            assert_eq!(format_unix_millis(ms), reference(ms), "{ms}");
        }
    }

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
