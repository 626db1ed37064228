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
    if !needs_lower_casing(domain.as_bytes()) {
        Cow::Borrowed(domain)
    } else {
        Cow::Owned(domain.to_lowercase())
    }
}

/// Whether any byte is an upper-case ASCII letter or past ASCII (which lower-casing may
/// change): eight bytes at a time, without a branch per byte.
fn needs_lower_casing(bytes: &[u8]) -> bool {
    let (words, rest) = bytes.as_chunks::<8>();
    let whole = words.iter().fold(false, |needs, word| {
        needs | word_needs_lower_casing(u64::from_le_bytes(*word))
    });
    // The rest is read as one word straight from the bytes, never copied into a buffer
    // first: a word loaded over the bytes just stored into it waits for those stores. The
    // last eight bytes hold it (bytes judged twice are judged the same), or a shorter domain
    // is all rest.
    let rest = match bytes.last_chunk::<8>() {
        Some(last) => u64::from_le_bytes(*last),
        None => short_word(rest),
    };
    whole | word_needs_lower_casing(rest)
}

/// Up to seven bytes as a word that holds each of them in a byte of its own, and zero
/// bytes otherwise, which are neither letters nor past ASCII.
fn short_word(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0, |word, &byte| (word << 8) + u64::from(byte))
}

/// The rule of [`needs_lower_casing`] for eight bytes in one word. Each byte's low seven
/// bits plus a constant set its high bit exactly when they reach a bound; no sum carries
/// into the next byte (at most 0x7F + 0x3F).
fn word_needs_lower_casing(word: u64) -> bool {
    const EACH: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let low = word & !HIGH;
    let from_a = low + EACH * u64::from(0x80 - b'A');
    let past_z = low + EACH * u64::from(0x80 - b'Z' - 1);
    (from_a & !past_z | word) & HIGH != 0
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule, a byte at a time.
    fn changes_when_lower_cased(byte: u8) -> bool {
        byte.is_ascii_uppercase() || !byte.is_ascii()
    }

    #[test]
    fn every_byte_value_at_every_place_is_judged_by_the_rule() {
        for length in 1..=17 {
            for place in 0..length {
                for byte in 0..=u8::MAX {
                    let mut bytes = vec![b'a'; length];
                    bytes[place] = byte;
                    assert_eq!(
                        needs_lower_casing(&bytes),
                        changes_when_lower_cased(byte),
                        "byte {byte:#04x} at {place} of {length}"
                    );
                }
            }
        }
    }

    #[test]
    fn capitals_in_every_word_of_a_domain_are_each_enough() {
        for length in 1..=40 {
            let capitals = vec![b'A'; length];
            assert!(needs_lower_casing(&capitals), "{length} capitals");
            for (first, second) in (0..length).flat_map(|a| (0..length).map(move |b| (a, b))) {
                let mut bytes = vec![b'a'; length];
                bytes[first] = b'Q';
                bytes[second] = b'Q';
                assert!(
                    needs_lower_casing(&bytes),
                    "at {first} and {second} of {length}"
                );
            }
        }
    }

    #[test]
    fn bytes_that_need_nothing_need_nothing_whatever_their_neighbours() {
        // The bounds' neighbours side by side: no carry from one byte may reach the next.
        let near = [
            b'@', b'[', b'`', b'{', 0x7F, 0x00, b'0', b'9', b'.', b'-', b'z', b'a',
        ];
        for first in near {
            for second in near {
                let bytes = [
                    first, second, first, second, first, second, first, second, first,
                ];
                assert!(!needs_lower_casing(&bytes), "{bytes:?}");
            }
        }
        assert!(!needs_lower_casing(b""));
    }

    #[test]
    fn a_domain_in_lower_case_is_borrowed_and_one_with_capitals_is_lower_cased() {
        assert!(matches!(
            lower_case("d12345.example"),
            Cow::Borrowed("d12345.example")
        ));
        assert_eq!(lower_case("D12345.Example"), "d12345.example");
        assert_eq!(lower_case("ÉCOLE.example"), "école.example");
    }
}
