//! A count of bytes held against a limit, shared without a lock: the
//! request-body and response-buffer budgets and the guest-memory shares
//! each hold one.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes charged to one holder (the process, a namespace, a plugin, a
/// backend), up to its limit.
#[derive(Debug)]
pub struct Account {
    used: AtomicUsize,
    max: usize,
}

impl Account {
    pub fn new(max: usize) -> Self {
        Self { used: AtomicUsize::new(0), max }
    }

    /// Takes `bytes`, if that many are left.
    pub fn reserve(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&n| n <= self.max)
            })
            .is_ok()
    }

    /// Gives back `bytes` taken by [`reserve`](Self::reserve).
    pub fn release(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    pub fn max(&self) -> usize {
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserves_up_to_the_limit_and_not_past_it() {
        let account = Account::new(10);
        assert!(account.reserve(6) && account.reserve(4));
        assert!(!account.reserve(1), "full");
        assert!(!account.reserve(usize::MAX), "an overflow is refused, not wrapped");
        account.release(4);
        assert_eq!((account.used(), account.max()), (6, 10));
        assert!(account.reserve(4));
    }
}
