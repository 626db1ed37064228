//! Reading a server's answers: the [`Category`] of an SMTP error or reply, by the command it
//! answers, and the queue id in a `250` after the final dot.

use lettre::transport::smtp::Error as SmtpError;
use lettre::transport::smtp::response::Response;

use super::reply::{Reply, ReplyError};
use crate::receipt::SourceText;
use lettre::Address;

use crate::{AcceptedTransaction, Category, Receipt, SendError};

/// Sorts a lettre SMTP error into a [`Category`], with the code `smtp.<reply code>` for a
/// server's reply, else `smtp.timeout`, `smtp.network`, `smtp.tls`, `smtp.client` or
/// `smtp.shutdown`.
///
/// | what happened | category |
/// |---|---|
/// | timeout | Timeout |
/// | 4xx with an RFC 3463 `4.7.x` code whose text says what is limited (a rate, too many connections or messages, throttling: `450 4.7.28 rate limited`, Postfix's `421 4.7.0 Error: too many connections from ...`), or Gmail's `4.7.28`; a `421` too, but not for "too many" alone (`421 4.7.0 Error: too many errors`) | RateLimited |
/// | other 421 | ServiceUnavailable |
/// | other 4xx | ServerError |
/// | 530, 534, 535 | Authentication |
/// | 552, or `5.3.4` (too big) | InvalidMessage |
/// | other 5xx | Rejected |
/// | TLS, connection, I/O, a reply cut off or unreadable | Network |
/// | lettre's own misuse, a transport shut down | Configuration |
///
/// ```
/// use mail_breaker::{classify_smtp_error, Category};
/// # use lettre::AsyncTransport;
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// // Nothing listens on port 1.
/// let relay = lettre::AsyncSmtpTransport::<lettre::Tokio1Executor>::builder_dangerous("127.0.0.1").port(1).build();
/// let envelope = lettre::address::Envelope::new(None, vec!["a@example.org".parse().unwrap()]).unwrap();
/// let error = relay.send_raw(&envelope, b"Subject: x\r\n\r\nhi").await.unwrap_err();
/// assert_eq!(classify_smtp_error(&error).category(), Category::Network);
/// # });
/// ```
pub fn classify_smtp_error(error: &SmtpError) -> SendError {
    let message = error.to_string();
    let sorted = if error.is_timeout() {
        SendError::new(Category::Timeout, "smtp.timeout", message)
    } else if let Some(code) = error.status() {
        classify_smtp_reply(u16::from(code), &message)
    } else if error.is_client() {
        SendError::new(Category::Configuration, "smtp.client", message)
    } else if error.is_transport_shutdown() {
        SendError::new(Category::Configuration, "smtp.shutdown", message)
    } else if error.is_tls() {
        SendError::new(Category::Network, "smtp.tls", message)
    } else {
        // Connection and I/O errors, and a reply lettre could not read: a connection dropped
        // mid-reply shows up as "incomplete response".
        SendError::new(Category::Network, "smtp.network", message)
    };
    match error_source(error) {
        Some(source) => sorted.with_source(source),
        None => sorted,
    }
}

/// Sorts a server's SMTP reply into a [`Category`], with the code `smtp.<code>`: the rules of
/// [`classify_smtp_error`] for an error that carries a reply, as a pure function of the reply
/// code and its text (which is kept as the error's message, addresses masked).
///
/// Any code and any text land in a category: a code that is not a failure reply at all (a
/// `250` where an error was expected, or a `999`) is `Network`, the server having answered
/// something that is not SMTP.
///
/// ```
/// use mail_breaker::{Category, classify_smtp_reply};
///
/// let error = classify_smtp_reply(450, "450 4.7.28 <bob@example.org> rate limited");
/// assert_eq!(error.category(), Category::RateLimited);
/// assert_eq!(error.code(), "smtp.450");
/// assert!(!error.to_string().contains("bob@"));
/// assert_eq!(classify_smtp_reply(421, "try later").category(), Category::ServiceUnavailable);
/// assert_eq!(classify_smtp_reply(421, "421 4.7.28 unusual rate").category(), Category::RateLimited);
/// assert_eq!(classify_smtp_reply(552, "552 5.3.4 too big").category(), Category::InvalidMessage);
/// assert_eq!(classify_smtp_reply(999, "what?").category(), Category::Network);
/// ```
pub fn classify_smtp_reply(code: u16, text: &str) -> SendError {
    SendError::new(reply_category(code, text), format!("smtp.{code}"), text)
}

/// The category of an SMTP reply code, reading the enhanced status code in `text` if any.
fn reply_category(reply: u16, text: &str) -> Category {
    match reply {
        400..=499 if is_rate_limit(text) => Category::RateLimited,
        421 => Category::ServiceUnavailable,
        400..=499 => Category::ServerError,
        530 | 534 | 535 => Category::Authentication,
        552 => Category::InvalidMessage,
        500..=599 if enhanced_status(text) == Some((5, 3, 4)) => Category::InvalidMessage,
        500..=599 => Category::Rejected,
        // Not a failure code at all: the server answered something lettre did not expect.
        _ => Category::Network,
    }
}

/// Whether a 4xx reply asks the client to slow down: an RFC 3463 `4.7.x` status whose text
/// says what is limited (a rate, too many connections or messages, throttling), or Gmail's
/// `4.7.28` (unusual rate of mail). "Too many" alone says nothing of a rate: Postfix's
/// `421 4.7.0 Error: too many errors` counts the session's own errors.
fn is_rate_limit(text: &str) -> bool {
    let Some(detail) = enhanced_status(text)
        .and_then(|(class, subject, detail)| (class == 4 && subject == 7).then_some(detail))
    else {
        return false;
    };
    let lower = text.to_ascii_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|word| !word.is_empty())
        .collect();
    let has = |word: &str| words.contains(&word);
    let too_many = |what: &[&str]| {
        words
            .windows(3)
            .any(|three| three[0] == "too" && three[1] == "many" && what.contains(&three[2]))
    };
    detail == 28
        || has("rate")
        || has("limit")
        || has("limited")
        || words.iter().any(|word| word.starts_with("throttl"))
        || lower.contains("slow down")
        || too_many(&[
            "connections",
            "messages",
            "sessions",
            "concurrent",
            "requests",
            "mails",
        ])
}

/// The first RFC 3463 enhanced status code (`class.subject.detail`) in `text`.
fn enhanced_status(text: &str) -> Option<(u16, u16, u16)> {
    text.split(|c: char| c.is_whitespace() || c == ':' || c == ',' || c == '(' || c == ')')
        .find_map(|word| {
            let mut parts = word.split('.');
            let class = parts.next()?;
            let subject = parts.next()?;
            let detail = parts.next()?;
            if parts.next().is_some()
                || class.len() != 1
                || !(1..=3).contains(&subject.len())
                || !(1..=3).contains(&detail.len())
            {
                return None;
            }
            let class: u16 = class.parse().ok()?;
            if !(2..=5).contains(&class) {
                return None;
            }
            Some((class, subject.parse().ok()?, detail.parse().ok()?))
        })
}

/// The command a reply answers, where the same code means different things.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// The server's first words.
    Greeting,
    /// EHLO.
    Hello,
    /// STARTTLS.
    StartTls,
    /// AUTH and its challenges.
    Auth,
    /// RSET, NOOP, MAIL, RCPT, DATA, BDAT and the final dot.
    Transaction,
}

/// The error for `reply`, which is not what `stage` expected.
///
/// A 4xx or 5xx is a refusal: by [`classify_smtp_reply`] in a transaction; about the server,
/// not the message, before it (a 5xx greeting or EHLO is `ServiceUnavailable`, so a pool
/// fails over; a refused STARTTLS, AUTH that needs TLS first (`530`, `538`) or a mechanism it
/// does not take (`504`) is `Configuration`; other 5xx to AUTH `Authentication`). Any other
/// code where it did not belong (a `354` to the final dot, a `250` to DATA) is the server
/// speaking out of turn: `Network`, `smtp.unexpected_reply`, and the connection is not reused.
pub(super) fn refusal(stage: Stage, reply: &Reply) -> SendError {
    let text = reply.text();
    let code = reply.code();
    let category = match (reply.class(), stage) {
        (4, _) | (5, Stage::Transaction) => reply_category(code, &text),
        (5, Stage::Greeting | Stage::Hello) => Category::ServiceUnavailable,
        (5, Stage::StartTls) => Category::Configuration,
        (5, Stage::Auth) if matches!(code, 504 | 530 | 538) => Category::Configuration,
        (5, Stage::Auth) => Category::Authentication,
        _ => {
            return SendError::new(
                Category::Network,
                "smtp.unexpected_reply",
                format!("the server answered out of turn: {text}"),
            );
        }
    };
    SendError::new(category, format!("smtp.{code}"), text)
}

/// The error for a reply that could not be read.
pub(super) fn unreadable(error: &ReplyError) -> SendError {
    let code = match error {
        ReplyError::TooLong(_) => "smtp.reply_too_long",
        ReplyError::Malformed(_) => "smtp.protocol",
        ReplyError::Closed | ReplyError::Io(_) => "smtp.network",
    };
    SendError::new(Category::Network, code, error.to_string())
}

/// The transaction the server accepted with `reply`, for `recipients`: the reply's text, and
/// the queue id when the reply names one.
pub(super) fn accepted_transaction(reply: &Reply, recipients: Vec<Address>) -> AcceptedTransaction {
    let text = reply.text();
    match queue_id(&text) {
        Some(id) => AcceptedTransaction::new(text, recipients).with_message_id(id),
        None => AcceptedTransaction::new(text, recipients),
    }
}

/// Whether a refusal of a recipient says the transaction has too many recipients, so the
/// others go in a further transaction: `452` (RFC 5321 §4.5.3.1.10), or the `552` some
/// servers give instead, with `4.5.3`/`5.5.3` or words saying so.
pub(super) fn is_too_many_recipients(reply: &Reply) -> bool {
    let text = reply.text();
    matches!(reply.code(), 452 | 552)
        && (matches!(enhanced_status(&text), Some((4 | 5, 5, 3)))
            || text.to_ascii_lowercase().contains("too many recipients"))
}

/// The refusal of a recipient as too many for this transaction, in the server's own words:
/// `ServerError`, since RFC 5321 §4.5.3.1.10 asks a client to treat even a `552` saying so
/// as temporary (the recipient goes in a further transaction, or a later try).
pub(super) fn too_many_recipients(reply: &Reply) -> SendError {
    SendError::new(
        Category::ServerError,
        format!("smtp.{}", reply.code()),
        reply.text(),
    )
}

fn error_source(error: &SmtpError) -> Option<SourceText> {
    std::error::Error::source(error).map(|source| SourceText::masked(source.to_string()))
}

/// The receipt for a message the server accepted with `response`: its reply text, and the
/// queue id when the reply names one.
pub(super) fn receipt_for(transport: &str, response: &Response) -> Receipt {
    let text = reply_text(response);
    let receipt = Receipt::new(transport);
    match queue_id(&text) {
        Some(id) => receipt.with_message_id(id).with_response(text),
        None => receipt.with_response(text),
    }
}

fn reply_text(response: &Response) -> String {
    let mut text = u16::from(response.code()).to_string();
    for line in response.message() {
        text.push(' ');
        text.push_str(line);
    }
    text
}

/// The queue id in a reply such as `250 2.0.0 Ok: queued as 4F2A1`.
fn queue_id(text: &str) -> Option<String> {
    let rest = &text[text.find("queued as ")? + "queued as ".len()..];
    let id: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric())
        .collect();
    (!id.is_empty()).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_421_is_service_unavailable() {
        assert_eq!(
            reply_category(421, "421 4.3.0 closing"),
            Category::ServiceUnavailable
        );
    }

    #[test]
    fn rate_limit_reply_with_4_7_code_is_rate_limited() {
        assert_eq!(
            reply_category(450, "450 4.7.28 rate limited"),
            Category::RateLimited
        );
        assert_eq!(
            reply_category(451, "451 4.7.1 too many messages, slow down"),
            Category::RateLimited
        );
    }

    #[test]
    fn policy_4_7_reply_without_rate_words_is_server_error() {
        assert_eq!(
            reply_category(450, "450 4.7.1 greylisted"),
            Category::ServerError
        );
    }

    #[test]
    fn rate_words_without_a_4_7_code_are_server_error() {
        assert_eq!(
            reply_category(451, "451 rate of errors too high"),
            Category::ServerError
        );
    }

    #[test]
    fn authentication_replies_are_authentication() {
        for code in [530, 534, 535] {
            assert_eq!(reply_category(code, ""), Category::Authentication);
        }
    }

    #[test]
    fn other_permanent_replies_are_rejected() {
        assert_eq!(
            reply_category(550, "550 5.1.1 unknown user"),
            Category::Rejected
        );
        assert_eq!(reply_category(554, ""), Category::Rejected);
    }

    #[test]
    fn enhanced_status_is_found_after_the_reply_code() {
        assert_eq!(enhanced_status("450 4.7.28 rate limited"), Some((4, 7, 28)));
        assert_eq!(
            enhanced_status("transient error (450): 4.2.2 mailbox full"),
            Some((4, 2, 2))
        );
        assert_eq!(enhanced_status("450 version 1.2.3.4"), None);
        assert_eq!(enhanced_status("no code here"), None);
    }

    fn reply(octets: &[u8]) -> Reply {
        let mut reader = crate::adapters::smtp::reply::ReplyReader::new();
        reader.feed(octets);
        reader
            .next_buffered()
            .expect("a valid reply")
            .expect("a whole reply")
    }

    fn refused(stage: Stage, octets: &[u8]) -> (Category, String) {
        let error = refusal(stage, &reply(octets));
        (error.category(), error.code().to_owned())
    }

    #[test]
    fn a_5xx_greeting_or_ehlo_is_about_the_server_so_a_pool_fails_over() {
        assert_eq!(
            refused(Stage::Greeting, b"554 blocklisted\r\n"),
            (Category::ServiceUnavailable, "smtp.554".to_owned())
        );
        assert_eq!(
            refused(Stage::Hello, b"550 go away\r\n").0,
            Category::ServiceUnavailable
        );
    }

    #[test]
    fn a_4xx_before_the_transaction_is_read_as_in_it() {
        assert_eq!(
            refused(Stage::Greeting, b"421 busy\r\n").0,
            Category::ServiceUnavailable
        );
        assert_eq!(
            refused(Stage::Auth, b"454 4.7.0 later\r\n").0,
            Category::ServerError
        );
        assert_eq!(
            refused(Stage::StartTls, b"454 TLS not now\r\n").0,
            Category::ServerError
        );
    }

    #[test]
    fn a_refused_starttls_is_configuration() {
        assert_eq!(
            refused(Stage::StartTls, b"502 no\r\n").0,
            Category::Configuration
        );
    }

    #[test]
    fn auth_that_needs_tls_first_or_another_mechanism_is_configuration() {
        for octets in [
            &b"530 5.7.0 STARTTLS first\r\n"[..],
            b"538 encryption\r\n",
            b"504 no such mechanism\r\n",
        ] {
            assert_eq!(
                refused(Stage::Auth, octets).0,
                Category::Configuration,
                "{octets:?}"
            );
        }
    }

    #[test]
    fn other_5xx_to_auth_are_authentication() {
        assert_eq!(
            refused(Stage::Auth, b"535 5.7.8 bad credentials\r\n"),
            (Category::Authentication, "smtp.535".to_owned())
        );
        assert_eq!(
            refused(Stage::Auth, b"550 no\r\n").0,
            Category::Authentication
        );
    }

    #[test]
    fn a_5xx_in_the_transaction_is_read_by_the_reply_table() {
        assert_eq!(
            refused(Stage::Transaction, b"550 5.1.1 unknown\r\n").0,
            Category::Rejected
        );
        assert_eq!(
            refused(Stage::Transaction, b"552 5.3.4 too big\r\n").0,
            Category::InvalidMessage
        );
    }

    #[test]
    fn a_reply_out_of_turn_is_an_unexpected_reply_at_any_stage() {
        for stage in [
            Stage::Greeting,
            Stage::Hello,
            Stage::StartTls,
            Stage::Auth,
            Stage::Transaction,
        ] {
            assert_eq!(
                refused(stage, b"354 go ahead\r\n"),
                (Category::Network, "smtp.unexpected_reply".to_owned())
            );
            assert_eq!(refused(stage, b"250 ok\r\n").1, "smtp.unexpected_reply");
        }
    }

    #[test]
    fn too_many_recipients_is_452_or_552_with_x_5_3_or_its_words() {
        assert!(is_too_many_recipients(&reply(
            b"452 4.5.3 Too many recipients\r\n"
        )));
        assert!(is_too_many_recipients(&reply(b"552 5.5.3 limit\r\n")));
        assert!(is_too_many_recipients(&reply(
            b"452 too many recipients\r\n"
        )));
        assert!(!is_too_many_recipients(&reply(
            b"452 4.2.2 mailbox full\r\n"
        )));
        assert!(!is_too_many_recipients(&reply(b"450 4.5.3 odd\r\n")));
        assert!(!is_too_many_recipients(&reply(b"552 5.3.4 too big\r\n")));
    }

    #[test]
    fn an_unreadable_reply_is_a_network_error_naming_why() {
        let code = |error| unreadable(&error).code().to_owned();
        assert_eq!(code(ReplyError::TooLong("x")), "smtp.reply_too_long");
        assert_eq!(code(ReplyError::Malformed("x")), "smtp.protocol");
        assert_eq!(code(ReplyError::Closed), "smtp.network");
        assert_eq!(
            unreadable(&ReplyError::Closed).category(),
            Category::Network
        );
    }

    #[test]
    fn an_accepted_transaction_carries_the_reply_and_its_queue_id() {
        let to: Address = "bob@example.org".parse().expect("an address");
        let transaction = accepted_transaction(
            &reply(b"250 2.0.0 Ok: queued as 4F2A1\r\n"),
            vec![to.clone()],
        );
        assert_eq!(transaction.message_id(), Some("4F2A1"));
        assert_eq!(transaction.response(), "250 2.0.0 Ok: queued as 4F2A1");
        assert_eq!(transaction.recipients(), [to]);
        let plain = accepted_transaction(&reply(b"250\r\n"), Vec::new());
        assert_eq!(plain.message_id(), None);
        assert_eq!(plain.response(), "250");
    }

    #[test]
    fn a_421_with_a_rate_code_is_rate_limited_and_other_421s_unavailable() {
        assert_eq!(
            reply_category(421, "421 4.7.28 unusual rate"),
            Category::RateLimited
        );
        assert_eq!(
            reply_category(421, "421 4.7.0 Try again later, rate limited"),
            Category::RateLimited
        );
        assert_eq!(
            reply_category(421, "421 4.4.2 timeout"),
            Category::ServiceUnavailable
        );
    }

    #[test]
    fn each_word_that_names_a_limit_makes_a_4_7_reply_a_rate_limit_on_its_own() {
        for text in [
            "451 4.7.1 connection rate exceeded",
            "451 4.7.1 hourly limit reached",
            "451 4.7.1 you are limited",
            "451 4.7.1 throttled",
            "451 4.7.1 please slow down",
            "451 4.7.1 too many connections from your host",
            "451 4.7.1 too many messages in this session",
        ] {
            assert_eq!(reply_category(451, text), Category::RateLimited, "{text}");
        }
    }

    #[test]
    fn connections_or_messages_without_too_many_before_them_are_no_rate_limit() {
        for text in [
            "451 4.7.1 messages from your network are refused by policy",
            "451 4.7.1 many connections were seen from your host",
            "451 4.7.1 too few messages",
        ] {
            assert_eq!(reply_category(451, text), Category::ServerError, "{text}");
        }
    }

    #[test]
    fn a_message_too_big_is_an_invalid_message() {
        assert_eq!(reply_category(552, "552 too big"), Category::InvalidMessage);
        assert_eq!(
            reply_category(554, "554 5.3.4 too big"),
            Category::InvalidMessage
        );
        assert_eq!(
            reply_category(554, "554 5.7.1 relay denied"),
            Category::Rejected
        );
    }

    #[test]
    fn queue_id_is_read_from_the_reply() {
        assert_eq!(
            queue_id("250 2.0.0 Ok: queued as 4F2A1").as_deref(),
            Some("4F2A1")
        );
        assert_eq!(queue_id("250 Ok"), None);
    }
}
