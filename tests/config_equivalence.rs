//! The README's stacks built by hand, and the same stacks from their DSN and their TOML,
//! behave the same: the same scenario against fresh embedded SMTP servers gives the same
//! answers, the same breaker states after each send, and the same metrics.
#![cfg(all(feature = "config", feature = "smtp", feature = "metrics"))]

mod support;

#[path = "../examples/support/mod.rs"]
mod embedded;

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use embedded::{EmbeddedSmtp, Mode};
use mail_breaker::config::Mailer;
use mail_breaker::{
    Backoff, CircuitBreakerTransport, PoolTransport, RetryTransport, SmtpTransport, State,
    Transport,
};
use metrics_util::debugging::{DebuggingRecorder, Snapshotter};
use support::message;

/// What one run saw: each send's answer (the server's reply, or the error's code), the
/// breakers' states after it, and the names of the metrics recorded.
#[derive(Debug, PartialEq)]
struct Seen {
    answers: Vec<String>,
    states: Vec<Vec<State>>,
    metrics: BTreeSet<String>,
}

type States<'a> = Box<dyn Fn() -> Pin<Box<dyn Future<Output = Vec<State>> + 'a>> + 'a>;

/// Sends `modes.len()` messages through `stack`, switching `servers[0]` to each mode before
/// each send, and reads the breakers' states after each.
async fn run(
    stack: &dyn Transport,
    states: States<'_>,
    server: &EmbeddedSmtp,
    modes: &[Mode],
    snapshotter: &Snapshotter,
) -> Seen {
    let mut seen = Seen {
        answers: Vec::new(),
        states: Vec::new(),
        metrics: BTreeSet::new(),
    };
    for mode in modes {
        server.set_mode(*mode);
        let answer = match stack.send(&message()).await {
            Ok(receipt) => receipt.response().unwrap_or_default().to_owned(),
            Err(error) => error.code().to_owned(),
        };
        seen.answers.push(answer);
        seen.states.push(states().await);
    }
    for (key, ..) in snapshotter.snapshot().into_vec() {
        seen.metrics.insert(key.key().name().to_owned());
    }
    seen
}

fn recorder() -> (Snapshotter, metrics::LocalRecorderGuard<'static>) {
    let recorder: &'static DebuggingRecorder = Box::leak(Box::new(DebuggingRecorder::new()));
    let guard = metrics::set_default_local_recorder(recorder);
    (recorder.snapshotter(), guard)
}

/// The mailer `config` describes: TOML when it holds a table, else a DSN.
async fn built(config: &str) -> Mailer {
    let read = if config.contains("[[member]]") {
        Mailer::from_toml(config)
    } else {
        Mailer::from_dsn(config)
    };
    read.unwrap().build().await.unwrap()
}

/// Reads the states of the mailer's breakers, in the configuration's order.
fn states_of(mailer: &Mailer) -> States<'_> {
    Box::new(|| {
        Box::pin(async {
            mailer
                .breakers()
                .map(|(_, breaker)| breaker.state())
                .collect()
        })
    })
}

/// The modes of the README's first example: three sends taken, then the server failing.
const ONE_BREAKER: [Mode; 9] = [
    Mode::Accept,
    Mode::Accept,
    Mode::Accept,
    Mode::Failing,
    Mode::Failing,
    Mode::Failing,
    Mode::Failing,
    Mode::Failing,
    Mode::Failing,
];

/// One breaker around an SMTP relay (the README's first example): by hand, from its DSN and
/// from its TOML.
#[tokio::test(flavor = "current_thread")]
async fn one_breaker_around_smtp_behaves_the_same_by_hand_from_its_dsn_and_from_its_toml() {
    let by_hand = {
        let server = EmbeddedSmtp::start();
        let (snapshotter, _guard) = recorder();
        let smtp = SmtpTransport::from_url(&format!("smtp://127.0.0.1:{}", server.port()))
            .unwrap()
            .build()
            .unwrap();
        let breaker = CircuitBreakerTransport::builder(smtp)
            .failure_threshold(5)
            .reset_timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        let states: States<'_> = Box::new(|| Box::pin(async { vec![breaker.state()] }));
        run(&breaker, states, &server, &ONE_BREAKER, &snapshotter).await
    };
    for config in [
        "smtp://127.0.0.1:{port}?breaker.threshold=5&breaker.reset=30s",
        "[[member]]\nurl = \"smtp://127.0.0.1:{port}\"\nbreaker = { threshold = 5, reset = \"30s\" }",
    ] {
        let server = EmbeddedSmtp::start();
        let (snapshotter, _guard) = recorder();
        let config = config.replace("{port}", &server.port().to_string());
        let mailer = built(&config).await;
        let states = states_of(&mailer);
        let seen = run(&mailer, states, &server, &ONE_BREAKER, &snapshotter).await;
        assert_eq!(seen, by_hand, "{config}");
    }
    assert_eq!(by_hand.states.last(), Some(&vec![State::Open]));
    assert!(
        by_hand.answers.contains(&"breaker.open".to_owned()),
        "{by_hand:?}"
    );
    assert!(
        by_hand
            .metrics
            .contains(mail_breaker::metrics::TRANSITIONS_TOTAL),
        "{by_hand:?}"
    );
}

/// A retry around a failover pool of two breakers (the demo's stack): by hand, from its DSN
/// and from its TOML. The primary fails from the third send on; its breaker opens at two
/// failures in a row and the pool sends to the backup.
#[tokio::test(flavor = "current_thread")]
async fn a_retry_around_a_failover_pool_behaves_the_same_by_hand_from_its_dsn_and_from_its_toml() {
    let modes = [
        Mode::Accept,
        Mode::Accept,
        Mode::Failing,
        Mode::Failing,
        Mode::Failing,
        Mode::Failing,
    ];
    let by_hand = {
        let (primary, backup) = (EmbeddedSmtp::start(), EmbeddedSmtp::start());
        let (snapshotter, _guard) = recorder();
        let breaker = |server: &EmbeddedSmtp, threshold: Option<u32>| {
            let smtp = SmtpTransport::from_url(&format!("smtp://127.0.0.1:{}", server.port()))
                .unwrap()
                .build()
                .unwrap();
            let mut builder =
                CircuitBreakerTransport::builder(Box::new(smtp) as Box<dyn Transport>);
            if let Some(threshold) = threshold {
                builder = builder.failure_threshold(threshold);
            }
            std::sync::Arc::new(builder.build().unwrap())
        };
        let (first, second) = (breaker(&primary, Some(2)), breaker(&backup, None));
        let pool = PoolTransport::builder()
            .add(std::sync::Arc::clone(&first), 0)
            .add(std::sync::Arc::clone(&second), 1)
            .build()
            .unwrap();
        let retry = RetryTransport::builder(pool)
            .max_attempts(3)
            .backoff(Backoff::constant(Duration::from_millis(20)))
            .build()
            .unwrap();
        let states: States<'_> =
            Box::new(|| Box::pin(async { vec![first.state(), second.state()] }));
        let seen = run(&retry, states, &primary, &modes, &snapshotter).await;
        (seen, backup.accepted())
    };
    for config in [
        "retry(failover(smtp://127.0.0.1:{primary}?breaker.threshold=2 smtp://127.0.0.1:{backup}))?attempts=3&delay=20ms",
        "strategy = \"failover\"\nretry = { attempts = 3, delay = \"20ms\" }\n\
         [[member]]\nurl = \"smtp://127.0.0.1:{primary}\"\nbreaker = { threshold = 2 }\n\
         [[member]]\nurl = \"smtp://127.0.0.1:{backup}\"",
    ] {
        let (primary, backup) = (EmbeddedSmtp::start(), EmbeddedSmtp::start());
        let (snapshotter, _guard) = recorder();
        let config = config
            .replace("{primary}", &primary.port().to_string())
            .replace("{backup}", &backup.port().to_string());
        let mailer = built(&config).await;
        let states = states_of(&mailer);
        let seen = run(&mailer, states, &primary, &modes, &snapshotter).await;
        assert_eq!((seen, backup.accepted()), by_hand, "{config}");
    }
    assert_eq!(by_hand.1, 4, "the last four went to the backup");
    assert!(by_hand.0.metrics.len() >= 3, "{by_hand:?}");
}
