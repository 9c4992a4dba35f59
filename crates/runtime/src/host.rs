//! What a plugin's `Store` holds, and the host functions it may call.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::Semaphore;
use tracing::Level;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::bindings::sluice::plugin::{host, types};
use crate::epoch::EpochTicker;
use crate::guest_log::{self, Admit, RateLimit};
use crate::memory::{GuestMemory, MemoryLimiter};

pub(crate) struct PluginState {
    /// `namespace/name`, for attributing log lines.
    pub plugin: Arc<str>,
    pub memory: MemoryLimiter,
    /// When the current call into the guest must have returned.
    pub deadline: Instant,
    log_rate: Arc<RateLimit>,
    tokens: TokenCounter,
    /// Must tick while this store's guest runs.
    pub ticker: Arc<EpochTicker>,
    /// Rust's wasip2 std imports WASI even when a plugin uses none of it; it
    /// gets a context with no preopens, no network, no env and no stdio.
    wasi: WasiCtx,
    table: ResourceTable,
}

impl PluginState {
    pub fn new(
        plugin: Arc<str>,
        max_memory_bytes: usize,
        budget: Arc<GuestMemory>,
        log_rate: Arc<RateLimit>,
        tokens: TokenCounter,
        ticker: Arc<EpochTicker>,
    ) -> Self {
        Self {
            ticker,
            plugin,
            memory: MemoryLimiter::new(max_memory_bytes, budget),
            deadline: Instant::now(),
            log_rate,
            tokens,
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

/// The current call into the guest ran out of time.
#[derive(Debug)]
pub(crate) struct DeadlineExceeded;

impl std::fmt::Display for DeadlineExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("deadline exceeded")
    }
}

impl std::error::Error for DeadlineExceeded {}

/// Counts tokens off the async workers, on at most `threads` blocking
/// threads at once, within the calling plugin's deadline.
#[derive(Clone)]
pub(crate) struct TokenCounter {
    threads: Arc<Semaphore>,
}

/// Text this short is counted in place: well under a millisecond.
const COUNT_IN_PLACE_BYTES: usize = 4096;

impl TokenCounter {
    pub fn new(threads: usize) -> Self {
        Self { threads: Arc::new(Semaphore::new(threads.max(1))) }
    }

    /// The count, or `None` if `deadline` passed first (waiting for a
    /// thread included). A count abandoned at its deadline stops at its next
    /// chunk and only then gives its thread back.
    pub async fn count(&self, model: String, text: String, deadline: Instant) -> Option<u32> {
        if text.len() <= COUNT_IN_PLACE_BYTES {
            return Some(crate::tokens::count_tokens(&model, &text));
        }
        let at = tokio::time::Instant::from_std(deadline);
        let thread = tokio::time::timeout_at(at, self.threads.clone().acquire_owned()).await.ok()?.ok()?;
        let job = tokio::task::spawn_blocking(move || {
            let _thread = thread;
            crate::tokens::count_tokens_until(&model, &text, Some(deadline))
        });
        tokio::time::timeout_at(at, job).await.ok()?.ok()?
    }
}

const LOG_TARGET: &str = "sluice::plugin";

impl PluginState {
    /// A log line within the plugin's rate, cut to size and escaped: its
    /// message and fields. Reports the lines dropped before it, if any.
    fn admit(&self, message: &str, fields: &[(String, String)]) -> Option<(String, String)> {
        match self.log_rate.admit(Instant::now()) {
            Admit::Drop => return None,
            Admit::Write { dropped: 0 } => {}
            Admit::Write { dropped } => {
                let plugin = &*self.plugin;
                tracing::warn!(target: LOG_TARGET, plugin, dropped, "plugin log lines dropped: over the rate limit");
            }
        }
        Some((guest_log::escape(message, guest_log::MAX_MESSAGE_BYTES), guest_log::fields(fields)))
    }
}

impl types::Host for PluginState {}

impl host::Host for PluginState {
    fn log(&mut self, level: types::LogLevel, message: String, fields: Vec<(String, String)>) {
        // Lines no one would see cost nothing and are not counted.
        macro_rules! at {
            ($level:expr) => {
                if tracing::enabled!(target: LOG_TARGET, $level)
                    && let Some((message, fields)) = self.admit(&message, &fields)
                {
                    tracing::event!(target: LOG_TARGET, $level, plugin = &*self.plugin, fields, "{message}");
                }
            };
        }
        match level {
            types::LogLevel::Trace => at!(Level::TRACE),
            types::LogLevel::Debug => at!(Level::DEBUG),
            types::LogLevel::Info => at!(Level::INFO),
            types::LogLevel::Warn => at!(Level::WARN),
            types::LogLevel::Error => at!(Level::ERROR),
        }
    }

    /// Runs off the async workers, and its time counts against the calling
    /// plugin's deadline: past it, the guest traps with a timeout.
    async fn count_tokens(&mut self, model: String, text: String) -> wasmtime::Result<u32> {
        let deadline = self.deadline;
        match self.tokens.count(model, text, deadline).await {
            Some(count) => Ok(count),
            None => Err(wasmtime::Error::new(DeadlineExceeded)),
        }
    }

    fn now_unix_ms(&mut self) -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
    }

    fn monotonic_ns(&mut self) -> u64 {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}
