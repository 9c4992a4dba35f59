//! The model-router plugin (plugins/model-router) through the real gateway:
//! requests for `auto` are routed, by the router's rules and semantic
//! routes, to `small` or `large`, each served by a route of its own in the
//! namespace; the echo upstream says which model it was asked for.
//!
//! The embeddings endpoint is a small HTTP server in this test, speaking
//! OpenAI's `/v1/embeddings` shape. It is not a language model: each vector
//! is a bag of words, every word (lower-cased, letters and digits) hashed
//! into one of 256 dimensions. Two texts are similar exactly as far as they
//! share words, so a Spanish prompt that borrows the English example's
//! technical words ("function", "parses", "json") lands near it. A real
//! embedding model also relates texts that share no words; this test shows
//! the plugin's wiring (one call, the examples embedded once per reused
//! instance, the threshold, the fallback), not the quality of a model.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use parking_lot::Mutex;
use serde_json::{Value, json};
use sluice_tests::{ConfigDir, Echo, Gateway, Plugin, Reply, Route, documents, eventually};
use tokio::net::TcpListener;

use crate::plugin_support as support;

const DIMENSIONS: usize = 256;

/// The test's embedding: a bag of words, hashed (FNV-1a) into `DIMENSIONS`.
fn bag_of_words(text: &str) -> Vec<f32> {
    let mut vector = vec![0.0f32; DIMENSIONS];
    for word in text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
        let hash = word
            .to_lowercase()
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
        vector[(hash % DIMENSIONS as u64) as usize] += 1.0;
    }
    vector
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b))
}

/// One call the embeddings server answered.
#[derive(Clone, Debug)]
struct Call {
    authorization: Option<String>,
    model: String,
    inputs: Vec<String>,
}

/// A real HTTP/1.1 embeddings server on loopback, recording each call.
struct Embeddings {
    addr: SocketAddr,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Embeddings {
    async fn start() -> Embeddings {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let recorded = calls.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let recorded = recorded.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| embed(request, recorded.clone()));
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
        });
        Embeddings { addr, calls }
    }

    fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The calls made with embedding model `model`, in order.
    fn calls(&self, model: &str) -> Vec<Call> {
        self.calls.lock().iter().filter(|c| c.model == model).cloned().collect()
    }
}

/// `POST /v1/embeddings` as OpenAI answers it: `{"data": [{"index",
/// "embedding"}]}`, one per input, `input` a string or a list of strings.
async fn embed(request: Request<Incoming>, calls: Arc<Mutex<Vec<Call>>>) -> Result<Response<Full<Bytes>>, Infallible> {
    let respond = |status: u16, body: Value| {
        let response = Response::builder().status(status).header("content-type", "application/json");
        Ok(response.body(Full::new(Bytes::from(body.to_string()))).unwrap())
    };
    if request.method() != hyper::Method::POST || request.uri().path() != "/v1/embeddings" {
        return respond(404, json!({"error": {"message": "not found"}}));
    }
    let authorization = request.headers().get("authorization").and_then(|v| v.to_str().ok()).map(str::to_string);
    let body = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return respond(400, json!({"error": {"message": "not JSON"}}));
    };
    let inputs: Vec<String> = match &body["input"] {
        Value::String(text) => vec![text.clone()],
        Value::Array(items) => items.iter().filter_map(|i| i.as_str().map(str::to_string)).collect(),
        _ => return respond(400, json!({"error": {"message": "no input"}})),
    };
    let model = body["model"].as_str().unwrap_or_default().to_string();
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(index, text)| json!({"object": "embedding", "index": index, "embedding": bag_of_words(text)}))
        .collect();
    calls.lock().push(Call { authorization, model: model.clone(), inputs });
    respond(
        200,
        json!({"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": 0, "total_tokens": 0}}),
    )
}

/// The router's config: rules, semantic routes against `embeddings`
/// (embedding model `model`), and `small` by default.
fn config(alias: &str, embeddings: &str, model: &str) -> Value {
    json!({
        "aliases": [alias],
        "rules": [
            {"model": "large", "when": {"keywords": ["stack trace", "segfault"]}},
            {"model": "small", "when": {"maxPromptTokens": 8}},
            {"model": "large", "when": {"minPromptTokens": 200}}
        ],
        "semantic": {
            "embeddings": {"url": format!("{embeddings}/v1/embeddings"), "model": model, "apiKey": "test-key",
                           "timeoutMs": 3000},
            "routes": [
                {"model": "large", "examples": [
                    "write a function that parses json and returns a struct",
                    "refactor this code to remove the global state"
                ]},
                {"model": "small", "examples": ["translate this sentence into french"]}
            ],
            "threshold": 0.4
        },
        "default": "small",
        "header": "x-sluice-routed-model"
    })
}

/// Spanish, borrowing the first example's technical words.
const SEMANTIC: &str = "escribe una function que parses json y returns un struct";
/// Spanish, sharing no word with any example.
const UNRELATED: &str = "cuéntame una historia corta sobre un gato naranja";

async fn ask(gateway: &Gateway, model: &str, prompt: &str) -> Reply {
    let body = support::chat(model, json!([{"role": "user", "content": prompt}]));
    gateway.post("/v1/chat/completions", body, &[]).await
}

/// The model the upstream was asked for, and the router's response header.
async fn routed(gateway: &Gateway, model: &str, prompt: &str) -> (String, String) {
    let reply = ask(gateway, model, prompt).await;
    let header = reply.header("x-sluice-routed-model").unwrap_or_default().to_string();
    (reply.echoed()["model"].as_str().unwrap_or_default().to_string(), header)
}

/// Counter `name` of plugin `plugin` whose labels include `labels`.
async fn counter(gateway: &Gateway, name: &str, plugin: &str, labels: &str) -> f64 {
    let metrics = gateway.client().get(&gateway.admin_url("/metrics")).await.text();
    let prefix = format!("sluice_plugin_{name}_total{{namespace=\"default\",plugin=\"{plugin}\"");
    metrics
        .lines()
        .find(|line| line.starts_with(&prefix) && line.contains(labels))
        .and_then(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn auto_is_routed_by_rules_then_semantic_similarity_then_the_default() {
    // What the test server does to these prompts, before the gateway is
    // involved: the threshold (0.4) splits them.
    let code_example = bag_of_words("write a function that parses json and returns a struct");
    assert!(cosine(&code_example, &bag_of_words(SEMANTIC)) >= 0.4);
    assert!(cosine(&code_example, &bag_of_words(UNRELATED)) < 0.1);

    let echo = Echo::start().await;
    let embeddings = Embeddings::start().await;
    // A port nothing listens on: the endpoint is down.
    let down = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let router = |name: &str, alias: &str, url: &str, model: &str| {
        Plugin::new(name, "model-router")
            .config(config(alias, url, model))
            .egress(json!({"destinations": [{"url": url}]}))
            .timeout_ms(10_000)
    };
    let plugins = [
        // Reused, as the README recommends for semantic routing: each
        // instance embeds the examples once.
        router("router", "auto", &embeddings.origin(), "bow-reused").reused(1).yaml(),
        // PerRequest, the default: every request a fresh instance.
        router("router-per-request", "auto-fresh", &embeddings.origin(), "bow-fresh").yaml(),
        router("router-down", "auto-down", &down, "bow-down").reused(1).yaml(),
    ];
    let routes = [
        Route::new("router", &["auto", "auto-raw"], &echo.url()).plugins(&["router"]).yaml(),
        Route::new("router-per-request", &["auto-fresh"], &echo.url()).plugins(&["router-per-request"]).yaml(),
        Route::new("router-down", &["auto-down"], &echo.url()).plugins(&["router-down"]).yaml(),
        Route::new("small", &["small"], &echo.url()).yaml(),
        Route::new("large", &["large"], &echo.url()).yaml(),
    ];
    let dir = ConfigDir::new();
    dir.write("plugins.yaml", &documents(&plugins));
    dir.write("routes.yaml", &documents(&routes));
    let gateway = Gateway::start(&dir).await;
    let admin = eventually("five routes", Duration::from_secs(120), async || {
        let admin = gateway.admin_config().await;
        (admin["routes"].as_array()?.len() == 5).then_some(admin.clone())
    })
    .await;
    assert_eq!(admin["errors"], json!([]), "{admin}");
    // Reused instances are made from the snapshot once it exists.
    gateway.wait_for_snapshots(Duration::from_secs(120)).await;

    // Rules, first match wins. A short prompt goes to `small`.
    assert_eq!(routed(&gateway, "auto", "Hi! How are you?").await, ("small".into(), "small".into()));
    // A long one (counted by the gateway's tokenizer) to `large`.
    let long = "The quick brown fox jumps over the lazy dog, again and again. ".repeat(30);
    assert_eq!(routed(&gateway, "auto", &long).await, ("large".into(), "large".into()));
    // A keyword, in any case, wins over the short-prompt rule after it.
    assert_eq!(routed(&gateway, "auto", "Here is my STACK TRACE").await, ("large".into(), "large".into()));
    assert!(embeddings.calls("bow-reused").is_empty(), "a matching rule makes no embeddings call");

    // No rule matches these: the semantic routes decide. The Spanish
    // prompt is near the code example, so `large`; the unrelated one is
    // near nothing, so the default, `small`.
    assert_eq!(routed(&gateway, "auto", SEMANTIC).await, ("large".into(), "large".into()));
    assert_eq!(routed(&gateway, "auto", UNRELATED).await, ("small".into(), "small".into()));
    assert_eq!(routed(&gateway, "auto", SEMANTIC).await, ("large".into(), "large".into()));
    // One call per request, with the key; the reused instance sent the
    // examples with the first prompt only.
    let calls = embeddings.calls("bow-reused");
    let inputs: Vec<usize> = calls.iter().map(|c| c.inputs.len()).collect();
    assert_eq!(inputs, [4, 1, 1], "{calls:?}");
    assert_eq!(calls[0].inputs[3], SEMANTIC);
    assert_eq!(calls[1].inputs, [UNRELATED]);
    assert!(calls.iter().all(|c| c.authorization.as_deref() == Some("Bearer test-key")), "{calls:?}");

    // With PerRequest, every semantic decision embeds the examples again:
    // correct, and what `isolation: Reused` saves.
    for _ in 0..2 {
        assert_eq!(routed(&gateway, "auto-fresh", SEMANTIC).await, ("large".into(), "large".into()));
    }
    let inputs: Vec<usize> = embeddings.calls("bow-fresh").iter().map(|c| c.inputs.len()).collect();
    assert_eq!(inputs, [4, 4]);

    // Other models pass untouched, even on the router's route.
    let reply = ask(&gateway, "auto-raw", SEMANTIC).await;
    assert_eq!((reply.echoed()["model"].as_str(), reply.header("x-sluice-routed-model")), (Some("auto-raw"), None));

    // The embeddings endpoint is down: the request is served all the same,
    // by the default model, and the failure is counted.
    for _ in 0..2 {
        assert_eq!(routed(&gateway, "auto-down", SEMANTIC).await, ("small".into(), "small".into()));
    }
    // The rules still apply without it.
    assert_eq!(routed(&gateway, "auto-down", "Here is my stack trace").await, ("large".into(), "large".into()));

    // The decisions, by model and reason.
    let decisions = async |plugin: &str, model: &str, reason: &str| {
        let labels = format!("model=\"{model}\",reason=\"{reason}\"");
        counter(&gateway, "model_router_decisions", plugin, &labels).await
    };
    assert_eq!(decisions("router", "small", "rule").await, 1.0);
    assert_eq!(decisions("router", "large", "rule").await, 2.0);
    assert_eq!(decisions("router", "large", "semantic").await, 2.0);
    assert_eq!(decisions("router", "small", "default").await, 1.0);
    assert_eq!(decisions("router-per-request", "large", "semantic").await, 2.0);
    assert_eq!(decisions("router-down", "small", "error").await, 2.0);
    assert_eq!(decisions("router-down", "large", "rule").await, 1.0);
    assert_eq!(counter(&gateway, "model_router_embedding_errors", "router-down", "error=\"failed\"").await, 2.0);
    assert_eq!(counter(&gateway, "model_router_example_embeddings", "router", "").await, 1.0);
    assert_eq!(counter(&gateway, "model_router_example_embeddings", "router-per-request", "").await, 2.0);
}

#[tokio::test]
async fn a_bad_config_is_refused_at_load_naming_the_field() {
    let grant = json!({"destinations": [{"url": "http://127.0.0.1:9"}]});
    let plugin = |name: &str, config: Value| Plugin::new(name, "model-router").egress(grant.clone()).config(config);
    support::assert_configs_rejected(vec![
        (plugin("no-default", json!({"rules": []})), "missing field `default`"),
        (plugin("loops", json!({"default": "auto"})), "`default` is one of the `aliases`"),
        (
            plugin(
                "bad-threshold",
                json!({"default": "small", "semantic": {
                    "embeddings": {"url": "http://127.0.0.1:9/v1/embeddings", "model": "m"},
                    "routes": [{"model": "large", "examples": ["x"]}],
                    "threshold": 2
                }}),
            ),
            "`semantic.threshold` must be a cosine similarity",
        ),
    ])
    .await;
}
