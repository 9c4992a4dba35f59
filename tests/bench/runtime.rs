//! Per-request plugin cost: a fresh instance (instantiate + configure) and
//! one `request-filter` call, for the add-header plugin.
//! Run: `cargo bench -p sluice-tests --bench runtime` (after `cargo xtask plugins`).

use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_core::Isolation;
use sluice_runtime::{Limits, Request, Runtime, RuntimeConfig};

fn plugin_bytes(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/dist").join(format!("{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}; run `cargo xtask plugins`", path.display()))
}

fn request() -> Request {
    Request {
        method: "POST".into(),
        path: "/v1/chat/completions".into(),
        headers: vec![("content-type".into(), "application/json".into())],
        body: br#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hello"}]}"#.to_vec(),
        model: "gpt-4o-mini".into(),
        route: "default/chat".into(),
    }
}

fn bench(c: &mut Criterion) {
    let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let limits = Limits { timeout: Duration::from_millis(100), max_memory_bytes: 64 << 20 };
    let config = serde_json::json!({"header": "x-team", "value": "search", "setBody": {"user": "team-search"}});
    let (plugin, reused) = tokio.block_on(async {
        let module = runtime.load(plugin_bytes("add-header"), None).await.unwrap();
        let reused = Isolation::Reused { max_idle: 4 };
        (
            module.configure("bench/add-header", &config, limits, Isolation::PerRequest).await.unwrap(),
            module.configure("bench/add-header", &config, limits, reused).await.unwrap(),
        )
    });
    let request = request();

    let mut group = c.benchmark_group("add-header");
    group.bench_function("instantiate+configure", |b| {
        b.iter_custom(|iters| {
            tokio.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    std::hint::black_box(plugin.instance().await.unwrap());
                }
                start.elapsed()
            })
        })
    });
    group.bench_function("request-filter call", |b| {
        b.iter_custom(|iters| {
            tokio.block_on(async {
                let mut instance = plugin.instance().await.unwrap();
                let start = Instant::now();
                for _ in 0..iters {
                    std::hint::black_box(instance.request_filter(&request).await.unwrap());
                }
                start.elapsed()
            })
        })
    });
    group.bench_function("per request (instantiate+configure+call)", |b| {
        b.iter_custom(|iters| {
            tokio.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let mut instance = plugin.instance().await.unwrap();
                    std::hint::black_box(instance.request_filter(&request).await.unwrap());
                }
                start.elapsed()
            })
        })
    });
    group.bench_function("per request, isolation: Reused (acquire+call+release)", |b| {
        b.iter_custom(|iters| {
            tokio.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let mut instance = reused.instance().await.unwrap();
                    std::hint::black_box(instance.request_filter(&request).await.unwrap());
                }
                start.elapsed()
            })
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
