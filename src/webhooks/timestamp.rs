//! The providers' times: RFC 3339 text (SNS, SES, Resend, Postmark) and Unix seconds
//! (SendGrid, Mailgun, Svix), read without panicking on any input, and the windows a signed
//! time must fall in.

use std::time::{Duration, SystemTime};

/// A signed time's distance from now, either way, that a route accepts for the providers
/// that sign each delivery afresh (SendGrid, Svix): 5 minutes.
pub(crate) const SKEW: Duration = Duration::from_secs(5 * 60);

/// Whether `signed` is no older than `max_age` and no further ahead than [`SKEW`].
pub(crate) fn within(signed: SystemTime, now: SystemTime, max_age: Duration) -> bool {
    match now.duration_since(signed) {
        Ok(age) => age <= max_age,
        Err(ahead) => ahead.duration() <= SKEW,
    }
}

/// Whole Unix seconds as text (`1770920772`), as the providers' headers carry them.
pub(crate) fn unix_seconds(text: &str) -> Option<SystemTime> {
    let text = text.trim();
    // Digits only: `u64`'s parser would also take a leading `+`. (An empty text fails the
    // parse.)
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let seconds: u64 = text.parse().ok()?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(seconds))
}

/// Unix seconds with an optional fraction (Mailgun's `1521472262.908181`), as a JSON number.
pub(crate) fn unix_float(seconds: f64) -> Option<SystemTime> {
    if !seconds.is_finite() || !(0.0..=1e12).contains(&seconds) {
        return None;
    }
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs_f64(seconds))
}

/// An RFC 3339 time (`2016-01-27T14:59:38.237Z`, `2019-11-05T16:33:54.9070259-05:00`).
pub(crate) fn rfc3339(text: &str) -> Option<SystemTime> {
    let bytes = text.trim().as_bytes();
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let digits = bytes.get(range)?;
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(digits).ok()?.parse().ok()
    };
    let separator = |at: usize, allowed: &[u8]| bytes.get(at).is_some_and(|b| allowed.contains(b));
    let separators = separator(4, b"-")
        && separator(7, b"-")
        && separator(10, b"Tt ")
        && separator(13, b":")
        && separator(16, b":");
    if !separators {
        return None;
    }
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut at = 19;
    let mut nanos: u64 = 0;
    if bytes.get(at) == Some(&b'.') {
        at += 1;
        let start = at;
        while bytes.get(at).is_some_and(u8::is_ascii_digit) {
            if at - start < 9 {
                nanos = nanos * 10 + u64::from(bytes[at] - b'0');
            }
            at += 1;
        }
        if at == start {
            return None;
        }
        for _ in (at - start).min(9)..9 {
            nanos *= 10;
        }
    }
    let offset_seconds = match bytes.get(at) {
        Some(b'Z' | b'z') if at + 1 == bytes.len() => 0,
        Some(sign @ (b'+' | b'-')) if at + 6 == bytes.len() && separator(at + 3, b":") => {
            let magnitude = number(at + 1..at + 3)? * 3600 + number(at + 4..at + 6)? * 60;
            if *sign == b'+' { magnitude } else { -magnitude }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_seconds;
    let seconds = u64::try_from(seconds).ok()?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::new(seconds, u32::try_from(nanos).ok()?))
}

/// Days from 1970-01-01 to the date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unix(seconds: u64, nanos: u32) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::new(seconds, nanos)
    }

    #[test]
    fn rfc3339_reads_the_providers_shapes() {
        assert_eq!(rfc3339("1970-01-01T00:00:00Z"), Some(unix(0, 0)));
        assert_eq!(
            rfc3339("2016-01-27T14:59:38.237Z"),
            Some(unix(1_453_906_778, 237_000_000))
        );
        assert_eq!(
            rfc3339("2019-11-05T16:33:54.9070259Z"),
            Some(unix(1_572_971_634, 907_025_900))
        );
        assert_eq!(
            rfc3339("2019-11-05T11:33:54-05:00"),
            Some(unix(1_572_971_634, 0))
        );
        assert_eq!(
            rfc3339("2000-02-29T00:00:00+00:00"),
            Some(unix(951_782_400, 0))
        );
    }

    #[test]
    fn rfc3339_refuses_what_is_not_a_time() {
        for text in [
            "",
            "2016-01-27",
            "2016-13-01T00:00:00Z",
            "2016-01-27T14:59:38",
            "2016-01-27T14:59:38.Z",
            "1969-12-31T23:59:59Z",
            "2016-01-27T14:59:38Zjunk",
            "２０１６-01-27T14:59:38Z",
        ] {
            assert_eq!(rfc3339(text), None, "{text}");
        }
    }

    #[test]
    fn a_signed_time_is_within_its_age_and_five_minutes_ahead() {
        let now = unix(10_000, 0);
        let hour = Duration::from_secs(3600);
        assert!(within(unix(10_000 - 3600, 0), now, hour));
        assert!(!within(unix(10_000 - 3601, 0), now, hour));
        assert!(within(unix(10_300, 0), now, hour));
        assert!(!within(unix(10_301, 0), now, hour));
    }

    #[test]
    fn unix_seconds_are_digits_only() {
        assert_eq!(unix_seconds("1770920772"), Some(unix(1_770_920_772, 0)));
        assert_eq!(unix_seconds("-1"), None);
        assert_eq!(unix_seconds("+1"), None);
        assert_eq!(unix_seconds(""), None);
        assert_eq!(unix_seconds("1e9"), None);
        assert_eq!(unix_seconds("99999999999999999999999"), None);
        assert_eq!(unix_float(f64::NAN), None);
        assert_eq!(unix_float(1.5), Some(unix(1, 500_000_000)));
    }
}
