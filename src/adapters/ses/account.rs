//! An SES account's standing as `GetAccount` says it: the enforcement status SES puts an
//! account under for its bounces and complaints (HEALTHY, PROBATION, SHUTDOWN), read for the
//! operator page and `mail-breaker reputation`, beside the member's reputation breaker.

use std::fmt;
use std::time::Duration;

use aws_sdk_sesv2::operation::get_account::GetAccountOutput;

use super::{SesTransport, classify_ses_error};
use crate::{Category, SendError};

/// How long [`SesTransport::account`] waits for `GetAccount`: a page or a command that shows
/// the standing must not hang on an endpoint that does not answer.
pub const ACCOUNT_TIMEOUT: Duration = Duration::from_secs(5);

/// The enforcement status SES gives an account (`EnforcementStatus` of `GetAccount`).
///
/// ```
/// use mail_breaker::SesEnforcement;
///
/// assert_eq!(SesEnforcement::from_status("PROBATION"), SesEnforcement::Probation);
/// assert_eq!(SesEnforcement::from_status("NEW_ONE").as_str(), "NEW_ONE");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SesEnforcement {
    /// Sending as usual.
    Healthy,
    /// Under review for its bounce or complaint rate: SES may shut it down if they do not
    /// fall.
    Probation,
    /// Sending stopped by SES.
    Shutdown,
    /// A status this crate does not know (or none), kept as SES said it.
    Other(String),
}

impl SesEnforcement {
    /// The status SES's word names (without regard to case); any other word is
    /// [`Other`](Self::Other).
    pub fn from_status(status: &str) -> SesEnforcement {
        if status.eq_ignore_ascii_case("HEALTHY") {
            SesEnforcement::Healthy
        } else if status.eq_ignore_ascii_case("PROBATION") {
            SesEnforcement::Probation
        } else if status.eq_ignore_ascii_case("SHUTDOWN") {
            SesEnforcement::Shutdown
        } else {
            SesEnforcement::Other(status.to_owned())
        }
    }

    /// SES's word for it: `HEALTHY`, `PROBATION`, `SHUTDOWN`, or the other word as said.
    pub fn as_str(&self) -> &str {
        match self {
            SesEnforcement::Healthy => "HEALTHY",
            SesEnforcement::Probation => "PROBATION",
            SesEnforcement::Shutdown => "SHUTDOWN",
            SesEnforcement::Other(status) => status,
        }
    }
}

impl fmt::Display for SesEnforcement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What `GetAccount` says of an SES account's standing.
///
/// ```
/// use mail_breaker::{SesAccount, SesEnforcement};
///
/// let account = SesAccount {
///     enforcement: SesEnforcement::Probation,
///     sending_enabled: true,
///     production_access: true,
/// };
/// assert_eq!(account.enforcement.as_str(), "PROBATION");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SesAccount {
    /// The enforcement status.
    pub enforcement: SesEnforcement,
    /// Whether the account may send now (`SendingEnabled`).
    pub sending_enabled: bool,
    /// Whether it is out of the sandbox (`ProductionAccessEnabled`).
    pub production_access: bool,
}

impl SesAccount {
    fn of(output: &GetAccountOutput) -> SesAccount {
        SesAccount {
            enforcement: SesEnforcement::from_status(
                output.enforcement_status.as_deref().unwrap_or(""),
            ),
            sending_enabled: output.sending_enabled,
            production_access: output.production_access_enabled,
        }
    }
}

impl SesTransport {
    /// The account's standing, read with `GetAccount` through this transport's client
    /// (its credentials, endpoint and signing), waiting at most [`ACCOUNT_TIMEOUT`]. An
    /// answer that does not come, or cannot be read, is an error sorted as a send's would
    /// be (`ses.timeout`, `ses.AccessDeniedException`, ...), never a panic.
    ///
    /// ```no_run
    /// # async fn run(ses: mail_breaker::SesTransport) {
    /// match ses.account().await {
    ///     Ok(account) => println!("{}: {}", ses.client().config().region().map_or("", |r| r.as_ref()), account.enforcement),
    ///     Err(error) => println!("unknown: {}", error.message()),
    /// }
    /// # }
    /// ```
    pub async fn account(&self) -> Result<SesAccount, SendError> {
        self.account_within(ACCOUNT_TIMEOUT).await
    }

    /// [`account`](Self::account), waiting at most `timeout` (and no longer than the
    /// client's own operation timeout).
    ///
    /// ```no_run
    /// # async fn run(ses: mail_breaker::SesTransport) -> Result<(), mail_breaker::SendError> {
    /// let account = ses.account_within(std::time::Duration::from_secs(2)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn account_within(&self, timeout: Duration) -> Result<SesAccount, SendError> {
        let call = self.client.get_account().send();
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(output)) => Ok(SesAccount::of(&output)),
            Ok(Err(error)) => Err(classify_ses_error(&error).with_transport(&self.name)),
            Err(_) => Err(SendError::new(
                Category::Timeout,
                "ses.timeout",
                format!(
                    "SES did not answer GetAccount within {} ms",
                    timeout.as_millis()
                ),
            )
            .with_transport(&self.name)),
        }
    }
}
