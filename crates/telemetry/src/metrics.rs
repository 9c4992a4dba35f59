//! The Prometheus metrics, one registry per process.
//!
//! Names follow the OpenTelemetry GenAI semantic conventions where they
//! define one (`gen_ai.client.token.usage` is `gen_ai_client_token_usage`,
//! as OpenTelemetry's Prometheus exporter would name it), Sluice's own start
//! with `sluice_`. No label carries what a client wrote: models are the
//! route's (a request for another model is not routed), response models and
//! consumers are capped to a configurable number of values, past which they
//! count as `other`.

use std::collections::HashSet;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::prometheus_protobuf::{self, prometheus_data_model::MetricFamily};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
pub use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

/// A label value shared without copying it.
pub type Label = Arc<str>;

/// The value of a capped label past its cap.
pub const OTHER: &str = "other";

/// The metrics of this process.
pub fn metrics() -> &'static Metrics {
    static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);
    &METRICS
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub route: Label,
    pub model: Label,
    pub backend: Label,
    /// `2xx`, `4xx`, …
    pub status_class: &'static str,
    /// The OpenAI-shaped error's `code`, or empty.
    pub error_code: &'static str,
}

/// One MCP tool call (or other routed MCP request), by its route, server,
/// tool (capped like consumers) and consumer.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct McpCallLabels {
    pub route: Label,
    pub server: Label,
    /// The prefixed tool name; empty for requests that are not tool calls.
    pub tool: Label,
    pub consumer: Label,
    /// `ok`, `tool_error` (the tool answered `isError`), `error` (a
    /// JSON-RPC error, or the server failed).
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct McpDurationLabels {
    pub route: Label,
    pub server: Label,
    pub tool: Label,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: Label,
    pub model: Label,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamLabels {
    pub route: Label,
    pub backend: Label,
    /// `2xx`…`5xx`, or `error` when no response came.
    pub status_class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RetryLabels {
    pub route: Label,
    /// The backend whose attempt failed.
    pub backend: Label,
    /// The failure: `RateLimited`, `Timeout`, …
    pub condition: &'static str,
    /// `retried`, or why not: `budget_exhausted`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabels {
    pub route: Label,
    pub backend: Label,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FallbackLabels {
    pub route: Label,
    /// The model the request moved to: one the config names.
    pub fallback_model: Label,
    pub condition: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GenAiLabels {
    pub gen_ai_operation_name: &'static str,
    pub gen_ai_provider_name: &'static str,
    pub gen_ai_request_model: Label,
    pub gen_ai_response_model: Label,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenUsageLabels {
    pub gen_ai_operation_name: &'static str,
    pub gen_ai_provider_name: &'static str,
    pub gen_ai_request_model: Label,
    pub gen_ai_response_model: Label,
    /// `input` or `output`.
    pub gen_ai_token_type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    pub route: Label,
    pub model: Label,
    pub consumer: Label,
    /// `input` or `output`.
    pub token_type: &'static str,
}

/// A loaded plugin version.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginLabels {
    pub namespace: Label,
    pub plugin: Label,
    pub digest: Label,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginHookLabels {
    pub namespace: Label,
    pub plugin: Label,
    pub digest: Label,
    pub hook: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginOutcomeLabels {
    pub namespace: Label,
    pub plugin: Label,
    pub digest: Label,
    pub hook: &'static str,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginPoolLabels {
    pub namespace: Label,
    pub plugin: Label,
    pub digest: Label,
    /// `in_use` or `idle`.
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginInfoLabels {
    pub namespace: Label,
    pub plugin: Label,
    pub digest: Label,
    pub source: Label,
    pub isolation: &'static str,
}

/// A plugin's outbound HTTP call. `destination` is a granted origin
/// (`https://host:port`), or `other` for one the grant does not list.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutboundCallLabels {
    pub namespace: Label,
    pub plugin: Label,
    pub destination: Label,
    /// `ok` (any status), `denied`, `concurrency_cap`, `timeout`,
    /// `too_large`, `tls_error` or `error`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceLabels {
    pub namespace: Label,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GuestMemoryRefusalLabels {
    /// `budget`, `namespace_share` or `plugin_share`.
    pub limit: &'static str,
    pub namespace: Label,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResponseBufferRefusalLabels {
    /// `budget` or `backend_share`.
    pub limit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    /// `GatewayPlugin` or `AIModelRoute`.
    pub kind: &'static str,
    pub namespace: Label,
    pub name: Label,
    /// `ready`, `degraded` (the last good version serves) or `failed`.
    pub state: &'static str,
    /// Why it is not ready (`PullFailed`, `LoadFailed`, …), or empty.
    pub reason: Label,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    pub kind: &'static str,
    /// `ok`, or the error's metric label.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    commit: &'static str,
}

/// Histograms of one bucket layout.
#[derive(Clone)]
pub struct Buckets(&'static [f64]);

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

/// The GenAI conventions' advice for `gen_ai.server.request.duration`.
const REQUEST_SECONDS: &[f64] =
    &[0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92];
/// … for `gen_ai.server.time_to_first_token`.
const FIRST_TOKEN_SECONDS: &[f64] =
    &[0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0];
/// … for `gen_ai.client.token.usage`.
const TOKENS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0,
    67108864.0,
];
/// Plugin calls: a few microseconds to their deadline.
const PLUGIN_SECONDS: &[f64] = &[
    0.000_005, 0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0,
];
/// Compiles and reconciles.
const TASK_SECONDS: &[f64] = &[0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

type Histograms<L> = Family<L, Histogram, Buckets>;

/// Every metric family. Fields are public so that each part of the gateway
/// records what it knows, where it knows it.
pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub request_duration: Histograms<RouteLabels>,
    pub upstream_duration: Histograms<UpstreamLabels>,
    pub gen_ai_request_duration: Histograms<GenAiLabels>,
    pub gen_ai_time_to_first_token: Histograms<GenAiLabels>,
    pub gen_ai_token_usage: Histograms<TokenUsageLabels>,
    pub tokens: Family<TokenLabels, Counter>,
    pub upstream_retries: Family<RetryLabels, Counter>,
    pub backend_ejections: Family<BackendLabels, Counter>,
    pub backend_ejected: Family<BackendLabels, Gauge>,
    pub fallbacks: Family<FallbackLabels, Counter>,
    pub plugin_invocations: Family<PluginOutcomeLabels, Counter>,
    pub plugin_duration: Histograms<PluginHookLabels>,
    pub plugin_skipped: Family<PluginHookLabels, Counter>,
    pub plugin_instances: Family<PluginPoolLabels, Gauge>,
    pub plugin_info: Family<PluginInfoLabels, Gauge>,
    pub plugin_outbound_calls: Family<OutboundCallLabels, Counter>,
    pub plugin_outbound_call_duration: Histograms<OutboundCallLabels>,
    pub guest_memory: Family<NamespaceLabels, Gauge>,
    pub guest_memory_budget: Gauge,
    pub guest_memory_refusals: Family<GuestMemoryRefusalLabels, Counter>,
    pub guest_memory_evictions: Counter,
    pub response_buffers: Gauge,
    pub response_buffer_budget: Gauge,
    pub response_buffer_refusals: Family<ResponseBufferRefusalLabels, Counter>,
    pub oci_pulls: Family<ResultLabels, Counter>,
    pub plugin_compiles: Family<ResultLabels, Counter>,
    pub plugin_compile_duration: Histogram,
    pub config_generations: Family<ResultLabels, Counter>,
    pub config_generation: Gauge,
    pub resource_state: Family<ResourceLabels, Gauge>,
    pub reconciles: Family<ReconcileLabels, Counter>,
    pub reconcile_duration: Histograms<KindLabels>,
    pub mcp_calls: Family<McpCallLabels, Counter>,
    pub mcp_call_duration: Histograms<McpDurationLabels>,
    pub mcp_stream_messages: Family<McpDurationLabels, Counter>,
    build: Family<BuildLabels, Gauge>,
    caps: Caps,
}

fn histograms<L: Clone + std::hash::Hash + Eq>(buckets: &'static [f64]) -> Histograms<L> {
    Family::new_with_constructor(Buckets(buckets))
}

impl Metrics {
    fn new() -> Self {
        let metrics = Self {
            registry: Registry::default(),
            requests: Family::default(),
            request_duration: histograms(REQUEST_SECONDS),
            upstream_duration: histograms(REQUEST_SECONDS),
            gen_ai_request_duration: histograms(REQUEST_SECONDS),
            gen_ai_time_to_first_token: histograms(FIRST_TOKEN_SECONDS),
            gen_ai_token_usage: histograms(TOKENS),
            tokens: Family::default(),
            upstream_retries: Family::default(),
            backend_ejections: Family::default(),
            backend_ejected: Family::default(),
            fallbacks: Family::default(),
            plugin_invocations: Family::default(),
            plugin_duration: histograms(PLUGIN_SECONDS),
            plugin_skipped: Family::default(),
            plugin_instances: Family::default(),
            plugin_info: Family::default(),
            plugin_outbound_calls: Family::default(),
            plugin_outbound_call_duration: histograms(REQUEST_SECONDS),
            guest_memory: Family::default(),
            guest_memory_budget: Gauge::default(),
            guest_memory_refusals: Family::default(),
            guest_memory_evictions: Counter::default(),
            response_buffers: Gauge::default(),
            response_buffer_budget: Gauge::default(),
            response_buffer_refusals: Family::default(),
            oci_pulls: Family::default(),
            plugin_compiles: Family::default(),
            plugin_compile_duration: Histogram::new(TASK_SECONDS.iter().copied()),
            config_generations: Family::default(),
            config_generation: Gauge::default(),
            resource_state: Family::default(),
            reconciles: Family::default(),
            reconcile_duration: histograms(TASK_SECONDS),
            mcp_calls: Family::default(),
            mcp_call_duration: histograms(REQUEST_SECONDS),
            mcp_stream_messages: Family::default(),
            build: Family::default(),
            caps: Caps::default(),
        };
        metrics.registered()
    }

    fn registered(mut self) -> Self {
        self.set_build(env!("CARGO_PKG_VERSION"), "unknown");
        let r = &mut self.registry;
        r.register("sluice_build_info", "The running build: its version and git commit", self.build.clone());
        r.register(
            "sluice_mcp_calls",
            "MCP requests routed to a server (tool calls, prompts, resources), by route, server, tool, consumer and result",
            self.mcp_calls.clone(),
        );
        r.register_with_unit(
            "sluice_mcp_call_duration",
            "Time from an MCP request's arrival to the server's answer, streamed messages included (OpenTelemetry's \
             execute_tool span)",
            Unit::Seconds,
            self.mcp_call_duration.clone(),
        );
        r.register(
            "sluice_mcp_stream_messages",
            "Messages relayed from MCP servers to clients in streams (progress, logs, server requests)",
            self.mcp_stream_messages.clone(),
        );
        r.register(
            "sluice_requests",
            "Requests answered, by route, model, backend, status class and error code",
            self.requests.clone(),
        );
        r.register_with_unit(
            "sluice_request_duration",
            "Time from the request's arrival to the end of its response body",
            Unit::Seconds,
            self.request_duration.clone(),
        );
        r.register_with_unit(
            "sluice_upstream_duration",
            "Time from sending a request upstream to its response head, per attempt",
            Unit::Seconds,
            self.upstream_duration.clone(),
        );
        r.register_with_unit(
            "gen_ai_server_request_duration",
            "GenAI server request duration (OpenTelemetry gen_ai.server.request.duration)",
            Unit::Seconds,
            self.gen_ai_request_duration.clone(),
        );
        r.register_with_unit(
            "gen_ai_server_time_to_first_token",
            "Time to the first byte of the response body: the first token of a stream \
             (OpenTelemetry gen_ai.server.time_to_first_token)",
            Unit::Seconds,
            self.gen_ai_time_to_first_token.clone(),
        );
        r.register(
            "gen_ai_client_token_usage",
            "Tokens used per request, as the upstream reported them (OpenTelemetry gen_ai.client.token.usage)",
            self.gen_ai_token_usage.clone(),
        );
        r.register(
            "sluice_tokens",
            "Tokens used, by route, model and consumer (the identity the auth phase gave)",
            self.tokens.clone(),
        );
        r.register(
            "sluice_upstream_retries",
            "Failed upstream attempts a retry policy covered: retried, or not for want of retry budget",
            self.upstream_retries.clone(),
        );
        r.register(
            "sluice_backend_ejections",
            "Times a backend was taken out of rotation: by outlier detection, or for a retry-after",
            self.backend_ejections.clone(),
        );
        r.register(
            "sluice_backend_ejected",
            "Whether a backend is out of rotation now (1) or not (0)",
            self.backend_ejected.clone(),
        );
        r.register(
            "sluice_fallbacks",
            "Requests moved to a fallback model, by route, fallback model and the failure that moved them",
            self.fallbacks.clone(),
        );
        r.register(
            "sluice_plugin_invocations",
            "Plugin hook calls, by plugin, hook and outcome",
            self.plugin_invocations.clone(),
        );
        r.register_with_unit(
            "sluice_plugin_duration",
            "Time a plugin hook call took, instance included",
            Unit::Seconds,
            self.plugin_duration.clone(),
        );
        r.register(
            "sluice_plugin_skipped",
            "Plugin calls that failed and were skipped (failurePolicy: Open)",
            self.plugin_skipped.clone(),
        );
        r.register(
            "sluice_plugin_instances",
            "Instances of each loaded plugin version, in use and idle",
            self.plugin_instances.clone(),
        );
        r.register("sluice_plugin_info", "Each loaded plugin version (value 1)", self.plugin_info.clone());
        r.register_with_unit(
            "sluice_plugin_guest_memory",
            "Linear memory plugin instances hold, busy and idle, by namespace",
            Unit::Bytes,
            self.guest_memory.clone(),
        );
        r.register_with_unit(
            "sluice_plugin_guest_memory_budget",
            "Linear memory all plugin instances may hold together (--max-guest-memory-bytes)",
            Unit::Bytes,
            self.guest_memory_budget.clone(),
        );
        r.register(
            "sluice_plugin_guest_memory_refusals",
            "Guest memory growths refused, after evicting idle instances, by the limit that refused them \
             (the budget, or the namespace's or plugin's share of it) and namespace",
            self.guest_memory_refusals.clone(),
        );
        r.register(
            "sluice_plugin_guest_memory_evictions",
            "Idle plugin instances dropped to give their memory to a live one",
            self.guest_memory_evictions.clone(),
        );
        r.register_with_unit(
            "sluice_response_buffers",
            "Upstream response bytes held in memory (for response-body plugins, translation, usage, events)",
            Unit::Bytes,
            self.response_buffers.clone(),
        );
        r.register_with_unit(
            "sluice_response_buffer_budget",
            "Upstream response bytes all responses may hold together (--max-buffered-response-bytes)",
            Unit::Bytes,
            self.response_buffer_budget.clone(),
        );
        r.register(
            "sluice_response_buffer_refusals",
            "Responses refused (502/503) or left unread for usage because the response buffer budget, or \
             their backend's share of it, was used up",
            self.response_buffer_refusals.clone(),
        );
        r.register("sluice_oci_pulls", "Plugin pulls from OCI registries, by result", self.oci_pulls.clone());
        r.register_collector(Box::new(crate::plugin_metrics::PluginCollector));
        r.register(
            "sluice_plugin_outbound_calls",
            "Plugins' outbound HTTP calls, by plugin, granted destination and result",
            self.plugin_outbound_calls.clone(),
        );
        r.register_with_unit(
            "sluice_plugin_outbound_call_duration",
            "Time from a plugin's outbound call to its response head (or its failure)",
            Unit::Seconds,
            self.plugin_outbound_call_duration.clone(),
        );
        r.register(
            "sluice_plugin_compiles",
            "Plugin versions made ready to run: compiled, or found in the compile cache",
            self.plugin_compiles.clone(),
        );
        r.register_with_unit(
            "sluice_plugin_compile_duration",
            "Time compiling a plugin version (cache misses only)",
            Unit::Seconds,
            self.plugin_compile_duration.clone(),
        );
        r.register(
            "sluice_config_generations",
            "Configs built from the source: applied, or rejected whole",
            self.config_generations.clone(),
        );
        r.register("sluice_config_generation", "The generation of the config served", self.config_generation.clone());
        r.register(
            "sluice_resource_load_state",
            "Each declared resource's load state on this replica (one series per resource, value 1)",
            self.resource_state.clone(),
        );
        r.register(
            "sluice_reconciles",
            "Controller reconciles, by kind and result (`ok` or the error's label)",
            self.reconciles.clone(),
        );
        r.register_with_unit(
            "sluice_reconcile_duration",
            "Time one reconcile took",
            Unit::Seconds,
            self.reconcile_duration.clone(),
        );
        self
    }

    /// The metrics in Prometheus's text format (0.0.4).
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(16 << 10);
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        out
    }

    /// The metrics as Prometheus's protobuf families, labels unescaped and
    /// histogram buckets cumulative: what the OTLP push sends.
    pub(crate) fn families(&self) -> Vec<MetricFamily> {
        prometheus_protobuf::encode(&self.registry).unwrap_or_else(|error| {
            // Only a metric that cannot be encoded fails it; none here can.
            tracing::warn!(%error, "the metrics could not be encoded as protobuf families");
            Vec::new()
        })
    }

    /// Names the running build (the binary knows its git commit; this
    /// crate would be rebuilt, and all that uses it, at every commit).
    pub fn set_build(&self, version: &'static str, commit: &'static str) {
        self.build.clear();
        self.build.get_or_create(&BuildLabels { version, commit }).set(1);
    }

    /// Sets the caps on consumer and response-model values.
    pub fn set_caps(&self, max_consumers: usize, max_response_models: usize) {
        let mut caps = self.caps.lock();
        caps.max_consumers = max_consumers;
        caps.max_response_models = max_response_models;
    }

    /// `consumer`, or [`OTHER`] once the cap is reached with other values.
    pub fn consumer_label(&self, consumer: &str) -> Label {
        self.caps.lock().admit(Cap::Consumer, consumer)
    }

    /// An MCP tool's name, or [`OTHER`] once the cap is reached with
    /// other values: a client names the tool, so it is capped like a
    /// consumer (by `max_consumers`).
    pub fn tool_label(&self, tool: &str) -> Label {
        self.caps.lock().admit(Cap::Tool, tool)
    }

    /// `model`, or [`OTHER`] once the cap is reached with other values.
    pub fn response_model_label(&self, model: &str) -> Label {
        self.caps.lock().admit(Cap::ResponseModel, model)
    }
}

/// Observes a duration in seconds.
pub fn observe(histogram: &Histogram, duration: Duration) {
    histogram.observe(duration.as_secs_f64());
}

/// `2xx`, `4xx`, … of an HTTP status.
pub fn status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

#[derive(Default)]
struct Caps(Mutex<Capped>);

impl Caps {
    fn lock(&self) -> parking_lot::MutexGuard<'_, Capped> {
        self.0.lock()
    }
}

enum Cap {
    Consumer,
    ResponseModel,
    Tool,
}

/// The label values admitted so far; they stay admitted for the process's
/// life, like their series. Looked up twice a request; a seeded fast hash
/// is enough for sets this small (at most the caps).
struct Capped {
    max_consumers: usize,
    max_response_models: usize,
    consumers: HashSet<Label, foldhash::fast::RandomState>,
    response_models: HashSet<Label, foldhash::fast::RandomState>,
    tools: HashSet<Label, foldhash::fast::RandomState>,
    other: Label,
}

impl Default for Capped {
    fn default() -> Self {
        Self {
            max_consumers: 100,
            max_response_models: 100,
            consumers: HashSet::default(),
            response_models: HashSet::default(),
            tools: HashSet::default(),
            other: Label::from(OTHER),
        }
    }
}

impl Capped {
    fn admit(&mut self, cap: Cap, value: &str) -> Label {
        let (seen, max) = match cap {
            Cap::Consumer => (&mut self.consumers, self.max_consumers),
            Cap::ResponseModel => (&mut self.response_models, self.max_response_models),
            Cap::Tool => (&mut self.tools, self.max_consumers),
        };
        if let Some(label) = seen.get(value) {
            return label.clone();
        }
        // `other` is the overflow's name: a value of that name is it.
        if seen.len() >= max || value == OTHER {
            return self.other.clone();
        }
        let label = Label::from(value);
        seen.insert(label.clone());
        label
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_labels_overflow_into_other() {
        let mut caps = Capped { max_consumers: 2, ..Capped::default() };
        assert_eq!(&*caps.admit(Cap::Consumer, "a"), "a");
        assert_eq!(&*caps.admit(Cap::Consumer, "b"), "b");
        assert_eq!(&*caps.admit(Cap::Consumer, "c"), OTHER);
        // Values admitted before the cap keep their own series.
        assert_eq!(&*caps.admit(Cap::Consumer, "a"), "a");
        // The caps are separate.
        assert_eq!(&*caps.admit(Cap::ResponseModel, "c"), "c");
    }

    #[test]
    fn the_text_format_names_follow_the_conventions() {
        let metrics = Metrics::new();
        let labels = TokenUsageLabels {
            gen_ai_operation_name: "chat",
            gen_ai_provider_name: "openai",
            gen_ai_request_model: "m".into(),
            gen_ai_response_model: "m-1".into(),
            gen_ai_token_type: "input",
        };
        metrics.gen_ai_token_usage.get_or_create(&labels).observe(12.0);
        let labels = RequestLabels {
            route: "default/chat".into(),
            model: "m".into(),
            backend: "http://b/v1".into(),
            status_class: "2xx",
            error_code: "",
        };
        metrics.requests.get_or_create(&labels).inc();
        let gen_ai = GenAiLabels {
            gen_ai_operation_name: "chat",
            gen_ai_provider_name: "openai",
            gen_ai_request_model: "m".into(),
            gen_ai_response_model: "m-1".into(),
        };
        observe(&metrics.gen_ai_time_to_first_token.get_or_create(&gen_ai), Duration::from_millis(30));
        let text = metrics.encode();
        assert!(text.contains("# TYPE gen_ai_client_token_usage histogram"), "{text}");
        assert!(text.contains(r#"gen_ai_client_token_usage_count{gen_ai_operation_name="chat",gen_ai_provider_name="openai",gen_ai_request_model="m",gen_ai_response_model="m-1",gen_ai_token_type="input"} 1"#), "{text}");
        assert!(text.contains(r#"gen_ai_server_time_to_first_token_seconds_bucket{gen_ai_operation_name="chat",gen_ai_provider_name="openai",gen_ai_request_model="m",gen_ai_response_model="m-1",le="0.04"} 1"#), "{text}");
        assert!(text.contains(r#"sluice_requests_total{route="default/chat",model="m",backend="http://b/v1",status_class="2xx",error_code=""} 1"#), "{text}");
        assert!(text.contains("sluice_build_info{version=\""), "{text}");
    }
}
