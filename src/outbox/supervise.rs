//! Keeps an outbox worker running for as long as its owner wants it: a worker that ends
//! without being stopped (a panic outside any send, an error) is started again, and why is
//! logged. `Mailer` runs its worker through this.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};

use crate::{Category, SendError};

/// The wait before a worker that ended is started again, so that one ending at once each
/// time does not spin.
pub(crate) const RESTART_WAIT: Duration = Duration::from_secs(1);

/// The shutdown signal each run of the worker is handed: completes once the owner stops it.
pub(crate) type Stopped = Shared<BoxFuture<'static, ()>>;

/// Runs `run` (one run of the worker, until the shutdown future it is handed completes)
/// until `stopped` completes. A run that ends otherwise is logged (`tracing` error
/// `outbox.worker_restarted`, and a counter under the `metrics` feature) and started again
/// after [`RESTART_WAIT`]; one refused for its settings (`Configuration`) is not, as it
/// would end again the same way.
pub(crate) async fn supervise<F, R>(stopped: Stopped, mut run: F)
where
    F: FnMut(Stopped) -> R,
    R: Future<Output = Result<(), SendError>>,
{
    loop {
        let ended = AssertUnwindSafe(run(stopped.clone())).catch_unwind().await;
        if stopped.peek().is_some() {
            return;
        }
        let why = match ended {
            Ok(Ok(())) => String::from("run returned while not stopped"),
            Ok(Err(error)) if error.category() == Category::Configuration => {
                tracing::error!(error = %error, "outbox.worker_stopped");
                return;
            }
            Ok(Err(error)) => error.to_string(),
            Err(panic) => crate::panicked::panicked("outbox worker", panic.as_ref()).to_string(),
        };
        tracing::error!(why = %why, "outbox.worker_restarted");
        super::gauges::worker_restarted();
        tokio::select! {
            () = tokio::time::sleep(RESTART_WAIT) => {}
            () = stopped.clone() => return,
        }
    }
}

/// The shutdown signal of [`supervise`] from a one-shot receiver: completes when the
/// sender sends or is dropped.
pub(crate) fn stopped_by(receiver: tokio::sync::oneshot::Receiver<()>) -> Stopped {
    async move {
        let _ = receiver.await;
    }
    .boxed()
    .shared()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Supervises a worker that panics, then fails, then runs until stopped; stops it after
    /// three restart waits. How many times it was run before the stop, and in all.
    async fn panic_then_fail_then_run_until_stopped() -> (usize, usize) {
        let (stop, receiver) = tokio::sync::oneshot::channel::<()>();
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&runs);
        let supervised = tokio::spawn(supervise(stopped_by(receiver), move |stopped| {
            let run = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                match run {
                    0 => panic!("a bug in the worker"),
                    1 => Err(SendError::new(
                        Category::ServiceUnavailable,
                        "test.down",
                        "down",
                    )),
                    _ => {
                        stopped.await;
                        Ok(())
                    }
                }
            }
        }));
        tokio::time::sleep(RESTART_WAIT * 3).await;
        let before_stop = runs.load(Ordering::SeqCst);
        stop.send(()).expect("still supervised");
        supervised.await.expect("the supervisor ends when stopped");
        (before_stop, runs.load(Ordering::SeqCst))
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_that_panicked_or_failed_is_started_again_until_it_is_stopped() {
        let (before_stop, in_all) = panic_then_fail_then_run_until_stopped().await;
        assert_eq!(before_stop, 3, "run after a panic and after an error");
        assert_eq!(in_all, 3, "not started again once stopped");
    }

    #[cfg(feature = "metrics")]
    #[tokio::test(start_paused = true)]
    async fn each_start_after_a_panic_or_a_failure_is_counted() {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        // The test's runtime runs its tasks on this thread, where the recorder is set.
        let _guard = ::metrics::set_default_local_recorder(&recorder);
        panic_then_fail_then_run_until_stopped().await;
        let restarts: u64 = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name() == crate::metrics::OUTBOX_WORKER_RESTARTS_TOTAL)
            .map(|(.., value)| match value {
                metrics_util::debugging::DebugValue::Counter(count) => count,
                _ => 0,
            })
            .sum();
        assert_eq!(restarts, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_refused_for_its_settings_is_not_started_again() {
        let (_stop, receiver) = tokio::sync::oneshot::channel::<()>();
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&runs);
        supervise(stopped_by(receiver), move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
            async {
                Err(SendError::new(
                    Category::Configuration,
                    "outbox.config",
                    "bad",
                ))
            }
        })
        .await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}
