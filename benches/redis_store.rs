//! What a decision costs with `RedisStore` on a loopback redis-server, against `MemoryStore`:
//! one decision (`BreakerStore::acquire`) and one guarded send (acquire, send, record)
//! through a closed breaker around a transport that answers at once.
//!
//! Before measuring, it counts the commands the server ran (through `MONITOR`) for
//! `ROUND_TRIPS` decisions and sends, prints them, and keeps them beside criterion's results
//! (`target/criterion/redis_store/round_trips.json`): one decision is one command from the
//! client (one round trip); the script's own commands run inside the server. Skipped, with a message, where redis-server is missing or the crate was built
//! without the `redis` feature.

mod support;

use criterion::{Criterion, criterion_group, criterion_main};

#[cfg(feature = "redis")]
mod with_redis {
    use std::hint::black_box;
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpStream;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use criterion::{Criterion, Throughput};
    use mail_breaker::breaker::Rules;
    use mail_breaker::store::Reporter;
    use mail_breaker::{BreakerStore, CircuitBreakerTransport, MemoryStore, RedisStore, Transport};

    use crate::support::{self, Immediate, redis::RedisServer};

    /// How many decisions and sends the round-trip count is taken over.
    const ROUND_TRIPS: u64 = 1_000;

    /// Commands the server ran, as `MONITOR` shows them: those a client sent (each one
    /// round trip) and those a script ran inside the server.
    #[derive(Debug, Default)]
    struct Seen {
        from_clients: AtomicU64,
        from_scripts: AtomicU64,
    }

    /// Watches every command the server at `127.0.0.1:port` runs, in a thread of its own,
    /// until the returned connection is shut down (MONITOR slows the server down).
    fn monitor(port: u16) -> (Arc<Seen>, TcpStream) {
        let seen = Arc::new(Seen::default());
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("a MONITOR connection");
        stream.write_all(b"MONITOR\r\n").expect("MONITOR");
        let control = stream
            .try_clone()
            .expect("a handle on the MONITOR connection");
        let mut lines = BufReader::new(stream).lines();
        let counts = Arc::clone(&seen);
        std::thread::spawn(move || {
            // `+1700000000.123 [0 127.0.0.1:40000] "evalsha" ...` or `... [0 lua] "time"`.
            while let Some(Ok(line)) = lines.next() {
                if line.contains(" lua] ") {
                    counts.from_scripts.fetch_add(1, Ordering::Relaxed);
                } else if line.contains(" [") {
                    counts.from_clients.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        (seen, control)
    }

    impl Seen {
        /// The counts once the server has gone quiet (MONITOR lags a little behind).
        fn settled(&self) -> (u64, u64) {
            let mut last = (u64::MAX, u64::MAX);
            loop {
                std::thread::sleep(Duration::from_millis(100));
                let now = (
                    self.from_clients.load(Ordering::Relaxed),
                    self.from_scripts.load(Ordering::Relaxed),
                );
                if now == last {
                    return now;
                }
                last = now;
            }
        }
    }

    pub fn bench(c: &mut Criterion) {
        if !support::installed("redis-server", "redis_store") {
            return;
        }
        let Some(server) = RedisServer::start("redis_store") else {
            return;
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a Tokio runtime");
        let rules = Rules::default();
        let late = Reporter::none();
        let redis_store = rt.block_on(async {
            let store = RedisStore::connect(&server.url())
                .await
                .expect("a Redis URL")
                .with_namespace("bench");
            Arc::new(store)
        });
        let memory_store = Arc::new(MemoryStore::new());
        let message = support::message_to("user@example.org");
        let redis_breaker = CircuitBreakerTransport::builder(Immediate)
            .store(redis_store.clone())
            .build()
            .expect("valid settings");
        let memory_breaker = CircuitBreakerTransport::builder(Immediate)
            .store(memory_store.clone())
            .build()
            .expect("valid settings");

        let port = server
            .url()
            .trim_end_matches('/')
            .rsplit(':')
            .next()
            .and_then(|port| port.parse().ok())
            .expect("a port in the server's URL");
        let (seen, monitoring) = monitor(port);
        // Warm up: the script is loaded and the key made before counting.
        rt.block_on(redis_breaker.send(&message)).expect("a send");
        let before = seen.settled();
        rt.block_on(async {
            for _ in 0..ROUND_TRIPS {
                black_box(redis_store.acquire("immediate", &rules, &late).await);
            }
        });
        let middle = seen.settled();
        rt.block_on(async {
            for _ in 0..ROUND_TRIPS {
                redis_breaker.send(&message).await.expect("a send");
            }
        });
        let after = seen.settled();
        let _ = monitoring.shutdown(std::net::Shutdown::Both);
        assert!(
            redis_store.is_shared(),
            "the store decided locally: Redis did not answer"
        );
        let decisions = (middle.0 - before.0, middle.1 - before.1);
        let sends = (after.0 - middle.0, after.1 - middle.1);
        println!(
            "redis_store: {ROUND_TRIPS} decisions: {} commands from the client (round trips), \
             {} run by the script inside Redis; {ROUND_TRIPS} guarded sends: {} round trips, {} in scripts",
            decisions.0, decisions.1, sends.0, sends.1
        );
        let dir = std::path::Path::new(
            &std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| String::from("target")),
        )
        .join("criterion/redis_store");
        let json = format!(
            "{{\"decisions\":{ROUND_TRIPS},\"decision_round_trips\":{},\"sends\":{ROUND_TRIPS},\"send_round_trips\":{}}}\n",
            decisions.0, sends.0
        );
        if let Err(error) = std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(dir.join("round_trips.json"), json))
        {
            println!("redis_store: could not keep the round-trip count: {error}");
        }

        let mut group = c.benchmark_group("redis_store");
        group
            .throughput(Throughput::Elements(1))
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(4));
        group.bench_function("decision/memory", |b| {
            b.to_async(&rt).iter(|| async {
                black_box(memory_store.acquire("immediate", &rules, &late).await)
            })
        });
        group.bench_function("decision/redis", |b| {
            b.to_async(&rt)
                .iter(|| async { black_box(redis_store.acquire("immediate", &rules, &late).await) })
        });
        group.bench_function("send/memory", |b| {
            b.to_async(&rt)
                .iter(|| async { black_box(memory_breaker.send(&message).await) })
        });
        group.bench_function("send/redis", |b| {
            b.to_async(&rt)
                .iter(|| async { black_box(redis_breaker.send(&message).await) })
        });
        group.finish();
        drop(server);
    }
}

fn redis_store(c: &mut Criterion) {
    #[cfg(feature = "redis")]
    with_redis::bench(c);
    #[cfg(not(feature = "redis"))]
    {
        let _ = c;
        println!(
            "SKIPPED redis_store: built without the `redis` feature (cargo bench --features redis)"
        );
    }
}

criterion_group!(benches, redis_store);
criterion_main!(benches);
