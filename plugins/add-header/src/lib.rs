//! Sets a request header and, if configured, top-level fields of the JSON
//! body and a header on the response the client gets. Everything is done
//! from the request hook: no instance is held across the upstream call.

use serde::Deserialize;
use serde_json::{Map, Value};
use sluice_plugin_sdk::prelude::*;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    header: String,
    value: String,
    /// Top-level fields written over the JSON request body's.
    set_body: Option<Map<String, Value>>,
    response_header: Option<Header>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    name: String,
    value: String,
}

#[derive(Debug)]
struct AddHeader {
    header: String,
    value: String,
    /// `setBody` but `messages`, as (name, JSON text) in config order.
    fields: Vec<(String, String)>,
    /// `setBody.messages`: they replace the request's.
    messages: Option<Vec<Message>>,
    response_header: Option<Header>,
}

impl Plugin for AddHeader {
    const NAME: &'static str = "add-header";
    type Config = Config;
    type State = ();

    fn new(config: Config) -> Result<Self, String> {
        let header = header_name(&config.header)?;
        check_header_value(&config.value)?;
        let mut response_header = config.response_header;
        if let Some(header) = &mut response_header {
            header.name = header_name(&header.name)?;
            check_header_value(&header.value)?;
        }
        let mut fields = Vec::new();
        let mut messages = None;
        for (name, value) in config.set_body.unwrap_or_default() {
            match name.as_str() {
                // The gateway routed the request by it before any plugin ran.
                "model" => return Err("setBody: `model` cannot be set: the route decides".into()),
                "messages" => messages = Some(replacement_messages(&value)?),
                _ => fields.push((name, value.to_string())),
            }
        }
        Ok(AddHeader { header, value: config.value, fields, messages, response_header })
    }

    fn on_request(&self, req: &Request, _: &mut ()) -> Result<Action, ApiError> {
        req.set_header(&self.header, &self.value);
        if let Some(messages) = &self.messages {
            let count = req.message_count()?;
            req.splice_messages(0, count, messages);
        }
        for (name, json) in &self.fields {
            req.set_field_json(name, Some(json));
        }
        if let Some(header) = &self.response_header {
            req.set_response_header(&header.name, &header.value);
        }
        Ok(Action::Continue)
    }
}

/// `setBody.messages`, checked now: the host replaces messages only with
/// messages.
fn replacement_messages(value: &Value) -> Result<Vec<Message>, String> {
    let Value::Array(messages) = value else {
        return Err("setBody: `messages` must be an array of messages".into());
    };
    messages
        .iter()
        .enumerate()
        .map(|(i, message)| Message::from_json(message).map_err(|e| format!("setBody: messages[{i}]: {e}")))
        .collect()
}

/// Checks `name` is an HTTP token (RFC 9110) and returns it in lower case,
/// the form the host uses.
fn header_name(name: &str) -> Result<String, String> {
    let is_token_char = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || !name.bytes().all(is_token_char) {
        return Err(format!("{name:?} is not a valid header name"));
    }
    Ok(name.to_ascii_lowercase())
}

fn check_header_value(value: &str) -> Result<(), String> {
    if value.bytes().any(|b| (b < b' ' && b != b'\t') || b == 0x7f) {
        // The value is not quoted: it may come from a Secret.
        return Err("a header value contains control characters".to_string());
    }
    Ok(())
}

export_plugin!(AddHeader);

#[cfg(test)]
mod tests {
    use serde_json::json;
    use sluice_plugin_sdk::testing::{chat_request, raw_request};

    use super::*;

    fn parse(json: &str) -> Result<AddHeader, String> {
        sluice_plugin_sdk::configure::<AddHeader>(json)
    }

    /// The request after the hook, which must go on.
    fn edit(plugin: &AddHeader, body: &[u8]) -> Request {
        let req = raw_request("m", &[("x-team", "client")], body.to_vec());
        assert_eq!(plugin.on_request(&req, &mut ()), Ok(Action::Continue));
        req
    }

    #[test]
    fn parses_a_minimal_config() {
        let config = parse(r#"{"header": "X-Team", "value": "search"}"#).unwrap();
        assert_eq!(config.header, "x-team");
        assert_eq!(config.value, "search");
        assert_eq!(config.hooks(), Hooks::REQUEST);
    }

    #[test]
    fn the_response_header_is_set_from_the_request_hook_alone() {
        let config = parse(
            r#"{"header": "x-team", "value": "search",
                "responseHeader": {"name": "X-Sluice-Plugin", "value": "add-header"}}"#,
        )
        .unwrap();
        assert_eq!(config.hooks(), Hooks::REQUEST, "no instance is held for the response");
        let req = edit(&config, br#"{"model": "m"}"#);
        assert_eq!(req.response_headers(), [("x-sluice-plugin".to_string(), "add-header".to_string())]);
    }

    #[test]
    fn rejects_missing_fields() {
        let err = parse(r#"{"value": "search"}"#).unwrap_err();
        assert!(err.contains("missing field `header`"), "{err}");
        let err = parse(r#"{"header": "x-team"}"#).unwrap_err();
        assert!(err.contains("missing field `value`"), "{err}");
    }

    #[test]
    fn rejects_invalid_header_names_and_values() {
        for name in ["", "x team", "x-team:", "x\u{e9}"] {
            let json = serde_json::json!({"header": name, "value": "v"}).to_string();
            let err = parse(&json).unwrap_err();
            assert!(err.contains("not a valid header name"), "{name:?}: {err}");
        }
        let err = parse(r#"{"header": "x-team", "value": "a\r\nb: c"}"#).unwrap_err();
        assert!(err.contains("control characters"), "{err}");
        let err = parse(r#"{"header": "x-team", "value": "v", "responseHeader": {"name": "bad name", "value": "v"}}"#)
            .unwrap_err();
        assert!(err.contains("not a valid header name"), "{err}");
    }

    #[test]
    fn rejects_unknown_fields() {
        let err = parse(r#"{"header": "x-team", "value": "v", "setbody": {}}"#).unwrap_err();
        assert!(err.contains("unknown field `setbody`"), "{err}");
    }

    #[test]
    fn sets_the_header_and_leaves_the_body_alone_without_set_body() {
        let config = parse(r#"{"header": "x-team", "value": "search"}"#).unwrap();
        let body = br#"{"model": "m", "n": 1.10}"#;
        let req = edit(&config, body);
        assert_eq!(req.headers(), [("x-team".to_string(), "search".to_string())], "the client's value replaced");
        assert!(req.response_headers().is_empty());
        assert_eq!(req.body(), body, "byte for byte");
    }

    #[test]
    fn set_body_overwrites_and_adds_fields_in_order() {
        let config =
            parse(r#"{"header": "x-team", "value": "search", "setBody": {"user": "team-search", "n": 2}}"#).unwrap();
        let req = edit(&config, br#"{"model": "m", "user": "alice", "messages": []}"#);
        let out = req.body_json();
        assert_eq!(out, json!({"model": "m", "user": "team-search", "messages": [], "n": 2}));
        let keys: Vec<&String> = out.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["model", "user", "messages", "n"]);
    }

    #[test]
    fn set_body_messages_replace_the_requests() {
        let config = parse(
            r#"{"header": "x-team", "value": "v",
                "setBody": {"messages": [{"role": "system", "content": "set by add-header"}]}}"#,
        )
        .unwrap();
        let req = edit(&config, br#"{"model": "m", "messages": [{"role": "user", "content": "a"}, {"role": "user"}]}"#);
        assert_eq!(
            req.body_json(),
            json!({"model": "m", "messages": [{"role": "system", "content": "set by add-header"}]})
        );
        // A body without messages to replace is the client's error.
        let error = config.on_request(&chat_request("m", &json!({"input": "x"})), &mut ()).unwrap_err();
        assert_eq!((error.status, error.code.as_str()), (400, "invalid_chat_request"));
    }

    #[test]
    fn set_body_cannot_set_the_model_or_messages_that_are_not_messages() {
        let err = parse(r#"{"header": "x", "value": "v", "setBody": {"model": "other"}}"#).unwrap_err();
        assert!(err.contains("`model` cannot be set"), "{err}");
        let err = parse(r#"{"header": "x", "value": "v", "setBody": {"messages": "hi"}}"#).unwrap_err();
        assert!(err.contains("`messages` must be an array"), "{err}");
        let err = parse(r#"{"header": "x", "value": "v", "setBody": {"messages": [{"content": "hi"}]}}"#).unwrap_err();
        assert!(err.contains("messages[0]: no `role`"), "{err}");
    }

    /// The gateway answers 400 to a client body that is not a JSON object
    /// before any plugin runs; only an earlier plugin can leave one, and
    /// the host then fails this plugin for the edit.
    #[test]
    fn set_body_on_a_body_that_is_not_an_object_fails_the_plugin() {
        let config = parse(r#"{"header": "x-team", "value": "v", "setBody": {"user": "u"}}"#).unwrap();
        let req = edit(&config, b"[1, 2]");
        let invalid = req.take_invalid_edits();
        assert_eq!(invalid, ["set-field: the body is not a JSON object"]);
    }
}
