//! Plugins built against `sluice:plugin@0.2.0`, `0.3.0` and `0.3.1` (kept
//! byte for byte in tests/fixtures/plugins-v<version>) and against the
//! current version (plugins/dist) serve in one chain: each sees the edits of
//! the ones before it, whichever version made them, and each can mark the
//! response.

use std::path::Path;

use serde_json::{Value, json};
use sluice_tests::{ConfigDir, Echo, Gateway, Plugin, Route, documents};

fn fixture(name: &str) -> std::path::PathBuf {
    fixture_of("0.2", name)
}

fn fixture_of(version: &str, name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/plugins-v{version}")).join(format!("{name}.wasm"))
}

fn decorator(prepend: &str, append: &str) -> Value {
    json!({"prepend": [{"role": "system", "content": prepend}], "append": [{"role": "user", "content": append}]})
}

#[tokio::test]
async fn plugins_of_both_versions_share_one_chain() {
    let echo = Echo::start().await;
    let plugins = [
        Plugin::new("new-decorator", "prompt-decorator").config(decorator("new first", "new last")),
        Plugin::at("old-decorator", fixture("prompt-decorator")).config(decorator("old first", "old last")),
        Plugin::at("old-header", fixture("add-header")).config(json!({"header": "x-old", "value": "0.2",
            "responseHeader": {"name": "x-marked-by-old", "value": "0.2"}})),
        Plugin::new("new-header", "add-header").config(json!({"header": "x-new", "value": "0.3",
            "setBody": {"temperature": 0.25}, "responseHeader": {"name": "x-marked-by-new", "value": "0.3"}})),
        Plugin::new("trim", "context-trim").config(json!({"models": [{"model": "*", "maxInputTokens": 100000}]})),
    ];
    let names: Vec<&str> = plugins.iter().map(Plugin::name).collect();
    let dir = ConfigDir::new();
    dir.write("plugins.yaml", &documents(&plugins.iter().map(Plugin::yaml).collect::<Vec<_>>()));
    dir.write("route.yaml", &Route::new("chat", &["gpt-test"], &echo.url()).plugins(&names).yaml());
    let gateway = Gateway::start(&dir).await;

    let admin = gateway.admin_config().await;
    assert_eq!(admin["routes"][0]["plugins"].as_array().map(Vec::len), Some(5), "all five load: {admin}");

    let body = json!({"model": "gpt-test", "messages": [{"role": "user", "content": "hello", "name": "ann"}],
        "user": "u-1"});
    let reply = gateway.post("/v1/chat/completions", body.to_string(), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let echoed = reply.echoed();
    let roles_and_text: Vec<(String, String)> = echoed["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["role"].as_str().unwrap().to_string(), m["content"].as_str().unwrap().to_string()))
        .collect();
    let expected = [
        ("system", "old first"),
        ("system", "new first"),
        ("user", "hello"),
        ("user", "new last"),
        ("user", "old last"),
    ];
    assert_eq!(roles_and_text, expected.map(|(r, t)| (r.to_string(), t.to_string())), "{echoed}");
    assert_eq!(echoed["messages"][2]["name"], "ann", "an untouched message keeps its members: {echoed}");
    assert_eq!(echoed["body"]["temperature"], 0.25, "{echoed}");
    assert_eq!(echoed["body"]["user"], "u-1", "{echoed}");
    assert_eq!(echoed["headers"]["x-old"], "0.2");
    assert_eq!(echoed["headers"]["x-new"], "0.3");
    assert_eq!(reply.header("x-marked-by-old"), Some("0.2"));
    assert_eq!(reply.header("x-marked-by-new"), Some("0.3"));
}

/// Components built for 0.3.0, before `state` and `request.consumer`
/// existed, load and serve unchanged in one chain with a 0.3.1 plugin that
/// uses both: the 0.3.0 auth plugin names the consumer, the 0.3.1 plugin
/// reads it and keeps state, and the 0.3.0 decorator and header plugins edit
/// the request as before.
#[tokio::test]
async fn plugins_built_for_0_3_0_serve_beside_0_3_1_ones() {
    let echo = Echo::start().await;
    // The auth plugin's bench key, `sk-bench-0123456789abcdef`.
    let key_sha256 = "4544960adbf893386971435af98a39b6f3a29f78107fbe68a787ab2467ba27d9";
    let plugins = [
        Plugin::at("old-auth", fixture_of("0.3.0", "auth"))
            .auth_phase()
            .config(json!({"apiKeys": [{"consumer": "team-a", "sha256": key_sha256}]})),
        Plugin::at("old-decorator", fixture_of("0.3.0", "prompt-decorator")).config(decorator("old first", "old last")),
        Plugin::at("old-header", fixture_of("0.3.0", "add-header")).config(json!({"header": "x-old", "value": "0.3.0",
            "responseHeader": {"name": "x-marked-by-old", "value": "0.3.0"}})),
        Plugin::new("stateful", "stateful").config(json!({"limit": 5, "window": "fixed:3600"})).state(json!({})),
    ];
    let names: Vec<&str> = plugins.iter().map(Plugin::name).collect();
    let dir = ConfigDir::new();
    dir.write("plugins.yaml", &documents(&plugins.iter().map(Plugin::yaml).collect::<Vec<_>>()));
    dir.write("route.yaml", &Route::new("chat", &["gpt-test"], &echo.url()).plugins(&names).yaml());
    let gateway = Gateway::start(&dir).await;

    let admin = gateway.admin_config().await;
    assert_eq!(admin["errors"], json!([]), "{admin}");
    assert_eq!(admin["routes"][0]["plugins"].as_array().map(Vec::len), Some(4), "all four load: {admin}");

    let body = json!({"model": "gpt-test", "messages": [{"role": "user", "content": "hello"}]});
    let headers = [("x-api-key", "sk-bench-0123456789abcdef"), ("x-state-reserve", "requests=2")];
    let reply = gateway.post("/v1/chat/completions", body.to_string(), &headers).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        reply.header("x-state-consumer"),
        Some("key:team-a"),
        "the 0.3.1 plugin reads the 0.3.0 auth's consumer"
    );
    assert_eq!(reply.header("x-state-remaining"), Some("3"));
    assert_eq!(reply.header("x-marked-by-old"), Some("0.3.0"));
    let echoed = reply.echoed();
    assert_eq!(echoed["headers"]["x-old"], "0.3.0", "{echoed}");
    let contents: Vec<&str> =
        echoed["messages"].as_array().unwrap().iter().map(|m| m["content"].as_str().unwrap()).collect();
    assert_eq!(contents, ["old first", "hello", "old last"], "{echoed}");

    // Without the key, the 0.3.0 auth plugin refuses before state is spent.
    let refused = gateway.post("/v1/chat/completions", body.to_string(), &headers[1..]).await;
    assert_eq!(refused.status, 401, "{}", refused.text());
    let again = gateway.post("/v1/chat/completions", body.to_string(), &headers).await;
    assert_eq!(again.header("x-state-remaining"), Some("1"), "{}", again.text());
}

/// Components built for 0.3.1 (tests/fixtures/plugins-v0.3.1): add-header,
/// the stateful test plugin and token-quota, which hands its reservation to
/// the gateway (`settle-at-end`), serve unchanged beside a 0.3.2 plugin that
/// routes the request (`set-model`) and imports outbound HTTP.
#[tokio::test]
async fn plugins_built_for_0_3_1_serve_beside_0_3_2_ones() {
    let echo = Echo::start().await;
    let quota =
        json!({"rules": [{"name": "tokens", "counts": "tokens", "limit": 1000000, "window": {"fixed": 86400}}]});
    let plugins = [
        Plugin::at("old-header", fixture_of("0.3.1", "add-header")).config(json!({"header": "x-old", "value": "0.3.1",
            "responseHeader": {"name": "x-marked-by-old", "value": "0.3.1"}})),
        Plugin::at("old-stateful", fixture_of("0.3.1", "stateful"))
            .config(json!({"limit": 5, "window": "fixed:3600"}))
            .state(json!({})),
        Plugin::at("old-quota", fixture_of("0.3.1", "token-quota")).config(quota).state(json!({})).timeout_ms(1000),
        Plugin::new("router", "caller").egress(json!({"destinations": [{"url": "http://127.0.0.1:9"}]})),
    ];
    let names: Vec<&str> = plugins.iter().map(Plugin::name).collect();
    let dir = ConfigDir::new();
    dir.write("plugins.yaml", &documents(&plugins.iter().map(Plugin::yaml).collect::<Vec<_>>()));
    dir.write("route.yaml", &Route::new("chat", &["gpt-test", "gpt-alt"], &echo.url()).plugins(&names).yaml());
    let gateway = Gateway::start(&dir).await;

    let admin = gateway.admin_config().await;
    assert_eq!(admin["errors"], json!([]), "{admin}");
    assert_eq!(admin["routes"][0]["plugins"].as_array().map(Vec::len), Some(4), "all four load: {admin}");

    let body = json!({"model": "gpt-test", "messages": [{"role": "user", "content": "hello"}]});
    let headers = [("x-state-reserve", "requests=2"), ("x-route-model", "gpt-alt")];
    let reply = gateway.post("/v1/chat/completions", body.to_string(), &headers).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.header("x-state-remaining"), Some("3"), "the 0.3.1 stateful plugin counts");
    assert_eq!(reply.header("x-marked-by-old"), Some("0.3.1"));
    assert!(reply.header("x-ratelimit-remaining-tokens").is_some(), "the 0.3.1 quota answers");
    let echoed = reply.echoed();
    assert_eq!((&echoed["headers"]["x-old"], &echoed["model"]), (&json!("0.3.1"), &json!("gpt-alt")), "{echoed}");
}
