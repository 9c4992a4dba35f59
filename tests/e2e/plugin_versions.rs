//! Plugins built against `sluice:plugin@0.2.0` (kept byte for byte in
//! tests/fixtures/plugins-v0.2) and against 0.3.0 (plugins/dist) serve in
//! one chain: each sees the edits of the ones before it, whichever version
//! made them, and both can mark the response.

use std::path::Path;

use serde_json::{Value, json};
use sluice_tests::{ConfigDir, Echo, Gateway, Plugin, Route, documents};

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/plugins-v0.2").join(format!("{name}.wasm"))
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
