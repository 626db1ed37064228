//! The breaker as a tower layer around a plain `tower::service_fn`, and the mail stack as a
//! tower service (DESIGN §22, issue 66). Time is paused: tokio's clock drives the breaker.
#![cfg(feature = "tower")]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::join_all;
use mail_breaker::tower::{
    BreakerError, CircuitBreakerLayer, Refuse, SendErrors, SendRequest, ServiceTransport,
    TransportService,
};
use mail_breaker::{Category, PoolTransport, Receipt, SendError, State, Transport};
use tower::{Service, ServiceBuilder, ServiceExt};

const RESET: Duration = Duration::from_secs(30);

/// A service whose calls fail while `down` is set, counting every call that reached it.
#[derive(Clone, Default)]
struct Backend {
    down: Arc<AtomicBool>,
    calls: Arc<AtomicUsize>,
    /// How long each call takes.
    takes: Duration,
}

impl Backend {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    fn service(
        &self,
    ) -> impl Service<
        u32,
        Response = u32,
        Error = std::io::Error,
        Future = impl Future<Output = Result<u32, std::io::Error>> + Send + 'static,
    > + Clone
    + Send
    + 'static {
        let backend = self.clone();
        tower::service_fn(move |request: u32| {
            let backend = backend.clone();
            async move {
                backend.calls.fetch_add(1, Ordering::SeqCst);
                if !backend.takes.is_zero() {
                    tokio::time::sleep(backend.takes).await;
                }
                if backend.down.load(Ordering::SeqCst) {
                    Err(std::io::Error::other("backend down"))
                } else {
                    Ok(request)
                }
            }
        })
    }
}

fn layer(refuse: Refuse) -> CircuitBreakerLayer {
    CircuitBreakerLayer::builder("backend")
        .failure_threshold(1)
        .reset_timeout(RESET)
        .when_open(refuse)
        .build()
        .expect("valid settings")
}

/// Opens `layer`'s breaker with one failed call through a service of `backend`.
async fn open(layer: &CircuitBreakerLayer, backend: &Backend) {
    backend.set_down(true);
    let service = ServiceBuilder::new()
        .layer(layer.clone())
        .service(backend.service());
    let failed = service.oneshot(1).await;
    assert!(matches!(failed, Err(BreakerError::Inner(_))), "{failed:?}");
    assert_eq!(layer.handle().state(), State::Open);
    backend.set_down(false);
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_refuses_in_the_call_without_reaching_the_service() {
    let layer = layer(Refuse::InCall);
    let backend = Backend::default();
    open(&layer, &backend).await;
    let service = ServiceBuilder::new()
        .layer(layer)
        .service(backend.service());
    let refused = service.oneshot(2).await;
    let Err(BreakerError::Refused(error)) = refused else {
        panic!("refused: {refused:?}");
    };
    assert_eq!(error.code(), "breaker.open");
    assert_eq!(error.category(), Category::ServiceUnavailable);
    assert_eq!(error.retry_after(), Some(RESET));
    assert_eq!(backend.calls(), 1, "only the call that failed");
}

#[tokio::test(start_paused = true)]
async fn one_probe_among_100_racing_calls_reaches_the_service() {
    let layer = layer(Refuse::InCall);
    let backend = Backend {
        takes: Duration::from_millis(100),
        ..Backend::default()
    };
    open(&layer, &backend).await;
    tokio::time::advance(RESET).await;
    let service = ServiceBuilder::new()
        .layer(layer.clone())
        .service(backend.service());
    let answers = join_all((0..100).map(|n| service.clone().oneshot(n))).await;
    let passed = answers.iter().filter(|answer| answer.is_ok()).count();
    let refused = answers
        .iter()
        .filter(|answer| matches!(answer, Err(BreakerError::Refused(_))))
        .count();
    assert_eq!((passed, refused), (1, 99));
    assert_eq!(backend.calls(), 2, "the failure, then the probe");
    assert_eq!(layer.handle().state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_probe_reserved_by_poll_ready_is_given_back_when_the_service_is_dropped() {
    let layer = layer(Refuse::InCall);
    let backend = Backend::default();
    open(&layer, &backend).await;
    tokio::time::advance(RESET).await;
    let mut reserving = ServiceBuilder::new()
        .layer(layer.clone())
        .service(backend.service());
    reserving.ready().await.expect("the probe's leave");
    // Another caller meanwhile: the probe is held.
    let held = ServiceBuilder::new()
        .layer(layer.clone())
        .service(backend.service());
    assert!(matches!(
        held.oneshot(1).await,
        Err(BreakerError::Refused(_))
    ));
    drop(reserving);
    let service = ServiceBuilder::new()
        .layer(layer.clone())
        .service(backend.service());
    assert_eq!(service.oneshot(2).await.expect("the next caller probes"), 2);
    assert_eq!(layer.handle().state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_probe_kept_past_the_probe_timeout_without_a_call_is_refused_at_the_call() {
    let layer = layer(Refuse::InCall);
    let backend = Backend::default();
    open(&layer, &backend).await;
    tokio::time::advance(RESET).await;
    let mut late = ServiceBuilder::new()
        .layer(layer.clone())
        .service(backend.service());
    late.ready().await.expect("the probe's leave");
    tokio::time::advance(RESET).await;
    let refused = late.call(1).await;
    assert!(
        matches!(refused, Err(BreakerError::Refused(_))),
        "{refused:?}"
    );
    assert_eq!(backend.calls(), 1, "nothing reached the service");
}

#[tokio::test(start_paused = true)]
async fn an_answer_from_before_a_reset_changes_nothing() {
    let layer = CircuitBreakerLayer::builder("backend")
        .failure_threshold(1)
        .reset_timeout(RESET)
        .build()
        .expect("valid settings");
    let backend = Backend {
        takes: Duration::from_secs(5),
        ..Backend::default()
    };
    backend.set_down(true);
    let service = ServiceBuilder::new()
        .layer(layer.clone())
        .service(backend.service());
    let slow = tokio::spawn(service.clone().oneshot(1));
    tokio::time::advance(Duration::from_secs(1)).await;
    layer.handle().isolate().await;
    layer.handle().reset().await;
    assert!(matches!(
        slow.await.expect("answered"),
        Err(BreakerError::Inner(_))
    ));
    assert_eq!(
        layer.handle().state(),
        State::Closed,
        "the failure was let go before the reset"
    );
}

#[tokio::test(start_paused = true)]
async fn an_isolated_breaker_refuses_until_it_is_reset() {
    let layer = layer(Refuse::InCall);
    let backend = Backend::default();
    let service = ServiceBuilder::new()
        .layer(layer.clone())
        .service(backend.service());
    layer.handle().isolate().await;
    let refused = service.clone().oneshot(1).await;
    let Err(BreakerError::Refused(error)) = refused else {
        panic!("refused: {refused:?}");
    };
    assert_eq!(error.code(), "breaker.isolated");
    tokio::time::advance(RESET * 10).await;
    assert!(matches!(
        service.clone().oneshot(1).await,
        Err(BreakerError::Refused(_))
    ));
    layer.handle().reset().await;
    assert_eq!(service.oneshot(3).await.expect("served"), 3);
    assert_eq!(backend.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_buffer_in_front_survives_an_open_breaker_and_serves_after_the_probe() {
    let layer = layer(Refuse::InCall);
    let backend = Backend::default();
    let service = ServiceBuilder::new()
        .buffer(16)
        .layer(layer.clone())
        .service(backend.service());
    backend.set_down(true);
    assert!(service.clone().oneshot(1).await.is_err());
    backend.set_down(false);
    let refused = service.clone().oneshot(2).await.expect_err("refused");
    assert!(
        refused
            .downcast_ref::<BreakerError<std::io::Error>>()
            .is_some(),
        "the breaker's refusal, not a closed buffer: {refused}"
    );
    tokio::time::advance(RESET).await;
    assert_eq!(service.clone().oneshot(3).await.expect("the probe"), 3);
    assert_eq!(service.oneshot(4).await.expect("closed again"), 4);
}

#[tokio::test(start_paused = true)]
async fn a_balance_of_two_with_not_ready_sends_nothing_to_the_open_one() {
    let broken = Backend::default();
    let healthy = Backend::default();
    let broken_layer = layer(Refuse::NotReady);
    open(&broken_layer, &broken).await;
    let endpoints = vec![
        tower::load::Constant::new(
            ServiceBuilder::new()
                .layer(broken_layer.clone())
                .service(broken.service()),
            1,
        ),
        tower::load::Constant::new(
            ServiceBuilder::new()
                .layer(layer(Refuse::NotReady))
                .service(healthy.service()),
            1,
        ),
    ];
    let mut balance =
        tower::balance::p2c::Balance::new(tower::discover::ServiceList::new(endpoints));
    for n in 0..50 {
        let answer = balance.ready().await.expect("ready").call(n).await;
        assert_eq!(answer.expect("served by the healthy one"), n);
    }
    assert_eq!(broken.calls(), 1, "only the failure that opened it");
    assert_eq!(healthy.calls(), 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transport_service_under_timeout_and_concurrency_limit_sends_through_smtp_sink() {
    let Some(sink) = support::smtp_sink::SmtpSink::start("tower_transport_service", &[]) else {
        return;
    };
    let smtp = mail_breaker::SmtpTransport::unencrypted("127.0.0.1", sink.port())
        .with_timeout(Duration::from_millis(800));
    let service = ServiceBuilder::new()
        .timeout(Duration::from_secs(5))
        .concurrency_limit(2)
        .service(TransportService::new(smtp));
    let answers = join_all((0..6).map(|_| {
        service
            .clone()
            .oneshot(SendRequest::from(&support::message()))
    }))
    .await;
    for answer in &answers {
        assert!(answer.is_ok(), "{answer:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_transport_stands_in_a_pool_and_keeps_10_sends_in_flight() {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(10));
    let service = {
        let (in_flight, most, barrier) = (in_flight.clone(), most.clone(), barrier.clone());
        tower::service_fn(move |_request: SendRequest| {
            let (in_flight, most, barrier) = (in_flight.clone(), most.clone(), barrier.clone());
            async move {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                // Every send waits for the nine others: they must all be in flight at once.
                barrier.wait().await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(Receipt::new("service"))
            }
        })
    };
    let member = ServiceTransport::new("service", service, |error: std::io::Error| {
        SendError::new(Category::Network, "service.io", error.to_string())
    });
    let pool = PoolTransport::builder()
        .add(member, 1)
        .build()
        .expect("a pool");
    let messages: Vec<lettre::Message> = (0..10).map(|_| support::message()).collect();
    let sends = join_all(messages.iter().map(|message| pool.send(message)));
    let answers = tokio::time::timeout(Duration::from_secs(5), sends)
        .await
        .expect("all ten in flight at once");
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert_eq!(most.load(Ordering::SeqCst), 10);
}

#[tokio::test]
async fn a_service_transports_error_is_classified_and_names_the_transport() {
    let service = tower::service_fn(|_request: SendRequest| async {
        Err::<Receipt, _>(std::io::Error::other("refused by the API"))
    });
    let transport = ServiceTransport::new("api", service, |error: std::io::Error| {
        SendError::new(Category::Rejected, "api.refused", error.to_string())
    });
    let error = transport
        .send(&support::message())
        .await
        .expect_err("refused");
    assert_eq!(error.category(), Category::Rejected);
    assert_eq!(error.transport(), Some("api"));
}

#[tokio::test(start_paused = true)]
async fn the_mail_classifier_counts_provider_failures_and_not_refusals_of_the_message() {
    let layer = CircuitBreakerLayer::builder("mail")
        .failure_threshold(1)
        .classify(SendErrors)
        .build()
        .expect("valid settings");
    let rejected = tower::service_fn(|_: SendRequest| async {
        Err::<Receipt, _>(SendError::new(
            Category::Rejected,
            "smtp.550",
            "no such user",
        ))
    });
    let service = ServiceBuilder::new().layer(layer.clone()).service(rejected);
    assert!(
        service
            .oneshot(SendRequest::from(&support::message()))
            .await
            .is_err()
    );
    assert_eq!(
        layer.handle().state(),
        State::Closed,
        "a refusal of the message"
    );
    let down = tower::service_fn(|_: SendRequest| async {
        Err::<Receipt, _>(SendError::new(Category::Network, "smtp.network", "down"))
    });
    let service = ServiceBuilder::new().layer(layer.clone()).service(down);
    assert!(
        service
            .oneshot(SendRequest::from(&support::message()))
            .await
            .is_err()
    );
    assert_eq!(layer.handle().state(), State::Open);
}

/// Review of issue 66, finding 2: a call's time is counted from the call, not from the
/// `poll_ready` that let it go.
#[tokio::test(start_paused = true)]
async fn a_fast_call_made_long_after_poll_ready_is_not_a_slow_call() {
    let layer = CircuitBreakerLayer::builder("backend")
        .failure_threshold(1)
        .slow_call(Duration::from_secs(1))
        .build()
        .expect("valid settings");
    let backend = Backend::default();
    let mut service = ServiceBuilder::new()
        .layer(layer.clone())
        .service(backend.service());
    service.ready().await.expect("ready");
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(service.call(1).await.expect("answered at once"), 1);
    assert_eq!(layer.handle().state(), State::Closed);
}

/// Review of issue 66, finding 11: a call made before `poll_ready` said ready breaks tower's
/// contract; it is answered without reaching the service, and the answer names the breaker.
#[tokio::test(start_paused = true)]
async fn a_call_before_poll_ready_is_answered_naming_the_breaker_and_reaches_nothing() {
    let layer = layer(Refuse::InCall);
    let backend = Backend::default();
    let mut service = ServiceBuilder::new()
        .layer(layer)
        .service(backend.service());
    let answer = service.call(1).await;
    let Err(BreakerError::Refused(error)) = answer else {
        panic!("refused: {answer:?}");
    };
    assert_eq!(error.code(), "tower.not_ready");
    assert_eq!(error.transport(), Some("backend"));
    assert_eq!(backend.calls(), 0);
}
