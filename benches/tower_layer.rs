//! The breaker as a tower layer against tower-resilience's circuit breaker, in one run, around
//! the same `service_fn` that answers at once (so every figure above the bare one is the
//! layer's own cost). Groups:
//! - `tower_closed`: one call on one task through a closed breaker (`ready` and `call` on a
//!   service clone, as `oneshot` does);
//! - `tower_open`: one refused call (our layer refuses in the call; tower-resilience's answers
//!   its open error);
//! - `tower_tasks_<n>`: n tasks on an n-worker runtime calling through one layer each on its
//!   own clone, 1,000 calls each; the figure is the whole round.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use mail_breaker::tower::CircuitBreakerLayer;
use tokio::runtime::{Builder, Runtime};
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_resilience_circuitbreaker::CircuitBreakerLayer as ResilienceLayer;

type Answer = Result<u32, std::io::Error>;

fn ok_service()
-> impl Service<u32, Response = u32, Error = std::io::Error, Future = std::future::Ready<Answer>> + Clone
{
    service_fn(|request: u32| std::future::ready(Ok(request)))
}

fn failing_service()
-> impl Service<u32, Response = u32, Error = std::io::Error, Future = std::future::Ready<Answer>> + Clone
{
    service_fn(|_: u32| std::future::ready(Err(std::io::Error::other("down"))))
}

fn ours() -> CircuitBreakerLayer {
    CircuitBreakerLayer::builder("bench")
        .failure_threshold(5)
        .reset_timeout(Duration::from_secs(3600))
        .build()
        .expect("valid settings")
}

fn theirs() -> ResilienceLayer {
    ResilienceLayer::builder()
        .consecutive_failures(5)
        .wait_duration_in_open(Duration::from_secs(3600))
        .build()
        .expect("valid settings")
}

fn runtime(workers: usize) -> Runtime {
    Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// One call on a clone of `service`, as a caller sharing it would make it.
async fn one<S>(service: &S, request: u32) -> bool
where
    S: Service<u32> + Clone,
{
    service.clone().oneshot(request).await.is_ok()
}

fn closed(c: &mut Criterion) {
    let rt = runtime(1);
    let mut group = c.benchmark_group("tower_closed");
    let bare = ok_service();
    let ours = ours().layer(ok_service());
    let theirs = theirs().layer(ok_service());
    group.bench_function("bare", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(one(&bare, 1).await) })
    });
    group.bench_function("mail_breaker", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(one(&ours, 1).await) })
    });
    group.bench_function("tower_resilience", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(one(&theirs, 1).await) })
    });
    group.finish();
}

fn open(c: &mut Criterion) {
    let rt = runtime(1);
    let mut group = c.benchmark_group("tower_open");
    let ours = ours().layer(failing_service());
    let theirs = theirs().layer(failing_service());
    rt.block_on(async {
        for _ in 0..10 {
            one(&ours, 1).await;
            one(&theirs, 1).await;
        }
    });
    group.bench_function("mail_breaker", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(one(&ours, 1).await) })
    });
    group.bench_function("tower_resilience", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(one(&theirs, 1).await) })
    });
    group.finish();
}

/// `tasks` tasks calling 1,000 times each through clones of `service`.
async fn round<S>(service: &S, tasks: usize)
where
    S: Service<u32> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: Send,
    S::Error: Send,
{
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let service = service.clone();
            tokio::spawn(async move {
                for n in 0..1_000 {
                    black_box(service.clone().oneshot(n).await.is_ok());
                }
            })
        })
        .collect();
    for handle in handles {
        handle.await.expect("a task");
    }
}

fn tasks(c: &mut Criterion) {
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    for tasks in [1, cores.max(2)] {
        let rt = runtime(tasks);
        let mut group = c.benchmark_group(format!("tower_tasks_{tasks}"));
        let ours = ours().layer(ok_service());
        let theirs = theirs().layer(ok_service());
        group.bench_function("mail_breaker", |b| {
            b.to_async(&rt).iter(|| round(&ours, tasks))
        });
        group.bench_function("tower_resilience", |b| {
            b.to_async(&rt).iter(|| round(&theirs, tasks))
        });
        group.finish();
    }
}

criterion_group!(benches, closed, open, tasks);
criterion_main!(benches);
