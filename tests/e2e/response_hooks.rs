//! The response side of the plugin world: per-event `response-chunk` hooks
//! on server-sent events, `response-body` on whole bodies, `response-end`
//! with the upstream's usage, and instance reuse (`isolation: Reused`).
//! The `probe` test plugin makes each of these visible.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_tests::{ConfigDir, Echo, Gateway, Plugin, Route, Streamed, chat_body, eventually};

async fn gateway_with_probe(echo: &Echo, probe: Plugin) -> (ConfigDir, Gateway) {
    let dir = ConfigDir::new();
    dir.write("probe.yaml", &probe.yaml());
    dir.write("route.yaml", &Route::new("chat", &["gpt-test"], &echo.url()).plugins(&["probe"]).yaml());
    let gateway = Gateway::start(&dir).await;
    (dir, gateway)
}

fn stream_body(include_usage: bool) -> String {
    let mut body = chat_body("gpt-test");
    body["stream"] = true.into();
    if include_usage {
        body["stream_options"] = json!({"include_usage": true});
    }
    body.to_string()
}

async fn stream(gateway: &Gateway, body: String, chunks: &str, delay_ms: &str) -> (Instant, Streamed) {
    let url = gateway.url("/v1/chat/completions");
    let knobs = [("x-echo-chunks", chunks), ("x-echo-chunk-delay-ms", delay_ms)];
    let sent = Instant::now();
    (sent, gateway.client().post_streaming(&url, body, &knobs).await)
}

fn content_of(events: &[(Instant, String)]) -> String {
    events
        .iter()
        .filter_map(|(_, data)| serde_json::from_str::<Value>(data).ok())
        .filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .collect()
}

/// The fields of the probe's `response-end` log lines, in order.
fn response_end_lines(gateway: &Gateway) -> Vec<String> {
    gateway.log().lines().filter(|line| line.contains("probe: response ended")).map(str::to_string).collect()
}

async fn next_response_end(gateway: &Gateway, seen: usize) -> String {
    eventually("the probe's response-end log line", Duration::from_secs(10), async || {
        response_end_lines(gateway).get(seen).cloned()
    })
    .await
}

#[tokio::test]
async fn without_a_chunk_hook_the_first_event_is_not_held_back() {
    let echo = Echo::start().await;
    // The probe has response-head and response-end hooks, but no chunk hook.
    let (_dir, gateway) = gateway_with_probe(&echo, Plugin::new("probe", "probe").config(json!({}))).await;

    // The echo sends its first event at once and the next ones 400 ms apart.
    let (sent, streamed) = stream(&gateway, stream_body(true), "4", "400").await;
    assert_eq!(streamed.status, 200);
    let events = streamed.events();
    let (first_at, _) = events.first().expect("at least one event");
    let (done_at, done) = events.last().unwrap();
    assert_eq!(done, "[DONE]");
    let first_after = *first_at - sent;
    assert!(first_after < Duration::from_millis(400), "the first event took {first_after:?}: it waited for the next");
    assert!(*done_at - *first_at >= Duration::from_millis(1000), "the events arrived together: buffered");
    // The upstream's bytes pass through untouched.
    let direct = content_of(&events);
    assert!(direct.contains("gpt-test"), "{direct}");
}

#[tokio::test]
async fn a_chunk_hook_rewrites_each_event_as_it_arrives() {
    let echo = Echo::start().await;
    let probe = Plugin::new("probe", "probe").config(json!({"upper": true}));
    let (_dir, gateway) = gateway_with_probe(&echo, probe).await;

    let (_, streamed) = stream(&gateway, stream_body(false), "4", "300").await;
    assert_eq!(streamed.status, 200);
    assert!(streamed.headers.get("content-length").is_none());
    let events = streamed.events();
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let content = content_of(&events);
    assert!(!content.is_empty());
    assert_eq!(content, content.to_uppercase(), "every content chunk went through the hook: {content}");
    assert!(content.contains("GPT-TEST"), "{content}");
    // Event by event, not the whole body at the end.
    let spread = events.last().unwrap().0 - events.first().unwrap().0;
    assert!(spread >= Duration::from_millis(600), "the rewritten stream arrived all at once ({spread:?})");
}

#[tokio::test]
async fn a_chunk_hook_can_end_the_stream() {
    let echo = Echo::start().await;
    let probe = Plugin::new("probe", "probe").config(json!({"stopAfter": 2}));
    let (_dir, gateway) = gateway_with_probe(&echo, probe).await;

    let (_, streamed) = stream(&gateway, stream_body(false), "6", "50").await;
    let events = streamed.events();
    let content_events = events.iter().filter(|(_, data)| data.contains("\"content\"")).count();
    assert_eq!(content_events, 2, "{events:?}");
    assert_eq!(events.last().unwrap().1, "[DONE]");
    assert_eq!(events.iter().filter(|(_, data)| data == "[DONE]").count(), 1, "{events:?}");
}

#[tokio::test]
async fn a_failing_chunk_hook_follows_its_failure_policy() {
    let echo = Echo::start().await;
    let closed = Plugin::new("probe", "probe").config(json!({"failChunk": true}));
    let (_dir, gateway) = gateway_with_probe(&echo, closed).await;
    let (_, streamed) = stream(&gateway, stream_body(false), "3", "10").await;
    assert_eq!(streamed.status, 200, "the head was already sent");
    let events = streamed.events();
    let last: Value = serde_json::from_str(&events.last().unwrap().1).expect("the last event is an error object");
    assert_eq!(last["error"]["code"], "plugin_failed", "{last}");
    assert_eq!(content_of(&events), "", "nothing passed the failed hook");
    drop(gateway);

    let open = Plugin::new("probe", "probe").config(json!({"failChunk": true})).fail_open();
    let (_dir, gateway) = gateway_with_probe(&echo, open).await;
    let (_, streamed) = stream(&gateway, stream_body(false), "3", "10").await;
    let events = streamed.events();
    assert_eq!(events.last().unwrap().1, "[DONE]");
    assert!(content_of(&events).contains("gpt-test"), "the stream went on without the plugin: {events:?}");
}

#[tokio::test]
async fn response_end_sees_the_usage_of_streams_and_whole_bodies() {
    let echo = Echo::start().await;
    let (_dir, gateway) = gateway_with_probe(&echo, Plugin::new("probe", "probe").config(json!({}))).await;

    // A whole body: the usage is the reply's.
    let reply = gateway.chat("gpt-test", &[]).await;
    assert_eq!(reply.status, 200);
    let usage = &reply.json()["usage"];
    let expected = format!("usage={}/{}/{}", usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]);
    let line = next_response_end(&gateway, 0).await;
    assert!(line.contains(&expected), "expected {expected} in: {line}");
    assert!(line.contains("streamed=false") && line.contains("completed=true"), "{line}");
    assert!(line.contains(&format!("body_bytes={}", reply.body.len())), "{line}");

    // A stream with `include_usage`: the usage of its final chunk.
    let (_, streamed) = stream(&gateway, stream_body(true), "3", "10").await;
    let events = streamed.events();
    let usage_chunk: Value = events
        .iter()
        .filter_map(|(_, data)| serde_json::from_str::<Value>(data).ok())
        .find(|chunk| chunk["usage"].is_object())
        .expect("a usage chunk");
    let usage = &usage_chunk["usage"];
    let expected = format!("usage={}/{}/{}", usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]);
    let line = next_response_end(&gateway, 1).await;
    assert!(line.contains(&expected), "expected {expected} in: {line}");
    assert!(line.contains("streamed=true") && line.contains("completed=true"), "{line}");

    // A stream without usage reports none.
    stream(&gateway, stream_body(false), "2", "10").await;
    let line = next_response_end(&gateway, 2).await;
    assert!(line.contains("usage=none"), "{line}");
}

#[tokio::test]
async fn a_response_body_hook_rewrites_a_whole_body() {
    let echo = Echo::start().await;
    let probe = Plugin::new("probe", "probe").config(json!({"body": true}));
    let (_dir, gateway) = gateway_with_probe(&echo, probe).await;

    let reply = gateway.chat("gpt-test", &[]).await;
    assert_eq!(reply.status, 200);
    let json = reply.json();
    assert_eq!(json["probe"], "seen", "{json}");
    assert_eq!(json["object"], "chat.completion", "the rest of the body is kept: {json}");
}

#[tokio::test]
async fn reused_instances_carry_state_and_a_trap_discards_them() {
    let echo = Echo::start().await;
    let served = async |gateway: &Gateway, headers: &[(&str, &str)]| {
        let reply = gateway.chat("gpt-test", headers).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        reply.header("x-probe-served").expect("the probe's header").to_string()
    };

    // Per request (the default): every request meets the instance as it was
    // made. Once the snapshot is made, that is one instance restored after
    // each request: one idle instance, and still nothing carried over.
    let (_dir, gateway) = gateway_with_probe(&echo, Plugin::new("probe", "probe").config(json!({}))).await;
    for _ in 0..3 {
        assert_eq!(served(&gateway, &[]).await, "1");
    }
    let start_from = async || gateway.admin_config().await["plugins"][0]["instancesStartFrom"].clone();
    sluice_tests::eventually("the snapshot", std::time::Duration::from_secs(30), async || {
        (start_from().await == "snapshot").then_some(())
    })
    .await;
    let idle = async || {
        let metrics = gateway.client().get(&gateway.admin_url("/metrics")).await.text();
        let line = metrics.lines().find(|l| l.starts_with("sluice_plugin_instances{") && l.contains(r#"state="idle""#));
        line.and_then(|l| l.rsplit(' ').next()).map(str::to_string).unwrap_or_default()
    };
    for _ in 0..3 {
        assert_eq!(served(&gateway, &[]).await, "1");
        assert_eq!(idle().await, "1", "a restored instance waits for the next request");
    }
    // A trap discards the instance: it is never restored.
    gateway.chat("gpt-test", &[("x-probe-trap", "1")]).await.assert_error(500, "plugin_failed");
    assert_eq!(idle().await, "0");
    assert_eq!(served(&gateway, &[]).await, "1");
    drop(gateway);

    // Reused: one instance serves requests one after another.
    let probe = Plugin::new("probe", "probe").config(json!({})).reused(2);
    let (_dir, gateway) = gateway_with_probe(&echo, probe).await;
    let counts = [served(&gateway, &[]).await, served(&gateway, &[]).await, served(&gateway, &[]).await];
    assert_eq!(counts, ["1", "2", "3"]);

    // A trap fails its request and discards the instance: the next request
    // gets a fresh one.
    gateway.chat("gpt-test", &[("x-probe-trap", "1")]).await.assert_error(500, "plugin_failed");
    assert_eq!(served(&gateway, &[]).await, "1");
    assert_eq!(served(&gateway, &[]).await, "2");
}
