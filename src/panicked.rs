//! A send that panics is an answer: `transport.panicked`, so that the pool, the retry
//! transport and the outbox worker that ran it go on (DESIGN §15).

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;

use crate::{Category, SendError};

/// The code of the error that answers a send which panicked.
pub(crate) const PANICKED: &str = "transport.panicked";

/// Runs `send` and answers a panic inside it with [`panicked`]'s error, naming `transport`.
///
/// Unwind safety is asserted: whatever the panicking send held is dropped with its future,
/// and the caller keeps nothing the send could have left half-changed but its own answer.
pub(crate) async fn catch_panic<T, F>(transport: &str, send: F) -> Result<T, SendError>
where
    F: Future<Output = Result<T, SendError>>,
{
    match AssertUnwindSafe(send).catch_unwind().await {
        Ok(answer) => answer,
        Err(payload) => Err(panicked(transport, payload.as_ref())),
    }
}

/// The answer to a send of `transport` that panicked with `payload`: category
/// `Configuration` (a bug or a setup no retry mends), code `transport.panicked`, the panic's
/// message (addresses masked) as its message. Logged at ERROR, as a panic is a bug to fix.
pub(crate) fn panicked(transport: &str, payload: &(dyn Any + Send)) -> SendError {
    let why = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message");
    let error = SendError::new(
        Category::Configuration,
        PANICKED,
        format!("the send panicked: {why}"),
    )
    .with_transport(transport)
    // One send's panic (often one message's content meeting a bug) is no sign that the
    // transport cannot send the next message.
    .about_the_message();
    tracing::error!(transport, error = %error, "transport.panicked");
    error
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Receipt;

    fn run<F: Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .map(|runtime| runtime.block_on(future))
            .unwrap_or_else(|error| panic!("no runtime: {error}"))
    }

    #[test]
    fn a_send_that_panics_is_answered_transport_panicked() {
        let answer: Result<Receipt, SendError> =
            run(catch_panic("smtp://relay:25", async { panic!("boom") }));
        let error = answer
            .err()
            .unwrap_or_else(|| panic!("a panic must be an Err"));
        assert_eq!(error.code(), "transport.panicked");
        assert_eq!(error.category(), Category::Configuration);
        assert_eq!(error.transport(), Some("smtp://relay:25"));
        assert!(error.message().contains("boom"), "{error}");
        assert!(
            error.is_about_the_message(),
            "one send's panic, not the member"
        );
    }

    #[test]
    fn a_panic_with_a_formatted_message_keeps_it_with_addresses_masked() {
        let answer: Result<Receipt, SendError> = run(catch_panic("stub", async {
            panic!("bad recipient {}", "bob@example.org")
        }));
        let error = answer
            .err()
            .unwrap_or_else(|| panic!("a panic must be an Err"));
        assert!(error.message().contains("***@example.org"), "{error}");
        assert!(!error.message().contains("bob@"), "{error}");
    }

    #[test]
    fn a_panic_without_a_message_is_answered_too() {
        let answer: Result<Receipt, SendError> =
            run(catch_panic("stub", async { std::panic::panic_any(42_u32) }));
        let error = answer
            .err()
            .unwrap_or_else(|| panic!("a panic must be an Err"));
        assert_eq!(error.code(), PANICKED);
    }

    #[test]
    fn a_send_that_answers_keeps_its_answer() {
        let delivered = run(catch_panic("stub", async { Ok(Receipt::new("stub")) }));
        assert_eq!(
            delivered.ok().map(|r| r.transport().to_owned()).as_deref(),
            Some("stub")
        );
        let refused: Result<Receipt, SendError> = run(catch_panic("stub", async {
            Err(SendError::new(Category::Rejected, "smtp.550", "no"))
        }));
        assert_eq!(
            refused.err().map(|e| e.code().to_owned()).as_deref(),
            Some("smtp.550")
        );
    }
}
