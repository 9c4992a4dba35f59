//! response-cache (plugins/response-cache) through the real gateway: a
//! repeated request answered without a call upstream, as JSON and as a
//! stream the official OpenAI Python SDK reads, and never another
//! consumer's answer.

use std::time::Duration;

use serde_json::{Value, json};
use sluice_tests::{ConfigDir, Echo, Gateway, Plugin, Reply, Route, documents, run_sdk_script};

const KEY_A: &str = "sk-a-0123456789abcdef";
const KEY_B: &str = "sk-b-0123456789abcdef";

fn sha256_hex(text: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

async fn gateway() -> (Echo, ConfigDir, Gateway) {
    let echo = Echo::start().await;
    let keys = json!([{"consumer": "a", "sha256": sha256_hex(KEY_A)}, {"consumer": "b", "sha256": sha256_hex(KEY_B)}]);
    let plugins = [
        Plugin::new("auth", "auth").auth_phase().config(json!({"apiKeys": keys})),
        Plugin::new("cache", "response-cache").config(json!({"ttlSeconds": 60})).state(json!({})).fail_open(),
    ];
    let dir = ConfigDir::new();
    dir.write("plugins.yaml", &documents(&plugins.iter().map(Plugin::yaml).collect::<Vec<_>>()));
    dir.write("route.yaml", &Route::new("chat", &["gpt-4o-mini"], &echo.url()).plugins(&["auth", "cache"]).yaml());
    let gateway = Gateway::start(&dir).await;
    assert_eq!(gateway.admin_config().await["errors"], json!([]));
    (echo, dir, gateway)
}

async fn chat(gateway: &Gateway, key: &str, body: &Value, extra: &[(&str, &str)]) -> Reply {
    let auth = format!("Bearer {key}");
    let mut headers = vec![("authorization", auth.as_str())];
    headers.extend_from_slice(extra);
    gateway.post("/v1/chat/completions", body.to_string(), &headers).await
}

fn question(text: &str) -> Value {
    json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}], "temperature": 0})
}

async fn upstream_requests(echo: &Echo) -> u64 {
    echo.script().requests()
}

#[tokio::test]
async fn a_repeated_request_is_answered_from_the_cache_and_only_for_its_consumer() {
    let (echo, _dir, gateway) = gateway().await;
    let first = chat(&gateway, KEY_A, &question("what is 2+2?"), &[]).await;
    assert_eq!((first.status.as_u16(), first.header("x-sluice-cache")), (200, Some("miss")), "{}", first.text());
    let before = upstream_requests(&echo).await;
    let second = chat(&gateway, KEY_A, &question("what is 2+2?"), &[]).await;
    assert_eq!(second.header("x-sluice-cache"), Some("hit"));
    assert_eq!(second.json(), first.json(), "the first answer, as it was");
    assert_eq!(upstream_requests(&echo).await, before, "a hit calls no upstream");
    // Another consumer asking the same gets its own answer.
    let other = chat(&gateway, KEY_B, &question("what is 2+2?"), &[]).await;
    assert_eq!(other.header("x-sluice-cache"), Some("miss"));
    assert_eq!(upstream_requests(&echo).await, before + 1);
    // `no-store` skips it.
    let skipped = chat(&gateway, KEY_A, &question("what is 2+2?"), &[("cache-control", "no-store")]).await;
    assert_eq!(skipped.header("x-sluice-cache"), Some("bypass"));
}

/// A streamed answer is kept, and replayed as events the OpenAI SDK reads
/// (streamed) or as the JSON completion it makes.
#[tokio::test]
async fn a_streamed_answer_is_replayed_to_the_openai_sdk() {
    let (echo, _dir, gateway) = gateway().await;
    let script = r#"
import sys, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0)
def ask(stream):
    messages = [{"role": "user", "content": "tell me a story"}]
    if not stream:
        r = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=messages, temperature=0)
        return r.headers["x-sluice-cache"], r.parse().choices[0].message.content
    r = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=messages, temperature=0,
        stream=True, stream_options={"include_usage": True})
    text, usage = "", None
    for chunk in r.parse():
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage:
            usage = chunk.usage
    assert usage is not None and usage.total_tokens > 0
    return r.headers["x-sluice-cache"], text
first = ask(True)
assert first[0] == "miss", first
print("ok miss")
again = ask(True)
assert again == ("hit", first[1]), (again, first)
print("ok stream_hit")
whole = ask(False)
assert whole == ("hit", first[1]), (whole, first)
print("ok json_hit")
"#;
    let base = gateway.url("/v1");
    run_sdk_script(script, &[&base, KEY_A], &[], &["miss", "stream_hit", "json_hit"], Duration::from_secs(60)).await;
    assert_eq!(upstream_requests(&echo).await, 1, "only the first went upstream");
}
