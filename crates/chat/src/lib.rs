//! A chat completion request body, parsed once and edited in place.
//!
//! The gateway hands one [`ChatBody`] down a route's plugin chain: plugins
//! read messages and fields and edit them, and the body is written once,
//! after the last one. Only what was edited is re-encoded; every other byte
//! stays as the client sent it (number text, field order, whitespace inside
//! untouched values), which a parse and re-serialization would not keep.
//!
//! The Rust plugin SDK uses the same code natively, as the stand-in for the
//! host in plugins' unit tests, so they see the host's behaviour.

mod read;
mod scan;
mod unique;

use std::borrow::Cow;
use std::ops::Range;

use bytes::Bytes;

pub use scan::set_member;
use scan::{elements, elements_with_members, members};
pub use unique::{DUPLICATE_KEY, Name, Names, check_members, duplicate_key};

/// A message's `content`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content {
    /// `null` or absent.
    None,
    Text(String),
    Parts(Vec<Part>),
}

/// An element of an array `content`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    /// `{"type": "text", "text": ...}` with no other member.
    Text(String),
    /// Any other part, as its JSON text.
    Other(String),
}

impl Part {
    /// The text plugins read from this part, as the Rust plugin SDK's
    /// `ContentPart::text` reads it: a text part's; a `refusal` part's
    /// `refusal`; any other part's `text` member. `None` if that is not a
    /// string. Upstreams read no other text from a part: what an
    /// OpenAI-compatible one may read is this or less, and the Anthropic
    /// translation sends only text parts' (the fuzz target
    /// `plugin_view_is_what_is_sent` checks both).
    pub fn text(&self) -> Option<Cow<'_, str>> {
        match self {
            Part::Text(text) => Some(Cow::Borrowed(text)),
            Part::Other(json) => {
                let part = serde_json::from_str::<PartText>(json).ok()?;
                let member = if part.kind.as_ref().and_then(serde_json::Value::as_str) == Some("refusal") {
                    part.refusal
                } else {
                    part.text
                };
                match member? {
                    serde_json::Value::String(text) => Some(Cow::Owned(text)),
                    _ => None,
                }
            }
        }
    }
}

/// A part's members that carry text, where it is kept as JSON.
#[derive(serde::Deserialize)]
struct PartText {
    #[serde(rename = "type", default)]
    kind: Option<serde_json::Value>,
    #[serde(default)]
    text: Option<serde_json::Value>,
    #[serde(default)]
    refusal: Option<serde_json::Value>,
}

impl Content {
    /// The text plugins read: the string, or each part's [`Part::text`].
    pub fn texts(&self) -> Vec<Cow<'_, str>> {
        match self {
            Content::None => Vec::new(),
            Content::Text(text) => vec![Cow::Borrowed(text.as_str())],
            Content::Parts(parts) => parts.iter().filter_map(Part::text).collect(),
        }
    }
}

/// One element of `messages`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: Content,
    /// Every other member, as the text of a JSON object: `{}` if none (an
    /// empty text counts as `{}` when writing).
    pub extra: String,
}

impl Message {
    pub fn text(role: &str, text: &str) -> Message {
        Message { role: role.into(), content: Content::Text(text.into()), extra: "{}".into() }
    }
}

/// A request body, edited in place.
#[derive(Clone, Debug, Default)]
pub struct ChatBody {
    /// The body as last written (or received).
    src: Bytes,
    /// Whether `src` is known to be valid JSON (the gateway checked it).
    valid: bool,
    /// `src`'s structure, read on first use; `Err` if it is not a JSON object.
    doc: Option<Result<Doc, String>>,
    /// Whether `doc` holds edits not yet written to `src`.
    edited: bool,
}

/// The top level of a body: its members in order, and the messages array's
/// elements once asked for. Each piece is either a span of `src` or text
/// written by an edit.
#[derive(Clone, Debug)]
struct Doc {
    members: Vec<DocMember>,
    /// The elements of the last `messages` member, once read.
    messages: Option<Result<Vec<Piece>, String>>,
}

#[derive(Clone, Debug)]
struct DocMember {
    /// The name, decoded: a slice of `src` unless it had escapes or an
    /// edit added it (a body has a handful, read on every request).
    key: Bytes,
    /// Up to the value: `"name" :` as the client wrote it, or as an edit added it.
    head: Piece,
    value: Piece,
}

#[derive(Clone, Debug)]
enum Piece {
    Span(Range<usize>),
    Owned(String),
}

impl Piece {
    fn bytes<'a>(&'a self, src: &'a [u8]) -> &'a [u8] {
        match self {
            Piece::Span(span) => &src[span.clone()],
            Piece::Owned(text) => text.as_bytes(),
        }
    }
}

const MESSAGES: &str = "messages";

impl ChatBody {
    /// A body that may be anything; it is checked when first read.
    pub fn new(body: Bytes) -> ChatBody {
        ChatBody { src: body, valid: false, doc: None, edited: false }
    }

    /// A body already known to be valid JSON (e.g. the gateway parsed it to
    /// route it), so reading it only has to find where things are.
    pub fn validated(body: Bytes) -> ChatBody {
        ChatBody { src: body, valid: true, doc: None, edited: false }
    }

    /// A body as the gateway receives it, and its `model`, read in one
    /// pass that checks it is JSON and finds its members and messages, so
    /// that neither routing nor plugins read it again. `None` where that
    /// pass is unsure (a body that is not a JSON object with a non-empty
    /// string `model`, or is nested very deep): serde_json decides those,
    /// and words the error.
    pub fn read(body: Bytes) -> Option<(ChatBody, String)> {
        let read = read::read(&body)?;
        let model = scan::decode_string(body.get(read.model?)?)?.into_owned();
        if model.is_empty() {
            return None;
        }
        let members = read.members.into_iter().map(|member| DocMember::new(member, &body)).collect();
        let messages = read.messages.map(|spans| spans.into_iter().map(Piece::Span).collect());
        let doc = Doc { members, messages: Some(messages) };
        Some((ChatBody { src: body, valid: true, doc: Some(Ok(doc)), edited: false }, model))
    }

    /// Whether this is `body` as received or last written, not edited since.
    pub fn is_reading_of(&self, body: &Bytes) -> bool {
        !self.edited && self.src.as_ptr() == body.as_ptr() && self.src.len() == body.len()
    }

    /// The body now: written once if it was edited since the last call.
    pub fn bytes(&mut self) -> Bytes {
        if self.edited {
            self.src = Bytes::from(self.write());
            self.valid = true;
            self.doc = None;
            self.edited = false;
        }
        self.src.clone()
    }

    /// Its length in bytes, edits included, without writing it.
    pub fn len(&self) -> usize {
        match (&self.doc, self.edited) {
            (Some(Ok(doc)), true) => doc.len(&self.src),
            _ => self.src.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether an edit changed it since it was received or last replaced.
    pub fn is_edited(&self) -> bool {
        self.edited
    }

    /// Replaces the whole body.
    pub fn set_bytes(&mut self, body: Bytes) {
        *self = ChatBody::new(body);
    }

    pub fn messages(&mut self) -> Result<Vec<Message>, String> {
        let src = self.src.clone();
        self.message_pieces()?.iter().enumerate().map(|(i, piece)| read_message(piece.bytes(&src), i)).collect()
    }

    pub fn message_count(&mut self) -> Result<u32, String> {
        Ok(self.message_pieces()?.len() as u32)
    }

    /// Replaces `delete` messages from `start` with `insert`.
    pub fn splice_messages(&mut self, start: u32, delete: u32, insert: Vec<Message>) -> Result<(), String> {
        let insert = insert.iter().map(write_message).collect::<Result<Vec<_>, _>>()?;
        let pieces = self.message_pieces_mut()?;
        let (start, delete) = (start as usize, delete as usize);
        let end = start.checked_add(delete).filter(|&end| end <= pieces.len()).ok_or_else(|| {
            format!("messages {start}..{} are past the end: there are {}", start.saturating_add(delete), pieces.len())
        })?;
        pieces.splice(start..end, insert.into_iter().map(Piece::Owned));
        self.edited = true;
        Ok(())
    }

    /// Replaces the `content` of message `index`, its other members kept.
    pub fn set_content(&mut self, index: u32, content: Content) -> Result<(), String> {
        let content = write_content(&content)?;
        let src = self.src.clone();
        let pieces = self.message_pieces_mut()?;
        let count = pieces.len();
        let piece = pieces
            .get_mut(index as usize)
            .ok_or_else(|| format!("message {index} is past the end: there are {count}"))?;
        let edited = set_member(piece.bytes(&src), "content", &content)
            .ok_or_else(|| format!("messages[{index}] is not an object"))?;
        *piece = Piece::Owned(String::from_utf8(edited).map_err(|_| "a message is not UTF-8".to_string())?);
        self.edited = true;
        Ok(())
    }

    /// The JSON text of the last top-level member `name`.
    pub fn field(&mut self, name: &str) -> Option<String> {
        let src = self.src.clone();
        let doc = self.doc().ok()?;
        if name == MESSAGES
            && let Some(Ok(pieces)) = &doc.messages
        {
            let mut out = Vec::new();
            write_array(pieces, &src, &mut out);
            return String::from_utf8(out).ok();
        }
        let member = doc.members.iter().rev().find(|member| member.key == name)?;
        String::from_utf8(member.value.bytes(&src).to_vec()).ok()
    }

    /// Sets every top-level member `name` to `value` (JSON text), adding it
    /// last if there is none; `None` removes them.
    pub fn set_field(&mut self, name: &str, value: Option<String>) -> Result<(), String> {
        if name == "model" {
            return Err("`model` cannot be set as a field: it routes the request".into());
        }
        if let Some(value) = &value {
            check_json(value.as_bytes()).map_err(|e| format!("the value of `{name}` is not JSON: {e}"))?;
        }
        let doc = self.doc()?;
        match value {
            None => doc.members.retain(|member| member.key != name),
            Some(value) => {
                let mut found = false;
                for member in doc.members.iter_mut().filter(|member| member.key == name) {
                    member.value = Piece::Owned(value.clone());
                    found = true;
                }
                if !found {
                    let head = serde_json::to_string(name).map_err(|e| e.to_string())? + ":";
                    let key = Bytes::copy_from_slice(name.as_bytes());
                    let member = DocMember { key, head: Piece::Owned(head), value: Piece::Owned(value) };
                    doc.members.push(member);
                }
            }
        }
        if name == MESSAGES {
            // Messages are read from spans of the body: write it, so the new
            // ones are read afresh when asked for.
            doc.messages = None;
            self.edited = true;
            self.bytes();
            return Ok(());
        }
        self.edited = true;
        Ok(())
    }

    fn doc(&mut self) -> Result<&mut Doc, String> {
        let (src, valid) = (&self.src, self.valid);
        self.doc.get_or_insert_with(|| read_doc(src, valid)).as_mut().map_err(|error| error.clone())
    }

    fn message_pieces(&mut self) -> Result<&Vec<Piece>, String> {
        self.message_pieces_mut().map(|pieces| &*pieces)
    }

    fn message_pieces_mut(&mut self) -> Result<&mut Vec<Piece>, String> {
        let src = self.src.clone();
        let doc = self.doc()?;
        if doc.messages.is_none() {
            doc.messages = Some(read_messages(doc, &src));
        }
        match &mut doc.messages {
            Some(Ok(pieces)) => Ok(pieces),
            Some(Err(error)) => Err(error.clone()),
            None => Err("the messages could not be read".into()),
        }
    }

    /// The body with its edits.
    fn write(&self) -> Vec<u8> {
        let Some(Ok(doc)) = &self.doc else {
            return self.src.to_vec();
        };
        let mut out = Vec::with_capacity(doc.len(&self.src));
        out.push(b'{');
        let messages = doc.messages_index();
        for (i, member) in doc.members.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(member.head.bytes(&self.src));
            match (&doc.messages, Some(i) == messages) {
                (Some(Ok(pieces)), true) => write_array(pieces, &self.src, &mut out),
                _ => out.extend_from_slice(member.value.bytes(&self.src)),
            }
        }
        out.push(b'}');
        out
    }
}

impl Doc {
    /// Which member is `messages` (the last, as a JSON parser reads it).
    fn messages_index(&self) -> Option<usize> {
        self.members.iter().rposition(|member| member.key == MESSAGES)
    }

    /// The written length.
    fn len(&self, src: &[u8]) -> usize {
        let messages = self.messages_index();
        let members: usize = self
            .members
            .iter()
            .enumerate()
            .map(|(i, member)| {
                let value = match (&self.messages, Some(i) == messages) {
                    (Some(Ok(pieces)), true) => {
                        2 + pieces.iter().map(|p| p.bytes(src).len()).sum::<usize>() + pieces.len().saturating_sub(1)
                    }
                    _ => member.value.bytes(src).len(),
                };
                member.head.bytes(src).len() + value
            })
            .sum();
        2 + members + self.members.len().saturating_sub(1)
    }
}

/// The top level of `src`; `valid` if it is known to be JSON already.
fn read_doc(src: &Bytes, valid: bool) -> Result<Doc, String> {
    if !valid {
        check_json(src).map_err(|e| format!("the body is not JSON: {e}"))?;
    }
    let members = members(src).ok_or("the body is not a JSON object")?;
    Ok(Doc { members: members.into_iter().map(|member| DocMember::new(member, src)).collect(), messages: None })
}

impl DocMember {
    /// A member of `src`, as found there.
    fn new(member: scan::Member<'_>, src: &Bytes) -> DocMember {
        let key = match member.key {
            // Not decoded, so the name between the quotes.
            Cow::Borrowed(_) => src.slice(member.key_span.start + 1..member.key_span.end - 1),
            Cow::Owned(name) => Bytes::from(name),
        };
        DocMember {
            key,
            head: Piece::Span(member.key_span.start..member.value.start),
            value: Piece::Span(member.value),
        }
    }
}

const NO_MESSAGES: &str = "the request has no `messages`";
const TWO_MESSAGES: &str = "the request has more than one `messages`";
const NOT_AN_ARRAY: &str = "`messages` must be an array";

/// The elements of `messages`. Two `messages` members are refused: parsers
/// disagree on which one counts, so a plugin could check one while the
/// upstream reads the other.
fn read_messages(doc: &Doc, src: &[u8]) -> Result<Vec<Piece>, String> {
    let mut named = doc.members.iter().filter(|member| member.key == MESSAGES);
    let member = named.next().ok_or(NO_MESSAGES)?;
    if named.next().is_some() {
        return Err(TWO_MESSAGES.into());
    }
    let value = member.value.bytes(src);
    let offset = match &member.value {
        Piece::Span(span) => span.start,
        Piece::Owned(_) => return Err("`messages` was replaced".into()),
    };
    // One pass finds the messages and their members, to check them.
    let elements = elements_with_members(value).ok_or(NOT_AN_ARRAY)?;
    for (i, (_, members)) in elements.iter().enumerate() {
        check_message(value, members.as_deref(), i)?;
    }
    Ok(elements.into_iter().map(|(span, _)| Piece::Span(span.start + offset..span.end + offset)).collect())
}

/// What `read_message` checks, without decoding any text: messages are
/// checked once, when first asked for, and read only when a plugin wants them.
/// `members` (spans within `text`) are `None` if the message is not an object.
fn check_message(text: &[u8], members: Option<&[scan::Member]>, index: usize) -> Result<(), String> {
    let at = |what: &str| format!("messages[{index}]: {what}");
    let members = members.ok_or_else(|| at("not an object"))?;
    let mut role = false;
    for member in members {
        let value = &text[member.value.clone()];
        match &*member.key {
            "role" if value.first() == Some(&b'"') => role = true,
            "role" => return Err(at("`role` must be a string")),
            "content" if matches!(value.first(), Some(b'n' | b'"' | b'[')) => {}
            "content" => return Err(at("`content` must be a string, an array or null")),
            _ => {}
        }
    }
    if role { Ok(()) } else { Err(at("no `role`")) }
}

fn read_message(text: &[u8], index: usize) -> Result<Message, String> {
    let at = |what: &str| format!("messages[{index}]: {what}");
    let members = members(text).ok_or_else(|| at("not an object"))?;
    let mut role = None;
    let mut content = Content::None;
    let mut extra = Vec::new();
    for member in &members {
        let value = &text[member.value.clone()];
        match &*member.key {
            "role" => role = Some(serde_json::from_slice::<String>(value).map_err(|_| at("`role` must be a string"))?),
            "content" => {
                content = read_content(value).ok_or_else(|| at("`content` must be a string, an array or null"))?
            }
            _ => extra.push(&text[member.key_span.start..member.value.end]),
        }
    }
    let role = role.ok_or_else(|| at("no `role`"))?;
    let extra = format!("{{{}}}", extra.iter().map(|m| String::from_utf8_lossy(m)).collect::<Vec<_>>().join(","));
    Ok(Message { role, content, extra })
}

fn read_content(value: &[u8]) -> Option<Content> {
    match value.first()? {
        b'n' => Some(Content::None),
        b'"' => serde_json::from_slice(value).ok().map(Content::Text),
        b'[' => {
            let parts = elements(value)?;
            parts.into_iter().map(|span| Some(read_part(&value[span]))).collect::<Option<_>>().map(Content::Parts)
        }
        _ => None,
    }
}

/// A text part is one with exactly `type: "text"` and a string `text`; any
/// other is kept as it is.
fn read_part(text: &[u8]) -> Part {
    let other = || Part::Other(String::from_utf8_lossy(text).into_owned());
    let Some(members) = members(text) else {
        return other();
    };
    let value = |key: &str| members.iter().find(|m| m.key == key).map(|m| &text[m.value.clone()]);
    match (members.len(), value("type"), value("text")) {
        (2, Some(b"\"text\""), Some(body)) => serde_json::from_slice(body).map(Part::Text).unwrap_or_else(|_| other()),
        _ => other(),
    }
}

fn write_message(message: &Message) -> Result<String, String> {
    // An empty `extra` is `{}`: a plugin adding a message need not spell it.
    let text = if message.extra.trim().is_empty() { "{}" } else { message.extra.as_str() };
    check_json(text.as_bytes()).map_err(|e| format!("a message's extra is not JSON: {e}"))?;
    let extra = members(text.as_bytes()).ok_or("a message's extra must be a JSON object")?;
    if let Some(member) = extra.iter().find(|m| m.key == "role" || m.key == "content") {
        return Err(format!("a message's extra must not hold `{}`", member.key));
    }
    let role = serde_json::to_string(&message.role).map_err(|e| e.to_string())?;
    let mut out = format!(r#"{{"role":{role},"content":{}"#, write_content(&message.content)?);
    for member in extra {
        out.push(',');
        out.push_str(&text[member.key_span.start..member.value.end]);
    }
    out.push('}');
    Ok(out)
}

fn write_content(content: &Content) -> Result<String, String> {
    let text = |s: &str| serde_json::to_string(s).map_err(|e| e.to_string());
    Ok(match content {
        Content::None => "null".into(),
        Content::Text(s) => text(s)?,
        Content::Parts(parts) => {
            let parts = parts
                .iter()
                .map(|part| match part {
                    Part::Text(s) => Ok(format!(r#"{{"type":"text","text":{}}}"#, text(s)?)),
                    Part::Other(json) => {
                        check_json(json.as_bytes()).map_err(|e| format!("a content part is not JSON: {e}"))?;
                        Ok(json.trim().to_string())
                    }
                })
                .collect::<Result<Vec<_>, String>>()?;
            format!("[{}]", parts.join(","))
        }
    })
}

fn write_array(pieces: &[Piece], src: &[u8], out: &mut Vec<u8>) {
    out.push(b'[');
    for (i, piece) in pieces.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(piece.bytes(src));
    }
    out.push(b']');
}

/// Whether `text` is one JSON value with no object naming a member twice,
/// checked without building it.
pub fn check_json(text: &[u8]) -> Result<(), serde_json::Error> {
    serde_json::from_slice::<serde::de::IgnoredAny>(text)?;
    match unique::first_duplicate(text) {
        Some(name) => Err(serde::de::Error::custom(duplicate_key(&name))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests;
