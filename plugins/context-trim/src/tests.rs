use serde_json::{Value, json};
use sluice_plugin_sdk::testing::chat_request;

use super::*;

fn plugin(config: Value) -> Result<ContextTrim, String> {
    sluice_plugin_sdk::configure::<ContextTrim>(&config.to_string())
}

/// Runs the request hook; the body sent on (or the error), and what the
/// response headers report as trimmed (`None` without them).
fn run(plugin: &ContextTrim, model: &str, body: Value) -> (Result<Value, ApiError>, Option<Trimmed>) {
    let req = chat_request(model, &body);
    let result = plugin.on_request(&req, &mut ()).map(|action| {
        assert_eq!(action, Action::Continue);
        req.body_json()
    });
    let header = |name: &str| req.response_header(name).map(|value| value.parse::<u32>().unwrap());
    let trimmed = match (header("x-sluice-trimmed-tokens"), header("x-sluice-trimmed-messages")) {
        (Some(tokens), Some(messages)) => Some(Trimmed { tokens, messages }),
        (None, None) => None,
        other => panic!("one trimmed header without the other: {other:?}"),
    };
    (result, trimmed)
}

/// A body's messages as the plugin reads them.
fn messages(body: &Value) -> Vec<Msg> {
    let req = chat_request("m", body);
    read_messages(&req).unwrap()
}

fn words(n: usize) -> String {
    (0..n).map(|i| format!("w{i}")).collect::<Vec<_>>().join(" ")
}

fn tokens(model: &str, body: &Value, config: &Config) -> u32 {
    let tools = body.get("tools").map(Value::to_string);
    Counter::new(model, config).total(&messages(body), tools.as_deref())
}

fn contents(body: &Value) -> Vec<String> {
    body["messages"].as_array().unwrap().iter().map(|m| m["content"].as_str().unwrap_or("").to_string()).collect()
}

#[test]
fn counts_as_documented() {
    let config = plugin(json!({"models": [{"model": "*", "maxInputTokens": 10}]})).unwrap().config;
    // 3 for the reply, then per message 4 + its words (the native stand-in
    // counts each word as one token).
    let body = json!({"model": "m", "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello there you", "name": "ann"}
    ]});
    assert_eq!(tokens("m", &body, &config), 3 + (4 + 2) + (4 + 3 + 1));
    let with_tools = json!({"model": "m", "messages": [], "tools": [{"type": "function"}]});
    assert!(tokens("m", &with_tools, &config) > 3, "tool definitions count");
}

#[test]
fn a_request_within_budget_passes_untouched_with_zero_headers() {
    let plugin = plugin(json!({"models": [{"model": "*", "maxInputTokens": 100}]})).unwrap();
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let (result, state) = run(&plugin, "m", body.clone());
    assert_eq!(result.unwrap(), json!({"messages": [{"role": "user", "content": "hi"}], "model": "m"}));
    assert_eq!(state, Some(Trimmed { tokens: 0, messages: 0 }));
    let req = chat_request("m", &body);
    plugin.on_request(&req, &mut ()).unwrap();
    assert!(!req.body_edited(), "the body is left as the client sent it");
    assert_eq!(
        req.response_headers(),
        [("x-sluice-trimmed-tokens".into(), "0".into()), ("x-sluice-trimmed-messages".into(), "0".into())]
    );
    assert_eq!(plugin.hooks(), Hooks::REQUEST, "no instance is held for the response");
}

#[test]
fn drop_oldest_drops_whole_old_turns_and_keeps_system_and_the_newest_turn() {
    let plugin = plugin(json!({"models": [{"model": "*", "maxInputTokens": 60}]})).unwrap();
    let body = json!({"messages": [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": words(20)},
        {"role": "assistant", "content": words(20)},
        {"role": "user", "content": "second question"},
        {"role": "assistant", "content": "second answer"},
        {"role": "user", "content": "newest"}
    ]});
    let (result, state) = run(&plugin, "m", body.clone());
    let out = result.unwrap();
    assert_eq!(contents(&out), ["rules", "second question", "second answer", "newest"]);
    let trimmed = state.unwrap();
    assert_eq!(trimmed.messages, 2);
    assert_eq!(trimmed.tokens, tokens("m", &body, &plugin.config) - tokens("m", &out, &plugin.config));
    assert!(tokens("m", &out, &plugin.config) <= 60);
}

#[test]
fn drop_oldest_never_splits_tool_calls_from_their_results() {
    let plugin = plugin(json!({"models": [{"model": "*", "maxInputTokens": 45}]})).unwrap();
    let body = json!({"messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": words(30)},
        {"role": "assistant", "content": "sunny"},
        {"role": "user", "content": "thanks"}
    ]});
    let out = run(&plugin, "m", body).0.unwrap();
    let roles: Vec<&str> = out["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user"], "the whole tool turn went: {out}");
}

#[test]
fn the_newest_turn_may_end_in_tool_results() {
    let plugin = plugin(json!({"models": [{"model": "*", "maxInputTokens": 40}]})).unwrap();
    let body = json!({"messages": [
        {"role": "user", "content": words(30)},
        {"role": "user", "content": "look it up"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "result"}
    ]});
    let out = run(&plugin, "m", body).0.unwrap();
    assert_eq!(out["messages"].as_array().unwrap().len(), 3, "{out}");
    assert_eq!(out["messages"][2]["tool_call_id"], "c1");
}

#[test]
fn when_the_minimum_does_not_fit_it_is_a_400() {
    let plugin = plugin(json!({"models": [{"model": "*", "maxInputTokens": 10}]})).unwrap();
    let body = json!({"messages": [{"role": "system", "content": words(5)}, {"role": "user", "content": words(10)}]});
    let (result, state) = run(&plugin, "small-model", body);
    let error = result.unwrap_err();
    assert_eq!((error.status, error.code.as_str()), (400, "context_length_exceeded"));
    assert!(error.message.contains("the input budget for small-model is 10 tokens"), "{}", error.message);
    assert_eq!(state, None);
}

#[test]
fn members_that_count_must_have_their_types() {
    let plugin = plugin(json!({"models": [{"model": "*", "maxInputTokens": 100}]})).unwrap();
    let body = json!({"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "x", "name": 5}]});
    let error = run(&plugin, "m", body).0.unwrap_err();
    assert_eq!((error.status, error.code.as_str()), (400, "invalid_chat_request"));
    assert!(error.message.starts_with("messages[1]: invalid type"), "{}", error.message);
    let error = run(&plugin, "m", json!({"messages": [{"role": "user", "content": 5}]})).0.unwrap_err();
    assert_eq!(error.code, "invalid_chat_request");
}

#[test]
fn context_window_minus_requested_output_is_the_budget() {
    let plugin = plugin(json!({"models": [
        {"model": "*", "maxInputTokens": 1000},
        {"model": "gpt-4o*", "contextWindow": 60, "defaultMaxTokens": 10}
    ]}))
    .unwrap();
    let body = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": words(20)}, {"role": "user", "content": "q"}]});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };
    // 3 + (4 + 20) + (4 + 1) = 32 tokens.
    assert_eq!(run(&plugin, "gpt-4o-mini", body(json!({}))).1.unwrap().messages, 0, "60 - 10 leaves room");
    assert_eq!(run(&plugin, "gpt-4o-mini", body(json!({"max_tokens": 40}))).1.unwrap().messages, 1, "60 - 40 = 20");
    let (_, state) = run(&plugin, "gpt-4o-mini", body(json!({"max_completion_tokens": 50, "max_tokens": 1})));
    assert_eq!(state.unwrap().messages, 1, "max_completion_tokens wins over max_tokens");
    let error = run(&plugin, "gpt-4o", body(json!({"max_tokens": 60}))).0.unwrap_err();
    assert_eq!(error.code, "context_length_exceeded");
    assert!(error.message.contains("max_tokens 60 leaves no room"), "{}", error.message);
    assert_eq!(run(&plugin, "llama", body(json!({"max_tokens": 5000}))).1.unwrap().messages, 0, "the * budget");
}

#[test]
fn models_without_a_budget_pass_and_other_endpoints_are_refused() {
    let plugin = plugin(json!({"models": [{"model": "gpt-*", "maxInputTokens": 1}]})).unwrap();
    let body = json!({"messages": [{"role": "user", "content": words(50)}]});
    let (result, state) = run(&plugin, "llama", body.clone());
    assert!(result.is_ok());
    assert_eq!(state, None, "no headers for a model without a budget");
    // Endpoints it cannot read, the Responses API among them, are refused
    // rather than passed untrimmed.
    for path in ["/v1/embeddings", "/v1/responses", "/v1/completions"] {
        let req = chat_request("gpt-x", &json!({"input": words(50)})).with_path(path);
        let error = plugin.on_request(&req, &mut ()).unwrap_err();
        assert_eq!((error.status, error.code.as_str()), (400, "unsupported_endpoint"), "{path}");
        assert!(!req.body_edited());
    }
}

#[test]
fn truncate_middle_cuts_the_longest_unprotected_message_with_a_marker() {
    let plugin = plugin(json!({"strategy": "truncate-middle", "marker": " [cut] ",
        "models": [{"model": "*", "maxInputTokens": 80}]}))
    .unwrap();
    let long = words(100);
    let body = json!({"messages": [
        {"role": "system", "content": words(10)},
        {"role": "user", "content": words(5)},
        {"role": "assistant", "content": long},
        {"role": "user", "content": words(8)}
    ]});
    let (result, state) = run(&plugin, "m", body.clone());
    let out = result.unwrap();
    let texts = contents(&out);
    assert_eq!(texts[0], words(10), "system kept");
    assert_eq!(texts[1], words(5));
    assert_eq!(texts[3], words(8), "newest user message kept");
    assert!(texts[2].starts_with("w0 w1") && texts[2].ends_with("w98 w99"), "{}", texts[2]);
    assert!(texts[2].contains(" [cut] "));
    let total = tokens("m", &out, &plugin.config);
    assert!((70..=80).contains(&total), "cut to the budget, not far below: {total}");
    assert_eq!(state.unwrap().messages, 1);
}

#[test]
fn truncate_middle_can_cut_the_newest_user_message_when_allowed() {
    let body = json!({"messages": [{"role": "user", "content": words(200)}]});
    let strict =
        plugin(json!({"strategy": "truncate-middle", "models": [{"model": "*", "maxInputTokens": 50}]})).unwrap();
    assert_eq!(run(&strict, "m", body.clone()).0.unwrap_err().code, "context_length_exceeded");
    let lenient = plugin(json!({"strategy": "truncate-middle", "protectLatestUser": false,
        "models": [{"model": "*", "maxInputTokens": 50}]}))
    .unwrap();
    let out = run(&lenient, "m", body).0.unwrap();
    assert!(tokens("m", &out, &lenient.config) <= 50);
}

#[test]
fn truncate_middle_handles_multibyte_text_and_parts() {
    let plugin =
        plugin(json!({"strategy": "truncate-middle", "models": [{"model": "*", "maxInputTokens": 40}]})).unwrap();
    let body = json!({"messages": [
        {"role": "user", "content": [{"type": "text", "text": "日本語 ".repeat(60)}, {"type": "image_url", "image_url": {"url": "u"}}]},
        {"role": "user", "content": "q"}
    ]});
    let out = run(&plugin, "m", body).0.unwrap();
    assert_eq!(out["messages"][0]["content"][1]["type"], "image_url", "other parts kept");
    assert!(tokens("m", &out, &plugin.config) <= 40);
}

#[test]
fn bad_configs_are_rejected() {
    let error = |config: Value| plugin(config).err().unwrap();
    assert!(error(json!({"models": []})).contains("`models` is empty"));
    assert!(error(json!({"models": [{"model": "*"}]})).contains("set `maxInputTokens` or `contextWindow`"));
    assert!(error(json!({"models": [{"model": "*", "maxInputTokens": 1, "contextWindow": 2}]})).contains("not both"));
    assert!(error(json!({"models": [{"model": "*", "contextWindow": 2, "defaultMaxTokens": 2}]})).contains("no room"));
    assert!(
        error(json!({"strategy": "summarize", "models": [{"model": "*", "maxInputTokens": 1}]}))
            .contains("unknown variant")
    );
    assert!(error(json!({"models": [{"model": "", "maxInputTokens": 1}]})).contains("cannot be empty"));
}

/// A small deterministic generator (xorshift64*), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A random conversation: system messages, user turns, assistant replies,
/// tool calls followed by their results, multi-part contents.
fn random_conversation(rng: &mut Rng) -> Vec<Value> {
    let mut messages = Vec::new();
    let mut call = 0;
    if rng.below(2) == 0 {
        messages.push(json!({"role": "system", "content": words(rng.below(30) as usize)}));
    }
    for _ in 0..=rng.below(8) {
        if rng.below(5) == 0 {
            let parts = json!([{"type": "text", "text": words(rng.below(30) as usize)},
                {"type": "image_url", "image_url": {"url": "u"}}, {"type": "text", "text": words(rng.below(30) as usize)}]);
            messages.push(json!({"role": "user", "content": parts}));
        } else {
            messages.push(json!({"role": "user", "content": words(rng.below(60) as usize)}));
        }
        if rng.below(4) == 0 {
            messages.push(json!({"role": "system", "content": words(rng.below(5) as usize)}));
        }
        for _ in 0..rng.below(3) {
            if rng.below(2) == 0 {
                let ids: Vec<String> = (0..=rng.below(2))
                    .map(|_| {
                        call += 1;
                        format!("call_{call}")
                    })
                    .collect();
                let calls: Vec<Value> = ids
                    .iter()
                    .map(|id| {
                        let arguments = format!("{{\"q\": \"{}\"}}", words(rng.below(10) as usize));
                        json!({"id": id, "type": "function", "function": {"name": "f", "arguments": arguments}})
                    })
                    .collect();
                messages.push(json!({"role": "assistant", "content": "", "tool_calls": calls}));
                for id in ids {
                    messages
                        .push(json!({"role": "tool", "tool_call_id": id, "content": words(rng.below(80) as usize)}));
                }
            } else {
                messages.push(json!({"role": "assistant", "content": words(rng.below(60) as usize)}));
            }
        }
    }
    messages
}

/// Every tool result follows the assistant message that called it, and
/// every call kept has its results kept.
fn tool_pairs_intact(messages: &[Value]) -> bool {
    let mut open: Vec<&str> = Vec::new();
    for message in messages {
        if let Some(id) = message["tool_call_id"].as_str() {
            match open.iter().position(|o| *o == id) {
                Some(at) => {
                    open.remove(at);
                }
                None => return false,
            }
        } else {
            if !open.is_empty() {
                return false;
            }
            open.extend(message["tool_calls"].as_array().into_iter().flatten().filter_map(|c| c["id"].as_str()));
        }
    }
    open.is_empty()
}

#[test]
fn randomised_results_are_within_budget_or_a_400() {
    let mut rng = Rng(0x5EED_C0FF_EE00_0001);
    let (mut fitted, mut refused, mut trimmed) = (0, 0, 0);
    for case in 0..600 {
        let strategy = if case % 2 == 0 { "drop-oldest" } else { "truncate-middle" };
        let protect = rng.below(2) == 0;
        let conversation = random_conversation(&mut rng);
        let original = json!({"messages": conversation});
        let config = json!({"strategy": strategy, "protectLatestUser": protect,
            "models": [{"model": "*", "maxInputTokens": 1}]});
        let counter_config = plugin(config).unwrap().config;
        let full = tokens("m", &original, &counter_config);
        // The shortcut past counting is sound only if the bound never
        // undercounts.
        let bound = Counter::new("m", &counter_config).upper_bound(&messages(&original), None);
        assert!(bound >= u64::from(full), "case {case}: byte bound {bound} under the count {full}");
        let budget = rng.below(u64::from(full) * 3 / 2 + 1) as u32;
        let plugin = plugin(json!({"strategy": strategy, "protectLatestUser": protect,
            "models": [{"model": "*", "maxInputTokens": budget}]}))
        .unwrap();
        let (result, state) = run(&plugin, "m", original.clone());
        let what = format!("case {case} ({strategy}, budget {budget}, full {full})");
        match result {
            Ok(out) => {
                let total = tokens("m", &out, &plugin.config);
                assert!(total <= budget, "{what}: {total} tokens");
                let sent = out["messages"].as_array().unwrap();
                let is_system = |m: &&Value| m["role"] == "system" || m["role"] == "developer";
                let systems = |m: &[Value]| m.iter().filter(is_system).cloned().collect::<Vec<_>>();
                assert_eq!(systems(sent), systems(&conversation), "{what}: system messages kept");
                assert!(tool_pairs_intact(sent), "{what}: tool calls split from results");
                let newest_user = |m: &[Value]| m.iter().rfind(|m| m["role"] == "user").cloned();
                if strategy == "drop-oldest" || protect {
                    assert_eq!(newest_user(sent), newest_user(&conversation), "{what}: newest user turn kept");
                }
                let state = state.unwrap();
                assert_eq!(state.tokens, full - total, "{what}: reported tokens");
                if state.messages > 0 {
                    trimmed += 1;
                }
                fitted += 1;
            }
            Err(error) => {
                assert_eq!((error.status, error.code.as_str()), (400, "context_length_exceeded"), "{what}");
                assert!(budget < full, "{what}: refused a request that fit");
                assert_eq!(state, None, "{what}: no headers on an error");
                refused += 1;
            }
        }
    }
    // The generator must exercise every outcome, or the test proves little.
    assert!(fitted > 100 && refused > 50 && trimmed > 100, "fitted {fitted}, refused {refused}, trimmed {trimmed}");
}

/// A body that fits unread would have fitted read: its size (plus the
/// per-message overhead) bounds what counting would start from, escapes,
/// non-ASCII text, names and tool calls included.
#[test]
fn the_body_size_bounds_what_counting_reads() {
    let bodies = [
        json!({"messages": [{"role": "user", "content": "héllo \"quoted\" \\ \u{1F600} done"}]}),
        json!({"messages": [{"role": "user", "content": "hi", "name": "ann"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
                "function": {"name": "lookup", "arguments": "{\"q\": \"\\u00e9\"}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "result"}]}]}),
        json!({"messages": [{"role": "system", "content": words(200)}, {"role": "user", "content": ""}]}),
    ];
    let mut unread = 0;
    for body in bodies {
        let req = chat_request("m", &body);
        let size = req.body_size();
        for budget in [size as u32, size as u32 + 50, size as u32 + 500] {
            let plugin = plugin(json!({"models": [{"model": "*", "maxInputTokens": budget}]})).unwrap();
            if plugin.fits_unread(&req, budget).unwrap() {
                unread += 1;
                let counter = Counter::new("m", &plugin.config);
                assert!(counter.upper_bound(&messages(&body), None) <= u64::from(budget), "{body}");
                let (result, trimmed) = run(&plugin, "m", body.clone());
                assert_eq!(result.unwrap(), serde_json::from_slice::<Value>(&req.body()).unwrap());
                assert_eq!(trimmed.map(|t| (t.tokens, t.messages)), Some((0, 0)));
            }
        }
        // With `tools` it always reads.
        let mut with_tools = body.clone();
        with_tools["tools"] = json!([{"type": "function", "function": {"name": "f", "parameters": {"x": 1e10}}}]);
        let plugin = plugin(json!({"models": [{"model": "*", "maxInputTokens": 1_000_000}]})).unwrap();
        assert!(!plugin.fits_unread(&chat_request("m", &with_tools), 1_000_000).unwrap());
    }
    assert!(unread >= 3, "only {unread} cases fitted unread");
}
