//! Golden fixtures: for each backend API, what a client's request becomes
//! on the wire to the backend (URI, headers, body) and what the backend's
//! response becomes for the client, with the plugins' edits and the
//! gateway's header rules ([`crate::headers`]) applied as in a request.
//!
//! Each `fixtures/*.json` holds a case's inputs (`backend`, `client`,
//! `backendResponse`) and its expected outputs (`sent`, `returned`, or
//! `refused` for a request the adapter refuses). `SLUICE_BLESS=1 cargo test`
//! rewrites the expected outputs from what the code does now: review the
//! diff before committing it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use http_body_util::BodyExt;
use serde_json::{Map, Value, json};
use sluice_core::Provider;
use sluice_core::routing::BackendTimeouts;

use super::{Adapter, error_code};
use crate::body::full;
use crate::chain::Outgoing;
use crate::gateway::Settings;
use crate::headers::{ForBackend, for_backend};
use crate::snapshot::Backend;
use crate::target::Target;

fn fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/backend_api/fixtures");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
}

fn backend(spec: &Value) -> Backend {
    let url = spec["url"].as_str().unwrap();
    let provider = match spec["provider"].as_str().unwrap() {
        "openai" => Provider::OpenAi,
        "anthropic" => Provider::Anthropic,
        other => panic!("unknown provider {other}"),
    };
    let credential = spec["key"].as_str().map(|key| Adapter::of(provider).credential(key).unwrap());
    Backend {
        url: url.into(),
        label: Arc::from(url),
        model: spec["model"].as_str().map(String::from),
        provider,
        credential,
        timeouts: BackendTimeouts::default(),
        client: None,
        health: Arc::default(),
        target: Target::new(url, provider),
    }
}

fn header_map(spec: &Value) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in spec.as_object().into_iter().flatten() {
        let name: http::HeaderName = name.parse().unwrap();
        headers.append(name, value.as_str().unwrap().parse().unwrap());
    }
    headers
}

/// Headers as a JSON object, names sorted; repeated names join with ", ".
fn headers_json(headers: &HeaderMap) -> Value {
    let mut names: Vec<_> = headers.keys().map(|n| n.as_str().to_string()).collect();
    names.sort();
    names.dedup();
    let object: Map<String, Value> = names
        .into_iter()
        .map(|name| {
            let values: Vec<_> = headers.get_all(&name).iter().map(|v| v.to_str().unwrap()).collect();
            (name, Value::from(values.join(", ")))
        })
        .collect();
    Value::Object(object)
}

/// A body as the fixtures write it: JSON, a list of server-sent events'
/// data (JSON or `[DONE]`), or text. In a translation (`pin`), `created`
/// is a clock reading: it is checked to be one and pinned to 0.
fn body_json(bytes: &[u8], content_type: Option<&str>, pin: bool) -> Value {
    let pin_created = |value| if pin { pin_created(value) } else { value };
    let text = std::str::from_utf8(bytes).unwrap();
    if content_type.is_some_and(|t| t.starts_with("text/event-stream")) {
        let events = text
            .split("\n\n")
            .filter(|event| !event.trim().is_empty())
            .map(|event| {
                let data: Vec<_> = event.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim).collect();
                let data = data.join("\n");
                serde_json::from_str(&data).map_or(Value::from(data), pin_created)
            })
            .collect();
        return json!({ "events": Value::Array(events) });
    }
    match serde_json::from_slice(bytes) {
        Ok(value) => json!({ "json": pin_created(value) }),
        Err(_) => json!({ "text": text }),
    }
}

fn pin_created(mut value: Value) -> Value {
    if let Some(created) = value.get_mut("created") {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        let read = created.as_u64().expect("created is a number");
        assert!(read.abs_diff(now) < 600, "created {read} is not a reading of the clock");
        *created = Value::from(0);
    }
    value
}

fn bytes_of(spec: &Value) -> Bytes {
    match (&spec["json"], &spec["text"]) {
        (Value::Null, Value::String(text)) => Bytes::from(text.clone()),
        (json, _) => Bytes::from(serde_json::to_vec(json).unwrap()),
    }
}

/// Runs one case; returns its expected outputs as the code makes them now.
async fn run(case: &Value) -> Map<String, Value> {
    let backend = backend(&case["backend"]);
    let api = Adapter::of(backend.provider);
    let client = &case["client"];
    let mut request = http::Request::new(());
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = client["path"].as_str().unwrap().parse().unwrap();
    *request.headers_mut() = header_map(&client["headers"]);
    let (parts, ()) = request.into_parts();
    let mut outgoing = Outgoing::new(parts, bytes_of(&client["body"]));
    outgoing.plugins_read_response = case["pluginsReadResponse"].as_bool().unwrap_or(false);

    let mut out = Map::new();
    let translated = match api.request(&outgoing.path, &outgoing.body, backend.model.as_deref()) {
        Ok(translated) => translated,
        Err(error) => {
            out.insert("refused".into(), json!({"status": error.status, "code": error.code}));
            return out;
        }
    };
    let uri = backend.target.uri(&outgoing.path).unwrap();
    let mut headers = outgoing.headers.clone();
    let rules = ForBackend {
        backend: &backend,
        via: &HeaderValue::from_static("1.1 sluice-golden"),
        traceparent: None,
        plugins_read_response: outgoing.plugins_read_response,
    };
    for_backend(&mut headers, rules);
    let sent_type = headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    let mut sent = json!({ "uri": uri.to_string(), "headers": headers_json(&headers) });
    sent.as_object_mut().unwrap().extend(body_json(&translated.body, sent_type, false).as_object().unwrap().clone());
    out.insert("sent".into(), sent);

    let answer = &case["backendResponse"];
    let mut response = http::Response::new(full(bytes_of(answer)));
    *response.status_mut() = http::StatusCode::from_u16(answer["status"].as_u64().unwrap() as u16).unwrap();
    *response.headers_mut() = header_map(&answer["headers"]);
    let settings = Settings::default();
    let result = api.response(response, translated.stream, &settings, Duration::from_secs(5), true).await;
    let (response, code) = result.unwrap_or_else(|error| panic!("the adapter failed the response: {error:?}"));
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    let returned_type = parts.headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    let mut returned = json!({
        "status": parts.status.as_u16(),
        "headers": headers_json(&parts.headers),
        "errorCode": code,
    });
    returned
        .as_object_mut()
        .unwrap()
        .extend(body_json(&bytes, returned_type, api.translates_responses()).as_object().unwrap().clone());
    out.insert("returned".into(), returned);
    out
}

#[tokio::test]
async fn every_backend_api_sends_and_returns_what_its_golden_fixtures_say() {
    let bless = std::env::var_os("SLUICE_BLESS").is_some();
    let files = fixtures();
    let mut apis = std::collections::BTreeSet::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let mut case: Map<String, Value> = serde_json::from_str(&text).unwrap();
        apis.insert(case["backend"]["provider"].as_str().unwrap().to_string());
        let outputs = run(&Value::Object(case.clone())).await;
        if bless {
            for key in ["sent", "returned", "refused"] {
                case.remove(key);
            }
            case.extend(outputs);
            std::fs::write(file, serde_json::to_string_pretty(&case).unwrap() + "\n").unwrap();
            continue;
        }
        for key in ["sent", "returned", "refused"] {
            assert_eq!(
                outputs.get(key),
                case.get(key),
                "{}: `{key}` differs from the golden fixture (SLUICE_BLESS=1 rewrites it)",
                file.display()
            );
        }
    }
    assert_eq!(apis.into_iter().collect::<Vec<_>>(), ["anthropic", "openai"], "every backend API has golden fixtures");
}

#[test]
fn error_codes_are_read_from_openai_error_bodies() {
    let body = br#"{"error":{"message":"too long","type":"invalid_request_error","code":"context_length_exceeded"}}"#;
    assert_eq!(error_code(body).as_deref(), Some("context_length_exceeded"));
    assert_eq!(error_code(br#"{"error":{"message":"x","code":null}}"#), None);
    assert_eq!(error_code(b"not json"), None);
}
