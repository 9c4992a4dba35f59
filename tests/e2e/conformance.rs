//! The same plugin in every guest language behaves the same through the real
//! gateway: decorator-lite from plugins/examples/{rust,c,python,js}, built by
//! `cargo xtask plugins` into plugins/dist/example-<language>.wasm.
//!
//! Each language gets one gateway, serving the plugin with a good config per
//! request and reused, and with a config its `configure` must reject. The C
//! example as built against `sluice:plugin@0.2.0` and `0.3.0` (kept byte
//! for byte in tests/fixtures/plugins-v0.2 and plugins-v0.3.0) must behave
//! the same: components built for earlier versions keep loading unchanged.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use sluice_tests::{ConfigDir, Echo, Gateway, Plugin, Route, chat_body, documents, eventually, plugin_wasm};

/// How long compiling a component may take: Python and JavaScript take
/// seconds alone, and the four languages' tests run side by side.
const COMPILE: Duration = Duration::from_secs(240);
/// Each plugin call's deadline.
const DEADLINE_MS: u32 = 5000;
/// How long a reload that compiles nothing may take.
const RELOAD: Duration = Duration::from_secs(20);

/// Quotes, a backslash and non-ASCII text: each language must carry it into
/// the body as the same JSON string.
const SYSTEM: &str = "Answer in one line. Say \"sluice\" \\ never \u{201c}maybe\u{201d} \u{2014} ünïcödé ✓ 😀";

#[tokio::test]
async fn rust() {
    conforms(plugin_wasm("example-rust"), "rust").await;
}

#[tokio::test]
async fn c() {
    conforms(plugin_wasm("example-c"), "c").await;
}

#[tokio::test]
async fn python() {
    conforms(plugin_wasm("example-python"), "python").await;
}

#[tokio::test]
async fn javascript() {
    conforms(plugin_wasm("example-js"), "javascript").await;
}

#[tokio::test]
async fn c_built_for_0_2() {
    let wasm = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/plugins-v0.2/example-c.wasm");
    conforms(wasm, "c").await;
}

#[tokio::test]
async fn c_built_for_0_3_0() {
    let wasm = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/plugins-v0.3.0/example-c.wasm");
    conforms(wasm, "c").await;
}

/// Runs every case against the component at `wasm`, which must mark
/// responses with `x-decorated-by: marker`.
async fn conforms(wasm: PathBuf, marker: &str) {
    let config = json!({"system": SYSTEM, "header": "x-team", "value": "search"});
    // The default 100 ms deadline covers instantiation, which for Python
    // (about 3 ms alone) can take longer on a machine busy compiling.
    let plugin =
        |name: &str, config: Value| Plugin::at(name, wasm.clone()).config(config).timeout_ms(DEADLINE_MS).yaml();
    let per_request = plugin("decorator", config.clone());
    let reused = with_isolation(plugin("decorator-reused", config), "Reused");
    let no_system = plugin("no-system", json!({"header": "x-team", "value": "search"}));
    let echo = Echo::start().await;
    let chat = Route::new("chat", &["gpt-test"], &echo.url()).plugins(&["decorator"]).yaml();
    let chat_reused = Route::new("chat-reused", &["gpt-reused"], &echo.url()).plugins(&["decorator-reused"]).yaml();
    let broken = Route::new("broken", &["broken"], &echo.url()).plugins(&["no-system"]).yaml();

    // Start with a plain route, then load one plugin: a Python or JavaScript component
    // takes seconds to compile (tens of seconds on a busy 2-core machine),
    // more than the harness waits for readiness. The others use the same
    // module, which the gateway then has compiled: loaded together from the
    // start, each would compile it again, side by side.
    let dir = ConfigDir::new();
    dir.write("plain.yaml", &Route::new("plain", &["plain"], &echo.url()).yaml());
    let gateway = Gateway::start(&dir).await;
    dir.write("plugins.yaml", &per_request);
    dir.write("routes.yaml", &chat);
    served(&gateway, &["default/chat", "default/plain"], COMPILE).await;
    dir.write("plugins.yaml", &documents(&[per_request, reused, no_system]));
    dir.write("routes.yaml", &documents(&[chat, chat_reused, broken]));
    served(&gateway, &["default/chat", "default/chat-reused", "default/plain"], RELOAD).await;

    for model in ["gpt-test", "gpt-reused"] {
        // A reused instance serves several requests: each must be decorated
        // once, with nothing carried over from the one before.
        for _ in 0..3 {
            decorates(&gateway, model, marker).await;
        }
        rejects_bodies_without_messages(&gateway, model).await;
    }
    streams(&gateway, marker).await;
    refuses_a_config_without_system(&gateway).await;
}

/// Waits until the gateway serves exactly `routes` (sorted).
async fn served(gateway: &Gateway, routes: &[&str], within: Duration) {
    eventually(&format!("routes {routes:?} to be served"), within, async || {
        let admin = gateway.admin_config().await;
        (route_names(&admin) == routes).then_some(())
    })
    .await;
}

/// The system message is prepended, the header set, the response marked.
async fn decorates(gateway: &Gateway, model: &str, marker: &str) {
    let reply = gateway.chat(model, &[("x-team", "set-by-client")]).await;
    let echoed = reply.echoed();
    assert_eq!(
        echoed["messages"],
        json!([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello"}]),
        "{model}: the upstream got the decorated messages: {echoed}"
    );
    assert_eq!(echoed["headers"]["x-team"], "search", "{model}: the plugin's header replaces the client's: {echoed}");
    assert_eq!(echoed["model"], model);
    assert_eq!(reply.header("x-decorated-by"), Some(marker), "{model}: the response is marked");

    // An empty list gets the system message alone; other fields stay.
    let body = json!({"model": model, "messages": [], "temperature": 0.5, "user": "u-1"});
    let reply = gateway.post("/v1/chat/completions", body.to_string(), &[]).await;
    assert_eq!(reply.echoed()["messages"], json!([{"role": "system", "content": SYSTEM}]), "{model}: empty messages");
}

/// A JSON body without a `messages` array gets the plugin's own 400.
async fn rejects_bodies_without_messages(gateway: &Gateway, model: &str) {
    for body in [
        json!({"model": model}),
        json!({"model": model, "messages": "hello"}),
        json!({"model": model, "messages": {"role": "user", "content": "hello"}}),
    ] {
        let reply = gateway.post("/v1/chat/completions", body.to_string(), &[]).await;
        let error = reply.assert_error(400, "invalid_messages");
        assert_eq!(error["type"], "invalid_request_error", "{body}: {error}");
        assert_eq!(error["param"], Value::Null, "{body}: {error}");
        assert!(error["message"].as_str().unwrap().contains("messages"), "{body}: {error}");
        assert_eq!(reply.header("content-type"), Some("application/json"), "{body}");
    }
}

/// A streamed request is decorated and still streams event by event.
async fn streams(gateway: &Gateway, marker: &str) {
    let mut body = chat_body("gpt-test");
    body["stream"] = true.into();
    let knobs = [("x-echo-chunks", "5"), ("x-echo-chunk-delay-ms", "200")];
    let streamed =
        gateway.client().post_streaming(&gateway.url("/v1/chat/completions"), body.to_string(), &knobs).await;
    assert_eq!(streamed.status, 200);
    assert_eq!(streamed.headers.get("content-type").unwrap(), "text/event-stream");
    assert_eq!(streamed.headers.get("x-decorated-by").unwrap(), marker);

    let events = streamed.events();
    let (first_at, _) = events.first().expect("at least one event");
    let (done_at, done) = events.last().unwrap();
    assert_eq!(done, "[DONE]");
    let spread = *done_at - *first_at;
    assert!(spread >= Duration::from_millis(600), "the first event came only {spread:?} before [DONE]: buffered");

    let content: String = events[..events.len() - 1]
        .iter()
        .map(|(_, data)| serde_json::from_str::<Value>(data).unwrap())
        .filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
        .collect();
    let echoed: Value = serde_json::from_str(&content).unwrap_or_else(|e| panic!("streamed content ({e}): {content}"));
    assert_eq!(echoed["messages"][0], json!({"role": "system", "content": SYSTEM}), "{echoed}");
    assert_eq!(echoed["headers"]["x-team"], "search", "{echoed}");
}

/// `configure` rejects a config without `system`: the plugin is reported,
/// and the route that needs it is not served.
async fn refuses_a_config_without_system(gateway: &Gateway) {
    gateway.chat("broken", &[]).await.assert_error(404, "model_not_found");
    let admin = gateway.admin_config().await;
    let errors = admin["errors"].as_array().unwrap_or_else(|| panic!("no errors list: {admin}"));
    let about = |resource: &str| -> Vec<&Value> {
        errors.iter().filter(|e| e["resource"].as_str().is_some_and(|r| r.contains(resource))).collect()
    };
    let rejected = about("GatewayPlugin default/no-system");
    assert_eq!(rejected.len(), 1, "{admin}");
    let message = rejected[0]["message"].as_str().unwrap();
    assert!(message.contains(r#"decorator-lite: the config needs a string "system""#), "{message}");
    assert_eq!(about("AIModelRoute default/broken").len(), 1, "{admin}");
    assert_eq!(errors.len(), 2, "only the broken plugin and its route have errors: {admin}");
    assert_eq!(route_names(&admin), ["default/chat", "default/chat-reused", "default/plain"], "{admin}");
}

/// The names of the routes /admin/config lists, sorted.
fn route_names(admin: &Value) -> Vec<&str> {
    let routes = admin["routes"].as_array().unwrap_or_else(|| panic!("no routes list: {admin}"));
    let mut names: Vec<&str> = routes.iter().filter_map(|r| r["name"].as_str()).collect();
    names.sort();
    names
}

/// A GatewayPlugin document with `isolation` set. The builder's YAML ends
/// with the spec's fields, so one more line at that indent joins them.
fn with_isolation(yaml: String, isolation: &str) -> String {
    format!("{yaml}  isolation: {isolation}\n")
}
