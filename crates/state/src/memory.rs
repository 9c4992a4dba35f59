//! The in-process store: one replica's state, in its memory.
//!
//! Plugins' state is split into shards by a hash of the scope, each behind
//! its own lock, so that plugins seldom wait for each other; one plugin's
//! state is all in one shard, and every call takes its shard's lock once,
//! which makes the call atomic. Calls do their work when made: the futures
//! they return are ready.
//!
//! Counters and entries that stopped counting are dropped: a key's dead
//! counters when a reserve names the key, an entry found expired when it is
//! read, a plugin's whole state when a call would put it past a cap, and a
//! shard's whole state every [`SWEEP_EVERY`] calls to it (and at
//! [`MemoryStore::sweep`]), so state that nobody reads again still goes.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::window::{Buckets, MAX_UNIX_MS};
use crate::{BoxFuture, Charge, Check, Limits, Reserved, Scope, Standing, StateError, Store, Ticket, Window};

/// Locks plugins' state is split across.
const SHARDS: usize = 16;

/// Calls to a shard between sweeps of all of it.
pub const SWEEP_EVERY: u32 = 4096;

/// What a counter's value counts against a plugin's bytes, beside its key.
const COUNTER_VALUE_BYTES: usize = 8;

/// Plugins' shared state in this process's memory: for a gateway of one
/// replica (replicas do not see each other's).
pub struct MemoryStore {
    limits: Limits,
    hasher: RandomState,
    shards: [Mutex<Shard>; SHARDS],
    /// What all plugins hold, and each namespace's plugins: taken after a
    /// shard's lock, never before.
    shares: Mutex<Shares>,
}

/// The store's keys and bytes, in total and by namespace. A call may add no
/// more than the room left when it starts; calls on other shards that start
/// meanwhile see the same room, so the store can pass its total (or a
/// namespace its share) by at most one call's growth (a value and its key,
/// or a reserve's counters) per call running at once.
#[derive(Default)]
struct Shares {
    total: Held,
    namespaces: HashMap<Arc<str>, Held>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Held {
    keys: usize,
    bytes: usize,
}

impl Shares {
    /// The keys and bytes `namespace` may still add.
    fn room(&self, namespace: &str, limits: &Limits) -> Held {
        let held = self.namespaces.get(namespace).copied().unwrap_or_default();
        Held {
            keys: limits
                .max_keys_total
                .saturating_sub(self.total.keys)
                .min(limits.namespace_keys().saturating_sub(held.keys)),
            bytes: limits
                .max_bytes_total
                .saturating_sub(self.total.bytes)
                .min(limits.namespace_bytes().saturating_sub(held.bytes)),
        }
    }

    /// A plugin of `namespace` went from holding `before` to `after`.
    fn moved(&mut self, namespace: &Arc<str>, before: Held, after: Held) {
        if before == after {
            return;
        }
        let held = self.namespaces.entry(Arc::clone(namespace)).or_default();
        held.keys = held.keys.saturating_add(after.keys).saturating_sub(before.keys);
        held.bytes = held.bytes.saturating_add(after.bytes).saturating_sub(before.bytes);
        let total = &mut self.total;
        total.keys = total.keys.saturating_add(after.keys).saturating_sub(before.keys);
        total.bytes = total.bytes.saturating_add(after.bytes).saturating_sub(before.bytes);
        if *held == Held::default() {
            self.namespaces.remove(namespace);
        }
    }
}

/// How much of the store a plugin holds, counting what has expired but not
/// yet been dropped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Counters (one per bucket) and entries.
    pub keys: usize,
    /// Their keys and values.
    pub bytes: usize,
}

#[derive(Default)]
struct Shard {
    plugins: HashMap<ScopeId, Plugin>,
    calls: u32,
}

/// A scope's identity: its names as a pair, never joined into one string,
/// so no two scopes can share state.
#[derive(Clone, PartialEq, Eq, Hash)]
struct ScopeId {
    namespace: Arc<str>,
    plugin: Arc<str>,
}

impl ScopeId {
    fn of(scope: &Scope) -> Self {
        ScopeId { namespace: Arc::clone(&scope.namespace), plugin: Arc::clone(&scope.plugin) }
    }
}

/// One plugin's counters and entries, and their totals against its caps.
#[derive(Default)]
struct Plugin {
    /// A key's counters: a few (a bucket or two of each window it is
    /// counted in), so a list.
    counters: HashMap<Box<str>, Vec<Counter>>,
    entries: HashMap<Box<str>, Entry>,
    keys: usize,
    bytes: usize,
}

struct Counter {
    window: Window,
    bucket: u64,
    count: u64,
    /// When the bucket stops counting ([`Window::expires_unix_ms`]).
    expires_ms: u64,
}

struct Entry {
    value: Box<[u8]>,
    expires_ms: u64,
}

/// A plugin's caps: the store's, or its scope's where lower, and the room
/// its namespace's share leaves.
#[derive(Clone, Copy)]
struct Caps {
    keys: usize,
    bytes: usize,
    /// Whether `keys` and `bytes` are the namespace's room, not the
    /// plugin's caps.
    keys_are_share: bool,
    bytes_are_share: bool,
    /// A namespace's share and the store's totals, for the refusal.
    share: (Held, Held),
}

fn counter_bytes(key: &str) -> usize {
    key.len().saturating_add(COUNTER_VALUE_BYTES)
}

fn entry_bytes(key: &str, value: &[u8]) -> usize {
    key.len().saturating_add(value.len())
}

impl MemoryStore {
    pub fn new(limits: Limits) -> Self {
        MemoryStore {
            limits,
            hasher: RandomState::new(),
            shards: std::array::from_fn(|_| Mutex::default()),
            shares: Mutex::default(),
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Drops every counter and entry that stopped counting by
    /// `now_unix_ms`; how many. Calls do this from time to time anyway; a
    /// task may call it to free idle plugins' state sooner.
    pub fn sweep(&self, now_unix_ms: u64) -> usize {
        let now = now_unix_ms.min(MAX_UNIX_MS);
        self.shards.iter().map(|shard| shard.lock().sweep(now, &self.shares)).sum()
    }

    /// How much `scope` holds.
    pub fn usage(&self, scope: &Scope) -> Usage {
        let id = ScopeId::of(scope);
        let shard = self.shard(&id).lock();
        shard.plugins.get(&id).map_or_else(Usage::default, |plugin| Usage { keys: plugin.keys, bytes: plugin.bytes })
    }

    fn shard(&self, id: &ScopeId) -> &Mutex<Shard> {
        // Less than SHARDS, so in bounds.
        let index = self.hasher.hash_one(id) % SHARDS as u64;
        &self.shards[index as usize]
    }

    /// Runs `call` on `scope`'s state (made if it has none), under its
    /// shard's lock; sweeps the shard every [`SWEEP_EVERY`] calls, and
    /// drops the plugin's state if it is left empty.
    fn with_plugin<R>(&self, scope: &Scope, now: u64, call: impl FnOnce(&mut Plugin, Caps) -> R) -> R {
        let id = ScopeId::of(scope);
        let mut shard = self.shard(&id).lock();
        shard.calls = shard.calls.wrapping_add(1);
        if shard.calls.is_multiple_of(SWEEP_EVERY) {
            shard.sweep(now, &self.shares);
        }
        let plugin = shard.plugins.entry(id.clone()).or_default();
        let before = plugin.held();
        let room = self.shares.lock().room(&id.namespace, &self.limits);
        let (keys, bytes) = (self.limits.max_keys(scope), self.limits.max_bytes(scope));
        let (keys_room, bytes_room) = (before.keys.saturating_add(room.keys), before.bytes.saturating_add(room.bytes));
        let caps = Caps {
            keys: keys.min(keys_room),
            bytes: bytes.min(bytes_room),
            keys_are_share: keys_room < keys,
            bytes_are_share: bytes_room < bytes,
            share: (
                Held { keys: self.limits.namespace_keys(), bytes: self.limits.namespace_bytes() },
                Held { keys: self.limits.max_keys_total, bytes: self.limits.max_bytes_total },
            ),
        };
        let result = call(plugin, caps);
        let after = plugin.held();
        if plugin.is_empty() {
            shard.plugins.remove(&id);
        }
        self.shares.lock().moved(&id.namespace, before, after);
        result
    }

    fn reserve_at(&self, scope: &Scope, checks: &[Check], now: u64) -> Result<Reserved, StateError> {
        self.limits.check_checks(checks)?;
        let now = now.min(MAX_UNIX_MS);
        self.with_plugin(scope, now, |plugin, caps| plugin.reserve(checks, now, caps))
    }

    fn commit_at(&self, scope: &Scope, ticket: &Ticket, actual: &[u64]) -> Result<(), StateError> {
        if actual.len() > ticket.len() {
            return Err(StateError::TooManyAmounts { given: actual.len(), counters: ticket.len() });
        }
        let id = ScopeId::of(scope);
        let mut shard = self.shard(&id).lock();
        // No state: every counter has stopped counting and gone.
        let Some(plugin) = shard.plugins.get_mut(&id) else { return Ok(()) };
        for (index, charge) in ticket.charges().iter().enumerate() {
            let actual = actual.get(index).copied().unwrap_or(charge.reserved);
            plugin.adjust(charge, actual);
        }
        Ok(())
    }

    fn get_at(&self, scope: &Scope, key: &str, now: u64) -> Result<Option<Vec<u8>>, StateError> {
        self.limits.check_key(key)?;
        let now = now.min(MAX_UNIX_MS);
        Ok(self.with_plugin(scope, now, |plugin, _| plugin.live_entry(key, now).map(|entry| entry.value.to_vec())))
    }

    /// Sets `key` if `expected` is `Some` and matches; whether it did.
    fn set_at(
        &self,
        scope: &Scope,
        key: &str,
        expected: Option<Option<&[u8]>>,
        value: &[u8],
        ttl_ms: u64,
        now: u64,
    ) -> Result<bool, StateError> {
        self.limits.check_key(key)?;
        self.limits.check_value(value)?;
        let now = now.min(MAX_UNIX_MS);
        let expires_ms = now.saturating_add(self.limits.ttl_ms(ttl_ms));
        self.with_plugin(scope, now, |plugin, caps| {
            if let Some(expected) = expected {
                let current = plugin.live_entry(key, now).map(|entry| &*entry.value);
                if current != expected {
                    return Ok(false);
                }
            }
            plugin.put_entry(key, value, expires_ms, now, caps)?;
            Ok(true)
        })
    }

    fn delete_at(&self, scope: &Scope, key: &str, now: u64) -> Result<bool, StateError> {
        self.limits.check_key(key)?;
        let now = now.min(MAX_UNIX_MS);
        Ok(self.with_plugin(scope, now, |plugin, _| {
            let live = plugin.live_entry(key, now).is_some();
            if live {
                plugin.remove_entry(key);
            }
            live
        }))
    }

    /// The count in one bucket of a counter, if it is kept.
    #[cfg(test)]
    fn count(&self, scope: &Scope, key: &str, window: Window, bucket: u64) -> Option<u64> {
        let id = ScopeId::of(scope);
        let shard = self.shard(&id).lock();
        let counters = shard.plugins.get(&id)?.counters.get(key)?;
        counters.iter().find(|counter| counter.window == window && counter.bucket == bucket).map(|c| c.count)
    }
}

impl Store for MemoryStore {
    fn kind(&self) -> &'static str {
        "in-process"
    }

    fn caps(&self, scope: &Scope) -> (usize, usize) {
        (self.limits.max_keys(scope), self.limits.max_bytes(scope))
    }

    fn sweep(&self, now_unix_ms: u64) -> usize {
        MemoryStore::sweep(self, now_unix_ms)
    }

    fn reserve<'a>(
        &'a self,
        scope: &'a Scope,
        checks: &'a [Check],
        now_unix_ms: u64,
    ) -> BoxFuture<'a, Result<Reserved, StateError>> {
        Box::pin(std::future::ready(self.reserve_at(scope, checks, now_unix_ms)))
    }

    fn commit<'a>(
        &'a self,
        scope: &'a Scope,
        ticket: Ticket,
        actual: &'a [u64],
    ) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(std::future::ready(self.commit_at(scope, &ticket, actual)))
    }

    fn get<'a>(
        &'a self,
        scope: &'a Scope,
        key: &'a str,
        now_unix_ms: u64,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>, StateError>> {
        Box::pin(std::future::ready(self.get_at(scope, key, now_unix_ms)))
    }

    fn set<'a>(
        &'a self,
        scope: &'a Scope,
        key: &'a str,
        value: &'a [u8],
        ttl_ms: u64,
        now_unix_ms: u64,
    ) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(std::future::ready(self.set_at(scope, key, None, value, ttl_ms, now_unix_ms).map(drop)))
    }

    fn compare_and_set<'a>(
        &'a self,
        scope: &'a Scope,
        key: &'a str,
        expected: Option<&'a [u8]>,
        value: &'a [u8],
        ttl_ms: u64,
        now_unix_ms: u64,
    ) -> BoxFuture<'a, Result<bool, StateError>> {
        Box::pin(std::future::ready(self.set_at(scope, key, Some(expected), value, ttl_ms, now_unix_ms)))
    }

    fn delete<'a>(
        &'a self,
        scope: &'a Scope,
        key: &'a str,
        now_unix_ms: u64,
    ) -> BoxFuture<'a, Result<bool, StateError>> {
        Box::pin(std::future::ready(self.delete_at(scope, key, now_unix_ms)))
    }
}

impl Shard {
    fn sweep(&mut self, now: u64, shares: &Mutex<Shares>) -> usize {
        let mut dropped = 0;
        self.plugins.retain(|id, plugin| {
            let before = plugin.held();
            dropped += plugin.sweep(now);
            shares.lock().moved(&id.namespace, before, plugin.held());
            !plugin.is_empty()
        });
        dropped
    }
}

impl Plugin {
    fn held(&self) -> Held {
        Held { keys: self.keys, bytes: self.bytes }
    }

    fn is_empty(&self) -> bool {
        self.counters.is_empty() && self.entries.is_empty()
    }

    /// Checks, then adds, all of `checks` (validated).
    fn reserve(&mut self, checks: &[Check], now: u64, caps: Caps) -> Result<Reserved, StateError> {
        for check in checks {
            self.drop_dead_counters(&check.key, now);
        }
        let buckets: Vec<Buckets> = checks.iter().map(|check| check.window.buckets(now)).collect();
        let mut refused = Vec::new();
        for (index, (check, buckets)) in checks.iter().zip(&buckets).enumerate() {
            // Earlier checks on the same counter would add to it first.
            let earlier = checks
                .iter()
                .take(index)
                .filter(|other| other.key == check.key && other.window == check.window)
                .fold(0, |sum: u64, other| sum.saturating_add(other.amount));
            let used = self.used(check, buckets).saturating_add(earlier);
            if used.checked_add(check.amount).is_none_or(|total| total > check.limit) {
                refused.push(index);
            }
        }
        if !refused.is_empty() {
            let standings = self.standings(checks, &buckets);
            // The refused check that resets last; the first of them on a tie.
            let mut tightest = None;
            for index in refused {
                let reset = standings.get(index).map_or(0, |standing| standing.reset_unix_ms);
                if tightest.is_none_or(|(_, latest)| reset > latest) {
                    tightest = Some((index, reset));
                }
            }
            let tightest = tightest.map_or(0, |(index, _)| index);
            return Ok(Reserved::Refused { tightest, standings });
        }
        self.make_room(caps, now, |plugin| plugin.after_reserve(checks, &buckets))?;
        let mut charges = Vec::with_capacity(checks.len());
        for (check, buckets) in checks.iter().zip(&buckets) {
            let expires_unix_ms = check.window.expires_unix_ms(&buckets.current);
            self.add(&check.key, check.window, buckets.current.index, check.amount, expires_unix_ms);
            charges.push(Charge {
                key: check.key.clone(),
                window: check.window,
                bucket: buckets.current.index,
                expires_unix_ms,
                reserved: check.amount,
            });
        }
        Ok(Reserved::Granted { ticket: Ticket::new(charges), standings: self.standings(checks, &buckets) })
    }

    /// What a check's window holds now.
    fn used(&self, check: &Check, buckets: &Buckets) -> u64 {
        let current = self.count(&check.key, check.window, buckets.current.index);
        let previous = buckets.previous.map_or(0, |previous| self.count(&check.key, check.window, previous.index));
        buckets.estimate(current, previous)
    }

    fn standings(&self, checks: &[Check], buckets: &[Buckets]) -> Vec<Standing> {
        checks
            .iter()
            .zip(buckets)
            .map(|(check, buckets)| {
                let used = self.used(check, buckets);
                Standing {
                    key: check.key.clone(),
                    limit: check.limit,
                    used,
                    remaining: check.limit.saturating_sub(used),
                    reset_unix_ms: buckets.current.end_ms,
                }
            })
            .collect()
    }

    /// The keys and bytes the plugin would hold once `checks` were added:
    /// a counter for each current bucket not yet kept.
    fn after_reserve(&self, checks: &[Check], buckets: &[Buckets]) -> (usize, usize) {
        let (mut keys, mut bytes) = (self.keys, self.bytes);
        for (index, (check, buckets)) in checks.iter().zip(buckets).enumerate() {
            let kept = self.counter(&check.key, check.window, buckets.current.index).is_some();
            let counted = checks.iter().take(index).any(|other| other.key == check.key && other.window == check.window);
            if !kept && !counted {
                keys = keys.saturating_add(1);
                bytes = bytes.saturating_add(counter_bytes(&check.key));
            }
        }
        (keys, bytes)
    }

    fn counter(&self, key: &str, window: Window, bucket: u64) -> Option<&Counter> {
        self.counters.get(key)?.iter().find(|counter| counter.window == window && counter.bucket == bucket)
    }

    fn count(&self, key: &str, window: Window, bucket: u64) -> u64 {
        self.counter(key, window, bucket).map_or(0, |counter| counter.count)
    }

    /// Adds `amount` to a bucket's counter, making it if need be (the caps
    /// were checked).
    fn add(&mut self, key: &str, window: Window, bucket: u64, amount: u64, expires_ms: u64) {
        let counter = Counter { window, bucket, count: amount, expires_ms };
        match self.counters.get_mut(key) {
            Some(counters) => match counters.iter_mut().find(|c| c.window == window && c.bucket == bucket) {
                Some(kept) => {
                    kept.count = kept.count.saturating_add(amount);
                    return;
                }
                None => counters.push(counter),
            },
            None => {
                self.counters.insert(key.into(), vec![counter]);
            }
        }
        self.keys = self.keys.saturating_add(1);
        self.bytes = self.bytes.saturating_add(counter_bytes(key));
    }

    /// Makes a charged counter count `actual` in place of what was
    /// reserved; one that is no longer kept has stopped counting.
    fn adjust(&mut self, charge: &Charge, actual: u64) {
        let Some(counters) = self.counters.get_mut(charge.key.as_str()) else { return };
        let Some(counter) = counters.iter_mut().find(|c| c.window == charge.window && c.bucket == charge.bucket) else {
            return;
        };
        counter.count = if actual >= charge.reserved {
            counter.count.saturating_add(actual - charge.reserved)
        } else {
            counter.count.saturating_sub(charge.reserved - actual)
        };
    }

    /// Drops `key`'s counters whose buckets stopped counting.
    fn drop_dead_counters(&mut self, key: &str, now: u64) {
        let Some(counters) = self.counters.get_mut(key) else { return };
        let before = counters.len();
        counters.retain(|counter| now < counter.expires_ms);
        let dropped = before - counters.len();
        if counters.is_empty() {
            self.counters.remove(key);
        }
        self.keys = self.keys.saturating_sub(dropped);
        self.bytes = self.bytes.saturating_sub(dropped.saturating_mul(counter_bytes(key)));
    }

    /// Drops everything that stopped counting; how many keys.
    fn sweep(&mut self, now: u64) -> usize {
        let (mut keys, mut bytes) = (self.keys, self.bytes);
        self.counters.retain(|key, counters| {
            let before = counters.len();
            counters.retain(|counter| now < counter.expires_ms);
            let dropped = before - counters.len();
            keys = keys.saturating_sub(dropped);
            bytes = bytes.saturating_sub(dropped.saturating_mul(counter_bytes(key)));
            !counters.is_empty()
        });
        self.entries.retain(|key, entry| {
            let live = now < entry.expires_ms;
            if !live {
                keys = keys.saturating_sub(1);
                bytes = bytes.saturating_sub(entry_bytes(key, &entry.value));
            }
            live
        });
        let dropped = self.keys.saturating_sub(keys);
        (self.keys, self.bytes) = (keys, bytes);
        dropped
    }

    /// Fails if the plugin would hold more keys or bytes than its caps, as
    /// `after` says it would, once the call is done; sweeps first if so.
    /// A call that does not add keys (or bytes) is not refused for them,
    /// even if the plugin is past a cap (its scope's was lowered).
    fn make_room(&mut self, caps: Caps, now: u64, after: impl Fn(&Plugin) -> (usize, usize)) -> Result<(), StateError> {
        let (share, store) = caps.share;
        let over = |plugin: &Plugin| {
            let (keys, bytes) = after(plugin);
            if keys > plugin.keys && keys > caps.keys && caps.keys_are_share {
                Some(StateError::ShareExceeded { what: "keys", namespace: share.keys, store: store.keys })
            } else if keys > plugin.keys && keys > caps.keys {
                Some(StateError::TooManyKeys { max: caps.keys })
            } else if bytes > plugin.bytes && bytes > caps.bytes && caps.bytes_are_share {
                Some(StateError::ShareExceeded { what: "bytes", namespace: share.bytes, store: store.bytes })
            } else if bytes > plugin.bytes && bytes > caps.bytes {
                Some(StateError::PluginBytesExceeded { needed: bytes, max: caps.bytes })
            } else {
                None
            }
        };
        if over(self).is_none() {
            return Ok(());
        }
        self.sweep(now);
        over(self).map_or(Ok(()), Err)
    }

    /// The entry under `key` if it has not expired; an expired one is
    /// dropped.
    fn live_entry(&mut self, key: &str, now: u64) -> Option<&Entry> {
        if self.entries.get(key).is_some_and(|entry| now >= entry.expires_ms) {
            self.remove_entry(key);
        }
        self.entries.get(key)
    }

    fn remove_entry(&mut self, key: &str) {
        if let Some((key, entry)) = self.entries.remove_entry(key) {
            self.keys = self.keys.saturating_sub(1);
            self.bytes = self.bytes.saturating_sub(entry_bytes(&key, &entry.value));
        }
    }

    /// Sets the entry under `key`, within the caps.
    fn put_entry(&mut self, key: &str, value: &[u8], expires_ms: u64, now: u64, caps: Caps) -> Result<(), StateError> {
        self.make_room(caps, now, |plugin| {
            let old = plugin.entries.get(key);
            let keys = plugin.keys.saturating_add(usize::from(old.is_none()));
            let old_bytes = old.map_or(0, |old| entry_bytes(key, &old.value));
            (keys, plugin.bytes.saturating_sub(old_bytes).saturating_add(entry_bytes(key, value)))
        })?;
        self.remove_entry(key);
        self.entries.insert(key.into(), Entry { value: value.into(), expires_ms });
        self.keys = self.keys.saturating_add(1);
        self.bytes = self.bytes.saturating_add(entry_bytes(key, value));
        Ok(())
    }
}

#[cfg(test)]
mod tests;
