//! One call of the breaker script, owned so that it can run in a task of its own, and the
//! give-back of a probe granted to a caller who stopped waiting.

use std::sync::Arc;
use std::time::Duration;

use ::redis::Script;
use ::redis::aio::ConnectionManager;

use super::Failure;
use super::script::{self, Call, Reply};
use crate::machine::{Decision, Permit, Rules};

/// One call of the script, owned, to run where nothing borrows the store.
#[derive(Clone)]
pub(super) struct RemoteCall {
    pub(super) connection: ConnectionManager,
    pub(super) script: Arc<Script>,
    pub(super) name: String,
    pub(super) call: Call,
    pub(super) arguments: Vec<u64>,
    pub(super) timeout: Duration,
    pub(super) idle_expiry: Duration,
}

impl RemoteCall {
    pub(super) async fn run(self) -> Result<Reply, Failure> {
        let mut connection = self.connection;
        let mut invocation = self.script.key(self.name);
        invocation.arg(script::call_name(self.call));
        for argument in self.arguments {
            invocation.arg(argument);
        }
        let values: Vec<i64> =
            tokio::time::timeout(self.timeout, invocation.invoke_async(&mut connection))
                .await
                .map_err(|_| Failure::Timeout(self.timeout))??;
        Ok(Reply::parse(values)?)
    }

    /// Runs the call with nobody waiting for it, logging a failure.
    pub(super) async fn run_in_background(self) {
        if let Err(error) = self.run().await {
            tracing::debug!(%error, "store.redis_release_failed: the probe's deadline frees its slot");
        }
    }

    /// The release of `permit`, on the same key as this call.
    fn into_release(mut self, permit: Permit) -> RemoteCall {
        self.call = Call::Release(permit);
        // The rules only set the key's expiry here, which a release does not renew.
        self.arguments = script::arguments(self.call, &Rules::default(), self.idle_expiry);
        self
    }
}

/// An acquire under way in its own task. Dropped before its answer was read, it waits for
/// that answer in the background and gives back a probe that Redis granted to nobody.
pub(super) struct GiveBack {
    pub(super) answer: Option<tokio::task::JoinHandle<Result<Reply, Failure>>>,
    pub(super) acquire: RemoteCall,
}

impl GiveBack {
    pub(super) async fn answer(mut self) -> Result<Reply, Failure> {
        let result = match &mut self.answer {
            Some(answer) => answer.await,
            None => return Err(Failure::Task("no acquire under way".to_owned())),
        };
        self.answer = None; // read by its caller: nothing to give back
        result.unwrap_or_else(|join| Err(Failure::Task(join.to_string())))
    }
}

impl Drop for GiveBack {
    fn drop(&mut self) {
        let Some(answer) = self.answer.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // no runtime: the probe's deadline frees the slot
        };
        let acquire = self.acquire.clone();
        runtime.spawn(async move {
            if let Ok(Ok(reply)) = answer.await
                && let Decision::Send(permit) = reply.decision
                && permit.is_probe()
            {
                acquire.into_release(permit).run_in_background().await;
            }
        });
    }
}
