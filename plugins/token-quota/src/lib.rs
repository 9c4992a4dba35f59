//! Request and token quotas in time windows, shared by every replica
//! through the gateway's state store (`sluice:plugin/state`; the
//! GatewayPlugin needs `state: {}`).
//!
//! Each request reserves, in one atomic call for all the rules that apply,
//! an estimate: its body's size in bytes as the input (no token is shorter
//! than a byte) plus the output it asks for (`max_completion_tokens`/
//! `max_tokens`, else `defaultMaxTokens`). Only a request that estimate
//! would refuse has its input counted exactly by the gateway, and is tried
//! once more. A rule that would pass its limit refuses the
//! request with OpenAI's 429 (`rate_limit_exceeded`, `retry-after`, the
//! `x-ratelimit-*` headers) and nothing is counted. When the response ends,
//! the reservation is committed with the usage the upstream reported (by
//! the gateway, which the plugin hands it to, unless an output cap has the
//! plugin watch the stream); a
//! response without usage (a stream the client abandoned) keeps the
//! estimate, and a failed upstream call counts the request but no tokens.
//! The estimate overshoots the real input (every text is counted, tool
//! calls and definitions by their bytes, and a token is never more than its
//! bytes; image and audio parts are not counted) and bounds the output the
//! client asked for, so only a request that names no output limit and produces
//! more than `defaultMaxTokens` can take a window past its limit, by that
//! excess.

use serde::Deserialize;
use serde_json::{Value, json};
use sluice_plugin_sdk::ModelPattern;
use sluice_plugin_sdk::prelude::*;
use sluice_plugin_sdk::state::{self, Check, Reservation, Reserved, Standing, StateError, UsageWeights, Window};

/// Tokens of chat format per message (role and delimiters), and priming
/// the reply, as OpenAI's cookbook counts them: part of the input estimate.
const MESSAGE_OVERHEAD_TOKENS: u64 = 4;
const REPLY_PRIMING_TOKENS: u64 = 3;
/// The checks one `reserve` may carry (the gateway's default cap).
const MAX_RULES: usize = 16;
/// A key part longer than this is named by its SHA-256 instead.
const LONG_VALUE_BYTES: usize = 40;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    rules: Vec<Rule>,
    /// Count and report what would be refused, and refuse nothing.
    #[serde(default)]
    shadow: bool,
    /// The output a request that names no limit is assumed to ask for.
    #[serde(default = "default_max_tokens")]
    default_max_tokens: u64,
    /// Ends a stream once its output passes this many tokens (counted by
    /// the gateway as the events go by), with an OpenAI-shaped error event
    /// and `[DONE]`: never a dropped connection. Responses that are not
    /// streamed are not cut.
    #[serde(default)]
    max_output_tokens: Option<u64>,
}

fn default_max_tokens() -> u64 {
    1024
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Rule {
    /// Names the rule in keys, logs and errors: `[a-z0-9-]`, at most 64.
    name: String,
    limit: u64,
    window: WindowSpec,
    counts: Counts,
    /// With `counts: weightedTokens`, what one input and one output token
    /// count, e.g. output ×4.
    #[serde(default)]
    weights: Weights,
    /// Whose quota: one counter per distinct value of these (none: one
    /// counter for every request the rule applies to).
    #[serde(default)]
    per: Vec<KeyPart>,
    /// The models the rule applies to (default: all).
    #[serde(default)]
    models: Vec<ModelPattern>,
    /// The consumers it applies to, as the auth phase names them (default:
    /// all, anonymous requests included).
    #[serde(default)]
    consumers: Vec<String>,
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
enum WindowSpec {
    /// Seconds, aligned to the Unix epoch (86400: the UTC day).
    Fixed(u32),
    /// The last this many seconds.
    Sliding(u32),
    /// The UTC calendar month.
    CalendarMonth,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
enum Counts {
    Requests,
    Tokens,
    InputTokens,
    OutputTokens,
    WeightedTokens,
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Weights {
    #[serde(default = "one")]
    input: u64,
    #[serde(default = "one")]
    output: u64,
}

impl Default for Weights {
    fn default() -> Self {
        Weights { input: 1, output: 1 }
    }
}

fn one() -> u64 {
    1
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
enum KeyPart {
    /// The consumer the auth phase named; `anonymous` without one.
    Consumer,
    Model,
    Route,
    /// A header the auth phase owns (e.g. one the auth plugin sets from a
    /// JWT claim): a header clients may set would let them pick a quota.
    Header(String),
}

/// Input and output tokens, estimated or reported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Tokens {
    input: u64,
    output: u64,
}

impl Counts {
    /// What one request counts: the same weights the gateway settles a
    /// response's usage by.
    fn usage_weights(self, weights: Weights) -> UsageWeights {
        let (request, input, output) = match self {
            Counts::Requests => (1, 0, 0),
            Counts::Tokens => (0, 1, 1),
            Counts::InputTokens => (0, 1, 0),
            Counts::OutputTokens => (0, 0, 1),
            Counts::WeightedTokens => (0, weights.input, weights.output),
        };
        UsageWeights { request, input, output }
    }

    fn amount(self, weights: Weights, tokens: Tokens) -> u64 {
        let w = self.usage_weights(weights);
        w.request
            .saturating_add(w.input.saturating_mul(tokens.input))
            .saturating_add(w.output.saturating_mul(tokens.output))
    }

    fn is_requests(self) -> bool {
        self == Counts::Requests
    }
}

struct TokenQuota {
    config: Config,
}

/// A request's reservation, from its request hook to its response's end.
#[derive(Default)]
struct Pending {
    reservation: Option<Reservation>,
    /// The rules it was made for, by index into the config, in order.
    rules: Vec<usize>,
    /// The request's model, estimate, and the output streamed so far.
    model: String,
    estimate: Tokens,
    streamed_output: u64,
    /// Whether the stream was ended at `maxOutputTokens`.
    cut: bool,
}

impl Plugin for TokenQuota {
    const NAME: &'static str = "token-quota";
    type Config = Config;
    type State = Pending;

    fn new(config: Config) -> Result<Self, String> {
        if config.rules.is_empty() {
            return Err("`rules` is empty: add at least one".into());
        }
        if config.rules.len() > MAX_RULES {
            return Err(format!("{} rules are more than {MAX_RULES}", config.rules.len()));
        }
        for (i, rule) in config.rules.iter().enumerate() {
            let valid_name = !rule.name.is_empty()
                && rule.name.len() <= 64
                && rule.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if !valid_name {
                return Err(format!("rules[{i}].name must be 1 to 64 of a-z, 0-9 and -"));
            }
            if config.rules[..i].iter().any(|other| other.name == rule.name) {
                return Err(format!("rules[{i}].name `{}` is used twice", rule.name));
            }
            if let WindowSpec::Fixed(0) | WindowSpec::Sliding(0) = rule.window {
                return Err(format!("rules[{i}] ({}): a window of 0 seconds", rule.name));
            }
            if rule.weights.input == 0 && rule.weights.output == 0 {
                return Err(format!("rules[{i}] ({}): both weights are 0", rule.name));
            }
        }
        Ok(TokenQuota { config })
    }

    fn hooks(&self) -> Hooks {
        // Without an output cap the gateway settles the reservation by the
        // response's usage: no response hook, so the instance ends with the
        // request hook instead of being held for the whole response. A cap
        // must see the stream event by event, and commits itself.
        match self.config.max_output_tokens {
            Some(_) => Hooks::REQUEST | Hooks::RESPONSE_CHUNK | Hooks::RESPONSE_END,
            None => Hooks::REQUEST,
        }
    }

    fn on_chunk(&self, data: &str, pending: &mut Pending) -> ChunkAction {
        let Some(cap) = self.config.max_output_tokens else { return ChunkAction::Pass };
        if pending.cut {
            return ChunkAction::Drop;
        }
        let Ok(chunk) = serde_json::from_str::<Value>(data) else { return ChunkAction::Pass };
        let text: u64 = chunk["choices"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|choice| choice["delta"]["content"].as_str())
            .map(|text| u64::from(host::count_tokens(&pending.model, text)))
            .sum();
        pending.streamed_output = pending.streamed_output.saturating_add(text);
        if pending.streamed_output <= cap {
            return ChunkAction::Pass;
        }
        pending.cut = true;
        let error = json!({"error": {
            "message": format!("The response passed this route's limit of {cap} output tokens and was ended."),
            "type": "tokens", "param": null, "code": "output_limit_exceeded"}});
        ChunkAction::Stop(Some(error.to_string()))
    }

    fn on_request(&self, req: &Request, pending: &mut Pending) -> Result<Action, ApiError> {
        let (model, consumer) = (req.model(), req.consumer());
        // The cap counts a stream's output whatever the rules.
        *pending = Pending { model: model.clone(), ..Pending::default() };
        let rules: Vec<usize> = (0..self.config.rules.len())
            .filter(|&i| self.config.rules[i].applies(&model, consumer.as_deref()))
            .collect();
        if rules.is_empty() {
            return Ok(Action::Continue);
        }
        let counts_tokens = rules.iter().any(|&i| !self.config.rules[i].counts.is_requests());
        // First the body's size as the input: no token in it is shorter
        // than a byte, so it never undercounts, and counting costs nothing.
        // Only a request it would refuse is counted exactly, and tried once
        // more: a request near a limit pays for the count, no other does.
        let mut estimate = if counts_tokens { self.estimate(req, false)? } else { Tokens::default() };
        let keys: Vec<String> =
            rules.iter().map(|&i| self.config.rules[i].key(req, &model, consumer.as_deref())).collect();
        let mut reserved = state::reserve(&self.checks(&rules, &keys, estimate)).unwrap_or_else(|e| failed(&e));
        if counts_tokens && matches!(reserved, Reserved::Refused { .. }) {
            let exact = self.estimate(req, true)?;
            if exact.input < estimate.input {
                estimate = exact;
                reserved = state::reserve(&self.checks(&rules, &keys, estimate)).unwrap_or_else(|e| failed(&e));
            }
        }
        match reserved {
            Reserved::Granted(reservation, standings) => {
                let rules_and_standings: Vec<(&Rule, Standing)> =
                    rules.iter().zip(standings).map(|(&i, s)| (&self.config.rules[i], self.real(i, s))).collect();
                if self.config.shadow {
                    self.report_shadow(req, &rules_and_standings);
                }
                for (name, value) in rate_limit_headers(&rules_and_standings, now_ms()) {
                    req.set_response_header(&name, &value);
                }
                if self.config.max_output_tokens.is_none() {
                    let weights: Vec<UsageWeights> = rules
                        .iter()
                        .map(|&i| self.config.rules[i].counts.usage_weights(self.config.rules[i].weights))
                        .collect();
                    reservation.settle_at_end(&weights).unwrap_or_else(|e| failed(&e));
                    return Ok(Action::Continue);
                }
                *pending = Pending { reservation: Some(reservation), rules, model, estimate, ..Pending::default() };
                Ok(Action::Continue)
            }
            Reserved::Refused { tightest, standings } => {
                let rules_and_standings: Vec<(&Rule, Standing)> =
                    rules.iter().zip(standings).map(|(&i, s)| (&self.config.rules[i], s)).collect();
                Err(refusal(&rules_and_standings, tightest, now_ms()))
            }
        }
    }

    fn on_end(&self, summary: &ResponseSummary, pending: &mut Pending) {
        let Some(reservation) = pending.reservation.take() else { return };
        let actual = match summary.usage {
            Some(usage) => Tokens { input: usage.prompt_tokens.into(), output: usage.completion_tokens.into() },
            // Ended at the cap: what was streamed, with the estimated input
            // (the upstream's usage came after the end, if at all).
            None if pending.cut => Tokens { input: pending.estimate.input, output: pending.streamed_output },
            // The upstream failed: the request counts, no tokens were used.
            None if summary.status >= 400 => Tokens::default(),
            // No usage (a stream the client left): the estimate stands.
            None => return drop(reservation),
        };
        let amounts: Vec<u64> = pending
            .rules
            .iter()
            .map(|&i| {
                let rule = &self.config.rules[i];
                rule.counts.amount(rule.weights, actual)
            })
            .collect();
        if let Err(e) = reservation.commit(&amounts) {
            // The response is gone; the estimate stands.
            host::log(
                LogLevel::Warn,
                "token-quota: the usage could not be committed",
                &[("error", &state::describe(&e))],
            );
        }
    }
}

impl TokenQuota {
    /// The checks of `rules` (with their counters' `keys`) for `estimate`.
    fn checks(&self, rules: &[usize], keys: &[String], estimate: Tokens) -> Vec<Check> {
        rules
            .iter()
            .zip(keys)
            .map(|(&i, key)| {
                let rule = &self.config.rules[i];
                Check {
                    key: key.clone(),
                    window: rule.window.into(),
                    // In shadow mode nothing is refused: the real limit is
                    // compared after.
                    limit: if self.config.shadow { u64::MAX } else { rule.limit },
                    amount: rule.counts.amount(rule.weights, estimate),
                }
            })
            .collect()
    }

    /// The input (the body's size, or with `exact`, every text counted by
    /// the gateway with the chat format's overhead) and the output the
    /// request asks for.
    fn estimate(&self, req: &Request, exact: bool) -> Result<Tokens, ApiError> {
        let model = req.model();
        let input = if !exact {
            // The chat format's tokens are not in the body's bytes.
            let messages = if req.is_chat_completion() { u64::from(req.message_count()?) } else { 0 };
            req.body_size() + MESSAGE_OVERHEAD_TOKENS * messages + REPLY_PRIMING_TOKENS
        } else if req.is_chat_completion() {
            let messages = req.messages()?;
            let texts: u64 = messages
                .iter()
                .map(|m| {
                    let content: u64 =
                        m.content.texts().iter().map(|text| u64::from(host::count_tokens(&model, text))).sum();
                    // Tool calls, names: bounded by their bytes, uncounted.
                    let extra = if m.extra == "{}" { 0 } else { m.extra.len() as u64 };
                    content + extra
                })
                .sum();
            // Tool definitions count as input too, bounded by their bytes.
            let tools = req.field_json("tools").map_or(0, |tools| tools.len() as u64);
            texts + tools + MESSAGE_OVERHEAD_TOKENS * messages.len() as u64 + REPLY_PRIMING_TOKENS
        } else {
            // Another endpoint's body: no text in it has more tokens than
            // bytes.
            req.body_size()
        };
        let output = ["max_completion_tokens", "max_tokens", "max_output_tokens"]
            .iter()
            .find_map(|name| req.field::<Value>(name).ok().flatten().and_then(|v| v.as_u64()))
            .unwrap_or(self.config.default_max_tokens);
        Ok(Tokens { input, output })
    }

    /// A standing as the rule's real limit sees it (in shadow mode the
    /// store was given no limit).
    fn real(&self, rule: usize, standing: Standing) -> Standing {
        let limit = self.config.rules[rule].limit;
        Standing { limit, remaining: limit.saturating_sub(standing.used), ..standing }
    }

    fn report_shadow(&self, req: &Request, rules: &[(&Rule, Standing)]) {
        let over: Vec<&str> =
            rules.iter().filter(|(rule, s)| s.used > rule.limit).map(|(rule, _)| rule.name.as_str()).collect();
        if over.is_empty() {
            return;
        }
        let names = over.join(",");
        host::log(LogLevel::Info, "token-quota: would refuse (shadow mode)", &[("rules", &names)]);
        req.set_response_header("x-sluice-quota-would-refuse", &names);
    }
}

impl Rule {
    fn applies(&self, model: &str, consumer: Option<&str>) -> bool {
        let model_ok = self.models.is_empty() || self.models.iter().any(|p| p.matches(model));
        let consumer_ok = self.consumers.is_empty() || consumer.is_some_and(|c| self.consumers.iter().any(|x| x == c));
        model_ok && consumer_ok
    }

    /// The counter's key: the rule's name and each part's value, each
    /// length-prefixed so no two sets of values make the same key.
    fn key(&self, req: &Request, model: &str, consumer: Option<&str>) -> String {
        let mut key = self.name.clone();
        for part in &self.per {
            let value = match part {
                KeyPart::Consumer => consumer.unwrap_or("anonymous").to_string(),
                KeyPart::Model => model.to_string(),
                KeyPart::Route => req.route(),
                KeyPart::Header(name) => req.header(name).unwrap_or_default(),
            };
            // Keys are capped by the gateway (256 bytes): a long value is
            // named by its digest, so long values still count apart.
            let value = if value.len() > LONG_VALUE_BYTES { digest(&value) } else { value };
            key.push_str(&format!("|{}:{value}", value.len()));
        }
        key
    }
}

impl From<WindowSpec> for Window {
    fn from(window: WindowSpec) -> Window {
        match window {
            WindowSpec::Fixed(seconds) => Window::Fixed(seconds),
            WindowSpec::Sliding(seconds) => Window::Sliding(seconds),
            WindowSpec::CalendarMonth => Window::CalendarMonth,
        }
    }
}

/// `#` and the first 128 bits of the value's SHA-256, in hex.
fn digest(value: &str) -> String {
    use sha2::Digest as _;
    let hash = sha2::Sha256::digest(value.as_bytes());
    let hex: String = hash[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("#{hex}")
}

fn now_ms() -> u64 {
    host::now_unix_ms()
}

/// A store that cannot answer, or a cap past which nothing is counted:
/// the plugin fails, and its failure policy decides (`Closed`: the request
/// is refused; `Open`: it goes on, uncounted, and the gateway logs it).
fn failed(error: &StateError) -> ! {
    panic!("token-quota: the state store failed: {}", state::describe(error))
}

/// OpenAI's duration format for `x-ratelimit-reset-*`: `1s`, `6m0s`,
/// `1h2m3s`, `250ms`.
fn duration(ms: u64) -> String {
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let seconds = ms.div_ceil(1000);
    let (h, m, s) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m{s}s"),
    }
}

/// OpenAI's headers: for requests and for tokens, the applying rule with
/// the least remaining.
fn rate_limit_headers(rules: &[(&Rule, Standing)], now: u64) -> Vec<(String, String)> {
    let mut headers = Vec::new();
    for (kind, requests) in [("requests", true), ("tokens", false)] {
        let tightest =
            rules.iter().filter(|(rule, _)| rule.counts.is_requests() == requests).min_by_key(|(_, s)| s.remaining);
        if let Some((_, s)) = tightest {
            headers.push((format!("x-ratelimit-limit-{kind}"), s.limit.to_string()));
            headers.push((format!("x-ratelimit-remaining-{kind}"), s.remaining.to_string()));
            headers.push((format!("x-ratelimit-reset-{kind}"), duration(s.reset_unix_ms.saturating_sub(now))));
        }
    }
    headers
}

/// The 429, naming the rule whose window ends last among those refusing.
fn refusal(rules: &[(&Rule, Standing)], tightest: usize, now: u64) -> ApiError {
    let Some((rule, standing)) = rules.get(tightest) else {
        return ApiError::new(429, "rate_limit_exceeded", "Rate limit reached");
    };
    let kind = if rule.counts.is_requests() { "requests" } else { "tokens" };
    let wait_ms = standing.reset_unix_ms.saturating_sub(now);
    let message = format!(
        "Rate limit reached for {kind} ({}): limit {}, used {}. Please try again in {}.",
        rule.name,
        standing.limit,
        standing.used,
        duration(wait_ms)
    );
    let mut error = ApiError::new(429, "rate_limit_exceeded", message).with_type(kind);
    error = error.with_header("retry-after", &wait_ms.div_ceil(1000).max(1).to_string());
    for (name, value) in rate_limit_headers(rules, now) {
        error = error.with_header(&name, &value);
    }
    error
}

export_plugin!(TokenQuota);

#[cfg(test)]
mod tests;
