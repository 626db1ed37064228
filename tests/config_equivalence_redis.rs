//! The README's stacks on Redis, built by hand and from their DSN and their TOML, behave the
//! same against real redis-servers (`config_equivalence.rs` has the stacks without Redis).
#![cfg(all(
    feature = "config",
    feature = "smtp",
    feature = "metrics",
    feature = "redis"
))]

mod support;

#[path = "../examples/support/mod.rs"]
mod embedded;

use std::sync::Arc;
use std::time::Duration;

use embedded::{EmbeddedSmtp, Mode};
use mail_breaker::{CircuitBreakerTransport, RedisStore, SmtpTransport, State, Transport};
use support::equivalence::{Seen, States, answer, built, filled, recorder, run, states_of};
use support::message;
use support::redis::RedisServer;
use support::redis_cluster::RedisCluster;

/// A breaker of `threshold` failures in a row around `server`'s SMTP, on `store`.
fn breaker_on(
    store: RedisStore,
    server: &EmbeddedSmtp,
    threshold: u32,
) -> CircuitBreakerTransport<SmtpTransport> {
    let smtp = SmtpTransport::from_url(&format!("smtp://127.0.0.1:{}", server.port()))
        .unwrap()
        .build()
        .unwrap();
    CircuitBreakerTransport::builder(smtp)
        .failure_threshold(threshold)
        .store(Arc::new(store))
        .build()
        .unwrap()
}

/// Runs the scenario `modes` through a mailer built from `config` (with `{port}` for a fresh
/// server's port and the other `values`).
async fn through_config(config: &str, values: &[(&str, String)], modes: &[Mode]) -> Seen {
    let server = EmbeddedSmtp::start();
    let (snapshotter, _guard) = recorder();
    let mut values = values.to_vec();
    values.push(("port", server.port().to_string()));
    let config = filled(config, &values);
    let mailer = built(&config).await;
    run(
        &mailer,
        states_of(&mailer),
        modes.len(),
        |step| server.set_mode(modes[step]),
        &snapshotter,
    )
    .await
}

/// Runs the scenario `modes` through the hand-built breaker that `make` puts around a fresh
/// server.
async fn through_hand_built<F>(make: F, modes: &[Mode]) -> Seen
where
    F: AsyncFnOnce(&EmbeddedSmtp) -> CircuitBreakerTransport<SmtpTransport>,
{
    let server = EmbeddedSmtp::start();
    let (snapshotter, _guard) = recorder();
    let breaker = make(&server).await;
    let states: States<'_> = Box::new(|| Box::pin(async { vec![breaker.state()] }));
    run(
        &breaker,
        states,
        modes.len(),
        |step| server.set_mode(modes[step]),
        &snapshotter,
    )
    .await
}

/// Two sends taken, then the server failing: the breaker opens at the third failure.
const FAILING: [Mode; 7] = [
    Mode::Accept,
    Mode::Accept,
    Mode::Failing,
    Mode::Failing,
    Mode::Failing,
    Mode::Failing,
    Mode::Failing,
];

/// The README's "One breaker for a fleet": a breaker on a Redis store with a namespace and a
/// timeout. Each build has a redis-server of its own, so none sees another's counts.
#[tokio::test(flavor = "current_thread")]
async fn a_breaker_on_redis_behaves_the_same_by_hand_from_its_dsn_and_from_its_toml() {
    let test = "a_breaker_on_redis_behaves_the_same_by_hand_from_its_dsn_and_from_its_toml";
    let Some(redis) = RedisServer::start(test) else {
        return;
    };
    let url = redis.url();
    let by_hand = through_hand_built(
        async |server| {
            let store = RedisStore::connect(&url)
                .await
                .unwrap()
                .with_namespace("myapp")
                .with_timeout(Duration::from_millis(100));
            breaker_on(store, server, 3)
        },
        &FAILING,
    )
    .await;
    for config in [
        "smtp://127.0.0.1:{port}?breaker.threshold=3&redis={redis}&redis.namespace=myapp&redis.timeout=100ms",
        "[[member]]\nurl = \"smtp://127.0.0.1:{port}\"\nbreaker = { threshold = 3 }\n\
         [redis]\nurl = \"{redis}\"\nnamespace = \"myapp\"\ntimeout = \"100ms\"",
    ] {
        let Some(redis) = RedisServer::start(test) else {
            return;
        };
        let seen = through_config(config, &[("redis", redis.url())], &FAILING).await;
        assert_eq!(seen, by_hand, "{config}");
    }
    assert_eq!(by_hand.states.last(), Some(&vec![State::Open]));
    assert_eq!(
        by_hand.answers.last().map(String::as_str),
        Some("breaker.open")
    );
}

/// The README's quorum on Redis Cluster: with a quorum of two, member `web-7`'s failures
/// open its own breaker, not the fleet's, so member `web-8` still sends to the same server.
/// Each build has a namespace of its own on one cluster; the scenario's last answer is
/// `web-8`'s.
#[tokio::test(flavor = "current_thread")]
async fn a_quorum_on_redis_cluster_behaves_the_same_by_hand_from_its_dsn_and_from_its_toml() {
    let test = "a_quorum_on_redis_cluster_behaves_the_same_by_hand_from_its_dsn_and_from_its_toml";
    let Some(cluster) = RedisCluster::start(test) else {
        return;
    };
    let nodes = cluster.urls();
    let by_hand = {
        let server = EmbeddedSmtp::start();
        let (snapshotter, _guard) = recorder();
        let member = async |name: &str| {
            let store = RedisStore::connect_cluster(&nodes)
                .await
                .unwrap()
                .with_namespace("by-hand")
                .with_quorum(2)
                .with_member(name);
            breaker_on(store, &server, 3)
        };
        let web7 = member("web-7").await;
        let states: States<'_> = Box::new(|| Box::pin(async { vec![web7.state()] }));
        let modes = &FAILING;
        let mut seen = run(
            &web7,
            states,
            modes.len(),
            |step| server.set_mode(modes[step]),
            &snapshotter,
        )
        .await;
        server.set_mode(Mode::Accept);
        seen.answers
            .push(answer(&member("web-8").await.send(&message()).await));
        seen
    };
    for config in [
        "smtp://127.0.0.1:{port}?breaker.threshold=3\
         &redis.cluster={nodes}&redis.namespace=dsn&redis.quorum=2&redis.member={member}",
        "[[member]]\nurl = \"smtp://127.0.0.1:{port}\"\nbreaker = { threshold = 3 }\n\
         [redis]\ncluster = [{quoted}]\nnamespace = \"toml\"\nquorum = 2\nmember = \"{member}\"",
    ] {
        let server = EmbeddedSmtp::start();
        let (snapshotter, _guard) = recorder();
        let quoted: Vec<String> = nodes.iter().map(|node| format!("\"{node}\"")).collect();
        let member = async |name: &str| {
            let values = [
                ("port", server.port().to_string()),
                ("nodes", nodes.join(",")),
                ("quoted", quoted.join(", ")),
                ("member", name.to_owned()),
            ];
            built(&filled(config, &values)).await
        };
        let web7 = member("web-7").await;
        let modes = &FAILING;
        let mut seen = run(
            &web7,
            states_of(&web7),
            modes.len(),
            |step| server.set_mode(modes[step]),
            &snapshotter,
        )
        .await;
        server.set_mode(Mode::Accept);
        seen.answers
            .push(answer(&member("web-8").await.send(&message()).await));
        assert_eq!(seen, by_hand, "{config}");
    }
    assert_eq!(by_hand.states.last(), Some(&vec![State::Open]));
    assert!(
        by_hand
            .answers
            .last()
            .is_some_and(|answer| answer.starts_with("250")),
        "web-8 sends while web-7's own breaker is open: {by_hand:?}"
    );
}
