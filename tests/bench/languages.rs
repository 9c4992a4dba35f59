//! What a plugin costs by guest language: the decorator-lite example built
//! from Rust, C, Python and JavaScript (plugins/examples), measured through
//! `sluice_runtime` as the gateway uses it. Prints one table.
//!
//! Run: `cargo bench -p sluice-tests --bench languages` (after `cargo xtask plugins`).
//! Arguments after `--` pick languages, e.g. `-- rust c`.
//!
//! Columns:
//! - size: the component file;
//! - compile: cranelift compiling the component (a cold start, or a new version);
//! - cached load: loading the precompiled artifact from the cache dir, as a
//!   restart does (sha256 of the bytes included);
//! - instantiate: a fresh instance plus its `configure` call, which
//!   `PerRequest` pays on every request;
//! - call: one `request-filter` call on a live instance;
//! - per request: getting an instance, one `request-filter` call, and
//!   releasing the instance, for `PerRequest` and for `Reused`.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_core::Isolation;
use sluice_runtime::{ConfiguredPlugin, Limits, PluginModule, PluginRequest, RequestAction, Runtime, RuntimeConfig};

const LANGUAGES: [&str; 4] = ["rust", "c", "python", "js"];

/// How long each per-operation measurement runs for (after a warm-up).
const MEASURE_FOR: Duration = Duration::from_millis(1500);

fn main() {
    // `cargo bench` passes `--bench`; anything else names languages.
    let picked: Vec<String> = std::env::args().skip(1).filter(|arg| !arg.starts_with('-')).collect();
    let languages: Vec<&str> =
        LANGUAGES.into_iter().filter(|l| picked.is_empty() || picked.iter().any(|p| p == l)).collect();
    let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();

    println!("decorator-lite by guest language (medians):\n");
    println!(
        "| language | size | compile | cached load | instantiate | call | per request, PerRequest | per request, Reused |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for language in languages {
        let row = tokio.block_on(measure(language));
        println!(
            "| {language} | {} | {} | {} | {} | {} | {} | {} |",
            size(row.size),
            time(row.compile),
            time(row.cached_load),
            time(row.instantiate),
            time(row.call),
            time(row.per_request),
            time(row.per_request_reused),
        );
    }
}

struct Row {
    size: usize,
    compile: Duration,
    cached_load: Duration,
    instantiate: Duration,
    call: Duration,
    per_request: Duration,
    per_request_reused: Duration,
}

async fn measure(language: &str) -> Row {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../plugins/dist/example-{language}.wasm"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}; run `cargo xtask plugins`", path.display()));
    let cache = tempfile::tempdir().unwrap();
    let config = || RuntimeConfig { cache_dir: Some(cache.path().to_path_buf()), ..RuntimeConfig::default() };

    // Compiling into an empty cache (which also writes the artifact).
    let runtime = Runtime::new(config()).unwrap();
    let start = Instant::now();
    let module = runtime.load(bytes.clone(), None).await.unwrap();
    let compile = start.elapsed();
    drop((module, runtime));

    // A new runtime finds the artifact on disk, as a restarted gateway does.
    let mut loads = Vec::new();
    let mut module = None;
    for _ in 0..5 {
        let runtime = Runtime::new(config()).unwrap();
        let start = Instant::now();
        module = Some(runtime.load(bytes.clone(), None).await.unwrap());
        loads.push(start.elapsed());
    }
    let module = module.unwrap();

    let per_request = configure(&module, Isolation::PerRequest).await;
    let reused = configure(&module, Isolation::Reused { max_idle: 4 }).await;
    let request = request();

    let instantiate = median_of(async || {
        std::hint::black_box(per_request.instance().await.unwrap());
    })
    .await;
    let mut live = per_request.instance().await.unwrap();
    let call = median_of(async || {
        let mut edited = request.clone();
        check(live.request_filter(&mut edited).await.unwrap(), edited);
    })
    .await;
    drop(live);
    let per_request_cost = median_of(async || {
        let mut instance = per_request.instance().await.unwrap();
        let mut edited = request.clone();
        check(instance.request_filter(&mut edited).await.unwrap(), edited);
    })
    .await;
    let per_request_reused = median_of(async || {
        let mut instance = reused.instance().await.unwrap();
        let mut edited = request.clone();
        check(instance.request_filter(&mut edited).await.unwrap(), edited);
    })
    .await;

    Row {
        size: bytes.len(),
        compile,
        cached_load: median(loads),
        instantiate,
        call,
        per_request: per_request_cost,
        per_request_reused,
    }
}

async fn configure(module: &Arc<PluginModule>, isolation: Isolation) -> ConfiguredPlugin {
    let limits = Limits { timeout: Duration::from_secs(5), max_memory_bytes: 256 << 20 };
    let config = serde_json::json!({"system": "Answer briefly.", "header": "x-team", "value": "search"});
    module
        .configure("bench/decorator-lite", &config, limits, isolation, sluice_runtime::Grants::default())
        .await
        .unwrap()
}

fn request() -> PluginRequest {
    const BODY: &[u8] = br#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hello"}]}"#;
    PluginRequest::chat("gpt-4o-mini", sluice_chat::ChatBody::validated(BODY.into()))
}

/// The plugin did its job, so the timing is of real work.
fn check(action: RequestAction, mut request: PluginRequest) {
    match action {
        RequestAction::Continue => assert!(request.body.bytes().windows(8).any(|w| w == br#""system""#)),
        RequestAction::Respond(response) => panic!("unexpected direct response {}", response.status),
    }
}

/// Runs `op` for a short warm-up, then for [`MEASURE_FOR`], and returns the
/// median duration of one run.
async fn median_of(mut op: impl AsyncFnMut()) -> Duration {
    let warm_up = Instant::now();
    while warm_up.elapsed() < MEASURE_FOR / 5 {
        op().await;
    }
    let mut samples = Vec::new();
    let start = Instant::now();
    while start.elapsed() < MEASURE_FOR || samples.len() < 10 {
        let one = Instant::now();
        op().await;
        samples.push(one.elapsed());
    }
    median(samples)
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn size(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

fn time(d: Duration) -> String {
    let micros = d.as_secs_f64() * 1e6;
    if micros >= 1e6 {
        format!("{:.2} s", micros / 1e6)
    } else if micros >= 1e3 {
        format!("{:.1} ms", micros / 1e3)
    } else {
        format!("{micros:.1} µs")
    }
}
