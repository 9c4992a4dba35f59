//! Guest memory limits: each instance's own (all its linear memories
//! together), one budget shared by every instance of the process, so that
//! guests cannot take more memory than the container has, and each
//! namespace's and plugin's share of that budget, so that one tenant cannot
//! take it all. Idle instances (`Reused` ones, and `PerRequest` ones
//! restored for their next request) hold memory too: when a growth would
//! pass a limit, idle instances under that limit are dropped, least
//! recently used first, before the growth is refused, so memory held idle
//! never turns a live request away. They hold slots of the instance pool
//! too, which they give up the same way (`evict_for_a_slot`).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Instant;

use parking_lot::Mutex;
use sluice_core::Account;
use sluice_telemetry::metrics::Gauge;
use sluice_telemetry::metrics::{GuestMemoryRefusalLabels, NamespaceLabels};

/// A namespace's share, and the gauge of what it holds.
#[derive(Debug)]
pub(crate) struct Namespace {
    account: Account,
    name: Arc<str>,
    gauge: Gauge,
}

/// A plugin's share (all versions of one `namespace/name` together).
#[derive(Debug)]
pub(crate) struct PluginShare {
    account: Account,
    namespace: Arc<Namespace>,
}

/// The idle instances of one plugin, which give their memory (and pool
/// slots) back when a live instance needs them.
pub(crate) trait IdlePool: Send + Sync {
    /// When its least recently used idle instance went idle.
    fn oldest(&self) -> Option<Instant>;
    /// Drops its least recently used idle instance; whether it had one.
    fn evict_oldest(&self) -> bool;
    /// Whose share its instances are charged to.
    fn share(&self) -> &Arc<PluginShare>;
}

/// The linear memory all guest instances may hold together, and the shares.
pub(crate) struct GuestMemory {
    total: Account,
    /// Each namespace's and each plugin's limit.
    namespace_max: usize,
    plugin_max: usize,
    namespaces: Mutex<HashMap<Arc<str>, Weak<Namespace>>>,
    plugins: Mutex<HashMap<Arc<str>, Weak<PluginShare>>>,
    idle: Mutex<Vec<Weak<dyn IdlePool>>>,
    /// Whether its use shows in the metrics (the process's budget, not a
    /// unit test's).
    metered: bool,
}

/// Which limit refused a guest's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The plugin's own `maxMemoryMiB`, or the instance alone would hold
    /// more than its plugin's share: the plugin's failure.
    Plugin,
    /// The process-wide budget: the gateway is busy.
    Budget,
    /// The namespace's share is held by its other instances.
    NamespaceShare,
    /// The plugin's share is held by its other instances.
    PluginShare,
}

impl Refused {
    fn label(self) -> &'static str {
        match self {
            Refused::Plugin => "plugin_limit",
            Refused::Budget => "budget",
            Refused::NamespaceShare => "namespace_share",
            Refused::PluginShare => "plugin_share",
        }
    }
}

impl GuestMemory {
    /// `max` bytes for all instances; a namespace may hold
    /// `namespace_percent` of it, and a plugin `plugin_percent`.
    #[cfg(test)]
    pub fn new(max: usize, namespace_percent: u8, plugin_percent: u8) -> Arc<Self> {
        Self::with_metrics(max, namespace_percent, plugin_percent, false)
    }

    /// The process's budget, whose use shows in the metrics.
    pub fn metered(max: usize, namespace_percent: u8, plugin_percent: u8) -> Arc<Self> {
        let metrics = sluice_telemetry::metrics();
        metrics.guest_memory_budget.set(i64::try_from(max).unwrap_or(i64::MAX));
        Self::with_metrics(max, namespace_percent, plugin_percent, true)
    }

    fn with_metrics(max: usize, namespace_percent: u8, plugin_percent: u8, metered: bool) -> Arc<Self> {
        let share = |percent: u8| (max / 100).saturating_mul(usize::from(percent.clamp(1, 100))).max(1);
        Arc::new(Self {
            total: Account::new(max),
            namespace_max: share(namespace_percent),
            plugin_max: share(plugin_percent),
            namespaces: Mutex::new(HashMap::new()),
            plugins: Mutex::new(HashMap::new()),
            idle: Mutex::new(Vec::new()),
            metered,
        })
    }

    /// The share of `plugin` (`namespace/name`), made on first use.
    pub fn share_of(&self, plugin: &str) -> Arc<PluginShare> {
        let mut plugins = self.plugins.lock();
        if let Some(share) = plugins.get(plugin).and_then(Weak::upgrade) {
            return share;
        }
        plugins.retain(|_, share| share.strong_count() > 0);
        let namespace = plugin.split_once('/').map_or(plugin, |(namespace, _)| namespace);
        let share =
            Arc::new(PluginShare { account: Account::new(self.plugin_max), namespace: self.namespace(namespace) });
        plugins.insert(plugin.into(), Arc::downgrade(&share));
        share
    }

    fn namespace(&self, name: &str) -> Arc<Namespace> {
        let mut namespaces = self.namespaces.lock();
        if let Some(namespace) = namespaces.get(name).and_then(Weak::upgrade) {
            return namespace;
        }
        namespaces.retain(|_, namespace| namespace.strong_count() > 0);
        let name: Arc<str> = name.into();
        let labels = NamespaceLabels { namespace: name.clone() };
        // Series of one namespace are shared by its successive accounts: only
        // increments and decrements, never sets.
        let gauge = match self.metered {
            true => sluice_telemetry::metrics().guest_memory.get_or_create(&labels).clone(),
            false => Gauge::default(),
        };
        let namespace = Arc::new(Namespace { account: Account::new(self.namespace_max), name: name.clone(), gauge });
        namespaces.insert(name, Arc::downgrade(&namespace));
        namespace
    }

    /// Registers a plugin's idle instances, to be evicted when memory or the
    /// instance pool is short.
    pub fn register_idle(&self, pool: Weak<dyn IdlePool>) {
        let mut idle = self.idle.lock();
        idle.retain(|pool| pool.strong_count() > 0);
        idle.push(pool);
    }

    /// Charges `bytes` to the process, `share` and its namespace, all or
    /// none.
    fn charge(&self, share: &PluginShare, bytes: usize) -> Result<(), Refused> {
        if !share.account.reserve(bytes) {
            return Err(Refused::PluginShare);
        }
        if !share.namespace.account.reserve(bytes) {
            share.account.release(bytes);
            return Err(Refused::NamespaceShare);
        }
        if !self.total.reserve(bytes) {
            share.namespace.account.release(bytes);
            share.account.release(bytes);
            return Err(Refused::Budget);
        }
        self.moved(share, bytes as i64);
        Ok(())
    }

    fn release(&self, share: &PluginShare, bytes: usize) {
        self.total.release(bytes);
        share.namespace.account.release(bytes);
        share.account.release(bytes);
        self.moved(share, -(bytes as i64));
    }

    fn moved(&self, share: &PluginShare, bytes: i64) {
        if self.metered {
            share.namespace.gauge.inc_by(bytes);
        }
    }

    /// Drops the least recently used idle instance of any plugin, for its
    /// slot of the instance pool; whether there was one.
    pub fn evict_for_a_slot(&self, share: &Arc<PluginShare>) -> bool {
        self.evict_one(Refused::Budget, share)
    }

    /// Drops the least recently used idle instance whose memory counts
    /// against the limit that `refused` (any, for the budget); whether
    /// there was one.
    fn evict_one(&self, refused: Refused, share: &Arc<PluginShare>) -> bool {
        let pools: Vec<Arc<dyn IdlePool>> = {
            let idle = self.idle.lock();
            idle.iter().filter_map(Weak::upgrade).collect()
        };
        let relevant = |pool: &&Arc<dyn IdlePool>| match refused {
            Refused::Budget => true,
            Refused::NamespaceShare => Arc::ptr_eq(&pool.share().namespace, &share.namespace),
            Refused::PluginShare => Arc::ptr_eq(pool.share(), share),
            Refused::Plugin => false,
        };
        // The pools are dropped here, after the registry's lock, whatever
        // they hold.
        let oldest = pools
            .iter()
            .filter(|pool| relevant(pool))
            .filter_map(|pool| Some((pool.oldest()?, pool)))
            .min_by_key(|(since, _)| *since);
        let evicted = oldest.is_some_and(|(_, pool)| pool.evict_oldest());
        if evicted && self.metered {
            sluice_telemetry::metrics().guest_memory_evictions.inc();
        }
        evicted
    }

    #[cfg(test)]
    pub fn used(&self) -> usize {
        self.total.used()
    }
}

/// Caps one instance's linear memories, all of them together, and takes
/// what they hold from the shared budget and its plugin's and namespace's
/// shares until the instance is dropped. It remembers which limit refused a
/// growth, so a guest that aborts on a failed allocation is reported as out
/// of memory (or the gateway as overloaded) rather than as a generic trap.
pub(crate) struct MemoryLimiter {
    /// The plugin's `maxMemoryMiB`, or its share if that is less.
    pub max_bytes: usize,
    /// What this instance's memories hold together.
    used: usize,
    budget: Arc<GuestMemory>,
    share: Arc<PluginShare>,
    /// Set when a growth was refused during the current call.
    pub refused: Option<Refused>,
}

impl MemoryLimiter {
    /// A limiter for an instance of `plugin` (`namespace/name`).
    pub fn new(max_bytes: usize, budget: Arc<GuestMemory>, plugin: &str) -> Self {
        let share = budget.share_of(plugin);
        let max_bytes = max_bytes.min(budget.plugin_max);
        Self { max_bytes, used: 0, budget, share, refused: None }
    }

    /// What this instance's memories hold together.
    pub fn used(&self) -> usize {
        self.used
    }

    /// Gives back what the instance's memories grew past `used`: they were
    /// restored to the size they had then.
    pub fn rewind(&mut self, used: usize) {
        let grown = self.used.saturating_sub(used);
        self.budget.release(&self.share, grown);
        self.used -= grown;
        self.refused = None;
    }

    fn refuse(&mut self, refused: Refused) -> wasmtime::Result<bool> {
        self.refused = Some(refused);
        if self.budget.metered {
            let labels =
                GuestMemoryRefusalLabels { limit: refused.label(), namespace: self.share.namespace.name.clone() };
            sluice_telemetry::metrics().guest_memory_refusals.get_or_create(&labels).inc();
        }
        Ok(false)
    }
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    /// Also called when a memory is created, with `current` 0.
    fn memory_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        if maximum.is_some_and(|maximum| desired > maximum) {
            // Past the memory's own maximum: wasmtime refuses it anyway.
            return Ok(false);
        }
        let more = desired.saturating_sub(current);
        if self.used.saturating_add(more) > self.max_bytes {
            return self.refuse(Refused::Plugin);
        }
        loop {
            match self.budget.charge(&self.share, more) {
                Ok(()) => break,
                // Idle memory yields to a live instance; a busy one does not.
                Err(refused) if self.budget.evict_one(refused, &self.share) => continue,
                Err(refused) => return self.refuse(refused),
            }
        }
        self.used += more;
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

impl Drop for MemoryLimiter {
    fn drop(&mut self) {
        self.budget.release(&self.share, self.used);
    }
}

#[cfg(test)]
mod tests {
    use wasmtime::ResourceLimiter as _;

    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn an_instance_limit_counts_all_its_memories_together() {
        let budget = GuestMemory::new(1 << 30, 100, 100);
        let mut limiter = MemoryLimiter::new(64 * MIB, budget.clone(), "ns/a");
        // Two memories created at 40 MiB each: the second one does not fit.
        assert!(limiter.memory_growing(0, 40 * MIB, None).unwrap());
        assert!(!limiter.memory_growing(0, 40 * MIB, None).unwrap(), "two memories got twice the limit");
        assert_eq!(limiter.refused, Some(Refused::Plugin));
        // The first memory grows to the limit, and no further.
        assert!(limiter.memory_growing(40 * MIB, 64 * MIB, None).unwrap());
        assert!(!limiter.memory_growing(64 * MIB, 64 * MIB + 65536, None).unwrap());
        assert_eq!(budget.used(), 64 * MIB);
        drop(limiter);
        assert_eq!(budget.used(), 0, "a dropped instance gives its memory back");
    }

    #[test]
    fn instances_share_one_budget() {
        let budget = GuestMemory::new(100 * MIB, 100, 100);
        let mut a = MemoryLimiter::new(64 * MIB, budget.clone(), "ns/a");
        let mut b = MemoryLimiter::new(64 * MIB, budget.clone(), "other/b");
        assert!(a.memory_growing(0, 60 * MIB, None).unwrap());
        assert!(!b.memory_growing(0, 60 * MIB, None).unwrap(), "the budget was overcommitted");
        assert_eq!(b.refused, Some(Refused::Budget));
        assert!(b.memory_growing(0, 40 * MIB, None).unwrap());
        assert_eq!(budget.used(), 100 * MIB);
        drop(a);
        assert!(b.memory_growing(40 * MIB, 64 * MIB, None).unwrap(), "memory given back is reusable");
        assert_eq!(budget.used(), 64 * MIB);
    }

    #[test]
    fn growth_past_a_memory_maximum_is_not_charged() {
        let budget = GuestMemory::new(100 * MIB, 100, 100);
        let mut limiter = MemoryLimiter::new(64 * MIB, budget.clone(), "ns/a");
        assert!(!limiter.memory_growing(0, 2 * MIB, Some(MIB)).unwrap());
        assert_eq!(limiter.refused, None);
        assert_eq!(budget.used(), 0);
    }

    /// A plugin, and a namespace, hold at most their share, all their
    /// instances together; an instance alone is capped at its plugin's
    /// share, as if that were its own limit.
    #[test]
    fn plugins_and_namespaces_hold_at_most_their_share() {
        let budget = GuestMemory::new(100 * MIB, 50, 25);
        let mut alone = MemoryLimiter::new(64 * MIB, budget.clone(), "t/a");
        assert_eq!(alone.max_bytes, 25 * MIB);
        assert!(!alone.memory_growing(0, 26 * MIB, None).unwrap());
        assert_eq!(alone.refused, Some(Refused::Plugin));
        drop(alone);
        let mut a1 = MemoryLimiter::new(64 * MIB, budget.clone(), "t/a");
        let mut a2 = MemoryLimiter::new(64 * MIB, budget.clone(), "t/a");
        assert!(a1.memory_growing(0, 20 * MIB, None).unwrap());
        assert!(!a2.memory_growing(0, 10 * MIB, None).unwrap(), "plugin t/a passed its share");
        assert_eq!(a2.refused, Some(Refused::PluginShare));
        let mut b = MemoryLimiter::new(64 * MIB, budget.clone(), "t/b");
        assert!(b.memory_growing(0, 25 * MIB, None).unwrap());
        let mut c = MemoryLimiter::new(64 * MIB, budget.clone(), "t/c");
        assert!(!c.memory_growing(0, 10 * MIB, None).unwrap(), "namespace t passed its share");
        assert_eq!(c.refused, Some(Refused::NamespaceShare));
        // Another namespace still has the rest of the budget.
        let mut other = MemoryLimiter::new(64 * MIB, budget.clone(), "u/a");
        assert!(other.memory_growing(0, 25 * MIB, None).unwrap());
        drop((a1, b));
        assert_eq!(budget.used(), 25 * MIB);
    }

    struct Pool {
        idle: Mutex<Vec<(Instant, MemoryLimiter)>>,
        share: Arc<PluginShare>,
    }

    impl IdlePool for Pool {
        fn oldest(&self) -> Option<Instant> {
            self.idle.lock().first().map(|(since, _)| *since)
        }
        fn evict_oldest(&self) -> bool {
            let mut idle = self.idle.lock();
            (!idle.is_empty()).then(|| idle.remove(0)).is_some()
        }
        fn share(&self) -> &Arc<PluginShare> {
            &self.share
        }
    }

    /// Memory held by idle instances is given back, least recently used
    /// first, when a live instance needs it; memory held by busy ones is
    /// not.
    #[test]
    fn idle_instances_yield_their_memory_least_recently_used_first() {
        let budget = GuestMemory::new(100 * MIB, 100, 100);
        let pool = |plugin: &str| Arc::new(Pool { idle: Mutex::new(Vec::new()), share: budget.share_of(plugin) });
        let (a, b) = (pool("t/a"), pool("u/b"));
        for (pool, plugin) in [(&a, "t/a"), (&b, "u/b")] {
            let mut idle = MemoryLimiter::new(64 * MIB, budget.clone(), plugin);
            assert!(idle.memory_growing(0, 40 * MIB, None).unwrap());
            pool.idle.lock().push((Instant::now(), idle));
            let weak: Weak<dyn IdlePool> = Arc::downgrade(&(pool.clone() as Arc<dyn IdlePool>));
            budget.register_idle(weak);
        }
        let mut live = MemoryLimiter::new(64 * MIB, budget.clone(), "v/c");
        assert!(live.memory_growing(0, 30 * MIB, None).unwrap(), "idle memory turned a live instance away");
        assert!(a.idle.lock().is_empty(), "the least recently used went first");
        assert_eq!(b.idle.lock().len(), 1, "only as much was evicted as needed");
        assert!(live.memory_growing(30 * MIB, 64 * MIB, None).unwrap());
        assert!(b.idle.lock().is_empty(), "the next least recently used went next");
        assert_eq!(budget.used(), 64 * MIB);
        // Busy memory is not evicted.
        let mut busy = MemoryLimiter::new(64 * MIB, budget.clone(), "w/d");
        assert!(!busy.memory_growing(0, 40 * MIB, None).unwrap());
        assert_eq!(busy.refused, Some(Refused::Budget));
    }
}
