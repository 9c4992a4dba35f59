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
        protocol(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"), ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")])
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
    assert!(!off(TraceConfig::default(), &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:4318/v1/traces")]));
}

#[test]
fn bad_settings_are_errors() {
    let error = |config: TraceConfig, vars: &[(&str, &str)]| build(config, &env_of(vars)).unwrap_err().to_string();
    let https = error(TraceConfig { endpoint: Some("https://collector:4317".into()), ..Default::default() }, &[]);
    assert!(https.contains("TLS"), "{https}");
    let https = error(TraceConfig::default(), &[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318")]);
    assert!(https.starts_with("OTEL_EXPORTER_OTLP_ENDPOINT"), "{https}");
    let ratio = error(
        TraceConfig { endpoint: Some("http://collector:4317".into()), sample_ratio: Some(2.0), ..Default::default() },
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
