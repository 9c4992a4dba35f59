//! Chat messages as the host hands them over: the role, the content (a
//! string, parts, or none), and every other member as the text of a JSON
//! object. The host keeps the request's JSON; plugins read and edit messages
//! through [`crate::Request`], and these helpers read their text and the
//! members plugins look at.

use std::borrow::Cow;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use crate::bindings::sluice::plugin::types::{Content, ContentPart, Message};

impl Message {
    /// A message whose content is `text`, with no other member.
    pub fn new(role: &str, text: &str) -> Message {
        Message { role: role.to_string(), content: Content::Text(text.to_string()), extra: "{}".to_string() }
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

    /// The members besides `role` and `content`, read as `T` (a struct of
    /// the members wanted, e.g. [`MessageExtra`]).
    pub fn extra_as<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(&self.extra)
    }

    /// A message from its JSON, checked as the host checks a message it
    /// reads: an object with a string `role`, and a `content` that is a
    /// string, an array of parts, `null` or absent.
    pub fn from_json(value: &Value) -> Result<Message, String> {
        let Value::Object(members) = value else {
            return Err("not an object".into());
        };
        let mut role = None;
        let mut content = Content::None;
        let mut extra = Map::new();
        for (key, value) in members {
            match key.as_str() {
                "role" => role = Some(value.as_str().ok_or("`role` must be a string")?.to_string()),
                "content" => {
                    content = match value {
                        Value::Null => Content::None,
                        Value::String(text) => Content::Text(text.clone()),
                        Value::Array(parts) => Content::Parts(parts.iter().map(ContentPart::from_json).collect()),
                        _ => return Err("`content` must be a string, an array or null".into()),
                    }
                }
                _ => {
                    extra.insert(key.clone(), value.clone());
                }
            }
        }
        let role = role.ok_or("no `role`")?;
        Ok(Message { role, content, extra: Value::Object(extra).to_string() })
    }

    /// The message as JSON: `role`, `content`, then the other members.
    pub fn to_json(&self) -> Value {
        let mut members = Map::new();
        members.insert("role".into(), Value::String(self.role.clone()));
        members.insert("content".into(), self.content.to_json());
        if let Ok(extra) = self.extra_as::<Map<String, Value>>() {
            members.extend(extra);
        }
        Value::Object(members)
    }
}

impl Content {
    /// The text pieces: the string, or the `text` of each part that has one.
    pub fn texts(&self) -> Vec<Cow<'_, str>> {
        match self {
            Content::Text(text) => vec![Cow::Borrowed(text.as_str())],
            Content::Parts(parts) => parts.iter().filter_map(ContentPart::text).collect(),
            Content::None => Vec::new(),
        }
    }

    /// All text, parts joined by newlines.
    pub fn text(&self) -> Cow<'_, str> {
        match self {
            Content::Text(text) => Cow::Borrowed(text),
            _ => Cow::Owned(self.texts().join("\n")),
        }
    }

    /// Replaces text piece `piece` (as numbered by [`Content::texts`]);
    /// false if there is no such piece.
    pub fn set_text(&mut self, piece: usize, text: String) -> bool {
        match self {
            Content::Text(old) if piece == 0 => {
                *old = text;
                true
            }
            Content::Parts(parts) => match parts.iter_mut().filter(|part| part.text().is_some()).nth(piece) {
                Some(part) => part.set_text(text),
                None => false,
            },
            _ => false,
        }
    }

    pub fn to_json(&self) -> Value {
        match self {
            Content::None => Value::Null,
            Content::Text(text) => Value::String(text.clone()),
            Content::Parts(parts) => Value::Array(parts.iter().map(ContentPart::to_json).collect()),
        }
    }
}

/// A part's members that carry text, where the host gives the part as JSON.
#[derive(Deserialize)]
struct PartText {
    #[serde(rename = "type", default)]
    kind: Option<Value>,
    #[serde(default)]
    text: Option<Value>,
    #[serde(default)]
    refusal: Option<Value>,
}

/// The member a part's text is in: a `refusal` part's `refusal` (an
/// upstream reads it as what the assistant said), any other's `text`.
fn text_member(members: &Map<String, Value>) -> &'static str {
    if members.get("type").and_then(Value::as_str) == Some("refusal") { "refusal" } else { "text" }
}

impl ContentPart {
    /// Its text: a text part's, a `refusal` part's `refusal`, or the string
    /// `text` member of any other part (a text part with more members,
    /// `input_text`, ...). The gateway's `sluice_chat::Part::text` is the
    /// same rule: its fuzz target checks that upstreams are sent no text
    /// besides.
    pub fn text(&self) -> Option<Cow<'_, str>> {
        match self {
            ContentPart::Text(text) => Some(Cow::Borrowed(text)),
            ContentPart::Other(json) => {
                let part = serde_json::from_str::<PartText>(json).ok()?;
                let member =
                    if part.kind.as_ref().and_then(Value::as_str) == Some("refusal") { part.refusal } else { part.text };
                match member? {
                    Value::String(text) => Some(Cow::Owned(text)),
                    _ => None,
                }
            }
        }
    }

    /// Replaces its text, keeping every other member; false if it has none.
    fn set_text(&mut self, text: String) -> bool {
        match self {
            ContentPart::Text(old) => *old = text,
            ContentPart::Other(json) => {
                let Ok(mut members) = serde_json::from_str::<Map<String, Value>>(json) else {
                    return false;
                };
                let member = text_member(&members);
                if !members.get(member).is_some_and(Value::is_string) {
                    return false;
                }
                members.insert(member.into(), Value::String(text));
                *json = Value::Object(members).to_string();
            }
        }
        true
    }

    /// A part from its JSON, as the host reads one: a text part is exactly
    /// `{"type": "text", "text": <string>}`, any other is kept as its JSON.
    pub fn from_json(value: &Value) -> ContentPart {
        if let Value::Object(members) = value
            && members.len() == 2
            && members.get("type").and_then(Value::as_str) == Some("text")
            && let Some(Value::String(text)) = members.get("text")
        {
            return ContentPart::Text(text.clone());
        }
        ContentPart::Other(value.to_string())
    }

    pub fn to_json(&self) -> Value {
        match self {
            ContentPart::Text(text) => serde_json::json!({"type": "text", "text": text}),
            ContentPart::Other(json) => serde_json::from_str(json).unwrap_or(Value::Null),
        }
    }
}

/// The members of a message besides `role` and `content` that policies look
/// at: `Message::extra_as::<MessageExtra>()`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct MessageExtra {
    #[serde(default)]
    pub name: Option<String>,
    /// Set on an assistant message that calls tools.
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// Set on a `tool` message: the call it answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

impl MessageExtra {
    /// The ids of the tool calls this message makes.
    pub fn tool_call_ids(&self) -> impl Iterator<Item = &str> {
        self.tool_calls.iter().flatten().filter_map(|call| call.id.as_deref())
    }
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
    fn messages_convert_from_and_to_json() {
        let value = json!({"role": "assistant", "name": "ann", "content": [
            {"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "u"}}
        ], "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]});
        let message = Message::from_json(&value).unwrap();
        assert_eq!(message.role, "assistant");
        assert_eq!(message.content.texts(), ["a"]);
        let extra: MessageExtra = message.extra_as().unwrap();
        assert_eq!(extra.name.as_deref(), Some("ann"));
        assert_eq!(extra.tool_call_ids().collect::<Vec<_>>(), ["c1"]);
        assert_eq!(message.to_json(), value);
        let keys: Vec<String> = message.to_json().as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["role", "content", "name", "tool_calls"]);

        for (bad, error) in [
            (json!([]), "not an object"),
            (json!({"content": "x"}), "no `role`"),
            (json!({"role": 1}), "`role` must be a string"),
            (json!({"role": "user", "content": 5}), "`content` must be a string, an array or null"),
        ] {
            assert_eq!(Message::from_json(&bad).unwrap_err(), error, "{bad}");
        }
        let absent = Message::from_json(&json!({"role": "assistant"})).unwrap();
        assert_eq!((absent.content, absent.extra.as_str()), (Content::None, "{}"));
    }

    #[test]
    fn the_text_of_every_part_that_has_one_is_read_and_editable() {
        // A text part with another member reaches plugins as `Other`; its
        // text must still be seen, or a guard could be bypassed with it.
        let mut content = Content::Parts(vec![
            ContentPart::Text("a".into()),
            ContentPart::Other(r#"{"type":"image_url","image_url":{"url":"u"}}"#.into()),
            ContentPart::Other(r#"{"type":"text","text":"b","cache_control":{"type":"ephemeral"}}"#.into()),
        ]);
        assert_eq!(content.text(), "a\nb");
        assert!(content.set_text(1, "B".into()));
        assert!(content.set_text(0, "A".into()));
        assert!(!content.set_text(2, "x".into()), "there are two text pieces");
        assert_eq!(content.texts(), ["A", "B"]);
        let Content::Parts(parts) = &content else { panic!("parts") };
        assert_eq!(
            parts[2],
            ContentPart::Other(r#"{"type":"text","text":"B","cache_control":{"type":"ephemeral"}}"#.into())
        );

        let mut text = Content::Text("t".into());
        assert!(text.set_text(0, "u".into()) && !text.set_text(1, "v".into()));
        assert_eq!(text.text(), "u");
        assert!(Content::None.texts().is_empty());
    }

    #[test]
    fn a_refusal_parts_text_is_read_and_edited_as_any_other() {
        // Upstreams read it as text (OpenAI's as the assistant's words,
        // some OpenAI-compatible servers in any role): a guard must see it.
        let mut content = Content::Parts(vec![
            ContentPart::Other(r#"{"type":"refusal","refusal":"no","text":"decoy"}"#.into()),
            ContentPart::Other(r#"{"type":"image_url","image_url":{"url":"u"},"text":"t"}"#.into()),
        ]);
        assert_eq!(content.texts(), ["no", "t"]);
        assert!(content.set_text(0, "NO".into()));
        assert_eq!(content.texts(), ["NO", "t"]);
        // The SDK's rule is the gateway's.
        for part in [
            r#"{"type":"refusal","refusal":"a","text":"b"}"#,
            r#"{"type":"refusal","text":"b"}"#,
            r#"{"type":"text","text":"a","x":1}"#,
            r#"{"type":5,"text":"a"}"#,
            r#"{"text":["a"]}"#,
        ] {
            let ours = ContentPart::Other(part.into());
            let gateway = sluice_chat::Part::Other(part.into());
            assert_eq!(ours.text(), gateway.text(), "{part}");
        }
    }

    #[test]
    fn parts_are_classified_as_the_host_does() {
        assert_eq!(ContentPart::from_json(&json!({"type": "text", "text": "x"})), ContentPart::Text("x".into()));
        let with_more = json!({"type": "text", "text": "x", "cache_control": {}});
        assert!(matches!(ContentPart::from_json(&with_more), ContentPart::Other(_)));
        assert!(matches!(ContentPart::from_json(&json!({"type": "text", "text": 5})), ContentPart::Other(_)));
    }
}
