//! What the gateway makes of its config: refused plugins, the admin view,
//! and the compile cache across restarts.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sluice_tests::{Backend, ConfigDir, Echo, Gateway, Options, Plugin, Route, documents, plugin_wasm};

/// The sha256 of a file's bytes, in hex.
fn sha256_hex(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The `errors` of /admin/config that concern `resource`.
fn errors_about<'a>(admin: &'a Value, resource: &str) -> Vec<&'a Value> {
    let errors = admin["errors"].as_array().unwrap_or_else(|| panic!("no errors list: {admin}"));
    errors.iter().filter(|e| e["resource"].as_str().is_some_and(|r| r.contains(resource))).collect()
}

fn route_names(admin: &Value) -> Vec<&str> {
    admin["routes"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect()
}

#[tokio::test]
async fn a_plugin_that_rejects_its_config_is_not_served() {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let rejecting = Plugin::new("rejecting", "chaos").config(json!({"rejectConfig": true}));
    let add_header = Plugin::new("add-header", "add-header").config(json!({"header": "x-team", "value": "fine"}));
    let guarded = Route::new("guarded", &["guarded"], &echo.url()).plugins(&["rejecting"]);
    let fine = Route::new("fine", &["fine"], &echo.url()).plugins(&["add-header"]);
    dir.write("config.yaml", &documents(&[rejecting.yaml(), add_header.yaml(), guarded.yaml(), fine.yaml()]));
    let gateway = Gateway::start(&dir).await;

    gateway.chat("guarded", &[]).await.assert_error(404, "model_not_found");
    assert_eq!(gateway.chat("fine", &[]).await.echoed()["headers"]["x-team"], "fine");

    let admin = gateway.admin_config().await;
    let rejected = errors_about(&admin, "GatewayPlugin default/rejecting");
    assert_eq!(rejected.len(), 1, "{admin}");
    assert!(rejected[0]["message"].as_str().unwrap().contains("config rejected on purpose"), "{admin}");
    assert_eq!(errors_about(&admin, "AIModelRoute default/guarded").len(), 1, "{admin}");
    assert_eq!(route_names(&admin), ["default/fine"]);
    assert!(gateway.wait_for_log("config rejected on purpose").await, "the rejection is logged");
}

#[tokio::test]
async fn a_module_that_does_not_match_its_sha256_pin_is_refused() {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let add_header = sha256_hex(&plugin_wasm("add-header"));
    let deny = sha256_hex(&plugin_wasm("deny"));
    let config = json!({"header": "x-team", "value": "pinned"});
    let wrong = Plugin::new("pinned-wrong", "add-header").config(config.clone()).sha256(&deny);
    let right = Plugin::new("pinned-right", "add-header").config(config).sha256(&add_header);
    let routes = [
        Route::new("wrong", &["wrong"], &echo.url()).plugins(&["pinned-wrong"]),
        Route::new("right", &["right"], &echo.url()).plugins(&["pinned-right"]),
    ];
    dir.write("plugins.yaml", &documents(&[wrong.yaml(), right.yaml()]));
    dir.write("routes.yaml", &documents(&routes.map(|r| r.yaml())));
    let gateway = Gateway::start(&dir).await;

    gateway.chat("wrong", &[]).await.assert_error(404, "model_not_found");
    assert_eq!(gateway.chat("right", &[]).await.echoed()["headers"]["x-team"], "pinned");

    let admin = gateway.admin_config().await;
    let refused = errors_about(&admin, "GatewayPlugin default/pinned-wrong");
    assert_eq!(refused.len(), 1, "{admin}");
    let message = refused[0]["message"].as_str().unwrap();
    assert!(message.contains("sha256") && message.contains(&deny) && message.contains(&add_header), "{message}");
    assert!(errors_about(&admin, "pinned-right").is_empty(), "{admin}");
}

#[tokio::test]
async fn admin_config_describes_what_is_served() {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let add_header = Plugin::new("add-header", "add-header").config(json!({
        "header": "x-team",
        "value": "admin",
        "responseHeader": {"name": "x-served-by", "value": "sluice"},
    }));
    let deny = Plugin::new("deny", "deny").config(json!({"models": ["never"]})).fail_open();
    let route = Route::new("chat", &["gpt-test", "gpt-test-mini"], &echo.url())
        .backends(vec![Backend::new(&echo.url()).model("upstream-model")])
        .plugins(&["add-header", "deny"]);
    dir.write("plugins.yaml", &documents(&[add_header.yaml(), deny.yaml()]));
    dir.write("route.yaml", &route.yaml());
    let gateway = Gateway::start(&dir).await;
    let admin = gateway.admin_config().await;

    assert!(admin["generation"].as_u64().is_some_and(|g| g >= 1), "{admin}");
    assert_eq!(admin["errors"], json!([]), "{admin}");
    assert_eq!(
        admin["routes"],
        json!([{
            "name": "default/chat",
            "models": ["gpt-test", "gpt-test-mini"],
            "backends": [{
                "url": echo.url(), "model": "upstream-model", "apiKey": false,
                "provider": "openai", "weight": 1, "priority": 0,
                "health": {"ejectedForMs": null, "consecutiveFailures": 0, "ejections": 0},
            }],
            "plugins": ["default/add-header", "default/deny"],
            "fallbacks": [],
            // Every forwarded endpoint: neither the route nor its plugins
            // narrow them.
            "endpoints": ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"],
        }])
    );

    let plugins: BTreeMap<&str, &Value> =
        admin["plugins"].as_array().unwrap().iter().map(|p| (p["name"].as_str().unwrap(), p)).collect();
    assert_eq!(plugins.keys().copied().collect::<Vec<_>>(), ["default/add-header", "default/deny"]);
    for (name, policy, hooks) in [("add-header", "Closed", json!(["request"])), ("deny", "Open", json!(["request"]))] {
        let plugin = plugins[format!("default/{name}").as_str()];
        let wasm = plugin_wasm(name);
        assert_eq!(plugin["digest"], format!("sha256:{}", sha256_hex(&wasm)), "{plugin}");
        assert_eq!(plugin["source"], format!("file:{}", wasm.display()), "{plugin}");
        assert_eq!(plugin["failurePolicy"], policy, "{plugin}");
        assert_eq!(plugin["hooks"], hooks, "{plugin}");
        assert_eq!(plugin["endpoints"].as_array().map(Vec::len), Some(4), "{plugin}");
    }

    for probe in ["/healthz", "/readyz"] {
        let reply = gateway.client().get(&gateway.admin_url(probe)).await;
        assert_eq!(reply.status, 200, "{probe}: {}", reply.text());
    }
}

/// The admin view tells whether a plugin's instances start from its
/// snapshot yet (the benchmark waits for it), or are configured each.
#[tokio::test]
async fn admin_config_tells_where_plugin_instances_start_from() {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let add_header = Plugin::new("add-header", "add-header").config(json!({"header": "x-team", "value": "a"}));
    dir.write("plugins.yaml", &add_header.yaml());
    dir.write("route.yaml", &Route::new("chat", &["gpt-test"], &echo.url()).plugins(&["add-header"]).yaml());
    let start_from = async |gateway: &Gateway| gateway.admin_config().await["plugins"][0]["instancesStartFrom"].clone();

    let gateway = Gateway::start(&dir).await;
    let first = start_from(&gateway).await;
    assert!(first == "snapshot" || first == "configure-until-snapshot", "{first}");
    sluice_tests::eventually("the snapshot", std::time::Duration::from_secs(30), async || {
        (start_from(&gateway).await == "snapshot").then_some(())
    })
    .await;

    let options = Options { args: vec!["--max-snapshot-bytes".into(), "0".into()], ..Default::default() };
    let without = Gateway::start_with(&dir, options).await;
    assert_eq!(start_from(&without).await, "configure");
}

#[tokio::test]
async fn a_restart_loads_plugins_from_the_compile_cache() {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let add_header = Plugin::new("add-header", "add-header").config(json!({"header": "x-team", "value": "cached"}));
    let deny = Plugin::new("deny", "deny").config(json!({"models": ["never"]}));
    let route = Route::new("chat", &["gpt-test"], &echo.url()).plugins(&["add-header", "deny"]);
    dir.write("config.yaml", &documents(&[add_header.yaml(), deny.yaml(), route.yaml()]));
    // A cache of its own, so what is in it was written by this test.
    let cache = tempfile::tempdir().unwrap();
    let options = Options { cache_dir: Some(cache.path().to_path_buf()), ..Options::default() };

    let first = Gateway::start_with(&dir, options.clone()).await;
    assert_eq!(first.chat("gpt-test", &[]).await.echoed()["headers"]["x-team"], "cached");
    drop(first);
    let artifacts = cached_artifacts(cache.path());
    for name in ["add-header", "deny"] {
        let hex = sha256_hex(&plugin_wasm(name));
        let prefix = format!("{hex}-");
        assert!(
            artifacts.keys().any(|file| file.starts_with(&prefix)),
            "no {name} artifact {prefix}*.cwasm in {artifacts:?}"
        );
    }

    let second = Gateway::start_with(&dir, options).await;
    assert_eq!(second.chat("gpt-test", &[]).await.echoed()["headers"]["x-team"], "cached");
    assert_eq!(
        cached_artifacts(cache.path()),
        artifacts,
        "the second start compiled again instead of loading the cache"
    );
}

/// The `*.cwasm` files in `dir`, with their modification times.
fn cached_artifacts(dir: &Path) -> BTreeMap<String, SystemTime> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap())
        .filter(|entry| entry.file_name().to_string_lossy().ends_with(".cwasm"))
        .map(|entry| (entry.file_name().to_string_lossy().into_owned(), entry.metadata().unwrap().modified().unwrap()))
        .collect()
}
