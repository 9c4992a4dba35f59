//! OTLP metrics through the real binary into a real OpenTelemetry
//! Collector: the metrics /metrics serves, pushed over gRPC and HTTP with
//! their OpenTelemetry names, as cumulative sums, gauges and histograms,
//! and pushed once more at shutdown.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;
use sluice_tests::{Collector, ConfigDir, Echo, Gateway, Options, Plugin, Route, documents};

/// The API key clients send; the auth plugin's config holds its SHA-256.
const API_KEY: &str = "sk-e2e-otlp-alice";
const MODEL: &str = "gpt-test";
/// The buckets of `gen_ai.client.token.usage` (crates/telemetry/src/metrics.rs).
const TOKEN_BOUNDS: usize = 14;
const WITHIN: Duration = Duration::from_secs(30);

fn sha256_hex(text: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// One route behind the auth plugin (consumer `key:alice`).
async fn serve(options: Options) -> (Echo, ConfigDir, Gateway) {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let auth = Plugin::new("auth", "auth")
        .auth_phase()
        .config(json!({"apiKeys": [{"consumer": "alice", "sha256": sha256_hex(API_KEY)}]}));
    let route = Route::new("chat", &[MODEL], &echo.url()).plugins(&["auth"]);
    dir.write("config.yaml", &documents(&[auth.yaml(), route.yaml()]));
    let gateway = Gateway::start_with(&dir, options).await;
    (echo, dir, gateway)
}

/// `ok` answered chats (returning the input and output tokens they used),
/// one refused by the auth plugin, one for a model no route serves.
async fn traffic(gateway: &Gateway, ok: usize) -> (f64, f64) {
    let bearer = format!("Bearer {API_KEY}");
    let (mut input, mut output) = (0.0, 0.0);
    for _ in 0..ok {
        let reply = gateway.chat(MODEL, &[("authorization", bearer.as_str())]).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let usage = reply.json()["usage"].clone();
        input += usage["prompt_tokens"].as_f64().expect("prompt_tokens");
        output += usage["completion_tokens"].as_f64().expect("completion_tokens");
    }
    gateway.chat(MODEL, &[]).await.assert_error(401, "missing_credentials");
    gateway.chat("no-such-model", &[("authorization", bearer.as_str())]).await.assert_error(404, "model_not_found");
    (input, output)
}

fn unix_nanos() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

const ROUTE: (&str, &str) = ("route", "default/chat");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_reach_a_real_collector_over_grpc_and_http() {
    for protocol in ["grpc", "http/protobuf"] {
        let collector = Collector::start().await;
        let endpoint = if protocol == "grpc" { collector.endpoint_grpc() } else { collector.endpoint_http() };
        let args = ["--otlp-endpoint", &endpoint, "--otlp-protocol", protocol, "--otlp-metrics-interval-seconds", "1"]
            .map(String::from)
            .to_vec();
        let before_start = unix_nanos();
        let (echo, _dir, gateway) = serve(Options { args, ..Options::default() }).await;
        let (input, output) = traffic(&gateway, 3).await;

        // Cumulative: wait for a push that counts everything sent.
        let points = collector
            .wait_for_metrics(
                |points| {
                    let latest = |name: &str, attributes: &[(&str, &str)]| {
                        points.iter().rev().find(|p| p.is(name, attributes)).and_then(|p| p.value)
                    };
                    latest("sluice_requests", &[ROUTE, ("status_class", "2xx")]) == Some(3.0)
                        && latest("sluice_requests", &[("error_code", "model_not_found")]) == Some(1.0)
                        && latest("sluice_plugin_invocations", &[("plugin", "auth"), ("outcome", "respond")])
                            == Some(1.0)
                },
                WITHIN,
            )
            .await;
        let pushed = unix_nanos();
        let latest = |name: &str, attributes: &[(&str, &str)]| {
            points
                .iter()
                .rev()
                .find(|p| p.is(name, attributes))
                .unwrap_or_else(|| panic!("{protocol}: no {name} {attributes:?} among {points:#?}"))
        };

        // Requests: a monotonic cumulative sum, by route, model, backend and
        // status class; the labels as attributes, an empty one left out.
        let ok = latest("sluice_requests", &[ROUTE, ("model", MODEL), ("status_class", "2xx")]);
        assert_eq!((ok.kind.as_str(), ok.monotonic, ok.temporality), ("sum", true, 2), "{protocol}: {ok:?}");
        assert_eq!(ok.attributes["backend"], echo.url().as_str(), "{protocol}");
        assert!(!ok.attributes.contains_key("error_code"), "{protocol}: {ok:?}");
        assert_eq!((ok.resource["service.name"].as_str(), ok.scope.as_str()), (Some("sluice"), "sluice"));
        // The series started with the process, before the first request.
        assert!(before_start < ok.start_unix_nanos && ok.start_unix_nanos < ok.time_unix_nanos, "{ok:?}");
        assert!(ok.time_unix_nanos <= pushed, "{ok:?}");
        let refused = latest("sluice_requests", &[ROUTE, ("status_class", "4xx")]);
        assert_eq!(refused.value, Some(1.0), "{protocol}: the auth plugin's 401");
        let unknown = latest("sluice_requests", &[("error_code", "model_not_found")]);
        assert!(!unknown.attributes.contains_key("route"), "{protocol}: {unknown:?}");
        assert_eq!(unknown.start_unix_nanos, ok.start_unix_nanos, "one start for every series");

        // Token usage: the GenAI convention's histogram, names and all.
        let gen_ai = [
            ("gen_ai.operation.name", "chat"),
            ("gen_ai.provider.name", "openai"),
            ("gen_ai.request.model", MODEL),
            ("gen_ai.response.model", MODEL),
        ];
        for (token_type, tokens) in [("input", input), ("output", output)] {
            let attributes: Vec<_> = gen_ai.iter().copied().chain([("gen_ai.token.type", token_type)]).collect();
            let usage = latest("gen_ai.client.token.usage", &attributes);
            assert_eq!((usage.kind.as_str(), usage.unit.as_str(), usage.temporality), ("histogram", "{token}", 2));
            assert_eq!((usage.count, usage.sum), (3, Some(tokens)), "{protocol} {token_type}: {usage:?}");
            assert_eq!(usage.explicit_bounds.len(), TOKEN_BOUNDS, "{usage:?}");
            assert_eq!(usage.bucket_counts.len(), TOKEN_BOUNDS + 1, "{usage:?}");
            assert_eq!(usage.bucket_counts.iter().sum::<u64>(), 3, "{usage:?}");
        }
        let duration = latest("gen_ai.server.request.duration", &gen_ai);
        assert_eq!((duration.unit.as_str(), duration.count), ("s", 3), "{protocol}: the 401 has no response model");
        let first_token = latest("gen_ai.server.time_to_first_token", &gen_ai);
        assert_eq!((first_token.unit.as_str(), first_token.count), ("s", 3), "{protocol}");
        let durations = latest("sluice_request_duration", &[ROUTE, ("model", MODEL)]);
        assert_eq!((durations.kind.as_str(), durations.unit.as_str(), durations.count), ("histogram", "s", 4));
        assert!(durations.sum.unwrap() > 0.0, "{durations:?}");

        // Plugins: calls by hook and outcome; a gauge for what is loaded.
        let auth = [("namespace", "default"), ("plugin", "auth"), ("hook", "request")];
        let calls = |outcome: &str| {
            let attributes: Vec<_> = auth.iter().copied().chain([("outcome", outcome)]).collect();
            latest("sluice_plugin_invocations", &attributes).value
        };
        // The unknown model never reached the route's plugin.
        assert_eq!((calls("continue"), calls("respond")), (Some(3.0), Some(1.0)), "{protocol}");
        let state = [("kind", "GatewayPlugin"), ("name", "auth"), ("state", "ready")];
        let loaded = latest("sluice_resource_load_state", &state);
        assert_eq!((loaded.kind.as_str(), loaded.value), ("gauge", Some(1.0)), "{protocol}: {loaded:?}");
        assert_eq!((loaded.start_unix_nanos, loaded.time_unix_nanos), (0, ok.time_unix_nanos), "a gauge has no start");
        assert!(latest("sluice_config_generation", &[]).value >= Some(1.0), "{protocol}");
        // Measured when read, before each push as before each scrape.
        let info = latest("sluice_plugin_info", &[("plugin", "auth")]);
        assert_eq!((info.kind.as_str(), info.value), ("gauge", Some(1.0)), "{protocol}: {info:?}");
        assert!(info.attributes["digest"].as_str().is_some_and(|d| d.starts_with("sha256:")), "{protocol}: {info:?}");
        let build = latest("sluice_build_info", &[]);
        assert_eq!(build.attributes["version"], env!("CARGO_PKG_VERSION"));

        // No Prometheus spellings.
        for point in &points {
            assert!(!point.name.ends_with("_total") && !point.name.ends_with("_seconds"), "{point:?}");
            assert!(!point.name.starts_with("gen_ai_"), "{point:?}");
            assert!(point.attributes.keys().all(|key| !key.starts_with("gen_ai_")), "{point:?}");
        }
        // The same numbers as /metrics: one registry.
        let text = gateway.client().get(&gateway.admin_url("/metrics")).await.text();
        let line = format!(
            r#"sluice_requests_total{{route="default/chat",model="{MODEL}",backend="{}",status_class="2xx",error_code=""}} 3"#,
            echo.url()
        );
        assert!(text.contains(&line), "{protocol}: no `{line}` in\n{text}");
        assert!(!gateway.log().contains("OTLP metrics push failed"), "{protocol}:\n{}", gateway.log());
    }
}

/// With the standard variables only and an interval longer than the test,
/// the only push is the one at shutdown, with every count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_counts_are_pushed_at_shutdown() {
    let collector = Collector::start().await;
    let env = [
        ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", format!("{}/v1/metrics", collector.endpoint_http())),
        ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf".into()),
        ("OTEL_METRIC_EXPORT_INTERVAL", "3600000".into()),
    ];
    let env = env.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    let (_echo, _dir, mut gateway) = serve(Options { env, ..Options::default() }).await;
    traffic(&gateway, 2).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(collector.metrics().is_empty(), "nothing is pushed before the interval");

    gateway.terminate();
    let status = gateway.wait_exit(Duration::from_secs(30)).await.expect("the gateway exits");
    assert!(status.success(), "{status:?}\n{}", gateway.log());
    // The collector writes what it received within 100 ms.
    let points = collector.wait_for_metrics(|points| !points.is_empty(), Duration::from_secs(5)).await;
    let ok = points.iter().rev().find(|p| p.is("sluice_requests", &[ROUTE, ("status_class", "2xx")]));
    assert_eq!(ok.and_then(|p| p.value), Some(2.0), "{points:#?}");
    // Only metrics: no trace endpoint is configured.
    assert!(collector.spans().is_empty());
}
