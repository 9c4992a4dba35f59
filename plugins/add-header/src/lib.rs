//! Sets a request header and, if configured, top-level fields of the JSON
//! body and a header on the upstream's response.

use std::sync::{Mutex, MutexGuard, PoisonError};

use serde::Deserialize;
use serde_json::{Map, Value};

wit_bindgen::generate!({ path: "../../wit", world: "plugin" });

use exports::sluice::plugin::filter::Guest;
use sluice::plugin::host::log;
use sluice::plugin::types::{
    DirectResponse, Hooks, LogLevel, Request, RequestAction, RequestEdits, Response, ResponseAction, ResponseEdits,
};

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

impl Config {
    fn parse(json: &str) -> Result<Self, String> {
        let mut config: Config = serde_json::from_str(json).map_err(|e| format!("add-header: invalid config: {e}"))?;
        config.header = header_name(&config.header)?;
        check_header_value(&config.value)?;
        if let Some(header) = &mut config.response_header {
            header.name = header_name(&header.name)?;
            check_header_value(&header.value)?;
        }
        Ok(config)
    }

    fn hooks(&self) -> Hooks {
        if self.response_header.is_some() { Hooks::REQUEST | Hooks::RESPONSE_HEAD } else { Hooks::REQUEST }
    }

    fn edit_request(&self, body: &[u8]) -> Result<RequestEdits, String> {
        let body = match &self.set_body {
            Some(fields) => Some(merge_fields(body, fields)?),
            None => None,
        };
        Ok(RequestEdits {
            set_headers: vec![(self.header.clone(), self.value.clone())],
            remove_headers: Vec::new(),
            body,
        })
    }

    fn edit_response(&self) -> ResponseEdits {
        ResponseEdits {
            set_headers: self.response_header.iter().map(|h| (h.name.clone(), h.value.clone())).collect(),
            remove_headers: Vec::new(),
        }
    }
}

/// Writes `fields` over the top level of a JSON object body, keeping the
/// other fields and their order.
fn merge_fields(body: &[u8], fields: &Map<String, Value>) -> Result<Vec<u8>, String> {
    let mut object: Map<String, Value> =
        serde_json::from_slice(body).map_err(|e| format!("add-header: request body is not a JSON object: {e}"))?;
    object.extend(fields.clone());
    serde_json::to_vec(&object).map_err(|e| format!("add-header: {e}"))
}

/// Checks `name` is an HTTP token (RFC 9110) and returns it in lower case,
/// the form the host uses.
fn header_name(name: &str) -> Result<String, String> {
    let is_token_char = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || !name.bytes().all(is_token_char) {
        return Err(format!("add-header: {name:?} is not a valid header name"));
    }
    Ok(name.to_ascii_lowercase())
}

fn check_header_value(value: &str) -> Result<(), String> {
    if value.bytes().any(|b| (b < b' ' && b != b'\t') || b == 0x7f) {
        return Err(format!("add-header: header value {value:?} contains control characters"));
    }
    Ok(())
}

/// Set by `configure`, which the host calls first on every instance.
static CONFIG: Mutex<Option<Config>> = Mutex::new(None);

fn config() -> MutexGuard<'static, Option<Config>> {
    CONFIG.lock().unwrap_or_else(PoisonError::into_inner)
}

struct AddHeader;

impl Guest for AddHeader {
    fn configure(config_json: String) -> Result<Hooks, String> {
        let parsed = Config::parse(&config_json)?;
        let hooks = parsed.hooks();
        *config() = Some(parsed);
        Ok(hooks)
    }

    fn request_filter(req: Request) -> RequestAction {
        let Some(config) = &*config() else {
            return RequestAction::Respond(error_response(500));
        };
        match config.edit_request(&req.body) {
            Ok(edits) => RequestAction::Continue(edits),
            Err(message) => {
                log(LogLevel::Warn, &message, &[]);
                RequestAction::Respond(error_response(400))
            }
        }
    }

    fn response_filter(_resp: Response) -> ResponseAction {
        let edits = match &*config() {
            Some(config) => config.edit_response(),
            None => ResponseEdits { set_headers: Vec::new(), remove_headers: Vec::new() },
        };
        ResponseAction::Continue(edits)
    }
}

/// An empty body asks the host to write its OpenAI-shaped error.
fn error_response(status: u16) -> DirectResponse {
    DirectResponse { status, headers: Vec::new(), body: Vec::new() }
}

export!(AddHeader);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_minimal_config() {
        let config = Config::parse(r#"{"header": "X-Team", "value": "search"}"#).unwrap();
        assert_eq!(config.header, "x-team");
        assert_eq!(config.value, "search");
        assert_eq!(config.hooks(), Hooks::REQUEST);
    }

    #[test]
    fn response_header_adds_the_response_hook() {
        let config = Config::parse(
            r#"{"header": "x-team", "value": "search",
                "responseHeader": {"name": "X-Sluice-Plugin", "value": "add-header"}}"#,
        )
        .unwrap();
        assert_eq!(config.hooks(), Hooks::REQUEST | Hooks::RESPONSE_HEAD);
        assert_eq!(config.edit_response().set_headers, vec![("x-sluice-plugin".to_string(), "add-header".to_string())]);
    }

    #[test]
    fn rejects_missing_fields() {
        let err = Config::parse(r#"{"value": "search"}"#).unwrap_err();
        assert!(err.contains("missing field `header`"), "{err}");
        let err = Config::parse(r#"{"header": "x-team"}"#).unwrap_err();
        assert!(err.contains("missing field `value`"), "{err}");
    }

    #[test]
    fn rejects_invalid_header_names_and_values() {
        for name in ["", "x team", "x-team:", "x\u{e9}"] {
            let json = serde_json::json!({"header": name, "value": "v"}).to_string();
            let err = Config::parse(&json).unwrap_err();
            assert!(err.contains("not a valid header name"), "{name:?}: {err}");
        }
        let err = Config::parse(r#"{"header": "x-team", "value": "a\r\nb: c"}"#).unwrap_err();
        assert!(err.contains("control characters"), "{err}");
        let err = Config::parse(
            r#"{"header": "x-team", "value": "v", "responseHeader": {"name": "bad name", "value": "v"}}"#,
        )
        .unwrap_err();
        assert!(err.contains("not a valid header name"), "{err}");
    }

    #[test]
    fn rejects_unknown_fields() {
        let err = Config::parse(r#"{"header": "x-team", "value": "v", "setbody": {}}"#).unwrap_err();
        assert!(err.contains("unknown field `setbody`"), "{err}");
    }

    #[test]
    fn sets_the_header_and_leaves_the_body_alone_without_set_body() {
        let config = Config::parse(r#"{"header": "x-team", "value": "search"}"#).unwrap();
        let edits = config.edit_request(br#"{"model": "m"}"#).unwrap();
        assert_eq!(edits.set_headers, vec![("x-team".to_string(), "search".to_string())]);
        assert!(edits.remove_headers.is_empty());
        assert_eq!(edits.body, None);
    }

    #[test]
    fn set_body_overwrites_and_adds_fields_in_order() {
        let config =
            Config::parse(r#"{"header": "x-team", "value": "search", "setBody": {"user": "team-search", "n": 2}}"#)
                .unwrap();
        let body = br#"{"model": "m", "user": "alice", "messages": []}"#;
        let edited = config.edit_request(body).unwrap().body.unwrap();
        assert_eq!(String::from_utf8(edited).unwrap(), r#"{"model":"m","user":"team-search","messages":[],"n":2}"#);
    }

    #[test]
    fn set_body_refuses_a_body_that_is_not_an_object() {
        let config = Config::parse(r#"{"header": "x-team", "value": "v", "setBody": {"user": "u"}}"#).unwrap();
        let err = config.edit_request(b"[1, 2]").unwrap_err();
        assert!(err.contains("not a JSON object"), "{err}");
    }
}
