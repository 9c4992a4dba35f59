//! What plugins' shared state costs: each store call, in process and in a
//! real Redis on loopback (`redis-server`), and what token-quota's two
//! request phases cost through the runtime with each store, with the Redis
//! commands each sends (`INFO commandstats`). Prints a table.
//!
//! Run: `cargo bench -p sluice-tests --bench state` (after `cargo xtask
//! plugins`; needs `redis-server`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sluice_core::Isolation;
use sluice_runtime::sluice_state::{
    Check, Limits, MemoryStore, RedisConfig, RedisStore, Reserved, Scope, Store, Window,
};
use sluice_runtime::{
    Limits as PluginLimits, PluginRequest, ResponseSummary, Runtime, RuntimeConfig, StateStore, Usage,
};
use sluice_tests::Redis;

const CALLS: u32 = 20_000;
const REDIS_CALLS: u32 = 5_000;
const REQUESTS: u32 = 5_000;
/// 2024-03-15T00:00:00Z: the benchmark's clock for store calls.
const NOW: u64 = 1_710_460_800_000;

fn checks() -> Vec<Check> {
    let window = Window::Fixed { seconds: 86_400 };
    vec![
        Check { key: "rpm|5:bench".into(), window: Window::Fixed { seconds: 60 }, limit: u64::MAX, amount: 1 },
        Check { key: "tokens|5:bench".into(), window, limit: u64::MAX, amount: 1500 },
    ]
}

/// The median of `runs` timings of `calls` calls each, per call.
async fn per_call(calls: u32, runs: usize, mut call: impl AsyncFnMut(u32)) -> Duration {
    let mut timings = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        for i in 0..calls {
            call(i).await;
        }
        timings.push(started.elapsed() / calls);
    }
    timings.sort();
    timings[runs / 2]
}

/// The commands clients sent Redis, from `INFO commandstats`: the
/// scripts' own calls inside Redis are listed there too, so only the
/// commands the store sends itself count (each a round trip).
fn commands(redis: &Redis) -> u64 {
    const SENT: [&str; 5] = ["cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_script:", "cmdstat_ping:", "cmdstat_hello:"];
    redis
        .command(&["INFO", "commandstats"])
        .lines()
        .filter(|line| SENT.iter().any(|sent| line.starts_with(sent)))
        .filter_map(|line| line.split("calls=").nth(1)?.split(',').next()?.parse::<u64>().ok())
        .sum()
}

/// Commands the scripts ran inside Redis, per call: what a round trip
/// costs Redis.
fn inside(redis: &Redis) -> u64 {
    let all: u64 = redis
        .command(&["INFO", "commandstats"])
        .lines()
        .filter_map(|line| line.split("calls=").nth(1)?.split(',').next()?.parse::<u64>().ok())
        .sum();
    all - commands(redis)
}

async fn store_rows(name: &str, store: &dyn Store, redis: Option<&Redis>, calls: u32) -> Vec<(String, Duration, f64)> {
    let scope = Scope::new("bench", "quota");
    let checks = checks();
    let mut rows = Vec::new();
    let mut measure = async |what: &str, duration: Duration, count: u64, calls: u32| {
        let per = count as f64 / f64::from(calls * 5);
        rows.push((format!("{name}: {what}"), duration, per));
    };
    let before = redis.map_or(0, commands);
    let reserve = per_call(calls, 5, async |_| {
        let Ok(Reserved::Granted { .. }) = store.reserve(&scope, &checks, NOW).await else { panic!("granted") };
    })
    .await;
    measure("reserve (2 checks)", reserve, redis.map_or(0, commands) - before, calls).await;
    let before = redis.map_or(0, commands);
    let commit = per_call(calls, 5, async |_| {
        let Ok(Reserved::Granted { ticket, .. }) = store.reserve(&scope, &checks, NOW).await else { panic!() };
        store.commit(&scope, ticket, &[1, 900]).await.unwrap();
    })
    .await;
    measure("reserve, then commit", commit, redis.map_or(0, commands) - before, calls).await;
    let before = redis.map_or(0, commands);
    let set = per_call(calls, 5, async |i| {
        store.set(&scope, &format!("k{}", i % 1000), &[7; 512], 60_000, NOW).await.unwrap()
    })
    .await;
    measure("set (512 B)", set, redis.map_or(0, commands) - before, calls).await;
    let before = redis.map_or(0, commands);
    let get = per_call(calls, 5, async |i| {
        store.get(&scope, &format!("k{}", i % 1000), NOW).await.unwrap();
    })
    .await;
    measure("get (512 B)", get, redis.map_or(0, commands) - before, calls).await;
    rows
}

/// token-quota's request phase (a reserve) and response end (a commit), as
/// the gateway runs them, per request.
async fn quota_rows(name: &str, state: Option<StateStore>, redis: Option<&Redis>) -> Vec<(String, Duration, f64)> {
    let runtime = Runtime::new(RuntimeConfig { max_instances: 50, state_store: state, ..Default::default() }).unwrap();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/dist/token-quota.wasm");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}; run `cargo xtask plugins`", path.display()));
    let module = runtime.load(bytes, None).await.unwrap();
    let rules = json!({"rules": [
        {"name": "rpm", "per": ["consumer"], "counts": "requests", "limit": 1_000_000_000u64, "window": {"fixed": 60}},
        {"name": "tpd", "per": ["consumer"], "counts": "tokens", "limit": 1_000_000_000_000u64, "window": {"fixed": 86400}},
    ]});
    let limits = PluginLimits { timeout: Duration::from_secs(1), max_memory_bytes: 64 << 20 };
    let scope = Some(Scope::new("bench", "quota"));
    let plugin = module
        .configure(
            "bench/quota",
            &rules,
            limits,
            Isolation::PerRequest,
            sluice_runtime::Grants { state: scope, egress: None },
        )
        .await
        .unwrap();
    plugin.snapshotted().await;
    let body = br#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hello there"}],"max_tokens":100}"#;
    let summary = ResponseSummary {
        status: 200,
        streamed: false,
        usage: Some(Usage { prompt_tokens: 12, completion_tokens: 40, total_tokens: 52 }),
        body_bytes: 300,
        completed: true,
        duration_ms: 5,
    };
    let request = || {
        let mut request = PluginRequest::chat("gpt-4o-mini", sluice_chat::ChatBody::validated(body.as_slice().into()));
        request.consumer = Some("key:bench".into());
        request
    };
    let before = redis.map_or(0, commands);
    let whole = per_call(REQUESTS, 5, async |_| {
        let mut instance = plugin.instance().await.unwrap();
        instance.request_filter(&mut request()).await.unwrap();
        instance.response_end(&summary).await.unwrap();
    })
    .await;
    let per = (redis.map_or(0, commands) - before) as f64 / f64::from(REQUESTS * 5);
    vec![(format!("{name}: token-quota, a request's two phases (2 rules)"), whole, per)]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut rows = Vec::new();
    let memory = MemoryStore::new(Limits::default());
    rows.extend(store_rows("in process", &memory, None, CALLS).await);
    let redis = Redis::start().await;
    let store = RedisStore::connect(RedisConfig::new(redis.url())).await.unwrap();
    let before = inside(&redis);
    rows.extend(store_rows("Redis (loopback)", &store, Some(&redis), REDIS_CALLS).await);
    let scripted = (inside(&redis) - before) as f64 / f64::from(REDIS_CALLS * 5 * 4);
    rows.extend(quota_rows("in process", None, None).await);
    let shared = RedisStore::connect(RedisConfig::new(redis.url())).await.unwrap();
    rows.extend(quota_rows("Redis (loopback)", Some(StateStore(Arc::new(shared))), Some(&redis)).await);

    println!("\n| store: call | time per call (median of 5 runs) | Redis round trips per call |");
    println!("|---|---:|---:|");
    for (what, time, commands) in rows {
        let commands = if what.starts_with("in process") { "—".to_string() } else { format!("{commands:.2}") };
        println!("| {what} | {:.2} µs | {commands} |", time.as_secs_f64() * 1e6);
    }
    println!("\nThe Redis store's scripts ran {scripted:.1} commands inside Redis per call, on average.");
}
