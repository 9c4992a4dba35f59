//! The observability harness itself, without a gateway: a real Prometheus
//! that scrapes and answers PromQL, and a real OpenTelemetry Collector that
//! takes OTLP over HTTP and gRPC and writes spans the tests read back.
//! Needs /usr/bin/prometheus and the collector `cargo xtask test` builds.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use serde_json::json;
use sluice_tests::{Client, Collector, Prometheus};

/// Prometheus' first scrape comes about 6 s after its start.
const SCRAPED_WITHIN: Duration = Duration::from_secs(30);
const EXPORTED_WITHIN: Duration = Duration::from_secs(10);

#[tokio::test]
async fn prometheus_scrapes_its_targets_and_answers_promql() {
    // Nothing listens there: a target that is down, reported as such.
    let down = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let prometheus = Prometheus::start(&[down]).await;

    // It scrapes its own /metrics as job `prometheus`.
    let up = prometheus.wait_for(r#"up{job="prometheus"} == 1"#, SCRAPED_WITHIN).await;
    assert_eq!(up.len(), 1, "{up:?}");
    assert_eq!(up[0].0["instance"], prometheus.addr().to_string());
    assert_eq!(up[0].1, 1.0);
    let build = prometheus.query("prometheus_build_info").await;
    assert_eq!(build.len(), 1, "{build:?}");
    assert!(build[0].0["version"].starts_with("2."), "{build:?}");

    // The given target is job `sluice`, and down.
    let target = prometheus.wait_for(&format!("up{{job=\"{}\"}}", Prometheus::JOB), SCRAPED_WITHIN).await;
    assert_eq!(target.len(), 1, "{target:?}");
    assert_eq!(target[0].0["instance"], down.to_string());
    assert_eq!(target[0].1, 0.0);

    // A series that does not exist is an empty vector, not an error.
    assert!(prometheus.query("no_such_metric_total").await.is_empty());
}

#[tokio::test]
async fn collector_exports_spans_sent_over_otlp_http_json() {
    let collector = Collector::start().await;
    let trace_id = "5b8efff798038103d269b633813fc60c";
    let body = json!({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "telemetry-infra"}}]},
        "scopeSpans": [{"scope": {"name": "harness"}, "spans": [
            {
                "traceId": trace_id, "spanId": "eee19b7ec3c1b174", "name": "parent", "kind": 2,
                "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000001000000000",
            },
            {
                "traceId": trace_id, "spanId": "0102030405060708", "parentSpanId": "eee19b7ec3c1b174",
                "name": "child", "kind": 3,
                "startTimeUnixNano": "1700000000100000000", "endTimeUnixNano": "1700000000900000000",
                "attributes": [
                    {"key": "http.response.status_code", "value": {"intValue": "502"}},
                    {"key": "server.address", "value": {"stringValue": "127.0.0.1"}},
                ],
                "status": {"code": 2, "message": "bad gateway"},
            },
        ]}],
    }]});
    let url = format!("{}/v1/traces", collector.endpoint_http());
    let reply = Client::http1().post(&url, body.to_string(), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());

    let spans = collector.wait_for_spans(|spans| spans.len() >= 2, EXPORTED_WITHIN).await;
    assert_eq!(spans.len(), 2, "{spans:?}");
    let parent = spans.iter().find(|span| span.name == "parent").expect("the parent span");
    let child = spans.iter().find(|span| span.name == "child").expect("the child span");
    assert_eq!((parent.kind, parent.parent_span_id.as_deref()), (2, None));
    assert_eq!(child.trace_id, trace_id);
    assert_eq!(child.parent_span_id.as_deref(), Some(parent.span_id.as_str()));
    assert_eq!(child.kind, 3);
    assert_eq!(child.attributes["http.response.status_code"], 502);
    assert_eq!(child.attributes["server.address"], "127.0.0.1");
    assert_eq!(child.resource["service.name"], "telemetry-infra");
    assert_eq!(child.scope, "harness");
    assert_eq!((child.status_code, child.status_message.as_str()), (2, "bad gateway"));
    assert_eq!(child.end_unix_nanos - child.start_unix_nanos, 800_000_000);
}

#[tokio::test]
async fn collector_exports_spans_sent_over_otlp_grpc() {
    let collector = Collector::start().await;
    let trace_id: Vec<u8> = (1..=16).collect();
    let span_id: Vec<u8> = (1..=8).collect();
    let request = export_trace_request(&trace_id, &span_id, "over-grpc", "grpc");
    // A gRPC message: no compression, its length, its bytes.
    let mut message = vec![0];
    message.extend((request.len() as u32).to_be_bytes());
    message.extend(request);
    let url = format!("{}/opentelemetry.proto.collector.trace.v1.TraceService/Export", collector.endpoint_grpc());
    let request = hyper::Request::post(url)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from(message)).map_err(|never| match never {}).boxed())
        .unwrap();
    let reply = Client::h2c().send(request).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    // grpc-go answers an error with headers only, grpc-status among them;
    // success has grpc-status 0 in the trailers.
    assert_eq!(reply.header("grpc-status"), None, "{reply:?}");

    let spans = collector.wait_for_spans(|spans| !spans.is_empty(), EXPORTED_WITHIN).await;
    assert_eq!(spans.len(), 1, "{spans:?}");
    assert_eq!(spans[0].name, "over-grpc");
    assert_eq!(spans[0].trace_id, "0102030405060708090a0b0c0d0e0f10");
    assert_eq!(spans[0].span_id, "0102030405060708");
    assert_eq!(spans[0].resource["service.name"], "grpc");
}

/// An `ExportTraceServiceRequest` with one span, protobuf-encoded by hand
/// (opentelemetry-proto's field numbers): a client independent of the one
/// the gateway uses.
fn export_trace_request(trace_id: &[u8], span_id: &[u8], name: &str, service: &str) -> Vec<u8> {
    // A length-delimited field (wire type 2).
    fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
        assert!(bytes.len() < 128, "one-byte varint lengths only");
        let mut out = vec![number << 3 | 2, bytes.len() as u8];
        out.extend(bytes);
        out
    }
    // A fixed64 field (wire type 1).
    fn fixed64(number: u8, value: u64) -> Vec<u8> {
        let mut out = vec![number << 3 | 1];
        out.extend(value.to_le_bytes());
        out
    }
    // Span: trace_id 1, span_id 2, name 5, start 7, end 8.
    let span = [
        field(1, trace_id),
        field(2, span_id),
        field(5, name.as_bytes()),
        fixed64(7, 1_700_000_000_000_000_000),
        fixed64(8, 1_700_000_001_000_000_000),
    ]
    .concat();
    // KeyValue { key 1, value 2: AnyValue { string_value 1 } }.
    let service_name = [field(1, b"service.name"), field(2, &field(1, service.as_bytes()))].concat();
    // ResourceSpans { resource 1: Resource { attributes 1 }, scope_spans 2:
    // ScopeSpans { spans 2 } }; the request's resource_spans is field 1.
    let resource_spans = [field(1, &field(1, &service_name)), field(2, &field(2, &span))].concat();
    field(1, &resource_spans)
}
