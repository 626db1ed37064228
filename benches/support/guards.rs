//! The guards the benches compare, shared by `overhead` (time) and `instructions`
//! (instructions counted by callgrind): a transport that answers at once, and failsafe's and
//! recloser's breakers around a send, inline and as a [`Transport`].
#![allow(dead_code)]

use std::time::Duration;

use failsafe::StateMachine;
use failsafe::backoff::{self, Constant};
use failsafe::failure_policy::{self, ConsecutiveFailures};
use mail_breaker::{
    Category, CircuitBreakerTransport, Envelope, Message, Receipt, Scope, SendError, Transport,
};
use recloser::{AsyncRecloser, Recloser};

/// A transport that answers every send at once, as success or as a Network failure.
pub struct Immediate {
    pub name: &'static str,
    pub fail: bool,
}

pub const OK: Immediate = Immediate {
    name: "immediate",
    fail: false,
};

pub const FAILING: Immediate = Immediate {
    name: "immediate",
    fail: true,
};

#[async_trait::async_trait]
impl Transport for Immediate {
    fn name(&self) -> &str {
        self.name
    }

    async fn send_raw(&self, _envelope: &Envelope, _raw: &[u8]) -> Result<Receipt, SendError> {
        self.answer()
    }

    async fn send(&self, _message: &Message) -> Result<Receipt, SendError> {
        self.answer()
    }

    // Its futures unboxed, for the guards below, which poll them inside their own: what a
    // transport whose send is an `async fn` of its own gives.

    fn send_raw_unboxed<'a>(
        &'a self,
        _envelope: &'a Envelope,
        _raw: &'a [u8],
    ) -> impl Future<Output = Result<Receipt, SendError>> + Send + 'a {
        std::future::ready(self.answer())
    }

    fn send_unboxed<'a>(
        &'a self,
        _message: &'a Message,
    ) -> impl Future<Output = Result<Receipt, SendError>> + Send + 'a {
        std::future::ready(self.answer())
    }
}

impl Immediate {
    fn answer(&self) -> Result<Receipt, SendError> {
        if self.fail {
            Err(SendError::new(Category::Network, "test.down", "down"))
        } else {
            Ok(Receipt::new(self.name))
        }
    }
}

pub fn message_to(to: &str) -> Message {
    Message::builder()
        .from("app@example.com".parse().expect("a valid sender"))
        .to(to.parse().expect("a valid recipient"))
        .subject("bench")
        .body(String::from("hello"))
        .expect("a valid message")
}

pub fn message() -> Message {
    message_to("user@example.org")
}

/// failsafe's state machine: 5 failures in a row open it for 30 s, like the breaker's default.
pub type Failsafe = StateMachine<ConsecutiveFailures<Constant>, ()>;

pub fn failsafe() -> Failsafe {
    let backoff = backoff::constant(Duration::from_secs(30));
    StateMachine::new(failure_policy::consecutive_failures(5, backoff), ())
}

pub fn recloser() -> AsyncRecloser {
    AsyncRecloser::from(
        Recloser::custom()
            .error_rate(0.5)
            .closed_len(5)
            .open_wait(Duration::from_secs(30))
            .build(),
    )
}

/// Sends through failsafe's state machine the way its futures API does: ask, send, record
/// (here only Network-like errors fail, as in the breaker's default).
pub async fn through_failsafe<F>(
    machine: &Failsafe,
    send: impl FnOnce() -> F,
) -> Result<Receipt, SendError>
where
    F: Future<Output = Result<Receipt, SendError>>,
{
    if !machine.is_call_permitted() {
        return Err(SendError::new(
            Category::ServiceUnavailable,
            "failsafe.rejected",
            "rejected",
        ));
    }
    let result = send().await;
    match &result {
        Err(error) if error.category().is_breaker_failure() => machine.on_error(),
        _ => machine.on_success(),
    }
    result
}

pub async fn through_recloser<F>(recloser: &AsyncRecloser, send: F) -> Result<Receipt, SendError>
where
    F: Future<Output = Result<Receipt, SendError>>,
{
    recloser
        .call_with(
            |error: &SendError| error.category().is_breaker_failure(),
            send,
        )
        .await
        .map_err(|error| match error {
            recloser::Error::Inner(error) => error,
            recloser::Error::Rejected => SendError::new(
                Category::ServiceUnavailable,
                "recloser.rejected",
                "rejected",
            ),
        })
}

/// failsafe as a [`Transport`]: what a user writes to put it in a pool.
pub struct FailsafeTransport<T> {
    pub inner: T,
    pub machine: Failsafe,
}

#[async_trait::async_trait]
impl<T: Transport> Transport for FailsafeTransport<T> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        through_failsafe(&self.machine, || self.inner.send_raw_unboxed(envelope, raw)).await
    }

    async fn send(&self, message: &Message) -> Result<Receipt, SendError> {
        through_failsafe(&self.machine, || self.inner.send_unboxed(message)).await
    }
}

/// recloser as a [`Transport`], the same way.
pub struct RecloserTransport<T> {
    pub inner: T,
    pub recloser: AsyncRecloser,
}

#[async_trait::async_trait]
impl<T: Transport> Transport for RecloserTransport<T> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn send_raw(&self, envelope: &Envelope, raw: &[u8]) -> Result<Receipt, SendError> {
        through_recloser(&self.recloser, self.inner.send_raw_unboxed(envelope, raw)).await
    }

    async fn send(&self, message: &Message) -> Result<Receipt, SendError> {
        through_recloser(&self.recloser, self.inner.send_unboxed(message)).await
    }
}

/// A breaker per recipient domain keeping at most `max_keys`: with the default rules over a
/// transport that delivers, and over one that fails, a threshold its failures never reach
/// (so that every send keeps its domain and none is refused).
pub fn per_domain(inner: Immediate, max_keys: usize) -> CircuitBreakerTransport<Immediate> {
    let fail = inner.fail;
    let breaker = CircuitBreakerTransport::builder(inner)
        .scope(Scope::RecipientDomain)
        .max_keys(max_keys);
    match fail {
        true => breaker.failure_threshold(u32::MAX),
        false => breaker,
    }
    .build()
    .expect("a valid breaker")
}

/// One envelope to each of `count` recipient domains, `d0.example` on.
pub fn domain_envelopes(count: usize) -> Vec<Envelope> {
    (0..count)
        .map(|i| {
            Envelope::new(
                Some("app@example.com".parse().expect("a valid sender")),
                vec![
                    format!("user@d{i}.example")
                        .parse()
                        .expect("a valid recipient"),
                ],
            )
            .expect("a valid envelope")
        })
        .collect()
}
