//! Isolation: endpoints (docs/security.md).
//!
//! A route's content policies hold on every endpoint it serves: a client
//! cannot step around prompt-guard, response-guard or a template-only route
//! by sending the same content to `/v1/responses` (or the legacy endpoints)
//! instead of `/v1/chat/completions`. A policy plugin reads an endpoint's
//! shape or refuses it; a route serves only the endpoints its whole chain
//! understands, and says which.

use serde_json::{Value, json};
use sluice_tests::{ConfigDir, Echo, Gateway, Plugin, Route, chat_body, documents};

const PHRASE: &str = "open sesame";
const KEY: &str = "sk-e2eSECRETabcdefghijklmnop0123456789";

/// A gateway serving `plugins` and the routes `routes` makes for the echo
/// upstream's URL.
async fn serve(plugins: &[Plugin], routes: impl FnOnce(&str) -> Vec<Route>) -> (Echo, ConfigDir, Gateway) {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let mut docs: Vec<String> = plugins.iter().map(Plugin::yaml).collect();
    docs.extend(routes(&echo.url()).iter().map(Route::yaml));
    dir.write("config.yaml", &documents(&docs));
    let gateway = Gateway::start(&dir).await;
    (echo, dir, gateway)
}

fn prompt_guard() -> Plugin {
    Plugin::new("prompt-guard", "prompt-guard").config(json!({
        "roles": ["user", "system"],
        "deny": [{"name": "magic-words", "pattern": "(?i)open\\s+sesame"}]
    }))
}

fn response_guard(action: &str) -> Plugin {
    Plugin::new("response-guard", "response-guard").config(json!({
        "action": action,
        "rules": [{"name": "openai-key", "pattern": "sk-[A-Za-z0-9]{20,}"}]
    }))
}

/// No 8-character piece of the key appears in `text`.
fn assert_no_key_fragment(text: &str) {
    for window in KEY.as_bytes().windows(8) {
        let fragment = std::str::from_utf8(window).unwrap();
        assert!(!text.contains(fragment), "{fragment:?} of the key leaked in {text}");
    }
}

/// The `data` of each event of a raw event stream (its `event:` lines
/// skipped), as JSON.
fn stream_events(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter_map(|event| event.lines().find_map(|line| line.strip_prefix("data: ")))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).unwrap_or_else(|e| panic!("not JSON ({e}): {data}")))
        .collect()
}

/// Before: prompt-guard looked only at chat `messages` and legacy
/// `prompt`; the same phrase in a Responses API `input` reached the model.
#[tokio::test]
async fn prompt_guard_reads_the_responses_api_and_embeddings() {
    let (_echo, _dir, gateway) =
        serve(&[prompt_guard()], |url| vec![Route::new("chat", &["m"], url).plugins(&["prompt-guard"])]).await;
    let bad = format!("please {PHRASE} now");
    let refused = [
        ("/v1/responses", json!({"model": "m", "input": bad})),
        (
            "/v1/responses",
            json!({"model": "m", "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "hi"}, {"type": "input_text", "text": bad}]}
            ]}),
        ),
        ("/v1/responses", json!({"model": "m", "input": [{"type": "message", "role": "user", "content": bad}]})),
        ("/v1/responses", json!({"model": "m", "instructions": bad, "input": "hi"})),
        ("/v1/embeddings", json!({"model": "m", "input": ["fine", bad]})),
        ("/v1/completions", json!({"model": "m", "prompt": bad})),
        ("/v1/chat/completions", json!({"model": "m", "messages": [{"role": "user", "content": bad}]})),
    ];
    for (path, body) in refused {
        let reply = gateway.post(path, body.to_string(), &[]).await;
        let error = reply.assert_error(400, "prompt_guard_denied");
        assert!(error["message"].as_str().unwrap().contains("magic-words"), "{path} {body}: {error}");
    }
    // Content the guard cannot read as text is refused, not let by.
    let tokens = json!({"model": "m", "input": [[1, 2, 3]]});
    gateway.post("/v1/embeddings", tokens.to_string(), &[]).await.assert_error(400, "prompt_guard_unreadable");
    let odd = json!({"model": "m", "input": [{"role": "user", "content": 7}]});
    gateway.post("/v1/responses", odd.to_string(), &[]).await.assert_error(400, "prompt_guard_unreadable");

    // Everyone else's clean requests, on every endpoint, are served.
    for (path, body) in [
        ("/v1/responses", json!({"model": "m", "input": "hello"})),
        (
            "/v1/responses",
            json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}),
        ),
        ("/v1/embeddings", json!({"model": "m", "input": "hello"})),
        ("/v1/chat/completions", chat_body("m")),
    ] {
        let reply = gateway.post(path, body.to_string(), &[]).await;
        assert_eq!(reply.status, 200, "{path}: {}", reply.text());
    }
}

/// Before: response-guard read only `choices`, so a Responses API answer
/// (`output[].content[].text`, `response.output_text.delta` events) passed
/// unmasked.
#[tokio::test]
async fn response_guard_masks_responses_api_output_whole_and_streamed() {
    let (_echo, _dir, gateway) =
        serve(&[response_guard("mask")], |url| vec![Route::new("chat", &["m"], url).plugins(&["response-guard"])])
            .await;
    let input = format!("my key is {KEY}, thanks");
    // Whole: the echoed input comes back as the output text.
    let reply = gateway.post("/v1/responses", json!({"model": "m", "input": input}).to_string(), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_no_key_fragment(&reply.text());
    let text = reply.json()["output"][0]["content"][0]["text"].as_str().unwrap().to_string();
    let echoed: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(echoed["input"], "my key is [REDACTED], thanks");

    // Streamed in pieces of about 5 characters: the key spans many deltas,
    // and the done events repeat the whole text.
    let body = json!({"model": "m", "input": input, "stream": true}).to_string();
    let knobs = [("x-echo-chunks", "150"), ("x-echo-chunk-delay-ms", "0")];
    let streamed = gateway.client().post_streaming(&gateway.url("/v1/responses"), body, &knobs).await;
    assert_eq!(streamed.status, 200);
    let raw: String = streamed.frames.iter().map(|(_, bytes)| String::from_utf8_lossy(bytes).into_owned()).collect();
    assert_no_key_fragment(&raw);
    let events = stream_events(&raw);
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap().to_string())
        .collect();
    let done = events.iter().find(|e| e["type"] == "response.output_text.done").expect("a text done event");
    let done = done["text"].as_str().unwrap();
    assert!(done.starts_with(&deltas), "the deltas are a prefix of the done text: {deltas:?} / {done:?}");
    let echoed: Value = serde_json::from_str(done).unwrap_or_else(|e| panic!("{e}: {done}"));
    assert_eq!(echoed["input"], "my key is [REDACTED], thanks");
    let completed = events.iter().find(|e| e["type"] == "response.completed").expect("a completed event");
    assert_eq!(completed["response"]["output"][0]["content"][0]["text"], done);

    // Chat on the same route is still served, and masked as before.
    let mut chat = chat_body("m");
    chat["messages"][0]["content"] = input.clone().into();
    let reply = gateway.post("/v1/chat/completions", chat.to_string(), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_no_key_fragment(&reply.text());
}

/// Block mode: a Responses answer with a match ends incomplete, for
/// `content_filter`, without the match.
#[tokio::test]
async fn response_guard_blocks_responses_api_output() {
    let (_echo, _dir, gateway) =
        serve(&[response_guard("block")], |url| vec![Route::new("chat", &["m"], url).plugins(&["response-guard"])])
            .await;
    let input = format!("my key is {KEY}, thanks");
    let reply = gateway.post("/v1/responses", json!({"model": "m", "input": input}).to_string(), &[]).await;
    assert_no_key_fragment(&reply.text());
    let response = reply.json();
    assert_eq!(response["status"], "incomplete", "{response}");
    assert_eq!(response["incomplete_details"]["reason"], "content_filter", "{response}");

    let body = json!({"model": "m", "input": input, "stream": true}).to_string();
    let knobs = [("x-echo-chunks", "150"), ("x-echo-chunk-delay-ms", "0")];
    let streamed = gateway.client().post_streaming(&gateway.url("/v1/responses"), body, &knobs).await;
    let raw: String = streamed.frames.iter().map(|(_, bytes)| String::from_utf8_lossy(bytes).into_owned()).collect();
    assert_no_key_fragment(&raw);
    let events = stream_events(&raw);
    let last = events.last().expect("events");
    assert_eq!(last["type"], "response.incomplete", "{raw}");
    assert_eq!(last["response"]["incomplete_details"]["reason"], "content_filter", "{raw}");
}

/// Before: a template-only route, context-trim and prompt-decorator let a
/// Responses API request through untouched. Each now refuses what it does
/// not read, and declares what it reads; the route serves the rest.
#[tokio::test]
async fn chat_only_plugins_refuse_the_responses_api() {
    let template = Plugin::new("template", "prompt-template").config(json!({
        "allowUntemplated": false,
        "templates": [{"name": "t", "template": {"messages": [{"role": "user", "content": "{{q}}"}]}}]
    }));
    let trim = Plugin::new("trim", "context-trim").config(json!({"models": [{"model": "*", "maxInputTokens": 1000}]}));
    let decorator = Plugin::new("decorator", "prompt-decorator")
        .config(json!({"prepend": [{"role": "system", "content": "be nice"}]}));
    let routes = |url: &str| {
        vec![
            Route::new("templated", &["t"], url).plugins(&["template"]),
            Route::new("trimmed", &["c"], url).plugins(&["trim"]),
            Route::new("decorated", &["d"], url).plugins(&["decorator"]),
        ]
    };
    let (_echo, _dir, gateway) = serve(&[template, trim, decorator], routes).await;
    for model in ["t", "c", "d"] {
        let reply = gateway.post("/v1/responses", json!({"model": model, "input": "hi"}).to_string(), &[]).await;
        assert!(reply.status.is_client_error(), "{model}: {} {}", reply.status, reply.text());
        let error = reply.json()["error"].clone();
        assert!(
            ["template_required", "unsupported_endpoint"].contains(&error["code"].as_str().unwrap_or_default()),
            "{model}: {error}"
        );
    }
    // Their chat requests are served as before.
    let templated = json!({"model": "t", "messages": "{template://t}", "properties": {"q": "hi"}});
    assert_eq!(gateway.post("/v1/chat/completions", templated.to_string(), &[]).await.status, 200);
    assert_eq!(gateway.chat("c", &[]).await.status, 200);
    assert_eq!(gateway.chat("d", &[]).await.status, 200);
}

/// A route's `endpoints`, and its plugins', limit what it serves: an
/// endpoint outside them is a 404 naming the route's endpoints, before any
/// plugin runs; the others are served.
#[tokio::test]
async fn a_route_serves_only_the_endpoints_its_whole_chain_understands() {
    // Refuses every request: if it ran, the refusal would be its 403.
    let deny = Plugin::new("deny", "deny").config(json!({"models": ["chat-only", "plugin-limited"]}));
    let tag = Plugin::new("tag", "add-header")
        .config(json!({"header": "x-team", "value": "a"}))
        .endpoints(&["/v1/chat/completions", "/v1/embeddings"]);
    let routes = |url: &str| {
        vec![
            Route::new("chat-only", &["chat-only"], url).plugins(&["deny"]).endpoints(&["/v1/chat/completions"]),
            Route::new("plugin-limited", &["plugin-limited"], url).plugins(&["tag"]),
            Route::new("open", &["open"], url),
        ]
    };
    let (_echo, _dir, gateway) = serve(&[deny, tag], routes).await;

    let reply = gateway.post("/v1/responses", json!({"model": "chat-only", "input": "hi"}).to_string(), &[]).await;
    let error = reply.assert_error(404, "unsupported_endpoint");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("/v1/responses") && message.contains("/v1/chat/completions"), "{message}");
    gateway.chat("chat-only", &[]).await.assert_error(403, "request_denied");

    let reply = gateway.post("/v1/responses", json!({"model": "plugin-limited", "input": "hi"}).to_string(), &[]).await;
    reply.assert_error(404, "unsupported_endpoint");
    assert_eq!(gateway.chat("plugin-limited", &[]).await.echoed()["headers"]["x-team"], "a");
    let embeddings = json!({"model": "plugin-limited", "input": "hi"});
    assert_eq!(gateway.post("/v1/embeddings", embeddings.to_string(), &[]).await.status, 200);

    // A route that says nothing serves every forwarded endpoint.
    let reply = gateway.post("/v1/responses", json!({"model": "open", "input": "hi"}).to_string(), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());

    let admin = gateway.admin_config().await;
    let route = |name: &str| {
        admin["routes"].as_array().unwrap().iter().find(|r| r["name"] == format!("default/{name}")).cloned().unwrap()
    };
    assert_eq!(route("chat-only")["endpoints"], json!(["/v1/chat/completions"]), "{admin}");
    assert_eq!(route("plugin-limited")["endpoints"], json!(["/v1/chat/completions", "/v1/embeddings"]), "{admin}");
    assert_eq!(route("open")["endpoints"].as_array().map(Vec::len), Some(4), "{admin}");
}
