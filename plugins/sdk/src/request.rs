//! The request the request hook is given: in wasm, a handle to the host's
//! copy; natively, a stand-in with the host's semantics (see
//! [`crate::testing`]). A plugin reads only what it asks for and edits in
//! place; the host parses a chat body once for the whole chain.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::ApiError;
use crate::RequestKind;
use crate::chat::{Content, Message};

#[cfg(target_arch = "wasm32")]
type Inner = crate::bindings::sluice::plugin::types::Request;
#[cfg(not(target_arch = "wasm32"))]
type Inner = crate::native::NativeRequest;

/// The client's request, as the plugins before this one left it.
///
/// Edits take effect at once: a later read, and the next plugin, see them.
/// An edit the host cannot apply (a header name HTTP cannot carry, text that
/// is not JSON, an index past the end, a body over the gateway's limit)
/// fails the plugin when its hook returns; natively, the test fails.
#[repr(transparent)]
pub struct Request(pub(crate) Inner);

impl Request {
    /// The SDK's view of the host's handle.
    #[cfg(target_arch = "wasm32")]
    pub(crate) fn from_host(request: &Inner) -> &Request {
        // SAFETY: `Request` is a `repr(transparent)` wrapper of `Inner`, so
        // the two references have the same layout and lifetime.
        unsafe { &*(request as *const Inner as *const Request) }
    }

    pub fn method(&self) -> String {
        self.0.method()
    }

    /// Path and query, e.g. `/v1/chat/completions`.
    pub fn path(&self) -> String {
        self.0.path()
    }

    /// The path without its query string.
    pub fn path_only(&self) -> String {
        let mut path = self.path();
        if let Some(query) = path.find('?') {
            path.truncate(query);
        }
        path
    }

    /// Whether this is `/v1/chat/completions`.
    pub fn is_chat_completion(&self) -> bool {
        self.path_only() == "/v1/chat/completions"
    }

    /// The `model` the client asked for.
    pub fn model(&self) -> String {
        self.0.model()
    }

    /// The AIModelRoute serving it, as `namespace/name`.
    pub fn route(&self) -> String {
        self.0.route()
    }

    /// Who the route's auth phase said the caller is (`key:<name>`,
    /// `jwt:<subject>`), once that phase has ended: `None` in the auth phase
    /// itself and on routes without one. A client cannot set it, so quotas
    /// and caches may key on it. Needs a gateway serving 0.3.1.
    pub fn consumer(&self) -> Option<String> {
        self.0.consumer()
    }

    /// The first value of header `name`, ignoring case.
    pub fn header(&self, name: &str) -> Option<String> {
        self.0.header(name)
    }

    /// Every header, names in lower case; a name may repeat.
    pub fn headers(&self) -> Vec<(String, String)> {
        self.0.headers()
    }

    /// Replaces every value of `name`.
    pub fn set_header(&self, name: &str, value: &str) {
        self.0.set_header(&name.to_ascii_lowercase(), value)
    }

    pub fn remove_header(&self, name: &str) {
        self.0.remove_header(&name.to_ascii_lowercase())
    }

    /// Sets `name` on the response the client gets, whoever answers, so a
    /// plugin that only marks responses needs no response hook.
    pub fn set_response_header(&self, name: &str, value: &str) {
        self.0.set_response_header(&name.to_ascii_lowercase(), value)
    }

    /// The body as it stands now. A copy: prefer the calls below for a
    /// chat request.
    pub fn body(&self) -> Vec<u8> {
        self.0.body()
    }

    /// The body's length in bytes, without copying it: no text in it has
    /// more tokens than bytes.
    pub fn body_size(&self) -> u64 {
        self.0.body_size()
    }

    /// Replaces the whole body.
    pub fn set_body(&self, body: &[u8]) {
        self.0.set_body(body)
    }

    /// The body as JSON of type `T`, for what the calls below do not cover
    /// (a legacy completion's `prompt`); a 400 `invalid_json` otherwise.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        serde_json::from_slice(&self.body())
            .map_err(|e| ApiError::bad_request("invalid_json", format!("request body is not valid JSON: {e}")))
    }

    /// The chat request's `messages`; a 400 if the body is not a chat request.
    pub fn messages(&self) -> Result<Vec<Message>, ApiError> {
        self.0.messages().map_err(|error| self.not_chat(error))
    }

    /// How many `messages` there are; a 400 if the body is not a chat request.
    pub fn message_count(&self) -> Result<u32, ApiError> {
        self.0.message_count().map_err(|error| self.not_chat(error))
    }

    /// Replaces `delete` messages from index `start` with `insert`. Messages
    /// outside the range keep their bytes.
    pub fn splice_messages(&self, start: u32, delete: u32, insert: &[Message]) {
        self.0.splice_messages(start, delete, insert)
    }

    /// Replaces only the `content` of message `index`.
    pub fn set_content(&self, index: u32, content: &Content) {
        self.0.set_content(index, content)
    }

    /// Top-level member `name` as `T`, if present; a 400 if it is not a `T`.
    /// Not `messages`: it has its own calls.
    pub fn field<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>, ApiError> {
        let Some(json) = self.0.field(name) else {
            return Ok(None);
        };
        serde_json::from_str(&json)
            .map(Some)
            .map_err(|e| ApiError::bad_request("invalid_field", format!("`{name}` is not what was expected: {e}")))
    }

    /// The JSON text of top-level member `name`, as the client wrote it.
    pub fn field_json(&self, name: &str) -> Option<String> {
        self.0.field(name)
    }

    /// Sets top-level member `name` to `value`, added last if absent.
    /// Setting `messages` replaces them all; `model` is refused.
    pub fn set_field<T: Serialize + ?Sized>(&self, name: &str, value: &T) -> Result<(), ApiError> {
        let json = serde_json::to_string(value)
            .map_err(|e| ApiError::internal(format!("cannot encode the value of `{name}`: {e}")))?;
        self.0.set_field(name, Some(&json));
        Ok(())
    }

    /// Sets top-level member `name` to JSON text (`None` removes it).
    pub fn set_field_json(&self, name: &str, json: Option<&str>) {
        self.0.set_field(name, json)
    }

    pub fn remove_field(&self, name: &str) {
        self.0.set_field(name, None)
    }

    /// Routes the request as if the client had asked for `model`: its body's
    /// `model`, [`Request::model`], the retries, fallbacks, metrics and
    /// access log all see it. Only a model this route, or another route of
    /// its namespace, serves; any other fails the plugin when the hook
    /// returns. Not from the auth phase. Needs a gateway serving 0.3.2.
    pub fn set_model(&self, model: &str) {
        self.0.set_model(model)
    }

    /// Sends the request to the route's backend `name`
    /// (`spec.backends[].name`) first, before the route's own choice; its
    /// retries and fallbacks go on as usual if that one fails. After a
    /// [`Request::set_model`] to another route, names that route's
    /// backends. An unknown name fails the plugin. Needs 0.3.2.
    pub fn set_backend(&self, name: &str) {
        self.0.set_backend(name)
    }

    /// Whether this is a chat request or an MCP message. Needs a gateway
    /// serving 0.3.3.
    pub fn kind(&self) -> RequestKind {
        self.0.kind()
    }

    /// Whether this is an MCP message (to an MCPRoute): the body is then
    /// the JSON-RPC message, [`Request::model`] the tool's name (or empty).
    /// Needs 0.3.3.
    pub fn is_mcp(&self) -> bool {
        self.kind() == RequestKind::Mcp
    }

    /// An MCP message's JSON-RPC method (`tools/call`, `tools/list`, ...);
    /// `None` on a chat request. Needs 0.3.3.
    pub fn mcp_method(&self) -> Option<String> {
        self.0.mcp_method()
    }

    /// For `tools/call`, the tool with its server's prefix
    /// (`weather__forecast`). Needs 0.3.3.
    pub fn tool_name(&self) -> Option<String> {
        self.0.tool_name()
    }

    /// For `tools/call`, the call's `arguments` as JSON object text, as the
    /// plugins before this one left them. Needs 0.3.3.
    pub fn tool_arguments(&self) -> Option<String> {
        self.0.tool_arguments()
    }

    /// For `tools/call`, the arguments as a JSON object (`None` for any
    /// other request); a 400 if they are not one.
    pub fn tool_arguments_json(&self) -> Result<Option<serde_json::Map<String, serde_json::Value>>, ApiError> {
        let Some(text) = self.tool_arguments() else {
            return Ok(None);
        };
        serde_json::from_str(&text).map(Some).map_err(|e| {
            ApiError::bad_request("invalid_arguments", format!("the tool's arguments are not a JSON object: {e}"))
        })
    }

    /// Replaces a `tools/call`'s arguments with JSON object text; the
    /// gateway forwards them. On any other request, or with text that is
    /// not a JSON object, the host refuses it and the plugin fails when the
    /// hook returns. Needs 0.3.3.
    pub fn set_tool_arguments(&self, arguments: &str) {
        self.0.set_tool_arguments(arguments)
    }

    /// [`Request::set_tool_arguments`] of a JSON object.
    pub fn set_tool_arguments_json(&self, arguments: &serde_json::Map<String, serde_json::Value>) {
        // A map of JSON values always serializes.
        let text = serde_json::to_string(arguments).unwrap_or_else(|_| "{}".into());
        self.set_tool_arguments(&text)
    }

    /// The 400 for a body that is not a chat request: `invalid_json` if it
    /// is not even a JSON object (the code the gateway uses), otherwise
    /// `invalid_chat_request` with the host's reason. Only errors pay for
    /// the extra look at the body.
    fn not_chat(&self, error: String) -> ApiError {
        match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&self.body()) {
            Err(e) => ApiError::bad_request("invalid_json", format!("request body is not a JSON object: {e}")),
            Ok(_) => ApiError::bad_request("invalid_chat_request", error),
        }
    }
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request").field("method", &self.method()).field("path", &self.path()).finish_non_exhaustive()
    }
}
