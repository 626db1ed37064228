//! The configuration of a whole stack as it is read: [`MailerConfig`] and the settings of
//! its members, retry, outbox and Redis, each checked where it is read.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use toml::Value;

use super::ConfigError;
use super::provider::{self, Provider, Secret};
use super::read::Node;

/// The configuration of a whole stack: a pool of members (each a provider with its breaker
/// and rate limit), a retry around them, an outbox and the Redis they share; read from a
/// DSN ([`from_dsn`](Self::from_dsn)), a TOML document ([`from_toml`](Self::from_toml)) or
/// any serde format (`Deserialize`), and checked as it is read: every error names the
/// setting's path, and a setting the crate does not know is an error, never ignored.
///
/// `${NAME}` anywhere in a value is read from the environment, so that a DSN can be written
/// down without its keys. `Debug` shows every key and password as `***`.
///
/// ```
/// use mail_breaker::config::MailerConfig;
///
/// let config = MailerConfig::from_dsn(
///     "failover(smtp://relay.example.com?tls=required&breaker.threshold=5 \
///               smtp://backup.example.com)?retry.attempts=4",
/// )?;
/// assert_eq!(config.members(), 2);
///
/// let error = MailerConfig::from_toml(
///     r#"
///     [[member]]
///     url = "smtp://relay.example.com"
///     breaker = { threshold = "five" }
///     "#,
/// )
/// .unwrap_err();
/// assert_eq!(error.setting(), "member[0].breaker.threshold");
/// assert_eq!(error.reason(), r#"expected a whole number of at least 1, got "five""#);
/// # Ok::<(), mail_breaker::ConfigError>(())
/// ```
#[derive(Clone, PartialEq)]
pub struct MailerConfig {
    pub(crate) strategy: Strategy,
    /// A message that may have reached a provider is never sent again: by the pool, the
    /// retry or the outbox.
    pub(crate) at_most_once: bool,
    pub(crate) members: Vec<MemberConfig>,
    pub(crate) retry: Option<RetryConfig>,
    pub(crate) outbox: Option<OutboxConfig>,
    pub(crate) redis: Option<RedisConfig>,
    /// The suppression list, asked before every send (`suppression=true`).
    pub(crate) suppression: Option<SuppressionConfig>,
    /// The webhook receivers (`webhooks.*`).
    pub(crate) webhooks: Option<super::webhooks::WebhooksConfig>,
}

/// Where the suppression list is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SuppressionConfig {
    /// In the outbox's database (the default).
    Outbox,
    /// In the stack's Redis.
    Redis,
}

/// How the pool picks among its members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strategy {
    /// The first member that is not open, in order (`failover(...)`).
    Failover,
    /// Each member in turn (`roundrobin(...)`).
    RoundRobin,
}

/// One provider with its breaker and rate limit.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MemberConfig {
    pub name: Option<String>,
    pub provider: Provider,
    pub priority: Option<u32>,
    pub breaker: BreakerConfig,
    pub rate: Option<RateConfig>,
    pub connection: ConnectionConfig,
    /// The member's reputation breaker (`reputation.*`, feature `webhooks`).
    pub reputation: Option<ReputationConfig>,
}

/// A member's reputation breaker as configured; unset parts keep the defaults of
/// `mail_breaker::reputation`.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ReputationConfig {
    /// `reputation.failover`: a pool may fail the member's mail over while it is open.
    pub failover: bool,
    pub hard_bounces: LimitsConfig,
    pub complaints: LimitsConfig,
    pub window_sends: Option<u64>,
    pub buckets: Option<u32>,
}

/// One rate's thresholds, in parts per million, and its minimum volume.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct LimitsConfig {
    pub warn: Option<u32>,
    pub throttle: Option<u32>,
    pub open: Option<u32>,
    pub min_sends: Option<u64>,
}

/// How a member reaches its provider; `None` keeps the transport's default.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ConnectionConfig {
    /// The bound on a whole send, for every provider.
    pub timeout: Option<Duration>,
    /// SMTP's connection pool and extensions: only for an `smtp://` or `smtps://` member.
    pub smtp: SmtpConnection,
}

/// An SMTP member's connection pool and extensions.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct SmtpConnection {
    pub max_connections: Option<usize>,
    pub idle_timeout: Option<Duration>,
    pub max_messages_per_connection: Option<u32>,
    pub pipelining: Option<bool>,
    pub chunking: Option<bool>,
}

impl SmtpConnection {
    /// The first setting given, by name: none may be given to a member that is not SMTP.
    fn first_given(&self) -> Option<&'static str> {
        [
            ("max_connections", self.max_connections.is_some()),
            ("idle_timeout", self.idle_timeout.is_some()),
            (
                "max_messages_per_connection",
                self.max_messages_per_connection.is_some(),
            ),
            ("pipelining", self.pipelining.is_some()),
            ("chunking", self.chunking.is_some()),
        ]
        .into_iter()
        .find_map(|(name, given)| given.then_some(name))
    }
}

/// How a member's breaker counts: failures in a row, or an error rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Counting {
    InARow(u32),
    Rate {
        percent: u8,
        min_calls: Option<u32>,
        window: Option<Duration>,
    },
}

/// A member's breaker; `None` keeps the builder's default.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct BreakerConfig {
    pub counting: Option<Counting>,
    pub reset: Option<Duration>,
    pub max_reset: Option<Duration>,
    pub probe_timeout: Option<Duration>,
    pub half_open_successes: Option<u32>,
    pub slow_call: Option<Duration>,
    pub per_recipient_domain: Option<bool>,
    pub max_keys: Option<usize>,
    pub shadow: Option<bool>,
}

/// A member's rate limit.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RateConfig {
    pub per_second: f64,
    pub burst: Option<u32>,
    pub max_in_flight: Option<usize>,
    pub max_wait: Option<Duration>,
    pub adaptive: Option<bool>,
    pub min_per_second: Option<f64>,
    /// One budget for the fleet, through the stack's Redis.
    pub shared: bool,
    pub fleet: Option<u32>,
}

/// The retry around the pool.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct RetryConfig {
    pub attempts: Option<u32>,
    pub backoff: Option<Backoff>,
    pub max_elapsed: Option<Duration>,
    pub budget: Option<Budget>,
    pub at_most_once: bool,
}

/// A retry budget: the default one (`budget = true`), or its three numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Budget {
    Default,
    Tokens {
        tokens: u64,
        min_tokens: u64,
        error_cost: u64,
    },
}

/// The retry's wait between attempts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Backoff {
    Exponential { initial: Duration, max: Duration },
    Constant(Duration),
}

/// The outbox the stack queues in.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OutboxConfig {
    pub database: Database,
    pub queue_only: bool,
    pub concurrency: Option<usize>,
    pub lease: Option<Duration>,
    pub max_age: Option<Duration>,
    pub poll: Option<Duration>,
    pub at_most_once: bool,
    /// Opened only if its SQLite file exists ([`MailerConfig::existing_outbox`]).
    pub must_exist: bool,
}

/// Where the outbox keeps its mail.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Database {
    Sqlite(String),
    Postgres(Secret),
}

/// The Redis the breakers (and shared rate limits) keep their state in.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RedisConfig {
    /// One URL, or a cluster's.
    pub urls: Vec<Secret>,
    pub cluster: bool,
    pub quorum: Option<u32>,
    /// This process's name in a quorum's fleet.
    pub member: Option<String>,
    pub namespace: Option<String>,
    pub timeout: Option<Duration>,
    pub retry_interval: Option<Duration>,
    /// A file of PEM certificates to trust beside the system's.
    pub ca: Option<String>,
}

impl MailerConfig {
    /// Reads a DSN: one provider's URL (`smtp://user:pass@host:587?tls=required`), or
    /// `failover(A B ...)` and `roundrobin(A B ...)` of them, optionally inside
    /// `retry(...)`; see the module's documentation for every setting.
    pub fn from_dsn(dsn: &str) -> Result<MailerConfig, ConfigError> {
        MailerConfig::from_tree(&super::dsn::parse(dsn)?)
    }

    /// Reads a TOML document: `strategy`, `[[member]]` (each with `url`, its connection
    /// settings, and its `breaker` and `rate`), `[retry]`, `[outbox]` and `[redis]`.
    pub fn from_toml(toml: &str) -> Result<MailerConfig, ConfigError> {
        let table: toml::Table = toml.parse().map_err(|error: toml::de::Error| {
            let at = error
                .span()
                .map(|span| format!("at byte {}: ", span.start))
                .unwrap_or_default();
            ConfigError::new("toml", format!("{at}{}", error.message()))
        })?;
        MailerConfig::from_tree(&Value::Table(table))
    }

    /// How many members the pool has.
    pub fn members(&self) -> usize {
        self.members.len()
    }

    /// The same stack without its outbox: [`build`](Self::build) opens no database, and mail
    /// the stack cannot send is an error instead of being queued. For tools that work on the
    /// members alone (checking them, isolating a breaker), which must not fail because the
    /// outbox's database is down.
    ///
    /// ```
    /// use mail_breaker::config::Mailer;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// // An outbox that cannot be opened: the members are built all the same.
    /// let config = Mailer::from_dsn("smtp://127.0.0.1:2525?outbox=sqlite:///no/such/folder/outbox.db")?;
    /// let mailer = config.without_outbox().build_without_worker().await?;
    /// assert!(mailer.outbox().is_none());
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// # }).unwrap();
    /// ```
    pub fn without_outbox(self) -> MailerConfig {
        // A list kept in the outbox's database goes with it.
        let suppression = self
            .suppression
            .filter(|kept| *kept != SuppressionConfig::Outbox);
        MailerConfig {
            outbox: None,
            suppression,
            ..self
        }
    }

    /// The same stack, whose SQLite outbox is opened only if its file exists and is an
    /// outbox: a file that does not exist is an error naming `outbox.url` and the path (a
    /// relative one with the folder it was looked for in), never a new, empty outbox; a file
    /// that is not an outbox (another database, or no database) is an error naming
    /// `outbox.url` too, and its bytes are left as they were. For tools that read or operate
    /// an outbox an application keeps, run from any folder.
    ///
    /// ```
    /// use mail_breaker::config::Mailer;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let config = Mailer::from_dsn("smtp://127.0.0.1:2525?outbox=sqlite:///no/such/folder/outbox.db")?;
    /// let error = config.existing_outbox().build_without_worker().await.unwrap_err();
    /// assert_eq!(error.setting(), "outbox.url");
    /// assert!(error.reason().contains("/no/such/folder/outbox.db"), "{error}");
    /// # Ok::<(), mail_breaker::ConfigError>(())
    /// # }).unwrap();
    /// ```
    pub fn existing_outbox(mut self) -> MailerConfig {
        if let Some(outbox) = &mut self.outbox {
            outbox.must_exist = true;
        }
        self
    }

    pub(crate) fn from_tree(tree: &Value) -> Result<MailerConfig, ConfigError> {
        let root = Node::root(tree);
        let mut fields = root.table()?;
        let strategy = fields
            .read("strategy", |node| node.choice(&["failover", "roundrobin"]))?
            .map_or(Strategy::Failover, |choice| match choice {
                "roundrobin" => Strategy::RoundRobin,
                _ => Strategy::Failover,
            });
        let at_most_once = fields.read("at_most_once", Node::flag)?.unwrap_or(false);
        let members = fields
            .required("member")?
            .list()?
            .iter()
            .map(member)
            .collect::<Result<Vec<_>, _>>()?;
        if members.is_empty() {
            return Err(ConfigError::new("member", "needs at least one member"));
        }
        let retry = fields.read("retry", retry)?;
        let outbox = fields.read("outbox", outbox)?;
        let redis = fields.read("redis", redis)?;
        let suppression = fields.read("suppression", suppression)?.flatten();
        let webhooks = fields.read("webhooks", super::webhooks::read)?;
        fields.finish()?;
        if let Some(webhooks) = &webhooks {
            webhooks.check(&members, suppression.is_some())?;
        }
        match suppression {
            Some(SuppressionConfig::Outbox) if outbox.is_none() => {
                return Err(ConfigError::new(
                    "suppression",
                    "the suppression list is kept in the outbox's database: give the stack an \
                     outbox, or suppression.store=redis",
                ));
            }
            Some(SuppressionConfig::Redis) if redis.is_none() => {
                return Err(ConfigError::new(
                    "suppression.store",
                    "a suppression list in Redis needs the stack's [redis]",
                ));
            }
            _ => {}
        }
        if let Some(index) = members
            .iter()
            .position(|member| member.rate.as_ref().is_some_and(|rate| rate.shared))
            && redis.is_none()
        {
            return Err(ConfigError::new(
                format!("member[{index}].rate.shared"),
                "a shared rate limit needs the stack's [redis]",
            ));
        }
        Ok(MailerConfig {
            strategy,
            at_most_once,
            members,
            retry,
            outbox,
            redis,
            suppression,
            webhooks,
        })
    }
}

impl fmt::Debug for MailerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MailerConfig")
            .field("strategy", &self.strategy)
            .field("at_most_once", &self.at_most_once)
            .field("members", &self.members)
            .field("retry", &self.retry)
            .field("outbox", &self.outbox)
            .field("redis", &self.redis)
            .field("suppression", &self.suppression)
            .field("webhooks", &self.webhooks)
            .finish()
    }
}

impl<'de> Deserialize<'de> for MailerConfig {
    /// Any serde format's tree, read as a TOML document's: the same settings, the same
    /// errors (as the format's custom error, the path first).
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let tree = Value::deserialize(deserializer)?;
        MailerConfig::from_tree(&tree).map_err(serde::de::Error::custom)
    }
}

/// A member: its settings, those its URL's query holds among them (as a DSN reads them
/// from the same text), one reader for both.
fn member(node: &Node<'_>) -> Result<MemberConfig, ConfigError> {
    let Some(written) = node.written_table() else {
        return member_settings(node);
    };
    let url = written
        .get("url")
        .and_then(Value::as_str)
        .map(|url| super::dsn::split_member(url, false))
        .transpose()
        .map_err(|why| ConfigError::new(format!("{}.url", node.path()), why))?;
    match url {
        // A URL whose query holds no member setting goes this way too (nothing to put
        // beside it): one path for every member.
        Some((mut from_url, _)) => {
            let mut merged = written.clone();
            if let Some(url) = from_url.remove("url") {
                merged.insert("url".to_owned(), url);
            }
            put_beside(&mut merged, from_url, node.path())?;
            member_settings(&Node::at(node.path(), &Value::Table(merged)))
        }
        None => member_settings(node),
    }
}

/// Puts the settings `from_url` read from a member's URL into the member's table: a setting
/// given both there and beside it is an error naming it.
fn put_beside(
    into: &mut toml::Table,
    from_url: toml::Table,
    path: &str,
) -> Result<(), ConfigError> {
    for (key, value) in from_url {
        let here = format!("{path}.{key}");
        match (into.get_mut(&key), value) {
            (Some(Value::Table(inner)), Value::Table(from)) => put_beside(inner, from, &here)?,
            (Some(_), _) => {
                return Err(ConfigError::new(
                    here,
                    "is given both in the member's url and beside it; give it once",
                ));
            }
            (None, value) => {
                into.insert(key, value);
            }
        }
    }
    Ok(())
}

fn member_settings(node: &Node<'_>) -> Result<MemberConfig, ConfigError> {
    let mut fields = node.table()?;
    let url = fields.required("url")?;
    let provider = provider::read(&url.url()?, url.path())?;
    let name = fields.read("name", Node::word)?;
    let priority = fields.read("priority", |node| node.whole_u32(0))?;
    let breaker = fields.read("breaker", breaker)?.unwrap_or_default();
    let rate = fields.read("rate", rate)?;
    let reputation = fields.read("reputation", reputation)?;
    let timeout = fields.read("timeout", Node::positive_duration)?;
    let smtp = SmtpConnection {
        max_connections: fields.read("max_connections", |node| node.whole_usize(1))?,
        idle_timeout: fields.read("idle_timeout", Node::positive_duration)?,
        max_messages_per_connection: fields
            .read("max_messages_per_connection", |node| node.whole_u32(1))?,
        pipelining: fields.read("pipelining", Node::flag)?,
        chunking: fields.read("chunking", Node::flag)?,
    };
    fields.finish()?;
    if let Some(setting) = smtp.first_given()
        && !matches!(provider, Provider::Smtp { .. })
    {
        return Err(ConfigError::new(
            format!("{}.{setting}", node.path()),
            "only an smtp:// or smtps:// member has this setting",
        ));
    }
    Ok(MemberConfig {
        name,
        provider,
        priority,
        breaker,
        rate,
        connection: ConnectionConfig { timeout, smtp },
        reputation,
    })
}

/// A member's `reputation` table: `failover`, `window_sends`, `buckets`, and for
/// `hard_bounces` and `complaints` each `warn`, `throttle`, `open` (percentages such as
/// `4%` or `0.08%`) and `min_sends`. Without the `webhooks` feature the table is refused.
fn reputation(node: &Node<'_>) -> Result<ReputationConfig, ConfigError> {
    if !cfg!(feature = "webhooks") {
        return Err(node.error(
            "a reputation breaker needs the crate's `webhooks` feature, which this build lacks",
        ));
    }
    let mut fields = node.table()?;
    let config = ReputationConfig {
        failover: fields.read("failover", Node::flag)?.unwrap_or(false),
        hard_bounces: fields.read("hard_bounces", limits)?.unwrap_or_default(),
        complaints: fields.read("complaints", limits)?.unwrap_or_default(),
        window_sends: fields.read("window_sends", |node| node.whole(2, u64::MAX))?,
        buckets: fields.read("buckets", |node| node.whole_u32(2))?,
    };
    fields.finish()?;
    Ok(config)
}

fn limits(node: &Node<'_>) -> Result<LimitsConfig, ConfigError> {
    let mut fields = node.table()?;
    let config = LimitsConfig {
        warn: fields.read("warn", parts_per_million)?,
        throttle: fields.read("throttle", parts_per_million)?,
        open: fields.read("open", parts_per_million)?,
        min_sends: fields.read("min_sends", |node| node.whole(1, u64::MAX))?,
    };
    fields.finish()?;
    Ok(config)
}

/// A rate written as a percentage above 0 and at most 100 (`0.08%`, `4%`, `4`), in parts per
/// million; finer than a millionth is refused rather than rounded to nothing.
fn parts_per_million(node: &Node<'_>) -> Result<u32, ConfigError> {
    let percent = node.positive("%")?;
    let ppm = (percent * 10_000.0).round();
    if percent > 100.0 || ppm < 1.0 {
        return Err(node.error(format!(
            "expected a percentage above 0.0001% and at most 100%, got {percent}%"
        )));
    }
    // Within 1..=1_000_000 after the check above.
    Ok(ppm as u32)
}

fn breaker(node: &Node<'_>) -> Result<BreakerConfig, ConfigError> {
    let mut fields = node.table()?;
    let threshold = fields.read("threshold", |node| node.whole_u32(1))?;
    let percent = fields.read("error_rate", Node::percent)?;
    let min_calls = fields.read("min_calls", |node| node.whole_u32(1))?;
    let window = fields.read("window", Node::duration)?;
    let counting = match (threshold, percent) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::new(
                format!("{}.error_rate", node.path()),
                "a breaker counts failures in a row (threshold) or an error rate, not both",
            ));
        }
        (Some(threshold), None) => Some(Counting::InARow(threshold)),
        (None, Some(percent)) => Some(Counting::Rate {
            percent,
            min_calls,
            window,
        }),
        (None, None) => None,
    };
    if percent.is_none() && (min_calls.is_some() || window.is_some()) {
        let setting = if min_calls.is_some() {
            "min_calls"
        } else {
            "window"
        };
        return Err(ConfigError::new(
            format!("{}.{setting}", node.path()),
            "counts only with an error_rate",
        ));
    }
    let config = BreakerConfig {
        counting,
        reset: fields.read("reset", Node::duration)?,
        max_reset: fields.read("max_reset", Node::duration)?,
        probe_timeout: fields.read("probe_timeout", Node::duration)?,
        half_open_successes: fields.read("half_open_successes", |node| node.whole_u32(1))?,
        slow_call: fields.read("slow_call", Node::duration)?,
        per_recipient_domain: fields
            .read("scope", |node| {
                node.choice(&["transport", "recipient_domain"])
            })?
            .map(|scope| scope == "recipient_domain"),
        max_keys: fields.read("max_keys", |node| node.whole_usize(1))?,
        shadow: fields.read("shadow", Node::flag)?,
    };
    fields.finish()?;
    Ok(config)
}

fn rate(node: &Node<'_>) -> Result<RateConfig, ConfigError> {
    let mut fields = node.table()?;
    let per_second = fields.required("per_second")?.positive("/s")?;
    let config = RateConfig {
        per_second,
        burst: fields.read("burst", |node| node.whole_u32(1))?,
        max_in_flight: fields.read("max_in_flight", |node| node.whole_usize(1))?,
        max_wait: fields.read("max_wait", Node::duration)?,
        adaptive: fields.read("adaptive", Node::flag)?,
        min_per_second: fields.read("min_per_second", |node| node.positive("/s"))?,
        shared: fields.read("shared", Node::flag)?.unwrap_or(false),
        fleet: fields.read("fleet", |node| node.whole_u32(1))?,
    };
    fields.finish()?;
    Ok(config)
}

fn retry(node: &Node<'_>) -> Result<RetryConfig, ConfigError> {
    let mut fields = node.table()?;
    let attempts = fields.read("attempts", |node| node.whole_u32(1))?;
    let initial = fields.read("initial", Node::duration)?;
    let max = fields.read("max_delay", Node::duration)?;
    let delay = fields.read("delay", Node::duration)?;
    let backoff = match (delay, initial, max) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
            return Err(ConfigError::new(
                format!("{}.delay", node.path()),
                "a constant delay, or an exponential backoff (initial, max_delay), not both",
            ));
        }
        (Some(delay), None, None) => Some(Backoff::Constant(delay)),
        (None, None, None) => None,
        (None, initial, max) => Some(Backoff::Exponential {
            initial: initial.unwrap_or(Duration::from_secs(1)),
            max: max.unwrap_or(Duration::from_secs(60)),
        }),
    };
    let config = RetryConfig {
        attempts,
        backoff,
        max_elapsed: fields.read("max_elapsed", Node::duration)?,
        budget: fields.read("budget", budget)?.flatten(),
        at_most_once: fields.read("at_most_once", Node::flag)?.unwrap_or(false),
    };
    fields.finish()?;
    Ok(config)
}

/// `budget = true` (the default budget), `false` (none), or `{ tokens, min_tokens,
/// error_cost }`.
fn budget(node: &Node<'_>) -> Result<Option<Budget>, ConfigError> {
    if let Ok(flag) = node.flag() {
        return Ok(flag.then_some(Budget::Default));
    }
    let mut fields = node.table().map_err(|_| {
        node.error("expected true, false, or a table of tokens, min_tokens and error_cost")
    })?;
    let tokens = fields.required("tokens")?.whole(1, u64::MAX)?;
    let min_tokens = fields
        .read("min_tokens", |node| node.whole(0, u64::MAX))?
        .unwrap_or(0);
    let error_cost = fields
        .read("error_cost", |node| node.whole(1, u64::MAX))?
        .unwrap_or(1);
    fields.finish()?;
    if min_tokens > tokens {
        return Err(ConfigError::new(
            format!("{}.min_tokens", node.path()),
            "must not be more than tokens",
        ));
    }
    Ok(Some(Budget::Tokens {
        tokens,
        min_tokens,
        error_cost,
    }))
}

fn outbox(node: &Node<'_>) -> Result<OutboxConfig, ConfigError> {
    let mut fields = node.table()?;
    let url = fields.required("url")?;
    let text = url.url()?;
    let database = if let Some(path) = text.strip_prefix("sqlite://") {
        if !cfg!(feature = "outbox") {
            return Err(url.error(
                "an outbox needs the crate's `outbox` feature, which this build does not have",
            ));
        }
        if path.is_empty() {
            return Err(url.error("names no file: sqlite:///var/lib/app/outbox.db"));
        }
        Database::Sqlite(path.to_owned())
    } else if text.starts_with("postgres://") || text.starts_with("postgresql://") {
        if !cfg!(feature = "postgres") {
            return Err(url.error(
                "an outbox on PostgreSQL needs the crate's `postgres` feature, which this \
                 build does not have",
            ));
        }
        Database::Postgres(Secret(text))
    } else {
        return Err(url.error(
            "expected sqlite:///path/to/outbox.db or postgres://user:password@host/database",
        ));
    };
    let config = OutboxConfig {
        database,
        queue_only: fields.read("queue_only", Node::flag)?.unwrap_or(false),
        concurrency: fields.read("concurrency", |node| node.whole_usize(1))?,
        lease: fields.read("lease", Node::duration)?,
        max_age: fields.read("max_age", Node::duration)?,
        poll: fields.read("poll", Node::duration)?,
        at_most_once: fields.read("at_most_once", Node::flag)?.unwrap_or(false),
        must_exist: false,
    };
    fields.finish()?;
    Ok(config)
}

/// `suppression`: a flag (`suppression = true`; in a DSN `suppression=true`), or a table
/// with `enabled` (a flag, true when not given) and `store` (`outbox`, the default, or
/// `redis`). `None` when it is off.
fn suppression(node: &Node<'_>) -> Result<Option<SuppressionConfig>, ConfigError> {
    let (enabled, store) = if node.written_table().is_some() {
        let mut fields = node.table()?;
        let enabled = fields.read("enabled", Node::flag)?.unwrap_or(true);
        let store = fields.read("store", |node| {
            let choice = node.choice(&["outbox", "redis"])?;
            if choice == "redis" && !cfg!(feature = "redis") {
                return Err(node.error(
                    "a suppression list in Redis needs the crate's `redis` feature, which \
                     this build does not have",
                ));
            }
            Ok(choice)
        })?;
        fields.finish()?;
        (enabled, store)
    } else {
        (node.flag()?, None)
    };
    if !enabled {
        return Ok(None);
    }
    if !cfg!(feature = "webhooks") {
        return Err(node.error(
            "a suppression list needs the crate's `webhooks` feature, which this build does \
             not have",
        ));
    }
    Ok(Some(match store {
        Some("redis") => SuppressionConfig::Redis,
        _ => SuppressionConfig::Outbox,
    }))
}

fn redis(node: &Node<'_>) -> Result<RedisConfig, ConfigError> {
    if !cfg!(feature = "redis") {
        return Err(node.error(
            "a Redis store needs the crate's `redis` feature, which this build does not have",
        ));
    }
    let mut fields = node.table()?;
    let url = fields.read("url", Node::url)?;
    let cluster = fields.read("cluster", Node::urls)?;
    let (urls, cluster) = match (url, cluster) {
        (Some(url), None) => (vec![Secret(url)], false),
        (None, Some(urls)) if !urls.is_empty() => (urls.into_iter().map(Secret).collect(), true),
        (None, Some(_)) => {
            return Err(ConfigError::new(
                format!("{}.cluster", node.path()),
                "needs at least one node's URL",
            ));
        }
        (Some(_), Some(_)) => {
            return Err(ConfigError::new(
                format!("{}.cluster", node.path()),
                "one Redis (url) or a cluster's nodes (cluster), not both",
            ));
        }
        (None, None) => {
            return Err(ConfigError::new(
                format!("{}.url", node.path()),
                "is required (or cluster, a list of the nodes' URLs)",
            ));
        }
    };
    let config = RedisConfig {
        urls,
        cluster,
        quorum: fields.read("quorum", |node| node.whole_u32(1))?,
        member: fields.read("member", Node::word)?,
        namespace: fields.read("namespace", Node::word)?,
        timeout: fields.read("timeout", Node::duration)?,
        retry_interval: fields.read("retry_interval", Node::duration)?,
        ca: fields.read("ca", Node::word)?,
    };
    fields.finish()?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The password an `smtp://` member's URL gives, decoded as the SMTP client decodes it.
    fn smtp_password(config: &MailerConfig) -> String {
        let Provider::Smtp { url } = &config.members[0].provider else {
            panic!("an smtp:// member")
        };
        let url = url::Url::parse(&url.0).expect("a URL");
        percent_encoding::percent_decode_str(url.password().expect("a password"))
            .decode_utf8()
            .expect("UTF-8")
            .into_owned()
    }

    #[test]
    fn a_secret_from_the_environment_is_never_percent_decoded() {
        // SAFETY: no other test of this binary reads or writes this variable.
        unsafe { std::env::set_var("MAIL_BREAKER_TREE_TEST_SECRET", "p%41ss+w&rd@x/y:z") };
        let dsn = MailerConfig::from_dsn(
            "smtp://user:${MAIL_BREAKER_TREE_TEST_SECRET}@relay.example.com?tls=required",
        )
        .unwrap();
        assert_eq!(smtp_password(&dsn), "p%41ss+w&rd@x/y:z");
        let toml = MailerConfig::from_toml(
            r#"
            [[member]]
            url = "smtp://user:${MAIL_BREAKER_TREE_TEST_SECRET}@relay.example.com?tls=required"
            "#,
        )
        .unwrap();
        assert_eq!(smtp_password(&toml), "p%41ss+w&rd@x/y:z");
    }

    #[cfg(feature = "webhooks")]
    #[test]
    fn suppression_is_a_flag_or_a_table_with_enabled_and_store_read_alike_from_a_dsn_and_toml() {
        let dsn = MailerConfig::from_dsn(
            "smtp://relay.example.com?outbox=sqlite:///tmp/o.db&suppression=true",
        )
        .unwrap();
        assert_eq!(dsn.suppression, Some(SuppressionConfig::Outbox));
        let toml = MailerConfig::from_toml(
            "[[member]]\nurl = \"smtp://relay.example.com\"\n\
             [outbox]\nurl = \"sqlite:///tmp/o.db\"\n[suppression]\nstore = \"outbox\"\n",
        )
        .unwrap();
        assert_eq!(toml.suppression, Some(SuppressionConfig::Outbox));
        let flag = MailerConfig::from_toml(
            "suppression = true\n[[member]]\nurl = \"smtp://relay.example.com\"\n\
             [outbox]\nurl = \"sqlite:///tmp/o.db\"\n",
        )
        .unwrap();
        assert_eq!(flag.suppression, Some(SuppressionConfig::Outbox));
        let off = MailerConfig::from_dsn("smtp://relay.example.com?suppression=false").unwrap();
        assert_eq!(off.suppression, None);
    }

    #[cfg(feature = "webhooks")]
    #[test]
    fn a_suppression_key_unknown_or_invalid_is_an_error_naming_it() {
        let error = |dsn: &str| MailerConfig::from_dsn(dsn).unwrap_err();
        let outbox = "smtp://relay.example.com?outbox=sqlite:///tmp/o.db";
        assert_eq!(
            error(&format!("{outbox}&suppression=maybe")).setting(),
            "suppression.enabled"
        );
        assert_eq!(
            error(&format!("{outbox}&suppression.store=memcached")).setting(),
            "suppression.store"
        );
        let unknown = error(&format!("{outbox}&suppression.ttl=3d"));
        assert!(unknown.setting().starts_with("suppression"), "{unknown}");
        assert!(unknown.to_string().contains("ttl"), "{unknown}");
        assert_eq!(
            error("smtp://relay.example.com?suppression=true").setting(),
            "suppression",
            "kept in the outbox's database, which the stack does not have"
        );
    }

    #[cfg(all(feature = "webhooks", feature = "redis"))]
    #[test]
    fn a_suppression_list_in_redis_needs_the_stacks_redis() {
        let error = MailerConfig::from_dsn(
            "smtp://relay.example.com?suppression=true&suppression.store=redis",
        )
        .unwrap_err();
        assert_eq!(error.setting(), "suppression.store");
        let config = MailerConfig::from_dsn(
            "smtp://relay.example.com?suppression.store=redis&redis=redis://127.0.0.1:6379",
        )
        .unwrap();
        assert_eq!(config.suppression, Some(SuppressionConfig::Redis));
    }

    #[test]
    fn a_percent_encoded_password_written_in_the_url_is_decoded() {
        let config =
            MailerConfig::from_dsn("smtp://user:p%41ss@relay.example.com?tls=required").unwrap();
        assert_eq!(smtp_password(&config), "pAss");
    }
}
