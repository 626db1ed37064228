#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod adapters;
pub mod breaker;
mod cascade;
pub mod config;
mod error;
mod inline;
pub mod machine;
pub mod metrics;
#[cfg(feature = "outbox")]
pub mod outbox;
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
#[cfg(feature = "config")]
pub use config::{Mailer, MailerConfig};
pub use error::ConfigError;
pub use machine::{ErrorRate, Snapshot, State};
#[cfg(feature = "outbox")]
pub use outbox::{DeadLetter, Outbox, OutboxId, OutboxStats, OutboxTransport, Worker};
pub use pool::{PoolBuilder, PoolTransport, Strategy};
pub use rate::{RateLimitBuilder, RateLimitTransport};
pub use receipt::{Category, Receipt, SendError};
pub use retry::{Backoff, RetryBudget, RetryBuilder, RetryTransport};
#[cfg(feature = "redis")]
pub use store::RedisStore;
pub use store::{BreakerStore, MemoryStore};
pub use time::MAX_PROVIDER_WAIT;
pub use transport::{Envelope, Message, MessageStream, ReceiptStream, Transport};
