//! response-guard through the real gateway. The echo upstream repeats the
//! request in its answer, so a secret in the prompt comes back as model
//! output, in a whole JSON body or split across many SSE chunks.

use crate::plugin_support as support;

use serde_json::{Value, json};
use sluice_tests::{Gateway, Plugin, Streamed, chat_body};
use support::serve;

const KEY: &str = "sk-e2eSECRETabcdefghijklmnop0123456789";

fn guard(action: &str) -> Plugin {
    Plugin::new("response-guard", "response-guard").config(json!({
        "action": action,
        "rules": [
            {"name": "openai-key", "pattern": "sk-[A-Za-z0-9]{20,}"},
            {"name": "email", "pattern": "[a-z]+@example\\.com", "replacement": "<email>"}
        ]
    }))
}

fn request(stream: bool) -> String {
    let mut body = chat_body("gpt-test");
    body["messages"] = json!([{"role": "user", "content": format!("my key is {KEY}, mail bob@example.com")}]);
    body["stream"] = stream.into();
    body.to_string()
}

async fn stream(gateway: &Gateway, chunks: &str) -> Streamed {
    let url = gateway.url("/v1/chat/completions");
    let knobs = [("x-echo-chunks", chunks), ("x-echo-chunk-delay-ms", "0")];
    let streamed = gateway.client().post_streaming(&url, request(true), &knobs).await;
    assert_eq!(streamed.status, 200);
    streamed
}

/// The content of every streamed chunk, joined, and the finish reasons seen.
fn streamed_content(streamed: &Streamed) -> (String, Vec<String>) {
    let events = streamed.events();
    assert_eq!(events.last().map(|(_, data)| data.as_str()), Some("[DONE]"), "the stream ends with [DONE]");
    let mut content = String::new();
    let mut reasons = Vec::new();
    for (_, data) in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("not JSON ({e}): {data}"));
        for choice in chunk["choices"].as_array().unwrap() {
            content += choice["delta"]["content"].as_str().unwrap_or("");
            if let Some(reason) = choice["finish_reason"].as_str() {
                reasons.push(reason.to_string());
            }
        }
    }
    (content, reasons)
}

/// No 8-character piece of the key appears in `text`.
fn assert_no_key_fragment(text: &str) {
    for window in KEY.as_bytes().windows(8) {
        let fragment = std::str::from_utf8(window).unwrap();
        assert!(!text.contains(fragment), "{fragment:?} of the key leaked in {text}");
    }
}

#[tokio::test]
async fn a_whole_response_is_masked() {
    let (_echo, _dir, gateway) = serve(&[guard("mask")], &["gpt-test"]).await;
    let reply = gateway.post("/v1/chat/completions", request(false), &[]).await;
    let content = reply.json()["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert_no_key_fragment(&content);
    // Masking happened inside JSON strings: the echoed document still parses.
    let echoed: Value = serde_json::from_str(&content).unwrap();
    assert_eq!(echoed["messages"][0]["content"], "my key is [REDACTED], mail <email>");
}

#[tokio::test]
async fn a_key_split_across_stream_chunks_is_masked() {
    let (_echo, _dir, gateway) = serve(&[guard("mask")], &["gpt-test"]).await;
    // About 5 characters per chunk: the key spans several chunks.
    let streamed = stream(&gateway, "120").await;
    let (content, reasons) = streamed_content(&streamed);
    assert_no_key_fragment(&content);
    let echoed: Value = serde_json::from_str(&content).unwrap_or_else(|e| panic!("{e}: {content}"));
    assert_eq!(echoed["messages"][0]["content"], "my key is [REDACTED], mail <email>");
    assert_eq!(reasons, ["stop"]);
}

#[tokio::test]
async fn block_ends_the_stream_before_the_match() {
    let (_echo, _dir, gateway) = serve(&[guard("block")], &["gpt-test"]).await;
    let streamed = stream(&gateway, "60").await;
    let (content, reasons) = streamed_content(&streamed);
    assert_no_key_fragment(&content);
    assert!(content.ends_with("my key is "), "the text before the match is sent: {content}");
    assert_eq!(reasons, ["content_filter"]);

    let reply = gateway.post("/v1/chat/completions", request(false), &[]).await;
    let choice = &reply.json()["choices"][0];
    assert_eq!(choice["message"]["content"], Value::Null);
    assert_eq!(choice["finish_reason"], "content_filter");
}

#[tokio::test]
async fn clean_responses_pass_unchanged() {
    let (_echo, _dir, gateway) = serve(&[guard("mask")], &["gpt-test"]).await;
    let reply = gateway.chat("gpt-test", &[]).await;
    assert_eq!(reply.echoed()["messages"], chat_body("gpt-test")["messages"]);
    let url = gateway.url("/v1/chat/completions");
    let mut body = chat_body("gpt-test");
    body["stream"] = true.into();
    let streamed = gateway.client().post_streaming(&url, body.to_string(), &[("x-echo-chunks", "9")]).await;
    let (content, reasons) = streamed_content(&streamed);
    let echoed: Value = serde_json::from_str(&content).unwrap();
    assert_eq!(echoed["messages"], chat_body("gpt-test")["messages"]);
    assert_eq!(reasons, ["stop"]);
}
