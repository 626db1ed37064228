//! The future of one send through a breaker that owns its memory store: the common case,
//! written by hand rather than as an `async fn`.
//!
//! An `async fn` keeps its state in a generated enum and moves the send's result through it
//! on the way out; this future asks the breaker for leave on its first poll, then polls the
//! inner send and hands its result straight back, counted, without storing it.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::BoxedSend;
use super::gate::{Gate, Unspent};
use crate::machine::{Outcome, Permit};
use crate::store::MemoryStore;
use crate::store::memory::{FirstKey, LocalBreaker};
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
    held: Held<'a>,
}

/// What a send under one breaker holds while it is out.
enum Held<'a> {
    /// Nothing: not yet let go, answered, or under several breakers.
    Nothing,
    /// Let go by the first key's breaker while it was closed with no failure counted in a
    /// row, on a gate that counts a result only by whether it failed: a permit that is never
    /// a probe's, so there is nothing to give back if the send is dropped, and a success
    /// changes nothing unless another result came first. The common case, kept to one word
    /// read before and, for a success, one after.
    Clean(&'a FirstKey, Permit),
    /// Any other leave: the breaker and its permit, given back if the send is dropped.
    Counted(LocalBreaker<'a>, Unspent<'a>),
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
            held: Held::Nothing,
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
        if let LocalBreaker::First(first) = breaker
            && gate.counts_plainly()
            && let Some(permit) = first.clean_permit()
        {
            self.held = Held::Clean(first, permit);
            self.send = Some(make());
            return Ok(());
        }
        let decision = breaker.acquire(&key, &gate.rules);
        match gate.admitted(transport, key, decision) {
            Ok(unspent) => {
                self.held = Held::Counted(breaker, unspent);
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
        // The inner send's answer is handed back as the very value it polled to, so that it
        // can be written once, where the caller reads it, and not moved out and back in.
        let answer = send.as_mut().poll(cx);
        let Poll::Ready(result) = &answer else {
            return Poll::Pending;
        };
        this.send = None;
        match &mut this.held {
            Held::Nothing => {}
            Held::Clean(first, permit) => {
                let outcome = match result {
                    Err(error) if (this.gate.is_failure)(error) => Outcome::Failure,
                    _ => Outcome::Success,
                };
                let transitions = first.record(&this.gate.rules, *permit, outcome);
                if !transitions.is_empty() {
                    this.gate.announce(this.transport, first.key(), transitions);
                }
                this.held = Held::Nothing;
            }
            Held::Counted(breaker, unspent) => {
                if let Some((permit, outcome)) = unspent.counted(result) {
                    let transitions =
                        breaker.record(unspent.key(), &this.gate.rules, permit, outcome);
                    unspent.recorded(transitions);
                }
            }
        }
        answer
    }
}
