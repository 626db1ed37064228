//! [`RetryBudget`]: the gRPC retry throttler, shared by every retry transport that holds it.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::ConfigError;

/// Stops retries while too many of them fail: the retry throttling of gRPC (proposal A6).
///
/// It holds tokens, `tokens` at the start and at most. Each try that fails with a retryable
/// error costs `error_cost` tokens ([`on_retry_failure`](Self::on_retry_failure)); each
/// success earns one back ([`on_success`](Self::on_success)). While the count is at or below
/// `min_tokens`, [`throttle_retry_attempt`](Self::throttle_retry_attempt) says no and
/// no message is retried; a message's first try is never throttled, so successes of first
/// tries refill the budget once the provider is back.
///
/// # Sharing
/// Share one budget between every [`RetryTransport`](crate::RetryTransport) that sends to the
/// same providers, through an `Arc`. It is lock-free: the count is one atomic. Under load,
/// several failures at once may take the count below `min_tokens`.
///
/// # Example
/// ```
/// use std::sync::Arc;
/// use mail_breaker::RetryBudget;
///
/// let budget = Arc::new(RetryBudget::new(100, 50, 10)?);
/// for _ in 0..5 {
///     assert!(!budget.throttle_retry_attempt());
///     budget.on_retry_failure();
/// }
/// assert_eq!(budget.tokens(), 50);
/// assert!(budget.throttle_retry_attempt()); // at min_tokens: no more retries
/// budget.on_success();
/// assert!(!budget.throttle_retry_attempt());
/// # Ok::<(), mail_breaker::ConfigError>(())
/// ```
#[derive(Debug)]
pub struct RetryBudget {
    max_tokens: u64,
    min_tokens: u64,
    error_cost: u64,
    tokens: AtomicU64,
}

impl RetryBudget {
    /// A full budget of `tokens`; retries stop at or below `min_tokens`; each failed try
    /// costs `error_cost`.
    ///
    /// A [`ConfigError`] when `tokens` or `error_cost` is 0, or `min_tokens` is over
    /// `tokens`.
    ///
    /// ```
    /// # use mail_breaker::RetryBudget;
    /// assert_eq!(RetryBudget::new(100, 200, 10).unwrap_err().setting(), "min_tokens");
    /// ```
    pub fn new(tokens: u64, min_tokens: u64, error_cost: u64) -> Result<Self, ConfigError> {
        if tokens == 0 {
            return Err(ConfigError::new("tokens", "must be at least 1, got 0"));
        }
        if error_cost == 0 {
            return Err(ConfigError::new("error_cost", "must be at least 1, got 0"));
        }
        if min_tokens > tokens {
            return Err(ConfigError::new(
                "min_tokens",
                format!("must be at most tokens ({tokens}), got {min_tokens}"),
            ));
        }
        Ok(RetryBudget::clamp(tokens, min_tokens, error_cost))
    }

    /// Like [`new`](Self::new), but adjusts what cannot work instead of refusing it: `tokens`
    /// and `error_cost` of 0 become 1, and `min_tokens` is lowered to at most `tokens`.
    ///
    /// ```
    /// # use mail_breaker::RetryBudget;
    /// let budget = RetryBudget::clamp(100, 200, 0);
    /// assert_eq!((budget.max_tokens(), budget.min_tokens(), budget.error_cost()), (100, 100, 1));
    /// ```
    pub fn clamp(tokens: u64, min_tokens: u64, error_cost: u64) -> Self {
        let tokens = tokens.max(1);
        RetryBudget {
            max_tokens: tokens,
            min_tokens: min_tokens.min(tokens),
            error_cost: error_cost.max(1),
            tokens: AtomicU64::new(tokens),
        }
    }

    /// Whether the next retry must not be sent (the count is at or below `min_tokens`).
    pub fn throttle_retry_attempt(&self) -> bool {
        self.tokens.load(Ordering::Relaxed) <= self.min_tokens
    }

    /// Takes `error_cost` tokens for a try that failed with a retryable error.
    pub fn on_retry_failure(&self) {
        let cost = self.error_cost;
        // The closure always returns Some, so the update cannot fail.
        let _ = self
            .tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tokens| {
                Some(tokens.saturating_sub(cost))
            });
    }

    /// Gives one token back for a try that succeeded, up to the full budget.
    pub fn on_success(&self) {
        let max = self.max_tokens;
        let _ = self
            .tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tokens| {
                Some(tokens.saturating_add(1).min(max))
            });
    }

    /// The tokens left now.
    pub fn tokens(&self) -> u64 {
        self.tokens.load(Ordering::Relaxed)
    }

    /// The full budget, and the count it starts with.
    pub fn max_tokens(&self) -> u64 {
        self.max_tokens
    }

    /// At or below this count, retries stop.
    pub fn min_tokens(&self) -> u64 {
        self.min_tokens
    }

    /// The tokens a failed try costs.
    pub fn error_cost(&self) -> u64 {
        self.error_cost
    }
}

impl Default for RetryBudget {
    /// The recommended budget: 100 tokens, retries stop at 50, a failure costs 10. Five
    /// failures in a row without a success stop retries, and then ten successes for each
    /// failed retry keep them going: retries stay under about a tenth of the traffic while
    /// a provider is failing.
    ///
    /// ```
    /// # use mail_breaker::RetryBudget;
    /// let budget = RetryBudget::default();
    /// assert_eq!((budget.max_tokens(), budget.min_tokens(), budget.error_cost()), (100, 50, 10));
    /// ```
    fn default() -> Self {
        RetryBudget::clamp(100, 50, 10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(budget: &RetryBudget) -> (u64, u64, u64) {
        (
            budget.max_tokens(),
            budget.min_tokens(),
            budget.error_cost(),
        )
    }

    #[test]
    fn a_budget_keeps_the_settings_it_was_built_with() {
        let budget = RetryBudget::new(100, 40, 7).unwrap();
        assert_eq!(settings(&budget), (100, 40, 7));
        assert_eq!(budget.tokens(), 100, "a budget starts full");
    }

    #[test]
    fn settings_that_cannot_work_are_refused_naming_the_setting() {
        let setting =
            |result: Result<RetryBudget, ConfigError>| result.unwrap_err().setting().to_owned();
        assert_eq!(setting(RetryBudget::new(0, 0, 1)), "tokens");
        assert_eq!(setting(RetryBudget::new(10, 0, 0)), "error_cost");
        assert_eq!(setting(RetryBudget::new(10, 11, 1)), "min_tokens");
        assert!(
            RetryBudget::new(10, 10, 1).is_ok(),
            "min_tokens may equal tokens"
        );
    }

    #[test]
    fn clamp_turns_zeros_into_ones_and_lowers_min_tokens_to_the_budget() {
        let budget = RetryBudget::clamp(0, 5, 0);
        assert_eq!(settings(&budget), (1, 1, 1));
    }

    #[test]
    fn each_failed_try_costs_error_cost_tokens_and_never_goes_below_zero() {
        let budget = RetryBudget::new(20, 0, 7).unwrap();
        budget.on_retry_failure();
        assert_eq!(budget.tokens(), 13);
        budget.on_retry_failure();
        budget.on_retry_failure();
        assert_eq!(budget.tokens(), 0);
    }

    #[test]
    fn each_success_gives_one_token_back_up_to_the_full_budget() {
        let budget = RetryBudget::new(20, 0, 3).unwrap();
        budget.on_retry_failure();
        budget.on_success();
        assert_eq!(budget.tokens(), 18);
        for _ in 0..5 {
            budget.on_success();
        }
        assert_eq!(budget.tokens(), 20);
    }

    #[test]
    fn retries_stop_at_min_tokens_not_only_below_it() {
        let budget = RetryBudget::new(20, 14, 3).unwrap();
        budget.on_retry_failure();
        assert!(!budget.throttle_retry_attempt(), "17 tokens, above 14");
        budget.on_retry_failure();
        assert!(budget.throttle_retry_attempt(), "14 tokens, at min_tokens");
        budget.on_success();
        assert!(!budget.throttle_retry_attempt(), "15 tokens, above again");
    }

    #[test]
    fn the_default_budget_is_100_tokens_stopping_at_50_and_costing_10() {
        let budget = RetryBudget::default();
        assert_eq!(settings(&budget), (100, 50, 10));
    }
}
