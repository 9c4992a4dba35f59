//! Shared state for plugins: counters in time windows, reserved against
//! limits and then committed (token quotas, rate limits), and entries with a
//! TTL and compare-and-set (response caches).
//!
//! Every call names the plugin's [`Scope`]; a store keeps each scope's keys
//! apart whatever key a plugin asks for. [`Store`] is what the runtime holds
//! (`Arc<dyn Store>`): [`MemoryStore`] in-process, for one replica;
//! [`RedisStore`], shared by replicas, implements the same trait, naming
//! buckets by the same indexes ([`Window::bucket`]) and keys by
//! [`redis_key`].
//!
//! Stores read no clock: every call that needs the time is given it, so
//! replicas agree on buckets by their clocks alone and tests are exact.

pub mod keys;
pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;
pub mod window;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

#[cfg(feature = "redis")]
pub use self::redis::{RedisConfig, RedisStore, RedisTls};
#[cfg(test)]
mod testing;

pub use keys::{KeyKind, redis_key};
pub use memory::{MemoryStore, Usage};
pub use window::{Bucket, Buckets, MAX_UNIX_MS, MAX_WINDOW_SECONDS, Window};

/// What a store's calls return: a future that can move between threads, so
/// that the trait can be used as `dyn Store`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Whose keys: a plugin's (GatewayPlugin) namespace and name. Every key a
/// store touches is kept under both, apart from every other scope's.
#[derive(Clone, Debug)]
pub struct Scope {
    pub namespace: Arc<str>,
    pub plugin: Arc<str>,
    /// The plugin's own cap on its live keys (counters and entries), if its
    /// grant gives one; the store's [`Limits::max_keys_per_plugin`] applies
    /// too, so the lower of the two holds.
    pub max_keys: Option<u64>,
    /// The plugin's own cap on the bytes of its keys and values, if its
    /// grant gives one; [`Limits::max_bytes_per_plugin`] applies too.
    pub max_bytes: Option<u64>,
}

impl Scope {
    /// A plugin's scope, under the store's caps alone.
    pub fn new(namespace: impl Into<Arc<str>>, plugin: impl Into<Arc<str>>) -> Self {
        Scope { namespace: namespace.into(), plugin: plugin.into(), max_keys: None, max_bytes: None }
    }
}

/// One limit to check and reserve against: may `amount` more be counted
/// under `key` in `window` without passing `limit`?
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub key: String,
    pub window: Window,
    pub limit: u64,
    pub amount: u64,
}

/// A counter as it stands: after a granted reserve, or as it stood (nothing
/// added) when one was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Standing {
    pub key: String,
    pub limit: u64,
    /// What the window holds; for a sliding window, the estimate
    /// ([`Buckets::estimate`]).
    pub used: u64,
    /// `limit - used`, or 0 once `used` is past the limit (a commit may
    /// count more than was reserved).
    pub remaining: u64,
    /// When the window holding `used` ends ([`Window::reset_unix_ms`]):
    /// when a refused client may retry.
    pub reset_unix_ms: u64,
}

/// What a reserve did.
#[derive(Debug, PartialEq, Eq)]
pub enum Reserved {
    /// Every check passed and every amount was added, in one atomic step.
    /// `standings` are the counters after, in the order of the checks.
    Granted { ticket: Ticket, standings: Vec<Standing> },
    /// At least one check would have passed its limit, and nothing was
    /// added. `tightest` indexes `standings` (one per check, in their order):
    /// of the refused checks, the one whose window resets last, the one a
    /// client must wait for (the first of them on a tie).
    Refused { tightest: usize, standings: Vec<Standing> },
}

/// One counter a reserve added to, and how much.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Charge {
    pub key: String,
    pub window: Window,
    /// The bucket the amount went into: a commit after the window moved on
    /// adjusts this one, not the bucket current by then.
    pub bucket: u64,
    /// When that bucket stops counting ([`Window::expires_unix_ms`]); a
    /// store whose keys expire (Redis) gives a counter it recreates this
    /// expiry.
    pub expires_unix_ms: u64,
    pub reserved: u64,
}

/// What a granted reserve added, one [`Charge`] per check in the order of
/// the checks, until [`Store::commit`] or [`Store::release`] settles it. A
/// ticket dropped unsettled leaves its amounts counted: an estimate is never
/// given back by accident. Committing takes the ticket, so it is settled
/// once. It holds no scope: settle it under the scope it was reserved in.
#[derive(Debug, PartialEq, Eq)]
pub struct Ticket {
    charges: Vec<Charge>,
}

impl Ticket {
    /// A ticket for these charges; for a store's `reserve` to return.
    pub fn new(charges: Vec<Charge>) -> Self {
        Ticket { charges }
    }

    /// The counters and reserved amounts, in the order of the checks.
    pub fn charges(&self) -> &[Charge] {
        &self.charges
    }

    /// The amounts reserved, in the order of the checks.
    pub fn amounts(&self) -> impl Iterator<Item = u64> + '_ {
        self.charges.iter().map(|charge| charge.reserved)
    }

    pub fn len(&self) -> usize {
        self.charges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.charges.is_empty()
    }
}

/// How one check counts a response's usage when the gateway settles a
/// reservation at the response's end (`settle-at-end` in the WIT).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsageWeights {
    /// Counted once, whatever the usage.
    pub request: u64,
    /// Per prompt token the upstream reported.
    pub input: u64,
    /// Per completion token.
    pub output: u64,
}

/// Whether `weights` can settle `ticket`: no more weights than checks, as
/// [`Store::commit`] takes no more amounts than counters.
pub fn check_weights(weights: &[UsageWeights], ticket: &Ticket) -> Result<(), StateError> {
    if weights.len() > ticket.len() {
        return Err(StateError::TooManyWeights { given: weights.len(), checks: ticket.len() });
    }
    Ok(())
}

/// What each check of a reservation settled at the response's end counts,
/// given the response's status and the (prompt, completion) tokens the
/// upstream reported; `None` when every reserved amount stands (no usage on
/// a response that did not fail). Here, not in the gateway, so that the
/// SDK's native tests settle as the gateway does.
pub fn settled_amounts(weights: &[UsageWeights], status: u16, usage: Option<(u64, u64)>) -> Option<Vec<u64>> {
    match usage {
        Some((input, output)) => Some(
            weights
                .iter()
                .map(|w| {
                    w.request
                        .saturating_add(w.input.saturating_mul(input))
                        .saturating_add(w.output.saturating_mul(output))
                })
                .collect(),
        ),
        None if status >= 400 => Some(weights.iter().map(|w| w.request).collect()),
        None => None,
    }
}

/// Why a store call did nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("a key of {len} bytes is past the cap of {max} bytes")]
    KeyTooLong { len: usize, max: usize },
    #[error("a value of {len} bytes is past the cap of {max} bytes")]
    ValueTooLarge { len: usize, max: usize },
    #[error("the plugin holds its cap of {max} keys")]
    TooManyKeys { max: usize },
    #[error("the plugin's keys and values would take {needed} bytes, past its cap of {max} bytes")]
    PluginBytesExceeded { needed: usize, max: usize },
    /// The store's memory is shared: one namespace's plugins may hold only
    /// their share of it, and all of them the whole.
    #[error(
        "the namespace's plugins hold their share of the state store ({} of {} {what}), or the store is full",
        .namespace, .store
    )]
    ShareExceeded { what: &'static str, namespace: usize, store: usize },
    #[error("{given} checks in one reserve are past the cap of {max}")]
    TooManyChecks { given: usize, max: usize },
    #[error("window {0:?} is not 1 to {MAX_WINDOW_SECONDS} seconds long")]
    InvalidWindow(Window),
    #[error("{given} amounts for a ticket of {counters} counters")]
    TooManyAmounts { given: usize, counters: usize },
    #[error("{given} weights for a reservation of {checks} checks")]
    TooManyWeights { given: usize, checks: usize },
    #[error("the state store is unavailable: {0}")]
    Unavailable(String),
    #[error("the state store did not answer in time")]
    Timeout,
}

impl StateError {
    /// Whether the store failed (down, or slow), as opposed to the call
    /// being past a cap: a plugin's failure policy applies to the former.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StateError::Unavailable(_) | StateError::Timeout)
    }
}

/// A store's caps, the same for every plugin (a [`Scope`] may lower the
/// per-plugin ones).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The longest key a plugin may name, in bytes (UTF-8).
    pub max_key_bytes: usize,
    /// The largest entry value.
    pub max_value_bytes: usize,
    /// Live keys (counters, one per bucket, and entries) per plugin.
    pub max_keys_per_plugin: usize,
    /// Bytes of keys and values per plugin (a counter's value counts 8).
    pub max_bytes_per_plugin: usize,
    /// Checks in one reserve.
    pub max_checks_per_call: usize,
    /// The longest an entry lives; a TTL of 0, or a longer one, gets it.
    pub max_ttl_ms: u64,
    /// Bytes of keys and values all plugins may hold together (the
    /// in-process store's memory).
    pub max_bytes_total: usize,
    /// Keys (counters and entries) all plugins may hold together: each
    /// costs the store's maps up to about 120 bytes beyond its key and value
    /// (measured with 200,000 of each: 78 for an entry, 117 for a counter),
    /// so this bounds that memory as `max_bytes_total` bounds the rest.
    pub max_keys_total: usize,
    /// The share of `max_bytes_total` and `max_keys_total` one namespace's
    /// plugins may hold together, in percent.
    pub namespace_percent: u8,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_key_bytes: 256,
            max_value_bytes: 64 * 1024,
            max_keys_per_plugin: 10_000,
            max_bytes_per_plugin: 16 * 1024 * 1024,
            max_checks_per_call: 16,
            max_ttl_ms: u64::from(MAX_WINDOW_SECONDS) * 1000,
            max_bytes_total: 32 * 1024 * 1024,
            max_keys_total: 100_000,
            namespace_percent: 50,
        }
    }
}

impl Limits {
    /// Refuses a key past [`Limits::max_key_bytes`].
    pub fn check_key(&self, key: &str) -> Result<(), StateError> {
        if key.len() > self.max_key_bytes {
            return Err(StateError::KeyTooLong { len: key.len(), max: self.max_key_bytes });
        }
        Ok(())
    }

    /// Refuses a value past [`Limits::max_value_bytes`].
    pub fn check_value(&self, value: &[u8]) -> Result<(), StateError> {
        if value.len() > self.max_value_bytes {
            return Err(StateError::ValueTooLarge { len: value.len(), max: self.max_value_bytes });
        }
        Ok(())
    }

    /// Refuses a reserve with too many checks, or any check with a key too
    /// long or an invalid window.
    pub fn check_checks(&self, checks: &[Check]) -> Result<(), StateError> {
        if checks.len() > self.max_checks_per_call {
            return Err(StateError::TooManyChecks { given: checks.len(), max: self.max_checks_per_call });
        }
        for check in checks {
            self.check_key(&check.key)?;
            check.window.validate()?;
        }
        Ok(())
    }

    /// The TTL an entry gets when `ttl_ms` is asked for: 0 and anything
    /// longer than [`Limits::max_ttl_ms`] get the maximum, so that no entry
    /// lives forever.
    pub fn ttl_ms(&self, ttl_ms: u64) -> u64 {
        if ttl_ms == 0 { self.max_ttl_ms } else { ttl_ms.min(self.max_ttl_ms) }
    }

    /// The key cap for `scope`: the store's, or the scope's if lower.
    pub fn max_keys(&self, scope: &Scope) -> usize {
        lower(self.max_keys_per_plugin, scope.max_keys)
    }

    /// The byte cap for `scope`: the store's, or the scope's if lower.
    pub fn max_bytes(&self, scope: &Scope) -> usize {
        lower(self.max_bytes_per_plugin, scope.max_bytes)
    }

    /// The bytes one namespace's plugins may hold together.
    pub fn namespace_bytes(&self) -> usize {
        self.namespace_share(self.max_bytes_total)
    }

    /// The keys one namespace's plugins may hold together.
    pub fn namespace_keys(&self) -> usize {
        self.namespace_share(self.max_keys_total)
    }

    fn namespace_share(&self, total: usize) -> usize {
        let share = total as u128 * u128::from(self.namespace_percent.min(100)) / 100;
        usize::try_from(share).unwrap_or(usize::MAX)
    }
}

fn lower(store: usize, scope: Option<u64>) -> usize {
    scope.map_or(store, |own| usize::try_from(own).unwrap_or(usize::MAX).min(store))
}

/// Where plugins' shared state is kept. Calls are atomic each; none reads a
/// clock (`now_unix_ms` is the caller's).
pub trait Store: Send + Sync {
    /// Checks every one of `checks` against its limit and only if all pass
    /// adds every amount, as one atomic step, so concurrent reserves never
    /// pass a limit together. A check whose amount alone is past its limit
    /// is refused. Several checks on one counter (key and window) count
    /// together.
    fn reserve<'a>(
        &'a self,
        scope: &'a Scope,
        checks: &'a [Check],
        now_unix_ms: u64,
    ) -> BoxFuture<'a, Result<Reserved, StateError>>;

    /// Settles `ticket`: each counter holds `actual[i]` in place of the
    /// amount reserved for check `i`, in the bucket it was reserved in.
    /// Counters without an amount in `actual` (it is shorter) keep what was
    /// reserved; more amounts than counters is an error, and nothing
    /// changes. More than reserved is counted too, past the limit if need
    /// be (the upstream's usage is a fact; the next reserve is refused);
    /// less gives the rest back, a counter never going below 0. A bucket
    /// that has stopped counting since is left alone.
    fn commit<'a>(
        &'a self,
        scope: &'a Scope,
        ticket: Ticket,
        actual: &'a [u64],
    ) -> BoxFuture<'a, Result<(), StateError>>;

    /// What the store is, for operators (`in-process`, `redis`).
    fn kind(&self) -> &'static str;

    /// The caps a scope holds under: the store's, or the scope's if lower.
    fn caps(&self, scope: &Scope) -> (usize, usize);

    /// Drops what stopped counting by `now_unix_ms` (ended windows, expired
    /// entries), so idle plugins' leftovers free their namespace's room;
    /// how many keys. A store that expires keys itself (Redis) has nothing
    /// to do.
    fn sweep(&self, _now_unix_ms: u64) -> usize {
        0
    }

    /// Gives back everything `ticket` reserved: a commit of 0 for each
    /// counter.
    fn release<'a>(&'a self, scope: &'a Scope, ticket: Ticket) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(async move {
            let zeros = vec![0; ticket.len()];
            self.commit(scope, ticket, &zeros).await
        })
    }

    /// The entry under `key`, unless absent or expired.
    fn get<'a>(
        &'a self,
        scope: &'a Scope,
        key: &'a str,
        now_unix_ms: u64,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>, StateError>>;

    /// Sets the entry under `key` for `ttl_ms` ([`Limits::ttl_ms`]: 0 is the
    /// longest allowed; no entry lives forever).
    fn set<'a>(
        &'a self,
        scope: &'a Scope,
        key: &'a str,
        value: &'a [u8],
        ttl_ms: u64,
        now_unix_ms: u64,
    ) -> BoxFuture<'a, Result<(), StateError>>;

    /// Sets `key` to `value` only if its entry is `expected` now (`None`:
    /// absent or expired); whether it did.
    fn compare_and_set<'a>(
        &'a self,
        scope: &'a Scope,
        key: &'a str,
        expected: Option<&'a [u8]>,
        value: &'a [u8],
        ttl_ms: u64,
        now_unix_ms: u64,
    ) -> BoxFuture<'a, Result<bool, StateError>>;

    /// Deletes the entry under `key`; whether there was a live one.
    fn delete<'a>(
        &'a self,
        scope: &'a Scope,
        key: &'a str,
        now_unix_ms: u64,
    ) -> BoxFuture<'a, Result<bool, StateError>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_are_bounded() {
        let limits = Limits { max_ttl_ms: 1000, ..Limits::default() };
        assert_eq!(limits.ttl_ms(0), 1000);
        assert_eq!(limits.ttl_ms(1), 1);
        assert_eq!(limits.ttl_ms(999), 999);
        assert_eq!(limits.ttl_ms(u64::MAX), 1000);
        assert_eq!(Limits::default().max_ttl_ms, 2_678_400_000);
    }

    #[test]
    fn a_scopes_caps_only_lower_the_stores() {
        let limits = Limits { max_keys_per_plugin: 100, max_bytes_per_plugin: 1000, ..Limits::default() };
        let mut scope = Scope::new("ns", "p");
        assert_eq!((limits.max_keys(&scope), limits.max_bytes(&scope)), (100, 1000));
        scope.max_keys = Some(10);
        scope.max_bytes = Some(u64::MAX);
        assert_eq!((limits.max_keys(&scope), limits.max_bytes(&scope)), (10, 1000));
    }

    #[test]
    fn checks_are_validated() {
        let limits = Limits { max_checks_per_call: 2, max_key_bytes: 3, ..Limits::default() };
        let check =
            |key: &str, seconds| Check { key: key.into(), window: Window::Fixed { seconds }, limit: 1, amount: 1 };
        assert_eq!(limits.check_checks(&[check("abc", 1), check("", 60)]), Ok(()));
        assert_eq!(
            limits.check_checks(&[check("a", 1), check("b", 1), check("c", 1)]),
            Err(StateError::TooManyChecks { given: 3, max: 2 })
        );
        assert_eq!(limits.check_checks(&[check("abcd", 1)]), Err(StateError::KeyTooLong { len: 4, max: 3 }));
        assert_eq!(limits.check_checks(&[check("a", 0)]), Err(StateError::InvalidWindow(Window::Fixed { seconds: 0 })));
        // Bytes, not characters.
        assert_eq!(limits.check_key("éé"), Err(StateError::KeyTooLong { len: 4, max: 3 }));
    }

    #[test]
    fn a_settled_reservation_counts_the_reported_usage_by_its_weights() {
        let requests = UsageWeights { request: 1, ..UsageWeights::default() };
        let weighted = UsageWeights { request: 0, input: 1, output: 4 };
        let weights = [requests, weighted];
        assert_eq!(settled_amounts(&weights, 200, Some((100, 10))), Some(vec![1, 140]));
        // A failure without usage counts the request alone; a success
        // without usage keeps the estimate.
        assert_eq!(settled_amounts(&weights, 502, None), Some(vec![1, 0]));
        assert_eq!(settled_amounts(&weights, 200, None), None);
        // Usage wins over the status: the tokens were spent.
        assert_eq!(settled_amounts(&weights, 500, Some((3, 0))), Some(vec![1, 3]));
        let huge = UsageWeights { request: u64::MAX, input: u64::MAX, output: 2 };
        assert_eq!(settled_amounts(&[huge], 200, Some((2, u64::MAX))), Some(vec![u64::MAX]));
    }

    #[test]
    fn errors_say_which_cap() {
        assert_eq!(StateError::TooManyKeys { max: 10_000 }.to_string(), "the plugin holds its cap of 10000 keys");
        assert_eq!(
            StateError::InvalidWindow(Window::Sliding { seconds: 0 }).to_string(),
            "window Sliding { seconds: 0 } is not 1 to 2678400 seconds long"
        );
        assert!(StateError::Timeout.is_unavailable());
        assert!(!StateError::TooManyChecks { given: 17, max: 16 }.is_unavailable());
    }
}
