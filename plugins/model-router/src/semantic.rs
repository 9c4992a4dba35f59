//! Semantic routes: the last user message is embedded by an OpenAI-compatible
//! embeddings endpoint and compared (cosine similarity) with example prompts
//! of each route; the route with the nearest example wins if that example is
//! at least `threshold` similar.
//!
//! The examples are embedded by the first semantic decision an instance
//! makes, in the same call as that request's prompt, and kept in the plugin
//! value for the instance's life: with `isolation: Reused` once per
//! instance, with `PerRequest` (every request a fresh instance) on every
//! request. They hold nothing of any client: only what the config says.

use std::cell::RefCell;
use std::rc::Rc;

use serde::Deserialize;
use serde_json::json;
use sluice_plugin_sdk::outbound::{self, Error};
use sluice_plugin_sdk::{host, metrics};

use crate::{EMBEDDING_SECONDS, EXAMPLE_EMBEDDINGS};

/// Example prompts, over every route: each is sent to the embeddings
/// endpoint when an instance embeds them, and kept in its memory.
pub(crate) const MAX_EXAMPLES: usize = 128;
/// The most text embedded for one example or prompt, in bytes: no text has
/// more tokens than bytes, so this fits every OpenAI embedding model's
/// 8,192-token input. A longer prompt is embedded by its beginning.
pub(crate) const MAX_TEXT_BYTES: usize = 8192;
const DEFAULT_TIMEOUT_MS: u32 = 500;
/// Inputs per embeddings call: 16 vectors of 3,072 dimensions, as JSON
/// text, stay under the gateway's 1 MiB response cap.
const DEFAULT_BATCH_SIZE: usize = 16;
/// OpenAI's cap on the inputs of one call.
const MAX_BATCH_SIZE: usize = 2048;

// No `Debug`: it would print the key.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct EmbeddingsConfig {
    /// The endpoint itself, e.g. `https://api.openai.com/v1/embeddings`.
    url: String,
    model: String,
    /// Sent as `authorization: Bearer <apiKey>`.
    #[serde(default)]
    api_key: Option<String>,
    /// The most the semantic step of one request waits for the endpoint,
    /// over all its calls.
    #[serde(default)]
    timeout_ms: Option<u32>,
    /// Inputs per call.
    #[serde(default)]
    batch_size: Option<usize>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct SemanticRouteConfig {
    pub(crate) model: String,
    examples: Vec<String>,
}

pub(crate) struct Semantic {
    url: String,
    model: String,
    authorization: Option<String>,
    timeout_ms: u32,
    batch_size: usize,
    /// Each route's model.
    models: Vec<String>,
    /// Every example, with the index of its route.
    examples: Vec<(usize, String)>,
    threshold: f64,
    /// The examples' embeddings, unit length, in the order of `examples`,
    /// once this instance has fetched them.
    cache: RefCell<Option<Vectors>>,
}

/// Unit vectors, shared between the cache and a decision.
type Vectors = Rc<Vec<Vec<f32>>>;

/// Why the semantic step has no answer: `kind` is the metric's label.
#[derive(Debug, PartialEq)]
pub(crate) struct Failure {
    pub(crate) kind: &'static str,
    pub(crate) detail: String,
}

impl Failure {
    fn new(kind: &'static str, detail: impl Into<String>) -> Failure {
        Failure { kind, detail: detail.into() }
    }

    fn invalid(detail: impl Into<String>) -> Failure {
        Failure::new("invalid", detail)
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Failure {
        let kind = match error {
            Error::Refused(_) => "refused",
            Error::Timeout => "timeout",
            Error::TooLarge => "too_large",
            Error::Failed(_) => "failed",
        };
        Failure::new(kind, error.to_string())
    }
}

/// An embeddings response: `{"data": [{"index", "embedding"}]}`.
#[derive(Deserialize)]
struct EmbeddingList {
    data: Vec<Embedding>,
}

#[derive(Deserialize)]
struct Embedding {
    #[serde(default)]
    index: Option<usize>,
    embedding: Vec<f32>,
}

impl Semantic {
    pub(crate) fn new(
        embeddings: EmbeddingsConfig,
        routes: Vec<SemanticRouteConfig>,
        threshold: f64,
    ) -> Result<Semantic, String> {
        check_url(&embeddings.url)?;
        if embeddings.model.trim().is_empty() {
            return Err("`semantic.embeddings.model` is empty".into());
        }
        let authorization = match embeddings.api_key {
            None => None,
            Some(key) if key.is_empty() => return Err("`semantic.embeddings.apiKey` is empty".into()),
            Some(key) if key.bytes().any(|b| b < b' ' || b == 0x7f) => {
                return Err("`semantic.embeddings.apiKey` has control characters".into());
            }
            Some(key) => Some(format!("Bearer {key}")),
        };
        let timeout_ms = embeddings.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
        if !(1..=60_000).contains(&timeout_ms) {
            return Err("`semantic.embeddings.timeoutMs` must be from 1 to 60000".into());
        }
        let batch_size = embeddings.batch_size.unwrap_or(DEFAULT_BATCH_SIZE);
        if !(1..=MAX_BATCH_SIZE).contains(&batch_size) {
            return Err(format!("`semantic.embeddings.batchSize` must be from 1 to {MAX_BATCH_SIZE}"));
        }
        if routes.is_empty() {
            return Err("`semantic.routes` is empty".into());
        }
        if !threshold.is_finite() || !(-1.0..=1.0).contains(&threshold) {
            return Err("`semantic.threshold` must be a cosine similarity, from -1 to 1".into());
        }
        let mut models = Vec::new();
        let mut examples = Vec::new();
        for (i, route) in routes.into_iter().enumerate() {
            if route.examples.is_empty() {
                return Err(format!("`semantic.routes[{i}].examples` is empty"));
            }
            for (j, example) in route.examples.into_iter().enumerate() {
                let field = format!("semantic.routes[{i}].examples[{j}]");
                if example.trim().is_empty() {
                    return Err(format!("`{field}` is empty"));
                }
                if example.len() > MAX_TEXT_BYTES {
                    return Err(format!("`{field}` is longer than {MAX_TEXT_BYTES} bytes"));
                }
                examples.push((i, example));
            }
            models.push(route.model);
        }
        if examples.len() > MAX_EXAMPLES {
            return Err(format!("`semantic.routes` have {} examples in all, at most {MAX_EXAMPLES}", examples.len()));
        }
        Ok(Semantic {
            url: embeddings.url,
            model: embeddings.model,
            authorization,
            timeout_ms,
            batch_size,
            models,
            examples,
            threshold,
            cache: RefCell::new(None),
        })
    }

    /// The models of the routes, in order.
    pub(crate) fn models(&self) -> impl Iterator<Item = &str> {
        self.models.iter().map(String::as_str)
    }

    /// The model whose nearest example is at least `threshold` similar to
    /// `text` (the first route of the best score), or none: below the
    /// threshold, or no text to compare.
    pub(crate) fn decide(&self, text: &str) -> Result<Option<&str>, Failure> {
        Ok(self.best(text)?.and_then(|(route, score)| (score >= self.threshold).then(|| self.models[route].as_str())))
    }

    /// The route with the nearest example to `text`, and its similarity.
    pub(crate) fn best(&self, text: &str) -> Result<Option<(usize, f64)>, Failure> {
        let text = truncate(text.trim(), MAX_TEXT_BYTES);
        if text.is_empty() {
            return Ok(None);
        }
        let started = host::monotonic_ns();
        let embedded = self.embed_with_examples(text, started + u64::from(self.timeout_ms) * 1_000_000);
        metrics::observe(EMBEDDING_SECONDS, &[], host::monotonic_ns().saturating_sub(started) as f64 / 1e9);
        let (examples, prompt) = embedded?;
        let mut best: Option<(usize, f64)> = None;
        for ((route, _), example) in self.examples.iter().zip(examples.iter()) {
            let score = dot(example, &prompt);
            if best.is_none_or(|(_, top)| score > top) {
                best = Some((*route, score));
            }
        }
        Ok(best)
    }

    /// The examples' embeddings (fetched now, with the prompt's, if this
    /// instance has none yet) and the prompt's.
    fn embed_with_examples(&self, text: &str, deadline: u64) -> Result<(Vectors, Vec<f32>), Failure> {
        let cached = self.cache.borrow().clone();
        if let Some(examples) = cached {
            let prompt = self.embed(&[text], deadline)?.pop().unwrap_or_default();
            if examples.first().is_some_and(|e| e.len() != prompt.len()) {
                // The endpoint changed models: embed the examples again.
                *self.cache.borrow_mut() = None;
                return Err(Failure::invalid("the prompt's embedding and the examples' differ in dimensions"));
            }
            return Ok((examples, prompt));
        }
        let mut inputs: Vec<&str> = self.examples.iter().map(|(_, text)| text.as_str()).collect();
        inputs.push(text);
        let mut vectors = self.embed(&inputs, deadline)?;
        let prompt = vectors.pop().unwrap_or_default();
        let examples = Rc::new(vectors);
        metrics::add(EXAMPLE_EMBEDDINGS, &[], 1);
        *self.cache.borrow_mut() = Some(examples.clone());
        Ok((examples, prompt))
    }

    /// One unit vector per input, in order, of one dimension, in calls of
    /// `batch_size` inputs, each given what is left of the deadline.
    fn embed(&self, inputs: &[&str], deadline: u64) -> Result<Vec<Vec<f32>>, Failure> {
        let mut vectors: Vec<Vec<f32>> = Vec::with_capacity(inputs.len());
        for batch in inputs.chunks(self.batch_size) {
            let left_ms = deadline.saturating_sub(host::monotonic_ns()) / 1_000_000;
            if left_ms == 0 {
                return Err(Failure::new("timeout", "no time left for the next embeddings call"));
            }
            let body = json!({"model": self.model, "input": batch});
            let mut request = outbound::Request::post_json(&self.url, &body)?.timeout_ms(left_ms.min(60_000) as u32);
            if let Some(authorization) = &self.authorization {
                request = request.header("authorization", authorization);
            }
            let response = outbound::send(&request)?;
            if !(200..300).contains(&response.status) {
                return Err(Failure::new("status", format!("the embeddings endpoint answered {}", response.status)));
            }
            let list: EmbeddingList = serde_json::from_slice(&response.body)
                .map_err(|e| Failure::invalid(format!("the response is not an embeddings list: {e}")))?;
            vectors.extend(in_order(list, batch.len())?);
        }
        let dimensions = vectors.first().map_or(0, Vec::len);
        if vectors.iter().any(|v| v.len() != dimensions) {
            return Err(Failure::invalid("the embeddings differ in dimensions"));
        }
        Ok(vectors)
    }
}

/// The list's vectors by `index` (or position), each scaled to unit length:
/// exactly one for each of `inputs`.
fn in_order(list: EmbeddingList, inputs: usize) -> Result<Vec<Vec<f32>>, Failure> {
    if list.data.len() != inputs {
        return Err(Failure::invalid(format!("{} embeddings came back for {inputs} inputs", list.data.len())));
    }
    let mut slots: Vec<Option<Vec<f32>>> = vec![None; inputs];
    for (position, item) in list.data.into_iter().enumerate() {
        let index = item.index.unwrap_or(position);
        let slot = slots.get_mut(index).ok_or_else(|| Failure::invalid("an embedding's index is out of range"))?;
        if slot.is_some() {
            return Err(Failure::invalid("two embeddings have the same index"));
        }
        if item.embedding.is_empty() {
            return Err(Failure::invalid("an embedding is empty"));
        }
        *slot = Some(unit(item.embedding)?);
    }
    Ok(slots.into_iter().flatten().collect())
}

/// `v` scaled to length 1 (a zero vector stays zero: similar to nothing).
fn unit(mut v: Vec<f32>) -> Result<Vec<f32>, Failure> {
    let norm = v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt();
    if !norm.is_finite() {
        return Err(Failure::invalid("an embedding is not finite"));
    }
    if norm > 0.0 {
        for x in &mut v {
            *x = (f64::from(*x) / norm) as f32;
        }
    }
    Ok(v)
}

/// The cosine similarity of two unit vectors.
fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum()
}

/// The longest prefix of `text` of at most `max` bytes that ends on a
/// character boundary.
fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `http://` or `https://` and a host, with no credentials in it. The URL
/// is never quoted: it may carry a key in its query.
fn check_url(url: &str) -> Result<(), String> {
    let lower = url.to_ascii_lowercase();
    let Some(rest) = lower.strip_prefix("https://").or_else(|| lower.strip_prefix("http://")) else {
        return Err("`semantic.embeddings.url` must start with http:// or https://".into());
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.is_empty() {
        return Err("`semantic.embeddings.url` has no host".into());
    }
    if authority.contains('@') {
        return Err("`semantic.embeddings.url` has credentials in it: give the key as `apiKey`".into());
    }
    if url.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err("`semantic.embeddings.url` has spaces or control characters".into());
    }
    Ok(())
}

#[cfg(test)]
pub(crate) fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (a, b) = (unit(a.to_vec()).unwrap(), unit(b.to_vec()).unwrap());
    dot(&a, &b)
}
