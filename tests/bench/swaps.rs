//! Hot swaps under load: one gateway (a config dir) serving a route with
//! add-header and prompt-decorator, driven open loop at a fixed rate, first
//! steady, then while add-header is swapped again and again: a config-only
//! change (its value), then a module change (plugins/dist/add-header.wasm
//! and tests/fixtures/plugins-v0.2/add-header.wasm, built for the older
//! interface, in turn; a module change sets a new value too, so it shows).
//!
//! Each request's latency is measured from the moment it was scheduled to
//! be sent, so a stall counts against every request it delayed
//! (coordinated-omission-free). A swap is served when a request's reply
//! shows its value; the next one is written a little after that.
//!
//! `cargo bench -p sluice-tests --bench swaps` after `cargo xtask plugins`
//! and `cargo build --release -p sluice` (or `cargo xtask bench`).
//! `SLUICE_BENCH_QUICK=1` makes it short. Prints tables.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use parking_lot::Mutex;
use serde_json::{Value, json};
use sluice_tests::{Client, ConfigDir, Echo, Gateway, Options, Plugin, Route, chat_body, percentile};

/// Requests per second, open loop.
const RATE: u32 = 200;
const MODEL: &str = "gpt-bench";
const HEADER: &str = "x-team";
const SYSTEM_PROMPT: &str = "You are a helpful assistant.";
/// The gateway waits this long for more file events before reloading
/// (crates/gateway/src/source/file.rs).
const SETTLE: Duration = Duration::from_millis(50);
/// Pause between a swap being served and the next one: well past the
/// settle time, so that every swap is a reload of its own.
const GAP_AFTER_SERVED: Duration = Duration::from_millis(100);
/// A request or a swap taking longer than this has failed.
const TIMEOUT: Duration = Duration::from_secs(10);

fn main() {
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime");
    tokio.block_on(measure());
}

/// (steady phase, swaps): shorter with SLUICE_BENCH_QUICK.
fn sizes() -> (Duration, usize) {
    let quick = std::env::var("SLUICE_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    if quick { (Duration::from_secs(3), 20) } else { (Duration::from_secs(10), 100) }
}

#[derive(Clone, Copy, PartialEq)]
enum Module {
    Current,
    V02,
}

fn add_header(module: Module, value: &str) -> String {
    let plugin = match module {
        Module::Current => Plugin::new("add-header", "add-header"),
        Module::V02 => Plugin::at("add-header", v02_add_header()),
    };
    plugin.config(json!({"header": HEADER, "value": value})).yaml()
}

fn v02_add_header() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/plugins-v0.2/add-header.wasm");
    path.canonicalize().unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One request of the load: when it was due, how long it took from then,
/// and the header value the upstream saw, or why it failed.
struct Outcome {
    scheduled: Instant,
    latency: Duration,
    result: Result<String, String>,
}

/// The first moment a reply showed each header value.
type Seen = Arc<Mutex<HashMap<String, Instant>>>;

async fn measure() {
    let (steady, swaps) = sizes();
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    dir.write("add-header.yaml", &add_header(Module::Current, "v0"));
    let decorator = Plugin::new("prompt-decorator", "prompt-decorator")
        .config(json!({"prepend": [{"role": "system", "content": SYSTEM_PROMPT}]}));
    let route = Route::new("bench", &[MODEL], &echo.url()).plugins(&["add-header", "prompt-decorator"]);
    dir.write("chain.yaml", &(decorator.yaml() + "---\n" + &route.yaml()));
    // An empty compiled-plugin cache: the first swap to the v0.2 module
    // compiles it, later ones find both modules compiled.
    let cache = tempfile::tempdir().expect("a cache dir");
    let options = Options { cache_dir: Some(cache.path().to_path_buf()), ..Options::default() };
    let gateway = Gateway::start_with(&dir, options).await;
    gateway.wait_for_snapshots(Duration::from_secs(60)).await;
    let url = gateway.url("/v1/chat/completions");
    let client = Client::http1();
    assert_eq!(send(&client, &url).await, Ok("v0".to_string()), "the first config does its work");

    let seen: Seen = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let load_start = Instant::now();
    let load = tokio::spawn(load(client.clone(), url.clone(), seen.clone(), stop.clone(), load_start));
    tokio::time::sleep(steady).await;

    let swaps_start = Instant::now();
    let (mut config_only, mut module_change) = (Vec::new(), Vec::new());
    let mut failed_swaps = Vec::new();
    let mut module = Module::Current;
    // When each swap was written, and whether it changed the module.
    let mut writes = Vec::new();
    let mut digest = plugin_digest(&gateway).await;
    let mut first_module_change = None;
    for i in 1..=swaps {
        let value = format!("v{i}");
        let changes_module = i % 2 == 0;
        if changes_module {
            module = if module == Module::Current { Module::V02 } else { Module::Current };
        }
        dir.write("add-header.yaml", &add_header(module, &value));
        let written = Instant::now();
        writes.push((written, changes_module));
        let served = loop {
            if let Some(at) = seen.lock().get(&value) {
                break Some(*at);
            }
            if written.elapsed() > TIMEOUT {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        let Some(served) = served else {
            failed_swaps.push(format!("swap {i} ({value}) was not served within {TIMEOUT:?}"));
            continue;
        };
        let took = served.saturating_duration_since(written);
        if changes_module {
            // The new value is served by the new module: the whole
            // declaration is applied at once. Check that it did change.
            let now = plugin_digest(&gateway).await;
            if now == digest {
                failed_swaps.push(format!("swap {i}: add-header's digest stayed {digest}"));
            }
            digest = now;
            first_module_change.get_or_insert(took);
            module_change.push(took);
        } else {
            config_only.push(took);
        }
        tokio::time::sleep(GAP_AFTER_SERVED).await;
    }
    let swaps_end = Instant::now();
    stop.store(true, Ordering::Relaxed);
    let outcomes = load.await.expect("the load task");

    let (steady_outcomes, swap_outcomes): (Vec<&Outcome>, Vec<&Outcome>) =
        outcomes.iter().filter(|o| o.scheduled < swaps_end).partition(|o| o.scheduled < swaps_start);
    println!(
        "Open loop, {RATE} req/s, latency from each request's scheduled send time; \
         add-header + prompt-decorator (isolation PerRequest) to the echo upstream.\n"
    );
    println!("| phase | requests sent | failed | p50 | p99 | max |");
    println!("|---|---:|---:|---:|---:|---:|");
    let steady_stats = phase_row(&format!("steady ({:.0} s)", steady.as_secs_f64()), &steady_outcomes);
    let swap_stats =
        phase_row(&format!("during {swaps} swaps ({:.1} s)", (swaps_end - swaps_start).as_secs_f64()), &swap_outcomes);
    // The swap phase again, each request under the kind of the last swap
    // written before it was due.
    let after_module_change =
        |o: &Outcome| writes.iter().rev().find(|(at, _)| *at <= o.scheduled).is_some_and(|&(_, module)| module);
    let (after_module, after_config): (Vec<&Outcome>, Vec<&Outcome>) =
        swap_outcomes.iter().partition(|o| after_module_change(o));
    phase_row("… after a config-only change", &after_config);
    phase_row("… after a module change", &after_module);
    if let (Some(steady_p99), Some(swap_p99)) = (steady_stats, swap_stats) {
        println!("\np99 during swaps / steady p99: {:.2}× (goal ≤ 1.5×)", swap_p99 / steady_p99);
    }
    report_failures(&outcomes);

    println!(
        "\n| file change → new behaviour (includes the {} ms settle; seen by the load, 1 request / {} ms) | swaps | p50 | p99 | max |",
        SETTLE.as_millis(),
        1000 / RATE
    );
    println!("|---|---:|---:|---:|---:|");
    for (what, samples) in
        [("config-only (add-header's value)", &mut config_only), ("module change", &mut module_change)]
    {
        if samples.is_empty() {
            continue;
        }
        samples.sort();
        println!(
            "| {what} | {} | {} | {} | {} |",
            samples.len(),
            ms(percentile(samples, 0.5)),
            ms(percentile(samples, 0.99)),
            ms(*samples.last().expect("not empty"))
        );
    }
    if let Some(first) = first_module_change {
        println!("\nThe first module change (compiling the v0.2 module into the empty cache) took {}.", ms(first));
    }
    if !failed_swaps.is_empty() {
        println!("\nSwaps that failed ({}):", failed_swaps.len());
        for failure in &failed_swaps {
            println!("- {failure}");
        }
    }
    drop(echo);
}

/// Schedules one request every 1/RATE s from `start` until `stop`, each on
/// its own task, and returns what became of them.
async fn load(client: Client, url: String, seen: Seen, stop: Arc<AtomicBool>, start: Instant) -> Vec<Outcome> {
    let period = Duration::from_secs(1) / RATE;
    let mut requests = tokio::task::JoinSet::new();
    for i in 0.. {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let scheduled = start + period * i;
        tokio::time::sleep_until(scheduled.into()).await;
        let (client, url, seen) = (client.clone(), url.clone(), seen.clone());
        requests.spawn(async move {
            let result = send(&client, &url).await;
            let done = Instant::now();
            if let Ok(value) = &result {
                seen.lock().entry(value.clone()).or_insert(done);
            }
            Outcome { scheduled, latency: done - scheduled, result }
        });
    }
    requests.join_all().await
}

/// One chat request: the add-header value the upstream saw, if the reply is
/// a 200 and the chain did its work.
async fn send(client: &Client, url: &str) -> Result<String, String> {
    let body = Full::new(Bytes::from(chat_body(MODEL).to_string())).map_err(|never| match never {}).boxed();
    let request =
        hyper::Request::post(url).header("content-type", "application/json").body(body).expect("a valid request");
    let reply = match tokio::time::timeout(TIMEOUT, client.try_send(request)).await {
        Err(_) => return Err(format!("no reply within {TIMEOUT:?}")),
        Ok(Err(e)) => return Err(format!("transport: {e}")),
        Ok(Ok(reply)) => reply,
    };
    if reply.status != 200 {
        return Err(format!("{}: {}", reply.status, reply.text().chars().take(200).collect::<String>()));
    }
    let seen = serde_json::from_slice::<Value>(&reply.body)
        .ok()
        .and_then(|reply| reply["choices"][0]["message"]["content"].as_str().map(str::to_string))
        .and_then(|content| serde_json::from_str::<Value>(&content).ok())
        .ok_or_else(|| format!("200 but not an echo: {}", reply.text()))?;
    let decorated = seen["messages"][0] == json!({"role": "system", "content": SYSTEM_PROMPT});
    match seen["headers"][HEADER].as_str() {
        Some(value) if decorated => Ok(value.to_string()),
        _ => Err(format!("200 but not decorated: {seen}")),
    }
}

/// Prints one phase's row; returns its p99 in ms.
fn phase_row(name: &str, outcomes: &[&Outcome]) -> Option<f64> {
    let failed = outcomes.iter().filter(|o| o.result.is_err()).count();
    let mut latencies: Vec<Duration> = outcomes.iter().filter(|o| o.result.is_ok()).map(|o| o.latency).collect();
    latencies.sort();
    let Some(max) = latencies.last().copied() else {
        println!("| {name} | {} | {failed} | - | - | - |", outcomes.len());
        return None;
    };
    let p99 = percentile(&latencies, 0.99);
    println!(
        "| {name} | {} | {failed} | {} | {} | {} |",
        outcomes.len(),
        ms(percentile(&latencies, 0.5)),
        ms(p99),
        ms(max)
    );
    Some(p99.as_secs_f64() * 1000.0)
}

/// Every distinct failure, with how often it happened.
fn report_failures(outcomes: &[Outcome]) {
    let mut errors = BTreeMap::<&str, usize>::new();
    for outcome in outcomes {
        if let Err(e) = &outcome.result {
            *errors.entry(e.as_str()).or_default() += 1;
        }
    }
    if !errors.is_empty() {
        println!("\nFailed requests (latencies above are of the successful ones):");
        for (error, count) in errors {
            println!("- {count}×: {error}");
        }
    }
}

async fn plugin_digest(gateway: &Gateway) -> String {
    let config = gateway.admin_config().await;
    let plugins = config["plugins"].as_array().cloned().unwrap_or_default();
    let plugin = plugins.iter().find(|p| p["name"].as_str().is_some_and(|name| name.ends_with("add-header")));
    plugin.and_then(|p| p["digest"].as_str()).unwrap_or_else(|| panic!("no add-header in {config}")).to_string()
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}
