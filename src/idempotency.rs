//! Idempotency keys that belong to one send (DESIGN §21).
//!
//! A provider that honours an idempotency key (Resend's `Idempotency-Key`, kept 24 hours)
//! answers a request whose key it has seen with the first request's answer and sends nothing
//! again. So a key must be the same for every try of one message (the retry's second try,
//! the pool's next member, the outbox's resend after a maybe-delivered answer), and never the
//! same for two messages. A key made from the message's bytes fails the second rule: the same
//! alert sent twice in one second differs only in its `Date:` and shares a key, and the
//! second is answered as delivered and dropped.
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
//! - **Your own key** ([`with_key`]): a job queue of your own that retries a send (an
//!   apalis job, a message consumer) passes its job's id, so that its retries share keys
//!   too, whatever Message-ID and `Date:` each run gives its messages.
//! - **Each try's key** ([`try_key`]) starts with the key given with [`with_key`], or else
//!   the message's Message-ID, or else the handover's own key; a given or made key is
//!   followed, for the second and later messages handed over under it (a job that sends or
//!   enqueues a welcome and a verification), by `~` and the message's number among them.
//!   Then come `.` and a hash of the sorted recipients the try addresses: a resend to the
//!   recipients a first try deferred is another request with another body, which Resend
//!   would refuse under the first try's key (`409`). So two calls share a key only when they
//!   send the same Message-ID to the same recipients (the application sending a message
//!   again after a maybe-delivered answer), or share a handover.
//! - **Streams.** A stream of messages
//!   ([`Transport::send_many`](crate::Transport::send_many)) through a retry or a pool has no
//!   handover per message: a message's tries there are keyed by its bytes and recipients
//!   (Message-ID, `Date:` and all), the same at every stage. Two messages of identical bytes
//!   to the same recipients in streams within 24 hours are then one message to the provider:
//!   give streamed messages a Message-ID (lettre's `.message_id(None)` makes one), or send
//!   them inside [`with_key`].
//! - **Messages an earlier version kept** in the outbox, which hold no key, are sent under
//!   the key that version gave them (the Message-ID, or a hash of the message), so that one
//!   it may have delivered is not delivered again by this one.

use std::cell::RefCell;
use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use futures::Stream;

use crate::Envelope;

tokio::task_local! {
    static HANDOVER: Handover;
}

/// What keys the tries inside one handover.
struct Handover {
    kind: Kind,
    /// The hashes of the messages handed over under this key, in the order they came: a
    /// message's number among them tells it from the others under the same key.
    messages: RefCell<Vec<u64>>,
}

enum Kind {
    /// The application's key ([`with_key`]): it wins over a Message-ID.
    Given(String),
    /// A message's Message-ID, or, for one without, a key made when a try first asks for it.
    Made(RefCell<Option<String>>),
    /// The key an outbox row keeps: what its first handover's tries were keyed by.
    Kept(String),
    /// A message of a stream: its Message-ID, or its bytes.
    Stream,
    /// An outbox row an earlier version kept: its key as that version made it.
    Earlier,
}

impl Handover {
    fn new(kind: Kind) -> Handover {
        Handover {
            kind,
            messages: RefCell::new(Vec::new()),
        }
    }

    /// The key of `raw` in this handover, before the recipients' hash.
    fn key_of(&self, message_id: Option<&str>, raw: &[u8]) -> String {
        let message_id = message_id
            .map(|id| id.trim_matches(['<', '>', ' ', '\t']))
            .filter(|id| !id.is_empty());
        match (&self.kind, message_id) {
            (Kind::Given(key), _) => self.numbered(key, raw),
            (Kind::Kept(key), _) => key.clone(),
            (Kind::Made(_) | Kind::Stream, Some(id)) => key_part(id),
            (Kind::Made(key), None) => {
                let key = key.borrow_mut().get_or_insert_with(fresh).clone();
                self.numbered(&key, raw)
            }
            (Kind::Stream, None) => bytes_key(raw),
            (Kind::Earlier, id) => earlier_key(id, raw),
        }
    }

    /// `key` for `raw`: as it is for the first message handed over under it, `key~n` for
    /// the next ones.
    fn numbered(&self, key: &str, raw: &[u8]) -> String {
        match self.number_of(raw) {
            0 => key.to_owned(),
            n => format!("{key}~{n}"),
        }
    }

    /// The number of `raw` among the messages handed over here (0 for the first).
    fn number_of(&self, raw: &[u8]) -> usize {
        let hash = fnv1a(raw);
        let mut messages = self.messages.borrow_mut();
        match messages.iter().position(|&seen| seen == hash) {
            Some(n) => n,
            None => {
                messages.push(hash);
                messages.len() - 1
            }
        }
    }
}

/// The longest key part kept as it is: with a message's number and the recipients' hash, a
/// try's key stays within Resend's 256 characters.
const MAX_PART_CHARS: usize = 200;

/// Runs `send` with `key` as the key of the messages it hands over, in place of their
/// Message-IDs or keys made for them: the key of a job queue of your own, so that the job's
/// retries, in any process, share their keys. The first message handed over inside is keyed
/// `key`, the next ones (of other bytes) `key~1`, `key~2`, in the order they come, and each
/// try adds its recipients' hash ([`try_key`]). A key longer than 200 characters, or holding anything but
/// visible ASCII, is shortened to its visible ASCII and a hash of the whole; an empty one is
/// no key: one is made, as without `with_key`.
///
/// A provider compares the request, not only the key: Resend answers a run that sends the
/// same bytes under a key it has seen with the first run's result, and refuses one that
/// sends other bytes (`resend.invalid_idempotent_request`, InvalidMessage: nothing sent,
/// the first run's delivery stands). So build the job's message the same on every run (the
/// same `Date:`, and the same Message-ID or none) for a rerun to be answered as delivered.
///
/// ```
/// use mail_breaker::idempotency;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let envelope = lettre::address::Envelope::new(
///     Some("app@example.com".parse().unwrap()),
///     vec!["user@example.org".parse().unwrap()],
/// ).unwrap();
/// let run = || idempotency::with_key("job-42", async {
///     idempotency::try_key(&envelope, None, b"Subject: welcome\r\n\r\nhello\r\n")
/// });
/// let first = run().await;
/// assert_eq!(first, run().await, "the job's next run");
/// assert!(first.starts_with("job-42."));
/// # });
/// ```
pub async fn with_key<F: Future>(key: impl AsRef<str>, send: F) -> F::Output {
    let key = key.as_ref().trim();
    let kind = if key.is_empty() {
        Kind::Made(RefCell::new(None))
    } else {
        Kind::Given(key_part(key))
    };
    HANDOVER.scope(Handover::new(kind), send).await
}

/// Runs `send` inside a handover: the open one if a layer outside opened it, else a new one
/// whose key is made when a try first asks for it.
pub(crate) async fn handover<F: Future>(send: F) -> F::Output {
    if is_open() {
        send.await
    } else {
        let handover = Handover::new(Kind::Made(RefCell::new(None)));
        HANDOVER.scope(handover, send).await
    }
}

/// Runs `send`, an outbox row's attempt, under the key the row keeps, or, for a row an
/// earlier version kept without one, under the key that version gave it.
#[cfg_attr(not(feature = "outbox"), allow(dead_code))]
pub(crate) async fn kept<F: Future>(key: Option<String>, send: F) -> F::Output {
    let kind = match key {
        Some(key) => Kind::Kept(key),
        None => Kind::Earlier,
    };
    HANDOVER.scope(Handover::new(kind), send).await
}

/// `messages`' stream with each message's tries keyed by its bytes, unless a handover is
/// open around the stream (then its key, numbered per message, serves): for a wrapper whose
/// stream sends a message again (a retry's next attempt, a pool's next member), where no
/// handover can follow one message from stage to stage.
pub(crate) fn keyed_by_bytes<S: Stream + Unpin>(stream: S) -> KeyedByBytes<S> {
    KeyedByBytes { stream }
}

/// See [`keyed_by_bytes`].
pub(crate) struct KeyedByBytes<S> {
    stream: S,
}

impl<S: Stream + Unpin> Stream for KeyedByBytes<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let stream = Pin::new(&mut self.stream);
        if is_open() {
            stream.poll_next(cx)
        } else {
            HANDOVER.sync_scope(Handover::new(Kind::Stream), || stream.poll_next(cx))
        }
    }
}

fn is_open() -> bool {
    HANDOVER.try_with(|_| ()).is_ok()
}

/// The key an outbox keeps with `raw` (whose Message-ID, if it has one, is `message_id`),
/// handed over now: what the open handover keys its tries by, or what a new handover would
/// (its Message-ID, or a new key).
#[cfg_attr(not(feature = "outbox"), allow(dead_code))]
pub(crate) fn to_keep(message_id: Option<&str>, raw: &[u8]) -> String {
    base(message_id, raw)
}

/// The open handover's key of `raw`, or a new handover's.
fn base(message_id: Option<&str>, raw: &[u8]) -> String {
    HANDOVER
        .try_with(|handover| handover.key_of(message_id, raw))
        .unwrap_or_else(|_| Handover::new(Kind::Made(RefCell::new(None))).key_of(message_id, raw))
}

/// The key of one try of the formatted message `raw` (whose Message-ID, if it has one, is
/// `message_id`) to `envelope`'s recipients, for a provider that honours idempotency keys:
/// the given key, the Message-ID or the handover's key (see the [module docs](self)), then
/// `.` and a hash of the sorted recipients. Outside any handover (a transport of your own
/// called directly), a message without a Message-ID gets a key for this try alone. At most 256 characters of visible ASCII.
///
/// ```
/// use mail_breaker::idempotency::{try_key, with_key};
///
/// let to = |who: &[&str]| {
///     lettre::address::Envelope::new(None, who.iter().map(|a| a.parse().unwrap()).collect())
///         .unwrap()
/// };
/// let raw = b"Subject: invoice\r\n\r\nyour invoice\r\n";
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let (both, swapped, one) = with_key("order-7", async {
///     (
///         try_key(&to(&["a@x.org", "b@x.org"]), None, raw),
///         try_key(&to(&["b@x.org", "a@x.org"]), None, raw),
///         try_key(&to(&["b@x.org"]), None, raw),
///     )
/// })
/// .await;
/// // The recipients' order does not matter; who they are does.
/// assert_eq!(both, swapped);
/// assert_ne!(both, one);
/// # });
/// // Outside a handover: a key of its own each time.
/// assert_ne!(try_key(&to(&["a@x.org"]), None, raw), try_key(&to(&["a@x.org"]), None, raw));
/// ```
pub fn try_key(envelope: &Envelope, message_id: Option<&str>, raw: &[u8]) -> String {
    let base = base(message_id, raw);
    if HANDOVER.try_with(|handover| matches!(handover.kind, Kind::Earlier)) == Ok(true) {
        // As the earlier version sent it: without the recipients.
        return base;
    }
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

/// A message's key from its bytes alone: a stream's.
fn bytes_key(raw: &[u8]) -> String {
    format!("raw-{:016x}-{}", fnv1a(raw), raw.len())
}

/// The key the version before keys (issue 65) gave a message: its Message-ID without angle
/// brackets (one over Resend's 256 characters, or not ASCII, cut and a hash of the whole
/// appended), or a hash of its bytes.
fn earlier_key(message_id: Option<&str>, raw: &[u8]) -> String {
    const MAX_KEY_CHARS: usize = 256;
    match message_id.map(|id| id.trim_matches(['<', '>', ' '])) {
        Some(id) if !id.is_empty() => {
            if id.chars().count() <= MAX_KEY_CHARS && id.is_ascii() {
                id.to_owned()
            } else {
                let head: String = id
                    .chars()
                    .filter(char::is_ascii)
                    .take(MAX_KEY_CHARS - 17)
                    .collect();
                format!("{head}-{:016x}", fnv1a(id.as_bytes()))
            }
        }
        _ => bytes_key(raw),
    }
}

/// `part` as it can stand in a key: itself when it is at most [`MAX_PART_CHARS`] of visible
/// ASCII, else its visible ASCII cut short and a hash of the whole.
fn key_part(part: &str) -> String {
    if part.len() <= MAX_PART_CHARS && part.bytes().all(|byte| byte.is_ascii_graphic()) {
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
    use futures::StreamExt;

    const RAW: &[u8] = b"Subject: one\r\n\r\nhello\r\n";
    const OTHER: &[u8] = b"Subject: two\r\n\r\nhello\r\n";

    fn to(recipients: &[&str]) -> Envelope {
        let to = recipients
            .iter()
            .map(|a| a.parse().expect("an address"))
            .collect();
        Envelope::new(None, to).expect("an envelope")
    }

    #[tokio::test]
    async fn every_try_inside_one_handover_shares_its_key() {
        let (first, second) = handover(async {
            let first = try_key(&to(&["a@x.org"]), None, RAW);
            let second = handover(async { try_key(&to(&["a@x.org"]), None, RAW) }).await;
            (first, second)
        })
        .await;
        assert_eq!(first, second);
        assert!(first.starts_with("mb-"), "{first}");
    }

    #[tokio::test]
    async fn two_handovers_of_the_same_message_have_two_keys() {
        let one = handover(async { try_key(&to(&["a@x.org"]), None, RAW) }).await;
        let two = handover(async { try_key(&to(&["a@x.org"]), None, RAW) }).await;
        assert_ne!(one, two);
    }

    #[tokio::test]
    async fn the_key_the_outbox_keeps_is_the_key_the_handovers_tries_used() {
        let (tried, row) = handover(async {
            let tried = try_key(&to(&["a@x.org"]), None, RAW);
            (tried, to_keep(None, RAW))
        })
        .await;
        assert!(tried.starts_with(&format!("{row}.")), "{tried} {row}");
        let later = kept(Some(row.clone()), async {
            try_key(&to(&["a@x.org"]), Some("<m@x.org>"), RAW)
        })
        .await;
        assert_eq!(later, tried, "the worker's try is the first try's");
        assert!(
            !to_keep(None, RAW).is_empty(),
            "outside a handover: a new key"
        );
        assert_ne!(to_keep(None, RAW), to_keep(None, RAW));
    }

    #[tokio::test]
    async fn a_message_id_keys_its_message_and_is_the_key_the_outbox_keeps() {
        let raw = b"Message-ID:\r\n <a.b@example.com>\r\nSubject: x\r\n\r\nMessage-ID: <body>\r\n";
        let id = Some("<a.b@example.com>");
        let (tried, row) =
            handover(async { (try_key(&to(&["a@x.org"]), id, raw), to_keep(id, raw)) }).await;
        assert_eq!(row, "a.b@example.com");
        assert!(tried.starts_with("a.b@example.com."), "{tried}");
        assert_eq!(
            tried,
            try_key(&to(&["a@x.org"]), id, raw),
            "another call: the same key"
        );
        assert_eq!(to_keep(id, raw), row);
        let streamed = kept(Some(row), async { try_key(&to(&["a@x.org"]), id, raw) }).await;
        assert_eq!(streamed, tried, "the worker's try");
    }

    #[tokio::test]
    async fn a_given_key_wins_over_the_message_id_and_an_inner_handover_keeps_it() {
        let key = with_key(
            "job-7",
            handover(async { try_key(&to(&["a@x.org"]), Some("<fresh.1@x.org>"), RAW) }),
        )
        .await;
        assert!(key.starts_with("job-7."), "{key}");
    }

    #[tokio::test]
    async fn each_other_message_under_one_given_key_is_numbered_in_the_order_it_came() {
        let keys = with_key("job-7", async {
            [
                to_keep(None, RAW),
                to_keep(None, OTHER),
                to_keep(None, RAW),
                try_key(&to(&["a@x.org"]), None, OTHER),
            ]
        })
        .await;
        assert_eq!(keys[0], "job-7");
        assert_eq!(keys[1], "job-7~1");
        assert_eq!(keys[2], "job-7", "the same message again");
        assert!(keys[3].starts_with("job-7~1."), "{}", keys[3]);
    }

    #[tokio::test]
    async fn an_empty_given_key_is_no_key() {
        let one = with_key(" ", async { to_keep(None, RAW) }).await;
        let two = with_key("", async { to_keep(None, RAW) }).await;
        assert!(one.starts_with("mb-"), "{one}");
        assert_ne!(one, two);
    }

    #[tokio::test]
    async fn a_row_an_earlier_version_kept_is_tried_under_that_versions_key() {
        let with_id = kept(None, async {
            try_key(&to(&["a@x.org"]), Some("<a.b@example.com>"), RAW)
        })
        .await;
        assert_eq!(with_id, "a.b@example.com");
        let without = kept(None, async { try_key(&to(&["a@x.org"]), None, RAW) }).await;
        assert_eq!(without, format!("raw-{:016x}-{}", fnv1a(RAW), RAW.len()));
        let long = format!("<{}@example.com>", "x".repeat(400));
        let cut = earlier_key(Some(&long), RAW);
        assert_eq!(cut.chars().count(), 256);
        assert_ne!(
            cut,
            earlier_key(Some(&format!("<{}y@x.org>", "x".repeat(400))), RAW)
        );
        assert_eq!(earlier_key(Some("<>"), RAW), bytes_key(RAW));
    }

    #[tokio::test]
    async fn a_stream_keys_each_message_by_its_bytes_unless_a_handover_is_open() {
        let keys = |raws: Vec<&'static [u8]>| {
            keyed_by_bytes(
                futures::stream::iter(raws)
                    .map(|raw| try_key(&to(&["a@x.org"]), None, raw))
                    .boxed(),
            )
            .collect::<Vec<String>>()
        };
        let streamed = keys(vec![RAW, RAW, OTHER]).await;
        assert_eq!(streamed[0], streamed[1]);
        assert_ne!(streamed[0], streamed[2]);
        assert!(streamed[0].starts_with(&bytes_key(RAW)), "{}", streamed[0]);
        let given = with_key("job-9", keys(vec![RAW, OTHER])).await;
        assert!(given[0].starts_with("job-9."), "{given:?}");
        assert!(given[1].starts_with("job-9~1."), "{given:?}");
    }

    #[test]
    fn a_try_to_other_recipients_has_another_key() {
        let first = kept(Some("k".into()), async {
            (
                try_key(&to(&["b@x.org", "a@x.org"]), None, RAW),
                try_key(&to(&["a@x.org", "b@x.org", "a@x.org"]), None, RAW),
                try_key(&to(&["a@x.org"]), None, RAW),
            )
        });
        let (both, again, one) = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
            .block_on(first);
        assert_eq!(both, again);
        assert_ne!(both, one);
        assert_eq!(
            both,
            format!("k.{:016x}", fnv1a(b"a@x.org\nb@x.org")),
            "sorted, each once"
        );
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
    fn the_hash_is_fnv1a() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
