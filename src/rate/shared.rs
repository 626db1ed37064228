//! The limiter a fleet shares: one hash in Redis (or a Redis Cluster) per limiter name, one
//! script call per send (`rate.lua`, beside this file), on the connection of a
//! [`RedisStore`](crate::RedisStore) and with its timeout. While Redis does not answer, each
//! process limits on its own at its share of the rate and of the burst, and tries Redis again
//! once per retry interval, as the store does. Its share is `1 / members`: the members set
//! with `.members(n)`, or else the processes Redis last said share the limiter.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ::redis::Script;
use tokio::time::Instant;

use super::gcra::Slot;
use super::local::LocalLimiter;
use crate::store::redis::{Connection, RedisStore};

const SOURCE: &str = include_str!("rate.lua");

/// How long a limiter's hash stays in Redis after its last write.
const IDLE_EXPIRY: Duration = Duration::from_secs(3_600);

pub(crate) struct SharedLimiter {
    connection: Connection,
    script: Arc<Script>,
    key: String,
    per_second: f64,
    burst: u32,
    floor: f64,
    timeout: Duration,
    retry_interval: Duration,
    /// This process's name among those sharing the limiter (the store's member name).
    member: String,
    /// The processes sharing the limiter, when set with `.members(n)`.
    members: Option<u32>,
    /// The processes Redis last said share the limiter; 0 before it said.
    members_seen: AtomicU32,
    /// Decides while Redis does not answer: at this process's share of the rate and burst.
    fallback: Mutex<Fallback>,
    /// Redis is not asked before this, after it failed.
    silent_until: Mutex<Option<Instant>>,
    /// Whether the warning of this outage was logged.
    warned: AtomicBool,
    /// The rate Redis last said, as `f64` bits.
    last_rate: AtomicU64,
    /// The limiter's name, for the logs.
    name: String,
}

impl std::fmt::Debug for SharedLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedLimiter")
            .field("key", &self.key)
            .field("per_second", &self.per_second)
            .field("burst", &self.burst)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The limiter of one process while Redis does not answer, made for a number of members.
#[derive(Debug)]
struct Fallback {
    members: u32,
    limiter: LocalLimiter,
}

impl Fallback {
    /// A limiter at the share of one of `members` processes: `1 / members` of the rate and of
    /// the burst (at least one send), the floor no higher than the share.
    fn new(members: u32, per_second: f64, burst: u32, floor: f64) -> Fallback {
        let members = members.max(1);
        let share = per_second / f64::from(members);
        let burst = (burst / members).max(1);
        Fallback {
            members,
            limiter: LocalLimiter::new(share, burst, floor.min(share)),
        }
    }
}

/// What a call of the script said.
enum Said {
    Slot(Slot),
    Rate,
}

impl SharedLimiter {
    pub(crate) fn new(
        store: &RedisStore,
        name: &str,
        per_second: f64,
        burst: u32,
        floor: f64,
        members: Option<u32>,
    ) -> SharedLimiter {
        SharedLimiter {
            connection: store.connection(),
            script: Arc::new(Script::new(SOURCE)),
            key: crate::store::redis::rate_key(store.namespace(), name),
            per_second,
            burst,
            floor,
            timeout: store.timeout(),
            retry_interval: store.retry_interval(),
            member: store.member().to_owned(),
            members,
            members_seen: AtomicU32::new(0),
            // Knowing neither the members nor who shares it: the full rate and burst.
            fallback: Mutex::new(Fallback::new(
                members.unwrap_or(1),
                per_second,
                burst,
                floor,
            )),
            silent_until: Mutex::new(None),
            warned: AtomicBool::new(false),
            last_rate: AtomicU64::new(per_second.to_bits()),
            name: name.to_owned(),
        }
    }

    /// Reserves the next slot in the fleet's budget at its rate times `factor`, or in this
    /// process's share of it while Redis does not answer.
    pub(crate) async fn reserve(&self, max_wait: Duration, cost: u32, factor: f64) -> Slot {
        if self.may_ask() {
            let micros = u64::try_from(max_wait.as_micros()).unwrap_or(u64::MAX);
            if let Some(Said::Slot(slot)) = self.call("take", micros, cost, factor).await {
                return slot;
            }
        }
        self.fallback().limiter.reserve(max_wait, cost, factor)
    }

    fn fallback(&self) -> std::sync::MutexGuard<'_, Fallback> {
        // Replaced whole, never torn by a panic.
        self.fallback.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many processes share the limiter: as set, or as Redis last said; `None` when
    /// neither is known.
    fn members(&self) -> Option<u32> {
        self.members.or_else(|| {
            let seen = self.members_seen.load(Ordering::Relaxed);
            (seen > 0).then_some(seen)
        })
    }

    /// The provider throttled a send: the fleet's rate halves (this process's share too).
    pub(crate) async fn throttled(&self) {
        self.fallback().limiter.throttled();
        if self.may_ask() {
            let _ = self.call("throttle", 0, 1, 1.0).await;
        }
    }

    /// The rate Redis last said (before any factor), or this process's share while Redis
    /// does not answer.
    pub(crate) fn per_second(&self) -> f64 {
        if self.silent() {
            self.fallback().limiter.per_second()
        } else {
            f64::from_bits(self.last_rate.load(Ordering::Relaxed))
        }
    }

    fn silent(&self) -> bool {
        self.silent_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// Whether to ask Redis now: always while it answers; once per retry interval while not.
    fn may_ask(&self) -> bool {
        let mut silent = self
            .silent_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match *silent {
            None => true,
            Some(until) if Instant::now() >= until => {
                *silent = Some(crate::time::later(Instant::now(), self.retry_interval));
                true
            }
            Some(_) => false,
        }
    }

    async fn call(&self, op: &str, max_wait_micros: u64, cost: u32, factor: f64) -> Option<Said> {
        let mut connection = self.connection.clone();
        let mut invocation = self.script.key(&self.key);
        invocation
            .arg(op)
            .arg(self.per_second)
            .arg(self.burst)
            .arg(max_wait_micros)
            .arg(self.floor)
            .arg(u64::try_from(IDLE_EXPIRY.as_millis()).unwrap_or(u64::MAX))
            .arg(&self.member)
            .arg(cost)
            // No test clock: the server's.
            .arg("")
            .arg(factor);
        let reply: Result<Result<Vec<i64>, _>, _> =
            tokio::time::timeout(self.timeout, invocation.invoke_async(&mut connection)).await;
        match reply {
            Ok(Ok(values)) if let [verdict, micros, rate, members] = values[..] => {
                self.answered();
                let members = u32::try_from(members).unwrap_or(u32::MAX);
                self.members_seen.store(members, Ordering::Relaxed);
                let rate = rate as f64 / 1000.0;
                self.last_rate.store(rate.to_bits(), Ordering::Relaxed);
                let micros = Duration::from_micros(u64::try_from(micros).unwrap_or(0));
                Some(match verdict {
                    1 => Said::Slot(Slot::After(micros)),
                    0 => Said::Slot(Slot::Refused {
                        retry_after: micros,
                    }),
                    _ => Said::Rate,
                })
            }
            Ok(Ok(values)) => {
                self.failed(&format!("an answer of {} numbers, not 4", values.len()));
                None
            }
            Ok(Err(error)) => {
                self.failed(&error);
                None
            }
            Err(_) => {
                self.failed(&format!("no answer within {:?}", self.timeout));
                None
            }
        }
    }

    fn answered(&self) {
        let mut silent = self
            .silent_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if silent.take().is_some() {
            self.warned.store(false, Ordering::Relaxed);
            tracing::info!(limiter = %self.name, "rate.redis_answering: the fleet shares its rate again");
        }
    }

    fn failed(&self, why: &dyn std::fmt::Display) {
        *self
            .silent_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) =
            Some(crate::time::later(Instant::now(), self.retry_interval));
        if !self.warned.swap(true, Ordering::Relaxed) {
            let members = self.members();
            let mut fallback = self.fallback();
            let share = members.unwrap_or(1);
            if fallback.members != share {
                *fallback = Fallback::new(share, self.per_second, self.burst, self.floor);
            }
            tracing::warn!(
                limiter = %self.name,
                error = %why,
                members = members.map_or_else(|| String::from("unknown: the full rate and burst"), |m| m.to_string()),
                per_second = fallback.limiter.per_second(),
                burst = (self.burst / share).max(1),
                "rate.redis_unreachable: the limiter paces this process alone, at its share of the rate and burst, until Redis answers"
            );
        }
    }
}
