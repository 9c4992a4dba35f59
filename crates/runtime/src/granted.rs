//! What a plugin was granted of shared state, the reservations it holds,
//! and those it handed to the gateway to settle: a file of their own, so the
//! bindings and the store's data can name them without importing the state
//! calls (which import both).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

use sluice_state::{Scope, Store, Ticket, UsageWeights, settled_amounts};

/// What a granted plugin's instances reach: the gateway's store, under the
/// plugin's scope.
#[derive(Clone)]
pub struct StateAccess {
    pub store: Arc<dyn Store>,
    pub scope: Scope,
}

/// What a configured plugin's instances were granted past the request.
#[derive(Clone, Default)]
pub(crate) struct Granted {
    pub state: Option<Arc<StateAccess>>,
    pub egress: Option<Arc<crate::egress::Egress>>,
    /// The metrics it declared (always granted).
    pub metrics: DeclaredMetrics,
}

/// What a configured plugin declared (`sluice:plugin/metrics`), set by its
/// first `configure` and shared by all its instances.
pub(crate) type DeclaredMetrics = Arc<std::sync::OnceLock<Arc<sluice_telemetry::plugin_metrics::PluginMetrics>>>;

/// What a GatewayPlugin grants its plugin: each is refused at load to a
/// component that imports it without the grant.
#[derive(Clone, Debug, Default)]
pub struct Grants {
    /// Shared state, under this scope.
    pub state: Option<Scope>,
    /// Outbound HTTP to these destinations.
    pub egress: Option<sluice_core::EgressGrant>,
}

/// What a granted `reserve` added, until committed or released. Dropped
/// without either, it stays counted (see the WIT).
pub struct Reservation {
    /// Taken when it is settled: a reservation is settled once.
    pub(crate) ticket: Option<Ticket>,
}

/// The most reservations a plugin may hand to the gateway in one request.
pub const MAX_SETTLEMENTS: usize = 32;

/// A reservation a plugin handed to the gateway (`settle-at-end`), to
/// commit by the response's usage when the response ends.
pub struct Settlement {
    pub(crate) access: Arc<StateAccess>,
    pub(crate) plugin: Arc<str>,
    pub(crate) ticket: Ticket,
    pub(crate) weights: Vec<UsageWeights>,
}

impl Settlement {
    /// Commits what the response's `status` and reported (prompt,
    /// completion) `usage` make each check count. The in-process store
    /// answers at once, here; a store that does not (Redis) finishes on a
    /// task of its own, bounded by its response timeout: the response is
    /// not held for it. A failed commit is logged; the reserved amounts
    /// stand.
    pub fn settle(self, status: u16, usage: Option<(u64, u64)>) {
        let Some(amounts) = settled_amounts(&self.weights, status, usage) else { return };
        let Settlement { access, plugin, ticket, .. } = self;
        let mut commit = Box::pin(async move {
            if let Err(error) = access.store.commit(&access.scope, ticket, &amounts).await {
                warn_failed(&plugin, &error);
            }
        });
        // Polled once without a waker: tokio's own wakers are given when
        // the task polls it again.
        if Pin::as_mut(&mut commit).poll(&mut Context::from_waker(Waker::noop())) == Poll::Pending {
            tokio::spawn(commit);
        }
    }
}

/// Settles every reservation of a response (see [`Settlement::settle`]).
pub fn settle_all(settlements: Vec<Settlement>, status: u16, usage: Option<(u64, u64)>) {
    for settlement in settlements {
        settlement.settle(status, usage);
    }
}

/// A store that fails every commit (Redis down) would write a line per
/// response: one every 10 s says it, with how many failed since.
fn warn_failed(plugin: &str, error: &sluice_state::StateError) {
    static LAST_SECOND: AtomicU64 = AtomicU64::new(0);
    static FAILED: AtomicU64 = AtomicU64::new(0);
    let failed = FAILED.fetch_add(1, Ordering::Relaxed) + 1;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let last = LAST_SECOND.load(Ordering::Relaxed);
    if now >= last.saturating_add(10)
        && LAST_SECOND.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    {
        FAILED.store(0, Ordering::Relaxed);
        tracing::warn!(plugin, %error, failed, "a reservation could not be settled at the response's end: its reserved amounts stand");
    }
}
