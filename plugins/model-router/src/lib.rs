//! Routes a request that asks for an alias (`model: auto`) to a real model:
//! by rules over the prompt (its size in tokens, keywords in the last user
//! message, the consumer), then, if none matched, by semantic similarity of
//! the last user message to example prompts, embedded by an
//! OpenAI-compatible `/v1/embeddings` endpoint; else to the default. The
//! decision is `request.set-model`: the gateway then serves the request as
//! if the client had asked for that model (on this route, or on the route
//! of the namespace that serves it, with that route's chain and backends).
//!
//! Requests for any other model pass untouched. An embeddings call that
//! fails routes to the default, counted: it never fails the request.
//! See README.md for the config, and why semantic routing wants
//! `isolation: Reused`.

mod semantic;
#[cfg(test)]
mod tests;

use std::cell::{Cell, OnceCell, RefCell};

use serde::Deserialize;
use sluice_plugin_sdk::metrics::{self, Metric};
use sluice_plugin_sdk::prelude::*;

use semantic::{EmbeddingsConfig, Semantic, SemanticRouteConfig};

/// The metric counting decisions, by model and reason.
pub(crate) const DECISIONS: &str = "model_router_decisions";
/// The metric counting failed embeddings calls, by kind.
pub(crate) const EMBEDDING_ERRORS: &str = "model_router_embedding_errors";
/// The histogram of the time the semantic step waited for embeddings.
pub(crate) const EMBEDDING_SECONDS: &str = "model_router_embedding_seconds";
/// The metric counting how often the examples were embedded (once per
/// instance that saw a semantic decision: per request with `PerRequest`).
pub(crate) const EXAMPLE_EMBEDDINGS: &str = "model_router_example_embeddings";

/// Why a model was chosen: the `reason` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    Rule,
    Semantic,
    Default,
    /// The semantic step failed (the embeddings endpoint), so the default.
    Error,
}

impl Reason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Reason::Rule => "rule",
            Reason::Semantic => "semantic",
            Reason::Default => "default",
            Reason::Error => "error",
        }
    }
}

// No `Debug` here or below: it would print the embeddings key.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    /// The models this router decides for; requests for others pass.
    #[serde(default = "default_aliases")]
    aliases: Vec<String>,
    /// First match wins.
    #[serde(default)]
    rules: Vec<RuleConfig>,
    #[serde(default)]
    semantic: Option<SemanticConfig>,
    /// When nothing matches.
    default: String,
    /// A response header naming the model chosen.
    #[serde(default)]
    header: Option<String>,
}

fn default_aliases() -> Vec<String> {
    vec!["auto".to_string()]
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RuleConfig {
    model: String,
    when: When,
}

/// A rule's conditions: every one given must hold.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct When {
    #[serde(default)]
    max_prompt_tokens: Option<u32>,
    #[serde(default)]
    min_prompt_tokens: Option<u32>,
    #[serde(default)]
    keywords: Option<Vec<String>>,
    #[serde(default)]
    consumers: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SemanticConfig {
    embeddings: EmbeddingsConfig,
    routes: Vec<SemanticRouteConfig>,
    threshold: f64,
}

/// A rule, checked.
#[derive(Debug)]
struct Rule {
    model: String,
    max_prompt_tokens: Option<u32>,
    min_prompt_tokens: Option<u32>,
    /// Lower-cased.
    keywords: Vec<String>,
    consumers: Vec<String>,
}

struct ModelRouter {
    aliases: Vec<String>,
    rules: Vec<Rule>,
    semantic: Option<Semantic>,
    default: String,
    header: Option<String>,
}

impl Plugin for ModelRouter {
    const NAME: &'static str = "model-router";
    type Config = Config;
    type State = ();

    fn new(config: Config) -> Result<Self, String> {
        if config.aliases.is_empty() {
            return Err("`aliases` is empty: the router would decide for no request".into());
        }
        if let Some(i) = config.aliases.iter().position(|a| a.trim().is_empty()) {
            return Err(format!("`aliases[{i}]` is empty"));
        }
        let is_alias = |model: &str| config.aliases.iter().any(|a| a == model);
        let check_model = |field: &str, model: &str| {
            if model.trim().is_empty() {
                Err(format!("`{field}` is empty"))
            } else if is_alias(model) {
                Err(format!("`{field}` is one of the `aliases`: a request routed there would not be decided"))
            } else {
                Ok(())
            }
        };
        check_model("default", &config.default)?;
        let rules = config
            .rules
            .into_iter()
            .enumerate()
            .map(|(i, rule)| {
                check_model(&format!("rules[{i}].model"), &rule.model)?;
                Rule::new(i, rule)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let semantic = match config.semantic {
            None => None,
            Some(semantic) => {
                for (i, route) in semantic.routes.iter().enumerate() {
                    check_model(&format!("semantic.routes[{i}].model"), &route.model)?;
                }
                Some(Semantic::new(semantic.embeddings, semantic.routes, semantic.threshold)?)
            }
        };
        let header = match config.header {
            None => None,
            Some(header) if is_token(&header) => Some(header.to_ascii_lowercase()),
            Some(_) => return Err("`header` is not a valid HTTP header name".into()),
        };
        let router = ModelRouter { aliases: config.aliases, rules, semantic, default: config.default, header };
        router.declare_metrics()?;
        Ok(router)
    }

    fn on_request(&self, req: &Request, _: &mut ()) -> Result<Action, ApiError> {
        let asked = req.model();
        if !self.aliases.contains(&asked) {
            return Ok(Action::Continue);
        }
        if !req.is_chat_completion() {
            return Err(ApiError::unsupported_endpoint(Self::NAME, &req.path_only(), &["/v1/chat/completions"]));
        }
        let (model, reason) = self.decide(&Prompt::new(req))?;
        req.set_model(model);
        if let Some(header) = &self.header {
            req.set_response_header(header, model);
        }
        metrics::add(DECISIONS, &[model, reason.as_str()], 1);
        Ok(Action::Continue)
    }
}

impl ModelRouter {
    /// Rules, then the semantic routes, then the default.
    fn decide(&self, prompt: &Prompt) -> Result<(&str, Reason), ApiError> {
        for rule in &self.rules {
            if rule.matches(prompt)? {
                return Ok((&rule.model, Reason::Rule));
            }
        }
        if let Some(semantic) = &self.semantic {
            let text = prompt.last_user()?;
            match semantic.decide(text) {
                Ok(Some(model)) => return Ok((model, Reason::Semantic)),
                Ok(None) => {}
                Err(failure) => {
                    metrics::add(EMBEDDING_ERRORS, &[failure.kind], 1);
                    host::log(
                        LogLevel::Warn,
                        "the embeddings call failed: routing to the default model",
                        &[("error", failure.kind), ("detail", &failure.detail), ("model", &self.default)],
                    );
                    return Ok((&self.default, Reason::Error));
                }
            }
        }
        Ok((&self.default, Reason::Default))
    }

    /// Every model a decision can name: the `model` label's values.
    fn models(&self) -> Vec<&str> {
        let mut models: Vec<&str> = vec![&self.default];
        models.extend(self.rules.iter().map(|r| r.model.as_str()));
        if let Some(semantic) = &self.semantic {
            models.extend(semantic.models());
        }
        let mut distinct: Vec<&str> = Vec::new();
        for model in models {
            if !distinct.contains(&model) {
                distinct.push(model);
            }
        }
        distinct
    }

    fn declare_metrics(&self) -> Result<(), String> {
        let models = self.models().len().clamp(1, 64) as u32;
        metrics::declare(&[
            Metric::counter(
                DECISIONS,
                "Requests for an alias, by the model chosen and why (rule, semantic, default, error)",
            )
            .labels(&["model", "reason"])
            .max_values(models.max(4)),
            Metric::counter(EMBEDDING_ERRORS, "Embeddings calls that failed, so the default model was chosen, by kind")
                .labels(&["error"])
                .max_values(6),
            Metric::histogram(EMBEDDING_SECONDS, "Time the semantic step waited for the embeddings endpoint"),
            Metric::counter(EXAMPLE_EMBEDDINGS, "Times the example prompts were embedded (once per instance)"),
        ])
    }
}

impl Rule {
    fn new(i: usize, config: RuleConfig) -> Result<Rule, String> {
        let When { max_prompt_tokens, min_prompt_tokens, keywords, consumers } = config.when;
        if max_prompt_tokens.is_none() && min_prompt_tokens.is_none() && keywords.is_none() && consumers.is_none() {
            return Err(format!("`rules[{i}].when` names no condition"));
        }
        if let (Some(min), Some(max)) = (min_prompt_tokens, max_prompt_tokens)
            && min > max
        {
            return Err(format!("`rules[{i}].when.minPromptTokens` is above its `maxPromptTokens`: it never matches"));
        }
        let non_empty = |field: &str, list: Option<Vec<String>>| -> Result<Vec<String>, String> {
            let Some(list) = list else { return Ok(Vec::new()) };
            if list.is_empty() {
                return Err(format!("`rules[{i}].when.{field}` is empty: it never matches"));
            }
            if let Some(j) = list.iter().position(|item| item.trim().is_empty()) {
                return Err(format!("`rules[{i}].when.{field}[{j}]` is empty"));
            }
            Ok(list)
        };
        let keywords = non_empty("keywords", keywords)?.iter().map(|k| k.to_lowercase()).collect();
        let consumers = non_empty("consumers", consumers)?;
        Ok(Rule { model: config.model, max_prompt_tokens, min_prompt_tokens, keywords, consumers })
    }

    /// Whether every condition holds, the cheapest first: the consumer, the
    /// body's size (no text has more tokens than bytes), keywords, tokens.
    fn matches(&self, prompt: &Prompt) -> Result<bool, ApiError> {
        if !self.consumers.is_empty() && !prompt.consumer().is_some_and(|c| self.consumers.iter().any(|k| k == c)) {
            return Ok(false);
        }
        if let Some(min) = self.min_prompt_tokens
            && prompt.body_size() < u64::from(min)
        {
            return Ok(false);
        }
        if !self.keywords.is_empty() {
            let text = prompt.last_user_lower()?;
            if !self.keywords.iter().any(|k| text.contains(k.as_str())) {
                return Ok(false);
            }
        }
        if let Some(max) = self.max_prompt_tokens
            && prompt.body_size() > u64::from(max)
            && prompt.tokens(&self.model)? > max
        {
            return Ok(false);
        }
        if let Some(min) = self.min_prompt_tokens
            && prompt.tokens(&self.model)? < min
        {
            return Ok(false);
        }
        Ok(true)
    }
}

/// The request as the rules read it, each part read from the host at most
/// once, and only if a rule asks.
struct Prompt<'r> {
    req: &'r Request,
    messages: OnceCell<Vec<Message>>,
    body_size: Cell<Option<u64>>,
    consumer: OnceCell<Option<String>>,
    last_user: OnceCell<String>,
    last_user_lower: OnceCell<String>,
    /// Tokens of the whole prompt, by the model counted for.
    tokens: RefCell<Vec<(String, u32)>>,
}

impl<'r> Prompt<'r> {
    fn new(req: &'r Request) -> Prompt<'r> {
        Prompt {
            req,
            messages: OnceCell::new(),
            body_size: Cell::new(None),
            consumer: OnceCell::new(),
            last_user: OnceCell::new(),
            last_user_lower: OnceCell::new(),
            tokens: RefCell::new(Vec::new()),
        }
    }

    fn messages(&self) -> Result<&[Message], ApiError> {
        if let Some(messages) = self.messages.get() {
            return Ok(messages);
        }
        let messages = self.req.messages()?;
        Ok(self.messages.get_or_init(|| messages))
    }

    fn body_size(&self) -> u64 {
        if let Some(size) = self.body_size.get() {
            return size;
        }
        let size = self.req.body_size();
        self.body_size.set(Some(size));
        size
    }

    fn consumer(&self) -> Option<&str> {
        self.consumer.get_or_init(|| self.req.consumer()).as_deref()
    }

    /// The text of the last user message (its text parts joined by
    /// newlines); empty if there is none.
    fn last_user(&self) -> Result<&str, ApiError> {
        if let Some(text) = self.last_user.get() {
            return Ok(text);
        }
        let text = self.messages()?.iter().rev().find(|m| m.is_user()).map(|m| m.content.text().into_owned());
        Ok(self.last_user.get_or_init(|| text.unwrap_or_default()))
    }

    fn last_user_lower(&self) -> Result<&str, ApiError> {
        if let Some(text) = self.last_user_lower.get() {
            return Ok(text);
        }
        let lower = self.last_user()?.to_lowercase();
        Ok(self.last_user_lower.get_or_init(|| lower))
    }

    /// The prompt's tokens for `model`: the text of every message, counted
    /// by the gateway (`count-tokens`) in one call per model.
    fn tokens(&self, model: &str) -> Result<u32, ApiError> {
        if let Some((_, n)) = self.tokens.borrow().iter().find(|(m, _)| m == model) {
            return Ok(*n);
        }
        let text = self.messages()?.iter().map(|m| m.content.text()).collect::<Vec<_>>().join("\n");
        let n = if text.is_empty() { 0 } else { host::count_tokens(model, &text) };
        self.tokens.borrow_mut().push((model.to_string(), n));
        Ok(n)
    }
}

/// An HTTP header name (RFC 9110 token).
fn is_token(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

export_plugin!(ModelRouter);
