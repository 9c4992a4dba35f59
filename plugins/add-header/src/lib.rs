//! Sets a request header and, if configured, top-level fields of the JSON
//! body and a header on the upstream's response.

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
struct AddHeader(Config);

impl Plugin for AddHeader {
    const NAME: &'static str = "add-header";
    type Config = Config;
    type State = ();

    fn new(mut config: Config) -> Result<Self, String> {
        config.header = header_name(&config.header)?;
        check_header_value(&config.value)?;
        if let Some(header) = &mut config.response_header {
            header.name = header_name(&header.name)?;
            check_header_value(&header.value)?;
        }
        Ok(AddHeader(config))
    }

    fn hooks(&self) -> Hooks {
        if self.0.response_header.is_some() { Hooks::REQUEST | Hooks::RESPONSE_HEAD } else { Hooks::REQUEST }
    }

    fn on_request(&self, req: &Request, _: &mut ()) -> Result<Action, ApiError> {
        let mut edits = Edits::new().set_header(&self.0.header, &self.0.value);
        if let Some(fields) = &self.0.set_body {
            edits = edits.body(merge_fields(&req.body, fields)?);
        }
        Ok(edits.into())
    }

    fn on_response(&self, _resp: &Response, _: &mut ()) -> HeaderEdits {
        match &self.0.response_header {
            Some(header) => HeaderEdits::new().set_header(&header.name, &header.value),
            None => HeaderEdits::new(),
        }
    }
}

/// Writes `fields` over the top level of a JSON object body, keeping the
/// other fields and their order.
fn merge_fields(body: &[u8], fields: &Map<String, Value>) -> Result<Vec<u8>, ApiError> {
    let mut object: Map<String, Value> = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request("invalid_json", format!("request body is not a JSON object: {e}")))?;
    object.extend(fields.clone());
    serde_json::to_vec(&object).map_err(|e| ApiError::internal(e.to_string()))
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
    use sluice_plugin_sdk::testing::chat_request;

    use super::*;

    fn parse(json: &str) -> Result<AddHeader, String> {
        sluice_plugin_sdk::configure::<AddHeader>(json)
    }

    fn edit(plugin: &AddHeader, body: &[u8]) -> Result<Edits, ApiError> {
        let mut req = chat_request("m", &serde_json::json!({}));
        req.body = body.to_vec();
        Ok(plugin.on_request(&req, &mut ())?.edits().expect("continues").clone())
    }

    #[test]
    fn parses_a_minimal_config() {
        let config = parse(r#"{"header": "X-Team", "value": "search"}"#).unwrap();
        assert_eq!(config.0.header, "x-team");
        assert_eq!(config.0.value, "search");
        assert_eq!(config.hooks(), Hooks::REQUEST);
    }

    #[test]
    fn response_header_adds_the_response_hook() {
        let config = parse(
            r#"{"header": "x-team", "value": "search",
                "responseHeader": {"name": "X-Sluice-Plugin", "value": "add-header"}}"#,
        )
        .unwrap();
        assert_eq!(config.hooks(), Hooks::REQUEST | Hooks::RESPONSE_HEAD);
        assert_eq!(
            config.on_response(&Response { status: 200, headers: Vec::new() }, &mut ()).set_headers,
            vec![("x-sluice-plugin".to_string(), "add-header".to_string())]
        );
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
        let edits = edit(&config, br#"{"model": "m"}"#).unwrap();
        assert_eq!(edits.set_headers, vec![("x-team".to_string(), "search".to_string())]);
        assert!(edits.remove_headers.is_empty());
        assert_eq!(edits.body, None);
    }

    #[test]
    fn set_body_overwrites_and_adds_fields_in_order() {
        let config =
            parse(r#"{"header": "x-team", "value": "search", "setBody": {"user": "team-search", "n": 2}}"#).unwrap();
        let body = br#"{"model": "m", "user": "alice", "messages": []}"#;
        let edited = edit(&config, body).unwrap().body.unwrap();
        assert_eq!(String::from_utf8(edited).unwrap(), r#"{"model":"m","user":"team-search","messages":[],"n":2}"#);
    }

    #[test]
    fn set_body_refuses_a_body_that_is_not_an_object() {
        let config = parse(r#"{"header": "x-team", "value": "v", "setBody": {"user": "u"}}"#).unwrap();
        let err = edit(&config, b"[1, 2]").unwrap_err();
        assert_eq!((err.status, err.code.as_str()), (400, "invalid_json"));
        assert!(err.message.contains("not a JSON object"), "{err}");
    }
}
