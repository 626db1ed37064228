//! One scenario sent through a stack built by hand and through the same stack built from its
//! DSN and from its TOML: what each saw, to compare (the `config_equivalence*` tests).

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;

use mail_breaker::config::Mailer;
use mail_breaker::{Receipt, SendError, State, Transport};
use metrics_util::debugging::{DebuggingRecorder, Snapshotter};

use super::message;

/// What one run saw: each send's answer, the breakers' states after it, and the names of the
/// metrics recorded.
#[derive(Debug, PartialEq)]
pub struct Seen {
    pub answers: Vec<String>,
    pub states: Vec<Vec<State>>,
    pub metrics: BTreeSet<String>,
}

/// Reads the breakers' states, in the configuration's order.
pub type States<'a> = Box<dyn Fn() -> Pin<Box<dyn Future<Output = Vec<State>> + 'a>> + 'a>;

/// A send's answer as a scenario compares it: the server's reply, `queued` for a message the
/// outbox kept, `sent` for a receipt without a reply (an API's), or the error's code.
pub fn answer(result: &Result<Receipt, SendError>) -> String {
    match result {
        Ok(receipt) if receipt.is_queued() => "queued".to_owned(),
        Ok(receipt) => receipt.response().unwrap_or("sent").to_owned(),
        Err(error) => error.code().to_owned(),
    }
}

/// Sends `steps` messages through `stack`, calling `before(step)` before each (to switch a
/// server's mode), and reads the breakers' states after each.
pub async fn run(
    stack: &dyn Transport,
    states: States<'_>,
    steps: usize,
    before: impl Fn(usize),
    snapshotter: &Snapshotter,
) -> Seen {
    let mut seen = Seen {
        answers: Vec::new(),
        states: Vec::new(),
        metrics: BTreeSet::new(),
    };
    for step in 0..steps {
        before(step);
        seen.answers.push(answer(&stack.send(&message()).await));
        seen.states.push(states().await);
    }
    seen.metrics = metric_names(snapshotter);
    seen
}

/// The names of the metrics recorded so far.
pub fn metric_names(snapshotter: &Snapshotter) -> BTreeSet<String> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, ..)| key.key().name().to_owned())
        .collect()
}

/// A recorder for this thread (run each scenario on a current-thread runtime).
pub fn recorder() -> (Snapshotter, metrics::LocalRecorderGuard<'static>) {
    let recorder: &'static DebuggingRecorder = Box::leak(Box::new(DebuggingRecorder::new()));
    let guard = metrics::set_default_local_recorder(recorder);
    (recorder.snapshotter(), guard)
}

/// The mailer `config` describes: TOML when it holds a table, else a DSN.
pub async fn built(config: &str) -> Mailer {
    let read = if config.contains("[[member]]") {
        Mailer::from_toml(config)
    } else {
        Mailer::from_dsn(config)
    };
    read.unwrap_or_else(|error| panic!("{config}: {error}"))
        .build()
        .await
        .unwrap_or_else(|error| panic!("{config}: {error}"))
}

/// Reads the states of the mailer's breakers, in the configuration's order.
pub fn states_of(mailer: &Mailer) -> States<'_> {
    Box::new(|| {
        Box::pin(async {
            mailer
                .breakers()
                .map(|(_, breaker)| breaker.state())
                .collect()
        })
    })
}

/// Fills `{name}` in `config` with each value.
pub fn filled(config: &str, values: &[(&str, String)]) -> String {
    values
        .iter()
        .fold(config.to_owned(), |config, (name, value)| {
            config.replace(&format!("{{{name}}}"), value)
        })
}
