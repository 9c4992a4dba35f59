//! What policy plugins see of a request against what is sent upstream: a
//! differential target. For any body the gateway routes, every text an
//! upstream reads (the body passed through, as an OpenAI-compatible server
//! reads it; the body translated for Anthropic) must be text the plugins'
//! view exposes, for the same message and role.
//!
//! The plugins' view is the host's messages (`sluice_chat::ChatBody`, which
//! backs the host functions) read with `sluice_chat::Part::text`, the Rust
//! SDK's rule. The upstream's reading is done independently, on
//! `serde_json::Value` (the last of a duplicated key wins there, as in most
//! servers).
//!
//! Inputs are chat bodies built from pools of the names that matter
//! (`text`, `refusal`, `type`, escaped spellings, `role`, `content`) so
//! duplicates, odd part types and odd roles are common.

use std::collections::HashMap;

use bolero::TypeGenerator;
use bytes::Bytes;
use serde_json::Value;
use sluice_chat::ChatBody;
use sluice_gateway::fuzzing::{requested_model, rewrite_model};
use sluice_providers::anthropic;

use crate::pick;

#[derive(Clone, Debug, TypeGenerator)]
pub struct Chat {
    #[generator(bolero::produce::<Vec<Message>>().with().len(0..6usize))]
    pub messages: Vec<Message>,
    /// Top-level members after `model` and `messages`.
    #[generator(bolero::produce::<Vec<Member>>().with().len(0..3usize))]
    pub members: Vec<Member>,
}

#[derive(Clone, Debug, TypeGenerator)]
pub struct Message {
    pub role: u8,
    pub content: Option<Content>,
    /// Members after `role` and `content` (another of either, sometimes).
    #[generator(bolero::produce::<Vec<Member>>().with().len(0..3usize))]
    pub members: Vec<Member>,
}

#[derive(Clone, Debug, TypeGenerator)]
pub enum Content {
    Null,
    Text(Text),
    Parts(#[generator(bolero::produce::<Vec<Part>>().with().len(0..4usize))] Vec<Part>),
}

#[derive(Clone, Debug, TypeGenerator)]
pub struct Part {
    /// Its `type`, from [`KINDS`]; past them, none.
    pub kind: u8,
    #[generator(bolero::produce::<Vec<Member>>().with().len(0..4usize))]
    pub members: Vec<Member>,
}

#[derive(Clone, Debug, TypeGenerator)]
pub struct Member {
    pub key: u8,
    pub value: Scalar,
}

#[derive(Clone, Debug, TypeGenerator)]
pub enum Scalar {
    Text(Text),
    Number(i32),
    Null,
    Object(#[generator(bolero::produce::<Vec<(u8, Text)>>().with().len(0..3usize))] Vec<(u8, Text)>),
}

#[derive(Clone, Debug, TypeGenerator)]
pub enum Text {
    /// From [`WORDS`], escapes included.
    Word(u8),
    Any(#[generator(bolero::produce::<String>().with().len(0..12usize))] String),
}

const ROLES: &[&str] = &["user", "system", "developer", "assistant", "tool", "function", "User"];

const KINDS: &[&str] = &["text", "refusal", "image_url", "input_text", "output_text", "", "Text", "thinking"];

/// Names, as JSON text (some escaped).
const KEYS: &[&str] = &[
    "\"text\"",
    "\"refusal\"",
    "\"type\"",
    "\"te\\u0078t\"",
    "\"content\"",
    "\"role\"",
    "\"image_url\"",
    "\"cache_control\"",
    "\"tool_call_id\"",
    "\"url\"",
    "\"name\"",
    "\"refus\\u0061l\"",
];

/// Strings, as JSON text.
const WORDS: &[&str] = &[
    "\"deny me\"",
    "\"ok\"",
    "\"\"",
    "\"d\\u0065ny me\"",
    "\"text\"",
    "\"refusal\"",
    "\"https://x/y.png\"",
    "\"data:image/png;base64,AAAA\"",
    "\"\\ud83d\\ude00\"",
    "\"line\\nbreak\"",
];

impl Chat {
    pub fn render(&self) -> String {
        let mut members = vec![r#""model":"m""#.to_string()];
        let messages: Vec<String> = self.messages.iter().map(Message::render).collect();
        members.push(format!(r#""messages":[{}]"#, messages.join(",")));
        members.extend(self.members.iter().map(Member::render));
        format!("{{{}}}", members.join(","))
    }
}

impl Message {
    fn render(&self) -> String {
        let role = pick(ROLES, self.role);
        let mut members = vec![format!(r#""role":"{role}""#)];
        if role == "tool" {
            members.push(r#""tool_call_id":"t""#.into());
        }
        match &self.content {
            None => {}
            Some(Content::Null) => members.push(r#""content":null"#.into()),
            Some(Content::Text(text)) => members.push(format!(r#""content":{}"#, text.render())),
            Some(Content::Parts(parts)) => {
                let parts: Vec<String> = parts.iter().map(Part::render).collect();
                members.push(format!(r#""content":[{}]"#, parts.join(",")));
            }
        }
        members.extend(self.members.iter().map(Member::render));
        format!("{{{}}}", members.join(","))
    }
}

impl Part {
    fn render(&self) -> String {
        let mut members = Vec::new();
        if let Some(kind) = KINDS.get(usize::from(self.kind) % (KINDS.len() + 1)) {
            members.push(format!(r#""type":"{kind}""#));
        }
        members.extend(self.members.iter().map(Member::render));
        format!("{{{}}}", members.join(","))
    }
}

impl Member {
    fn render(&self) -> String {
        let value = match &self.value {
            Scalar::Text(text) => text.render(),
            Scalar::Number(n) => n.to_string(),
            Scalar::Null => "null".into(),
            Scalar::Object(members) => {
                let members: Vec<String> =
                    members.iter().map(|(key, text)| format!("{}:{}", pick(KEYS, *key), text.render())).collect();
                format!("{{{}}}", members.join(","))
            }
        };
        format!("{}:{value}", pick(KEYS, self.key))
    }
}

impl Text {
    fn render(&self) -> String {
        match self {
            Text::Word(i) => pick(WORDS, *i).to_string(),
            Text::Any(text) => serde_json::to_string(text).unwrap_or_default(),
        }
    }
}

pub fn check(chat: &Chat) {
    check_body(chat.render().as_bytes());
}

/// (role, text) pairs, counted.
type Texts = HashMap<(String, String), usize>;

/// Every text sent upstream is one the plugins saw.
pub fn check_body(body: &[u8]) {
    let shown = || String::from_utf8_lossy(body).into_owned();
    // Refused before routing: nothing is read or sent.
    if requested_model(body).is_err() {
        return;
    }
    let Some(view) = plugin_view(body) else { return };
    let sent = rewrite_model(&Bytes::copy_from_slice(body), "backend").expect("a routed body is rewritten");
    let upstream: Value = serde_json::from_slice(&sent).expect("a routed body is JSON");
    let messages = upstream["messages"].as_array().expect("the plugins read messages from an array");
    assert_eq!(messages.len(), view.len(), "{}", shown());

    // Passed through: an OpenAI-compatible server's reading.
    for (i, (message, (role, texts))) in messages.iter().zip(&view).enumerate() {
        assert_eq!(message["role"].as_str(), Some(role.as_str()), "messages[{i}] role: {}", shown());
        for text in openai_texts(&message["content"]) {
            assert!(texts.contains(&text), "messages[{i}]: {text:?} is sent but plugins see {texts:?}: {}", shown());
        }
    }

    // Translated for Anthropic: every text block (and the system prompt) is
    // a text plugins saw, in a message of the role it is sent as.
    let Ok(translated) = anthropic::chat_request(&sent, Some("claude")) else { return };
    let translated: Value = serde_json::from_slice(&translated.body).expect("the translation is JSON");
    let mut seen = Texts::new();
    let mut system = Vec::new();
    for (role, texts) in &view {
        let role = match role.as_str() {
            "system" | "developer" => {
                system.extend(texts.iter().filter(|t| !t.is_empty()).cloned());
                continue;
            }
            "tool" => "user",
            role => role,
        };
        for text in texts {
            *seen.entry((role.to_string(), text.clone())).or_default() += 1;
        }
    }
    let sent_system = translated["system"].as_str().map(str::to_string);
    assert_eq!(sent_system, (!system.is_empty()).then(|| system.join("\n\n")), "system: {}", shown());
    let mut blocks = Vec::new();
    for message in translated["messages"].as_array().expect("messages") {
        let role = message["role"].as_str().expect("a role");
        for block in message["content"].as_array().expect("blocks") {
            blocks.push((role, block));
            for inner in block["content"].as_array().into_iter().flatten() {
                blocks.push((role, inner));
            }
        }
    }
    for (role, block) in blocks {
        if let Some(text) = block.get("text") {
            let text = text.as_str().expect("text is a string").to_string();
            let key = (role.to_string(), text);
            let left = seen.get_mut(&key).filter(|n| **n > 0);
            let left = left.unwrap_or_else(|| panic!("{key:?} is sent to Anthropic unseen by plugins: {}", shown()));
            *left -= 1;
        }
    }
}

/// Each message's role and its texts as plugins see them; `None` if they
/// cannot read the messages (a guard then refuses the request).
fn plugin_view(body: &[u8]) -> Option<Vec<(String, Vec<String>)>> {
    let body = Bytes::copy_from_slice(body);
    // As the proxy reads it, and the plugin chain when the one pass was unsure.
    let mut chat = ChatBody::read(body.clone()).map(|(chat, _)| chat).unwrap_or_else(|| ChatBody::validated(body));
    let messages = chat.messages().ok()?;
    Some(
        messages
            .into_iter()
            .map(|m| {
                let texts = m.content.texts().into_iter().map(|t| t.into_owned()).collect();
                (m.role, texts)
            })
            .collect(),
    )
}

/// The texts an OpenAI-compatible server reads from a message's content:
/// the string; a `text` or `input_text` part's `text`; a `refusal` part's
/// `refusal`.
fn openai_texts(content: &Value) -> Vec<String> {
    let text = |value: Option<&Value>| value.and_then(Value::as_str).map(str::to_string);
    match content {
        Value::String(text) => vec![text.clone()],
        Value::Array(parts) => parts
            .iter()
            .filter_map(|part| match part["type"].as_str()? {
                "text" | "input_text" => text(part.get("text")),
                "refusal" => text(part.get("refusal")),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}
