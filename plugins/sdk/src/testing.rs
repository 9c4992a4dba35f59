//! Requests for plugin unit tests, and what a hook did to them. Native only:
//! the request is a stand-in for the host's, built on the gateway's own
//! chat body code, so reads and edits behave as they will in the gateway.
//!
//! An edit the host would refuse (an invalid header, a splice past the end,
//! `set_field("model")`) is recorded, and fails the test when the request
//! is dropped unless the test took it with [`Request::take_invalid_edits`].

use serde_json::Value;

use crate::native::NativeRequest;
use crate::{Request, metrics, outbound};

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
    Request(NativeRequest::new("POST", "/v1/chat/completions", model, headers, body))
}

/// An MCP message to route `default/mcp`, as the gateway hands it to
/// plugins: `POST /mcp`, the JSON-RPC message as the body, the tool as the
/// `model` (or empty). For `tools/call`, `tool` and `arguments` (an
/// object, or `{}`) name the call.
pub fn mcp_request(method: &str, tool: Option<&str>, arguments: Option<&Value>) -> Request {
    let mut params = serde_json::Map::new();
    if let Some(tool) = tool {
        params.insert("name".into(), tool.into());
    }
    if let Some(arguments) = arguments {
        params.insert("arguments".into(), arguments.clone());
    }
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let request = Request(NativeRequest::new("POST", "/mcp", tool.unwrap_or(""), &[], body.to_string().into_bytes()));
    let arguments = (method == "tools/call").then(|| arguments.map_or_else(|| "{}".to_string(), Value::to_string));
    request.0.with(|s| {
        s.route = "default/mcp".into();
        s.mcp = Some(crate::native::Mcp {
            method: method.into(),
            tool: tool.map(str::to_string),
            arguments,
            arguments_edited: false,
        });
    });
    request
}

/// What tests look at, natively.
impl Request {
    /// The same request on another path, e.g. `/v1/embeddings`.
    pub fn with_path(self, path: &str) -> Request {
        self.0.with(|s| s.path = path.to_string());
        self
    }

    /// The same request, as the auth phase named its caller.
    pub fn with_consumer(self, consumer: &str) -> Request {
        self.0.with(|s| s.consumer = Some(consumer.to_string()));
        self
    }

    /// The body now, as JSON; panics if it is not JSON.
    pub fn body_json(&self) -> Value {
        let body = self.body_now();
        serde_json::from_slice(&body)
            .unwrap_or_else(|e| panic!("the body is not JSON ({e}): {}", String::from_utf8_lossy(&body)))
    }

    /// The body now, as text.
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body_now()).into_owned()
    }

    /// The body now, read without calling the host (which is recorded).
    fn body_now(&self) -> Vec<u8> {
        self.0.with(|s| s.body.bytes().to_vec())
    }

    /// The calls the plugin made into the host so far, in order, as
    /// `method` or `method(name)` (`header(x-api-key)`), WIT's names. Each
    /// is a crossing out of the component: hooks that run on every request
    /// keep them few.
    pub fn host_calls(&self) -> Vec<String> {
        self.0.with(|s| s.host_calls.clone())
    }

    /// The headers set with `set_response_header`, in order.
    pub fn response_headers(&self) -> Vec<(String, String)> {
        self.0.with(|s| s.response_headers.clone())
    }

    /// The first response header `name` set, ignoring case.
    pub fn response_header(&self, name: &str) -> Option<String> {
        self.0.with(|s| s.response_headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.clone()))
    }

    /// The edits the host would have refused, failing the plugin; taking
    /// them keeps the test from failing when the request is dropped.
    pub fn take_invalid_edits(&self) -> Vec<String> {
        self.0.with(|s| std::mem::take(&mut s.invalid_edits))
    }

    /// Whether any edit changed the body since the request was built or
    /// its body last replaced.
    pub fn body_edited(&self) -> bool {
        self.0.with(|s| s.body.is_edited())
    }

    /// The arguments a plugin set with `set_tool_arguments`, if one did.
    pub fn edited_tool_arguments(&self) -> Option<Value> {
        self.0.with(|s| {
            let mcp = s.mcp.as_ref().filter(|mcp| mcp.arguments_edited)?;
            serde_json::from_str(mcp.arguments.as_deref()?).ok()
        })
    }

    /// The model the plugin routed to with `set_model`, if it did.
    pub fn routed_model(&self) -> Option<String> {
        self.0.with(|s| s.routed_model.clone())
    }

    /// The backend the plugin chose with `set_backend`, if it did.
    pub fn routed_backend(&self) -> Option<String> {
        self.0.with(|s| s.routed_backend.clone())
    }
}

/// Answers [`outbound::send`] on this thread with `responder` instead of
/// the network. Without one, every call is refused.
pub fn on_outbound(responder: impl Fn(&outbound::Request) -> Result<outbound::Response, outbound::Error> + 'static) {
    outbound::set_responder(responder)
}

/// Every request given to [`outbound::send`] on this thread, in order,
/// answered or not.
pub fn outbound_requests() -> Vec<outbound::Request> {
    outbound::sent()
}

/// Counter `name` for these label values (`other` for the values past
/// the metric's `max_values`): 0 if nothing was added.
pub fn counter(name: &str, labels: &[&str]) -> u64 {
    metrics::counter(name, labels)
}

/// What histogram `name` recorded for these label values, in order.
pub fn observations(name: &str, labels: &[&str]) -> Vec<f64> {
    metrics::observations(name, labels)
}

/// Forgets this thread's declarations and values, so a test can declare
/// again (the gateway takes one declaration per plugin).
pub fn reset_metrics() {
    metrics::reset()
}

/// Ends the response as the gateway does for reservations left to it
/// ([`crate::state::Reservation::settle_at_end`]): each is committed by
/// `status` and the upstream's reported `(prompt, completion)` tokens.
pub fn end_response(status: u16, usage: Option<(u32, u32)>) {
    crate::state::end_response(status, usage.map(|(input, output)| (input.into(), output.into())));
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::HeaderList;
    use crate::chat::{Content, Message};

    #[test]
    fn reads_and_edits_behave_as_the_host_does() {
        let req = chat_request("m", &json!({"n": 1.0e5, "messages": [{"role": "user", "content": "hi"}]}));
        assert_eq!(req.message_count().unwrap(), 1);
        assert_eq!(req.field::<f64>("n").unwrap(), Some(100000.0));
        assert_eq!(req.field_json("n").as_deref(), Some("100000.0"), "serde_json wrote it so");
        req.splice_messages(0, 0, &[Message::system("s")]);
        req.set_content(1, &Content::Text("HI".into()));
        req.set_field("user", "u").unwrap();
        req.remove_field("n");
        assert!(req.body_edited());
        assert_eq!(
            req.body_text(),
            r#"{"messages":[{"role":"system","content":"s"},{"role":"user","content":"HI"}],"model":"m","user":"u"}"#
        );
    }

    #[test]
    fn headers_replace_every_value_and_responses_get_their_own() {
        let req = request_with_headers("m", &[("X-A", "1"), ("x-a", "2"), ("b", "3")]);
        assert_eq!(req.headers().get_all_headers("x-a").collect::<Vec<_>>(), ["1", "2"]);
        req.set_header("X-A", "9");
        req.remove_header("B");
        req.set_response_header("X-R", "r");
        assert_eq!(req.headers(), [("x-a".to_string(), "9".to_string())]);
        assert_eq!(req.response_headers(), [("x-r".to_string(), "r".to_string())]);
        assert_eq!(req.response_header("x-r").as_deref(), Some("r"));
    }

    #[test]
    fn edits_the_host_refuses_are_recorded_and_fail_the_test_unless_taken() {
        let req = chat_request("m", &json!({"messages": []}));
        req.splice_messages(1, 0, &[]);
        req.set_field("model", "other").unwrap();
        req.set_header("bad name", "v");
        req.set_response_header("x", "a\nb");
        let invalid = req.take_invalid_edits();
        assert_eq!(invalid.len(), 4, "{invalid:?}");
        assert!(invalid[0].starts_with("splice-messages: messages 1..1 are past the end"), "{invalid:?}");
        assert_eq!(req.body_json()["model"], "m");

        let dropped = std::panic::catch_unwind(|| {
            let req = chat_request("m", &json!({"messages": []}));
            req.set_content(0, &Content::None);
        });
        let message = dropped.expect_err("an untaken invalid edit fails the test");
        let message = message.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(message.contains("set-content: message 0 is past the end"), "{message}");
    }

    #[test]
    fn a_body_that_is_not_a_chat_request_is_a_400() {
        let req = raw_request("m", &[], b"not json".to_vec());
        assert_eq!(req.messages().unwrap_err().code, "invalid_json");
        let req = chat_request("m", &json!({"messages": 5}));
        let error = req.message_count().unwrap_err();
        assert_eq!((error.status, error.code.as_str()), (400, "invalid_chat_request"));
        assert_eq!(error.message, "`messages` must be an array");
        let req = chat_request("m", &json!({"messages": [{"role": "user", "content": 5}]}));
        assert!(req.messages().unwrap_err().message.starts_with("messages[0]:"));
    }

    #[test]
    fn routing_is_recorded_and_the_model_reads_as_routed() {
        let req = raw_request("gpt-4o", &[], br#"{"model": "gpt-4o", "n": 1.50}"#.to_vec());
        assert_eq!((req.routed_model(), req.routed_backend()), (None, None));
        req.set_model("gpt-4o-mini");
        req.set_backend("azure-east");
        assert_eq!(req.model(), "gpt-4o-mini");
        assert_eq!(req.routed_model().as_deref(), Some("gpt-4o-mini"));
        assert_eq!(req.routed_backend().as_deref(), Some("azure-east"));
        assert_eq!(req.body_text(), r#"{"model": "gpt-4o-mini", "n": 1.50}"#, "every other byte kept");
        assert_eq!(req.host_calls(), ["set-model", "set-backend", "model"]);
        req.set_model("");
        req.set_backend("");
        assert_eq!(req.take_invalid_edits().len(), 2);
        assert_eq!(req.model(), "gpt-4o-mini");
    }

    #[test]
    fn mcp_requests_read_and_edit_as_the_host_does() {
        let chat = chat_request("m", &json!({"messages": []}));
        assert_eq!((chat.kind(), chat.mcp_method(), chat.tool_name()), (crate::RequestKind::Chat, None, None));
        chat.set_tool_arguments("{}");
        assert_eq!(chat.take_invalid_edits().len(), 1, "not on a chat request");

        let call = mcp_request("tools/call", Some("weather__forecast"), Some(&json!({"city": "Oslo"})));
        assert!(call.is_mcp());
        assert_eq!(call.mcp_method().as_deref(), Some("tools/call"));
        assert_eq!(call.tool_name().as_deref(), Some("weather__forecast"));
        assert_eq!(call.model(), "weather__forecast");
        assert_eq!(call.tool_arguments_json().unwrap().unwrap()["city"], "Oslo");
        assert_eq!(call.edited_tool_arguments(), None);
        call.set_tool_arguments("[1]");
        call.set_tool_arguments("{\"a\": 1, \"a\": 2}");
        assert_eq!(call.take_invalid_edits().len(), 2, "an array, a name twice");
        call.set_tool_arguments(r#"{"city": "Oslo", "units": "metric"}"#);
        assert_eq!(call.edited_tool_arguments(), Some(json!({"city": "Oslo", "units": "metric"})));

        let list = mcp_request("tools/list", None, None);
        assert_eq!((list.kind(), list.tool_name(), list.tool_arguments()), (crate::RequestKind::Mcp, None, None));
        list.set_tool_arguments("{}");
        assert_eq!(list.take_invalid_edits().len(), 1, "only on tools/call");
    }

    #[test]
    fn paths() {
        let req = chat_request("m", &json!({"messages": []}));
        assert!(req.is_chat_completion());
        let req = req.with_path("/v1/chat/completions?x=1");
        assert!(req.is_chat_completion());
        assert_eq!(req.path_only(), "/v1/chat/completions");
        let req = req.with_path("/v1/embeddings");
        assert!(!req.is_chat_completion());
        let req = raw_request("m", &[], b"{not json".to_vec());
        assert_eq!(req.json::<Value>().unwrap_err().code, "invalid_json");
    }
}
