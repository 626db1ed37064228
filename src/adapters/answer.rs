//! What the provider adapters (SES and the HTTP APIs) share about an error answer: the
//! provider's message cut to a size fit for logs, and its `Retry-After`.

use std::time::{Duration, SystemTime};

use crate::Category;

/// The longest provider message kept in a [`SendError`](crate::SendError); error messages are
/// a sentence or two.
const MAX_MESSAGE_CHARS: usize = 300;

/// A provider's message fit for logs: addresses are masked by
/// [`SendError::new`](crate::SendError::new); this trims it, cuts it short, and an
/// authentication message at its first sentence (signature errors can echo the request).
pub(crate) fn safe_message(message: &str, category: Category) -> String {
    let message = message.trim();
    let message = if category == Category::Authentication {
        match message.find(". ") {
            Some(end) => &message[..=end],
            None => message,
        }
    } else {
        message
    };
    match message.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((cut, _)) => format!("{}...", &message[..cut]),
        None => message.to_owned(),
    }
}

/// A `Retry-After` value (seconds or an HTTP-date) as a wait from now, capped at a day.
pub(crate) fn retry_after(value: &str) -> Option<Duration> {
    crate::time::parse_retry_after(value, SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_trimmed_and_cut_and_authentication_at_the_first_sentence() {
        let long = "x".repeat(1000);
        let cut = safe_message(&long, Category::ServerError);
        assert_eq!(cut.len(), MAX_MESSAGE_CHARS + 3);
        assert!(cut.ends_with("..."));
        let exact = "y".repeat(MAX_MESSAGE_CHARS);
        assert_eq!(safe_message(&exact, Category::ServerError), exact);
        assert_eq!(
            safe_message(" Bad token. It was abc ", Category::Authentication),
            "Bad token."
        );
        assert_eq!(
            safe_message("Bad token. It was abc", Category::ServerError),
            "Bad token. It was abc"
        );
    }

    #[test]
    fn retry_after_reads_seconds() {
        assert_eq!(retry_after("3"), Some(Duration::from_secs(3)));
        assert_eq!(retry_after("soon"), None);
    }
}
