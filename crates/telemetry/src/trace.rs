//! Traces: W3C trace context in and out, and the spans of each request.
//!
//! Tracing is off unless configured. When it is on, a request's trace
//! context is decided when it arrives (the client's `traceparent` is its
//! parent), so that the upstream can be given its own `traceparent`; the
//! spans themselves are built when the request ends, from its record.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry::{InstrumentationScope, KeyValue, StringValue, Value};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::resource::{EnvResourceDetector, TelemetryResourceDetector};
use opentelemetry_sdk::trace::{
    BatchSpanProcessor, Sampler, SamplingDecision, ShouldSample, SpanData, SpanEvents, SpanExporter, SpanLinks,
    SpanProcessor,
};

use crate::context::new_trace_id;
pub use crate::context::{TraceContext, new_span_id, parse_traceparent};
use crate::metrics::Label;
use crate::record::RequestRecord;

/// Whether the SDK's `sampler` samples a trace: a child of the client's
/// span (`parent`: its id and sampled flag) or a new one. By the trace id
/// only, as OpenTelemetry's ratio sampler has it: every replica decides the
/// same for one trace.
fn samples(sampler: &dyn ShouldSample, trace_id: [u8; 16], parent: Option<([u8; 8], bool)>) -> bool {
    let trace_id = TraceId::from_bytes(trace_id);
    let parent = parent.map(|(span_id, sampled)| {
        let flags = if sampled { TraceFlags::SAMPLED } else { TraceFlags::default() };
        let span = SpanContext::new(trace_id, SpanId::from_bytes(span_id), flags, true, TraceState::default());
        opentelemetry::Context::new().with_remote_span_context(span)
    });
    let decision = sampler.should_sample(parent.as_ref(), trace_id, "", &SpanKind::Server, &[], &[]).decision;
    decision == SamplingDecision::RecordAndSample
}

/// The tracer once set up: the sampler and where finished spans go.
pub(crate) struct Tracer {
    sampler: Box<dyn ShouldSample>,
    processor: Arc<BatchSpanProcessor>,
}

impl fmt::Debug for Tracer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tracer").field("sampler", &self.sampler).finish_non_exhaustive()
    }
}

static TRACER: OnceLock<Tracer> = OnceLock::new();

/// The request's trace context if tracing is on: a child of the client's
/// `traceparent` when it sent a valid one, else a new trace.
pub fn start(traceparent: Option<&[u8]>) -> Option<TraceContext> {
    let tracer = TRACER.get()?;
    let span_id = new_span_id();
    if let Some((trace_id, parent, sampled)) = traceparent.and_then(parse_traceparent) {
        let sampled = samples(&*tracer.sampler, trace_id, Some((parent, sampled)));
        return Some(TraceContext { trace_id, span_id, parent_span_id: Some(parent), sampled });
    }
    let trace_id = new_trace_id();
    let sampled = samples(&*tracer.sampler, trace_id, None);
    Some(TraceContext { trace_id, span_id, parent_span_id: None, sampled })
}

/// How spans reach the collector. Each field left `None` falls back to the
/// standard `OTEL_*` variable, then to OpenTelemetry's default.
#[derive(Clone, Debug, Default)]
pub struct TraceConfig {
    /// The collector's OTLP endpoint, like `OTEL_EXPORTER_OTLP_ENDPOINT`:
    /// for `http/protobuf`, `/v1/traces` is appended to it. Else
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as is), then
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`; tracing is off without any.
    pub endpoint: Option<String>,
    /// Else `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, then
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`, then `http/protobuf`.
    pub protocol: Option<Protocol>,
    /// The share of new traces sampled, 0 to 1 (a client's sampled flag is
    /// kept). Else the SDK's sampler: `OTEL_TRACES_SAMPLER` and
    /// `OTEL_TRACES_SAMPLER_ARG`, then `parentbased_always_on`; a value it
    /// does not know is warned of, not an error.
    pub sample_ratio: Option<f64>,
}

/// The OTLP transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// `grpc`
    Grpc,
    /// `http/protobuf`
    HttpProtobuf,
}

impl FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "grpc" => Ok(Protocol::Grpc),
            "http/protobuf" => Ok(Protocol::HttpProtobuf),
            _ => Err(format!("`{s}` is not an OTLP protocol Sluice speaks: grpc or http/protobuf")),
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{name}: {message}")]
    Setting { name: &'static str, message: String },
    #[error("the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("the OTLP exporter's runtime: {0}")]
    Runtime(std::io::Error),
    #[error("tracing is set up already")]
    AlreadySetUp,
}

fn setting(name: &'static str, message: impl Into<String>) -> TraceError {
    TraceError::Setting { name, message: message.into() }
}

/// Keeps the exporter running: [`TraceGuard::shutdown`] (or dropping it)
/// exports the spans still queued, then stops it.
pub struct TraceGuard {
    /// Until shut down.
    processor: Option<Arc<BatchSpanProcessor>>,
}

impl TraceGuard {
    /// Exports what is queued (waiting up to 5 seconds) and stops. It blocks:
    /// call it at exit, from anywhere, a runtime's thread included.
    pub fn shutdown(mut self) {
        self.close();
    }

    fn close(&mut self) {
        let Some(processor) = self.processor.take() else { return };
        if let Err(error) = processor.shutdown() {
            tracing::warn!(%error, "the last spans were not all exported");
        }
    }
}

impl Drop for TraceGuard {
    fn drop(&mut self) {
        self.close();
    }
}

impl fmt::Debug for TraceGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceGuard").finish_non_exhaustive()
    }
}

/// Sets up tracing: `Ok(None)` when no OTLP endpoint is configured (or
/// `OTEL_SDK_DISABLED=true`, or `OTEL_TRACES_EXPORTER=none`). Keep the guard
/// until exit.
///
/// Besides the variables [`TraceConfig`] names, the exporter reads
/// `OTEL_EXPORTER_OTLP_{,TRACES_}{HEADERS,TIMEOUT}`, the batching ones
/// `OTEL_BSP_*`, and the resource `OTEL_SERVICE_NAME` (`sluice` by default)
/// and `OTEL_RESOURCE_ATTRIBUTES`.
pub fn init(config: TraceConfig) -> Result<Option<TraceGuard>, TraceError> {
    if TRACER.get().is_some() {
        return Err(TraceError::AlreadySetUp);
    }
    let Some((tracer, guard)) = build(config, &from_env)? else { return Ok(None) };
    TRACER.set(tracer).map_err(|_| TraceError::AlreadySetUp)?;
    Ok(Some(guard))
}

/// A variable's value, if set and not blank.
pub(crate) type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

pub(crate) fn from_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.trim().is_empty())
}

const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
const TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";

fn build(config: TraceConfig, env: Env) -> Result<Option<(Tracer, TraceGuard)>, TraceError> {
    let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim() == "none");
    let endpoint = config.endpoint.filter(|e| !e.trim().is_empty());
    let (name, effective) = match &endpoint {
        Some(endpoint) => ("the trace endpoint", endpoint.clone()),
        None => match env(TRACES_ENDPOINT) {
            Some(endpoint) => (TRACES_ENDPOINT, endpoint),
            None => match env(ENDPOINT) {
                Some(endpoint) => (ENDPOINT, endpoint),
                None => return Ok(None),
            },
        },
    };
    if disabled {
        return Ok(None);
    }
    // Neither transport is built with TLS: said now, not at the first export.
    if !effective.trim().to_ascii_lowercase().starts_with("http://") {
        return Err(setting(name, format!("`{effective}` is not an http:// URL (TLS is not supported)")));
    }
    let protocol = match config.protocol {
        Some(protocol) => protocol,
        None => protocol_from_env(env)?,
    };
    let sampler: Box<dyn ShouldSample> = match config.sample_ratio {
        Some(ratio) => {
            let ratio = ratio_in_range("the sample ratio", ratio)?;
            Box::new(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio))))
        }
        // The SDK's, from `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`
        // (it warns of a value it does not know, and samples by the parent,
        // else all).
        None => opentelemetry_sdk::trace::Config::default().sampler,
    };

    // The batch processor exports from its own thread, each export on the
    // runtime the metrics are pushed from too.
    let runtime = crate::export::runtime().map_err(TraceError::Runtime)?;
    let mut exporter = {
        // tonic's channel spawns its worker where it is built.
        let _runtime = runtime.enter();
        let builder = opentelemetry_otlp::SpanExporter::builder();
        match protocol {
            Protocol::Grpc => {
                let builder = builder.with_tonic();
                match endpoint {
                    Some(endpoint) => builder.with_endpoint(endpoint),
                    None => builder,
                }
                .build()?
            }
            Protocol::HttpProtobuf => {
                let builder = builder.with_http().with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
                match endpoint {
                    Some(endpoint) => builder.with_endpoint(http_traces_url(&endpoint)),
                    None => builder,
                }
                .build()?
            }
        }
    };
    exporter.set_resource(&resource(env));
    let exporter = OnRuntime { exporter: Arc::new(exporter), runtime: runtime.handle().clone() };
    let processor = Arc::new(BatchSpanProcessor::builder(exporter).build());
    let tracer = Tracer { sampler, processor: processor.clone() };
    Ok(Some((tracer, TraceGuard { processor: Some(processor) })))
}

/// The traces URL under an OTLP/HTTP base URL, as the exporter makes it of
/// `OTEL_EXPORTER_OTLP_ENDPOINT`.
fn http_traces_url(base: &str) -> String {
    format!("{}/v1/traces", base.trim().trim_end_matches('/'))
}

fn protocol_from_env(env: Env) -> Result<Protocol, TraceError> {
    for name in ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"] {
        if let Some(value) = env(name) {
            return value.trim().parse().map_err(|message| setting(name, message));
        }
    }
    Ok(Protocol::HttpProtobuf)
}

fn ratio_in_range(name: &'static str, ratio: f64) -> Result<f64, TraceError> {
    if (0.0..=1.0).contains(&ratio) { Ok(ratio) } else { Err(setting(name, format!("{ratio} is not between 0 and 1"))) }
}

/// `service.name` is `sluice` unless `OTEL_SERVICE_NAME` or
/// `OTEL_RESOURCE_ATTRIBUTES` name it otherwise (the former first, as the
/// SDK's detectors have it).
pub(crate) fn resource(env: Env) -> Resource {
    let builder = Resource::builder_empty()
        .with_service_name("sluice")
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .with_detectors(&[Box::new(TelemetryResourceDetector), Box::new(EnvResourceDetector::new())]);
    match env("OTEL_SERVICE_NAME") {
        Some(name) => builder.with_service_name(name),
        None => builder,
    }
    .build()
}

/// Runs each export on the exporter's runtime, whatever thread asks for it.
#[derive(Debug)]
struct OnRuntime {
    exporter: Arc<opentelemetry_otlp::SpanExporter>,
    runtime: tokio::runtime::Handle,
}

impl SpanExporter for OnRuntime {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let exporter = self.exporter.clone();
        match self.runtime.spawn(async move { exporter.export(batch).await }).await {
            Ok(result) => result,
            Err(error) => Err(OTelSdkError::InternalFailure(format!("the export task ended: {error}"))),
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.exporter.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.exporter.force_flush()
    }
}

/// Exports the request's spans, if it is sampled.
pub(crate) fn export(record: &RequestRecord, duration: Duration) {
    if let Some(tracer) = TRACER.get() {
        export_to(&*tracer.processor, record, duration);
    }
}

fn export_to(processor: &dyn SpanProcessor, record: &RequestRecord, duration: Duration) {
    for span in spans(record, duration) {
        processor.on_end(span);
    }
}

/// The longest attribute value or span name, in bytes.
const MAX_TEXT: usize = 256;

/// The request's spans, built after the fact from its record: the server
/// span, a child per plugin hook and one per upstream attempt. None unless
/// the request is sampled.
fn spans(record: &RequestRecord, duration: Duration) -> Vec<SpanData> {
    let Some(trace) = record.trace.as_ref().filter(|trace| trace.sampled) else { return Vec::new() };
    let trace_id = TraceId::from_bytes(trace.trace_id);
    let server_id = SpanId::from_bytes(trace.span_id);
    let at = |offset: Duration| record.started_at.checked_add(offset).unwrap_or(record.started_at);
    let scope = InstrumentationScope::builder("sluice").with_version(env!("CARGO_PKG_VERSION")).build();
    let span = |span_id: SpanId, kind: SpanKind, name: String, (start, end): (Duration, Duration)| SpanData {
        span_context: SpanContext::new(trace_id, span_id, TraceFlags::SAMPLED, false, TraceState::NONE),
        parent_span_id: server_id,
        parent_span_is_remote: false,
        span_kind: kind,
        name: Cow::Owned(bounded(&name).to_string()),
        start_time: at(start),
        end_time: at(end.max(start)),
        attributes: Vec::new(),
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status: Status::Unset,
        instrumentation_scope: scope.clone(),
    };
    let mut spans = Vec::with_capacity(1 + record.plugins.len() + record.attempts.len());

    // The server span. Named as GenAI spans are for the endpoints that
    // forward to a model, as HTTP server spans are otherwise.
    let name = match (record.operation, &record.model) {
        (Some(operation), Some(model)) => format!("{operation} {model}"),
        _ => format!("{} {}", record.method, record.path),
    };
    let mut server = span(server_id, SpanKind::Server, name, (Duration::ZERO, duration));
    server.parent_span_id = trace.parent_span_id.map_or(SpanId::INVALID, SpanId::from_bytes);
    server.parent_span_is_remote = trace.parent_span_id.is_some();
    let attributes = &mut server.attributes;
    attributes.push(KeyValue::new("http.request.method", method(&record.method)));
    attributes.push(KeyValue::new("url.path", text(&record.path)));
    if record.status != 0 {
        attributes.push(KeyValue::new("http.response.status_code", i64::from(record.status)));
    }
    attributes.push(KeyValue::new("http.response.body.size", record.response_bytes.min(i64::MAX as u64) as i64));
    if let Some(operation) = record.operation {
        attributes.push(KeyValue::new("gen_ai.operation.name", operation));
        attributes.push(KeyValue::new("gen_ai.provider.name", record.provider));
    }
    if let Some(model) = &record.model {
        attributes.push(KeyValue::new("gen_ai.request.model", label(model)));
    }
    if let Some(model) = &record.response_model {
        attributes.push(KeyValue::new("gen_ai.response.model", text(model)));
    }
    if let Some(tokens) = record.tokens {
        attributes.push(KeyValue::new("gen_ai.usage.input_tokens", tokens.input.min(i64::MAX as u64) as i64));
        attributes.push(KeyValue::new("gen_ai.usage.output_tokens", tokens.output.min(i64::MAX as u64) as i64));
    }
    let server_error = record.status >= 500;
    match record.error_code {
        Some(code) => attributes.push(KeyValue::new("error.type", code)),
        None if server_error => attributes.push(KeyValue::new("error.type", record.status.to_string())),
        None => {}
    }
    attributes.push(KeyValue::new("sluice.request_id", label(&record.id)));
    if let Some(route) = &record.route {
        attributes.push(KeyValue::new("sluice.route", label(route)));
    }
    if let Some(backend) = &record.backend {
        attributes.push(KeyValue::new("sluice.backend", label(backend)));
    }
    if let Some(consumer) = &record.consumer {
        attributes.push(KeyValue::new("sluice.consumer", text(consumer)));
    }
    attributes.push(KeyValue::new("sluice.streamed", record.streamed));
    attributes.push(KeyValue::new("sluice.completed", record.completed));
    if let Some(first) = record.first_byte {
        attributes.push(KeyValue::new("sluice.time_to_first_token_ms", millis(first)));
    }
    if server_error {
        // Server spans are errors for 5xx only: a 4xx is the client's.
        server.status = Status::error(record.error_code.unwrap_or(""));
    }
    spans.push(server);

    for calls in &record.plugins {
        let plugin = &calls.plugin;
        let hook = calls.hook.as_str();
        let name = format!("plugin {}/{} {hook}", plugin.namespace, plugin.name);
        let mut child =
            span(SpanId::from_bytes(new_span_id()), SpanKind::Internal, name, (calls.first_start, calls.last_end));
        child.attributes = vec![
            KeyValue::new("sluice.plugin.namespace", label(&plugin.namespace)),
            KeyValue::new("sluice.plugin.name", label(&plugin.name)),
            KeyValue::new("sluice.plugin.digest", label(&plugin.digest)),
            KeyValue::new("sluice.plugin.hook", hook),
            KeyValue::new("sluice.plugin.outcome", calls.outcome.as_str()),
            KeyValue::new("sluice.plugin.calls", i64::from(calls.calls)),
            KeyValue::new("sluice.plugin.busy_ms", millis(calls.busy)),
            KeyValue::new("sluice.plugin.skipped", calls.skipped),
        ];
        if calls.outcome.failed() {
            child.status = Status::error(calls.outcome.as_str());
        }
        spans.push(child);
    }

    // The upstream gets the path without `/v1` under the backend URL, as the
    // proxy builds it.
    let suffix = record.path.strip_prefix("/v1").unwrap_or(&record.path);
    for attempt in &record.attempts {
        let span_id = SpanId::from_bytes(attempt.span_id.unwrap_or_else(new_span_id));
        let name = format!("upstream {}", attempt.backend);
        let mut child = span(span_id, SpanKind::Client, name, (attempt.start, attempt.end));
        let attributes = &mut child.attributes;
        attributes.push(KeyValue::new("url.full", text(&format!("{}{suffix}", attempt.backend))));
        if let Some((address, port)) = server_address(&attempt.backend) {
            attributes.push(KeyValue::new("server.address", text(&address)));
            attributes.push(KeyValue::new("server.port", i64::from(port)));
        }
        attributes.push(KeyValue::new("http.request.method", method(&record.method)));
        if let Some(status) = attempt.status {
            attributes.push(KeyValue::new("http.response.status_code", i64::from(status)));
        }
        // `error.type` is meant to be low-cardinality: the message goes in
        // the status.
        match (&attempt.error, attempt.status) {
            (Some(error), _) => {
                attributes.push(KeyValue::new("error.type", "_OTHER"));
                child.status = Status::error(bounded(error).to_string());
            }
            // Client spans are errors for 4xx too: this request failed.
            (None, Some(status)) if status >= 400 => {
                attributes.push(KeyValue::new("error.type", status.to_string()));
                child.status = Status::error("");
            }
            (None, _) => {}
        }
        spans.push(child);
    }
    spans
}

/// The method as HTTP conventions name it: the known ones, else `_OTHER`.
fn method(method: &str) -> &'static str {
    const KNOWN: [&str; 9] = ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"];
    KNOWN.into_iter().find(|known| *known == method).unwrap_or("_OTHER")
}

fn millis(duration: Duration) -> f64 {
    (duration.as_secs_f64() * 1e6).round() / 1e3
}

/// At most [`MAX_TEXT`] bytes of `text`, cut at a character boundary.
fn bounded(text: &str) -> &str {
    let mut end = text.len().min(MAX_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn text(text: &str) -> Value {
    Value::from(bounded(text).to_string())
}

/// A label shared, not copied, when it is short enough.
fn label(label: &Label) -> Value {
    if label.len() <= MAX_TEXT { Value::String(StringValue::from(label.clone())) } else { text(label) }
}

/// The host (without IPv6 brackets) and port of a backend URL.
fn server_address(url: &str) -> Option<(String, u16)> {
    let uri: http::Uri = url.parse().ok()?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    let port = match (uri.port_u16(), uri.scheme_str()) {
        (Some(port), _) => port,
        (None, Some("https")) => 443,
        (None, _) => 80,
    };
    Some((host.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::hex;
    use crate::record::{Attempt, Hook, Outcome, PluginCalls, PluginId, Tokens};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SimpleSpanProcessor};

    const CLIENT_TRACE: [u8; 16] = [0x4b; 16];
    const CLIENT_SPAN: [u8; 8] = [0x0f; 8];
    const SERVER_SPAN: [u8; 8] = [0x5e; 8];
    const ATTEMPT_SPAN: [u8; 8] = [0xa7; 8];

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A chat request that went through one plugin twice (two hooks) and
    /// two backends, the first unreachable.
    fn chat_record(trace: Option<TraceContext>) -> RequestRecord {
        let mut record = RequestRecord::new("req-1".into(), "POST", "/v1/chat/completions");
        record.trace = trace;
        record.operation = Some("chat");
        record.route = Some("default/chat".into());
        record.model = Some("gpt-4o-mini".into());
        record.response_model = Some("gpt-4o-mini-2024-07-18".into());
        record.backend = Some("http://127.0.0.1:9001/v1".into());
        record.status = 200;
        record.streamed = true;
        record.completed = true;
        record.first_byte = Some(ms(40));
        record.response_bytes = 1234;
        record.tokens = Some(Tokens { input: 12, output: 34, total: 46 });
        record.consumer = Some("team-a".into());
        let plugin = Arc::new(PluginId::new("default", "pii", "sha256:abc"));
        let calls = |hook, first_start, last_end, calls, outcome| PluginCalls {
            plugin: plugin.clone(),
            hook,
            calls,
            first_start,
            last_end,
            busy: ms(1),
            outcome,
            skipped: false,
        };
        record.plugins.push(calls(Hook::Request, ms(1), ms(3), 1, Outcome::Continue));
        record.plugins.push(calls(Hook::ResponseChunk, ms(41), ms(90), 7, Outcome::Trap));
        record.attempts.push(Attempt {
            backend: "http://127.0.0.1:9000/v1".into(),
            start: ms(4),
            end: ms(6),
            status: None,
            error: Some("connection refused".into()),
            span_id: Some([0xa6; 8]),
        });
        record.attempts.push(Attempt {
            backend: "http://127.0.0.1:9001/v1".into(),
            start: ms(6),
            end: ms(95),
            status: Some(200),
            error: None,
            span_id: Some(ATTEMPT_SPAN),
        });
        record
    }

    fn child_of_client(sampled: bool) -> Option<TraceContext> {
        Some(TraceContext { trace_id: CLIENT_TRACE, span_id: SERVER_SPAN, parent_span_id: Some(CLIENT_SPAN), sampled })
    }

    /// What the SDK's in-memory exporter received for the record.
    fn exported(record: &RequestRecord, duration: Duration) -> Vec<SpanData> {
        let exporter = InMemorySpanExporter::default();
        export_to(&SimpleSpanProcessor::new(exporter.clone()), record, duration);
        exporter.get_finished_spans().unwrap()
    }

    fn attribute(span: &SpanData, key: &str) -> Option<Value> {
        span.attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| kv.value.clone())
    }

    fn string(value: &str) -> Option<Value> {
        Some(Value::from(value.to_string()))
    }

    #[test]
    fn a_sampled_request_is_a_server_span_with_a_child_per_plugin_hook_and_attempt() {
        let record = chat_record(child_of_client(true));
        let spans = exported(&record, ms(100));
        assert_eq!(spans.len(), 5, "{spans:#?}");

        let server = &spans[0];
        assert_eq!(server.name, "chat gpt-4o-mini");
        assert_eq!(server.span_kind, SpanKind::Server);
        assert_eq!(server.span_context.trace_id(), TraceId::from_bytes(CLIENT_TRACE));
        assert_eq!(server.span_context.span_id(), SpanId::from_bytes(SERVER_SPAN));
        assert!(server.span_context.is_sampled());
        // The client's span is the parent, and it is remote.
        assert_eq!(server.parent_span_id, SpanId::from_bytes(CLIENT_SPAN));
        assert!(server.parent_span_is_remote);
        assert_eq!(server.start_time, record.started_at);
        assert_eq!(server.end_time, record.started_at + ms(100));
        assert_eq!(server.status, Status::Unset);
        for (key, value) in [
            ("gen_ai.operation.name", Value::from("chat")),
            ("gen_ai.provider.name", Value::from("openai")),
            ("gen_ai.request.model", Value::from("gpt-4o-mini")),
            ("gen_ai.response.model", Value::from("gpt-4o-mini-2024-07-18")),
            ("gen_ai.usage.input_tokens", Value::I64(12)),
            ("gen_ai.usage.output_tokens", Value::I64(34)),
            ("http.request.method", Value::from("POST")),
            ("url.path", Value::from("/v1/chat/completions")),
            ("http.response.status_code", Value::I64(200)),
            ("http.response.body.size", Value::I64(1234)),
            ("sluice.route", Value::from("default/chat")),
            ("sluice.backend", Value::from("http://127.0.0.1:9001/v1")),
            ("sluice.request_id", Value::from("req-1")),
            ("sluice.consumer", Value::from("team-a")),
            ("sluice.streamed", Value::Bool(true)),
            ("sluice.completed", Value::Bool(true)),
            ("sluice.time_to_first_token_ms", Value::F64(40.0)),
        ] {
            assert_eq!(attribute(server, key), Some(value), "{key}");
        }
        assert_eq!(attribute(server, "error.type"), None);

        // Every child is the server span's, within its time.
        for child in &spans[1..] {
            assert_eq!(child.span_context.trace_id(), TraceId::from_bytes(CLIENT_TRACE));
            assert_eq!(child.parent_span_id, SpanId::from_bytes(SERVER_SPAN));
            assert!(!child.parent_span_is_remote);
            assert!(server.start_time <= child.start_time, "{}", child.name);
            assert!(child.start_time <= child.end_time, "{}", child.name);
            assert!(child.end_time <= server.end_time, "{}", child.name);
        }
        let ids: std::collections::HashSet<_> = spans.iter().map(|s| s.span_context.span_id()).collect();
        assert_eq!(ids.len(), spans.len(), "span ids are unique");

        let request = &spans[1];
        assert_eq!(request.name, "plugin default/pii request");
        assert_eq!(request.span_kind, SpanKind::Internal);
        assert_eq!((request.start_time, request.end_time), (record.started_at + ms(1), record.started_at + ms(3)));
        assert_eq!(request.status, Status::Unset);
        for (key, value) in [
            ("sluice.plugin.namespace", Value::from("default")),
            ("sluice.plugin.name", Value::from("pii")),
            ("sluice.plugin.digest", Value::from("sha256:abc")),
            ("sluice.plugin.hook", Value::from("request")),
            ("sluice.plugin.outcome", Value::from("continue")),
            ("sluice.plugin.calls", Value::I64(1)),
            ("sluice.plugin.skipped", Value::Bool(false)),
        ] {
            assert_eq!(attribute(request, key), Some(value), "{key}");
        }
        // The chunk hook's seven calls are one span, from the first to the
        // last; the trap makes it an error.
        let chunks = &spans[2];
        assert_eq!(chunks.name, "plugin default/pii response-chunk");
        assert_eq!((chunks.start_time, chunks.end_time), (record.started_at + ms(41), record.started_at + ms(90)));
        assert_eq!(attribute(chunks, "sluice.plugin.calls"), Some(Value::I64(7)));
        assert_eq!(attribute(chunks, "sluice.plugin.outcome"), Some(Value::from("trap")));
        assert_eq!(chunks.status, Status::error("trap"));

        let refused = &spans[3];
        assert_eq!(refused.name, "upstream http://127.0.0.1:9000/v1");
        assert_eq!(refused.span_kind, SpanKind::Client);
        assert_eq!(refused.span_context.span_id(), SpanId::from_bytes([0xa6; 8]));
        assert_eq!(attribute(refused, "url.full"), string("http://127.0.0.1:9000/v1/chat/completions"));
        assert_eq!(attribute(refused, "server.address"), string("127.0.0.1"));
        assert_eq!(attribute(refused, "server.port"), Some(Value::I64(9000)));
        assert_eq!(attribute(refused, "http.response.status_code"), None);
        assert_eq!(attribute(refused, "error.type"), Some(Value::from("_OTHER")));
        assert_eq!(refused.status, Status::error("connection refused"));

        // The span id the upstream saw in its `traceparent`.
        let answered = &spans[4];
        assert_eq!(answered.span_context.span_id(), SpanId::from_bytes(ATTEMPT_SPAN));
        assert_eq!((answered.start_time, answered.end_time), (record.started_at + ms(6), record.started_at + ms(95)));
        assert_eq!(attribute(answered, "http.request.method"), Some(Value::from("POST")));
        assert_eq!(attribute(answered, "http.response.status_code"), Some(Value::I64(200)));
        assert_eq!(attribute(answered, "server.port"), Some(Value::I64(9001)));
        assert_eq!(attribute(answered, "error.type"), None);
        assert_eq!(answered.status, Status::Unset);
    }

    #[test]
    fn unsampled_and_untraced_requests_export_nothing() {
        assert!(exported(&chat_record(child_of_client(false)), ms(100)).is_empty());
        assert!(exported(&chat_record(None), ms(100)).is_empty());
    }

    #[test]
    fn a_new_trace_has_no_parent_and_a_gateway_error_is_an_error() {
        let trace = TraceContext { trace_id: CLIENT_TRACE, span_id: SERVER_SPAN, parent_span_id: None, sampled: true };
        let mut record = RequestRecord::new("req-2".into(), "BREW", "/v1/chat/completions");
        record.trace = Some(trace);
        record.operation = Some("chat");
        record.status = 502;
        let spans = exported(&record, ms(5));
        let [server] = &spans[..] else { panic!("{spans:#?}") };
        // No model: named as an HTTP server span.
        assert_eq!(server.name, "BREW /v1/chat/completions");
        assert_eq!(server.parent_span_id, SpanId::INVALID);
        assert!(!server.parent_span_is_remote);
        assert_eq!(attribute(server, "http.request.method"), Some(Value::from("_OTHER")));
        assert_eq!(attribute(server, "error.type"), string("502"));
        assert!(matches!(server.status, Status::Error { .. }));
        assert_eq!(attribute(server, "gen_ai.request.model"), None);
        assert_eq!(attribute(server, "gen_ai.usage.input_tokens"), None);
        assert_eq!(attribute(server, "sluice.consumer"), None);

        // The gateway's error code wins; a 4xx is not the server's error.
        record.status = 429;
        record.error_code = Some("rate_limit_exceeded");
        let spans = exported(&record, ms(5));
        assert_eq!(attribute(&spans[0], "error.type"), Some(Value::from("rate_limit_exceeded")));
        assert_eq!(spans[0].status, Status::Unset);
    }

    #[test]
    fn an_upstream_4xx_fails_its_attempt_span() {
        let mut record = chat_record(child_of_client(true));
        record.attempts.truncate(1);
        record.attempts[0] = Attempt {
            backend: "https://api.example.com/v1".into(),
            start: ms(1),
            end: ms(2),
            status: Some(401),
            error: None,
            span_id: None,
        };
        let spans = exported(&record, ms(5));
        let attempt = spans.last().unwrap();
        assert_eq!(attempt.span_kind, SpanKind::Client);
        assert!(attempt.span_context.span_id() != SpanId::INVALID);
        assert_eq!(attribute(attempt, "server.address"), string("api.example.com"));
        assert_eq!(attribute(attempt, "server.port"), Some(Value::I64(443)));
        assert_eq!(attribute(attempt, "error.type"), string("401"));
        assert!(matches!(attempt.status, Status::Error { .. }));
    }

    #[test]
    fn long_values_are_cut_at_a_character_boundary() {
        let mut record = chat_record(child_of_client(true));
        // 255 bytes of ASCII, then a two-byte character across the limit.
        record.consumer = Some(format!("{}é{}", "a".repeat(255), "b".repeat(100)));
        record.model = Some("m".repeat(300).into());
        let spans = exported(&record, ms(100));
        let consumer = attribute(&spans[0], "sluice.consumer").unwrap().as_str().into_owned();
        assert_eq!(consumer, "a".repeat(255));
        let model = attribute(&spans[0], "gen_ai.request.model").unwrap().as_str().into_owned();
        assert_eq!(model.len(), MAX_TEXT);
        assert_eq!(spans[0].name.len(), MAX_TEXT);
        assert_eq!(bounded("ascii"), "ascii");
    }

    #[test]
    fn offsets_past_the_end_of_time_do_not_panic() {
        let mut record = chat_record(child_of_client(true));
        record.attempts[0].end = Duration::MAX;
        let spans = exported(&record, Duration::MAX);
        assert_eq!(spans.len(), 5);
    }

    #[test]
    fn server_addresses_of_backend_urls() {
        assert_eq!(server_address("http://127.0.0.1:9000/v1"), Some(("127.0.0.1".into(), 9000)));
        assert_eq!(server_address("https://api.example.com/v1"), Some(("api.example.com".into(), 443)));
        assert_eq!(server_address("http://example.com"), Some(("example.com".into(), 80)));
        assert_eq!(server_address("http://[::1]:8080/v1"), Some(("::1".into(), 8080)));
        assert_eq!(server_address("not a url"), None);
    }

    fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn sampling_decisions() {
        let trace = new_trace_id();
        let parent = [7; 8];
        let ratio = |ratio| Sampler::TraceIdRatioBased(ratio);
        // What `--trace-sample-ratio` sets up: the client's flag decides.
        let parent_based = Sampler::ParentBased(Box::new(ratio(0.0)));
        assert!(samples(&parent_based, trace, Some((parent, true))));
        assert!(!samples(&parent_based, trace, Some((parent, false))));
        assert!(!samples(&parent_based, trace, None));
        assert!(!samples(&Sampler::AlwaysOff, trace, Some((parent, true))));
        assert!(samples(&Sampler::AlwaysOn, trace, Some((parent, false))));
        let half = Sampler::ParentBased(Box::new(ratio(0.5)));
        let sampled_count = (0..2000).filter(|_| samples(&half, new_trace_id(), None)).count();
        // Binomial(2000, 0.5): this range is more than 8 standard deviations.
        assert!((800..1200).contains(&sampled_count), "{sampled_count}");
        // By the trace id: the same decision every time.
        let decisions: Vec<bool> = (0..10).map(|_| samples(&half, trace, None)).collect();
        assert!(decisions.iter().all(|d| *d == decisions[0]), "{decisions:?}");
    }

    /// Unless the ratio is given, the SDK's sampler from the environment:
    /// by default, the parent's decision, else all.
    #[test]
    fn the_default_sampler_is_the_sdks() {
        if std::env::var_os("OTEL_TRACES_SAMPLER").is_some() {
            return;
        }
        let config = TraceConfig { endpoint: Some("http://127.0.0.1:4318".into()), ..Default::default() };
        let (tracer, guard) = build(config, &env_of(&[])).unwrap().unwrap();
        assert!(samples(&*tracer.sampler, new_trace_id(), None));
        assert!(!samples(&*tracer.sampler, new_trace_id(), Some(([7; 8], false))));
        guard.shutdown();
    }

    #[test]
    fn protocols_from_the_environment() {
        let protocol = |vars: &[(&str, &str)]| protocol_from_env(&env_of(vars));
        assert_eq!(protocol(&[]).unwrap(), Protocol::HttpProtobuf);
        assert_eq!(protocol(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]).unwrap(), Protocol::Grpc);
        assert_eq!(
            protocol(&[
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
            ])
            .unwrap(),
            Protocol::HttpProtobuf
        );
        assert!(protocol(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")]).is_err());
    }

    #[test]
    fn tracing_is_off_without_an_endpoint() {
        let off = |config: TraceConfig, vars: &[(&str, &str)]| build(config, &env_of(vars)).unwrap().is_none();
        assert!(off(TraceConfig::default(), &[]));
        assert!(off(TraceConfig { endpoint: Some(" ".into()), ..Default::default() }, &[]));
        let endpoint = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")];
        assert!(off(TraceConfig::default(), &[endpoint[0], ("OTEL_SDK_DISABLED", "true")]));
        assert!(off(TraceConfig::default(), &[endpoint[0], ("OTEL_TRACES_EXPORTER", "none")]));
        // And on with one (nothing is sent until there are spans).
        assert!(!off(TraceConfig::default(), &endpoint));
        assert!(!off(
            TraceConfig::default(),
            &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:4318/v1/traces")]
        ));
    }

    #[test]
    fn bad_settings_are_errors() {
        let error = |config: TraceConfig, vars: &[(&str, &str)]| build(config, &env_of(vars)).unwrap_err().to_string();
        let https = error(TraceConfig { endpoint: Some("https://collector:4317".into()), ..Default::default() }, &[]);
        assert!(https.contains("TLS"), "{https}");
        let https = error(TraceConfig::default(), &[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318")]);
        assert!(https.starts_with("OTEL_EXPORTER_OTLP_ENDPOINT"), "{https}");
        let ratio = error(
            TraceConfig {
                endpoint: Some("http://collector:4317".into()),
                sample_ratio: Some(2.0),
                ..Default::default()
            },
            &[],
        );
        assert!(ratio.contains("between 0 and 1"), "{ratio}");
    }

    #[test]
    fn the_service_is_sluice_unless_named() {
        let name = |vars: &[(&str, &str)]| resource(&env_of(vars)).get(&"service.name".into());
        // (`OTEL_RESOURCE_ATTRIBUTES` is read from the process's environment.)
        if std::env::var_os("OTEL_RESOURCE_ATTRIBUTES").is_none() {
            assert_eq!(name(&[]), Some(Value::from("sluice")));
        }
        assert_eq!(name(&[("OTEL_SERVICE_NAME", "edge-gateway")]), Some(Value::from("edge-gateway")));
        let resource = resource(&env_of(&[]));
        assert_eq!(resource.get(&"service.version".into()), Some(Value::from(env!("CARGO_PKG_VERSION"))));
        assert_eq!(resource.get(&"telemetry.sdk.name".into()), Some(Value::from("opentelemetry")));
    }

    /// Exports a record to a local collector over `protocol`, stopping the
    /// exporter with `stop` (the tests call it in and out of a runtime).
    fn export_over(protocol: Protocol) {
        let reply = crate::stand_in::Reply::Ok(bytes::Bytes::new());
        let collector = crate::stand_in::start::<ExportTraceServiceRequest>(reply);
        let config = TraceConfig {
            endpoint: Some(format!("http://{}", collector.addr)),
            protocol: Some(protocol),
            sample_ratio: None,
        };
        let (tracer, guard) = build(config, &env_of(&[])).unwrap().unwrap();
        let record = chat_record(child_of_client(true));
        export_to(&*tracer.processor, &record, ms(100));
        // Shutting down exports what is queued.
        guard.shutdown();

        let crate::stand_in::Export { path, request, .. } =
            collector.received.recv_timeout(Duration::from_secs(20)).expect("an export");
        let expected = match protocol {
            Protocol::Grpc => "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            Protocol::HttpProtobuf => "/v1/traces",
        };
        assert_eq!(path, expected);
        let [resource_spans] = &request.resource_spans[..] else { panic!("{request:#?}") };
        let service = resource_spans.resource.as_ref().unwrap().attributes.iter().find(|kv| kv.key == "service.name");
        assert!(service.is_some(), "{resource_spans:#?}");
        let spans: Vec<_> = resource_spans.scope_spans.iter().flat_map(|s| &s.spans).collect();
        assert_eq!(spans.len(), 5);
        assert_eq!(spans[0].name, "chat gpt-4o-mini");
        assert_eq!(spans[0].trace_id, CLIENT_TRACE);
        assert_eq!(spans[0].parent_span_id, CLIENT_SPAN);
        assert_eq!(spans[4].span_id, ATTEMPT_SPAN);
        assert_eq!(resource_spans.scope_spans[0].scope.as_ref().unwrap().name, "sluice");
    }

    // The batch processor exports from its own thread: neither transport
    // may depend on the caller's runtime, or on there being one.
    #[test]
    fn exports_over_grpc_without_a_runtime() {
        export_over(Protocol::Grpc);
    }

    #[test]
    fn exports_over_http_without_a_runtime() {
        export_over(Protocol::HttpProtobuf);
    }

    // Set up and shut down on a single-threaded runtime's only thread, as
    // a `#[tokio::main(flavor = "current_thread")]` would: blocking it must
    // not stall the export.
    #[tokio::test]
    async fn exports_over_grpc_from_a_single_threaded_runtime() {
        export_over(Protocol::Grpc);
    }

    #[tokio::test]
    async fn exports_over_http_from_a_single_threaded_runtime() {
        export_over(Protocol::HttpProtobuf);
    }

    #[test]
    fn reads_valid_traceparents_only() {
        let (trace, parent, sampled) =
            parse_traceparent(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(hex(&trace), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&parent), "00f067aa0ba902b7");
        assert!(sampled);
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "",
        ] {
            assert!(parse_traceparent(bad.as_bytes()).is_none(), "{bad}");
        }
        // A later version may carry more.
        assert!(parse_traceparent(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-x").is_some());
    }
}
