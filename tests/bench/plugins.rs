//! What each first-party plugin costs per request, with the config from its
//! `plugins/<name>/example.yaml`: a fresh instance (instantiate +
//! `configure`), and one `request-filter` call on a chat request. Prints a
//! table, with what the plugin did with the request (some examples answer
//! it directly, e.g. auth without a credential).
//!
//! Run: `cargo bench -p sluice-tests --bench plugins` (after `cargo xtask plugins`).

use std::path::Path;
use std::time::{Duration, Instant};

use sluice_api::Document;
use sluice_core::Isolation;
use sluice_runtime::{Limits, Request, RequestAction, Runtime, RuntimeConfig};

const PLUGINS: &[&str] =
    &["prompt-template", "prompt-decorator", "context-trim", "auth", "prompt-guard", "response-guard"];
const MEASURE_FOR: Duration = Duration::from_millis(1000);

fn main() {
    let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    println!("| plugin | size | instantiate + configure | request-filter call | per request, Reused | outcome |");
    println!("|---|---|---|---|---|---|");
    tokio.block_on(async {
        sluice_runtime::tokens::warm_up();
        let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
        for name in PLUGINS {
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            let bytes = std::fs::read(root.join(format!("plugins/dist/{name}.wasm"))).expect("built plugins");
            let size = bytes.len();
            let module = runtime.load(bytes, None).await.unwrap();
            let config = example_config(&root.join(format!("plugins/{name}/example.yaml")));
            let limits = Limits { timeout: Duration::from_secs(5), max_memory_bytes: 64 << 20 };
            let plugin = module.configure(name, &config, limits, Isolation::PerRequest).await.unwrap();
            let request = request();
            let instantiate = median_of(async || drop(plugin.instance().await.unwrap())).await;
            let mut instance = plugin.instance().await.unwrap();
            let outcome = match instance.request_filter(&request).await.unwrap() {
                RequestAction::Continue(_) => "continue".to_string(),
                RequestAction::Respond(response) => format!("respond {}", response.status),
            };
            let call = median_of(async || drop(instance.request_filter(&request).await.unwrap())).await;
            let reused = module.configure(name, &config, limits, Isolation::Reused { max_idle: 4 }).await.unwrap();
            let per_request_reused = median_of(async || {
                let mut instance = reused.instance().await.unwrap();
                drop(instance.request_filter(&request).await.unwrap());
            })
            .await;
            println!(
                "| {name} | {:.0} KiB | {} | {} | {} | {outcome} |",
                size as f64 / 1024.0,
                us(instantiate),
                us(call),
                us(per_request_reused)
            );
        }
    });
}

fn example_config(path: &Path) -> serde_json::Value {
    let yaml = std::fs::read_to_string(path).expect("the plugin's example.yaml");
    sluice_api::parse_documents(&yaml)
        .into_iter()
        .find_map(|doc| match doc {
            Ok(Document::Plugin(plugin)) => Some(plugin.spec.config.unwrap_or_default()),
            _ => None,
        })
        .expect("a GatewayPlugin in the example")
}

fn request() -> Request {
    let body = serde_json::json!({
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "Summarise the plot of Hamlet in two sentences."}
        ]
    });
    Request {
        method: "POST".into(),
        path: "/v1/chat/completions".into(),
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.to_string().into_bytes(),
        model: "gpt-4o-mini".into(),
        route: "default/chat".into(),
    }
}

async fn median_of(mut op: impl AsyncFnMut()) -> Duration {
    let mut samples = Vec::new();
    let start = Instant::now();
    while start.elapsed() < MEASURE_FOR {
        let one = Instant::now();
        op().await;
        samples.push(one.elapsed());
    }
    samples.sort();
    samples[samples.len() / 2]
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}
