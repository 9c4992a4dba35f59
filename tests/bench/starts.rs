//! Cold and warm start with 10 plugins: a config dir with 10 GatewayPlugins
//! over the first-party plugins on one route (auth with an API key in the
//! Auth phase, then nine filters), started with an empty `--cache-dir`
//! (cold: every module compiled) and again with the same one (warm:
//! compiled modules loaded from it). Measured from spawning `sluice run` to
//! /readyz answering 200, to the first 200 through the route (its work
//! checked), and to every plugin starting its instances from a snapshot
//! (/admin/config's `instancesStartFrom`), polling every 2 ms. The goal:
//! serving within 100 ms, warm.
//!
//! The harness's `Gateway::start_with` waits for readiness itself, so this
//! bench spawns the binary (`sluice_binary()`) on its own.
//!
//! `cargo bench -p sluice-tests --bench starts` after `cargo xtask plugins`
//! and `cargo build --release -p sluice` (or `cargo xtask bench`).
//! `SLUICE_BENCH_QUICK=1` makes one run of each instead of three. Prints a
//! table.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use sluice_api::Document;
use sluice_tests::{Client, ConfigDir, Echo, Plugin, Route, chat_body, empty, sluice_binary};

const MODEL: &str = "gpt-4o-mini";
/// The key plugins/auth/example.yaml knows (its SHA-256 is in the config).
const API_KEY: &str = "sk-sluice-example-key";
const SYSTEM_PROMPT: &str = "You are a helpful assistant.";
const POLL: Duration = Duration::from_millis(2);
const TIMEOUT: Duration = Duration::from_secs(120);

fn main() {
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime");
    tokio.block_on(measure());
}

fn runs() -> usize {
    let quick = std::env::var("SLUICE_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    if quick { 1 } else { 3 }
}

/// The `config` of the GatewayPlugin in plugins/<name>/example.yaml.
fn example_config(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../plugins/{name}/example.yaml"));
    let yaml = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    sluice_api::parse_documents(&yaml)
        .into_iter()
        .find_map(|doc| match doc {
            Ok(Document::Plugin(plugin)) => Some(plugin.spec.config.unwrap_or_default()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no GatewayPlugin in {}", path.display()))
}

/// Ten GatewayPlugins, all on the one route: auth (the Auth phase, so it
/// runs first), then nine filters.
fn plugins() -> Vec<Plugin> {
    let mut template = example_config("prompt-template");
    // Plain `messages` pass too, so the bench's chat request does.
    template["allowUntemplated"] = true.into();
    vec![
        Plugin::new("auth", "auth").auth_phase().config(example_config("auth")),
        Plugin::new("team-header", "add-header").config(json!({"header": "x-team", "value": "search"})),
        Plugin::new("env-header", "add-header").config(json!({"header": "x-env", "value": "bench"})),
        Plugin::new("house-style", "prompt-decorator")
            .config(json!({"prepend": [{"role": "system", "content": SYSTEM_PROMPT}]})),
        Plugin::new("reminder", "prompt-decorator").config(example_config("prompt-decorator")),
        Plugin::new("prompt-template", "prompt-template").config(template),
        Plugin::new("prompt-guard", "prompt-guard").config(example_config("prompt-guard")).reused(4),
        Plugin::new("context-trim", "context-trim").config(example_config("context-trim")).timeout_ms(1000),
        // Denies only requests that ask for it, which the bench's do not.
        Plugin::new("deny", "deny").config(json!({"header": "x-deny", "values": ["yes"]})),
        Plugin::new("response-guard", "response-guard").config(example_config("response-guard")).reused(4),
    ]
}

/// What one start took, from spawning the process.
struct Start {
    ready: Duration,
    first_200: Duration,
    snapshots: Duration,
    /// instancesStartFrom of each plugin at the end.
    start_from: Vec<String>,
}

async fn measure() {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let plugins = plugins();
    // An Auth-phase plugin is listed like the others; it runs first.
    let chain: Vec<&str> = plugins.iter().map(Plugin::name).collect();
    let mut docs: Vec<String> = plugins.iter().map(Plugin::yaml).collect();
    docs.push(Route::new("chat", &[MODEL], &echo.url()).plugins(&chain).yaml());
    dir.write("config.yaml", &docs.join("---\n"));

    let scratch = tempfile::tempdir().expect("a scratch dir");
    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    for run in 0..runs() {
        let cache = scratch.path().join(format!("cache-{run}"));
        std::fs::create_dir(&cache).expect("an empty cache dir");
        cold.push(start(&dir, &cache, scratch.path()).await);
        warm.push(start(&dir, &cache, scratch.path()).await);
    }

    println!("10 GatewayPlugins on one route (auth in the Auth phase + 9 filters), {} run(s) each:\n", cold.len());
    println!(
        "| from spawning `sluice run` (median, min–max) | /readyz 200 | first 200 through the route | all snapshots made |"
    );
    println!("|---|---:|---:|---:|");
    for (what, starts) in [("cold: empty --cache-dir", &cold), ("warm: the same --cache-dir again", &warm)] {
        println!(
            "| {what} | {} | {} | {} |",
            summary(starts.iter().map(|s| s.ready)),
            summary(starts.iter().map(|s| s.first_200)),
            summary(starts.iter().map(|s| s.snapshots)),
        );
    }
    let warm_first = median(warm.iter().map(|s| s.first_200));
    let verdict = if warm_first <= Duration::from_millis(100) { "met" } else { "not met" };
    println!("\nGoal: serving within 100 ms warm: {verdict} ({}).", ms(warm_first));
    let last = warm.last().expect("at least one run");
    println!("instancesStartFrom at the end of the last warm run: {}", last.start_from.join(", "));
}

/// Starts `sluice run` on `dir` with `cache` and times it; kills it after.
/// The harness's `Gateway::start_with` returns once /readyz answers, too
/// late to time it, so the process is spawned here.
async fn start(dir: &ConfigDir, cache: &Path, scratch: &Path) -> Start {
    let (listen, admin) = (free_port(), free_port());
    let log = tempfile::NamedTempFile::new_in(scratch).expect("a log file");
    let started = Instant::now();
    let mut child = KillOnDrop(
        Command::new(sluice_binary())
            .arg("run")
            .arg("--config")
            .arg(dir.path())
            .args(["--listen", &listen.to_string(), "--admin", &admin.to_string()])
            .arg("--cache-dir")
            .arg(cache)
            .arg("--oci-cache-dir")
            .arg(scratch.join("oci"))
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.reopen().expect("the log file"))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", sluice_binary().display())),
    );
    let admin_client = Client::http1();
    let data_client = Client::http1();

    let readyz = format!("http://{admin}/readyz");
    let ready = poll(&mut child.0, log.path(), started, async || {
        let request = hyper::Request::get(&readyz).body(empty()).expect("a valid request");
        admin_client.try_send(request).await.is_ok_and(|reply| reply.status == 200).then_some(())
    });
    let chat = format!("http://{listen}/v1/chat/completions");
    let first_200 = async {
        let probe = async || data_client.try_send(chat_request(&chat)).await.ok().filter(|reply| reply.status == 200);
        let deadline = started + TIMEOUT;
        loop {
            if let Some(reply) = probe().await {
                return (started.elapsed(), reply);
            }
            assert!(Instant::now() < deadline, "no 200 within {TIMEOUT:?}; log:\n{}", read(log.path()));
            tokio::time::sleep(POLL).await;
        }
    };
    let ((ready, _), (first_200, reply)) = tokio::join!(ready, first_200);
    check_work(&reply.echoed());

    let admin_config = format!("http://{admin}/admin/config");
    let (snapshots, start_from) = poll(&mut child.0, log.path(), started, async || {
        let config = admin_client.get(&admin_config).await.json();
        let plugins = config["plugins"].as_array().cloned().unwrap_or_default();
        assert_eq!(plugins.len(), 10, "not 10 plugins: {config}");
        assert_eq!(config["errors"], json!([]), "config errors: {config}");
        let start_from: Vec<String> =
            plugins.iter().map(|p| p["instancesStartFrom"].as_str().unwrap_or("?").to_string()).collect();
        start_from.iter().all(|s| s != "configure-until-snapshot").then_some(start_from)
    })
    .await;

    Start { ready, first_200, snapshots, start_from }
}

/// The gateway process, killed when dropped: also when a check panics.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `probe` every [`POLL`] until it returns `Some`; returns the time
/// since `started` and the value. Panics with the log if the gateway exits
/// or [`TIMEOUT`] passes.
async fn poll<T>(
    child: &mut Child,
    log: &Path,
    started: Instant,
    mut probe: impl AsyncFnMut() -> Option<T>,
) -> (Duration, T) {
    loop {
        if let Some(value) = probe().await {
            return (started.elapsed(), value);
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the gateway exited ({status}); log:\n{}", read(log));
        }
        assert!(started.elapsed() < TIMEOUT, "timed out after {TIMEOUT:?}; log:\n{}", read(log));
        tokio::time::sleep(POLL).await;
    }
}

/// A chat request with the API key auth wants.
fn chat_request(url: &str) -> hyper::Request<BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>> {
    let body = Full::new(Bytes::from(chat_body(MODEL).to_string())).map_err(|never| match never {}).boxed();
    hyper::Request::post(url)
        .header("content-type", "application/json")
        .header("x-api-key", API_KEY)
        .body(body)
        .expect("a valid request")
}

/// The request arrived at the upstream authenticated, with both headers
/// and both system messages.
fn check_work(seen: &Value) {
    let headers = &seen["headers"];
    assert_eq!(headers["x-sluice-consumer"], "key:search-service", "{seen}");
    assert_eq!(headers["x-team"], "search", "{seen}");
    assert_eq!(headers["x-env"], "bench", "{seen}");
    assert!(headers["x-api-key"].is_null(), "the API key went upstream: {seen}");
    // house-style prepends its message, then the example's decorator
    // prepends and appends its own: four messages.
    let messages = seen["messages"].as_array().expect("messages arrived");
    assert_eq!(messages.len(), 4, "{seen}");
    assert_eq!(messages[1], json!({"role": "system", "content": SYSTEM_PROMPT}), "{seen}");
}

fn read(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_else(|e| format!("(cannot read {}: {e})", log.display()))
}

fn free_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    listener.local_addr().expect("a bound listener has an address")
}

fn median(times: impl Iterator<Item = Duration>) -> Duration {
    let mut times: Vec<Duration> = times.collect();
    times.sort();
    times[times.len() / 2]
}

fn summary(times: impl Iterator<Item = Duration>) -> String {
    let mut times: Vec<Duration> = times.collect();
    times.sort();
    let median = times[times.len() / 2];
    match (times.first(), times.last()) {
        (Some(min), Some(max)) if times.len() > 1 => format!("{} ({}–{})", ms(median), ms(*min), ms(*max)),
        _ => ms(median),
    }
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}
