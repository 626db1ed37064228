//! Idempotency keys that belong to one send (DESIGN §21).
//!
//! A provider that honours an idempotency key (Resend's `Idempotency-Key`, kept 24 hours)
//! answers a request whose key it has seen with the first request's answer and sends nothing
//! again. So a key must be the same for every try of one message (the retry's second try,
//! the outbox's resend after a maybe-delivered answer), and never the same for two messages.
//! A key made from the message's bytes fails the second rule: the same alert sent twice in
//! one second differs only in its `Date:` and shares a key, and the second is answered as
//! delivered and dropped.
//!
//! So the key is made **once, when the application hands the message over**, and each try
//! derives its own from it:
//!
//! - **The handover.** The outermost of the crate's layers that a send passes through (a
//!   [`RetryTransport`](crate::RetryTransport), a [`PoolTransport`](crate::PoolTransport),
//!   [`OutboxTransport`](crate::OutboxTransport), an HTTP transport called alone) opens the
//!   handover; the layers inside it find it open and share it. Its key is made the first time
//!   a try asks for it: a send through providers that take no key makes none.
//! - **The outbox keeps it.** [`Outbox::enqueue`](crate::Outbox::enqueue) makes a key for each
//!   message (or takes the open handover's, as `send_or_queue` does when it queues a message
//!   its first try did not deliver), keeps it with the row, and the worker sends every
//!   attempt of that row, in any process, under it.
//! - **Each try's key** ([`try_key`]) is the message's Message-ID when it has one (two calls
//!   with the same Message-ID are one message, and share a key), else the handover's key,
//!   followed by a hash of the sorted recipients the try addresses: a resend to the
//!   recipients a first try deferred is another request with another body, which Resend
//!   would refuse under the first try's key (`409`).
//! - **Your own key** ([`with_key`]): a job queue of your own that retries a send (an
//!   apalis job, a message consumer) passes its job's id, so that its retries share a key
//!   too.
//!
//! A stream of messages ([`Transport::send_many`](crate::Transport::send_many)) cannot carry
//! a key from one try of a message to the next: a later try of a streamed message (a retry's
//! next attempt, a pool's next member) has a key of its own unless the message has a
//! Message-ID. Give messages you stream through a retry a Message-ID (lettre's
//! `.message_id(None)` makes one).

use std::cell::OnceCell;
use std::future::Future;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::Envelope;

tokio::task_local! {
    static HANDOVER: Handover;
}

/// The key of one handover, made when a try first asks for it.
struct Handover {
    key: OnceCell<String>,
}

/// The longest key part kept as it is: with the recipients' hash, a try's key stays within
/// Resend's 256 characters.
const MAX_PART_CHARS: usize = 200;

/// Runs `send` with `key` as the key of the message it sends, in place of one made for it:
/// the key of a job queue of your own, so that the job's retries, in any process, share it.
/// Each try's key is still [`try_key`]'s: the Message-ID, when the message has one, comes
/// first, and the recipients' hash follows. A key longer than 200 characters, or holding
/// anything but visible ASCII, is shortened to its visible ASCII and a hash of the whole.
///
/// ```
/// use mail_breaker::idempotency;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let envelope = lettre::address::Envelope::new(
///     Some("app@example.com".parse().unwrap()),
///     vec!["user@example.org".parse().unwrap()],
/// ).unwrap();
/// let first = idempotency::with_key("job-42", async { idempotency::try_key(&envelope, None) }).await;
/// let again = idempotency::with_key("job-42", async { idempotency::try_key(&envelope, None) }).await;
/// assert_eq!(first, again);
/// assert!(first.starts_with("job-42."));
/// # });
/// ```
pub async fn with_key<F: Future>(key: impl AsRef<str>, send: F) -> F::Output {
    let handover = Handover {
        key: OnceCell::from(key_part(key.as_ref())),
    };
    HANDOVER.scope(handover, send).await
}

/// Runs `send` inside a handover: the open one if a layer outside opened it, else a new one
/// whose key is made when a try first asks for it.
pub(crate) async fn handover<F: Future>(send: F) -> F::Output {
    if HANDOVER.try_with(|_| ()).is_ok() {
        send.await
    } else {
        let handover = Handover {
            key: OnceCell::new(),
        };
        HANDOVER.scope(handover, send).await
    }
}

/// The open handover's key (made now if no try asked for it yet), or `None` outside a
/// handover: what the outbox keeps with a message `send_or_queue` queues.
#[cfg_attr(not(feature = "outbox"), allow(dead_code))]
pub(crate) fn current() -> Option<String> {
    HANDOVER
        .try_with(|handover| handover.key.get_or_init(fresh).clone())
        .ok()
}

/// The key of one try to `envelope`'s recipients, for a provider that honours idempotency
/// keys: `message_id` (the message's Message-ID, angle brackets and all, if it has one), or
/// the handover's key, then `.` and a hash of the sorted recipients. Outside any handover
/// (a transport of your own called directly) a key is made for this try alone. At most 217
/// characters of visible ASCII.
///
/// ```
/// use mail_breaker::idempotency::try_key;
///
/// let to = |who: &[&str]| {
///     lettre::address::Envelope::new(None, who.iter().map(|a| a.parse().unwrap()).collect())
///         .unwrap()
/// };
/// let id = Some("<welcome.42@example.com>");
/// // The recipients' order does not matter; who they are does.
/// assert_eq!(try_key(&to(&["a@x.org", "b@x.org"]), id), try_key(&to(&["b@x.org", "a@x.org"]), id));
/// assert_ne!(try_key(&to(&["a@x.org", "b@x.org"]), id), try_key(&to(&["b@x.org"]), id));
/// assert!(try_key(&to(&["a@x.org"]), id).starts_with("welcome.42@example.com."));
/// // Without a Message-ID, outside a handover: a key of its own each time.
/// assert_ne!(try_key(&to(&["a@x.org"]), None), try_key(&to(&["a@x.org"]), None));
/// ```
pub fn try_key(envelope: &Envelope, message_id: Option<&str>) -> String {
    let id = message_id
        .map(|id| id.trim_matches(['<', '>', ' ', '\t']))
        .filter(|id| !id.is_empty());
    let base = match id {
        Some(id) => key_part(id),
        None => HANDOVER
            .try_with(|handover| handover.key.get_or_init(fresh).clone())
            .unwrap_or_else(|_| fresh()),
    };
    let mut recipients: Vec<&str> = envelope.to().iter().map(AsRef::as_ref).collect();
    recipients.sort_unstable();
    recipients.dedup();
    format!("{base}.{:016x}", fnv1a(recipients.join("\n").as_bytes()))
}

/// A new key: 128 bits no other handover, in this process or another, makes. std's
/// `RandomState` is seeded from the operating system's randomness once per thread and
/// differs at every call; a counter and the clock make two calls' inputs differ too.
pub(crate) fn fresh() -> String {
    static MADE: AtomicU64 = AtomicU64::new(0);
    let made = MADE.fetch_add(1, Ordering::Relaxed);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    let input = (made, now, std::process::id());
    let high = std::collections::hash_map::RandomState::new().hash_one(input);
    let low = std::collections::hash_map::RandomState::new().hash_one(input);
    format!("mb-{high:016x}{low:016x}")
}

/// `part` as it can stand in a key: itself when it is at most [`MAX_PART_CHARS`] of visible
/// ASCII, else its visible ASCII cut short and a hash of the whole.
fn key_part(part: &str) -> String {
    if !part.is_empty()
        && part.len() <= MAX_PART_CHARS
        && part.bytes().all(|byte| byte.is_ascii_graphic())
    {
        return part.to_owned();
    }
    let head: String = part
        .chars()
        .filter(char::is_ascii_graphic)
        .take(MAX_PART_CHARS - 17)
        .collect();
    format!("{head}-{:016x}", fnv1a(part.as_bytes()))
}

/// The 64-bit FNV-1a hash: stable across processes and releases, unlike std's hasher, so
/// that two processes trying one message derive one key.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to(recipients: &[&str]) -> Envelope {
        let to = recipients
            .iter()
            .map(|a| a.parse().expect("an address"))
            .collect();
        Envelope::new(None, to).expect("an envelope")
    }

    #[tokio::test]
    async fn every_try_inside_one_handover_without_a_message_id_shares_its_key() {
        let (first, second) = handover(async {
            let first = try_key(&to(&["a@x.org"]), None);
            let second = handover(async { try_key(&to(&["a@x.org"]), None) }).await;
            (first, second)
        })
        .await;
        assert_eq!(first, second);
        assert!(first.starts_with("mb-"), "{first}");
    }

    #[tokio::test]
    async fn two_handovers_of_the_same_message_without_a_message_id_have_two_keys() {
        let one = handover(async { try_key(&to(&["a@x.org"]), None) }).await;
        let two = handover(async { try_key(&to(&["a@x.org"]), None) }).await;
        assert_ne!(one, two);
    }

    #[tokio::test]
    async fn the_key_the_outbox_keeps_is_the_key_the_handovers_tries_used() {
        let (tried, kept) = handover(async {
            let tried = try_key(&to(&["a@x.org"]), None);
            (tried, current().expect("a handover is open"))
        })
        .await;
        assert!(tried.starts_with(&format!("{kept}.")), "{tried} {kept}");
        assert_eq!(current(), None);
    }

    #[tokio::test]
    async fn a_key_given_to_with_key_is_the_handovers_and_an_inner_handover_keeps_it() {
        let key = with_key("job-7", handover(async { current() })).await;
        assert_eq!(key.as_deref(), Some("job-7"));
    }

    #[test]
    fn a_message_id_is_the_key_without_its_brackets_and_a_try_to_other_recipients_differs() {
        let id = Some("<a.b@example.com>");
        let both = try_key(&to(&["b@x.org", "a@x.org"]), id);
        assert_eq!(both, try_key(&to(&["a@x.org", "b@x.org", "a@x.org"]), id));
        assert!(both.starts_with("a.b@example.com."), "{both}");
        assert_ne!(both, try_key(&to(&["a@x.org"]), id));
        assert_ne!(
            both,
            try_key(&to(&["a@x.org", "b@x.org"]), Some("<c@example.com>"))
        );
        // An empty Message-ID is none.
        assert!(try_key(&to(&["a@x.org"]), Some("<>")).starts_with("mb-"));
    }

    #[test]
    fn a_long_or_foreign_key_part_is_cut_to_visible_ascii_with_a_hash_of_the_whole() {
        assert_eq!(key_part("job-1"), "job-1");
        let exact = "x".repeat(MAX_PART_CHARS);
        assert_eq!(key_part(&exact), exact);
        let long = "x".repeat(MAX_PART_CHARS + 1);
        let cut = key_part(&long);
        assert_eq!(cut.len(), MAX_PART_CHARS);
        assert_ne!(cut, key_part(&"x".repeat(MAX_PART_CHARS + 2)));
        let foreign = key_part("jöb 1");
        assert!(foreign.starts_with("jb1-"), "{foreign}");
        assert!(key_part("").starts_with('-'));
        assert!(try_key(&to(&["a@x.org"]), Some(&format!("<{long}@example.com>"))).len() <= 217);
    }

    #[test]
    fn fresh_keys_differ_and_are_128_bits_of_hex() {
        let one = fresh();
        let two = fresh();
        assert_ne!(one, two);
        assert_eq!(one.len(), 3 + 32);
        assert!(one[3..].bytes().all(|b| b.is_ascii_hexdigit()));
    }

    #[test]
    fn the_recipients_hash_is_fnv1a() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
