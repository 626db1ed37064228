//! A send's deadline, known to the whole stack (DESIGN §19, "A deadline, not a guess").
//!
//! The outermost layer that bounds a send (the outbox worker, at its `send_timeout`) runs it
//! inside [`scope`]. Every layer below reads the deadline through a `tokio::task_local!`,
//! as gRPC and Finagle propagate theirs, so [`Transport`](crate::Transport) and
//! [`Envelope`](crate::Envelope) do not change. Work the stack spawns into another task (a
//! token fetch) does not inherit a task-local: the spawner reads [`current`] and passes it
//! on explicitly ([`within`] sets it there).
//!
//! What each layer does with it:
//! - **A wait of known length** (a retry's sleep, a rate limiter's wait) that would end past
//!   the deadline ([`would_pass`]) is not started: the layer answers its last error at once,
//!   with any receipt it holds.
//! - **A wait of unknown length** (a pooled connection's slot, a connect, a token) is
//!   [`bounded`] by the deadline; cut, the layer answers not-attempted with the last error it
//!   holds (or its own `*.deadline` error).
//! - **A cut is maybe-delivered only when a try in flight may have reached the provider.**
//!   The scope keeps a progress cell the layers write: a wrapper that hands a try to its
//!   inner transport marks [`try_begins`] (untouched: a transport that marks nothing, a
//!   user's own or lettre's, is taken as having reached the provider); a transport that
//!   knows better marks [`not_reached`] when its try starts and [`may_have_reached`] once
//!   it may have (the crate's SMTP client at `DATA` or `BDAT`, the HTTP and SES adapters
//!   when the request is handed to the client); a wrapper whose try answered marks
//!   [`try_answered`], so that its wait for the next try is not taken for a try in flight.
//!   A try that answered delivered (or maybe delivered) keeps the scope "reached" for good:
//!   a cut then throws that answer away, and the message may be with the provider.
//!
//! Without a scope (a send outside the worker) every function here is a no-op costing one
//! thread-local read, and nothing allocates.

use std::cell::Cell;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::{Receipt, SendError};

tokio::task_local! {
    static DEADLINE: Scope;
}

/// The state a [`scope`] shares with the layers below it.
struct Scope {
    at: Instant,
    /// What the try in flight (if any) has done.
    in_flight: Cell<Progress>,
    /// A try answered delivered, or maybe delivered: sticky.
    answered_reached: Cell<bool>,
}

/// What the try in flight has done, as far as the layers below said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    /// No transport marked anything: it may have reached the provider.
    Untouched,
    /// A transport said nothing of this try has gone yet, or no try is in flight.
    NotReached,
    /// A transport said the provider may have the message.
    MayHaveReached,
}

/// A send cut at its deadline.
#[cfg_attr(not(feature = "outbox"), allow(dead_code))] // the worker's
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cut {
    /// A try in flight at the cut may have reached the provider (or an earlier try's
    /// delivery was thrown away by the cut): answer it maybe-delivered.
    pub(crate) may_have_reached: bool,
}

/// Runs `send` with `deadline` known to every layer inside it, and cuts it there. Scopes
/// nest: the inner one's deadline is the earlier of both, and what it learnt of its tries
/// is passed to the outer one. `Err(Cut)` says whether the cut send may have reached the
/// provider.
#[cfg_attr(not(feature = "outbox"), allow(dead_code))] // the worker's
pub(crate) async fn scope<F: Future>(deadline: Instant, send: F) -> Result<F::Output, Cut> {
    let at = current().map_or(deadline, |outer| outer.min(deadline));
    let state = Scope {
        at,
        in_flight: Cell::new(Progress::Untouched),
        answered_reached: Cell::new(false),
    };
    let (result, in_flight, answered_reached) = DEADLINE
        .scope(state, async move {
            let result = tokio::select! {
                // The send first: a layer bounded by the same instant answers its own cut,
                // which says more than this one.
                biased;
                output = send => Ok(output),
                () = tokio::time::sleep_until(at) => Err(Cut { may_have_reached: reached() }),
            };
            let (in_flight, answered) = DEADLINE
                .try_with(|s| (s.in_flight.get(), s.answered_reached.get()))
                .unwrap_or((Progress::Untouched, false));
            (result, in_flight, answered)
        })
        .await;
    // An outer scope learns what this one's tries did.
    let _ = DEADLINE.try_with(|outer| {
        outer.in_flight.set(in_flight);
        if answered_reached {
            outer.answered_reached.set(true);
        }
    });
    result
}

/// Runs `work` with `deadline` known inside it, without cutting it: for work spawned into
/// its own task, which does not inherit the spawner's task-locals (pass it
/// [`current`]`()`). `None` runs `work` as it is.
#[allow(dead_code)] // the OAuth token fetch's (issue 62, point 8)
pub(crate) async fn within<F: Future>(deadline: Option<Instant>, work: F) -> F::Output {
    match deadline {
        Some(at) => {
            let state = Scope {
                at,
                in_flight: Cell::new(Progress::NotReached),
                answered_reached: Cell::new(false),
            };
            DEADLINE.scope(state, work).await
        }
        None => work.await,
    }
}

/// The deadline of the send this task is running, if a layer above set one.
pub(crate) fn current() -> Option<Instant> {
    DEADLINE.try_with(|s| s.at).ok()
}

/// Whether a wait of `wait` starting now would end at the deadline or past it: then it is
/// not started (the try after it would be cut at once), and the layer answers its last
/// error at once. `false` without a deadline.
pub(crate) fn would_pass(wait: Duration) -> bool {
    current().is_some_and(|at| crate::time::later(Instant::now(), wait) >= at)
}

/// `wait` bounded by the deadline: its output, or `on_cut()`'s once the deadline comes
/// first. Without a deadline, `wait` as it is. For waits of unknown length; `on_cut`
/// answers not-attempted with the last error the layer holds.
#[cfg_attr(not(feature = "smtp"), allow(dead_code))] // the SMTP client's (and OAuth's)
pub(crate) async fn bounded<F, T>(wait: F, on_cut: impl FnOnce() -> T) -> T
where
    F: Future<Output = T>,
{
    match current() {
        Some(at) => {
            tokio::select! {
                biased;
                output = wait => output,
                () = tokio::time::sleep_until(at) => on_cut(),
            }
        }
        None => wait.await,
    }
}

/// A wrapper hands a try to its inner transport: until that transport says otherwise, a
/// cut takes the try as having reached the provider.
pub(crate) fn try_begins() {
    set_in_flight(Progress::Untouched);
}

/// A wrapper's try answered `result`: no try is in flight now. A delivery or a
/// maybe-delivered error keeps the scope reached for good: a cut would throw it away.
pub(crate) fn try_answered(result: &Result<Receipt, SendError>) {
    let _ = DEADLINE.try_with(|s| {
        s.in_flight.set(Progress::NotReached);
        if result
            .as_ref()
            .map_or_else(SendError::is_maybe_delivered, |_| true)
        {
            s.answered_reached.set(true);
        }
    });
}

/// A transport that knows where its try is says nothing of it has gone yet: called when
/// its try starts (before it waits for a connection).
#[cfg_attr(not(feature = "smtp"), allow(dead_code))] // the SMTP client's
pub(crate) fn not_reached() {
    set_in_flight(Progress::NotReached);
}

/// A transport's try may have reached the provider: the SMTP client wrote `DATA` or
/// `BDAT`, an HTTP or SES adapter handed its request to the client.
#[cfg_attr(
    not(any(
        feature = "smtp",
        feature = "ses",
        feature = "postmark",
        feature = "resend",
        feature = "sendgrid",
        feature = "mailgun"
    )),
    allow(dead_code)
)] // the SMTP client's, SES's and the HTTP adapters'
pub(crate) fn may_have_reached() {
    set_in_flight(Progress::MayHaveReached);
}

fn set_in_flight(progress: Progress) {
    let _ = DEADLINE.try_with(|s| s.in_flight.set(progress));
}

/// Whether a cut now may throw away a message the provider has.
#[cfg_attr(not(feature = "outbox"), allow(dead_code))] // the worker's
fn reached() -> bool {
    DEADLINE
        .try_with(|s| s.answered_reached.get() || s.in_flight.get() != Progress::NotReached)
        .unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_a_second() -> Instant {
        Instant::now() + Duration::from_secs(1)
    }

    #[tokio::test(start_paused = true)]
    async fn a_send_that_marks_nothing_is_cut_as_maybe_reached() {
        let cut = scope(in_a_second(), std::future::pending::<()>()).await;
        assert_eq!(
            cut,
            Err(Cut {
                may_have_reached: true
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_send_cut_before_it_wrote_anything_is_cut_as_not_reached() {
        let cut = scope(in_a_second(), async {
            not_reached();
            std::future::pending::<()>().await
        })
        .await;
        assert_eq!(
            cut,
            Err(Cut {
                may_have_reached: false
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_send_cut_after_it_may_have_reached_is_cut_as_maybe_reached() {
        let cut = scope(in_a_second(), async {
            not_reached();
            may_have_reached();
            std::future::pending::<()>().await
        })
        .await;
        assert_eq!(
            cut,
            Err(Cut {
                may_have_reached: true
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_try_that_answered_a_failure_does_not_count_at_the_cut() {
        let cut = scope(in_a_second(), async {
            try_begins();
            may_have_reached();
            try_answered(&Err(SendError::new(
                crate::Category::ServerError,
                "smtp.451",
                "later",
            )));
            std::future::pending::<()>().await
        })
        .await;
        assert_eq!(
            cut,
            Err(Cut {
                may_have_reached: false
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_next_try_through_a_transport_that_marks_nothing_is_cut_as_maybe_reached() {
        let cut = scope(in_a_second(), async {
            not_reached();
            try_answered(&Err(SendError::new(
                crate::Category::ServerError,
                "smtp.451",
                "later",
            )));
            try_begins();
            std::future::pending::<()>().await
        })
        .await;
        assert_eq!(
            cut,
            Err(Cut {
                may_have_reached: true
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_outer_scope_cut_after_an_inner_one_delivered_is_cut_as_maybe_reached() {
        let at = in_a_second();
        let cut = scope(at, async {
            let inner = scope(at + Duration::from_secs(1), async {
                try_answered(&Ok(Receipt::new("inner")));
            })
            .await;
            assert_eq!(inner, Ok(()));
            // The next try, stuck before it sent anything: the delivery above still counts.
            not_reached();
            std::future::pending::<()>().await
        })
        .await;
        assert_eq!(
            cut,
            Err(Cut {
                may_have_reached: true
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_try_that_answered_maybe_delivered_counts_at_the_cut_for_good() {
        let cut = scope(in_a_second(), async {
            try_answered(&Err(SendError::new(
                crate::Category::Timeout,
                "smtp.timeout",
                "no answer to the dot",
            )
            .maybe_delivered()));
            try_begins();
            not_reached();
            std::future::pending::<()>().await
        })
        .await;
        assert_eq!(
            cut,
            Err(Cut {
                may_have_reached: true
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_is_known_inside_the_scope_and_not_outside() {
        let at = in_a_second();
        assert_eq!(current(), None);
        assert_eq!(scope(at, async { current() }).await, Ok(Some(at)));
        let earlier = at - Duration::from_millis(500);
        let nested = scope(at, scope(earlier, async { current() })).await;
        assert_eq!(nested, Ok(Ok(Some(earlier))));
        assert_eq!(within(Some(at), async { current() }).await, Some(at));
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_that_would_pass_the_deadline_is_known_before_it_starts() {
        let verdict = scope(in_a_second(), async {
            (
                would_pass(Duration::from_secs(2)),
                would_pass(Duration::from_secs(1)),
                would_pass(Duration::from_millis(500)),
            )
        })
        .await;
        // A wait ending at the deadline itself leaves its next try no time: not started.
        assert_eq!(verdict, Ok((true, true, false)));
        assert!(!would_pass(Duration::MAX));
    }

    #[tokio::test(start_paused = true)]
    async fn a_bounded_wait_answers_its_cut_at_the_deadline() {
        let answer = scope(in_a_second(), async {
            not_reached();
            bounded(std::future::pending::<&str>(), || "cut").await
        })
        .await;
        assert_eq!(answer, Ok("cut"));
        assert_eq!(bounded(async { "done" }, || "cut").await, "done");
    }
}
