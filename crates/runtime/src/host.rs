//! What a plugin's `Store` holds, and the host functions it may call.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::Semaphore;
use tracing::Level;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use wasmtime::component::Resource;

use crate::bindings::v3::sluice::plugin::types as wit;
use crate::bindings::{Content, ContentPart, Message, v2, v3};
use crate::epoch::EpochTicker;
use crate::guest_log::{self, Admit, RateLimit};
use crate::headers::to_pairs;
use crate::memory::{GuestMemory, MemoryLimiter};
use crate::request::PluginRequest;

pub(crate) struct PluginState {
    /// `namespace/name`, for attributing log lines.
    pub plugin: Arc<str>,
    pub memory: MemoryLimiter,
    /// When the current call into the guest must have returned.
    pub deadline: Instant,
    /// Whether the current call has seen a tick of the epoch.
    pub ticked: bool,
    log_rate: Arc<RateLimit>,
    tokens: TokenCounter,
    /// Must tick while this store's guest runs.
    pub ticker: Arc<EpochTicker>,
    /// Rust's wasip2 std imports WASI even when a plugin uses none of it; it
    /// gets a context with no preopens, no network, no env and no stdio,
    /// made at the first WASI call: most instances make none (a component
    /// without WASI never does, one from a snapshot rarely), and seeding
    /// its random generators was 5% of a fresh instance's cost (perf).
    wasi: Option<WasiCtx>,
    pub(crate) table: ResourceTable,
    /// The request the guest borrows during a request hook, as
    /// [`SERVING`]: one at a time, so it needs no place in `table` (an
    /// allocation per call).
    pub(crate) serving: Option<PluginRequest>,
    /// The request the instance serves now, for attributing log lines.
    pub request_id: Option<Arc<str>>,
    /// The plugin's shared state, if granted.
    pub(crate) state: Option<Arc<crate::granted::StateAccess>>,
    /// Why a state call of the current call into the guest found the store
    /// unavailable, if one did: a failure that follows is the store's.
    pub(crate) state_failed: Option<String>,
    /// Reservations handed to the gateway in this request hook, for it to
    /// take when the hook returns.
    pub(crate) settlements: Vec<crate::granted::Settlement>,
    /// `wasi:http`'s context, and the send hook that enforces the grant.
    http: wasmtime_wasi_http::WasiHttpCtx,
    pub(crate) egress: crate::egress::EgressHooks,
    /// Whether the current call is `configure`: metrics are declared there.
    pub(crate) configuring: bool,
    /// Whether this instance has declared its metrics.
    pub(crate) metrics_declared: bool,
    pub(crate) metrics: crate::granted::DeclaredMetrics,
}

impl PluginState {
    pub fn new(
        plugin: Arc<str>,
        max_memory_bytes: usize,
        budget: Arc<GuestMemory>,
        log_rate: Arc<RateLimit>,
        tokens: TokenCounter,
        ticker: Arc<EpochTicker>,
        granted: crate::granted::Granted,
    ) -> Self {
        let memory = MemoryLimiter::new(max_memory_bytes, budget, &plugin);
        Self {
            ticker,
            plugin,
            memory,
            deadline: Instant::now(),
            ticked: false,
            log_rate,
            tokens,
            wasi: None,
            table: ResourceTable::new(),
            serving: None,
            request_id: None,
            state: granted.state,
            configuring: false,
            metrics_declared: false,
            metrics: granted.metrics,
            state_failed: None,
            settlements: Vec::new(),
            http: wasmtime_wasi_http::WasiHttpCtx::new(),
            egress: crate::egress::EgressHooks {
                egress: granted.egress,
                deadline: Instant::now(),
                trace: None,
                calls: Default::default(),
            },
        }
    }
}

impl PluginState {
    /// The state of an instance just restored to how it was made, with
    /// `memory_used` bytes of memory then: no WASI context (its random
    /// generators would carry on from the last request), no resources, no
    /// request.
    pub fn rewind(&mut self, memory_used: usize) {
        self.memory.rewind(memory_used);
        self.wasi = None;
        self.table = ResourceTable::new();
        self.serving = None;
        self.request_id = None;
        self.ticked = false;
        self.settlements.clear();
        self.egress.trace = None;
        self.egress.calls.lock().clear();
    }
}

impl WasiView for PluginState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        let ctx = self.wasi.get_or_insert_with(|| {
            WasiCtx::builder().allow_tcp(false).allow_udp(false).allow_ip_name_lookup(false).build()
        });
        WasiCtxView { ctx, table: &mut self.table }
    }
}

impl wasmtime_wasi_http::WasiHttpView for PluginState {
    fn http(&mut self) -> wasmtime_wasi_http::WasiHttpCtxView<'_> {
        // A call made now is bounded by the hook it is made in.
        self.egress.deadline = self.deadline;
        wasmtime_wasi_http::WasiHttpCtxView { ctx: &mut self.http, table: &mut self.table, hooks: &mut self.egress }
    }
}

/// Wall-clock time for plugins (`now-unix-ms`) and their state calls.
pub(crate) fn now_unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
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

impl v2::sluice::plugin::types::Host for PluginState {}

impl PluginState {
    fn log(&mut self, level: Level, message: String, fields: Vec<(String, String)>) {
        // Lines no one would see cost nothing and are not counted.
        macro_rules! at {
            ($level:expr) => {
                if tracing::enabled!(target: LOG_TARGET, $level)
                    && let Some((message, fields)) = self.admit(&message, &fields)
                {
                    let request_id = self.request_id.as_deref();
                    tracing::event!(target: LOG_TARGET, $level, plugin = &*self.plugin, request_id, fields, "{message}");
                }
            };
        }
        match level {
            Level::TRACE => at!(Level::TRACE),
            Level::DEBUG => at!(Level::DEBUG),
            Level::INFO => at!(Level::INFO),
            Level::WARN => at!(Level::WARN),
            _ => at!(Level::ERROR),
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

    fn monotonic_ns(&mut self) -> u64 {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// 0.3's host functions; 0.2's are the same but for the log level's type.
impl v3::sluice::plugin::host::Host for PluginState {
    fn log(
        &mut self,
        level: v3::sluice::plugin::types::LogLevel,
        message: String,
        fields: Vec<(String, String)>,
    ) -> wasmtime::Result<()> {
        use v3::sluice::plugin::types::LogLevel as L;
        let level = match level {
            L::Trace => Level::TRACE,
            L::Debug => Level::DEBUG,
            L::Info => Level::INFO,
            L::Warn => Level::WARN,
            L::Error => Level::ERROR,
        };
        PluginState::log(self, level, message, fields);
        Ok(())
    }

    async fn count_tokens(&mut self, model: String, text: String) -> wasmtime::Result<u32> {
        PluginState::count_tokens(self, model, text).await
    }

    fn now_unix_ms(&mut self) -> wasmtime::Result<u64> {
        Ok(now_unix_ms())
    }

    fn monotonic_ns(&mut self) -> wasmtime::Result<u64> {
        Ok(PluginState::monotonic_ns(self))
    }
}

impl v2::sluice::plugin::host::Host for PluginState {
    fn log(&mut self, level: v2::sluice::plugin::types::LogLevel, message: String, fields: Vec<(String, String)>) {
        use v2::sluice::plugin::types::LogLevel as L;
        let level = match level {
            L::Trace => Level::TRACE,
            L::Debug => Level::DEBUG,
            L::Info => Level::INFO,
            L::Warn => Level::WARN,
            L::Error => Level::ERROR,
        };
        PluginState::log(self, level, message, fields);
    }

    async fn count_tokens(&mut self, model: String, text: String) -> wasmtime::Result<u32> {
        PluginState::count_tokens(self, model, text).await
    }

    fn now_unix_ms(&mut self) -> u64 {
        now_unix_ms()
    }

    fn monotonic_ns(&mut self) -> u64 {
        PluginState::monotonic_ns(self)
    }
}

// 0.3's request handle: calls on the `PluginRequest` in the store's table.

fn message_from(message: sluice_chat::Message) -> Message {
    Message { role: message.role, content: content_from(message.content), extra: message.extra }
}

fn content_from(content: sluice_chat::Content) -> Content {
    match content {
        sluice_chat::Content::None => Content::None,
        sluice_chat::Content::Text(text) => Content::Text(text),
        sluice_chat::Content::Parts(parts) => Content::Parts(
            parts
                .into_iter()
                .map(|part| match part {
                    sluice_chat::Part::Text(text) => ContentPart::Text(text),
                    sluice_chat::Part::Other(json) => ContentPart::Other(json),
                })
                .collect(),
        ),
    }
}

fn message_into(message: Message) -> sluice_chat::Message {
    sluice_chat::Message { role: message.role, content: content_into(message.content), extra: message.extra }
}

fn content_into(content: Content) -> sluice_chat::Content {
    match content {
        Content::None => sluice_chat::Content::None,
        Content::Text(text) => sluice_chat::Content::Text(text),
        Content::Parts(parts) => sluice_chat::Content::Parts(
            parts
                .into_iter()
                .map(|part| match part {
                    ContentPart::Text(text) => sluice_chat::Part::Text(text),
                    ContentPart::Other(json) => sluice_chat::Part::Other(json),
                })
                .collect(),
        ),
    }
}

type Handle = Resource<PluginRequest>;

/// The handle of the request a hook borrows ([`PluginState::serving`]).
pub(crate) const SERVING: u32 = 0;

impl PluginState {
    /// The request behind a handle the guest was lent. The component model
    /// lets a guest use only handles of this type that it was given, for
    /// the call they were given for; this checks it anyway.
    pub(crate) fn request(&mut self, handle: &Handle) -> wasmtime::Result<&mut PluginRequest> {
        match &mut self.serving {
            Some(request) if handle.rep() == SERVING => Ok(request),
            _ => wasmtime::bail!("no request behind handle {}", handle.rep()),
        }
    }
}

impl wit::HostRequest for PluginState {
    fn method(&mut self, this: Handle) -> wasmtime::Result<String> {
        Ok(self.request(&this)?.method.clone())
    }

    fn path(&mut self, this: Handle) -> wasmtime::Result<String> {
        Ok(self.request(&this)?.path.clone())
    }

    fn model(&mut self, this: Handle) -> wasmtime::Result<String> {
        Ok(self.request(&this)?.model.clone())
    }

    fn route(&mut self, this: Handle) -> wasmtime::Result<String> {
        Ok(self.request(&this)?.route.clone())
    }

    fn consumer(&mut self, this: Handle) -> wasmtime::Result<Option<String>> {
        Ok(self.request(&this)?.consumer.clone())
    }

    // Shadowed by `borrowed.rs`, which calls the same methods.
    fn header(&mut self, this: Handle, name: String) -> wasmtime::Result<Option<String>> {
        Ok(self.request(&this)?.header(&name))
    }

    fn headers(&mut self, this: Handle) -> wasmtime::Result<Vec<(String, String)>> {
        Ok(to_pairs(&self.request(&this)?.headers))
    }

    // This and the next two are shadowed by `borrowed.rs`, which calls the
    // same methods.
    fn set_header(&mut self, this: Handle, name: String, value: String) -> wasmtime::Result<()> {
        self.request(&this)?.set_header(&name, value);
        Ok(())
    }

    fn remove_header(&mut self, this: Handle, name: String) -> wasmtime::Result<()> {
        self.request(&this)?.remove_header(&name);
        Ok(())
    }

    fn set_response_header(&mut self, this: Handle, name: String, value: String) -> wasmtime::Result<()> {
        self.request(&this)?.set_response_header(&name, value);
        Ok(())
    }

    fn body(&mut self, this: Handle) -> wasmtime::Result<Vec<u8>> {
        Ok(self.request(&this)?.body.bytes().to_vec())
    }

    fn body_size(&mut self, this: Handle) -> wasmtime::Result<u64> {
        Ok(self.request(&this)?.body.len() as u64)
    }

    fn set_body(&mut self, this: Handle, body: Vec<u8>) -> wasmtime::Result<()> {
        self.request(&this)?.set_body(body);
        Ok(())
    }

    fn messages(&mut self, this: Handle) -> wasmtime::Result<Result<Vec<Message>, String>> {
        Ok(self.request(&this)?.body.messages().map(|messages| messages.into_iter().map(message_from).collect()))
    }

    fn message_count(&mut self, this: Handle) -> wasmtime::Result<Result<u32, String>> {
        Ok(self.request(&this)?.body.message_count())
    }

    fn splice_messages(&mut self, this: Handle, start: u32, delete: u32, insert: Vec<Message>) -> wasmtime::Result<()> {
        let insert = insert.into_iter().map(message_into).collect();
        self.request(&this)?.edit_body(|body| body.splice_messages(start, delete, insert));
        Ok(())
    }

    fn set_content(&mut self, this: Handle, index: u32, content: Content) -> wasmtime::Result<()> {
        self.request(&this)?.edit_body(|body| body.set_content(index, content_into(content)));
        Ok(())
    }

    // Shadowed by `borrowed.rs`, which does the same.
    fn field(&mut self, this: Handle, name: String) -> wasmtime::Result<Option<String>> {
        Ok(self.request(&this)?.body.field(&name))
    }

    fn set_field(&mut self, this: Handle, name: String, value: Option<String>) -> wasmtime::Result<()> {
        self.request(&this)?.edit_body(|body| body.set_field(&name, value));
        Ok(())
    }

    fn set_model(&mut self, this: Handle, model: String) -> wasmtime::Result<()> {
        self.request(&this)?.set_model(model);
        Ok(())
    }

    fn set_backend(&mut self, this: Handle, name: String) -> wasmtime::Result<()> {
        self.request(&this)?.set_backend(name);
        Ok(())
    }

    fn kind(&mut self, this: Handle) -> wasmtime::Result<wit::RequestKind> {
        Ok(if self.request(&this)?.is_mcp() { wit::RequestKind::Mcp } else { wit::RequestKind::Chat })
    }

    fn mcp_method(&mut self, this: Handle) -> wasmtime::Result<Option<String>> {
        Ok(self.request(&this)?.mcp.as_ref().map(|mcp| mcp.method.clone()))
    }

    fn tool_name(&mut self, this: Handle) -> wasmtime::Result<Option<String>> {
        Ok(self.request(&this)?.mcp.as_ref().and_then(|mcp| mcp.tool.clone()))
    }

    fn tool_arguments(&mut self, this: Handle) -> wasmtime::Result<Option<String>> {
        Ok(self.request(&this)?.mcp.as_ref().and_then(|mcp| mcp.arguments.clone()))
    }

    fn set_tool_arguments(&mut self, this: Handle, arguments: String) -> wasmtime::Result<()> {
        self.request(&this)?.set_tool_arguments(arguments);
        Ok(())
    }

    /// The host owns every request; the guest only ever borrows one.
    fn drop(&mut self, _this: Handle) -> wasmtime::Result<()> {
        Ok(())
    }
}

impl wit::Host for PluginState {}
