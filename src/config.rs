//! [`ConfigError`]: a builder setting that cannot work.

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
    setting: &'static str,
    reason: Cow<'static, str>,
}

impl ConfigError {
    /// An error for `setting`, saying `reason`.
    pub fn new(setting: &'static str, reason: impl Into<Cow<'static, str>>) -> Self {
        ConfigError {
            setting,
            reason: reason.into(),
        }
    }

    /// The name of the setting, as the builder method that takes it.
    pub fn setting(&self) -> &'static str {
        self.setting
    }

    /// Why the value cannot work.
    pub fn reason(&self) -> &str {
        &self.reason
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
