//! Plugins' shared state in a real Redis (`redis-server`), shared by two
//! gateway processes: one quota across replicas, one cache entry seen by
//! both, an outage that each failure policy rides out, and Redis over TLS.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_tests::{ConfigDir, Echo, Gateway, Options, Plugin, Redis, Reply, Route, TestCa, documents, eventually};

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

/// `rediss://` to a Redis with a CA of its own that asks for client
/// certificates: a replica given the CA and a client certificate counts
/// there; one without a client certificate fails the quota's calls as the
/// store's (a retryable 503 under `Closed`), within the plugin's deadline.
#[tokio::test]
async fn a_replica_reaches_redis_over_tls_with_a_client_certificate() {
    let ca = TestCa::new("sluice test Redis CA");
    let (echo, redis) = (Echo::start().await, Redis::start_tls(&ca).await);
    let dir = config(&echo);
    let files = tempfile::tempdir().unwrap();
    let ca_file = ca.write_pem(files.path(), "ca.pem");
    let (cert, key) = ca.write_client_cert(files.path(), "client.pem", "client.key");
    let mut args: Vec<String> = vec!["--state-redis-url".into(), redis.tls_url(), "--state-redis-timeout-ms".into()];
    args.extend(["500".into(), "--state-redis-ca-file".into(), ca_file.display().to_string()]);
    let anonymous = Gateway::start_with(&dir, Options { args: args.clone(), ..Options::default() }).await;
    args.extend(["--state-redis-client-cert-file".into(), cert.display().to_string()]);
    args.extend(["--state-redis-client-key-file".into(), key.display().to_string()]);
    let trusted = Gateway::start_with(&dir, Options { args, ..Options::default() }).await;

    for n in 1..=3 {
        let reply = chat(&trusted, "closed", &[]).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.header("x-ratelimit-remaining-requests"), Some((10 - n).to_string().as_str()));
    }
    let keys = redis.command(&["KEYS", "sluice:{default/quota}:c:*"]);
    assert!(keys.contains("sluice:{default/quota}:c:"), "counted in this Redis: {keys}");

    let started = Instant::now();
    let refused = chat(&anonymous, "closed", &[]).await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.json()["error"]["code"], "state_unavailable", "{}", refused.text());
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
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
