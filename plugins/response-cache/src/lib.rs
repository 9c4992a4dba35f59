//! An exact-match cache of chat completions, kept in the gateway's shared
//! state (`sluice:plugin/state`; the GatewayPlugin needs `state: {}`), so
//! replicas sharing a Redis share it.
//!
//! The key is a digest of the request's `keyFields` (the model, the
//! messages and every field that changes the answer, by default), with
//! object members sorted so that the order a client wrote them in does not
//! matter, under the route and, unless `scope: route` is asked for, the
//! consumer the auth phase named: one consumer never receives another's
//! answer, and a request with no consumer is not cached at all.
//!
//! A hit answers at once, as JSON or, for `stream: true`, as the server-sent
//! events the OpenAI SDKs read, whichever way the answer was first given.
//! Only complete 200 chat completions of at most `maxEntryBytes` are kept,
//! for `ttlSeconds`. `Cache-Control: no-store` skips the cache both ways;
//! `no-cache` skips the lookup and stores the fresh answer. Every response
//! says `x-sluice-cache: hit`, `miss` or `bypass`.

use serde::Deserialize;
use serde_json::{Map, Value, json};
use sha2::Digest as _;
use sluice_plugin_sdk::prelude::*;
use sluice_plugin_sdk::state;

const HEADER: &str = "x-sluice-cache";

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    #[serde(default = "default_ttl")]
    ttl_seconds: u64,
    #[serde(default = "default_max_entry")]
    max_entry_bytes: usize,
    #[serde(default)]
    scope: Scope,
    /// The request's top-level fields the key is made of (`model` is always
    /// one). Fields outside it (`user`, `stream`, `stream_options`,
    /// metadata) do not change the key.
    #[serde(default = "default_fields")]
    key_fields: Vec<String>,
}

fn default_ttl() -> u64 {
    300
}

/// The gateway's default cap on one value.
fn default_max_entry() -> usize {
    64 * 1024
}

fn default_fields() -> Vec<String> {
    [
        "messages",
        "temperature",
        "top_p",
        "n",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "seed",
        "tools",
        "tool_choice",
        "response_format",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "reasoning_effort",
    ]
    .map(String::from)
    .to_vec()
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
enum Scope {
    /// Per route and consumer; requests without a consumer are not cached.
    #[default]
    Consumer,
    /// Per route, shared by every caller of it: ask for it only where the
    /// answers hold nothing of one caller's.
    Route,
}

struct ResponseCache {
    config: Config,
}

/// What a miss keeps from its request to its response's end.
#[derive(Default)]
struct Pending {
    /// The entry's key, if the answer is to be stored.
    key: Option<String>,
    /// A whole JSON body, as `response-body` saw it.
    body: Option<Vec<u8>>,
    /// A stream, as its events went by.
    stream: Option<Assembled>,
}

impl Plugin for ResponseCache {
    const NAME: &'static str = "response-cache";
    type Config = Config;
    type State = Pending;

    fn new(config: Config) -> Result<Self, String> {
        if config.ttl_seconds == 0 {
            return Err("`ttlSeconds` is 0: nothing would be kept".into());
        }
        if config.max_entry_bytes == 0 {
            return Err("`maxEntryBytes` is 0: nothing would be kept".into());
        }
        Ok(ResponseCache { config })
    }

    fn hooks(&self) -> Hooks {
        Hooks::REQUEST | Hooks::RESPONSE_BODY | Hooks::RESPONSE_CHUNK | Hooks::RESPONSE_END
    }

    fn on_request(&self, req: &Request, pending: &mut Pending) -> Result<Action, ApiError> {
        let control = req.header("cache-control").unwrap_or_default().to_ascii_lowercase();
        let directive = |name: &str| control.split(',').any(|d| d.trim() == name);
        let Some(key) = self.key(req)?.filter(|_| req.is_chat_completion() && !directive("no-store")) else {
            req.set_response_header(HEADER, "bypass");
            return Ok(Action::Continue);
        };
        let streamed = req.field::<bool>("stream")?.unwrap_or(false);
        if !directive("no-cache") {
            let cached = state::get(&key).unwrap_or_else(|e| failed(&e));
            if let Some(entry) = cached.and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok()) {
                return Ok(hit(&entry, streamed, req.field::<Value>("stream_options")?.as_ref()));
            }
        }
        req.set_response_header(HEADER, "miss");
        *pending = Pending { key: Some(key), body: None, stream: streamed.then(Assembled::default) };
        Ok(Action::Continue)
    }

    fn on_body(&self, body: &[u8], pending: &mut Pending) -> Option<Vec<u8>> {
        if pending.key.is_some() && body.len() <= self.config.max_entry_bytes {
            pending.body = Some(body.to_vec());
        }
        None
    }

    fn on_chunk(&self, data: &str, pending: &mut Pending) -> ChunkAction {
        if let Some(stream) = &mut pending.stream {
            stream.add(data);
        }
        ChunkAction::Pass
    }

    fn on_end(&self, summary: &ResponseSummary, pending: &mut Pending) {
        let Some(key) = pending.key.take() else { return };
        if summary.status != 200 || !summary.completed {
            return;
        }
        let entry = match (pending.body.take(), pending.stream.take()) {
            (Some(body), _) => serde_json::from_slice::<Value>(&body).ok(),
            (None, Some(stream)) => stream.completion(),
            (None, None) => None,
        };
        let Some(entry) = entry.filter(|e| e["object"] == "chat.completion") else { return };
        let bytes = entry.to_string().into_bytes();
        if bytes.len() > self.config.max_entry_bytes {
            return;
        }
        let ttl_ms = self.config.ttl_seconds.saturating_mul(1000);
        if let Err(e) = state::set(&key, &bytes, ttl_ms) {
            // The answer has gone out; the next request is a miss.
            host::log(LogLevel::Warn, "response-cache: not stored", &[("error", &state::describe(&e))]);
        }
    }
}

impl ResponseCache {
    /// `route|consumer|digest`, or `None` when the request is not to be
    /// cached (no consumer to partition by).
    fn key(&self, req: &Request) -> Result<Option<String>, ApiError> {
        let who = match (self.config.scope, req.consumer()) {
            (Scope::Route, _) => "*".to_string(),
            (Scope::Consumer, Some(consumer)) => consumer,
            (Scope::Consumer, None) => return Ok(None),
        };
        let mut fields = Map::new();
        fields.insert("model".into(), req.model().into());
        for name in &self.config.key_fields {
            if let Some(value) = req.field::<Value>(name)? {
                fields.insert(name.clone(), value);
            }
        }
        let normal = normalised(Value::Object(fields)).to_string();
        let digest: String = sha2::Sha256::digest(normal.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        // Length-prefixed, so no route and consumer pair names another's.
        let route = req.route();
        Ok(Some(format!("{}:{route}|{}:{who}|{digest}", route.len(), who.len())))
    }
}

/// `value` with every object's members sorted by name, so two requests
/// that differ only in member order have one key.
fn normalised(value: Value) -> Value {
    match value {
        Value::Object(members) => {
            let mut members: Vec<(String, Value)> = members.into_iter().collect();
            members.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(members.into_iter().map(|(k, v)| (k, normalised(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(normalised).collect()),
        other => other,
    }
}

/// The cached answer, in the shape the request asked for.
fn hit(entry: &Value, streamed: bool, stream_options: Option<&Value>) -> Action {
    if !streamed {
        let headers = [("content-type", "application/json"), (HEADER, "hit")];
        return Action::respond(200, &headers, entry.to_string());
    }
    let with_usage = stream_options.and_then(|o| o["include_usage"].as_bool()).unwrap_or(false);
    let headers = [("content-type", "text/event-stream"), ("cache-control", "no-cache"), (HEADER, "hit")];
    Action::respond(200, &headers, replay(entry, with_usage))
}

/// A completion as the events of a stream: per choice, its message as one
/// delta, then its finish; the usage if asked for; `[DONE]`.
fn replay(entry: &Value, with_usage: bool) -> String {
    let base = |choices: Value| {
        json!({"id": entry["id"], "object": "chat.completion.chunk", "created": entry["created"],
               "model": entry["model"], "choices": choices})
    };
    let mut events = Vec::new();
    for choice in entry["choices"].as_array().into_iter().flatten() {
        let mut delta = choice["message"].clone();
        if let Some(calls) = delta.get_mut("tool_calls").and_then(Value::as_array_mut) {
            for (i, call) in calls.iter_mut().enumerate() {
                call["index"] = i.into();
            }
        }
        events.push(base(json!([{"index": choice["index"], "delta": delta, "finish_reason": null}])));
        events.push(base(json!([{"index": choice["index"], "delta": {}, "finish_reason": choice["finish_reason"]}])));
    }
    if with_usage {
        let mut last = base(json!([]));
        last["usage"] = entry["usage"].clone();
        events.push(last);
    }
    let mut out: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    out.push_str("data: [DONE]\n\n");
    out
}

/// A streamed completion put back together from its chunks: enough to
/// store it and replay it either way.
#[derive(Default)]
struct Assembled {
    head: Option<Value>,
    /// Per choice index: its role, content, finish reason.
    choices: Vec<(String, String, Value)>,
    usage: Value,
    /// A chunk it cannot put back (tool calls, refusals, logprobs): the
    /// stream is not stored.
    unusable: bool,
}

impl Assembled {
    fn add(&mut self, data: &str) {
        if data == "[DONE]" || self.unusable {
            return;
        }
        let Ok(chunk) = serde_json::from_str::<Value>(data) else {
            self.unusable = true;
            return;
        };
        if self.head.is_none() {
            self.head = Some(json!({"id": chunk["id"], "created": chunk["created"], "model": chunk["model"]}));
        }
        if chunk["usage"].is_object() {
            self.usage = chunk["usage"].clone();
        }
        for choice in chunk["choices"].as_array().into_iter().flatten() {
            let delta = &choice["delta"];
            let known = delta.as_object().is_some_and(|d| d.keys().all(|k| k == "role" || k == "content"));
            if !known || !choice["logprobs"].is_null() {
                self.unusable = true;
                return;
            }
            let Some(index) = choice["index"].as_u64().and_then(|i| usize::try_from(i).ok()).filter(|i| *i < 128)
            else {
                self.unusable = true;
                return;
            };
            if self.choices.len() <= index {
                self.choices.resize(index + 1, ("assistant".into(), String::new(), Value::Null));
            }
            let entry = &mut self.choices[index];
            if let Some(role) = delta["role"].as_str() {
                entry.0 = role.to_string();
            }
            if let Some(text) = delta["content"].as_str() {
                entry.1.push_str(text);
            }
            if !choice["finish_reason"].is_null() {
                entry.2 = choice["finish_reason"].clone();
            }
        }
    }

    /// The stream as the completion a JSON request would have had.
    fn completion(self) -> Option<Value> {
        let head = self.head.filter(|_| !self.unusable && !self.choices.is_empty())?;
        if self.choices.iter().any(|(_, _, finish)| finish.is_null()) {
            return None;
        }
        let choices: Vec<Value> = self
            .choices
            .into_iter()
            .enumerate()
            .map(|(index, (role, content, finish))| {
                json!({"index": index, "message": {"role": role, "content": content}, "finish_reason": finish,
                       "logprobs": null})
            })
            .collect();
        let mut completion = json!({"id": head["id"], "object": "chat.completion", "created": head["created"],
            "model": head["model"], "choices": choices});
        if self.usage.is_object() {
            completion["usage"] = self.usage;
        }
        Some(completion)
    }
}

/// A store that cannot answer: the plugin fails, and its failure policy
/// decides (a cache usually fails `Open`: the request goes on uncached).
fn failed(error: &state::StateError) -> ! {
    panic!("response-cache: the state store failed: {}", state::describe(error))
}

export_plugin!(ResponseCache);

#[cfg(test)]
mod tests;
