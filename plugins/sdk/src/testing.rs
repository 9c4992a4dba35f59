//! Builders for plugin unit tests.

use serde_json::Value;

use crate::Request;

/// A `POST /v1/chat/completions` for `model` whose body is `body` with
/// `model` set (a non-object `body` is sent as is).
pub fn chat_request(model: &str, body: &Value) -> Request {
    let mut body = body.clone();
    if let Some(fields) = body.as_object_mut() {
        fields.insert("model".into(), model.into());
    }
    raw_request(model, &[], body.to_string().into_bytes())
}

/// A chat request with one user message, and `headers`.
pub fn request_with_headers(model: &str, headers: &[(&str, &str)]) -> Request {
    let body = serde_json::json!({"model": model, "messages": [{"role": "user", "content": "hello"}]});
    raw_request(model, headers, body.to_string().into_bytes())
}

/// A chat completion request with any body bytes.
pub fn raw_request(model: &str, headers: &[(&str, &str)], body: Vec<u8>) -> Request {
    Request {
        method: "POST".into(),
        path: "/v1/chat/completions".into(),
        headers: headers.iter().map(|(n, v)| (n.to_ascii_lowercase(), v.to_string())).collect(),
        body,
        model: model.into(),
        route: "default/chat".into(),
    }
}
