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
    let name = match (record.operation, &record.model, &record.tool) {
        (Some(operation), Some(model), _) => format!("{operation} {model}"),
        // The GenAI conventions' name for a tool call's span.
        (_, _, Some(tool)) => format!("execute_tool {tool}"),
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
    if let Some(tool) = &record.tool {
        attributes.push(KeyValue::new("gen_ai.operation.name", "execute_tool"));
        attributes.push(KeyValue::new("gen_ai.tool.name", text(tool)));
    }
    if let Some(method) = &record.mcp_method {
        attributes.push(KeyValue::new("mcp.method.name", text(method)));
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
    if let Some(requested) = &record.requested_model {
        attributes.push(KeyValue::new("sluice.requested_model", label(requested)));
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

    // Plugins' outbound calls: the destination's origin only (a path or
    // query may carry what the plugin was given: keys, prompts).
    for call in &record.outbound {
        let plugin = &call.plugin;
        let span_id = SpanId::from_bytes(call.span_id.unwrap_or_else(new_span_id));
        let name = format!("plugin {}/{} call {}", plugin.namespace, plugin.name, call.destination);
        let mut child = span(span_id, SpanKind::Client, name, (call.start, call.end));
        let attributes = &mut child.attributes;
        attributes.push(KeyValue::new("sluice.plugin.namespace", label(&plugin.namespace)));
        attributes.push(KeyValue::new("sluice.plugin.name", label(&plugin.name)));
        attributes.push(KeyValue::new("sluice.plugin.hook", call.hook.as_str()));
        attributes.push(KeyValue::new("sluice.outbound.destination", label(&call.destination)));
        if let Some((address, port)) = server_address(&call.destination) {
            attributes.push(KeyValue::new("server.address", text(&address)));
            attributes.push(KeyValue::new("server.port", i64::from(port)));
        }
        if let Some(status) = call.status {
            attributes.push(KeyValue::new("http.response.status_code", i64::from(status)));
        }
        if call.result != "ok" {
            attributes.push(KeyValue::new("error.type", call.result));
            child.status = Status::error(call.result);
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
mod tests;
