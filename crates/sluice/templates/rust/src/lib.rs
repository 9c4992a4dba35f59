//! {{name}}: a Sluice plugin, written by `sluice plugin new`. It uses every
//! hook, each with a small visible effect, so you can see where your own
//! logic goes; delete what you do not need.
//!
//! - `configure` reads the GatewayPlugin's `config` (`{"value": "...",
//!   "system": "..."}`) and declares the hooks;
//! - the request hook sets the request header `x-{{name}}` to `value`,
//!   puts a system message first if `system` is set, and answers 400
//!   itself when the body has no `messages`;
//! - the response hooks set the response header `x-{{name}}`, add
//!   `"sluice_plugin": "{{name}}"` to the JSON body (or to each streamed
//!   event), and log a line when the response ends.

use std::sync::OnceLock;

use serde_json::{Value, json};

// The Rust types and traits of the `plugin` world, generated from wit/ at
// compile time.
wit_bindgen::generate!({ path: "wit", world: "plugin" });

use exports::sluice::plugin::filter::Guest;
use sluice::plugin::host;
use sluice::plugin::types::{
    ChunkAction, Content, DirectResponse, Hooks, LogLevel, Message, Request, RequestAction, Response, ResponseAction,
    ResponseEdits, ResponseSummary,
};

const NAME: &str = "{{name}}";
const HEADER: &str = "x-{{name}}";

struct Config {
    value: String,
    system: Option<String>,
}

/// Set by `configure`. The host snapshots the instance after `configure`
/// and starts every later instance from that snapshot, so this is set once
/// per plugin version, not per request.
static CONFIG: OnceLock<Config> = OnceLock::new();

fn config() -> &'static Config {
    CONFIG.get().expect("the host calls configure first")
}

fn parse_config(text: &str) -> Result<Config, String> {
    let config: Value = serde_json::from_str(text).map_err(|e| format!("{NAME}: the config is not JSON: {e}"))?;
    let value = config["value"].as_str().ok_or(format!("{NAME}: the config needs a string \"value\""))?;
    let system = match &config["system"] {
        Value::Null => None,
        Value::String(system) => Some(system.clone()),
        _ => return Err(format!("{NAME}: \"system\" must be a string")),
    };
    Ok(Config { value: value.to_owned(), system })
}

/// The JSON object in `bytes` with `"sluice_plugin": NAME` added; `None` if
/// it is not a JSON object.
fn marked(bytes: &[u8]) -> Option<Vec<u8>> {
    let Ok(Value::Object(mut object)) = serde_json::from_slice(bytes) else {
        return None;
    };
    object.insert("sluice_plugin".into(), NAME.into());
    serde_json::to_vec(&object).ok()
}

/// A 400 in OpenAI's error shape, sent by the plugin instead of forwarding.
fn bad_request(message: &str) -> RequestAction {
    let error = json!({"message": message, "type": "invalid_request_error", "param": null, "code": "invalid_messages"});
    RequestAction::Respond(DirectResponse {
        status: 400,
        headers: vec![("content-type".into(), "application/json".into())],
        body: json!({ "error": error }).to_string().into_bytes(),
    })
}

struct Plugin;

impl Guest for Plugin {
    /// Called once per plugin version with `spec.config` as JSON. An `Err`
    /// rejects the config: the message shows in `/admin/config` and the log.
    fn configure(config: String) -> Result<Hooks, String> {
        let _ = CONFIG.set(parse_config(&config)?);
        // The host calls only the hooks declared here. Declaring only
        // REQUEST is cheapest: no instance is kept across the upstream call.
        Ok(Hooks::REQUEST | Hooks::RESPONSE_HEAD | Hooks::RESPONSE_CHUNK | Hooks::RESPONSE_BODY | Hooks::RESPONSE_END)
    }

    /// Before the request is forwarded. `req` is the host's request: read
    /// only what you need, and edit it in place.
    fn request_filter(req: &Request) -> RequestAction {
        let config = config();
        // Counting is the cheap way to ask whether the body is a chat request.
        if req.message_count().is_err() {
            return bad_request(&format!("{NAME}: the request body needs a \"messages\" array"));
        }
        req.set_header(HEADER, &config.value);
        if let Some(system) = &config.system {
            let message = Message { role: "system".into(), content: Content::Text(system.clone()), extra: "{}".into() };
            req.splice_messages(0, 0, &[message]);
        }
        RequestAction::Continue
    }

    /// The upstream's status and headers.
    fn response_filter(_resp: Response) -> ResponseAction {
        let set_headers = vec![(HEADER.to_owned(), config().value.clone())];
        ResponseAction::Continue(ResponseEdits { set_headers, remove_headers: Vec::new() })
    }

    /// Each `data:` payload of a streamed (`text/event-stream`) response.
    fn response_chunk(data: String) -> ChunkAction {
        match marked(data.as_bytes()) {
            Some(json) => ChunkAction::Replace(String::from_utf8(json).expect("serde_json writes UTF-8")),
            None => ChunkAction::Pass, // `[DONE]`
        }
    }

    /// The whole body of a response that is not streamed; `Some` replaces it.
    fn response_body(body: Vec<u8>) -> Option<Vec<u8>> {
        marked(&body)
    }

    /// Once the response is over: for accounting and logs.
    fn response_end(summary: ResponseSummary) {
        let tokens = summary.usage.map_or("unknown".into(), |usage| usage.total_tokens.to_string());
        let fields = [("status".to_owned(), summary.status.to_string()), ("total_tokens".to_owned(), tokens)];
        host::log(LogLevel::Info, &format!("{NAME}: response ended"), &fields);
    }
}

export!(Plugin);
