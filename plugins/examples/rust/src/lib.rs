//! decorator-lite in Rust: sets a request header, prepends a system message,
//! and marks the response with `x-decorated-by: rust`. The request is the
//! host's: the plugin edits it through its methods and never sees the body's
//! JSON. It declares only the `request` hook, so the host keeps no instance
//! across the upstream call.

use std::sync::OnceLock;

use serde_json::{Value, json};

wit_bindgen::generate!({ path: "../../../wit", world: "plugin" });

use exports::sluice::plugin::filter::Guest;
use sluice::plugin::types::{
    ChunkAction, Content, DirectResponse, Hooks, Message, Request, RequestAction, Response, ResponseAction,
    ResponseEdits, ResponseSummary,
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
        Ok(Hooks::REQUEST)
    }

    fn request_filter(req: &Request) -> RequestAction {
        let config = CONFIG.get().expect("configure runs first");
        // Counting is the cheap way to ask whether the body is a chat request.
        if req.message_count().is_err() {
            return bad_request(r#"decorator-lite: the request body needs a "messages" array"#);
        }
        req.set_header(&config.header, &config.value);
        let content = Content::Text(config.system.clone());
        let system = Message { role: "system".into(), content, extra: "{}".into() };
        req.splice_messages(0, 0, &[system]);
        req.set_response_header("x-decorated-by", "rust");
        RequestAction::Continue
    }

    // Hooks not declared by `configure`: the host never calls them.
    fn response_filter(_resp: Response) -> ResponseAction {
        ResponseAction::Continue(ResponseEdits { set_headers: Vec::new(), remove_headers: Vec::new() })
    }

    fn response_chunk(_data: String) -> ChunkAction {
        ChunkAction::Pass
    }

    fn response_body(_body: Vec<u8>) -> Option<Vec<u8>> {
        None
    }

    fn response_end(_summary: ResponseSummary) {}
}

export!(DecoratorLite);
