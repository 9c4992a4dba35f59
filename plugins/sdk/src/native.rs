//! The host's `request` resource, natively: the same methods, on the
//! gateway's own chat body code (`sluice-chat`), so a plugin's unit tests
//! see what the host would do with its reads and edits.

use std::cell::RefCell;

use bytes::Bytes;
use sluice_chat::ChatBody;

use crate::chat::{Content, ContentPart, Message};

pub struct NativeRequest {
    state: RefCell<State>,
}

pub(crate) struct State {
    pub method: String,
    pub path: String,
    pub model: String,
    pub route: String,
    pub consumer: Option<String>,
    pub headers: Vec<(String, String)>,
    pub body: ChatBody,
    pub response_headers: Vec<(String, String)>,
    /// Set on MCP traffic, as the gateway sets it.
    pub mcp: Option<Mcp>,
    /// What `set-model` and `set-backend` chose.
    pub routed_model: Option<String>,
    pub routed_backend: Option<String>,
    /// Edits the host could not apply: it would fail the plugin.
    pub invalid_edits: Vec<String>,
    /// Every call into the host, in order, as `method` or `method(name)`:
    /// each is a crossing out of the component, which costs more than most
    /// of what a plugin does in between.
    pub host_calls: Vec<String>,
}

impl NativeRequest {
    pub(crate) fn new(method: &str, path: &str, model: &str, headers: &[(&str, &str)], body: Vec<u8>) -> Self {
        let state = State {
            method: method.into(),
            path: path.into(),
            model: model.into(),
            route: "default/chat".into(),
            consumer: None,
            mcp: None,
            headers: headers.iter().map(|(n, v)| (n.to_ascii_lowercase(), v.to_string())).collect(),
            body: ChatBody::new(Bytes::from(body)),
            response_headers: Vec::new(),
            routed_model: None,
            routed_backend: None,
            invalid_edits: Vec::new(),
            host_calls: Vec::new(),
        };
        NativeRequest { state: RefCell::new(state) }
    }

    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.state.borrow_mut())
    }

    /// [`Self::with`] for a method of the host's resource: the call is
    /// recorded.
    fn call<R>(&self, method: &str, name: Option<&str>, f: impl FnOnce(&mut State) -> R) -> R {
        self.with(|s| {
            s.host_calls.push(name.map_or_else(|| method.to_string(), |name| format!("{method}({name})")));
            f(s)
        })
    }

    pub fn method(&self) -> String {
        self.call("method", None, |s| s.method.clone())
    }

    pub fn path(&self) -> String {
        self.call("path", None, |s| s.path.clone())
    }

    pub fn model(&self) -> String {
        self.call("model", None, |s| s.model.clone())
    }

    pub fn route(&self) -> String {
        self.call("route", None, |s| s.route.clone())
    }

    pub fn consumer(&self) -> Option<String> {
        self.call("consumer", None, |s| s.consumer.clone())
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.call("header", Some(name), |s| {
            s.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.clone())
        })
    }

    pub fn headers(&self) -> Vec<(String, String)> {
        self.call("headers", None, |s| s.headers.clone())
    }

    pub fn set_header(&self, name: &str, value: &str) {
        self.call("set-header", Some(name), |s| match check_header(name, value) {
            Ok(()) => set(&mut s.headers, name, value),
            Err(error) => s.invalid_edits.push(format!("set-header: {error}")),
        })
    }

    pub fn remove_header(&self, name: &str) {
        self.call("remove-header", Some(name), |s| s.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name)))
    }

    pub fn set_response_header(&self, name: &str, value: &str) {
        self.call("set-response-header", Some(name), |s| match check_header(name, value) {
            Ok(()) => set(&mut s.response_headers, name, value),
            Err(error) => s.invalid_edits.push(format!("set-response-header: {error}")),
        })
    }

    pub fn body(&self) -> Vec<u8> {
        self.call("body", None, |s| s.body.bytes().to_vec())
    }

    pub fn body_size(&self) -> u64 {
        self.call("body-size", None, |s| s.body.len() as u64)
    }

    pub fn set_body(&self, body: &[u8]) {
        self.call("set-body", None, |s| s.body.set_bytes(Bytes::copy_from_slice(body)))
    }

    pub fn messages(&self) -> Result<Vec<Message>, String> {
        self.call("messages", None, |s| s.body.messages()).map(|messages| messages.into_iter().map(from_chat).collect())
    }

    pub fn message_count(&self) -> Result<u32, String> {
        self.call("message-count", None, |s| s.body.message_count())
    }

    pub fn splice_messages(&self, start: u32, delete: u32, insert: &[Message]) {
        let insert = insert.iter().map(to_chat).collect();
        self.call("splice-messages", None, |s| {
            if let Err(error) = s.body.splice_messages(start, delete, insert) {
                s.invalid_edits.push(format!("splice-messages: {error}"));
            }
        })
    }

    pub fn set_content(&self, index: u32, content: &Content) {
        self.call("set-content", None, |s| {
            if let Err(error) = s.body.set_content(index, to_chat_content(content)) {
                s.invalid_edits.push(format!("set-content: {error}"));
            }
        })
    }

    pub fn field(&self, name: &str) -> Option<String> {
        self.call("field", Some(name), |s| s.body.field(name))
    }

    pub fn set_field(&self, name: &str, value: Option<&str>) {
        self.call("set-field", Some(name), |s| {
            if let Err(error) = s.body.set_field(name, value.map(str::to_string)) {
                s.invalid_edits.push(format!("set-field: {error}"));
            }
        })
    }

    /// The host rewrites the body's `model` too, every other byte kept.
    pub fn set_model(&self, model: &str) {
        self.call("set-model", None, |s| {
            if model.is_empty() {
                return s.invalid_edits.push("set-model: no route serves an empty model".into());
            }
            s.model = model.to_string();
            s.routed_model = Some(model.to_string());
            let body = s.body.bytes();
            if serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_ok()
                && let Some(edited) =
                    sluice_chat::set_member(&body, "model", &serde_json::Value::from(model).to_string())
            {
                s.body.set_bytes(Bytes::from(edited));
            }
        })
    }

    pub fn set_backend(&self, name: &str) {
        self.call("set-backend", None, |s| {
            if name.is_empty() {
                return s.invalid_edits.push("set-backend: no backend has an empty name".into());
            }
            s.routed_backend = Some(name.to_string());
        })
    }
}

/// An MCP message as the gateway describes it to plugins.
#[derive(Clone, Debug, Default)]
pub(crate) struct Mcp {
    pub method: String,
    pub tool: Option<String>,
    pub arguments: Option<String>,
    /// Whether `set-tool-arguments` replaced them.
    pub arguments_edited: bool,
}

impl NativeRequest {
    pub fn kind(&self) -> crate::RequestKind {
        self.call("kind", None, |s| if s.mcp.is_some() { crate::RequestKind::Mcp } else { crate::RequestKind::Chat })
    }

    pub fn mcp_method(&self) -> Option<String> {
        self.call("mcp-method", None, |s| s.mcp.as_ref().map(|mcp| mcp.method.clone()))
    }

    pub fn tool_name(&self) -> Option<String> {
        self.call("tool-name", None, |s| s.mcp.as_ref().and_then(|mcp| mcp.tool.clone()))
    }

    pub fn tool_arguments(&self) -> Option<String> {
        self.call("tool-arguments", None, |s| s.mcp.as_ref().and_then(|mcp| mcp.arguments.clone()))
    }

    /// Refused as the host refuses it: not a `tools/call`, or not a JSON
    /// object (the host's body limit is not modelled).
    pub fn set_tool_arguments(&self, arguments: &str) {
        self.call("set-tool-arguments", None, |s| {
            let Some(mcp) = s.mcp.as_mut().filter(|mcp| mcp.method == "tools/call") else {
                return s.invalid_edits.push("set-tool-arguments: the request is not an MCP tools/call".into());
            };
            let is_object = arguments.trim_start().starts_with('{');
            match sluice_chat::check_json(arguments.as_bytes()) {
                Ok(()) if is_object => {
                    mcp.arguments = Some(arguments.to_string());
                    mcp.arguments_edited = true;
                }
                Ok(()) => s.invalid_edits.push("set-tool-arguments: the arguments are JSON but not an object".into()),
                Err(e) => s.invalid_edits.push(format!("set-tool-arguments: the arguments are not JSON: {e}")),
            }
        })
    }
}

impl Drop for NativeRequest {
    /// A test that made an edit the host would refuse fails here, unless it
    /// took the record with `Request::take_invalid_edits`.
    fn drop(&mut self) {
        let invalid = std::mem::take(&mut self.state.get_mut().invalid_edits);
        if !invalid.is_empty() && !std::thread::panicking() {
            panic!("the host would fail this plugin for edits it cannot apply: {invalid:?}");
        }
    }
}

/// Replaces every value of `name` (any case) with `value`.
fn set(headers: &mut Vec<(String, String)>, name: &str, value: &str) {
    headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
    headers.push((name.to_ascii_lowercase(), value.to_string()));
}

/// What HTTP can carry: a token (RFC 9110) for the name, and a value
/// without control characters other than tab.
fn check_header(name: &str, value: &str) -> Result<(), String> {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || !name.bytes().all(token) {
        return Err(format!("{name:?} is not a valid header name"));
    }
    if value.bytes().any(|b| (b < b' ' && b != b'\t') || b == 0x7f) {
        return Err(format!("the value of {name} has control characters"));
    }
    Ok(())
}

fn from_chat(message: sluice_chat::Message) -> Message {
    let content = match message.content {
        sluice_chat::Content::None => Content::None,
        sluice_chat::Content::Text(text) => Content::Text(text),
        sluice_chat::Content::Parts(parts) => Content::Parts(
            parts
                .into_iter()
                .map(|part| match part {
                    sluice_chat::Part::Text(text) => ContentPart::Text(text),
                    sluice_chat::Part::Other(json) => ContentPart::Other(json),
                })
                .collect(),
        ),
    };
    Message { role: message.role, content, extra: message.extra }
}

fn to_chat(message: &Message) -> sluice_chat::Message {
    sluice_chat::Message {
        role: message.role.clone(),
        content: to_chat_content(&message.content),
        extra: message.extra.clone(),
    }
}

fn to_chat_content(content: &Content) -> sluice_chat::Content {
    match content {
        Content::None => sluice_chat::Content::None,
        Content::Text(text) => sluice_chat::Content::Text(text.clone()),
        Content::Parts(parts) => sluice_chat::Content::Parts(
            parts
                .iter()
                .map(|part| match part {
                    ContentPart::Text(text) => sluice_chat::Part::Text(text.clone()),
                    ContentPart::Other(json) => sluice_chat::Part::Other(json.clone()),
                })
                .collect(),
        ),
    }
}
