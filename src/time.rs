//! Time arithmetic that cannot panic: every `Instant + Duration` whose Duration comes from a
//! setting or a server goes through here, and so does every wait a provider asks for.
//!
//! A setting of `Duration::MAX` means "for ever" to the user; `Instant + Duration::MAX`
//! would overflow and panic. These helpers saturate at a point far beyond any process's life
//! instead, and cap a provider's `Retry-After` at [`MAX_PROVIDER_WAIT`].

use std::time::{Duration, SystemTime};

/// The longest wait a provider may ask for: a `Retry-After` beyond it is taken as this.
pub const MAX_PROVIDER_WAIT: Duration = Duration::from_secs(24 * 60 * 60);

/// About thirty years: what "later" saturates to when the sum overflows.
const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 24 * 60 * 60);

/// `now + by`, with `by` taken as at most about thirty years: longer is "for ever" to any
/// process, and a timer set millions of years ahead would make Tokio's timer wheel wake every
/// two years for nothing. (`now` itself if even that overflows, which no clock reaches.)
pub(crate) fn later(now: tokio::time::Instant, by: Duration) -> tokio::time::Instant {
    now.checked_add(by.min(FAR_FUTURE)).unwrap_or(now)
}

/// [`later`] for `std::time::Instant`.
#[cfg_attr(not(feature = "redis"), allow(dead_code))] // the Redis store's retry clock
pub(crate) fn later_std(now: std::time::Instant, by: Duration) -> std::time::Instant {
    now.checked_add(by.min(FAR_FUTURE)).unwrap_or(now)
}

/// A wait a provider asked for, capped at [`MAX_PROVIDER_WAIT`].
#[cfg_attr(
    not(any(
        feature = "ses",
        feature = "postmark",
        feature = "resend",
        feature = "sendgrid",
        feature = "mailgun"
    )),
    allow(dead_code)
)] // read from SES and the HTTP providers
pub(crate) fn provider_wait(wait: Duration) -> Duration {
    wait.min(MAX_PROVIDER_WAIT)
}

/// An HTTP `Retry-After` value as a wait from `now`: a number of seconds (fractions allowed,
/// as some providers send them) or an HTTP-date. Capped at [`MAX_PROVIDER_WAIT`]; a date in
/// the past is no wait; anything else (negative, not a number, not a date) is `None`.
#[cfg_attr(
    not(any(
        feature = "ses",
        feature = "postmark",
        feature = "resend",
        feature = "sendgrid",
        feature = "mailgun"
    )),
    allow(dead_code)
)] // read from SES and the HTTP providers
pub(crate) fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<f64>() {
        if !(seconds.is_finite() && seconds >= 0.0) {
            return None;
        }
        let capped = seconds.min(MAX_PROVIDER_WAIT.as_secs_f64());
        return Some(provider_wait(Duration::from_secs_f64(capped)));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(provider_wait(
        date.duration_since(now).unwrap_or(Duration::ZERO),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_saturates_instead_of_panicking() {
        let now = tokio::time::Instant::now();
        assert!(later(now, Duration::MAX) > later(now, Duration::from_secs(3600)));
        assert_eq!(
            later(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
        let std_now = std::time::Instant::now();
        assert!(later_std(std_now, Duration::MAX) > std_now);
    }

    #[test]
    fn retry_after_in_seconds_is_read_and_capped() {
        let now = SystemTime::now();
        assert_eq!(parse_retry_after("7", now), Some(Duration::from_secs(7)));
        assert_eq!(
            parse_retry_after(" 1.5 ", now),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(parse_retry_after("1e20", now), Some(MAX_PROVIDER_WAIT));
        assert_eq!(parse_retry_after("inf", now), None);
        assert_eq!(parse_retry_after("NaN", now), None);
        assert_eq!(parse_retry_after("-3", now), None);
        assert_eq!(parse_retry_after("soon", now), None);
    }

    #[test]
    fn retry_after_as_an_http_date_is_the_time_until_it() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:50:07 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(
            parse_retry_after("Sat, 06 Nov 2094 08:00:00 GMT", now),
            Some(MAX_PROVIDER_WAIT)
        );
    }
}
