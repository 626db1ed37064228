//! Configuration: [`ConfigError`], which every builder answers for a setting that cannot
//! work; and with feature `config`, a whole stack's configuration read from one DSN or one
//! TOML document ([`MailerConfig`]).

#[cfg(feature = "config")]
mod dsn;
mod error;
#[cfg(feature = "config")]
mod mailer;
#[cfg(feature = "config")]
mod provider;
#[cfg(feature = "config")]
mod read;
#[cfg(feature = "config")]
mod tree;

pub use error::ConfigError;
pub(crate) use error::{at_least_one, non_zero_duration};
#[cfg(feature = "config")]
pub use mailer::{Mailer, MemberBreaker};
#[cfg(feature = "config")]
pub use tree::MailerConfig;
