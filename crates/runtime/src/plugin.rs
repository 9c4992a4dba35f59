use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::{Store, UpdateDeadline};

use crate::bindings::sluice::plugin::types::{Hooks, Request, RequestAction, Response, ResponseAction};
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
    ) -> Result<ConfiguredPlugin, LoadError> {
        let mut plugin = ConfiguredPlugin {
            module: self.clone(),
            name: name.into(),
            config: config.to_string().into(),
            limits,
            hooks: Hooks::empty(),
        };
        let instance = plugin.instantiate().await?;
        plugin.hooks = instance.hooks;
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

    /// A fresh, configured instance in a store of its own, for one request.
    pub async fn instantiate(&self) -> Result<PluginInstance, PluginError> {
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
        Ok(PluginInstance { store, bindings, timeout, hooks })
    }
}

/// One plugin instance serving one request, from request to response head.
pub struct PluginInstance {
    store: Store<PluginState>,
    bindings: Plugin,
    timeout: Duration,
    hooks: Hooks,
}

impl PluginInstance {
    pub async fn request_filter(&mut self, request: &Request) -> Result<RequestAction, PluginError> {
        arm(&mut self.store, self.timeout);
        let result = self.bindings.sluice_plugin_filter().call_request_filter(&mut self.store, request).await;
        result.map_err(|e| classify(&self.store, e, self.timeout))
    }

    pub async fn response_filter(&mut self, response: &Response) -> Result<ResponseAction, PluginError> {
        arm(&mut self.store, self.timeout);
        let result = self.bindings.sluice_plugin_filter().call_response_filter(&mut self.store, response).await;
        result.map_err(|e| classify(&self.store, e, self.timeout))
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
    store.data_mut().deadline = Instant::now() + timeout;
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
