//! The breaker's shell around its store: asks for leave before a send, reports the result
//! after, and gives a probe back when its caller stops waiting.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use super::events::{History, Listener, announce};
use super::recording::Recording;
use super::scope::{Keys, Scope};
use crate::machine::{Decision, Outcome, Permit, Rules, Transitions};
use crate::store::{BreakerStore, MemoryStore, Reporter};
use crate::{Category, Envelope, Receipt, SendError};
use tokio::time::Instant;

/// What decides a result is the provider failing.
pub(crate) type FailurePredicate = Arc<dyn Fn(&SendError) -> bool + Send + Sync>;

/// Everything a breaker decides with, apart from the transport it guards.
pub(crate) struct Gate {
    pub(crate) rules: Rules,
    pub(crate) scope: Scope,
    pub(crate) store: Arc<dyn BreakerStore>,
    /// The same store when it is the breaker's own [`MemoryStore`]: the one-key send then
    /// calls it directly, without a trait object's call and future.
    pub(crate) memory: Option<Arc<MemoryStore>>,
    pub(crate) is_failure: FailurePredicate,
    pub(crate) listener: Option<Listener>,
    /// The guarded transport's name when the breaker was built, shared by every refusal so
    /// that refusing allocates nothing.
    pub(crate) transport_name: Arc<str>,
    /// The handles its metrics are recorded through (nothing without the `metrics` feature).
    pub(crate) recording: Recording,
    /// Tells the listener and the logs of changes the store learns of after a call returned.
    pub(crate) late: Reporter,
    /// Counts and changes state, but never refuses a send.
    pub(crate) shadow: bool,
    /// A success slower than this counts as a failure.
    pub(crate) slow_call: Option<Duration>,
    /// The last changes of state, for an operator.
    pub(crate) history: Arc<History>,
}

/// Leave to send one message: the permits of each of its breakers. Dropped unused, it
/// gives them back, so a probe whose caller went away frees its slot at once.
pub(crate) struct Ticket<'a> {
    gate: &'a Gate,
    transport: &'a str,
    permits: Permits<'a>,
    /// When the send was let go, if slow calls count.
    started: Option<Instant>,
}

enum Permits<'a> {
    One(Cow<'a, str>, Option<Permit>),
    Many(Vec<(Cow<'a, str>, Option<Permit>)>),
}

/// A breaker held a send back; `retry_after` is the time until it may let one through.
///
/// The gate answers with this small value rather than a whole [`SendError`], which the
/// caller makes with [`Gate::refusal`] only when it needs one: every `?` and `.await` on the
/// way out then moves a few bytes instead of an error.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeldBack {
    /// `None` while the breaker is isolated: no time can be promised.
    pub(crate) retry_after: Option<Duration>,
}

impl Gate {
    /// Sends through `send` if the breakers of `envelope` in any store but the breaker's own
    /// memory store give leave (which [`LocalSend`](super::future::LocalSend) asks), and
    /// counts the result. Dropped while sending or recording, it gives the permit back.
    pub(crate) async fn guard_shared<F>(
        &self,
        transport: &str,
        envelope: &Envelope,
        send: impl FnOnce() -> F,
    ) -> Result<Receipt, SendError>
    where
        F: Future<Output = Result<Receipt, SendError>>,
    {
        let key = match self.one_key(transport, envelope) {
            Ok(key) => key,
            Err(many) => return Box::pin(self.guard_many(transport, many, send)).await,
        };
        let decision = (self.store)
            .acquire_in(transport, &key, &self.rules, &self.late)
            .await;
        let mut unspent = match self.admitted(transport, key, decision) {
            Ok(unspent) => unspent,
            Err(held) => return Err(self.refusal(transport, held)),
        };
        let result = send().await;
        // Spent only once recorded: dropped while the store records, `unspent` gives the
        // permit back, so a probe's slot is not held until its deadline.
        if let Some((permit, outcome)) = unspent.counted(&result) {
            let key = unspent.key();
            let transitions = (self.store)
                .record(key, &self.rules, permit, outcome, &self.late)
                .await;
            unspent.recorded(transitions);
        }
        result
    }

    /// The one key of `envelope`, or its several keys.
    #[inline]
    pub(crate) fn one_key<'k>(
        &self,
        transport: &'k str,
        envelope: &'k Envelope,
    ) -> Result<Cow<'k, str>, Keys<'k>> {
        match &self.scope {
            Scope::Transport => Ok(Cow::Borrowed(transport)),
            scope => match scope.keys(transport, envelope) {
                Keys::One(key) => Ok(key),
                many => Err(many),
            },
        }
    }

    /// The send's permit for `key` from the store's `decision`, or what held it back.
    #[inline]
    pub(crate) fn admitted<'g>(
        &'g self,
        transport: &'g str,
        key: Cow<'g, str>,
        (decision, transitions): (Decision, Transitions),
    ) -> Result<Unspent<'g>, HeldBack> {
        self.announce(transport, &key, transitions);
        let permit = match decision {
            Decision::Send(permit) => Some(permit),
            refused => self.refused(transport, &key, refused)?,
        };
        Ok(Unspent {
            gate: self,
            transport,
            key,
            permit,
            started: self.started(transport),
        })
    }

    /// Sends through `send` under several breakers (one per recipient domain).
    pub(crate) async fn guard_many<'a, F>(
        &'a self,
        transport: &'a str,
        keys: Keys<'a>,
        send: impl FnOnce() -> F,
    ) -> Result<Receipt, SendError>
    where
        F: Future<Output = Result<Receipt, SendError>>,
    {
        let ticket = match self.admit_keys(transport, keys).await {
            Ok(ticket) => ticket,
            Err(held) => return Err(self.refusal(transport, held)),
        };
        let result = send().await;
        ticket.finish(&result).await;
        result
    }

    /// Asks each breaker of `envelope` for leave; the first refusal answers for all.
    pub(crate) async fn admit<'a>(
        &'a self,
        transport: &'a str,
        envelope: &Envelope,
    ) -> Result<Ticket<'a>, HeldBack> {
        let keys = match &self.scope {
            Scope::Transport => Keys::One(Cow::Borrowed(transport)),
            // A batch keeps its tickets after the inner transport took the message.
            scope => scope.keys(transport, envelope).into_owned(),
        };
        self.admit_keys(transport, keys).await
    }

    /// Asks the breaker of each of `keys` for leave; the first refusal answers for all.
    pub(crate) async fn admit_keys<'a>(
        &'a self,
        transport: &'a str,
        keys: Keys<'a>,
    ) -> Result<Ticket<'a>, HeldBack> {
        match keys {
            Keys::One(key) => {
                let permit = self.acquire(transport, &key).await?;
                Ok(Ticket {
                    gate: self,
                    transport,
                    permits: Permits::One(key, permit),
                    started: self.started(transport),
                })
            }
            Keys::Many(keys) => {
                let mut ticket = Ticket {
                    gate: self,
                    transport,
                    permits: Permits::Many(Vec::with_capacity(keys.len())),
                    started: None,
                };
                for key in keys {
                    // On a refusal, dropping `ticket` gives back the permits already granted.
                    let permit = self.acquire(transport, &key).await?;
                    if let Permits::Many(permits) = &mut ticket.permits {
                        permits.push((key, permit));
                    }
                }
                ticket.started = self.started(transport);
                Ok(ticket)
            }
        }
    }

    /// Leave to send for `key`: a permit, or none in shadow mode when the breaker would refuse.
    async fn acquire(&self, transport: &str, key: &str) -> Result<Option<Permit>, HeldBack> {
        let (decision, transitions) = (self.store)
            .acquire_in(transport, key, &self.rules, &self.late)
            .await;
        self.announce(transport, key, transitions);
        match decision {
            Decision::Send(permit) => Ok(Some(permit)),
            refused => self.refused(transport, key, refused),
        }
    }

    /// A send the store refused: held back, or let go without a permit in shadow mode.
    fn refused(
        &self,
        transport: &str,
        key: &str,
        decision: Decision,
    ) -> Result<Option<Permit>, HeldBack> {
        if self.shadow {
            return Ok(None); // logged once, at the change of state
        }
        let retry_after = match decision {
            Decision::Refuse { retry_after } => Some(retry_after),
            Decision::Isolated | Decision::Send(_) => None,
        };
        tracing::debug!(
            transport,
            key,
            retry_after_ms = retry_after.map(|after| after.as_millis() as u64),
            "breaker.refused"
        );
        Err(HeldBack { retry_after })
    }

    /// Tells the listener and the logs of `transitions`, if there are any.
    pub(crate) fn announce(&self, transport: &str, key: &str, transitions: Transitions) {
        if !transitions.is_empty() {
            announce(
                self.listener.as_ref(),
                &self.recording,
                transport,
                key,
                transitions,
                self.shadow,
                Some(&self.history),
            );
        }
    }

    /// The answer to a send the breaker held back.
    pub(crate) fn refusal(&self, transport: &str, held: HeldBack) -> SendError {
        self.recording.send_refused(transport);
        let error = match held.retry_after {
            Some(retry_after) => SendError::fixed(
                Category::ServiceUnavailable,
                "breaker.open",
                "the circuit breaker is open: the provider failed recently, nothing was sent",
            )
            .with_retry_after(retry_after),
            None => SendError::fixed(
                Category::ServiceUnavailable,
                "breaker.isolated",
                "the circuit breaker was isolated by hand until it is reset: nothing was sent",
            ),
        };
        // Nothing was sent: a breaker around this one counts the refusal for nothing.
        let mut error = error.not_attempted();
        // One breaker for the whole transport, or an isolation (which holds every key), holds
        // back every message; a breaker of one recipient domain holds back only that domain's.
        if matches!(self.scope, Scope::Transport) || held.retry_after.is_none() {
            error = error.refusing_every_message();
        }
        if *self.transport_name == *transport {
            error.with_shared_transport(&self.transport_name)
        } else {
            // The transport was renamed through `inner_mut` since the breaker was built.
            error.with_transport(transport)
        }
    }

    /// Counts one result in the breaker of `key`.
    async fn report(&self, transport: &str, key: &str, permit: Permit, outcome: Outcome) {
        let transitions = self
            .store
            .record(key, &self.rules, permit, outcome, &self.late)
            .await;
        self.announce(transport, key, transitions);
    }

    /// How the breaker counts `result` of a send let go at `started` (set when slow calls
    /// count): a success slower than the slow-call time is a failure, though delivered.
    pub(crate) fn outcome(
        &self,
        result: &Result<Receipt, SendError>,
        started: Option<Instant>,
    ) -> Outcome {
        match result {
            Err(error) if (self.is_failure)(error) => Outcome::Failure,
            Ok(_) if self.is_slow(started) => Outcome::Failure,
            _ => Outcome::Success,
        }
    }

    /// Whether a send's result counts only by whether it failed: no slow calls to time. A
    /// send let go by a breaker closed with nothing counted then holds only its permit, and
    /// under the `metrics` feature when it went (see [`LocalSend`](super::future::LocalSend)).
    #[inline]
    pub(crate) fn counts_plainly(&self) -> bool {
        self.slow_call.is_none()
    }

    /// When a send of `transport` let go now started, read only if slow calls or the
    /// recorder's send-time histogram need it.
    fn started(&self, transport: &str) -> Option<Instant> {
        (self.slow_call.is_some() || self.recording.times_sends(transport)).then(Instant::now)
    }

    fn is_slow(&self, started: Option<Instant>) -> bool {
        match (self.slow_call, started) {
            (Some(limit), Some(started)) => started.elapsed() > limit,
            _ => false,
        }
    }
}

impl Ticket<'_> {
    /// Reports how the send went to each of its breakers.
    ///
    /// A permit is spent only once its store has recorded it: a caller that drops this future
    /// while a (remote) store is still recording leaves the permit to `Drop`, which releases
    /// it, so a probe's slot is freed rather than held until the probe's deadline.
    pub(crate) async fn finish(mut self, result: &Result<Receipt, SendError>) {
        let (gate, transport) = (self.gate, self.transport);
        if !attempted(result) {
            // Neither a success nor a failure: `Drop` gives the permits back.
            return;
        }
        let outcome = gate.outcome(result, self.started);
        let counted = self.unspent().any(|(_, permit)| permit.is_some());
        let counted = counted.then_some(outcome);
        gate.recording
            .send_finished(transport, counted, self.started);
        for (key, permit) in self.unspent() {
            if let Some(granted) = *permit {
                gate.report(transport, key, granted, outcome).await;
                *permit = None;
            }
        }
    }

    /// Each breaker's key with its permit, `None` once spent.
    fn unspent(&mut self) -> impl Iterator<Item = (&str, &mut Option<Permit>)> {
        let (one, many) = match &mut self.permits {
            Permits::One(key, permit) => (Some((&**key, permit)), None),
            Permits::Many(permits) => (
                None,
                Some(permits.iter_mut().map(|(key, permit)| (&**key, permit))),
            ),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }
}

/// Whether `result` says anything of the provider: not when a wrapper below the breaker
/// refused the message before any send ([`SendError::is_not_attempted`]). Such a send gives
/// its permit back, as a cancelled one does (DESIGN §15).
#[inline]
pub(crate) fn attempted(result: &Result<Receipt, SendError>) -> bool {
    !matches!(result, Err(error) if error.is_not_attempted())
}

/// The permit of a send under one breaker, given back if the send is dropped unanswered.
pub(crate) struct Unspent<'a> {
    gate: &'a Gate,
    transport: &'a str,
    key: Cow<'a, str>,
    permit: Option<Permit>,
    /// When the send was let go, if slow calls or metrics need it.
    started: Option<Instant>,
}

impl Unspent<'_> {
    /// Whether its permit is the half-open breaker's probe.
    pub(crate) fn is_probe(&self) -> bool {
        self.permit.is_some_and(|permit| permit.is_probe())
    }

    /// The permit, for a caller that keeps it past this borrow of the gate (the tower
    /// layer's service, between `poll_ready` and the answer): that caller gives it back.
    #[cfg(feature = "tower")]
    pub(crate) fn into_permit(mut self) -> Option<Permit> {
        self.permit.take()
    }

    /// The key of the breaker that gave the permit.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// What to record of `result`: the permit and how it counts, unless the send went without
    /// one (in shadow mode, past a breaker that would refuse), or unless it was never
    /// attempted: then its permit stays, for `Drop` to give back.
    #[inline]
    pub(crate) fn counted(&self, result: &Result<Receipt, SendError>) -> Option<(Permit, Outcome)> {
        if !attempted(result) {
            return None;
        }
        let counted = self
            .permit
            .map(|permit| (permit, self.gate.outcome(result, self.started)));
        self.gate.recording.send_finished(
            self.transport,
            counted.map(|(_, outcome)| outcome),
            self.started,
        );
        counted
    }

    /// The permit is spent: the store recorded it and made `transitions`.
    pub(crate) fn recorded(&mut self, transitions: Transitions) {
        self.permit = None;
        self.gate.announce(self.transport, &self.key, transitions);
    }
}

impl Drop for Unspent<'_> {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            let gate = self.gate;
            gate.store
                .release(&self.key, &gate.rules, permit, &gate.late);
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let gate = self.gate;
        for (key, permit) in self.unspent() {
            if let Some(permit) = permit.take() {
                gate.store.release(key, &gate.rules, permit, &gate.late);
            }
        }
    }
}
