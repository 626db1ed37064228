//! A [`Mailer`] built from a DSN or TOML sends through the stack it describes: failover
//! between two embedded SMTP servers, each member's breaker by name, a retry, and an
//! outbox with its worker; and shows no secret.
#![cfg(all(feature = "config", feature = "smtp"))]

mod support;

#[path = "../examples/support/mod.rs"]
mod embedded;

use std::time::Duration;

use embedded::{EmbeddedSmtp, Mode};
use mail_breaker::config::Mailer;
use mail_breaker::{State, Transport};
use support::message;

fn smtp(server: &EmbeddedSmtp) -> String {
    format!("smtp://127.0.0.1:{}", server.port())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_dsn_sends_through_its_first_member_while_it_takes_mail() {
    let (first, second) = (EmbeddedSmtp::start(), EmbeddedSmtp::start());
    let dsn = format!("failover({} {})", smtp(&first), smtp(&second));
    let mailer = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
    for _ in 0..3 {
        mailer.send(&message()).await.unwrap();
    }
    assert_eq!((first.accepted(), second.accepted()), (3, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_breaker_opens_is_passed_over_for_the_next() {
    let (first, second) = (EmbeddedSmtp::start(), EmbeddedSmtp::start());
    first.set_mode(Mode::Failing);
    let dsn = format!(
        "failover({}?name=primary&breaker.threshold=2 {}?name=backup)",
        smtp(&first),
        smtp(&second)
    );
    let mailer = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
    for _ in 0..4 {
        mailer.send(&message()).await.unwrap();
    }
    assert_eq!(second.accepted(), 4, "each failed over to the backup");
    let primary = mailer.breaker("primary").expect("the primary's breaker");
    assert_eq!(primary.snapshot().await.state(), State::Open);
    assert_eq!(
        mailer.breakers().map(|(name, _)| name).collect::<Vec<_>>(),
        ["primary", "backup"]
    );
    assert!(mailer.breaker("nobody").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_isolated_by_name_sends_nothing_until_reset() {
    let (first, second) = (EmbeddedSmtp::start(), EmbeddedSmtp::start());
    let toml = format!(
        r#"
        [[member]]
        url = "{}"
        name = "primary"
        [[member]]
        url = "{}"
        name = "backup"
        "#,
        smtp(&first),
        smtp(&second)
    );
    let mailer = Mailer::from_toml(&toml).unwrap().build().await.unwrap();
    mailer.breaker("primary").unwrap().isolate().await;
    mailer.send(&message()).await.unwrap();
    assert_eq!((first.accepted(), second.accepted()), (0, 1));
    mailer.breaker("primary").unwrap().reset().await;
    mailer.send(&message()).await.unwrap();
    assert_eq!((first.accepted(), second.accepted()), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_members_with_one_name_are_an_error_naming_the_second() {
    let server = EmbeddedSmtp::start();
    let dsn = format!("roundrobin({} {})", smtp(&server), smtp(&server));
    let error = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap_err();
    assert_eq!(error.setting(), "member[1].name");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_around_the_pool_sends_again_after_a_refusal_that_may_pass() {
    let server = EmbeddedSmtp::start();
    server.set_mode(Mode::Failing);
    let dsn = format!("retry({})?attempts=3&delay=50ms", smtp(&server));
    let mailer = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
    let sending = tokio::spawn({
        let message = message();
        async move { mailer.send(&message).await }
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    server.set_mode(Mode::Accept);
    sending.await.unwrap().unwrap();
    assert_eq!(server.accepted(), 1);
}

#[cfg(feature = "outbox")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_outbox_mail_the_stack_cannot_send_now_is_kept_and_sent_later() {
    let server = EmbeddedSmtp::start();
    server.set_mode(Mode::Unavailable);
    let folder = std::env::temp_dir().join(format!("mail-breaker-config-{}", std::process::id()));
    std::fs::create_dir_all(&folder).unwrap();
    let dsn = format!(
        "{}?breaker.threshold=1&breaker.reset=200ms&outbox=sqlite://{}&outbox.poll=50ms",
        smtp(&server),
        folder.join("outbox.db").display()
    );
    let mailer = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
    let receipt = mailer.send(&message()).await.unwrap();
    assert!(receipt.is_queued(), "kept in the outbox: {receipt:?}");
    server.set_mode(Mode::Accept);
    for _ in 0..100 {
        if server.accepted() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        server.accepted(),
        1,
        "sent by the worker once the server took mail"
    );
    // The server takes the message before the worker writes its answer: the outbox empties
    // a moment after.
    let outbox = mailer.outbox().expect("an outbox");
    let mut queued = u64::MAX;
    for _ in 0..100 {
        queued = outbox.stats().await.unwrap().queued;
        if queued == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(queued, 0, "the delivered message left the outbox");
    drop(mailer);
    let _ = std::fs::remove_dir_all(&folder);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mailers_debug_shows_its_stack_and_no_password() {
    let server = EmbeddedSmtp::start();
    let dsn = format!(
        "smtp://app:hunter2@127.0.0.1:{}?breaker.threshold=3",
        server.port()
    );
    let mailer = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
    let shown = format!("{mailer:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("***"), "{shown}");
    assert!(shown.contains("InARow(3)"), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_a_rate_limit_is_paced() {
    let server = EmbeddedSmtp::start();
    let dsn = format!("{}?rate=10/s", smtp(&server));
    let mailer = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
    let started = std::time::Instant::now();
    for _ in 0..3 {
        mailer.send(&message()).await.unwrap();
    }
    // The first at once, then one every 100 ms.
    assert!(
        started.elapsed() >= Duration::from_millis(190),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(server.accepted(), 3);
}

#[cfg(feature = "postmark")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_member_sends_with_its_key_to_its_host() {
    use support::http_api::{ApiServer, Reply};
    let api = ApiServer::start(|request| {
        match request.header("x-postmark-server-token") {
            Some("pm-token") => Reply::json(
                200,
                r#"{"To":"bob@example.org","SubmittedAt":"2024-01-01T00:00:00Z","MessageID":"pm-1","ErrorCode":0,"Message":"OK"}"#,
            ),
            _ => Reply::json(401, r#"{"ErrorCode":10,"Message":"bad token"}"#),
        }
    })
    .await;
    let port = api.endpoint().rsplit(':').next().unwrap().to_owned();
    let dsn = format!("postmark://pm-token@127.0.0.1:{port}");
    let mailer = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
    mailer.send(&message()).await.unwrap();
    assert_eq!(api.request_count(), 1);
    assert!(!format!("{mailer:?}").contains("pm-token"));
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_mailers_on_one_redis_share_their_breakers() {
    let Some(redis) = support::redis::RedisServer::start("config_shared_breakers") else {
        return;
    };
    let server = EmbeddedSmtp::start();
    let dsn = format!(
        "{}?name=relay&redis={}&redis.namespace=config-test",
        smtp(&server),
        redis.url()
    );
    let one = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
    let other = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
    one.breaker("relay").unwrap().isolate().await;
    let refused = other.send(&message()).await.unwrap_err();
    assert_eq!(refused.code(), "breaker.isolated", "{refused}");
    assert_eq!(server.accepted(), 0);
}

#[cfg(all(feature = "redis", feature = "webhooks"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_mailers_on_one_redis_share_their_members_reputation() {
    use mail_breaker::events::BounceKind;
    let Some(redis) = support::redis::RedisServer::start("config_shared_reputation") else {
        return;
    };
    let server = EmbeddedSmtp::start();
    let dsn = format!(
        "{}?name=relay&redis={}&redis.namespace=config-reputation\
         &reputation.window_sends=100&reputation.buckets=10\
         &reputation.hard_bounces.min_sends=2&reputation.complaints.min_sends=2",
        smtp(&server),
        redis.url()
    );
    let one = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
    let other = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
    for _ in 0..2 {
        one.send(&message()).await.expect("healthy: sent");
    }
    let mut bounce = support::suppression_rules::bounce(
        "bounce-1",
        BounceKind::Permanent,
        "user@example.org",
        std::time::SystemTime::now(),
    );
    bounce.member = Some("relay".into());
    one.reputation("relay")
        .unwrap()
        .record(&[bounce])
        .await
        .unwrap();

    let held = other.send(&message()).await.unwrap_err();

    assert_eq!(held.code(), "reputation.open", "{held}");
    assert_eq!(server.accepted(), 2);
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_does_not_answer_does_not_stop_the_mailer_from_sending() {
    let server = EmbeddedSmtp::start();
    let port = support::servers::free_port();
    let dsn = format!(
        "{}?redis=redis://127.0.0.1:{port}/&redis.timeout=50ms",
        smtp(&server)
    );
    let mailer = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
    mailer.send(&message()).await.unwrap();
    assert_eq!(
        server.accepted(),
        1,
        "the breaker decided alone while Redis was away"
    );
}

/// A server that takes connections and never says a word: its listener's backlog completes
/// each connect, and nothing reads or answers.
fn silent_server() -> (std::net::TcpListener, u16) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    (listener, port)
}

/// Sends one message through the mailer `dsn` describes; a send still running after 10 s
/// fails the test rather than hang it.
async fn send_error(dsn: &str) -> mail_breaker::SendError {
    let mailer = Mailer::from_dsn(dsn).unwrap().build().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), mailer.send(&message()))
        .await
        .expect("the member's timeout ends the send")
        .unwrap_err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_smtp_members_timeout_ends_a_send_to_a_silent_server() {
    let (_listener, port) = silent_server();
    let error = send_error(&format!("smtp://127.0.0.1:{port}?timeout=200ms")).await;
    assert_eq!(
        error.category(),
        mail_breaker::Category::Timeout,
        "{error:?}"
    );
}

#[cfg(feature = "postmark")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_members_timeout_ends_a_send_to_a_silent_server() {
    let (_listener, port) = silent_server();
    let error = send_error(&format!(
        "postmark://pm-token@127.0.0.1:{port}?timeout=200ms"
    ))
    .await;
    assert_eq!(
        error.category(),
        mail_breaker::Category::Timeout,
        "{error:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_smtp_connection_setting_the_transport_refuses_names_the_members_setting() {
    let dsn = format!("smtp://127.0.0.1:25?max_connections={}", usize::MAX);
    let error = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap_err();
    assert_eq!(error.setting(), "member[0].max_connections", "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mailers_name_is_its_stacks() {
    let server = EmbeddedSmtp::start();
    let mailer = Mailer::from_dsn(&smtp(&server))
        .unwrap()
        .build()
        .await
        .unwrap();
    assert_eq!(
        mailer.name(),
        smtp(&server),
        "a lone member's breaker, named as its SMTP"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mailers_verify_asks_its_providers() {
    let server = EmbeddedSmtp::start();
    let working = Mailer::from_dsn(&smtp(&server))
        .unwrap()
        .build()
        .await
        .unwrap();
    working.verify().await.unwrap();
    // A port nothing listens on: taken from a listener that is then closed.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dsn = format!("smtp://127.0.0.1:{closed}?timeout=1s");
    let broken = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
    assert!(broken.verify().await.is_err());
}

/// Every HTTP API builds from its URL, named as the provider names itself.
#[cfg(all(
    feature = "postmark",
    feature = "resend",
    feature = "sendgrid",
    feature = "mailgun"
))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_http_api_builds_from_its_url() {
    for (url, name) in [
        ("postmark://KEY@default", "postmark"),
        ("resend://KEY@default", "resend"),
        ("sendgrid://KEY@default?region=eu", "sendgrid"),
        (
            "mailgun://KEY:mg.example.com@default?region=eu",
            "mailgun:mg.example.com",
        ),
    ] {
        let mailer = Mailer::from_dsn(url).unwrap().build().await.unwrap();
        let names: Vec<&str> = mailer.breakers().map(|(name, _)| name).collect();
        assert_eq!(names, [name], "{url}");
    }
}

/// With error-rate counting, the breaker opens on its own rate, minimum and window: 30 %
/// of at least 4 calls in the last second (the defaults are 50 %, 20 calls and 10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_rate_breaker_opens_on_its_own_rate_minimum_and_window() {
    let server = EmbeddedSmtp::start();
    let dsn = format!(
        "{}?breaker.error_rate=30%&breaker.min_calls=4&breaker.window=1s",
        smtp(&server)
    );
    let mailer = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
    let breaker = mailer.breakers().next().unwrap().1;
    let message = message();
    let send = |mode| {
        server.set_mode(mode);
        mailer.send(&message)
    };
    for _ in 0..2 {
        send(Mode::Failing).await.unwrap_err();
    }
    assert_eq!(
        breaker.state(),
        State::Closed,
        "fewer calls than the minimum"
    );
    // The two failures leave the window.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    for _ in 0..3 {
        send(Mode::Accept).await.unwrap();
    }
    send(Mode::Failing).await.unwrap_err();
    assert_eq!(breaker.state(), State::Closed, "1 failure in 4 calls: 25 %");
    send(Mode::Failing).await.unwrap_err();
    assert_eq!(breaker.state(), State::Open, "2 failures in 5 calls: 40 %");
}

/// A server that hangs up after the message's final dot: the message may have arrived.
async fn hangs_up_after_the_dot() -> support::raw_smtp::RawSmtp {
    use support::raw_smtp::{Answer, RawSmtp};
    RawSmtp::start(
        b"220 raw.test ready\r\n".to_vec(),
        |command| match command {
            "." => Answer::HangUp,
            other => Answer::healthy(other),
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_at_most_once_never_sends_again_what_may_have_arrived() {
    for (at_most_once, messages) in [(false, 3), (true, 1)] {
        let server = hangs_up_after_the_dot().await;
        let dsn = format!(
            "retry(smtp://127.0.0.1:{})?attempts=3&delay=10ms&at_most_once={at_most_once}",
            server.port()
        );
        let mailer = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
        let error = mailer.send(&message()).await.unwrap_err();
        assert!(error.is_maybe_delivered(), "{error:?}");
        assert_eq!(
            server.count("DATA"),
            messages,
            "at_most_once={at_most_once}"
        );
    }
}

/// An outbox's own `at_most_once`: a send that may have reached the provider is answered with
/// its error, not queued to be sent again.
#[cfg(feature = "outbox")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_at_most_once_answers_a_maybe_delivered_failure_instead_of_queueing_it() {
    let folder = std::env::temp_dir().join(format!(
        "mail-breaker-config-at-most-once-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&folder).unwrap();
    for at_most_once in [false, true] {
        let server = hangs_up_after_the_dot().await;
        let dsn = format!(
            "smtp://127.0.0.1:{}?outbox=sqlite://{}&outbox.at_most_once={at_most_once}",
            server.port(),
            folder.join(format!("{at_most_once}.db")).display()
        );
        let mailer = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
        match mailer.send(&message()).await {
            Ok(receipt) => assert!(!at_most_once && receipt.is_queued(), "{receipt:?}"),
            Err(error) => assert!(at_most_once && error.is_maybe_delivered(), "{error:?}"),
        }
    }
    let _ = std::fs::remove_dir_all(&folder);
}

/// The worker a mailer gives (`Mailer::worker`) keeps the stack's `at_most_once` as well as
/// the outbox's own: a message that may have reached the provider becomes a dead letter
/// rather than being sent again.
#[cfg(feature = "outbox")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mailers_worker_is_at_most_once_when_the_stack_or_its_outbox_says_so() {
    let folder = std::env::temp_dir().join(format!(
        "mail-breaker-config-worker-at-most-once-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&folder).unwrap();
    for (index, (setting, dead)) in [
        ("", 0),
        ("&at_most_once=true", 1),
        ("&outbox.at_most_once=true", 1),
    ]
    .into_iter()
    .enumerate()
    {
        let server = hangs_up_after_the_dot().await;
        let dsn = format!(
            "smtp://127.0.0.1:{}?outbox=sqlite://{}{setting}",
            server.port(),
            folder.join(format!("{index}.db")).display()
        );
        let mailer = Mailer::from_dsn(&dsn)
            .unwrap()
            .build_without_worker()
            .await
            .unwrap();
        let outbox = mailer.outbox().expect("an outbox");
        outbox.enqueue(&message()).await.unwrap();
        let worker = mailer
            .worker()
            .expect("a mailer with an outbox gives a worker");
        worker.drain().await.unwrap();
        let stats = outbox.stats().await.unwrap();
        assert_eq!(
            (server.count("DATA"), stats.queued, stats.dead),
            (1, 1 - dead, dead),
            "{setting:?}: {stats:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&folder);
}

/// The three places a DSN can ask for at-most-once: the stack's own flag, the retry's and the
/// outbox's. Each, set alone, must hold for the whole stack (DESIGN §19, "One at-most-once").
#[cfg(feature = "outbox")]
const AT_MOST_ONCE_ANYWHERE: [&str; 3] = [
    "at_most_once=true",
    "retry.at_most_once=true",
    "outbox.at_most_once=true",
];

/// A failover pool of a server that hangs up after the final dot and a healthy backup,
/// behind a retry of three attempts and an outbox, with `setting` added to the stack.
#[cfg(feature = "outbox")]
async fn hang_up_then_backup(
    setting: &str,
    database: &std::path::Path,
) -> (support::raw_smtp::RawSmtp, EmbeddedSmtp, Mailer) {
    let first = hangs_up_after_the_dot().await;
    let backup = EmbeddedSmtp::start();
    let dsn = format!(
        "failover(smtp://127.0.0.1:{} {})?retry.attempts=3&retry.delay=10ms&outbox=sqlite://{}&{setting}",
        first.port(),
        smtp(&backup),
        database.display()
    );
    let mailer = Mailer::from_dsn(&dsn)
        .unwrap()
        .build_without_worker()
        .await
        .unwrap();
    (first, backup, mailer)
}

#[cfg(feature = "outbox")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_once_asked_anywhere_keeps_the_pool_from_failing_over_and_the_retry_from_resending()
{
    let folder = tempfile::tempdir().unwrap();
    for (index, setting) in AT_MOST_ONCE_ANYWHERE.into_iter().enumerate() {
        let database = folder.path().join(format!("{index}.db"));
        let (first, backup, mailer) = hang_up_then_backup(setting, &database).await;
        let error = mailer.send(&message()).await.unwrap_err();
        assert!(error.is_maybe_delivered(), "{setting}: {error:?}");
        assert_eq!(backup.accepted(), 0, "{setting}: the pool failed it over");
        assert_eq!(first.count("DATA"), 1, "{setting}: the retry sent it again");
        let stats = mailer.outbox().unwrap().stats().await.unwrap();
        assert_eq!(stats.queued, 0, "{setting}: queued to be sent again");
    }
}

#[cfg(feature = "outbox")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_once_asked_anywhere_makes_the_worker_dead_letter_a_hang_up_after_the_dot() {
    let folder = tempfile::tempdir().unwrap();
    for (index, setting) in AT_MOST_ONCE_ANYWHERE.into_iter().enumerate() {
        let database = folder.path().join(format!("{index}.db"));
        let (first, backup, mailer) = hang_up_then_backup(setting, &database).await;
        let outbox = mailer.outbox().unwrap();
        outbox.enqueue(&message()).await.unwrap();
        mailer.worker().unwrap().drain().await.unwrap();
        let stats = outbox.stats().await.unwrap();
        assert_eq!(
            (
                first.count("DATA"),
                backup.accepted(),
                stats.queued,
                stats.dead
            ),
            (1, 0, 0, 1),
            "{setting}: {stats:?}"
        );
    }
}

/// `scope = "recipient_domain"` keeps a breaker per recipient domain; `transport`, one for
/// the member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_scoped_by_recipient_domain_keeps_one_per_domain() {
    for (scope, key) in [
        ("recipient_domain", "example.org".to_owned()),
        ("transport", String::new()),
    ] {
        let server = EmbeddedSmtp::start();
        let dsn = format!("{}?breaker.scope={scope}", smtp(&server));
        let mailer = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
        mailer.send(&message()).await.unwrap();
        let breaker = mailer.breakers().next().unwrap().1;
        let keys: Vec<String> = breaker
            .snapshots()
            .await
            .iter()
            .map(|snapshot| snapshot.key().to_owned())
            .collect();
        let key = if key.is_empty() { smtp(&server) } else { key };
        assert_eq!(keys, [key], "{scope}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mailers_limiters_are_its_rated_members_by_name_with_their_rates() {
    let first = EmbeddedSmtp::start();
    let second = EmbeddedSmtp::start();
    let third = EmbeddedSmtp::start();
    let dsn = format!(
        "failover({}?name=steady&rate=14/s {}?name=unlimited {}?name=adapting&rate=4/s&rate.adaptive=true)",
        smtp(&first),
        smtp(&second),
        smtp(&third)
    );
    let mailer = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
    let limiters: Vec<_> = mailer.limiters().collect();
    let read: Vec<_> = limiters
        .iter()
        .map(|limiter| {
            (
                limiter.name(),
                limiter.configured_per_second(),
                limiter.per_second(),
                limiter.limiter().per_second(),
                limiter.is_adaptive(),
            )
        })
        .collect();
    assert_eq!(
        read,
        [
            ("steady", 14.0, 14.0, 14.0, false),
            ("adapting", 4.0, 4.0, 4.0, true)
        ]
    );
    let shown = format!("{:?}", limiters[1]);
    assert!(
        shown.contains("adapting") && shown.contains("adaptive: true"),
        "{shown}"
    );
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mailer_shares_its_breakers_only_through_redis() {
    let Some(redis) = support::redis::RedisServer::start("config_shares_breakers") else {
        return;
    };
    let server = EmbeddedSmtp::start();
    let alone = Mailer::from_dsn(&smtp(&server))
        .unwrap()
        .build()
        .await
        .unwrap();
    let dsn = format!(
        "{}?redis={}&redis.namespace=shares",
        smtp(&server),
        redis.url()
    );
    let sharing = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
    assert!(!alone.shares_breakers());
    assert!(sharing.shares_breakers());
}

#[cfg(feature = "outbox")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mailer_built_without_its_outbox_opens_no_database() {
    let server = EmbeddedSmtp::start();
    // An outbox that cannot be opened: building with it fails, naming it.
    let dsn = format!(
        "{}?outbox=sqlite:///no/such/folder/outbox.db",
        smtp(&server)
    );
    let error = Mailer::from_dsn(&dsn)
        .unwrap()
        .build_without_worker()
        .await
        .unwrap_err();
    assert_eq!(error.setting(), "outbox.url");
    let mailer = Mailer::from_dsn(&dsn)
        .unwrap()
        .without_outbox()
        .build_without_worker()
        .await
        .unwrap();
    assert!(mailer.outbox().is_none());
    mailer.send(&message()).await.unwrap();
    assert_eq!(server.accepted(), 1);
}

#[cfg(feature = "outbox")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_outbox_is_opened_only_if_its_file_is_there_and_none_is_made() {
    let folder = tempfile::tempdir().unwrap();
    let file = folder.path().join("outbox.db");
    let dsn = format!("smtp://127.0.0.1:1?outbox=sqlite://{}", file.display());
    let error = Mailer::from_dsn(&dsn)
        .unwrap()
        .existing_outbox()
        .build_without_worker()
        .await
        .unwrap_err();
    assert_eq!(error.setting(), "outbox.url");
    assert!(
        error.reason().contains(&file.display().to_string()),
        "{error}"
    );
    assert!(!file.exists(), "no outbox was made");

    mail_breaker::outbox::Outbox::sqlite(&file).await.unwrap();
    let mailer = Mailer::from_dsn(&dsn)
        .unwrap()
        .existing_outbox()
        .build_without_worker()
        .await
        .unwrap();
    assert!(mailer.outbox().is_some());
    let without = Mailer::from_dsn("smtp://127.0.0.1:1")
        .unwrap()
        .existing_outbox()
        .build_without_worker()
        .await
        .unwrap();
    assert!(without.outbox().is_none(), "existing_outbox adds none");
}

#[cfg(feature = "webhooks")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_its_outbox_a_stack_drops_the_suppression_list_kept_in_the_outboxs_database() {
    let folder = tempfile::tempdir().unwrap();
    let dsn = format!(
        "smtp://127.0.0.1:1?outbox=sqlite://{}&suppression=true",
        folder.path().join("outbox.db").display()
    );

    let with_outbox = Mailer::from_dsn(&dsn)
        .unwrap()
        .build_without_worker()
        .await
        .expect("an outbox and its list");
    assert!(with_outbox.suppression().is_some());
    drop(with_outbox);
    std::fs::remove_file(folder.path().join("outbox.db")).unwrap();

    let mailer = Mailer::from_dsn(&dsn)
        .unwrap()
        .without_outbox()
        .build_without_worker()
        .await
        .expect("no outbox, so no list in its database: nothing to open");

    assert!(mailer.outbox().is_none());
    assert!(mailer.suppression().is_none());
    assert!(
        !folder.path().join("outbox.db").exists(),
        "no outbox file made for the list"
    );
}
