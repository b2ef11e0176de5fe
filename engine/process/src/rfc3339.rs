//! RFC 3339 timestamps in UTC, as container engines write a container's `Created`
//! (`2024-05-01T10:20:30.123456789Z`), to nanoseconds since the Unix epoch.
//!
//! Accepted: `YYYY-MM-DDTHH:MM:SS`, an optional fraction of one or more digits (digits past the
//! nanosecond are dropped), then `Z` or `+00:00`. Any other offset is refused rather than
//! converted, as before. A second of 60 (a leap second) counts as 59. Years before 1970, and
//! instants past what a `u64` of nanoseconds holds (in the year 2554), are out of range.

/// Why a timestamp was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TimestampError {
    #[error("not an RFC 3339 UTC timestamp (YYYY-MM-DDTHH:MM:SS[.fraction]Z)")]
    Format,
    #[error("a field of the timestamp is out of range")]
    OutOfRange,
}

/// Days before each month in a common year.
const DAYS_BEFORE_MONTH: [u64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];

/// Nanoseconds since the Unix epoch of the UTC timestamp `text`.
pub fn parse_utc_ns(text: &str) -> Result<u64, TimestampError> {
    use TimestampError::{Format, OutOfRange};
    let body = text
        .strip_suffix('Z')
        .or_else(|| text.strip_suffix("+00:00"))
        .ok_or(Format)?
        .as_bytes();
    let (stamp, fraction) = body.split_at_checked(19).ok_or(Format)?;
    for (i, sep) in [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':')] {
        if stamp[i] != sep {
            return Err(Format);
        }
    }
    let field = |from: usize, to: usize| number(&stamp[from..to]).ok_or(Format);
    let (year, month, day) = (field(0, 4)?, field(5, 7)?, field(8, 10)?);
    let (hour, minute, second) = (field(11, 13)?, field(14, 16)?, field(17, 19)?);
    let nanos = match fraction {
        [] => 0,
        [b'.', digits @ ..] if !digits.is_empty() => {
            number(digits).ok_or(Format)?;
            // The first nine digits, padded with zeros: the nanoseconds.
            (0..9).fold(0, |n, i| {
                n * 10 + digits.get(i).map_or(0, |d| u64::from(d - b'0'))
            })
        }
        _ => return Err(Format),
    };
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let month_days = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        1..=12 => 31,
        _ => return Err(OutOfRange),
    };
    if year < 1970 || day == 0 || day > month_days || hour > 23 || minute > 59 || second > 60 {
        return Err(OutOfRange);
    }
    let leap_days_before = |y: u64| (y - 1) / 4 - (y - 1) / 100 + (y - 1) / 400;
    let day_of_year =
        DAYS_BEFORE_MONTH[(month - 1) as usize] + u64::from(leap && month > 2) + day - 1;
    let days = (year - 1970) * 365 + leap_days_before(year) - leap_days_before(1970) + day_of_year;
    let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second.min(59);
    seconds
        .checked_mul(1_000_000_000)
        .and_then(|ns| ns.checked_add(nanos))
        .ok_or(OutOfRange)
}

/// The value of a run of ASCII digits (at most 19, so it cannot overflow); `None` for anything
/// else. A longer run is checked for digits only and valued 0: fractions are cut to nine digits
/// by the caller.
fn number(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        digits
            .iter()
            .take(19)
            .fold(0, |n, d| n * 10 + u64::from(d - b'0')),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn engine_timestamps_read_to_the_nanosecond() {
        // Values from Python's datetime.
        assert_eq!(parse_utc_ns("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(
            parse_utc_ns("2024-05-01T10:20:30.123456789Z"),
            Ok(1_714_558_830 * S + 123_456_789)
        );
        assert_eq!(
            parse_utc_ns("2026-11-30T16:53:36.956847568Z"),
            Ok(1_796_057_616 * S + 956_847_568)
        );
        assert_eq!(
            parse_utc_ns("2024-05-01T10:20:30+00:00"),
            Ok(1_714_558_830 * S)
        );
        assert_eq!(
            parse_utc_ns("2024-05-01T10:20:30.5+00:00"),
            Ok(1_714_558_830 * S + 500_000_000)
        );
        assert_eq!(parse_utc_ns("1999-12-31T23:59:59Z"), Ok(946_684_799 * S));
    }

    #[test]
    fn fractions_of_any_length_are_cut_to_nanoseconds() {
        let base = 1_714_558_830 * S;
        for (fraction, nanos) in [
            ("1", 100_000_000),
            ("12", 120_000_000),
            ("123", 123_000_000),
            ("000001", 1_000),
            ("123456789", 123_456_789),
            ("1234567891", 123_456_789),
            ("999999999999", 999_999_999),
            ("0000000000000000000000000", 0),
        ] {
            let text = format!("2024-05-01T10:20:30.{fraction}Z");
            assert_eq!(parse_utc_ns(&text), Ok(base + nanos), "{text}");
        }
    }

    #[test]
    fn leap_years_and_leap_seconds() {
        assert_eq!(parse_utc_ns("2024-02-29T00:00:00Z"), Ok(1_709_164_800 * S));
        assert_eq!(parse_utc_ns("2000-02-29T12:00:00Z"), Ok(951_825_600 * S));
        assert_eq!(parse_utc_ns("2024-03-01T00:00:00Z"), Ok(1_709_251_200 * S));
        assert_eq!(parse_utc_ns("2024-12-31T00:00:00Z"), Ok(1_735_603_200 * S));
        for not_a_day in [
            "2023-02-29T00:00:00Z",
            "2100-02-29T00:00:00Z",
            "2024-02-30T00:00:00Z",
            "2024-04-31T00:00:00Z",
        ] {
            assert_eq!(
                parse_utc_ns(not_a_day),
                Err(TimestampError::OutOfRange),
                "{not_a_day}"
            );
        }
        // A leap second is the second before it.
        assert_eq!(
            parse_utc_ns("2016-12-31T23:59:60Z"),
            parse_utc_ns("2016-12-31T23:59:59Z")
        );
    }

    #[test]
    fn the_range_ends_where_u64_nanoseconds_do() {
        assert_eq!(parse_utc_ns("2554-07-21T23:34:33.709551615Z"), Ok(u64::MAX));
        assert_eq!(
            parse_utc_ns("2554-07-21T23:34:33.709551616Z"),
            Err(TimestampError::OutOfRange)
        );
        assert_eq!(
            parse_utc_ns("9999-12-31T23:59:59Z"),
            Err(TimestampError::OutOfRange)
        );
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            "",
            "yesterday",
            "2024-05-01",
            "2024-05-01T10:20:30",
            "2024-05-01T10:20:30z",
            "2024-05-01t10:20:30Z",
            "2024-05-01 10:20:30Z",
            "2024-05-01T10:20:30+02:00",
            "2024-05-01T10:20:30-00:00",
            "2024-05-01T10:20:30.123+02:00",
            "2024-05-01T10:20:30.Z",
            "2024-05-01T10:20:30.12a4Z",
            "2024-05-01T10:20:30.1 Z",
            "2024-05-01T10:20:30ZZ",
            "2024-05-01T10:20:30Z+00:00",
            "2024-05-01T10:20:30,5Z",
            "2024-5-01T10:20:30Z",
            "2024-05-01T10:2:300Z",
            "+024-05-01T10:20:30Z",
            "2024-05-01T10:20:3\u{e9}Z",
            "\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}Z",
        ] {
            assert_eq!(parse_utc_ns(bad), Err(TimestampError::Format), "{bad:?}");
        }
        for bad in [
            "1969-12-31T23:59:59Z",
            "2024-00-01T10:20:30Z",
            "2024-13-01T10:20:30Z",
            "2024-05-00T10:20:30Z",
            "2024-05-32T10:20:30Z",
            "2024-05-01T24:00:00Z",
            "2024-05-01T10:60:30Z",
            "2024-05-01T10:20:61Z",
        ] {
            assert_eq!(
                parse_utc_ns(bad),
                Err(TimestampError::OutOfRange),
                "{bad:?}"
            );
        }
    }
}
