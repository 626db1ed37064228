//! Operating breakers that share a `RedisStore` (DESIGN §8): isolate, reset, the open streak
//! and snapshots hold for every process sharing a key. Each test runs its own redis-server.
#![cfg(feature = "redis")]

mod support;

use std::sync::Arc;
use std::time::Duration;

use mail_breaker::{
    BreakerStore, Category, CircuitBreakerTransport, RedisStore, Scope, State, Transport,
};
use support::redis::RedisServer;
use support::scripted::{Reply, Scripted};
use support::{message, message_to};

const RESET: Duration = Duration::from_millis(300);
/// Long enough that no call falls back to local state on a busy machine.
const PATIENT: Duration = Duration::from_secs(2);

async fn store(server: &RedisServer) -> Arc<RedisStore> {
    let store = RedisStore::connect(&server.url())
        .await
        .expect("a valid URL")
        .with_namespace("ops")
        .with_timeout(PATIENT);
    assert!(
        store.is_shared(),
        "the store reaches the test's redis-server"
    );
    Arc::new(store)
}

/// A breaker named "provider" on `store`: one failure opens it, each reopening doubles the
/// open time up to 8 reset timeouts.
fn breaker(inner: &Scripted, store: &Arc<RedisStore>) -> CircuitBreakerTransport<Scripted> {
    CircuitBreakerTransport::builder(inner.clone())
        .failure_threshold(1)
        .reset_timeout(RESET)
        .max_reset_timeout(RESET * 8)
        .store(Arc::clone(store) as Arc<dyn BreakerStore>)
        .build()
        .expect("valid settings")
}

#[tokio::test]
async fn an_isolation_holds_for_every_process_sharing_the_key_until_one_resets_it() {
    let Some(server) = RedisServer::start("redis_isolate_shared") else {
        return;
    };
    let (a_store, b_store) = (store(&server).await, store(&server).await);
    let (a, b) = (
        breaker(&Scripted::new("provider"), &a_store),
        breaker(&Scripted::new("provider"), &b_store),
    );
    a.isolate().await;
    tokio::time::sleep(RESET * 2).await;
    let refused = b.send(&message()).await.unwrap_err();
    assert_eq!(refused.code(), "breaker.isolated");
    assert!(b.snapshot().await.is_isolated());
    assert_eq!(b.inner().sends(), 0);

    b.reset().await;
    a.send(&message())
        .await
        .expect("reset by the other process");
    assert_eq!(a.snapshot().await.state(), State::Closed);
    assert!(
        a_store.is_shared() && b_store.is_shared(),
        "every decision came from Redis"
    );
}

#[tokio::test]
async fn the_open_streak_is_shared_so_a_probe_failed_elsewhere_doubles_the_open_time_here() {
    let Some(server) = RedisServer::start("redis_streak_shared") else {
        return;
    };
    let (a_store, b_store) = (store(&server).await, store(&server).await);
    let failing = || Scripted::answering("provider", Reply::fail(Category::ServerError));
    let (a, b) = (breaker(&failing(), &a_store), breaker(&failing(), &b_store));
    let _ = a.send(&message()).await; // opens for RESET
    tokio::time::sleep(RESET + Duration::from_millis(50)).await;
    let _ = b.send(&message()).await; // the probe fails: open for twice RESET

    let snapshot = a.snapshot().await;
    assert_eq!((snapshot.state(), snapshot.open_streak()), (State::Open, 2));
    let wait = snapshot.retry_after().expect("open");
    assert!(
        wait > RESET + RESET / 2,
        "the second opening lasts twice the reset timeout: {wait:?} left"
    );
    let refused = a.send(&message()).await.unwrap_err();
    assert!(refused.retry_after().unwrap() > RESET + RESET / 2);
}

#[tokio::test]
async fn snapshots_read_every_key_of_the_namespace_from_redis() {
    let Some(server) = RedisServer::start("redis_snapshots_scan") else {
        return;
    };
    let (a_store, b_store) = (store(&server).await, store(&server).await);
    let inner = Scripted::new("provider");
    let by_domain = |store: &Arc<RedisStore>| {
        CircuitBreakerTransport::builder(inner.clone())
            .failure_threshold(2)
            .scope(Scope::RecipientDomain)
            .store(Arc::clone(store) as Arc<dyn BreakerStore>)
            .build()
            .expect("valid settings")
    };
    let writer = by_domain(&a_store);
    for domain in ["one.example", "two.example", "Odd}{Key.example"] {
        inner.then([Reply::fail(Category::Network)]);
        let _ = writer.send(&message_to(&format!("x@{domain}"))).await;
    }
    // Another process, which never sent to these domains, sees them all.
    let reader = by_domain(&b_store);
    let mut seen: Vec<_> = reader
        .snapshots()
        .await
        .into_iter()
        .map(|s| (s.key().to_owned(), s.failures()))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("odd}{key.example".to_owned(), 1),
            ("one.example".to_owned(), 1),
            ("two.example".to_owned(), 1),
        ]
    );
}

#[tokio::test]
async fn with_redis_down_isolate_acts_on_this_process_and_never_fails() {
    let Some(mut server) = RedisServer::start("redis_isolate_down") else {
        return;
    };
    let store = store(&server).await;
    let breaker = breaker(&Scripted::new("provider"), &store);
    server.stop();
    breaker.isolate().await;
    let refused = breaker.send(&message()).await.unwrap_err();
    assert_eq!(refused.code(), "breaker.isolated");
    breaker.reset().await;
    breaker
        .send(&message())
        .await
        .expect("reset in this process too");
    assert!(!store.is_shared());
}

#[tokio::test]
async fn isolating_a_breaker_scoped_by_recipient_domain_refuses_a_domain_first_seen_after_it_in_every_process_until_reset()
 {
    let Some(server) = RedisServer::start("redis_isolate_by_domain") else {
        return;
    };
    let (a_store, b_store) = (store(&server).await, store(&server).await);
    let (a_inner, b_inner) = (Scripted::new("provider"), Scripted::new("provider"));
    let by_domain = |inner: &Scripted, store: &Arc<RedisStore>| {
        CircuitBreakerTransport::builder(inner.clone())
            .scope(Scope::RecipientDomain)
            .store(Arc::clone(store) as Arc<dyn BreakerStore>)
            .build()
            .expect("valid settings")
    };
    let (a, b) = (by_domain(&a_inner, &a_store), by_domain(&b_inner, &b_store));
    a.isolate().await;

    // Another process sharing the store, to a domain neither ever sent to.
    let refused = b
        .send(&message_to("x@first-seen-now.example"))
        .await
        .expect_err("isolated as a whole, in every process");
    assert_eq!(refused.code(), "breaker.isolated");
    assert_eq!(refused.retry_after(), None);
    assert_eq!(b_inner.sends(), 0);

    a.reset().await;
    b.send(&message_to("x@first-seen-now.example"))
        .await
        .expect("the reset lifted it for every process and every domain");
    assert_eq!(b_inner.sends(), 1);
    assert!(a_store.is_shared() && b_store.is_shared());
}

/// Isolating one breaker scoped by recipient domain leaves another breaker on the same Redis
/// store and namespace sending: each has its own isolation flag.
#[tokio::test]
async fn isolating_one_breaker_scoped_by_recipient_domain_leaves_another_on_the_same_redis_sending()
{
    let Some(server) = RedisServer::start("redis_isolate_one_of_two") else {
        return;
    };
    let shared = store(&server).await;
    let by_domain = |inner: &Scripted| {
        CircuitBreakerTransport::builder(inner.clone())
            .scope(Scope::RecipientDomain)
            .store(Arc::clone(&shared) as Arc<dyn BreakerStore>)
            .build()
            .expect("valid settings")
    };
    let (isolated, other) = (Scripted::new("relay-a"), Scripted::new("relay-b"));
    let (a, b) = (by_domain(&isolated), by_domain(&other));
    a.isolate().await;
    let refused = a
        .send(&message_to("x@example.org"))
        .await
        .expect_err("isolated");
    assert_eq!(refused.code(), "breaker.isolated");
    b.send(&message_to("x@example.org"))
        .await
        .expect("another breaker's isolation is not this one's");
    assert_eq!((isolated.sends(), other.sends()), (0, 1));
}
