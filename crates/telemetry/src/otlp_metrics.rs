//! OTLP metrics: the Prometheus registry, pushed to a collector.
//!
//! There is one source of truth. Each push takes the registry (what
//! /metrics serves as text) as Prometheus's protobuf families, from
//! prometheus-client's own encoder: labels unescaped, values and buckets
//! typed, nothing parsed back. It sends them as OTLP metrics with
//! cumulative temporality: counters as monotonic sums, gauges as gauges,
//! histograms as explicit-bucket histograms, labels as attributes. The GenAI families take their
//! OpenTelemetry names (`gen_ai_client_token_usage` is
//! `gen_ai.client.token.usage`, its labels `gen_ai.token.type`, …);
//! Sluice's own keep their Prometheus names without the `_total` and unit
//! suffixes (`sluice_requests`, `sluice_request_duration` in `s`), so that a
//! backend that turns OTLP names back into Prometheus ones gets exactly the
//! names /metrics serves, and dashboards work on either path.
//!
//! Pushes run on the export runtime the traces use too, never on the request
//! path: one at a time, each bounded by a timeout; a push that would start
//! while one is still running is skipped, not queued. Shutting down pushes
//! once more.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, mpsc};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics,
    ScopeMetrics, Sum, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use prometheus_client::encoding::prometheus_protobuf::prometheus_data_model::{
    LabelPair, Metric as PromMetric, MetricFamily, MetricType,
};
use prost::Message;
use tokio::sync::oneshot;

use crate::metrics::metrics;
use crate::trace::{Env, Protocol, from_env, resource};

/// How metrics reach the collector. Each field left `None` falls back to the
/// standard `OTEL_*` variable, then to OpenTelemetry's default.
#[derive(Clone, Debug, Default)]
pub struct MetricsConfig {
    /// The collector's OTLP endpoint, as for traces: for `http/protobuf`,
    /// `/v1/metrics` is appended to it. Else
    /// `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` (used as is), then
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`; no pushes without any.
    pub endpoint: Option<String>,
    /// Else `OTEL_EXPORTER_OTLP_METRICS_PROTOCOL`, then
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`, then `http/protobuf`.
    pub protocol: Option<Protocol>,
    /// Time between pushes. Else `OTEL_METRIC_EXPORT_INTERVAL`
    /// (milliseconds), then 60 seconds.
    pub interval: Option<Duration>,
}

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("{name}: {message}")]
    Setting { name: &'static str, message: String },
    #[error("the OTLP metrics exporter's runtime: {0}")]
    Runtime(std::io::Error),
    #[error("OTLP metrics are set up already")]
    AlreadySetUp,
}

fn setting(name: &'static str, message: impl Into<String>) -> MetricsError {
    MetricsError::Setting { name, message: message.into() }
}

const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
const METRICS_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT";
const INTERVAL: &str = "OTEL_METRIC_EXPORT_INTERVAL";
const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// Pushing more often than this is a mistake, not a setting.
const MIN_INTERVAL: Duration = Duration::from_millis(100);
/// OpenTelemetry's default export timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The last push at shutdown waits no longer than this.
const LAST_PUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// The most of a collector's answer read: an OTLP response is tiny.
const MAX_RESPONSE_BYTES: usize = 64 << 10;

/// What runs before each push.
type Refresh = Box<dyn Fn() + Send + Sync>;

/// Keeps the pushes going: [`MetricsGuard::shutdown`] (or dropping it)
/// pushes once more, then stops.
pub struct MetricsGuard {
    stop: Option<oneshot::Sender<()>>,
    /// Hears (or sees closed) when the pushes have stopped.
    stopped: Option<mpsc::Receiver<()>>,
    refresh: Arc<OnceLock<Refresh>>,
}

impl MetricsGuard {
    /// Runs `refresh` before each push (on the export runtime), as /metrics
    /// does before each scrape: for the values measured when read, such as
    /// the plugin instances. Only the first one set is kept.
    pub fn refresh_before_push(&self, refresh: impl Fn() + Send + Sync + 'static) {
        let _ = self.refresh.set(Box::new(refresh));
    }

    /// Pushes the metrics one last time (waiting up to 5 seconds) and stops.
    /// It blocks: call it at exit, from anywhere, a runtime's thread
    /// included.
    pub fn shutdown(mut self) {
        self.close();
    }

    fn close(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(stopped) = self.stopped.take() {
            // Bounded: the push in flight is cancelled, the last one has a
            // timeout. Not awaited: this may be a runtime's thread, and the
            // pushes run on the export runtime's.
            let _ = stopped.recv();
        }
    }
}

impl Drop for MetricsGuard {
    fn drop(&mut self) {
        self.close();
    }
}

impl std::fmt::Debug for MetricsGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsGuard").finish_non_exhaustive()
    }
}

static STARTED: AtomicBool = AtomicBool::new(false);

/// Starts pushing the metrics: `Ok(None)` when no OTLP endpoint is
/// configured (or `OTEL_SDK_DISABLED=true`, or `OTEL_METRICS_EXPORTER` does
/// not name `otlp`). Call it before anything is counted: its time is the
/// start of every cumulative series. Keep the guard until exit.
///
/// Besides the variables [`MetricsConfig`] names, it reads
/// `OTEL_EXPORTER_OTLP_{,METRICS_}{HEADERS,TIMEOUT}` and, for the resource
/// (the traces' one), `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`.
/// Temporality is always cumulative.
pub fn init(config: MetricsConfig) -> Result<Option<MetricsGuard>, MetricsError> {
    let Some(settings) = settings(config, &from_env)? else { return Ok(None) };
    if STARTED.swap(true, Ordering::SeqCst) {
        return Err(MetricsError::AlreadySetUp);
    }
    let start = unix_nanos(SystemTime::now());
    start_pushing(settings, proto_resource(&resource(&from_env)), start).map(Some)
}

/// Where and how often to push, once resolved.
#[derive(Debug)]
struct Settings {
    protocol: Protocol,
    /// gRPC: the collector's endpoint; HTTP: the metrics URL.
    url: String,
    interval: Duration,
    timeout: Duration,
    headers: HeaderMap,
}

fn settings(config: MetricsConfig, env: Env) -> Result<Option<Settings>, MetricsError> {
    let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        // A list: `otlp`, `prometheus` (the pull exporter: /metrics is
        // always served), `console` or `none`.
        || env("OTEL_METRICS_EXPORTER").is_some_and(|v| !v.split(',').any(|e| e.trim() == "otlp"));
    // The name to blame, the URL, and whether it is a base URL.
    let (name, endpoint, base) = match config.endpoint.filter(|e| !e.trim().is_empty()) {
        Some(endpoint) => ("the OTLP endpoint", endpoint, true),
        None => match env(METRICS_ENDPOINT) {
            Some(endpoint) => (METRICS_ENDPOINT, endpoint, false),
            None => match env(ENDPOINT) {
                Some(endpoint) => (ENDPOINT, endpoint, true),
                None => return Ok(None),
            },
        },
    };
    if disabled {
        return Ok(None);
    }
    let endpoint = endpoint.trim();
    // Neither transport is built with TLS: said now, not at the first push.
    if !endpoint.to_ascii_lowercase().starts_with("http://") {
        return Err(setting(name, format!("`{endpoint}` is not an http:// URL (TLS is not supported)")));
    }
    let protocol = match config.protocol {
        Some(protocol) => protocol,
        None => protocol_from_env(env)?,
    };
    let url = match protocol {
        Protocol::HttpProtobuf if base => format!("{}/v1/metrics", endpoint.trim_end_matches('/')),
        _ => endpoint.to_string(),
    };
    if let Err(error) = url.parse::<http::Uri>() {
        return Err(setting(name, format!("`{url}` is not a URL: {error}")));
    }
    let interval = match config.interval {
        Some(interval) => interval,
        None => millis_from_env(env, &[INTERVAL])?.unwrap_or(DEFAULT_INTERVAL),
    };
    if interval < MIN_INTERVAL {
        return Err(setting("the metrics interval", format!("{interval:?} is shorter than {MIN_INTERVAL:?}")));
    }
    let timeout = millis_from_env(env, &["OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"])?
        .unwrap_or(DEFAULT_TIMEOUT);
    let headers = headers_from_env(env)?;
    Ok(Some(Settings { protocol, url, interval, timeout, headers }))
}

fn protocol_from_env(env: Env) -> Result<Protocol, MetricsError> {
    for name in ["OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"] {
        if let Some(value) = env(name) {
            return value.trim().parse().map_err(|message| setting(name, message));
        }
    }
    Ok(Protocol::HttpProtobuf)
}

/// The first of `names` that is set, in milliseconds.
fn millis_from_env(env: Env, names: &[&'static str]) -> Result<Option<Duration>, MetricsError> {
    let Some((name, value)) = names.iter().find_map(|name| Some((*name, env(name)?))) else { return Ok(None) };
    match value.trim().parse::<u64>() {
        Ok(millis) if millis > 0 => Ok(Some(Duration::from_millis(millis))),
        _ => Err(setting(name, format!("`{value}` is not a number of milliseconds"))),
    }
}

/// `OTEL_EXPORTER_OTLP_METRICS_HEADERS`, else `OTEL_EXPORTER_OTLP_HEADERS`:
/// `key=value` pairs separated by commas, values percent-encoded.
fn headers_from_env(env: Env) -> Result<HeaderMap, MetricsError> {
    let mut headers = HeaderMap::new();
    let Some((name, value)) = ["OTEL_EXPORTER_OTLP_METRICS_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"]
        .into_iter()
        .find_map(|name| Some((name, env(name)?)))
    else {
        return Ok(headers);
    };
    for pair in value.split(',').map(str::trim).filter(|pair| !pair.is_empty()) {
        let header = pair.split_once('=').and_then(|(key, value)| {
            let key = HeaderName::from_bytes(key.trim().as_bytes()).ok()?;
            let value = HeaderValue::from_bytes(&percent_decoded(value.trim())?).ok()?;
            Some((key, value))
        });
        let Some((key, value)) = header else {
            // Not the pair itself: it may hold a secret.
            return Err(setting(name, "a header is not `key=value` with a valid name and value"));
        };
        headers.append(key, value);
    }
    Ok(headers)
}

fn percent_decoded(text: &str) -> Option<Vec<u8>> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&byte, after)) = rest.split_first() {
        if byte == b'%' {
            let hex = std::str::from_utf8(after.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &after[2..];
        } else {
            bytes.push(byte);
            rest = after;
        }
    }
    Some(bytes)
}

fn unix_nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
}

/// The SDK's resource (the traces' one) as OTLP.
fn proto_resource(resource: &opentelemetry_sdk::Resource) -> (Resource, String) {
    let ResourceAttributesWithSchema { attributes, schema_url } = resource.into();
    let resource = Resource { attributes: attributes.0, dropped_attributes_count: 0, entity_refs: Vec::new() };
    (resource, schema_url.unwrap_or_default())
}

/// Starts the pushes, a task on the export runtime (the traces' too).
fn start_pushing(settings: Settings, resource: (Resource, String), start: u64) -> Result<MetricsGuard, MetricsError> {
    let runtime = crate::export::runtime().map_err(MetricsError::Runtime)?;
    let transport = {
        // tonic's channel spawns its worker where it is built.
        let _runtime = runtime.enter();
        Transport::new(&settings)?
    };
    let refresh = Arc::new(OnceLock::new());
    let pusher = Pusher {
        transport,
        headers: settings.headers,
        timeout: settings.timeout,
        resource,
        start,
        refresh: refresh.clone(),
        failing: false,
    };
    let (stop, stop_heard) = oneshot::channel();
    let (done, stopped) = mpsc::sync_channel(1);
    let interval = settings.interval;
    runtime.spawn(async move {
        pusher.run(interval, stop_heard).await;
        let _ = done.send(());
    });
    Ok(MetricsGuard { stop: Some(stop), stopped: Some(stopped), refresh })
}

enum Transport {
    Grpc(MetricsServiceClient<tonic::transport::Channel>),
    // Boxed: it is the larger by far.
    Http { client: Box<Client<HttpConnector, Full<Bytes>>>, url: http::Uri },
}

impl Transport {
    fn new(settings: &Settings) -> Result<Transport, MetricsError> {
        let invalid =
            |error: &dyn std::fmt::Display| setting("the OTLP endpoint", format!("`{}`: {error}", settings.url));
        Ok(match settings.protocol {
            Protocol::Grpc => {
                let endpoint = tonic::transport::Endpoint::from_shared(settings.url.clone())
                    .map_err(|error| invalid(&error))?
                    .connect_timeout(settings.timeout)
                    .timeout(settings.timeout);
                Transport::Grpc(MetricsServiceClient::new(endpoint.connect_lazy()))
            }
            Protocol::HttpProtobuf => {
                let url = settings.url.parse().map_err(|error| invalid(&error))?;
                let mut connector = HttpConnector::new();
                connector.set_connect_timeout(Some(settings.timeout));
                Transport::Http { client: Box::new(Client::builder(TokioExecutor::new()).build(connector)), url }
            }
        })
    }

    async fn send(&mut self, request: ExportMetricsServiceRequest, headers: &HeaderMap) -> Result<(), String> {
        let response = match self {
            Transport::Grpc(client) => {
                let mut request = tonic::Request::new(request);
                *request.metadata_mut() = tonic::metadata::MetadataMap::from_headers(headers.clone());
                let response = client
                    .export(request)
                    .await
                    .map_err(|status| format!("gRPC status {:?}: {}", status.code(), status.message()))?;
                response.into_inner()
            }
            Transport::Http { client, url } => {
                let mut request = http::Request::post(url.clone())
                    .header(http::header::CONTENT_TYPE, "application/x-protobuf")
                    .body(Full::new(Bytes::from(request.encode_to_vec())))
                    .map_err(|error| error.to_string())?;
                request.headers_mut().extend(headers.clone());
                let response = client.request(request).await.map_err(|error| error.to_string())?;
                let status = response.status();
                let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES).collect().await;
                let body = body.map(|body| body.to_bytes()).unwrap_or_default();
                if !status.is_success() {
                    let text = String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
                    return Err(format!("HTTP {status}: {text}"));
                }
                // An empty body is a full success.
                ExportMetricsServiceResponse::decode(body).unwrap_or_default()
            }
        };
        match response.partial_success {
            Some(partial) if partial.rejected_data_points > 0 || !partial.error_message.is_empty() => Err(format!(
                "the collector rejected {} data points: {}",
                partial.rejected_data_points, partial.error_message
            )),
            _ => Ok(()),
        }
    }
}

struct Pusher {
    transport: Transport,
    headers: HeaderMap,
    timeout: Duration,
    /// The resource and its schema URL.
    resource: (Resource, String),
    /// When the cumulative series started, in nanoseconds since the epoch.
    start: u64,
    refresh: Arc<OnceLock<Refresh>>,
    /// The last push failed: the next failures are logged at debug only.
    failing: bool,
}

impl Pusher {
    async fn run(mut self, interval: Duration, mut stop: oneshot::Receiver<()>) {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        // A push that outlasts the interval delays the next; none pile up.
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = &mut stop => break,
            }
            tokio::select! {
                () = self.push(self.timeout) => {}
                // Shutting down cancels the push in flight for the last one.
                _ = &mut stop => break,
            }
        }
        self.push(self.timeout.min(LAST_PUSH_TIMEOUT)).await;
    }

    async fn push(&mut self, timeout: Duration) {
        if let Some(refresh) = self.refresh.get() {
            refresh();
        }
        let request = snapshot(&self.resource, self.start);
        let result = match tokio::time::timeout(timeout, self.transport.send(request, &self.headers)).await {
            Ok(result) => result,
            Err(_) => Err(format!("no answer within {timeout:?}")),
        };
        match result {
            Ok(()) if self.failing => {
                self.failing = false;
                tracing::info!("OTLP metrics pushes succeed again");
            }
            Ok(()) => {}
            Err(error) if self.failing => tracing::debug!(%error, "an OTLP metrics push failed"),
            Err(error) => {
                self.failing = true;
                tracing::warn!(%error, "an OTLP metrics push failed (the next failures are logged at debug)");
            }
        }
    }
}

/// The registry now, as one OTLP request.
fn snapshot(resource: &(Resource, String), start: u64) -> ExportMetricsServiceRequest {
    let families = metrics().families();
    let now = unix_nanos(SystemTime::now());
    request(&families, resource, start, now)
}

// ---- OTLP ----

/// Prometheus family names (less unit and `_total` suffixes) of GenAI
/// conventions, their OpenTelemetry names and units.
const GEN_AI_METRICS: &[(&str, &str, &str)] = &[
    ("gen_ai_client_token_usage", "gen_ai.client.token.usage", "{token}"),
    ("gen_ai_server_request_duration", "gen_ai.server.request.duration", "s"),
    ("gen_ai_server_time_to_first_token", "gen_ai.server.time_to_first_token", "s"),
];

/// Prometheus label names of GenAI attributes and their OpenTelemetry names.
const GEN_AI_ATTRIBUTES: &[(&str, &str)] = &[
    ("gen_ai_operation_name", "gen_ai.operation.name"),
    ("gen_ai_provider_name", "gen_ai.provider.name"),
    ("gen_ai_request_model", "gen_ai.request.model"),
    ("gen_ai_response_model", "gen_ai.response.model"),
    ("gen_ai_token_type", "gen_ai.token.type"),
];

/// The OTLP name and unit of a family: the GenAI convention's, else the
/// Prometheus name (as /metrics spells it) without `_total` and `_seconds`
/// (unit `s`).
fn otlp_name(family: &str, kind: MetricType) -> (String, &'static str) {
    let name = match kind {
        MetricType::Counter => family.strip_suffix("_total").unwrap_or(family),
        _ => family,
    };
    let (name, unit) = match name.strip_suffix("_seconds") {
        Some(name) => (name, "s"),
        None => (name, ""),
    };
    match GEN_AI_METRICS.iter().find(|(prometheus, ..)| *prometheus == name) {
        Some((_, otlp, unit)) => (otlp.to_string(), unit),
        None => (name.to_string(), unit),
    }
}

/// The labels as attributes. An empty value is no label, for Prometheus:
/// no attribute either.
fn attributes(labels: &[LabelPair]) -> Vec<KeyValue> {
    labels
        .iter()
        .filter(|label| !label.value.is_empty())
        .map(|label| {
            let key = GEN_AI_ATTRIBUTES
                .iter()
                .find(|(prometheus, _)| *prometheus == label.name)
                .map_or(&*label.name, |a| a.1);
            KeyValue {
                key: key.to_string(),
                value: Some(AnyValue { value: Some(any_value::Value::StringValue(label.value.clone())) }),
                key_strindex: 0,
            }
        })
        .collect()
}

/// One request: every family with a series, under the resource and the
/// `sluice` scope. `start` and `now` are nanoseconds since the epoch.
fn request(
    families: &[MetricFamily],
    resource: &(Resource, String),
    start: u64,
    now: u64,
) -> ExportMetricsServiceRequest {
    let metrics = families.iter().filter_map(|family| metric(family, start, now)).collect();
    let scope =
        InstrumentationScope { name: "sluice".into(), version: env!("CARGO_PKG_VERSION").into(), ..Default::default() };
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(resource.0.clone()),
            scope_metrics: vec![ScopeMetrics { scope: Some(scope), metrics, schema_url: String::new() }],
            schema_url: resource.1.clone(),
        }],
    }
}

/// A family as an OTLP metric with cumulative temporality: counters as
/// monotonic sums, gauges as gauges, histograms as explicit-bucket
/// histograms. None for a family without series, or of a kind the registry
/// does not hold (untyped, summaries).
fn metric(family: &MetricFamily, start: u64, now: u64) -> Option<Metric> {
    if family.metric.is_empty() {
        return None;
    }
    let kind = MetricType::try_from(family.r#type).ok()?;
    let cumulative = AggregationTemporality::Cumulative as i32;
    // A gauge's value is of the moment: it has no start.
    let numbers = |start: u64, value: fn(&PromMetric) -> Option<f64>| -> Vec<NumberDataPoint> {
        let point = |series: &PromMetric| {
            Some(NumberDataPoint {
                attributes: attributes(&series.label),
                start_time_unix_nano: start,
                time_unix_nano: now,
                value: Some(number(value(series)?)),
                ..Default::default()
            })
        };
        family.metric.iter().filter_map(point).collect()
    };
    let data = match kind {
        MetricType::Counter => metric::Data::Sum(Sum {
            data_points: numbers(start, |series| Some(series.counter.as_ref()?.value)),
            aggregation_temporality: cumulative,
            is_monotonic: true,
        }),
        MetricType::Gauge => {
            metric::Data::Gauge(Gauge { data_points: numbers(0, |series| Some(series.gauge.as_ref()?.value)) })
        }
        MetricType::Histogram => metric::Data::Histogram(Histogram {
            data_points: family.metric.iter().filter_map(|series| histogram_point(series, start, now)).collect(),
            aggregation_temporality: cumulative,
        }),
        MetricType::Summary | MetricType::Untyped | MetricType::GaugeHistogram => return None,
    };
    let (name, unit) = otlp_name(&family.name, kind);
    Some(Metric { name, description: family.help.clone(), unit: unit.into(), metadata: Vec::new(), data: Some(data) })
}

/// Prometheus's protobuf values are doubles. A whole one (every counter and
/// gauge of the registry counts in integers) goes as an integer, as the
/// text exposition writes it.
fn number(value: f64) -> number_data_point::Value {
    /// Past 2^53, not every integer is a double.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    if value.fract() == 0.0 && value.abs() <= EXACT {
        // Whole and in range: exact.
        number_data_point::Value::AsInt(value as i64)
    } else {
        number_data_point::Value::AsDouble(value)
    }
}

/// Prometheus's cumulative buckets as OTLP's: a count per bucket, the last
/// one past the highest finite bound.
fn histogram_point(series: &PromMetric, start: u64, now: u64) -> Option<HistogramDataPoint> {
    let histogram = series.histogram.as_ref()?;
    let finite = histogram.bucket.iter().filter(|bucket| bucket.upper_bound.is_finite());
    let mut explicit_bounds = Vec::with_capacity(histogram.bucket.len());
    let mut bucket_counts = Vec::with_capacity(histogram.bucket.len() + 1);
    let mut below = 0;
    for bucket in finite {
        explicit_bounds.push(bucket.upper_bound);
        bucket_counts.push(bucket.cumulative_count.saturating_sub(below));
        below = bucket.cumulative_count;
    }
    bucket_counts.push(histogram.sample_count.saturating_sub(below));
    Some(HistogramDataPoint {
        attributes: attributes(&series.label),
        start_time_unix_nano: start,
        time_unix_nano: now,
        count: histogram.sample_count,
        sum: Some(histogram.sample_sum),
        bucket_counts,
        explicit_bounds,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family as PromFamily;
    use prometheus_client::metrics::gauge::Gauge as PromGauge;
    use prometheus_client::metrics::histogram::Histogram as PromHistogram;
    use prometheus_client::registry::{Registry, Unit};

    use super::*;
    use crate::metrics::{GenAiLabels, RequestLabels, TokenUsageLabels};

    fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// The registry as prometheus-client's protobuf encoder gives it.
    fn families_of(registry: &Registry) -> Vec<MetricFamily> {
        prometheus_client::encoding::prometheus_protobuf::encode(registry).unwrap()
    }

    fn string_attributes(attributes: &[KeyValue]) -> Vec<(String, String)> {
        let value = |kv: &KeyValue| match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(any_value::Value::StringValue(value)) => value.clone(),
            other => panic!("{other:?}"),
        };
        attributes.iter().map(|kv| (kv.key.clone(), value(kv))).collect()
    }

    fn test_resource() -> (Resource, String) {
        proto_resource(&resource(&env_of(&[])))
    }

    /// A registry with a counter, a gauge, a histogram (with labels) and a
    /// family without series, pushed as one OTLP request: names, units,
    /// attributes, temporality, values, buckets and times.
    #[test]
    fn a_registry_becomes_an_otlp_request() {
        #[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
        struct StateLabels {
            state: &'static str,
        }
        let mut registry = Registry::default();
        let requests = PromFamily::<RequestLabels, Counter>::default();
        registry.register("sluice_requests", "Requests", requests.clone());
        let instances = PromFamily::<StateLabels, PromGauge>::default();
        registry.register("sluice_plugin_instances", "Instances", instances.clone());
        let usage: PromFamily<TokenUsageLabels, PromHistogram, _> =
            PromFamily::new_with_constructor(|| PromHistogram::new([1.0, 4.0, 16.0]));
        registry.register("gen_ai_client_token_usage", "Tokens", usage.clone());
        let durations = PromHistogram::new([0.5]);
        registry.register_with_unit("sluice_request_duration", "Durations", Unit::Seconds, durations.clone());
        let budget = PromGauge::<i64, std::sync::atomic::AtomicI64>::default();
        registry.register_with_unit("sluice_response_buffer_budget", "Budget", Unit::Bytes, budget.clone());
        let reconciles = PromFamily::<RequestLabels, Counter>::default();
        registry.register("sluice_reconciles", "Reconciles, none here", reconciles);

        let route = RequestLabels {
            route: "r".into(),
            model: "m".into(),
            backend: "http://b/v1".into(),
            status_class: "2xx",
            error_code: "",
        };
        requests.get_or_create(&route).inc_by(3);
        instances.get_or_create(&StateLabels { state: "idle" }).set(-2);
        let token = TokenUsageLabels {
            gen_ai_operation_name: "chat",
            gen_ai_provider_name: "openai",
            gen_ai_request_model: "m".into(),
            gen_ai_response_model: "m-1".into(),
            gen_ai_token_type: "input",
        };
        for tokens in [1.0, 10.0, 12.0, 97.0] {
            usage.get_or_create(&token).observe(tokens);
        }
        durations.observe(0.25);
        budget.set(1 << 20);

        let (start, now) = (1_000, 2_000);
        let request = request(&families_of(&registry), &test_resource(), start, now);
        let [resource_metrics] = &request.resource_metrics[..] else { panic!("{request:#?}") };
        let service = resource_metrics.resource.as_ref().unwrap().attributes.iter().find(|kv| kv.key == "service.name");
        assert!(service.is_some(), "{resource_metrics:#?}");
        let scope = &resource_metrics.scope_metrics[0];
        assert_eq!(scope.scope.as_ref().unwrap().name, "sluice");
        // No series, no metric.
        let [requests, instances, usage, durations, budget] = &scope.metrics[..] else { panic!("{scope:#?}") };

        // A counter: a monotonic cumulative sum from `start`.
        assert_eq!((requests.name.as_str(), requests.description.as_str()), ("sluice_requests", "Requests."));
        assert_eq!(requests.unit, "");
        let Some(metric::Data::Sum(sum)) = &requests.data else { panic!("{requests:#?}") };
        assert!(sum.is_monotonic);
        assert_eq!(sum.aggregation_temporality, AggregationTemporality::Cumulative as i32);
        let point = &sum.data_points[0];
        assert_eq!((point.start_time_unix_nano, point.time_unix_nano), (start, now));
        assert_eq!(point.value, Some(number_data_point::Value::AsInt(3)));
        // The labels in their order; an empty one is no attribute.
        assert_eq!(
            string_attributes(&point.attributes),
            labels(&[("route", "r"), ("model", "m"), ("backend", "http://b/v1"), ("status_class", "2xx")])
        );

        // A gauge: of the moment, no start.
        assert_eq!(instances.name, "sluice_plugin_instances");
        let Some(metric::Data::Gauge(gauge)) = &instances.data else { panic!("{instances:#?}") };
        let point = &gauge.data_points[0];
        assert_eq!((point.start_time_unix_nano, point.time_unix_nano), (0, now));
        assert_eq!(point.value, Some(number_data_point::Value::AsInt(-2)));
        assert_eq!(string_attributes(&point.attributes), labels(&[("state", "idle")]));

        // A histogram: the GenAI name, unit and attribute names; a count per
        // bucket, not cumulative, the last past the highest bound.
        assert_eq!((usage.name.as_str(), usage.unit.as_str()), ("gen_ai.client.token.usage", "{token}"));
        let Some(metric::Data::Histogram(histogram)) = &usage.data else { panic!("{usage:#?}") };
        assert_eq!(histogram.aggregation_temporality, AggregationTemporality::Cumulative as i32);
        let point = &histogram.data_points[0];
        assert_eq!(point.explicit_bounds, [1.0, 4.0, 16.0]);
        assert_eq!(point.bucket_counts, [1, 0, 2, 1]);
        assert_eq!((point.count, point.sum), (4, Some(120.0)));
        assert_eq!((point.start_time_unix_nano, point.time_unix_nano), (start, now));
        assert_eq!(
            string_attributes(&point.attributes),
            labels(&[
                ("gen_ai.operation.name", "chat"),
                ("gen_ai.provider.name", "openai"),
                ("gen_ai.request.model", "m"),
                ("gen_ai.response.model", "m-1"),
                ("gen_ai.token.type", "input"),
            ])
        );

        // Seconds: the suffix goes, the unit is `s`; a histogram without
        // labels has one point without attributes.
        assert_eq!((durations.name.as_str(), durations.unit.as_str()), ("sluice_request_duration", "s"));
        let Some(metric::Data::Histogram(histogram)) = &durations.data else { panic!("{durations:#?}") };
        let point = &histogram.data_points[0];
        assert_eq!((point.explicit_bounds.as_slice(), point.bucket_counts.as_slice()), (&[0.5][..], &[1, 0][..]));
        assert_eq!((point.count, point.sum), (1, Some(0.25)));
        assert!(point.attributes.is_empty());
        // Other units keep the name /metrics serves.
        assert_eq!((budget.name.as_str(), budget.unit.as_str()), ("sluice_response_buffer_budget_bytes", ""));
    }

    /// Label values arrive as written, whatever they hold: nothing escaped
    /// on the way.
    #[test]
    fn label_values_and_buckets_as_the_registry_holds_them() {
        let mut registry = Registry::default();
        let requests = PromFamily::<RequestLabels, Counter>::default();
        registry.register("sluice_requests", "Requests", requests.clone());
        let usage: PromFamily<TokenUsageLabels, PromHistogram, _> =
            PromFamily::new_with_constructor(|| PromHistogram::new([0.000_005, 1.0, 4.0, 16777216.0]));
        registry.register("gen_ai_client_token_usage", "Tokens", usage.clone());
        let tricky = "quote \" backslash \\ newline \n return \r comma , brace } λ";
        let route = RequestLabels {
            route: tricky.into(),
            model: "m".into(),
            backend: "http://b/v1".into(),
            status_class: "2xx",
            error_code: "",
        };
        requests.get_or_create(&route).inc_by(41);
        let token = TokenUsageLabels {
            gen_ai_operation_name: "chat",
            gen_ai_provider_name: "openai",
            gen_ai_request_model: tricky.into(),
            gen_ai_response_model: "m-1".into(),
            gen_ai_token_type: "output",
        };
        let histogram = usage.get_or_create(&token);
        for value in [0.000_001, 3.0, 3.0, 20.0, 1e9] {
            histogram.observe(value);
        }

        let request = request(&families_of(&registry), &test_resource(), 1, 2);
        let metrics = &request.resource_metrics[0].scope_metrics[0].metrics;
        let Some(metric::Data::Sum(sum)) = &metrics[0].data else { panic!("{metrics:#?}") };
        assert_eq!(string_attributes(&sum.data_points[0].attributes)[0], ("route".to_string(), tricky.to_string()));
        assert_eq!(sum.data_points[0].value, Some(number_data_point::Value::AsInt(41)));
        let Some(metric::Data::Histogram(histogram)) = &metrics[1].data else { panic!("{metrics:#?}") };
        let point = &histogram.data_points[0];
        assert_eq!(point.explicit_bounds, [0.000_005, 1.0, 4.0, 16777216.0]);
        assert_eq!(point.bucket_counts, [1, 0, 2, 1, 1]);
        assert_eq!((point.sum, point.count), (Some(0.000_001 + 3.0 + 3.0 + 20.0 + 1e9), 5));
        assert_eq!(string_attributes(&point.attributes)[2], ("gen_ai.request.model".to_string(), tricky.to_string()));
    }

    /// Whole values go as integers, others as doubles.
    #[test]
    fn numbers_as_integers_when_whole() {
        use number_data_point::Value::{AsDouble, AsInt};
        assert_eq!(number(3.0), AsInt(3));
        assert_eq!(number(-2.0), AsInt(-2));
        assert_eq!(number(9_007_199_254_740_992.0), AsInt(9_007_199_254_740_992));
        assert_eq!(number(0.25), AsDouble(0.25));
        assert_eq!(number(1e300), AsDouble(1e300));
        assert_eq!(number(f64::INFINITY), AsDouble(f64::INFINITY));
        assert!(matches!(number(f64::NAN), AsDouble(nan) if nan.is_nan()));
    }

    /// Every family of the process's registry is sent: each one with a
    /// series is a metric.
    #[test]
    fn sends_the_whole_process_registry() {
        let families = metrics().families();
        let text = metrics().encode();
        assert_eq!(families.len(), text.matches("# TYPE ").count(), "{text}");
        let with_series = families.iter().filter(|family| !family.metric.is_empty()).count();
        let request = request(&families, &test_resource(), 1, 2);
        let sent = &request.resource_metrics[0].scope_metrics[0].metrics;
        assert_eq!(sent.len(), with_series, "{families:#?}");
        let build = sent.iter().find(|m| m.name == "sluice_build_info").expect("the build info");
        let Some(metric::Data::Gauge(gauge)) = &build.data else { panic!("{build:#?}") };
        assert_eq!(gauge.data_points[0].value, Some(number_data_point::Value::AsInt(1)));
    }

    #[test]
    fn names_and_units() {
        let name = |family: &str, kind| otlp_name(family, kind);
        assert_eq!(
            name("gen_ai_client_token_usage", MetricType::Histogram),
            ("gen_ai.client.token.usage".into(), "{token}")
        );
        assert_eq!(
            name("gen_ai_server_request_duration_seconds", MetricType::Histogram),
            ("gen_ai.server.request.duration".into(), "s")
        );
        assert_eq!(
            name("gen_ai_server_time_to_first_token_seconds", MetricType::Histogram),
            ("gen_ai.server.time_to_first_token".into(), "s")
        );
        assert_eq!(name("sluice_requests_total", MetricType::Counter), ("sluice_requests".into(), ""));
        assert_eq!(
            name("sluice_request_duration_seconds", MetricType::Histogram),
            ("sluice_request_duration".into(), "s")
        );
        assert_eq!(name("sluice_plugin_instances", MetricType::Gauge), ("sluice_plugin_instances".into(), ""));
        // `_total` is a counter's suffix only.
        assert_eq!(name("sluice_grand_total", MetricType::Gauge), ("sluice_grand_total".into(), ""));
    }

    #[test]
    fn every_gen_ai_label_has_its_attribute_name() {
        let gen_ai = GenAiLabels {
            gen_ai_operation_name: "chat",
            gen_ai_provider_name: "openai",
            gen_ai_request_model: "m".into(),
            gen_ai_response_model: "m".into(),
        };
        let tokens = TokenUsageLabels {
            gen_ai_operation_name: "chat",
            gen_ai_provider_name: "openai",
            gen_ai_request_model: "m".into(),
            gen_ai_response_model: "m".into(),
            gen_ai_token_type: "input",
        };
        let mut registry = Registry::default();
        let a = PromFamily::<GenAiLabels, Counter>::default();
        let b = PromFamily::<TokenUsageLabels, Counter>::default();
        a.get_or_create(&gen_ai).inc();
        b.get_or_create(&tokens).inc();
        registry.register("a", "", a);
        registry.register("b", "", b);
        let families = families_of(&registry);
        for family in &families {
            for (key, _) in string_attributes(&attributes(&family.metric[0].label)) {
                assert!(key.starts_with("gen_ai.") && !key.contains("gen_ai_"), "{key} is a Prometheus spelling");
            }
        }
        let keys: Vec<String> =
            string_attributes(&attributes(&families[1].metric[0].label)).into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                "gen_ai.operation.name",
                "gen_ai.provider.name",
                "gen_ai.request.model",
                "gen_ai.response.model",
                "gen_ai.token.type"
            ]
        );
    }

    #[test]
    fn off_without_an_endpoint_or_when_disabled() {
        let off = |config: MetricsConfig, vars: &[(&str, &str)]| settings(config, &env_of(vars)).unwrap().is_none();
        assert!(off(MetricsConfig::default(), &[]));
        assert!(off(MetricsConfig { endpoint: Some(" ".into()), ..Default::default() }, &[]));
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
        assert!(!off(MetricsConfig::default(), &[endpoint]));
        assert!(!off(MetricsConfig::default(), &[endpoint, ("OTEL_METRICS_EXPORTER", "prometheus, otlp")]));
        for disabled in
            [("OTEL_METRICS_EXPORTER", "none"), ("OTEL_METRICS_EXPORTER", "prometheus"), ("OTEL_SDK_DISABLED", "true")]
        {
            assert!(off(MetricsConfig::default(), &[endpoint, disabled]), "{disabled:?}");
        }
        // Traces off does not turn metrics off.
        assert!(!off(MetricsConfig::default(), &[endpoint, ("OTEL_TRACES_EXPORTER", "none")]));
    }

    #[test]
    fn endpoints_protocols_and_intervals() {
        let resolved = |config: MetricsConfig, vars: &[(&str, &str)]| settings(config, &env_of(vars)).unwrap().unwrap();
        let flag = |endpoint: &str, protocol| MetricsConfig {
            endpoint: Some(endpoint.into()),
            protocol: Some(protocol),
            interval: None,
        };
        // A base URL takes `/v1/metrics` over HTTP; gRPC uses it as is.
        let http = resolved(flag("http://collector:4318/", Protocol::HttpProtobuf), &[]);
        assert_eq!((http.protocol, http.url.as_str()), (Protocol::HttpProtobuf, "http://collector:4318/v1/metrics"));
        assert_eq!((http.interval, http.timeout), (DEFAULT_INTERVAL, DEFAULT_TIMEOUT));
        let grpc = resolved(flag("http://collector:4317", Protocol::Grpc), &[]);
        assert_eq!(grpc.url, "http://collector:4317");
        // The flag before the variables.
        let vars = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://other:4318"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")];
        let both =
            resolved(MetricsConfig { endpoint: Some("http://collector:4317".into()), ..Default::default() }, &vars);
        assert_eq!((both.protocol, both.url.as_str()), (Protocol::Grpc, "http://collector:4317"));
        // The metrics' own variables before the general ones; their
        // endpoint is the whole URL.
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://other:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://collector:4318/custom/metrics"),
            ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "1500"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2000"),
            ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "700"),
        ];
        let env = resolved(MetricsConfig::default(), &vars);
        assert_eq!((env.protocol, env.url.as_str()), (Protocol::HttpProtobuf, "http://collector:4318/custom/metrics"));
        assert_eq!((env.interval, env.timeout), (Duration::from_millis(1500), Duration::from_millis(700)));
        let general = resolved(MetricsConfig::default(), &vars[..2]);
        assert_eq!((general.protocol, general.url.as_str()), (Protocol::Grpc, "http://other:4317"));
        // The interval flag before the variable.
        let config = MetricsConfig { interval: Some(Duration::from_secs(5)), ..flag("http://c:1", Protocol::Grpc) };
        assert_eq!(resolved(config, &vars).interval, Duration::from_secs(5));
    }

    #[test]
    fn bad_settings_are_errors() {
        let error =
            |config: MetricsConfig, vars: &[(&str, &str)]| settings(config, &env_of(vars)).unwrap_err().to_string();
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
        let https = error(MetricsConfig { endpoint: Some("https://collector:4317".into()), ..Default::default() }, &[]);
        assert!(https.contains("TLS"), "{https}");
        let https = error(MetricsConfig::default(), &[("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "https://c/v1/metrics")]);
        assert!(https.starts_with("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"), "{https}");
        let url = error(MetricsConfig::default(), &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://bad host")]);
        assert!(url.contains("not a URL"), "{url}");
        let protocol =
            error(MetricsConfig::default(), &[endpoint, ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/json")]);
        assert!(protocol.starts_with("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"), "{protocol}");
        for interval in ["0", "soon", "-5"] {
            let message = error(MetricsConfig::default(), &[endpoint, ("OTEL_METRIC_EXPORT_INTERVAL", interval)]);
            assert!(message.starts_with("OTEL_METRIC_EXPORT_INTERVAL"), "{message}");
        }
        let short =
            error(MetricsConfig { interval: Some(Duration::from_millis(10)), ..Default::default() }, &[endpoint]);
        assert!(short.contains("shorter than"), "{short}");
        let timeout = error(MetricsConfig::default(), &[endpoint, ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")]);
        assert!(timeout.starts_with("OTEL_EXPORTER_OTLP_TIMEOUT"), "{timeout}");
        let header = error(MetricsConfig::default(), &[endpoint, ("OTEL_EXPORTER_OTLP_HEADERS", "api-key")]);
        assert!(header.starts_with("OTEL_EXPORTER_OTLP_HEADERS") && !header.contains("api-key"), "{header}");
        let header = error(MetricsConfig::default(), &[endpoint, ("OTEL_EXPORTER_OTLP_HEADERS", "k=%zz")]);
        assert!(header.starts_with("OTEL_EXPORTER_OTLP_HEADERS"), "{header}");
    }

    #[test]
    fn headers_from_the_environment() {
        let headers = |vars: &[(&str, &str)]| headers_from_env(&env_of(vars)).unwrap();
        assert!(headers(&[]).is_empty());
        let both = headers(&[
            ("OTEL_EXPORTER_OTLP_HEADERS", "general=1"),
            ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "api-key = s%3Dcr%2Cet , tenant=a b,"),
        ]);
        // The metrics' own replace the general ones.
        assert_eq!(both.len(), 2, "{both:?}");
        assert_eq!(both["api-key"], "s=cr,et");
        assert_eq!(both["tenant"], "a b");
        assert_eq!(headers(&[("OTEL_EXPORTER_OTLP_HEADERS", "general=1")])["general"], "1");
    }

    /// The stand-in collector, answering as told.
    mod collector {
        use bytes::Bytes;
        use opentelemetry_proto::tonic::collector::metrics::v1::{
            ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse,
        };
        use prost::Message;

        pub type Collector = crate::stand_in::Collector<ExportMetricsServiceRequest>;

        #[derive(Clone, Copy)]
        pub enum Answer {
            Ok,
            /// A partial success: one data point rejected.
            Reject,
            /// Never.
            Hang,
        }

        pub fn start(answer: Answer) -> Collector {
            let reply = |response: ExportMetricsServiceResponse| {
                crate::stand_in::Reply::Ok(Bytes::from(response.encode_to_vec()))
            };
            crate::stand_in::start(match answer {
                Answer::Ok => reply(ExportMetricsServiceResponse::default()),
                Answer::Reject => reply(ExportMetricsServiceResponse {
                    partial_success: Some(ExportMetricsPartialSuccess {
                        rejected_data_points: 1,
                        error_message: "bad point".into(),
                    }),
                }),
                Answer::Hang => crate::stand_in::Reply::Hang,
            })
        }
    }

    fn test_settings(collector: &collector::Collector, protocol: Protocol, interval: Duration) -> Settings {
        let vars = [("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "api-key=secret"), ("OTEL_EXPORTER_OTLP_TIMEOUT", "500")];
        let config = MetricsConfig {
            endpoint: Some(format!("http://{}", collector.addr)),
            protocol: Some(protocol),
            interval: Some(interval),
        };
        settings(config, &env_of(&vars)).unwrap().unwrap()
    }

    /// Pushes the process's registry to a local collector over `protocol`:
    /// every interval, and once more at shutdown.
    fn push_over(protocol: Protocol) {
        let collector = collector::start(collector::Answer::Ok);
        let start = unix_nanos(SystemTime::now());
        let guard =
            start_pushing(test_settings(&collector, protocol, Duration::from_millis(100)), test_resource(), start)
                .unwrap();
        let refreshed = Arc::new(AtomicBool::new(false));
        guard.refresh_before_push({
            let refreshed = refreshed.clone();
            move || refreshed.store(true, Ordering::SeqCst)
        });
        let first = collector.received.recv_timeout(Duration::from_secs(20)).expect("a periodic push");
        guard.shutdown();
        let mut last = first;
        // The last push, at shutdown, comes after the periodic ones.
        while let Ok(export) = collector.received.recv_timeout(Duration::from_millis(200)) {
            last = export;
        }
        let expected = match protocol {
            Protocol::Grpc => "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
            Protocol::HttpProtobuf => "/v1/metrics",
        };
        assert_eq!(last.path, expected);
        assert_eq!(last.headers["api-key"], "secret");
        let [resource_metrics] = &last.request.resource_metrics[..] else { panic!("{:#?}", last.request) };
        let resource = resource_metrics.resource.as_ref().unwrap();
        assert!(resource.attributes.iter().any(|kv| kv.key == "service.name"), "{resource:#?}");
        let metrics = &resource_metrics.scope_metrics[0].metrics;
        let build = metrics.iter().find(|m| m.name == "sluice_build_info").expect("the build info");
        let Some(metric::Data::Gauge(gauge)) = &build.data else { panic!("{build:#?}") };
        assert!(gauge.data_points[0].time_unix_nano >= start);
        assert!(refreshed.load(Ordering::SeqCst), "refreshed before pushing");
    }

    #[test]
    fn pushes_over_grpc() {
        push_over(Protocol::Grpc);
    }

    #[test]
    fn pushes_over_http() {
        push_over(Protocol::HttpProtobuf);
    }

    // Set up and shut down on a single-threaded runtime's only thread, as
    // `sluice run` may: the pushes do not need it.
    #[tokio::test]
    async fn pushes_from_a_single_threaded_runtime() {
        push_over(Protocol::Grpc);
        push_over(Protocol::HttpProtobuf);
    }

    #[tokio::test]
    async fn rejected_points_are_an_error() {
        for protocol in [Protocol::Grpc, Protocol::HttpProtobuf] {
            let collector = collector::start(collector::Answer::Reject);
            let settings = test_settings(&collector, protocol, DEFAULT_INTERVAL);
            let mut transport = Transport::new(&settings).unwrap();
            let error = transport.send(snapshot(&test_resource(), 0), &settings.headers).await.unwrap_err();
            assert!(error.contains("rejected 1 data points: bad point"), "{protocol}: {error}");
        }
    }

    #[tokio::test]
    async fn an_unreachable_collector_is_an_error() {
        // A port nothing listens on.
        let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        for protocol in [Protocol::Grpc, Protocol::HttpProtobuf] {
            let config =
                MetricsConfig { endpoint: Some(format!("http://{addr}")), protocol: Some(protocol), interval: None };
            let settings = settings(config, &env_of(&[])).unwrap().unwrap();
            let mut transport = Transport::new(&settings).unwrap();
            assert!(transport.send(snapshot(&test_resource(), 0), &settings.headers).await.is_err(), "{protocol}");
        }
    }

    /// A collector that never answers holds up neither the pushes nor the
    /// shutdown: each push ends at its timeout.
    #[test]
    fn a_silent_collector_is_given_up_on() {
        for protocol in [Protocol::Grpc, Protocol::HttpProtobuf] {
            let collector = collector::start(collector::Answer::Hang);
            let settings = test_settings(&collector, protocol, Duration::from_millis(100));
            assert_eq!(settings.timeout, Duration::from_millis(500));
            let guard = start_pushing(settings, test_resource(), 0).unwrap();
            // Two pushes in a row time out: the first, then the next tick's.
            for _ in 0..2 {
                collector.received.recv_timeout(Duration::from_secs(20)).expect("a push");
            }
            let stopping = Instant::now();
            guard.shutdown();
            // The push in flight is dropped, the last one times out.
            let took = stopping.elapsed();
            assert!(took < Duration::from_secs(3), "{protocol}: {took:?}");
        }
    }

    /// The figure for one push: a registry of a few hundred series taken
    /// as families and made into one OTLP request.
    #[test]
    fn a_push_of_hundreds_of_series() {
        let mut registry = Registry::default();
        let requests = PromFamily::<RequestLabels, Counter>::default();
        let buckets = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92];
        let durations: PromFamily<RequestLabels, PromHistogram, _> =
            PromFamily::new_with_constructor(move || PromHistogram::new(buckets));
        let gauges = PromFamily::<RequestLabels, PromGauge>::default();
        registry.register("sluice_requests", "Requests", requests.clone());
        registry.register_with_unit("sluice_request_duration", "Durations", Unit::Seconds, durations.clone());
        registry.register("sluice_things", "Things", gauges.clone());
        let statuses = ["2xx", "4xx", "5xx"];
        for route in 0..50 {
            for status_class in statuses {
                let labels = RequestLabels {
                    route: format!("default/route-{route}").into(),
                    model: "gpt-4o-mini".into(),
                    backend: "http://upstream.default.svc:8080/v1".into(),
                    status_class,
                    error_code: "",
                };
                requests.get_or_create(&labels).inc_by(route);
                durations.get_or_create(&labels).observe(0.3);
                gauges.get_or_create(&labels).set(1);
            }
        }
        let series = 3 * 50 * statuses.len();
        let resource = test_resource();
        let runs = 20;
        let (mut encoding, mut converting, mut bytes) = (Duration::ZERO, Duration::ZERO, 0);
        for _ in 0..runs {
            let started = Instant::now();
            let families = families_of(&registry);
            let encoded = Instant::now();
            let request = request(&families, &resource, 1, 2);
            let message = request.encode_to_vec();
            converting += encoded.elapsed();
            encoding += encoded - started;
            bytes = message.len();
            let points: usize = request.resource_metrics[0].scope_metrics[0]
                .metrics
                .iter()
                .map(|m| match &m.data {
                    Some(metric::Data::Sum(sum)) => sum.data_points.len(),
                    Some(metric::Data::Gauge(gauge)) => gauge.data_points.len(),
                    Some(metric::Data::Histogram(histogram)) => histogram.data_points.len(),
                    _ => 0,
                })
                .sum();
            assert_eq!(points, series);
        }
        eprintln!(
            "one push of {series} series ({bytes} bytes of protobuf): the registry's families {:?}, OTLP + protobuf {:?}",
            encoding / runs,
            converting / runs
        );
    }
}
