use serde_json::{Value, json};
use sluice_plugin_sdk::host::testing::set_now_unix_ms;
use sluice_plugin_sdk::testing::{chat_request, request_with_headers};
use sluice_plugin_sdk::{ResponseSummary, Usage};

use super::*;

/// 2024-03-15T00:00:00Z: the start of a UTC day and of every fixed window
/// that divides one.
const T0: u64 = 1_710_460_800_000;

fn plugin(config: Value) -> Result<TokenQuota, String> {
    sluice_plugin_sdk::configure::<TokenQuota>(&config.to_string())
}

fn chat(consumer: Option<&str>, max_tokens: Option<u64>) -> Request {
    let mut body = json!({"messages": [{"role": "user", "content": "hello there"}]});
    if let Some(max) = max_tokens {
        body["max_tokens"] = max.into();
    }
    let req = chat_request("gpt-4o-mini", &body);
    match consumer {
        Some(consumer) => req.with_consumer(consumer),
        None => req,
    }
}

/// The request hook's answer: the state to end the response with, or the
/// refusal.
fn admit(plugin: &TokenQuota, req: &Request) -> Result<Pending, ApiError> {
    let mut pending = Pending::default();
    plugin.on_request(req, &mut pending).map(|action| {
        assert_eq!(action, Action::Continue);
        pending
    })
}

fn end(plugin: &TokenQuota, mut pending: Pending, status: u16, usage: Option<(u32, u32)>) {
    let usage = usage.map(|(prompt_tokens, completion_tokens)| Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens + completion_tokens,
    });
    let summary =
        ResponseSummary { status, streamed: false, usage, body_bytes: 10, completed: usage.is_some(), duration_ms: 5 };
    plugin.on_end(&summary, &mut pending);
    // What the gateway does for a reservation left to it.
    sluice_plugin_sdk::testing::end_response(status, usage.map(|u| (u.prompt_tokens, u.completion_tokens)));
}

/// The fast estimate of a one-message chat's input: its body's bytes, and
/// the chat format's 4 + 3.
fn bytes_estimate(req: &Request) -> u64 {
    req.body_text().len() as u64 + 4 + 3
}

fn header<'a>(error: &'a ApiError, name: &str) -> Option<&'a str> {
    error.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

fn requests_rule(limit: u64) -> Value {
    json!({"name": "rpm", "limit": limit, "window": {"fixed": 60}, "counts": "requests", "per": ["consumer"]})
}

#[test]
fn requests_past_the_limit_get_openais_429_with_its_headers() {
    set_now_unix_ms(Some(T0 + 15_000));
    let quota = plugin(json!({"rules": [requests_rule(2)]})).unwrap();
    for remaining in ["1", "0"] {
        let req = chat(Some("key:a"), None);
        let pending = admit(&quota, &req).unwrap();
        assert_eq!(req.response_header("x-ratelimit-remaining-requests").as_deref(), Some(remaining));
        assert_eq!(req.response_header("x-ratelimit-limit-requests").as_deref(), Some("2"));
        assert_eq!(req.response_header("x-ratelimit-reset-requests").as_deref(), Some("45s"));
        end(&quota, pending, 200, Some((10, 5)));
    }
    let error = admit(&quota, &chat(Some("key:a"), None)).err().unwrap();
    assert_eq!((error.status, error.code.as_str(), error.error_type()), (429, "rate_limit_exceeded", "requests"));
    assert_eq!(header(&error, "retry-after"), Some("45"));
    assert_eq!(header(&error, "x-ratelimit-remaining-requests"), Some("0"));
    assert!(error.message.contains("rpm"), "{}", error.message);
    // Another consumer has its own counter; the window's end starts anew.
    admit(&quota, &chat(Some("key:b"), None)).unwrap();
    set_now_unix_ms(Some(T0 + 60_000));
    admit(&quota, &chat(Some("key:a"), None)).unwrap();
}

#[test]
fn tokens_are_reserved_as_estimated_and_committed_as_reported() {
    set_now_unix_ms(Some(T0));
    let rule = json!({"name": "tpd", "limit": 1000, "window": {"fixed": 86400}, "counts": "tokens"});
    let quota = plugin(json!({"rules": [rule]})).unwrap();
    // The estimate: the input (its body's bytes, 4 per message, 3 priming)
    // and the output asked for.
    let req = chat(None, Some(500));
    let estimate = bytes_estimate(&req) + 500;
    let pending = admit(&quota, &req).unwrap();
    assert_eq!(req.response_header("x-ratelimit-remaining-tokens"), Some((1000 - estimate).to_string()));
    // 600 more do not fit while the estimate stands, even counted exactly...
    assert_eq!(admit(&quota, &chat(None, Some(600))).err().map(|e| e.status), Some(429));
    // ...and do once the real usage is committed.
    end(&quota, pending, 200, Some((9, 20)));
    let req = chat(None, Some(600));
    admit(&quota, &req).unwrap();
    let left = 1000 - 29 - (bytes_estimate(&req) + 600);
    assert_eq!(req.response_header("x-ratelimit-remaining-tokens"), Some(left.to_string()));
}

#[test]
fn near_a_limit_the_input_is_counted_exactly_before_a_refusal() {
    set_now_unix_ms(Some(T0));
    let rule = json!({"name": "tokens", "limit": 50, "window": {"fixed": 60}, "counts": "tokens"});
    let quota = plugin(json!({"rules": [rule]})).unwrap();
    let req = chat(None, Some(10));
    assert!(bytes_estimate(&req) + 10 > 50, "the body's size alone would refuse it");
    admit(&quota, &req).unwrap();
    // Counted: 2 words, 4 + 3 of format, 10 of output.
    assert_eq!(req.response_header("x-ratelimit-remaining-tokens").as_deref(), Some("31"));
    assert_eq!(admit(&quota, &chat(None, Some(40))).err().map(|e| e.status), Some(429));
}

#[test]
fn a_response_without_usage_keeps_the_estimate_and_a_failed_call_counts_no_tokens() {
    set_now_unix_ms(Some(T0));
    let tokens = json!({"name": "tokens", "limit": 2000, "window": "calendarMonth", "counts": "tokens"});
    let quota = plugin(json!({"rules": [tokens, requests_rule(100)], "defaultMaxTokens": 100})).unwrap();
    let remaining =
        |req: &Request| req.response_header("x-ratelimit-remaining-tokens").unwrap().parse::<u64>().unwrap();
    let first = chat(Some("key:a"), None);
    let pending = admit(&quota, &first).unwrap();
    let estimate = 2000 - remaining(&first);
    assert_eq!(estimate, bytes_estimate(&first) + 100);
    end(&quota, pending, 200, None);
    let second = chat(Some("key:a"), None);
    let pending = admit(&quota, &second).unwrap();
    assert_eq!(remaining(&second), 2000 - 2 * estimate, "the abandoned stream kept its estimate");
    assert_eq!(second.response_header("x-ratelimit-remaining-requests").as_deref(), Some("98"));
    end(&quota, pending, 502, None);
    let third = chat(Some("key:a"), None);
    admit(&quota, &third).unwrap();
    assert_eq!(remaining(&third), 2000 - 2 * estimate, "the failed call gave its tokens back");
    assert_eq!(third.response_header("x-ratelimit-remaining-requests").as_deref(), Some("97"), "and counted");
}

#[test]
fn weighted_tokens_count_output_at_its_weight() {
    set_now_unix_ms(Some(T0));
    let rule = json!({"name": "cost", "limit": 10_000, "window": {"sliding": 3600}, "counts": "weightedTokens",
        "weights": {"input": 1, "output": 4}});
    let quota = plugin(json!({"rules": [rule]})).unwrap();
    let pending = admit(&quota, &chat(None, Some(10))).unwrap();
    end(&quota, pending, 200, Some((100, 50)));
    let req = chat(None, Some(10));
    admit(&quota, &req).unwrap();
    let expected = 10_000 - (100 + 4 * 50) - (bytes_estimate(&req) + 4 * 10);
    assert_eq!(req.response_header("x-ratelimit-remaining-tokens"), Some(expected.to_string()));
}

#[test]
fn rules_apply_by_model_and_consumer_and_the_tightest_refusal_is_named() {
    set_now_unix_ms(Some(T0));
    let minute = json!({"name": "minute", "limit": 1, "window": {"fixed": 60}, "counts": "requests",
        "per": ["consumer"], "models": ["gpt-4o*"]});
    let day = json!({"name": "day", "limit": 1, "window": {"fixed": 86400}, "counts": "requests",
        "per": ["consumer"], "consumers": ["key:a"]});
    let quota = plugin(json!({"rules": [minute, day]})).unwrap();
    admit(&quota, &chat(Some("key:a"), None)).unwrap();
    let error = admit(&quota, &chat(Some("key:a"), None)).err().unwrap();
    assert!(error.message.contains("(day)"), "the day's window ends last: {}", error.message);
    // key:b is under the minute rule only; a model outside it, under none.
    admit(&quota, &chat(Some("key:b"), None)).unwrap();
    assert_eq!(admit(&quota, &chat(Some("key:b"), None)).err().map(|e| e.status), Some(429));
    let other_model = request_with_headers("o3-mini", &[]).with_consumer("key:b");
    admit(&quota, &other_model).unwrap();
}

#[test]
fn shadow_mode_counts_and_reports_but_refuses_nothing() {
    set_now_unix_ms(Some(T0));
    let quota = plugin(json!({"rules": [requests_rule(1)], "shadow": true})).unwrap();
    let first = chat(Some("key:a"), None);
    admit(&quota, &first).unwrap();
    assert_eq!(first.response_header("x-sluice-quota-would-refuse"), None);
    let second = chat(Some("key:a"), None);
    admit(&quota, &second).unwrap();
    assert_eq!(second.response_header("x-sluice-quota-would-refuse").as_deref(), Some("rpm"));
    assert_eq!(second.response_header("x-ratelimit-remaining-requests").as_deref(), Some("0"));
}

#[test]
fn keys_of_different_values_never_meet() {
    set_now_unix_ms(Some(T0));
    let rule = json!({"name": "r", "limit": 1, "window": {"fixed": 60}, "counts": "requests",
        "per": ["consumer", {"header": "x-team"}]});
    let quota = plugin(json!({"rules": [rule]})).unwrap();
    // Joined plainly, both would be `r|a|b|c`: length-prefixed parts keep
    // them apart.
    let one = request_with_headers("m", &[("x-team", "c")]).with_consumer("a|b");
    let two = request_with_headers("m", &[("x-team", "b|c")]).with_consumer("a");
    admit(&quota, &one).unwrap();
    admit(&quota, &two).unwrap();
    // Long values, alike but for their end, are named apart by digest, and
    // the same long value meets itself.
    let long = |end: &str| format!("{}{end}", "t".repeat(300));
    for end in ["1", "2"] {
        admit(&quota, &request_with_headers("m", &[("x-team", &long(end))]).with_consumer("a")).unwrap();
    }
    let again = request_with_headers("m", &[("x-team", &long("1"))]).with_consumer("a");
    assert_eq!(admit(&quota, &again).err().map(|e| e.status), Some(429));
}

#[test]
fn bad_configs_are_refused_with_reasons() {
    let rule = |name: &str, window: Value| json!({"name": name, "limit": 1, "window": window, "counts": "requests"});
    for (config, says) in [
        (json!({"rules": []}), "empty"),
        (json!({"rules": [rule("Bad Name", json!({"fixed": 60}))]}), "a-z"),
        (json!({"rules": [rule("a", json!({"fixed": 0}))]}), "0 seconds"),
        (json!({"rules": [rule("a", json!({"fixed": 60})), rule("a", json!("calendarMonth"))]}), "twice"),
        (json!({"rules": [rule("a", json!({"weekly": 1}))]}), "unknown variant"),
    ] {
        let error = plugin(config.clone()).err().unwrap_or_else(|| panic!("accepted: {config}"));
        assert!(error.contains(says), "{config}: {error}");
    }
}

/// A stream's event carrying `text` as its delta.
fn event(text: &str) -> String {
    json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}}]})
        .to_string()
}

#[test]
fn a_stream_past_the_output_cap_ends_with_an_error_event_and_counts_what_was_sent() {
    set_now_unix_ms(Some(T0));
    let rule = json!({"name": "tokens", "limit": 1000, "window": {"fixed": 60}, "counts": "outputTokens"});
    let quota = plugin(json!({"rules": [rule], "maxOutputTokens": 5})).unwrap();
    assert!(quota.hooks().contains(Hooks::RESPONSE_CHUNK));
    let mut pending = admit(&quota, &chat(None, Some(100))).unwrap();
    // Three words, then three more: the sixth token is past the cap.
    assert_eq!(quota.on_chunk(&event("one two three"), &mut pending), ChunkAction::Pass);
    let ChunkAction::Stop(Some(last)) = quota.on_chunk(&event("four five six"), &mut pending) else {
        panic!("the stream was not ended")
    };
    let error: Value = serde_json::from_str(&last).unwrap();
    assert_eq!(error["error"]["code"], "output_limit_exceeded");
    assert_eq!(quota.on_chunk(&event("seven"), &mut pending), ChunkAction::Drop);
    // No usage came: the output streamed (6) counts, not the 100 reserved.
    end(&quota, pending, 200, None);
    let req = chat(None, Some(100));
    admit(&quota, &req).unwrap();
    assert_eq!(req.response_header("x-ratelimit-remaining-tokens").as_deref(), Some("894"));
    // Without a cap, streams are not read.
    let uncapped = plugin(json!({"rules": [requests_rule(5)]})).unwrap();
    assert!(!uncapped.hooks().contains(Hooks::RESPONSE_CHUNK));
}

#[test]
fn durations_read_as_openai_writes_them() {
    assert_eq!(duration(250), "250ms");
    assert_eq!(duration(1000), "1s");
    assert_eq!(duration(1001), "2s");
    assert_eq!(duration(360_000), "6m0s");
    assert_eq!(duration(3_723_000), "1h2m3s");
}
