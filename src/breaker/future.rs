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
use super::gate::{Gate, HeldBack, Unspent, attempted};
use super::recording::CleanStart;
use crate::machine::{Decision, Outcome, Permit, State, Transitions};
use crate::store::MemoryStore;
use crate::store::memory::{FirstKey, LocalBreaker};
use crate::transport::unanswered;
use crate::{Envelope, Receipt, SendError};

pin_project_lite::pin_project! {
    /// A send through `send` if the breakers of `envelope` in the breaker's own memory store
    /// give leave, its result counted. Nothing is asked of the breaker until it is first
    /// polled; dropped while sending, it gives the permit back.
    ///
    /// Its parts are separate fields rather than one enum of steps, so that no step is moved
    /// out and back in on the way: each poll touches only what it needs. The inner send's
    /// future `F` is polled where it lies, inside this one: unboxed when the transport gives
    /// it so ([`Transport::send_unboxed`](crate::Transport::send_unboxed)), and then a send
    /// through the breaker allocates once, for this future's box.
    pub(crate) struct LocalSend<'a, S, F> {
        gate: &'a Gate,
        memory: &'a MemoryStore,
        transport: &'a str,
        envelope: &'a Envelope,
        // Makes the inner send once the breaker gives leave; taken at the first poll.
        make: Option<S>,
        // The send under way.
        #[pin]
        send: Sending<'a, F>,
        // The one breaker that gave leave, and its permit, to count the result with.
        held: Held<'a>,
    }
}

pin_project_lite::pin_project! {
    /// The send under way, pinned inside the breaker's future.
    #[project = SendingNow]
    enum Sending<'a, F> {
        /// Not started yet, or answered.
        Idle,
        /// Under one breaker: the inner send itself.
        One { #[pin] future: F },
        /// Under several (a message to several recipient domains): their `async fn`, boxed.
        Many { future: BoxedSend<'a> },
    }
}

/// What a send under one breaker holds while it is out.
enum Held<'a> {
    /// Nothing: not yet let go, answered, or under several breakers.
    Nothing,
    /// Let go by the first key's breaker while it was closed with no failure counted in a
    /// row, on a gate that counts a result only by whether it failed: a permit that is never
    /// a probe's, so there is nothing to give back if the send is dropped, and a success
    /// changes nothing unless another result came first. The common case, kept to one word
    /// read before and, for a success, one after; with the `metrics` feature, also when the
    /// send went, for its histogram, if the recorder keeps it (nothing without the feature).
    Clean(&'a FirstKey, Permit, CleanStart),
    /// Any other leave: the breaker and its permit, given back if the send is dropped.
    Counted(LocalBreaker<'a>, Unspent<'a>),
}

impl<'a, S, F> LocalSend<'a, S, F>
where
    S: FnOnce() -> F + Send + 'a,
    F: Future<Output = Result<Receipt, SendError>> + Send + 'a,
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
            send: Sending::Idle,
            held: Held::Nothing,
        }
    }
}

/// What the breakers of a send's envelope answered when asked for leave.
enum Leave<'a, S> {
    /// One breaker gave leave: the send is to be made, and counted by what it holds.
    One(S, Held<'a>),
    /// Several breakers: the send under all of them, already under way.
    Many(BoxedSend<'a>),
}

/// Asks the breakers of `envelope` for leave: the send to start, or why it may not. The send's
/// future is made by the caller, straight into its place.
// Without `metrics` a clean send's start time is `()`: passed along all the same, so that
// both builds share one path.
#[cfg_attr(not(feature = "metrics"), allow(clippy::unit_arg))]
fn start<'a, S, F>(
    gate: &'a Gate,
    memory: &'a MemoryStore,
    transport: &'a str,
    envelope: &'a Envelope,
    make: S,
) -> Result<Leave<'a, S>, HeldBack>
where
    S: FnOnce() -> F + Send + 'a,
    F: Future<Output = Result<Receipt, SendError>> + Send + 'a,
{
    let key: Cow<'a, str> = match gate.one_key(transport, envelope) {
        Ok(key) => key,
        Err(many) => {
            return Ok(Leave::Many(Box::pin(
                gate.guard_many(transport, many, make),
            )));
        }
    };
    let mut breaker = memory.breaker_of(&key, &gate.rules);
    // One atomic read: isolated as a whole, every key is refused (DESIGN §19).
    let isolated = memory.isolates_whole(transport);
    if !isolated
        && let LocalBreaker::First(first) = breaker
        && gate.counts_plainly()
        && let Some(permit) = first.clean_permit()
    {
        let clean = Held::Clean(first, permit, gate.recording.clean_start(transport));
        return Ok(Leave::One(make, clean));
    }
    let decision = if isolated {
        (Decision::Isolated, Transitions::NONE)
    } else {
        breaker.acquire(&key, &gate.rules)
    };
    match gate.admitted(transport, key, decision) {
        Ok(unspent) => Ok(Leave::One(make, Held::Counted(breaker, unspent))),
        Err(held) => Err(held),
    }
}

/// [`start`] inside the decision's span (`mail_breaker.decide`), which records the state the
/// decision says (a probe is half open, another leave closed, a refusal open) and a refusal's
/// code. Kept out of line: only a listener at DEBUG takes it.
#[cold]
#[inline(never)]
fn traced_start<'a, S, F>(
    gate: &'a Gate,
    memory: &'a MemoryStore,
    transport: &'a str,
    envelope: &'a Envelope,
    make: S,
) -> Result<Leave<'a, S>, HeldBack>
where
    S: FnOnce() -> F + Send + 'a,
    F: Future<Output = Result<Receipt, SendError>> + Send + 'a,
{
    let span = crate::telemetry::decide_span(transport);
    let leave = span.in_scope(|| start(gate, memory, transport, envelope, make));
    let (state, refused) = match &leave {
        Ok(Leave::One(_, Held::Counted(_, unspent))) if unspent.is_probe() => {
            (Some(State::HalfOpen), None)
        }
        Ok(Leave::One(..)) => (Some(State::Closed), None),
        Ok(Leave::Many(_)) => (None, None),
        Err(held) => (
            Some(State::Open),
            Some(if held.retry_after.is_some() {
                "breaker.open"
            } else {
                "breaker.isolated"
            }),
        ),
    };
    crate::telemetry::decided(&span, state, refused);
    leave
}

impl<'a, S, F> Future for LocalSend<'a, S, F>
where
    S: FnOnce() -> F + Send + 'a,
    F: Future<Output = Result<Receipt, SendError>> + Send + 'a,
{
    type Output = Result<Receipt, SendError>;

    #[cfg_attr(not(feature = "metrics"), allow(clippy::unit_arg))]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Some(make) = this.make.take() {
            // The decision's span only when someone listens at DEBUG: one read of the level
            // else, and the path below as it was.
            let leave = if crate::telemetry::decisions_traced() {
                traced_start(this.gate, this.memory, this.transport, this.envelope, make)
            } else {
                start(this.gate, this.memory, this.transport, this.envelope, make)
            };
            match leave {
                Ok(Leave::One(make, held)) => {
                    *this.held = held;
                    this.send.set(Sending::One { future: make() });
                }
                Ok(Leave::Many(future)) => this.send.set(Sending::Many { future }),
                Err(held) => return Poll::Ready(Err(this.gate.refusal(this.transport, held))),
            }
        }
        // The inner send's answer is handed back as the very value it polled to, so that it
        // can be written once, where the caller reads it, and not moved out and back in.
        let answer = match this.send.as_mut().project() {
            SendingNow::One { future } => future.poll(cx),
            SendingNow::Many { future } => future.as_mut().poll(cx),
            // Polled again after it answered: a caller's mistake, answered, not a panic.
            SendingNow::Idle => return Poll::Ready(Err(unanswered(this.transport))),
        };
        let Poll::Ready(result) = &answer else {
            return Poll::Pending;
        };
        this.send.set(Sending::Idle);
        let gate = *this.gate;
        if !attempted(result) {
            // Neither a success nor a failure: a clean permit holds nothing to give back, a
            // counted one is given back as it is dropped here (a probe's slot frees at once).
            *this.held = Held::Nothing;
            return answer;
        }
        match this.held {
            Held::Nothing => {}
            Held::Clean(first, permit, started) => {
                let outcome = match result {
                    Err(error) if (gate.is_failure)(error) => Outcome::Failure,
                    _ => Outcome::Success,
                };
                gate.recording
                    .clean_finished(this.transport, outcome, *started);
                let transitions = first.record(&gate.rules, *permit, outcome);
                if !transitions.is_empty() {
                    gate.announce(this.transport, first.key(), transitions);
                }
                *this.held = Held::Nothing;
            }
            Held::Counted(breaker, unspent) => {
                if let Some((permit, outcome)) = unspent.counted(result) {
                    let transitions = breaker.record(unspent.key(), &gate.rules, permit, outcome);
                    unspent.recorded(transitions);
                }
            }
        }
        answer
    }
}
