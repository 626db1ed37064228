//! The suppression list: addresses that bounced for good or complained, kept so that the
//! next message to them is refused before it reaches a provider and costs reputation.
//!
//! # Rules
//! - A **permanent bounce** or a **complaint** ([`DeliveryEvent`]s given to the list as an
//!   [`EventSink`]) suppresses the address for good, with the reason (`bounced`,
//!   `complained`), the provider, the event's id and its time. An address suppressed for
//!   good keeps its first cause.
//! - **Transient bounces** (and undetermined ones) are counted per address: 3 within 72
//!   hours (by the provider's times) suppress it for 24 hours from the last of them; then the
//!   entry expires by itself. A permanent cause replaces such a hold. Mail to a held address
//!   waits: [`SuppressionTransport`] answers it deferred (`suppressed.held`, retryable, not
//!   attempted, with the hold's end as its `retry_after`), so an outbox sends it once the hold
//!   ends.
//! - Each event is kept once by `(provider, event id, recipient)`: a provider sending a report
//!   again changes nothing. Ids are remembered for 30 days, far past any provider's resends. [`keep`](EventSink::keep) is one transaction: all of its events
//!   are kept, with their ids, or none.
//! - **Addresses compare as mail does**: the local part as written, the domain without case.
//!   The list keeps each address with its domain in lower case.
//! - By hand: [`add`](SuppressionList::add), [`remove`](SuppressionList::remove),
//!   [`get`](SuppressionList::get), [`list`](SuppressionList::list) (pages) and
//!   [`import`](SuppressionList::import) (CSV, see [`import`](SuppressionList::import)).
//!
//! # Where it is kept
//! In the outbox's database ([`SuppressionList::in_outbox`]: SQLite or PostgreSQL, tables of
//! its own that the outbox makes when it opens, `mail_breaker_suppression*`), or in Redis
//! ([`SuppressionList::redis`], feature `redis`).
//!
//! # Sending
//! [`SuppressionTransport`] answers each suppressed recipient as `Rejected`
//! (`suppressed.bounced`, `suppressed.complained`, `suppressed.manual`) without contacting the
//! provider, and sends the message to the others. In a [`Mailer`](crate::Mailer) it is the
//! first layer behind the outbox (`suppression=true`).
//!
//! # Example
//! ```
//! use std::time::SystemTime;
//! use mail_breaker::events::{BounceKind, DeliveryEvent, EventKind, EventSink, Provider};
//! use mail_breaker::outbox::Outbox;
//! use mail_breaker::suppression::{Reason, SuppressionList};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! # let dir = tempfile::tempdir().unwrap();
//! let outbox = Outbox::sqlite(dir.path().join("mail.db")).await?;
//! let list = SuppressionList::in_outbox(&outbox)?;
//! let bounce = DeliveryEvent::new(
//!     Provider::Ses,
//!     "sns-message-1",
//!     EventKind::Bounced { bounce: BounceKind::Permanent, subtype: None },
//!     "gone@Example.COM",
//!     SystemTime::now(),
//! );
//! assert_eq!(list.keep(&[bounce.clone()]).await?.new, 1);
//! assert_eq!(list.keep(&[bounce]).await?.new, 0, "a resent event changes nothing");
//! let entry = list.get("gone@example.com").await?.expect("suppressed");
//! assert_eq!(entry.reason, Reason::Bounced);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;

use crate::events::{DeliveryEvent, EventSink, KeepError, Kept};

mod import;
#[cfg(feature = "redis")]
mod redis;
pub(crate) mod rules;
mod sql;
mod transport;

use rules::Millis;
pub use transport::SuppressionTransport;

pub(crate) use sql::SqlStore;

/// The list's tables and indexes, which the outbox makes in its schema step.
pub(crate) fn sql_schema() -> &'static [&'static str] {
    &sql::SCHEMA
}

/// Why an address is suppressed.
///
/// ```
/// use mail_breaker::suppression::Reason;
///
/// assert_eq!(Reason::Bounced.code(), "suppressed.bounced");
/// assert_eq!("complained".parse::<Reason>(), Ok(Reason::Complained));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// It bounced: for good, or three transient bounces within 72 hours (then for 24 hours).
    Bounced,
    /// Its recipient marked a message as spam.
    Complained,
    /// Added by hand (an operator, an import without a reason).
    Manual,
}

impl Reason {
    /// Its name as the stores, the command and CSV files write it: `bounced`, `complained`,
    /// `manual`.
    ///
    /// ```
    /// # use mail_breaker::suppression::Reason;
    /// assert_eq!(Reason::Manual.as_str(), "manual");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Bounced => "bounced",
            Reason::Complained => "complained",
            Reason::Manual => "manual",
        }
    }

    /// The code of the `Rejected` error a suppressed recipient is answered with:
    /// `suppressed.bounced`, `suppressed.complained`, `suppressed.manual`.
    ///
    /// ```
    /// # use mail_breaker::suppression::Reason;
    /// assert_eq!(Reason::Complained.code(), "suppressed.complained");
    /// ```
    pub fn code(self) -> &'static str {
        match self {
            Reason::Bounced => "suppressed.bounced",
            Reason::Complained => "suppressed.complained",
            Reason::Manual => "suppressed.manual",
        }
    }

    /// Reads a reason as providers' exports and people write it, without case: `bounced`,
    /// `bounce`, `hardbounce` (Postmark's `HardBounce`); `complained`, `complaint`, `spam`,
    /// `spamcomplaint` (Postmark's `SpamComplaint`); `manual`, `manualsuppression`
    /// (Postmark's `ManualSuppression`), `unsubscribed`. `None` for anything else.
    ///
    /// ```
    /// # use mail_breaker::suppression::Reason;
    /// assert_eq!(Reason::from_export("HardBounce"), Some(Reason::Bounced));
    /// assert_eq!(Reason::from_export("COMPLAINT"), Some(Reason::Complained));
    /// assert_eq!(Reason::from_export("550 5.1.1 user unknown"), None);
    /// ```
    pub fn from_export(text: &str) -> Option<Reason> {
        let word: String = text
            .trim()
            .chars()
            .filter(|c| !matches!(c, ' ' | '_' | '-'))
            .flat_map(char::to_lowercase)
            .collect();
        match word.as_str() {
            "bounced" | "bounce" | "hardbounce" | "bounces" => Some(Reason::Bounced),
            "complained" | "complaint" | "complaints" | "spam" | "spamcomplaint" => {
                Some(Reason::Complained)
            }
            "manual" | "manualsuppression" | "unsubscribed" | "unsubscribe" => Some(Reason::Manual),
            _ => None,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Reason {
    type Err = SuppressionError;

    /// [`Reason::from_export`], with an error naming the words it reads.
    fn from_str(text: &str) -> Result<Reason, SuppressionError> {
        Reason::from_export(text).ok_or_else(|| SuppressionError::InvalidReason {
            reason: text.chars().take(80).collect(),
        })
    }
}

/// One suppressed address, as the list keeps it.
///
/// ```
/// use mail_breaker::suppression::{Reason, Suppression};
///
/// fn describe(entry: &Suppression) -> String {
///     match entry.until {
///         Some(_) => format!("{} held for a while ({})", entry.address, entry.reason),
///         None => format!("{} suppressed for good ({})", entry.address, entry.reason),
///     }
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Suppression {
    /// The address, its domain in lower case.
    pub address: String,
    /// Why.
    pub reason: Reason,
    /// The provider that reported it (`ses`, `postmark`…), `None` when added by hand.
    pub provider: Option<String>,
    /// The provider's id of the event that suppressed it, `None` when added by hand.
    pub event_id: Option<String>,
    /// When: the event's time, or when it was added.
    pub at: SystemTime,
    /// When a hold for transient bounces ends; `None` for good.
    pub until: Option<SystemTime>,
}

/// The list as a store keeps it: times in milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub address: String,
    pub reason: Reason,
    pub provider: Option<String>,
    pub event_id: Option<String>,
    pub at: Millis,
    pub until: Option<Millis>,
}

impl Entry {
    fn public(self) -> Suppression {
        Suppression {
            address: self.address,
            reason: self.reason,
            provider: self.provider,
            event_id: self.event_id,
            at: rules::time(self.at),
            until: self.until.map(rules::time),
        }
    }
}

/// What [`SuppressionList::import`] did.
///
/// ```
/// use mail_breaker::suppression::Imported;
///
/// fn report(imported: Imported) -> String {
///     format!("{} read, {} new", imported.read, imported.added)
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Imported {
    /// Addresses read from the file.
    pub read: usize,
    /// Of those, how many were not on the list before (the others are left as they were).
    pub added: usize,
    /// Rows not imported because they say a temporary failure: a `status` or `code` column
    /// of `4.x.x` or `4xx` (SendGrid's blocks export, Mailgun's `code`), or a reason that
    /// begins so or names a soft, transient, temporary or deferred failure (`Soft bounce`):
    /// no reason to suppress an address for good.
    pub skipped: usize,
}

/// Why the list could not do what it was asked.
///
/// ```
/// use mail_breaker::suppression::SuppressionError;
///
/// let error = SuppressionError::Store { doing: "reading", reason: "connection refused".into() };
/// assert!(error.to_string().contains("connection refused"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SuppressionError {
    /// The text is no e-mail address.
    #[error("{address:?} is no e-mail address: {why}")]
    InvalidAddress {
        /// The text given (its first 80 characters).
        address: String,
        /// Why.
        why: &'static str,
    },
    /// The reason is none the list knows.
    #[error(
        "{reason:?} is no reason the list knows: bounced (bounce, hardbounce), complained \
         (complaint, spam, spamcomplaint) or manual (manualsuppression, unsubscribed)"
    )]
    InvalidReason {
        /// The text given (its first 80 characters).
        reason: String,
    },
    /// A line of an import cannot be read; nothing was imported.
    #[error("line {line} of the import: {why}; nothing was imported")]
    Import {
        /// Its number, from 1.
        line: usize,
        /// Why.
        why: String,
    },
    /// The store (the database, Redis) failed or cannot be reached.
    #[error("the suppression list's store failed while {doing}: {reason}")]
    Store {
        /// What the list was doing.
        doing: &'static str,
        /// The store's error.
        reason: String,
    },
    /// The list cannot be kept where it was asked to be.
    #[error("the suppression list cannot be kept here: {reason}")]
    Unsupported {
        /// Why.
        reason: String,
    },
}

impl SuppressionError {
    fn invalid_address(text: &str, why: &'static str) -> SuppressionError {
        SuppressionError::InvalidAddress {
            address: text.chars().take(80).collect(),
            why,
        }
    }
}

/// Where a list is kept: the outbox's database or Redis. Every method is one statement or
/// one transaction (one script on Redis).
#[async_trait]
pub(crate) trait Store: Send + Sync + fmt::Debug {
    /// Applies `events` in one transaction, each id once; how many were new.
    async fn keep(&self, events: &[rules::Planned], now: Millis)
    -> Result<usize, SuppressionError>;
    /// Puts `entries` in one transaction: replacing what is there (`replace`, a manual
    /// add) or leaving it (an import); how many were not there before.
    async fn put(&self, entries: &[Entry], replace: bool) -> Result<usize, SuppressionError>;
    /// Takes an address off (and forgets its transient bounces); whether it was on.
    async fn remove(&self, address: &str) -> Result<bool, SuppressionError>;
    /// The entries of these addresses in force at `now`.
    async fn find(&self, addresses: &[String], now: Millis)
    -> Result<Vec<Entry>, SuppressionError>;
    /// Up to `limit` entries in force at `now`, by address, after `after`.
    async fn page(
        &self,
        after: Option<&str>,
        limit: u32,
        now: Millis,
    ) -> Result<Vec<Entry>, SuppressionError>;
    /// Up to `limit` entries in force at `now` whose address holds `text` (ASCII letters
    /// without case), by address.
    async fn search(
        &self,
        text: &str,
        limit: u32,
        now: Millis,
    ) -> Result<Vec<Entry>, SuppressionError>;
}

/// The clock a list reads: when a hold ends, what is pruned, when an address was added.
type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// The suppression list; see the [module docs](self) for its rules.
///
/// Cheap to clone: clones share the store's connections.
///
/// ```
/// use mail_breaker::outbox::Outbox;
/// use mail_breaker::suppression::{Reason, SuppressionList};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// # let dir = tempfile::tempdir().unwrap();
/// let list = SuppressionList::in_outbox(&Outbox::sqlite(dir.path().join("mail.db")).await?)?;
/// list.add("Someone@EXAMPLE.org", Reason::Manual).await?;
/// assert!(list.contains("Someone@example.org").await?);
/// assert!(!list.contains("someone@example.org").await?, "the local part keeps its case");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct SuppressionList {
    store: Arc<dyn Store>,
    clock: Clock,
}

impl fmt::Debug for SuppressionList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SuppressionList")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl SuppressionList {
    /// The list in `outbox`'s database (SQLite or PostgreSQL), in the tables the outbox
    /// made when it opened; it shares the outbox's connections.
    ///
    /// ```
    /// # use mail_breaker::outbox::Outbox;
    /// # use mail_breaker::suppression::SuppressionList;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// # let dir = tempfile::tempdir().unwrap();
    /// let outbox = Outbox::sqlite(dir.path().join("mail.db")).await?;
    /// let list = SuppressionList::in_outbox(&outbox)?;
    /// assert!(list.list(None, 10).await?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn in_outbox(outbox: &crate::outbox::Outbox) -> Result<SuppressionList, SuppressionError> {
        let store = outbox
            .suppression_store()
            .ok_or_else(|| SuppressionError::Unsupported {
                reason: "this outbox has no database of its own".into(),
            })?;
        Ok(SuppressionList::with_store(Arc::new(store)))
    }

    /// The list in the Redis `store` reaches (one server or a cluster), under its namespace,
    /// on the store's own connection. Every change is one script, so all or nothing.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use mail_breaker::RedisStore;
    /// use mail_breaker::suppression::SuppressionList;
    ///
    /// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
    /// let list = SuppressionList::redis(&store);
    /// println!("{}", list.contains("someone@example.org").await?);
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis")]
    pub fn redis(store: &crate::RedisStore) -> SuppressionList {
        SuppressionList::with_store(Arc::new(redis::RedisList::new(store)))
    }

    fn with_store(store: Arc<dyn Store>) -> SuppressionList {
        SuppressionList {
            store,
            clock: Arc::new(SystemTime::now),
        }
    }

    /// The same list reading `clock` for the time (tests drive holds and their expiry with
    /// it, and no sleep).
    ///
    /// ```
    /// # use std::time::{Duration, SystemTime};
    /// # use mail_breaker::outbox::Outbox;
    /// # use mail_breaker::suppression::SuppressionList;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let outbox = Outbox::sqlite(dir.path().join("mail.db")).await?;
    /// let tomorrow = SystemTime::now() + Duration::from_secs(86_400);
    /// let list = SuppressionList::in_outbox(&outbox)?.with_clock(move || tomorrow);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn with_clock(
        mut self,
        clock: impl Fn() -> SystemTime + Send + Sync + 'static,
    ) -> SuppressionList {
        self.clock = Arc::new(clock);
        self
    }

    fn now(&self) -> Millis {
        rules::millis((self.clock)())
    }

    /// Suppresses `address` with `reason`, by hand: for good, replacing what the list held for
    /// it (a hold, another reason). `InvalidAddress` for a text that is no address.
    ///
    /// ```
    /// # use mail_breaker::outbox::Outbox;
    /// # use mail_breaker::suppression::{Reason, SuppressionList, SuppressionError};
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let list = SuppressionList::in_outbox(&Outbox::sqlite(dir.path().join("mail.db")).await?)?;
    /// list.add("complainer@example.org", Reason::Complained).await?;
    /// let error = list.add("not an address", Reason::Manual).await.unwrap_err();
    /// assert!(matches!(error, SuppressionError::InvalidAddress { .. }));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn add(&self, address: &str, reason: Reason) -> Result<(), SuppressionError> {
        let key = key_of(address)?;
        let entry = Entry {
            address: key,
            reason,
            provider: None,
            event_id: None,
            at: self.now(),
            until: None,
        };
        self.store.put(&[entry], true).await.map(|_| ())
    }

    /// Takes `address` off the list, and forgets its transient bounces; whether it was on.
    ///
    /// ```
    /// # use mail_breaker::outbox::Outbox;
    /// # use mail_breaker::suppression::{Reason, SuppressionList};
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let list = SuppressionList::in_outbox(&Outbox::sqlite(dir.path().join("mail.db")).await?)?;
    /// list.add("back@example.org", Reason::Bounced).await?;
    /// assert!(list.remove("back@EXAMPLE.org").await?);
    /// assert!(!list.remove("back@example.org").await?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn remove(&self, address: &str) -> Result<bool, SuppressionError> {
        let key = key_of(address)?;
        self.store.remove(&key).await
    }

    /// The entry for `address` in force now (a hold that ended is none).
    ///
    /// ```
    /// # use mail_breaker::outbox::Outbox;
    /// # use mail_breaker::suppression::{Reason, SuppressionList};
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let list = SuppressionList::in_outbox(&Outbox::sqlite(dir.path().join("mail.db")).await?)?;
    /// assert_eq!(list.get("anyone@example.org").await?, None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn get(&self, address: &str) -> Result<Option<Suppression>, SuppressionError> {
        let key = key_of(address)?;
        let found = self.store.find(&[key], self.now()).await?;
        Ok(found.into_iter().next().map(Entry::public))
    }

    /// Whether `address` is suppressed now.
    ///
    /// ```
    /// # use mail_breaker::outbox::Outbox;
    /// # use mail_breaker::suppression::SuppressionList;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let list = SuppressionList::in_outbox(&Outbox::sqlite(dir.path().join("mail.db")).await?)?;
    /// assert!(!list.contains("anyone@example.org").await?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn contains(&self, address: &str) -> Result<bool, SuppressionError> {
        Ok(self.get(address).await?.is_some())
    }

    /// The entries in force of these addresses (each as [`get`](Self::get) would read it),
    /// in one read; addresses not on the list are left out.
    pub(crate) async fn find_keys(
        &self,
        keys: &[String],
    ) -> Result<Vec<Suppression>, SuppressionError> {
        let found = self.store.find(keys, self.now()).await?;
        Ok(found.into_iter().map(Entry::public).collect())
    }

    /// A page of the list in force now, by address: up to `limit` entries after `after`
    /// (from the first for `None`). The last one's address is the next page's `after`; an
    /// empty page is the end.
    ///
    /// ```
    /// # use mail_breaker::outbox::Outbox;
    /// # use mail_breaker::suppression::{Reason, SuppressionList};
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let list = SuppressionList::in_outbox(&Outbox::sqlite(dir.path().join("mail.db")).await?)?;
    /// # list.add("a@example.org", Reason::Manual).await?;
    /// let mut after: Option<String> = None;
    /// loop {
    ///     let page = list.list(after.as_deref(), 500).await?;
    ///     let Some(last) = page.last() else { break };
    ///     for entry in &page {
    ///         println!("{} {}", entry.address, entry.reason);
    ///     }
    ///     after = Some(last.address.clone());
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn list(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<Suppression>, SuppressionError> {
        let page = self.store.page(after, limit, self.now()).await?;
        Ok(page.into_iter().map(Entry::public).collect())
    }

    /// Up to `limit` entries in force now whose address holds `text`, by address: the
    /// letters A to Z compared without case, every other character as written (`%`, `_`,
    /// `*` are no patterns). For an operator looking for an address; an empty `text` holds
    /// in every address.
    ///
    /// ```
    /// # use mail_breaker::outbox::Outbox;
    /// # use mail_breaker::suppression::{Reason, SuppressionList};
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let list = SuppressionList::in_outbox(&Outbox::sqlite(dir.path().join("mail.db")).await?)?;
    /// list.add("ann@shop.example", Reason::Bounced).await?;
    /// list.add("bob@example.org", Reason::Manual).await?;
    /// let found = list.search("SHOP", 50).await?;
    /// assert_eq!(found.len(), 1);
    /// assert_eq!(found[0].address, "ann@shop.example");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn search(
        &self,
        text: &str,
        limit: u32,
    ) -> Result<Vec<Suppression>, SuppressionError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let found = self.store.search(text, limit, self.now()).await?;
        Ok(found.into_iter().map(Entry::public).collect())
    }

    /// Imports a CSV file's addresses, all or none (one transaction): each is suppressed for
    /// good unless it is so already, in which case it is left as it is (a hold for transient
    /// bounces becomes an entry for good).
    ///
    /// # Format
    /// UTF-8, one address a line, `address[,reason]`; fields may be in double quotes (`""`
    /// for a quote inside); blank lines are skipped. A first line naming its columns is a
    /// header: then the address is the column named `address`, `email`, `email_address`,
    /// `emailaddress` or `recipient`, the reason the one named `reason`,
    /// `suppression_reason`, `suppressionreason` or `type`, and other columns are ignored.
    /// That reads providers' exports as they are: Postmark's suppressions
    /// (`EmailAddress,SuppressionReason,Origin,CreatedAt` with `HardBounce`,
    /// `SpamComplaint`, `ManualSuppression`), Mailgun's bounces and complaints
    /// (`address,code,error,created_at`), SendGrid's bounces (`email,created,reason,status`,
    /// whose reason is the receiving server's answer), or a list written by hand. A reason is
    /// read by [`Reason::from_export`]; a line without one, or whose reason is words it does
    /// not read (a provider's free text), takes `default`. A row that says a temporary
    /// failure (a `status` or `code` of `4.x.x` or `4xx`, a reason such as
    /// `421 4.7.0 Try again later` or `Soft bounce`) is skipped and counted in
    /// [`Imported::skipped`].
    ///
    /// # Errors
    /// `Import` with the line's number for a line that is no address, a reason the list does
    /// not know, or a header without an address column: nothing is imported then. A store
    /// that fails partway (the addresses are written 200 at a time) may have kept the first
    /// parts: importing the same file again completes it.
    ///
    /// ```
    /// # use mail_breaker::outbox::Outbox;
    /// # use mail_breaker::suppression::{Reason, SuppressionList};
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let list = SuppressionList::in_outbox(&Outbox::sqlite(dir.path().join("mail.db")).await?)?;
    /// let csv = "EmailAddress,SuppressionReason,Origin\n\
    ///            gone@example.org,HardBounce,Recipient\n\
    ///            angry@example.org,SpamComplaint,Recipient\n";
    /// let imported = list.import(csv, Reason::Manual).await?;
    /// assert_eq!((imported.read, imported.added), (2, 2));
    /// assert_eq!(list.get("angry@example.org").await?.unwrap().reason, Reason::Complained);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn import(&self, csv: &str, default: Reason) -> Result<Imported, SuppressionError> {
        let now = self.now();
        let read = import::read(csv, default)?;
        let entries: Vec<Entry> = read
            .rows
            .into_iter()
            .map(|(address, reason)| Entry {
                address,
                reason,
                provider: None,
                event_id: None,
                at: now,
                until: None,
            })
            .collect();
        // In parts: one script or statement for a whole export (Postmark's may hold 100,000
        // addresses) would hold a shared Redis and outlast the store's timeout. An import
        // cut halfway by an error is taken up again by importing the same file: an address
        // already there is left as it is.
        let mut added = 0;
        for part in entries.chunks(IMPORT_PART) {
            added += self.store.put(part, false).await?;
        }
        Ok(Imported {
            read: entries.len(),
            added,
            skipped: read.skipped,
        })
    }
}

/// How many addresses an import writes in one call to the store.
const IMPORT_PART: usize = 200;

/// The key of `address`, or why it is none.
fn key_of(address: &str) -> Result<String, SuppressionError> {
    rules::address_key(address).map_err(|why| SuppressionError::invalid_address(address, why))
}

#[async_trait]
impl EventSink for SuppressionList {
    async fn keep(&self, events: &[DeliveryEvent]) -> Result<Kept, KeepError> {
        let planned = rules::plan(events);
        let new = self
            .store
            .keep(&planned, self.now())
            .await
            .map_err(|error| KeepError::new(error.to_string()))?;
        Ok(Kept { new })
    }
}
