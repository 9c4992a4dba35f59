//! Guest memory limits: each instance's own (all its linear memories
//! together), and one budget shared by every instance of the process, so
//! that guests cannot take more memory than the container has.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The linear memory all guest instances may hold together.
#[derive(Debug)]
pub(crate) struct GuestMemory {
    used: AtomicUsize,
    max: usize,
}

impl GuestMemory {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self { used: AtomicUsize::new(0), max })
    }

    /// Takes `bytes` from the budget, if that many are left.
    fn reserve(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&n| n <= self.max)
            })
            .is_ok()
    }

    fn release(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    #[cfg(test)]
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// Which limit refused a guest's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The plugin's own `maxMemoryMiB`: the plugin's failure.
    Plugin,
    /// The process-wide budget: the gateway is busy.
    Budget,
}

/// Caps one instance's linear memories, all of them together, and takes
/// what they hold from the shared budget until the instance is dropped. It
/// remembers which limit refused a growth, so a guest that aborts on a
/// failed allocation is reported as out of memory (or the gateway as
/// overloaded) rather than as a generic trap.
pub(crate) struct MemoryLimiter {
    pub max_bytes: usize,
    /// What this instance's memories hold together.
    used: usize,
    budget: Arc<GuestMemory>,
    /// Set when a growth was refused during the current call.
    pub refused: Option<Refused>,
}

impl MemoryLimiter {
    pub fn new(max_bytes: usize, budget: Arc<GuestMemory>) -> Self {
        Self { max_bytes, used: 0, budget, refused: None }
    }

    /// What this instance's memories hold together.
    pub fn used(&self) -> usize {
        self.used
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
            self.refused = Some(Refused::Plugin);
            return Ok(false);
        }
        if !self.budget.reserve(more) {
            self.refused = Some(Refused::Budget);
            return Ok(false);
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
        self.budget.release(self.used);
    }
}

#[cfg(test)]
mod tests {
    use wasmtime::ResourceLimiter as _;

    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn an_instance_limit_counts_all_its_memories_together() {
        let budget = GuestMemory::new(1 << 30);
        let mut limiter = MemoryLimiter::new(64 * MIB, budget.clone());
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
        let budget = GuestMemory::new(100 * MIB);
        let mut a = MemoryLimiter::new(64 * MIB, budget.clone());
        let mut b = MemoryLimiter::new(64 * MIB, budget.clone());
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
        let budget = GuestMemory::new(100 * MIB);
        let mut limiter = MemoryLimiter::new(64 * MIB, budget.clone());
        assert!(!limiter.memory_growing(0, 2 * MIB, Some(MIB)).unwrap());
        assert_eq!(limiter.refused, None);
        assert_eq!(budget.used(), 0);
    }
}
