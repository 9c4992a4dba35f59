// Calls that need `unsafe`, each block with a SAFETY: comment saying why
// it is sound (clippy::undocumented_unsafe_blocks checks there is one).
#![allow(unsafe_code)]
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::compiler::Compiler;
use crate::epoch::EpochTicker;
use crate::host::{PluginState, TokenCounter};
use crate::memory::GuestMemory;
use crate::plugin::{PluginModule, Shared};
use crate::versions::PluginPre;
use crate::{LoadError, digest_of};

#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// Where precompiled modules are kept across restarts; none disables it.
    pub cache_dir: Option<PathBuf>,
    /// Plugin instances alive at once across all requests (the pool's size).
    pub max_instances: u32,
    /// The most linear memory any one plugin may be given.
    pub max_memory_bytes: usize,
    /// The linear memory all plugin instances may hold together. The
    /// default fits a 1 GiB container: 256 MiB of guests, next to 256 MiB of
    /// buffered request bodies and 64 MiB of response buffers (the gateway's
    /// defaults), 96 MiB of snapshots, the two tokenizers, compiled plugins
    /// and the rest of the process (docs/security.md sums them, budget by
    /// budget).
    pub max_guest_memory_bytes: usize,
    /// The share of `max_guest_memory_bytes` one namespace's plugin
    /// instances may hold together, busy or idle, in percent: one tenant
    /// cannot take the whole budget.
    pub guest_memory_namespace_percent: u8,
    /// The share one plugin's instances (all its versions) may hold
    /// together, in percent; an instance alone is capped at it too, and a
    /// plugin whose `configure` needs more is refused at load.
    pub guest_memory_plugin_percent: u8,
    /// Instances of one plugin version alive at once (requests in its hooks,
    /// and responses it waits on). Past it, and past the pool or the memory
    /// budget, [`crate::PluginError::Overloaded`].
    pub max_instances_per_plugin: u32,
    /// Threads counting tokens at once for plugins, off the async workers.
    pub token_counting_threads: usize,
    /// Log lines each plugin may write per second (in bursts of twice
    /// that); the rest are dropped and counted.
    pub plugin_log_lines_per_second: u32,
    /// Each plugin version is snapshotted right after `configure` (a
    /// `Reused` one once it first needs a new instance), and its instances
    /// start from the snapshot instead of being configured one by one (see
    /// [`crate::ConfiguredPlugin::snapshotted`]). A snapshot holds
    /// its own compiled copy of the plugin and of its memory after
    /// `configure` (0.5 MiB for a small Rust plugin, 4 MiB with regexes,
    /// 35 MiB for Python or JavaScript): this bounds what all snapshots hold
    /// together. Past it, new plugin versions are configured per instance;
    /// 0 turns snapshots off.
    pub max_snapshot_bytes: usize,
    /// How much of each linear memory and table a finished instance leaves
    /// resident in its pool slot, for the next instance to reuse instead of
    /// faulting its pages in again: the dirty pages are reset in place. Only
    /// where Linux's `PAGEMAP_SCAN` (6.7 and later) finds the dirty pages;
    /// without it, resetting resident pages costs more than the faults it
    /// saves, and this is ignored. It costs up to twice this much resident
    /// memory per idle slot (wasmtime keeps up to 100 warm); 0 turns it off.
    pub keep_resident_bytes: usize,
    /// Whether a `PerRequest` instance made from a snapshot is restored to
    /// how it was made after its request, and serves the next, rather than
    /// dropped for a new one: the same isolation for a third of the cost
    /// (`wasmtime::component::Instance::restore`, a patch Sluice carries:
    /// `vendor/wasmtime/SLUICE.md`). False makes a new instance for every
    /// request, as before the patch.
    pub restore_instances: bool,
    /// How long a new `PerRequest` plugin version serves, its instances
    /// configured one by one, before its snapshot is made. Versions replaced
    /// within it (a burst of config changes) never cost the snapshot's
    /// compile, which competes with requests for the CPU. 0 makes each at
    /// once.
    pub snapshot_settle: Duration,
    /// A version is snapshotted, settled or not (and a `Reused` one at all),
    /// once its new instances have spent this long in `configure` for want
    /// of a snapshot: a third of what a small Rust plugin's snapshot costs
    /// to make, so configuring never costs much more than the snapshot
    /// would have. 0: at the first such instance.
    pub snapshot_configure_budget: Duration,
    /// The caps of the in-process store granted plugins' shared state lives
    /// in, unless `state_store` names another.
    pub state_limits: sluice_state::Limits,
    /// Where granted plugins' shared state lives: by default in process.
    pub state_store: Option<StateStore>,
    /// The caps on plugins' outbound HTTP, and which addresses it may reach.
    pub egress: crate::egress::EgressConfig,
}

/// A state store for the runtime's plugins (Redis, shared by replicas).
#[derive(Clone)]
pub struct StateStore(pub Arc<dyn sluice_state::Store>);

impl std::fmt::Debug for StateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StateStore({})", self.0.kind())
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            cache_dir: None,
            max_instances: 1000,
            max_memory_bytes: 1 << 30,
            max_guest_memory_bytes: 256 << 20,
            guest_memory_namespace_percent: 50,
            guest_memory_plugin_percent: 50,
            max_instances_per_plugin: 256,
            // Half the cores: the async workers keep the rest.
            token_counting_threads: (cores / 2).max(1),
            plugin_log_lines_per_second: 100,
            max_snapshot_bytes: 96 << 20,
            // A fresh Rust plugin instance touches about this much at the low
            // addresses of its memory: keeping it halves a request's cost.
            keep_resident_bytes: 64 << 10,
            restore_instances: true,
            // Under 100 swaps in 20 s on 2 cores, snapshots made at once took
            // p99 latency from 1.0 to 1.6–2.3× steady; with none made, 0.9–1.2×.
            snapshot_settle: Duration::from_secs(1),
            snapshot_configure_budget: Duration::from_millis(100),
            state_limits: sluice_state::Limits::default(),
            state_store: None,
            egress: crate::egress::EgressConfig::default(),
        }
    }
}

/// How often plugins' ended windows and expired entries are dropped, for
/// plugins that make no calls that would drop them.
const STATE_SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Sweeps the state store now and then, while the runtime lives, if there
/// is an async runtime to do it on.
fn sweep_state(store: &Arc<dyn sluice_state::Store>) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else { return };
    let store = Arc::downgrade(store);
    handle.spawn(async move {
        let mut every = tokio::time::interval(STATE_SWEEP_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let Some(store) = store.upgrade() else { return };
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            store.sweep(u64::try_from(now.as_millis()).unwrap_or(u64::MAX));
        }
    });
}

/// The plugin runtime could not start.
#[derive(Debug, thiserror::Error)]
#[error("starting the plugin runtime: {0}")]
pub struct StartError(String);

impl StartError {
    fn wasmtime(error: wasmtime::Error) -> Self {
        Self(format!("{error:#}"))
    }
}

/// The one wasmtime engine of a process, and the modules compiled with it.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    /// What every plugin is linked with; each component then gets its own
    /// copy, restricted to the WASI it is granted (`wasi::restrict`).
    linker: Linker<PluginState>,
    shared: Arc<Shared>,
    cache_dir: Option<PathBuf>,
    /// Compiled modules by digest, alive while some snapshot uses them, so a
    /// config change that keeps a module does not compile it again.
    modules: Mutex<HashMap<String, Weak<PluginModule>>>,
    /// One lock per digest being compiled, so plugins sharing a module
    /// loaded at the same time compile it once, not side by side.
    compiling: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

impl Runtime {
    pub fn new(config: RuntimeConfig) -> Result<Self, StartError> {
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(config.max_instances)
            .total_core_instances(config.max_instances * 4)
            .total_memories(config.max_instances * 2)
            .total_tables(config.max_instances * 4)
            .total_stacks(config.max_instances)
            .max_memories_per_component(4)
            .max_tables_per_component(8)
            .max_memory_size(config.max_memory_bytes.min(config.max_guest_memory_bytes));
        if config.keep_resident_bytes > 0 && PoolingAllocationConfig::is_pagemap_scan_available() {
            pool.linear_memory_keep_resident(config.keep_resident_bytes)
                .table_keep_resident(config.keep_resident_bytes)
                .pagemap_scan(Enabled::Yes);
        }
        let mut wasm = Config::new();
        wasm.epoch_interruption(true);
        let compiler = Compiler::new(wasm.clone());
        wasm.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        crate::background::lower_compile_threads();
        crate::background::bound_freed_memory();
        let engine = Engine::new(&wasm).map_err(StartError::wasmtime)?;

        let mut linker = crate::wasi::base_linker(&engine).map_err(StartError::wasmtime)?;
        crate::versions::add_to_linker(&mut linker).map_err(StartError::wasmtime)?;
        let shared = Arc::new(Shared {
            memory: GuestMemory::metered(
                config.max_guest_memory_bytes,
                config.guest_memory_namespace_percent,
                config.guest_memory_plugin_percent,
            ),
            tokens: TokenCounter::new(config.token_counting_threads),
            max_instances_per_plugin: config.max_instances_per_plugin.max(1) as usize,
            restore_instances: config.restore_instances,
            log_lines_per_second: config.plugin_log_lines_per_second,
            snapshot_bytes: Arc::new(crate::snapshot::Budget::new(config.max_snapshot_bytes)),
            snapshot_turn: tokio::sync::Semaphore::new(1),
            snapshot_settle: config.snapshot_settle,
            snapshot_configure_budget: config.snapshot_configure_budget,
            ticker: EpochTicker::start(&engine),
            compiler,
            state: match &config.state_store {
                Some(StateStore(store)) => store.clone(),
                None => Arc::new(sluice_state::MemoryStore::new(config.state_limits.clone())),
            },
            egress: config.egress.clone(),
        });
        sweep_state(&shared.state);

        if let Some(dir) = &config.cache_dir {
            prepare_cache_dir(dir)?;
        }
        Ok(Self {
            inner: Arc::new(Inner {
                engine,
                linker,
                shared,
                cache_dir: config.cache_dir,
                modules: Mutex::new(HashMap::new()),
                compiling: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// Compiles (or finds, in memory or on disk) the module with these bytes,
    /// checking it against an expected sha256 first. Compilation is CPU-heavy
    /// and runs off the async executor.
    pub async fn load(&self, bytes: Vec<u8>, expected_sha256: Option<&str>) -> Result<Arc<PluginModule>, LoadError> {
        let digest = digest_of(&bytes);
        if let Some(expected) = expected_sha256
            && digest.strip_prefix("sha256:") != Some(expected)
        {
            return Err(LoadError::DigestMismatch { expected: format!("sha256:{expected}"), actual: digest });
        }
        if let Some(module) = self.cached(&digest) {
            return Ok(module);
        }
        let lock = self.compile_lock(&digest);
        let _compiling = lock.lock().await;
        // Whoever held the lock before may have compiled it.
        if let Some(module) = self.cached(&digest) {
            return Ok(module);
        }
        let this = self.clone();
        let compiled = tokio::task::spawn_blocking(move || {
            let compiled = this.compile(&digest, bytes.into());
            crate::background::return_freed_memory();
            compiled
        })
        .await
        .map_err(|e| LoadError::Compile(format!("compile task failed: {e}")))??;
        Ok(compiled)
    }

    fn compile_lock(&self, digest: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.inner.compiling.lock();
        locks.retain(|_, lock| lock.strong_count() > 0);
        if let Some(lock) = locks.get(digest).and_then(Weak::upgrade) {
            return lock;
        }
        let lock = Arc::new(tokio::sync::Mutex::new(()));
        locks.insert(digest.to_string(), Arc::downgrade(&lock));
        lock
    }

    fn cached(&self, digest: &str) -> Option<Arc<PluginModule>> {
        let modules = self.inner.modules.lock();
        modules.get(digest).and_then(Weak::upgrade)
    }

    fn compile(&self, digest: &str, bytes: Arc<[u8]>) -> Result<Arc<PluginModule>, LoadError> {
        let component = match self.artifact_path(digest) {
            Some(path) => self.compile_cached(&path, &bytes),
            None => self.compile_fresh(&bytes).and_then(|artifact| self.load_artifact(&artifact)),
        };
        if component.is_err() {
            count_compile("failed");
        }
        let component = component?;
        let incompatible = |e: wasmtime::Error| LoadError::Incompatible(format!("{e:#}"));
        // The pre-tokenizers' regexes take a few ms to compile: done for the
        // first plugin that can count tokens, here (off the async workers,
        // before the plugin serves) so its first `count-tokens` call does not
        // spend its deadline on them.
        if imports_host_func(&component, "count-tokens") {
            crate::tokens::warm_up();
        }
        let linker = crate::wasi::restrict(&self.inner.linker, &component).map_err(incompatible)?;
        let pre = PluginPre::new(&linker, &component).map_err(incompatible)?;
        let module = Arc::new(PluginModule::new(digest.to_string(), pre, linker, bytes, self.inner.shared.clone()));
        let mut modules = self.inner.modules.lock();
        modules.retain(|_, m| m.strong_count() > 0);
        modules.insert(digest.to_string(), Arc::downgrade(&module));
        Ok(module)
    }

    /// The compiled artifact of `bytes`.
    fn compile_fresh(&self, bytes: &[u8]) -> Result<Vec<u8>, LoadError> {
        if wasmparser_is_core_module(bytes) {
            return Err(LoadError::Compile(
                "this is a core Wasm module, not a component; build for wasm32-wasip2 or run `wasm-tools component new`"
                    .into(),
            ));
        }
        let started = std::time::Instant::now();
        let artifact =
            self.inner.shared.compiler.precompile(bytes).map_err(|e| LoadError::Compile(format!("{e:#}")))?;
        let metrics = sluice_telemetry::metrics();
        metrics.plugin_compile_duration.observe(started.elapsed().as_secs_f64());
        count_compile("compiled");
        Ok(artifact)
    }

    /// Loads the precompiled artifact if a valid one is on disk, otherwise
    /// compiles and writes it for the next start.
    fn compile_cached(&self, path: &Path, bytes: &[u8]) -> Result<Component, LoadError> {
        if path.exists() {
            // SAFETY: the cache directory is ours and no one else can write
            // to it (`prepare_cache_dir` refused it otherwise), written only
            // by `Component::serialize` of this engine configuration (the
            // file name carries the engine's compatibility hash).
            match unsafe { Component::deserialize_file(&self.inner.engine, path) } {
                Ok(component) => {
                    count_compile("cache_hit");
                    return Ok(component);
                }
                Err(e) => tracing::warn!(path = %path.display(), error = %e, "discarding unreadable cached artifact"),
            }
        }
        let artifact = self.compile_fresh(bytes)?;
        if let Err(e) = write_atomically(path, &artifact) {
            tracing::warn!(path = %path.display(), error = %e, "could not cache compiled plugin");
        }
        self.load_artifact(&artifact)
    }

    fn load_artifact(&self, artifact: &[u8]) -> Result<Component, LoadError> {
        crate::compiler::load(&self.inner.engine, artifact).map_err(|e| LoadError::Compile(format!("{e:#}")))
    }

    fn artifact_path(&self, digest: &str) -> Option<PathBuf> {
        let dir = self.inner.cache_dir.as_ref()?;
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.inner.engine.precompile_compatibility_hash().hash(&mut hasher);
        let hex = digest.trim_start_matches("sha256:");
        Some(dir.join(format!("{hex}-{:016x}.cwasm", hasher.finish())))
    }
}

/// Counts a plugin version made ready to run: `compiled`, `cache_hit` (from
/// the compiled-artifact cache) or `failed`.
fn count_compile(result: &'static str) {
    let labels = sluice_telemetry::metrics::ResultLabels { result };
    sluice_telemetry::metrics().plugin_compiles.get_or_create(&labels).inc();
}

/// Creates the compiled-artifact cache 0700 and refuses one that someone
/// else could write to: its files are loaded as native code, unchecked, so
/// whoever can plant a file there runs code in the gateway. Refusing to start
/// (as ssh refuses a key file others can read) rather than silently
/// compiling in memory: an operator who pointed the cache somewhere shared
/// finds out at once, not from a slow start months later.
fn prepare_cache_dir(dir: &Path) -> Result<(), StartError> {
    let refuse = |why: String| StartError(format!("compiled-plugin cache {}: {why}", dir.display()));
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| refuse(format!("creating it: {e}")))?;
        let meta = std::fs::metadata(dir).map_err(|e| refuse(e.to_string()))?;
        if meta.mode() & 0o022 != 0 {
            return Err(refuse(format!(
                "mode {:o} lets other users write to it, and its files are loaded as native code; \
                 `chmod go-w` it or choose another directory",
                meta.mode() & 0o777
            )));
        }
        // /proc/self belongs to this process's effective user (Linux).
        if let Ok(me) = std::fs::metadata("/proc/self").map(|m| m.uid())
            && meta.uid() != me
        {
            return Err(refuse(format!(
                "owned by uid {}, not by this process (uid {me}), and its files are loaded as native code",
                meta.uid()
            )));
        }
    }
    #[cfg(not(unix))]
    std::fs::create_dir_all(dir).map_err(|e| refuse(format!("creating it: {e}")))?;
    Ok(())
}

fn write_atomically(path: &Path, artifact: &[u8]) -> Result<(), String> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, artifact).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, path).map_err(|e| e.to_string())
}

/// Whether `component` imports `func` from Sluice's host interface (any
/// version). Components import only the functions they call.
fn imports_host_func(component: &Component, func: &str) -> bool {
    let engine = component.engine();
    component.component_type().imports(engine).any(|(name, import)| {
        name.starts_with("sluice:plugin/host@")
            && matches!(import.ty, wasmtime::component::types::ComponentItem::ComponentInstance(instance)
                if instance.exports(engine).any(|(export, _)| export == func))
    })
}

/// Core modules have version 1 in the preamble; components have layer 1.
fn wasmparser_is_core_module(bytes: &[u8]) -> bool {
    bytes.len() >= 8 && bytes[0..4] == *b"\0asm" && bytes[4..8] == [1, 0, 0, 0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::built_plugin;

    fn add_header() -> Vec<u8> {
        built_plugin("add-header")
    }

    /// Only plugins that count tokens make the gateway load the tokenizers.
    #[test]
    fn which_plugins_count_tokens_is_read_from_their_imports() {
        let engine = Engine::default();
        for (name, counts) in [("add-header", false), ("prompt-decorator", false), ("context-trim", true)] {
            let component = Component::new(&engine, built_plugin(name)).unwrap();
            assert_eq!(imports_host_func(&component, "count-tokens"), counts, "{name}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_cache_dir_others_can_write_is_refused_and_a_new_one_is_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        for mode in [0o777, 0o775, 0o757] {
            std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(mode)).unwrap();
            let config = RuntimeConfig { cache_dir: Some(shared.clone()), max_instances: 10, ..Default::default() };
            let error = Runtime::new(config).err().unwrap_or_else(|| panic!("mode {mode:o} was accepted"));
            assert!(error.to_string().contains("other users write"), "{error}");
        }

        let fresh = dir.path().join("a/b/cache");
        let config = RuntimeConfig { cache_dir: Some(fresh.clone()), max_instances: 10, ..Default::default() };
        Runtime::new(config).unwrap();
        let mode = std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "the cache dir was created {mode:o}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_loads_of_one_module_compile_it_once() {
        let runtime = Runtime::new(RuntimeConfig { max_instances: 10, ..Default::default() }).unwrap();
        let bytes = add_header();
        let (a, b, c) = tokio::join!(
            runtime.load(bytes.clone(), None),
            runtime.load(bytes.clone(), None),
            runtime.load(bytes, None)
        );
        let (a, b, c) = (a.unwrap(), b.unwrap(), c.unwrap());
        assert!(Arc::ptr_eq(&a, &b) && Arc::ptr_eq(&b, &c), "each load compiled its own copy");
    }
}
