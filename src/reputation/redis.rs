//! The reputation breaker's state in Redis, shared by a fleet: one hash per member and the
//! ids it counted beside it, changed by one script call (`reputation.lua`, beside this file)
//! on the connection of a [`RedisStore`] and with its timeout. Events heard by any process
//! open the breaker for all; a reset by any closes it for all.

use std::sync::LazyLock;
use std::time::Duration;

use ::redis::Script;
use async_trait::async_trait;

use super::rules::ReputationRules;
use super::store::{Heard, Recorded, ReputationStore, SEEN_IDS, Signal};
use super::window::{Counts, Standing, Tier, TierChange};
use crate::RedisStore;
use crate::events::KeepError;
use crate::store::redis::reputation_key;

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("reputation.lua")));

/// How long the ids counted stay after the last event: providers resend within a day.
const SEEN_FOR: Duration = Duration::from_secs(7 * 24 * 3_600);

/// What the script answered: the tiers before and after, the window, the events new.
struct Answer {
    change: TierChange,
    standing: Standing,
    new: usize,
}

async fn call(
    store: &RedisStore,
    op: &str,
    member: &str,
    rules: &ReputationRules,
    sends: u64,
    heard: &[Heard],
) -> Result<Answer, KeepError> {
    let key = reputation_key(store.namespace(), member);
    let mut invocation = SCRIPT.key(&key);
    invocation.key(format!("{key}:seen"));
    invocation
        .arg(op)
        .arg(rules.window_sends)
        .arg(rules.buckets)
        .arg(rules.hard_bounces.warn)
        .arg(rules.hard_bounces.throttle)
        .arg(rules.hard_bounces.open)
        .arg(rules.hard_bounces.minimum_sends)
        .arg(rules.complaints.warn)
        .arg(rules.complaints.throttle)
        .arg(rules.complaints.open)
        .arg(rules.complaints.minimum_sends)
        .arg(sends)
        .arg(SEEN_IDS)
        .arg(u64::try_from(SEEN_FOR.as_millis()).unwrap_or(u64::MAX));
    for event in heard {
        let signal = match event.signal {
            Signal::HardBounce => "b",
            Signal::Complaint => "c",
        };
        invocation.arg(signal).arg(&event.id);
    }
    let mut connection = store.connection();
    let reply: Result<Result<Vec<i64>, _>, _> =
        tokio::time::timeout(store.timeout(), invocation.invoke_async(&mut connection)).await;
    let values = match reply {
        Ok(Ok(values)) => values,
        Ok(Err(error)) => {
            return Err(KeepError::new(format!(
                "the reputation of {member} could not be kept in Redis: {error}"
            )));
        }
        Err(_) => {
            return Err(KeepError::new(format!(
                "Redis did not answer for the reputation of {member} within {:?}",
                store.timeout()
            )));
        }
    };
    let [from, to, sends, hard_bounces, complaints, new] = values[..] else {
        return Err(KeepError::new(format!(
            "the reputation script answered {} numbers, not 6",
            values.len()
        )));
    };
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    let to = Tier::from_number(to);
    Ok(Answer {
        change: TierChange {
            from: Tier::from_number(from),
            to,
        },
        standing: Standing {
            tier: to,
            window: Counts {
                sends: count(sends),
                hard_bounces: count(hard_bounces),
                complaints: count(complaints),
            },
        },
        new: usize::try_from(new).unwrap_or(0),
    })
}

/// The reputation of each member in Redis, for every process sharing the store: one hash per
/// member and the ids it counted beside it, changed by one script call on the connection of a
/// [`RedisStore`]. A Redis that does not answer within the store's timeout is an error: the
/// breaker then decides from the tier it last heard, and a webhook receiver answers 5xx.
///
/// ```no_run
/// use std::sync::Arc;
/// use mail_breaker::RedisStore;
/// use mail_breaker::reputation::ReputationBreaker;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = Arc::new(RedisStore::connect("redis://127.0.0.1:6379").await?);
/// let ses = ReputationBreaker::builder("ses").store(store).build()?;
/// # Ok(())
/// # }
/// ```
#[async_trait]
impl ReputationStore for RedisStore {
    async fn record(
        &self,
        member: &str,
        rules: &ReputationRules,
        sends: u64,
        heard: &[Heard],
    ) -> Result<Recorded, KeepError> {
        let answer = call(self, "record", member, rules, sends, heard).await?;
        Ok(Recorded {
            standing: answer.standing,
            change: answer.change,
            new: answer.new,
        })
    }

    async fn standing(&self, member: &str, rules: &ReputationRules) -> Result<Standing, KeepError> {
        Ok(call(self, "standing", member, rules, 0, &[])
            .await?
            .standing)
    }

    async fn reset(&self, member: &str, rules: &ReputationRules) -> Result<TierChange, KeepError> {
        Ok(call(self, "reset", member, rules, 0, &[]).await?.change)
    }
}
