//! Observability through the real binary: the metrics as a real Prometheus
//! scrapes and queries them, the JSON access log field by field, request
//! ids, and plugin log lines that name their request.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};
use sluice_oci::{Reference, RegistryOptions};
use sluice_tests::{
    Collector, ConfigDir, Echo, Gateway, Options, Plugin, Prometheus, Registry, Route, chat_body, documents,
};

/// The API key clients send; the auth plugin's config holds its SHA-256.
const API_KEY: &str = "sk-e2e-telemetry-alice";
const MODEL: &str = "gpt-test";

fn sha256_hex(text: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// auth (consumer `key:alice`) → chaos (fails open on `x-chaos: trap`) →
/// probe (every response hook: chunks and whole bodies too), the probe
/// pulled from a registry.
fn plugins(probe_reference: &str) -> Vec<Plugin> {
    vec![
        Plugin::new("auth", "auth")
            .auth_phase()
            .config(json!({"apiKeys": [{"consumer": "alice", "sha256": sha256_hex(API_KEY)}]})),
        Plugin::new("chaos", "chaos").fail_open(),
        Plugin::oci("probe", probe_reference).config(json!({"stopAfter": 1000, "body": true})),
        // Declared, refused at load, used by no route: a failed resource.
        Plugin::new("broken", "chaos").config(json!({"rejectConfig": true})),
    ]
}

async fn push_probe(registry: &Registry) -> String {
    let reference = registry.reference("plugins/probe:v1");
    let module = std::fs::read(sluice_tests::plugin_wasm("probe")).expect("plugins/dist/probe.wasm");
    let scratch = tempfile::tempdir().unwrap();
    let client = sluice_oci::Registry::new(RegistryOptions::new(scratch.path().join("cache"))).unwrap();
    let parsed: Reference = reference.parse().unwrap();
    client.push(module, &parsed, BTreeMap::new(), None).await.expect("pushing the probe");
    reference
}

async fn serve(registry: &Registry, options: Options) -> (Echo, ConfigDir, Gateway) {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let plugins = plugins(&push_probe(registry).await);
    let mut docs: Vec<String> = plugins.iter().map(Plugin::yaml).collect();
    docs.push(Route::new("chat", &[MODEL], &echo.url()).plugins(&["auth", "chaos", "probe"]).yaml());
    dir.write("config.yaml", &documents(&docs));
    let gateway = Gateway::start_with(&dir, options).await;
    (echo, dir, gateway)
}

fn bearer() -> String {
    format!("Bearer {API_KEY}")
}

fn streaming_body() -> String {
    json!({"model": MODEL, "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "hello"}]})
    .to_string()
}

/// The value of an instant query that must return exactly one series.
async fn value(prometheus: &Prometheus, promql: &str) -> f64 {
    let samples = prometheus.query(promql).await;
    assert_eq!(samples.len(), 1, "{promql} returned {samples:?}");
    samples[0].1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_family_reaches_a_real_prometheus() {
    let registry = Registry::start();
    let (echo, dir, gateway) = serve(&registry, Options::default()).await;
    let auth = bearer();
    let key = [("authorization", auth.as_str())];
    for _ in 0..3 {
        let reply = gateway.chat(MODEL, &key).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    let streamed = gateway.post("/v1/chat/completions", streaming_body(), &key).await;
    assert_eq!(streamed.status, 200, "{}", streamed.text());
    // chaos traps, and is skipped (failurePolicy: Open).
    let reply = gateway.chat(MODEL, &[("authorization", auth.as_str()), ("x-chaos", "trap")]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    gateway.chat(MODEL, &[]).await.assert_error(401, "missing_credentials");
    gateway.chat("no-such-model", &key).await.assert_error(404, "model_not_found");
    // A config that does not parse is rejected whole; the last good serves.
    dir.write("zz-broken.yaml", "kind: [unclosed");
    sluice_tests::eventually("the broken file is rejected", Duration::from_secs(10), async || {
        let metrics = gateway.client().get(&gateway.admin_url("/metrics")).await.text();
        metrics.contains("result=\"rejected\"").then_some(())
    })
    .await;

    let prometheus = Prometheus::start(&[gateway.admin_addr()]).await;
    prometheus.wait_for("sluice_build_info", Duration::from_secs(60)).await;
    let route = r#"route="default/chat",model="gpt-test""#;

    // Requests: by route, model, backend, status class and error code.
    let ok = format!(r#"sum(sluice_requests_total{{{route},status_class="2xx",error_code=""}})"#);
    assert_eq!(value(&prometheus, &ok).await, 5.0);
    let backend = format!(r#"sluice_requests_total{{{route},backend="{}",status_class="2xx"}}"#, echo.url());
    assert_eq!(value(&prometheus, &backend).await, 5.0);
    let refused = format!(r#"sluice_requests_total{{{route},status_class="4xx"}}"#);
    assert_eq!(value(&prometheus, &refused).await, 1.0, "the 401 came from the route's auth plugin");
    let unknown = r#"sluice_requests_total{route="",status_class="4xx",error_code="model_not_found"}"#;
    assert_eq!(value(&prometheus, unknown).await, 1.0);
    // Durations, time to first token, upstream latency.
    let durations = format!("sum(sluice_request_duration_seconds_count{{{route}}})");
    assert_eq!(value(&prometheus, &durations).await, 6.0);
    let gen_ai = r#"gen_ai_operation_name="chat",gen_ai_provider_name="openai",gen_ai_request_model="gpt-test",gen_ai_response_model="gpt-test""#;
    let duration = format!("gen_ai_server_request_duration_seconds_count{{{gen_ai}}}");
    assert_eq!(value(&prometheus, &duration).await, 5.0, "the 401 has no response model");
    let first_token = format!("gen_ai_server_time_to_first_token_seconds_count{{{gen_ai}}}");
    assert_eq!(value(&prometheus, &first_token).await, 5.0);
    let upstream = r#"sum(sluice_upstream_duration_seconds_count{route="default/chat",status_class="2xx"})"#;
    assert_eq!(value(&prometheus, upstream).await, 5.0);
    // Tokens: per the GenAI conventions, and by consumer.
    for token_type in ["input", "output"] {
        let usage = format!(r#"gen_ai_client_token_usage_count{{{gen_ai},gen_ai_token_type="{token_type}"}}"#);
        assert_eq!(value(&prometheus, &usage).await, 5.0, "{token_type}");
        let tokens = format!(r#"sluice_tokens_total{{{route},consumer="key:alice",token_type="{token_type}"}}"#);
        assert!(value(&prometheus, &tokens).await > 5.0, "{token_type}");
    }
    // Plugins: calls by hook and outcome, durations, skips, instances, info.
    let calls = |plugin: &str, hook: &str, outcome: &str| {
        format!(
            r#"sluice_plugin_invocations_total{{namespace="default",plugin="{plugin}",hook="{hook}",outcome="{outcome}"}}"#
        )
    };
    assert_eq!(value(&prometheus, &calls("auth", "request", "continue")).await, 5.0);
    assert_eq!(value(&prometheus, &calls("auth", "request", "respond")).await, 1.0);
    assert_eq!(value(&prometheus, &calls("chaos", "request", "trap")).await, 1.0);
    assert_eq!(value(&prometheus, &calls("probe", "response-end", "continue")).await, 5.0);
    assert_eq!(value(&prometheus, &calls("probe", "response-body", "continue")).await, 4.0, "not streamed");
    assert!(value(&prometheus, &calls("probe", "response-chunk", "continue")).await >= 3.0, "one per event");
    let skipped = r#"sluice_plugin_skipped_total{plugin="chaos",hook="request"}"#;
    assert_eq!(value(&prometheus, skipped).await, 1.0);
    let plugin_durations = r#"sum(sluice_plugin_duration_seconds_count{plugin="auth",hook="request"})"#;
    assert_eq!(value(&prometheus, plugin_durations).await, 6.0);
    let info = prometheus.query(r#"sluice_plugin_info{plugin="probe"}"#).await;
    assert_eq!(info.len(), 1, "{info:?}");
    assert!(info[0].0["digest"].starts_with("sha256:"), "{info:?}");
    assert!(info[0].0["source"].contains("plugins/probe:v1"), "{info:?}");
    let instances = r#"sluice_plugin_instances{plugin="auth",state="in_use"}"#;
    assert_eq!(value(&prometheus, instances).await, 0.0, "nothing in flight");
    // Loading: OCI pulls, compiles (or cache hits), configs, resource states.
    assert!(value(&prometheus, r#"sluice_oci_pulls_total{result="pulled"}"#).await >= 1.0);
    assert!(value(&prometheus, "sum(sluice_plugin_compiles_total)").await >= 3.0);
    assert_eq!(value(&prometheus, r#"sluice_config_generations_total{result="rejected"}"#).await, 1.0);
    assert!(value(&prometheus, r#"sluice_config_generations_total{result="applied"}"#).await >= 1.0);
    assert!(value(&prometheus, "sluice_config_generation").await >= 1.0);
    let state = |name: &str, state: &str| {
        format!(
            r#"sluice_resource_load_state{{kind="GatewayPlugin",namespace="default",name="{name}",state="{state}"}}"#
        )
    };
    assert_eq!(value(&prometheus, &state("probe", "ready")).await, 1.0);
    assert_eq!(value(&prometheus, &state("broken", "failed")).await, 1.0);
    let route_state = r#"sluice_resource_load_state{kind="AIModelRoute",name="chat",state="ready"}"#;
    assert_eq!(value(&prometheus, route_state).await, 1.0);
    // The build.
    let build = prometheus.query("sluice_build_info").await;
    assert_eq!(build[0].0["version"], env!("CARGO_PKG_VERSION"), "{build:?}");
    // Built from a checkout: the commit is known.
    if std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.git")).exists() {
        let commit = &build[0].0["commit"];
        assert!(commit.len() >= 7 && commit.bytes().all(|b| b.is_ascii_hexdigit()), "{build:?}");
    }
    dashboard_queries_run(&prometheus).await;
    // No label carries what the client wrote: no prompt, no key, no model
    // that no route serves.
    let all = gateway.client().get(&gateway.admin_url("/metrics")).await.text();
    for text in ["hello", API_KEY, "no-such-model"] {
        assert!(!all.contains(text), "the metrics hold {text:?}:\n{all}");
    }
}

/// Every query of the Grafana dashboard runs against the real Prometheus,
/// and names only metrics the gateway exports (the controller's, which a
/// standalone gateway has none of, are checked in the Kubernetes tests).
async fn dashboard_queries_run(prometheus: &Prometheus) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/grafana/sluice.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut queries = Vec::new();
    collect_exprs(&dashboard, &mut queries);
    assert!(queries.len() >= 20, "{} queries in the dashboard", queries.len());
    let exported: Vec<String> = prometheus
        .query(r#"count by (__name__) ({__name__=~"sluice_.+|gen_ai_.+"})"#)
        .await
        .into_iter()
        .map(|(labels, _)| labels["__name__"].clone())
        .collect();
    let controller_only = ["sluice_reconciles_total", "sluice_reconcile_duration_seconds"];
    for query in &queries {
        for metric in metric_names(query) {
            let known = exported.contains(&metric) || controller_only.iter().any(|c| metric.starts_with(c));
            assert!(known, "the dashboard's `{query}` names {metric}, which is not exported: {exported:?}");
        }
        let query = query
            .replace("$__rate_interval", "1m")
            .replace("$__range", "5m")
            .replace("$__interval", "1m")
            .replace("${datasource}", "")
            .replace("$route", ".*")
            .replace("$model", ".*")
            .replace("$namespace", ".*")
            .replace("$plugin", ".*");
        // Panics with Prometheus's error if the query does not parse.
        prometheus.query(&query).await;
    }
}

fn collect_exprs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match value {
                    Value::String(expr) if key == "expr" => out.push(expr.clone()),
                    value => collect_exprs(value, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| collect_exprs(item, out)),
        _ => {}
    }
}

/// The metric names in a PromQL query: words starting `sluice_` or `gen_ai_`
/// outside label matchers (`{…}`) and label lists (`by (…)`, `on (…)`, …).
fn metric_names(query: &str) -> Vec<String> {
    const LABEL_LISTS: [&str; 6] = ["by", "without", "on", "ignoring", "group_left", "group_right"];
    let mut names = Vec::new();
    let mut rest = query;
    while let Some(c) = rest.chars().next() {
        if c == '{' || c == '"' {
            // A matcher, or a string: skip to its end.
            let end = if c == '{' { '}' } else { '"' };
            rest = rest[1..].find(end).map_or("", |i| &rest[i + 2..]);
        } else if c.is_ascii_alphabetic() || c == '_' {
            let len = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
            let (word, after) = rest.split_at(len);
            let after_space = after.trim_start();
            if LABEL_LISTS.contains(&word) && after_space.starts_with('(') {
                rest = after_space.find(')').map_or("", |i| &after_space[i + 1..]);
                continue;
            }
            if word.starts_with("sluice_") || word.starts_with("gen_ai_") {
                names.push(word.to_string());
            }
            rest = after;
        } else {
            rest = &rest[c.len_utf8()..];
        }
    }
    names
}

#[test]
fn metric_names_are_found_outside_matchers_and_label_lists() {
    let query = r#"histogram_quantile(0.99, sum by (le, gen_ai_request_model) (rate(gen_ai_server_time_to_first_token_seconds_bucket{gen_ai_token_type="x", route=~"$route"}[1m]))) / on (route) sluice_requests_total"#;
    assert_eq!(metric_names(query), ["gen_ai_server_time_to_first_token_seconds_bucket", "sluice_requests_total"]);
    assert_eq!(metric_names("count by (version) (sluice_bogus_info)"), ["sluice_bogus_info"]);
}

/// The JSON lines of the gateway's log.
fn json_lines(gateway: &Gateway) -> Vec<Value> {
    gateway.log().lines().filter_map(|line| serde_json::from_str::<Value>(line).ok()).collect()
}

/// The access log line of the request with id `id`, once written.
async fn access_line(gateway: &Gateway, id: &str) -> Value {
    sluice_tests::eventually("the access log line", Duration::from_secs(5), async || {
        json_lines(gateway).into_iter().find(|line| line["target"] == "sluice::access" && line["request_id"] == id)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_access_log_tells_each_request_without_secrets() {
    let registry = Registry::start();
    let options = Options { env: vec![("SLUICE_LOG_FORMAT".into(), "json".into())], ..Options::default() };
    let (echo, _dir, gateway) = serve(&registry, options).await;
    let auth = bearer();
    let reply = gateway.chat(MODEL, &[("authorization", auth.as_str()), ("x-request-id", "req-42")]).await;
    // The id goes back to the client, and on to the upstream.
    assert_eq!(reply.header("x-request-id"), Some("req-42"));
    // The upstream's own id is kept for the client, under another name.
    assert!(reply.header("x-upstream-request-id").is_some_and(|id| id.starts_with("req_echo")), "{:?}", reply.headers);
    assert_eq!(reply.echoed()["headers"]["x-request-id"], "req-42");
    let usage = reply.json()["usage"].clone();
    let line = access_line(&gateway, "req-42").await;
    assert_eq!(line["level"], "INFO");
    assert_eq!(line["method"], "POST");
    assert_eq!(line["path"], "/v1/chat/completions");
    assert_eq!(line["route"], "default/chat");
    assert_eq!(line["model"], MODEL);
    assert_eq!(line["backend"], echo.url());
    assert_eq!(line["status"], 200);
    assert_eq!(line["error_code"], Value::Null);
    assert_eq!(line["streamed"], false);
    assert_eq!(line["completed"], true);
    assert_eq!(line["attempts"], 1);
    assert_eq!(line["input_tokens"], usage["prompt_tokens"]);
    assert_eq!(line["output_tokens"], usage["completion_tokens"]);
    assert_eq!(line["response_model"], MODEL);
    assert_eq!(line["consumer"], "key:alice");
    assert_eq!(line["response_bytes"], reply.body.len());
    assert_eq!(line["trace_id"], Value::Null, "tracing is off");
    let ms = |field: &str| line[field].as_f64().unwrap_or_else(|| panic!("{field} in {line}"));
    let (upstream, first, duration) = (ms("upstream_ms"), ms("time_to_first_token_ms"), ms("duration_ms"));
    assert!(0.0 < upstream && upstream <= first && first <= duration, "{line}");
    assert!(line["timestamp"].as_str().unwrap().ends_with('Z'), "{line}");
    let plugins = line["plugins"].as_array().unwrap();
    for (plugin, hook) in [("default/auth", "request"), ("default/chaos", "request"), ("default/probe", "response-end")]
    {
        let found = plugins.iter().find(|p| p["plugin"] == plugin && p["hook"] == hook);
        let found = found.unwrap_or_else(|| panic!("{plugin} {hook} in {line}"));
        assert_eq!(found["outcome"], "continue", "{found}");
        assert_eq!(found["calls"], 1, "{found}");
        assert!(found["digest"].as_str().unwrap().starts_with("sha256:"), "{found}");
    }

    // A failure names its code; a client's unusable id is replaced.
    let reply = gateway.chat("no-such-model", &[("authorization", auth.as_str()), ("x-request-id", "has space")]).await;
    let id = reply.header("x-request-id").expect("a generated id").to_string();
    assert_eq!(id.len(), 32, "{id}");
    let line = access_line(&gateway, &id).await;
    assert_eq!((&line["status"], &line["error_code"]), (&json!(404), &json!("model_not_found")), "{line}");
    assert_eq!(line["route"], Value::Null);

    // Plugin log lines name their plugin and request.
    let probe =
        json_lines(&gateway).into_iter().find(|l| l["plugin"] == "default/probe" && l["request_id"] == "req-42");
    assert!(probe.is_some(), "no probe line for req-42:\n{}", gateway.log());
    // Never a secret or the prompt.
    let log = gateway.log();
    assert!(!log.contains(API_KEY), "the log holds the API key");
    let prompt = chat_body(MODEL)["messages"][0]["content"].as_str().unwrap().to_string();
    assert!(!log.contains(&format!("\"{prompt}\"")), "the log holds the prompt:\n{log}");
}

/// A `traceparent` as a client would send it.
const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_reach_a_real_collector_over_grpc_and_http() {
    let registry = Registry::start();
    for protocol in ["grpc", "http/protobuf"] {
        let collector = Collector::start().await;
        let endpoint = if protocol == "grpc" { collector.endpoint_grpc() } else { collector.endpoint_http() };
        let args = ["--otlp-endpoint", &endpoint, "--otlp-protocol", protocol].map(String::from).to_vec();
        let (_echo, _dir, gateway) = serve(&registry, Options { args, ..Options::default() }).await;
        let auth = bearer();
        // Not sampled by the client: no spans for this trace.
        let unsampled = format!("00-{}-{CLIENT_SPAN}-00", "a".repeat(32));
        let reply = gateway.chat(MODEL, &[("authorization", auth.as_str()), ("traceparent", unsampled.as_str())]).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
        let headers =
            [("authorization", auth.as_str()), ("traceparent", traceparent.as_str()), ("x-request-id", "traced")];
        let reply = gateway.chat(MODEL, &headers).await;
        // The upstream is a child of this request's upstream attempt.
        let upstream_parent =
            reply.echoed()["headers"]["traceparent"].as_str().expect("a traceparent upstream").to_string();
        let parts: Vec<&str> = upstream_parent.split('-').collect();
        assert_eq!((parts[0], parts[1], parts[3]), ("00", CLIENT_TRACE, "01"), "{upstream_parent}");
        assert_ne!(parts[2], CLIENT_SPAN, "the upstream's parent is the gateway's span, not the client's");
        // A stream's span ends with the stream.
        let stream_parent = format!("00-{}-{CLIENT_SPAN}-01", "b".repeat(32));
        let streamed = gateway
            .post(
                "/v1/chat/completions",
                streaming_body(),
                &[("authorization", auth.as_str()), ("traceparent", stream_parent.as_str())],
            )
            .await;
        assert_eq!(streamed.status, 200);

        let spans = collector
            .wait_for_spans(
                |spans| {
                    spans.iter().any(|s| s.kind == 2 && s.trace_id == "b".repeat(32))
                        && spans.iter().any(|s| s.trace_id == CLIENT_TRACE && s.kind == 3)
                },
                Duration::from_secs(30),
            )
            .await;
        let trace: Vec<_> = spans.iter().filter(|s| s.trace_id == CLIENT_TRACE).collect();
        let server =
            trace.iter().find(|s| s.kind == 2).unwrap_or_else(|| panic!("{protocol}: no server span in {trace:#?}"));
        assert_eq!(server.name, "chat gpt-test", "{protocol}");
        assert_eq!(server.parent_span_id.as_deref(), Some(CLIENT_SPAN), "{protocol}: the client's span is the parent");
        let attribute = |span: &sluice_tests::Span, key: &str| span.attributes.get(key).cloned().unwrap_or(Value::Null);
        for (key, expected) in [
            ("gen_ai.operation.name", json!("chat")),
            ("gen_ai.provider.name", json!("openai")),
            ("gen_ai.request.model", json!(MODEL)),
            ("gen_ai.response.model", json!(MODEL)),
            ("http.response.status_code", json!(200)),
            ("sluice.request_id", json!("traced")),
            ("sluice.route", json!("default/chat")),
            ("sluice.consumer", json!("key:alice")),
        ] {
            assert_eq!(attribute(server, key), expected, "{protocol}: {key} in {server:#?}");
        }
        let usage = reply.json()["usage"].clone();
        assert_eq!(attribute(server, "gen_ai.usage.input_tokens"), usage["prompt_tokens"], "{protocol}");
        assert_eq!(attribute(server, "gen_ai.usage.output_tokens"), usage["completion_tokens"], "{protocol}");
        assert_eq!(server.resource.get("service.name"), Some(&json!("sluice")), "{protocol}");
        // Children: each plugin hook, and the upstream attempt whose id the
        // upstream was given.
        let children: Vec<_> =
            trace.iter().filter(|s| s.parent_span_id.as_deref() == Some(server.span_id.as_str())).collect();
        for name in ["plugin default/auth request", "plugin default/chaos request", "plugin default/probe response-end"]
        {
            let span = children
                .iter()
                .find(|s| s.name == name)
                .unwrap_or_else(|| panic!("{protocol}: no {name} in {children:#?}"));
            assert_eq!(span.kind, 1, "{name}");
            assert!(
                attribute(span, "sluice.plugin.digest").as_str().unwrap_or_default().starts_with("sha256:"),
                "{span:#?}"
            );
            assert_eq!(attribute(span, "sluice.plugin.outcome"), "continue", "{span:#?}");
            assert!(
                server.start_unix_nanos <= span.start_unix_nanos && span.end_unix_nanos <= server.end_unix_nanos,
                "{span:#?}"
            );
        }
        let attempt = children.iter().find(|s| s.kind == 3).unwrap_or_else(|| panic!("{protocol}: no upstream span"));
        assert_eq!(attempt.span_id, parts[2], "{protocol}: the upstream's parent is the attempt's span");
        assert_eq!(attribute(attempt, "http.response.status_code"), json!(200), "{attempt:#?}");
        // The stream's server span lasts until its last event.
        let stream = spans.iter().find(|s| s.trace_id == "b".repeat(32) && s.kind == 2).unwrap();
        assert_eq!(attribute(stream, "sluice.streamed"), json!(true), "{stream:#?}");
        let stream_ms = (stream.end_unix_nanos - stream.start_unix_nanos) as f64 / 1e6;
        let first_token_ms = attribute(stream, "sluice.time_to_first_token_ms").as_f64().expect("time to first token");
        assert!(first_token_ms < stream_ms, "{first_token_ms} ms to the first token, {stream_ms} ms in all");
        assert!(spans.iter().all(|s| s.trace_id != "a".repeat(32)), "{protocol}: an unsampled trace was exported");
        // The access log links to the trace.
        sluice_tests::eventually("the access line", Duration::from_secs(5), async || {
            gateway.log().lines().find(|l| l.contains("request_id=\"traced\"") && l.contains(CLIENT_TRACE)).map(|_| ())
        })
        .await;
    }
}
