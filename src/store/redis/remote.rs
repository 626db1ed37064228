//! One call of the breaker script, owned so that it runs in a task of its own, and what is
//! done with an answer that comes after its caller stopped waiting.
//!
//! A call that Redis ran cannot be taken back: the caller may give up at the store's timeout
//! or drop its future, but the script may still run on the server. So each call runs in a
//! task, and an answer nobody read is settled there: its changes of state go to the call's
//! [`Reporter`], and a probe it granted goes back at once (rather than being held by nobody
//! until its deadline reopens the breaker for the whole fleet).

use std::sync::Arc;
use std::time::Duration;

use ::redis::Script;
use tokio::task::JoinHandle;

use super::Failure;
use super::connection::Connection;
use super::script::{self, Call, Reply};
use crate::machine::{Decision, Permit, Rules};
use crate::store::Reporter;

/// How long a call's task waits for a late answer after its caller gave up: past that,
/// nothing is settled, and a granted probe is freed by its deadline.
const LATE_ANSWER_LIMIT: Duration = Duration::from_secs(10);

/// One call of the script, owned, to run where nothing borrows the store.
#[derive(Clone)]
pub(super) struct RemoteCall {
    pub(super) connection: Connection,
    pub(super) script: Arc<Script>,
    pub(super) key: String,
    /// The breaker's hash in Redis.
    pub(super) name: String,
    /// The set of members beside it.
    pub(super) members: String,
    /// For an acquire, the flag that isolates the whole breaker (DESIGN §19).
    pub(super) isolation: Option<String>,
    /// This process's name in the fleet.
    pub(super) member: Arc<str>,
    pub(super) quorum: u32,
    pub(super) call: Call,
    pub(super) rules: Rules,
    pub(super) timeout: Duration,
    pub(super) idle_expiry: Duration,
    /// A test's time in microseconds, for the script to read instead of the server's clock.
    pub(super) told_now: Option<u64>,
}

impl RemoteCall {
    /// Runs the call here, giving up after the store's timeout: for callers without a runtime
    /// to spawn on.
    pub(super) async fn run_within_timeout(self) -> Result<Reply, Failure> {
        let timeout = self.timeout;
        tokio::time::timeout(timeout, self.run(timeout))
            .await
            .map_err(|_| Failure::Timeout(timeout))?
    }

    async fn run(self, limit: Duration) -> Result<Reply, Failure> {
        Ok(Reply::parse(self.values(limit).await?)?)
    }

    /// The script's reply as it came, within `limit`.
    pub(super) async fn values(self, limit: Duration) -> Result<Vec<i64>, Failure> {
        tokio::time::timeout(limit, self.values_now())
            .await
            .map_err(|_| Failure::Timeout(limit))?
    }

    async fn values_now(self) -> Result<Vec<i64>, Failure> {
        let mut connection = self.connection;
        let mut invocation = self.script.key(self.name);
        invocation.key(self.members);
        match (self.isolation, &mut connection) {
            // One server: the script reads the flag in the same call, one round trip.
            (Some(flag), Connection::Single(_)) => {
                invocation.key(flag);
            }
            // A cluster keeps the flag on its own slot, which a script on the key's slot
            // may not read: it is asked first, a round trip more while the fleet shares a
            // cluster.
            (Some(flag), Connection::Cluster(_)) => {
                let isolated: i64 = ::redis::cmd("EXISTS")
                    .arg(flag)
                    .query_async(&mut connection)
                    .await?;
                if isolated == 1 {
                    // Refused as isolated; the key's state, not read, is told as closed.
                    return Ok(vec![0, 0, 0, -1, 0]);
                }
            }
            (None, _) => {}
        }
        invocation
            .arg(script::call_name(self.call))
            .arg(&*self.member);
        for argument in script::arguments(self.call, &self.rules, self.idle_expiry, self.quorum) {
            invocation.arg(argument);
        }
        if let Some(now) = self.told_now {
            invocation.arg(now);
        }
        invocation
            .invoke_async(&mut connection)
            .await
            .map_err(Failure::from)
    }

    /// Starts the call in a task of its own on `runtime`; see [`InFlight`].
    pub(super) fn start(self, runtime: &tokio::runtime::Handle, late: Reporter) -> InFlight {
        let limit = self.timeout.max(LATE_ANSWER_LIMIT);
        let answer = runtime.spawn(self.clone().run(limit));
        InFlight {
            answer: Some(answer),
            call: self,
            late,
        }
    }

    /// The release of `permit`, on the same key as this call.
    fn into_release(mut self, permit: Permit) -> RemoteCall {
        self.call = Call::Release(permit);
        self.isolation = None;
        self
    }
}

/// A call under way in its own task. Its caller waits for it up to the store's timeout; if
/// the caller stops waiting first (the timeout passed, or its future was dropped), the
/// answer is settled in the background when it comes.
pub(super) struct InFlight {
    answer: Option<JoinHandle<Result<Reply, Failure>>>,
    call: RemoteCall,
    late: Reporter,
}

impl InFlight {
    /// The call's answer, or a failure once the store's timeout has passed.
    pub(super) async fn answer(mut self) -> Result<Reply, Failure> {
        let timeout = self.call.timeout;
        let Some(answer) = self.answer.as_mut() else {
            return Err(Failure::Task("no call under way".to_owned()));
        };
        let joined = match tokio::time::timeout(timeout, answer).await {
            Ok(joined) => joined,
            // Dropping `self` leaves the answer to be settled when it comes.
            Err(_) => return Err(Failure::Timeout(timeout)),
        };
        self.answer = None; // read by its caller: nothing to settle
        joined.unwrap_or_else(|join| Err(Failure::Task(join.to_string())))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let Some(answer) = self.answer.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // no runtime: a granted probe is freed by its deadline
        };
        let call = self.call.clone();
        let late = self.late.clone();
        runtime.spawn(async move {
            if let Ok(Ok(reply)) = answer.await {
                settle(call, reply, &late).await;
            }
        });
    }
}

/// What an answer nobody read still asks for: its changes told, its probe given back.
async fn settle(call: RemoteCall, reply: Reply, late: &Reporter) {
    late.report(&call.key, reply.transitions);
    if let Call::Acquire = call.call
        && let Decision::Send(permit) = reply.decision
        && permit.is_probe()
    {
        let key = call.key.clone();
        let limit = call.timeout.max(LATE_ANSWER_LIMIT);
        match call.into_release(permit).run(limit).await {
            Ok(released) => late.report(&key, released.transitions),
            Err(error) => tracing::debug!(
                %error,
                "store.redis_release_failed: the probe's deadline frees its slot"
            ),
        }
    }
}

/// Sends a release with nobody waiting for it, and reports the changes it made.
pub(super) async fn release_in_background(call: RemoteCall, late: Reporter) {
    let key = call.key.clone();
    let limit = call.timeout.max(LATE_ANSWER_LIMIT);
    match call.run(limit).await {
        Ok(reply) => late.report(&key, reply.transitions),
        Err(error) => tracing::debug!(
            %error,
            "store.redis_release_failed: the probe's deadline frees its slot"
        ),
    }
}
