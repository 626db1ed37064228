#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod adapters;
#[cfg(feature = "admin")]
pub mod admin;
pub mod breaker;
mod cascade;
pub mod config;
mod inline;
pub mod machine;
pub mod metrics;
#[cfg(feature = "smtp")]
pub mod oauth;
#[cfg(feature = "outbox")]
pub mod outbox;
mod panicked;
pub mod pool;
pub mod rate;
mod receipt;
pub mod retry;
pub mod store;
mod sync;
mod time;
mod transport;

#[cfg(feature = "mailgun")]
pub use adapters::http::mailgun::{MailgunTransport, classify_mailgun_error};
#[cfg(feature = "postmark")]
pub use adapters::http::postmark::{PostmarkTransport, classify_postmark_error};
#[cfg(feature = "resend")]
pub use adapters::http::resend::{ResendTransport, classify_resend_error};
#[cfg(feature = "sendgrid")]
pub use adapters::http::sendgrid::{SendGridTransport, classify_sendgrid_error};
pub use adapters::lettre::LettreTransport;
#[cfg(feature = "ses")]
pub use adapters::ses::{SesTransport, classify_ses_error};
#[cfg(feature = "smtp")]
pub use adapters::smtp::{SmtpBuilder, SmtpTransport, classify_smtp_error, classify_smtp_reply};
pub use breaker::{CircuitBreakerTransport, Scope, StateChange};
pub use config::ConfigError;
#[cfg(feature = "config")]
pub use config::{Mailer, MailerConfig};
pub use machine::{ErrorRate, Snapshot, State};
#[cfg(feature = "smtp")]
pub use oauth::{AccessToken, OAuthMechanism, TokenSource};
#[cfg(feature = "oauth2")]
pub use oauth::{ClientCredentials, RefreshToken};
#[cfg(feature = "outbox")]
pub use outbox::{DeadLetter, Outbox, OutboxId, OutboxStats, OutboxTransport, Worker};
pub use pool::{PoolBuilder, PoolTransport, Strategy};
pub use rate::{RateLimitBuilder, RateLimitTransport};
pub use receipt::{AcceptedTransaction, Category, Receipt, SendError};
pub use retry::{Backoff, RetryBudget, RetryBuilder, RetryTransport};
#[cfg(feature = "redis")]
pub use store::RedisStore;
pub use store::{BreakerStore, MemoryStore};
pub use time::MAX_PROVIDER_WAIT;
pub use transport::{Envelope, Message, MessageStream, ReceiptStream, Transport};
