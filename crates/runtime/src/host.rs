//! What a plugin's `Store` holds, and the host functions it may call.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::bindings::sluice::plugin::{host, types};

pub(crate) struct PluginState {
    /// `namespace/name`, for attributing log lines.
    pub plugin: Arc<str>,
    pub memory: MemoryLimiter,
    /// When the current call into the guest must have returned.
    pub deadline: Instant,
    /// Rust's wasip2 std imports WASI even when a plugin uses none of it; it
    /// gets a context with no preopens, no network, no env and no stdio.
    wasi: WasiCtx,
    table: ResourceTable,
}

impl PluginState {
    pub fn new(plugin: Arc<str>, max_memory_bytes: usize) -> Self {
        Self {
            plugin,
            memory: MemoryLimiter { max_bytes: max_memory_bytes, hit: false },
            deadline: Instant::now(),
            wasi: WasiCtx::builder().allow_tcp(false).allow_udp(false).allow_ip_name_lookup(false).build(),
            table: ResourceTable::new(),
        }
    }
}

impl WasiView for PluginState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// Caps a plugin's linear memory, and remembers that it did so, so a guest
/// that aborts on a failed allocation is reported as out of memory rather
/// than as a generic trap.
pub(crate) struct MemoryLimiter {
    pub max_bytes: usize,
    pub hit: bool,
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let allowed = desired <= self.max_bytes;
        self.hit |= !allowed;
        Ok(allowed)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

impl types::Host for PluginState {}

impl host::Host for PluginState {
    fn log(&mut self, level: types::LogLevel, message: String, fields: Vec<(String, String)>) {
        let fields = fields.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ");
        let plugin = &*self.plugin;
        match level {
            types::LogLevel::Trace => tracing::trace!(target: "sluice::plugin", plugin, fields, "{message}"),
            types::LogLevel::Debug => tracing::debug!(target: "sluice::plugin", plugin, fields, "{message}"),
            types::LogLevel::Info => tracing::info!(target: "sluice::plugin", plugin, fields, "{message}"),
            types::LogLevel::Warn => tracing::warn!(target: "sluice::plugin", plugin, fields, "{message}"),
            types::LogLevel::Error => tracing::error!(target: "sluice::plugin", plugin, fields, "{message}"),
        }
    }

    fn count_tokens(&mut self, model: String, text: String) -> u32 {
        crate::tokens::count_tokens(&model, &text)
    }

    fn now_unix_ms(&mut self) -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
    }

    fn monotonic_ns(&mut self) -> u64 {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}
