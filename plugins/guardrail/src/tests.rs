use serde_json::json;
use sluice_plugin_sdk::outbound::{Error, Response};
use sluice_plugin_sdk::testing::{
    chat_request, counter, observations, on_outbound, outbound_requests, raw_request, reset_metrics,
};

use super::*;

const MODERATION_URL: &str = "http://checker.internal:8080/v1/moderations";
const PRESIDIO_URL: &str = "http://presidio.internal:5002/analyze";

fn guardrail(config: Value) -> Guardrail {
    reset_metrics();
    sluice_plugin_sdk::configure::<Guardrail>(&config.to_string()).unwrap_or_else(|e| panic!("{e}"))
}

fn config_error(config: Value) -> String {
    reset_metrics();
    sluice_plugin_sdk::configure::<Guardrail>(&config.to_string()).err().expect("the config is refused")
}

/// A guardrail on OpenAI moderation, with `extra` config on top.
fn moderated(extra: Value) -> Guardrail {
    let mut config = json!({"provider": {"openaiModeration": {"url": MODERATION_URL, "apiKey": "sk-mod"}}});
    config.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    guardrail(config)
}

fn presidio(extra: Value) -> Guardrail {
    let mut config = json!({"provider": {"presidio": {"url": PRESIDIO_URL, "entities": ["EMAIL_ADDRESS", "PHONE_NUMBER"],
        "scoreThreshold": 0.5}}});
    config.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    guardrail(config)
}

fn answer(body: Value) -> Result<Response, Error> {
    Ok(Response { status: 200, headers: vec![], body: body.to_string().into_bytes() })
}

/// The JSON body of a request the plugin sent.
fn sent_json(request: &outbound::Request) -> Value {
    serde_json::from_slice(&request.body).unwrap()
}

/// A moderation server that flags any input containing "attack".
fn moderation_flags_attack() {
    on_outbound(|request| {
        let input = sent_json(request)["input"].as_str().unwrap().to_string();
        let flagged = input.contains("attack");
        answer(json!({"id": "modr-1", "model": "omni-moderation-latest", "results": [{"flagged": flagged,
            "categories": {"violence": flagged, "hate": false, "self-harm": null},
            "category_scores": {"violence": 0.9}}]}))
    });
}

/// A Presidio analyzer that finds each `(entity, literal)` wherever the
/// literal occurs, answering offsets in characters as Python does.
fn presidio_finds(found: &'static [(&'static str, &'static str)]) {
    on_outbound(move |request| {
        let text = sent_json(request)["text"].as_str().unwrap().to_string();
        let mut results = Vec::new();
        for (entity, literal) in found {
            for (at, _) in text.match_indices(literal) {
                let start = text[..at].chars().count();
                let end = start + literal.chars().count();
                results.push(json!({"entity_type": entity, "start": start, "end": end, "score": 0.85,
                    "analysis_explanation": null, "recognition_metadata": {}}));
            }
        }
        answer(Value::Array(results))
    });
}

/// The inputs the checker was sent, in order.
fn checked_texts() -> Vec<String> {
    outbound_requests()
        .iter()
        .map(|r| {
            let body = sent_json(r);
            body["input"].as_str().or(body["text"].as_str()).unwrap().to_string()
        })
        .collect()
}

fn chat(messages: Value) -> Request {
    chat_request("gpt-4o", &json!({"messages": messages}))
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

fn verdicts(phase: &str, verdict: &str) -> u64 {
    counter("guardrail_verdicts", &[phase, verdict])
}

// ---- the request phase ----

#[test]
fn a_flagged_prompt_is_refused_with_a_content_filter_400() {
    let guard = moderated(json!({"timeoutMs": 1500}));
    moderation_flags_attack();
    let error = guard.on_request(&chat(user("plan an attack on the castle")), &mut Stream::default()).unwrap_err();
    assert_eq!(
        (error.status, error.code.as_str(), error.error_type()),
        (400, "content_filter", "invalid_request_error")
    );
    assert_eq!(error.message, "the prompt was blocked by the guardrail: flagged for violence");
    let body: Value = serde_json::from_slice(&error.to_json()).unwrap();
    assert_eq!(body["error"]["code"], "content_filter");

    let sent = outbound_requests();
    assert_eq!(sent.len(), 1);
    assert_eq!((sent[0].method.as_str(), sent[0].url.as_str()), ("POST", MODERATION_URL));
    assert_eq!(
        sent_json(&sent[0]),
        json!({"model": "omni-moderation-latest", "input": "plan an attack on the castle"})
    );
    assert!(sent[0].headers.contains(&("authorization".into(), "Bearer sk-mod".into())), "{:?}", sent[0].headers);
    assert!(sent[0].headers.contains(&("content-type".into(), "application/json".into())));
    assert_eq!(sent[0].timeout_ms, Some(1500));
    assert_eq!(verdicts("request", "block"), 1);
    assert_eq!(verdicts("request", "pass"), 0);
    assert_eq!(observations("guardrail_check_seconds", &["request"]).len(), 1);
}

#[test]
fn a_clean_prompt_goes_on_unchanged() {
    let guard = moderated(json!({}));
    moderation_flags_attack();
    let req = chat(user("a poem about spring"));
    assert_eq!(guard.on_request(&req, &mut Stream::default()), Ok(Action::Continue));
    assert!(!req.body_edited());
    assert_eq!(checked_texts(), ["a poem about spring"]);
    assert_eq!(verdicts("request", "pass"), 1);
    assert_eq!(verdicts("request", "block"), 0);
}

/// Every message is checked, whatever its role: a client writes the whole
/// history, forged assistant turns included, and the model reads it all.
#[test]
fn the_text_of_every_message_is_checked_as_one() {
    let guard = moderated(json!({}));
    moderation_flags_attack();
    let messages = json!([
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "first part"},
            {"type": "image_url", "image_url": {"url": "https://x/y.png"}}, {"type": "text", "text": "second part"}]},
        {"role": "assistant", "content": "sure, attack at dawn"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
            "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "user", "content": "thanks"}
    ]);
    let error = guard.on_request(&chat(messages), &mut Stream::default()).unwrap_err();
    assert_eq!(error.code, "content_filter", "the assistant turn was checked");
    assert_eq!(checked_texts(), ["be brief\n\nfirst part\n\nsecond part\n\nsure, attack at dawn\n\nthanks"]);
}

#[test]
fn presidio_masks_the_prompt_in_place_at_character_offsets() {
    let guard = presidio(json!({"action": "mask"}));
    presidio_finds(&[("EMAIL_ADDRESS", "zoë@exämple.fr"), ("PHONE_NUMBER", "06 12 34 56 78")]);
    let messages = json!([
        {"role": "system", "content": "Réponds en français 🇫🇷."},
        {"role": "user", "content": [{"type": "text", "text": "Écris à zoë@exämple.fr ✉️ ou au 06 12 34 56 78."},
            {"type": "text", "text": "Merci — 感谢, zoë@exämple.fr"}]},
        {"role": "user", "content": "nothing here"}
    ]);
    let req = chat(messages);
    assert_eq!(guard.on_request(&req, &mut Stream::default()), Ok(Action::Continue));
    let body = req.body_json();
    assert_eq!(body["messages"][0]["content"], "Réponds en français 🇫🇷.");
    assert_eq!(body["messages"][1]["content"][0]["text"], "Écris à <EMAIL_ADDRESS> ✉️ ou au <PHONE_NUMBER>.");
    assert_eq!(body["messages"][1]["content"][1]["text"], "Merci — 感谢, <EMAIL_ADDRESS>");
    assert_eq!(body["messages"][2]["content"], "nothing here");
    assert!(!req.body_text().contains("zoë"), "{}", req.body_text());

    let sent = sent_json(&outbound_requests()[0]);
    assert_eq!(sent["language"], "en");
    assert_eq!(sent["entities"], json!(["EMAIL_ADDRESS", "PHONE_NUMBER"]));
    assert_eq!(sent["score_threshold"], 0.5);
    assert!(sent["text"].as_str().unwrap().starts_with("Réponds en français 🇫🇷.\n\nÉcris à zoë@"));
    assert_eq!(verdicts("request", "mask"), 1);
}

#[test]
fn presidio_blocks_or_monitors_as_configured() {
    let prompt = user("mail me at bob@example.com");
    let blocker = presidio(json!({}));
    presidio_finds(&[("EMAIL_ADDRESS", "bob@example.com")]);
    let error = blocker.on_request(&chat(prompt.clone()), &mut Stream::default()).unwrap_err();
    assert_eq!(error.code, "content_filter");
    assert_eq!(error.message, "the prompt was blocked by the guardrail: it contains EMAIL_ADDRESS");

    let monitor = presidio(json!({"action": "monitor"}));
    let req = chat(prompt);
    assert_eq!(monitor.on_request(&req, &mut Stream::default()), Ok(Action::Continue));
    assert!(!req.body_edited(), "monitor changes nothing");
    assert_eq!(verdicts("request", "monitor"), 1);
    assert_eq!(verdicts("request", "block"), 0);
}

#[test]
fn moderation_monitor_counts_and_lets_by() {
    let guard = moderated(json!({"action": "monitor"}));
    moderation_flags_attack();
    assert_eq!(guard.on_request(&chat(user("attack!")), &mut Stream::default()), Ok(Action::Continue));
    assert_eq!(verdicts("request", "monitor"), 1);
}

/// Findings below the threshold (when the analyzer ignores it) and
/// overlapping findings: no character of any finding is left.
#[test]
fn spans_are_merged_filtered_and_checked_against_the_text() {
    let text = "contact: ann@x.org, né à Zürich";
    let result = |entity: &str, start: usize, end: usize| PresidioResult {
        entity_type: entity.into(),
        start,
        end,
        score: Some(0.9),
    };
    // "ann@x.org" is characters 9..18; "x.org" (a URL) overlaps it; "Zürich" is 25..31.
    let whole =
        spans(text, vec![result("LOCATION", 25, 31), result("URL", 13, 18), result("EMAIL_ADDRESS", 9, 18)]).unwrap();
    assert_eq!(mask(text, &whole), "contact: <EMAIL_ADDRESS>, né à <LOCATION>");
    let partial = spans(text, vec![result("EMAIL_ADDRESS", 9, 14), result("URL", 13, 18)]).unwrap();
    assert_eq!(mask(text, &partial), "contact: <EMAIL_ADDRESS>, né à Zürich", "overlaps are merged");
    for bad in [result("X", 25, 32), result("X", 40, 41), result("X", 5, 5), result("X", 6, 2)] {
        assert!(spans(text, vec![bad]).is_err());
    }

    let guard = presidio(json!({"action": "mask"}));
    on_outbound(|_| answer(json!([{"entity_type": "PERSON", "start": 0, "end": 3, "score": 0.2}])));
    let req = chat(user("Ann says hi"));
    assert_eq!(guard.on_request(&req, &mut Stream::default()), Ok(Action::Continue));
    assert!(!req.body_edited(), "below the threshold");
    assert_eq!(verdicts("request", "pass"), 1);
}

/// A span that runs across two messages (the separator included) is
/// masked in both.
#[test]
fn a_finding_across_messages_is_masked_in_each() {
    let guard = presidio(json!({"action": "mask"}));
    // "one two" + "\n\n" + "three": characters 4..12 are "two\n\nthr".
    on_outbound(|_| answer(json!([{"entity_type": "PERSON", "start": 4, "end": 12}])));
    let req = chat(json!([{"role": "user", "content": "one two"}, {"role": "user", "content": "three"}]));
    assert_eq!(guard.on_request(&req, &mut Stream::default()), Ok(Action::Continue));
    let body = req.body_json();
    assert_eq!(
        (body["messages"][0]["content"].as_str(), body["messages"][1]["content"].as_str()),
        (Some("one <PERSON>"), Some("<PERSON>ee"))
    );
}

#[test]
fn a_failed_check_blocks_or_allows_as_on_error_says() {
    let failures: [fn() -> Result<Response, Error>; 5] = [
        || Err(Error::Timeout),
        || Err(Error::Failed("ConnectionRefused".into())),
        || Ok(Response { status: 500, headers: vec![], body: b"oops".to_vec() }),
        || answer(json!({"unexpected": true})),
        || answer(json!({"results": []})),
    ];
    for (i, failure) in failures.into_iter().enumerate() {
        let closed = moderated(json!({}));
        on_outbound(move |_| failure());
        let error = closed.on_request(&chat(user("hello")), &mut Stream::default()).unwrap_err();
        assert_eq!((error.status, error.code.as_str()), (503, "guardrail_unavailable"), "failure {i}");
        assert_eq!(error.message, "the guardrail could not check the prompt, so it was not sent");
        assert_eq!(verdicts("request", "error"), 1, "failure {i}");

        let open = moderated(json!({"onError": "allow"}));
        on_outbound(move |_| failure());
        assert_eq!(open.on_request(&chat(user("hello")), &mut Stream::default()), Ok(Action::Continue), "failure {i}");
        assert_eq!(verdicts("request", "error"), 1, "failure {i}");
        assert_eq!(verdicts("request", "pass"), 0, "failure {i}");
    }
    // Presidio offsets outside the text are a failed check too.
    let guard = presidio(json!({"action": "mask"}));
    on_outbound(|_| answer(json!([{"entity_type": "PERSON", "start": 0, "end": 99}])));
    assert_eq!(guard.on_request(&chat(user("short")), &mut Stream::default()).unwrap_err().status, 503);
}

#[test]
fn only_chat_completions_with_one_choice_are_read() {
    let guard = moderated(json!({}));
    moderation_flags_attack();
    let embeddings = raw_request("m", &[], br#"{"input": "attack"}"#.to_vec()).with_path("/v1/embeddings");
    let error = guard.on_request(&embeddings, &mut Stream::default()).unwrap_err();
    assert_eq!((error.status, error.code.as_str()), (400, "unsupported_endpoint"));
    let many = chat_request("m", &json!({"n": 2, "messages": user("hi")}));
    assert_eq!(guard.on_request(&many, &mut Stream::default()).unwrap_err().code, "unsupported_value");
    let one = chat_request("m", &json!({"n": 1, "messages": user("hi")}));
    assert_eq!(guard.on_request(&one, &mut Stream::default()), Ok(Action::Continue));
    // Without response checks, several choices are fine.
    let request_only = moderated(json!({"checkResponse": false}));
    assert_eq!(request_only.on_request(&many, &mut Stream::default()), Ok(Action::Continue));
    let not_chat = raw_request("m", &[], b"[1]".to_vec());
    assert_eq!(guard.on_request(&not_chat, &mut Stream::default()).unwrap_err().code, "invalid_json");
}

#[test]
fn hooks_follow_what_is_checked() {
    assert_eq!(moderated(json!({})).hooks(), Hooks::REQUEST | Hooks::RESPONSE_CHUNK | Hooks::RESPONSE_BODY);
    assert_eq!(moderated(json!({"checkResponse": false})).hooks(), Hooks::REQUEST);
    let response_only = moderated(json!({"checkRequest": false}));
    assert_eq!(response_only.hooks(), Hooks::REQUEST | Hooks::RESPONSE_CHUNK | Hooks::RESPONSE_BODY);
    moderation_flags_attack();
    assert_eq!(response_only.on_request(&chat(user("attack")), &mut Stream::default()), Ok(Action::Continue));
    assert!(outbound_requests().is_empty(), "the prompt is not checked");
}

// ---- whole responses ----

fn completion(content: &str) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}})
}

fn on_body(guard: &Guardrail, body: &Value) -> Option<Value> {
    let out = guard.on_body(body.to_string().as_bytes(), &mut Stream::default())?;
    Some(serde_json::from_slice(&out).unwrap())
}

#[test]
fn a_whole_response_is_blocked_masked_monitored_or_passed() {
    let blocker = moderated(json!({}));
    moderation_flags_attack();
    let body = completion("Sure: attack the north gate.");
    let blocked = on_body(&blocker, &body).expect("replaced");
    assert_eq!(blocked["choices"][0]["message"]["content"], BLOCKED_NOTICE);
    assert_eq!(blocked["choices"][0]["finish_reason"], "content_filter");
    assert_eq!((&blocked["id"], &blocked["usage"]), (&body["id"], &body["usage"]), "the rest is kept");
    assert_eq!(verdicts("response", "block"), 1);
    assert_eq!(on_body(&blocker, &completion("A fine answer.")), None, "clean bodies are not rewritten");
    assert_eq!(verdicts("response", "pass"), 1);

    let masker = presidio(json!({"action": "mask"}));
    presidio_finds(&[("EMAIL_ADDRESS", "zoë@exämple.fr")]);
    let masked = on_body(&masker, &completion("Écrivez à zoë@exämple.fr 📧 demain")).expect("replaced");
    assert_eq!(masked["choices"][0]["message"]["content"], "Écrivez à <EMAIL_ADDRESS> 📧 demain");
    assert_eq!(masked["choices"][0]["finish_reason"], "stop");

    let monitor = presidio(json!({"action": "monitor"}));
    presidio_finds(&[("EMAIL_ADDRESS", "zoë@exämple.fr")]);
    assert_eq!(on_body(&monitor, &completion("zoë@exämple.fr")), None);
    assert_eq!(verdicts("response", "monitor"), 1);

    // Not a completion, or nothing to check: no call, no change.
    let calls = outbound_requests().len();
    let error = json!({"error": {"message": "x", "type": "server_error"}});
    assert_eq!(on_body(&monitor, &error), None);
    let tool_call = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": null,
        "tool_calls": []}, "finish_reason": "tool_calls"}]});
    assert_eq!(on_body(&monitor, &tool_call), None);
    assert_eq!(monitor.on_body(b"\xff not json", &mut Stream::default()), None);
    assert_eq!(outbound_requests().len(), calls);
}

#[test]
fn a_whole_response_that_cannot_be_checked_is_withheld_or_passed() {
    let closed = moderated(json!({}));
    on_outbound(|_| Err(Error::Timeout));
    let withheld = on_body(&closed, &completion("anything")).expect("replaced");
    assert_eq!(withheld["choices"][0]["message"]["content"], UNCHECKED_NOTICE);
    assert_eq!(withheld["choices"][0]["finish_reason"], "content_filter");
    assert_eq!(verdicts("response", "error"), 1);

    let open = moderated(json!({"onError": "allow"}));
    on_outbound(|_| Err(Error::Timeout));
    assert_eq!(on_body(&open, &completion("anything")), None);
}

// ---- streamed responses ----

fn chunk(content: &str) -> String {
    json!({"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o",
        "choices": [{"index": 0, "delta": {"content": content}, "logprobs": null, "finish_reason": null}],
        "usage": null})
    .to_string()
}

fn role_chunk() -> String {
    json!({"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": "", "refusal": null}, "finish_reason": null}]})
    .to_string()
}

fn finish_chunk() -> String {
    json!({"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    .to_string()
}

/// What the hook did with one event.
#[derive(Debug, PartialEq)]
enum Did {
    Pass,
    Replace(String),
    Drop,
    Stop(Option<String>),
}

/// Feeds `events` through the hook as the gateway does; returns what it did
/// with each (up to a stop) and the events the client receives.
fn stream(guard: &Guardrail, events: &[String]) -> (Vec<Did>, Vec<String>) {
    let mut state = Stream::default();
    let (mut did, mut out) = (Vec::new(), Vec::new());
    for event in events {
        match guard.on_chunk(event, &mut state) {
            ChunkAction::Pass => {
                did.push(Did::Pass);
                out.push(event.clone());
            }
            ChunkAction::Replace(data) => {
                did.push(Did::Replace(content(std::slice::from_ref(&data))));
                out.push(data);
            }
            ChunkAction::Drop => did.push(Did::Drop),
            ChunkAction::Stop(last) => {
                did.push(Did::Stop(last.clone()));
                out.extend(last);
                out.push("[DONE]".to_string());
                return (did, out);
            }
        }
    }
    (did, out)
}

/// All the content the client sees, joined.
fn content(events: &[String]) -> String {
    events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .flat_map(|e| e["choices"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["delta"]["content"].as_str().map(str::to_string))
        .collect()
}

fn replaced(text: &str) -> Did {
    Did::Replace(text.to_string())
}

#[test]
fn a_stream_is_checked_a_sentence_at_a_time() {
    let guard = moderated(json!({}));
    moderation_flags_attack();
    let events = [
        role_chunk(),
        chunk("Hel"),
        chunk("lo there. How "),
        chunk("are you? Fi"),
        chunk("ne"),
        finish_chunk(),
        "[DONE]".to_string(),
    ];
    let (did, out) = stream(&guard, &events);
    assert_eq!(
        did,
        [
            Did::Pass,
            Did::Drop,
            replaced("Hello there."),
            replaced(" How are you?"),
            Did::Drop,
            replaced(" Fine"),
            Did::Pass
        ]
    );
    assert_eq!(checked_texts(), ["Hello there.", " How are you?", " Fine"]);
    assert_eq!(content(&out), "Hello there. How are you? Fine");
    // Each released chunk keeps the shape of the event it replaces.
    let released: Value = serde_json::from_str(&out[1]).unwrap();
    assert_eq!(
        (&released["id"], &released["object"], &released["model"]),
        (&json!("chatcmpl-9"), &json!("chat.completion.chunk"), &json!("gpt-4o"))
    );
    let last: Value = serde_json::from_str(&out[3]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop", "the finish carries the last window");
    assert_eq!(out.last().unwrap(), "[DONE]");
    assert_eq!(verdicts("response", "pass"), 3);
}

#[test]
fn sentence_windows_can_hold_several_sentences_and_end_at_newlines_and_cjk_stops() {
    let guard = moderated(json!({"window": {"sentences": 2}}));
    moderation_flags_attack();
    let events = [chunk("One. Two"), chunk("! Three.\nFour"), chunk("。五？"), chunk("x"), "[DONE]".to_string()];
    let (did, out) = stream(&guard, &events);
    let flushed = Did::Stop(Some(did_text(&did[4])));
    assert_eq!(did, [Did::Drop, replaced("One. Two! Three.\n"), replaced("Four。五？"), Did::Drop, flushed]);
    assert_eq!(checked_texts(), ["One. Two! Three.\n", "Four。五？", "x"]);
    assert_eq!(content(&out), "One. Two! Three.\nFour。五？x");
}

/// Text without a sentence end is not held to the end of the answer.
#[test]
fn a_sentence_window_closes_at_its_length_cap_without_an_end() {
    let guard = moderated(json!({}));
    moderation_flags_attack();
    let words = "word ".repeat(MAX_SENTENCE_CHARS / 5 - 1);
    let (did, _) = stream(&guard, &[chunk(&words), chunk("word "), chunk("more")]);
    assert_eq!(did[0], Did::Drop, "{} characters", words.chars().count());
    assert_eq!(did[1], replaced(&format!("{words}word ")));
    assert_eq!(did[2], Did::Drop);
}

/// The data of a stop, checked to be a chunk.
fn did_text(did: &Did) -> String {
    let Did::Stop(Some(data)) = did else { panic!("not a stop with data: {did:?}") };
    assert!(serde_json::from_str::<Value>(data).unwrap()["choices"].is_array(), "{data}");
    data.clone()
}

#[test]
fn char_windows_close_at_n_characters() {
    let guard = moderated(json!({"window": {"chars": 10}}));
    moderation_flags_attack();
    let events = [chunk("ééééé"), chunk("ééé. "), chunk("abc"), chunk("defg"), "[DONE]".to_string()];
    let (did, out) = stream(&guard, &events);
    let first = "éééééééé. ";
    assert_eq!(first.chars().count(), 10);
    assert_eq!(did[..4], [Did::Drop, replaced(first), Did::Drop, Did::Drop]);
    did_text(&did[4]);
    assert_eq!(checked_texts(), [first, "abcdefg"]);
    assert_eq!(content(&out), "éééééééé. abcdefg");
}

#[test]
fn a_flagged_window_ends_the_stream_before_any_of_it_is_sent() {
    let guard = moderated(json!({}));
    moderation_flags_attack();
    let events = [
        role_chunk(),
        chunk("All good. "),
        chunk("Now we att"),
        chunk("ack them"),
        chunk(" at dawn. "),
        chunk("Never sent."),
        finish_chunk(),
        "[DONE]".to_string(),
    ];
    let (did, out) = stream(&guard, &events);
    assert_eq!(did.len(), 5, "stopped at the flagged window: {did:?}");
    assert_eq!(content(&out), "All good.");
    assert!(!out.iter().any(|e| e.contains("att") || e.contains("dawn") || e.contains("Never")), "{out:?}");
    let Did::Stop(Some(error)) = &did[4] else { panic!("{did:?}") };
    let error: Value = serde_json::from_str(error).unwrap();
    assert_eq!(
        error,
        json!({"error": {"message": "the response was blocked by the guardrail: flagged for violence",
            "type": "invalid_request_error", "param": null, "code": "content_filter"}})
    );
    assert_eq!(out.last().unwrap(), "[DONE]");
    assert_eq!(checked_texts(), ["All good.", " Now we attack them at dawn."]);
    assert_eq!((verdicts("response", "pass"), verdicts("response", "block")), (1, 1));
}

#[test]
fn a_stream_is_masked_window_by_window() {
    let guard = presidio(json!({"action": "mask"}));
    presidio_finds(&[("EMAIL_ADDRESS", "zoë@exämple.fr"), ("PHONE_NUMBER", "06 12 34 56 78")]);
    let events =
        [chunk("Écrivez à zo"), chunk("ë@exäm"), chunk("ple.fr 😀 ou au 06 12"), chunk(" 34 56 78"), "[DONE]".into()];
    let (did, out) = stream(&guard, &events);
    assert_eq!(did[..4], [Did::Drop, Did::Drop, Did::Drop, Did::Drop]);
    // The `.` inside the address is followed by no space: no sentence ends.
    let texts = checked_texts();
    assert_eq!(texts.len(), 1, "{texts:?}");
    assert_eq!(texts[0], "Écrivez à zoë@exämple.fr 😀 ou au 06 12 34 56 78");
    assert_eq!(content(&out), "Écrivez à <EMAIL_ADDRESS> 😀 ou au <PHONE_NUMBER>");
    assert_eq!(verdicts("response", "mask"), 1);
}

#[test]
fn the_remainder_is_flushed_at_done_in_a_chunk_like_the_others() {
    let guard = moderated(json!({}));
    moderation_flags_attack();
    let (did, out) = stream(&guard, &[chunk("no end in sight"), "[DONE]".to_string()]);
    assert_eq!(did[0], Did::Drop);
    let Did::Stop(Some(last)) = &did[1] else { panic!("{did:?}") };
    let last: Value = serde_json::from_str(last).unwrap();
    assert_eq!(last["id"], "chatcmpl-9");
    assert_eq!(last["object"], "chat.completion.chunk");
    assert_eq!(last["choices"], json!([{"index": 0, "delta": {"content": "no end in sight"}, "finish_reason": null}]));
    assert_eq!(content(&out), "no end in sight");

    moderation_flags_attack();
    let (did, out) = stream(&guard, &[chunk("attack"), "[DONE]".to_string()]);
    let Did::Stop(Some(error)) = &did[1] else { panic!("{did:?}") };
    assert!(error.contains("content_filter"), "{error}");
    assert_eq!(content(&out), "");
    // Nothing held: [DONE] and a finish pass as they are.
    let (did, _) = stream(&guard, &[chunk("Done."), finish_chunk(), "[DONE]".to_string()]);
    assert_eq!(did, [Did::Drop, replaced("Done."), Did::Pass], "a final `.` waits for what follows");
}

/// A role, a tool call or usage while text is held closes the window: the
/// text is checked and goes out in that event, before its own contents.
#[test]
fn other_events_pass_or_carry_the_held_text_in_order() {
    let guard = moderated(json!({}));
    moderation_flags_attack();
    let tool_call = json!({"id": "chatcmpl-9", "object": "chat.completion.chunk", "choices": [{"index": 0,
        "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "lookup", "arguments": ""}}]}, "finish_reason": null}]})
    .to_string();
    let usage = json!({"id": "chatcmpl-9", "object": "chat.completion.chunk", "choices": [],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}})
    .to_string();
    let not_json = "keep-alive".to_string();
    let events = [not_json.clone(), chunk("Let me look"), tool_call.clone(), chunk("that up"), usage.clone()];
    let (did, out) = stream(&guard, &events);
    assert_eq!(did, [Did::Pass, Did::Drop, replaced("Let me look"), Did::Drop, replaced("that up")]);
    let merged: Value = serde_json::from_str(&out[1]).unwrap();
    assert_eq!(merged["choices"][0]["delta"]["tool_calls"][0]["id"], "call_1", "the tool call is kept");
    assert_eq!(merged["choices"][0]["delta"]["content"], "Let me look");
    let merged: Value = serde_json::from_str(&out[2]).unwrap();
    assert_eq!(merged["usage"]["total_tokens"], 7, "the usage is kept");
    assert_eq!(merged["choices"], json!([{"index": 0, "delta": {"content": "that up"}, "finish_reason": null}]));
    assert_eq!(checked_texts(), ["Let me look", "that up"]);
    // With nothing held, they pass untouched, unchecked.
    let (did, _) = stream(&guard, &[tool_call, usage]);
    assert_eq!(did, [Did::Pass, Did::Pass]);
    assert_eq!(checked_texts().len(), 2);
}

#[test]
fn a_stream_that_cannot_be_checked_ends_or_flows_as_on_error_says() {
    let events = [chunk("One. "), chunk("Two."), finish_chunk(), "[DONE]".to_string()];
    let closed = moderated(json!({}));
    on_outbound(|_| Err(Error::Failed("ConnectionRefused".into())));
    let (did, out) = stream(&closed, &events);
    let Did::Stop(Some(error)) = &did[0] else { panic!("{did:?}") };
    let error: Value = serde_json::from_str(error).unwrap();
    assert_eq!(error["error"]["code"], "guardrail_unavailable");
    assert_eq!(error["error"]["type"], "server_error");
    assert_eq!(content(&out), "");

    let open = moderated(json!({"onError": "allow"}));
    on_outbound(|_| Err(Error::Failed("ConnectionRefused".into())));
    let (_, out) = stream(&open, &events);
    assert_eq!(content(&out), "One. Two.");
    assert_eq!(verdicts("response", "error"), 2);
}

#[test]
fn text_in_another_choice_ends_the_stream() {
    let guard = moderated(json!({}));
    moderation_flags_attack();
    let two = json!({"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": null},
        {"index": 1, "delta": {"content": "attack"}, "finish_reason": null}]})
    .to_string();
    let (did, out) = stream(&guard, &[two]);
    let Did::Stop(Some(error)) = &did[0] else { panic!("{did:?}") };
    assert!(error.contains("unsupported_value"), "{error}");
    assert!(!out.iter().any(|e| e.contains("attack")));
}

// ---- configuration ----

#[test]
fn defaults() {
    let guard = moderated(json!({}));
    assert_eq!(guard.action, Mode::Block);
    assert_eq!(guard.on_error, OnError::Block);
    assert_eq!(guard.window, Window::Sentences(1));
    assert_eq!(guard.timeout_ms, 2000);
    assert!(guard.check_request && guard.check_response);
    let Provider::Moderation(m) = &guard.provider else { panic!("moderation") };
    assert_eq!(m.model, "omni-moderation-latest");
}

#[test]
fn bad_configs_are_refused_without_quoting_values() {
    let secret = "sk-planted-secret";
    let moderation = json!({"url": MODERATION_URL, "apiKey": secret});
    let presidio = json!({"url": PRESIDIO_URL});
    for (config, expected) in [
        (json!({}), "missing field `provider`"),
        (json!({"provider": {}}), "exactly one of `openaiModeration` and `presidio`"),
        (json!({"provider": {"openaiModeration": moderation, "presidio": presidio}}), "exactly one"),
        (json!({"provider": {"openaiModeration": moderation}, "action": "mask"}), "needs the `presidio` provider"),
        (json!({"provider": {"openaiModeration": {"url": secret}}}), "`provider.openaiModeration.url` must be an http"),
        (json!({"provider": {"presidio": {"url": "ftp://x"}}}), "`provider.presidio.url` must be an http"),
        (json!({"provider": {"presidio": {"url": PRESIDIO_URL, "scoreThreshold": 1.5}}}), "between 0 and 1"),
        (json!({"provider": {"presidio": presidio}, "checkRequest": false, "checkResponse": false}), "both false"),
        (json!({"provider": {"presidio": presidio}, "window": {"sentences": 0}}), "at least 1"),
        (json!({"provider": {"presidio": presidio}, "window": {"chars": 0}}), "at least 1"),
        (json!({"provider": {"presidio": presidio}, "window": {"words": 3}}), "unknown variant at `window`"),
        (json!({"provider": {"presidio": presidio}, "timeoutMs": 0}), "`timeoutMs` must be positive"),
        (json!({"provider": {"presidio": presidio}, "action": secret}), "unknown variant at `action`"),
        (json!({"provider": {"presidio": presidio}, "onError": "retry"}), "unknown variant at `onError`"),
        (json!({"provider": {"openaiModeration": {"url": MODERATION_URL, "key": secret}}}), "unknown field `key`"),
        (json!({"provider": {"presidio": presidio}, "extra": 1}), "unknown field `extra`"),
    ] {
        let error = config_error(config.clone());
        assert!(error.starts_with("guardrail: "), "{error}");
        assert!(error.contains(expected), "{config}: expected {expected:?} in {error:?}");
        assert!(!error.contains("planted"), "{error}");
    }
    let presidio_mask = json!({"provider": {"presidio": {"url": PRESIDIO_URL}}, "action": "mask"});
    assert_eq!(guardrail(presidio_mask).action, Mode::Mask);
}
