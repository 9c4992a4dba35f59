use serde_json::{Value, json};
use sluice_plugin_sdk::testing::{chat_request, request_with_headers};
use sluice_plugin_sdk::{DirectResponse, ResponseSummary};

use super::*;

fn plugin(config: Value) -> ResponseCache {
    sluice_plugin_sdk::configure::<ResponseCache>(&config.to_string()).unwrap()
}

fn ask(body: Value, consumer: Option<&str>, headers: &[(&str, &str)]) -> Request {
    let mut req = chat_request("gpt-4o-mini", &body);
    if !headers.is_empty() {
        let mut full = body.clone();
        full["model"] = "gpt-4o-mini".into();
        req = request_with_headers("gpt-4o-mini", headers);
        req.set_body(full.to_string().as_bytes());
    }
    match consumer {
        Some(consumer) => req.with_consumer(consumer),
        None => req,
    }
}

fn body(text: &str) -> Value {
    json!({"messages": [{"role": "user", "content": text}], "temperature": 0})
}

fn completion(text: &str) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",
           "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop",
                        "logprobs": null}],
           "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
}

fn summary(status: u16, completed: bool) -> ResponseSummary {
    ResponseSummary { status, streamed: false, usage: None, body_bytes: 1, completed, duration_ms: 1 }
}

/// Runs a request through the hooks: `Ok(pending)` on a miss or bypass
/// (with its `x-sluice-cache`), `Err(direct)` on a hit.
fn run(cache: &ResponseCache, req: &Request) -> Result<(Pending, String), DirectResponse> {
    let mut pending = Pending::default();
    match cache.on_request(req, &mut pending).unwrap() {
        Action::Continue => Ok((pending, req.response_header(HEADER).unwrap_or_default())),
        Action::Respond(direct) => Err(direct),
    }
}

/// A JSON answer given to a miss, as the gateway hands it to the hooks.
fn answer(cache: &ResponseCache, mut pending: Pending, response: &Value, status: u16) {
    assert_eq!(cache.on_body(response.to_string().as_bytes(), &mut pending), None);
    cache.on_end(&summary(status, true), &mut pending);
}

fn header<'a>(direct: &'a DirectResponse, name: &str) -> Option<&'a str> {
    direct.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

#[test]
fn a_complete_answer_is_a_hit_for_the_same_request_whatever_its_member_order() {
    let cache = plugin(json!({}));
    let (pending, said) = run(&cache, &ask(body("hi"), Some("key:a"), &[])).unwrap();
    assert_eq!(said, "miss");
    answer(&cache, pending, &completion("hello!"), 200);
    // The same fields, written in another order, and a `user` that is not
    // part of the key.
    let reordered = json!({"temperature": 0, "user": "u-9", "messages": [{"content": "hi", "role": "user"}]});
    let direct = run(&cache, &ask(reordered, Some("key:a"), &[])).err().expect("a hit");
    assert_eq!((direct.status, header(&direct, HEADER)), (200, Some("hit")));
    assert_eq!(serde_json::from_slice::<Value>(&direct.body).unwrap(), completion("hello!"));
    // A field of the key changes the answer.
    let warmer = json!({"messages": [{"role": "user", "content": "hi"}], "temperature": 1});
    assert_eq!(run(&cache, &ask(warmer, Some("key:a"), &[])).map(|(_, said)| said).ok().as_deref(), Some("miss"));
}

#[test]
fn one_consumer_never_gets_anothers_answer_and_no_consumer_is_not_cached() {
    let cache = plugin(json!({}));
    let (pending, _) = run(&cache, &ask(body("secret"), Some("key:a"), &[])).unwrap();
    answer(&cache, pending, &completion("a's answer"), 200);
    let (_, said) = run(&cache, &ask(body("secret"), Some("key:b"), &[])).unwrap();
    assert_eq!(said, "miss");
    let (pending, said) = run(&cache, &ask(body("secret"), None, &[])).unwrap();
    assert_eq!((said.as_str(), pending.key.is_none()), ("bypass", true));
    // A route-wide cache must be asked for; then callers share it.
    let shared = plugin(json!({"scope": "route"}));
    let (pending, _) = run(&shared, &ask(body("public"), None, &[])).unwrap();
    answer(&shared, pending, &completion("for all"), 200);
    assert!(run(&shared, &ask(body("public"), Some("key:b"), &[])).is_err(), "a hit for anyone on the route");
}

#[test]
fn cache_control_is_honoured() {
    let cache = plugin(json!({}));
    let (pending, _) = run(&cache, &ask(body("q"), Some("c"), &[])).unwrap();
    answer(&cache, pending, &completion("old"), 200);
    // no-store: neither read nor written.
    let (pending, said) = run(&cache, &ask(body("q"), Some("c"), &[("cache-control", "no-store")])).unwrap();
    assert_eq!((said.as_str(), pending.key.is_none()), ("bypass", true));
    // no-cache: not read, and the fresh answer replaces the old.
    let (pending, said) = run(&cache, &ask(body("q"), Some("c"), &[("cache-control", "max-age=0, no-cache")])).unwrap();
    assert_eq!(said, "miss");
    answer(&cache, pending, &completion("new"), 200);
    let direct = run(&cache, &ask(body("q"), Some("c"), &[])).err().unwrap();
    assert_eq!(serde_json::from_slice::<Value>(&direct.body).unwrap(), completion("new"));
}

#[test]
fn only_complete_200_answers_of_bounded_size_are_kept() {
    let cache = plugin(json!({"maxEntryBytes": 600}));
    for (status, completed, response) in [
        (500, true, completion("error")),
        (200, false, completion("cut")),
        (200, true, json!({"object": "list", "data": []})),
        (200, true, completion(&"x".repeat(700))),
    ] {
        let (mut pending, _) = run(&cache, &ask(body("k"), Some("c"), &[])).unwrap();
        cache.on_body(response.to_string().as_bytes(), &mut pending);
        cache.on_end(&summary(status, completed), &mut pending);
        assert!(run(&cache, &ask(body("k"), Some("c"), &[])).is_ok(), "kept: {status} {completed} {response}");
    }
}

/// The events of a stream whose text comes in `pieces`.
fn stream(pieces: &[&str]) -> Vec<String> {
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 7, "model": "gpt-4o-mini",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}]})
        .to_string()
    };
    let mut events = vec![chunk(json!({"role": "assistant", "content": ""}), Value::Null)];
    events.extend(pieces.iter().map(|p| chunk(json!({"content": p}), Value::Null)));
    events.push(chunk(json!({}), "stop".into()));
    events.push(
        json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 7, "model": "gpt-4o-mini",
               "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
        .to_string(),
    );
    events.push("[DONE]".into());
    events
}

#[test]
fn a_streamed_answer_is_kept_and_replayed_either_way() {
    let cache = plugin(json!({}));
    let streamed = |text: &str| {
        let mut b = body(text);
        b["stream"] = true.into();
        b["stream_options"] = json!({"include_usage": true});
        b
    };
    let (mut pending, said) = run(&cache, &ask(streamed("s"), Some("c"), &[])).unwrap();
    assert_eq!(said, "miss");
    for event in stream(&["Hel", "lo ", "world"]) {
        assert_eq!(cache.on_chunk(&event, &mut pending), ChunkAction::Pass);
    }
    cache.on_end(&summary(200, true), &mut pending);
    // As JSON, to a request that does not stream (`stream` is not a key
    // field).
    let direct = run(&cache, &ask(body("s"), Some("c"), &[])).err().expect("a hit");
    let json: Value = serde_json::from_slice(&direct.body).unwrap();
    assert_eq!(json["choices"][0]["message"]["content"], "Hello world");
    assert_eq!(json["usage"]["total_tokens"], 5);
    // As a stream: events that put back together make the same answer.
    let direct = run(&cache, &ask(streamed("s"), Some("c"), &[])).err().expect("a hit");
    assert_eq!(header(&direct, "content-type"), Some("text/event-stream"));
    let text = String::from_utf8(direct.body).unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let mut again = Assembled::default();
    for data in text.split("\n\n").filter_map(|e| e.strip_prefix("data: ")) {
        again.add(data);
    }
    assert_eq!(again.completion(), Some(json));
}

#[test]
fn a_stream_it_cannot_put_back_together_is_not_kept() {
    let cache = plugin(json!({}));
    let mut b = body("t");
    b["stream"] = true.into();
    let (mut pending, _) = run(&cache, &ask(b.clone(), Some("c"), &[])).unwrap();
    let tool_call = json!({"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": "f"}}]},
                     "finish_reason": "tool_calls"}]});
    cache.on_chunk(&tool_call.to_string(), &mut pending);
    cache.on_end(&summary(200, true), &mut pending);
    assert!(run(&cache, &ask(b, Some("c"), &[])).is_ok(), "not kept");
}

#[test]
fn keys_of_different_routes_and_consumers_never_meet() {
    let cache = plugin(json!({}));
    let key = |consumer: &str| cache.key(&ask(body("k"), Some(consumer), &[])).unwrap().unwrap();
    assert_ne!(key("a|b"), key("a"));
    assert!(key("a").starts_with("12:default/chat|1:a|"), "{}", key("a"));
}
