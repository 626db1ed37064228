//! Configuration: [`ConfigError`], which every builder answers for a setting that cannot
//! work; and with feature `config` (on by default), the whole stack from one DSN or one TOML
//! document: [`Mailer`].
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use mail_breaker::config::Mailer;
//!
//! let mailer = Mailer::from_dsn(
//!     "retry(failover(smtp://app:${SMTP_PASSWORD}@smtp.example.com?tls=required&breaker.threshold=5 \
//!                     postmark://${POSTMARK_TOKEN}@default?rate=10/s))?attempts=4",
//! )?
//! .build()
//! .await?;
//! # Ok(())
//! # }
//! ```
//!
//! # The DSN
//! - A member is a provider's URL: `smtp://user:pass@host:587?tls=required` (and the other
//!   forms of [`SmtpTransport::from_url`](crate::SmtpTransport::from_url)), `smtps://...`,
//!   `ses://REGION` (the keys from `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`),
//!   `postmark://KEY@default`, `resend://KEY@default`, `sendgrid://KEY@default?region=eu`,
//!   `mailgun://KEY:DOMAIN@default?region=eu`, and Microsoft Graph's
//!   `graph://CLIENT_ID:${SECRET}@TENANT?sender=app@contoso.com` (feature `graph`; a
//!   member without a `rate` keeps Exchange's 30 messages a minute). A host other than
//!   `default` is the API's endpoint (`http://` on a loopback host, else `https://`).
//! - Its query also holds its own settings: `name`, `priority`, `timeout`, SMTP's connection
//!   settings, `breaker.*` and `rate` (`14/s`) or `rate.*`; the rest stays in the URL for
//!   the provider, which knows each of its options or refuses it (`?TLS=required` is an
//!   error naming `member[0].url.TLS`, never a setting ignored).
//! - An SMTP URL's own options: `tls` (`required`: STARTTLS or no send; `opportunistic`;
//!   `none`: clear text, said in words), `auth_without_tls=true` (credentials in clear text,
//!   for a trusted local relay), and `auth=xoauth2` or `auth=oauthbearer` with `oauth2.*`
//!   for OAuth 2.0 (feature `oauth2`; see [`oauth`](crate::oauth)). A URL with credentials
//!   (or `auth`) and no `tls` option means STARTTLS required; `tls=none` with credentials is
//!   an error naming `auth_without_tls` unless it is `true`. `smtps://` is TLS from the
//!   first octet and takes no `tls`.
//! - `failover(A B ...)` tries the members in order (or by `priority`), `roundrobin(A B ...)`
//!   in turn; the options after the closing parenthesis are the stack's: `at_most_once`,
//!   `retry.*`, `outbox` (a URL) and `outbox.*`, `redis` (a URL) and `redis.*`,
//!   `suppression` (a flag) and `suppression.*`, `webhooks.*`.
//! - `retry(...)` wraps a pool or a member, its options the retry's (`attempts=4`).
//!
//! # The TOML document
//! The same tree: `strategy` (`failover` or `roundrobin`), `at_most_once`, a `[[member]]`
//! for each member with its `url`, `name`, `priority`, connection settings, `breaker` and
//! `rate` (a member's `url` may hold these in its query, read as a DSN reads them; one given
//! both there and beside it is an error), and `[retry]`, `[outbox]` (with its `url`) and `[redis]` (with its `url`, or
//! `cluster`: the nodes' URLs). Any serde format gives the same tree through
//! `MailerConfig`'s `Deserialize`.
//!
//! # The settings
//! | table | settings |
//! |---|---|
//! | a member | `url`, `name`, `priority`, `timeout` (a whole send's bound, every provider); for `smtp://` and `smtps://` only: `max_connections`, `idle_timeout`, `max_messages_per_connection`, `pipelining`, `chunking` |
//! | `breaker` | `threshold` (failures in a row) or `error_rate` (`50%`) with `min_calls` and `window`; `reset`, `max_reset`, `probe_timeout`, `half_open_successes`, `slow_call`, `scope` (`transport` or `recipient_domain`), `max_keys`, `shadow` |
//! | `rate` | `per_second` (required), `burst`, `max_in_flight`, `max_wait`, `adaptive`, `min_per_second`, `shared` (one budget through `[redis]`), `fleet` (processes sharing it) |
//! | `retry` | `attempts`, `initial` and `max_delay` (exponential) or `delay` (constant), `max_elapsed`, `budget` (`true`, or `tokens`, `min_tokens`, `error_cost`), `at_most_once` |
//! | `outbox` | `url` (`sqlite:///path` or `postgres://...`), `concurrency`, `lease`, `max_age`, `poll`, `queue_only`, `at_most_once` |
//! | `redis` | `url` or `cluster`, `quorum`, `member`, `namespace`, `timeout`, `retry_interval`, `ca` (a PEM file) |
//! | `suppression` | a flag (`suppression=true`), or a table: `enabled` (true when not given), `store` (`outbox`, the default: the outbox's database; or `redis`: the stack's `[redis]`); feature `webhooks`. The list ([`crate::suppression`]) is asked before every send, as the first layer behind the outbox |
//! | `webhooks` | `body_limit` (bytes), and a table per provider: `ses` (`topics`: the SNS topics' ARNs), `postmark` (`user`, `password`), `sendgrid` (`public_key`), `mailgun` (`signing_key`), `resend` (`secret`), each with `member` (whose events these are; default the one member of that provider); feature `webhooks`. `Mailer::webhooks()` builds the receivers, which keep events in `Mailer::event_sink()` |
//!
//! Durations carry their unit: `250ms`, `30s`, `10m`, `1h`, `3d`. Numbers may be written as
//! text (a DSN's are). `${NAME}` anywhere in a value is read from the environment, after the
//! text around it is percent-decoded: a value put into a URL is taken exactly as the
//! environment holds it (a password holding `%41` stays `%41`), never decoded.
//!
//! # Errors
//! A setting out of range, of the wrong kind or unknown is a [`ConfigError`] whose
//! [`setting`](ConfigError::setting) is its path (`member[1].breaker.threshold`) and whose
//! [`reason`](ConfigError::reason) says what was expected; a DSN or TOML that does not parse
//! names `dsn` or `toml` and where. No error, and no `Debug`, shows a key or a password.

#[cfg(feature = "config")]
mod dsn;
#[cfg(feature = "config")]
mod mailer;
#[cfg(feature = "config")]
mod provider;
#[cfg(feature = "config")]
mod read;
#[cfg(all(feature = "config", feature = "smtp"))]
mod smtp_url;
#[cfg(feature = "config")]
mod tree;
#[cfg(feature = "config")]
mod webhooks;

pub use crate::error::ConfigError;
#[cfg(feature = "config")]
pub use mailer::{Mailer, MemberBreaker, MemberLimiter};
#[cfg(feature = "config")]
pub use tree::MailerConfig;
#[cfg(all(feature = "config", feature = "webhooks"))]
pub use webhooks::MailerEvents;
