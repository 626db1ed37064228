//! [`RedisStore`]: breaker state shared through Redis by every process of a fleet.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ::redis::aio::ConnectionManagerConfig;
use ::redis::{RedisError, Script};

use super::lru::BoundedMap;
use super::memory::DEFAULT_MAX_KEYS;
use super::{BreakerStore, MemoryStore, Reach, Reporter, StoreFuture};
use crate::machine::{Decision, Outcome, Permit, Rules, Snapshot, Transitions};
use crate::{Category, ConfigError, SendError, State};

mod connection;
mod health;
mod quorum;
mod remote;
mod script;
mod tls;

pub(crate) use script::rate_key;
#[cfg(feature = "webhooks")]
pub(crate) use script::reputation_key;

pub(crate) use connection::Connection;
use health::Health;
use remote::RemoteCall;
use script::{BadReply, Call, Reply};

/// The bit that marks a permit the local store gave while Redis was silent. Redis periods
/// count changes of state and never come near it (the script's numbers are below 2^53).
const LOCAL_PERIOD: u64 = 1 << 63;

/// How long a call to Redis may take before the store decides locally (default).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);
/// How often a silent Redis is tried again (default).
pub const DEFAULT_RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// How long `connect` waits for the first connection and answer: it runs once, at startup,
/// not before a send.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The longest time the store hands to Redis: expiries and the breaker's timeouts beyond it
/// (`Duration::MAX` for "for ever") are taken as this, about a hundred years, which keeps
/// every time the script computes exact in Lua's numbers and within Redis's range.
pub const MAX_EXPIRY: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// How long a breaker's keys stay in Redis after their last write (default).
pub const DEFAULT_IDLE_EXPIRY: Duration = Duration::from_secs(3600);

/// Breaker state in Redis, shared by every breaker, in any process, that uses the same
/// Redis and namespace: they count failures together, open together, and let **one** probe
/// through between them in each half-open period.
///
/// # How it decides
/// Each decision before a send, each result after it and each abandoned probe is one call
/// of a Lua script on the server, atomic, and timed by the server's clock (`TIME`), so
/// processes whose clocks disagree still agree on the breaker. The script restates the rules
/// of [`Machine`](crate::machine::Machine): consecutive or error-rate counting, one probe
/// token with a deadline, `half_open_successes`, and periods, so a late result from an
/// earlier period changes nothing in any process. Each change of state is reported by the
/// one process whose call made it.
///
/// # Keys
/// One hash per breaker, `mail-breaker:<namespace>:{<key>}`, with both parts escaped
/// (bytes outside `[A-Za-z0-9._-]` become `%XX`), so untrusted recipient domains cannot
/// collide with each other or break the `{...}` hash tag that keeps a breaker on one Redis
/// Cluster node. A closed breaker that has counted nothing writes nothing; every write
/// renews the key's expiry ([`with_idle_expiry`](Self::with_idle_expiry), default 1 hour),
/// so the number of keys stays bounded by the traffic of the last hour.
///
/// # When Redis fails
/// A call that fails or takes longer than the [timeout](Self::with_timeout) (default
/// 100 ms) is decided from a [`MemoryStore`] inside this store, and a warning
/// (`store.redis_unreachable`) is logged once. Until Redis answers again the breakers of
/// this process decide on their own, each starting from the state this process last saw in
/// Redis (a breaker last seen open or half-open starts open for a new reset timeout, one
/// never seen starts closed), and Redis is tried again at
/// most once per [retry interval](Self::with_retry_interval) (default 1 s); the other
/// sends in between do not wait for it at all. Results of sends that Redis allowed are
/// dropped while it is silent. A send never waits on a dead store beyond the timeout.
///
/// # A fleet
/// [`connect_cluster`](Self::connect_cluster) puts the breakers on a Redis Cluster, each on
/// the master that owns its slot. [`with_quorum`](Self::with_quorum) keeps one sick member
/// from opening everyone's breaker: a member whose own failures meet the rule opens for
/// itself only, and the fleet's breaker opens once failures from that many distinct members
/// ([`with_member`](Self::with_member)) meet it.
///
/// # Example
/// ```no_run
/// use std::sync::Arc;
/// use std::time::Duration;
/// use mail_breaker::{CircuitBreakerTransport, LettreTransport, RedisStore};
/// # use lettre::transport::stub::AsyncStubTransport;
/// # async fn run() -> Result<(), mail_breaker::ConfigError> {
/// # let transport = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
///
/// let store = RedisStore::connect("redis://127.0.0.1:6379/")
///     .await?
///     .with_namespace("myapp")
///     .with_timeout(Duration::from_millis(50));
/// let breaker = CircuitBreakerTransport::builder(transport)
///     .store(Arc::new(store))
///     .build()?;
/// # Ok(()) }
/// ```
pub struct RedisStore {
    connection: Connection,
    script: Arc<Script>,
    namespace: String,
    /// This process's name in the fleet.
    member: Arc<str>,
    /// How many distinct members' failures open the fleet's breaker.
    quorum: u32,
    /// With a quorum above 1, this member's own breakers, fed with its own results.
    own: MemoryStore,
    timeout: Duration,
    idle_expiry: Duration,
    health: Health,
    /// The state of each key as this process last saw it in Redis.
    seen: Mutex<BoundedMap<Seen>>,
    /// Decides while Redis is silent.
    local: MemoryStore,
    /// How many sends were decided here rather than in Redis.
    local_decisions: AtomicU64,
    /// Tests only: the time the script reads instead of the server's clock.
    test_clock: Option<Arc<AtomicU64>>,
}

/// A key's state as this process last saw it in Redis.
#[derive(Debug, Clone, Copy)]
struct Seen {
    state: State,
    /// The outage in which the local fallback last started again from `state`.
    mirrored_in: u64,
}

/// No outage: [`Health`] numbers them from 1.
const NOT_MIRRORED: u64 = 0;

/// Why a call to Redis was decided locally.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Redis(#[from] RedisError),
    #[error(transparent)]
    BadReply(#[from] BadReply),
    #[error("the call's task ended without an answer: {0}")]
    Task(String),
}

impl RedisStore {
    /// A store on the Redis at `url`, in the namespace `default`:
    /// - `redis://[user:password@]host:port/db`: an ACL user and its password (or the
    ///   password alone, for `requirepass`);
    /// - `rediss://…`, the same over TLS, the server's certificate checked against the
    ///   system's trusted authorities (for a private authority, see
    ///   [`connect_with_ca`](Self::connect_with_ca));
    /// - `unix:///path`.
    ///
    /// The connection is made at once (waiting up to 1 s for it) and kept, reconnecting by
    /// itself. A server that cannot be reached is not an error: the store starts deciding
    /// locally, logs one warning, and uses Redis as soon as it answers.
    ///
    /// # Errors
    /// A [`ConfigError`] for the setting `url` when `url` is not a Redis URL, when the server
    /// refuses its user or password, when the user lacks a permission the store needs, or
    /// when its TLS certificate is not trusted: settings that waiting would not mend.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), mail_breaker::ConfigError> {
    /// let store = mail_breaker::RedisStore::connect("redis://127.0.0.1:6379/").await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<RedisStore, ConfigError> {
        let not_a_url = || {
            ConfigError::new(
                "url",
                "not a Redis URL: expected redis://host:port/db, rediss://host:port/db or unix:///path",
            )
        };
        let client = ::redis::Client::open(url).map_err(|_| not_a_url())?;
        RedisStore::with_client(client).await
    }

    /// A store on the Redis at `url` (`rediss://[user:password@]host:port/db`) over TLS,
    /// trusting the certificate authority in `ca_pem` (PEM), and only it: for a server
    /// whose certificate a private authority signed. Otherwise as [`connect`](Self::connect).
    ///
    /// # Errors
    /// A [`ConfigError`] for `url` as for [`connect`](Self::connect), and when it is not a
    /// `rediss://` URL; for `ca_pem` when it holds no certificate.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), mail_breaker::ConfigError> {
    /// let ca = std::fs::read("/etc/redis/ca.pem").expect("the CA's certificate");
    /// let store = mail_breaker::RedisStore::connect_with_ca(
    ///     "rediss://mailer:secret@redis.internal:6380/",
    ///     &ca,
    /// )
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_with_ca(url: &str, ca_pem: &[u8]) -> Result<RedisStore, ConfigError> {
        tls::require_tls_url("url", url)?;
        let client = ::redis::Client::build_with_tls(url, tls::certificates(ca_pem)?)
            .map_err(|error| ConfigError::new("url", format!("not a Redis URL: {error}")))?;
        RedisStore::with_client(client).await
    }

    async fn with_client(client: ::redis::Client) -> Result<RedisStore, ConfigError> {
        tls::install_provider();
        let not_a_url = || ConfigError::new("url", "not a Redis URL");
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let connection = client
            .get_connection_manager_lazy(config)
            .map_err(|_| not_a_url())?;
        RedisStore::on(Connection::Single(connection), "url").await
    }

    /// A store on the Redis Cluster that `urls` lead to (one or more of its nodes, each
    /// `redis://[user:password@]host:port/`), in the namespace `default`, with every setting
    /// of [`connect`](Self::connect).
    ///
    /// Each breaker's keys share one hash tag, so each decision is one script call on the
    /// master that owns the slot; the script is loaded on each node, and a node that lost it
    /// (a replica promoted, a restart) is given it again (EVALSHA, falling back to EVAL).
    /// [`snapshots`](BreakerStore::snapshots) scans every master. While a master fails and
    /// until its replica takes over, the breakers whose keys it held decide locally, as for
    /// a silent Redis (see [`RedisStore`]), and share again once the cluster answers.
    ///
    /// As for one server, a cluster that cannot be reached yet is not an error: the store
    /// decides locally and uses the cluster as soon as it answers.
    ///
    /// # Errors
    /// A [`ConfigError`] for the setting `urls` when it is empty or holds something other
    /// than a Redis URL.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), mail_breaker::ConfigError> {
    /// let store = mail_breaker::RedisStore::connect_cluster(&[
    ///     "redis://10.0.0.1:6379/",
    ///     "redis://10.0.0.2:6379/",
    /// ])
    /// .await?
    /// .with_namespace("myapp");
    /// # Ok(()) }
    /// ```
    pub async fn connect_cluster<S: AsRef<str>>(urls: &[S]) -> Result<RedisStore, ConfigError> {
        RedisStore::cluster(urls, None).await
    }

    /// A store on the Redis Cluster that `urls` lead to (each
    /// `rediss://[user:password@]host:port/`) over TLS, trusting the certificate authority
    /// in `ca_pem` (PEM), and only it. Otherwise as
    /// [`connect_cluster`](Self::connect_cluster).
    ///
    /// # Errors
    /// As for [`connect_cluster`](Self::connect_cluster), and a [`ConfigError`] for `urls`
    /// when one is not a `rediss://` URL, for `ca_pem` when it holds no certificate.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), mail_breaker::ConfigError> {
    /// let ca = std::fs::read("/etc/redis/ca.pem").expect("the CA's certificate");
    /// let store = mail_breaker::RedisStore::connect_cluster_with_ca(
    ///     &["rediss://mailer:secret@10.0.0.1:6380/"],
    ///     &ca,
    /// )
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_cluster_with_ca<S: AsRef<str>>(
        urls: &[S],
        ca_pem: &[u8],
    ) -> Result<RedisStore, ConfigError> {
        for url in urls {
            tls::require_tls_url("urls", url.as_ref())?;
        }
        RedisStore::cluster(urls, Some(tls::certificates(ca_pem)?)).await
    }

    async fn cluster<S: AsRef<str>>(
        urls: &[S],
        certificates: Option<::redis::TlsCertificates>,
    ) -> Result<RedisStore, ConfigError> {
        if urls.is_empty() {
            return Err(ConfigError::new(
                "urls",
                "no node given: name at least one node of the cluster",
            ));
        }
        tls::install_provider();
        let urls: Vec<&str> = urls.iter().map(AsRef::as_ref).collect();
        let connection =
            Connection::cluster(&urls, CONNECT_TIMEOUT, certificates).map_err(|_| {
                ConfigError::new(
                    "urls",
                    "not Redis URLs of one cluster: expected redis://host:port/ for each node",
                )
            })?;
        RedisStore::on(connection, "urls").await
    }

    /// A store on `connection` with the default settings, its script loaded; a
    /// [`ConfigError`] for `setting` when the server refused the credentials or the
    /// certificate.
    async fn on(connection: Connection, setting: &'static str) -> Result<RedisStore, ConfigError> {
        let store = RedisStore {
            connection,
            script: Arc::new(Script::new(script::SOURCE)),
            namespace: String::from("default"),
            member: Arc::from(quorum::default_member()),
            quorum: 1,
            own: MemoryStore::with_max_keys(DEFAULT_MAX_KEYS),
            timeout: DEFAULT_TIMEOUT,
            idle_expiry: DEFAULT_IDLE_EXPIRY,
            health: Health::new(DEFAULT_RETRY_INTERVAL),
            seen: Mutex::new(BoundedMap::new(DEFAULT_MAX_KEYS)),
            local: MemoryStore::with_max_keys(DEFAULT_MAX_KEYS),
            local_decisions: AtomicU64::new(0),
            test_clock: None,
        };
        store.load_script(setting).await?;
        Ok(store)
    }

    /// How many members of the fleet must see failures before the fleet's breaker opens
    /// (default 1: any member's failures open it for everyone). A quorum of 0 is taken as 1.
    ///
    /// With a quorum above 1, each member also keeps a breaker of its own, fed with its own
    /// results by the same rules:
    /// - a member whose own failures meet the rule opens **for itself only**: its
    ///   [`state`](crate::CircuitBreakerTransport::state) is `Open`, its sends are refused
    ///   with `breaker.open`, and it lets its own probe through once its reset timeout has
    ///   passed, while the other members go on sending;
    /// - the fleet's breaker counts every member's results, as with a quorum of 1, and
    ///   keeps the set of members whose failures are in its count (a success clears both);
    ///   it opens, for every member, once the rule is met and `quorum` distinct members
    ///   are in that set. Its probe, reopening and closing work as with a quorum of 1.
    ///
    /// A send goes when both breakers let it. The listener hears the changes of both: the
    /// member's own, and the fleet's that this member's calls made. Every member of a fleet
    /// should use the same quorum and a [name](Self::with_member) of its own.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), mail_breaker::ConfigError> {
    /// let store = mail_breaker::RedisStore::connect("redis://127.0.0.1:6379/")
    ///     .await?
    ///     .with_quorum(2)
    ///     .with_member("web-7");
    /// assert_eq!(store.quorum(), 2);
    /// # Ok(()) }
    /// ```
    pub fn with_quorum(mut self, quorum: u32) -> Self {
        self.quorum = quorum.max(1);
        self
    }

    /// This process's name in the fleet, which the [quorum](Self::with_quorum) counts
    /// (default: the host name and the process id, `web-7:4242`). Two processes with one name
    /// count as one member.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), mail_breaker::ConfigError> {
    /// let store = mail_breaker::RedisStore::connect("redis://127.0.0.1:6379/")
    ///     .await?
    ///     .with_member("web-7");
    /// assert_eq!(store.member(), "web-7");
    /// # Ok(()) }
    /// ```
    pub fn with_member(mut self, member: impl Into<String>) -> Self {
        self.member = Arc::from(member.into());
        self
    }

    /// How many distinct members' failures open the fleet's breaker.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), mail_breaker::ConfigError> {
    /// let store = mail_breaker::RedisStore::connect("redis://127.0.0.1:6379/").await?;
    /// assert_eq!(store.quorum(), 1);
    /// # Ok(()) }
    /// ```
    pub fn quorum(&self) -> u32 {
        self.quorum
    }

    /// This process's name in the fleet.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), mail_breaker::ConfigError> {
    /// let store = mail_breaker::RedisStore::connect("redis://127.0.0.1:6379/").await?;
    /// println!("this process counts in the quorum as {}", store.member());
    /// # Ok(()) }
    /// ```
    pub fn member(&self) -> &str {
        &self.member
    }

    /// Keeps this store's breakers apart from those of other applications on the same Redis
    /// (default `default`). Breakers in several processes share state when they use the same
    /// namespace and the same key.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), mail_breaker::ConfigError> {
    /// let store = mail_breaker::RedisStore::connect("redis://127.0.0.1:6379/")
    ///     .await?
    ///     .with_namespace("billing-mailer");
    /// # Ok(()) }
    /// ```
    pub fn with_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// How long one call to Redis may take before the store decides locally (default 100 ms).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn run() -> Result<(), mail_breaker::ConfigError> {
    /// let store = mail_breaker::RedisStore::connect("redis://127.0.0.1:6379/")
    ///     .await?
    ///     .with_timeout(Duration::from_millis(20));
    /// # Ok(()) }
    /// ```
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How often a Redis that failed is tried again (default 1 s); in between, decisions are
    /// local and wait for nothing.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn run() -> Result<(), mail_breaker::ConfigError> {
    /// let store = mail_breaker::RedisStore::connect("redis://127.0.0.1:6379/")
    ///     .await?
    ///     .with_retry_interval(Duration::from_secs(5));
    /// # Ok(()) }
    /// ```
    pub fn with_retry_interval(mut self, interval: Duration) -> Self {
        self.health = self.health.with_retry_interval(interval);
        self
    }

    /// How long a breaker's keys stay in Redis after their last write (default 1 hour). The
    /// store keeps them longer where the breaker's own timeouts need it.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn run() -> Result<(), mail_breaker::ConfigError> {
    /// let store = mail_breaker::RedisStore::connect("redis://127.0.0.1:6379/")
    ///     .await?
    ///     .with_idle_expiry(Duration::from_secs(600));
    /// # Ok(()) }
    /// ```
    ///
    /// Redis keeps a key at most [`MAX_EXPIRY`] (about a hundred years): a longer expiry,
    /// such as `Duration::MAX` for "never", is taken as that, since Redis refuses an
    /// expiry past its clock's range and would then refuse every write.
    pub fn with_idle_expiry(mut self, expiry: Duration) -> Self {
        self.idle_expiry = expiry.min(MAX_EXPIRY);
        self
    }

    /// How many keys this process keeps in memory (default 10,000): its cache of the states
    /// it last saw, and the breakers it decides by while Redis is silent. Past that the least
    /// recently used closed ones are forgotten first.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), mail_breaker::ConfigError> {
    /// let store = mail_breaker::RedisStore::connect("redis://127.0.0.1:6379/")
    ///     .await?
    ///     .with_max_keys(50_000);
    /// # Ok(()) }
    /// ```
    pub fn with_max_keys(mut self, max_keys: usize) -> Self {
        self.seen = Mutex::new(BoundedMap::new(max_keys));
        self.local = MemoryStore::with_max_keys(max_keys);
        self.own = MemoryStore::with_max_keys(max_keys);
        self
    }

    /// For tests only, and not part of the API: the script reads the time, in microseconds,
    /// from `micros` at each call instead of from the Redis server's clock, so that a test
    /// can step the shared breaker through time in lockstep with a
    /// [`Machine`](crate::machine::Machine). A fleet must decide by the one clock of its Redis.
    #[doc(hidden)]
    pub fn with_clock_for_tests(mut self, micros: Arc<AtomicU64>) -> Self {
        self.test_clock = Some(micros);
        self
    }

    /// The namespace the store's keys are in.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), mail_breaker::ConfigError> {
    /// let store = mail_breaker::RedisStore::connect("redis://127.0.0.1:6379/").await?;
    /// assert_eq!(store.namespace(), "default");
    /// # Ok(()) }
    /// ```
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Whether Redis answered the last call made to it; `false` while the store decides locally.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), mail_breaker::ConfigError> {
    /// let store = mail_breaker::RedisStore::connect("redis://127.0.0.1:6379/").await?;
    /// if !store.is_shared() {
    ///     eprintln!("Redis is down: this process's breakers decide on their own");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn is_shared(&self) -> bool {
        self.health.is_answering()
    }

    /// How many sends this store decided from local state rather than in Redis, since it
    /// was made: 0 means every decision was shared with the fleet.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), mail_breaker::ConfigError> {
    /// let store = mail_breaker::RedisStore::connect("redis://127.0.0.1:6379/").await?;
    /// assert_eq!(store.local_decisions(), 0);
    /// # Ok(()) }
    /// ```
    pub fn local_decisions(&self) -> u64 {
        self.local_decisions.load(Ordering::Relaxed)
    }

    /// Loads the script into Redis's cache, which also tells whether Redis answers.
    /// The connection, for a rate limiter shared through this store (`RateLimitTransport::shared`).
    pub(crate) fn connection(&self) -> Connection {
        self.connection.clone()
    }

    /// How long a call may take before the caller decides locally.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How often a silent Redis is tried again.
    pub(crate) fn retry_interval(&self) -> Duration {
        self.health.retry_interval()
    }

    /// Loads the script, the store's first call: a server that does not answer is waited
    /// out, one that refuses the credentials or the certificate is an error for `setting`.
    async fn load_script(&self, setting: &'static str) -> Result<(), ConfigError> {
        let mut connection = self.connection.clone();
        let load = self.script.load_async(&mut connection);
        match tokio::time::timeout(CONNECT_TIMEOUT, load).await {
            Ok(Ok(_)) => self.health.answered(&self.namespace),
            Ok(Err(error)) => {
                if let Some(refused) = tls::refusal(&error) {
                    return Err(ConfigError::new(setting, refused));
                }
                self.health.failed(&self.namespace, &error);
            }
            Err(_) => self
                .health
                .failed(&self.namespace, &Failure::Timeout(CONNECT_TIMEOUT)),
        }
        Ok(())
    }

    /// One call of the script, within the timeout; notes whether Redis answered. An answer
    /// that comes after this call stopped waiting is settled through `late`.
    async fn ask(&self, key: &str, rules: &Rules, call: Call, late: &Reporter) -> Option<Reply> {
        self.ask_in(None, key, rules, call, late).await
    }

    /// [`ask`](Self::ask) for a key of the breaker named `breaker`, whose isolation as a
    /// whole the script reads in the same call.
    async fn ask_in(
        &self,
        breaker: Option<&str>,
        key: &str,
        rules: &Rules,
        call: Call,
        late: &Reporter,
    ) -> Option<Reply> {
        let mut remote = self.remote(key, call, rules);
        remote.isolation = breaker.map(|breaker| script::isolation_name(&self.namespace, breaker));
        let result = match tokio::runtime::Handle::try_current() {
            Ok(runtime) => remote.start(&runtime, late.clone()).answer().await,
            Err(_) => remote.run_within_timeout().await,
        };
        match result {
            Ok(reply) => {
                self.health.answered(&self.namespace);
                self.remember(key, reply.state);
                Some(reply)
            }
            Err(failure) => {
                self.health.failed(&self.namespace, &failure);
                None
            }
        }
    }

    /// One call of the script on `key`, owned so that it can run in a task of its own.
    fn remote(&self, key: &str, call: Call, rules: &Rules) -> RemoteCall {
        RemoteCall {
            connection: self.connection.clone(),
            script: Arc::clone(&self.script),
            key: key.to_owned(),
            name: script::key_name(&self.namespace, key),
            members: script::members_name(&self.namespace, key),
            isolation: None,
            member: Arc::clone(&self.member),
            quorum: self.quorum,
            call,
            rules: *rules,
            timeout: self.timeout,
            idle_expiry: self.idle_expiry,
            told_now: self
                .test_clock
                .as_ref()
                .map(|micros| micros.load(Ordering::Relaxed)),
        }
    }

    fn remember(&self, key: &str, state: State) {
        self.seen().with(
            key,
            || Seen {
                state,
                mirrored_in: NOT_MIRRORED,
            },
            |seen| seen.state == State::Closed,
            |entry| entry.state = state,
        );
    }

    fn seen(&self) -> MutexGuard<'_, BoundedMap<Seen>> {
        // Each change under this lock is one assignment: a panic cannot leave it torn.
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn acquire_locally(
        &self,
        breaker: Option<&str>,
        key: &str,
        rules: &Rules,
    ) -> (Decision, Transitions) {
        self.local_decisions.fetch_add(1, Ordering::Relaxed);
        // An isolation of the whole breaker this process made or saw holds here too.
        if breaker.is_some_and(|breaker| self.local.isolates_whole(breaker)) {
            return (Decision::Isolated, Transitions::NONE);
        }
        self.start_locally(key, rules);
        let (decision, transitions) = self.local.acquire_now(key, rules);
        let decision = match decision {
            Decision::Send(permit) => {
                Decision::Send(Permit::new(permit.period() | LOCAL_PERIOD, permit.probe()))
            }
            refuse => refuse,
        };
        (decision, transitions)
    }

    /// Readies the local breaker of `key` for a decision while Redis is silent.
    fn start_locally(&self, key: &str, rules: &Rules) {
        // At the start of each outage, a key's local breaker starts again from the state this
        // process last saw in Redis: one last seen open or half-open starts open, rather than
        // letting sends through to a provider the fleet saw failing; one last seen closed, or
        // never seen, starts closed, whatever it did in an earlier outage.
        let outage = self.health.outage();
        let restart = self.seen().with(
            key,
            || Seen {
                state: State::Closed,
                mirrored_in: NOT_MIRRORED,
            },
            |seen| seen.state == State::Closed,
            |seen| {
                let restart = seen.mirrored_in != outage;
                seen.mirrored_in = outage;
                restart.then_some(seen.state)
            },
        );
        if let Some(state) = restart {
            // Not announced: the change was reported by the process whose call made it.
            let _ = self.local.restart_from(key, rules, state);
        }
    }
}

/// A permit of the local store, as that store gave it, if `permit` is one.
fn local_permit(permit: Permit) -> Option<Permit> {
    (permit.period() & LOCAL_PERIOD != 0)
        .then(|| Permit::new(permit.period() & !LOCAL_PERIOD, permit.probe()))
}

/// The shared breaker alone: Redis's, or the local fallback's while Redis is silent.
impl RedisStore {
    async fn acquire_shared(
        &self,
        breaker: Option<&str>,
        key: &str,
        rules: &Rules,
        late: &Reporter,
    ) -> (Decision, Transitions) {
        if self.health.should_ask()
            && let Some(reply) = self.ask_in(breaker, key, rules, Call::Acquire, late).await
        {
            return (reply.decision, reply.transitions);
        }
        self.acquire_locally(breaker, key, rules).await
    }

    fn record_shared<'a>(
        &'a self,
        key: &'a str,
        rules: &'a Rules,
        permit: Permit,
        outcome: Outcome,
        late: &'a Reporter,
    ) -> StoreFuture<'a, Transitions> {
        if let Some(permit) = local_permit(permit) {
            return StoreFuture::ready(self.local.record_now(key, rules, permit, outcome));
        }
        StoreFuture::pending(async move {
            if !self.health.should_ask() {
                // Given by Redis, which is silent now: the result is lost, not miscounted.
                return Transitions::NONE;
            }
            self.ask(key, rules, Call::Record(permit, outcome), late)
                .await
                .map_or(Transitions::NONE, |reply| reply.transitions)
        })
    }

    fn release_shared(&self, key: &str, rules: &Rules, permit: Permit, late: &Reporter) {
        if let Some(permit) = local_permit(permit) {
            return late.report(key, self.local.release_now(key, rules, permit));
        }
        if permit.probe().is_none() || !self.health.is_answering() {
            return; // only a probe holds anything; a silent Redis frees it at its deadline
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // no runtime to send it on: the probe's deadline frees the slot
        };
        // Called from Drop: the call goes on in the background and nothing waits for it.
        // It carries the breaker's own rules, so the expiry it sets is the one every call sets.
        let release = self.remote(key, Call::Release(permit), rules);
        runtime.spawn(remote::release_in_background(release, late.clone()));
    }

    fn state_shared(&self, key: &str, rules: &Rules) -> (State, Transitions) {
        if !self.health.is_answering() {
            return self.local.state(key, rules);
        }
        let state = self.seen().peek_mut(key, |seen| seen.state);
        (state.unwrap_or(State::Closed), Transitions::NONE)
    }

    /// Whether this member keeps a breaker of its own beside the fleet's.
    fn has_own_breaker(&self) -> bool {
        self.quorum > 1
    }
}

impl BreakerStore for RedisStore {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        rules: &'a Rules,
        late: &'a Reporter,
    ) -> StoreFuture<'a, (Decision, Transitions)> {
        StoreFuture::pending(self.acquire_for(None, key, rules, late))
    }

    fn acquire_in<'a>(
        &'a self,
        breaker: &'a str,
        key: &'a str,
        rules: &'a Rules,
        late: &'a Reporter,
    ) -> StoreFuture<'a, (Decision, Transitions)> {
        StoreFuture::pending(self.acquire_for(Some(breaker), key, rules, late))
    }

    fn isolate_breaker<'a>(
        &'a self,
        breaker: &'a str,
    ) -> StoreFuture<'a, Result<Reach, SendError>> {
        StoreFuture::pending(self.whole_by_hand(breaker, true))
    }

    fn lift_isolation<'a>(&'a self, breaker: &'a str) -> StoreFuture<'a, Result<Reach, SendError>> {
        StoreFuture::pending(self.whole_by_hand(breaker, false))
    }

    fn record<'a>(
        &'a self,
        key: &'a str,
        rules: &'a Rules,
        permit: Permit,
        outcome: Outcome,
        late: &'a Reporter,
    ) -> StoreFuture<'a, Transitions> {
        match quorum::split(permit) {
            Some((shared, own)) => {
                late.report(key, self.own.record_now(key, rules, own, outcome));
                self.record_shared(key, rules, shared, outcome, late)
            }
            None => self.record_shared(key, rules, permit, outcome, late),
        }
    }

    fn release(&self, key: &str, rules: &Rules, permit: Permit, late: &Reporter) {
        match quorum::split(permit) {
            Some((shared, own)) => {
                late.report(key, self.own.release_now(key, rules, own));
                self.release_shared(key, rules, shared, late);
            }
            None => self.release_shared(key, rules, permit, late),
        }
    }

    fn state(&self, key: &str, rules: &Rules) -> (State, Transitions) {
        let (shared, mut transitions) = self.state_shared(key, rules);
        if !self.has_own_breaker() {
            return (shared, transitions);
        }
        let (own, changes) = self.own.state(key, rules);
        // Each is at most the one change time makes: a probe past its deadline.
        for change in changes.iter() {
            transitions.push(change);
        }
        (quorum::stricter(shared, own), transitions)
    }

    fn tracked_keys(&self) -> usize {
        self.seen()
            .len()
            .max(self.local.tracked_keys())
            .max(self.own.tracked_keys())
    }

    fn snapshot<'a>(
        &'a self,
        key: &'a str,
        rules: &'a Rules,
        late: &'a Reporter,
    ) -> StoreFuture<'a, Snapshot> {
        StoreFuture::pending(async move {
            let shared = self.snapshot_shared(key, rules, late).await;
            if !self.has_own_breaker() {
                return shared;
            }
            // A member held open by its own breaker shows that one, as its state does.
            let own = self.own.snapshot(key, rules, late).await;
            if quorum::stricter(shared.state(), own.state()) != shared.state() {
                own
            } else {
                shared
            }
        })
    }

    fn snapshots<'a>(
        &'a self,
        rules: &'a Rules,
        late: &'a Reporter,
    ) -> StoreFuture<'a, Vec<Snapshot>> {
        StoreFuture::pending(async move {
            if self.health.should_ask() {
                match self.keys_in_namespace().await {
                    Ok(keys) => {
                        let mut snapshots = Vec::with_capacity(keys.len());
                        for key in keys {
                            snapshots.push(self.snapshot(&key, rules, late).await);
                        }
                        return snapshots;
                    }
                    Err(failure) => self.health.failed(&self.namespace, &failure),
                }
            }
            self.local.snapshots(rules, late).await
        })
    }

    fn isolate<'a>(
        &'a self,
        key: &'a str,
        rules: &'a Rules,
        late: &'a Reporter,
    ) -> StoreFuture<'a, Transitions> {
        StoreFuture::pending(self.by_hand(key, rules, Call::Isolate, late))
    }

    fn reset<'a>(
        &'a self,
        key: &'a str,
        rules: &'a Rules,
        late: &'a Reporter,
    ) -> StoreFuture<'a, Transitions> {
        if self.has_own_breaker() {
            late.report(key, self.own.change(key, rules, |machine| machine.reset()));
        }
        StoreFuture::pending(self.by_hand(key, rules, Call::Reset, late))
    }
}

impl RedisStore {
    /// A decision for `key`, of the breaker named `breaker` when the caller says which.
    async fn acquire_for(
        &self,
        breaker: Option<&str>,
        key: &str,
        rules: &Rules,
        late: &Reporter,
    ) -> (Decision, Transitions) {
        if !self.has_own_breaker() {
            return self.acquire_shared(breaker, key, rules, late).await;
        }
        // The member's own breaker first: one it holds open costs no call to Redis.
        let (own, changes) = self.own.acquire_now(key, rules);
        late.report(key, changes);
        let Decision::Send(own) = own else {
            return (own, Transitions::NONE);
        };
        let mut own = OwnPermit {
            store: self,
            key,
            rules,
            late,
            permit: Some(own),
        };
        let (shared, transitions) = self.acquire_shared(breaker, key, rules, late).await;
        match (shared, own.permit.take()) {
            (Decision::Send(shared), Some(own)) => {
                (Decision::Send(quorum::join(shared, own)), transitions)
            }
            (shared, own_permit) => {
                own.permit = own_permit; // refused by the fleet: dropping `own` frees it
                (shared, transitions)
            }
        }
    }

    /// Sets (`isolate`) or deletes the flag that isolates the breaker named `breaker` as a
    /// whole, in Redis for every process, and in this process's fallback. With Redis silent
    /// the change holds here alone, which the error says.
    async fn whole_by_hand(&self, breaker: &str, isolate: bool) -> Result<Reach, SendError> {
        self.local.isolate_whole(breaker, isolate);
        let flag = script::isolation_name(&self.namespace, breaker);
        let mut connection = self.connection.clone();
        // No expiry: an isolation holds until it is lifted, however long that takes.
        let command = if isolate {
            ::redis::cmd("SET").arg(&flag).arg(1).to_owned()
        } else {
            ::redis::cmd("DEL").arg(&flag).to_owned()
        };
        // Asked even while Redis is thought silent: an operator's change is rare, and
        // whether it reached the fleet is what the operator asks.
        let answer = tokio::time::timeout(
            self.timeout,
            command.query_async::<::redis::Value>(&mut connection),
        )
        .await;
        let failure = match answer {
            Ok(Ok(_)) => {
                self.health.answered(&self.namespace);
                return Ok(Reach::Fleet);
            }
            Ok(Err(error)) => Failure::Redis(error),
            Err(_) => Failure::Timeout(self.timeout),
        };
        self.health.failed(&self.namespace, &failure);
        let done = if isolate { "isolated" } else { "reset" };
        tracing::warn!(
            namespace = %self.namespace,
            breaker,
            error = %failure,
            "store.redis_unreachable: the breaker was {done} in this process only; other processes sharing it do not know"
        );
        Err(SendError::new(
            Category::ServiceUnavailable,
            "store.unreachable",
            format!(
                "Redis did not answer ({failure}): the breaker was {done} in this process only; \
                 other processes sharing it do not know"
            ),
        ))
    }
}

/// The member's own permit while the fleet's breaker is asked: given back if the fleet
/// refuses, or if the caller stops waiting before it answers.
struct OwnPermit<'a> {
    store: &'a RedisStore,
    key: &'a str,
    rules: &'a Rules,
    late: &'a Reporter,
    permit: Option<Permit>,
}

impl Drop for OwnPermit<'_> {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            let changes = self.store.own.release_now(self.key, self.rules, permit);
            self.late.report(self.key, changes);
        }
    }
}

impl RedisStore {
    /// The fleet's snapshot of `key`: from Redis, or from local state while it is silent.
    async fn snapshot_shared(&self, key: &str, rules: &Rules, late: &Reporter) -> Snapshot {
        if self.health.should_ask() {
            match self.read_snapshot(key, rules).await {
                Ok((snapshot, transitions)) => {
                    late.report(key, transitions);
                    return snapshot;
                }
                Err(failure) => self.health.failed(&self.namespace, &failure),
            }
        }
        self.start_locally(key, rules);
        self.local.snapshot(key, rules, late).await
    }

    /// An isolate or reset: in Redis for every process, or, with Redis silent, here alone
    /// (said in a warning, since the fleet does not hear of it).
    async fn by_hand(&self, key: &str, rules: &Rules, call: Call, late: &Reporter) -> Transitions {
        if self.health.should_ask()
            && let Some(reply) = self.ask(key, rules, call, late).await
        {
            return reply.transitions;
        }
        self.start_locally(key, rules);
        let local = self.local.change(key, rules, |machine| match call {
            Call::Isolate => machine.isolate(),
            _ => machine.reset(),
        });
        tracing::warn!(
            namespace = %self.namespace,
            key,
            call = script::call_name(call),
            "store.redis_unreachable: the breaker was changed in this process only; other processes sharing it do not know"
        );
        local
    }

    async fn read_snapshot(
        &self,
        key: &str,
        rules: &Rules,
    ) -> Result<(Snapshot, Transitions), Failure> {
        // Not settled in the background if it times out: a snapshot's only change is a
        // probe's expiry, which Redis then applies with no listener told.
        let values = self
            .remote(key, Call::Snapshot, rules)
            .values(self.timeout)
            .await?;
        let read = script::parse_snapshot(key, rules, values)?;
        self.health.answered(&self.namespace);
        self.remember(key, read.0.state());
        Ok(read)
    }

    /// Every breaker key of the namespace in Redis, found with SCAN (never KEYS, which would
    /// block the server), each step within the timeout.
    /// On a cluster, each master is scanned in turn.
    async fn keys_in_namespace(&self) -> Result<Vec<String>, Failure> {
        let mut connection = self.connection.clone();
        let pattern = script::namespace_pattern(&self.namespace);
        let targets = tokio::time::timeout(self.timeout, connection.scan_targets())
            .await
            .map_err(|_| Failure::Timeout(self.timeout))??;
        let mut keys = Vec::new();
        for target in &targets {
            let mut cursor: u64 = 0;
            loop {
                let step = connection.scan(target, cursor, &pattern);
                let (next, names) = tokio::time::timeout(self.timeout, step)
                    .await
                    .map_err(|_| Failure::Timeout(self.timeout))??;
                keys.extend(
                    names
                        .iter()
                        .filter_map(|name| script::key_of_name(&self.namespace, name)),
                );
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        keys.sort_unstable();
        keys.dedup(); // SCAN may return a key twice
        Ok(keys)
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("namespace", &self.namespace)
            .field("member", &self.member)
            .field("quorum", &self.quorum)
            .field("timeout", &self.timeout)
            .field("retry_interval", &self.health.retry_interval())
            .field("idle_expiry", &self.idle_expiry)
            .field("shared", &self.is_shared())
            .finish_non_exhaustive()
    }
}
