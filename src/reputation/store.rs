//! Where reputation breakers keep their counts and their open flag: [`ReputationStore`],
//! with [`MemoryReputation`] for one process; a `RedisStore` (feature `redis`) shares them
//! with a fleet, so that events heard by one process open the breaker for all.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;

use super::rules::ReputationRules;
use super::window::{Counts, Reputation, Standing, TierChange};
use crate::events::KeepError;

/// What a bounce or a complaint says about a member's reputation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Signal {
    /// A permanent bounce.
    HardBounce,
    /// A complaint (a feedback loop report).
    Complaint,
}

/// One event a breaker heard, with the id it is counted once under.
///
/// ```
/// use mail_breaker::reputation::{Heard, Signal};
///
/// let heard = Heard { id: "ses:0000014a:bob@example.org".into(), signal: Signal::HardBounce };
/// assert_eq!(heard.signal, Signal::HardBounce);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Heard {
    /// The event's id: providers resend an event with the same id, and a store counts each
    /// id once.
    pub id: String,
    /// What it says.
    pub signal: Signal,
}

/// What one [`ReputationStore::record`] did.
///
/// ```
/// use mail_breaker::reputation::{MemoryReputation, ReputationRules, ReputationStore, Tier};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let recorded = MemoryReputation::new()
///     .record("ses", &ReputationRules::default(), 3, &[])
///     .await?;
/// assert_eq!((recorded.standing.window.sends, recorded.new), (3, 0));
/// assert!(!recorded.change.changed());
/// # Ok::<(), mail_breaker::events::KeepError>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Recorded {
    /// Where the member stands after it.
    pub standing: Standing,
    /// The change of tier it made (`from == to` when none).
    pub change: TierChange,
    /// How many of the events heard were new (not counted before under their id).
    pub new: usize,
}

/// How many event ids a store remembers per member to count each once: providers resend
/// within hours, so the last hundred thousand are plenty.
pub const SEEN_IDS: usize = 100_000;

/// The state behind [`ReputationBreaker`](super::ReputationBreaker)s, one
/// [`Reputation`] per member, changed atomically per member.
///
/// # Implementing a store
/// - **Atomic per member**: each call decides on the member's state as one step, with the
///   rules of [`Reputation`] (a store elsewhere restates them, as the Redis store's script
///   does).
/// - **Each id once**: an event whose id the store counted before changes nothing and is
///   not in [`Recorded::new`]; remember at least the last [`SEEN_IDS`].
/// - **Errors are values**: a store that cannot be reached answers `Err`; the breaker then
///   decides from the tier it last knew, and a webhook receiver answers 5xx so that the
///   provider sends the events again.
///
/// # Example
/// ```
/// use mail_breaker::reputation::{
///     Counts, Heard, MemoryReputation, ReputationRules, ReputationStore, Signal, Tier,
/// };
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let store = MemoryReputation::new();
/// let rules = ReputationRules::default();
/// store.record("ses", &rules, 1_000, &[]).await?;
/// let bounces: Vec<Heard> = (0..41)
///     .map(|n| Heard { id: format!("bounce-{n}"), signal: Signal::HardBounce })
///     .collect();
/// let recorded = store.record("ses", &rules, 0, &bounces).await?;
/// assert_eq!(recorded.standing.tier, Tier::Open);
/// assert_eq!(recorded.new, 41);
/// # Ok::<(), mail_breaker::events::KeepError>(())
/// # }).unwrap();
/// ```
#[async_trait]
pub trait ReputationStore: Send + Sync + fmt::Debug + 'static {
    /// Counts `sends` sends for `member`, then each event of `heard` whose id is new, and
    /// decides the tier once.
    async fn record(
        &self,
        member: &str,
        rules: &ReputationRules,
        sends: u64,
        heard: &[Heard],
    ) -> Result<Recorded, KeepError>;

    /// Where `member` stands now; a member the store does not know is healthy.
    async fn standing(&self, member: &str, rules: &ReputationRules) -> Result<Standing, KeepError>;

    /// Clears `member`'s counts and closes its breaker, for every process sharing the store.
    async fn reset(&self, member: &str, rules: &ReputationRules) -> Result<TierChange, KeepError>;
}

/// A [`ReputationStore`] in this process's memory: the default, for one process. Share one
/// (`Arc`) among the breakers of a process; use a `RedisStore` to share them with a fleet.
///
/// ```
/// use std::sync::Arc;
/// use mail_breaker::reputation::{MemoryReputation, ReputationBreaker};
///
/// let store = Arc::new(MemoryReputation::new());
/// let ses = ReputationBreaker::builder("ses").store(store.clone()).build()?;
/// let postmark = ReputationBreaker::builder("postmark").store(store).build()?;
/// # Ok::<(), mail_breaker::ConfigError>(())
/// ```
#[derive(Debug, Default)]
pub struct MemoryReputation {
    members: Mutex<HashMap<String, Member>>,
}

#[derive(Debug)]
struct Member {
    reputation: Reputation,
    seen: HashSet<String>,
    /// The ids in `seen`, oldest first, to forget the oldest past [`SEEN_IDS`].
    order: VecDeque<String>,
}

impl Member {
    fn new(rules: &ReputationRules) -> Member {
        Member {
            reputation: Reputation::new(rules),
            seen: HashSet::new(),
            order: VecDeque::new(),
        }
    }

    /// Whether `id` is new, remembering it.
    fn first_time(&mut self, id: &str) -> bool {
        if self.seen.contains(id) {
            return false;
        }
        if self.order.len() >= SEEN_IDS
            && let Some(oldest) = self.order.pop_front()
        {
            self.seen.remove(&oldest);
        }
        self.seen.insert(id.to_owned());
        self.order.push_back(id.to_owned());
        true
    }
}

impl MemoryReputation {
    /// An empty store.
    pub fn new() -> MemoryReputation {
        MemoryReputation::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Member>> {
        // Each call changes one member in steps that cannot panic halfway.
        self.members.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl ReputationStore for MemoryReputation {
    async fn record(
        &self,
        member: &str,
        rules: &ReputationRules,
        sends: u64,
        heard: &[Heard],
    ) -> Result<Recorded, KeepError> {
        let mut members = self.lock();
        let entry = members
            .entry(member.to_owned())
            .or_insert_with(|| Member::new(rules));
        let mut counts = Counts::sends(sends);
        let mut new = 0;
        for event in heard {
            if !entry.first_time(&event.id) {
                continue;
            }
            new += 1;
            match event.signal {
                Signal::HardBounce => counts.hard_bounces += 1,
                Signal::Complaint => counts.complaints += 1,
            }
        }
        let change = entry.reputation.record(rules, counts);
        Ok(Recorded {
            standing: entry.reputation.standing(),
            change,
            new,
        })
    }

    async fn standing(
        &self,
        member: &str,
        _rules: &ReputationRules,
    ) -> Result<Standing, KeepError> {
        Ok(self
            .lock()
            .get(member)
            .map(|entry| entry.reputation.standing())
            .unwrap_or_default())
    }

    async fn reset(&self, member: &str, rules: &ReputationRules) -> Result<TierChange, KeepError> {
        let mut members = self.lock();
        let entry = members
            .entry(member.to_owned())
            .or_insert_with(|| Member::new(rules));
        // The ids stay: a resent old complaint must not count again after the reset.
        Ok(entry.reputation.reset())
    }
}
