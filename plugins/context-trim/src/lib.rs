//! Keeps a chat request within a per-model input token budget, by dropping
//! the oldest turns or cutting the middle out of the longest message, and
//! answers `context_length_exceeded` when even the minimum does not fit.
//!
//! Tokens are counted by the gateway (`count-tokens`, the model family's
//! BPE). A request counts as: per message, `messageOverheadTokens` (default
//! 4: the role and the chat format's delimiters, as OpenAI's cookbook counts
//! them) plus its name, text and tool calls; plus 3 tokens priming the reply;
//! plus the `tools` definitions as JSON. Image and audio parts are not
//! counted.

use serde::Deserialize;
use serde_json::Value;
use sluice_plugin_sdk::ModelPattern;
use sluice_plugin_sdk::chat::MessageExtra;
use sluice_plugin_sdk::prelude::*;

/// Tokens that prime the assistant's reply, counted once per request.
const REPLY_PRIMING_TOKENS: u32 = 3;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    /// Budgets by model; the most specific matching pattern applies.
    models: Vec<ModelBudget>,
    #[serde(default)]
    strategy: Strategy,
    #[serde(default = "default_overhead")]
    message_overhead_tokens: u32,
    /// Put where `truncate-middle` cut text out.
    #[serde(default = "default_marker")]
    marker: String,
    /// With `truncate-middle`, whether the newest user message is kept whole.
    #[serde(default = "yes")]
    protect_latest_user: bool,
}

fn default_overhead() -> u32 {
    4
}

fn default_marker() -> String {
    "\n[… trimmed to fit the context window …]\n".to_string()
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ModelBudget {
    /// A model name or glob: `gpt-4o`, `gpt-4o*`, `*`.
    model: ModelPattern,
    /// The input budget itself.
    max_input_tokens: Option<u32>,
    /// Or the model's whole window, less the output the request reserves
    /// (`max_completion_tokens`/`max_tokens`, else `defaultMaxTokens`).
    context_window: Option<u32>,
    #[serde(default)]
    default_max_tokens: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Strategy {
    #[default]
    DropOldest,
    TruncateMiddle,
}

struct ContextTrim {
    config: Config,
}

/// What was trimmed from this request, for the response headers.
#[derive(Debug, Default, PartialEq)]
struct Trimmed {
    tokens: u32,
    messages: u32,
}

/// A message, with the members besides its content that count.
struct Msg {
    message: Message,
    extra: MessageExtra,
}

impl Msg {
    fn is_system(&self) -> bool {
        self.message.is_system()
    }

    fn is_user(&self) -> bool {
        self.message.is_user()
    }
}

/// What the request hook changes in the request's messages.
#[derive(Debug, PartialEq)]
enum Edit {
    None,
    /// Remove these messages.
    Drop(Vec<bool>),
    /// Give these messages this content.
    Cut(Vec<(usize, Content)>),
}

impl Plugin for ContextTrim {
    const NAME: &'static str = "context-trim";
    type Config = Config;
    type State = ();

    fn new(config: Config) -> Result<Self, String> {
        if config.models.is_empty() {
            return Err("`models` is empty: add at least one budget (`model: \"*\"` for a default)".into());
        }
        for budget in &config.models {
            let model = budget.model.as_str();
            match (budget.max_input_tokens, budget.context_window) {
                (Some(_), Some(_)) => {
                    return Err(format!("{model}: set `maxInputTokens` or `contextWindow`, not both"));
                }
                (None, None) => return Err(format!("{model}: set `maxInputTokens` or `contextWindow`")),
                (_, Some(window)) if budget.default_max_tokens >= window => {
                    return Err(format!("{model}: `defaultMaxTokens` leaves no room in the context window"));
                }
                _ => {}
            }
        }
        Ok(ContextTrim { config })
    }

    /// The response headers are set from the request hook: no instance is
    /// held across the upstream call.
    fn hooks(&self) -> Hooks {
        Hooks::REQUEST
    }

    fn on_request(&self, req: &Request, _: &mut ()) -> Result<Action, ApiError> {
        // It counts and trims chat messages only: a request to any other
        // endpoint would go out unbounded, so it is refused.
        if !req.is_chat_completion() {
            return Err(ApiError::unsupported_endpoint(Self::NAME, &req.path_only(), &["/v1/chat/completions"]));
        }
        // Budgets are for the model the client asked for, before any
        // backend rewrite. A model without one costs no further call.
        let model = req.model();
        let Some(budget) = self.budget(&model, req)? else {
            return Ok(Action::Continue);
        };
        if self.fits_unread(req, budget)? {
            req.set_response_header("x-sluice-trimmed-tokens", "0");
            req.set_response_header("x-sluice-trimmed-messages", "0");
            return Ok(Action::Continue);
        }
        let messages = read_messages(req)?;
        let tools = req.field::<Value>("tools")?.map(|tools| tools.to_string());
        let (trimmed, edit) =
            Counter::new(&model, &self.config).trim(&messages, tools.as_deref(), budget, &self.config)?;
        match edit {
            Edit::None => {}
            Edit::Drop(dropped) => {
                // From the end, so earlier indices stay valid.
                let mut end = dropped.len();
                while let Some(last) = dropped[..end].iter().rposition(|d| *d) {
                    let first = dropped[..last].iter().rposition(|d| !*d).map_or(0, |i| i + 1);
                    req.splice_messages(first as u32, (last + 1 - first) as u32, &[]);
                    end = first;
                }
            }
            Edit::Cut(contents) => {
                for (index, content) in &contents {
                    req.set_content(*index as u32, content);
                }
            }
        }
        req.set_response_header("x-sluice-trimmed-tokens", &trimmed.tokens.to_string());
        req.set_response_header("x-sluice-trimmed-messages", &trimmed.messages.to_string());
        Ok(Action::Continue)
    }
}

impl ContextTrim {
    /// Whether the request fits `budget` without reading a message: every
    /// text counted (contents, names, tool calls) is a JSON string of the
    /// body, no longer decoded than encoded, with at most a token per byte,
    /// so the body's size bounds them all. Not with `tools`: they are
    /// counted as re-encoded, which may be longer than the client wrote.
    fn fits_unread(&self, req: &Request, budget: u32) -> Result<bool, ApiError> {
        let count = u64::from(req.message_count()?);
        if req.field_json("tools").is_some() {
            return Ok(false);
        }
        let bound =
            req.body_size() + count * u64::from(self.config.message_overhead_tokens) + u64::from(REPLY_PRIMING_TOKENS);
        Ok(bound <= u64::from(budget))
    }
}

/// The request's messages with their `name` and tool calls; a 400 if a
/// member that counts has the wrong type.
fn read_messages(req: &Request) -> Result<Vec<Msg>, ApiError> {
    req.messages()?
        .into_iter()
        .enumerate()
        .map(|(i, message)| {
            let extra = if message.extra == "{}" {
                MessageExtra::default()
            } else {
                message
                    .extra_as()
                    .map_err(|e| ApiError::bad_request("invalid_chat_request", format!("messages[{i}]: {e}")))?
            };
            Ok(Msg { message, extra })
        })
        .collect()
}

impl ContextTrim {
    /// The input budget for `model`, or `None` when no entry matches.
    fn budget(&self, model: &str, req: &Request) -> Result<Option<u32>, ApiError> {
        let entries = self.config.models.iter().map(|b| (&b.model, b));
        let Some(budget) = ModelPattern::best_match(entries, model) else {
            return Ok(None);
        };
        if let Some(max) = budget.max_input_tokens {
            return Ok(Some(max));
        }
        let window = budget.context_window.unwrap_or_default();
        let output = max_output_tokens(req)?.unwrap_or(budget.default_max_tokens.into());
        if output >= u64::from(window) {
            return Err(too_long(format!(
                "max_tokens {output} leaves no room for input in the {window}-token context window of {model}"
            )));
        }
        Ok(Some(window - output as u32))
    }
}

/// The output budget the client asked for: `max_completion_tokens`, or the
/// older `max_tokens`.
fn max_output_tokens(req: &Request) -> Result<Option<u64>, ApiError> {
    for key in ["max_completion_tokens", "max_tokens"] {
        if let Some(tokens) = req.field::<Value>(key)?.as_ref().and_then(Value::as_u64) {
            return Ok(Some(tokens));
        }
    }
    Ok(None)
}

fn too_long(message: String) -> ApiError {
    ApiError::bad_request("context_length_exceeded", message)
}

/// Counts tokens the way this plugin documents.
struct Counter<'a> {
    model: &'a str,
    overhead: u32,
}

impl<'a> Counter<'a> {
    fn new(model: &'a str, config: &Config) -> Counter<'a> {
        Counter { model, overhead: config.message_overhead_tokens }
    }

    fn text(&self, text: &str) -> u32 {
        if text.is_empty() { 0 } else { host::count_tokens(self.model, text) }
    }

    /// Everything in a message except its content's text.
    fn message_frame(&self, message: &Msg) -> u32 {
        let name = message.extra.name.as_deref().map_or(0, |name| self.text(name));
        let calls: u32 = message
            .extra
            .tool_calls
            .iter()
            .flatten()
            .filter_map(|call| call.function.as_ref())
            .map(|f| self.text(f.name.as_deref().unwrap_or("")) + self.text(f.arguments.as_deref().unwrap_or("")))
            .sum();
        self.overhead + name + calls
    }

    /// One message: its frame, and each text piece of its content.
    fn message(&self, message: &Msg) -> MessageTokens {
        MessageTokens {
            frame: self.message_frame(message),
            pieces: message.message.content.texts().iter().map(|t| self.text(t)).collect(),
        }
    }

    /// What the request costs besides its messages: `tools` is their JSON.
    fn fixed(&self, tools: Option<&str>) -> u32 {
        REPLY_PRIMING_TOKENS + tools.map_or(0, |tools| self.text(tools))
    }

    #[cfg(test)]
    fn total(&self, messages: &[Msg], tools: Option<&str>) -> u32 {
        self.fixed(tools) + messages.iter().map(|m| self.message(m).total()).sum::<u32>()
    }

    /// Never fewer than the tokens the request counts as: the gateway's
    /// BPE tokenizers never produce more tokens than the text has bytes.
    fn upper_bound(&self, messages: &[Msg], tools: Option<&str>) -> u64 {
        let len = |text: Option<&str>| text.map_or(0, str::len) as u64;
        let messages: u64 = messages
            .iter()
            .map(|message| {
                let calls: u64 = message
                    .extra
                    .tool_calls
                    .iter()
                    .flatten()
                    .filter_map(|call| call.function.as_ref())
                    .map(|f| len(f.name.as_deref()) + len(f.arguments.as_deref()))
                    .sum();
                let texts: u64 = message.message.content.texts().iter().map(|t| t.len() as u64).sum();
                u64::from(self.overhead) + len(message.extra.name.as_deref()) + calls + texts
            })
            .sum();
        u64::from(REPLY_PRIMING_TOKENS) + len(tools) + messages
    }

    /// Each text is counted once (a host call per piece); the strategies
    /// then work from these counts. Returns what was trimmed and how.
    fn trim(
        &self,
        messages: &[Msg],
        tools: Option<&str>,
        budget: u32,
        config: &Config,
    ) -> Result<(Trimmed, Edit), ApiError> {
        // Counting is most of this plugin's cost, and most requests are far
        // inside their budget: skip it when even one token per byte fits.
        if self.upper_bound(messages, tools) <= u64::from(budget) {
            return Ok((Trimmed::default(), Edit::None));
        }
        let fixed = self.fixed(tools);
        let counts: Vec<MessageTokens> = messages.iter().map(|m| self.message(m)).collect();
        let before = fixed + counts.iter().map(MessageTokens::total).sum::<u32>();
        if before <= budget {
            return Ok((Trimmed::default(), Edit::None));
        }
        let (trimmed, after, edit) = match config.strategy {
            Strategy::DropOldest => self.drop_oldest(messages, budget, fixed, &counts)?,
            Strategy::TruncateMiddle => self.truncate_middle(messages, budget, before, counts, config)?,
        };
        Ok((Trimmed { tokens: before - after, messages: trimmed }, edit))
    }

    /// Drops whole turns, oldest first. A turn runs from a user message to
    /// the next one, so an assistant's tool calls and their results go
    /// together. System messages and the newest user turn always stay.
    /// Returns how many messages were dropped, the tokens left, and which.
    fn drop_oldest(
        &self,
        messages: &[Msg],
        budget: u32,
        fixed: u32,
        counts: &[MessageTokens],
    ) -> Result<(u32, u32, Edit), ApiError> {
        let newest_turn = newest_turn_start(messages);
        let mut turns: Vec<Vec<usize>> = Vec::new();
        for (i, message) in messages[..newest_turn].iter().enumerate() {
            if message.is_system() {
                continue;
            }
            match turns.last_mut() {
                Some(turn) if !message.is_user() => turn.push(i),
                _ => turns.push(vec![i]),
            }
        }
        let mut total = fixed + counts.iter().map(MessageTokens::total).sum::<u32>();
        let mut dropped = vec![false; messages.len()];
        for turn in &turns {
            if total <= budget {
                break;
            }
            for &i in turn {
                dropped[i] = true;
                total -= counts[i].total();
            }
        }
        if total > budget {
            return Err(too_long(format!(
                "the system messages and the newest user turn alone need {total} tokens; \
                 the input budget for {} is {budget} tokens",
                self.model
            )));
        }
        let count = dropped.iter().filter(|d| **d).count() as u32;
        Ok((count, total, Edit::Drop(dropped)))
    }

    /// Cuts text out of the middle of the longest trimmable message until
    /// the request fits, then the next longest. System messages, and unless
    /// configured otherwise the newest user message, are never cut. Returns
    /// how many messages were cut, the tokens left, and their new content.
    fn truncate_middle(
        &self,
        messages: &[Msg],
        budget: u32,
        mut total: u32,
        counts: Vec<MessageTokens>,
        config: &Config,
    ) -> Result<(u32, u32, Edit), ApiError> {
        let newest_user = messages.iter().rposition(Msg::is_user);
        let protected = |i: usize, m: &Msg| m.is_system() || (config.protect_latest_user && Some(i) == newest_user);

        // Every text piece that may be cut, with its original text.
        let mut pieces: Vec<Piece> = Vec::new();
        for (i, (message, count)) in messages.iter().zip(counts).enumerate() {
            if protected(i, message) {
                continue;
            }
            for (p, (text, tokens)) in message.message.content.texts().into_iter().zip(count.pieces).enumerate() {
                pieces.push(Piece {
                    message: i,
                    piece: p,
                    original: text.to_string(),
                    kept: text.chars().count(),
                    tokens,
                });
            }
        }
        let marker_tokens = self.text(&config.marker);
        // The new content of each message cut, in the order first cut.
        let mut cut: Vec<(usize, Content)> = Vec::new();
        // Each round shrinks one piece; the cap only guards against a
        // tokenizer that never converges.
        let mut rounds = 0;
        while total > budget && rounds < 64 + 8 * pieces.len() {
            rounds += 1;
            let Some(longest) = pieces.iter_mut().filter(|p| p.kept > 0).max_by_key(|p| p.tokens) else {
                break;
            };
            let excess = total - budget;
            // Keep the share of characters the remaining tokens allow.
            let target = longest.tokens.saturating_sub(excess + marker_tokens);
            let proportional = (longest.kept as u64 * u64::from(target) / u64::from(longest.tokens.max(1))) as usize;
            // Always make progress, even when the estimate is off.
            let kept = proportional.min(longest.kept - (longest.kept / 20).max(1));
            let text = cut_middle(&longest.original, kept, &config.marker);
            let tokens = self.text(&text);
            total = total - longest.tokens + tokens;
            longest.tokens = tokens;
            longest.kept = kept;
            let at = match cut.iter().position(|(i, _)| *i == longest.message) {
                Some(at) => at,
                None => {
                    cut.push((longest.message, messages[longest.message].message.content.clone()));
                    cut.len() - 1
                }
            };
            cut[at].1.set_text(longest.piece, text);
        }
        if total > budget {
            return Err(too_long(format!(
                "even with every trimmable message cut, the request needs {total} tokens; \
                 the input budget for {} is {budget} tokens",
                self.model
            )));
        }
        Ok((cut.len() as u32, total, Edit::Cut(cut)))
    }
}

/// A message's tokens: the frame (overhead, name, tool calls) and each text
/// piece of its content.
struct MessageTokens {
    frame: u32,
    pieces: Vec<u32>,
}

impl MessageTokens {
    fn total(&self) -> u32 {
        self.frame + self.pieces.iter().sum::<u32>()
    }
}

/// A text piece `truncate-middle` may cut.
struct Piece {
    message: usize,
    piece: usize,
    original: String,
    /// Characters of `original` still kept.
    kept: usize,
    tokens: u32,
}

/// Where the newest user turn starts: the last user message, or failing
/// that the last message that is not a system message.
fn newest_turn_start(messages: &[Msg]) -> usize {
    messages
        .iter()
        .rposition(Msg::is_user)
        .or_else(|| messages.iter().rposition(|m| !m.is_system()))
        .unwrap_or(messages.len())
}

/// `text` with all but `kept` characters cut from its middle, and the marker
/// where they were.
fn cut_middle(text: &str, kept: usize, marker: &str) -> String {
    let head = kept.div_ceil(2);
    let tail = kept - head;
    let chars = text.chars().count();
    let tail_start = text.char_indices().nth(chars - tail).map_or(text.len(), |(i, _)| i);
    let head_end = text.char_indices().nth(head).map_or(text.len(), |(i, _)| i);
    format!("{}{marker}{}", &text[..head_end], &text[tail_start..])
}

export_plugin!(ContextTrim);

#[cfg(test)]
mod tests;
