//! Configure once per plugin version, not per instance.
//!
//! Once `configure` has accepted a config, the module is pre-initialised
//! with it (Wizer): instrumented, instantiated, configured, and its linear
//! memories and globals written into a new component, which the runtime's
//! engine compiles. A new instance then starts from that snapshot: a fresh
//! instance with fresh memory, copy-on-write from the snapshot's image, and
//! no `configure` call. Isolation is the same as configuring each instance.
//!
//! A snapshot cannot hold what an import returned (a resource handle, random
//! bytes, the time, a log line already written), so every import traps while
//! the snapshot's instance starts and configures, but two: the seed of hash
//! maps' flooding protection, which Rust's std asks for as soon as a
//! `HashMap` (or a `serde_json` map) is made, and which WASI lets a host make
//! deterministic; and `metrics.declare`, whose declaration the host kept
//! from the plugin's first `configure` (it answers `ok` here). A plugin that calls another import there, or that Wizer
//! cannot snapshot, keeps being configured per instance; the reason is logged
//! once, at info.
//!
//! Making a snapshot compiles the module twice, a few hundred ms of CPU
//! beside the requests, and the snapshot holds a few MiB: it is made once a
//! version is likely to pay for it. A `PerRequest` version waits until it
//! has served a while (`RuntimeConfig::snapshot_settle`), so a version
//! replaced at once (a burst of config changes) never costs the compile. A
//! `Reused` one, which makes new instances only when more requests overlap
//! than it has idle, waits until it needs them often. Either is snapshotted
//! sooner once configuring its new instances has cost
//! `RuntimeConfig::snapshot_configure_budget` (a third of what a small
//! plugin's snapshot costs): a guard compiling regexes in `configure` is
//! snapshotted after a few requests, not after a second of them.
//!
//! The snapshot is made in the background, one at a time per runtime, with
//! the plugin's limits: its deadline for instantiating and configuring, its
//! memory limit, the shared guest memory budget. One that finds every
//! instance slot (or the memory budget) taken by requests is tried again,
//! 0.5 s later and then twice as long each time, five times: a busy moment
//! does not cost a version its snapshot for good. A guest holding more than
//! `MAX_SNAPSHOT_MEMORY` after `configure` is not snapshotted (making one
//! copies that memory in the host), and all snapshots together hold at most
//! `RuntimeConfig::max_snapshot_bytes`. Wizer panics on some inputs: it runs
//! on a blocking thread, whose panic fails only the snapshot.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use tokio::sync::{Notify, watch};
use wasmtime::component::{Component, Instance, Lift, Linker, ResourceType, WasmList};
use wasmtime::{Store, format_err};
use wasmtime_wasi::WasiView as _;
use wasmtime_wasi::p2::bindings::random::insecure_seed;
use wasmtime_wizer::{ComponentInstanceState, Wizer};

use crate::PluginError;
use crate::bindings::Hooks;
use crate::compiler::Compiler;
use crate::deadline::{Limits, arm, arm_trusted, classify};
use crate::guest_log::RateLimit;
use crate::host::PluginState;
use crate::request::PluginRequest;
use crate::versions::{Plugin, PluginPre};

/// What a snapshot is made from: a compiled plugin module.
pub(crate) trait Source: Send + Sync + 'static {
    fn engine(&self) -> &wasmtime::Engine;
    /// The component's bytes.
    fn bytes(&self) -> &[u8];
    /// What the module's instances are linked with.
    fn linker(&self) -> &Linker<PluginState>;
    /// A store with the plugin's limits, as the module's instances get.
    fn store(&self, name: Arc<str>, limits: Limits, log_rate: Arc<RateLimit>) -> Store<PluginState>;
    fn budget(&self) -> &Arc<Budget>;
    /// Compiles for [`Source::engine`].
    fn compiler(&self) -> &Compiler;
    /// Held while a snapshot is made: one at a time.
    fn turn(&self) -> &tokio::sync::Semaphore;
}

/// A plugin version's snapshot after `configure`, or the making of one.
pub(crate) struct Snapshot {
    state: watch::Receiver<State>,
    /// Wakes the maker, which waits until told to make it (`make_now`) or
    /// until no one wants it.
    wake: Arc<Notify>,
}

enum State {
    Making,
    /// Holds its size in the budget until the last plugin using it is gone.
    Ready {
        ready: Ready,
        _reserved: Reserved,
    },
    /// Instances are configured one by one.
    Unavailable,
}

impl Snapshot {
    /// What to instantiate, once the snapshot is made.
    pub fn ready(&self) -> Option<Ready> {
        match &*self.state.borrow() {
            State::Ready { ready, .. } => Some(ready.clone()),
            State::Making | State::Unavailable => None,
        }
    }

    /// Whether it is still being made.
    pub fn making(&self) -> bool {
        matches!(*self.state.borrow(), State::Making)
    }

    /// Makes it as soon as it is this runtime's turn, unless it is made or
    /// being made.
    pub fn make_now(&self) {
        self.wake.notify_one();
    }

    /// Waits until making the snapshot has ended; whether it was made.
    pub async fn wait(&self) -> bool {
        let mut state = self.state.clone();
        // An error: the maker is gone without a word (its task was dropped).
        state
            .wait_for(|state| !matches!(state, State::Making))
            .await
            .is_ok_and(|state| matches!(*state, State::Ready { .. }))
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        // A maker still waiting gives up now.
        self.wake.notify_one();
    }
}

/// The snapshot of `module` configured with `config`, which its `configure`
/// accepted with `hooks`: made once [`Snapshot::make_now`] is called. It is
/// abandoned between steps once no one holds the returned [`Snapshot`] (a
/// new config, or shutting down: the process waits for blocking threads).
pub(crate) fn start<M: Source>(
    module: Arc<M>,
    name: Arc<str>,
    config: Arc<str>,
    limits: Limits,
    hooks: Hooks,
    log_rate: Arc<RateLimit>,
) -> Arc<Snapshot> {
    let (made, state) = watch::channel(State::Making);
    let wake = Arc::new(Notify::new());
    let snapshot = Arc::new(Snapshot { state, wake: wake.clone() });
    let wanted = Arc::downgrade(&snapshot);
    tokio::spawn(async move {
        wake.notified().await;
        if wanted.strong_count() == 0 {
            return;
        }
        let turn = module.clone();
        let Ok(_turn) = turn.turn().acquire().await else {
            return;
        };
        let started = Instant::now();
        let plugin = name.clone();
        let mut retry = 0;
        let outcome = loop {
            let runtime = tokio::runtime::Handle::current();
            let wanted = wanted.clone();
            let abandoned = move || wanted.strong_count() == 0;
            let (module, name, config, log_rate) = (module.clone(), name.clone(), config.clone(), log_rate.clone());
            let job = move || runtime.block_on(make(&*module, name, &config, limits, hooks, log_rate, abandoned));
            // Snapshots are made beside serving, at background priority.
            let outcome = match crate::background::run("sluice-snapshot", job).await {
                Ok(outcome) => outcome,
                Err(panic) => Err(format!("the snapshot tool panicked: {panic}").into()),
            };
            // Every instance slot taken by requests is a moment, not a
            // property of the plugin: tried again later, not given up.
            match outcome {
                Err(Failed { busy: true, .. }) if retry < BUSY_RETRIES && !made.is_closed() => {
                    tokio::time::sleep(BUSY_BACKOFF * 2u32.pow(retry)).await;
                    retry += 1;
                }
                outcome => break outcome.map_err(|failed| failed.why),
            }
        };
        let state = match outcome {
            Ok((ready, reserved)) => {
                let (ms, kib) = (started.elapsed().as_millis() as u64, reserved.bytes >> 10);
                tracing::debug!(
                    plugin = &*plugin,
                    ms,
                    kib,
                    "plugin instances start from a snapshot taken after configure"
                );
                State::Ready { ready, _reserved: reserved }
            }
            Err(_) if made.is_closed() => return,
            // The reason never quotes the config, which may hold Secrets.
            Err(reason) => {
                tracing::info!(plugin = &*plugin, reason, "plugin instances are each configured: no snapshot");
                State::Unavailable
            }
        };
        made.send_replace(state);
    });
    snapshot
}

/// How often a snapshot that found every instance slot taken is tried
/// again, the first after [`BUSY_BACKOFF`], each wait twice the last.
const BUSY_RETRIES: u32 = 5;
const BUSY_BACKOFF: std::time::Duration = std::time::Duration::from_millis(500);

/// Why a snapshot was not made, and whether only because the instance pool
/// (or the memory budget) was in use by requests at the time.
struct Failed {
    why: String,
    busy: bool,
}

impl From<String> for Failed {
    fn from(why: String) -> Self {
        Failed { why, busy: false }
    }
}

impl From<&str> for Failed {
    fn from(why: &str) -> Self {
        Failed { why: why.into(), busy: false }
    }
}

/// A failure to instantiate, busy if the pool or the memory budget was.
fn instantiating(context: &str, error: PluginError) -> Failed {
    let busy = matches!(error, PluginError::Overloaded(_));
    Failed { why: format!("{context}: {error}"), busy }
}

/// Instruments the module, configures an instance of it with every import
/// trapping, snapshots it and compiles the snapshot. Runs on a blocking
/// thread: instrumenting and compiling take CPU.
async fn make<M: Source>(
    module: &M,
    name: Arc<str>,
    config: &str,
    limits: Limits,
    hooks: Hooks,
    log_rate: Arc<RateLimit>,
    abandoned: impl Fn() -> bool,
) -> Result<(Ready, Reserved), Failed> {
    let unless_abandoned = || if abandoned() { Err(Failed::from("abandoned")) } else { Ok(()) };
    unless_abandoned()?;
    let engine = module.engine();
    let wizer = Wizer::new();
    let (context, instrumented) = wizer.instrument_component(module.bytes()).map_err(|e| format!("{e:#}"))?;
    unless_abandoned()?;
    let component =
        module.compiler().compile(engine, &instrumented).map_err(|e| format!("compiling it instrumented: {e:#}"))?;
    unless_abandoned()?;
    let linker = snapshot_linker(&component).map_err(|e| format!("{e:#}"))?;

    // Nothing here waits in the host (every import traps or returns at once),
    // so the epoch deadline alone bounds the guest, without a wall-clock
    // timer.
    let mut store = module.store(name.clone(), limits, log_rate.clone());
    let timeout = limits.timeout;
    arm(&mut store, timeout);
    let configured = async {
        let instance = linker.instantiate_async(&mut store, &component).await?;
        let bindings = Plugin::new(&mut store, &component, &instance)?;
        let answer = bindings.configure(&mut store, config).await?;
        Ok((instance, answer))
    };
    let (instance, answer) = configured.await.map_err(|e| match classify(&store, e, timeout) {
        PluginError::Trap(why) if why.starts_with("unknown import: `") => {
            let import = why.split('`').nth(1).unwrap_or_default();
            Failed::from(format!(
                "it calls {import} while starting or configuring, and a snapshot cannot hold what that returns"
            ))
        }
        error => instantiating("configuring it with every import trapping", error),
    })?;
    // Its message may quote the config: it is left out.
    if answer != Ok(hooks) {
        return Err("configure answered differently with every import trapping".into());
    }
    let memory = store.data().memory.used();
    if memory > MAX_SNAPSHOT_MEMORY {
        let mib = |bytes| bytes >> 20;
        return Err(format!(
            "its memory after configure, {} MiB, is more than a snapshot may hold, {} MiB",
            mib(memory),
            mib(MAX_SNAPSHOT_MEMORY)
        )
        .into());
    }

    // Reading the state out runs only Wizer's accessors (a global's value, a
    // memory's bounds), none of the plugin's code; the time goes to Wizer
    // scanning the memory in the host, between calls.
    arm_trusted(&mut store);
    let mut state = Accessors { store: &mut store, instance, error: None };
    let snapshot = wizer.snapshot_component(&context, &mut state).await.map_err(|e| format!("{e:#}"));
    if let Some(error) = state.error {
        return Err(format!("reading its state: {error}").into());
    }
    let snapshot = snapshot?;
    drop(store);
    unless_abandoned()?;

    let component =
        module.compiler().compile(engine, &snapshot).map_err(|e| format!("compiling the snapshot: {e:#}"))?;
    // Its compiled code and data, memory image included.
    let bytes = component.image_range().end.addr() - component.image_range().start.addr();
    let reserved = Budget::reserve(module.budget(), bytes).ok_or_else(|| {
        let budget = module.budget();
        format!(
            "its snapshot needs {} KiB, and the snapshots of all plugins hold {} of at most {} KiB \
             (max_snapshot_bytes)",
            bytes >> 10,
            budget.used.load(Ordering::Acquire) >> 10,
            budget.max >> 10
        )
    })?;
    let pre = PluginPre::new(module.linker(), &component).map_err(|e| format!("{e:#}"))?;
    // Check that it starts within the plugin's limits, once, rather than
    // fail requests.
    let mut store = module.store(name, limits, log_rate);
    arm(&mut store, timeout);
    if let Err(e) = pre.instantiate_async(&mut store).await {
        return Err(instantiating("starting the snapshot", classify(&store, e, timeout)));
    }
    Ok((Ready { pre, restorable: starts_nothing(&snapshot) }, reserved))
}

/// A made snapshot, ready to instantiate.
#[derive(Clone)]
pub(crate) struct Ready {
    pub pre: PluginPre,
    /// Whether its instances can be restored to the state they were made in
    /// (`wasmtime::component::Instance::restore`), which returns each core
    /// instance to its module's image: true unless instantiating runs code.
    pub restorable: bool,
}

/// Whether instantiating `component` runs none of its code: no core module
/// in it has a `start` function. (Wizer leaves none in a snapshot of Rust
/// or C; a malformed section counts as one.)
fn starts_nothing(component: &[u8]) -> bool {
    wasmparser::Parser::new(0)
        .parse_all(component)
        .all(|payload| matches!(payload, Ok(payload) if !matches!(payload, wasmparser::Payload::StartSection { .. })))
}

/// What all snapshots hold together, against a maximum.
pub(crate) struct Budget {
    used: AtomicUsize,
    max: usize,
}

impl Budget {
    pub fn new(max: usize) -> Self {
        Self { used: AtomicUsize::new(0), max }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// Takes `bytes` from the budget, if that many are left, until the
    /// returned value is dropped.
    fn reserve(budget: &Arc<Budget>, bytes: usize) -> Option<Reserved> {
        let fits = |used: usize| used.checked_add(bytes).filter(|&n| n <= budget.max);
        budget.used.fetch_update(Ordering::AcqRel, Ordering::Acquire, fits).ok()?;
        Some(Reserved { budget: budget.clone(), bytes })
    }
}

/// A snapshot's part of the budget.
struct Reserved {
    budget: Arc<Budget>,
    bytes: usize,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// The most guest memory a snapshot is made of: making one holds a few
/// copies of it in the host, outside the guest memory budget. Rust plugins
/// hold about 1 MiB after `configure`, Python and JavaScript ones 10–15 MiB.
const MAX_SNAPSHOT_MEMORY: usize = 64 << 20;

/// Every import of `component` traps, but `wasi:random/insecure-seed`: "not
/// required to be computed from a CSPRNG, and may even be entirely
/// deterministic", called once by a language runtime to seed its hash maps
/// (Rust's `RandomState`). The instances of a snapshot share the seed, a
/// random one per snapshot, unknown to clients.
fn snapshot_linker(component: &Component) -> wasmtime::Result<Linker<PluginState>> {
    let mut linker = Linker::new(component.engine());
    linker.define_unknown_imports_as_traps(component)?;
    linker.allow_shadowing(true);
    for (name, _) in component.component_type().imports(component.engine()) {
        // The request resource is a type, not a function: it must be the
        // host's own for the exports that take it to type-check. Nothing
        // can make one during `configure`.
        if name.starts_with(REQUEST_TYPES) {
            linker.instance(name)?.resource("request", ResourceType::host::<PluginRequest>(), |_, _| Ok(()))?;
        }
        // What `configure` declares was kept from the plugin's first,
        // live `configure` (the same config declares the same): here it is
        // only answered.
        if name.starts_with(METRICS) {
            linker
                .instance(name)?
                .func_wrap("declare", |_, (_,): (Vec<crate::bindings::v3::sluice::plugin::metrics::Metric>,)| {
                    Ok((Ok::<(), String>(()),))
                })?;
        }
        if name.starts_with(INSECURE_SEED) {
            linker.instance(name)?.func_wrap("insecure-seed", |mut store, (): ()| {
                let state: &mut PluginState = store.data_mut();
                insecure_seed::Host::insecure_seed(state.ctx().ctx.random()).map(|seed| (seed,))
            })?;
        }
    }
    Ok(linker)
}

const INSECURE_SEED: &str = "wasi:random/insecure-seed@";
const METRICS: &str = "sluice:plugin/metrics@0.3";
const REQUEST_TYPES: &str = "sluice:plugin/types@0.3";

/// Reads an instrumented instance's state for Wizer, through the functions
/// instrumenting exported. Wizer's interface cannot fail, so the first
/// error is kept here, and the snapshot is then discarded. (After an error
/// Wizer may panic on the empty memory it is given: that panic ends only the
/// snapshot.)
struct Accessors<'a> {
    store: &'a mut Store<PluginState>,
    instance: Instance,
    error: Option<String>,
}

impl Accessors<'_> {
    async fn call<R: Lift + Send + Sync + 'static>(&mut self, instance: &str, func: &str) -> Option<R> {
        if self.error.is_some() {
            return None;
        }
        let result = async {
            let missing = || format_err!("no export {instance}#{func}");
            let (_, parent) = self.instance.get_export(&mut *self.store, None, instance).ok_or_else(missing)?;
            let (_, index) = self.instance.get_export(&mut *self.store, Some(&parent), func).ok_or_else(missing)?;
            let func = self.instance.get_typed_func::<(), (R,)>(&mut *self.store, index)?;
            Ok::<_, wasmtime::Error>(func.call_async(&mut *self.store, ()).await?.0)
        };
        match result.await {
            Ok(value) => Some(value),
            Err(e) => {
                self.error = Some(format!("{e:#}"));
                None
            }
        }
    }
}

impl ComponentInstanceState for Accessors<'_> {
    async fn call_func_ret_list_u8(&mut self, instance: &str, func: &str, contents: impl FnOnce(&[u8]) + Send) {
        match self.call::<WasmList<u8>>(instance, func).await {
            Some(list) => contents(list.as_le_slice(&*self.store)),
            None => contents(&[]),
        }
    }

    async fn call_func_ret_s32(&mut self, instance: &str, func: &str) -> i32 {
        self.call(instance, func).await.unwrap_or_default()
    }

    async fn call_func_ret_s64(&mut self, instance: &str, func: &str) -> i64 {
        self.call(instance, func).await.unwrap_or_default()
    }

    async fn call_func_ret_f32(&mut self, instance: &str, func: &str) -> u32 {
        self.call::<f32>(instance, func).await.unwrap_or_default().to_bits()
    }

    async fn call_func_ret_f64(&mut self, instance: &str, func: &str) -> u64 {
        self.call::<f64>(instance, func).await.unwrap_or_default().to_bits()
    }
}

#[cfg(test)]
mod tests;
