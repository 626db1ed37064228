//! A Graph member from a DSN (issue 65): `graph://CLIENT_ID:SECRET@TENANT?sender=ADDRESS`,
//! with `graph.endpoint` and `oauth2.token_url`, each setting checked as every other key.
#![cfg(all(feature = "graph", feature = "config"))]

mod support;

#[cfg(feature = "metrics")]
#[path = "../examples/support/mod.rs"]
mod embedded;

use mail_breaker::Transport;
use mail_breaker::config::{Mailer, MailerConfig};
use support::http_api::{ApiServer, Reply};

fn dsn_error(dsn: &str) -> (String, String) {
    let error = MailerConfig::from_dsn(dsn).unwrap_err();
    (error.setting().to_owned(), error.reason().to_owned())
}

/// A token endpoint that hands out `token-1` to every request.
async fn token_endpoint() -> ApiServer {
    ApiServer::start(|_| Reply::json(200, r#"{"access_token":"token-1","expires_in":3599}"#)).await
}

const MEMBER: &str = "graph://app-id:s3cret-VALUE@contoso.onmicrosoft.com";

#[tokio::test]
async fn a_graph_member_of_a_dsn_sends_as_its_sender_with_a_token_for_its_application() {
    let tokens = token_endpoint().await;
    let graph = ApiServer::start(|_| Reply::text(202, "")).await;
    let dsn = format!(
        "{MEMBER}?sender=app%40contoso.com&graph.endpoint={}&oauth2.token_url={}/token",
        graph.endpoint(),
        tokens.endpoint()
    );
    let mailer = Mailer::from_dsn(&dsn)
        .unwrap()
        .build_without_worker()
        .await
        .unwrap();
    let message = mail_breaker::Message::builder()
        .from("app@contoso.com".parse().unwrap())
        .to("ann@example.org".parse().unwrap())
        .subject("hi")
        .body(String::from("hello"))
        .unwrap();
    let receipt = mailer.send(&message).await.unwrap();
    assert_eq!(receipt.transport(), "graph");
    assert_eq!(graph.last().path, "/v1.0/users/app@contoso.com/sendMail");
    assert_eq!(graph.last().header("authorization"), Some("Bearer token-1"));
    let asked = tokens.last().text();
    for field in [
        "client_id=app-id",
        "client_secret=s3cret-VALUE",
        "scope=https%3A%2F%2Fgraph.microsoft.com%2F.default",
    ] {
        assert!(asked.contains(field), "{field} in {asked}");
    }
}

#[tokio::test]
async fn a_graph_member_without_a_rate_keeps_exchanges_thirty_messages_a_minute() {
    let mailer = Mailer::from_dsn(&format!("{MEMBER}?sender=app%40contoso.com"))
        .unwrap()
        .build_without_worker()
        .await
        .unwrap();
    let rates: Vec<f64> = mailer
        .limiters()
        .map(|limiter| limiter.configured_per_second())
        .collect();
    assert_eq!(rates, [0.5]);
    let own = Mailer::from_dsn(&format!("{MEMBER}?sender=app%40contoso.com&rate=2/s"))
        .unwrap()
        .build_without_worker()
        .await
        .unwrap();
    let rates: Vec<f64> = own
        .limiters()
        .map(|limiter| limiter.configured_per_second())
        .collect();
    assert_eq!(rates, [2.0], "a rate given is kept");
}

#[test]
fn each_wrong_setting_of_a_graph_member_is_an_error_naming_it_and_never_its_secret() {
    let cases = [
        (MEMBER.to_owned(), "member[0].url.sender"),
        (
            format!("{MEMBER}?sender=not-an-address"),
            "member[0].url.sender",
        ),
        (
            format!("{MEMBER}?sender=a%40contoso.com&graph.endpoint=http://graph.example.com"),
            "member[0].url.graph.endpoint",
        ),
        (
            format!("{MEMBER}?sender=a%40contoso.com&oauth2.token_url=http://login.example.com/t"),
            "member[0].url.oauth2.token_url",
        ),
        (
            format!("{MEMBER}?sender=a%40contoso.com&sender=b%40contoso.com"),
            "member[0].url.sender",
        ),
        (
            format!("{MEMBER}?sender=a%40contoso.com&region=eu"),
            "member[0].url",
        ),
        (
            "graph://app-id@contoso.onmicrosoft.com?sender=a%40contoso.com".to_owned(),
            "member[0].url",
        ),
    ];
    for (dsn, setting) in cases {
        let (path, reason) = dsn_error(&dsn);
        assert_eq!(path, setting, "{dsn}: {reason}");
        assert!(!reason.contains("s3cret"), "{reason}");
    }
}

#[test]
fn a_national_clouds_https_graph_and_token_endpoint_are_taken() {
    MailerConfig::from_dsn(
        "graph://app-id:s3cret@contoso.onmicrosoft.us?sender=app%40contoso.us\
         &graph.endpoint=https://graph.microsoft.us\
         &oauth2.token_url=https://login.microsoftonline.us/contoso.onmicrosoft.us/oauth2/v2.0/token",
    )
    .unwrap();
}

#[test]
fn a_graph_member_of_a_toml_document_reads_as_its_dsn_does() {
    let toml = r#"
        [[member]]
        url = "graph://app-id:s3cret@contoso.onmicrosoft.com?sender=app%40contoso.com"
        timeout = "5s"
    "#;
    let from_toml = MailerConfig::from_toml(toml).unwrap();
    let from_dsn = MailerConfig::from_dsn(
        "graph://app-id:s3cret@contoso.onmicrosoft.com?sender=app%40contoso.com&timeout=5s",
    )
    .unwrap();
    assert_eq!(from_toml, from_dsn);
    assert!(!format!("{from_toml:?}").contains("s3cret"));
}

/// A breaker and a pool around a Graph member behave as around any other: Graph first, an
/// SMTP relay second, by hand, from the DSN and from the TOML. Graph is down for the six
/// sends between the first and the last; its breaker opens at its fifth failure and the
/// relay takes the mail.
#[cfg(feature = "metrics")]
#[tokio::test(flavor = "current_thread")]
async fn graph_then_smtp_behaves_the_same_by_hand_from_its_dsn_and_from_its_toml() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use mail_breaker::oauth::ClientCredentials;
    use mail_breaker::{
        CircuitBreakerTransport, GraphTransport, PoolTransport, RateLimitTransport, SmtpTransport,
        State,
    };
    use support::equivalence::{States, built, filled, recorder, run, states_of};

    const GRAPH_UP: [bool; 8] = [true, false, false, false, false, false, false, true];
    async fn servers(up: Arc<AtomicBool>) -> (ApiServer, ApiServer, embedded::EmbeddedSmtp) {
        let tokens = token_endpoint().await;
        let graph = ApiServer::start(move |_| {
            if up.load(Ordering::SeqCst) {
                Reply::text(202, "")
            } else {
                Reply::json(
                    503,
                    r#"{"error":{"code":"ServiceUnavailable","message":"Try later."}}"#,
                )
            }
        })
        .await;
        (tokens, graph, embedded::EmbeddedSmtp::start())
    }

    let by_hand = {
        let up = Arc::new(AtomicBool::new(true));
        let (tokens, graph, relay) = servers(Arc::clone(&up)).await;
        let (snapshotter, _guard) = recorder();
        let source = ClientCredentials {
            token_url: format!("{}/token", tokens.endpoint()),
            ..ClientCredentials::for_graph("contoso.onmicrosoft.com", "app-id", "s3cret")
        }
        .build()
        .unwrap();
        let graph_member = RateLimitTransport::builder(
            GraphTransport::new("app@contoso.com", source).with_endpoint(graph.endpoint()),
        )
        .per_second(100.0)
        .build()
        .unwrap();
        let first = Arc::new(CircuitBreakerTransport::new(graph_member));
        let smtp = SmtpTransport::from_url(&format!("smtp://127.0.0.1:{}", relay.port()))
            .unwrap()
            .build()
            .unwrap();
        let second = Arc::new(CircuitBreakerTransport::new(smtp));
        let pool = PoolTransport::builder()
            .add(Arc::clone(&first), 1)
            .add(Arc::clone(&second), 2)
            .build()
            .unwrap();
        let states: States<'_> =
            Box::new(|| Box::pin(async { vec![first.state(), second.state()] }));
        let seen = run(
            &pool,
            states,
            GRAPH_UP.len(),
            |step| up.store(GRAPH_UP[step], Ordering::SeqCst),
            &snapshotter,
        )
        .await;
        (seen, graph.request_count())
    };
    let graph_url = "graph://app-id:s3cret@contoso.onmicrosoft.com?sender=app%40contoso.com\
                     &graph.endpoint={graph}&oauth2.token_url={tokens}/token";
    for config in [
        format!("failover({graph_url}&rate=100/s smtp://127.0.0.1:{{port}})"),
        format!(
            "strategy = \"failover\"\n\
             [[member]]\nurl = \"{graph_url}\"\npriority = 1\nrate = {{ per_second = 100 }}\n\
             [[member]]\nurl = \"smtp://127.0.0.1:{{port}}\"\npriority = 2"
        ),
    ] {
        let up = Arc::new(AtomicBool::new(true));
        let (tokens, graph, relay) = servers(Arc::clone(&up)).await;
        let (snapshotter, _guard) = recorder();
        let config = filled(
            &config,
            &[
                ("graph", graph.endpoint()),
                ("tokens", tokens.endpoint()),
                ("port", relay.port().to_string()),
            ],
        );
        let mailer = built(&config).await;
        let seen = run(
            &mailer,
            states_of(&mailer),
            GRAPH_UP.len(),
            |step| up.store(GRAPH_UP[step], Ordering::SeqCst),
            &snapshotter,
        )
        .await;
        assert_eq!((seen, graph.request_count()), by_hand, "{config}");
    }
    let (seen, graph_requests) = &by_hand;
    assert_eq!(seen.states[5], vec![State::Open, State::Closed], "{seen:?}");
    // Graph took the first; the relay every other, Graph's breaker open at the last.
    assert!(seen.answers[0].starts_with("202"), "{seen:?}");
    assert!(
        seen.answers[1..]
            .iter()
            .all(|answer| answer.starts_with("250")),
        "{seen:?}"
    );
    assert_eq!(*graph_requests, 6, "the first and five failures");
}

/// The outbox around a Graph member behaves as around any other: what Graph does not take
/// now is queued, and sent once when it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_keeps_what_a_graph_member_does_not_take_and_sends_it_once_when_it_is_back() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let up = Arc::new(AtomicBool::new(false));
    let tokens = token_endpoint().await;
    let switch = Arc::clone(&up);
    let graph = ApiServer::start(move |_| {
        if switch.load(Ordering::SeqCst) {
            Reply::text(202, "")
        } else {
            Reply::text(503, "").with_header("Retry-After", "1")
        }
    })
    .await;
    let folder = tempfile::tempdir().unwrap();
    let dsn = format!(
        "{MEMBER}?sender=app%40contoso.com&graph.endpoint={}&oauth2.token_url={}/token\
         &outbox=sqlite://{}/outbox.db",
        graph.endpoint(),
        tokens.endpoint(),
        folder.path().display()
    );
    let mailer = Mailer::from_dsn(&dsn)
        .unwrap()
        .build_without_worker()
        .await
        .unwrap();
    let message = mail_breaker::Message::builder()
        .from("app@contoso.com".parse().unwrap())
        .to("ann@example.org".parse().unwrap())
        .subject("kept")
        .body(String::from("hello"))
        .unwrap();
    let receipt = mailer.send(&message).await.unwrap();
    assert!(receipt.is_queued(), "{receipt:?}");
    let tried = graph.request_count();
    up.store(true, Ordering::SeqCst);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    mailer.worker().expect("an outbox").drain().await.unwrap();
    let delivered = graph
        .requests()
        .iter()
        .skip(tried)
        .filter(|request| request.path.ends_with("/sendMail"))
        .count();
    assert_eq!(delivered, 1);
    let stats = mailer.outbox().unwrap().stats().await.unwrap();
    assert_eq!((stats.queued, stats.dead), (0, 0), "{stats:?}");
}
