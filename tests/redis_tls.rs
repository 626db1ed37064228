//! The Redis store and the shared rate limiter on a real redis-server that speaks TLS (a
//! certificate signed by a test authority, made with openssl) and has an ACL user.
#![cfg(feature = "redis")]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use mail_breaker::{
    BreakerStore, Category, CircuitBreakerTransport, ConfigError, RateLimitTransport, RedisStore,
    State, Transport,
};
use support::redis::{ACL_USER, RedisServer};
use support::scripted::{Reply, Scripted};
use support::test_certs::TestCertificates;

/// A server with TLS and the ACL user, and the test authority's certificate; `None` when
/// redis-server or openssl is missing (SKIPPED printed).
fn server(test: &str) -> Option<(RedisServer, TestCertificates, Vec<u8>)> {
    let certificates = TestCertificates::make(test)?;
    let server = RedisServer::start_with_tls_and_user(test, &certificates)?;
    let ca = std::fs::read(certificates.path("ca.pem")).expect("the test CA");
    Some((server, certificates, ca))
}

/// `rediss://` as the ACL user, to the name the certificate was made for.
fn tls_url(server: &RedisServer) -> String {
    let (user, password) = ACL_USER;
    format!(
        "rediss://{user}:{password}@localhost:{}/",
        server.tls_port()
    )
}

async fn tls_store(server: &RedisServer, ca: &[u8]) -> Arc<RedisStore> {
    let store = RedisStore::connect_with_ca(&tls_url(server), ca)
        .await
        .expect("the store connects over TLS")
        .with_namespace("tls");
    Arc::new(store)
}

/// Connecting returns within a bound, whatever it returns.
async fn connect_within_2s(url: &str) -> Result<RedisStore, ConfigError> {
    let started = Instant::now();
    let connected = RedisStore::connect(url).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "connecting took {:?}",
        started.elapsed()
    );
    connected
}

#[tokio::test]
async fn a_breaker_store_over_rediss_as_an_acl_user_shares_its_breaker() {
    let Some((server, _certificates, ca)) = server("redis_tls_breaker") else {
        return;
    };
    let stores = [tls_store(&server, &ca).await, tls_store(&server, &ca).await];
    assert!(stores.iter().all(|store| store.is_shared()));
    let breaker = |store: &Arc<RedisStore>| {
        CircuitBreakerTransport::builder(Scripted::answering(
            "provider",
            Reply::fail(Category::ServerError),
        ))
        .failure_threshold(2)
        .reset_timeout(Duration::from_secs(30))
        .store(Arc::clone(store) as Arc<dyn BreakerStore>)
        .build()
        .expect("valid settings")
    };
    let (a, b) = (breaker(&stores[0]), breaker(&stores[1]));
    let _ = a.send(&support::message()).await;
    let _ = b.send(&support::message()).await;
    let refused = a.send(&support::message()).await;
    assert!(matches!(refused, Err(error) if error.code() == "breaker.open"));
    assert_eq!(b.state(), State::Open, "opened by failures on both");
    assert!(stores.iter().all(|store| store.local_decisions() == 0));
}

#[tokio::test]
async fn a_shared_rate_limiter_over_rediss_paces_two_limiters_together() {
    let Some((server, _certificates, ca)) = server("redis_tls_rate") else {
        return;
    };
    let store = tls_store(&server, &ca).await;
    let limiter = || {
        RateLimitTransport::builder(Scripted::new("ses"))
            .name("ses")
            .per_second(50.0)
            .max_wait(Duration::from_secs(5))
            .shared(Arc::clone(&store))
            .build()
            .expect("valid settings")
    };
    let (first, second) = (limiter(), limiter());
    let started = Instant::now();
    let send_10 = |limiter: RateLimitTransport<Scripted>| async move {
        for _ in 0..10 {
            limiter.send(&support::message()).await.expect("sent");
        }
    };
    tokio::join!(send_10(first), send_10(second));
    let took = started.elapsed();
    // 20 sends at 50 a second between them: the first at once, then one every 20 ms.
    assert!(
        took >= Duration::from_millis(370),
        "one budget for both: 20 sends took {took:?}"
    );
    assert_eq!(store.local_decisions(), 0);
}

#[tokio::test]
async fn a_plain_url_to_the_tls_port_fails_fast_and_decides_locally() {
    let Some((server, _certificates, _ca)) = server("redis_tls_plain") else {
        return;
    };
    let url = format!("redis://127.0.0.1:{}/", server.tls_port());
    let store = connect_within_2s(&url).await.expect("not a setting error");
    assert!(!store.is_shared());
}

#[tokio::test]
async fn a_wrong_acl_password_is_a_config_error_for_the_url() {
    let Some((server, _certificates, _ca)) = server("redis_tls_wrong_password") else {
        return;
    };
    let url = server
        .url()
        .replace("redis://", &format!("redis://{}:wrong@", ACL_USER.0));
    let error = connect_within_2s(&url).await.expect_err("refused");
    assert_eq!(error.setting(), "url");
    assert!(
        error.reason().contains("user or password"),
        "{}",
        error.reason()
    );
}

#[tokio::test]
async fn the_right_acl_password_over_a_plain_port_connects() {
    let Some((server, _certificates, _ca)) = server("redis_tls_right_password") else {
        return;
    };
    let (user, password) = ACL_USER;
    let url = server
        .url()
        .replace("redis://", &format!("redis://{user}:{password}@"));
    let store = connect_within_2s(&url).await.expect("accepted");
    assert!(store.is_shared());
}

#[tokio::test]
async fn a_certificate_from_an_authority_the_system_does_not_trust_is_a_config_error() {
    let Some((server, _certificates, _ca)) = server("redis_tls_untrusted") else {
        return;
    };
    let error = connect_within_2s(&tls_url(&server))
        .await
        .expect_err("untrusted");
    assert_eq!(error.setting(), "url");
    assert!(error.reason().contains("certificate"), "{}", error.reason());
}

#[tokio::test]
async fn a_certificate_authority_needs_a_rediss_url() {
    let error = RedisStore::connect_with_ca("redis://127.0.0.1:6379/", b"")
        .await
        .expect_err("not TLS");
    assert_eq!(error.setting(), "url");
}

#[tokio::test]
async fn a_certificate_authority_without_a_certificate_is_a_config_error() {
    let error = RedisStore::connect_with_ca("rediss://127.0.0.1:6379/", b"not a certificate")
        .await
        .expect_err("no certificate");
    assert_eq!(error.setting(), "ca_pem");
}

#[tokio::test]
async fn cluster_urls_with_a_certificate_authority_must_all_be_rediss() {
    let error = RedisStore::connect_cluster_with_ca(
        &["rediss://127.0.0.1:7000/", "redis://127.0.0.1:7001/"],
        b"",
    )
    .await
    .expect_err("one is not TLS");
    assert_eq!(error.setting(), "urls");
}
