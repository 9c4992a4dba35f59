//! What one request did, filled in along its way through the data plane and
//! finished once, when its response ends: the metrics, the access log line
//! and the trace all come from it, in [`RequestRecord::finish`].

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;

use crate::metrics::{self, Label, metrics};

/// A plugin version as telemetry names it.
#[derive(Debug)]
pub struct PluginId {
    pub namespace: Label,
    pub name: Label,
    pub digest: Label,
    /// Its metrics per hook, looked up on first use: a call then costs no
    /// label hashing.
    hooks: [OnceLock<HookMetrics>; HOOKS],
    /// Its name and digest as an access line writes them, escaped once
    /// rather than for every request (access.rs).
    pub(crate) access: OnceLock<Box<str>>,
}

const HOOKS: usize = 5;
const OUTCOMES: usize = 8;
// The arrays above are indexed by these enums: each one's last variant (a
// new variant goes last) must be the array's last index.
const _: () = assert!(Hook::ResponseEnd as usize + 1 == HOOKS && Outcome::StateUnavailable as usize + 1 == OUTCOMES);

#[derive(Debug)]
struct HookMetrics {
    duration: Histogram,
    outcomes: [OnceLock<Counter>; OUTCOMES],
    skipped: OnceLock<Counter>,
}

impl PluginId {
    pub fn new(namespace: &str, name: &str, digest: &str) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            digest: digest.into(),
            hooks: Default::default(),
            access: OnceLock::new(),
        }
    }

    fn labels(&self, hook: Hook) -> metrics::PluginHookLabels {
        metrics::PluginHookLabels {
            namespace: self.namespace.clone(),
            plugin: self.name.clone(),
            digest: self.digest.clone(),
            hook: hook.as_str(),
        }
    }

    fn hook(&self, hook: Hook) -> &HookMetrics {
        self.hooks[hook as usize].get_or_init(|| HookMetrics {
            duration: metrics().plugin_duration.get_or_create_owned(&self.labels(hook)),
            outcomes: Default::default(),
            skipped: OnceLock::new(),
        })
    }

    fn outcome(&self, hook: Hook, outcome: Outcome) -> &Counter {
        self.hook(hook).outcomes[outcome as usize].get_or_init(|| {
            let labels = self.labels(hook);
            let labels = metrics::PluginOutcomeLabels {
                namespace: labels.namespace,
                plugin: labels.plugin,
                digest: labels.digest,
                hook: labels.hook,
                outcome: outcome.as_str(),
            };
            metrics().plugin_invocations.get_or_create_owned(&labels)
        })
    }

    fn skipped(&self, hook: Hook) -> &Counter {
        self.hook(hook).skipped.get_or_init(|| metrics().plugin_skipped.get_or_create_owned(&self.labels(hook)))
    }
}

/// A plugin hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    Request,
    ResponseHead,
    ResponseChunk,
    ResponseBody,
    ResponseEnd,
}

impl Hook {
    pub fn as_str(self) -> &'static str {
        match self {
            Hook::Request => "request",
            Hook::ResponseHead => "response-head",
            Hook::ResponseChunk => "response-chunk",
            Hook::ResponseBody => "response-body",
            Hook::ResponseEnd => "response-end",
        }
    }
}

/// How a plugin call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It let the request or response go on (edited or not).
    Continue,
    /// It answered the request itself.
    Respond,
    Trap,
    Timeout,
    MemoryLimit,
    InvalidEdit,
    /// No instance could be had: the plugin did not run.
    Overloaded,
    /// It failed after its state store did not answer. The last variant:
    /// `OUTCOMES` counts them.
    StateUnavailable,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Continue => "continue",
            Outcome::Respond => "respond",
            Outcome::Trap => "trap",
            Outcome::Timeout => "timeout",
            Outcome::MemoryLimit => "memory_limit",
            Outcome::InvalidEdit => "invalid_edit",
            Outcome::Overloaded => "overloaded",
            Outcome::StateUnavailable => "state_unavailable",
        }
    }

    pub fn failed(self) -> bool {
        !matches!(self, Outcome::Continue | Outcome::Respond)
    }
}

/// A plugin's calls of one hook during the request: one for most hooks, one
/// per event for `response-chunk`.
#[derive(Clone, Debug)]
pub struct PluginCalls {
    pub plugin: Arc<PluginId>,
    pub hook: Hook,
    pub calls: u32,
    /// Since the request started, of the first call.
    pub first_start: Duration,
    /// Of the last call.
    pub last_end: Duration,
    /// All calls together.
    pub busy: Duration,
    /// The last call's outcome, unless an earlier one failed: then the
    /// first failure.
    pub outcome: Outcome,
    /// It failed and was skipped (`failurePolicy: Open`).
    pub skipped: bool,
}

/// One outbound HTTP call a plugin made (`spec.egress`).
#[derive(Clone, Debug)]
pub struct OutboundSpan {
    pub plugin: Arc<PluginId>,
    pub hook: Hook,
    /// The granted origin called, or `other` (refused).
    pub destination: Label,
    /// Since the request started.
    pub start: Duration,
    pub end: Duration,
    pub status: Option<u16>,
    /// `ok`, or why it failed (`denied`, `timeout`, …).
    pub result: &'static str,
    /// The span id the destination saw in `traceparent`.
    pub span_id: Option<[u8; 8]>,
}

/// One attempt to reach a backend.
#[derive(Clone, Debug)]
pub struct Attempt {
    pub backend: Label,
    /// Since the request started.
    pub start: Duration,
    pub end: Duration,
    /// The response's status, or `None` if none came.
    pub status: Option<u16>,
    /// Why no response came.
    pub error: Option<String>,
    /// The span id the upstream saw in `traceparent`.
    pub span_id: Option<[u8; 8]>,
}

/// Token usage as the upstream reported it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tokens {
    pub input: u64,
    pub output: u64,
    /// As reported (it may count more than input and output, e.g.
    /// reasoning), and never less than their sum.
    pub total: u64,
}

/// The most attempts and plugin entries a record keeps: both are bounded by
/// the config already (backends per route, plugins per chain times hooks);
/// this keeps a record's size bounded whatever the config.
const MAX_ENTRIES: usize = 256;

/// One request, as telemetry sees it.
#[derive(Debug)]
pub struct RequestRecord {
    pub id: Arc<str>,
    pub started_at: SystemTime,
    pub started: Instant,
    pub method: String,
    /// The path without its query (which may carry secrets).
    pub path: String,
    /// `chat`, `text_completion` or `embeddings`, for forwarded endpoints.
    pub operation: Option<&'static str>,
    pub route: Option<Label>,
    /// The model asked for, once a route serves it; the one a plugin
    /// routed the request to, if one did.
    pub model: Option<Label>,
    /// The model the client asked for, when a plugin routed the request to
    /// another (`set-model`).
    pub requested_model: Option<Label>,
    /// The backend that answered (or the last one tried).
    pub backend: Option<Label>,
    /// `gen_ai.provider.name`: the API of that backend (`openai`, or
    /// `anthropic` for a translated one).
    pub provider: &'static str,
    pub status: u16,
    /// The OpenAI-shaped error's code, when the gateway answered with one.
    pub error_code: Option<&'static str>,
    pub streamed: bool,
    /// The body reached its end (not cut by the client, a timeout or a
    /// failure).
    pub completed: bool,
    /// When the first byte of the response body went out, since the start.
    pub first_byte: Option<Duration>,
    pub response_bytes: u64,
    pub tokens: Option<Tokens>,
    pub response_model: Option<String>,
    /// The identity the auth phase gave the caller.
    pub consumer: Option<String>,
    /// On an MCP route: the JSON-RPC method (at most 64 bytes), and for
    /// `tools/call` the tool (at most 256): never its arguments.
    pub mcp_method: Option<String>,
    pub tool: Option<String>,
    pub attempts: Vec<Attempt>,
    pub plugins: Vec<PluginCalls>,
    /// Plugins' outbound calls, for the trace.
    pub outbound: Vec<OutboundSpan>,
    pub trace: Option<crate::context::TraceContext>,
    /// Moved on to whoever finishes it (the response body): this one is
    /// an empty shell, and finishing it does nothing.
    pub(crate) handed_off: bool,
}

impl RequestRecord {
    pub fn new(id: Arc<str>, method: &str, path: &str) -> Self {
        Self {
            id,
            started_at: SystemTime::now(),
            started: Instant::now(),
            method: method.to_string(),
            path: path.to_string(),
            operation: None,
            route: None,
            model: None,
            backend: None,
            provider: PROVIDER,
            status: 0,
            error_code: None,
            streamed: false,
            completed: false,
            first_byte: None,
            response_bytes: 0,
            tokens: None,
            response_model: None,
            consumer: None,
            mcp_method: None,
            tool: None,
            requested_model: None,
            attempts: Vec::new(),
            plugins: Vec::new(),
            outbound: Vec::new(),
            trace: None,
            handed_off: false,
        }
    }

    /// Moves the record out, to be finished by its new holder; this one is
    /// left finished.
    pub fn hand_off(&mut self) -> Self {
        let shell = Self { handed_off: true, ..Self::new(self.id.clone(), "", "") };
        std::mem::replace(self, shell)
    }

    /// Records one plugin call that started at `started` and ended now.
    pub fn plugin_call(&mut self, plugin: &Arc<PluginId>, hook: Hook, started: Instant, outcome: Outcome) {
        let now = Instant::now();
        let took = now.saturating_duration_since(started);
        plugin.hook(hook).duration.observe(took.as_secs_f64());
        plugin.outcome(hook, outcome).inc();

        let since = |at: Instant| at.saturating_duration_since(self.started);
        let (first_start, last_end) = (since(started), since(now));
        if let Some(entry) = self.plugins.iter_mut().rev().find(|e| Arc::ptr_eq(&e.plugin, plugin) && e.hook == hook) {
            entry.calls = entry.calls.saturating_add(1);
            entry.last_end = last_end;
            entry.busy += took;
            if !entry.outcome.failed() {
                entry.outcome = outcome;
            }
        } else if self.plugins.len() < MAX_ENTRIES {
            self.plugins.push(PluginCalls {
                plugin: plugin.clone(),
                hook,
                calls: 1,
                first_start,
                last_end,
                busy: took,
                outcome,
                skipped: false,
            });
        }
    }

    /// An outbound call a plugin made; past [`MAX_ENTRIES`] calls only
    /// counted (by the runtime), not traced.
    pub fn outbound_call(&mut self, call: OutboundSpan) {
        if self.outbound.len() < MAX_ENTRIES {
            self.outbound.push(call);
        }
    }

    /// The plugin's last call failed and it is skipped from here on.
    pub fn plugin_skipped(&mut self, plugin: &Arc<PluginId>, hook: Hook) {
        plugin.skipped(hook).inc();
        if let Some(entry) = self.plugins.iter_mut().rev().find(|e| Arc::ptr_eq(&e.plugin, plugin) && e.hook == hook) {
            entry.skipped = true;
        }
    }

    /// Records an attempt to reach `backend` that started at `started`.
    pub fn attempt(&mut self, attempt: Attempt) {
        if let Some(route) = &self.route {
            let (backend, status_class) = (&attempt.backend, attempt.status.map_or("error", metrics::status_class));
            let labels = || metrics::UpstreamLabels { route: route.clone(), backend: backend.clone(), status_class };
            let seconds = (attempt.end - attempt.start).as_secs_f64();
            crate::memo::with(|handles| {
                let key = crate::memo::Key::of([route, backend, status_class]);
                handles.upstream_duration.get(key, labels, &metrics().upstream_duration).observe(seconds);
            });
        }
        self.backend = Some(attempt.backend.clone());
        if self.attempts.len() < MAX_ENTRIES {
            self.attempts.push(attempt);
        }
    }

    /// Since the request started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

/// `gen_ai.provider.name` unless a backend speaks another API.
pub const PROVIDER: &str = "openai";

/// The GenAI operation of a forwarded endpoint.
pub fn operation_of(path: &str) -> Option<&'static str> {
    match path {
        // The Responses API is a chat too, as the GenAI conventions see it.
        "/v1/chat/completions" | "/v1/responses" => Some("chat"),
        "/v1/completions" => Some("text_completion"),
        "/v1/embeddings" => Some("embeddings"),
        _ => None,
    }
}
