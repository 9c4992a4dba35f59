use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sluice_core::Isolation;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime::component::{Checkpoint, Instance, Linker};
use wasmtime::{Store, UpdateDeadline};

use crate::bindings::{ChunkAction, Hooks, RequestAction, Response, ResponseAction, ResponseSummary};
use crate::compiler::Compiler;
pub use crate::deadline::Limits;
use crate::deadline::{arm, classify, within};
use crate::epoch::EpochTicker;
use crate::granted::{Granted, Grants, StateAccess};
use crate::guest_log::RateLimit;
use crate::host::TokenCounter;
use crate::host::{DeadlineExceeded, PluginState};
use crate::memory::{GuestMemory, IdlePool, PluginShare};
use crate::request::PluginRequest;
use crate::snapshot::{Budget, Snapshot, Source};
use crate::versions::{Plugin, PluginPre};
use crate::{LoadError, PluginError};

/// What every plugin of a runtime shares.
pub(crate) struct Shared {
    pub memory: Arc<GuestMemory>,
    pub tokens: TokenCounter,
    pub max_instances_per_plugin: usize,
    /// `RuntimeConfig::restore_instances`.
    pub restore_instances: bool,
    pub log_lines_per_second: u32,
    /// What the snapshots of configured plugins may hold together (see
    /// `snapshot.rs`); none are made if that is 0.
    pub snapshot_bytes: Arc<Budget>,
    /// Snapshots are made one at a time: each compiles the module twice.
    pub snapshot_turn: Semaphore,
    /// How long a new `PerRequest` version serves before its snapshot is
    /// made.
    pub snapshot_settle: Duration,
    /// `configure` time spent on a version's new instances, for want of a
    /// snapshot, after which it is made.
    pub snapshot_configure_budget: Duration,
    pub ticker: Arc<EpochTicker>,
    pub compiler: Compiler,
    /// The store granted plugins' state lives in.
    pub state: Arc<dyn sluice_state::Store>,
    /// The gateway's caps on plugins' outbound HTTP.
    pub egress: crate::egress::EgressConfig,
}

/// A compiled component, ready to instantiate cheaply.
pub struct PluginModule {
    digest: String,
    pub(crate) pre: PluginPre,
    /// What `pre` was linked with; its snapshots are linked the same way.
    pub(crate) linker: Linker<PluginState>,
    /// The component itself: each snapshot is made from it.
    pub(crate) bytes: Arc<[u8]>,
    pub(crate) shared: Arc<Shared>,
    /// Whether the component imports `sluice:plugin/state`: it is then
    /// served only to plugins granted state.
    imports_state: bool,
    /// Whether it imports `wasi:http/outgoing-handler`: served only to
    /// plugins granted egress.
    imports_outbound_http: bool,
    /// The snapshots of this module, while some configured plugin uses
    /// them: made once, not per plugin.
    snapshots: Mutex<HashMap<SnapshotKey, Weak<Snapshot>>>,
}

/// A config, and a memory limit (the snapshot must fit in it).
type SnapshotKey = (Arc<str>, usize);

impl PluginModule {
    pub(crate) fn new(
        digest: String,
        pre: PluginPre,
        linker: Linker<PluginState>,
        bytes: Arc<[u8]>,
        shared: Arc<Shared>,
    ) -> Self {
        let imports_state = pre.imports_interface("sluice:plugin/state@");
        let imports_outbound_http = pre.imports_interface(crate::wasi::OUTGOING_HANDLER);
        Self {
            digest,
            pre,
            linker,
            bytes,
            shared,
            imports_state,
            imports_outbound_http,
            snapshots: Mutex::new(HashMap::new()),
        }
    }

    /// `sha256:<hex>`.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Validates `config` by running the plugin's `configure` once on a
    /// fresh instance. The result is what a snapshot serves. Instantiating
    /// and configuring take at most `limits.timeout`, in wall-clock time.
    ///
    /// Then, in the background and once the version has settled, the module
    /// is snapshotted right after `configure` with this config (see
    /// `snapshot.rs`): once that is done, new instances start from the
    /// snapshot instead of calling `configure`. Until then, or if it cannot
    /// be done, each new instance is configured.
    pub async fn configure(
        self: &Arc<Self>,
        name: &str,
        config: &serde_json::Value,
        limits: Limits,
        isolation: Isolation,
        grants: Grants,
    ) -> Result<ConfiguredPlugin, LoadError> {
        // Refused before any of its code runs: a grant is read from the
        // resource, never assumed.
        if self.imports_state && grants.state.is_none() {
            return Err(LoadError::NotGranted(
                "the component imports sluice:plugin/state, which its GatewayPlugin does not grant (spec.state)",
            ));
        }
        if self.imports_outbound_http && grants.egress.is_none() {
            return Err(LoadError::NotGranted(
                "the component imports wasi:http/outgoing-handler, which its GatewayPlugin does not grant \
                 (spec.egress)",
            ));
        }
        let egress = match &grants.egress {
            Some(grant) => {
                Some(Arc::new(crate::egress::Egress::new(name, grant, &self.shared.egress).map_err(LoadError::Egress)?))
            }
            None => None,
        };
        let state = grants.state.map(|scope| Arc::new(StateAccess { store: self.shared.state.clone(), scope }));
        let granted = Granted { state, egress, metrics: Default::default() };
        let mut plugin = ConfiguredPlugin {
            module: self.clone(),
            name: name.into(),
            config: config.to_string().into(),
            limits,
            hooks: Hooks::empty(),
            isolation,
            snapshot: Arc::default(),
            configuring_us: Arc::default(),
            idle: Idle::new(self.shared.memory.share_of(name)),
            busy: Arc::new(Semaphore::new(self.shared.max_instances_per_plugin)),
            log_rate: Arc::new(RateLimit::new(self.shared.log_lines_per_second)),
            granted,
        };
        let started = Instant::now();
        let configured = loop {
            match plugin.configure_live().await {
                Err(Made::PoolFull(_)) if plugin.evict_for_a_slot() => {}
                configured => break configured.map_err(Made::into_error),
            }
        };
        let (live, hooks) = configured.map_err(|error| match error {
            // Capped below its own limit: by its share of the budget.
            PluginError::MemoryLimit(share) if share < limits.max_memory_bytes => LoadError::OverShare(share),
            error => LoadError::Plugin(error),
        })?;
        let took = started.elapsed();
        plugin.hooks = hooks;
        // Idle instances yield their memory to live ones.
        let pool: Arc<dyn IdlePool> = plugin.idle.clone();
        self.shared.memory.register_idle(Arc::downgrade(&pool));
        // A reusable instance is kept: the first request does not pay for it.
        if let Isolation::Reused { .. } = isolation {
            plugin.idle.push(live);
        }
        // A `Reused` plugin makes its snapshot once configuring new
        // instances has cost enough: it may never need many (one request at
        // a time on one thread), and the snapshot's compiled code and memory
        // cost about 4 MiB a plugin.
        if isolation == Isolation::PerRequest {
            plugin.start_snapshot();
            plugin.make_snapshot_after(self.shared.snapshot_settle);
            plugin.configured(took);
        }
        Ok(plugin)
    }

    /// The snapshot of this module configured as `plugin` is: shared with
    /// the plugins configured alike, or started now.
    fn snapshot(self: &Arc<Self>, plugin: &ConfiguredPlugin) -> Arc<Snapshot> {
        let key = (plugin.config.clone(), plugin.limits.max_memory_bytes);
        let mut snapshots = self.snapshots.lock();
        snapshots.retain(|_, snapshot| snapshot.strong_count() > 0);
        if let Some(snapshot) = snapshots.get(&key).and_then(Weak::upgrade) {
            return snapshot;
        }
        let snapshot = crate::snapshot::start(
            self.clone(),
            plugin.name.clone(),
            plugin.config.clone(),
            plugin.limits,
            plugin.hooks,
            plugin.log_rate.clone(),
        );
        snapshots.insert(key, Arc::downgrade(&snapshot));
        snapshot
    }

    /// A store for one instance of this module, with its limits.
    fn new_store(
        &self,
        name: Arc<str>,
        limits: Limits,
        log_rate: Arc<RateLimit>,
        granted: Granted,
    ) -> Store<PluginState> {
        let shared = &self.shared;
        let state = PluginState::new(
            name,
            limits.max_memory_bytes,
            shared.memory.clone(),
            log_rate,
            shared.tokens.clone(),
            shared.ticker.clone(),
            granted,
        );
        let mut store = Store::new(self.pre.engine(), state);
        store.limiter(|state| &mut state.memory);
        // Every epoch tick past the deadline's start, yield to tokio so a
        // busy guest cannot hog a worker thread; once the deadline has
        // passed, trap. A call that sees a second tick has run through a
        // whole one: the epoch ticks fast while it runs.
        store.epoch_deadline_callback(|mut ctx| {
            let state = ctx.data_mut();
            if Instant::now() >= state.deadline {
                return Err(wasmtime::Error::new(DeadlineExceeded));
            }
            if state.ticked {
                state.ticker.call_runs_long();
            }
            state.ticked = true;
            Ok(UpdateDeadline::Yield(1))
        });
        store
    }
}

impl Source for PluginModule {
    fn engine(&self) -> &wasmtime::Engine {
        self.pre.engine()
    }

    fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    fn linker(&self) -> &Linker<PluginState> {
        &self.linker
    }

    /// A snapshot's store has no state: a `configure` that calls the store
    /// is not snapshotted (it calls an import), and runs on every instance.
    fn store(&self, name: Arc<str>, limits: Limits, log_rate: Arc<RateLimit>) -> Store<PluginState> {
        self.new_store(name, limits, log_rate, Granted::default())
    }

    fn budget(&self) -> &Arc<Budget> {
        &self.shared.snapshot_bytes
    }

    fn compiler(&self) -> &Compiler {
        &self.shared.compiler
    }

    fn turn(&self) -> &Semaphore {
        &self.shared.snapshot_turn
    }
}

/// Where a plugin's new instances start from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceStart {
    /// The snapshot taken after `configure`: no `configure` call.
    Snapshot,
    /// A `configure` call each, until the snapshot is made (the version
    /// settles first).
    ConfigureUntilSnapshot,
    /// A `Reused` plugin's idle instance; a new one is configured, and the
    /// snapshot is made once that has cost enough.
    SnapshotWhenNeeded,
    /// A `configure` call each: no snapshot could be made, or none is made.
    Configure,
}

impl InstanceStart {
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceStart::Snapshot => "snapshot",
            InstanceStart::ConfigureUntilSnapshot => "configure-until-snapshot",
            InstanceStart::SnapshotWhenNeeded => "snapshot-when-needed",
            InstanceStart::Configure => "configure",
        }
    }
}

/// A module with a config its `configure` accepted.
#[derive(Clone)]
pub struct ConfiguredPlugin {
    pub(crate) module: Arc<PluginModule>,
    name: Arc<str>,
    config: Arc<str>,
    limits: Limits,
    hooks: Hooks,
    isolation: Isolation,
    /// Idle instances: a `Reused` plugin's as they were left, a `PerRequest`
    /// one's restored to how they were made.
    idle: Arc<Idle>,
    /// One permit per instance serving a request.
    busy: Arc<Semaphore>,
    /// Shared by all its instances.
    log_rate: Arc<RateLimit>,
    /// Where new instances start from once it is made; unset if the
    /// runtime makes no snapshots, or a `Reused` plugin has not needed
    /// enough new instances yet. Shared by the plugin's clones.
    pub(crate) snapshot: Arc<OnceLock<Arc<Snapshot>>>,
    /// Microseconds its new instances have spent in `configure` for want of
    /// a snapshot.
    pub(crate) configuring_us: Arc<AtomicU64>,
    /// Its shared state and outbound HTTP, if granted.
    granted: Granted,
}

/// A configured instance and the store it lives in.
struct Live {
    store: Store<PluginState>,
    bindings: Plugin,
    /// How to return it to the state it was made in, if it can be: made
    /// from a snapshot whose instantiation runs no code.
    restore: Option<Restore>,
}

struct Restore {
    instance: Instance,
    checkpoint: Checkpoint,
    /// What its memories held when it was made.
    memory_used: usize,
}

impl Live {
    /// Returns the instance to the state it was made in, memory, globals,
    /// tables and host state alike: a `PerRequest` instance's next request
    /// sees nothing of this one, as if it had a new instance. False if it
    /// cannot be (not made from a snapshot, or it holds a resource), and it
    /// must be dropped.
    fn restore(&mut self) -> bool {
        let Some(restore) = &self.restore else {
            return false;
        };
        if let Err(error) = restore.instance.restore(&mut self.store, &restore.checkpoint) {
            tracing::debug!(plugin = &*self.store.data().plugin, %error, "a plugin instance could not be restored");
            return false;
        }
        self.store.data_mut().rewind(restore.memory_used);
        true
    }
}

impl ConfiguredPlugin {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn digest(&self) -> &str {
        self.module.digest()
    }

    pub fn hooks(&self) -> Hooks {
        self.hooks
    }

    /// Its shared state, if granted: the store's kind and the caps it holds
    /// under (keys, bytes).
    pub fn state(&self) -> Option<(&'static str, usize, usize)> {
        let access = self.granted.state.as_ref()?;
        let (keys, bytes) = access.store.caps(&access.scope);
        Some((access.store.kind(), keys, bytes))
    }

    pub fn isolation(&self) -> Isolation {
        self.isolation
    }

    /// Its instances serving requests now, and those idle waiting for one.
    pub fn instances(&self) -> (usize, usize) {
        let in_use = self.module.shared.max_instances_per_plugin.saturating_sub(self.busy.available_permits());
        let idle = self.idle.instances.lock().len();
        (in_use, idle)
    }

    /// Where its new instances start from now.
    pub fn instances_start_from(&self) -> InstanceStart {
        match self.snapshot.get() {
            Some(snapshot) if snapshot.ready().is_some() => InstanceStart::Snapshot,
            Some(snapshot) if snapshot.making() => InstanceStart::ConfigureUntilSnapshot,
            None if self.snapshots_on() => InstanceStart::SnapshotWhenNeeded,
            _ => InstanceStart::Configure,
        }
    }

    fn snapshots_on(&self) -> bool {
        self.module.shared.snapshot_bytes.max() > 0
    }

    /// Starts making the snapshot new instances will start from, unless it
    /// is made or being made, or the runtime makes none.
    fn start_snapshot(&self) {
        if self.snapshots_on() {
            self.snapshot.get_or_init(|| self.module.snapshot(self));
        }
    }

    /// The snapshot is made once `settle` has passed, unless it is sooner.
    fn make_snapshot_after(&self, settle: Duration) {
        let Some(snapshot) = self.snapshot.get() else {
            return;
        };
        if settle.is_zero() {
            snapshot.make_now();
            return;
        }
        let snapshot = Arc::downgrade(snapshot);
        tokio::spawn(async move {
            tokio::time::sleep(settle).await;
            if let Some(snapshot) = snapshot.upgrade() {
                snapshot.make_now();
            }
        });
    }

    /// Counts a `configure` call made for want of a snapshot; once they have
    /// cost the budget, the snapshot is made.
    fn configured(&self, took: Duration) {
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let budget = micros(self.module.shared.snapshot_configure_budget);
        let before = self.configuring_us.fetch_add(micros(took), Ordering::Relaxed);
        if before.saturating_add(micros(took)) >= budget {
            self.start_snapshot();
            if let Some(snapshot) = self.snapshot.get() {
                snapshot.make_now();
            }
        }
    }

    /// Waits until the snapshot of this plugin taken after `configure` is
    /// made, or could not be; whether new instances now start from it
    /// instead of calling `configure`. False at once if the runtime makes no
    /// snapshots.
    pub async fn snapshotted(&self) -> bool {
        match self.snapshot.get() {
            Some(snapshot) => snapshot.wait().await,
            None => false,
        }
    }

    /// An instance for one request: an idle one if there is any (with
    /// `PerRequest`, one restored to how it was made), or a new one.
    /// [`PluginError::Overloaded`] at once if the plugin already has its
    /// most instances at work, or none can be made (pool or memory budget
    /// used up, with no idle instance left to give way).
    pub async fn instance(&self) -> Result<PluginInstance, PluginError> {
        let permit = self.busy.clone().try_acquire_owned().map_err(|_| {
            PluginError::Overloaded(format!(
                "{} instances of this plugin are in use",
                self.module.shared.max_instances_per_plugin
            ))
        })?;
        let max_idle = match self.isolation {
            Isolation::PerRequest => Isolation::DEFAULT_MAX_IDLE,
            Isolation::Reused { max_idle } => max_idle,
        };
        let restores = self.isolation == Isolation::PerRequest;
        let home = Home { idle: self.idle.clone(), max_idle: max_idle as usize, restores };
        let reused = home.idle.pop();
        let live = match reused {
            Some(live) => live,
            None => self.instantiate_live().await?,
        };
        Ok(PluginInstance { live: Some(live), timeout: self.limits.timeout, home, tainted: false, _permit: permit })
    }

    /// A fresh, configured instance in a store of its own: from the
    /// snapshot if there is one, or configured now. With the instance pool
    /// full, an idle instance (any plugin's, least recently used) gives up
    /// its slot, as idle memory yields to a live instance.
    async fn instantiate_live(&self) -> Result<Live, PluginError> {
        loop {
            match self.try_instantiate_live().await {
                Err(Made::PoolFull(_)) if self.evict_for_a_slot() => {}
                live => return live.map_err(Made::into_error),
            }
        }
    }

    /// With the instance pool full, drops the least recently used idle
    /// instance of any plugin for its slot; whether there was one.
    fn evict_for_a_slot(&self) -> bool {
        self.module.shared.memory.evict_for_a_slot(self.idle.share())
    }

    async fn try_instantiate_live(&self) -> Result<Live, Made> {
        let Some(ready) = self.snapshot.get().and_then(|snapshot| snapshot.ready()) else {
            let started = Instant::now();
            let live = self.configure_live().await?.0;
            self.configured(started.elapsed());
            return Ok(live);
        };
        let mut store =
            self.module.new_store(self.name.clone(), self.limits, self.log_rate.clone(), self.granted.clone());
        let timeout = self.limits.timeout;
        let deadline = arm(&mut store, timeout);
        let (instance, bindings) = within(deadline, ready.pre.instantiate_with_instance(&mut store))
            .await
            .map_err(|e| Made::from(&store, e, timeout))?;
        // A `PerRequest` instance is restored after each request, then
        // serves the next: a few µs, against making a new one.
        let restorable = ready.restorable && self.module.shared.restore_instances;
        let restore = (self.isolation == Isolation::PerRequest && restorable)
            .then(|| instance.checkpoint(&mut store))
            .flatten()
            .map(|checkpoint| Restore { instance, checkpoint, memory_used: store.data().memory.used() });
        Ok(Live { store, bindings, restore })
    }

    /// A fresh instance of the module, which `configure` has set up.
    async fn configure_live(&self) -> Result<(Live, Hooks), Made> {
        let mut store =
            self.module.new_store(self.name.clone(), self.limits, self.log_rate.clone(), self.granted.clone());
        let timeout = self.limits.timeout;
        let deadline = arm(&mut store, timeout);
        let start = async {
            let bindings = self.module.pre.instantiate_async(&mut store).await?;
            store.data_mut().configuring = true;
            let hooks = bindings.configure(&mut store, &self.config).await?;
            store.data_mut().configuring = false;
            Ok((bindings, hooks))
        };
        let (bindings, hooks) = within(deadline, start).await.map_err(|e| Made::from(&store, e, timeout))?;
        let hooks = hooks.map_err(|why| Made::Failed(PluginError::ConfigRejected(why)))?;
        Ok((Live { store, bindings, restore: None }, hooks))
    }
}

/// Why no instance was made: the instance pool is full, or anything else.
enum Made {
    PoolFull(PluginError),
    Failed(PluginError),
}

impl Made {
    fn from(store: &Store<PluginState>, error: wasmtime::Error, timeout: Duration) -> Made {
        let pool_full = error.chain().any(|e| e.is::<wasmtime::PoolConcurrencyLimitError>());
        let error = classify(store, error, timeout);
        if pool_full { Made::PoolFull(error) } else { Made::Failed(error) }
    }

    fn into_error(self) -> PluginError {
        match self {
            Made::PoolFull(error) | Made::Failed(error) => error,
        }
    }
}

/// Where an instance returns after its request.
struct Home {
    idle: Arc<Idle>,
    max_idle: usize,
    /// Whether it is restored first (`PerRequest`), or kept as it is.
    restores: bool,
}

/// The idle instances of a plugin, each with when it went idle,
/// most recently used last. Registered with the guest memory budget, which
/// drops them, least recently used first, when a live instance needs their
/// memory.
pub(crate) struct Idle {
    instances: Mutex<Vec<(Instant, Live)>>,
    share: Arc<PluginShare>,
}

impl Idle {
    fn new(share: Arc<PluginShare>) -> Arc<Self> {
        Arc::new(Self { instances: Mutex::new(Vec::new()), share })
    }

    fn push(&self, live: Live) {
        self.instances.lock().push((Instant::now(), live));
    }

    /// The most recently used: its pages are the likeliest still resident.
    fn pop(&self) -> Option<Live> {
        self.instances.lock().pop().map(|(_, live)| live)
    }
}

impl IdlePool for Idle {
    fn oldest(&self) -> Option<Instant> {
        self.instances.lock().first().map(|(since, _)| *since)
    }

    fn evict_oldest(&self) -> bool {
        let mut instances = self.instances.lock();
        if instances.is_empty() {
            return false;
        }
        let evicted = instances.remove(0);
        // Dropped after the lock: dropping a store gives its memory back.
        drop(instances);
        drop(evicted);
        true
    }

    fn share(&self) -> &Arc<PluginShare> {
        &self.share
    }
}

/// One plugin instance serving one request, from the request to the end of
/// the response body.
pub struct PluginInstance {
    live: Option<Live>,
    timeout: Duration,
    home: Home,
    /// A call failed, or was abandoned midway (the request future was
    /// dropped): the guest's state is unknown, so it is never reused.
    tainted: bool,
    /// Counts this instance against its plugin's concurrency limit.
    _permit: OwnedSemaphorePermit,
}

impl PluginInstance {
    /// The request this instance serves from now on: its log lines name it.
    pub fn serve_request(&mut self, request_id: Arc<str>) {
        if let Some(live) = &mut self.live {
            live.store.data_mut().request_id = Some(request_id);
        }
    }

    /// The request's trace (its trace id, if sampled): the plugin's
    /// outbound calls carry it in `traceparent`, as child spans.
    pub fn serve_trace(&mut self, trace_id: Option<[u8; 16]>) {
        if let Some(live) = &mut self.live {
            live.store.data_mut().egress.trace = trace_id;
        }
    }

    /// The outbound calls the plugin made since the last time they were
    /// taken, for the request's trace.
    pub fn take_outbound_calls(&mut self) -> Vec<crate::egress::OutboundCall> {
        self.live
            .as_mut()
            .map(|live| std::mem::take(&mut *live.store.data_mut().egress.calls.lock()))
            .unwrap_or_default()
    }

    /// The reservations the plugin handed to the gateway in its request
    /// hook (`settle-at-end`), for the response's end.
    pub fn take_settlements(&mut self) -> Vec<crate::granted::Settlement> {
        self.live.as_mut().map(|live| std::mem::take(&mut live.store.data_mut().settlements)).unwrap_or_default()
    }

    /// Runs the request hook: the plugin's edits are made to `request` as
    /// it goes. On an error they may have been made in part; a caller that
    /// goes on without the plugin (`failurePolicy: Open`) keeps a copy.
    pub async fn request_filter(&mut self, request: &mut PluginRequest) -> Result<RequestAction, PluginError> {
        let action = self.call(async |plugin, store| plugin.request_filter(store, request).await).await?;
        match request.take_invalid() {
            Some(why) => Err(PluginError::InvalidEdit(why)),
            None => Ok(action),
        }
    }

    pub async fn response_filter(&mut self, response: &Response) -> Result<ResponseAction, PluginError> {
        self.call(async |plugin, store| plugin.response_filter(store, response).await).await
    }

    pub async fn response_chunk(&mut self, data: &str) -> Result<ChunkAction, PluginError> {
        self.call(async |plugin, store| plugin.response_chunk(store, data).await).await
    }

    pub async fn response_body(&mut self, body: &[u8]) -> Result<Option<Vec<u8>>, PluginError> {
        self.call(async |plugin, store| plugin.response_body(store, body).await).await
    }

    pub async fn response_end(&mut self, summary: &ResponseSummary) -> Result<(), PluginError> {
        self.call(async |plugin, store| plugin.response_end(store, *summary).await).await
    }

    async fn call<T>(
        &mut self,
        call: impl AsyncFnOnce(&Plugin, &mut Store<PluginState>) -> wasmtime::Result<T>,
    ) -> Result<T, PluginError> {
        let Some(live) = &mut self.live else {
            return Err(PluginError::Trap("the instance was already released".into()));
        };
        let deadline = arm(&mut live.store, self.timeout);
        self.tainted = true;
        // Pinned where it is made: the call's future is large (wasmtime's,
        // the bindings' and the hook's state), and each wrapper it was
        // moved into copied all of it.
        let result = within(deadline, std::pin::pin!(call(&live.bindings, &mut live.store))).await;
        let result = result.map_err(|e| classify(&live.store, e, self.timeout));
        self.tainted = result.is_err();
        result
    }
}

impl Drop for PluginInstance {
    fn drop(&mut self) {
        if self.tainted {
            return;
        }
        if let Some(mut live) = self.live.take() {
            let home = &self.home;
            // `PerRequest`: only an instance returned to how it was made.
            if home.restores && !live.restore() {
                return;
            }
            let mut idle = home.idle.instances.lock();
            if idle.len() < home.max_idle {
                idle.push((Instant::now(), live));
                return;
            }
            // Dropped after the lock.
            drop(idle);
            drop(live);
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod mcp_tests;

#[cfg(test)]
mod versions_tests;
