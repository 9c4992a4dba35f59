//! What each first-party plugin costs per request, with the config from its
//! `plugins/<name>/example.yaml`, median and 99th percentile:
//!
//! - a new instance (from its snapshot taken after `configure`) and its drop
//!   (the pool slot reset for the next one), with restoring turned off;
//! - restoring a used instance in place after a request, as `PerRequest`
//!   does by default (`RuntimeConfig::restore_instances`);
//! - one `request-filter` call on a chat request;
//! - a whole request with each isolation: `PerRequest` (an idle restored
//!   instance, the call, the restore), `PerRequest` with new instances (new
//!   instance, call, drop), `Reused` (an idle instance, the call).
//!
//! Prints a table, with what the plugin did with the request (some examples
//! answer it directly, e.g. auth without a credential), and the RSS one more
//! loaded plugin version adds (compiled code, snapshot, an instance at work).
//!
//! Run: `cargo bench -p sluice-tests --bench plugins` (after `cargo xtask plugins`).
//! `SLUICE_BENCH_PLUGINS=context-trim,auth` measures only those,
//! `SLUICE_BENCH_SECONDS=10` each figure for longer (to profile one), and
//! `SLUICE_BENCH_KEEP_RESIDENT=bytes` sets `RuntimeConfig::keep_resident_bytes`.

// Calls that need `unsafe`, each block with a SAFETY: comment saying why
// it is sound (clippy::undocumented_unsafe_blocks checks there is one).
#![allow(unsafe_code)]

use std::path::Path;
use std::time::{Duration, Instant};

use sluice_core::Isolation;
use sluice_runtime::{ConfiguredPlugin, Grants, Limits, PluginRequest, RequestAction, Runtime, RuntimeConfig};

#[path = "example_config.rs"]
mod example_config;
use example_config::example_config;

const PLUGINS: &[&str] =
    &["prompt-template", "prompt-decorator", "context-trim", "auth", "prompt-guard", "response-guard"];

/// How long each figure is measured: a second, unless `SLUICE_BENCH_SECONDS` says.
fn measure_for() -> Duration {
    let seconds = std::env::var("SLUICE_BENCH_SECONDS").ok().and_then(|s| s.parse::<f64>().ok());
    Duration::from_secs_f64(seconds.unwrap_or(1.0))
}

/// The plugins to measure: all, unless `SLUICE_BENCH_PLUGINS` names some.
fn selected() -> Vec<&'static str> {
    match std::env::var("SLUICE_BENCH_PLUGINS") {
        Ok(names) => PLUGINS.iter().copied().filter(|p| names.split(',').any(|n| n.trim() == *p)).collect(),
        Err(_) => PLUGINS.to_vec(),
    }
}

fn main() {
    let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    println!(
        "| plugin | size | new instance (from its snapshot) | its drop (pool slot reset) | restore in place (after a request) | request-filter call | a request, `PerRequest` | a request, `PerRequest` with new instances | a request, `Reused` | RSS added | outcome |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    tokio.block_on(async {
        sluice_runtime::tokens::warm_up();
        let keep_resident = std::env::var("SLUICE_BENCH_KEEP_RESIDENT").ok().and_then(|bytes| bytes.parse().ok());
        let defaults = RuntimeConfig::default();
        let defaults =
            RuntimeConfig { keep_resident_bytes: keep_resident.unwrap_or(defaults.keep_resident_bytes), ..defaults };
        let runtime = Runtime::new(defaults.clone()).unwrap();
        let new_instances = Runtime::new(RuntimeConfig { restore_instances: false, ..defaults }).unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let limits = Limits { timeout: Duration::from_secs(5), max_memory_bytes: 64 << 20 };
        // What the runtime sets up once, for its first plugin (compile and
        // snapshot threads, their malloc arenas, the instance pool's first
        // slots), is not one more plugin version's: a plugin not in the
        // table pays it first.
        let warm_up = std::fs::read(root.join("plugins/dist/add-header.wasm")).expect("built plugins");
        let warm_up = runtime.load(warm_up, None).await.unwrap();
        let config = serde_json::json!({"header": "x-team", "value": "search"});
        let warm_up =
            warm_up.configure("add-header", &config, limits, Isolation::PerRequest, Grants::default()).await.unwrap();
        warm_up.snapshotted().await;
        warm_up.instance().await.unwrap().request_filter(&mut request()).await.unwrap();
        for name in selected() {
            let bytes = std::fs::read(root.join(format!("plugins/dist/{name}.wasm"))).expect("built plugins");
            let size = bytes.len();
            let rss_before = rss_bytes();
            let module = runtime.load(bytes, None).await.unwrap();
            let config = example_config(&root.join(format!("plugins/{name}/example.yaml")));
            let plugin =
                module.configure(name, &config, limits, Isolation::PerRequest, Grants::default()).await.unwrap();
            // Measured from its snapshot, as it serves.
            plugin.snapshotted().await;
            let request = request();
            let mut instance = plugin.instance().await.unwrap();
            let outcome = match instance.request_filter(&mut request.clone()).await.unwrap() {
                RequestAction::Continue => "continue".to_string(),
                RequestAction::Respond(response) => format!("respond {}", response.status),
            };
            let call = median_of(async || drop(instance.request_filter(&mut request.clone()).await.unwrap())).await;
            // What one more loaded plugin version holds: its code, its
            // snapshot and an instance at work.
            let rss_added = rss_bytes().saturating_sub(rss_before);
            drop(instance);
            // All that isolation costs, as a request pays it: an instance,
            // the call and the restore after it.
            let per_request = median_of(async || {
                let mut instance = plugin.instance().await.unwrap();
                drop(instance.request_filter(&mut request.clone()).await.unwrap());
            })
            .await;
            let restore = restores(&plugin, &request).await;

            // The same plugin on a runtime that makes a new instance per
            // request: the instance, its first call (its pages faulted in)
            // and its drop.
            let fresh =
                new_instances.load(std::fs::read(root.join(format!("plugins/dist/{name}.wasm"))).unwrap(), None);
            let fresh = fresh
                .await
                .unwrap()
                .configure(name, &config, limits, Isolation::PerRequest, Grants::default())
                .await
                .unwrap();
            fresh.snapshotted().await;
            let (instantiate, reset) = fresh_instances(&fresh).await;
            let per_request_fresh = median_of(async || {
                let mut instance = fresh.instance().await.unwrap();
                drop(instance.request_filter(&mut request.clone()).await.unwrap());
            })
            .await;
            let reused = module
                .configure(name, &config, limits, Isolation::Reused { max_idle: 4 }, Grants::default())
                .await
                .unwrap();
            let per_request_reused = median_of(async || {
                let mut instance = reused.instance().await.unwrap();
                drop(instance.request_filter(&mut request.clone()).await.unwrap());
            })
            .await;
            println!(
                "| {name} | {:.0} KiB | {} | {} | {} | {} | {} | {} | {} | {:.1} MiB | {outcome} |",
                size as f64 / 1024.0,
                us(instantiate),
                us(reset),
                us(restore),
                us(call),
                us(per_request),
                us(per_request_fresh),
                us(per_request_reused),
                rss_added as f64 / (1024.0 * 1024.0),
            );
        }
    });
}

fn request() -> PluginRequest {
    let body = serde_json::json!({
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "Summarise the plot of Hamlet in two sentences."}
        ]
    });
    let body = body.to_string();
    PluginRequest::chat("gpt-4o-mini", sluice_chat::ChatBody::validated(body.into()))
}

/// The median and the 99th percentile of `op` run for [`measure_for`].
async fn median_of(mut op: impl AsyncFnMut()) -> (Duration, Duration) {
    let (mut samples, measure_for) = (Vec::new(), measure_for());
    let start = Instant::now();
    while start.elapsed() < measure_for {
        let one = Instant::now();
        op().await;
        samples.push(one.elapsed());
    }
    percentiles(samples)
}

/// Fresh instances of `plugin` made and dropped for [`measure_for`]: the
/// median and 99th percentile of making one, and of dropping it (its pool
/// slot reset for the next), timed apart since the goal (a fresh instance
/// within 15 µs at p99) is about making one.
async fn fresh_instances(plugin: &ConfiguredPlugin) -> ((Duration, Duration), (Duration, Duration)) {
    let (mut made, mut dropped, measure_for) = (Vec::new(), Vec::new(), measure_for());
    let start = Instant::now();
    while start.elapsed() < measure_for {
        let one = Instant::now();
        let instance = plugin.instance().await.unwrap();
        let ready = Instant::now();
        drop(instance);
        made.push(ready - one);
        dropped.push(ready.elapsed());
    }
    (percentiles(made), percentiles(dropped))
}

/// Requests served by `plugin` for [`measure_for`]: the median and 99th
/// percentile of restoring its instance after each (the instance's drop).
async fn restores(plugin: &ConfiguredPlugin, request: &PluginRequest) -> (Duration, Duration) {
    let (mut restored, measure_for) = (Vec::new(), measure_for());
    let start = Instant::now();
    while start.elapsed() < measure_for {
        let mut instance = plugin.instance().await.unwrap();
        drop(instance.request_filter(&mut request.clone()).await.unwrap());
        let one = Instant::now();
        drop(instance);
        restored.push(one.elapsed());
    }
    percentiles(restored)
}

fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    (samples[samples.len() / 2], samples[samples.len() * 99 / 100])
}

/// Resident memory in use: what glibc keeps of freed memory (compiling a
/// plugin frees tens of MiB) is given back first, so it is not counted.
fn rss_bytes() -> u64 {
    // SAFETY: malloc_trim only releases free memory.
    unsafe { libc::malloc_trim(0) };
    let status = std::fs::read_to_string("/proc/self/status").expect("reading /proc/self/status");
    let kib = status.lines().find_map(|line| line.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next());
    kib.and_then(|kib| kib.parse::<u64>().ok()).expect("VmRSS in kB") * 1024
}

fn us((median, p99): (Duration, Duration)) -> String {
    format!("{:.1} µs (p99 {:.1})", median.as_secs_f64() * 1e6, p99.as_secs_f64() * 1e6)
}
