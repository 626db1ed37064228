//! The README's stacks built by hand, and the same stacks from their DSN and their TOML,
//! behave the same: the same scenario against fresh embedded SMTP servers gives the same
//! answers, the same breaker states after each send, and the same metrics.
//!
//! A `Mailer`'s member always has a breaker: where the README's example puts none around a
//! piece (the rate limiter, the outbox's stack), the hand-built stack has a default one too.
//! The stacks on Redis are in `config_equivalence_redis.rs`, those with SES and an HTTP API
//! in `config_ses.rs`.
#![cfg(all(feature = "config", feature = "smtp", feature = "metrics"))]

mod support;

#[path = "../examples/support/mod.rs"]
mod embedded;

use std::sync::Arc;
use std::time::{Duration, Instant};

use embedded::{EmbeddedSmtp, Mode};
use mail_breaker::{
    Backoff, CircuitBreakerTransport, PoolTransport, RetryBudget, RetryTransport, SmtpTransport,
    State, Strategy, Transport,
};
use support::equivalence::{Seen, States, built, filled, recorder, run, states_of};

/// A plain SMTP transport to the embedded `server`.
fn smtp(server: &EmbeddedSmtp) -> SmtpTransport {
    SmtpTransport::from_url(&format!("smtp://127.0.0.1:{}", server.port()))
        .unwrap()
        .build()
        .unwrap()
}

/// Runs `configs` (a DSN and a TOML document, with `{port}` for the server's port) against a
/// fresh server each, switched to `modes[i]` before send `i`, and checks that each saw what
/// `by_hand` saw.
async fn each_config_sees(by_hand: &Seen, configs: [&str; 2], modes: &[Mode]) {
    for config in configs {
        let server = EmbeddedSmtp::start();
        let (snapshotter, _guard) = recorder();
        let config = filled(config, &[("port", server.port().to_string())]);
        let mailer = built(&config).await;
        let seen = run(
            &mailer,
            states_of(&mailer),
            modes.len(),
            |step| server.set_mode(modes[step]),
            &snapshotter,
        )
        .await;
        assert_eq!(&seen, by_hand, "{config}");
    }
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
        let breaker = CircuitBreakerTransport::builder(smtp(&server))
            .failure_threshold(5)
            .reset_timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        let states: States<'_> = Box::new(|| Box::pin(async { vec![breaker.state()] }));
        let modes = &ONE_BREAKER;
        run(
            &breaker,
            states,
            modes.len(),
            |step| server.set_mode(modes[step]),
            &snapshotter,
        )
        .await
    };
    each_config_sees(
        &by_hand,
        [
            "smtp://127.0.0.1:{port}?breaker.threshold=5&breaker.reset=30s",
            "[[member]]\nurl = \"smtp://127.0.0.1:{port}\"\nbreaker = { threshold = 5, reset = \"30s\" }",
        ],
        &ONE_BREAKER,
    )
    .await;
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

/// A breaker around `server`'s SMTP as a pool member, with `threshold` failures in a row.
fn member(
    server: &EmbeddedSmtp,
    threshold: Option<u32>,
) -> Arc<CircuitBreakerTransport<Box<dyn Transport>>> {
    let mut builder =
        CircuitBreakerTransport::builder(Box::new(smtp(server)) as Box<dyn Transport>);
    if let Some(threshold) = threshold {
        builder = builder.failure_threshold(threshold);
    }
    Arc::new(builder.build().unwrap())
}

/// Runs a two-member scenario: `configs` hold `{primary}` and `{backup}`; the primary is
/// switched to `modes[i]` before send `i`, the backup takes every message. Each config must
/// see what `by_hand` saw, with as many messages at the backup.
async fn each_pool_config_sees(by_hand: &(Seen, usize), configs: [&str; 2], modes: &[Mode]) {
    for config in configs {
        let (primary, backup) = (EmbeddedSmtp::start(), EmbeddedSmtp::start());
        let (snapshotter, _guard) = recorder();
        let config = filled(
            config,
            &[
                ("primary", primary.port().to_string()),
                ("backup", backup.port().to_string()),
            ],
        );
        let mailer = built(&config).await;
        let seen = run(
            &mailer,
            states_of(&mailer),
            modes.len(),
            |step| primary.set_mode(modes[step]),
            &snapshotter,
        )
        .await;
        assert_eq!(&(seen, backup.accepted()), by_hand, "{config}");
    }
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
        let (first, second) = (member(&primary, Some(2)), member(&backup, None));
        let pool = PoolTransport::builder()
            .add(Arc::clone(&first), 0)
            .add(Arc::clone(&second), 1)
            .build()
            .unwrap();
        let retry = RetryTransport::builder(pool)
            .max_attempts(3)
            .backoff(Backoff::constant(Duration::from_millis(20)))
            .build()
            .unwrap();
        let states: States<'_> =
            Box::new(|| Box::pin(async { vec![first.state(), second.state()] }));
        let seen = run(
            &retry,
            states,
            modes.len(),
            |step| primary.set_mode(modes[step]),
            &snapshotter,
        )
        .await;
        (seen, backup.accepted())
    };
    each_pool_config_sees(
        &by_hand,
        [
            "retry(failover(smtp://127.0.0.1:{primary}?breaker.threshold=2 smtp://127.0.0.1:{backup}))?attempts=3&delay=20ms",
            "strategy = \"failover\"\nretry = { attempts = 3, delay = \"20ms\" }\n\
             [[member]]\nurl = \"smtp://127.0.0.1:{primary}\"\nbreaker = { threshold = 2 }\n\
             [[member]]\nurl = \"smtp://127.0.0.1:{backup}\"",
        ],
        &modes,
    )
    .await;
    assert_eq!(by_hand.1, 4, "the last four went to the backup");
    assert!(by_hand.0.metrics.len() >= 3, "{by_hand:?}");
}

/// The README's "Fail over, and retry the way the breaker says": members by priority, an
/// exponential backoff, `max_elapsed` and a retry budget (an SMTP server stands in for SES).
/// The primary fails six times: its breaker opens at the fifth, and the pool passes it over
/// until its reset time, the last send too.
#[tokio::test(flavor = "current_thread")]
async fn a_prioritized_pool_with_a_budgeted_retry_behaves_the_same_by_hand_from_its_dsn_and_from_its_toml()
 {
    let modes = [
        Mode::Accept,
        Mode::Failing,
        Mode::Failing,
        Mode::Failing,
        Mode::Failing,
        Mode::Failing,
        Mode::Failing,
        Mode::Accept,
    ];
    let by_hand = {
        let (primary, backup) = (EmbeddedSmtp::start(), EmbeddedSmtp::start());
        let (snapshotter, _guard) = recorder();
        let (first, second) = (member(&primary, None), member(&backup, None));
        let pool = PoolTransport::builder()
            .add(Arc::clone(&first), 1)
            .add(Arc::clone(&second), 2)
            .strategy(Strategy::Priority)
            .build()
            .unwrap();
        let retry = RetryTransport::builder(pool)
            .max_attempts(4)
            .backoff(Backoff::exponential(
                Duration::from_millis(500),
                Duration::from_secs(30),
            ))
            .max_elapsed(Duration::from_secs(120))
            .budget(Arc::new(RetryBudget::default()))
            .build()
            .unwrap();
        let states: States<'_> =
            Box::new(|| Box::pin(async { vec![first.state(), second.state()] }));
        let seen = run(
            &retry,
            states,
            modes.len(),
            |step| primary.set_mode(modes[step]),
            &snapshotter,
        )
        .await;
        (seen, backup.accepted())
    };
    each_pool_config_sees(
        &by_hand,
        [
            "retry(failover(smtp://127.0.0.1:{primary}?priority=1 smtp://127.0.0.1:{backup}?priority=2))\
             ?attempts=4&initial=500ms&max_delay=30s&max_elapsed=120s&budget=true",
            "strategy = \"failover\"\n\
             retry = { attempts = 4, initial = \"500ms\", max_delay = \"30s\", max_elapsed = \"120s\", budget = true }\n\
             [[member]]\nurl = \"smtp://127.0.0.1:{primary}\"\npriority = 1\n\
             [[member]]\nurl = \"smtp://127.0.0.1:{backup}\"\npriority = 2",
        ],
        &modes,
    )
    .await;
    assert_eq!(by_hand.0.states[5], vec![State::Open, State::Closed]);
    assert_eq!(
        by_hand.1, 7,
        "every send after the first went to the backup"
    );
}

/// The README's tuned breaker ("Operating it"): shadow mode, a growing open time and slow
/// calls. In shadow mode the breaker opens but every send still goes.
#[tokio::test(flavor = "current_thread")]
async fn a_breaker_in_shadow_mode_behaves_the_same_by_hand_from_its_dsn_and_from_its_toml() {
    let modes = [
        Mode::Failing,
        Mode::Failing,
        Mode::Failing,
        Mode::Failing,
        Mode::Failing,
        Mode::Failing,
        Mode::Accept,
    ];
    let by_hand = {
        let server = EmbeddedSmtp::start();
        let (snapshotter, _guard) = recorder();
        let breaker = CircuitBreakerTransport::builder(smtp(&server))
            .shadow(true)
            .reset_timeout(Duration::from_secs(30))
            .max_reset_timeout(Duration::from_secs(600))
            .slow_call(Duration::from_secs(10))
            .build()
            .unwrap();
        let states: States<'_> = Box::new(|| Box::pin(async { vec![breaker.state()] }));
        let seen = run(
            &breaker,
            states,
            modes.len(),
            |step| server.set_mode(modes[step]),
            &snapshotter,
        )
        .await;
        assert_eq!(
            server.accepted(),
            1,
            "the last send went through the open breaker"
        );
        seen
    };
    each_config_sees(
        &by_hand,
        [
            "smtp://127.0.0.1:{port}?breaker.shadow=true&breaker.reset=30s&breaker.max_reset=10m&breaker.slow_call=10s",
            "[[member]]\nurl = \"smtp://127.0.0.1:{port}\"\n\
             breaker = { shadow = true, reset = \"30s\", max_reset = \"10m\", slow_call = \"10s\" }",
        ],
        &modes,
    )
    .await;
    assert_eq!(by_hand.states[5], vec![State::Open]);
    assert!(
        !by_hand.answers.contains(&"breaker.open".to_owned()),
        "{by_hand:?}"
    );
}

/// The README's "SMTP on the crate's own connections": a whole send's timeout and the
/// connection pool's settings, inside a member's breaker (the embedded server offers neither
/// TLS nor AUTH, so the example's STARTTLS and password are left out).
#[tokio::test(flavor = "current_thread")]
async fn smtp_with_its_connection_settings_behaves_the_same_by_hand_from_its_dsn_and_from_its_toml()
{
    let modes = [Mode::Accept; 5];
    let by_hand = {
        let server = EmbeddedSmtp::start();
        let (snapshotter, _guard) = recorder();
        let smtp = SmtpTransport::builder_dangerous("127.0.0.1")
            .port(server.port())
            .timeout(Duration::from_secs(30))
            .max_connections(10)
            .idle_timeout(Duration::from_secs(30))
            .max_messages_per_connection(100)
            .build()
            .unwrap();
        let breaker = CircuitBreakerTransport::new(smtp);
        let states: States<'_> = Box::new(|| Box::pin(async { vec![breaker.state()] }));
        run(&breaker, states, modes.len(), |_| {}, &snapshotter).await
    };
    each_config_sees(
        &by_hand,
        [
            "smtp://127.0.0.1:{port}?timeout=30s&max_connections=10&idle_timeout=30s&max_messages_per_connection=100",
            "[[member]]\nurl = \"smtp://127.0.0.1:{port}\"\ntimeout = \"30s\"\n\
             max_connections = 10\nidle_timeout = \"30s\"\nmax_messages_per_connection = 100",
        ],
        &modes,
    )
    .await;
    assert_eq!(by_hand.answers.len(), modes.len());
}

/// Sixteen sends through the README's rate limit (14/s, a burst of 14): the last two wait
/// for their slots, so the run takes at least 2/14 s.
const PACED: usize = 16;

/// The README's rate limit ("Pacing to a provider's quota") inside a member's breaker.
#[tokio::test(flavor = "current_thread")]
async fn a_rate_limited_member_behaves_the_same_by_hand_from_its_dsn_and_from_its_toml() {
    let at_least = Duration::from_secs(2) / 14;
    let by_hand = {
        let server = EmbeddedSmtp::start();
        let (snapshotter, _guard) = recorder();
        let limited = mail_breaker::RateLimitTransport::builder(smtp(&server))
            .per_second(14.0)
            .burst(14)
            .max_in_flight(10)
            .max_wait(Duration::from_secs(5))
            .adaptive(true)
            .build()
            .unwrap();
        let breaker = CircuitBreakerTransport::new(limited);
        let states: States<'_> = Box::new(|| Box::pin(async { vec![breaker.state()] }));
        let started = Instant::now();
        let seen = run(&breaker, states, PACED, |_| {}, &snapshotter).await;
        assert!(started.elapsed() >= at_least, "{:?}", started.elapsed());
        seen
    };
    for config in [
        "smtp://127.0.0.1:{port}?rate=14/s&rate.burst=14&rate.max_in_flight=10&rate.max_wait=5s&rate.adaptive=true",
        "[[member]]\nurl = \"smtp://127.0.0.1:{port}\"\n\
         rate = { per_second = 14, burst = 14, max_in_flight = 10, max_wait = \"5s\", adaptive = true }",
    ] {
        let server = EmbeddedSmtp::start();
        let (snapshotter, _guard) = recorder();
        let mailer = built(&filled(config, &[("port", server.port().to_string())])).await;
        let started = Instant::now();
        let seen = run(&mailer, states_of(&mailer), PACED, |_| {}, &snapshotter).await;
        assert!(
            started.elapsed() >= at_least,
            "{config}: {:?}",
            started.elapsed()
        );
        assert_eq!(seen, by_hand, "{config}");
    }
    assert_eq!(by_hand.answers.len(), PACED);
}

/// The modes of the outbox's scenario: one message taken, then the server failing, so the
/// breaker opens and the rest are queued; then the worker sends them once the server is back.
#[cfg(feature = "outbox")]
const OUTBOX: [Mode; 5] = [
    Mode::Accept,
    Mode::Failing,
    Mode::Failing,
    Mode::Failing,
    Mode::Failing,
];

/// What an outbox scenario saw: the answers (each send's state is left out: the worker sends
/// beside the scenario, so when the breaker opens depends on its timing), the messages the
/// server took once the outbox drained, and the metrics' names.
#[cfg(feature = "outbox")]
type Drained = (Vec<String>, usize, std::collections::BTreeSet<String>);

/// Runs the outbox's scenario through `stack`, then waits until `outbox` holds nothing and
/// the server took every message.
#[cfg(feature = "outbox")]
async fn drained(
    stack: &dyn Transport,
    outbox: &mail_breaker::outbox::Outbox,
    server: &EmbeddedSmtp,
    snapshotter: &metrics_util::debugging::Snapshotter,
) -> Drained {
    let states: States<'_> = Box::new(|| Box::pin(async { Vec::new() }));
    let seen = run(
        stack,
        states,
        OUTBOX.len(),
        |step| server.set_mode(OUTBOX[step]),
        snapshotter,
    )
    .await;
    server.set_mode(Mode::Accept);
    let deadline = Instant::now() + Duration::from_secs(30);
    while (outbox.stats().await.unwrap().queued > 0 || server.accepted() < OUTBOX.len())
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (
        seen.answers,
        server.accepted(),
        support::equivalence::metric_names(snapshotter),
    )
}

/// The README's outbox: `send_or_queue` in front of a breaker, and a worker of concurrency
/// 16 that sends what it keeps through the same stack.
#[cfg(feature = "outbox")]
#[tokio::test(flavor = "current_thread")]
async fn send_or_queue_with_its_worker_behaves_the_same_by_hand_from_its_dsn_and_from_its_toml() {
    use mail_breaker::outbox::{Outbox, OutboxTransport};
    let folder =
        std::env::temp_dir().join(format!("mail-breaker-equivalence-{}", std::process::id()));
    std::fs::create_dir_all(&folder).unwrap();
    let database = |name: &str| folder.join(name).display().to_string();
    let by_hand = {
        let server = EmbeddedSmtp::start();
        let (snapshotter, _guard) = recorder();
        let outbox = Outbox::sqlite(&database("by-hand.db")).await.unwrap();
        let stack: Arc<dyn Transport> = Arc::new(
            CircuitBreakerTransport::builder(smtp(&server))
                .failure_threshold(2)
                .reset_timeout(Duration::from_millis(200))
                .build()
                .unwrap(),
        );
        let transport = OutboxTransport::send_or_queue(outbox.clone(), Arc::clone(&stack));
        let worker = outbox.worker(stack).concurrency(16);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(async move {
            worker
                .run(async { stopped.await.unwrap_or(()) })
                .await
                .unwrap()
        });
        let seen = drained(&transport, &outbox, &server, &snapshotter).await;
        drop(stop);
        running.await.unwrap();
        seen
    };
    for (config, file) in [
        (
            "smtp://127.0.0.1:{port}?breaker.threshold=2&breaker.reset=200ms\
             &outbox=sqlite://{database}&outbox.concurrency=16",
            "dsn.db",
        ),
        (
            "[[member]]\nurl = \"smtp://127.0.0.1:{port}\"\n\
             breaker = { threshold = 2, reset = \"200ms\" }\n\
             [outbox]\nurl = \"sqlite://{database}\"\nconcurrency = 16",
            "toml.db",
        ),
    ] {
        let server = EmbeddedSmtp::start();
        let (snapshotter, _guard) = recorder();
        let config = filled(
            config,
            &[
                ("port", server.port().to_string()),
                ("database", database(file)),
            ],
        );
        let mailer = built(&config).await;
        let outbox = mailer.outbox().expect("an outbox").clone();
        let seen = drained(&mailer, &outbox, &server, &snapshotter).await;
        assert_eq!(seen, by_hand, "{config}");
    }
    let _ = std::fs::remove_dir_all(&folder);
    assert_eq!(by_hand.0[1..], ["queued"; 4], "{by_hand:?}");
    assert_eq!(by_hand.1, OUTBOX.len(), "every message sent once");
}
