//! Isolation: plugins' shared state (docs/security.md, S1–S3). The
//! `stateful` test plugin (plugins/testing/stateful) drives
//! `sluice:plugin/state` from request headers, so each test plays a
//! tenant's plugin against the gateway's store.

use serde_json::{Value, json};
use sluice_tests::{ConfigDir, Echo, Gateway, Options, Reply};

/// A GatewayPlugin in `namespace` running the `stateful` plugin, with
/// `state` (the grant, as YAML flow) if given.
fn stateful(namespace: &str, name: &str, config: Value, state: Option<&str>) -> String {
    let file = Value::from(sluice_tests::plugin_wasm("stateful").to_string_lossy());
    let grant = state.map(|s| format!("  state: {s}\n")).unwrap_or_default();
    format!(
        "apiVersion: sluice.dev/v1alpha1\nkind: GatewayPlugin\nmetadata:\n  name: {name}\n  namespace: {namespace}\n\
         spec:\n  source:\n    file: {file}\n  config: {config}\n  failurePolicy: Closed\n{grant}"
    )
}

/// An AIModelRoute in `namespace` serving `model` through `plugin`.
fn route(namespace: &str, model: &str, url: &str, plugin: &str) -> String {
    format!(
        "apiVersion: sluice.dev/v1alpha1\nkind: AIModelRoute\nmetadata:\n  name: route-{model}\n  namespace: {namespace}\n\
         spec:\n  models: [{model}]\n  backends:\n    - url: {}\n  plugins:\n    - name: {plugin}\n",
        Value::from(url)
    )
}

async fn chat(gateway: &Gateway, model: &str, headers: &[(&str, &str)]) -> Reply {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    gateway.post("/v1/chat/completions", body.to_string(), headers).await
}

/// Two tenants run the same plugin under the same name, and a third plugin
/// of the first tenant too, each asking for the same keys: none sees or
/// spends another's entries or counters.
#[tokio::test]
async fn a_plugin_reaches_only_its_own_state_whatever_key_it_names() {
    let echo = Echo::start().await;
    let limit = json!({"limit": 3, "window": "fixed:3600"});
    let docs = [
        stateful("tenant-a", "quota", limit.clone(), Some("{}")),
        route("tenant-a", "model-a", &echo.url(), "quota"),
        stateful("tenant-b", "quota", limit.clone(), Some("{}")),
        route("tenant-b", "model-b", &echo.url(), "quota"),
        stateful("tenant-a", "other", limit, Some("{}")),
        route("tenant-a", "model-a2", &echo.url(), "other"),
    ];
    let dir = ConfigDir::new();
    dir.write("state.yaml", &docs.join("---\n"));
    let gateway = Gateway::start(&dir).await;

    // Entries under one key.
    let set = chat(&gateway, "model-a", &[("x-state-set", "shared=from-a")]).await;
    assert_eq!(set.header("x-state-done"), Some("set"), "{}", set.text());
    for (model, seen) in [("model-b", "-"), ("model-a2", "-"), ("model-a", "from-a")] {
        let got = chat(&gateway, model, &[("x-state-get", "shared")]).await;
        assert_eq!(got.status, 200, "{model}: {}", got.text());
        assert_eq!(got.header("x-state-value"), Some(seen), "{model} reads `shared`");
    }
    // A key naming another scope's path is still this plugin's own key.
    for key in ["tenant-a/quota/shared", "{tenant-a/quota}:shared", "../quota/shared"] {
        let got = chat(&gateway, "model-b", &[("x-state-get", key)]).await;
        assert_eq!(got.header("x-state-value"), Some("-"), "tenant-b reading {key:?}");
    }

    // Counters under one key: tenant-a spends its whole limit...
    for remaining in ["2", "1", "0"] {
        let granted = chat(&gateway, "model-a", &[("x-state-reserve", "requests=1")]).await;
        assert_eq!(granted.status, 200, "{}", granted.text());
        assert_eq!(granted.header("x-state-remaining"), Some(remaining));
    }
    let refused = chat(&gateway, "model-a", &[("x-state-reserve", "requests=1")]).await;
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(refused.header("x-state-remaining"), Some("0"));
    // ...and the others' counters under the same key are untouched.
    for model in ["model-b", "model-a2"] {
        let granted = chat(&gateway, model, &[("x-state-reserve", "requests=1")]).await;
        assert_eq!(granted.status, 200, "{model}: {}", granted.text());
        assert_eq!(granted.header("x-state-remaining"), Some("2"), "{model}");
    }
}

/// The same component without `spec.state` is refused when it loads, with
/// the reason in /admin/config, while the granted copy beside it serves:
/// a grant is read from the resource, never assumed.
#[tokio::test]
async fn a_component_that_imports_state_without_a_grant_is_refused_at_load() {
    let echo = Echo::start().await;
    let docs = [
        stateful("tenant-a", "granted", json!({}), Some("{}")),
        route("tenant-a", "granted", &echo.url(), "granted"),
        stateful("tenant-b", "ungranted", json!({}), None),
        route("tenant-b", "ungranted", &echo.url(), "ungranted"),
    ];
    let dir = ConfigDir::new();
    dir.write("state.yaml", &docs.join("---\n"));
    let gateway = Gateway::start(&dir).await;

    let admin = gateway.admin_config().await;
    let errors = admin["errors"].as_array().unwrap_or_else(|| panic!("no errors list: {admin}"));
    let refusal = errors
        .iter()
        .find(|e| e["resource"].as_str().is_some_and(|r| r.contains("tenant-b/ungranted")))
        .unwrap_or_else(|| panic!("no refusal of tenant-b/ungranted: {admin}"));
    let message = refusal.to_string();
    assert!(message.contains("sluice:plugin/state") && message.contains("spec.state"), "{message}");

    chat(&gateway, "ungranted", &[]).await.assert_error(404, "model_not_found");
    let served = chat(&gateway, "granted", &[("x-state-set", "k=v")]).await;
    assert_eq!(served.header("x-state-done"), Some("set"), "{}", served.text());
}

/// Each plugin's state is capped (its grant's `maxKeys`, the gateway's
/// value size): past a cap the plugin gets a `refused` error it can handle
/// (here: a 503 naming it), nothing is stored, and another plugin's room is
/// untouched.
#[tokio::test]
async fn a_plugin_cannot_store_past_its_caps() {
    let echo = Echo::start().await;
    let docs = [
        stateful("tenant-a", "small", json!({}), Some("{maxKeys: 2}")),
        route("tenant-a", "small", &echo.url(), "small"),
        stateful("tenant-b", "neighbour", json!({}), Some("{}")),
        route("tenant-b", "neighbour", &echo.url(), "neighbour"),
    ];
    let dir = ConfigDir::new();
    dir.write("state.yaml", &docs.join("---\n"));
    let options = Options { args: vec!["--state-max-value-bytes".into(), "64".into()], ..Options::default() };
    let gateway = Gateway::start_with(&dir, options).await;

    // Where each plugin's state is kept, and its caps, in /admin/config.
    let admin = gateway.admin_config().await;
    let state_of = |name: &str| {
        let plugins = admin["plugins"].as_array().unwrap_or_else(|| panic!("no plugins: {admin}"));
        plugins.iter().find(|p| p["name"] == name).map(|p| p["state"].clone()).unwrap_or_default()
    };
    assert_eq!(state_of("tenant-a/small"), json!({"store": "in-process", "maxKeys": 2, "maxBytes": 16 << 20}));
    assert_eq!(state_of("tenant-b/neighbour")["maxKeys"], 10_000, "{admin}");

    for key in ["k1", "k2"] {
        let set = chat(&gateway, "small", &[("x-state-set", &format!("{key}=v"))]).await;
        assert_eq!(set.header("x-state-done"), Some("set"), "{key}: {}", set.text());
    }
    let third = chat(&gateway, "small", &[("x-state-set", "k3=v")]).await;
    assert_eq!(third.status, 503, "{}", third.text());
    let why = third.header("x-state-error").unwrap_or_default();
    assert!(why.starts_with("refused:") && why.contains('2'), "the cap, named: {why}");
    let got = chat(&gateway, "small", &[("x-state-get", "k3")]).await;
    assert_eq!(got.header("x-state-value"), Some("-"), "nothing stored past the cap");
    // Overwriting a key it holds is within its caps.
    let again = chat(&gateway, "small", &[("x-state-set", "k1=w")]).await;
    assert_eq!(again.header("x-state-done"), Some("set"), "{}", again.text());

    let big = "x".repeat(65);
    let too_big = chat(&gateway, "neighbour", &[("x-state-set", &format!("big={big}"))]).await;
    assert_eq!(too_big.status, 503, "{}", too_big.text());
    assert!(too_big.header("x-state-error").is_some_and(|why| why.starts_with("refused:")));
    for key in ["k1", "k2", "k3"] {
        let set = chat(&gateway, "neighbour", &[("x-state-set", &format!("{key}=v"))]).await;
        assert_eq!(set.header("x-state-done"), Some("set"), "the neighbour's room: {key}: {}", set.text());
    }
}
