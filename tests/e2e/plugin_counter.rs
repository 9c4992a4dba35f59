//! The Python per-consumer counter (plugins/examples/python-counter, built
//! into plugins/dist/example-python-counter.wasm) through the real gateway:
//! `sluice:plugin/state` from Python behind the auth plugin, the grant it
//! needs, its config checks, and its store failures under the failure
//! policy. One gateway for every case: a Python component takes seconds to
//! compile, and the copies beside the first reuse its compiled module.

use std::time::Duration;

use crate::plugin_support::served;
use serde_json::{Value, json};
use sluice_tests::{ConfigDir, Echo, Gateway, Plugin, Reply, Route, documents, plugin_wasm};

/// How long compiling the component may take on a busy 2-core machine.
const COMPILE: Duration = Duration::from_secs(240);
/// A reload that compiles nothing.
const RELOAD: Duration = Duration::from_secs(60);
/// Each plugin call's deadline: instantiating Python is milliseconds, more
/// on a machine busy compiling.
const DEADLINE_MS: u32 = 5000;
/// The auth plugin's keys: consumers `a` and `b`.
const KEY_A: &str = "sk-counter-a-0123456789";
const KEY_B: &str = "sk-counter-b-0123456789";
/// The day: a window this test will not straddle but by a rare chance.
const WINDOW_SECS: u64 = 86_400;

fn sha256_hex(text: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

fn counter(name: &str, config: Value) -> Plugin {
    Plugin::at(name, plugin_wasm("example-python-counter")).config(config).timeout_ms(DEADLINE_MS)
}

async fn chat(gateway: &Gateway, model: &str, key: Option<&str>) -> Reply {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "hello"}]});
    let bearer = key.map(|key| format!("Bearer {key}"));
    let headers: Vec<(&str, &str)> = bearer.iter().map(|b| ("authorization", b.as_str())).collect();
    gateway.post("/v1/chat/completions", body.to_string(), &headers).await
}

#[tokio::test]
async fn python_counts_each_consumers_requests_in_shared_state() {
    let echo = Echo::start().await;
    let keys = json!([{"consumer": "a", "sha256": sha256_hex(KEY_A)}, {"consumer": "b", "sha256": sha256_hex(KEY_B)}]);
    let auth = Plugin::new("auth", "auth").auth_phase().config(json!({"apiKeys": keys})).yaml();
    let good = json!({"limit": 3, "window": {"fixed": WINDOW_SECS}});
    let granted = counter("counter", good.clone()).state(json!({})).yaml();
    let route = |name: &str, plugins: &[&str]| Route::new(name, &[name], &echo.url()).plugins(plugins).yaml();

    // A plain route first, then the counter alone: compiling it takes longer
    // than the harness waits for readiness. The copies loaded next reuse it.
    let dir = ConfigDir::new();
    dir.write("plain.yaml", &Route::new("plain", &["plain"], &echo.url()).yaml());
    let gateway = Gateway::start(&dir).await;
    dir.write("plugins.yaml", &documents(&[auth.clone(), granted.clone()]));
    dir.write("routes.yaml", &route("counted", &["auth", "counter"]));
    served(&gateway, &["default/counted", "default/plain"], COMPILE).await;

    let plugins = [
        auth,
        granted,
        // The same component: without the grant, without a limit, with a
        // zero-second window, and with room for one counter only.
        counter("ungranted", good.clone()).yaml(),
        counter("no-limit", json!({"window": {"fixed": 60}})).state(json!({})).yaml(),
        counter("bad-window", json!({"limit": 3, "window": {"fixed": 0}})).state(json!({})).yaml(),
        counter("one-key", good.clone()).state(json!({"maxKeys": 1})).yaml(),
        counter("one-key-open", good).state(json!({"maxKeys": 1})).fail_open().yaml(),
    ];
    let routes = [
        route("counted", &["auth", "counter"]),
        route("anonymous", &["counter"]),
        route("ungranted", &["auth", "ungranted"]),
        route("no-limit", &["auth", "no-limit"]),
        route("bad-window", &["auth", "bad-window"]),
        route("one-key", &["auth", "one-key"]),
        route("one-key-open", &["auth", "one-key-open"]),
    ];
    dir.write("plugins.yaml", &documents(&plugins));
    dir.write("routes.yaml", &documents(&routes));
    let expected = ["default/anonymous", "default/counted", "default/one-key", "default/one-key-open", "default/plain"];
    let admin = served(&gateway, &expected, RELOAD).await;

    counts_per_consumer_and_refuses_past_the_limit(&gateway, &echo).await;
    passes_requests_without_a_consumer(&gateway).await;
    refuses_loading_without_a_grant_or_with_a_bad_config(&gateway, &admin).await;
    store_failures_get_the_failure_policy(&gateway).await;
}

/// Each consumer has a counter of its own; past the limit the plugin answers
/// OpenAI's 429 with `retry-after`, and the upstream never sees the request.
async fn counts_per_consumer_and_refuses_past_the_limit(gateway: &Gateway, echo: &Echo) {
    for (used, remaining) in [("1", "2"), ("2", "1"), ("3", "0")] {
        let reply = chat(gateway, "counted", Some(KEY_A)).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.header("x-consumer-requests"), Some(used), "a's count");
        assert_eq!(reply.header("x-consumer-requests-remaining"), Some(remaining), "a's remaining");
    }
    let b = chat(gateway, "counted", Some(KEY_B)).await;
    assert_eq!((b.status.as_u16(), b.header("x-consumer-requests")), (200, Some("1")), "b's own count: {}", b.text());

    let upstream_before = echo.script().requests();
    let refused = chat(gateway, "counted", Some(KEY_A)).await;
    let error = refused.assert_error(429, "rate_limit_exceeded");
    assert_eq!((&error["type"], &error["param"]), (&json!("requests"), &Value::Null), "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("Rate limit reached for requests") && message.contains("limit 3"), "{message}");
    assert_eq!(refused.header("content-type"), Some("application/json"));
    assert_eq!(refused.header("x-consumer-requests-remaining"), Some("0"));
    let retry_after: u64 = refused.header("retry-after").and_then(|v| v.parse().ok()).unwrap_or(0);
    assert!((1..=WINDOW_SECS).contains(&retry_after), "retry-after: {retry_after}");
    assert_eq!(echo.script().requests(), upstream_before, "the refused request reached the upstream");

    let b = chat(gateway, "counted", Some(KEY_B)).await;
    assert_eq!((b.status.as_u16(), b.header("x-consumer-requests")), (200, Some("2")), "b still served: {}", b.text());
    assert_eq!(echo.script().requests(), upstream_before + 1);
}

/// A route without an auth phase names no consumer: nothing is counted.
async fn passes_requests_without_a_consumer(gateway: &Gateway) {
    for _ in 0..4 {
        let reply = chat(gateway, "anonymous", None).await;
        assert_eq!(reply.echoed()["model"], "anonymous");
        assert_eq!(reply.header("x-consumer-requests"), None);
        assert_eq!(reply.header("x-consumer-requests-remaining"), None);
    }
}

/// The copy without `spec.state` is refused when it loads, and the bad
/// configs with the plugin's own messages; none of their routes serve.
async fn refuses_loading_without_a_grant_or_with_a_bad_config(gateway: &Gateway, admin: &Value) {
    let errors = admin["errors"].as_array().unwrap_or_else(|| panic!("no errors list: {admin}"));
    let about = |resource: &str| -> String {
        let found: Vec<String> = errors
            .iter()
            .filter(|e| e["resource"].as_str().is_some_and(|r| r.contains(resource)))
            .map(Value::to_string)
            .collect();
        assert_eq!(found.len(), 1, "one error about {resource}: {admin}");
        found.concat()
    };
    let ungranted = about("GatewayPlugin default/ungranted");
    assert!(ungranted.contains("sluice:plugin/state") && ungranted.contains("spec.state"), "{ungranted}");
    let no_limit = about("GatewayPlugin default/no-limit");
    assert!(no_limit.contains(r#"counter: the config needs \"limit\""#), "{no_limit}");
    let bad_window = about("GatewayPlugin default/bad-window");
    assert!(bad_window.contains(r#"counter: \"window\" must be"#), "{bad_window}");
    for route in ["ungranted", "no-limit", "bad-window"] {
        about(&format!("AIModelRoute default/{route}"));
        chat(gateway, route, Some(KEY_A)).await.assert_error(404, "model_not_found");
    }
    assert_eq!(errors.len(), 6, "only the three refused plugins and their routes: {admin}");
}

/// Past a cap of the grant the store refuses, and the plugin fails rather
/// than serve uncounted: `Closed` refuses the request, `Open` lets it through
/// without a count. Consumer `a` takes the one key each grant allows.
async fn store_failures_get_the_failure_policy(gateway: &Gateway) {
    for model in ["one-key", "one-key-open"] {
        let first = chat(gateway, model, Some(KEY_A)).await;
        assert_eq!((first.status.as_u16(), first.header("x-consumer-requests")), (200, Some("1")), "{model}");
    }
    chat(gateway, "one-key", Some(KEY_B)).await.assert_error(500, "plugin_failed");
    let open = chat(gateway, "one-key-open", Some(KEY_B)).await;
    assert_eq!(open.echoed()["model"], "one-key-open");
    assert_eq!(open.header("x-consumer-requests"), None, "served uncounted");
    assert!(gateway.wait_for_log("counter: the state store failed: refused:").await, "{}", gateway.log());
}
