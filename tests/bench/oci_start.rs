//! Start-up cost of plugins from a registry, per guest language: a cold
//! start (pull, verify, compile, configure) and a warm restart served from
//! the module and compiled-artifact caches with the registry down.
//!
//! `cargo bench -p sluice-tests --bench oci_start` after `cargo xtask plugins`
//! and `cargo build -p sluice` (or `cargo xtask bench`). Prints a table.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use sluice_oci::{Reference, RegistryOptions};
use sluice_tests::{ConfigDir, Echo, Gateway, Options, Plugin, Registry, Route, plugin_wasm};

const EXAMPLES: &[&str] = &["example-rust", "example-c", "example-python", "example-js"];
const RUNS: usize = 3;

fn main() {
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime");
    tokio.block_on(measure());
}

async fn measure() {
    let mut registry = Registry::start();
    let echo = Echo::start().await;
    let scratch = tempfile::tempdir().expect("a scratch dir");
    let client = sluice_oci::Registry::new(RegistryOptions::new(scratch.path().join("push-cache"))).expect("a client");

    println!(
        "| plugin | size | cold start: pull + compile (median of {RUNS}) | warm restart, registry down (median of {RUNS}) |"
    );
    println!("|---|---|---|---|");
    let mut rows = Vec::new();
    for name in EXAMPLES {
        let bytes = std::fs::read(plugin_wasm(name)).expect("a built example");
        let reference = registry.reference(&format!("bench/{name}:v1"));
        let parsed: Reference = reference.parse().expect("a reference");
        client.push(bytes.clone(), &parsed, BTreeMap::new(), None).await.expect("pushing");
        rows.push((name, bytes.len(), reference));
    }
    let mut cold_caches = Vec::new();
    for (name, size, reference) in &rows {
        let mut cold = Vec::new();
        let mut warm = Vec::new();
        for run in 0..RUNS {
            let caches = scratch.path().join(format!("{name}-{run}"));
            let options = Options {
                cache_dir: Some(caches.join("compiled")),
                oci_cache_dir: Some(caches.join("oci")),
                ..Options::default()
            };
            let dir = ConfigDir::new();
            let config = json!({"system": "Be brief.", "header": "x-team", "value": "bench"});
            dir.write("plugin.yaml", &Plugin::oci("example", reference).config(config).yaml());
            dir.write("route.yaml", &Route::new("chat", &["gpt-test"], &echo.url()).plugins(&["example"]).yaml());
            let started = Instant::now();
            let gateway = Gateway::start_with(&dir, options.clone()).await;
            cold.push(started.elapsed());
            assert_eq!(gateway.chat("gpt-test", &[]).await.status, 200);
            drop(gateway);
            cold_caches.push((dir, options));
        }
        registry.kill();
        for (dir, options) in cold_caches.drain(..) {
            let started = Instant::now();
            let gateway = Gateway::start_with(&dir, options).await;
            warm.push(started.elapsed());
            assert_eq!(gateway.chat("gpt-test", &[]).await.status, 200);
        }
        registry.restart();
        println!("| {name} | {:.1} MiB | {} | {} |", *size as f64 / 1048576.0, ms(median(cold)), ms(median(warm)));
    }
    println!("\nBoth columns include starting the sluice process and waiting for /readyz.");
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}
