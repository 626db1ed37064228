//! Transports for real providers: SMTP through lettre, lettre's other transports, and SES.

pub mod lettre;
#[cfg(feature = "ses")]
pub mod ses;
#[cfg(feature = "smtp")]
pub mod smtp;
