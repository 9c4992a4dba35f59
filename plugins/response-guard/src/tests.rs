use serde_json::json;

use super::*;

fn guard(config: Value) -> ResponseGuard {
    sluice_plugin_sdk::configure::<ResponseGuard>(&config.to_string()).unwrap_or_else(|e| panic!("{e}"))
}

fn secrets() -> ResponseGuard {
    guard(json!({"rules": [
        {"name": "openai-key", "pattern": "sk-[A-Za-z0-9]{20,}"},
        {"name": "email", "pattern": "[a-z.]+@[a-z]+\\.[a-z]{2,}", "replacement": "<email>"}
    ]}))
}

fn chunk(content: &str) -> String {
    json!({"id": "c1", "object": "chat.completion.chunk", "model": "m",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}]})
    .to_string()
}

fn finish_chunk() -> String {
    json!({"id": "c1", "object": "chat.completion.chunk", "model": "m",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    .to_string()
}

/// Feeds `events` through the hook as the gateway would, and returns the
/// events the client receives.
fn stream(guard: &ResponseGuard, events: &[String]) -> Vec<String> {
    let mut state = Stream::default();
    let mut out = Vec::new();
    for event in events {
        match guard.on_chunk(event, &mut state) {
            ChunkAction::Pass => out.push(event.clone()),
            ChunkAction::Replace(data) => out.push(data),
            ChunkAction::Drop => {}
            ChunkAction::Stop(last) => {
                out.extend(last);
                out.push("[DONE]".to_string());
                return out;
            }
        }
    }
    out
}

/// All content the client sees, joined.
fn content(events: &[String]) -> String {
    events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .flat_map(|e| e["choices"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["delta"]["content"].as_str().or(c["text"].as_str()).map(str::to_string))
        .collect()
}

const KEY: &str = "sk-abcdefghijklmnopqrstuvwxyz0123";

#[test]
fn masks_within_one_chunk_and_keeps_the_chunk_shape() {
    let out =
        stream(&secrets(), &[chunk(&format!("key {KEY} mail bob@example.com end")), finish_chunk(), "[DONE]".into()]);
    assert_eq!(content(&out), "key [REDACTED] mail <email> end");
    let first: Value = serde_json::from_str(&out[0]).unwrap();
    assert_eq!(first["id"], "c1");
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(out.last().unwrap(), "[DONE]");
}

#[test]
fn a_match_split_across_chunks_is_masked() {
    let out = stream(
        &secrets(),
        &[chunk("my key is sk-abc"), chunk("defghijklmnopqrstuvwxyz0123, ok"), finish_chunk(), "[DONE]".into()],
    );
    let seen = content(&out);
    assert_eq!(seen, "my key is [REDACTED], ok");
    assert!(!out.iter().any(|e| e.contains("sk-abc")), "no fragment of the key was sent: {out:?}");
}

#[test]
fn held_back_text_is_flushed_at_done_without_a_finish_reason() {
    let out = stream(&secrets(), &[chunk("short answer"), "[DONE]".into()]);
    assert_eq!(content(&out), "short answer");
    assert_eq!(out.last().unwrap(), "[DONE]");
    let flushed: Value = serde_json::from_str(&out[out.len() - 2]).unwrap();
    assert_eq!(flushed["id"], "c1", "the closing chunk looks like the others: {flushed}");
}

#[test]
fn nothing_held_back_means_done_and_usage_chunks_pass() {
    let usage = json!({"id": "c1", "choices": [], "usage": {"prompt_tokens": 1}}).to_string();
    let events = [chunk("hi"), finish_chunk(), usage.clone(), "[DONE]".to_string()];
    let out = stream(&secrets(), &events);
    assert_eq!(out[2], usage);
    assert_eq!(out[3], "[DONE]");
    assert_eq!(content(&out), "hi");
    assert_eq!(stream(&secrets(), &["not json".to_string()]), ["not json"]);
}

#[test]
fn randomly_split_streams_are_masked_like_the_whole_text() {
    let guard = secrets();
    let text = format!("Keys: {KEY} and sk-ZZZZZZZZZZZZZZZZZZZZZZZZ; mail a.b@corp.io or x@y.org! Done. {KEY}");
    let expected = guard.mask(&text);
    let mut seed: u64 = 0x0DDB_1A5E_5BAD_5EED;
    for _ in 0..300 {
        let mut events = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        let mut at = 0;
        while at < chars.len() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = 1 + (seed % 12) as usize;
            let end = (at + len).min(chars.len());
            events.push(chunk(&chars[at..end].iter().collect::<String>()));
            at = end;
        }
        if seed.is_multiple_of(2) {
            events.push(finish_chunk());
        }
        events.push("[DONE]".into());
        let out = stream(&guard, &events);
        assert_eq!(content(&out), expected, "split into {} chunks", events.len());
    }
}

#[test]
fn block_stops_the_stream_before_the_match() {
    let guard = guard(json!({"action": "block", "rules": [{"name": "key", "pattern": "sk-[A-Za-z0-9]{20,}"}]}));
    let events = [
        chunk("here it is: sk-abcdefgh"),
        chunk("ijklmnopqrstuvwxyz0123 and more"),
        chunk("never sent"),
        "[DONE]".into(),
    ];
    let out = stream(&guard, &events);
    assert_eq!(content(&out), "here it is: ");
    assert!(!out.iter().any(|e| e.contains("sk-") || e.contains("never sent")), "{out:?}");
    let last: Value = serde_json::from_str(&out[out.len() - 2]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "content_filter");
    assert_eq!(out.last().unwrap(), "[DONE]");
    let clean = stream(&guard, &[chunk("all fine"), finish_chunk(), "[DONE]".into()]);
    assert_eq!(content(&clean), "all fine");
}

#[test]
fn choices_are_tracked_separately() {
    let two = |a: &str, b: &str| {
        json!({"choices": [{"index": 0, "delta": {"content": a}, "finish_reason": null},
                           {"index": 1, "delta": {"content": b}, "finish_reason": null}]})
        .to_string()
    };
    let out = stream(&secrets(), &[two("sk-abcdefghij", "sk-"), two("klmnopqrstuvwxyz", "safe"), "[DONE]".into()]);
    let mut by_choice = [String::new(), String::new()];
    for event in &out {
        if let Ok(value) = serde_json::from_str::<Value>(event) {
            for choice in value["choices"].as_array().unwrap() {
                by_choice[choice["index"].as_u64().unwrap() as usize] +=
                    choice["delta"]["content"].as_str().unwrap_or("");
            }
        }
    }
    assert_eq!(by_choice, ["[REDACTED]".to_string(), "sk-safe".to_string()]);
}

#[test]
fn legacy_completion_chunks_are_masked() {
    let event = |text: &str| json!({"choices": [{"index": 0, "text": text, "finish_reason": null}]}).to_string();
    let out = stream(&secrets(), &[event("mail bob@exa"), event("mple.com now"), "[DONE]".into()]);
    assert_eq!(content(&out), "mail <email> now");
}

#[test]
fn whole_bodies_are_masked_or_blocked() {
    let body = json!({"id": "x", "choices": [{"index": 0, "message": {"role": "assistant", "content": format!("use {KEY}")},
        "finish_reason": "stop"}], "usage": {"total_tokens": 3}});
    let masked: Value =
        serde_json::from_slice(&secrets().on_body(body.to_string().as_bytes(), &mut Stream::default()).unwrap())
            .unwrap();
    assert_eq!(masked["choices"][0]["message"]["content"], "use [REDACTED]");
    assert_eq!(masked["usage"], body["usage"], "the rest is kept");

    let blocker = guard(json!({"action": "block", "rules": [{"name": "key", "pattern": "sk-"}]}));
    let blocked: Value =
        serde_json::from_slice(&blocker.on_body(body.to_string().as_bytes(), &mut Stream::default()).unwrap()).unwrap();
    assert_eq!(blocked["choices"][0]["message"]["content"], Value::Null);
    assert_eq!(blocked["choices"][0]["finish_reason"], "content_filter");

    let clean = json!({"choices": [{"message": {"content": "nothing here"}}]}).to_string();
    assert_eq!(secrets().on_body(clean.as_bytes(), &mut Stream::default()), None, "unchanged bodies are not rewritten");
    assert_eq!(secrets().on_body(b"\xff not json", &mut Stream::default()), None);
    let legacy = json!({"choices": [{"text": "bob@example.com"}]}).to_string();
    let legacy: Value =
        serde_json::from_slice(&secrets().on_body(legacy.as_bytes(), &mut Stream::default()).unwrap()).unwrap();
    assert_eq!(legacy["choices"][0]["text"], "<email>");
}

#[test]
fn capture_groups_can_keep_part_of_a_match() {
    let guard = guard(json!({"rules": [{"name": "card", "pattern": "\\b\\d{4}[ -]?\\d{4}[ -]?\\d{4}[ -]?(\\d{4})\\b",
        "replacement": "****-$1"}]}));
    assert_eq!(guard.mask("card 4111 1111 1111 1234."), "card ****-1234.");
}

#[test]
fn bad_configs_are_rejected() {
    let error = |config: Value| sluice_plugin_sdk::configure::<ResponseGuard>(&config.to_string()).err().unwrap();
    assert!(error(json!({"rules": []})).contains("`rules` is empty"));
    assert!(
        error(json!({"rules": [{"name": "x", "pattern": "("}]}))
            .starts_with("response-guard: rule \"x\": regex parse error")
    );
    assert!(error(json!({"rules": [{"name": "x", "pattern": "a"}, {"name": "x", "pattern": "b"}]})).contains("unique"));
    assert!(error(json!({"action": "drop", "rules": [{"name": "x", "pattern": "a"}]})).contains("unknown variant"));
}

/// A Responses API stream of `pieces`, as OpenAI (and echo) send it.
fn responses_events(pieces: &[&str]) -> Vec<String> {
    let text: String = pieces.concat();
    let response =
        |status: &str, output: Value| json!({"id": "r1", "object": "response", "status": status, "output": output});
    let part = |text: &str| json!({"type": "output_text", "text": text, "annotations": []});
    let item = |content: Value| json!({"type": "message", "id": "m1", "role": "assistant", "content": content});
    let at = |mut event: Value| {
        event["item_id"] = "m1".into();
        event["output_index"] = 0.into();
        event["content_index"] = 0.into();
        event.to_string()
    };
    let mut events = vec![
        json!({"type": "response.created", "response": response("in_progress", json!([]))}).to_string(),
        json!({"type": "response.output_item.added", "output_index": 0, "item": item(json!([]))}).to_string(),
        at(json!({"type": "response.content_part.added", "part": part("")})),
    ];
    events.extend(pieces.iter().map(|piece| at(json!({"type": "response.output_text.delta", "delta": piece}))));
    events.push(at(json!({"type": "response.output_text.done", "text": text})));
    events.push(at(json!({"type": "response.content_part.done", "part": part(&text)})));
    events.push(
        json!({"type": "response.output_item.done", "output_index": 0, "item": item(json!([part(&text)]))}).to_string(),
    );
    events.push(
        json!({"type": "response.completed", "response": response("completed", json!([item(json!([part(&text)]))]))})
            .to_string(),
    );
    events
}

/// The events a client receives (no `[DONE]` is added: the Responses API
/// has none, but a guard's stop sends one).
fn stream_events(guard: &ResponseGuard, events: &[String]) -> Vec<Value> {
    let mut state = Stream::default();
    let mut out = Vec::new();
    for event in events {
        match guard.on_chunk(event, &mut state) {
            ChunkAction::Pass => out.push(event.clone()),
            ChunkAction::Replace(data) => out.push(data),
            ChunkAction::Drop => {}
            ChunkAction::Stop(last) => {
                out.extend(last);
                break;
            }
        }
    }
    out.iter().map(|e| serde_json::from_str(e).unwrap()).collect()
}

/// Responses API output is masked too, in every event of a stream, not
/// passed unmasked.
#[test]
fn responses_api_streams_are_masked_in_every_event() {
    let guard = secrets();
    let pieces = ["my key is sk-abc", "defghijklmnop", "qrstuvwxyz0123, ok ", "mail bob@example.com bye"];
    let out = stream_events(&guard, &responses_events(&pieces));
    let all = serde_json::to_string(&out).unwrap();
    assert!(!all.contains("sk-abc") && !all.contains("bob@"), "{all}");
    let deltas: String = out
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    let whole = "my key is [REDACTED], ok mail <email> bye";
    let done = out.iter().find(|e| e["type"] == "response.output_text.done").unwrap();
    assert_eq!(done["text"], whole);
    assert!(whole.starts_with(&deltas), "deltas {deltas:?} lead the whole text");
    let completed = out.last().unwrap();
    assert_eq!(completed["response"]["output"][0]["content"][0]["text"], whole);
    assert_eq!(completed["response"]["status"], "completed");
    let item = out.iter().find(|e| e["type"] == "response.output_item.done").unwrap();
    assert_eq!(item["item"]["content"][0]["text"], whole);

    // Clean streams pass as they came.
    let clean = responses_events(&["all ", "fine"]);
    let out = stream_events(&guard, &clean);
    assert_eq!(out.len(), clean.len());
    assert_eq!(out.last().unwrap()["response"]["output"][0]["content"][0]["text"], "all fine");
}

#[test]
fn responses_api_streams_are_blocked_with_an_incomplete_response() {
    let guard = guard(json!({"action": "block", "rules": [{"name": "key", "pattern": "sk-[A-Za-z0-9]{20,}"}]}));
    let out = stream_events(&guard, &responses_events(&["here: sk-abcdefgh", "ijklmnopqrstuvwxyz0123", "never sent"]));
    let all = serde_json::to_string(&out).unwrap();
    assert!(!all.contains("sk-") && !all.contains("never sent"), "{all}");
    let last = out.last().unwrap();
    assert_eq!(last["type"], "response.incomplete");
    assert_eq!(last["response"]["id"], "r1", "the closing event names the response: {last}");
    assert_eq!(last["response"]["incomplete_details"]["reason"], "content_filter");
}

#[test]
fn whole_responses_api_bodies_are_masked_or_blocked() {
    let body = json!({"id": "r1", "object": "response", "status": "completed", "output": [
        {"type": "reasoning", "summary": []},
        {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": format!("use {KEY}"), "annotations": []},
            {"type": "output_text", "text": "fine"}
        ]}
    ], "output_text": format!("use {KEY}\nfine"), "usage": {"total_tokens": 3}});
    let masked: Value =
        serde_json::from_slice(&secrets().on_body(body.to_string().as_bytes(), &mut Stream::default()).unwrap())
            .unwrap();
    assert_eq!(masked["output"][1]["content"][0]["text"], "use [REDACTED]");
    assert_eq!(masked["output"][1]["content"][1]["text"], "fine");
    assert_eq!(masked["output_text"], "use [REDACTED]\nfine");
    assert_eq!(masked["usage"], body["usage"]);

    let blocker = guard(json!({"action": "block", "rules": [{"name": "key", "pattern": "sk-"}]}));
    let blocked: Value =
        serde_json::from_slice(&blocker.on_body(body.to_string().as_bytes(), &mut Stream::default()).unwrap()).unwrap();
    assert!(!blocked.to_string().contains("sk-"), "{blocked}");
    assert_eq!(blocked["status"], "incomplete");
    assert_eq!(blocked["incomplete_details"]["reason"], "content_filter");

    let clean = json!({"object": "response", "output": [{"type": "message", "content": [{"type": "output_text", "text": "ok"}]}]});
    assert_eq!(secrets().on_body(clean.to_string().as_bytes(), &mut Stream::default()), None);
    // Embeddings carry no text: unchanged.
    let embeddings = json!({"object": "list", "data": [{"embedding": [0.1]}]});
    assert_eq!(secrets().on_body(embeddings.to_string().as_bytes(), &mut Stream::default()), None);
}

#[test]
fn endpoints_it_does_not_read_are_refused() {
    use sluice_plugin_sdk::testing::chat_request;
    let guard = secrets();
    for path in ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"] {
        let req = chat_request("m", &json!({})).with_path(path);
        assert_eq!(guard.on_request(&req, &mut Stream::default()), Ok(Action::Continue), "{path}");
    }
    let req = chat_request("m", &json!({})).with_path("/v1/audio/transcriptions");
    let error = guard.on_request(&req, &mut Stream::default()).unwrap_err();
    assert_eq!((error.status, error.code.as_str()), (400, "unsupported_endpoint"));
}
