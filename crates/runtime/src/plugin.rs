use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sluice_core::Isolation;

use wasmtime::{Store, UpdateDeadline};

use crate::bindings::sluice::plugin::types::{
    ChunkAction, Hooks, Request, RequestAction, Response, ResponseAction, ResponseSummary,
};
use crate::bindings::{Plugin, PluginPre};
use crate::host::PluginState;
use crate::{LoadError, PluginError};

/// A compiled component, ready to instantiate cheaply.
pub struct PluginModule {
    digest: String,
    pre: PluginPre<PluginState>,
}

/// Per-plugin limits, from the GatewayPlugin spec.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Deadline for each call into the guest (instantiation included).
    pub timeout: Duration,
    pub max_memory_bytes: usize,
}

impl PluginModule {
    pub(crate) fn new(digest: String, pre: PluginPre<PluginState>) -> Self {
        Self { digest, pre }
    }

    /// `sha256:<hex>`.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Validates `config` by running the plugin's `configure` once on a
    /// fresh instance. The result is what a snapshot serves.
    pub async fn configure(
        self: &Arc<Self>,
        name: &str,
        config: &serde_json::Value,
        limits: Limits,
        isolation: Isolation,
    ) -> Result<ConfiguredPlugin, LoadError> {
        let mut plugin = ConfiguredPlugin {
            module: self.clone(),
            name: name.into(),
            config: config.to_string().into(),
            limits,
            hooks: Hooks::empty(),
            isolation,
            idle: Arc::new(Mutex::new(Vec::new())),
        };
        let (live, hooks) = plugin.instantiate_live().await?;
        plugin.hooks = hooks;
        // A reusable instance is kept: the first request does not pay for it.
        if let Isolation::Reused { .. } = isolation {
            plugin.idle.lock().unwrap_or_else(PoisonError::into_inner).push(live);
        }
        Ok(plugin)
    }
}

/// A module with a config its `configure` accepted.
#[derive(Clone)]
pub struct ConfiguredPlugin {
    module: Arc<PluginModule>,
    name: Arc<str>,
    config: Arc<str>,
    limits: Limits,
    hooks: Hooks,
    isolation: Isolation,
    /// Idle instances of a `Reused` plugin, most recently used last.
    idle: Arc<Mutex<Vec<Live>>>,
}

/// A configured instance and the store it lives in.
struct Live {
    store: Store<PluginState>,
    bindings: Plugin,
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

    pub fn isolation(&self) -> Isolation {
        self.isolation
    }

    /// An instance for one request: a fresh one, or with `Reused`, an idle
    /// one if there is any.
    pub async fn instance(&self) -> Result<PluginInstance, PluginError> {
        let home = match self.isolation {
            Isolation::PerRequest => None,
            Isolation::Reused { max_idle } => Some(Home { idle: self.idle.clone(), max_idle: max_idle as usize }),
        };
        let reused = home.as_ref().and_then(|home| home.idle.lock().unwrap_or_else(PoisonError::into_inner).pop());
        let live = match reused {
            Some(live) => live,
            None => self.instantiate_live().await?.0,
        };
        Ok(PluginInstance { live: Some(live), timeout: self.limits.timeout, home, tainted: false })
    }

    /// A fresh, configured instance in a store of its own.
    async fn instantiate_live(&self) -> Result<(Live, Hooks), PluginError> {
        let mut store =
            Store::new(self.module.pre.engine(), PluginState::new(self.name.clone(), self.limits.max_memory_bytes));
        store.limiter(|state| &mut state.memory);
        // Every epoch tick past the deadline's start, yield to tokio so a
        // busy guest cannot hog a worker thread; once the deadline has
        // passed, trap.
        store.epoch_deadline_callback(|ctx| {
            if Instant::now() >= ctx.data().deadline {
                Err(wasmtime::Error::new(DeadlineExceeded))
            } else {
                Ok(UpdateDeadline::Yield(1))
            }
        });
        let timeout = self.limits.timeout;
        arm(&mut store, timeout);
        let bindings = self.module.pre.instantiate_async(&mut store).await.map_err(|e| classify(&store, e, timeout))?;
        let hooks = bindings
            .sluice_plugin_filter()
            .call_configure(&mut store, &self.config)
            .await
            .map_err(|e| classify(&store, e, timeout))?
            .map_err(PluginError::ConfigRejected)?;
        Ok((Live { store, bindings }, hooks))
    }
}

/// Where a `Reused` instance returns after its request.
struct Home {
    idle: Arc<Mutex<Vec<Live>>>,
    max_idle: usize,
}

/// One plugin instance serving one request, from the request to the end of
/// the response body.
pub struct PluginInstance {
    live: Option<Live>,
    timeout: Duration,
    home: Option<Home>,
    /// A call failed, or was abandoned midway (the request future was
    /// dropped): the guest's state is unknown, so it is never reused.
    tainted: bool,
}

impl PluginInstance {
    pub async fn request_filter(&mut self, request: &Request) -> Result<RequestAction, PluginError> {
        self.call(async |plugin, store| plugin.sluice_plugin_filter().call_request_filter(store, request).await).await
    }

    pub async fn response_filter(&mut self, response: &Response) -> Result<ResponseAction, PluginError> {
        self.call(async |plugin, store| plugin.sluice_plugin_filter().call_response_filter(store, response).await).await
    }

    pub async fn response_chunk(&mut self, data: &str) -> Result<ChunkAction, PluginError> {
        self.call(async |plugin, store| plugin.sluice_plugin_filter().call_response_chunk(store, data).await).await
    }

    pub async fn response_body(&mut self, body: &[u8]) -> Result<Option<Vec<u8>>, PluginError> {
        self.call(async |plugin, store| plugin.sluice_plugin_filter().call_response_body(store, body).await).await
    }

    pub async fn response_end(&mut self, summary: &ResponseSummary) -> Result<(), PluginError> {
        self.call(async |plugin, store| plugin.sluice_plugin_filter().call_response_end(store, *summary).await).await
    }

    async fn call<T>(
        &mut self,
        call: impl AsyncFnOnce(&Plugin, &mut Store<PluginState>) -> wasmtime::Result<T>,
    ) -> Result<T, PluginError> {
        let Some(live) = &mut self.live else {
            return Err(PluginError::Trap("the instance was already released".into()));
        };
        arm(&mut live.store, self.timeout);
        self.tainted = true;
        let result = call(&live.bindings, &mut live.store).await.map_err(|e| classify(&live.store, e, self.timeout));
        self.tainted = result.is_err();
        result
    }
}

impl Drop for PluginInstance {
    fn drop(&mut self) {
        if self.tainted {
            return;
        }
        if let (Some(home), Some(live)) = (&self.home, self.live.take()) {
            let mut idle = home.idle.lock().unwrap_or_else(PoisonError::into_inner);
            if idle.len() < home.max_idle {
                idle.push(live);
            }
        }
    }
}

#[derive(Debug)]
struct DeadlineExceeded;

impl std::fmt::Display for DeadlineExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("deadline exceeded")
    }
}

impl std::error::Error for DeadlineExceeded {}

/// Starts the deadline for the next call into the guest.
fn arm(store: &mut Store<PluginState>, timeout: Duration) {
    let state = store.data_mut();
    state.deadline = Instant::now() + timeout;
    state.memory.hit = false;
    store.set_epoch_deadline(1);
}

fn classify(store: &Store<PluginState>, error: wasmtime::Error, timeout: Duration) -> PluginError {
    if error.downcast_ref::<DeadlineExceeded>().is_some() {
        PluginError::Timeout(timeout)
    } else if store.data().memory.hit {
        PluginError::MemoryLimit(store.data().memory.max_bytes)
    } else {
        // The client gets the trap's cause; the wasm backtrace goes to the log.
        tracing::debug!(plugin = &*store.data().plugin, error = format!("{error:?}"), "plugin trapped");
        match error.downcast_ref::<wasmtime::Trap>() {
            Some(trap) => PluginError::Trap(trap.to_string()),
            None => PluginError::Trap(error.to_string()),
        }
    }
}
