//! Anthropic's Messages API: shapes, events, tool use and errors.

use super::*;

const HEADERS: &[(&str, &str)] = &[("x-api-key", "sk-ant-test"), ("anthropic-version", "2023-06-01")];

fn body(stream: bool, text: &str, tools: bool) -> String {
    let mut body = json!({
        "model": "claude-echo",
        "max_tokens": 256,
        "system": "be brief",
        "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
        "stream": stream,
    });
    if tools {
        body["tools"] = json!([
            {"name": "get_weather", "description": "The weather", "input_schema": {"type": "object"}},
            {"name": "other", "input_schema": {"type": "object"}},
        ]);
    }
    body.to_string()
}

#[tokio::test]
async fn a_message_echoes_what_arrived() {
    let server = start(EchoOptions::default()).await;
    let (status, headers, reply) =
        exchange(&client(false), post(server.addr, "/v1/messages", body(false, "héllo", false), HEADERS)).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert!(headers["request-id"].to_str().unwrap().starts_with("req_"));
    assert!(reply["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(reply["type"], "message");
    assert_eq!(reply["role"], "assistant");
    assert_eq!(reply["model"], "claude-echo");
    assert_eq!(reply["stop_reason"], "end_turn");
    assert_eq!(reply["stop_sequence"], Value::Null);
    let content = reply["content"].as_array().unwrap();
    assert_eq!(content.len(), 1);
    assert_eq!(content[0]["type"], "text");
    let text = content[0]["text"].as_str().unwrap();
    let echoed: Value = serde_json::from_str(text).unwrap();
    assert_eq!(echoed["system"], "be brief");
    assert_eq!(echoed["messages"][0]["content"][0]["text"], "héllo");
    assert_eq!(echoed["headers"]["x-api-key"], "sk-ant-test");
    assert_eq!(echoed["path"], "/v1/messages");
    assert_eq!(echoed["body"]["max_tokens"], 256);

    let usage = &reply["usage"];
    // "be brief" + "user" + "text" + "héllo": 21 characters.
    assert_eq!(usage["input_tokens"], 6);
    assert_eq!(usage["output_tokens"], text.chars().count().div_ceil(4) as u64);
    assert_eq!(usage["cache_creation_input_tokens"], 0);
    assert_eq!(usage["cache_read_input_tokens"], 0);
}

#[tokio::test]
async fn a_streamed_message_is_anthropics_event_sequence() {
    let server = start(EchoOptions { chunk_delay: Duration::from_millis(20), chunks: 4, ..Default::default() }).await;
    let response =
        client(false).request(post(server.addr, "/messages", body(true, "stream", false), HEADERS)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[CONTENT_TYPE], "text/event-stream; charset=utf-8");
    let (text, error) = read_to_end(response.into_body()).await;
    assert!(error.is_none());
    let events = parse_sse(&text);
    for (name, data) in &events {
        assert_eq!(name.as_deref(), data["type"].as_str(), "each event is named after its type");
    }
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_deref().unwrap()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    let start = &events[0].1["message"];
    assert_eq!(start["content"], json!([]));
    assert_eq!(start["stop_reason"], Value::Null);
    assert_eq!(start["model"], "claude-echo");
    assert_eq!(events[1].1["content_block"], json!({"type": "text", "text": ""}));
    let text: String = events[3..7]
        .iter()
        .map(|(_, e)| {
            assert_eq!(e["delta"]["type"], "text_delta");
            e["delta"]["text"].as_str().unwrap()
        })
        .collect();
    let echoed: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(echoed["path"], "/messages");
    let delta = &events[8].1;
    assert_eq!(delta["delta"], json!({"stop_reason": "end_turn", "stop_sequence": null}));
    assert_eq!(delta["usage"]["output_tokens"], text.chars().count().div_ceil(4) as u64);
    assert_eq!(delta["usage"]["input_tokens"], start["usage"]["input_tokens"]);
}

#[tokio::test]
async fn call_tool_gets_a_tool_use_block_whole_and_streamed() {
    let server = start(EchoOptions { chunk_delay: Duration::ZERO, ..Default::default() }).await;
    let client = client(false);
    let request = post(server.addr, "/v1/messages", body(false, "please call tool now", true), HEADERS);
    let (status, _, reply) = exchange(&client, request).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(reply["stop_reason"], "tool_use");
    let tool_use = &reply["content"][1];
    assert_eq!(tool_use["type"], "tool_use");
    assert_eq!(tool_use["name"], "get_weather");
    assert!(tool_use["id"].as_str().unwrap().starts_with("toolu_"));
    assert_eq!(tool_use["input"], serde_json::from_str::<Value>(TOOL_INPUT).unwrap());

    let response =
        client.request(post(server.addr, "/v1/messages", body(true, "call tool", true), HEADERS)).await.unwrap();
    let (text, _) = read_to_end(response.into_body()).await;
    let events = parse_sse(&text);
    let block = events.iter().find(|(_, e)| e["type"] == "content_block_start" && e["index"] == 1).unwrap();
    assert_eq!(block.1["content_block"]["name"], "get_weather");
    assert_eq!(block.1["content_block"]["input"], json!({}));
    let partial: String = events
        .iter()
        .filter(|(_, e)| e["delta"]["type"] == "input_json_delta")
        .map(|(_, e)| {
            assert_eq!(e["index"], 1);
            e["delta"]["partial_json"].as_str().unwrap()
        })
        .collect();
    assert_eq!(partial, TOOL_INPUT);
    let delta = events.iter().find(|(_, e)| e["type"] == "message_delta").unwrap();
    assert_eq!(delta.1["delta"]["stop_reason"], "tool_use");

    // Tools, but no ask; or an ask in a turn of tool results only.
    let (_, _, reply) = exchange(&client, post(server.addr, "/v1/messages", body(false, "hi", true), HEADERS)).await;
    assert_eq!((reply["stop_reason"].as_str(), reply["content"].as_array().unwrap().len()), (Some("end_turn"), 1));
    let mut results: Value = serde_json::from_str(&body(false, "call tool", true)).unwrap();
    results["messages"].as_array_mut().unwrap().push(json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny; call tool"}
    ]}));
    let (_, _, reply) = exchange(&client, post(server.addr, "/v1/messages", results.to_string(), HEADERS)).await;
    assert_eq!(reply["stop_reason"], "end_turn");
}

#[tokio::test]
async fn errors_take_anthropics_shape() {
    let opts = EchoOptions::default();
    let script = opts.script.clone();
    let server = start(opts).await;
    let client = client(false);
    let check = async |request, status: StatusCode, kind: &str, message: &str| {
        let (got, headers, reply) = exchange(&client, request).await;
        assert_eq!(got, status, "{reply}");
        assert_eq!(reply["type"], "error");
        assert_eq!(reply["error"]["type"], kind, "{reply}");
        if !message.is_empty() {
            assert_eq!(reply["error"]["message"], message);
        }
        assert_eq!(reply["request_id"], headers["request-id"].to_str().unwrap());
        headers
    };
    let url = "/v1/messages";
    let plain = body(false, "hi", false);
    let key = &HEADERS[..1];
    check(
        post(server.addr, url, plain.clone(), &[]),
        StatusCode::UNAUTHORIZED,
        "authentication_error",
        "x-api-key header is required",
    )
    .await;
    check(
        post(server.addr, url, plain.clone(), key),
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "anthropic-version: header is required",
    )
    .await;
    let old = [HEADERS[0], ("anthropic-version", "latest")];
    check(post(server.addr, url, plain.clone(), &old), StatusCode::BAD_REQUEST, "invalid_request_error", "").await;
    check(post(server.addr, url, "{nope", HEADERS), StatusCode::BAD_REQUEST, "invalid_request_error", "").await;
    let no_max = json!({"model": "claude-echo", "messages": []}).to_string();
    check(
        post(server.addr, url, no_max, HEADERS),
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "max_tokens: Field required",
    )
    .await;
    // Anthropic's 2.x SDKs send the key as a bearer token, and newer versions.
    let bearer = [("authorization", "Bearer sk-ant-test"), ("anthropic-version", "2026-10-21")];
    assert_eq!(send(&client, post(server.addr, url, plain.clone(), &bearer)).await.0, StatusCode::OK);
    let basic = [("authorization", "Basic c2s6"), HEADERS[1]];
    check(post(server.addr, url, plain.clone(), &basic), StatusCode::UNAUTHORIZED, "authentication_error", "").await;
    let knob = [HEADERS[0], HEADERS[1], ("x-echo-status", "500")];
    check(post(server.addr, url, plain.clone(), &knob), StatusCode::INTERNAL_SERVER_ERROR, "api_error", "").await;

    script.push(Step::rate_limited("3"), 1);
    script.push(Step::overloaded(), 1);
    script.push(Step::context_length_exceeded(), 1);
    let headers =
        check(post(server.addr, url, plain.clone(), HEADERS), StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", "")
            .await;
    assert_eq!(headers[RETRY_AFTER], "3");
    let status = StatusCode::from_u16(529).unwrap();
    check(post(server.addr, url, plain.clone(), HEADERS), status, "overloaded_error", "").await;
    // "be brief" + "user" + "text" + "hi": 18 characters, 5 tokens.
    let message = "prompt is too long: 200005 tokens > 200000 maximum";
    check(post(server.addr, url, plain.clone(), HEADERS), StatusCode::BAD_REQUEST, "invalid_request_error", message)
        .await;
    assert_eq!((script.requests(), script.completed()), (11, 1));
}

#[tokio::test]
async fn a_reset_cuts_a_streamed_message() {
    let opts = EchoOptions { chunk_delay: Duration::ZERO, chunks: 5, ..Default::default() };
    let script = opts.script.clone();
    let server = start(opts).await;
    script.push(Step::ResetAfterChunks(3), 1);
    let response =
        client(false).request(post(server.addr, "/v1/messages", body(true, "hi", false), HEADERS)).await.unwrap();
    let (text, error) = read_to_end(response.into_body()).await;
    assert!(error.is_some(), "{text}");
    let names: Vec<String> = parse_sse(&text).into_iter().map(|(name, _)| name.unwrap()).collect();
    assert_eq!(
        names,
        ["message_start", "content_block_start", "ping"]
            .into_iter()
            .chain(["content_block_delta"; 3])
            .collect::<Vec<_>>()
    );
    assert_eq!(script.completed(), 0);
}
