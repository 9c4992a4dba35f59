//! context-trim through the real gateway, counted with the gateway's own
//! tokenizer: what reaches the upstream is at or under the budget, or the
//! client gets `context_length_exceeded`.

use crate::plugin_support as support;

use serde_json::{Value, json};
use sluice_runtime::tokens::count_tokens;
use sluice_tests::{Gateway, Plugin, Reply};
use support::serve;

const MODEL: &str = "gpt-4o-mini";

/// The plugin's documented count: 4 per message plus its name, text and tool
/// calls, 3 for the reply, plus the tools JSON.
fn tokens(body: &Value) -> u32 {
    let text = |v: &Value| v.as_str().map_or(0, |s| count_tokens(MODEL, s));
    let messages = body["messages"].as_array().unwrap();
    let per_message: u32 = messages
        .iter()
        .map(|m| {
            let content = match &m["content"] {
                Value::Array(parts) => parts.iter().map(|p| text(&p["text"])).sum(),
                other => text(other),
            };
            let calls: u32 = m["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| text(&c["function"]["name"]) + text(&c["function"]["arguments"]))
                .sum();
            4 + text(&m["name"]) + content + calls
        })
        .sum();
    let tools = body.get("tools").map_or(0, |t| count_tokens(MODEL, &t.to_string()));
    3 + per_message + tools
}

fn prose(seed: usize, words: usize) -> String {
    const WORDS: [&str; 8] = ["gateway", "token", "budget", "river", "sluice", "model", "context", "window"];
    (0..words).map(|i| WORDS[(i * 7 + seed) % WORDS.len()]).collect::<Vec<_>>().join(" ")
}

/// A system prompt, four old turns (one with a tool call and its result),
/// and a new question.
fn conversation() -> Value {
    json!({"model": MODEL, "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": prose(1, 120)},
        {"role": "assistant", "content": prose(2, 120)},
        {"role": "user", "content": "Look up the weather."},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": prose(3, 150)},
        {"role": "assistant", "content": prose(4, 60)},
        {"role": "user", "content": prose(5, 40)},
        {"role": "assistant", "content": prose(6, 40)},
        {"role": "user", "content": "And tomorrow?"}
    ]})
}

fn trim_plugin(config: Value) -> Plugin {
    // Counting calls the gateway's tokenizer, which in this debug build, on
    // a busy 2-core machine with several gateways warming their tokenizers
    // at once, can take longer than the 100 ms default deadline.
    Plugin::new("context-trim", "context-trim").config(config).timeout_ms(5000)
}

async fn send(gateway: &Gateway, body: &Value) -> Reply {
    gateway.post("/v1/chat/completions", body.to_string(), &[]).await
}

fn header(reply: &Reply, name: &str) -> u32 {
    reply.header(name).unwrap_or_else(|| panic!("no {name} header")).parse().unwrap()
}

#[tokio::test]
async fn drop_oldest_fits_the_budget_keeping_system_and_the_newest_turn() {
    let budget = 300;
    let (_echo, _dir, gateway) =
        serve(&[trim_plugin(json!({"models": [{"model": "gpt-4o*", "maxInputTokens": budget}]}))], &[MODEL]).await;
    let body = conversation();
    let full = tokens(&body);
    assert!(full > budget, "the conversation must need trimming: {full}");

    let reply = send(&gateway, &body).await;
    let echoed = reply.echoed();
    let sent = json!({"messages": echoed["messages"]});
    let sent_tokens = tokens(&sent);
    assert!(sent_tokens <= budget, "{sent_tokens} tokens reached the upstream");
    let messages = echoed["messages"].as_array().unwrap();
    assert_eq!(messages.first().unwrap()["content"], "You are terse.");
    assert_eq!(messages.last().unwrap()["content"], "And tomorrow?");
    // Tool calls and their results went together, or stayed together.
    let has_call = messages.iter().any(|m| m.get("tool_calls").is_some());
    let has_result = messages.iter().any(|m| m["role"] == "tool");
    assert_eq!(has_call, has_result, "a tool call was split from its result: {messages:?}");

    let dropped = body["messages"].as_array().unwrap().len() - messages.len();
    assert_eq!(header(&reply, "x-sluice-trimmed-messages") as usize, dropped);
    assert_eq!(header(&reply, "x-sluice-trimmed-tokens"), full - sent_tokens);
}

#[tokio::test]
async fn a_request_at_the_budget_passes_untouched_and_one_token_over_is_trimmed() {
    let body = conversation();
    let full = tokens(&body);
    let at = trim_plugin(json!({"models": [{"model": MODEL, "maxInputTokens": full}]}));
    let (_echo, _dir, gateway) = serve(&[at], &[MODEL]).await;
    let reply = send(&gateway, &body).await;
    assert_eq!(reply.echoed()["messages"], body["messages"], "exactly at the budget is untouched");
    assert_eq!(header(&reply, "x-sluice-trimmed-messages"), 0);
    assert_eq!(header(&reply, "x-sluice-trimmed-tokens"), 0);

    let over = trim_plugin(json!({"models": [{"model": MODEL, "maxInputTokens": full - 1}]}));
    let (_echo, _dir, gateway) = serve(&[over], &[MODEL]).await;
    let reply = send(&gateway, &body).await;
    assert!(tokens(&json!({"messages": reply.echoed()["messages"]})) < full);
    assert!(header(&reply, "x-sluice-trimmed-messages") > 0);
}

#[tokio::test]
async fn context_window_less_max_tokens_is_the_budget() {
    let body = conversation();
    let full = tokens(&body);
    let window = full + 100;
    let plugin = trim_plugin(json!({"models": [{"model": "*", "contextWindow": window}]}));
    let (_echo, _dir, gateway) = serve(&[plugin], &[MODEL]).await;

    let mut small = body.clone();
    small["max_tokens"] = json!(100);
    assert_eq!(send(&gateway, &small).await.echoed()["messages"], body["messages"], "fits with 100 reserved");

    let mut large = body.clone();
    large["max_completion_tokens"] = json!(250);
    let reply = send(&gateway, &large).await;
    assert!(tokens(&json!({"messages": reply.echoed()["messages"]})) <= window - 250);

    let mut all = body.clone();
    all["max_tokens"] = json!(window);
    send(&gateway, &all).await.assert_error(400, "context_length_exceeded");
}

#[tokio::test]
async fn truncate_middle_cuts_the_longest_message_to_fit() {
    let body = conversation();
    // 100 tokens over: cutting the longest message (the tool result, 150
    // words) is enough.
    let budget = tokens(&body) - 100;
    let plugin = trim_plugin(json!({"strategy": "truncate-middle", "marker": " [...] ",
        "models": [{"model": "*", "maxInputTokens": budget}]}));
    let (_echo, _dir, gateway) = serve(&[plugin], &[MODEL]).await;
    let reply = send(&gateway, &body).await;
    let echoed = reply.echoed();
    let messages = echoed["messages"].as_array().unwrap();
    assert_eq!(messages.len(), body["messages"].as_array().unwrap().len(), "nothing dropped");
    assert!(tokens(&json!({"messages": messages})) <= budget);
    let tool = messages.iter().find(|m| m["role"] == "tool").unwrap()["content"].as_str().unwrap();
    assert!(tool.contains(" [...] "), "the longest message was cut: {tool}");
    let original = prose(3, 150);
    assert!(
        tool.starts_with(&original[..20]) && tool.ends_with(&original[original.len() - 20..]),
        "head and tail kept"
    );
    let untouched: Vec<&Value> = messages.iter().filter(|m| m["role"] != "tool").collect();
    let before: Vec<&Value> = body["messages"].as_array().unwrap().iter().filter(|m| m["role"] != "tool").collect();
    assert_eq!(untouched, before, "only the longest message was cut");
    assert_eq!(header(&reply, "x-sluice-trimmed-messages"), 1);
}

#[tokio::test]
async fn when_the_minimum_cannot_fit_the_client_gets_context_length_exceeded() {
    let plugin = trim_plugin(json!({"models": [{"model": "*", "maxInputTokens": 20}]}));
    let (_echo, _dir, gateway) = serve(&[plugin], &[MODEL]).await;
    let body = json!({"model": MODEL, "messages": [
        {"role": "system", "content": prose(1, 30)}, {"role": "user", "content": "hi"}]});
    let error = send(&gateway, &body).await.assert_error(400, "context_length_exceeded");
    assert!(error["message"].as_str().unwrap().contains("the input budget for gpt-4o-mini is 20 tokens"), "{error}");
    assert_eq!(error["type"], "invalid_request_error");
}

#[tokio::test]
async fn randomised_conversations_reach_the_upstream_within_budget_or_get_a_400() {
    let budget = 200;
    let plugin = trim_plugin(json!({"models": [{"model": "*", "maxInputTokens": budget}]}));
    let (_echo, _dir, gateway) = serve(&[plugin], &[MODEL]).await;
    let mut seed: u64 = 0x00C0_FFEE_D00D_F00D;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n) as usize
    };
    let (mut fitted, mut refused) = (0, 0);
    for case in 0..30 {
        let mut messages = vec![json!({"role": "system", "content": prose(case, next(40))})];
        for turn in 0..=next(6) {
            messages.push(json!({"role": "user", "content": prose(turn, next(120))}));
            messages.push(json!({"role": "assistant", "content": prose(turn + 1, next(120))}));
        }
        messages.push(json!({"role": "user", "content": prose(case + 2, next(260))}));
        let body = json!({"model": MODEL, "messages": messages});
        let reply = send(&gateway, &body).await;
        if reply.status == 200 {
            let sent = tokens(&json!({"messages": reply.echoed()["messages"]}));
            assert!(sent <= budget, "case {case}: {sent} tokens reached the upstream");
            fitted += 1;
        } else {
            reply.assert_error(400, "context_length_exceeded");
            // Refused only when the system prompt and last question alone are over.
            let minimum = json!({"messages": [messages[0].clone(), messages.last().unwrap().clone()]});
            assert!(tokens(&minimum) > budget, "case {case}: refused a request whose minimum fits");
            refused += 1;
        }
    }
    assert!(fitted > 5 && refused > 0, "fitted {fitted}, refused {refused}: the cases must cover both");
}
