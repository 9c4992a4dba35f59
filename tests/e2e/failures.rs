//! Failures fail only the request they happen in: unreachable and slow
//! upstreams, and plugins that trap, spin or exhaust their memory.

use std::time::{Duration, Instant};

use serde_json::json;
use sluice_tests::{Backend, ConfigDir, Echo, Gateway, Plugin, Route, chat_body, documents};

/// The URL of a port nothing listens on.
fn closed_port_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}/v1")
}

#[tokio::test]
async fn upstream_failures_are_reported_and_a_dead_backend_is_skipped() {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let dead = closed_port_url();
    let routes = [
        Route::new("dead", &["dead"], &dead),
        Route::new("slow", &["slow"], &echo.url()).timeout_ms(300),
        Route::new("failover", &["failover"], &dead).backends(vec![Backend::new(&dead), Backend::new(&echo.url())]),
    ];
    dir.write("routes.yaml", &documents(&routes.map(|r| r.yaml())));
    let gateway = Gateway::start(&dir).await;

    gateway.chat("dead", &[]).await.assert_error(502, "upstream_unavailable");

    let started = Instant::now();
    gateway.chat("slow", &[("x-echo-delay-ms", "3000")]).await.assert_error(504, "upstream_timeout");
    let waited = started.elapsed();
    assert!(waited < Duration::from_millis(2500), "the 300 ms route timeout fired only after {waited:?}");
    let reply = gateway.chat("slow", &[("x-echo-delay-ms", "20")]).await;
    assert_eq!(reply.echoed()["model"], "slow", "a reply within the timeout is served");

    // Backends take turns; every request that starts at the dead one must
    // fall over to the live one.
    for _ in 0..4 {
        assert_eq!(gateway.chat("failover", &[]).await.echoed()["model"], "failover");
    }
}

#[tokio::test]
async fn plugin_failures_fail_only_their_own_request() {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    // Spinning meets a 50 ms deadline; growing meets a 16 MiB memory cap,
    // with time enough to get there.
    let fast = |name: &str| Plugin::new(name, "chaos").timeout_ms(50);
    let small = |name: &str| Plugin::new(name, "chaos").timeout_ms(2000).max_memory_mib(16);
    let plugins =
        [fast("fast-closed"), fast("fast-open").fail_open(), small("small-closed"), small("small-open").fail_open()];
    let routes = plugins.clone().map(|p| {
        let name = p.name().to_string();
        Route::new(&name, &[&name], &echo.url()).plugins(&[&name]).yaml()
    });
    dir.write("plugins.yaml", &documents(&plugins.map(|p| p.yaml())));
    dir.write("routes.yaml", &documents(&routes));
    let mut gateway = Gateway::start(&dir).await;
    let models = ["fast-closed", "fast-open", "small-closed", "small-open"];

    // Untroubled, the plugin runs and marks the request.
    for model in models {
        assert_eq!(gateway.chat(model, &[]).await.echoed()["headers"]["x-chaos-seen"], "1", "{model}");
    }

    let failures = [
        ("trap", "fast", "trapped"),
        ("spin", "fast", "exceeded its 50ms deadline"),
        ("grow", "small", "memory limit of 16 MiB"),
    ];
    for (chaos, plugin, says) in failures {
        let started = Instant::now();
        let closed = format!("{plugin}-closed");
        let error = gateway.chat(&closed, &[("x-chaos", chaos)]).await.assert_error(500, "plugin_failed");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(&closed) && message.contains(says), "x-chaos: {chaos}: {message}");
        assert!(started.elapsed() < Duration::from_secs(5), "x-chaos: {chaos} took {:?}", started.elapsed());

        // Open: the failed plugin is skipped and the request goes on as it was.
        let echoed = gateway.chat(&format!("{plugin}-open"), &[("x-chaos", chaos)]).await.echoed();
        assert_eq!(echoed["headers"]["x-chaos"], chaos);
        assert!(echoed["headers"].get("x-chaos-seen").is_none(), "x-chaos: {chaos}: the plugin's edits survived");
    }

    assert!(gateway.is_running(), "the gateway process died");
    for model in models {
        assert_eq!(gateway.chat(model, &[]).await.echoed()["headers"]["x-chaos-seen"], "1", "{model} after failures");
    }
    assert!(gateway.wait_for_log("failurePolicy: Open").await, "skipping an Open plugin is logged");
}

#[tokio::test]
async fn a_spinning_plugin_does_not_hold_up_other_requests() {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let slow_chaos = Plugin::new("slow-chaos", "chaos").timeout_ms(3000);
    let add_header = Plugin::new("add-header", "add-header").config(json!({"header": "x-team", "value": "busy"}));
    let spin = Route::new("spin", &["spin"], &echo.url()).plugins(&["slow-chaos"]);
    let other = Route::new("other", &["other"], &echo.url()).plugins(&["add-header"]);
    dir.write("config.yaml", &documents(&[slow_chaos.yaml(), add_header.yaml(), spin.yaml(), other.yaml()]));
    let mut gateway = Gateway::start(&dir).await;

    // As many spinning plugins as this machine has cores, for three seconds.
    let url = gateway.url("/v1/chat/completions");
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let spinning: Vec<_> = (0..cores)
        .map(|_| {
            let (client, url) = (gateway.client().clone(), url.clone());
            tokio::spawn(async move { client.post(&url, chat_body("spin").to_string(), &[("x-chaos", "spin")]).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;

    for _ in 0..5 {
        let started = Instant::now();
        let reply = gateway.chat("other", &[]).await;
        assert_eq!(reply.echoed()["headers"]["x-team"], "busy");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "a request took {:?} beside spinning plugins",
            started.elapsed()
        );
    }
    assert!(spinning.iter().all(|s| !s.is_finished()), "the spinning requests ended before the others were tested");

    for spin in spinning {
        let error = spin.await.unwrap().assert_error(500, "plugin_failed");
        assert!(error["message"].as_str().unwrap().contains("deadline"), "{error}");
    }
    assert!(gateway.is_running());
}

/// A replica that cannot yet load a declared plugin for a reason that may
/// pass (its registry is down and the cache is empty) is not Ready; one
/// whose only problem is a permanent error in one resource is, and serves
/// the rest (docs/security.md, T9).
#[tokio::test]
async fn readyz_waits_for_transient_failures_but_not_for_permanent_ones() {
    let echo = Echo::start().await;
    // A registry that refuses connections: nothing listens on that port.
    let down = closed_port_url();
    let registry = down.trim_start_matches("http://").trim_end_matches("/v1");
    let dir = ConfigDir::new();
    let plugins = [Plugin::oci("remote", &format!("{registry}/plugins/remote:1.0"))];
    let routes = [
        Route::new("remote", &["remote"], &echo.url()).plugins(&["remote"]),
        Route::new("plain", &["plain"], &echo.url()),
    ];
    dir.write("plugins.yaml", &documents(&plugins.map(|p| p.yaml())));
    dir.write("routes.yaml", &documents(&routes.map(|r| r.yaml())));
    let gateway = Gateway::start_live(&dir, Default::default()).await;
    // Wait for the first config to be applied (its error is reported).
    let deadline = Instant::now() + Duration::from_secs(30);
    while gateway.admin_config().await["errors"].as_array().is_none_or(|e| e.is_empty()) {
        assert!(Instant::now() < deadline, "the pull failure was never reported");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(gateway.readyz().await, 503, "ready although a declared plugin is still waiting for its registry");
    // Not ready is not down: what did load is served.
    assert_eq!(gateway.chat("plain", &[]).await.echoed()["model"], "plain");

    // A permanent error (a config the plugin rejects) is reported, and does
    // not hold readiness back.
    let dir = ConfigDir::new();
    let plugins = [Plugin::new("broken", "add-header").config(json!({"no-such-field": 1}))];
    let routes = [
        Route::new("broken", &["broken"], &echo.url()).plugins(&["broken"]),
        Route::new("plain", &["plain"], &echo.url()),
    ];
    dir.write("plugins.yaml", &documents(&plugins.map(|p| p.yaml())));
    dir.write("routes.yaml", &documents(&routes.map(|r| r.yaml())));
    let gateway = Gateway::start(&dir).await;
    assert_eq!(gateway.readyz().await, 200);
    assert!(!gateway.admin_config().await["errors"].as_array().unwrap().is_empty());
    assert_eq!(gateway.chat("plain", &[]).await.echoed()["model"], "plain");
}
