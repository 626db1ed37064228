//! Reading a server's answers: the [`Category`] of an SMTP error or reply, and the queue id in
//! a `250` after the final dot.

use lettre::transport::smtp::Error as SmtpError;
use lettre::transport::smtp::response::Response;

use mail_breaker::{Category, Receipt, SendError};

/// Sorts a lettre SMTP error into a [`Category`], with the code `smtp.<reply code>` for a
/// server's reply, else `smtp.timeout`, `smtp.network`, `smtp.tls`, `smtp.client` or
/// `smtp.shutdown`.
///
/// | what happened | category |
/// |---|---|
/// | timeout | Timeout |
/// | 421 | ServiceUnavailable |
/// | 4xx with an RFC 3463 `4.7.x` code that speaks of a rate (`450 4.7.28 rate limited`) | RateLimited |
/// | other 4xx | ServerError |
/// | 530, 534, 535 | Authentication |
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
    if error.is_timeout() {
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
/// assert_eq!(classify_smtp_reply(999, "what?").category(), Category::Network);
/// ```
pub fn classify_smtp_reply(code: u16, text: &str) -> SendError {
    SendError::new(reply_category(code, text), format!("smtp.{code}"), text)
}

/// The category of an SMTP reply code, reading the enhanced status code in `text` if any.
fn reply_category(reply: u16, text: &str) -> Category {
    match reply {
        421 => Category::ServiceUnavailable,
        400..=499 if is_rate_limit(text) => Category::RateLimited,
        400..=499 => Category::ServerError,
        530 | 534 | 535 => Category::Authentication,
        500..=599 => Category::Rejected,
        // Not a failure code at all: the server answered something lettre did not expect.
        _ => Category::Network,
    }
}

/// Whether a 4xx reply asks the client to slow down: an RFC 3463 `4.7.x` status with words of
/// rate in the text, or Gmail's `4.7.28` (unusual rate of mail).
fn is_rate_limit(text: &str) -> bool {
    let Some(detail) = enhanced_status(text)
        .and_then(|(class, subject, detail)| (class == 4 && subject == 7).then_some(detail))
    else {
        return false;
    };
    let lower = text.to_ascii_lowercase();
    detail == 28
        || ["rate", "limit", "too many", "throttl", "slow down"]
            .iter()
            .any(|word| lower.contains(word))
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

/// Whether the connection that gave `error` can carry another transaction: the server answered
/// with a refusal of this command, not a `421` (which closes the connection) and not something
/// unreadable or a broken socket.
pub(super) fn leaves_connection_usable(error: &SmtpError) -> bool {
    error.status().is_some_and(|code| u16::from(code) != 421)
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
