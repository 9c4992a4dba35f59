//! A real OpenTelemetry Collector for tests of trace and metrics export:
//! the OTLP receiver on free loopback ports (gRPC and HTTP), and file
//! exporters writing what it receives as OTLP-JSON lines, which
//! [`Collector::spans`] and [`Collector::metrics`] read back.
//!
//! `cargo xtask test` builds the binary from source once per machine
//! (crates/xtask/src/otelcol.rs) and passes its path in `SLUICE_OTELCOL_BIN`.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

/// Set by `cargo xtask test`.
const BIN_ENV: &str = "SLUICE_OTELCOL_BIN";
/// The binary crates/xtask/src/otelcol.rs builds, under the cache directory
/// (keep in sync: `COLLECTOR_VERSION` there).
const CACHE_PATH: &str = "sluice/otelcol/otelcol-v0.161.0/bin/otelcol";
const BUILD_HINT: &str = "run `cargo xtask test` (it builds the collector from source, once)";

const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The collector logs this once its receivers listen.
const READY_LINE: &str = "Everything is ready";
const LOG_TAIL_LINES: usize = 40;

/// A running collector, killed when dropped.
pub struct Collector {
    child: Child,
    grpc: SocketAddr,
    http: SocketAddr,
    dir: TempDir,
}

/// A span as the collector exported it, with its resource's attributes.
/// Attribute values are plain JSON: OTLP's `{"stringValue": "x"}` is `"x"`,
/// `{"intValue": "7"}` is `7`, arrays and key-value lists nest likewise.
#[derive(Clone, Debug)]
pub struct Span {
    pub name: String,
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    /// None for a root span.
    pub parent_span_id: Option<String>,
    /// OTLP's SpanKind: 1 internal, 2 server, 3 client, 4 producer, 5
    /// consumer (0 unspecified).
    pub kind: i64,
    pub attributes: BTreeMap<String, Value>,
    /// The attributes of the span's resource, e.g. `service.name`.
    pub resource: BTreeMap<String, Value>,
    /// The instrumentation scope's name.
    pub scope: String,
    /// OTLP's StatusCode: 0 unset, 1 ok, 2 error.
    pub status_code: i64,
    pub status_message: String,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
    /// The span as exported, for anything else (events, links, flags).
    pub raw: Value,
}

impl Collector {
    /// Starts the collector and returns once its receivers listen. Panics
    /// with its log if it does not start.
    pub async fn start() -> Collector {
        let binary = binary();
        let dir = tempfile::Builder::new().prefix("sluice-e2e-otelcol").tempdir().expect("creating a collector dir");
        let (child, grpc, http) = crate::start_on_free_ports("the collector", async || {
            let (grpc, http) = (free_port(), free_port());
            let config = dir.path().join("config.yaml");
            let yaml = config_yaml(grpc, http, &dir.path().join("spans.jsonl"), &dir.path().join("metrics.jsonl"));
            std::fs::write(&config, yaml).expect("writing the collector config");
            let mut child = spawn(&binary, &config, dir.path());
            match wait_ready(&mut child, dir.path()).await {
                Ok(()) => Ok((child, grpc, http)),
                Err(log) => {
                    crate::kill(&mut child);
                    Err(log)
                }
            }
        })
        .await;
        Collector { child, grpc, http, dir }
    }

    /// `http://127.0.0.1:<port>`: the OTLP/gRPC receiver.
    pub fn endpoint_grpc(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// `http://127.0.0.1:<port>`: the OTLP/HTTP receiver; traces go to
    /// `/v1/traces` under it.
    pub fn endpoint_http(&self) -> String {
        format!("http://{}", self.http)
    }

    /// Every span exported so far, in the order received.
    pub fn spans(&self) -> Vec<Span> {
        let text = std::fs::read_to_string(self.spans_file()).unwrap_or_default();
        parse_spans(&text)
    }

    /// Reads the spans until `done` holds for them, and returns them. Panics
    /// after `within` with the spans seen (and, as it drops, the collector
    /// shows the end of its log).
    pub async fn wait_for_spans(&self, done: impl Fn(&[Span]) -> bool, within: Duration) -> Vec<Span> {
        let deadline = Instant::now() + within;
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            if Instant::now() > deadline {
                let seen: Vec<String> = spans.iter().map(|span| format!("\n  {span:?}")).collect();
                panic!("timed out after {within:?} waiting for spans; {} seen:{}", spans.len(), seen.concat());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every metric data point exported so far, in the order received: a
    /// push of cumulative metrics repeats each series with its new value.
    pub fn metrics(&self) -> Vec<MetricPoint> {
        let text = std::fs::read_to_string(self.dir.path().join("metrics.jsonl")).unwrap_or_default();
        parse_metrics(&text)
    }

    /// Reads the metric points until `done` holds for them, and returns
    /// them. Panics after `within` with the names seen.
    pub async fn wait_for_metrics(&self, done: impl Fn(&[MetricPoint]) -> bool, within: Duration) -> Vec<MetricPoint> {
        let deadline = Instant::now() + within;
        loop {
            let points = self.metrics();
            if done(&points) {
                return points;
            }
            if Instant::now() > deadline {
                let names: std::collections::BTreeSet<&str> = points.iter().map(|p| p.name.as_str()).collect();
                panic!("timed out after {within:?} waiting for metrics; {} points seen, of {names:?}", points.len());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The collector's own log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("otelcol.log")).unwrap_or_default()
    }

    fn spans_file(&self) -> PathBuf {
        self.dir.path().join("spans.jsonl")
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        crate::kill(&mut self.child);
        if std::thread::panicking() {
            eprintln!("{}", log_tail(self.dir.path()));
        }
    }
}

/// The binary: `$SLUICE_OTELCOL_BIN`, else the xtask's cache.
fn binary() -> PathBuf {
    crate::cached_tool(BIN_ENV, CACHE_PATH, BUILD_HINT)
}

/// OTLP in on both protocols, a file exporter out per signal, flushed
/// every 100 ms so that tests see spans and metrics promptly. The
/// collector's own metrics are off: they would listen on :8888, one port
/// for every collector.
fn config_yaml(grpc: SocketAddr, http: SocketAddr, spans: &Path, metrics: &Path) -> String {
    format!(
        "receivers:\n\
         \x20 otlp:\n    protocols:\n      grpc:\n        endpoint: {grpc}\n      http:\n        endpoint: {http}\n\
         exporters:\n\
         \x20 file:\n    path: {}\n    flush_interval: 100ms\n\
         \x20 file/metrics:\n    path: {}\n    flush_interval: 100ms\n\
         service:\n\
         \x20 telemetry:\n    metrics:\n      level: none\n\
         \x20 pipelines:\n    traces:\n      receivers: [otlp]\n      exporters: [file]\n\
         \x20   metrics:\n      receivers: [otlp]\n      exporters: [file/metrics]\n",
        spans.display(),
        metrics.display()
    )
}

fn spawn(binary: &Path, config: &Path, dir: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("otelcol.log"))
        .expect("opening the collector log");
    Command::new(binary)
        .arg(format!("--config=file:{}", config.display()))
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("cloning a log file"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}: {BUILD_HINT}", binary.display()))
}

/// Waits for the collector's ready line; on failure, the end of its log.
async fn wait_ready(child: &mut Child, dir: &Path) -> Result<(), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    // The log is appended to across attempts: count the ready lines.
    let before = ready_lines(dir);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("it exited ({status})\n{}", log_tail(dir)));
        }
        if ready_lines(dir) > before {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Err(format!("not ready after {READY_TIMEOUT:?}\n{}", log_tail(dir)))
}

fn ready_lines(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("otelcol.log")).unwrap_or_default().matches(READY_LINE).count()
}

fn log_tail(dir: &Path) -> String {
    crate::log_tail(&dir.join("otelcol.log"), LOG_TAIL_LINES)
}

/// The spans of the file exporter's output: one OTLP-JSON `TracesData`
/// per line, flattened from resourceSpans → scopeSpans → spans. A last line
/// without its newline is still being written, and is left for later.
fn parse_spans(text: &str) -> Vec<Span> {
    let complete = &text[..text.rfind('\n').map_or(0, |end| end + 1)];
    let mut spans = Vec::new();
    for line in complete.lines().filter(|line| !line.trim().is_empty()) {
        let data: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("the collector wrote a line that is not JSON ({e}): {line}"));
        for resource_spans in array(&data["resourceSpans"]) {
            let resource = attributes(&resource_spans["resource"]["attributes"]);
            for scope_spans in array(&resource_spans["scopeSpans"]) {
                let scope = scope_spans["scope"]["name"].as_str().unwrap_or_default();
                for span in array(&scope_spans["spans"]) {
                    spans.push(Span {
                        name: string(&span["name"]),
                        trace_id: string(&span["traceId"]),
                        span_id: string(&span["spanId"]),
                        parent_span_id: span["parentSpanId"].as_str().filter(|id| !id.is_empty()).map(str::to_string),
                        kind: span["kind"].as_i64().unwrap_or(0),
                        attributes: attributes(&span["attributes"]),
                        resource: resource.clone(),
                        scope: scope.to_string(),
                        status_code: span["status"]["code"].as_i64().unwrap_or(0),
                        status_message: string(&span["status"]["message"]),
                        start_unix_nanos: nanos(&span["startTimeUnixNano"]),
                        end_unix_nanos: nanos(&span["endTimeUnixNano"]),
                        raw: span.clone(),
                    });
                }
            }
        }
    }
    spans
}

/// One data point of a metric as the collector exported it, with its
/// metric's and resource's fields. Attribute values are plain JSON, as for
/// [`Span`].
#[derive(Clone, Debug)]
pub struct MetricPoint {
    pub name: String,
    pub description: String,
    pub unit: String,
    /// `sum`, `gauge`, `histogram`, `exponentialHistogram` or `summary`.
    pub kind: String,
    /// A sum's: monotonic or not.
    pub monotonic: bool,
    /// OTLP's AggregationTemporality: 1 delta, 2 cumulative (0 for a gauge).
    pub temporality: i64,
    pub attributes: BTreeMap<String, Value>,
    pub resource: BTreeMap<String, Value>,
    /// The instrumentation scope's name.
    pub scope: String,
    pub start_unix_nanos: u64,
    pub time_unix_nanos: u64,
    /// A sum's or gauge's value (`asInt` or `asDouble`).
    pub value: Option<f64>,
    /// A histogram's count, sum, bucket counts and bounds.
    pub count: u64,
    pub sum: Option<f64>,
    pub bucket_counts: Vec<u64>,
    pub explicit_bounds: Vec<f64>,
    /// The data point as exported, for anything else (exemplars, flags).
    pub raw: Value,
}

impl MetricPoint {
    /// Whether this is a point of metric `name` with (at least) these
    /// string attributes.
    pub fn is(&self, name: &str, attributes: &[(&str, &str)]) -> bool {
        self.name == name
            && attributes.iter().all(|(key, value)| self.attributes.get(*key).and_then(Value::as_str) == Some(*value))
    }
}

/// The data points of the file exporter's output: one OTLP-JSON
/// `MetricsData` per line, flattened from resourceMetrics → scopeMetrics →
/// metrics → dataPoints. A last line without its newline is left for later.
fn parse_metrics(text: &str) -> Vec<MetricPoint> {
    let complete = &text[..text.rfind('\n').map_or(0, |end| end + 1)];
    let mut points = Vec::new();
    for line in complete.lines().filter(|line| !line.trim().is_empty()) {
        let data: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("the collector wrote a line that is not JSON ({e}): {line}"));
        for resource_metrics in array(&data["resourceMetrics"]) {
            let resource = attributes(&resource_metrics["resource"]["attributes"]);
            for scope_metrics in array(&resource_metrics["scopeMetrics"]) {
                let scope = scope_metrics["scope"]["name"].as_str().unwrap_or_default();
                for metric in array(&scope_metrics["metrics"]) {
                    let kinds = ["sum", "gauge", "histogram", "exponentialHistogram", "summary"];
                    let Some(kind) = kinds.into_iter().find(|kind| metric.get(*kind).is_some()) else { continue };
                    let data = &metric[kind];
                    for point in array(&data["dataPoints"]) {
                        let number = point.get("asInt").or_else(|| point.get("asDouble"));
                        points.push(MetricPoint {
                            name: string(&metric["name"]),
                            description: string(&metric["description"]),
                            unit: string(&metric["unit"]),
                            kind: kind.to_string(),
                            monotonic: data["isMonotonic"].as_bool().unwrap_or(false),
                            temporality: data["aggregationTemporality"].as_i64().unwrap_or(0),
                            attributes: attributes(&point["attributes"]),
                            resource: resource.clone(),
                            scope: scope.to_string(),
                            start_unix_nanos: nanos(&point["startTimeUnixNano"]),
                            time_unix_nanos: nanos(&point["timeUnixNano"]),
                            value: number.and_then(float),
                            count: nanos(&point["count"]),
                            sum: point.get("sum").and_then(float),
                            bucket_counts: array(&point["bucketCounts"]).iter().map(nanos).collect(),
                            explicit_bounds: array(&point["explicitBounds"]).iter().filter_map(float).collect(),
                            raw: point.clone(),
                        });
                    }
                }
            }
        }
    }
    points
}

/// A number, or a 64-bit integer written as a string (OTLP/JSON).
fn float(value: &Value) -> Option<f64> {
    value.as_f64().or_else(|| value.as_str().and_then(|text| text.parse().ok()))
}

fn array(value: &Value) -> &[Value] {
    value.as_array().map_or(&[], Vec::as_slice)
}

fn string(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_string()
}

/// OTLP/JSON writes 64-bit integers as strings.
fn nanos(value: &Value) -> u64 {
    value.as_str().and_then(|text| text.parse().ok()).or_else(|| value.as_u64()).unwrap_or(0)
}

/// `[{"key": k, "value": AnyValue}]` as a map of plain JSON values.
fn attributes(list: &Value) -> BTreeMap<String, Value> {
    array(list).iter().map(|kv| (string(&kv["key"]), any_value(&kv["value"]))).collect()
}

/// An OTLP AnyValue as plain JSON.
fn any_value(value: &Value) -> Value {
    let Some((kind, inner)) = value.as_object().and_then(|object| object.iter().next()) else { return Value::Null };
    match kind.as_str() {
        "intValue" => {
            inner.as_str().and_then(|text| text.parse::<i64>().ok()).map_or_else(|| inner.clone(), Value::from)
        }
        "arrayValue" => Value::Array(array(&inner["values"]).iter().map(any_value).collect()),
        "kvlistValue" => Value::Object(attributes(&inner["values"]).into_iter().collect()),
        // stringValue, boolValue, doubleValue, and bytesValue (base64).
        _ => inner.clone(),
    }
}

fn free_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    listener.local_addr().expect("a bound listener has an address")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exported_lines_flatten_into_spans_with_plain_attributes() {
        let line = serde_json::json!({"resourceSpans": [{
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "sluice"}}]},
            "scopeSpans": [{"scope": {"name": "sluice"}, "spans": [{
                "traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174",
                "parentSpanId": "", "name": "POST /v1/chat/completions", "kind": 2,
                "startTimeUnixNano": "1544712660000000000", "endTimeUnixNano": "1544712661000000000",
                "attributes": [
                    {"key": "http.response.status_code", "value": {"intValue": "200"}},
                    {"key": "ok", "value": {"boolValue": true}},
                    {"key": "list", "value": {"arrayValue": {"values": [{"stringValue": "a"}, {"intValue": "1"}]}}},
                ],
                "status": {"code": 2, "message": "upstream failed"},
            }]}],
        }]});
        // A second line still being written is left out.
        let text = format!("{line}\n{{\"resourceSpans\": [");
        let spans = parse_spans(&text);
        assert_eq!(spans.len(), 1);
        let span = &spans[0];
        assert_eq!(span.name, "POST /v1/chat/completions");
        assert_eq!(span.parent_span_id, None);
        assert_eq!(span.kind, 2);
        assert_eq!(span.attributes["http.response.status_code"], 200);
        assert_eq!(span.attributes["ok"], true);
        assert_eq!(span.attributes["list"], serde_json::json!(["a", 1]));
        assert_eq!(span.resource["service.name"], "sluice");
        assert_eq!((span.status_code, span.status_message.as_str()), (2, "upstream failed"));
        assert_eq!(span.end_unix_nanos - span.start_unix_nanos, 1_000_000_000);
    }

    #[test]
    fn exported_lines_flatten_into_metric_points() {
        let line = serde_json::json!({"resourceMetrics": [{
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "sluice"}}]},
            "scopeMetrics": [{"scope": {"name": "sluice"}, "metrics": [
                {"name": "sluice_requests", "description": "Requests", "sum": {
                    "dataPoints": [{"attributes": [{"key": "route", "value": {"stringValue": "default/chat"}}],
                        "startTimeUnixNano": "1000", "timeUnixNano": "2000", "asInt": "3"}],
                    "aggregationTemporality": 2, "isMonotonic": true}},
                {"name": "g", "gauge": {"dataPoints": [{"timeUnixNano": "2000", "asDouble": 0.5}]}},
                {"name": "gen_ai.client.token.usage", "unit": "{token}", "histogram": {
                    "dataPoints": [{"startTimeUnixNano": "1000", "timeUnixNano": "2000", "count": "4", "sum": 120,
                        "bucketCounts": ["1", "0", "3"], "explicitBounds": [1, 4]}],
                    "aggregationTemporality": 2}},
            ]}],
        }]});
        let text = format!("{line}\n{{\"resourceMetrics\": [");
        let points = parse_metrics(&text);
        let [requests, gauge, usage] = &points[..] else { panic!("{points:#?}") };
        assert_eq!((requests.kind.as_str(), requests.monotonic, requests.temporality), ("sum", true, 2));
        assert_eq!((requests.value, requests.start_unix_nanos, requests.time_unix_nanos), (Some(3.0), 1000, 2000));
        assert_eq!(requests.attributes["route"], "default/chat");
        assert_eq!(requests.resource["service.name"], "sluice");
        assert_eq!((gauge.kind.as_str(), gauge.value, gauge.temporality), ("gauge", Some(0.5), 0));
        assert_eq!((usage.unit.as_str(), usage.count, usage.sum), ("{token}", 4, Some(120.0)));
        assert_eq!(
            (usage.bucket_counts.as_slice(), usage.explicit_bounds.as_slice()),
            (&[1, 0, 3][..], &[1.0, 4.0][..])
        );
    }
}
