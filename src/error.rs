//! [`ConfigError`]: a setting that cannot work, named by its builder method or its path, and
//! the small checks every builder makes with it.
//!
//! It stands on the ground floor, beside [`SendError`](crate::SendError), so that the
//! breaker, the wrappers and the adapters answer for their settings without depending on
//! [`config`](crate::config), the module that builds them all; that module re-exports it as
//! `mail_breaker::config::ConfigError`.

use std::borrow::Cow;

/// A setting given to a builder that cannot work, naming the setting and why.
///
/// ```
/// use mail_breaker::{CircuitBreakerTransport, LettreTransport};
/// # use lettre::transport::stub::AsyncStubTransport;
/// # let stub = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
/// let err = CircuitBreakerTransport::builder(stub).failure_threshold(0).build().unwrap_err();
/// assert_eq!(err.setting(), "failure_threshold");
/// assert_eq!(err.to_string(), "invalid failure_threshold: must be at least 1, got 0");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {setting}: {reason}")]
pub struct ConfigError {
    setting: Cow<'static, str>,
    reason: Cow<'static, str>,
}

impl ConfigError {
    /// An error for `setting`, saying `reason`.
    pub fn new(
        setting: impl Into<Cow<'static, str>>,
        reason: impl Into<Cow<'static, str>>,
    ) -> Self {
        ConfigError {
            setting: setting.into(),
            reason: reason.into(),
        }
    }

    /// The setting: the builder method that takes it, or for a whole stack's
    /// configuration its path (`member[1].breaker.threshold`).
    pub fn setting(&self) -> &str {
        &self.setting
    }

    /// Why the value cannot work.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The same error, its setting read as a part of `path` (`member[1].url` for a
    /// transport's `url` error, when it was built from that member).
    #[cfg_attr(not(feature = "config"), allow(dead_code))]
    pub(crate) fn within(self, path: &str) -> ConfigError {
        let setting = if path.is_empty() {
            self.setting
        } else if self.setting.is_empty() || path.ends_with(&*self.setting) {
            Cow::Owned(path.to_owned())
        } else {
            Cow::Owned(format!("{path}.{}", self.setting))
        };
        ConfigError {
            setting,
            reason: self.reason,
        }
    }
}

/// `Err` naming `setting` unless `value` is at least 1.
pub(crate) fn at_least_one(setting: &'static str, value: u64) -> Result<(), ConfigError> {
    if value == 0 {
        return Err(ConfigError::new(setting, "must be at least 1, got 0"));
    }
    Ok(())
}

/// `Err` naming `setting` when `value` is zero.
pub(crate) fn non_zero_duration(
    setting: &'static str,
    value: std::time::Duration,
) -> Result<(), ConfigError> {
    if value.is_zero() {
        return Err(ConfigError::new(setting, "must be longer than zero"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::ConfigError;

    #[test]
    fn an_error_read_within_a_path_is_named_by_the_path_and_its_setting() {
        let error = ConfigError::new("threshold", "must be at least 1, got 0");
        assert_eq!(
            error.within("member[1].breaker").setting(),
            "member[1].breaker.threshold"
        );
    }

    #[test]
    fn an_error_whose_setting_ends_the_path_is_named_by_the_path_alone() {
        let error = ConfigError::new("url", "not a URL");
        assert_eq!(error.within("member[1].url").setting(), "member[1].url");
    }

    #[test]
    fn an_error_without_a_setting_takes_the_path_and_an_empty_path_keeps_the_setting() {
        assert_eq!(
            ConfigError::new("", "bad").within("retry").setting(),
            "retry"
        );
        assert_eq!(ConfigError::new("url", "bad").within("").setting(), "url");
    }
}
