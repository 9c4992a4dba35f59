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
mod tests;
