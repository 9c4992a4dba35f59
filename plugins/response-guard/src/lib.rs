//! Masks (or blocks) regex matches in what the model says: the
//! `choices[].delta.content` of each streamed chunk, and the
//! `choices[].message.content` of a whole JSON response (`text` for the
//! legacy completions endpoint); for the Responses API, the
//! `output[].content[].text` of a response and the
//! `response.output_text.delta` events of a stream (with every event that
//! repeats the text). Requests to an endpoint it does not read are refused.
//!
//! A streamed match can be split across chunks (`"sk-ab"` then `"cd…"`), so
//! the last `holdBackChars` characters of each choice's text are held back
//! until the next chunk, the choice's `finish_reason`, or `[DONE]`. Matches up
//! to that length are caught wherever the chunks split them.

use std::collections::BTreeMap;

use regex::Regex;
use serde::Deserialize;
use serde_json::{Map, Value};
use sluice_plugin_sdk::prelude::*;

/// Text like a model's answer, matched once while configuring (see `new`).
const WARM_UP: &str = "Sure! The key is sk-test and the card 1234 5678 9012 3456; mail me at a@b.example. Voilà.";

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    rules: Vec<RuleConfig>,
    #[serde(default)]
    action: Mode,
    /// What a match becomes when the rule has no `replacement` of its own.
    /// `$1` and `${name}` refer to capture groups; `$$` is a literal `$`.
    #[serde(default = "default_replacement")]
    replacement: String,
    /// The longest match caught across a chunk boundary, in characters.
    #[serde(default = "default_hold_back")]
    hold_back_chars: usize,
}

fn default_replacement() -> String {
    "[REDACTED]".to_string()
}

fn default_hold_back() -> usize {
    64
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleConfig {
    name: String,
    pattern: String,
    replacement: Option<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Mode {
    /// Replace each match and carry on.
    #[default]
    Mask,
    /// End the response at the first match, with `finish_reason: content_filter`.
    Block,
}

struct Rule {
    name: String,
    regex: Regex,
    replacement: String,
}

struct ResponseGuard {
    rules: Vec<Rule>,
    mode: Mode,
    hold_back_chars: usize,
}

/// One streamed response's progress.
#[derive(Default)]
struct Stream {
    /// Per choice index, text received but not yet sent.
    pending: BTreeMap<u64, String>,
    /// The latest chunk, the model for a closing chunk of our own.
    last_chunk: Option<Map<String, Value>>,
    /// Responses API: per (output index, content index), text received
    /// but not yet sent.
    parts: BTreeMap<(u64, u64), String>,
    /// Responses API: the latest `response` object an event carried, the
    /// model for a closing `response.incomplete` of our own.
    last_response: Option<Map<String, Value>>,
}

/// The endpoints whose responses it reads. Embeddings carry no text to
/// guard; the others are read as their shapes say.
const ENDPOINTS: &[&str] = &["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"];

impl Plugin for ResponseGuard {
    const NAME: &'static str = "response-guard";
    type Config = Config;
    type State = Stream;

    fn new(config: Config) -> Result<Self, String> {
        if config.rules.is_empty() {
            return Err("`rules` is empty".into());
        }
        let mut rules: Vec<Rule> = Vec::new();
        for rule in config.rules {
            if rule.name.trim().is_empty() || rules.iter().any(|r| r.name == rule.name) {
                return Err(format!("rule names must be non-empty and unique: {:?}", rule.name));
            }
            let regex = Regex::new(&rule.pattern).map_err(|e| format!("rule {:?}: {e}", rule.name))?;
            // The regex's engines build their caches at their first use.
            // Using it here builds them in `configure`, whose memory the
            // host snapshots: a fresh instance starts with them instead of
            // building them on its first response.
            let _ = regex.find_iter(WARM_UP).count();
            let replacement = rule.replacement.unwrap_or_else(|| config.replacement.clone());
            rules.push(Rule { name: rule.name, regex, replacement });
        }
        Ok(ResponseGuard { rules, mode: config.action, hold_back_chars: config.hold_back_chars })
    }

    fn hooks(&self) -> Hooks {
        // The request hook refuses endpoints it does not read; the head
        // starts each response afresh (see the SDK's `State`).
        Hooks::REQUEST | Hooks::RESPONSE_HEAD | Hooks::RESPONSE_CHUNK | Hooks::RESPONSE_BODY
    }

    fn on_request(&self, req: &Request, _: &mut Stream) -> Result<Action, ApiError> {
        let path = req.path_only();
        if ENDPOINTS.contains(&path.as_str()) {
            Ok(Action::Continue)
        } else {
            Err(ApiError::unsupported_endpoint(Self::NAME, &path, ENDPOINTS))
        }
    }

    fn on_chunk(&self, data: &str, stream: &mut Stream) -> ChunkAction {
        if data.trim() == "[DONE]" {
            return match self.flush(stream) {
                Some(last) => ChunkAction::Stop(Some(last)),
                None => ChunkAction::Pass,
            };
        }
        // Not JSON: nothing we know how to read, so nothing to mask.
        let Ok(mut chunk) = serde_json::from_str::<Map<String, Value>>(data) else {
            return ChunkAction::Pass;
        };
        if chunk.get("type").and_then(Value::as_str).is_some_and(|t| t.starts_with("response.")) {
            return self.on_event(chunk, stream);
        }
        let mut changed = false;
        let mut blocked = false;
        if let Some(Value::Array(choices)) = chunk.get_mut("choices") {
            for (position, choice) in choices.iter_mut().enumerate() {
                let Some(choice) = choice.as_object_mut() else { continue };
                let index = choice.get("index").and_then(Value::as_u64).unwrap_or(position as u64);
                let finished = choice.get("finish_reason").is_some_and(|reason| !reason.is_null());
                let Some(text) = choice_text(choice) else { continue };
                let pending = stream.pending.entry(index).or_default();
                pending.push_str(&text);
                let (send, was_blocked) = self.release(pending, finished);
                blocked |= was_blocked;
                if was_blocked {
                    choice.insert("finish_reason".into(), "content_filter".into());
                }
                if send != text {
                    set_choice_text(choice, send);
                    changed = true;
                }
            }
        }
        if blocked {
            stream.pending.clear();
            return ChunkAction::Stop(Some(Value::Object(chunk).to_string()));
        }
        // Written from the map itself, which is then kept: no copy of it.
        let chunk = Value::Object(chunk);
        let action = if changed { ChunkAction::Replace(chunk.to_string()) } else { ChunkAction::Pass };
        if let Value::Object(chunk) = chunk {
            stream.last_chunk = Some(chunk);
        }
        action
    }

    fn on_body(&self, body: &[u8], _: &mut Stream) -> Option<Vec<u8>> {
        let mut response: Map<String, Value> = serde_json::from_slice(body).ok()?;
        if response.get("object").and_then(Value::as_str) == Some("response") || response.contains_key("output") {
            return match self.guard_response(&mut response) {
                Verdict::Clean => None,
                Verdict::Masked => Some(Value::Object(response).to_string().into_bytes()),
                Verdict::Blocked => Some(Value::Object(incomplete(response)).to_string().into_bytes()),
            };
        }
        let Some(Value::Array(choices)) = response.get_mut("choices") else { return None };
        let mut changed = false;
        for choice in choices.iter_mut().filter_map(Value::as_object_mut) {
            let text = match choice.get("message").and_then(|m| m.get("content")) {
                Some(Value::String(text)) => text.clone(),
                _ => match choice.get("text") {
                    Some(Value::String(text)) => text.clone(),
                    _ => continue,
                },
            };
            let (masked, blocked) = match self.mode {
                Mode::Mask => (self.mask(&text), false),
                Mode::Block => (text.clone(), self.first_match(&text).is_some()),
            };
            if blocked {
                // What a provider's own content filter answers.
                if let Some(Value::Object(message)) = choice.get_mut("message") {
                    message.insert("content".into(), Value::Null);
                } else {
                    choice.insert("text".into(), "".into());
                }
                choice.insert("finish_reason".into(), "content_filter".into());
                changed = true;
            } else if masked != text {
                if let Some(Value::Object(message)) = choice.get_mut("message") {
                    message.insert("content".into(), masked.into());
                } else {
                    choice.insert("text".into(), masked.into());
                }
                changed = true;
            }
        }
        changed.then(|| Value::Object(response).to_string().into_bytes())
    }
}

impl ResponseGuard {
    /// Takes what can be sent now out of `pending`, masked, and says whether
    /// it was blocked instead. Unless the choice is finished, the tail that
    /// may be the start of a match stays in `pending`.
    fn release(&self, pending: &mut String, finished: bool) -> (String, bool) {
        if self.mode == Mode::Block
            && let Some(at) = self.first_match(pending)
        {
            let before = pending[..at].to_string();
            pending.clear();
            return (before, true);
        }
        let split = if finished { pending.len() } else { self.safe_split(pending) };
        let ready: String = pending.drain(..split).collect();
        match self.mode {
            Mode::Mask => (self.mask(&ready), false),
            Mode::Block => (ready, false),
        }
    }

    /// Where `text` can be cut: before the last `hold_back_chars`
    /// characters, and never inside a match.
    fn safe_split(&self, text: &str) -> usize {
        let mut split = match self.hold_back_chars {
            0 => text.len(),
            n => text.char_indices().rev().nth(n - 1).map_or(0, |(i, _)| i),
        };
        // A match across the cut may still grow: hold all of it back. Moving
        // the cut can put it inside another rule's match, so repeat.
        loop {
            let straddling = self
                .rules
                .iter()
                .flat_map(|rule| rule.regex.find_iter(text))
                .filter(|m| m.start() < split && m.end() > split)
                .map(|m| m.start())
                .min();
            match straddling {
                Some(start) => split = start,
                None => return split,
            }
        }
    }

    fn mask(&self, text: &str) -> String {
        let mut text = text.to_string();
        for rule in &self.rules {
            if let std::borrow::Cow::Owned(masked) = rule.regex.replace_all(&text, rule.replacement.as_str()) {
                host::log(LogLevel::Debug, "masked model output", &[("rule", &rule.name)]);
                text = masked;
            }
        }
        text
    }

    /// Where the earliest match of any rule starts.
    fn first_match(&self, text: &str) -> Option<usize> {
        let first = self
            .rules
            .iter()
            .filter_map(|rule| rule.regex.find(text).map(|m| (m.start(), rule)))
            .min_by_key(|(at, _)| *at);
        if let Some((_, rule)) = first {
            host::log(LogLevel::Info, "blocked model output", &[("rule", &rule.name)]);
        }
        first.map(|(at, _)| at)
    }

    /// A last chunk carrying whatever is still held back, if anything is.
    fn flush(&self, stream: &mut Stream) -> Option<String> {
        let pending = std::mem::take(&mut stream.pending);
        let choices: Vec<Value> = pending
            .into_iter()
            .filter(|(_, text)| !text.is_empty())
            .map(|(index, mut text)| {
                let (send, blocked) = self.release(&mut text, true);
                let reason = if blocked { Value::from("content_filter") } else { Value::Null };
                serde_json::json!({"index": index, "delta": {"content": send}, "finish_reason": reason})
            })
            .collect();
        if choices.is_empty() {
            return None;
        }
        let mut chunk = stream.last_chunk.take().unwrap_or_default();
        chunk.insert("choices".into(), Value::Array(choices));
        chunk.remove("usage");
        Some(Value::Object(chunk).to_string())
    }
}

/// What guarding a piece of the Responses API found.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
enum Verdict {
    Clean,
    Masked,
    Blocked,
}

impl ResponseGuard {
    /// One Responses API stream event. Text deltas are held back and
    /// masked as chat deltas are, per content part; every event that
    /// repeats text (`.done` events, items, the `response` objects) has it
    /// masked whole. In block mode a match ends the stream with a
    /// `response.incomplete` for `content_filter`.
    ///
    /// A part's held-back text cannot get a delta event of its own (the
    /// host forwards one event for each it reads): it reaches the client in
    /// the part's `response.output_text.done` and the events after it,
    /// which carry the whole text.
    fn on_event(&self, mut event: Map<String, Value>, stream: &mut Stream) -> ChunkAction {
        let kind = event.get("type").and_then(Value::as_str).unwrap_or_default().to_string();
        let at = |event: &Map<String, Value>| {
            let index = |name| event.get(name).and_then(Value::as_u64).unwrap_or(0);
            (index("output_index"), index("content_index"))
        };
        let verdict = match kind.as_str() {
            "response.output_text.delta" => {
                let Some(Value::String(delta)) = event.get("delta") else { return ChunkAction::Pass };
                let delta = delta.clone();
                let pending = stream.parts.entry(at(&event)).or_default();
                pending.push_str(&delta);
                let (send, blocked) = self.release(pending, false);
                if blocked {
                    Verdict::Blocked
                } else if send != delta {
                    event.insert("delta".into(), send.into());
                    Verdict::Masked
                } else {
                    Verdict::Clean
                }
            }
            "response.output_text.done" => {
                stream.parts.remove(&at(&event));
                self.guard_text(event.get_mut("text"))
            }
            "response.content_part.added" | "response.content_part.done" => self.guard_part(event.get_mut("part")),
            "response.output_item.added" | "response.output_item.done" => self.guard_item(event.get_mut("item")),
            _ => match event.get_mut("response") {
                Some(Value::Object(response)) => {
                    let verdict = self.guard_response(response);
                    let mut seen = response.clone();
                    seen.remove("output");
                    stream.last_response = Some(seen);
                    verdict
                }
                _ => Verdict::Clean,
            },
        };
        match verdict {
            Verdict::Clean => ChunkAction::Pass,
            Verdict::Masked => ChunkAction::Replace(Value::Object(event).to_string()),
            Verdict::Blocked => {
                stream.parts.clear();
                let response = incomplete(stream.last_response.take().unwrap_or_default());
                let closing = serde_json::json!({"type": "response.incomplete", "response": response});
                ChunkAction::Stop(Some(closing.to_string()))
            }
        }
    }

    /// A `response` object: the text of every output item, and the
    /// `output_text` some servers add.
    fn guard_response(&self, response: &mut Map<String, Value>) -> Verdict {
        let mut verdict = self.guard_text(response.get_mut("output_text"));
        if let Some(Value::Array(items)) = response.get_mut("output") {
            for item in items {
                verdict = verdict.max(self.guard_item(Some(item)));
            }
        }
        verdict
    }

    /// An output item: the text of each of its content parts.
    fn guard_item(&self, item: Option<&mut Value>) -> Verdict {
        let Some(Value::Array(parts)) = item.and_then(|item| item.get_mut("content")) else {
            return Verdict::Clean;
        };
        parts.iter_mut().map(|part| self.guard_part(Some(part))).fold(Verdict::Clean, Verdict::max)
    }

    fn guard_part(&self, part: Option<&mut Value>) -> Verdict {
        self.guard_text(part.and_then(|part| part.get_mut("text")))
    }

    /// Masks a string in place; in block mode, empties it if it matches.
    fn guard_text(&self, text: Option<&mut Value>) -> Verdict {
        let Some(Value::String(text)) = text else { return Verdict::Clean };
        match self.mode {
            Mode::Block if self.first_match(text).is_some() => {
                text.clear();
                Verdict::Blocked
            }
            Mode::Block => Verdict::Clean,
            Mode::Mask => {
                let masked = self.mask(text);
                if masked == *text {
                    return Verdict::Clean;
                }
                *text = masked;
                Verdict::Masked
            }
        }
    }
}

impl Verdict {
    fn max(self, other: Verdict) -> Verdict {
        if other > self { other } else { self }
    }
}

/// A response ended by the guard: what a provider's own content filter
/// answers in the Responses API.
fn incomplete(mut response: Map<String, Value>) -> Map<String, Value> {
    response.insert("status".into(), "incomplete".into());
    response.insert("incomplete_details".into(), serde_json::json!({"reason": "content_filter"}));
    response
}

/// The streamed text of a choice: `delta.content`, or the legacy `text`.
fn choice_text(choice: &Map<String, Value>) -> Option<String> {
    match choice.get("delta") {
        Some(delta) => match delta.get("content") {
            Some(Value::String(text)) => Some(text.clone()),
            // A chunk without content can still finish the choice, and
            // then carries what was held back.
            _ => Some(String::new()),
        },
        None => choice.get("text").and_then(Value::as_str).map(str::to_string),
    }
}

fn set_choice_text(choice: &mut Map<String, Value>, text: String) {
    match choice.get_mut("delta") {
        Some(Value::Object(delta)) => {
            delta.insert("content".into(), text.into());
        }
        _ => {
            choice.insert("text".into(), text.into());
        }
    }
}

export_plugin!(ResponseGuard);

#[cfg(test)]
mod tests;
