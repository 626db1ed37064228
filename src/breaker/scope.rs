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
    ///
    /// A domain already in lower case (nearly all are) is borrowed from the envelope, and a
    /// message to one domain has one key: a send to a tracked domain allocates nothing.
    pub(crate) fn keys<'a>(&self, transport: &'a str, envelope: &'a Envelope) -> Keys<'a> {
        match self {
            Scope::Transport => Keys::One(Cow::Borrowed(transport)),
            Scope::Custom(key_of) => Keys::One(Cow::Owned(key_of(envelope))),
            Scope::RecipientDomain => match envelope.to() {
                [one] => Keys::One(lower_case(one.domain())),
                many => {
                    let mut domains: Vec<Cow<'a, str>> = many
                        .iter()
                        .map(|address| lower_case(address.domain()))
                        .collect();
                    // Always acquired in one order, as locks are: two messages to the same
                    // domains in half-open never each hold one probe the other needs.
                    domains.sort_unstable();
                    domains.dedup();
                    match domains.len() {
                        1 => Keys::One(domains.swap_remove(0)),
                        _ => Keys::Many(domains),
                    }
                }
            },
        }
    }
}

/// `domain` in lower case, borrowed when it already is.
fn lower_case(domain: &str) -> Cow<'_, str> {
    // One pass without a branch per byte: a byte past ASCII or an upper-case letter needs
    // the lower-cased copy.
    let needs_copy = domain.bytes().fold(false, |needs, byte| {
        needs | matches!(byte, b'A'..=b'Z' | 0x80..=0xFF)
    });
    if !needs_copy {
        Cow::Borrowed(domain)
    } else {
        Cow::Owned(domain.to_lowercase())
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
    Many(Vec<Cow<'a, str>>),
}

impl Keys<'_> {
    /// The same keys, owning what they borrowed: for a ticket that outlives its envelope.
    pub(crate) fn into_owned(self) -> Keys<'static> {
        match self {
            Keys::One(key) => Keys::One(Cow::Owned(key.into_owned())),
            Keys::Many(keys) => Keys::Many(
                keys.into_iter()
                    .map(|key| Cow::Owned(key.into_owned()))
                    .collect(),
            ),
        }
    }
}
