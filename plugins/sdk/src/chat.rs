//! OpenAI chat completion requests, typed where plugins look and untyped
//! everywhere else, so a rewritten body keeps every field the client sent.

use std::borrow::Cow;

use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::ApiError;

/// A `/v1/chat/completions` request body.
///
/// Fields keep the client's order exactly, at the top level and in each
/// message: typed fields are written back where they were, unknown fields
/// stay in `extra`, and fields a plugin adds go last.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<Message>,
    /// Every other top-level field (`temperature`, `tools`, `stream`, …).
    pub extra: Map<String, Value>,
    order: KeyOrder,
}

impl ChatRequest {
    pub fn new(model: &str, messages: Vec<Message>) -> ChatRequest {
        ChatRequest { model: model.to_string(), messages, extra: Map::new(), order: KeyOrder::default() }
    }

    /// Parses a body; a 400 `invalid_chat_request` names what is wrong.
    pub fn from_slice(body: &[u8]) -> Result<ChatRequest, ApiError> {
        let fields: Map<String, Value> = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request("invalid_json", format!("request body is not a JSON object: {e}")))?;
        ChatRequest::from_map(fields)
    }

    pub fn from_map(mut fields: Map<String, Value>) -> Result<ChatRequest, ApiError> {
        let invalid = |message: String| ApiError::bad_request("invalid_chat_request", message);
        let order = KeyOrder::of(&fields);
        let model = match fields.remove("model") {
            Some(Value::String(model)) => model,
            _ => return Err(invalid("`model` must be a string".into())),
        };
        let messages = match fields.remove("messages") {
            Some(Value::Array(messages)) => messages
                .into_iter()
                .enumerate()
                .map(|(i, message)| {
                    let order = message.as_object().map(KeyOrder::of).unwrap_or_default();
                    let message = Message::deserialize(message).map_err(|e| invalid(format!("messages[{i}]: {e}")))?;
                    Ok(Message { order, ..message })
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(invalid("`messages` must be an array".into())),
            None => return Err(invalid("the request has no `messages`".into())),
        };
        Ok(ChatRequest { model, messages, extra: fields, order })
    }

    /// The body as JSON bytes, fields in the client's order.
    pub fn to_body(&self) -> Result<Vec<u8>, ApiError> {
        serde_json::to_vec(self).map_err(|e| ApiError::internal(format!("cannot encode the request: {e}")))
    }

    /// The output budget the client asked for: `max_completion_tokens`, or
    /// the older `max_tokens`.
    pub fn max_output_tokens(&self) -> Option<u64> {
        ["max_completion_tokens", "max_tokens"].iter().find_map(|key| self.extra.get(*key).and_then(Value::as_u64))
    }
}

impl Serialize for ChatRequest {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut fields = self.extra.clone();
        fields.insert("model".into(), Value::String(self.model.clone()));
        let messages = self.messages.iter().map(Message::to_ordered_value).collect::<Result<_, _>>();
        fields.insert("messages".into(), Value::Array(messages.map_err(serde::ser::Error::custom)?));
        self.order.write(fields, serializer)
    }
}

/// The key order of a JSON object as the client sent it. It never makes two
/// values unequal.
#[derive(Clone, Debug, Default)]
struct KeyOrder(Vec<String>);

impl PartialEq for KeyOrder {
    fn eq(&self, _: &KeyOrder) -> bool {
        true
    }
}

impl KeyOrder {
    fn of(object: &Map<String, Value>) -> KeyOrder {
        KeyOrder(object.keys().cloned().collect())
    }

    fn sort(&self, mut fields: Map<String, Value>) -> Map<String, Value> {
        let mut sorted: Map<String, Value> = self.0.iter().filter_map(|key| fields.shift_remove_entry(key)).collect();
        // What is left was added by a plugin: it goes last.
        sorted.extend(fields);
        sorted
    }

    fn write<S: Serializer>(&self, fields: Map<String, Value>, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(fields.len()))?;
        for (key, value) in self.sort(fields) {
            map.serialize_entry(&key, &value)?;
        }
        map.end()
    }
}

/// One chat message. Known fields are typed; the rest stay in `extra`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default, skip_serializing_if = "Content::is_absent")]
    pub content: Content,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Set on an assistant message that calls tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// Set on a `tool` message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
    #[serde(skip)]
    order: KeyOrder,
}

impl Message {
    pub fn new(role: &str, text: &str) -> Message {
        Message {
            role: role.to_string(),
            content: Content::Text(text.to_string()),
            name: None,
            tool_calls: None,
            tool_call_id: None,
            extra: Map::new(),
            order: KeyOrder::default(),
        }
    }

    /// The message as JSON, keys in the order the client sent them.
    fn to_ordered_value(&self) -> Result<Value, serde_json::Error> {
        match serde_json::to_value(self)? {
            Value::Object(fields) => Ok(Value::Object(self.order.sort(fields))),
            other => Ok(other),
        }
    }

    pub fn system(text: &str) -> Message {
        Message::new("system", text)
    }

    pub fn user(text: &str) -> Message {
        Message::new("user", text)
    }

    pub fn assistant(text: &str) -> Message {
        Message::new("assistant", text)
    }

    /// `system`, or its newer name `developer`.
    pub fn is_system(&self) -> bool {
        self.role == "system" || self.role == "developer"
    }

    pub fn is_user(&self) -> bool {
        self.role == "user"
    }

    /// The ids of the tool calls this message makes.
    pub fn tool_call_ids(&self) -> impl Iterator<Item = &str> {
        self.tool_calls.iter().flatten().filter_map(|call| call.id.as_deref())
    }
}

/// A message's `content`: a string, an array of parts, `null`, or absent.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Content {
    #[default]
    Absent,
    Null,
    Text(String),
    Parts(Vec<ContentPart>),
}

impl Content {
    pub fn is_absent(&self) -> bool {
        matches!(self, Content::Absent)
    }

    /// The text pieces: the string, or the `text` of each text part.
    pub fn texts(&self) -> Vec<&str> {
        match self {
            Content::Text(text) => vec![text.as_str()],
            Content::Parts(parts) => parts.iter().filter_map(|part| part.text.as_deref()).collect(),
            Content::Absent | Content::Null => Vec::new(),
        }
    }

    /// The text pieces, to edit in place.
    pub fn texts_mut(&mut self) -> Vec<&mut String> {
        match self {
            Content::Text(text) => vec![text],
            Content::Parts(parts) => parts.iter_mut().filter_map(|part| part.text.as_mut()).collect(),
            Content::Absent | Content::Null => Vec::new(),
        }
    }

    /// All text, parts joined by newlines.
    pub fn text(&self) -> Cow<'_, str> {
        match self {
            Content::Text(text) => Cow::Borrowed(text),
            _ => Cow::Owned(self.texts().join("\n")),
        }
    }
}

impl Serialize for Content {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            // `Absent` is skipped by the message; null is the closest value.
            Content::Absent | Content::Null => serializer.serialize_unit(),
            Content::Text(text) => serializer.serialize_str(text),
            Content::Parts(parts) => parts.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Content, D::Error> {
        use serde::de::Error;
        match Value::deserialize(deserializer)? {
            Value::Null => Ok(Content::Null),
            Value::String(text) => Ok(Content::Text(text)),
            Value::Array(parts) => parts
                .into_iter()
                .enumerate()
                .map(|(i, part)| {
                    ContentPart::deserialize(part).map_err(|e| D::Error::custom(format!("content[{i}]: {e}")))
                })
                .collect::<Result<_, _>>()
                .map(Content::Parts),
            _ => Err(D::Error::custom("`content` must be a string, an array of content parts, or null")),
        }
    }
}

/// One part of a multi-part content: `{"type": "text", "text": …}`, or an
/// image, audio or file part kept as is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One entry of an assistant message's `tool_calls`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<FunctionCall>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// JSON-encoded arguments, as a string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn round_trips_every_field_in_order() {
        let body = json!({
            "temperature": 0.2,
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "name": "ann", "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "data:..."}}
                ]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "look", "arguments": "{}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "a cat", "x-vendor": 1}
            ],
            "model": "gpt-4o",
            "tools": [{"type": "function", "function": {"name": "look"}}],
            "max_tokens": 100
        });
        let text = body.to_string();
        let chat = ChatRequest::from_slice(text.as_bytes()).unwrap();
        assert_eq!(chat.model, "gpt-4o");
        assert_eq!(chat.messages.len(), 4);
        assert_eq!(chat.messages[1].content.texts(), ["what is this?"]);
        assert_eq!(chat.messages[2].content, Content::Null);
        assert_eq!(chat.messages[2].tool_call_ids().collect::<Vec<_>>(), ["call_1"]);
        assert_eq!(chat.max_output_tokens(), Some(100));
        let written = String::from_utf8(chat.to_body().unwrap()).unwrap();
        assert_eq!(written, text, "nothing lost, nothing reordered");
    }

    #[test]
    fn added_fields_go_last() {
        let mut chat = ChatRequest::from_slice(br#"{"model":"m","messages":[]}"#).unwrap();
        chat.extra.insert("user".into(), json!("u"));
        chat.messages.push(Message::user("hi"));
        assert_eq!(
            String::from_utf8(chat.to_body().unwrap()).unwrap(),
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"user":"u"}"#
        );
    }

    #[test]
    fn invalid_requests_name_the_problem() {
        let error = |body: &str| ChatRequest::from_slice(body.as_bytes()).unwrap_err();
        assert_eq!(error("[1]").code, "invalid_json");
        assert_eq!(error(r#"{"model": "m"}"#).message, "the request has no `messages`");
        assert_eq!(error(r#"{"model": "m", "messages": {}}"#).message, "`messages` must be an array");
        let bad =
            error(r#"{"model": "m", "messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": 5}]}"#);
        assert_eq!(bad.code, "invalid_chat_request");
        assert!(bad.message.starts_with("messages[1]:"), "{}", bad.message);
        assert!(bad.message.contains("must be a string"), "{}", bad.message);
        let no_role = error(r#"{"model": "m", "messages": [{"content": "x"}]}"#);
        assert!(no_role.message.contains("missing field `role`"), "{}", no_role.message);
    }

    #[test]
    fn text_of_parts_is_editable() {
        let mut content: Content = serde_json::from_value(
            json!([{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}]),
        )
        .unwrap();
        assert_eq!(content.text(), "a\nb");
        for text in content.texts_mut() {
            text.push('!');
        }
        assert_eq!(content.texts(), ["a!", "b!"]);
    }
}
