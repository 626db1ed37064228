//! Reading a formatted message back into what the JSON e-mail APIs take: sender, recipients,
//! subject, one text and one HTML body, attachments (inline ones with their content ids) and
//! the other headers. A structure those APIs cannot express is
//! [`Unsupported`](crate::Category::Unsupported), naming it, never a part silently left out:
//! a transport that takes MIME (Mailgun, SES, SMTP) can carry it, so a pool fails over.
//! Attachments keep their bytes exactly (the part with its transfer encoding undone, never
//! text decoded and encoded again) and their type is a bare `type/subtype`.
//!
//! # The structure read
//! - `text/plain` and `text/html` bodies, alone or in `multipart/alternative`;
//! - `multipart/related`: its first part is the body, the others inline resources, each of
//!   which must have a `Content-ID`;
//! - `multipart/mixed`: its first part is the body, the others attachments (any type,
//!   `message/rfc822` included); an inline part with a `Content-ID` stays inline;
//! - a part with `Content-Disposition: attachment` is an attachment wherever it is.
//!
//! Not expressible, so Unsupported: `multipart/signed`, `multipart/encrypted` and any
//! other multipart kind; a second text or HTML body; an alternative that is neither text nor
//! HTML (a `text/calendar` invitation); a related resource without a `Content-ID`; more than
//! one From address; a header given twice, for APIs whose headers are a JSON object.
//!
//! # Recipients
//! The envelope decides who gets the message. To and Cc recipients in the envelope stay To
//! and Cc; envelope recipients in neither header are Bcc. A To or Cc address that is not in
//! the envelope is Unsupported: these APIs deliver to every address they are given, so it
//! would receive a message the envelope does not send it. So is a message without a To
//! recipient in the envelope (Bcc only): every JSON API requires one.

#[cfg(any(feature = "resend", feature = "sendgrid"))]
use std::collections::BTreeMap;
use std::collections::HashSet;

use mail_parser::decoders::base64::base64_decode;
use mail_parser::decoders::quoted_printable::quoted_printable_decode;
use mail_parser::{Address, Encoding, Message, MessageParser, MessagePart, MimeHeaders, PartType};

use crate::{Category, Envelope, SendError};

/// A message read back from its MIME form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReadMessage {
    pub(crate) from: Mailbox,
    pub(crate) to: Vec<Mailbox>,
    pub(crate) cc: Vec<Mailbox>,
    pub(crate) bcc: Vec<Mailbox>,
    pub(crate) reply_to: Vec<Mailbox>,
    pub(crate) subject: Option<String>,
    pub(crate) text: Option<String>,
    pub(crate) html: Option<String>,
    pub(crate) attachments: Vec<Attachment>,
    /// Every header not expressed by a field above, in order, values unfolded.
    pub(crate) headers: Vec<(String, String)>,
    /// The Message-ID header, without its angle brackets.
    pub(crate) message_id: Option<String>,
}

/// An address with its display name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mailbox {
    pub(crate) name: Option<String>,
    pub(crate) address: String,
}

impl Mailbox {
    /// `"Name" <address>`, or the bare address: the form Postmark and Resend take.
    #[cfg(any(feature = "postmark", feature = "resend"))]
    pub(crate) fn to_header_form(&self) -> String {
        match &self.name {
            Some(name) if !name.is_empty() => {
                let escaped = name.replace('\\', "\\\\").replace('"', "\\\"");
                format!("\"{escaped}\" <{}>", self.address)
            }
            _ => self.address.clone(),
        }
    }
}

/// An attachment; with a content id it is shown inline (an image the HTML refers to).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Attachment {
    pub(crate) filename: String,
    pub(crate) content_type: String,
    pub(crate) content: Vec<u8>,
    pub(crate) content_id: Option<String>,
}

/// Headers carried by the APIs' own fields, or written anew by every provider: never passed
/// on as custom headers. `Content-*` headers are left out too (the API builds the
/// structure), and so are `DKIM-Signature` (it would not match the message the provider
/// builds, which signs it again) and `Received` (the providers refuse to take it).
const STRUCTURAL_HEADERS: &[&str] = &[
    "from",
    "to",
    "cc",
    "bcc",
    "reply-to",
    "subject",
    "date",
    "mime-version",
    "return-path",
    "dkim-signature",
    "received",
];

impl ReadMessage {
    /// Reads the formatted message `raw` sent to `envelope`'s recipients. Errors are
    /// InvalidMessage with the code `<provider>.message`.
    pub(crate) fn read(provider: &str, envelope: &Envelope, raw: &[u8]) -> Result<Self, SendError> {
        let message = MessageParser::default()
            .parse(raw)
            .ok_or_else(|| invalid(provider, "the message has no headers to read".to_owned()))?;
        let from = single_from(provider, &message)?;
        let to_header = mailboxes(message.all_to());
        let cc_header = mailboxes(message.all_cc());
        let (to, cc, bcc) = split_recipients(provider, envelope, &to_header, &cc_header)?;
        let mut body = Body::default();
        walk(provider, &message, 0, Place::Body, &mut body)?;
        Ok(ReadMessage {
            from,
            to,
            cc,
            bcc,
            reply_to: mailboxes(message.reply_to().into_iter()),
            subject: message.subject().map(str::to_owned),
            text: body.text,
            html: body.html,
            attachments: body.attachments,
            headers: custom_headers(&message),
            message_id: message.message_id().map(str::to_owned),
        })
    }

    /// The custom headers with one value per name, for APIs whose `headers` field is a JSON
    /// object; a name given twice (in any case) is Unsupported, since the object cannot
    /// hold both.
    #[cfg(any(feature = "resend", feature = "sendgrid"))]
    pub(crate) fn headers_by_name(
        &self,
        provider: &str,
    ) -> Result<BTreeMap<&str, &str>, SendError> {
        let mut headers = BTreeMap::new();
        for (name, value) in &self.headers {
            if headers
                .keys()
                .any(|known: &&str| known.eq_ignore_ascii_case(name))
            {
                return Err(unsupported(
                    provider,
                    format!(
                        "the header {name} appears more than once; {provider}'s headers field takes each name once"
                    ),
                ));
            }
            headers.insert(name.as_str(), value.as_str());
        }
        Ok(headers)
    }

    /// Unsupported unless the message has a To recipient, which every JSON API requires (a
    /// transport that takes MIME carries a Bcc-only message).
    pub(crate) fn require_to(&self, provider: &str) -> Result<(), SendError> {
        if self.to.is_empty() {
            return Err(unsupported(
                provider,
                format!(
                    "{provider} needs at least one To recipient in the envelope; this message has none"
                ),
            ));
        }
        Ok(())
    }
}

fn invalid(provider: &str, why: String) -> SendError {
    SendError::new(Category::InvalidMessage, format!("{provider}.message"), why)
}

/// This API cannot express the message, which a transport taking MIME can carry.
fn unsupported(provider: &str, why: String) -> SendError {
    SendError::new(
        Category::Unsupported,
        format!("{provider}.unsupported"),
        why,
    )
}

/// The one From address; none, or several, cannot be expressed.
fn single_from(provider: &str, message: &Message<'_>) -> Result<Mailbox, SendError> {
    let mut from = mailboxes(message.from().into_iter());
    match from.len() {
        1 => Ok(from.remove(0)),
        0 => Err(invalid(
            provider,
            "the message has no From address".to_owned(),
        )),
        n => Err(unsupported(
            provider,
            format!("the message has {n} From addresses; {provider} takes one"),
        )),
    }
}

/// Every address of the headers read, groups flattened; a name without an address (an empty
/// group's label) is no recipient and is not kept.
fn mailboxes<'a>(headers: impl Iterator<Item = &'a Address<'a>>) -> Vec<Mailbox> {
    headers
        .flat_map(|address| address.iter())
        .filter_map(|addr| {
            Some(Mailbox {
                name: addr.name().map(str::to_owned),
                address: addr.address()?.to_owned(),
            })
        })
        .collect()
}

type Recipients = (Vec<Mailbox>, Vec<Mailbox>, Vec<Mailbox>);

/// To, Cc and Bcc as the envelope decides (see the module's docs).
fn split_recipients(
    provider: &str,
    envelope: &Envelope,
    to_header: &[Mailbox],
    cc_header: &[Mailbox],
) -> Result<Recipients, SendError> {
    let in_envelope: HashSet<String> = envelope
        .to()
        .iter()
        .map(|address| address.to_string().to_lowercase())
        .collect();
    let mut placed = HashSet::new();
    let mut keep = |header: &str, list: &[Mailbox]| -> Result<Vec<Mailbox>, SendError> {
        let mut kept = Vec::new();
        for mailbox in list {
            let key = mailbox.address.to_lowercase();
            if !in_envelope.contains(&key) {
                return Err(unsupported(
                    provider,
                    format!(
                        "the {header} header names {}, which is not in the envelope; {provider} would deliver to it",
                        mailbox.address
                    ),
                ));
            }
            if placed.insert(key) {
                kept.push(mailbox.clone());
            }
        }
        Ok(kept)
    };
    let to = keep("To", to_header)?;
    let cc = keep("Cc", cc_header)?;
    let bcc = envelope
        .to()
        .iter()
        .filter(|address| placed.insert(address.to_string().to_lowercase()))
        .map(|address| Mailbox {
            name: None,
            address: address.to_string(),
        })
        .collect();
    Ok((to, cc, bcc))
}

/// Where in the structure a part sits, which decides what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// The message's body, or the first part of a mixed or related part.
    Body,
    /// One of the alternatives of the body.
    Alternative,
    /// A resource of a `multipart/related` body, shown inline.
    Related,
    /// After the first part of a `multipart/mixed`.
    Attached,
}

#[derive(Debug, Default)]
struct Body {
    text: Option<String>,
    html: Option<String>,
    attachments: Vec<Attachment>,
}

fn walk(
    provider: &str,
    message: &Message<'_>,
    id: u32,
    place: Place,
    body: &mut Body,
) -> Result<(), SendError> {
    let Some(part) = message.part(id) else {
        return Err(invalid(provider, format!("MIME part {id} is missing")));
    };
    let (ctype, subtype) = content_type(part);
    if let PartType::Multipart(children) = &part.body {
        return walk_multipart(provider, message, children, &subtype, place, body);
    }
    let disposition = part
        .content_disposition()
        .map(|d| d.ctype().to_ascii_lowercase());
    let content_id = part.content_id().map(str::to_owned);
    if disposition.as_deref() == Some("attachment") {
        body.attachments.push(attachment(
            message.raw_message(),
            part,
            &ctype,
            &subtype,
            None,
            body.attachments.len(),
        ));
        return Ok(());
    }
    let is_text = ctype == "text" && subtype == "plain";
    let is_html = ctype == "text" && subtype == "html";
    match place {
        Place::Body | Place::Alternative if is_text => {
            set_once(provider, &mut body.text, part, "text/plain")
        }
        Place::Body | Place::Alternative if is_html => {
            set_once(provider, &mut body.html, part, "text/html")
        }
        Place::Alternative => Err(unsupported(
            provider,
            format!(
                "a {ctype}/{subtype} alternative cannot be expressed by {provider}'s API, which takes text and HTML only"
            ),
        )),
        Place::Related => match content_id {
            Some(cid) => {
                let inline = attachment(
                    message.raw_message(),
                    part,
                    &ctype,
                    &subtype,
                    Some(cid),
                    body.attachments.len(),
                );
                body.attachments.push(inline);
                Ok(())
            }
            None => Err(unsupported(
                provider,
                format!(
                    "a {ctype}/{subtype} part of multipart/related has no Content-ID, so {provider}'s API cannot refer to it"
                ),
            )),
        },
        Place::Attached
            if (is_text || is_html) && content_id.is_none() && part.attachment_name().is_none() =>
        {
            Err(unsupported(
                provider,
                format!(
                    "a second {ctype}/{subtype} body (an inline part after the first of multipart/mixed) cannot be expressed by {provider}'s API"
                ),
            ))
        }
        // A body that is not text (an image alone), or a part after the first of a mixed
        // one: an attachment, inline where it has a content id to be referred to by.
        Place::Body | Place::Attached => {
            let inline = content_id.filter(|_| disposition.as_deref() == Some("inline"));
            body.attachments.push(attachment(
                message.raw_message(),
                part,
                &ctype,
                &subtype,
                inline,
                body.attachments.len(),
            ));
            Ok(())
        }
    }
}

fn walk_multipart(
    provider: &str,
    message: &Message<'_>,
    children: &[u32],
    subtype: &str,
    place: Place,
    body: &mut Body,
) -> Result<(), SendError> {
    match (subtype, place) {
        ("alternative", Place::Body | Place::Alternative) => {
            for &child in children {
                walk(provider, message, child, Place::Alternative, body)?;
            }
            Ok(())
        }
        ("related", Place::Body | Place::Alternative) => {
            let mut children = children.iter();
            if let Some(&root) = children.next() {
                walk(provider, message, root, place, body)?;
            }
            for &child in children {
                walk(provider, message, child, Place::Related, body)?;
            }
            Ok(())
        }
        ("mixed", Place::Body) => {
            let mut children = children.iter();
            if let Some(&first) = children.next() {
                walk(provider, message, first, Place::Body, body)?;
            }
            for &child in children {
                walk(provider, message, child, Place::Attached, body)?;
            }
            Ok(())
        }
        ("mixed", Place::Attached) => {
            for &child in children {
                walk(provider, message, child, Place::Attached, body)?;
            }
            Ok(())
        }
        _ => Err(unsupported(
            provider,
            format!(
                "a multipart/{subtype} part cannot be expressed by {provider}'s JSON API; send it through a transport that takes MIME (Mailgun, SES, SMTP)"
            ),
        )),
    }
}

/// Stores a body, or says there is a second one.
fn set_once(
    provider: &str,
    slot: &mut Option<String>,
    part: &MessagePart<'_>,
    kind: &str,
) -> Result<(), SendError> {
    if slot.is_some() {
        return Err(unsupported(
            provider,
            format!("the message has more than one {kind} body; {provider}'s API takes one"),
        ));
    }
    *slot = Some(String::from_utf8_lossy(part.contents()).into_owned());
    Ok(())
}

/// A part's content type, lower-cased; `text/plain` where it has none (RFC 2045's default).
fn content_type(part: &MessagePart<'_>) -> (String, String) {
    match part.content_type() {
        Some(ct) => (
            ct.ctype().to_ascii_lowercase(),
            ct.subtype().unwrap_or("").to_ascii_lowercase(),
        ),
        None => ("text".to_owned(), "plain".to_owned()),
    }
}

/// A part as an attachment: its bytes (see [`transfer_decoded`]), its file name (or a
/// made-up one: every API requires one), and its bare `type/subtype` (SendGrid refuses a type
/// with parameters).
fn attachment(
    raw: &[u8],
    part: &MessagePart<'_>,
    ctype: &str,
    subtype: &str,
    content_id: Option<String>,
    index: usize,
) -> Attachment {
    let content_type = if subtype.is_empty() {
        "application/octet-stream".to_owned()
    } else {
        format!("{ctype}/{subtype}")
    };
    let filename = match part.attachment_name() {
        Some(name) if !name.is_empty() => name.to_owned(),
        _ if ctype == "message" => format!("message-{}.eml", index + 1),
        _ => format!("attachment-{}", index + 1),
    };
    Attachment {
        filename,
        content_type,
        content: transfer_decoded(raw, part),
        content_id,
    }
}

/// A part's bytes as its sender wrote them: the body in the formatted message `raw` with its
/// transfer encoding undone. mail-parser decodes `text/*` parts into UTF-8 text (a Latin-1
/// byte becomes U+FFFD, a charset is transcoded), so for those the bytes are read again from
/// `raw`; other parts mail-parser keeps as bytes already.
fn transfer_decoded(raw: &[u8], part: &MessagePart<'_>) -> Vec<u8> {
    if !matches!(part.body, PartType::Text(_) | PartType::Html(_)) {
        return part.contents().to_vec();
    }
    let start = part.raw_body_offset() as usize;
    let end = part.raw_end_offset() as usize;
    let Some(body) = raw.get(start..end) else {
        return part.contents().to_vec();
    };
    let decoded = match part.encoding {
        Encoding::Base64 => base64_decode(body),
        Encoding::QuotedPrintable => quoted_printable_decode(body),
        Encoding::None => Some(body.to_vec()),
    };
    decoded.unwrap_or_else(|| part.contents().to_vec())
}

/// The headers not carried by the APIs' own fields, in order, each value unfolded.
fn custom_headers(message: &Message<'_>) -> Vec<(String, String)> {
    message
        .headers_raw()
        .filter(|(name, _)| {
            let lower = name.to_ascii_lowercase();
            !STRUCTURAL_HEADERS.contains(&lower.as_str()) && !lower.starts_with("content-")
        })
        .map(|(name, value)| (name.to_owned(), unfold(value)))
        .collect()
}

/// A raw header value on one line: folding line breaks removed, ends trimmed.
fn unfold(value: &str) -> String {
    value
        .split(['\r', '\n'])
        .map(str::trim)
        .filter(|piece| !piece.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use lettre::message::header::ContentType;
    use lettre::message::{Attachment as LettreAttachment, MultiPart, SinglePart};

    use super::*;
    use crate::Message as Email;

    fn read(message: &Email) -> Result<ReadMessage, SendError> {
        ReadMessage::read("test", message.envelope(), &message.formatted())
    }

    fn builder() -> lettre::message::MessageBuilder {
        Email::builder()
            .from("App <app@example.com>".parse().expect("a sender"))
            .to("Bob <bob@example.org>".parse().expect("a recipient"))
            .subject("Hello")
    }

    #[test]
    fn a_plain_message_is_read_into_its_fields() {
        let message = builder()
            .cc("carol@example.org".parse().expect("an address"))
            .bcc("dave@example.net".parse().expect("an address"))
            .reply_to("help@example.com".parse().expect("an address"))
            .header(lettre::message::header::UserAgent::from("tests".to_owned()))
            .message_id(Some("<m1@example.com>".to_owned()))
            .body("hi there".to_owned())
            .expect("a message");
        let read = read(&message).expect("readable");
        assert_eq!(read.from.address, "app@example.com");
        assert_eq!(read.from.name.as_deref(), Some("App"));
        assert_eq!(read.to[0].address, "bob@example.org");
        assert_eq!(read.cc[0].address, "carol@example.org");
        assert_eq!(read.bcc[0].address, "dave@example.net");
        assert_eq!(read.reply_to[0].address, "help@example.com");
        assert_eq!(read.subject.as_deref(), Some("Hello"));
        assert_eq!(read.text.as_deref().map(str::trim_end), Some("hi there"));
        assert_eq!(read.html, None);
        assert!(
            read.headers
                .iter()
                .any(|(name, value)| name == "User-Agent" && value == "tests")
        );
        assert!(read.headers.iter().any(|(name, _)| name == "Message-ID"));
        assert!(
            !read
                .headers
                .iter()
                .any(|(name, _)| name.eq_ignore_ascii_case("subject"))
        );
        assert_eq!(read.message_id.as_deref(), Some("m1@example.com"));
    }

    #[test]
    fn alternative_related_and_mixed_parts_become_bodies_and_attachments() {
        let body = MultiPart::mixed()
            .multipart(
                MultiPart::alternative()
                    .singlepart(SinglePart::plain("plain text".to_owned()))
                    .multipart(
                        MultiPart::related()
                            .singlepart(SinglePart::html("<img src=\"cid:logo\">".to_owned()))
                            .singlepart(LettreAttachment::new_inline("logo".to_owned()).body(
                                vec![1u8, 2, 3],
                                ContentType::parse("image/png").expect("a type"),
                            )),
                    ),
            )
            .singlepart(LettreAttachment::new("report.pdf".to_owned()).body(
                vec![9u8; 10],
                ContentType::parse("application/pdf").expect("a type"),
            ));
        let message = builder().multipart(body).expect("a message");
        let read = read(&message).expect("readable");
        assert_eq!(read.text.as_deref(), Some("plain text"));
        assert_eq!(read.html.as_deref(), Some("<img src=\"cid:logo\">"));
        assert_eq!(read.attachments.len(), 2);
        let logo = &read.attachments[0];
        assert_eq!(logo.content_id.as_deref(), Some("logo"));
        assert_eq!(logo.content, vec![1, 2, 3]);
        assert_eq!(logo.content_type, "image/png");
        let report = &read.attachments[1];
        assert_eq!(report.filename, "report.pdf");
        assert_eq!(report.content_id, None);
        assert_eq!(report.content, vec![9; 10]);
    }

    #[test]
    fn a_header_recipient_outside_the_envelope_is_unsupported() {
        let envelope = Envelope::new(
            Some("app@example.com".parse().expect("an address")),
            vec!["bob@example.org".parse().expect("an address")],
        )
        .expect("an envelope");
        let message = builder()
            .cc("carol@example.org".parse().expect("an address"))
            .envelope(envelope)
            .body("hi".to_owned())
            .expect("a message");
        let error = read(&message).expect_err("carol is not in the envelope");
        assert_eq!(error.category(), Category::Unsupported);
        assert_eq!(error.code(), "test.unsupported");
        assert!(error.to_string().contains("Cc header"));
        assert!(!error.to_string().contains("carol@"));
    }

    #[test]
    fn a_signed_message_is_unsupported_naming_the_structure() {
        let raw = b"From: a@example.com\r\nTo: b@example.org\r\nSubject: s\r\nMIME-Version: 1.0\r\n\
Content-Type: multipart/signed; boundary=\"XX\"; protocol=\"application/pgp-signature\"\r\n\r\n\
--XX\r\nContent-Type: text/plain\r\n\r\nhello\r\n--XX\r\nContent-Type: application/pgp-signature\r\n\r\nsig\r\n--XX--\r\n";
        let envelope = Envelope::new(None, vec!["b@example.org".parse().expect("an address")])
            .expect("an envelope");
        let error =
            ReadMessage::read("test", &envelope, raw).expect_err("signed is not expressible");
        assert_eq!(error.category(), Category::Unsupported);
        assert!(error.message().contains("multipart/signed"), "{error}");
    }

    #[test]
    fn a_calendar_alternative_is_unsupported_naming_it() {
        let body = MultiPart::alternative()
            .singlepart(SinglePart::plain("invite".to_owned()))
            .singlepart(
                SinglePart::builder()
                    .header(ContentType::parse("text/calendar; method=REQUEST").expect("a type"))
                    .body("BEGIN:VCALENDAR".to_owned()),
            );
        let message = builder().multipart(body).expect("a message");
        let error = read(&message).expect_err("calendar is not expressible");
        assert_eq!(error.category(), Category::Unsupported);
        assert!(error.message().contains("text/calendar"), "{error}");
    }

    #[test]
    #[cfg(any(feature = "resend", feature = "sendgrid"))]
    fn a_header_given_twice_cannot_be_a_json_object() {
        let raw =
            b"From: a@example.com\r\nTo: b@example.org\r\nX-Tag: one\r\nx-tag: two\r\n\r\nhi\r\n";
        let envelope = Envelope::new(None, vec!["b@example.org".parse().expect("an address")])
            .expect("an envelope");
        let read = ReadMessage::read("test", &envelope, raw).expect("readable");
        let error = read.headers_by_name("test").expect_err("X-Tag twice");
        assert_eq!(error.category(), Category::Unsupported);
        assert!(
            error.message().to_ascii_lowercase().contains("x-tag"),
            "{error}"
        );
    }

    fn raw_read(raw: &[u8]) -> Result<ReadMessage, SendError> {
        let envelope = Envelope::new(None, vec!["b@example.org".parse().expect("an address")])
            .expect("an envelope");
        ReadMessage::read("test", &envelope, raw)
    }

    /// A mixed message whose second part is `part` (its headers and body).
    fn mixed_with(part: &str) -> Vec<u8> {
        format!(
            "From: a@example.com\r\nTo: b@example.org\r\nMIME-Version: 1.0\r\n\
Content-Type: multipart/mixed; boundary=\"B\"\r\n\r\n--B\r\nContent-Type: text/plain\r\n\r\nbody\r\n\
--B\r\n{part}\r\n--B--\r\n"
        )
        .into_bytes()
    }

    #[test]
    fn a_text_attachment_keeps_its_bytes_in_every_transfer_encoding() {
        let cases = [
            ("quoted-printable", "caf=E9;prix\r\nx=\r\ny"),
            ("base64", "Y2Fm6Ttwcml4DQp4eQ=="),
            ("8bit", "caf\u{e9};prix\r\nxy"),
        ];
        for (encoding, body) in cases {
            let mut raw = mixed_with(&format!(
                "Content-Type: text/csv; charset=iso-8859-1\r\nContent-Transfer-Encoding: {encoding}\r\n\
Content-Disposition: attachment; filename=\"p.csv\"\r\n\r\n{body}"
            ));
            if encoding == "8bit" {
                // The é as one Latin-1 byte, not UTF-8.
                let text = String::from_utf8(raw).expect("utf-8");
                raw = text.replace('\u{e9}', "\u{1}").into_bytes();
                let at = raw.iter().position(|&b| b == 1).expect("the marker");
                raw[at] = 0xe9;
            }
            let read = raw_read(&raw).expect("readable");
            let csv = &read.attachments[0];
            assert_eq!(csv.content, b"caf\xe9;prix\r\nxy", "{encoding}");
            assert_eq!(csv.content_type, "text/csv", "{encoding}");
            assert_eq!(csv.filename, "p.csv");
        }
    }

    #[test]
    fn a_second_body_and_a_related_part_without_content_id_are_unsupported() {
        let second = raw_read(&mixed_with("Content-Type: text/plain\r\n\r\nagain"))
            .expect_err("a second body");
        assert_eq!(second.category(), Category::Unsupported);
        let related = b"From: a@example.com\r\nTo: b@example.org\r\nMIME-Version: 1.0\r\n\
Content-Type: multipart/related; boundary=\"R\"\r\n\r\n--R\r\nContent-Type: text/html\r\n\r\n<p>hi</p>\r\n\
--R\r\nContent-Type: image/png\r\n\r\npng\r\n--R--\r\n";
        let error = raw_read(related).expect_err("no Content-ID");
        assert_eq!(error.category(), Category::Unsupported);
        assert_eq!(error.code(), "test.unsupported");
    }

    #[test]
    fn a_named_text_part_after_the_first_is_an_attachment_not_a_second_body() {
        let read = raw_read(&mixed_with(
            "Content-Type: text/plain; name=\"notes.txt\"\r\n\r\nnotes",
        ))
        .expect("a named part is an attachment");
        assert_eq!(read.attachments.len(), 1);
        assert_eq!(read.attachments[0].filename, "notes.txt");
        assert_eq!(read.attachments[0].content, b"notes");
        let inline = raw_read(&mixed_with(
            "Content-Type: text/html\r\nContent-ID: <part1>\r\nContent-Disposition: inline\r\n\r\n<p>x</p>",
        ))
        .expect("an HTML part with a Content-ID is inline");
        assert_eq!(inline.attachments[0].content_id.as_deref(), Some("part1"));
    }

    #[test]
    fn a_mixed_part_inside_a_mixed_message_gives_its_attachments() {
        let read = raw_read(&mixed_with(
            "Content-Type: multipart/mixed; boundary=\"N\"\r\n\r\n--N\r\n\
Content-Type: application/pdf\r\nContent-Disposition: attachment; filename=\"a.pdf\"\r\n\r\npdf\r\n--N--",
        ))
        .expect("a nested mixed part is read");
        assert_eq!(read.attachments.len(), 1);
        assert_eq!(read.attachments[0].filename, "a.pdf");
    }

    #[test]
    fn an_attachment_without_a_file_name_gets_one() {
        let name_of = |part: &str| {
            raw_read(&mixed_with(part)).expect("readable").attachments[0]
                .filename
                .clone()
        };
        assert_eq!(
            name_of(
                "Content-Type: application/octet-stream\r\nContent-Disposition: attachment\r\n\r\nbin"
            ),
            "attachment-1"
        );
        assert_eq!(
            name_of(
                "Content-Type: application/octet-stream\r\nContent-Disposition: attachment; filename=\"\"\r\n\r\nbin"
            ),
            "attachment-1"
        );
        assert_eq!(
            name_of(
                "Content-Type: message/rfc822\r\nContent-Disposition: attachment\r\n\r\nFrom: x@example.com\r\n\r\nhi"
            ),
            "message-1.eml"
        );
    }

    #[test]
    fn a_message_without_a_to_recipient_is_unsupported() {
        let raw = b"From: a@example.com\r\nBcc: b@example.org\r\n\r\nhi\r\n";
        let read = raw_read(raw).expect("readable");
        let error = read.require_to("test").expect_err("Bcc only");
        assert_eq!(error.category(), Category::Unsupported);
    }

    #[test]
    fn a_message_without_headers_is_invalid() {
        let envelope = Envelope::new(None, vec!["b@example.org".parse().expect("an address")])
            .expect("an envelope");
        let error = ReadMessage::read("test", &envelope, b"").expect_err("nothing to read");
        assert_eq!(error.category(), Category::InvalidMessage);
    }

    #[test]
    fn folded_headers_are_unfolded() {
        assert_eq!(unfold(" a\r\n b \r\n"), "a b");
    }

    #[test]
    #[cfg(any(feature = "postmark", feature = "resend"))]
    fn names_are_quoted_in_header_form() {
        let mailbox = Mailbox {
            name: Some("Doe, \"J\"".to_owned()),
            address: "j@example.org".to_owned(),
        };
        assert_eq!(
            mailbox.to_header_form(),
            "\"Doe, \\\"J\\\"\" <j@example.org>"
        );
        let unnamed = Mailbox {
            name: Some(String::new()),
            address: "j@example.org".to_owned(),
        };
        assert_eq!(unnamed.to_header_form(), "j@example.org");
    }
}
