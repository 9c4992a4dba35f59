//! decorator-lite in Rust: prepends a system message, sets a request header,
//! and marks the response with `x-decorated-by: rust`.

use std::sync::OnceLock;

use serde_json::{Value, json};

wit_bindgen::generate!({ path: "../../../wit", world: "plugin" });

use exports::sluice::plugin::filter::Guest;
use sluice::plugin::types::{
    ChunkAction, DirectResponse, Hooks, Request, RequestAction, RequestEdits, Response, ResponseAction, ResponseEdits,
    ResponseSummary,
};

struct Config {
    system: String,
    header: String,
    value: String,
}

/// Set by `configure`, which the host calls first on every instance.
static CONFIG: OnceLock<Config> = OnceLock::new();

fn parse_config(json: &str) -> Result<Config, String> {
    let config: Value = serde_json::from_str(json).unwrap_or(Value::Null);
    if !config.is_object() {
        return Err("decorator-lite: the config is not a JSON object".into());
    }
    let field = |name: &str| {
        config[name].as_str().map(str::to_owned).ok_or(format!("decorator-lite: the config needs a string {name:?}"))
    };
    Ok(Config { system: field("system")?, header: field("header")?, value: field("value")? })
}

fn bad_request(message: &str) -> RequestAction {
    let error = json!({"message": message, "type": "invalid_request_error", "param": null, "code": "invalid_messages"});
    RequestAction::Respond(DirectResponse {
        status: 400,
        headers: vec![("content-type".into(), "application/json".into())],
        body: json!({ "error": error }).to_string().into_bytes(),
    })
}

struct DecoratorLite;

impl Guest for DecoratorLite {
    fn configure(config: String) -> Result<Hooks, String> {
        // An instance is configured once; a second call keeps the first config.
        let _ = CONFIG.set(parse_config(&config)?);
        Ok(Hooks::REQUEST | Hooks::RESPONSE_HEAD)
    }

    fn request_filter(req: Request) -> RequestAction {
        let config = CONFIG.get().expect("configure runs first");
        let mut body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        let Some(messages) = body.get_mut("messages").and_then(Value::as_array_mut) else {
            return bad_request(r#"decorator-lite: the request body needs a "messages" array"#);
        };
        messages.insert(0, json!({"role": "system", "content": config.system}));
        RequestAction::Continue(RequestEdits {
            set_headers: vec![(config.header.clone(), config.value.clone())],
            remove_headers: Vec::new(),
            body: Some(body.to_string().into_bytes()),
        })
    }

    fn response_filter(_resp: Response) -> ResponseAction {
        let set_headers = vec![("x-decorated-by".into(), "rust".into())];
        ResponseAction::Continue(ResponseEdits { set_headers, remove_headers: Vec::new() })
    }

    // Hooks not declared by `configure`: the host never calls them.
    fn response_chunk(_data: String) -> ChunkAction {
        ChunkAction::Pass
    }

    fn response_body(_body: Vec<u8>) -> Option<Vec<u8>> {
        None
    }

    fn response_end(_summary: ResponseSummary) {}
}

export!(DecoratorLite);
