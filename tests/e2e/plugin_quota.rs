//! token-quota (plugins/token-quota) through the real gateway: behind the
//! auth plugin, on the gateway's state store, read by the official OpenAI
//! Python SDK.

use std::time::Duration;

use serde_json::{Value, json};
use sluice_tests::{ConfigDir, Echo, Gateway, Options, Plugin, Reply, Route, Step, documents, run_sdk_script};

/// The auth plugin's keys: `sk-a-…` names consumer `a`, `sk-b-…` names `b`.
const KEY_A: &str = "sk-a-0123456789abcdef";
const KEY_B: &str = "sk-b-0123456789abcdef";

fn sha256_hex(text: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// A gateway serving `gpt-4o-mini` through auth and token-quota with `rules`.
async fn gateway(rules: Value) -> (Echo, ConfigDir, Gateway) {
    gateway_with(rules, Options::default()).await
}

async fn gateway_with(rules: Value, options: Options) -> (Echo, ConfigDir, Gateway) {
    let echo = Echo::start().await;
    let keys = json!([{"consumer": "a", "sha256": sha256_hex(KEY_A)}, {"consumer": "b", "sha256": sha256_hex(KEY_B)}]);
    let plugins = [
        Plugin::new("auth", "auth").auth_phase().config(json!({"apiKeys": keys})),
        Plugin::new("quota", "token-quota").config(json!({"rules": rules})).state(json!({})).timeout_ms(2000),
    ];
    let dir = ConfigDir::new();
    dir.write("plugins.yaml", &documents(&plugins.iter().map(Plugin::yaml).collect::<Vec<_>>()));
    dir.write("route.yaml", &Route::new("chat", &["gpt-4o-mini"], &echo.url()).plugins(&["auth", "quota"]).yaml());
    let gateway = Gateway::start_with(&dir, options).await;
    let admin = gateway.admin_config().await;
    assert_eq!(admin["errors"], json!([]), "{admin}");
    (echo, dir, gateway)
}

async fn chat(gateway: &Gateway, key: &str, body: Value) -> Reply {
    let mut body = body;
    body["model"] = "gpt-4o-mini".into();
    gateway.post("/v1/chat/completions", body.to_string(), &[("authorization", &format!("Bearer {key}"))]).await
}

fn hello() -> Value {
    json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 50})
}

/// Many requests at once against one consumer's limit: exactly the limit is
/// admitted (the reserve is atomic), the rest get OpenAI's 429 with
/// `retry-after` and `x-ratelimit-*`, and another consumer's counter is its
/// own.
#[tokio::test]
async fn concurrent_requests_never_pass_a_limit_and_refusals_are_openais_429() {
    let rules =
        json!([{"name": "rpm", "per": ["consumer"], "counts": "requests", "limit": 10, "window": {"fixed": 3600}}]);
    let (_echo, _dir, gateway) = gateway(rules).await;
    let replies = futures_util::future::join_all((0..30).map(|_| chat(&gateway, KEY_A, hello()))).await;
    let admitted = replies.iter().filter(|r| r.status == 200).count();
    let refused: Vec<&Reply> = replies.iter().filter(|r| r.status == 429).collect();
    assert_eq!((admitted, refused.len()), (10, 20), "{:?}", replies.iter().map(|r| r.status).collect::<Vec<_>>());
    let refusal = refused[0];
    let error = &refusal.json()["error"];
    assert_eq!((error["code"].as_str(), error["type"].as_str()), (Some("rate_limit_exceeded"), Some("requests")));
    let retry_after: u64 = refusal.header("retry-after").and_then(|v| v.parse().ok()).unwrap_or(0);
    assert!((1..=3600).contains(&retry_after), "retry-after: {retry_after}");
    assert_eq!(refusal.header("x-ratelimit-limit-requests"), Some("10"));
    assert_eq!(refusal.header("x-ratelimit-remaining-requests"), Some("0"));
    let other = chat(&gateway, KEY_B, hello()).await;
    assert_eq!(other.status, 200, "{}", other.text());
    assert_eq!(other.header("x-ratelimit-remaining-requests"), Some("9"));
}

/// A streamed request reserves its estimate and commits the usage the
/// upstream reported in the stream's last event: the next request sees the
/// real count, not the estimate.
#[tokio::test]
async fn a_stream_commits_the_usage_it_reported() {
    let rules = json!([{"name": "daily", "per": ["consumer"], "counts": "tokens", "limit": 100000,
        "window": {"fixed": 86400}}]);
    let (_echo, _dir, gateway) = gateway(rules).await;
    let mut body = hello();
    body["max_tokens"] = 5000.into();
    body["stream"] = true.into();
    body["stream_options"] = json!({"include_usage": true});
    let streamed = chat(&gateway, KEY_A, body).await;
    assert_eq!(streamed.status, 200, "{}", streamed.text());
    let estimate_left: u64 = streamed.header("x-ratelimit-remaining-tokens").unwrap().parse().unwrap();
    assert!(estimate_left <= 100000 - 5000, "the estimate holds the output asked for: {estimate_left}");
    let text = streamed.text();
    let usage = text
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .find_map(|event| event["usage"]["total_tokens"].as_u64())
        .unwrap_or_else(|| panic!("no usage in the stream: {text}"));
    // The commit lands when the stream has ended, just after its last byte.
    let next = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1});
    // Its own estimate: its body's bytes, 4 + 3 of chat format, 1 of output.
    let mut sent = next.clone();
    sent["model"] = "gpt-4o-mini".into();
    let next_estimate = sent.to_string().len() as u64 + 7 + 1;
    let left = sluice_tests::eventually("the stream's commit", Duration::from_secs(5), async || {
        let reply = chat(&gateway, KEY_A, next.clone()).await;
        let left: u64 = reply.header("x-ratelimit-remaining-tokens")?.parse().ok()?;
        (left == 100000 - usage - next_estimate).then_some(left)
    })
    .await;
    assert!(left > estimate_left, "the estimate was given back: {left} against {estimate_left}");
}

/// Without an output cap token-quota leaves its reservation to the gateway,
/// which settles it by the response's usage: the plugin's instance ends with
/// the request hook, so a gateway allowed one plugin instance in all serves
/// a second request while the first waits on its upstream (an instance held
/// for the response would refuse it as overloaded); and a request the
/// upstream refuses counts as a request but none of its estimated tokens.
#[tokio::test]
async fn the_gateway_settles_the_reservation_without_holding_the_plugin() {
    let rules = json!([
        {"name": "rpm", "per": ["consumer"], "counts": "requests", "limit": 100, "window": {"fixed": 3600}},
        {"name": "daily", "per": ["consumer"], "counts": "tokens", "limit": 100000, "window": {"fixed": 86400}},
    ]);
    let options = Options { args: vec!["--max-plugin-instances".into(), "1".into()], ..Options::default() };
    let (echo, _dir, gateway) = gateway_with(rules, options).await;
    // Snapshots first: making one takes the one instance slot too. Served
    // as consumer `b`, whose counters the test does not read.
    sluice_tests::eventually("both plugins' snapshots", Duration::from_secs(60), async || {
        let _ = chat(&gateway, KEY_B, hello()).await;
        let admin = gateway.admin_config().await;
        let starts: Vec<&Value> = admin["plugins"].as_array()?.iter().map(|p| &p["instancesStartFrom"]).collect();
        starts.iter().all(|start| *start == "snapshot").then_some(())
    })
    .await;
    echo.script().push(Step::Delay(Duration::from_millis(1500)), 1);
    let (slow, quick) = tokio::join!(chat(&gateway, KEY_A, hello()), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        chat(&gateway, KEY_A, hello()).await
    });
    assert_eq!(quick.status, 200, "served while the first waited: {}", quick.text());
    assert_eq!(slow.status, 200, "{}", slow.text());

    let remaining = |reply: &Reply, kind: &str| -> u64 {
        reply.header(&format!("x-ratelimit-remaining-{kind}")).and_then(|v| v.parse().ok()).unwrap()
    };
    let used = |reply: &Reply| reply.json()["usage"]["total_tokens"].as_u64().unwrap();
    // Settled when each response ended, just after its last byte.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = chat(&gateway, KEY_A, hello()).await;
    assert_eq!(before.status, 200, "{}", before.text());
    tokio::time::sleep(Duration::from_secs(1)).await;
    echo.script().push(Step::status(400), 1);
    let refused = chat(&gateway, KEY_A, hello()).await;
    assert_eq!(refused.status, 400, "{}", refused.text());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = chat(&gateway, KEY_A, hello()).await;
    // The same body, so the same estimate: between the two, only `before`'s
    // real usage was added to the tokens, and two requests.
    assert_eq!(remaining(&after, "tokens"), remaining(&before, "tokens") - used(&before));
    assert_eq!(remaining(&after, "requests"), remaining(&before, "requests") - 2);
    assert_eq!(remaining(&before, "requests"), 100 - 3);
}

/// The official OpenAI Python SDK reads the refusal as its own
/// `RateLimitError`, with the headers it uses to wait.
#[tokio::test]
async fn the_openai_sdk_reads_the_refusal_as_a_rate_limit_error() {
    let rules =
        json!([{"name": "rpm", "per": ["consumer"], "counts": "requests", "limit": 1, "window": {"fixed": 3600}}]);
    let (_echo, _dir, gateway) = gateway(rules).await;
    let script = r#"
import sys, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0)
client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
print("ok admitted")
try:
    client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
except openai.RateLimitError as e:
    assert e.status_code == 429, e.status_code
    assert e.code == "rate_limit_exceeded", e.code
    assert int(e.response.headers["retry-after"]) >= 1
    assert e.response.headers["x-ratelimit-remaining-requests"] == "0"
    print("ok rate_limit_error")
"#;
    let base = gateway.url("/v1");
    run_sdk_script(script, &[&base, KEY_A], &[], &["admitted", "rate_limit_error"], Duration::from_secs(60)).await;
}
