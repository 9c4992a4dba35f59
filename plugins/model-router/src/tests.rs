use std::cell::Cell;
use std::rc::Rc;

use serde_json::{Value, json};
use sluice_plugin_sdk::outbound::{self, Error};
use sluice_plugin_sdk::testing::{self, chat_request, counter, observations, on_outbound, outbound_requests};

use super::*;
use crate::semantic::{MAX_TEXT_BYTES, cosine};

/// A router for `config`; the metrics are reset first, as the gateway takes
/// one declaration per plugin and a test may configure several.
fn router(config: Value) -> ModelRouter {
    testing::reset_metrics();
    sluice_plugin_sdk::configure::<ModelRouter>(&config.to_string()).unwrap_or_else(|e| panic!("{e}"))
}

fn config_error(config: Value) -> String {
    testing::reset_metrics();
    sluice_plugin_sdk::configure::<ModelRouter>(&config.to_string()).err().expect("the config is rejected")
}

fn chat(model: &str, messages: Value) -> Request {
    chat_request(model, &json!({"messages": messages}))
}

fn user(text: &str) -> Request {
    chat("auto", json!([{"role": "user", "content": text}]))
}

/// Runs the hook on `req`: the model routed to (the request goes on).
fn route(router: &ModelRouter, req: &Request) -> Option<String> {
    assert_eq!(router.on_request(req, &mut ()), Ok(Action::Continue));
    req.routed_model()
}

fn decisions(model: &str, reason: &str) -> u64 {
    counter(DECISIONS, &[model, reason])
}

/// The rules of the README's example.
fn rules_config() -> Value {
    json!({
        "rules": [
            {"model": "gpt-4o-mini", "when": {"maxPromptTokens": 12}},
            {"model": "code-model", "when": {"keywords": ["stack trace", "COMPILE"]}},
            {"model": "premium", "when": {"consumers": ["key:vip"]}}
        ],
        "default": "gpt-4o",
        "header": "X-Sluice-Routed-Model"
    })
}

const LONG: &str = "Please read the following paragraph carefully and then tell me, in your own words, \
    what the author most likely meant by it, which arguments support that reading, and which do not.";

#[test]
fn requests_for_other_models_pass_untouched() {
    let router = router(rules_config());
    let req = chat("gpt-4o", json!([{"role": "user", "content": "hi"}]));
    assert_eq!(route(&router, &req), None);
    assert!(!req.body_edited());
    assert_eq!(req.host_calls(), ["model"], "nothing else is read");
    assert!(req.response_headers().is_empty());
    assert_eq!(decisions("gpt-4o", "default"), 0);
}

#[test]
fn a_short_prompt_matches_max_prompt_tokens() {
    let router = router(rules_config());
    let req = user("Hi there!");
    assert_eq!(route(&router, &req).as_deref(), Some("gpt-4o-mini"));
    assert_eq!(req.body_json()["model"], "gpt-4o-mini", "the body's model is rewritten");
    assert_eq!(req.response_header("x-sluice-routed-model").as_deref(), Some("gpt-4o-mini"));
    assert_eq!(decisions("gpt-4o-mini", "rule"), 1);
    assert_eq!(route(&router, &user(LONG)).as_deref(), Some("gpt-4o"), "over 12 tokens");
}

#[test]
fn a_body_smaller_than_max_prompt_tokens_is_not_read() {
    let router = router(json!({"rules": [{"model": "small", "when": {"maxPromptTokens": 400}}], "default": "large"}));
    let req = user("Hi there!");
    assert!(req.body_size() <= 400);
    assert_eq!(route(&router, &req).as_deref(), Some("small"));
    // The test's own `body-size` first, then the hook's.
    assert_eq!(req.host_calls(), ["body-size", "model", "path", "body-size", "set-model"], "nothing else is read");
}

#[test]
fn tokens_are_counted_on_every_message_when_the_body_is_too_big_to_tell() {
    let router = router(json!({"rules": [{"model": "small", "when": {"maxPromptTokens": 12}}], "default": "large"}));
    // Seven tokens of text (the native stand-in counts words and
    // punctuation), in a body far over 12 bytes: counted, and it fits.
    let req =
        chat("auto", json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi, you!"}]));
    assert!(req.body_size() > 12);
    assert_eq!(host::count_tokens("small", "Be brief.\nHi, you!"), 7);
    assert_eq!(route(&router, &req).as_deref(), Some("small"));
    assert!(req.host_calls().contains(&"messages".to_string()));
    // The system message counts too: 13 tokens do not fit.
    let req = chat(
        "auto",
        json!([{"role": "system", "content": "Be brief, be kind, be right."}, {"role": "user", "content": "Hi, you!"}]),
    );
    assert_eq!(route(&router, &req).as_deref(), Some("large"));
    assert_eq!((decisions("small", "rule"), decisions("large", "default")), (1, 1));
}

#[test]
fn min_prompt_tokens_routes_long_prompts() {
    let router = router(json!({
        "rules": [{"model": "large", "when": {"minPromptTokens": 100}}],
        "default": "small"
    }));
    let long = LONG.repeat(3);
    assert!(host::count_tokens("large", &long) >= 100);
    assert_eq!(route(&router, &user(&long)).as_deref(), Some("large"));
    let short = user("Hi");
    assert!(short.body_size() < 100);
    assert_eq!(route(&router, &short).as_deref(), Some("small"));
    assert!(!short.host_calls().contains(&"messages".to_string()), "a body under 100 bytes is not read");
    let medium = user(LONG);
    assert!(medium.body_size() >= 100);
    assert_eq!(route(&router, &medium).as_deref(), Some("small"), "counted: under 100 tokens");
    assert!(medium.host_calls().contains(&"messages".to_string()));
}

#[test]
fn keywords_match_the_last_user_message_in_any_case() {
    let router = router(rules_config());
    let long_with = format!("{LONG} Here is the STACK TRACE I get.");
    assert_eq!(route(&router, &user(&long_with)).as_deref(), Some("code-model"));
    let long_with = format!("{LONG} Why won't it compile?");
    assert_eq!(route(&router, &user(&long_with)).as_deref(), Some("code-model"), "COMPILE in the config");
    // A keyword in an earlier user message or an assistant message is not
    // the last user message.
    let req = chat(
        "auto",
        json!([
            {"role": "user", "content": "here is a stack trace"},
            {"role": "assistant", "content": "it does not compile"},
            {"role": "user", "content": LONG}
        ]),
    );
    assert_eq!(route(&router, &req).as_deref(), Some("gpt-4o"));
    // Text parts are read.
    let req = chat(
        "auto",
        json!([{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://x"}},
            {"type": "text", "text": format!("{LONG} stack trace attached")}
        ]}]),
    );
    assert_eq!(route(&router, &req).as_deref(), Some("code-model"));
    assert_eq!(decisions("code-model", "rule"), 3);
}

#[test]
fn consumers_match_who_the_auth_phase_named() {
    let router = router(rules_config());
    assert_eq!(route(&router, &user(LONG).with_consumer("key:vip")).as_deref(), Some("premium"));
    assert_eq!(route(&router, &user(LONG).with_consumer("key:other")).as_deref(), Some("gpt-4o"));
    assert_eq!(route(&router, &user(LONG)).as_deref(), Some("gpt-4o"), "no consumer");
}

#[test]
fn the_first_matching_rule_wins_and_every_condition_of_a_rule_must_hold() {
    let router = router(json!({
        "rules": [
            {"model": "vip-code", "when": {"consumers": ["key:vip"], "keywords": ["code"]}},
            {"model": "code", "when": {"keywords": ["code"]}},
            {"model": "vip", "when": {"consumers": ["key:vip"]}}
        ],
        "default": "plain"
    }));
    let cases = [
        (Some("key:vip"), "some code", "vip-code"),
        (None, "some code", "code"),
        (Some("key:vip"), "a poem", "vip"),
        (Some("key:x"), "a poem", "plain"),
    ];
    for (consumer, text, expected) in cases {
        let req = user(text);
        let req = match consumer {
            Some(consumer) => req.with_consumer(consumer),
            None => req,
        };
        assert_eq!(route(&router, &req).as_deref(), Some(expected), "{consumer:?} {text}");
    }
}

#[test]
fn the_default_applies_when_nothing_matches_and_aliases_are_configurable() {
    let router = router(json!({"aliases": ["router", "fast"], "rules": [], "default": "gpt-4o"}));
    assert_eq!(route(&router, &chat("router", json!([{"role": "user", "content": "x"}]))).as_deref(), Some("gpt-4o"));
    assert_eq!(route(&router, &chat("fast", json!([]))).as_deref(), Some("gpt-4o"));
    assert_eq!(route(&router, &chat("auto", json!([]))), None, "`auto` is not an alias here");
    assert_eq!(decisions("gpt-4o", "default"), 2);
}

#[test]
fn an_alias_on_an_endpoint_it_does_not_read_is_refused() {
    let router = router(rules_config());
    let req = chat_request("auto", &json!({"input": "hello"})).with_path("/v1/embeddings");
    let error = router.on_request(&req, &mut ()).unwrap_err();
    assert_eq!((error.status, error.code.as_str()), (400, "unsupported_endpoint"));
    assert_eq!(req.routed_model(), None);
    // Another model on that endpoint is not this router's business.
    let req = chat_request("text-embedding-3-small", &json!({"input": "hello"})).with_path("/v1/embeddings");
    assert_eq!(route(&router, &req), None);
}

#[test]
fn a_body_that_is_not_a_chat_request_is_a_400_when_a_rule_reads_it() {
    let router = router(rules_config());
    let req = chat_request("auto", &json!({"messages": "not a list", "pad": LONG}));
    let error = router.on_request(&req, &mut ()).unwrap_err();
    assert_eq!((error.status, error.code.as_str()), (400, "invalid_chat_request"));
}

// Semantic routing.

/// The test's embeddings: a bag of words, each word (lower case, letters
/// and digits) hashed into one of 1024 dimensions. Texts that share words
/// are similar, whatever language the rest is in.
fn bag_of_words(text: &str) -> Vec<f32> {
    let mut v = vec![0.0f32; 1024];
    for word in text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
        let hash = word
            .to_lowercase()
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
        v[(hash % 1024) as usize] += 1.0;
    }
    v
}

fn inputs(request: &outbound::Request) -> Vec<String> {
    let body: Value = serde_json::from_slice(&request.body).unwrap();
    body["input"].as_array().unwrap().iter().map(|i| i.as_str().unwrap().to_string()).collect()
}

/// Answers as OpenAI's embeddings endpoint does, with [`bag_of_words`],
/// indexes in reverse order (they are not promised in order).
fn embeddings_server() {
    on_outbound(|request| {
        let data: Vec<Value> = inputs(request)
            .iter()
            .enumerate()
            .rev()
            .map(|(i, text)| json!({"object": "embedding", "index": i, "embedding": bag_of_words(text)}))
            .collect();
        let body = json!({"object": "list", "data": data, "model": "bow"});
        Ok(outbound::Response { status: 200, headers: vec![], body: body.to_string().into_bytes() })
    });
}

fn semantic_config() -> Value {
    json!({
        "rules": [{"model": "gpt-4o-mini", "when": {"maxPromptTokens": 3}}],
        "semantic": {
            "embeddings": {"url": "http://embed.internal:8080/v1/embeddings", "model": "text-embedding-3-small",
                           "apiKey": "sk-test", "timeoutMs": 800},
            "routes": [
                {"model": "code-model",
                 "examples": ["write a function that parses json", "why does this compile error happen"]},
                {"model": "writer", "examples": ["write a poem about the sea"]}
            ],
            "threshold": 0.4
        },
        "default": "gpt-4o"
    })
}

#[test]
fn the_test_embeddings_are_similar_for_shared_words() {
    // Three shared words of six and eight: 3 / sqrt(48).
    let spanish = "escribe una function que parses json por favor";
    let code = cosine(&bag_of_words("write a function that parses json"), &bag_of_words(spanish));
    assert!((code - 3.0 / 48f64.sqrt()).abs() < 1e-6, "{code}");
    assert_eq!(cosine(&bag_of_words("write a poem about the sea"), &bag_of_words(spanish)), 0.0);
    assert_eq!(cosine(&bag_of_words("write a function that parses json"), &bag_of_words("bonjour mon ami")), 0.0);
}

#[test]
fn a_prompt_near_an_example_routes_to_its_model_in_any_language() {
    embeddings_server();
    let router = router(semantic_config());
    let req = user("escribe una function que parses json por favor");
    assert_eq!(route(&router, &req).as_deref(), Some("code-model"));
    assert_eq!(decisions("code-model", "semantic"), 1);

    // One call: the three examples, then the prompt, with the key and a
    // deadline within the configured 800 ms.
    let sent = outbound_requests();
    assert_eq!(sent.len(), 1);
    assert_eq!((sent[0].method.as_str(), sent[0].url.as_str()), ("POST", "http://embed.internal:8080/v1/embeddings"));
    let headers: Vec<(&str, &str)> = sent[0].headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    assert_eq!(headers, [("content-type", "application/json"), ("authorization", "Bearer sk-test")]);
    assert!(sent[0].timeout_ms.is_some_and(|ms| (1..=800).contains(&ms)), "{:?}", sent[0].timeout_ms);
    let body: Value = serde_json::from_slice(&sent[0].body).unwrap();
    assert_eq!(body["model"], "text-embedding-3-small");
    assert_eq!(
        inputs(&sent[0]),
        [
            "write a function that parses json",
            "why does this compile error happen",
            "write a poem about the sea",
            "escribe una function que parses json por favor"
        ]
    );
    assert_eq!((counter(EXAMPLE_EMBEDDINGS, &[]), observations(EMBEDDING_SECONDS, &[]).len()), (1, 1));
}

#[test]
fn the_examples_are_embedded_once_per_instance() {
    embeddings_server();
    let reused = router(semantic_config());
    let prompts = [
        "could you write me a poem about the sea tonight",
        "pourquoi does ce compile error happen",
        "bonjour mon ami, ça va bien?",
    ];
    let routed: Vec<Option<String>> = prompts.iter().map(|p| route(&reused, &user(p))).collect();
    assert_eq!(routed, [Some("writer".into()), Some("code-model".into()), Some("gpt-4o".into())]);
    let sent: Vec<usize> = outbound_requests().iter().map(|r| inputs(r).len()).collect();
    assert_eq!(sent, [4, 1, 1], "the examples went once, with the first prompt");
    assert_eq!(inputs(&outbound_requests()[2]), [prompts[2]]);
    assert_eq!(counter(EXAMPLE_EMBEDDINGS, &[]), 1);
    assert_eq!(
        (decisions("writer", "semantic"), decisions("code-model", "semantic"), decisions("gpt-4o", "default")),
        (1, 1, 1)
    );

    // A fresh instance (what `isolation: PerRequest` gives every request)
    // embeds them again.
    let fresh = router(semantic_config());
    assert_eq!(route(&fresh, &user(prompts[0])).as_deref(), Some("writer"));
    assert_eq!(inputs(outbound_requests().last().unwrap()).len(), 4);
    assert_eq!(counter(EXAMPLE_EMBEDDINGS, &[]), 1, "counted since the reset");
}

#[test]
fn a_matching_rule_makes_no_embeddings_call() {
    embeddings_server();
    let router = router(semantic_config());
    assert_eq!(route(&router, &user("hi")).as_deref(), Some("gpt-4o-mini"));
    assert_eq!(outbound_requests().len(), 0);
    // Nor does a request without user text: nothing to compare.
    let req = chat("auto", json!([{"role": "system", "content": "You are a helpful assistant."}]));
    assert_eq!(route(&router, &req).as_deref(), Some("gpt-4o"));
    assert_eq!(outbound_requests().len(), 0);
    assert_eq!(decisions("gpt-4o", "default"), 1);
}

#[test]
fn below_the_threshold_the_default_applies() {
    embeddings_server();
    let mut config = semantic_config();
    config["semantic"]["threshold"] = json!(0.95);
    let router = router(config);
    let req = user("escribe una function que parses json por favor");
    assert_eq!(route(&router, &req).as_deref(), Some("gpt-4o"));
    assert_eq!(decisions("gpt-4o", "default"), 1);
    let best = router.semantic.as_ref().unwrap().best("escribe una function que parses json por favor").unwrap();
    let (route, score) = best.unwrap();
    assert_eq!(route, 0, "the code route is nearest");
    assert!((0.4..0.95).contains(&score), "{score}");
}

#[test]
fn an_embeddings_failure_routes_to_the_default_counted_and_caches_nothing() {
    let router = router(semantic_config());
    let prompt = "escribe una function que parses json por favor";
    type Answer = Rc<dyn Fn() -> Result<outbound::Response, Error>>;
    let failures: [(&str, Answer); 6] = [
        ("timeout", Rc::new(|| Err(Error::Timeout))),
        ("refused", Rc::new(|| Err(Error::Refused("the destination is not granted (spec.egress)".into())))),
        ("failed", Rc::new(|| Err(Error::Failed("ConnectionRefused".into())))),
        ("too_large", Rc::new(|| Err(Error::TooLarge))),
        ("status", Rc::new(|| Ok(outbound::Response { status: 429, headers: vec![], body: b"{}".to_vec() }))),
        ("invalid", Rc::new(|| Ok(outbound::Response { status: 200, headers: vec![], body: b"<html>".to_vec() }))),
    ];
    for (kind, answer) in failures {
        on_outbound(move |_| answer());
        let req = user(prompt);
        assert_eq!(route(&router, &req).as_deref(), Some("gpt-4o"), "{kind}");
        assert_eq!(counter(EMBEDDING_ERRORS, &[kind]), 1, "{kind}");
    }
    assert_eq!(decisions("gpt-4o", "error"), 6);
    assert_eq!(decisions("gpt-4o", "default"), 0);
    assert_eq!(counter(EXAMPLE_EMBEDDINGS, &[]), 0);
    // Every attempt sent the examples: a failure kept nothing.
    assert!(outbound_requests().iter().all(|r| inputs(r).len() == 4));
    // The endpoint is back: routed, and the examples kept from now on.
    embeddings_server();
    assert_eq!(route(&router, &user(prompt)).as_deref(), Some("code-model"));
    assert_eq!(route(&router, &user(prompt)).as_deref(), Some("code-model"));
    let sizes: Vec<usize> = outbound_requests().iter().skip(6).map(|r| inputs(r).len()).collect();
    assert_eq!(sizes, [4, 1]);
}

#[test]
fn malformed_embeddings_are_failures() {
    let router = router(semantic_config());
    let cases = [
        (json!({"data": []}), "0 embeddings came back for 4 inputs"),
        (
            json!({"data": [{"index": 0, "embedding": [1.0]}, {"index": 0, "embedding": [1.0]},
                          {"index": 1, "embedding": [1.0]}, {"index": 2, "embedding": [1.0]}]}),
            "the same index",
        ),
        (
            json!({"data": [{"index": 9, "embedding": [1.0]}, {"index": 1, "embedding": [1.0]},
                          {"index": 2, "embedding": [1.0]}, {"index": 3, "embedding": [1.0]}]}),
            "out of range",
        ),
        (
            json!({"data": [{"embedding": [1.0]}, {"embedding": [1.0, 2.0]},
                            {"embedding": [1.0]}, {"embedding": [1.0]}]}),
            "differ in dimensions",
        ),
        (json!({"data": [{"embedding": []}, {"embedding": []}, {"embedding": []}, {"embedding": []}]}), "empty"),
    ];
    for (body, why) in cases {
        on_outbound(move |_| {
            Ok(outbound::Response { status: 200, headers: vec![], body: body.to_string().into_bytes() })
        });
        let failure = router.semantic.as_ref().unwrap().best("escribe una function").unwrap_err();
        assert_eq!(failure.kind, "invalid");
        assert!(failure.detail.contains(why), "{why}: {}", failure.detail);
    }
}

#[test]
fn an_endpoint_that_changes_dimensions_has_the_examples_embedded_again() {
    let dimensions = Rc::new(Cell::new(1024usize));
    let seen = dimensions.clone();
    on_outbound(move |request| {
        let data: Vec<Value> = inputs(request)
            .iter()
            .enumerate()
            .map(|(i, text)| json!({"index": i, "embedding": bag_of_words(text)[..seen.get()].to_vec()}))
            .collect();
        Ok(outbound::Response { status: 200, headers: vec![], body: json!({"data": data}).to_string().into_bytes() })
    });
    let router = router(semantic_config());
    let prompt = "escribe una function que parses json por favor";
    assert_eq!(route(&router, &user(prompt)).as_deref(), Some("code-model"));
    dimensions.set(512);
    assert_eq!(route(&router, &user(prompt)).as_deref(), Some("gpt-4o"));
    assert_eq!(counter(EMBEDDING_ERRORS, &["invalid"]), 1);
    dimensions.set(1024);
    assert_eq!(route(&router, &user(prompt)).as_deref(), Some("code-model"));
    let sizes: Vec<usize> = outbound_requests().iter().map(|r| inputs(r).len()).collect();
    assert_eq!(sizes, [4, 1, 4], "embedded again after the change");
}

#[test]
fn examples_go_in_batches_and_come_back_in_order() {
    embeddings_server();
    let mut config = semantic_config();
    config["semantic"]["embeddings"]["batchSize"] = json!(3);
    let router = router(config);
    assert_eq!(route(&router, &user("write a poem about the sea please")).as_deref(), Some("writer"));
    let sizes: Vec<usize> = outbound_requests().iter().map(|r| inputs(r).len()).collect();
    assert_eq!(sizes, [3, 1]);
    assert_eq!(inputs(&outbound_requests()[1]), ["write a poem about the sea please"]);
}

#[test]
fn a_long_prompt_is_embedded_by_its_beginning() {
    embeddings_server();
    let router = router(semantic_config());
    let long = format!("write a poem about the sea {}", "é".repeat(MAX_TEXT_BYTES));
    assert_eq!(route(&router, &user(&long)).as_deref(), Some("writer"));
    let sent = inputs(&outbound_requests()[0]);
    let prompt = sent.last().unwrap();
    assert!(prompt.len() <= MAX_TEXT_BYTES && prompt.len() >= MAX_TEXT_BYTES - 1, "{}", prompt.len());
    assert!(long.starts_with(prompt.as_str()));
}

// Configuration.

#[test]
fn config_errors_name_fields_and_never_quote_values() {
    let secret = "hunter2-planted";
    let semantic = |patch: &dyn Fn(&mut Value)| {
        let mut config = semantic_config();
        patch(&mut config);
        config
    };
    let cases: Vec<(Value, &str)> = vec![
        (json!({"rules": []}), "missing field `default`"),
        (json!({"default": "m", "extra": secret}), "unknown field `extra`"),
        (json!({"default": "m", "rules": [{"model": "x", "when": {"tokens": 3}}]}), "unknown field `tokens`"),
        (json!({"default": "m", "aliases": []}), "`aliases` is empty"),
        (json!({"default": "m", "aliases": ["auto", " "]}), "`aliases[1]` is empty"),
        (json!({"default": "auto"}), "`default` is one of the `aliases`"),
        (json!({"default": ""}), "`default` is empty"),
        (
            json!({"default": "m", "rules": [{"model": "auto", "when": {"keywords": ["x"]}}]}),
            "`rules[0].model` is one of the `aliases`",
        ),
        (json!({"default": "m", "rules": [{"model": "x", "when": {}}]}), "`rules[0].when` names no condition"),
        (
            json!({"default": "m", "rules": [
                {"model": "x", "when": {"keywords": ["a"]}},
                {"model": "y", "when": {"keywords": [secret, ""]}}
            ]}),
            "`rules[1].when.keywords[1]` is empty",
        ),
        (
            json!({"default": "m", "rules": [{"model": "x", "when": {"consumers": []}}]}),
            "`rules[0].when.consumers` is empty",
        ),
        (
            json!({"default": "m", "rules": [{"model": "x", "when": {"minPromptTokens": 10, "maxPromptTokens": 5}}]}),
            "`rules[0].when.minPromptTokens` is above its `maxPromptTokens`",
        ),
        (
            json!({"default": "m", "rules": [{"model": "x", "when": {"maxPromptTokens": -1}}]}),
            "invalid value at `rules[0].when.maxPromptTokens`",
        ),
        (json!({"default": "m", "header": format!("{secret} x")}), "`header` is not a valid HTTP header name"),
        (
            semantic(&|c| c["semantic"]["embeddings"]["url"] = json!(format!("ftp://{secret}/"))),
            "`semantic.embeddings.url` must start with http:// or https://",
        ),
        (
            semantic(&|c| c["semantic"]["embeddings"]["url"] = json!(format!("https://user:{secret}@host/v1"))),
            "`semantic.embeddings.url` has credentials in it",
        ),
        (
            semantic(&|c| c["semantic"]["embeddings"]["url"] = json!("https:///v1/embeddings")),
            "`semantic.embeddings.url` has no host",
        ),
        (
            semantic(&|c| c["semantic"]["embeddings"]["apiKey"] = json!(format!("{secret}\n"))),
            "`semantic.embeddings.apiKey` has control characters",
        ),
        (
            semantic(&|c| c["semantic"]["embeddings"]["apiKey"] = json!(7)),
            "invalid type at `semantic.embeddings.apiKey`",
        ),
        (semantic(&|c| c["semantic"]["embeddings"]["model"] = json!("")), "`semantic.embeddings.model` is empty"),
        (
            semantic(&|c| c["semantic"]["embeddings"]["timeoutMs"] = json!(0)),
            "`semantic.embeddings.timeoutMs` must be from 1 to 60000",
        ),
        (
            semantic(&|c| c["semantic"]["embeddings"]["batchSize"] = json!(0)),
            "`semantic.embeddings.batchSize` must be from 1 to 2048",
        ),
        (semantic(&|c| c["semantic"]["embeddings"]["dimensions"] = json!(3)), "unknown field `dimensions`"),
        (semantic(&|c| c["semantic"]["threshold"] = json!(1.5)), "`semantic.threshold` must be a cosine similarity"),
        (semantic(&|c| c["semantic"]["routes"] = json!([])), "`semantic.routes` is empty"),
        (semantic(&|c| c["semantic"]["routes"][1]["examples"] = json!([])), "`semantic.routes[1].examples` is empty"),
        (
            semantic(&|c| c["semantic"]["routes"][1]["examples"] = json!(["ok", "  "])),
            "`semantic.routes[1].examples[1]` is empty",
        ),
        (
            semantic(&|c| c["semantic"]["routes"][0]["model"] = json!("auto")),
            "`semantic.routes[0].model` is one of the `aliases`",
        ),
        (
            semantic(&|c| c["semantic"]["routes"][0]["examples"] = json!([secret.repeat(MAX_TEXT_BYTES)])),
            "`semantic.routes[0].examples[0]` is longer than 8192 bytes",
        ),
        (
            semantic(&|c| c["semantic"]["routes"][0]["examples"] = json!(vec![secret; 129])),
            "`semantic.routes` have 130 examples in all, at most 128",
        ),
        (semantic(&|c| c["semantic"]["extra"] = json!(secret)), "unknown field `extra`"),
    ];
    for (config, expected) in cases {
        let error = config_error(config);
        assert!(error.starts_with("model-router: "), "{error}");
        assert!(error.contains(expected), "expected {expected:?} in: {error}");
        assert!(!error.contains("hunter2"), "a value is quoted: {error}");
    }
}

#[test]
fn a_valid_config_declares_its_metrics_and_only_the_request_hook() {
    let router = router(semantic_config());
    assert_eq!(router.hooks(), Hooks::REQUEST, "no instance is kept across the upstream call");
    assert_eq!(router.models(), ["gpt-4o", "gpt-4o-mini", "code-model", "writer"]);
    assert_eq!(router.aliases, ["auto"], "the default alias");
    // Declared once: a second configure on this thread is refused as the
    // gateway would refuse a second declaration.
    let again = sluice_plugin_sdk::configure::<ModelRouter>(&semantic_config().to_string()).err();
    assert_eq!(again.as_deref(), Some("model-router: metrics are declared once, from configure"));
}
