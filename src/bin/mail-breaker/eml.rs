//! A raw message as `send` reads it: its envelope from its headers, and the bytes that leave,
//! without the fields that name its blind copies.

use std::borrow::Cow;
use std::str::FromStr;

use lettre::Address;
use mail_breaker::{Category, Envelope, SendError};
use mail_parser::HeaderName;

/// `raw` as it leaves: without its `Bcc:` and `Resent-Bcc:` fields (any case, each with the
/// lines folded into it), as lettre leaves `Bcc` out when it formats a message; the blind
/// copies are in the envelope only. The body is left as it is.
pub fn without_blind_copies(raw: &[u8]) -> Cow<'_, [u8]> {
    let mut kept = Vec::with_capacity(raw.len());
    let mut dropping = false;
    let mut dropped_any = false;
    let mut in_header = true;
    for line in raw.split_inclusive(|byte| *byte == b'\n') {
        if in_header {
            if line == b"\n" || line == b"\r\n" {
                in_header = false;
                dropping = false;
            } else if line.starts_with(b" ") || line.starts_with(b"\t") {
                // A folded line continues the field before it.
            } else {
                dropping = is_blind_copy_field(line);
            }
        }
        if dropping {
            dropped_any = true;
        } else {
            kept.extend_from_slice(line);
        }
    }
    if dropped_any {
        Cow::Owned(kept)
    } else {
        Cow::Borrowed(raw)
    }
}

/// Whether a field's first line is a `Bcc:` or `Resent-Bcc:` (RFC 5322's obsolete syntax
/// allows white space before the colon).
fn is_blind_copy_field(line: &[u8]) -> bool {
    let Some(colon) = line.iter().position(|byte| *byte == b':') else {
        return false;
    };
    let name = line[..colon].trim_ascii_end();
    name.eq_ignore_ascii_case(b"bcc") || name.eq_ignore_ascii_case(b"resent-bcc")
}

/// The envelope of a raw message: `from` or its `From` (else `Sender`), and `to` or its
/// `To`, `Cc` and `Bcc`, every such field counted. A resent message (one with `Resent-To`,
/// `Resent-Cc` or `Resent-Bcc`) goes to those instead, from its `Resent-Sender` or
/// `Resent-From` where it has one, as sendmail and Postfix read it.
pub fn envelope(
    raw: &[u8],
    from: Option<Address>,
    to: Vec<Address>,
) -> Result<Envelope, SendError> {
    let bad = |why: String| SendError::new(Category::InvalidMessage, "cli.bad_message", why);
    let parsed = mail_parser::MessageParser::default()
        .parse(raw)
        .ok_or_else(|| bad("not a message: no header could be read".to_owned()))?;
    let addresses = |names: &[HeaderName<'static>]| -> Vec<String> {
        names
            .iter()
            .flat_map(|name| parsed.header_values(name.clone()))
            .filter_map(|value| value.as_address())
            .flat_map(|list| list.iter())
            .filter_map(|addr| addr.address().map(str::to_owned))
            .collect()
    };
    let resent_to = addresses(&[
        HeaderName::ResentTo,
        HeaderName::ResentCc,
        HeaderName::ResentBcc,
    ]);
    let resent = !resent_to.is_empty();
    let from = match from {
        Some(from) => Some(from),
        None => {
            let mut senders = Vec::new();
            if resent {
                senders = addresses(&[HeaderName::ResentSender, HeaderName::ResentFrom]);
            }
            senders.extend(addresses(&[HeaderName::From, HeaderName::Sender]));
            senders
                .into_iter()
                .next()
                .map(|text| {
                    Address::from_str(&text).map_err(|e| bad(format!("sender {text:?}: {e}")))
                })
                .transpose()?
        }
    };
    let to = if !to.is_empty() {
        to
    } else {
        let all = if resent {
            resent_to
        } else {
            addresses(&[HeaderName::To, HeaderName::Cc, HeaderName::Bcc])
        };
        all.iter()
            .map(|text| {
                Address::from_str(text).map_err(|e| bad(format!("recipient {text:?}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?
    };
    if to.is_empty() {
        return Err(bad(
            "no recipient: the message has no To, Cc or Bcc (or give --to)".to_owned(),
        ));
    }
    Envelope::new(from, to).map_err(|error| bad(error.to_string()))
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use lettre::Address;
    use mail_breaker::Category;

    use super::{envelope, without_blind_copies};

    const RAW: &[u8] = b"From: App <app@example.com>\r\nTo: a@example.org\r\n\
        Cc: b@example.org\r\nBcc: c@example.org\r\nSubject: hi\r\n\r\nbody\r\n";

    fn addresses(envelope: &mail_breaker::Envelope) -> Vec<String> {
        envelope.to().iter().map(ToString::to_string).collect()
    }

    #[test]
    fn the_envelope_is_the_messages_from_and_its_to_cc_and_bcc() {
        let envelope = envelope(RAW, None, Vec::new()).unwrap();
        assert_eq!(
            envelope.from().map(ToString::to_string).as_deref(),
            Some("app@example.com")
        );
        assert_eq!(
            addresses(&envelope),
            ["a@example.org", "b@example.org", "c@example.org"]
        );
    }

    #[test]
    fn without_a_from_the_sender_is_the_envelopes_sender() {
        let raw = b"Sender: ops@example.com\r\nTo: a@example.org\r\n\r\nbody\r\n";
        let envelope = envelope(raw, None, Vec::new()).unwrap();
        assert_eq!(
            envelope.from().map(ToString::to_string).as_deref(),
            Some("ops@example.com")
        );
    }

    #[test]
    fn from_and_to_given_on_the_command_line_replace_the_headers() {
        let from = Address::from_str("bounce@example.com").unwrap();
        let to = vec![Address::from_str("only@example.net").unwrap()];
        let envelope = envelope(RAW, Some(from), to).unwrap();
        assert_eq!(
            envelope.from().map(ToString::to_string).as_deref(),
            Some("bounce@example.com")
        );
        assert_eq!(addresses(&envelope), ["only@example.net"]);
    }

    #[test]
    fn a_message_without_a_recipient_is_an_invalid_message() {
        let raw = b"From: app@example.com\r\nSubject: hi\r\n\r\nbody\r\n";
        let error = envelope(raw, None, Vec::new()).unwrap_err();
        assert_eq!(error.category(), Category::InvalidMessage);
        assert_eq!(error.code(), "cli.bad_message");
    }

    #[test]
    fn no_blind_copy_field_leaves_in_any_case_or_folding_and_the_rest_is_kept_byte_for_byte() {
        let raw = b"From: a@example.com\r\nBCC: x@example.org\r\nTo: b@example.org\r\n\
            bcc : y@example.org,\r\n z@example.org\r\n\tw@example.org\r\nResent-bcc: v@example.org\r\n\
            X-Bcc-Note: kept\r\nSubject: hi\r\n\r\nBcc: body\r\n \tfolded-looking body\r\n";
        let kept = without_blind_copies(raw);
        assert_eq!(
            String::from_utf8_lossy(&kept),
            "From: a@example.com\r\nTo: b@example.org\r\nX-Bcc-Note: kept\r\nSubject: hi\r\n\
             \r\nBcc: body\r\n \tfolded-looking body\r\n"
        );
    }

    #[test]
    fn a_message_with_bare_line_feeds_and_a_last_bcc_field_loses_it_and_keeps_its_body() {
        let raw = b"To: b@example.org\nSubject: hi\nBcc: x@example.org,\n  y@example.org\n\nbody\n";
        assert_eq!(
            &*without_blind_copies(raw),
            b"To: b@example.org\nSubject: hi\n\nbody\n",
            "the empty line after a last Bcc field still ends the header"
        );
    }

    #[test]
    fn a_message_without_blind_copies_is_sent_as_it_is() {
        let raw = b"To: b@example.org\r\nSubject: hi\r\n\r\nbody";
        assert!(matches!(
            without_blind_copies(raw),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn every_to_cc_and_bcc_field_is_in_the_envelope_not_only_the_first() {
        let raw = b"From: a@example.com\r\nTo: t1@example.org\r\nTo: t2@example.org\r\n\
            Cc: c1@example.org\r\nBcc: b1@example.org\r\nBCC: b2@example.org\r\n\r\nbody";
        let envelope = envelope(raw, None, Vec::new()).unwrap();
        let mut all = addresses(&envelope);
        all.sort();
        assert_eq!(
            all,
            [
                "b1@example.org",
                "b2@example.org",
                "c1@example.org",
                "t1@example.org",
                "t2@example.org"
            ]
        );
    }

    #[test]
    fn a_resent_message_goes_from_and_to_its_resent_fields() {
        let raw = b"Resent-From: ops@example.com\r\nResent-To: again@example.org\r\n\
            Resent-Cc: also@example.org\r\nResent-Bcc: quiet@example.org\r\n\
            From: app@example.com\r\nTo: first@example.org\r\n\r\nbody";
        let resent = envelope(raw, None, Vec::new()).unwrap();
        assert_eq!(
            resent.from().map(ToString::to_string).as_deref(),
            Some("ops@example.com")
        );
        assert_eq!(
            addresses(&resent),
            ["again@example.org", "also@example.org", "quiet@example.org"]
        );
        let sender = b"Resent-Sender: desk@example.com\r\nResent-From: ops@example.com\r\n\
            Resent-To: again@example.org\r\nFrom: app@example.com\r\n\r\nbody";
        let by_its_sender = envelope(sender, None, Vec::new()).unwrap();
        assert_eq!(
            by_its_sender.from().map(ToString::to_string).as_deref(),
            Some("desk@example.com")
        );
    }

    #[test]
    fn resent_fields_without_a_resent_recipient_leave_the_original_envelope() {
        let raw = b"Resent-From: ops@example.com\r\nFrom: app@example.com\r\n\
            To: first@example.org\r\n\r\nbody";
        let envelope = envelope(raw, None, Vec::new()).unwrap();
        assert_eq!(
            envelope.from().map(ToString::to_string).as_deref(),
            Some("app@example.com")
        );
        assert_eq!(addresses(&envelope), ["first@example.org"]);
    }
}
