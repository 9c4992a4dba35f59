//! Sends the prompt and the model's answer to an external checker (OpenAI's
//! moderation endpoint, or a Presidio analyzer) over outbound HTTP, and
//! blocks, masks or only counts what it finds. A streamed answer is checked
//! as it flows: the text of each window (a sentence, or N characters) is
//! held back until the window closes, checked, and only then sent on, as one
//! chunk; a window the checker flags ends the stream with an error event
//! instead, so the client never receives it.
//!
//! Only `/v1/chat/completions` is read; any other endpoint is refused,
//! rather than let by unchecked.

use std::cmp::Reverse;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use sluice_plugin_sdk::metrics::{self, Metric};
use sluice_plugin_sdk::outbound;
use sluice_plugin_sdk::prelude::*;

const CHAT: &str = "/v1/chat/completions";

/// A sentence window closes after one of these.
const SENTENCE_ENDS: &[char] = &['\n', '。', '！', '？'];
/// Or after one of these followed by a space: a `.` inside an address,
/// a URL or a number ends nothing.
const SENTENCE_STOPS: &[char] = &['.', '!', '?'];

/// A sentence window closes at this many characters even without an end,
/// so text without punctuation is not held to the end of the answer.
const MAX_SENTENCE_CHARS: usize = 1000;

/// What a blocked choice of a whole (not streamed) answer says instead.
const BLOCKED_NOTICE: &str = "This response was blocked by the gateway's guardrail.";
const UNCHECKED_NOTICE: &str = "This response could not be checked by the gateway's guardrail, so it was withheld.";

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    provider: ProviderConfig,
    #[serde(default)]
    action: Mode,
    #[serde(default = "yes")]
    check_request: bool,
    #[serde(default = "yes")]
    check_response: bool,
    #[serde(default)]
    window: Window,
    #[serde(default)]
    on_error: OnError,
    #[serde(default = "default_timeout_ms")]
    timeout_ms: u32,
}

fn yes() -> bool {
    true
}

fn default_timeout_ms() -> u32 {
    2000
}

/// Exactly one of the two.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ProviderConfig {
    #[serde(default)]
    openai_moderation: Option<Moderation>,
    #[serde(default)]
    presidio: Option<Presidio>,
}

/// OpenAI's `POST /v1/moderations`, or a server that answers like it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Moderation {
    url: String,
    #[serde(default = "default_model")]
    model: String,
    /// Sent as `authorization: Bearer`; from a Secret (`configFrom`).
    #[serde(default)]
    api_key: Option<String>,
}

fn default_model() -> String {
    "omni-moderation-latest".to_string()
}

/// Presidio's analyzer, `POST /analyze`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Presidio {
    url: String,
    #[serde(default = "default_language")]
    language: String,
    /// The entity types to look for; all the analyzer knows if absent.
    #[serde(default)]
    entities: Option<Vec<String>>,
    #[serde(default)]
    score_threshold: Option<f64>,
}

fn default_language() -> String {
    "en".to_string()
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Mode {
    /// Refuse the prompt, end the answer.
    #[default]
    Block,
    /// Replace each entity Presidio finds with `<ENTITY_TYPE>`.
    Mask,
    /// Only count what is found.
    Monitor,
}

/// How a streamed answer is cut into the pieces that are checked.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
enum Window {
    /// At least this many sentence ends: `.`, `!` or `?` followed by a
    /// space, a newline, `。`, `！` or `？`.
    Sentences(usize),
    /// At least this many characters.
    Chars(usize),
}

impl Default for Window {
    fn default() -> Self {
        Window::Sentences(1)
    }
}

/// What a failed check (unreachable, timed out, nonsense) counts as.
#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum OnError {
    /// Fail closed: as if the text were flagged.
    #[default]
    Block,
    /// Fail open: as if it were clean.
    Allow,
}

enum Provider {
    Moderation(Moderation),
    Presidio(Presidio),
}

struct Guardrail {
    provider: Provider,
    action: Mode,
    check_request: bool,
    check_response: bool,
    window: Window,
    on_error: OnError,
    timeout_ms: u32,
}

/// Which text is checked: the label of the metrics, and the words of errors.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    Request,
    Response,
}

impl Phase {
    fn label(self) -> &'static str {
        match self {
            Phase::Request => "request",
            Phase::Response => "response",
        }
    }

    fn text(self) -> &'static str {
        match self {
            Phase::Request => "prompt",
            Phase::Response => "response",
        }
    }
}

/// An entity Presidio found: a byte range of the checked text.
#[derive(Clone, Debug, PartialEq)]
struct Span {
    start: usize,
    end: usize,
    entity: String,
}

/// What the checker found in a text.
#[derive(Debug, PartialEq)]
enum Finding {
    Clean,
    /// Flagged by moderation, in these categories.
    Flagged(Vec<String>),
    /// Entities, sorted and not overlapping.
    Entities(Vec<Span>),
}

/// What to do with a checked text.
#[derive(Debug, PartialEq)]
enum Decision {
    Pass,
    Mask(Vec<Span>),
    /// Blocked, and why (categories or entity types, never the text).
    Block(String),
    /// The check failed and `onError` is `block`.
    Unchecked,
}

/// One streamed answer's progress.
#[derive(Default)]
struct Stream {
    /// Text received and not yet checked: the open window.
    held: String,
    /// The first chunk without its choices: the model of a closing chunk of
    /// our own, when `[DONE]` comes with text still held.
    template: Option<Map<String, Value>>,
}

impl Plugin for Guardrail {
    const NAME: &'static str = "guardrail";
    type Config = Config;
    type State = Stream;

    fn new(config: Config) -> Result<Self, String> {
        let provider = match (config.provider.openai_moderation, config.provider.presidio) {
            (Some(moderation), None) => {
                check_url("provider.openaiModeration.url", &moderation.url)?;
                if config.action == Mode::Mask {
                    return Err(
                        "`action: mask` needs the `presidio` provider: moderation finds no spans to mask".into()
                    );
                }
                Provider::Moderation(moderation)
            }
            (None, Some(presidio)) => {
                check_url("provider.presidio.url", &presidio.url)?;
                if presidio.score_threshold.is_some_and(|t| !(0.0..=1.0).contains(&t)) {
                    return Err("`provider.presidio.scoreThreshold` must be between 0 and 1".into());
                }
                Provider::Presidio(presidio)
            }
            _ => return Err("`provider` needs exactly one of `openaiModeration` and `presidio`".into()),
        };
        if !config.check_request && !config.check_response {
            return Err("`checkRequest` and `checkResponse` are both false: nothing would be checked".into());
        }
        if matches!(config.window, Window::Sentences(0) | Window::Chars(0)) {
            return Err("`window` must be at least 1 sentence or 1 character".into());
        }
        if config.timeout_ms == 0 {
            return Err("`timeoutMs` must be positive".into());
        }
        metrics::declare(&[
            Metric::counter("guardrail_verdicts", "Guardrail checks by phase and verdict")
                .labels(&["phase", "verdict"])
                .max_values(8),
            Metric::histogram("guardrail_check_seconds", "How long each guardrail check took").labels(&["phase"]),
        ])?;
        Ok(Guardrail {
            provider,
            action: config.action,
            check_request: config.check_request,
            check_response: config.check_response,
            window: config.window,
            on_error: config.on_error,
            timeout_ms: config.timeout_ms,
        })
    }

    fn hooks(&self) -> Hooks {
        // The request hook refuses what it cannot read, and starts each
        // request's state afresh on a reused instance.
        let mut hooks = Hooks::REQUEST;
        if self.check_response {
            hooks |= Hooks::RESPONSE_CHUNK | Hooks::RESPONSE_BODY;
        }
        hooks
    }

    fn on_request(&self, req: &Request, _: &mut Stream) -> Result<Action, ApiError> {
        let path = req.path_only();
        if path != CHAT {
            return Err(ApiError::unsupported_endpoint(Self::NAME, &path, &[CHAT]));
        }
        // A stream is checked as one text: the other choices would pass unchecked.
        if self.check_response && req.field::<Value>("n")?.and_then(|n| n.as_f64()).is_some_and(|n| n > 1.0) {
            return Err(ApiError::bad_request("unsupported_value", "guardrail checks one choice: `n` must be 1"));
        }
        if !self.check_request {
            return Ok(Action::Continue);
        }
        let messages = req.messages()?;
        let prompt = Prompt::of(&messages);
        if prompt.text.trim().is_empty() {
            return Ok(Action::Continue);
        }
        match self.decide(Phase::Request, &prompt.text) {
            Decision::Pass => {}
            Decision::Mask(spans) => prompt.mask(req, messages, &spans),
            Decision::Block(why) => return Err(blocked(Phase::Request, &why)),
            Decision::Unchecked => return Err(unchecked(Phase::Request)),
        }
        Ok(Action::Continue)
    }

    fn on_chunk(&self, data: &str, stream: &mut Stream) -> ChunkAction {
        if data.trim() == "[DONE]" {
            if stream.held.is_empty() {
                return ChunkAction::Pass;
            }
            let window = std::mem::take(&mut stream.held);
            let last = match self.release(&window) {
                Ok(text) => {
                    let mut chunk = stream.template.take().unwrap_or_default();
                    set_text(&mut chunk, text);
                    Value::Object(chunk).to_string()
                }
                Err(error) => error,
            };
            return ChunkAction::Stop(Some(last));
        }
        // Not JSON: nothing to read.
        let Ok(mut chunk) = serde_json::from_str::<Map<String, Value>>(data) else {
            return ChunkAction::Pass;
        };
        if stream.template.is_none() {
            let mut template = chunk.clone();
            template.remove("choices");
            template.remove("usage");
            stream.template = Some(template);
        }
        let choices = chunk.get("choices").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        if choices.iter().enumerate().any(|(at, choice)| index(choice, at) != 0 && !text_of(choice).is_empty()) {
            stream.held.clear();
            let error = ApiError::bad_request("unsupported_value", "guardrail checks one choice: `n` must be 1");
            return ChunkAction::Stop(Some(json_text(&error)));
        }
        let first = choices.iter().enumerate().find(|(at, choice)| index(choice, *at) == 0);
        stream.held.push_str(first.map_or("", |(_, choice)| text_of(choice)));
        if stream.held.is_empty() {
            return ChunkAction::Pass;
        }
        // Anything but more text (a finish, usage, a tool call) closes the
        // window, and carries its text: events keep their order.
        let end = if content_only(&chunk) { self.window_end(&stream.held) } else { Some(stream.held.len()) };
        let Some(end) = end else {
            return ChunkAction::Drop;
        };
        let window: String = stream.held.drain(..end).collect();
        match self.release(&window) {
            Ok(text) => {
                set_text(&mut chunk, text);
                ChunkAction::Replace(Value::Object(chunk).to_string())
            }
            Err(error) => {
                stream.held.clear();
                ChunkAction::Stop(Some(error))
            }
        }
    }

    fn on_body(&self, body: &[u8], _: &mut Stream) -> Option<Vec<u8>> {
        let mut response: Map<String, Value> = serde_json::from_slice(body).ok()?;
        let Some(Value::Array(choices)) = response.get_mut("choices") else { return None };
        let mut changed = false;
        for choice in choices.iter_mut().filter_map(Value::as_object_mut) {
            let Some(Value::Object(message)) = choice.get_mut("message") else { continue };
            let Some(Value::String(text)) = message.get_mut("content") else { continue };
            if text.trim().is_empty() {
                continue;
            }
            let notice = match self.decide(Phase::Response, text) {
                Decision::Pass => continue,
                Decision::Mask(spans) => {
                    *text = mask(text, &spans);
                    changed = true;
                    continue;
                }
                Decision::Block(_) => BLOCKED_NOTICE,
                Decision::Unchecked => UNCHECKED_NOTICE,
            };
            *text = notice.to_string();
            choice.insert("finish_reason".into(), "content_filter".into());
            changed = true;
        }
        changed.then(|| Value::Object(response).to_string().into_bytes())
    }
}

impl Guardrail {
    /// Checks `text` and decides, as `action` and `onError` say; counts
    /// the verdict and times the check.
    fn decide(&self, phase: Phase, text: &str) -> Decision {
        let started = host::monotonic_ns();
        let found = self.provider.check(text, self.timeout_ms);
        let seconds = host::monotonic_ns().saturating_sub(started) as f64 / 1e9;
        metrics::observe("guardrail_check_seconds", &[phase.label()], seconds);
        let (verdict, decision) = match found {
            Err(why) => {
                host::log(LogLevel::Warn, "guardrail check failed", &[("phase", phase.label()), ("reason", &why)]);
                let decision = match self.on_error {
                    OnError::Block => Decision::Unchecked,
                    OnError::Allow => Decision::Pass,
                };
                ("error", decision)
            }
            Ok(Finding::Clean) => ("pass", Decision::Pass),
            Ok(found) => {
                let why = found.describe();
                host::log(LogLevel::Info, "guardrail finding", &[("phase", phase.label()), ("found", &why)]);
                match (self.action, found) {
                    (Mode::Monitor, _) => ("monitor", Decision::Pass),
                    (Mode::Mask, Finding::Entities(spans)) => ("mask", Decision::Mask(spans)),
                    // Moderation has nothing to mask (refused in `new`).
                    (Mode::Mask | Mode::Block, _) => ("block", Decision::Block(why)),
                }
            }
        };
        metrics::add("guardrail_verdicts", &[phase.label(), verdict], 1);
        decision
    }

    /// A closed window of a stream: the text to send (masked if need be),
    /// or the error event that ends the stream.
    fn release(&self, window: &str) -> Result<String, String> {
        if window.trim().is_empty() {
            return Ok(window.to_string());
        }
        match self.decide(Phase::Response, window) {
            Decision::Pass => Ok(window.to_string()),
            Decision::Mask(spans) => Ok(mask(window, &spans)),
            Decision::Block(why) => Err(json_text(&blocked(Phase::Response, &why))),
            Decision::Unchecked => Err(json_text(&unchecked(Phase::Response))),
        }
    }

    /// Where the open window `held` closes, if it has: after its last
    /// sentence end, or at its end once it is long enough.
    fn window_end(&self, held: &str) -> Option<usize> {
        let chars = held.chars().count();
        match self.window {
            Window::Chars(n) => (chars >= n).then_some(held.len()),
            Window::Sentences(n) => {
                let (mut count, mut last) = (0, 0);
                let mut scan = held.char_indices().peekable();
                while let Some((at, c)) = scan.next() {
                    let next_is_space = scan.peek().is_some_and(|(_, next)| next.is_whitespace());
                    if SENTENCE_ENDS.contains(&c) || (SENTENCE_STOPS.contains(&c) && next_is_space) {
                        count += 1;
                        last = at + c.len_utf8();
                    }
                }
                if count >= n { Some(last) } else { (chars >= MAX_SENTENCE_CHARS).then_some(held.len()) }
            }
        }
    }
}

impl Provider {
    fn check(&self, text: &str, timeout_ms: u32) -> Result<Finding, String> {
        match self {
            Provider::Moderation(m) => {
                let mut request = post(&m.url, &json!({"model": m.model, "input": text}), timeout_ms)?;
                if let Some(key) = &m.api_key {
                    request = request.header("authorization", &format!("Bearer {key}"));
                }
                let answer: ModerationAnswer = call(&request)?;
                if answer.results.is_empty() {
                    return Err("the moderation answer has no results".into());
                }
                let flagged = answer.results.iter().filter(|r| r.flagged);
                let mut categories: Vec<String> = flagged
                    .clone()
                    .flat_map(|r| r.categories.iter().filter(|(_, on)| **on == Value::Bool(true)))
                    .map(|(name, _)| name.clone())
                    .collect();
                categories.sort();
                categories.dedup();
                Ok(if flagged.count() == 0 { Finding::Clean } else { Finding::Flagged(categories) })
            }
            Provider::Presidio(p) => {
                let mut body = json!({"text": text, "language": p.language});
                if let Some(entities) = &p.entities {
                    body["entities"] = json!(entities);
                }
                if let Some(threshold) = p.score_threshold {
                    body["score_threshold"] = json!(threshold);
                }
                let found: Vec<PresidioResult> = call(&post(&p.url, &body, timeout_ms)?)?;
                let threshold = p.score_threshold.unwrap_or(0.0);
                let found = found.into_iter().filter(|f| f.score.is_none_or(|score| score >= threshold)).collect();
                let spans = spans(text, found)?;
                Ok(if spans.is_empty() { Finding::Clean } else { Finding::Entities(spans) })
            }
        }
    }
}

impl Finding {
    /// Why a text was flagged: moderation categories or entity types.
    fn describe(&self) -> String {
        match self {
            Finding::Clean => String::new(),
            Finding::Flagged(categories) if categories.is_empty() => "flagged by moderation".to_string(),
            Finding::Flagged(categories) => format!("flagged for {}", categories.join(", ")),
            Finding::Entities(spans) => {
                let mut entities: Vec<&str> = spans.iter().map(|s| s.entity.as_str()).collect();
                entities.sort();
                entities.dedup();
                format!("it contains {}", entities.join(", "))
            }
        }
    }
}

#[derive(Deserialize)]
struct ModerationAnswer {
    results: Vec<ModerationResult>,
}

#[derive(Deserialize)]
struct ModerationResult {
    flagged: bool,
    #[serde(default)]
    categories: Map<String, Value>,
}

#[derive(Deserialize)]
struct PresidioResult {
    entity_type: String,
    /// Offsets in characters (Python's `str` indexing: Unicode scalars).
    start: usize,
    end: usize,
    #[serde(default)]
    score: Option<f64>,
}

fn post(url: &str, body: &Value, timeout_ms: u32) -> Result<outbound::Request, String> {
    Ok(outbound::Request::post_json(url, body).map_err(|e| e.to_string())?.timeout_ms(timeout_ms))
}

/// Sends `request` and reads a 2xx answer as `T`. The errors say what went
/// wrong but quote nothing the checker sent.
fn call<T: DeserializeOwned>(request: &outbound::Request) -> Result<T, String> {
    let response = outbound::send(request).map_err(|e| e.to_string())?;
    if !(200..300).contains(&response.status) {
        return Err(format!("the checker answered {}", response.status));
    }
    serde_json::from_slice(&response.body).map_err(|_| "the checker's answer is not in the expected shape".into())
}

/// Presidio's findings as byte ranges of `text`, sorted, overlapping ones
/// merged (the first's entity names both). An offset outside the text
/// means the answer is not about this text: an error.
fn spans(text: &str, found: Vec<PresidioResult>) -> Result<Vec<Span>, String> {
    let bytes: Vec<usize> = text.char_indices().map(|(at, _)| at).chain([text.len()]).collect();
    let mut spans = Vec::with_capacity(found.len());
    for f in found {
        match (bytes.get(f.start), bytes.get(f.end)) {
            (Some(&start), Some(&end)) if start < end => spans.push(Span { start, end, entity: f.entity_type }),
            _ => return Err("the checker's answer has an entity outside the text".into()),
        }
    }
    spans.sort_by_key(|s| (s.start, Reverse(s.end)));
    let mut merged: Vec<Span> = Vec::with_capacity(spans.len());
    for span in spans {
        match merged.last_mut() {
            Some(last) if span.start < last.end => last.end = last.end.max(span.end),
            _ => merged.push(span),
        }
    }
    Ok(merged)
}

/// `text` with each span replaced by `<ENTITY_TYPE>`.
fn mask(text: &str, spans: &[Span]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for span in spans {
        out.push_str(&text[at..span.start]);
        out.push('<');
        out.push_str(&span.entity);
        out.push('>');
        at = span.end;
    }
    out.push_str(&text[at..]);
    out
}

/// The text of a chat request, checked as one: every text piece of every
/// message, whatever its role, joined by blank lines.
struct Prompt {
    text: String,
    /// Per piece: its message, its number among the message's text pieces,
    /// and its byte range in `text`.
    pieces: Vec<(usize, usize, usize, usize)>,
}

impl Prompt {
    fn of(messages: &[Message]) -> Prompt {
        let mut text = String::new();
        let mut pieces = Vec::new();
        for (m, message) in messages.iter().enumerate() {
            for (p, piece) in message.content.texts().iter().enumerate() {
                if !text.is_empty() {
                    text.push_str("\n\n");
                }
                let start = text.len();
                text.push_str(piece);
                pieces.push((m, p, start, text.len()));
            }
        }
        Prompt { text, pieces }
    }

    /// Masks each message's pieces in place, through the host: the
    /// upstream never sees what was found.
    fn mask(&self, req: &Request, messages: Vec<Message>, spans: &[Span]) {
        for (m, message) in messages.into_iter().enumerate() {
            let mut content = message.content;
            let mut changed = false;
            for &(_, p, start, end) in self.pieces.iter().filter(|piece| piece.0 == m) {
                let local: Vec<Span> = spans
                    .iter()
                    .filter(|s| s.start < end && s.end > start)
                    .map(|s| Span { start: s.start.max(start) - start, end: s.end.min(end) - start, ..s.clone() })
                    .collect();
                if !local.is_empty() {
                    changed |= content.set_text(p, mask(&self.text[start..end], &local));
                }
            }
            if changed {
                req.set_content(m as u32, &content);
            }
        }
    }
}

fn check_url(field: &str, url: &str) -> Result<(), String> {
    let lower = url.to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        Ok(())
    } else {
        Err(format!("`{field}` must be an http:// or https:// URL"))
    }
}

/// The 400 for flagged text; in a stream, the error event that ends it.
fn blocked(phase: Phase, why: &str) -> ApiError {
    ApiError::bad_request("content_filter", format!("the {} was blocked by the guardrail: {why}", phase.text()))
}

/// The error when the check failed and `onError` is `block`.
fn unchecked(phase: Phase) -> ApiError {
    let message = format!("the guardrail could not check the {}, so it was not sent", phase.text());
    ApiError::new(503, "guardrail_unavailable", message)
}

fn json_text(error: &ApiError) -> String {
    String::from_utf8_lossy(&error.to_json()).into_owned()
}

/// A choice's `index`, or its position.
fn index(choice: &Value, position: usize) -> u64 {
    choice.get("index").and_then(Value::as_u64).unwrap_or(position as u64)
}

/// A streamed choice's `delta.content`.
fn text_of(choice: &Value) -> &str {
    choice.get("delta").and_then(|d| d.get("content")).and_then(Value::as_str).unwrap_or_default()
}

/// Whether a chunk only adds text to the first choice: one choice, no
/// finish, no usage, and nothing else in its delta.
fn content_only(chunk: &Map<String, Value>) -> bool {
    let Some(Value::Array(choices)) = chunk.get("choices") else { return false };
    let [choice] = choices.as_slice() else { return false };
    let delta = choice.get("delta").and_then(Value::as_object);
    chunk.get("usage").is_none_or(Value::is_null)
        && choice.get("finish_reason").is_none_or(Value::is_null)
        && delta.is_some_and(|delta| delta.iter().all(|(name, value)| name == "content" || value.is_null()))
}

/// Sets the first choice's `delta.content` to `text`, adding the choice
/// (or the delta) if the chunk has none.
fn set_text(chunk: &mut Map<String, Value>, text: String) {
    let choices = chunk.entry("choices").or_insert_with(|| json!([]));
    if !choices.is_array() {
        *choices = json!([]);
    }
    let Value::Array(choices) = choices else { return };
    let at = choices.iter().enumerate().position(|(at, choice)| index(choice, at) == 0 && choice.is_object());
    let choice = match at {
        Some(at) => &mut choices[at],
        None => {
            choices.insert(0, json!({"index": 0, "delta": {}, "finish_reason": null}));
            &mut choices[0]
        }
    };
    let Value::Object(choice) = choice else { return };
    let delta = choice.entry("delta").or_insert_with(|| json!({}));
    if !delta.is_object() {
        *delta = json!({});
    }
    if let Value::Object(delta) = delta {
        delta.insert("content".into(), text.into());
    }
}

export_plugin!(Guardrail);

#[cfg(test)]
mod tests;
