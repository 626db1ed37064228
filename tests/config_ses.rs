//! `ses://` members of a DSN send through the AWS SDK to moto's SES server with the keys of
//! the environment; and the README's stacks with SES (the HTTP-API pool, SES across a fleet)
//! behave the same built by hand, from their DSN and from their TOML. Every test here calls
//! [`keys`] first: it sets the environment's AWS keys once, before any test reads them.
#![cfg(all(feature = "config", feature = "ses"))]

mod support;

use std::sync::Once;

use aws_sdk_sesv2::config::{BehaviorVersion, Credentials, Region};
use mail_breaker::Transport;
use mail_breaker::config::Mailer;
use support::moto::Moto;

const ACCESS_KEY: &str = "AKIDCONFIGTEST";
const SECRET_KEY: &str = "config-ses-secret-never-shown";

/// Sets the AWS keys in the environment, once for the whole binary.
fn keys() {
    static KEYS: Once = Once::new();
    // SAFETY: every test of this binary calls this before anything that reads the
    // environment, and `Once` holds the others until the first call has set them; the keys
    // never change afterwards.
    KEYS.call_once(|| unsafe {
        std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY);
        std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
    });
}

/// Moto, with `app@example.com` verified; `None` where moto is not installed.
async fn moto(test: &str) -> Option<(Moto, aws_sdk_sesv2::Client)> {
    let moto = Moto::start(test).await?;
    let sdk = aws_sdk_sesv2::Client::from_conf(
        aws_sdk_sesv2::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new(ACCESS_KEY, SECRET_KEY, None, None, "test"))
            .endpoint_url(moto.endpoint())
            .build(),
    );
    sdk.create_email_identity()
        .email_identity("app@example.com")
        .send()
        .await
        .expect("moto creates the identity");
    Some((moto, sdk))
}

#[tokio::test(flavor = "current_thread")]
async fn an_ses_member_sends_through_the_sdk_with_the_environments_keys() {
    keys();
    let Some((moto, _)) = moto("config_ses").await else {
        return;
    };
    let dsn = format!("ses://us-east-1?endpoint={}", moto.endpoint());
    let mailer = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
    let receipt = mailer.send(&support::message()).await.unwrap();
    assert!(receipt.message_id().is_some(), "{receipt:?}");
    assert!(moto.state_dump().await.contains("user@example.org"));
    assert!(!format!("{mailer:?}").contains(SECRET_KEY));
}

#[tokio::test(flavor = "current_thread")]
async fn an_ses_members_timeout_ends_a_send_to_a_silent_endpoint() {
    keys();
    // Takes connections and never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let dsn = format!("ses://us-east-1?endpoint=http://127.0.0.1:{port}&timeout=200ms");
    let mailer = Mailer::from_dsn(&dsn).unwrap().build().await.unwrap();
    let error = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        mailer.send(&support::message()),
    )
    .await
    .expect("the member's timeout ends the send")
    .unwrap_err();
    assert_eq!(
        error.category(),
        mail_breaker::Category::Timeout,
        "{error:?}"
    );
}

#[cfg(all(feature = "metrics", feature = "postmark"))]
mod equivalent {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use mail_breaker::{
        CircuitBreakerTransport, PoolTransport, PostmarkTransport, SesTransport, State,
    };

    use super::support::equivalence::{States, built, filled, recorder, run, states_of};
    use super::support::http_api::{ApiServer, Reply};
    use super::{keys, moto};

    /// Postmark's answer to a message it took.
    const SENT: &str = r#"{"To":"user@example.org","SubmittedAt":"2024-01-01T00:00:00Z","MessageID":"pm-1","ErrorCode":0,"Message":"OK"}"#;

    /// A Postmark stand-in that takes mail while `up` holds, and answers 503 otherwise.
    async fn postmark(up: Arc<AtomicBool>) -> ApiServer {
        ApiServer::start(move |_| {
            if up.load(Ordering::SeqCst) {
                Reply::json(200, SENT)
            } else {
                Reply::json(503, r#"{"ErrorCode":100,"Message":"Maintenance"}"#)
            }
        })
        .await
    }

    /// Postmark is up for the first send and the last, down for the six between.
    const POSTMARK_UP: [bool; 8] = [true, false, false, false, false, false, false, true];

    /// The README's HTTP-API pool: Postmark first, SES second, each behind a default breaker.
    /// Postmark's breaker opens at its fifth failure, and SES takes the mail until its reset.
    #[tokio::test(flavor = "current_thread")]
    async fn postmark_then_ses_behaves_the_same_by_hand_from_its_dsn_and_from_its_toml() {
        keys();
        let Some((moto, sdk)) = moto("postmark_then_ses_behaves_the_same").await else {
            return;
        };
        let by_hand = {
            let up = Arc::new(AtomicBool::new(true));
            let api = postmark(Arc::clone(&up)).await;
            let (snapshotter, _guard) = recorder();
            let first = Arc::new(CircuitBreakerTransport::new(
                PostmarkTransport::new("pm-token")
                    .with_endpoint(api.endpoint())
                    .with_timeout(Duration::from_secs(10)),
            ));
            let second = Arc::new(CircuitBreakerTransport::new(SesTransport::new(sdk)));
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
                POSTMARK_UP.len(),
                |step| up.store(POSTMARK_UP[step], Ordering::SeqCst),
                &snapshotter,
            )
            .await;
            (seen, api.request_count())
        };
        for config in [
            "failover(postmark://pm-token@127.0.0.1:{port} ses://us-east-1?endpoint={moto})",
            "strategy = \"failover\"\n\
             [[member]]\nurl = \"postmark://pm-token@127.0.0.1:{port}\"\npriority = 1\n\
             [[member]]\nurl = \"ses://us-east-1?endpoint={moto}\"\npriority = 2",
        ] {
            let up = Arc::new(AtomicBool::new(true));
            let api = postmark(Arc::clone(&up)).await;
            let (snapshotter, _guard) = recorder();
            let port = api.endpoint().rsplit(':').next().unwrap().to_owned();
            let config = filled(config, &[("port", port), ("moto", moto.endpoint())]);
            let mailer = built(&config).await;
            let seen = run(
                &mailer,
                states_of(&mailer),
                POSTMARK_UP.len(),
                |step| up.store(POSTMARK_UP[step], Ordering::SeqCst),
                &snapshotter,
            )
            .await;
            assert_eq!((seen, api.request_count()), by_hand, "{config}");
        }
        let (seen, postmark_requests) = &by_hand;
        assert_eq!(seen.states[5], vec![State::Open, State::Closed], "{seen:?}");
        assert!(
            seen.answers.iter().all(|answer| answer == "sent"),
            "{seen:?}"
        );
        assert_eq!(*postmark_requests, 6, "the first and five failures");
    }

    /// The README's "SES across a fleet": a retry around a breaker on Redis (over TLS, as an
    /// ACL user) around SES paced by a limiter shared through the same Redis. Each build has a
    /// redis-server of its own; the keys each leaves in Redis are compared too.
    #[cfg(feature = "redis")]
    #[tokio::test(flavor = "current_thread")]
    async fn ses_across_a_fleet_behaves_the_same_by_hand_from_its_dsn_and_from_its_toml() {
        use super::support::redis::{ACL_USER, RedisServer};
        use super::support::test_certs::TestCertificates;
        use mail_breaker::{RateLimitTransport, RedisStore, RetryTransport};

        keys();
        let test = "ses_across_a_fleet_behaves_the_same_by_hand_from_its_dsn_and_from_its_toml";
        let Some((moto, sdk)) = moto(test).await else {
            return;
        };
        let Some(certificates) = TestCertificates::make(test) else {
            return;
        };
        let redis = || RedisServer::start_with_tls_and_user(test, &certificates);
        let tls_url = |redis: &RedisServer| {
            format!(
                "rediss://{}:{}@localhost:{}/",
                ACL_USER.0,
                ACL_USER.1,
                redis.tls_port()
            )
        };
        const SENDS: usize = 5;
        let by_hand = {
            let Some(redis) = redis() else { return };
            let (snapshotter, _guard) = recorder();
            let ca = std::fs::read(certificates.path("ca.pem")).unwrap();
            let store = Arc::new(
                RedisStore::connect_with_ca(&tls_url(&redis), &ca)
                    .await
                    .unwrap()
                    .with_namespace("myapp"),
            );
            let paced = RateLimitTransport::builder(SesTransport::new(sdk))
                .name("ses")
                .per_second(14.0)
                .adaptive(true)
                .shared(Arc::clone(&store))
                .members(5)
                .build()
                .unwrap();
            let breaker = Arc::new(
                CircuitBreakerTransport::builder(paced)
                    .store(store)
                    .build()
                    .unwrap(),
            );
            let states: States<'_> = Box::new(|| Box::pin(async { vec![breaker.state()] }));
            let transport = RetryTransport::builder(Arc::clone(&breaker))
                .build()
                .unwrap();
            let seen = run(&transport, states, SENDS, |_| {}, &snapshotter).await;
            (seen, keys_in(&redis).await)
        };
        for config in [
            "retry(ses://us-east-1?endpoint={moto}&name=ses&rate=14/s&rate.adaptive=true\
             &rate.shared=true&rate.fleet=5&redis={redis}&redis.ca={ca}&redis.namespace=myapp)",
            "retry = {}\n\
             [[member]]\nurl = \"ses://us-east-1?endpoint={moto}\"\nname = \"ses\"\n\
             rate = { per_second = 14, adaptive = true, shared = true, fleet = 5 }\n\
             [redis]\nurl = \"{redis}\"\nca = \"{ca}\"\nnamespace = \"myapp\"",
        ] {
            let Some(redis) = redis() else { return };
            let (snapshotter, _guard) = recorder();
            let config = filled(
                config,
                &[
                    ("moto", moto.endpoint()),
                    ("redis", tls_url(&redis)),
                    ("ca", certificates.path("ca.pem").display().to_string()),
                ],
            );
            let mailer = built(&config).await;
            let seen = run(&mailer, states_of(&mailer), SENDS, |_| {}, &snapshotter).await;
            assert_eq!((seen, keys_in(&redis).await), by_hand, "{config}");
        }
        let (seen, keys) = &by_hand;
        assert!(
            seen.answers.iter().all(|answer| answer == "sent"),
            "{seen:?}"
        );
        assert!(
            keys.contains(&"mail-breaker:myapp:rate:{ses}".to_owned()),
            "the shared limiter's budget, by its name in the namespace: {keys:?}"
        );
    }

    /// Every key in `redis`, through its plain port.
    #[cfg(feature = "redis")]
    async fn keys_in(redis: &super::support::redis::RedisServer) -> Vec<String> {
        let client = redis::Client::open(redis.url()).unwrap();
        let mut connection = client.get_multiplexed_async_connection().await.unwrap();
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut connection)
            .await
            .unwrap();
        keys.sort();
        keys
    }
}
