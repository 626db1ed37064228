//! [`Scope`]: which breaker a message answers to.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use crate::Envelope;

/// Which breaker a message answers to.
///
/// ```
/// use mail_breaker::Scope;
///
/// // One breaker per tenant, named by the sender's domain.
/// let by_sender = Scope::custom(|envelope| {
///     envelope.from().map(|from| from.domain().to_ascii_lowercase()).unwrap_or_default()
/// });
/// # let _ = (by_sender, Scope::Transport, Scope::RecipientDomain);
/// ```
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum Scope {
    /// One breaker for the whole transport, keyed by its name.
    #[default]
    Transport,
    /// One breaker per lower-cased recipient domain: a message is held while the breaker of
    /// any of its domains is open, and its result counts for each.
    RecipientDomain,
    /// One breaker per key that the function returns for a message's envelope.
    Custom(Arc<dyn Fn(&Envelope) -> String + Send + Sync>),
}

impl Scope {
    /// A scope keyed by `key_of(envelope)`.
    pub fn custom(key_of: impl Fn(&Envelope) -> String + Send + Sync + 'static) -> Self {
        Scope::Custom(Arc::new(key_of))
    }

    /// The keys of the breakers that `envelope` answers to, without repeats, sorted.
    pub(crate) fn keys<'a>(&self, transport: &'a str, envelope: &Envelope) -> Keys<'a> {
        match self {
            Scope::Transport => Keys::One(Cow::Borrowed(transport)),
            Scope::Custom(key_of) => Keys::One(Cow::Owned(key_of(envelope))),
            Scope::RecipientDomain => {
                let mut domains: Vec<String> = envelope
                    .to()
                    .iter()
                    .map(|address| address.domain().to_lowercase())
                    .collect();
                // Always acquired in one order, as locks are: two messages to the same
                // domains in half-open never each hold one probe the other needs.
                domains.sort_unstable();
                domains.dedup();
                Keys::Many(domains)
            }
        }
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Transport => f.write_str("Transport"),
            Scope::RecipientDomain => f.write_str("RecipientDomain"),
            Scope::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

/// The keys of one message: one without allocating in the common case, or several.
#[derive(Debug)]
pub(crate) enum Keys<'a> {
    One(Cow<'a, str>),
    Many(Vec<String>),
}
