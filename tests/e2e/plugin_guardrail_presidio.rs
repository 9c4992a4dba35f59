//! guardrail through the real gateway with the real Presidio analyzer: the
//! `presidio-analyzer` package from PyPI behind its REST API
//! (sluice_tests::Presidio), its pattern recognizers only (no spaCy model).
//! What the plugin masks or blocks is what Presidio itself finds, at
//! Presidio's own offsets (Python characters) and scores.

use crate::plugin_support::serve_each as serve;
use serde_json::{Value, json};
use sluice_tests::{Gateway, Plugin, Presidio, Reply};

/// An e-mail address and a phone number, after text of 2- and 4-byte
/// characters: Presidio counts characters, the plugin masks bytes.
const PERSONAL: &str = "Grüße aus Köln 😀! My email is ada.lovelace@example.com and my phone number is 415-555-0132.";
const MASKED: &str = "Grüße aus Köln 😀! My email is <EMAIL_ADDRESS> and my phone number is <PHONE_NUMBER>.";
const CLEAN: &str = "Write a haiku about rivers.";

/// A guardrail on `presidio`'s analyzer checking prompts, with `extra`
/// config. Answers are not checked: the echo's answer holds the request's
/// headers, whose random ids (`traceparent`, `x-request-id`) Presidio's
/// number patterns may or may not find something in.
fn guardrail(name: &str, presidio: &Presidio, extra: Value) -> Plugin {
    let mut config =
        json!({"provider": {"presidio": {"url": presidio.url(), "language": "en"}}, "checkResponse": false});
    config.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    Plugin::new(name, "guardrail")
        .config(config)
        // Presidio in Python takes milliseconds to tens of them per call.
        .timeout_ms(10000)
        .endpoints(&["/v1/chat/completions"])
        .egress(json!({"destinations": [{"url": presidio.origin()}]}))
}

async fn ask(gateway: &Gateway, model: &str, messages: Value) -> Reply {
    let body = json!({"model": model, "messages": messages});
    gateway.post("/v1/chat/completions", body.to_string(), &[]).await
}

fn user(prompt: &str) -> Value {
    json!([{"role": "user", "content": prompt}])
}

#[tokio::test]
async fn presidio_findings_are_masked_before_the_upstream_sees_them() {
    let presidio = Presidio::start().await;
    let plugins = [
        guardrail("masked", &presidio, json!({"action": "mask"})),
        // The plugin's example: four entities, and findings scored under 0.5
        // let by.
        guardrail(
            "example",
            &presidio,
            json!({"action": "mask", "provider": {"presidio": {"url": presidio.url(), "language": "en",
                "entities": ["EMAIL_ADDRESS", "PHONE_NUMBER", "CREDIT_CARD", "IBAN_CODE"], "scoreThreshold": 0.5}}}),
        ),
    ];
    let (echo, _dir, gateway) = serve(&plugins).await;

    // Each finding is masked in the message that holds it; the other
    // messages keep their bytes. Presidio also finds two URLs inside the
    // address: they merge into it.
    let messages = json!([
        {"role": "system", "content": "You answer in French."},
        {"role": "user", "content": PERSONAL},
    ]);
    let reply = ask(&gateway, "masked", messages).await;
    let echoed = reply.echoed();
    assert_eq!(
        echoed["messages"],
        json!([{"role": "system", "content": "You answer in French."}, {"role": "user", "content": MASKED}])
    );
    assert!(!echoed.to_string().contains("lovelace") && !echoed.to_string().contains("0132"), "{echoed}");

    // A clean prompt is forwarded unchanged.
    let reply = ask(&gateway, "masked", user(CLEAN)).await;
    assert_eq!(reply.echoed()["messages"], user(CLEAN));
    assert_eq!(echo.script().requests(), 2);

    // Presidio's scores count: a phone number with a context word ("phone")
    // scores 0.75 and is masked; with none it scores 0.4, under the
    // threshold, and goes through ("call" is one of spaCy's stop words,
    // which the context enhancer skips). The address scores 1.0.
    let reply = ask(&gateway, "example", user(PERSONAL)).await;
    assert_eq!(reply.echoed()["messages"], user(MASKED));
    let bare = "Reach me on ada.lovelace@example.com, or call 415-555-0132.";
    let reply = ask(&gateway, "example", user(bare)).await;
    assert_eq!(reply.echoed()["messages"], user("Reach me on <EMAIL_ADDRESS>, or call 415-555-0132."));

    // Presidio was asked once per prompt, through the plugin's egress grant.
    let analyzed = presidio.log().matches("\"POST /analyze HTTP/1.1\" 200").count();
    assert_eq!(analyzed, 4, "{}", presidio.log());
}

#[tokio::test]
async fn a_prompt_with_presidio_findings_is_blocked() {
    let presidio = Presidio::start().await;
    let plugins = [guardrail("blocked", &presidio, json!({"action": "block"}))];
    let (echo, _dir, gateway) = serve(&plugins).await;

    let error = ask(&gateway, "blocked", user(PERSONAL)).await.assert_error(400, "content_filter");
    assert_eq!(error["type"], "invalid_request_error");
    // Every entity type Presidio found, sorted: the URLs inside the address
    // merged into it.
    assert_eq!(error["message"], "the prompt was blocked by the guardrail: it contains EMAIL_ADDRESS, PHONE_NUMBER");
    assert_eq!(echo.script().requests(), 0, "the upstream was reached");

    // A clean prompt passes.
    let reply = ask(&gateway, "blocked", user(CLEAN)).await;
    assert_eq!(reply.echoed()["messages"], user(CLEAN));
    assert_eq!(echo.script().requests(), 1);
}
