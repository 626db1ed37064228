//! A Postmark-like API (`POST /email`) that takes up to R messages a second (a token bucket
//! holding a tenth of a second's worth) and answers the rest as Postmark throttles: HTTP 429.
//! R can change while a test runs; every answer is logged with its time, and the subjects of
//! the messages it took are kept, to count what arrived.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::http_api::{ApiServer, Reply};

/// The server token the transport must send.
pub const TOKEN: &str = "throttled-api-token";

const TAKEN: &str = r#"{"To":"user@example.org","SubmittedAt":"2024-01-01T00:00:00Z","MessageID":"taken","ErrorCode":0,"Message":"OK"}"#;
const THROTTLED: &str = r#"{"ErrorCode":429,"Message":"Rate limit exceeded."}"#;

#[derive(Debug)]
struct Bucket {
    per_second: f64,
    tokens: f64,
    refilled: Instant,
}

impl Bucket {
    fn capacity(&self) -> f64 {
        (self.per_second / 10.0).max(1.0)
    }

    fn take(&mut self, now: Instant) -> bool {
        let elapsed = now.duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.capacity());
        self.refilled = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// What the server answered: when, and whether it took the message.
#[derive(Debug, Default)]
struct Log {
    answers: Vec<(Instant, bool)>,
    subjects: Vec<String>,
}

pub struct ThrottlingApi {
    server: ApiServer,
    bucket: Arc<Mutex<Bucket>>,
    log: Arc<Mutex<Log>>,
}

impl ThrottlingApi {
    pub async fn start(per_second: f64) -> ThrottlingApi {
        let mut full = Bucket {
            per_second,
            tokens: 0.0,
            refilled: Instant::now(),
        };
        full.tokens = full.capacity();
        let bucket = Arc::new(Mutex::new(full));
        let log: Arc<Mutex<Log>> = Arc::default();
        let (answering, logging) = (Arc::clone(&bucket), Arc::clone(&log));
        let server = ApiServer::start(move |request| {
            if request.header("x-postmark-server-token") != Some(TOKEN) {
                return Reply::json(401, r#"{"ErrorCode":10,"Message":"Bad token."}"#);
            }
            let now = Instant::now();
            let taken = lock(&answering).take(now);
            let mut log = lock(&logging);
            log.answers.push((now, taken));
            if taken {
                let subject = request.json()["Subject"].as_str().unwrap_or("").to_owned();
                log.subjects.push(subject);
                Reply::json(200, TAKEN)
            } else {
                Reply::json(429, THROTTLED)
            }
        })
        .await;
        ThrottlingApi {
            server,
            bucket,
            log,
        }
    }

    /// The API's base URL, for the transport's endpoint.
    pub fn endpoint(&self) -> String {
        self.server.endpoint()
    }

    /// From now on it takes `per_second`.
    pub fn set_rate(&self, per_second: f64) {
        let mut bucket = lock(&self.bucket);
        bucket.take(Instant::now()); // settle the tokens earned at the old rate
        bucket.tokens += 1.0; // give back the one that took
        bucket.per_second = per_second;
    }

    /// Messages taken and throttled in `[from, from + span)`.
    pub fn answers(&self, from: Instant, span: Duration) -> (usize, usize) {
        let log = lock(&self.log);
        let within = log
            .answers
            .iter()
            .filter(|(at, _)| *at >= from && *at < from + span);
        within.fold((0, 0), |(taken, throttled), (_, took)| {
            if *took {
                (taken + 1, throttled)
            } else {
                (taken, throttled + 1)
            }
        })
    }

    /// The subjects of every message it took, in order.
    pub fn subjects(&self) -> Vec<String> {
        lock(&self.log).subjects.clone()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
