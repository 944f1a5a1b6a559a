//! RFC 3339 rendering of epoch milliseconds, without a date-time dependency.

/// 9999-12-31T23:59:59.999Z: the last instant RFC 3339's four-digit year can render.
pub const MAX_TIMESTAMP_MS: i64 = 253_402_300_799_999;

/// Renders `0..=MAX_TIMESTAMP_MS` as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC).
pub fn rfc3339_from_ms(ms: i64) -> String {
    let ms = ms.clamp(0, MAX_TIMESTAMP_MS);
    let days = ms.div_euclid(86_400_000);
    let in_day = ms.rem_euclid(86_400_000);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute) = (in_day / 3_600_000, in_day / 60_000 % 60);
    let (second, milli) = (in_day / 1000 % 60, in_day % 1000);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{milli:03}Z")
}

// Howard Hinnant's days-to-civil algorithm (proleptic Gregorian calendar).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_known_instants() {
        assert_eq!(rfc3339_from_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_from_ms(951_782_400_001), "2000-02-29T00:00:00.001Z");
        assert_eq!(
            rfc3339_from_ms(1_795_319_248_123),
            "2026-11-22T03:47:28.123Z"
        );
        assert_eq!(
            rfc3339_from_ms(MAX_TIMESTAMP_MS),
            "9999-12-31T23:59:59.999Z"
        );
    }
}
