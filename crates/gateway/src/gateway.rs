use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use sluice_core::{BackendPolicy, LoadReport, ResourceError};
use sluice_oci::Registry;
use sluice_runtime::Runtime;
use tokio::sync::{Semaphore, watch};

use sluice_telemetry::metrics;
use sluice_telemetry::metrics::{ResourceLabels, ResultLabels};

use crate::snapshot::{self, BuildReport, Snapshot};
use crate::upstream::UpstreamClient;
use sluice_core::ConfigUpdate;

#[derive(Clone, Debug)]
pub struct Settings {
    /// Largest request body accepted; larger ones get a 413.
    pub max_body_bytes: usize,
    /// How often plugins from OCI tags with `pullPolicy: Always` are
    /// resolved again while serving.
    pub oci_resync: Duration,
    /// Longest a starting replica stays not ready while a declared plugin
    /// cannot be loaded for a reason that may pass (its registry is
    /// unreachable and the cache is empty). After that it turns ready and
    /// serves without it, so one unreachable registry cannot hold a
    /// rollout back forever.
    pub max_ready_wait: Duration,
    /// The data plane listener's connection limits.
    pub connections: sluice_serve::Limits,
    /// Requests (streams included) in flight at once; past it, a 503.
    pub max_in_flight: usize,
    /// Requests in flight on one connection (HTTP/2 streams); past it, a
    /// 503, so that a few connections cannot take `max_in_flight`.
    pub max_in_flight_per_connection: usize,
    /// The share of `max_in_flight`, in percent (rounded up), that the
    /// connections from one peer address (an IPv6 /64) may hold together;
    /// past it, a 503, so that the rest is left for everyone else.
    pub max_in_flight_per_peer_percent: u8,
    /// Request bodies all requests in flight may hold in memory together;
    /// past it, a 503, so that many large bodies at once cannot exhaust
    /// the container's memory.
    pub max_buffered_body_bytes: usize,
    /// A request body must arrive within this long; a 408 otherwise.
    pub request_body_timeout: Duration,
    /// An upstream that sends nothing for this long, mid-body, is cut off
    /// (the stream ends with an error), releasing the plugin instances
    /// waiting on it.
    pub upstream_idle_timeout: Duration,
    /// Loading one plugin version (pull, compile, configure) may take this
    /// long; past it, the plugin is reported (and retried), and the rest of
    /// the config is applied without waiting for it.
    pub plugin_load_timeout: Duration,
    /// What backends may reach: restricted in Kubernetes mode (a route's
    /// author is not the operator), open in standalone mode unless asked.
    pub backends: Arc<BackendPolicy>,
    /// This gateway's mark on every request it forwards, `1.1 sluice-<id>`
    /// in `via`, the id random per process: a request that comes back with
    /// it is a loop.
    pub via: http::HeaderValue,
    /// Gateways (Sluice's `via` entries) a request may have passed through
    /// already; past it, a 508.
    pub max_gateway_hops: usize,
    /// Upstream response bytes all responses may hold in memory together,
    /// and each backend's share of it (the flags' values, and the budget
    /// itself, shared by the clones of these settings): past it, a 503.
    pub response_buffers: crate::body::ResponseBuffers,
    /// Seal and open MCP session ids (`--mcp-session-keys`): shared by
    /// every replica so that any continues any session.
    pub mcp_session_keys: Arc<crate::mcp::session::SessionKeys>,
    /// The most an MCP route may ask for (`spec.limits`), each a flag.
    pub mcp_limits: sluice_core::McpLimits,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_body_bytes: 4 * 1024 * 1024,
            oci_resync: Duration::from_secs(60),
            max_ready_wait: Duration::from_secs(120),
            connections: sluice_serve::Limits::default(),
            // Envoy's default circuit breaker for requests to a cluster.
            max_in_flight: 1024,
            // Below HTTP/2's usual 100 streams: 16 connections to fill the
            // budget, and the per-peer share stops one address doing that.
            max_in_flight_per_connection: 64,
            // 256 of the default 1024 are always left for other addresses.
            max_in_flight_per_peer_percent: 75,
            max_buffered_body_bytes: 256 * 1024 * 1024,
            request_body_timeout: Duration::from_secs(30),
            upstream_idle_timeout: Duration::from_secs(120),
            plugin_load_timeout: Duration::from_secs(60),
            backends: Arc::default(),
            via: http::HeaderValue::try_from(format!("1.1 sluice-{:016x}", fastrand::u64(..)))
                .unwrap_or(http::HeaderValue::from_static("1.1 sluice-0")),
            max_gateway_hops: 8,
            response_buffers: crate::body::ResponseBuffers::new(
                Self::DEFAULT_MAX_BUFFERED_RESPONSE_BYTES,
                Self::DEFAULT_RESPONSE_BUFFER_BACKEND_PERCENT,
            ),
            mcp_session_keys: Arc::new(crate::mcp::session::SessionKeys::ephemeral()),
            mcp_limits: sluice_core::McpLimits::default(),
        }
    }
}

impl Settings {
    /// See /work/evidence/memory-worst-case.md (docs/security.md): with the
    /// other budgets' defaults, the worst case stays inside a 1 GiB pod.
    pub const DEFAULT_MAX_BUFFERED_RESPONSE_BYTES: usize = 64 * 1024 * 1024;
    pub const DEFAULT_RESPONSE_BUFFER_BACKEND_PERCENT: u8 = 50;
}

/// How often the backends out of rotation are checked for the load report.
const HEALTH_REPORT_EVERY: Duration = Duration::from_secs(2);
/// Waits before building a config again after a transient failure.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The data plane's shared state. Requests load the current snapshot once
/// and keep it to the end; the config loop replaces it whole.
pub struct Gateway {
    pub(crate) snapshot: ArcSwap<Snapshot>,
    pub(crate) report: ArcSwap<Report>,
    /// Per-resource outcome of each applied config, for a source that
    /// writes status (Kubernetes).
    load_reports: watch::Sender<Arc<LoadReport>>,
    /// Set once, never cleared: see [`Gateway::apply`].
    pub(crate) ready: AtomicBool,
    started: Instant,
    /// Shutting down: /readyz says so, so load balancers stop sending new
    /// requests before the listener closes.
    draining: AtomicBool,
    pub(crate) runtime: Runtime,
    /// Fetches plugins with an `oci` source.
    pub(crate) registry: Option<Registry>,
    pub(crate) upstream: UpstreamClient,
    pub(crate) settings: Settings,
    /// One permit per request in flight.
    pub(crate) in_flight: Arc<Semaphore>,
    /// Requests in flight per peer address.
    pub(crate) peers: Arc<PeerShares>,
    /// One permit per byte of request body held in memory.
    pub(crate) body_budget: Arc<Semaphore>,
    /// MCP streams open per session on this replica.
    pub(crate) mcp_streams: Arc<crate::mcp::shares::StreamShares>,
}

/// What the admin API tells about the last config change.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Report {
    /// Problems with the source itself (e.g. a YAML file that does not
    /// parse): while any exist, nothing from the source is applied.
    pub source_errors: Vec<ResourceError>,
    pub build: BuildReport,
}

impl Gateway {
    pub fn new(
        runtime: Runtime,
        registry: Option<Registry>,
        settings: Settings,
    ) -> Result<Arc<Self>, crate::upstream::ClientError> {
        let response_buffers = i64::try_from(settings.response_buffers.max()).unwrap_or(i64::MAX);
        metrics().response_buffer_budget.set(response_buffers);
        Ok(Arc::new(Self {
            registry,
            snapshot: ArcSwap::from_pointee(Snapshot::default()),
            report: ArcSwap::from_pointee(Report::default()),
            load_reports: watch::Sender::new(Arc::new(LoadReport::default())),
            ready: AtomicBool::new(false),
            started: Instant::now(),
            draining: AtomicBool::new(false),
            upstream: UpstreamClient::new(settings.backends.clone())?,
            runtime,
            in_flight: Arc::new(Semaphore::new(settings.max_in_flight.clamp(1, Semaphore::MAX_PERMITS))),
            peers: Arc::new(PeerShares::new(&settings)),
            body_budget: Arc::new(Semaphore::new(settings.max_buffered_body_bytes.clamp(1, Semaphore::MAX_PERMITS))),
            mcp_streams: Arc::default(),
            settings,
        }))
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// The per-resource outcome of every config applied from now on (and
    /// of the last one), including rebuilds after transient failures.
    pub fn load_reports(&self) -> watch::Receiver<Arc<LoadReport>> {
        self.load_reports.subscribe()
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && !self.draining.load(Ordering::Acquire)
    }

    /// Marks the gateway not ready for the rest of its life; requests are
    /// still served.
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Applies every update from a config source: builds the next snapshot
    /// in full (every plugin compiled, configured and instantiated once),
    /// then swaps it in. Runs until the source goes away.
    ///
    /// The same config is built again, with nothing new from the source,
    /// after a transient failure (with backoff) and periodically while some
    /// plugin comes from an OCI tag that may move.
    pub async fn follow(self: Arc<Self>, mut updates: watch::Receiver<Option<ConfigUpdate>>) {
        let mut retry_delay = RETRY_FIRST;
        let mut health = tokio::time::interval(HEALTH_REPORT_EVERY);
        health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let update = updates.borrow_and_update().clone();
            let mut again = None;
            if let Some(update) = update {
                let outcome = self.apply(update).await;
                again = match outcome {
                    Applied::Retry => {
                        let delay = retry_delay;
                        retry_delay = (retry_delay * 2).min(RETRY_MAX);
                        Some(delay)
                    }
                    Applied::Resync => Some(self.settings.oci_resync),
                    Applied::Done => None,
                };
                if !matches!(outcome, Applied::Retry) {
                    retry_delay = RETRY_FIRST;
                }
            }
            let rebuild_at = again.map(|delay| tokio::time::Instant::now() + delay);
            let rebuild = async {
                match rebuild_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(rebuild);
            loop {
                tokio::select! {
                    changed = updates.changed() => if changed.is_err() { return } else { break },
                    () = &mut rebuild => { updates.mark_changed(); break },
                    _ = health.tick() => self.report_ejections(),
                }
            }
        }
    }

    /// Publishes the backends out of rotation again if they changed since
    /// the last load report, so the status a Kubernetes leader writes
    /// shows them.
    fn report_ejections(&self) {
        let ejected = self.snapshot.load().ejected();
        if self.load_reports.borrow().ejected != ejected {
            let mut report = LoadReport::clone(&self.load_reports.borrow());
            report.ejected = ejected;
            self.load_reports.send_replace(Arc::new(report));
        }
    }

    async fn apply(&self, update: ConfigUpdate) -> Applied {
        let mut desired = match update {
            ConfigUpdate::Desired(desired) => desired,
            ConfigUpdate::Invalid(errors) => {
                for error in &errors {
                    tracing::error!(resource = %error.resource, "{}; keeping the last good config", error.message);
                }
                let build = self.report.load().build.clone();
                self.report.store(Arc::new(Report { source_errors: errors, build }));
                metrics().config_generations.get_or_create(&ResultLabels { result: "rejected" }).inc();
                return Applied::Done;
            }
        };
        // A route's author chooses its MCP limits within the operator's caps.
        for route in &mut desired.mcp_routes {
            route.limits = route.limits.within(&self.settings.mcp_limits);
        }
        let previous = self.snapshot.load_full();
        let load_timeout = self.settings.plugin_load_timeout;
        let (next, build) = snapshot::build(
            &self.runtime,
            self.registry.as_ref(),
            &desired,
            &previous,
            load_timeout,
            &self.settings.backends,
        )
        .await;
        for error in &build.errors {
            tracing::error!(resource = %error.resource, "{}", error.message);
        }
        tracing::info!(
            generation = next.generation,
            routes = next.routes().len(),
            errors = build.errors.len(),
            "config applied"
        );
        let outcome = if build.retry {
            Applied::Retry
        } else if desired.plugins.iter().any(|p| p.source.may_move()) {
            Applied::Resync
        } else {
            Applied::Done
        };
        count_applied(&next, &build);
        let ejected = next.ejected();
        self.snapshot.store(Arc::new(next));
        let load_report = LoadReport {
            revision: desired.revision,
            plugins: build.plugins.clone(),
            routes: build.routes.clone(),
            mcp_routes: build.mcp_routes.clone(),
            ejected,
        };
        self.load_reports.send_replace(Arc::new(load_report));
        // Ready once every declared plugin is served or has failed for good
        // (a bad config, a missing module): waiting cannot fix those, and
        // one tenant's mistake must not keep the replica out of service.
        // A plugin whose registry is down may load in a moment, so the
        // replica waits for it, up to `max_ready_wait`. Once ready it stays
        // ready: later failures keep the last good version serving.
        if !build.waiting || self.started.elapsed() >= self.settings.max_ready_wait {
            self.ready.store(true, Ordering::Release);
        }
        self.report.store(Arc::new(Report { source_errors: Vec::new(), build }));
        outcome
    }
}

/// The metrics of a config just applied: its generation, and each declared
/// resource's state (replacing the last config's).
fn count_applied(next: &Snapshot, build: &BuildReport) {
    let m = metrics();
    m.config_generations.get_or_create(&ResultLabels { result: "applied" }).inc();
    m.config_generation.set(i64::try_from(next.generation).unwrap_or(i64::MAX));
    m.resource_state.clear();
    let resources =
        build.plugins.iter().map(|r| ("GatewayPlugin", r)).chain(build.routes.iter().map(|r| ("AIModelRoute", r)));
    for (kind, (key, state)) in resources {
        let labels = ResourceLabels {
            kind,
            namespace: key.namespace.as_str().into(),
            name: key.name.as_str().into(),
            state: match (state.ready, &state.digest) {
                (true, _) => "ready",
                (false, Some(_)) => "degraded",
                (false, None) => "failed",
            },
            reason: state.reason.as_deref().unwrap_or("").into(),
        };
        m.resource_state.get_or_create(&labels).set(1);
    }
}

/// What to do after applying a config.
enum Applied {
    Done,
    /// A transient failure: build the same config again soon.
    Retry,
    /// Tags may move: build the same config again after the resync period.
    Resync,
}

/// The requests in flight of each peer address, within its share of the
/// gateway's. Holds an entry per address with a request in flight, so at
/// most `max_in_flight` entries.
pub(crate) struct PeerShares {
    /// Requests one address may hold; `None` when that is all of them.
    share: Option<usize>,
    held: parking_lot::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
}

impl PeerShares {
    fn new(settings: &Settings) -> Self {
        let percent = usize::from(settings.max_in_flight_per_peer_percent.min(100));
        let share = (settings.max_in_flight.saturating_mul(percent)).div_ceil(100).max(1);
        Self { share: (share < settings.max_in_flight).then_some(share), held: Default::default() }
    }

    /// The share this peer's request needs, if it is within the share.
    pub(crate) fn take(self: &Arc<Self>, peer: std::net::IpAddr) -> Result<Option<PeerShare>, usize> {
        let Some(share) = self.share else { return Ok(None) };
        let mut held = self.held.lock();
        let count = held.entry(peer).or_default();
        if *count >= share {
            return Err(share);
        }
        *count += 1;
        Ok(Some(PeerShare { shares: self.clone(), peer }))
    }
}

/// One request in flight counted against its peer's share.
pub(crate) struct PeerShare {
    shares: Arc<PeerShares>,
    peer: std::net::IpAddr,
}

impl Drop for PeerShare {
    fn drop(&mut self) {
        let mut held = self.shares.held.lock();
        if let Some(count) = held.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.peer);
            }
        }
    }
}
