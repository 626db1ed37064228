//! The list's rules, pure: how an address is compared, what each event asks of the list, and
//! when transient bounces suppress. No clock, no I/O: every store applies these.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::Reason;
use crate::events::{BounceKind, DeliveryEvent, EventKind};

/// Milliseconds since the Unix epoch, as the stores keep time (the outbox's unit).
pub(crate) type Millis = i64;

/// How far back transient bounces are counted: 72 hours.
pub(crate) const TRANSIENT_WINDOW: Millis = 72 * 3_600_000;

/// How many transient bounces within [`TRANSIENT_WINDOW`] suppress the address.
pub(crate) const TRANSIENT_LIMIT: u64 = 3;

/// How long transient bounces suppress: 24 hours from the last of them.
pub(crate) const TRANSIENT_HOLD: Millis = 24 * 3_600_000;

/// How long an event's id is kept: 30 days, far past the latest resend of any provider
/// (SNS retries for about an hour, Mailgun for 8 hours, SendGrid for 3 days), so that the
/// ids kept do not grow for ever.
pub(crate) const EVENT_MEMORY: Millis = 30 * 24 * 3_600_000;

/// `time` in milliseconds since the Unix epoch (0 before it, saturating far after).
pub(crate) fn millis(time: SystemTime) -> Millis {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        Millis::try_from(since.as_millis()).unwrap_or(Millis::MAX)
    })
}

/// The time `at` milliseconds after the Unix epoch (the epoch for a negative one).
pub(crate) fn time(at: Millis) -> SystemTime {
    let after = Duration::from_millis(u64::try_from(at).unwrap_or(0));
    UNIX_EPOCH.checked_add(after).unwrap_or(UNIX_EPOCH)
}

/// The key an address is kept under: the local part as written (mail servers may tell
/// `Bob@` from `bob@`, RFC 5321 §2.4) and the domain in lower case (domains have no case),
/// an internationalized domain as its punycode (`bücher.de` is `xn--bcher-kva.de`).
/// Surrounding spaces and one pair of angle brackets are dropped. `Err` says why it is no
/// address.
pub(crate) fn address_key<'a>(address: &'a str) -> Result<String, &'static str> {
    // ASCII blanks alone: a non-ASCII space (U+3000) belongs to the mailbox's name.
    let ascii_trim = |text: &'a str| text.trim_matches(|c: char| c.is_ascii_whitespace());
    let trimmed = ascii_trim(address);
    let bare = ascii_trim(
        trimmed
            .strip_prefix('<')
            .and_then(|inner| inner.strip_suffix('>'))
            .unwrap_or(trimmed),
    );
    let Some((local, domain)) = bare.rsplit_once('@') else {
        return Err("it has no @");
    };
    // The root's dot names the same domain (`example.org.` is `example.org`).
    let domain = domain.strip_suffix('.').unwrap_or(domain);
    if local.is_empty() {
        return Err("it has nothing before the @");
    }
    if domain.is_empty() {
        return Err("it has no domain after the @");
    }
    // What lettre sends to, the list reads: a quoted local part (`"john doe"@`) may hold
    // spaces and tabs, and non-ASCII characters stand anywhere; ASCII spaces and controls
    // stand nowhere else.
    let quoted = local
        .strip_prefix('"')
        .and_then(|inner| inner.strip_suffix('"'));
    let ascii_blank = |c: char| c.is_ascii_whitespace() || c.is_ascii_control();
    let blank_in_quotes = quoted.is_some_and(|inner| {
        inner
            .chars()
            .any(|c| ascii_blank(c) && c != ' ' && c != '\t')
    });
    if blank_in_quotes
        || domain.chars().any(|c| c.is_whitespace() || c.is_control())
        || (quoted.is_none() && local.chars().any(ascii_blank))
    {
        return Err("it holds a space or a control character");
    }
    if bare.len() > 320 {
        return Err("it is longer than an address can be (320 bytes)");
    }
    // `"bob.smith"@` is `bob.smith@` and `"b\ob"@` is `bob@`: a backslash in quotes stands
    // for the character after it, and quotes around what needs none are dropped; what
    // needs them is written back with a backslash before each `"` and `\` alone.
    let local = match quoted.map(unescaped) {
        Some(None) => return Err("its quoted part holds a bare quote or ends in a backslash"),
        Some(Some(inner)) if is_dot_atom(&inner) => inner,
        Some(Some(inner)) => format!("\"{}\"", inner.replace('\\', "\\\\").replace('"', "\\\"")),
        None => local.to_owned(),
    };
    Ok(format!("{local}@{}", domain_key(domain)))
}

/// The inside of a quoted local part with each quoted-pair (`\c`) read as its character;
/// `None` for a `"` that no backslash escapes, or a backslash with nothing after it (the
/// quotes do not close where they seem to).
fn unescaped(inner: &str) -> Option<String> {
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(chars.next()?),
            '"' => return None,
            c => out.push(c),
        }
    }
    Some(out)
}

/// Whether `text` is a local part that needs no quotes (RFC 5321's dot-string, with the
/// non-ASCII characters of RFC 6531): atoms of letters, digits, ``!#$%&'*+-/=?^_`{|}~``
/// and any non-ASCII character (lettre sends a non-ASCII space unquoted too), joined by
/// single dots.
fn is_dot_atom(text: &str) -> bool {
    let atom_char =
        |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-/=?^_`{|}~".contains(c) || !c.is_ascii();
    text.split('.')
        .all(|atom| !atom.is_empty() && atom.chars().all(atom_char))
}

/// A domain as one key whichever way it is written: in ASCII (an internationalized name as
/// its punycode, as providers report it), lower case. What IDNA cannot read (an address
/// literal, a name it refuses) is kept in lower case, and so is a name holding a `%`: the
/// URL parser would read `%2e` as a dot, which no mail server does.
fn domain_key(domain: &str) -> String {
    if domain.contains('%') {
        return domain.to_lowercase();
    }
    match url::Host::parse(domain) {
        Ok(url::Host::Domain(ascii)) => ascii,
        _ => domain.to_lowercase(),
    }
}

/// What one event asks of the list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Suppress the address for good, with this reason: a permanent bounce, a complaint.
    Suppress(Reason),
    /// Count a transient bounce; [`TRANSIENT_LIMIT`] within [`TRANSIENT_WINDOW`] suppress
    /// for [`TRANSIENT_HOLD`]. An undetermined bounce counts as one: it may be either, and a
    /// count suppresses only for a while.
    CountTransient,
    /// Nothing but keeping the event's id (deliveries, opens, a recipient that is no address).
    Nothing,
}

/// What `kind` asks of the list.
pub(crate) fn change_of(kind: &EventKind) -> Change {
    match kind {
        EventKind::Bounced {
            bounce: BounceKind::Permanent,
            ..
        } => Change::Suppress(Reason::Bounced),
        EventKind::Complained { .. } => Change::Suppress(Reason::Complained),
        EventKind::Bounced {
            bounce: BounceKind::Transient | BounceKind::Undetermined,
            ..
        } => Change::CountTransient,
        _ => Change::Nothing,
    }
}

/// One event as a store applies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Planned {
    pub provider: &'static str,
    pub event_id: String,
    /// The recipient's key ([`address_key`]), or as written when it is no address.
    pub recipient: String,
    /// When the provider says it happened.
    pub at: Millis,
    pub change: Change,
}

/// Each event as a store applies it. A recipient that is no address keeps its event's id
/// (the provider's report was read) and changes nothing.
pub(crate) fn plan(events: &[DeliveryEvent]) -> Vec<Planned> {
    events
        .iter()
        .map(|event| {
            let (recipient, change) = match address_key(&event.recipient) {
                Ok(key) => (key, change_of(&event.kind)),
                Err(why) => {
                    tracing::warn!(
                        provider = event.provider.as_str(),
                        event_id = %event.event_id,
                        "a delivery event's recipient is no address ({why}): its id is kept, \
                         and it suppresses nothing"
                    );
                    (event.recipient.clone(), Change::Nothing)
                }
            };
            Planned {
                provider: event.provider.as_str(),
                event_id: event.event_id.clone(),
                recipient,
                at: millis(event.at),
                change,
            }
        })
        .collect()
}

/// The end of the hold when `count` transient bounces fell within the window ending at `at`
/// (the latest one's time), `None` while they are fewer than [`TRANSIENT_LIMIT`].
pub(crate) fn transient_hold(count: u64, at: Millis) -> Option<Millis> {
    (count >= TRANSIENT_LIMIT).then(|| at.saturating_add(TRANSIENT_HOLD))
}

/// The earliest time (exclusive) a transient bounce counts toward one at `at`.
pub(crate) fn window_start(at: Millis) -> Millis {
    at.saturating_sub(TRANSIENT_WINDOW)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_domain_is_compared_without_case_and_the_local_part_as_written() {
        assert_eq!(
            address_key("Bob@Example.ORG").as_deref(),
            Ok("Bob@example.org")
        );
        assert_eq!(
            address_key(" <bob@example.org> ").as_deref(),
            Ok("bob@example.org")
        );
        assert_ne!(
            address_key("Bob@example.org"),
            address_key("bob@example.org")
        );
    }

    #[test]
    fn a_domain_in_unicode_and_the_same_domain_in_punycode_are_one_address() {
        // A provider reports the domain as it went over the wire (ASCII, punycode); the
        // application may hand the message over with the domain in Unicode.
        assert_eq!(
            address_key("bob@BÜCHER.de"),
            address_key("bob@xn--bcher-kva.de")
        );
        assert_eq!(
            address_key("bob@bücher.de").as_deref(),
            Ok("bob@xn--bcher-kva.de")
        );
    }

    #[test]
    fn a_domain_written_with_its_root_dot_is_the_same_domain() {
        // `example.org.` is `example.org` to DNS and to the receiving server.
        assert_eq!(
            address_key("bob@Example.org."),
            address_key("bob@example.org")
        );
    }

    #[test]
    fn a_quoted_local_part_may_hold_spaces_and_one_that_needs_no_quotes_is_the_bare_one() {
        assert_eq!(
            address_key("\"john doe\"@Example.org").as_deref(),
            Ok("\"john doe\"@example.org")
        );
        assert_eq!(
            address_key("\"bob.smith\"@example.org"),
            address_key("bob.smith@example.org")
        );
        assert_eq!(
            address_key("\"a@b\"@example.org").as_deref(),
            Ok("\"a@b\"@example.org")
        );
        // A backslash in quotes stands for the character after it (RFC 5322's quoted-pair).
        assert_eq!(
            address_key("\"b\\ob\"@example.org"),
            address_key("bob@example.org")
        );
        assert_eq!(
            address_key("\"a\\\"b\"@example.org").as_deref(),
            Ok("\"a\\\"b\"@example.org")
        );
        // Non-ASCII letters and symbols need no quotes (RFC 6531).
        assert_eq!(
            address_key("\"a€\"@example.org"),
            address_key("a€@example.org")
        );
        // What lettre sends to, the list reads: a tab in quotes, a non-ASCII space unquoted.
        assert_eq!(
            address_key("\"john\tdoe\"@example.org").as_deref(),
            Ok("\"john\tdoe\"@example.org")
        );
        assert_eq!(
            address_key("a\u{a0}b@example.org").as_deref(),
            Ok("a\u{a0}b@example.org")
        );
        // A quoted part that is not closed properly is no address, never another one's key.
        for text in [
            "\"john doe@example.org",
            "jo hn\"@example.org",
            "\"bob\\\"@example.org",
            "\"a\"b\"@example.org",
            "\"a\rb\"@example.org",
            "jo\thn@example.org",
        ] {
            assert!(address_key(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn a_local_part_that_begins_with_a_non_ascii_space_is_not_keyed_as_the_address_without_it() {
        // Only ASCII blanks surround an address; an ideographic space belongs to its mailbox.
        for space in ['\u{3000}', '\u{a0}', '\u{85}'] {
            let key = address_key(&format!("{space}victim@example.org"));
            assert_ne!(key, address_key("victim@example.org"), "{space:?}");
        }
    }

    #[test]
    fn a_quoted_local_part_of_non_ascii_spaces_has_the_key_of_the_same_part_unquoted() {
        // lettre sends both spellings, which name one mailbox.
        for space in ['\u{3000}', '\u{a0}', '\u{85}'] {
            assert_eq!(
                address_key(&format!("\"a{space}b\"@example.org")),
                address_key(&format!("a{space}b@example.org")),
                "{space:?}"
            );
        }
    }

    #[test]
    fn an_address_whose_domain_holds_a_non_ascii_space_is_no_address() {
        // Pasted from a spreadsheet: kept, it would be a key no recipient has.
        for text in [
            "bob@example.org\u{a0}",
            "bob@exa\u{3000}mple.org",
            "bob@example.org\u{85}",
        ] {
            assert!(address_key(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn a_domain_written_with_percent_escapes_is_not_keyed_as_the_decoded_domain() {
        // IDNA's parser of URLs reads `%2e` as a dot; no mail server does.
        assert_ne!(
            address_key("victim@gmail%2ecom"),
            address_key("victim@gmail.com")
        );
        assert_ne!(
            address_key("victim@gm%61il.com"),
            address_key("victim@gmail.com")
        );
    }

    #[test]
    fn a_text_without_a_local_part_or_a_domain_is_no_address() {
        for text in ["", "bob", "@example.org", "bob@", "b ob@example.org"] {
            assert!(address_key(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn a_permanent_bounce_and_a_complaint_suppress_and_a_transient_bounce_is_counted() {
        let bounce = |bounce| EventKind::Bounced {
            bounce,
            subtype: None,
        };
        assert_eq!(
            change_of(&bounce(BounceKind::Permanent)),
            Change::Suppress(Reason::Bounced)
        );
        assert_eq!(
            change_of(&EventKind::Complained { feedback: None }),
            Change::Suppress(Reason::Complained)
        );
        assert_eq!(
            change_of(&bounce(BounceKind::Transient)),
            Change::CountTransient
        );
        assert_eq!(change_of(&EventKind::Delivered), Change::Nothing);
    }

    #[test]
    fn three_transient_bounces_hold_the_address_for_a_day_from_the_last_and_two_do_not() {
        assert_eq!(transient_hold(2, 1_000), None);
        assert_eq!(transient_hold(3, 1_000), Some(1_000 + TRANSIENT_HOLD));
    }
}
