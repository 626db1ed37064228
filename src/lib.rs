//! Keep an application's e-mail flowing when its mail provider fails.
//!
//! A [`CircuitBreakerTransport`] stops sending to a provider that keeps failing, answers at
//! once while it is down, and lets exactly one probe through to learn whether it is back; a
//! [`PoolTransport`] fails over to the next provider; a [`RetryTransport`] waits as long as
//! the breaker says; a [`RateLimitTransport`] keeps to a provider's quota; an
//! [`Outbox`](crate::outbox) keeps what no provider takes now. Each is a [`Transport`], and
//! so is each provider: the crate's own [`SmtpTransport`], Amazon SES and the HTTP APIs (each
//! under its feature), any lettre transport through [`LettreTransport`]. A [`Mailer`] builds
//! the whole stack from one DSN or one TOML document.
//!
//! ```no_run
//! use mail_breaker::{Mailer, Transport};
//!
//! # async fn run(message: lettre::Message) -> Result<(), Box<dyn std::error::Error>> {
//! let mailer = Mailer::from_dsn(
//!     "retry(failover(smtp://app:${SMTP_PASSWORD}@smtp.example.com?tls=required \
//!                     smtps://app:${BACKUP_PASSWORD}@backup.example.com))?attempts=4",
//! )?
//! .build()
//! .await?;
//! mailer.send(&message).await?;
//! # Ok(())
//! # }
//! ```
//!
//! The [guide] is the user's manual, chapter by chapter, from [a first
//! stack](guide::first_stack) (two relays, one Redis, an outbox) to [the configuration
//! reference](guide::configuration) and [performance](guide::performance).
//!
//! # Layers
//!
//! The crate is built in floors, from the ground up; a module imports only from its own
//! floor and the floors below it, so each can be read, tested and changed knowing only what
//! it stands on. `tests/layers.rs` reads this table and every file of `src/`, and fails when a
//! module imports one on a floor above it, unless a comment on that line says `layers:` and
//! why. (Doc links may point anywhere.)
//!
//! In one line: core (machine, transport, receipt and error, time) → stores → the breaker's
//! shell → wrappers (pool, retry, cascade, rate) → adapters and webhooks → outbox →
//! configuration → the command and the page (bin, admin).
//!
//! | floor | modules | what stands there |
//! |---|---|---|
//! | 1. the core | `machine`, `transport`, `receipt`, `error`, `time`, `deadline`, `metrics`, `handles`, `sync`, `inline`, `panicked`, `events`, `idempotency`, `telemetry` | the breaker's state machine, the [`Transport`] trait, what providers report after a send (`events`), answers and errors ([`Receipt`], [`SendError`], [`ConfigError`] and the checks every builder makes), time arithmetic, a send's deadline and its idempotency key, the metrics' names and the handles each room keeps to record them, the spans' names |
//! | 2. the stores | `store` | where a breaker's state is kept: [`MemoryStore`], the Redis store |
//! | 3. the breaker's shell | `breaker` | [`CircuitBreakerTransport`]: asks a store before each send, tells it each answer |
//! | 4. the wrappers | `pool`, `retry`, `cascade`, `rate`, `reputation`, `tower` | transports around transports: failover and round robin, retries, rate limits, a member held back for its reputation; the breaker as a tower layer, a transport as a tower service and back |
//! | 5. the adapters | `adapters`, `oauth`, `webhooks` | the providers: SMTP, SES, the HTTP APIs, lettre's transports; OAuth 2.0 tokens for SMTP's login; the providers' webhooks, received and verified (an axum router) |
//! | 6. the outbox | `outbox`, `suppression` | mail kept in a database until a provider takes it; the addresses no mail goes to, kept in the same database (or Redis) |
//! | 7. the configuration | `config` | the whole stack from one DSN or one TOML document |
//! | 8. the command, the page and the guide | `bin`, `admin`, `guide` | what an operator runs and reads; the user's manual (text only) |
#![warn(missing_docs)]
// docs.rs (nightly, `--cfg docsrs`) marks each item with the features it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod adapters;
#[cfg(feature = "admin")]
pub mod admin;
pub mod breaker;
mod cascade;
pub mod config;
mod deadline;
mod error;
#[cfg(feature = "webhooks")]
pub mod events;
pub mod guide;
#[cfg(feature = "metrics")]
mod handles;
pub mod idempotency;
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
#[cfg(feature = "webhooks")]
pub mod reputation;
pub mod retry;
pub mod store;
#[cfg(feature = "webhooks")]
pub mod suppression;
mod sync;
pub mod telemetry;
mod time;
#[cfg(feature = "tower")]
pub mod tower;
mod transport;
#[cfg(feature = "webhooks")]
pub mod webhooks;

#[cfg(feature = "graph")]
pub use adapters::http::graph::{GraphTransport, classify_graph_error};
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
pub use adapters::ses::{SesAccount, SesEnforcement, SesTransport, classify_ses_error};
#[cfg(feature = "smtp")]
pub use adapters::smtp::{SmtpBuilder, SmtpTransport, classify_smtp_error, classify_smtp_reply};
pub use breaker::{CircuitBreakerTransport, Scope, StateChange};
#[cfg(feature = "config")]
pub use config::{Mailer, MailerConfig};
pub use error::ConfigError;
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
pub use store::{BreakerStore, MemoryStore, Reach};
pub use time::MAX_PROVIDER_WAIT;
pub use transport::{Envelope, Message, MessageStream, ReceiptStream, Transport};

/// The README's code blocks, compiled as doctests so that what the front page shows builds.
#[cfg(all(doctest, feature = "smtp", feature = "config"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
