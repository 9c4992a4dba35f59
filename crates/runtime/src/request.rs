//! The request a route's plugins see and edit, one after another: in 0.3 a
//! handle (`resource request`) to this value, in 0.2 a copy of it.

use http::HeaderMap;
use sluice_chat::ChatBody;

use crate::headers::{self, apply_edits};

/// The request, as the plugins before the current one left it.
#[derive(Clone, Debug, Default)]
pub struct PluginRequest {
    pub method: String,
    /// Path and query.
    pub path: String,
    /// The model the client asked for.
    pub model: String,
    /// The route serving it, `namespace/name`.
    pub route: String,
    /// Who the route's auth phase said the caller is, once it has ended.
    pub consumer: Option<String>,
    pub headers: HeaderMap,
    /// Parsed once for the whole chain; written once, after it.
    pub body: ChatBody,
    /// Headers plugins set for the client's response.
    pub response_headers: HeaderMap,
    /// The most bytes a body a plugin leaves may have.
    pub max_body_bytes: usize,
    /// The backend of its route a plugin chose (`set-backend`), by name.
    pub backend: Option<String>,
    /// Whether a plugin routed it to another model (`set-model`): `model`
    /// is then the one chosen, and the body says so.
    pub rerouted: bool,
    /// The first edit of the current call that could not be applied.
    pub(crate) invalid: Option<String>,
    /// Set on MCP traffic: the JSON-RPC message's method, and for
    /// `tools/call` the tool and its arguments (WIT 0.3.3).
    pub mcp: Option<McpRequest>,
}

/// An MCP message as plugins see it. The body is the JSON-RPC message
/// itself; these are read from it once, by the gateway.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct McpRequest {
    /// `tools/call`, `tools/list`, `initialize`, ...
    pub method: String,
    /// For `tools/call` (and `prompts/get`): the name as the client sent it,
    /// with its server's prefix (`weather__forecast`).
    pub tool: Option<String>,
    /// The call's `arguments`, as JSON object text.
    pub arguments: Option<String>,
    /// A plugin replaced `arguments` (`set-tool-arguments`): the gateway
    /// writes them into the message it forwards.
    pub arguments_edited: bool,
}

impl PluginRequest {
    /// A request no plugin has seen yet.
    pub fn new(method: String, path: String, model: String, route: String, headers: HeaderMap, body: ChatBody) -> Self {
        PluginRequest { method, path, model, route, headers, body, max_body_bytes: usize::MAX, ..Default::default() }
    }

    /// `POST /v1/chat/completions` of a JSON `body` for `model` on route
    /// `default/chat`, as a client sends it: for tests and benchmarks.
    pub fn chat(model: &str, body: ChatBody) -> Self {
        let json = http::HeaderValue::from_static("application/json");
        let headers = HeaderMap::from_iter([(http::header::CONTENT_TYPE, json)]);
        let (method, path) = ("POST".into(), "/v1/chat/completions".into());
        PluginRequest::new(method, path, model.into(), "default/chat".into(), headers, body)
    }

    /// Whether this is MCP traffic (`request.kind`).
    pub fn is_mcp(&self) -> bool {
        self.mcp.is_some()
    }

    /// Why the current call's edits cannot stand, if they cannot: the first
    /// edit refused during the call (a body over the limit included). Cleared.
    pub(crate) fn take_invalid(&mut self) -> Option<String> {
        self.invalid.take()
    }

    fn refuse(&mut self, why: String) {
        self.invalid.get_or_insert(why);
    }

    /// After a refused edit the plugin will fail: later edits are not made,
    /// so a plugin cannot go on growing the host's copy of the request.
    fn refused(&self) -> bool {
        self.invalid.is_some()
    }

    /// Makes a header edit unless one was refused already.
    fn edit(&mut self, edit: impl FnOnce(&mut Self) -> Result<(), String>) {
        if self.refused() {
            return;
        }
        if let Err(why) = edit(self) {
            self.refuse(why);
        }
    }

    pub(crate) fn edit_headers(&mut self, set: &[(String, String)], remove: &[String]) {
        self.edit(|request| apply_edits(&mut request.headers, set, remove));
    }

    pub(crate) fn set_body(&mut self, body: Vec<u8>) {
        self.edit_body(|chat| {
            chat.set_bytes(body.into());
            Ok(())
        });
    }

    /// Routes the request to `model`: the gateway checks, when the hook
    /// returns, that the plugin may choose it.
    /// The body is rewritten when it is forwarded, as for a backend's
    /// `model`.
    pub(crate) fn set_model(&mut self, model: String) {
        if !self.refused() {
            self.model = model;
            self.rerouted = true;
            // A backend chosen before named the old route's.
            self.backend = None;
        }
    }

    pub(crate) fn set_backend(&mut self, name: String) {
        if !self.refused() {
            self.backend = Some(name);
        }
    }

    /// A `tools/call`'s arguments replaced (`set-tool-arguments`): only on
    /// one, only with a JSON object, within the body limit. The gateway
    /// writes them into the message it forwards (`arguments_edited`).
    pub(crate) fn set_tool_arguments(&mut self, arguments: String) {
        if self.refused() {
            return;
        }
        let max = self.max_body_bytes;
        let Some(mcp) = self.mcp.as_mut().filter(|mcp| mcp.method == "tools/call") else {
            return self.refuse("set-tool-arguments: the request is not an MCP tools/call".into());
        };
        if arguments.len() > max {
            let len = arguments.len();
            return self
                .refuse(format!("set-tool-arguments: the arguments ({len} bytes) are over the limit of {max} bytes"));
        }
        // Checked as `set-field`'s values are (one value, no name twice),
        // without building it: the text is kept as given.
        let is_object = arguments.trim_start().starts_with('{');
        match sluice_chat::check_json(arguments.as_bytes()) {
            Ok(()) if is_object => {
                mcp.arguments = Some(arguments);
                mcp.arguments_edited = true;
            }
            Ok(()) => self.refuse("set-tool-arguments: the arguments are JSON but not an object".into()),
            Err(e) => self.refuse(format!("set-tool-arguments: the arguments are not JSON: {e}")),
        }
    }

    /// The first value of header `name`, if it is one and is text.
    pub(crate) fn header(&self, name: &str) -> Option<String> {
        let value = self.headers.get(headers::parse_name(name)?)?;
        value.to_str().ok().map(String::from)
    }

    pub(crate) fn set_header(&mut self, name: &str, value: String) {
        self.edit(|request| headers::set_one(&mut request.headers, name, value));
    }

    pub(crate) fn remove_header(&mut self, name: &str) {
        self.edit(|request| headers::remove_one(&mut request.headers, name));
    }

    pub(crate) fn set_response_header(&mut self, name: &str, value: String) {
        self.edit(|request| headers::set_one(&mut request.response_headers, name, value));
    }

    /// Makes a body edit; past the body limit, the plugin fails.
    pub(crate) fn edit_body(&mut self, edit: impl FnOnce(&mut ChatBody) -> Result<(), String>) {
        if self.refused() {
            return;
        }
        if let Err(why) = edit(&mut self.body) {
            return self.refuse(why);
        }
        let len = self.body.len();
        if len > self.max_body_bytes {
            self.refuse(format!("the body it left ({len} bytes) is over the limit of {} bytes", self.max_body_bytes));
        }
    }
}
