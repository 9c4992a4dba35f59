//! Per-request plugin cost.
//! - `instance/<plugin>/...`: getting an instance for one request and
//!   dropping it: a fresh instance that `configure` sets up (snapshots off),
//!   first with no pages kept resident in pool slots (as before either
//!   existed); a fresh instance from the snapshot taken after `configure`
//!   (the default for `PerRequest`); an idle instance of a `Reused` plugin;
//! - `add-header/...`: one `request-filter` call, and a whole request.
//!
//! Run: `cargo bench -p sluice-tests --bench runtime` (after `cargo xtask plugins`).

use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use sluice_core::Isolation;
use sluice_runtime::{ConfiguredPlugin, Limits, PluginRequest, Runtime, RuntimeConfig};

fn plugin_bytes(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/dist").join(format!("{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}; run `cargo xtask plugins`", path.display()))
}

fn request() -> PluginRequest {
    const BODY: &[u8] = br#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hello"}]}"#;
    PluginRequest::chat("gpt-4o-mini", sluice_chat::ChatBody::validated(BODY.into()))
}

/// The plugins measured, with the configs of their READMEs and examples.
fn plugins() -> Vec<(&'static str, Value)> {
    vec![
        ("add-header", json!({"header": "x-team", "value": "search", "setBody": {"user": "team-search"}})),
        (
            "prompt-decorator",
            json!({
                "prepend": [{"role": "system", "content": "You are the ACME support assistant. Answer in plain English."}],
                "append": [{"role": "system", "content": "Never include customer account numbers in answers."}],
            }),
        ),
        (
            // Its configure compiles three regexes.
            "prompt-guard",
            json!({"roles": ["user"], "deny": [
                {"name": "ignore-instructions", "pattern": r"(?i)\b(ignore|disregard|forget)\s+(all\s+|any\s+)?(previous|prior|above|earlier)\s+(instructions|prompts|rules)"},
                {"name": "reveal-system-prompt", "pattern": r"(?i)(reveal|print|show|repeat)\s+(me\s+)?(your|the)\s+(system\s+prompt|hidden\s+instructions)"},
                {"name": "card-number", "pattern": r"\b\d{4}[ -]?\d{4}[ -]?\d{4}[ -]?\d{4}\b"},
            ]}),
        ),
        (
            "context-trim",
            json!({"strategy": "drop-oldest", "models": [
                {"model": "gpt-4o*", "contextWindow": 128000, "defaultMaxTokens": 4096},
                {"model": "*", "maxInputTokens": 8000},
            ]}),
        ),
    ]
}

const LIMITS: Limits = Limits { timeout: Duration::from_millis(100), max_memory_bytes: 64 << 20 };

/// Getting an instance and dropping it, `iters` times.
fn instances(tokio: &tokio::runtime::Runtime, plugin: &ConfiguredPlugin, iters: u64) -> Duration {
    tokio.block_on(async {
        let start = Instant::now();
        for _ in 0..iters {
            std::hint::black_box(plugin.instance().await.unwrap());
        }
        start.elapsed()
    })
}

fn bench(c: &mut Criterion) {
    let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let runtime = |snapshots: bool, keep_resident_bytes: Option<usize>| {
        let defaults = RuntimeConfig::default();
        let max_snapshot_bytes = if snapshots { defaults.max_snapshot_bytes } else { 0 };
        let keep_resident_bytes = keep_resident_bytes.unwrap_or(defaults.keep_resident_bytes);
        Runtime::new(RuntimeConfig { max_snapshot_bytes, keep_resident_bytes, ..defaults }).unwrap()
    };
    let (with_snapshots, without) = (runtime(true, None), runtime(false, None));
    let (cold, before) = (runtime(true, Some(0)), runtime(false, Some(0)));
    let reused = Isolation::Reused { max_idle: 4 };

    let mut group = c.benchmark_group("instance");
    for (name, config) in plugins() {
        let configure = async |runtime: &Runtime, isolation| {
            let module = runtime.load(plugin_bytes(name), None).await.unwrap();
            module.configure(name, &config, LIMITS, isolation, sluice_runtime::Grants::default()).await.unwrap()
        };
        let ways = tokio.block_on(async {
            let snapshotted = configure(&with_snapshots, Isolation::PerRequest).await;
            // The snapshot is made in the background: wait for it.
            assert!(snapshotted.snapshotted().await, "{name} was not snapshotted");
            [
                ("configure per instance, no pages kept resident", configure(&before, Isolation::PerRequest).await),
                ("configure per instance", configure(&without, Isolation::PerRequest).await),
                ("from snapshot", snapshotted),
                ("reused", configure(&with_snapshots, reused).await),
            ]
        });
        for (way, plugin) in &ways {
            group.bench_function(format!("{name}/{way}"), |b| b.iter_custom(|iters| instances(&tokio, plugin, iters)));
        }
    }
    group.finish();

    let (name, config) = plugins().swap_remove(0);
    let configure = async |runtime: &Runtime, isolation| {
        let module = runtime.load(plugin_bytes(name), None).await.unwrap();
        let plugin =
            module.configure(name, &config, LIMITS, isolation, sluice_runtime::Grants::default()).await.unwrap();
        plugin.snapshotted().await;
        plugin
    };
    let (ways, reused) = tokio.block_on(async {
        let ways = [
            ("configured per instance, no pages kept resident", configure(&before, Isolation::PerRequest).await),
            ("configured per instance", configure(&without, Isolation::PerRequest).await),
            ("from snapshot", configure(&with_snapshots, Isolation::PerRequest).await),
            ("from snapshot, no pages kept resident", configure(&cold, Isolation::PerRequest).await),
        ];
        (ways, configure(&with_snapshots, reused).await)
    });
    let plugin = &ways[2].1;
    let request = request();
    let mut group = c.benchmark_group(name);
    group.bench_function("request-filter call", |b| {
        b.iter_custom(|iters| {
            tokio.block_on(async {
                let mut instance = plugin.instance().await.unwrap();
                let start = Instant::now();
                for _ in 0..iters {
                    std::hint::black_box(instance.request_filter(&mut request.clone()).await.unwrap());
                }
                start.elapsed()
            })
        })
    });
    // The first call into a fresh instance also pays for the pages of
    // memory it touches first (copy-on-write faults), which configuring
    // paid before, unless its pool slot kept them resident.
    for (what, plugin) in &ways {
        group.bench_function(format!("per request (instance {what} + call)"), |b| {
            b.iter_custom(|iters| {
                tokio.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        let mut instance = plugin.instance().await.unwrap();
                        std::hint::black_box(instance.request_filter(&mut request.clone()).await.unwrap());
                    }
                    start.elapsed()
                })
            })
        });
    }
    group.bench_function("per request, isolation: Reused (acquire+call+release)", |b| {
        b.iter_custom(|iters| {
            tokio.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let mut instance = reused.instance().await.unwrap();
                    std::hint::black_box(instance.request_filter(&mut request.clone()).await.unwrap());
                }
                start.elapsed()
            })
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
