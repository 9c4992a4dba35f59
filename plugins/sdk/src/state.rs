//! Shared state (`sluice:plugin/state`, WIT 0.3.1): counters in time windows
//! with atomic check-and-reserve, then commit, and entries with a TTL. The
//! GatewayPlugin must grant it (`spec.state`); the gateway keeps every key
//! under the plugin's namespace and name.
//!
//! On `wasm32` these call the host. Natively (unit tests) they run on the
//! gateway's own in-process store (`sluice-state`), one per test thread,
//! with the clock of [`crate::host::now_unix_ms`] (pin it with
//! [`crate::host::testing::set_now_unix_ms`] to step through windows).

pub use crate::bindings::sluice::plugin::state::Standing;
pub use crate::bindings::sluice::plugin::state::{Check, StateError, UsageWeights, Window};

/// What a [`reserve`] did.
pub enum Reserved {
    /// Every check fitted and every amount was added: settle the
    /// reservation later (or drop it: it stays counted). The standings are
    /// in the order of the checks.
    Granted(Reservation, Vec<Standing>),
    /// A check did not fit, and nothing was added: `tightest` indexes the
    /// refusing check whose window ends last (the one to wait for).
    Refused { tightest: usize, standings: Vec<Standing> },
}

/// The amounts one granted [`reserve`] added. Dropped without a commit or
/// release, they stay counted: an abandoned request pays its estimate.
pub struct Reservation(imp::Reservation);

impl Reservation {
    /// Each check's counter counts `actual[i]` instead of what was reserved
    /// (in the window it was reserved in); checks past the end of `actual`
    /// keep their reserved amounts. More than reserved counts too.
    pub fn commit(self, actual: &[u64]) -> Result<(), StateError> {
        imp::commit(self.0, actual)
    }

    /// Gives back everything reserved.
    pub fn release(self) -> Result<(), StateError> {
        imp::release(self.0)
    }

    /// Leaves the reservation to the gateway, which commits it when the
    /// response ends: check `i` counts `weights[i].request + input ×
    /// prompt tokens + output × completion tokens` as the upstream reported
    /// them (checks past the end of `weights` keep their reserved amounts).
    /// Without usage the reserved amounts stand, unless the response failed
    /// (status 400 or more): then each check counts its `request` weight.
    /// Only in the request hook; a plugin that settles this way needs no
    /// response hook. Natively, [`crate::testing::end_response`] settles.
    pub fn settle_at_end(self, weights: &[UsageWeights]) -> Result<(), StateError> {
        imp::settle_at_end(self.0, weights)
    }
}

/// `unavailable: …` or `refused: …`: a store error for a log line or a
/// panic message.
pub fn describe(error: &StateError) -> String {
    match error {
        StateError::Unavailable(why) => format!("unavailable: {why}"),
        StateError::Refused(why) => format!("refused: {why}"),
    }
}

/// Checks every limit and, only if all fit, adds every amount, atomically:
/// concurrent requests on any replica never pass a limit together.
pub fn reserve(checks: &[Check]) -> Result<Reserved, StateError> {
    imp::reserve(checks)
}

/// The entry under `key`, unless absent or expired.
pub fn get(key: &str) -> Result<Option<Vec<u8>>, StateError> {
    imp::get(key)
}

/// Sets an entry for `ttl_ms` milliseconds (0: the longest allowed).
pub fn set(key: &str, value: &[u8], ttl_ms: u64) -> Result<(), StateError> {
    imp::set(key, value, ttl_ms)
}

/// Sets the entry only if it is `expected` now (`None`: absent); whether it
/// did.
pub fn compare_and_set(key: &str, expected: Option<&[u8]>, value: &[u8], ttl_ms: u64) -> Result<bool, StateError> {
    imp::compare_and_set(key, expected, value, ttl_ms)
}

/// Whether there was an entry to delete.
pub fn delete(key: &str) -> Result<bool, StateError> {
    imp::delete(key)
}

/// What [`crate::testing::end_response`] does: natively, the gateway's
/// settling at the response's end.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn end_response(status: u16, usage: Option<(u64, u64)>) {
    imp::end_response(status, usage)
}

#[cfg(target_arch = "wasm32")]
mod imp {
    use super::{Check, Reserved, StateError};
    use crate::bindings::sluice::plugin::state as host;

    pub type Reservation = host::Reservation;

    pub fn reserve(checks: &[Check]) -> Result<Reserved, StateError> {
        Ok(match host::reserve(checks)? {
            host::Reserved::Granted((reservation, standings)) => {
                Reserved::Granted(super::Reservation(reservation), standings)
            }
            host::Reserved::Refused((tightest, standings)) => {
                Reserved::Refused { tightest: tightest as usize, standings }
            }
        })
    }

    pub fn commit(reservation: Reservation, actual: &[u64]) -> Result<(), StateError> {
        reservation.commit(actual)
    }

    pub fn release(reservation: Reservation) -> Result<(), StateError> {
        reservation.release()
    }

    pub fn settle_at_end(reservation: Reservation, weights: &[super::UsageWeights]) -> Result<(), StateError> {
        host::settle_at_end(reservation, weights)
    }

    pub fn get(key: &str) -> Result<Option<Vec<u8>>, StateError> {
        host::get(key)
    }

    pub fn set(key: &str, value: &[u8], ttl_ms: u64) -> Result<(), StateError> {
        host::set(key, value, ttl_ms)
    }

    pub fn compare_and_set(key: &str, expected: Option<&[u8]>, value: &[u8], ttl_ms: u64) -> Result<bool, StateError> {
        host::compare_and_set(key, expected, value, ttl_ms)
    }

    pub fn delete(key: &str) -> Result<bool, StateError> {
        host::delete(key)
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    use std::task::{Context, Poll, Waker};

    use sluice_state as store;
    use sluice_state::Store as _;

    use super::{Check, Reserved, Standing, StateError, Window};
    use crate::host::now_unix_ms;

    pub struct Reservation(store::Ticket);

    thread_local! {
        /// The gateway's in-process store with its default caps, one per
        /// test thread.
        static STORE: store::MemoryStore = store::MemoryStore::new(store::Limits::default());
    }

    fn scope() -> store::Scope {
        store::Scope::new("test", "plugin")
    }

    /// The in-process store's calls are ready at once.
    fn ready<T>(mut future: store::BoxFuture<'_, T>) -> T {
        match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(value) => value,
            Poll::Pending => unreachable!("the in-process store answers at once"),
        }
    }

    fn error(error: store::StateError) -> StateError {
        if error.is_unavailable() {
            StateError::Unavailable(error.to_string())
        } else {
            StateError::Refused(error.to_string())
        }
    }

    fn standing(s: store::Standing) -> Standing {
        Standing { key: s.key, limit: s.limit, used: s.used, remaining: s.remaining, reset_unix_ms: s.reset_unix_ms }
    }

    pub fn reserve(checks: &[Check]) -> Result<Reserved, StateError> {
        let checks: Vec<store::Check> = checks
            .iter()
            .map(|c| store::Check {
                key: c.key.clone(),
                window: match c.window {
                    Window::Fixed(seconds) => store::Window::Fixed { seconds },
                    Window::Sliding(seconds) => store::Window::Sliding { seconds },
                    Window::CalendarMonth => store::Window::CalendarMonth,
                },
                limit: c.limit,
                amount: c.amount,
            })
            .collect();
        let now = now_unix_ms();
        let scope = scope();
        Ok(match STORE.with(|s| ready(s.reserve(&scope, &checks, now))).map_err(error)? {
            store::Reserved::Granted { ticket, standings } => Reserved::Granted(
                super::Reservation(Reservation(ticket)),
                standings.into_iter().map(standing).collect(),
            ),
            store::Reserved::Refused { tightest, standings } => {
                Reserved::Refused { tightest, standings: standings.into_iter().map(standing).collect() }
            }
        })
    }

    pub fn commit(reservation: Reservation, actual: &[u64]) -> Result<(), StateError> {
        let scope = scope();
        STORE.with(|s| ready(s.commit(&scope, reservation.0, actual))).map_err(error)
    }

    pub fn release(reservation: Reservation) -> Result<(), StateError> {
        let scope = scope();
        STORE.with(|s| ready(s.release(&scope, reservation.0))).map_err(error)
    }

    thread_local! {
        /// Reservations left to settle at the response's end, as the
        /// gateway holds them.
        static SETTLEMENTS: std::cell::RefCell<Vec<(store::Ticket, Vec<store::UsageWeights>)>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }

    pub fn settle_at_end(reservation: Reservation, weights: &[super::UsageWeights]) -> Result<(), StateError> {
        let weights: Vec<_> = weights
            .iter()
            .map(|w| store::UsageWeights { request: w.request, input: w.input, output: w.output })
            .collect();
        store::check_weights(&weights, &reservation.0).map_err(error)?;
        SETTLEMENTS.with(|s| s.borrow_mut().push((reservation.0, weights)));
        Ok(())
    }

    /// Settles what was left to settle, as the gateway does when a response
    /// ends with `status` and the upstream's reported (prompt, completion)
    /// tokens.
    pub fn end_response(status: u16, usage: Option<(u64, u64)>) {
        let scope = scope();
        for (ticket, weights) in SETTLEMENTS.with(|s| std::mem::take(&mut *s.borrow_mut())) {
            if let Some(amounts) = store::settled_amounts(&weights, status, usage) {
                STORE.with(|s| ready(s.commit(&scope, ticket, &amounts))).expect("the in-process store commits");
            }
        }
    }

    pub fn get(key: &str) -> Result<Option<Vec<u8>>, StateError> {
        let now = now_unix_ms();
        let scope = scope();
        STORE.with(|s| ready(s.get(&scope, key, now))).map_err(error)
    }

    pub fn set(key: &str, value: &[u8], ttl_ms: u64) -> Result<(), StateError> {
        let now = now_unix_ms();
        let scope = scope();
        STORE.with(|s| ready(s.set(&scope, key, value, ttl_ms, now))).map_err(error)
    }

    pub fn compare_and_set(key: &str, expected: Option<&[u8]>, value: &[u8], ttl_ms: u64) -> Result<bool, StateError> {
        let now = now_unix_ms();
        let scope = scope();
        STORE.with(|s| ready(s.compare_and_set(&scope, key, expected, value, ttl_ms, now))).map_err(error)
    }

    pub fn delete(key: &str) -> Result<bool, StateError> {
        let now = now_unix_ms();
        let scope = scope();
        STORE.with(|s| ready(s.delete(&scope, key, now))).map_err(error)
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::host::testing::set_now_unix_ms;

    /// 2024-03-15T00:00:00Z.
    const T0: u64 = 1_710_460_800_000;

    fn tokens(amount: u64) -> Check {
        Check { key: "tokens".into(), window: Window::Fixed(60), limit: 100, amount }
    }

    #[test]
    fn a_reservation_is_committed_with_the_real_amount() {
        set_now_unix_ms(Some(T0));
        let Ok(Reserved::Granted(reservation, standings)) = reserve(&[tokens(80)]) else { panic!("granted") };
        assert_eq!((standings[0].used, standings[0].remaining), (80, 20));
        assert!(matches!(reserve(&[tokens(30)]), Ok(Reserved::Refused { tightest: 0, .. })));
        reservation.commit(&[10]).unwrap();
        let Ok(Reserved::Granted(_, standings)) = reserve(&[tokens(30)]) else { panic!("granted after the commit") };
        assert_eq!(standings[0].used, 40);
        // The next window starts from nothing.
        set_now_unix_ms(Some(T0 + 60_000));
        let Ok(Reserved::Granted(_, standings)) = reserve(&[tokens(100)]) else { panic!("a new window") };
        assert_eq!(standings[0].reset_unix_ms, T0 + 120_000);
    }

    #[test]
    fn a_reservation_left_to_the_gateway_is_settled_by_the_usage_at_the_end() {
        set_now_unix_ms(Some(T0));
        let requests = Check { key: "requests".into(), window: Window::Fixed(60), limit: 10, amount: 1 };
        let Ok(Reserved::Granted(reservation, _)) = reserve(&[requests.clone(), tokens(50)]) else { panic!("granted") };
        let weights =
            [UsageWeights { request: 1, input: 0, output: 0 }, UsageWeights { request: 0, input: 1, output: 2 }];
        reservation.settle_at_end(&weights).unwrap();
        imp::end_response(200, Some((10, 5)));
        let Ok(Reserved::Granted(_, standings)) = reserve(&[requests.clone(), tokens(0)]) else { panic!("granted") };
        assert_eq!((standings[0].used, standings[1].used), (2, 20));
        // Failed without usage: the request counts, its tokens do not.
        let Ok(Reserved::Granted(reservation, _)) = reserve(&[requests.clone(), tokens(30)]) else { panic!("granted") };
        reservation.settle_at_end(&weights).unwrap();
        imp::end_response(502, None);
        let Ok(Reserved::Granted(_, standings)) = reserve(&[requests, tokens(0)]) else { panic!("granted") };
        assert_eq!((standings[0].used, standings[1].used), (4, 20));
        let Ok(Reserved::Granted(reservation, _)) = reserve(&[tokens(1)]) else { panic!("granted") };
        assert!(matches!(reservation.settle_at_end(&weights), Err(StateError::Refused(_))));
    }

    #[test]
    fn entries_live_until_their_ttl() {
        set_now_unix_ms(Some(T0));
        set("k", b"v", 1000).unwrap();
        assert_eq!(get("k").unwrap(), Some(b"v".to_vec()));
        assert!(!compare_and_set("k", None, b"w", 0).unwrap());
        set_now_unix_ms(Some(T0 + 1000));
        assert_eq!(get("k").unwrap(), None);
        assert!(compare_and_set("k", None, b"w", 0).unwrap());
        assert!(delete("k").unwrap());
        let Err(StateError::Refused(why)) = set(&"k".repeat(300), b"", 0) else { panic!("a key past the cap") };
        assert!(why.contains("256"), "{why}");
    }
}
