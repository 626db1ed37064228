//! The list in Redis, on the [`RedisStore`](crate::RedisStore)'s connection: every change one
//! Lua script (the rules of `rules.rs` restated there), so all or nothing; every key under one
//! hash tag, so that a cluster keeps the whole list on one node and a script touches one slot.
//!
//! Keys, under `mail-breaker:<namespace>:{suppression}`:
//! - `:entry:<address>`: a hash (`reason`, `provider`, `event_id`, `at`, `until`, empty for
//!   none), one per address;
//! - `:index`: a sorted set of the addresses, all of score 0, read in pages by `ZRANGEBYLEX`;
//! - `:events`: a sorted set of the events kept (`provider \n id \n recipient`) by when,
//!   those older than 30 days pruned;
//! - `:transient:<address>`: a sorted set of an address's transient bounces by time, which
//!   expires after the window unless a bounce comes.
//!
//! A script checks nothing that can fail after its first write: Redis keeps a failed script's
//! earlier writes, so each one reads what it needs first.

use std::time::Duration;

use ::redis::Script;
use async_trait::async_trait;

use super::rules::{self, Change, Millis, Planned};
use super::{Entry, Reason, Store, SuppressionError};
use crate::store::redis::Connection;

/// Applies events: `KEYS[1]` the events kept (a sorted set by the time kept), `KEYS[2]` the
/// index, then for each event its entry's and its transient bounces' keys. `ARGV`: now,
/// window, hold, limit, how long ids are kept, then for each
/// event provider, id, recipient, time and change (`bounced`, `complained`, `transient`,
/// `none`). Answers how many events were new.
const KEEP: &str = r#"
local now, window, hold, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now - tonumber(ARGV[5]))
local new = 0
local count = (#ARGV - 5) / 5
for i = 0, count - 1 do
  local a = 6 + i * 5
  local provider, id, recipient, at, change = ARGV[a], ARGV[a + 1], ARGV[a + 2], tonumber(ARGV[a + 3]), ARGV[a + 4]
  local entry, transient = KEYS[3 + i * 2], KEYS[4 + i * 2]
  local seen = provider .. "\n" .. id .. "\n" .. recipient
  if redis.call("ZADD", KEYS[1], "NX", now, seen) == 1 then
    new = new + 1
    local reason, hold_until = nil, nil
    if change == "bounced" or change == "complained" then
      reason = change
    elseif change == "transient" then
      redis.call("ZADD", transient, at, seen)
      redis.call("ZREMRANGEBYSCORE", transient, "-inf", now - window)
      redis.call("PEXPIRE", transient, window)
      local bounces = redis.call("ZCOUNT", transient, "(" .. (at - window), at)
      if bounces >= limit then
        reason, hold_until = "bounced", at + hold
      end
    end
    if reason then
      local current = redis.call("HGET", entry, "until")
      local replace = current == false
        or (current ~= "" and (hold_until == nil or hold_until > tonumber(current)))
      if replace then
        redis.call("DEL", entry)
        redis.call("HSET", entry, "reason", reason, "provider", provider, "event_id", id,
          "at", at, "until", hold_until and tostring(hold_until) or "")
        redis.call("ZADD", KEYS[2], 0, recipient)
      end
    end
  end
end
return new
"#;

/// Puts entries: `KEYS[1]` the index, then each entry's key. `ARGV`: replace (1 or 0), then
/// for each entry address, reason, provider, event id, at and until (empty for none). An
/// entry for good is left as it is unless replacing. Answers how many were written.
const PUT: &str = r#"
local replace = ARGV[1] == "1"
local written = 0
local count = (#ARGV - 1) / 6
for i = 0, count - 1 do
  local a = 2 + i * 6
  local entry = KEYS[2 + i]
  local current = redis.call("HGET", entry, "until")
  if replace or current == false or current ~= "" then
    redis.call("DEL", entry)
    redis.call("HSET", entry, "reason", ARGV[a + 1], "provider", ARGV[a + 2],
      "event_id", ARGV[a + 3], "at", ARGV[a + 4], "until", ARGV[a + 5])
    redis.call("ZADD", KEYS[1], 0, ARGV[a])
    written = written + 1
  end
end
return written
"#;

/// Removes an address: `KEYS` its entry, the index, its transient bounces; `ARGV[1]` the
/// address. Answers 1 when it was on the list.
const REMOVE: &str = r#"
local had = redis.call("DEL", KEYS[1])
redis.call("ZREM", KEYS[2], ARGV[1])
redis.call("DEL", KEYS[3])
return had
"#;

/// The Redis list: its connection, key prefix and bound on each call.
pub(crate) struct RedisList {
    connection: Connection,
    prefix: String,
    timeout: Duration,
}

impl std::fmt::Debug for RedisList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisList")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisList {
    pub(crate) fn new(store: &crate::RedisStore) -> RedisList {
        // Braces in the namespace would move the hash tag.
        let namespace: String = store
            .namespace()
            .chars()
            .map(|c| if matches!(c, '{' | '}') { '_' } else { c })
            .collect();
        RedisList {
            connection: store.connection(),
            prefix: format!("mail-breaker:{namespace}:{{suppression}}"),
            timeout: store.timeout(),
        }
    }

    fn entry_key(&self, address: &str) -> String {
        format!("{}:entry:{address}", self.prefix)
    }

    fn transient_key(&self, address: &str) -> String {
        format!("{}:transient:{address}", self.prefix)
    }

    fn index_key(&self) -> String {
        format!("{}:index", self.prefix)
    }

    fn events_key(&self) -> String {
        format!("{}:events", self.prefix)
    }

    /// Awaits `call` within the store's timeout.
    async fn bounded<T>(
        &self,
        doing: &'static str,
        call: impl std::future::Future<Output = ::redis::RedisResult<T>>,
    ) -> Result<T, SuppressionError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(store_error(doing, &error)),
            Err(_) => Err(SuppressionError::Store {
                doing,
                reason: format!("Redis did not answer within {:?}", self.timeout),
            }),
        }
    }

    /// Runs a script bounded by the store's timeout.
    async fn run<T: ::redis::FromRedisValue>(
        &self,
        doing: &'static str,
        invocation: &::redis::ScriptInvocation<'_>,
    ) -> Result<T, SuppressionError> {
        let mut connection = self.connection.clone();
        self.bounded(doing, invocation.invoke_async(&mut connection))
            .await
    }

    /// The entries of `addresses`, as stored (expired holds included), in one pipeline.
    async fn read(&self, addresses: &[String]) -> Result<Vec<Option<Entry>>, SuppressionError> {
        if addresses.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = ::redis::pipe();
        for address in addresses {
            pipe.hgetall(self.entry_key(address));
        }
        let mut connection = self.connection.clone();
        let hashes: Vec<Vec<(String, String)>> = self
            .bounded("looking addresses up", pipe.query_async(&mut connection))
            .await?;
        addresses
            .iter()
            .zip(hashes)
            .map(|(address, fields)| entry(address, &fields))
            .collect()
    }
}

fn store_error(doing: &'static str, error: &::redis::RedisError) -> SuppressionError {
    SuppressionError::Store {
        doing,
        reason: error.to_string(),
    }
}

/// An entry read from its hash; `None` for an empty hash (no entry).
fn entry(address: &str, fields: &[(String, String)]) -> Result<Option<Entry>, SuppressionError> {
    if fields.is_empty() {
        return Ok(None);
    }
    let field = |name: &str| {
        fields
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
            .filter(|value| !value.is_empty())
    };
    let corrupt = |what: &str| SuppressionError::Store {
        doing: "reading an entry",
        reason: format!("the entry of an address has {what}"),
    };
    let reason = field("reason")
        .and_then(Reason::from_export)
        .ok_or_else(|| corrupt("no reason the list knows"))?;
    let at = field("at")
        .and_then(|at| at.parse::<Millis>().ok())
        .ok_or_else(|| corrupt("no time"))?;
    let until = match field("until") {
        None => None,
        Some(until) => Some(
            until
                .parse::<Millis>()
                .map_err(|_| corrupt("an end of hold that is no time"))?,
        ),
    };
    Ok(Some(Entry {
        address: address.to_owned(),
        reason,
        provider: field("provider").map(str::to_owned),
        event_id: field("event_id").map(str::to_owned),
        at,
        until,
    }))
}

/// Whether `entry` is in force at `now`.
fn in_force(entry: &Entry, now: Millis) -> bool {
    entry.until.is_none_or(|until| until > now)
}

#[async_trait]
impl Store for RedisList {
    async fn keep(&self, events: &[Planned], now: Millis) -> Result<usize, SuppressionError> {
        if events.is_empty() {
            return Ok(0);
        }
        let script = Script::new(KEEP);
        let mut invocation = script.key(self.events_key());
        invocation.key(self.index_key());
        invocation
            .arg(now)
            .arg(rules::TRANSIENT_WINDOW)
            .arg(rules::TRANSIENT_HOLD)
            .arg(rules::TRANSIENT_LIMIT)
            .arg(rules::EVENT_MEMORY);
        for event in events {
            invocation
                .key(self.entry_key(&event.recipient))
                .key(self.transient_key(&event.recipient));
            let change = match event.change {
                Change::Suppress(reason) => reason.as_str(),
                Change::CountTransient => "transient",
                Change::Nothing => "none",
            };
            invocation
                .arg(event.provider)
                .arg(event.event_id.as_str())
                .arg(event.recipient.as_str())
                .arg(event.at)
                .arg(change);
        }
        let new: i64 = self.run("keeping delivery events", &invocation).await?;
        Ok(usize::try_from(new).unwrap_or(0))
    }

    async fn put(&self, entries: &[Entry], replace: bool) -> Result<usize, SuppressionError> {
        if entries.is_empty() {
            return Ok(0);
        }
        let script = Script::new(PUT);
        let mut invocation = script.key(self.index_key());
        invocation.arg(if replace { "1" } else { "0" });
        for entry in entries {
            invocation.key(self.entry_key(&entry.address));
            invocation
                .arg(entry.address.as_str())
                .arg(entry.reason.as_str())
                .arg(entry.provider.as_deref().unwrap_or(""))
                .arg(entry.event_id.as_deref().unwrap_or(""))
                .arg(entry.at)
                .arg(
                    entry
                        .until
                        .map(|until| until.to_string())
                        .unwrap_or_default(),
                );
        }
        let written: i64 = self.run("adding addresses", &invocation).await?;
        Ok(usize::try_from(written).unwrap_or(0))
    }

    async fn remove(&self, address: &str) -> Result<bool, SuppressionError> {
        let script = Script::new(REMOVE);
        let mut invocation = script.key(self.entry_key(address));
        invocation
            .key(self.index_key())
            .key(self.transient_key(address))
            .arg(address);
        let had: i64 = self.run("removing an address", &invocation).await?;
        Ok(had > 0)
    }

    async fn find(
        &self,
        addresses: &[String],
        now: Millis,
    ) -> Result<Vec<Entry>, SuppressionError> {
        Ok(self
            .read(addresses)
            .await?
            .into_iter()
            .flatten()
            .filter(|entry| in_force(entry, now))
            .collect())
    }

    async fn page(
        &self,
        after: Option<&str>,
        limit: u32,
        now: Millis,
    ) -> Result<Vec<Entry>, SuppressionError> {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let mut page = Vec::new();
        let mut from = after.map_or_else(|| "-".to_owned(), |after| format!("({after}"));
        // Holds that ran out are still indexed: read on until the page is full or the
        // index ends, so that an empty page always means the end.
        while page.len() < limit {
            let want = (limit - page.len()).clamp(1, 500);
            let mut connection = self.connection.clone();
            let command = ::redis::cmd("ZRANGEBYLEX")
                .arg(self.index_key())
                .arg(&from)
                .arg("+")
                .arg("LIMIT")
                .arg(0)
                .arg(want)
                .to_owned();
            let addresses: Vec<String> = self
                .bounded(
                    "reading a page of the list",
                    command.query_async(&mut connection),
                )
                .await?;
            let Some(last) = addresses.last() else { break };
            from = format!("({last}");
            let read = addresses.len();
            let entries = self.read(&addresses).await?;
            page.extend(
                entries
                    .into_iter()
                    .flatten()
                    .filter(|entry| in_force(entry, now)),
            );
            if read < want {
                break;
            }
        }
        page.truncate(limit);
        Ok(page)
    }

    async fn search(
        &self,
        text: &str,
        limit: u32,
        now: Millis,
    ) -> Result<Vec<Entry>, SuppressionError> {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let pattern = format!("*{}*", glob_text(text));
        let mut found = Vec::new();
        let mut cursor: u64 = 0;
        // ZSCAN filters on the server; each call reads about 500 of the index. It goes on
        // until `limit` entries in force are found or the index ends.
        loop {
            let mut connection = self.connection.clone();
            let command = ::redis::cmd("ZSCAN")
                .arg(self.index_key())
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(500)
                .to_owned();
            let (next, scored): (u64, Vec<String>) = self
                .bounded("searching the list", command.query_async(&mut connection))
                .await?;
            // ZSCAN answers each member followed by its score.
            let addresses: Vec<String> = scored.into_iter().step_by(2).collect();
            let entries = self.read(&addresses).await?;
            found.extend(
                entries
                    .into_iter()
                    .flatten()
                    .filter(|entry| in_force(entry, now)),
            );
            // A cursor of 0 is the end of the index: another call would start it again.
            if next == 0 {
                break;
            }
            if found.len() >= limit {
                break;
            }
            cursor = next;
        }
        found.sort_by(|a, b| a.address.cmp(&b.address));
        found.dedup_by(|a, b| a.address == b.address);
        found.truncate(limit);
        Ok(found)
    }
}

/// `text` as the inside of a Redis glob: `*`, `?`, `[`, `]` and `\` matched as written,
/// and each letter A to Z as `[aA]`, without case.
fn glob_text(text: &str) -> String {
    let mut glob = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        if c.is_ascii_alphabetic() {
            glob.push('[');
            glob.push(c.to_ascii_lowercase());
            glob.push(c.to_ascii_uppercase());
            glob.push(']');
        } else {
            if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^' | '-') {
                glob.push('\\');
            }
            glob.push(c);
        }
    }
    glob
}
