//! The breaker's shell around its store: asks for leave before a send, reports the result
//! after, and gives a probe back when its caller stops waiting.

use std::borrow::Cow;
use std::sync::Arc;

use super::events::{Listener, announce};
use super::machine::{Decision, Outcome, Permit, Rules};
use super::scope::{Keys, Scope};
use crate::store::BreakerStore;
use crate::{Category, Envelope, Receipt, SendError};

/// What decides a result is the provider failing.
pub(crate) type FailurePredicate = Arc<dyn Fn(&SendError) -> bool + Send + Sync>;

/// Everything a breaker decides with, apart from the transport it guards.
pub(crate) struct Gate {
    pub(crate) rules: Rules,
    pub(crate) scope: Scope,
    pub(crate) store: Arc<dyn BreakerStore>,
    pub(crate) is_failure: FailurePredicate,
    pub(crate) listener: Option<Listener>,
}

/// Leave to send one message: the permits of each of its breakers. Dropped unused, it
/// gives them back, so a probe whose caller went away frees its slot at once.
pub(crate) struct Ticket<'a> {
    gate: &'a Gate,
    transport: &'a str,
    permits: Permits<'a>,
}

enum Permits<'a> {
    One(Cow<'a, str>, Option<Permit>),
    Many(Vec<(String, Option<Permit>)>),
}

impl Gate {
    /// Asks each breaker of `envelope` for leave; the first refusal answers for all.
    pub(crate) async fn admit<'a>(
        &'a self,
        transport: &'a str,
        envelope: &Envelope,
    ) -> Result<Ticket<'a>, SendError> {
        match self.scope.keys(transport, envelope) {
            Keys::One(key) => {
                let permit = self.acquire(transport, &key).await?;
                Ok(Ticket {
                    gate: self,
                    transport,
                    permits: Permits::One(key, Some(permit)),
                })
            }
            Keys::Many(keys) => {
                let mut ticket = Ticket {
                    gate: self,
                    transport,
                    permits: Permits::Many(Vec::with_capacity(keys.len())),
                };
                for key in keys {
                    // On a refusal, dropping `ticket` gives back the permits already granted.
                    let permit = self.acquire(transport, &key).await?;
                    if let Permits::Many(permits) = &mut ticket.permits {
                        permits.push((key, Some(permit)));
                    }
                }
                Ok(ticket)
            }
        }
    }

    async fn acquire(&self, transport: &str, key: &str) -> Result<Permit, SendError> {
        let (decision, transitions) = self.store.acquire(key, &self.rules).await;
        announce(self.listener.as_ref(), transport, key, transitions);
        match decision {
            Decision::Send(permit) => Ok(permit),
            Decision::Refuse { retry_after } => {
                tracing::debug!(
                    transport,
                    key,
                    retry_after_ms = retry_after.as_millis() as u64,
                    "breaker.refused"
                );
                Err(refusal(transport, retry_after))
            }
        }
    }

    /// How the breaker counts `result`.
    pub(crate) fn outcome(&self, result: &Result<Receipt, SendError>) -> Outcome {
        match result {
            Err(error) if (self.is_failure)(error) => Outcome::Failure,
            _ => Outcome::Success,
        }
    }
}

impl Ticket<'_> {
    /// Reports how the send went to each of its breakers.
    ///
    /// A permit is spent only once its store has recorded it: a caller that drops this future
    /// while a (remote) store is still recording leaves the permit to `Drop`, which releases
    /// it, so a probe's slot is freed rather than held until the probe's deadline.
    pub(crate) async fn finish(mut self, outcome: Outcome) {
        let (gate, transport) = (self.gate, self.transport);
        for (key, permit) in self.unspent() {
            if let Some(granted) = *permit {
                let transitions = gate.store.record(key, &gate.rules, granted, outcome).await;
                *permit = None;
                announce(gate.listener.as_ref(), transport, key, transitions);
            }
        }
    }

    /// Each breaker's key with its permit, `None` once spent.
    fn unspent(&mut self) -> impl Iterator<Item = (&str, &mut Option<Permit>)> {
        let (one, many) = match &mut self.permits {
            Permits::One(key, permit) => (Some((&**key, permit)), None),
            Permits::Many(permits) => (
                None,
                Some(
                    permits
                        .iter_mut()
                        .map(|(key, permit)| (key.as_str(), permit)),
                ),
            ),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let gate = self.gate;
        for (key, permit) in self.unspent() {
            if let Some(permit) = permit.take() {
                gate.store.release(key, permit);
            }
        }
    }
}

/// The answer to a send the breaker holds back.
fn refusal(transport: &str, retry_after: std::time::Duration) -> SendError {
    SendError::fixed(
        Category::ServiceUnavailable,
        "breaker.open",
        "the circuit breaker is open: the provider failed recently, nothing was sent",
    )
    .with_retry_after(retry_after)
    .with_transport(transport)
}
