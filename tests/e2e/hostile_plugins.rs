//! Plugins that attack the host from inside the sandbox: expensive host
//! calls, blocking WASI calls, exhausting the instance pool and flooding or
//! forging the log. Each must cost only the plugin's own requests, never the
//! rest of the gateway.

use std::time::{Duration, Instant};

use serde_json::json;
use sluice_tests::{ConfigDir, Echo, Gateway, Options, Plugin, Route, documents, eventually};

/// `n` pseudo-random lowercase letters and no spaces: one long BPE piece,
/// the tokenizer's worst case.
fn random_letters(n: usize) -> String {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            char::from(b'a' + (seed % 26) as u8)
        })
        .collect()
}

/// A gateway serving each `(model, plugins)` route from `echo`, with the
/// plugins declared in `plugins`.
async fn serve(echo: &Echo, plugins: &[Plugin], routes: &[(&str, &[&str])], args: &[&str]) -> (ConfigDir, Gateway) {
    let dir = ConfigDir::new();
    dir.write("config.yaml", &config(echo, plugins, routes));
    let options = Options { args: args.iter().map(|a| a.to_string()).collect(), ..Default::default() };
    let gateway = Gateway::start_with(&dir, options).await;
    (dir, gateway)
}

fn config(echo: &Echo, plugins: &[Plugin], routes: &[(&str, &[&str])]) -> String {
    let mut docs: Vec<String> = plugins.iter().map(Plugin::yaml).collect();
    for (model, chain) in routes {
        docs.push(Route::new(&format!("route-{model}"), &[model], &echo.url()).plugins(chain).yaml());
    }
    documents(&docs)
}

/// Eight requests at a time, each with a 4 MB message of random letters,
/// through context-trim at its default 100 ms deadline. Token counting runs
/// off the async workers and within the plugin's deadline (docs/security.md,
/// T7): /healthz and a route without plugins answer promptly all along, and
/// each trimmed request ends soon after its deadline. Before, counting ran
/// on the async workers: /healthz stalled for seconds and requests took up
/// to 9 s.
#[tokio::test]
async fn healthz_and_other_routes_stay_responsive_while_tokens_are_counted() {
    let echo = Echo::start().await;
    let trim = Plugin::new("trim", "context-trim").config(json!({"models": [{"model": "*", "maxInputTokens": 1000}]}));
    let (_dir, gateway) = serve(&echo, &[trim], &[("trimmed", &["trim"]), ("plain", &[])], &[]).await;
    let body =
        json!({"model": "trimmed", "messages": [{"role": "user", "content": random_letters(4_000_000)}]}).to_string();

    let load = async {
        let mut slowest = Duration::ZERO;
        for _ in 0..2 {
            let started = Instant::now();
            let replies =
                futures_util::future::join_all((0..8).map(|_| gateway.post("/v1/chat/completions", body.clone(), &[])))
                    .await;
            slowest = slowest.max(started.elapsed());
            for reply in replies {
                // Over its deadline: the plugin fails (Closed), promptly.
                reply.assert_error(500, "plugin_failed");
            }
        }
        slowest
    };
    let probe = async {
        let mut worst_health = Duration::ZERO;
        let mut worst_plain = Duration::ZERO;
        // Until the load is over (bounded: 120 rounds of ~100 ms).
        for _ in 0..120 {
            let started = Instant::now();
            let health = gateway.client().get(&gateway.admin_url("/healthz")).await;
            assert_eq!(health.status, 200);
            worst_health = worst_health.max(started.elapsed());
            let started = Instant::now();
            assert_eq!(gateway.chat("plain", &[]).await.status, 200);
            worst_plain = worst_plain.max(started.elapsed());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (worst_health, worst_plain)
    };
    let (slowest, (worst_health, worst_plain)) = tokio::join!(load, probe);
    eprintln!("under load: /healthz at worst {worst_health:?}, plain route {worst_plain:?}, 8 trims {slowest:?}");
    // Bounds far above what it takes here (30-120 ms) and far below the
    // 8.4 s it took before the fix, so a loaded CI machine cannot flake them.
    assert!(worst_health < Duration::from_millis(1500), "/healthz took {worst_health:?} under load");
    assert!(worst_plain < Duration::from_millis(2500), "a route without plugins took {worst_plain:?} under load");
    // 8 bodies of 4 MB, parsed and copied into the guest, on 2 shared cores.
    assert!(slowest < Duration::from_secs(4), "8 trimmed requests took {slowest:?} together");
}

/// A plugin that sleeps in `configure` fails its load at its deadline
/// instead of holding up the config (docs/security.md, T7): the other
/// plugin's route is served within seconds. Before, the snapshot waited out
/// the sleep.
#[tokio::test]
async fn a_plugin_sleeping_in_configure_does_not_stall_the_others() {
    let echo = Echo::start().await;
    let sleeper = Plugin::new("sleeper", "hostile").config(json!({"sleepInConfigureMs": 40_000}));
    let tagger = Plugin::new("tagger", "add-header").config(json!({"header": "x-tagged", "value": "1"}));
    let dir = ConfigDir::new();
    dir.write("config.yaml", &config(&echo, &[sleeper, tagger], &[("slept", &["sleeper"]), ("tagged", &["tagger"])]));
    let started = Instant::now();
    let gateway = Gateway::start_live(&dir, Options::default()).await;
    let reply = eventually("the tagged route", Duration::from_secs(30), async || {
        let reply = gateway.chat("tagged", &[]).await;
        (reply.status == 200).then_some(reply)
    })
    .await;
    let took = started.elapsed();
    assert_eq!(reply.echoed()["headers"]["x-tagged"], "1");
    assert!(took < Duration::from_secs(10), "the other plugin was served only after {took:?}");
    let admin = gateway.admin_config().await;
    let errors = admin["errors"].to_string();
    assert!(errors.contains("sleeper"), "the sleeping plugin is reported: {errors}");
}

/// A plugin that sleeps while handling a request fails it at its deadline
/// (a WASI sleep is not granted), and the gateway goes on serving
/// (docs/security.md, T7). Before, the request hung for the whole 30 s
/// sleep.
#[tokio::test]
async fn a_plugin_sleeping_in_a_request_fails_at_its_deadline() {
    let echo = Echo::start().await;
    let sleeper = Plugin::new("sleeper", "hostile").timeout_ms(200);
    let (_dir, gateway) = serve(&echo, &[sleeper], &[("m", &["sleeper"])], &[]).await;
    let started = Instant::now();
    let reply = tokio::time::timeout(Duration::from_secs(10), gateway.chat("m", &[("x-hostile", "sleep")]))
        .await
        .expect("the sleeping plugin's request still hangs after 10 s");
    let took = started.elapsed();
    reply.assert_error(500, "plugin_failed");
    assert!(took < Duration::from_secs(5), "the sleeping plugin's request took {took:?}");
    let reply = gateway.chat("m", &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.echoed()["headers"]["x-hostile-seen"], "1");
}

/// With every plugin instance in use (two requests hold the two instances
/// `--max-plugin-instances 2` allows, across their slow responses), a third
/// request gets a 503 `overloaded` even through a `failurePolicy: Open`
/// plugin: exhaustion never skips a plugin (docs/security.md, T6). Before,
/// the Open plugin was silently skipped (200) and a Closed one gave a 500.
#[tokio::test]
async fn exhausted_plugin_instances_give_a_503_and_never_skip_a_plugin() {
    let echo = Echo::start().await;
    let open = Plugin::new("guard", "hostile").config(json!({"responseHooks": true})).fail_open();
    let (_dir, gateway) = serve(&echo, &[open], &[("m", &["guard"])], &["--max-plugin-instances", "2"]).await;
    let slow = [("x-echo-delay-ms", "2000")];
    let (first, second, third) = tokio::join!(gateway.chat("m", &slow), gateway.chat("m", &slow), async {
        tokio::time::sleep(Duration::from_millis(700)).await;
        gateway.chat("m", &[]).await
    });
    assert_eq!(first.status, 200);
    assert_eq!(second.status, 200);
    third.assert_error(503, "overloaded");
    // Capacity comes back with the instances.
    let reply = gateway.chat("m", &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.echoed()["headers"]["x-hostile-seen"], "1");
}

/// A plugin cannot forge log lines (newlines and escape sequences in its
/// message and fields are escaped) nor flood the log (past its rate, lines
/// are dropped and counted; docs/security.md, T8). Before, the forged line
/// stood on its own and all 10 000 flood lines were written.
#[tokio::test]
async fn plugin_logs_cannot_forge_lines_or_flood() {
    let echo = Echo::start().await;
    let hostile = Plugin::new("hostile", "hostile").timeout_ms(5000);
    let (_dir, gateway) = serve(&echo, &[hostile], &[("m", &["hostile"])], &[]).await;

    assert_eq!(gateway.chat("m", &[("x-hostile", "forge")]).await.status, 200);
    let log = eventually("the forged log line", Duration::from_secs(5), async || {
        let log = gateway.log();
        log.contains("hostile: one line").then_some(log)
    })
    .await;
    for line in log.lines().filter(|l| l.contains("forged") || l.contains("FORGED")) {
        assert!(line.contains("hostile: one line"), "a plugin forged a log line: {line:?}");
        assert!(!line.contains('\x1b') && !line.contains('\r'), "a raw control character was logged: {line:?}");
    }

    assert_eq!(gateway.chat("m", &[("x-hostile", "flood")]).await.status, 200);
    // The next line reports what was dropped.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(gateway.chat("m", &[("x-hostile", "forge")]).await.status, 200);
    let log = eventually("the dropped-lines report", Duration::from_secs(5), async || {
        let log = gateway.log();
        log.contains("dropped").then_some(log)
    })
    .await;
    let flood = log.matches("hostile: flood").count();
    assert!((10..=500).contains(&flood), "{flood} of 10000 flood lines were logged");
}
