//! [`MemoryStore`]: breaker state in this process.

use std::sync::{OnceLock, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::lru::BoundedMap;
use super::{BreakerStore, Reporter, StoreFuture};
use crate::State;
use crate::inline::InlineStr;
use crate::machine::{Counting, Decision, Machine, Outcome, Permit, Rules, Snapshot, Transitions};
use crate::sync::{AtomicU64, Mutex, MutexGuard, Ordering};

/// The default number of keys a [`MemoryStore`] tracks.
pub const DEFAULT_MAX_KEYS: usize = 10_000;

/// Breaker state kept in this process: the default store, one per breaker.
///
/// It tracks at most `max_keys` keys (default 10,000); past that it forgets the least
/// recently used closed breakers first, so memory stays bounded however many recipient
/// domains pass through. Each decision takes a lock for a few instructions and never
/// across an `.await`.
///
/// Counting failures in a row, a key is tracked from its first failure. Until then its
/// breaker is closed with nothing counted, which is what a key the store does not track
/// has anyway, so a send to it is decided on a new breaker that is not kept. Domains whose
/// sends only succeed thus take no place in the map, cost a lookup rather than an
/// insertion, and never push out a domain whose failures are being counted. Counting an
/// error rate, where a success counts too, a key is tracked from its first send.
///
/// # The first key
/// The first key a store decides on (under [`Scope::Transport`](crate::Scope::Transport),
/// the only one) is kept apart from the others and never forgotten; it counts towards
/// `max_keys` when that is 2 or more. While its breaker is closed with no failure counted
/// (under [`failure_threshold`](crate::breaker::CircuitBreakerBuilder::failure_threshold)
/// counting), a send through it and its success take no lock and read no clock: both
/// change nothing, and the store knows it from one atomic word.
///
/// ```
/// use std::sync::Arc;
/// use mail_breaker::{CircuitBreakerTransport, LettreTransport, MemoryStore, Scope};
/// # use lettre::transport::stub::AsyncStubTransport;
/// # let transport = LettreTransport::new(AsyncStubTransport::new_ok(), |_| unreachable!());
///
/// let breaker = CircuitBreakerTransport::builder(transport)
///     .scope(Scope::RecipientDomain)
///     .store(Arc::new(MemoryStore::with_max_keys(1_000)))
///     .build()
///     .unwrap();
/// ```
#[derive(Debug)]
pub struct MemoryStore {
    machines: Mutex<BoundedMap<Machine>>,
    /// Moves on, under the lock of `machines`, at every result that can leave a closed
    /// breaker there with something counted: a failure, or any result counted at a rate.
    /// A success for a key whose breaker was closed with nothing counted when it gave
    /// leave, with this unmoved since, changes nothing, and is answered without the lock
    /// (see [`LocalBreaker`]). Every other change (a reset, a trip, an isolation) moves the
    /// breaker's period on, and a result from an earlier period counts for nothing.
    changes: AtomicU64,
    /// The first key decided on, when `max_keys` leaves room for it beside the map.
    first: OnceLock<FirstKey>,
    keeps_first_apart: bool,
    /// The names of the breakers isolated as a whole (DESIGN §19): every key of theirs,
    /// also one first seen later, is refused until the isolation is lifted.
    isolated: Mutex<Vec<Box<str>>>,
    /// How many names `isolated` holds, written under its lock: every send reads this one
    /// word, and only while it is not 0 (an operator isolated something) looks further.
    isolations: AtomicU64,
}

/// The first key's breaker, with a word that says when sending through it changes nothing.
///
/// Aligned to whole cache lines, with short keys kept inline: every send reads the word and
/// the key, and a key on the heap shares its cache line with the small allocations that
/// other threads make and free on every send, which made two threads wait on each other.
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct FirstKey {
    key: InlineKey,
    /// `period + 1` while the breaker is closed in `period` with no failure counted in a
    /// row; 0 otherwise. Written only under `machine`'s lock, after each change.
    clean: AtomicU64,
    /// While the breaker is open for a time, 1 + the nanoseconds from `made` to the end of
    /// that time; 0 otherwise. Written only under `machine`'s lock, after each change, so a
    /// refusal needs no lock.
    open_until: AtomicU64,
    made: Instant,
    machine: Mutex<Machine>,
}

/// A key kept in place when it is short (a transport's name, a domain), else on the heap:
/// every send reads the first key, and on the heap it would share a cache line with the
/// small allocations other threads make.
type InlineKey = InlineStr<96>;

impl MemoryStore {
    /// A store that tracks up to 10,000 keys.
    pub fn new() -> Self {
        MemoryStore::with_max_keys(DEFAULT_MAX_KEYS)
    }

    /// A store that tracks up to `max_keys` keys (at least 1).
    pub fn with_max_keys(max_keys: usize) -> Self {
        let keeps_first_apart = max_keys >= 2;
        let in_map = if keeps_first_apart {
            max_keys - 1
        } else {
            max_keys
        };
        MemoryStore {
            machines: Mutex::new(BoundedMap::new(in_map)),
            changes: AtomicU64::new(0),
            first: OnceLock::new(),
            keeps_first_apart,
            isolated: Mutex::new(Vec::new()),
            isolations: AtomicU64::new(0),
        }
    }

    /// Whether the breaker named `breaker` is isolated as a whole: one atomic read while
    /// no breaker is.
    #[inline]
    pub(crate) fn isolates_whole(&self, breaker: &str) -> bool {
        self.isolations.load(Ordering::Acquire) != 0 && self.names_isolated(breaker)
    }

    /// Looks for `breaker` among the names isolated: out of line, off the common path.
    #[inline(never)]
    fn names_isolated(&self, breaker: &str) -> bool {
        lock(&self.isolated).iter().any(|name| **name == *breaker)
    }

    /// Isolates the breaker named `breaker` as a whole, or lifts that isolation.
    pub(crate) fn isolate_whole(&self, breaker: &str, isolated: bool) {
        let mut names = lock(&self.isolated);
        let found = names.iter().position(|name| **name == *breaker);
        match (isolated, found) {
            (true, None) => names.push(breaker.into()),
            (false, Some(at)) => {
                names.swap_remove(at);
            }
            _ => {}
        }
        // Under the lock, after the change: a reader that sees 0 finds no name to look for.
        self.isolations.store(names.len() as u64, Ordering::Release);
    }

    /// The first key's breaker if `key` is it; made from `key` if there is none yet and
    /// `make` is true.
    #[inline(always)]
    fn first(&self, key: &str, rules: &Rules, make: bool) -> Option<&FirstKey> {
        let first = match self.first.get() {
            Some(first) => first,
            None if make && self.keeps_first_apart => {
                self.first.get_or_init(|| FirstKey::new(key, rules))
            }
            None => return None,
        };
        first.key.is(key).then_some(first)
    }

    /// Runs `f` on the machine of `key`, made if missing, and marks the key used. A result
    /// that may leave a closed machine with something counted is recorded by
    /// [`LocalBreaker::record`], which moves `changes` on.
    fn with_machine<R>(&self, key: &str, rules: &Rules, f: impl FnOnce(&mut Machine) -> R) -> R {
        self.lock()
            .with(key, || Machine::closed(rules), is_closed, f)
    }

    /// Starts the breaker of `key` again from `state`: closed with nothing counted, or opened
    /// for a new reset timeout. For a store that falls back to local state, at the start of
    /// each outage, from the state it last saw elsewhere. Returns the changes, which the
    /// caller does not announce (they mirror changes already reported).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn restart_from(&self, key: &str, rules: &Rules, state: State) -> Transitions {
        let now = Instant::now();
        let restart = |machine: &mut Machine| {
            let mut transitions = machine.reset();
            if state != State::Closed {
                for change in machine.trip(rules, now).iter() {
                    transitions.push(change);
                }
            }
            transitions
        };
        match self.first(key, rules, true) {
            Some(first) => first.update(rules, restart),
            None => self.with_machine(key, rules, restart),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BoundedMap<Machine>> {
        lock(&self.machines)
    }

    /// [`BreakerStore::acquire`], answered at once: a breaker that owns its store calls
    /// this directly, without the trait object and its future.
    #[inline]
    pub(crate) fn acquire_now(&self, key: &str, rules: &Rules) -> (Decision, Transitions) {
        self.breaker_of(key, rules).acquire(key, rules)
    }

    /// [`BreakerStore::record`], answered at once (see [`acquire_now`](Self::acquire_now)).
    #[inline]
    pub(crate) fn record_now(
        &self,
        key: &str,
        rules: &Rules,
        permit: Permit,
        outcome: Outcome,
    ) -> Transitions {
        self.breaker_of(key, rules)
            .record(key, rules, permit, outcome)
    }

    /// The breaker of `key`, found once for both the acquire and the record of a send: the
    /// first key is told apart from the others by comparing the key once, not twice.
    #[inline]
    pub(crate) fn breaker_of(&self, key: &str, rules: &Rules) -> LocalBreaker<'_> {
        match self.first(key, rules, true) {
            Some(first) => LocalBreaker::First(first),
            None => LocalBreaker::InMap {
                store: self,
                clean_since: None,
            },
        }
    }
}

/// The breaker of one key in a [`MemoryStore`], as [`MemoryStore::breaker_of`] found it.
/// Its methods take the same key again.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LocalBreaker<'s> {
    /// The first key's, kept apart from the map.
    First(&'s FirstKey),
    /// One in the store's map, looked up (and marked used) at each call.
    InMap {
        store: &'s MemoryStore,
        /// The store's `changes` when this breaker last gave leave while closed with
        /// nothing counted: while they stay the same, a success of that send changes nothing.
        clean_since: Option<u64>,
    },
}

impl LocalBreaker<'_> {
    /// Leave to send (see [`BreakerStore::acquire`]).
    #[inline]
    pub(crate) fn acquire(&mut self, key: &str, rules: &Rules) -> (Decision, Transitions) {
        match self {
            LocalBreaker::First(first) => first.acquire(rules),
            LocalBreaker::InMap { store, clean_since } => {
                acquire_in_map(store, clean_since, key, rules)
            }
        }
    }

    /// Counts one result (see [`BreakerStore::record`]).
    #[inline]
    pub(crate) fn record(
        self,
        key: &str,
        rules: &Rules,
        permit: Permit,
        outcome: Outcome,
    ) -> Transitions {
        match self {
            LocalBreaker::First(first) => first.record(rules, permit, outcome),
            LocalBreaker::InMap { store, clean_since } => {
                let changes_nothing = outcome == Outcome::Success
                    && clean_since == Some(store.changes.load(Ordering::Acquire));
                if changes_nothing {
                    // Closed with nothing counted when it gave leave (so `permit` is not a
                    // probe's), and nothing that could count something has happened since.
                    return Transitions::NONE;
                }
                let counts_something = outcome == Outcome::Failure || !counts_in_a_row(rules);
                let record = |machine: &mut Machine| {
                    let transitions = machine.record_lazily(rules, Instant::now, permit, outcome);
                    if counts_something {
                        // Under the lock, after the change: see `MemoryStore::changes`.
                        store.changes.fetch_add(1, Ordering::Release);
                    }
                    transitions
                };
                if counts_something {
                    return store.with_machine(key, rules, record);
                }
                // A success, counting in a row: a key the store does not track has a new
                // breaker, which the success leaves new, so there is nothing to keep.
                store
                    .lock()
                    .with_existing(key, is_closed, record)
                    .unwrap_or(Transitions::NONE)
            }
        }
    }
}

impl MemoryStore {
    /// [`BreakerStore::release`], returning the changes it made.
    pub(crate) fn release_now(&self, key: &str, rules: &Rules, permit: Permit) -> Transitions {
        if !permit.is_probe() {
            return Transitions::NONE; // only a probe holds anything to give back
        }
        let now = Instant::now();
        match self.first.get().filter(|first| first.key.is(key)) {
            Some(first) => first.release(rules, now, permit),
            None => self
                .lock()
                .peek_mut(key, |machine| machine.release(rules, now, permit))
                .unwrap_or(Transitions::NONE),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The lock guards no invariant a panic could break halfway: machines change in place
    // by plain assignments, so a poisoned lock is still sound to use.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

/// What `Machine::acquire` decides, without reading the clock while closed: every send goes
/// through, in the current period, and nothing changes.
fn acquire(machine: &mut Machine, rules: &Rules) -> (Decision, Transitions) {
    if machine.state() == State::Closed {
        (
            Decision::Send(Permit::new(machine.period(), None)),
            Transitions::NONE,
        )
    } else {
        machine.acquire(rules, Instant::now())
    }
}

/// [`LocalBreaker::acquire`] for a key of the map: out of line, so that the first key's
/// path, which takes no lock, stays small enough to be inlined into the send.
fn acquire_in_map(
    store: &MemoryStore,
    clean_since: &mut Option<u64>,
    key: &str,
    rules: &Rules,
) -> (Decision, Transitions) {
    let mut decide = |machine: &mut Machine| {
        let answer = acquire(machine, rules);
        *clean_since = machine
            .ignores_a_success(rules)
            .then(|| store.changes.load(Ordering::Relaxed));
        answer
    };
    if !counts_in_a_row(rules) {
        return store.with_machine(key, rules, decide);
    }
    // A key the store does not track has a new breaker: closed, nothing counted. It lets
    // the send go, and counting in a row, a success would leave it new, so it is decided on
    // and not kept. The key is kept from its first failure (see `LocalBreaker::record`):
    // domains that only ever succeed take no place in the map, and cannot push out one
    // whose failures are being counted.
    let mut machines = store.lock();
    machines
        .with_existing(key, is_closed, &mut decide)
        .unwrap_or_else(|| decide(&mut Machine::closed(rules)))
}

/// Whether a breaker in the map may be forgotten first.
fn is_closed(machine: &Machine) -> bool {
    machine.state() == State::Closed
}

fn counts_in_a_row(rules: &Rules) -> bool {
    matches!(rules.counting, Counting::Consecutive { .. })
}

impl FirstKey {
    fn new(key: &str, rules: &Rules) -> Self {
        let machine = Machine::closed(rules);
        let clean = if counts_in_a_row(rules) {
            machine.period() + 1
        } else {
            0
        };
        FirstKey {
            key: InlineKey::new(key),
            clean: AtomicU64::new(clean),
            open_until: AtomicU64::new(0),
            made: Instant::now(),
            machine: Mutex::new(machine),
        }
    }

    fn acquire(&self, rules: &Rules) -> (Decision, Transitions) {
        let clean = self.clean.load(Ordering::Acquire);
        if clean != 0 {
            return (
                Decision::Send(Permit::new(clean - 1, None)),
                Transitions::NONE,
            );
        }
        if let Some(retry_after) = self.refuses_for() {
            // Open, and not yet at the end of its time: the machine would refuse for what is
            // left of it, and change nothing.
            return (Decision::Refuse { retry_after }, Transitions::NONE);
        }
        let mut machine = lock(&self.machine);
        let answer = acquire(&mut machine, rules);
        // The clean word needs no write: it is 0 whenever the machine is not closed (only a
        // result or a change closes or leaves the closed state, and both set it), and a
        // leave counts nothing.
        self.publish_open(&machine);
        answer
    }

    /// The time left while the breaker is open for a time, from `open_until`.
    fn refuses_for(&self) -> Option<Duration> {
        let until = self.open_until.load(Ordering::Acquire).checked_sub(1)?;
        let since_made = Instant::now()
            .saturating_duration_since(self.made)
            .as_nanos();
        let left = u128::from(until)
            .checked_sub(since_made)
            .filter(|&left| left > 0)?;
        Some(Duration::from_nanos(u64::try_from(left).ok()?))
    }

    /// Sets `open_until` to what `machine` now says; under its lock, after each change.
    fn publish_open(&self, machine: &Machine) {
        let word = machine
            .open_until()
            .and_then(|until| {
                u64::try_from(until.saturating_duration_since(self.made).as_nanos()).ok()
            })
            .and_then(|nanos| nanos.checked_add(1))
            .unwrap_or(0);
        self.open_until.store(word, Ordering::Release);
    }

    /// The permit of a send let go while the breaker is closed with no failure counted in a
    /// row, read from one word without the lock; `None` in any other state.
    #[inline]
    pub(crate) fn clean_permit(&self) -> Option<Permit> {
        let clean = self.clean.load(Ordering::Acquire);
        (clean != 0).then(|| Permit::new(clean - 1, None))
    }

    /// The key this breaker is for.
    pub(crate) fn key(&self) -> &str {
        self.key.as_str()
    }

    /// Counts one result (see [`BreakerStore::record`]).
    #[inline]
    pub(crate) fn record(&self, rules: &Rules, permit: Permit, outcome: Outcome) -> Transitions {
        if counts_in_a_row(rules)
            && outcome == Outcome::Success
            && !permit.is_probe()
            && self.clean.load(Ordering::Acquire) == permit.period() + 1
        {
            // A success in the period of a closed breaker with no failure in a row: the
            // machine would set its count of failures to the 0 it already is.
            return Transitions::NONE;
        }
        self.record_under_lock(rules, permit, outcome)
    }

    /// Counts one result that may change the machine.
    #[inline(never)]
    fn record_under_lock(&self, rules: &Rules, permit: Permit, outcome: Outcome) -> Transitions {
        let in_a_row = counts_in_a_row(rules);
        let now = Instant::now();
        let mut machine = lock(&self.machine);
        let before = machine.period();
        let transitions = machine.record(rules, now, permit, outcome);
        let counted = permit.period() == before;
        let clean = if machine.state() != State::Closed || !in_a_row {
            Some(0)
        } else if counted && outcome == Outcome::Success {
            // A success counted while closed, or the probe's that closed the breaker: no
            // failure is counted. (Only a counted success closes a breaker.)
            Some(machine.period() + 1)
        } else if counted {
            Some(0) // a failure counted while closed
        } else {
            None // from an earlier period: nothing changed
        };
        if let Some(clean) = clean {
            self.clean.store(clean, Ordering::Release);
        }
        self.publish_open(&machine);
        transitions
    }

    /// Changes the machine by `change`, then sets the word to what the machine now says.
    fn update<R>(&self, rules: &Rules, change: impl FnOnce(&mut Machine) -> R) -> R {
        let mut machine = lock(&self.machine);
        let result = change(&mut machine);
        let clean = if machine.state() == State::Closed
            && counts_in_a_row(rules)
            && machine.has_nothing_counted()
        {
            machine.period() + 1
        } else {
            0
        };
        self.clean.store(clean, Ordering::Release);
        self.publish_open(&machine);
        result
    }

    fn state(&self, rules: &Rules, now: Instant) -> (State, Transitions) {
        let mut machine = lock(&self.machine);
        // Time moves a machine between open and half-open, never into or out of closed: the
        // clean word stays as it is.
        let transitions = machine.expire(rules, now);
        self.publish_open(&machine);
        (machine.state(), transitions)
    }

    /// Gives back the probe of `permit` (see [`Machine::release`]).
    fn release(&self, rules: &Rules, now: Instant, permit: Permit) -> Transitions {
        let mut machine = lock(&self.machine);
        let transitions = machine.release(rules, now, permit);
        self.publish_open(&machine);
        transitions
    }
}

impl BreakerStore for MemoryStore {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        rules: &'a Rules,
        _late: &'a Reporter,
    ) -> StoreFuture<'a, (Decision, Transitions)> {
        StoreFuture::ready(self.acquire_now(key, rules))
    }

    fn record<'a>(
        &'a self,
        key: &'a str,
        rules: &'a Rules,
        permit: Permit,
        outcome: Outcome,
        _late: &'a Reporter,
    ) -> StoreFuture<'a, Transitions> {
        StoreFuture::ready(self.record_now(key, rules, permit, outcome))
    }

    fn release(&self, key: &str, rules: &Rules, permit: Permit, late: &Reporter) {
        late.report(key, self.release_now(key, rules, permit));
    }

    fn state(&self, key: &str, rules: &Rules) -> (State, Transitions) {
        let now = Instant::now();
        if let Some(first) = self.first(key, rules, false) {
            return first.state(rules, now);
        }
        self.lock()
            .peek_mut(key, |machine| {
                let transitions = machine.expire(rules, now);
                (machine.state(), transitions)
            })
            .unwrap_or((State::Closed, Transitions::NONE))
    }

    fn tracked_keys(&self) -> usize {
        self.lock().len() + usize::from(self.first.get().is_some())
    }

    fn snapshot<'a>(
        &'a self,
        key: &'a str,
        rules: &'a Rules,
        late: &'a Reporter,
    ) -> StoreFuture<'a, Snapshot> {
        let now = Instant::now();
        let take = |machine: &mut Machine| machine.snapshot(key, rules, now);
        let (snapshot, transitions) = match self.first(key, rules, false) {
            Some(first) => first.update(rules, take),
            None => self
                .lock()
                .peek_mut(key, take)
                .unwrap_or_else(|| Machine::new(rules, now).snapshot(key, rules, now)),
        };
        late.report(key, transitions);
        StoreFuture::ready(snapshot)
    }

    fn snapshots<'a>(
        &'a self,
        rules: &'a Rules,
        late: &'a Reporter,
    ) -> StoreFuture<'a, Vec<Snapshot>> {
        let now = Instant::now();
        let mut taken = Vec::new();
        if let Some(first) = self.first.get() {
            let key = first.key.as_str().to_owned();
            taken.push(first.update(rules, |machine| machine.snapshot(&key, rules, now)));
        }
        self.lock().for_each_mut(|key, machine| {
            taken.push(machine.snapshot(key, rules, now));
        });
        let snapshots = taken
            .into_iter()
            .map(|(snapshot, transitions)| {
                late.report(snapshot.key(), transitions);
                snapshot
            })
            .collect();
        StoreFuture::ready(snapshots)
    }

    fn isolate<'a>(
        &'a self,
        key: &'a str,
        rules: &'a Rules,
        _late: &'a Reporter,
    ) -> StoreFuture<'a, Transitions> {
        StoreFuture::ready(self.change(key, rules, Machine::isolate))
    }

    fn acquire_in<'a>(
        &'a self,
        breaker: &'a str,
        key: &'a str,
        rules: &'a Rules,
        _late: &'a Reporter,
    ) -> StoreFuture<'a, (Decision, Transitions)> {
        if self.isolates_whole(breaker) {
            return StoreFuture::ready((Decision::Isolated, Transitions::NONE));
        }
        StoreFuture::ready(self.acquire_now(key, rules))
    }

    fn isolate_breaker<'a>(
        &'a self,
        breaker: &'a str,
    ) -> StoreFuture<'a, Result<super::Reach, crate::SendError>> {
        self.isolate_whole(breaker, true);
        StoreFuture::ready(Ok(super::Reach::ThisProcess))
    }

    fn lift_isolation<'a>(
        &'a self,
        breaker: &'a str,
    ) -> StoreFuture<'a, Result<super::Reach, crate::SendError>> {
        self.isolate_whole(breaker, false);
        StoreFuture::ready(Ok(super::Reach::ThisProcess))
    }

    fn reset<'a>(
        &'a self,
        key: &'a str,
        rules: &'a Rules,
        _late: &'a Reporter,
    ) -> StoreFuture<'a, Transitions> {
        StoreFuture::ready(self.change(key, rules, Machine::reset))
    }
}

impl MemoryStore {
    /// Applies `change` to the machine of `key`, made if missing.
    pub(crate) fn change(
        &self,
        key: &str,
        rules: &Rules,
        change: impl FnOnce(&mut Machine) -> Transitions,
    ) -> Transitions {
        match self.first(key, rules, true) {
            Some(first) => first.update(rules, change),
            None => self.with_machine(key, rules, change),
        }
    }
}

#[cfg(all(test, mail_breaker_loom))]
#[path = "memory_loom.rs"]
mod loom_model;

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap};
    use std::time::Duration;

    use super::*;
    use crate::ErrorRate;

    /// Drives the store and one plain [`Machine`] per key with the same random events at the
    /// same times: the store's shortcuts (the first key's atomic word, the closed breaker
    /// decided without the clock) must answer exactly as the machines do.
    async fn store_decides_as_machines_do(rules: Rules, seed: u64) {
        let mut rng = fastrand::Rng::with_seed(seed);
        let store = MemoryStore::with_max_keys(8);
        let mut machines: HashMap<&str, Machine> = HashMap::new();
        // The keys the store keeps: the first it decides on, kept apart; counting a rate,
        // every key it decides on; counting in a row, a key from its first failure, since
        // until then its breaker is as a new one is.
        let mut kept: BTreeSet<&str> = BTreeSet::new();
        let counting_in_a_row = matches!(rules.counting, Counting::Consecutive { .. });
        // Each send's breaker is kept from its leave to its result, as a breaker's send keeps
        // it, or found again, as a store shared through the trait finds it.
        let mut out: Vec<(&str, Permit, LocalBreaker<'_>)> = Vec::new();
        for _ in 0..20_000 {
            // "steady" only ever succeeds.
            let key = ["first", "second", "third", "steady"][rng.usize(0..4)];
            let now = Instant::now();
            match rng.u8(0..10) {
                0..=3 => {
                    // A key the store does not track has a new machine.
                    let machine = machines
                        .entry(key)
                        .or_insert_with(|| Machine::new(&rules, now));
                    if kept.is_empty() || !counting_in_a_row {
                        kept.insert(key);
                    }
                    let expected = machine.acquire(&rules, now);
                    let mut breaker = store.breaker_of(key, &rules);
                    let got = if rng.bool() {
                        breaker.acquire(key, &rules)
                    } else {
                        store.acquire(key, &rules, &Reporter::none()).await
                    };
                    assert_eq!(got, expected, "acquire {key}");
                    if let (Decision::Send(permit), _) = got {
                        out.push((key, permit, breaker));
                    }
                }
                4..=7 if !out.is_empty() => {
                    let (key, permit, breaker) = out.swap_remove(rng.usize(..out.len()));
                    let outcome = if rng.u8(0..3) == 0 {
                        Outcome::Success
                    } else {
                        Outcome::Failure
                    };
                    let outcome = if rng.bool() || key == "steady" {
                        Outcome::Success
                    } else {
                        outcome
                    };
                    let machine = machines.get_mut(key).expect("acquired before");
                    let expected = machine.record(&rules, now, permit, outcome);
                    if outcome == Outcome::Failure {
                        kept.insert(key);
                    }
                    let got = if rng.bool() {
                        breaker.record(key, &rules, permit, outcome)
                    } else {
                        store
                            .record(key, &rules, permit, outcome, &Reporter::none())
                            .await
                    };
                    assert_eq!(got, expected, "record {key} {outcome:?}");
                }
                8 if !out.is_empty() => {
                    let (key, permit, _) = out.swap_remove(rng.usize(..out.len()));
                    let expected = machines
                        .get_mut(key)
                        .expect("acquired")
                        .release(&rules, now, permit);
                    assert_eq!(
                        store.release_now(key, &rules, permit),
                        expected,
                        "release {key}"
                    );
                }
                _ => {
                    let expected = match machines.get_mut(key) {
                        Some(machine) => {
                            let transitions = machine.expire(&rules, now);
                            (machine.state(), transitions)
                        }
                        None => (State::Closed, Transitions::NONE),
                    };
                    assert_eq!(store.state(key, &rules), expected, "state {key}");
                }
            }
            tokio::time::advance(Duration::from_millis(rng.u64(0..4_000))).await;
        }
        assert_eq!(store.tracked_keys(), kept.len());
    }

    #[tokio::test(start_paused = true)]
    async fn store_decides_as_machines_do_counting_in_a_row() {
        let rules = Rules {
            counting: Counting::Consecutive { threshold: 3 },
            reset_timeout: Duration::from_secs(20),
            probe_timeout: Duration::from_secs(10),
            half_open_successes: 2,
            max_reset_timeout: None,
        };
        for seed in 0..5 {
            store_decides_as_machines_do(rules, seed).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn store_decides_as_machines_do_counting_a_rate() {
        let rules = Rules {
            counting: Counting::ErrorRate(ErrorRate {
                threshold_percent: 50,
                minimum_requests: 4,
                window: Duration::from_secs(30),
                buckets: 3,
            }),
            reset_timeout: Duration::from_secs(20),
            probe_timeout: Duration::from_secs(10),
            half_open_successes: 1,
            max_reset_timeout: None,
        };
        for seed in 0..5 {
            store_decides_as_machines_do(rules, seed).await;
        }
    }

    /// The default rules, opening at `threshold` failures in a row.
    fn in_a_row(threshold: u32) -> Rules {
        Rules {
            counting: Counting::Consecutive { threshold },
            ..Rules::default()
        }
    }

    /// One send to `key` through the store, ending in `outcome`.
    fn send(store: &MemoryStore, key: &str, rules: &Rules, outcome: Outcome) {
        let mut breaker = store.breaker_of(key, rules);
        if let (Decision::Send(permit), _) = breaker.acquire(key, rules) {
            breaker.record(key, rules, permit, outcome);
        }
    }

    #[test]
    fn a_first_key_too_long_to_keep_in_place_is_still_found() {
        let rules = Rules::default();
        let long = "x".repeat(97);
        let store = MemoryStore::new();
        for key in [long.as_str(), "short"] {
            send(&store, key, &rules, Outcome::Failure);
        }
        assert!(store.first(&long, &rules, false).is_some());
        assert!(store.first(&long[1..], &rules, false).is_none());
        assert_eq!(store.tracked_keys(), 2);
    }

    #[test]
    fn the_first_key_counts_towards_max_keys() {
        let rules = Rules::default();
        let store = MemoryStore::with_max_keys(3);
        for key in ["a", "b", "c", "d", "e"] {
            send(&store, key, &rules, Outcome::Failure);
        }
        assert_eq!(store.tracked_keys(), 3);
        let alone = MemoryStore::with_max_keys(1);
        for key in ["a", "b"] {
            send(&alone, key, &rules, Outcome::Failure);
        }
        assert_eq!(alone.tracked_keys(), 1);
    }

    #[test]
    fn an_open_breaker_outlasts_closed_ones_when_the_map_is_full() {
        let rules = in_a_row(2);
        let store = MemoryStore::with_max_keys(4);
        send(&store, "first.example", &rules, Outcome::Failure);
        for _ in 0..2 {
            send(&store, "down.example", &rules, Outcome::Failure);
        }
        // Ten closed breakers, each with one failure counted, through the map's places.
        for i in 0..10 {
            send(&store, &format!("d{i}.example"), &rules, Outcome::Failure);
        }
        assert_eq!(store.tracked_keys(), 4);
        assert_eq!(store.state("down.example", &rules).0, State::Open);
        assert_eq!(store.state("d0.example", &rules).0, State::Closed);
        assert!(
            store.lock().peek_mut("d0.example", |_| ()).is_none(),
            "forgotten"
        );
    }

    #[test]
    fn counting_in_a_row_a_key_whose_sends_only_succeed_is_not_kept() {
        let rules = Rules::default();
        let store = MemoryStore::new();
        send(&store, "first.example", &rules, Outcome::Success);
        for _ in 0..3 {
            send(&store, "healthy.example", &rules, Outcome::Success);
        }
        assert_eq!(store.tracked_keys(), 1, "only the first key, kept apart");
        assert_eq!(store.state("healthy.example", &rules).0, State::Closed);
    }

    #[test]
    fn counting_in_a_row_a_key_is_kept_from_its_first_failure() {
        let rules = Rules::default();
        let store = MemoryStore::new();
        send(&store, "first.example", &rules, Outcome::Success);
        send(&store, "flaky.example", &rules, Outcome::Failure);
        assert_eq!(store.tracked_keys(), 2);
        let failures = |store: &MemoryStore| {
            let late = Reporter::none();
            let snapshot =
                futures::executor::block_on(store.snapshot("flaky.example", &rules, &late));
            snapshot.failures()
        };
        assert_eq!(failures(&store), 1);
        // A success clears the count and the key stays kept.
        send(&store, "flaky.example", &rules, Outcome::Success);
        assert_eq!(failures(&store), 0);
        assert_eq!(store.tracked_keys(), 2);
    }

    #[test]
    fn counting_a_rate_a_key_is_kept_from_its_first_send() {
        let rules = Rules {
            counting: Counting::ErrorRate(ErrorRate::default()),
            ..Rules::default()
        };
        let store = MemoryStore::new();
        for key in ["first.example", "healthy.example"] {
            send(&store, key, &rules, Outcome::Success);
        }
        assert_eq!(store.tracked_keys(), 2);
    }

    #[test]
    fn keys_that_only_succeed_never_push_out_the_count_of_one_that_fails() {
        let rules = in_a_row(3);
        let store = MemoryStore::with_max_keys(10);
        send(&store, "first.example", &rules, Outcome::Success);
        for _ in 0..2 {
            send(&store, "flaky.example", &rules, Outcome::Failure);
        }
        for i in 0..1_000 {
            send(&store, &format!("d{i}.example"), &rules, Outcome::Success);
        }
        send(&store, "flaky.example", &rules, Outcome::Failure);
        assert_eq!(store.state("flaky.example", &rules).0, State::Open);
    }

    #[test]
    fn a_first_key_gives_a_permit_from_its_word_only_while_closed_with_nothing_counted() {
        let rules = Rules::default();
        let store = MemoryStore::new();
        let first = store.first("smtp", &rules, true).expect("the first key");
        assert_eq!(first.key(), "smtp");
        let period = || lock(&first.machine).period();
        let clean = first.clean_permit().expect("made closed");
        assert_eq!((clean.period(), clean.is_probe()), (period(), false));

        let (_, permit) = leave(&store, "smtp", &rules);
        first.record(&rules, permit, Outcome::Failure);
        assert_eq!(first.clean_permit(), None, "a failure counted");

        store.change("smtp", &rules, Machine::reset);
        let clean = first.clean_permit().expect("reset: nothing counted");
        assert_eq!(clean.period(), period());
        assert_ne!(clean.period(), permit.period(), "a new period");
    }

    /// Leave for a send to `key` under `rules`, with the breaker that gave it.
    fn leave<'s>(store: &'s MemoryStore, key: &str, rules: &Rules) -> (LocalBreaker<'s>, Permit) {
        let mut breaker = store.breaker_of(key, rules);
        match breaker.acquire(key, rules) {
            (Decision::Send(permit), _) => (breaker, permit),
            (decision, _) => panic!("expected leave for {key}, got {decision:?}"),
        }
    }

    /// A store whose breakers open at two failures in a row, with its first key taken: the
    /// keys of the tests that use it are in the map.
    fn two_in_a_row() -> (MemoryStore, Rules) {
        let rules = in_a_row(2);
        let store = MemoryStore::new();
        leave(&store, "first", &rules);
        (store, rules)
    }

    #[test]
    fn a_success_after_another_sends_failure_still_clears_the_count() {
        let (store, rules) = two_in_a_row();
        let (fast, fast_permit) = leave(&store, "example.org", &rules);
        let (slow, slow_permit) = leave(&store, "example.org", &rules);
        slow.record("example.org", &rules, slow_permit, Outcome::Failure);
        fast.record("example.org", &rules, fast_permit, Outcome::Success);
        let (next, next_permit) = leave(&store, "example.org", &rules);
        next.record("example.org", &rules, next_permit, Outcome::Failure);
        assert_eq!(
            store.state("example.org", &rules).0,
            State::Closed,
            "one failure in a row of two"
        );
    }

    #[test]
    fn a_success_after_a_reset_of_its_breaker_counts_for_nothing() {
        let (store, rules) = two_in_a_row();
        let (before, before_permit) = leave(&store, "example.org", &rules);
        let (failing, failing_permit) = leave(&store, "example.org", &rules);
        store.change("example.org", &rules, Machine::reset);
        let (after, after_permit) = leave(&store, "example.org", &rules);
        after.record("example.org", &rules, after_permit, Outcome::Failure);
        before.record("example.org", &rules, before_permit, Outcome::Success);
        failing.record("example.org", &rules, failing_permit, Outcome::Failure);
        let (last, last_permit) = leave(&store, "example.org", &rules);
        last.record("example.org", &rules, last_permit, Outcome::Failure);
        assert_eq!(
            store.state("example.org", &rules).0,
            State::Open,
            "two failures in a row since the reset: the success before it cleared nothing"
        );
    }

    /// Runs `f` in another thread while this one holds `mutex`, and returns what it
    /// returned, or `None` if it waited for the lock.
    fn runs_while_held<T, R: Send>(mutex: &Mutex<T>, f: impl FnOnce() -> R + Send) -> Option<R> {
        std::thread::scope(|scope| {
            let held = lock(mutex);
            let (answer, answered) = std::sync::mpsc::channel();
            scope.spawn(move || {
                let _ = answer.send(f());
            });
            let got = answered.recv_timeout(Duration::from_secs(10)).ok();
            drop(held);
            got
        })
    }

    #[test]
    fn a_success_that_changes_nothing_takes_no_lock_whatever_other_successes_came_since() {
        let rules = Rules::default();
        let store = MemoryStore::new();
        leave(&store, "first", &rules);
        let (breaker, permit) = leave(&store, "example.org", &rules);
        let (_, other) = leave(&store, "example.org", &rules);
        // Found again, as a store shared through the trait finds it: under the lock.
        store.record_now("example.org", &rules, other, Outcome::Success);
        let recorded = runs_while_held(&store.machines, || {
            breaker.record("example.org", &rules, permit, Outcome::Success)
        });
        assert_eq!(recorded, Some(Transitions::NONE));
    }

    #[test]
    fn a_success_through_a_clean_first_key_takes_no_lock() {
        let rules = Rules::default();
        let store = MemoryStore::new();
        let (breaker, permit) = leave(&store, "smtp", &rules);
        let LocalBreaker::First(first) = breaker else {
            panic!("the first key decided on is kept apart");
        };
        let recorded = runs_while_held(&first.machine, || {
            first.record(&rules, permit, Outcome::Success)
        });
        assert_eq!(recorded, Some(Transitions::NONE));
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_key_is_clean_again_after_a_success_that_follows_a_failure_or_closes_it() {
        let (store, rules) = two_in_a_row();
        let first = store.first("first", &rules, false).expect("the first key");
        let send = |outcome| {
            let (_, permit) = leave(&store, "first", &rules);
            first.record(&rules, permit, outcome)
        };
        send(Outcome::Failure);
        assert_eq!(first.clean_permit(), None, "a failure counted");
        send(Outcome::Success);
        assert!(first.clean_permit().is_some(), "the success cleared it");

        send(Outcome::Failure);
        send(Outcome::Failure);
        assert_eq!(store.state("first", &rules).0, State::Open);
        tokio::time::advance(rules.reset_timeout).await;
        let closing = send(Outcome::Success);
        assert_eq!(
            closing.iter().last().map(|change| change.to),
            Some(State::Closed)
        );
        let clean = first.clean_permit().expect("closed by its probe");
        assert_eq!(clean.period(), lock(&first.machine).period());
    }

    /// A store under the default rules whose first key, `smtp`, is open.
    fn opened() -> (MemoryStore, Rules) {
        let (store, rules) = (MemoryStore::new(), Rules::default());
        open(&store, "smtp", &rules);
        (store, rules)
    }

    /// Opens the breaker of `key` with failures in a row (five open it under the default rules).
    fn open(store: &MemoryStore, key: &str, rules: &Rules) {
        for _ in 0..5 {
            if let (Decision::Send(permit), _) = store.acquire_now(key, rules) {
                store.record_now(key, rules, permit, Outcome::Failure);
            }
        }
        assert_eq!(store.state(key, rules).0, State::Open);
    }

    #[test]
    fn an_open_breaker_is_kept_while_closed_ones_come_and_go() {
        let rules = Rules::default();
        // The first key apart, and three in the map.
        let store = MemoryStore::with_max_keys(4);
        leave(&store, "first", &rules);
        open(&store, "down.example", &rules);
        for i in 0..10 {
            let key = format!("up{i}.example");
            let (breaker, permit) = leave(&store, &key, &rules);
            breaker.record(&key, &rules, permit, Outcome::Success);
        }
        assert_eq!(
            store.state("down.example", &rules).0,
            State::Open,
            "closed breakers are forgotten first"
        );
    }

    #[test]
    fn an_open_first_key_refuses_without_taking_its_lock() {
        let (store, rules) = opened();
        let first = store.first("smtp", &rules, false).expect("the first key");
        let refused = runs_while_held(&first.machine, || store.acquire_now("smtp", &rules).0);
        assert!(
            matches!(refused, Some(Decision::Refuse { retry_after })
                if retry_after > Duration::ZERO && retry_after <= rules.reset_timeout),
            "{refused:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_open_first_key_refuses_for_what_is_left_of_its_open_time() {
        let (store, rules) = opened();
        tokio::time::advance(Duration::from_millis(1_500)).await;
        let left = rules.reset_timeout - Duration::from_millis(1_500);
        let refusal = Decision::Refuse { retry_after: left };
        assert_eq!(store.acquire_now("smtp", &rules).0, refusal);
        tokio::time::advance(left - Duration::from_nanos(1)).await;
        let last = Decision::Refuse {
            retry_after: Duration::from_nanos(1),
        };
        assert_eq!(store.acquire_now("smtp", &rules).0, last);
    }

    #[tokio::test(start_paused = true)]
    async fn an_open_first_key_lets_a_probe_go_at_exactly_the_end_of_its_open_time() {
        let (store, rules) = opened();
        tokio::time::advance(rules.reset_timeout).await;
        let (decision, changes) = store.acquire_now("smtp", &rules);
        assert!(matches!(decision, Decision::Send(permit) if permit.is_probe()));
        assert!(!changes.is_empty(), "open to half-open");
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_key_reset_while_open_lets_the_next_send_go() {
        let (store, rules) = opened();
        store.restart_from("smtp", &rules, State::Closed);
        let (decision, _) = store.acquire_now("smtp", &rules);
        assert!(matches!(decision, Decision::Send(permit) if !permit.is_probe()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_key_whose_probe_is_given_back_after_its_deadline_refuses_again() {
        let (store, rules) = opened();
        tokio::time::advance(rules.reset_timeout).await;
        let (Decision::Send(probe), _) = store.acquire_now("smtp", &rules) else {
            panic!("a probe");
        };
        tokio::time::advance(rules.probe_timeout).await;
        store.release_now("smtp", &rules, probe);
        // The probe failed at its deadline, which is now: open again for the second time.
        let reopened = Decision::Refuse {
            retry_after: rules.open_time(2),
        };
        assert_eq!(store.acquire_now("smtp", &rules).0, reopened);
    }
}
