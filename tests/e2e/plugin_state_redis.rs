//! Plugins' shared state in a real Redis (`redis-server`), shared by two
//! gateway processes: one quota across replicas, one cache entry seen by
//! both, and an outage that each failure policy rides out.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_tests::{ConfigDir, Echo, Gateway, Options, Plugin, Redis, Reply, Route, documents, eventually};

/// Two routes through token-quota (10 requests an hour, for everyone),
/// one failing closed and one open, one through the `stateful` test plugin
/// and one through response-cache (shared by the route's callers).
fn config(echo: &Echo) -> ConfigDir {
    let rules = json!({"rules": [{"name": "rph", "counts": "requests", "limit": 10, "window": {"fixed": 3600}}]});
    let plugins = [
        Plugin::new("quota", "token-quota").config(rules.clone()).state(json!({})).timeout_ms(1000),
        Plugin::new("quota-open", "token-quota").config(rules).state(json!({})).timeout_ms(1000).fail_open(),
        Plugin::new("stateful", "stateful").state(json!({})).timeout_ms(1000),
        Plugin::new("cache", "response-cache").config(json!({"scope": "route"})).state(json!({})).timeout_ms(1000),
    ];
    let routes = [
        Route::new("closed", &["closed"], &echo.url()).plugins(&["quota"]),
        Route::new("open", &["open"], &echo.url()).plugins(&["quota-open"]),
        Route::new("kv", &["kv"], &echo.url()).plugins(&["stateful"]),
        Route::new("cached", &["cached"], &echo.url()).plugins(&["cache"]),
    ];
    let dir = ConfigDir::new();
    let mut docs: Vec<String> = plugins.iter().map(Plugin::yaml).collect();
    docs.extend(routes.iter().map(Route::yaml));
    dir.write("config.yaml", &documents(&docs));
    dir
}

async fn replica(dir: &ConfigDir, redis: &Redis) -> Gateway {
    let args = vec!["--state-redis-url".into(), redis.url(), "--state-redis-timeout-ms".into(), "200".into()];
    let gateway = Gateway::start_with(dir, Options { args, ..Options::default() }).await;
    let admin = gateway.admin_config().await;
    assert_eq!(admin["errors"], json!([]), "{admin}");
    let stores: Vec<&Value> = admin["plugins"].as_array().unwrap().iter().map(|p| &p["state"]["store"]).collect();
    assert!(stores.iter().all(|store| *store == "redis"), "every plugin's state is in Redis: {admin}");
    gateway
}

async fn chat(gateway: &Gateway, model: &str, headers: &[(&str, &str)]) -> Reply {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5});
    gateway.post("/v1/chat/completions", body.to_string(), headers).await
}

/// Fifteen requests at once on each of two replicas against one limit of
/// ten: ten are admitted in all, not ten each; an entry written through
/// one replica is read through the other.
#[tokio::test]
async fn two_replicas_share_one_quota_and_one_cache() {
    let (echo, redis) = (Echo::start().await, Redis::start().await);
    let dir = config(&echo);
    let (a, b) = (replica(&dir, &redis).await, replica(&dir, &redis).await);
    let both = (0..15).map(|_| chat(&a, "closed", &[])).chain((0..15).map(|_| chat(&b, "closed", &[])));
    let statuses: Vec<u16> = futures_util::future::join_all(both).await.iter().map(|r| r.status.as_u16()).collect();
    let admitted = statuses.iter().filter(|s| **s == 200).count();
    assert_eq!(admitted, 10, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 20, "{statuses:?}");

    let set = chat(&a, "kv", &[("x-state-set", "answer=42")]).await;
    assert_eq!(set.header("x-state-done"), Some("set"), "{}", set.text());
    let got = chat(&b, "kv", &[("x-state-get", "answer")]).await;
    assert_eq!(got.header("x-state-value"), Some("42"), "{}", got.text());
    // response-cache: an answer kept through one replica is a hit on the
    // other.
    let first = chat(&a, "cached", &[]).await;
    assert_eq!(first.header("x-sluice-cache"), Some("miss"), "{}", first.text());
    let second = chat(&b, "cached", &[]).await;
    assert_eq!(second.header("x-sluice-cache"), Some("hit"), "{}", second.text());
    assert_eq!(second.json(), first.json());
    // Every key a plugin wrote is under its own hash tag, so in one
    // Cluster slot.
    let keys = redis.command(&["KEYS", "sluice:*"]);
    assert!(keys.contains("sluice:{default/stateful}:e:answer"), "{keys}");
    let names: Vec<&str> = keys.lines().filter(|line| line.starts_with("sluice:")).collect();
    let plugins = ["stateful", "quota", "cache"];
    let under_its_tag = |k: &&str| plugins.iter().any(|p| k.starts_with(&format!("sluice:{{default/{p}}}:")));
    assert!(names.iter().all(under_its_tag), "{keys}");
}

/// Redis killed mid-load: a plugin failing closed answers a retryable 503
/// at once, one failing open serves uncounted, no request waits past its
/// plugin's deadline, and once Redis is back both count again, with no
/// restart of the gateway.
#[tokio::test]
async fn an_outage_follows_each_failure_policy_and_recovers() {
    let (echo, mut redis) = (Echo::start().await, Redis::start().await);
    let dir = config(&echo);
    let gateway = replica(&dir, &redis).await;
    assert_eq!(chat(&gateway, "closed", &[]).await.status, 200);

    redis.kill();
    let started = Instant::now();
    let closed = chat(&gateway, "closed", &[]).await;
    let open = chat(&gateway, "open", &[]).await;
    assert!(started.elapsed() < Duration::from_secs(3), "the outage held requests {:?}", started.elapsed());
    closed.assert_error(503, "state_unavailable");
    assert_eq!(open.status, 200, "failing open serves: {}", open.text());
    assert_eq!(open.header("x-ratelimit-remaining-requests"), None, "uncounted");
    let metrics = gateway.client().get(&gateway.admin_url("/metrics")).await.text();
    assert!(metrics.contains("outcome=\"state_unavailable\""), "counted as the store's failure");

    redis.restart().await;
    let back = eventually("the quota counts again", Duration::from_secs(15), async || {
        let reply = chat(&gateway, "closed", &[]).await;
        (reply.status == 200).then_some(reply)
    })
    .await;
    // A fresh, empty Redis: this is the window's first request again.
    assert_eq!(back.header("x-ratelimit-remaining-requests"), Some("9"));
}
