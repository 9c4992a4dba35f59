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
    assert_eq!(name("sluice_request_duration_seconds", MetricType::Histogram), ("sluice_request_duration".into(), "s"));
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
    let both = resolved(MetricsConfig { endpoint: Some("http://collector:4317".into()), ..Default::default() }, &vars);
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
    let error = |config: MetricsConfig, vars: &[(&str, &str)]| settings(config, &env_of(vars)).unwrap_err().to_string();
    let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
    let https = error(MetricsConfig { endpoint: Some("https://collector:4317".into()), ..Default::default() }, &[]);
    assert!(https.contains("TLS"), "{https}");
    let https = error(MetricsConfig::default(), &[("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "https://c/v1/metrics")]);
    assert!(https.starts_with("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"), "{https}");
    let url = error(MetricsConfig::default(), &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://bad host")]);
    assert!(url.contains("not a URL"), "{url}");
    let protocol = error(MetricsConfig::default(), &[endpoint, ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/json")]);
    assert!(protocol.starts_with("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"), "{protocol}");
    for interval in ["0", "soon", "-5"] {
        let message = error(MetricsConfig::default(), &[endpoint, ("OTEL_METRIC_EXPORT_INTERVAL", interval)]);
        assert!(message.starts_with("OTEL_METRIC_EXPORT_INTERVAL"), "{message}");
    }
    let short = error(MetricsConfig { interval: Some(Duration::from_millis(10)), ..Default::default() }, &[endpoint]);
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
        let reply =
            |response: ExportMetricsServiceResponse| crate::stand_in::Reply::Ok(Bytes::from(response.encode_to_vec()));
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
        start_pushing(test_settings(&collector, protocol, Duration::from_millis(100)), test_resource(), start).unwrap();
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
