//! The future of one send through a breaker that owns its memory store: the common case,
//! written by hand rather than as an `async fn`.
//!
//! An `async fn` keeps its state in a generated enum and moves the send's result through it
//! on the way out; this future asks the breaker for leave on its first poll, then polls the
//! inner send and hands its result straight back, counted, without storing it.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use super::BoxedSend;
use super::gate::{Gate, Unspent};
use crate::store::MemoryStore;
use crate::store::memory::LocalBreaker;
use crate::transport::unanswered;
use crate::{Envelope, Receipt, SendError};

/// A send through `send` if the breakers of `envelope` in the breaker's own memory store give
/// leave, its result counted. Nothing is asked of the breaker until it is first polled;
/// dropped while sending, it gives the permit back.
///
/// Its parts are separate fields rather than one enum of steps, so that no step is moved out
/// and back in on the way: each poll touches only what it needs.
pub(crate) struct LocalSend<'a, S> {
    gate: &'a Gate,
    memory: &'a MemoryStore,
    transport: &'a str,
    envelope: &'a Envelope,
    /// Makes the inner send once the breaker gives leave; taken at the first poll.
    make: Option<S>,
    /// The inner send (or, for a message under several breakers, the rarer `async fn` that
    /// sends under all of them); `None` before the first poll and once answered.
    send: Option<BoxedSend<'a>>,
    /// The one breaker that gave leave, and its permit, to count the result with.
    held: Option<(LocalBreaker<'a>, Unspent<'a>)>,
}

impl<'a, S> LocalSend<'a, S>
where
    S: FnOnce() -> BoxedSend<'a> + Send + 'a,
{
    pub(crate) fn new(
        gate: &'a Gate,
        memory: &'a MemoryStore,
        transport: &'a str,
        envelope: &'a Envelope,
        make: S,
    ) -> Self {
        LocalSend {
            gate,
            memory,
            transport,
            envelope,
            make: Some(make),
            send: None,
            held: None,
        }
    }

    /// Asks the breakers for leave and starts the send, or answers the refusal.
    fn start(&mut self, make: S) -> Result<(), SendError> {
        let (gate, transport) = (self.gate, self.transport);
        let key: Cow<'a, str> = match gate.one_key(transport, self.envelope) {
            Ok(key) => key,
            Err(many) => {
                self.send = Some(Box::pin(gate.guard_many(transport, many, make)));
                return Ok(());
            }
        };
        let mut breaker = self.memory.breaker_of(&key, &gate.rules);
        let decision = breaker.acquire(&key, &gate.rules);
        match gate.admitted(transport, key, decision) {
            Ok(unspent) => {
                self.held = Some((breaker, unspent));
                self.send = Some(make());
                Ok(())
            }
            Err(held) => Err(gate.refusal(transport, held)),
        }
    }
}

impl<'a, S> Future for LocalSend<'a, S>
where
    S: FnOnce() -> BoxedSend<'a> + Send + Unpin + 'a,
{
    type Output = Result<Receipt, SendError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Some(make) = this.make.take()
            && let Err(refusal) = this.start(make)
        {
            return Poll::Ready(Err(refusal));
        }
        let Some(send) = &mut this.send else {
            // Polled again after it answered: a caller's mistake, answered, not a panic.
            return Poll::Ready(Err(unanswered(this.transport)));
        };
        let result = ready!(send.as_mut().poll(cx));
        this.send = None;
        if let Some((breaker, unspent)) = &mut this.held
            && let Some((permit, outcome)) = unspent.counted(&result)
        {
            let transitions = breaker.record(unspent.key(), &this.gate.rules, permit, outcome);
            unspent.recorded(transitions);
        }
        Poll::Ready(result)
    }
}
