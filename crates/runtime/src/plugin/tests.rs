use crate::Grants;
use crate::built_plugin as wasm;
use serde_json::json;

use super::*;
use crate::{Runtime, RuntimeConfig};

fn limits(timeout_ms: u64) -> Limits {
    Limits { timeout: Duration::from_millis(timeout_ms), max_memory_bytes: 64 << 20 }
}

async fn configured(runtime: &Runtime, name: &str, config: serde_json::Value, timeout_ms: u64) -> ConfiguredPlugin {
    let module = runtime.load(wasm(name), None).await.unwrap();
    module.configure(name, &config, limits(timeout_ms), Isolation::PerRequest, Grants::default()).await.unwrap()
}

use crate::test_request as request;

/// A count that takes longer than the plugin's deadline ends the call
/// at the deadline, as a timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_counting_is_charged_to_the_plugins_deadline() {
    crate::tokens::warm_up();
    let runtime = Runtime::new(RuntimeConfig { max_instances: 10, ..Default::default() }).unwrap();
    let plugin = configured(&runtime, "hostile", json!({}), 100).await;
    let letters: String =
        (0..4_000_000u32).map(|i| char::from(b'a' + (i.wrapping_mul(2_654_435_761) >> 27) as u8 % 26)).collect();
    let mut instance = plugin.instance().await.unwrap();
    let started = Instant::now();
    let result = instance.request_filter(&mut request(&[("x-hostile", "count")], letters)).await;
    let took = started.elapsed();
    assert!(matches!(result, Err(PluginError::Timeout(_))), "{result:?}");
    assert!(took < Duration::from_millis(400), "a 100 ms plugin counted tokens for {took:?}");
    // A short text is counted.
    let mut instance = plugin.instance().await.unwrap();
    let mut counted = request(&[("x-hostile", "count")], "hello world".into());
    let action = instance.request_filter(&mut counted).await.unwrap();
    assert!(matches!(action, RequestAction::Continue), "the hostile plugin answered");
    assert_eq!(counted.headers.get("x-hostile-tokens").unwrap(), "2", "{:?}", counted.headers);
}

/// A plugin cannot grow the host's copy of the request without bound:
/// header edits past `MAX_HEADERS` (or past what a `HeaderMap` holds,
/// where it panics) or `MAX_HEADER_BYTES`, and body edits past the body
/// limit, fail the plugin, and the edits after the first refused one are
/// not made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_cannot_grow_the_request_without_bound() {
    use crate::headers::{MAX_HEADER_BYTES, MAX_HEADERS};
    let runtime = Runtime::new(RuntimeConfig { max_instances: 10, ..Default::default() }).unwrap();
    let plugin = configured(&runtime, "hostile", json!({}), 10_000).await;
    let body = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}"#;
    for attack in ["headers", "response-headers", "big-header", "grow"] {
        let mut sent = request(&[("x-hostile", attack)], body.into());
        sent.max_body_bytes = 4 << 20;
        let result = plugin.instance().await.unwrap().request_filter(&mut sent).await;
        assert!(matches!(&result, Err(PluginError::InvalidEdit(_))), "{attack}: {result:?}");
        for headers in [&sent.headers, &sent.response_headers] {
            let bytes: usize = headers.iter().map(|(n, v)| n.as_str().len() + v.len()).sum();
            assert!(headers.len() <= MAX_HEADERS && bytes <= MAX_HEADER_BYTES, "{attack}: {} headers", headers.len());
        }
        // One 1 MiB message past the limit at most: then edits stop.
        assert!(sent.body.len() <= (4 << 20) + (1 << 20) + 64, "{attack}: the body grew to {}", sent.body.len());
    }
}

/// The epoch ticker parks while no guest runs; a guest called after
/// that still ends at its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spinning_guest_called_while_the_ticker_is_parked_times_out() {
    let runtime = Runtime::new(RuntimeConfig { max_instances: 10, ..Default::default() }).unwrap();
    let plugin = configured(&runtime, "chaos", json!({}), 200).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut instance = plugin.instance().await.unwrap();
    let started = Instant::now();
    let result = instance.request_filter(&mut request(&[("x-chaos", "spin")], String::new())).await;
    assert!(matches!(result, Err(PluginError::Timeout(_))), "{result:?}");
    assert!(started.elapsed() < Duration::from_secs(2), "a 200 ms plugin spun for {:?}", started.elapsed());
}

/// Sleeping is not granted; a plugin that sleeps fails at once instead
/// of waiting outside its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_cannot_sleep() {
    let runtime = Runtime::new(RuntimeConfig { max_instances: 10, ..Default::default() }).unwrap();
    let module = runtime.load(wasm("hostile"), None).await.unwrap();
    let started = Instant::now();
    let config = json!({"sleepInConfigureMs": 10_000});
    let error = module
        .configure("sleeper", &config, limits(5_000), Isolation::PerRequest, Grants::default())
        .await
        .err()
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(2), "configure slept for {:?}", started.elapsed());
    assert!(error.to_string().contains("sleeping is not granted"), "{error}");

    let plugin = configured(&runtime, "hostile", json!({}), 5_000).await;
    let mut instance = plugin.instance().await.unwrap();
    let started = Instant::now();
    let result = instance.request_filter(&mut request(&[("x-hostile", "sleep")], String::new())).await;
    assert!(matches!(&result, Err(PluginError::Trap(why)) if why.contains("sleeping")), "{result:?}");
    assert!(started.elapsed() < Duration::from_secs(2), "the request slept for {:?}", started.elapsed());
}

/// WASI beyond what language runtimes need to start is not linked: a
/// plugin that opens a socket traps (it still loads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_cannot_use_sockets() {
    let runtime = Runtime::new(RuntimeConfig { max_instances: 10, ..Default::default() }).unwrap();
    let plugin = configured(&runtime, "hostile", json!({}), 5_000).await;
    let mut instance = plugin.instance().await.unwrap();
    let result = instance.request_filter(&mut request(&[("x-hostile", "connect")], String::new())).await;
    let Err(PluginError::Trap(why)) = &result else {
        panic!("the plugin used a socket: {result:?}");
    };
    assert!(why.starts_with("wasi:sockets/") && why.ends_with("is not granted to plugins"), "{why}");
}

/// A plugin has at most `max_instances_per_plugin` at work; past it,
/// `Overloaded` (a 503), not a plugin failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_plugin_has_a_concurrency_limit() {
    let config = RuntimeConfig { max_instances: 10, max_instances_per_plugin: 2, ..Default::default() };
    let runtime = Runtime::new(config).unwrap();
    let plugin = configured(&runtime, "hostile", json!({}), 1_000).await;
    let other = configured(&runtime, "add-header", json!({"header": "x", "value": "1"}), 1_000).await;
    let first = plugin.instance().await.unwrap();
    let _second = plugin.instance().await.unwrap();
    let third = plugin.instance().await;
    assert!(matches!(&third, Err(PluginError::Overloaded(_))), "{:?}", third.err());
    // Other plugins are not affected; a finished request frees its place.
    let _other = other.instance().await.unwrap();
    drop(first);
    plugin.instance().await.unwrap();
}

/// Instances share one memory budget; past it, `Overloaded`, and the
/// memory comes back when instances are dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_share_one_memory_budget() {
    let config = RuntimeConfig { max_instances: 50, max_guest_memory_bytes: 8 << 20, ..Default::default() };
    let runtime = Runtime::new(config).unwrap();
    let plugin = configured(&runtime, "hostile", json!({}), 1_000).await;
    let mut held = Vec::new();
    let error = loop {
        match plugin.instance().await {
            Ok(instance) => held.push(instance),
            Err(error) => break error,
        }
        assert!(held.len() < 50, "50 instances fit in 8 MiB");
    };
    assert!(matches!(error, PluginError::Overloaded(_)), "{error:?}");
    assert!(!held.is_empty());
    held.clear();
    plugin.instance().await.unwrap();
}

/// Idle instances hold slots of the instance pool: a plugin that needs a
/// slot when the pool is full takes the least recently used idle one's,
/// another plugin's included, as it takes idle memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_instance_gives_its_pool_slot_to_a_busy_plugin() {
    let at_once = RuntimeConfig {
        max_instances: 2,
        snapshot_settle: Duration::ZERO,
        snapshot_configure_budget: Duration::ZERO,
        ..Default::default()
    };
    let runtime = Runtime::new(at_once).unwrap();
    let header = |value: &str| json!({"header": "x-team", "value": value});
    let idle = configured(&runtime, "add-header", header("a"), 1000).await;
    assert!(idle.snapshotted().await);
    let busy = configured(&runtime, "add-header", header("b"), 1000).await;
    assert!(busy.snapshotted().await);
    let body = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}"#;
    idle.instance().await.unwrap().request_filter(&mut request(&[], body.into())).await.unwrap();
    assert_eq!(idle.instances(), (0, 1), "restored and kept");

    // Both slots for `busy`: the idle instance of the other plugin goes.
    let first = busy.instance().await.unwrap();
    let second = busy.instance().await;
    assert!(second.is_ok(), "{:?}", second.err());
    assert_eq!(idle.instances(), (0, 0));
    drop(first);
}
