//! guardrail through the real gateway, with a real checker: a small HTTP
//! server in the test that answers as OpenAI's moderation endpoint does
//! (flagging any input that contains [`WORD`]) and as Presidio's analyzer
//! does (finding e-mail addresses), reached over the plugin's egress grant.
//! The echo upstream repeats the prompt in its answer, so a prompt the
//! request check lets by comes back as model output, whole or streamed in
//! many chunks.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::plugin_support::serve_each as serve;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use parking_lot::Mutex;
use serde_json::{Value, json};
use sluice_tests::{ConfigDir, Echo, Gateway, Plugin, Reply, Streamed, run_sdk_script};
use tokio::net::TcpListener;

/// What the checker flags.
const WORD: &str = "bomb";

/// A prompt whose third sentence is flagged.
const STORY: &str = "The weather is nice. Rivers are long. Here is how to make a bomb at home. This is never sent.";

/// What the checker was asked: each request's path, `authorization`, and body.
type Seen = Arc<Mutex<Vec<(String, Option<String>, Value)>>>;

/// A moderation- and Presidio-compatible checker on loopback.
struct Checker {
    addr: SocketAddr,
    seen: Seen,
}

impl Checker {
    async fn start() -> Checker {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Seen::default();
        let log = seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let log = log.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| answer(request, log.clone()));
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
        });
        Checker { addr, seen }
    }

    fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The moderation inputs it was sent, in order.
    fn inputs(&self) -> Vec<String> {
        let seen = self.seen.lock();
        seen.iter().filter_map(|(_, _, body)| body["input"].as_str().map(str::to_string)).collect()
    }
}

async fn answer(request: Request<Incoming>, seen: Seen) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = request.uri().path().to_string();
    let authorization = request.headers().get("authorization").and_then(|v| v.to_str().ok()).map(str::to_string);
    let body = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    seen.lock().push((path.clone(), authorization, body.clone()));
    let answer = match path.as_str() {
        "/v1/moderations" => {
            let flagged = body["input"].as_str().is_some_and(|input| input.to_lowercase().contains(WORD));
            json!({"id": "modr-e2e", "model": body["model"], "results": [{"flagged": flagged,
                "categories": {"violence": flagged, "harassment": false}, "category_scores": {"violence": 0.5}}]})
        }
        // Presidio's analyzer: each word with an `@` is an e-mail address,
        // at offsets in characters, as Python counts them.
        "/analyze" => {
            let text = body["text"].as_str().unwrap_or_default();
            let mut found = Vec::new();
            let mut at = 0;
            for word in text.split(' ') {
                let address = word.trim_end_matches(['.', ',']);
                if address.contains('@') {
                    let len = address.chars().count();
                    found.push(json!({"entity_type": "EMAIL_ADDRESS", "start": at, "end": at + len, "score": 1.0}));
                }
                at += word.chars().count() + 1;
            }
            Value::Array(found)
        }
        _ => return Ok(Response::builder().status(404).body(Full::new(Bytes::new())).unwrap()),
    };
    Ok(Response::new(Full::new(Bytes::from(answer.to_string()))))
}

/// A guardrail on the checker's moderation endpoint, with `extra` config.
fn guardrail(name: &str, origin: &str, extra: Value) -> Plugin {
    let mut config = json!({"provider": {"openaiModeration": {"url": format!("{origin}/v1/moderations"),
        "model": "omni-moderation-latest", "apiKey": "sk-moderation-e2e"}}, "timeoutMs": 2000});
    config.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    Plugin::new(name, "guardrail")
        .config(config)
        .timeout_ms(5000)
        .endpoints(&["/v1/chat/completions"])
        .egress(json!({"destinations": [{"url": origin}]}))
}

async fn ask(gateway: &Gateway, model: &str, prompt: &str) -> Reply {
    let body = json!({"model": model, "messages": [{"role": "user", "content": prompt}]});
    gateway.post("/v1/chat/completions", body.to_string(), &[]).await
}

async fn ask_streamed(gateway: &Gateway, model: &str, prompt: &str) -> Streamed {
    let body = json!({"model": model, "stream": true, "messages": [{"role": "user", "content": prompt}]});
    let knobs = [("x-echo-chunks", "60"), ("x-echo-chunk-delay-ms", "0")];
    let streamed =
        gateway.client().post_streaming(&gateway.url("/v1/chat/completions"), body.to_string(), &knobs).await;
    assert_eq!(streamed.status, 200);
    streamed
}

/// A counter of the gateway's `/metrics`, 0 if absent.
async fn metric(gateway: &Gateway, name: &str, labels: &str) -> f64 {
    let metrics = gateway.client().get(&gateway.admin_url("/metrics")).await.text();
    metrics
        .lines()
        .find(|line| line.starts_with(&format!("{name}{{")) && line.contains(labels))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// A loopback origin nobody listens on: a checker that is down.
async fn down_origin() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

#[tokio::test]
async fn prompts_are_checked_before_they_are_forwarded() {
    let checker = Checker::start().await;
    let down = down_origin().await;
    let plugins = [
        guardrail("guarded", &checker.origin(), json!({})),
        guardrail("down-closed", &down, json!({"onError": "block"})),
        guardrail("down-open", &down, json!({"onError": "allow"})),
    ];
    let (echo, _dir, gateway) = serve(&plugins).await;

    // A flagged prompt: 400 content_filter, and nothing reaches the upstream.
    let error = ask(&gateway, "guarded", "how do I build a BOMB?").await.assert_error(400, "content_filter");
    assert_eq!(error["type"], "invalid_request_error");
    assert_eq!(error["message"], "the prompt was blocked by the guardrail: flagged for violence");
    assert_eq!(echo.script().requests(), 0, "the upstream was reached");
    {
        let seen = checker.seen.lock();
        let (path, authorization, body) = &seen[0];
        assert_eq!(path, "/v1/moderations");
        assert_eq!(authorization.as_deref(), Some("Bearer sk-moderation-e2e"));
        assert_eq!(body, &json!({"model": "omni-moderation-latest", "input": "how do I build a BOMB?"}));
    }

    // A clean one is forwarded as it was sent.
    let reply = ask(&gateway, "guarded", "a haiku about rivers").await;
    assert_eq!(reply.echoed()["messages"], json!([{"role": "user", "content": "a haiku about rivers"}]));
    assert_eq!(echo.script().requests(), 1);
    // Its answer was checked too (the echo's JSON, without a sentence end).
    assert_eq!(checker.inputs().len(), 3, "{:?}", checker.inputs());

    // A checker that is down: closed refuses, open lets by.
    let error = ask(&gateway, "down-closed", "hello").await.assert_error(503, "guardrail_unavailable");
    assert_eq!(error["message"], "the guardrail could not check the prompt, so it was not sent");
    assert_eq!(echo.script().requests(), 1);
    let reply = ask(&gateway, "down-open", "hello").await;
    assert_eq!(reply.echoed()["messages"][0]["content"], "hello");

    let verdicts = "sluice_plugin_guardrail_verdicts_total";
    let labels = |plugin: &str, phase: &str, verdict: &str| {
        format!("plugin=\"{plugin}\",phase=\"{phase}\",verdict=\"{verdict}\"")
    };
    assert_eq!(metric(&gateway, verdicts, &labels("guarded", "request", "block")).await, 1.0);
    assert_eq!(metric(&gateway, verdicts, &labels("guarded", "request", "pass")).await, 1.0);
    assert_eq!(metric(&gateway, verdicts, &labels("guarded", "response", "pass")).await, 1.0);
    assert_eq!(metric(&gateway, verdicts, &labels("down-closed", "request", "error")).await, 1.0);
    // The open one checked the prompt and the answer, and both failed.
    assert_eq!(metric(&gateway, verdicts, &labels("down-open", "request", "error")).await, 1.0);
    assert_eq!(metric(&gateway, verdicts, &labels("down-open", "response", "error")).await, 1.0);
    let seconds = "sluice_plugin_guardrail_check_seconds_count";
    assert_eq!(metric(&gateway, seconds, "plugin=\"guarded\",phase=\"request\"").await, 2.0);

    // The checker's key went to the checker only: not to the log, the
    // metrics or the admin view.
    let metrics = gateway.client().get(&gateway.admin_url("/metrics")).await.text();
    let admin = gateway.admin_config().await.to_string();
    for (what, text) in [("log", gateway.log()), ("metrics", metrics), ("admin config", admin)] {
        assert!(!text.contains("sk-moderation-e2e"), "the checker's key is in the {what}");
    }
}

/// The content of the streamed chunks, and the error event if the stream
/// ended with one. The stream always ends with `[DONE]`.
fn streamed_content(streamed: &Streamed) -> (String, Option<Value>) {
    let events = streamed.events();
    assert_eq!(events.last().map(|(_, data)| data.as_str()), Some("[DONE]"), "the stream ends with [DONE]");
    let mut content = String::new();
    let mut error = None;
    for (_, data) in &events[..events.len() - 1] {
        let event: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("not JSON ({e}): {data}"));
        assert!(error.is_none(), "an event after the error: {data}");
        if event.get("error").is_some() {
            error = Some(event["error"].clone());
            continue;
        }
        for choice in event["choices"].as_array().unwrap() {
            content += choice["delta"]["content"].as_str().unwrap_or_default();
        }
    }
    (content, error)
}

#[tokio::test]
async fn a_streamed_answer_is_checked_a_sentence_at_a_time_and_cut_before_the_flagged_one() {
    let checker = Checker::start().await;
    // The prompt is not checked: the flagged word comes back as model output.
    let plugins = [guardrail("output", &checker.origin(), json!({"checkRequest": false}))];
    let (_echo, _dir, gateway) = serve(&plugins).await;

    let streamed = ask_streamed(&gateway, "output", STORY).await;
    let (content, error) = streamed_content(&streamed);
    let error = error.expect("the stream ends with an error event");
    assert_eq!(
        error,
        json!({"message": "the response was blocked by the guardrail: flagged for violence",
            "type": "invalid_request_error", "param": null, "code": "content_filter"})
    );
    assert!(content.ends_with(r#""content":"The weather is nice. Rivers are long."#), "{content}");
    assert!(!content.contains(WORD) && !content.contains("never"), "{content}");
    // The checker saw sentence windows, up to the flagged one, and no more.
    let inputs = checker.inputs();
    assert_eq!(inputs.len(), 3, "{inputs:?}");
    assert!(inputs[0].ends_with(r#""content":"The weather is nice."#), "{inputs:?}");
    assert_eq!(inputs[1..], [" Rivers are long.", " Here is how to make a bomb at home."]);

    // A clean answer arrives whole, as the echo wrote it.
    let streamed = ask_streamed(&gateway, "output", "Rivers are long. Seas are wide.").await;
    let (content, error) = streamed_content(&streamed);
    assert_eq!(error, None);
    let echoed: Value = serde_json::from_str(&content).unwrap_or_else(|e| panic!("{e}: {content}"));
    assert_eq!(echoed["messages"][0]["content"], "Rivers are long. Seas are wide.");

    // Whole answers are checked too: the flagged one is replaced by a notice.
    let reply = ask(&gateway, "output", STORY).await;
    assert_eq!(reply.status, 200);
    let choice = &reply.json()["choices"][0];
    assert_eq!(choice["finish_reason"], "content_filter");
    assert_eq!(choice["message"]["content"], "This response was blocked by the gateway's guardrail.");
}

/// The official OpenAI Python SDK reads the error event as an `APIError`
/// and its stream ends; it never sees the flagged sentence.
#[tokio::test]
async fn the_openai_sdk_gets_the_error_event_and_the_stream_ends() {
    let checker = Checker::start().await;
    let plugins = [guardrail("output", &checker.origin(), json!({"checkRequest": false}))];
    let (_echo, _dir, gateway) = serve(&plugins).await;
    let script = r#"
import sys, json, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0)
knobs = {"x-echo-chunks": "60", "x-echo-chunk-delay-ms": "0"}
def stream(prompt):
    text, chunks = "", 0
    s = client.chat.completions.create(model="output", messages=[{"role": "user", "content": prompt}],
        stream=True, extra_headers=knobs)
    try:
        for chunk in s:
            chunks += 1
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
    except openai.APIError as e:
        return text, chunks, e
    return text, chunks, None
text, chunks, error = stream(sys.argv[2])
assert error is not None, text
assert error.code == "content_filter", (error.code, error.body)
assert error.type == "invalid_request_error", error.type
assert "blocked by the guardrail" in error.message, error.message
assert "bomb" not in text and "never" not in text, text
assert text.endswith('"content":"The weather is nice. Rivers are long.'), text
print("ok error_event")
text, chunks, error = stream("Rivers are long. Seas are wide.")
assert error is None, error
assert json.loads(text)["messages"][0]["content"] == "Rivers are long. Seas are wide.", text
print("ok clean_stream")
"#;
    let checks = ["error_event", "clean_stream"];
    run_sdk_script(script, &[&gateway.url("/v1"), STORY], &[], &checks, Duration::from_secs(60)).await;
}

/// example.yaml loads as written (its module, upstream and analyzer pointed
/// at this test's) and masks an address before the upstream sees it.
#[tokio::test]
async fn the_example_masks_an_address_out_of_the_prompt() {
    let checker = Checker::start().await;
    let echo = Echo::start().await;
    let plugins = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins").canonicalize().unwrap();
    let yaml = std::fs::read_to_string(plugins.join("guardrail/example.yaml")).unwrap();
    let pointed = yaml
        .replace("file: ../dist/", &format!("file: {}/", plugins.join("dist").display()))
        .replace("http://127.0.0.1:9000/v1", &echo.url())
        .replace("http://127.0.0.1:5002", &checker.origin());
    let dir = ConfigDir::new();
    dir.write("example.yaml", &pointed);
    let gateway = Gateway::start(&dir).await;
    let admin = gateway.admin_config().await;
    assert_eq!(admin["errors"], json!([]), "{admin}");

    let reply = ask(&gateway, "gpt-4o-mini", "Écris à zoë@exämple.fr demain, merci.").await;
    assert_eq!(reply.echoed()["messages"][0]["content"], "Écris à <EMAIL_ADDRESS> demain, merci.");
    let seen = checker.seen.lock();
    assert_eq!(seen[0].0, "/analyze");
    assert_eq!(seen[0].2["text"], "Écris à zoë@exämple.fr demain, merci.");
    assert_eq!(seen[0].2["entities"], json!(["EMAIL_ADDRESS", "PHONE_NUMBER", "CREDIT_CARD", "IBAN_CODE"]));
}
