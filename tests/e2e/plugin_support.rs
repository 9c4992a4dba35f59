//! Helpers shared by the first-party plugin tests (plugin_*.rs).

use std::time::Duration;

use serde_json::{Value, json};
use sluice_tests::{ConfigDir, Echo, Gateway, Plugin, Route, documents, eventually};

/// A gateway serving `models` through `plugins`, in that order, from a
/// fresh echo upstream. Keep the returned values alive for the test.
pub async fn serve(plugins: &[Plugin], models: &[&str]) -> (Echo, ConfigDir, Gateway) {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let names: Vec<&str> = plugins.iter().map(Plugin::name).collect();
    let route = Route::new("chat", models, &echo.url()).plugins(&names);
    let mut docs: Vec<String> = plugins.iter().map(Plugin::yaml).collect();
    docs.push(route.yaml());
    dir.write("config.yaml", &documents(&docs));
    let gateway = Gateway::start(&dir).await;
    (echo, dir, gateway)
}

/// A gateway serving each plugin on a route of its own name (the route's
/// one model), from an echo; every plugin loads.
pub async fn serve_each(plugins: &[Plugin]) -> (Echo, ConfigDir, Gateway) {
    let echo = Echo::start().await;
    let mut docs: Vec<String> = plugins.iter().map(Plugin::yaml).collect();
    for plugin in plugins {
        docs.push(Route::new(plugin.name(), &[plugin.name()], &echo.url()).plugins(&[plugin.name()]).yaml());
    }
    let dir = ConfigDir::new();
    dir.write("config.yaml", &documents(&docs));
    let gateway = Gateway::start(&dir).await;
    let admin = gateway.admin_config().await;
    assert_eq!(admin["errors"], json!([]), "{admin}");
    (echo, dir, gateway)
}

/// Waits until the gateway serves exactly `routes` (sorted).
pub async fn served(gateway: &Gateway, routes: &[&str], within: Duration) -> Value {
    eventually(&format!("routes {routes:?} to be served"), within, async || {
        let admin = gateway.admin_config().await;
        let mut names: Vec<&str> = admin["routes"].as_array()?.iter().filter_map(|r| r["name"].as_str()).collect();
        names.sort();
        (names == routes).then_some(admin.clone())
    })
    .await
}

/// A chat request body for `model` with `messages`.
pub fn chat(model: &str, messages: Value) -> String {
    json!({"model": model, "messages": messages}).to_string()
}

/// The `errors` of /admin/config that concern `resource`.
pub fn errors_about<'a>(admin: &'a Value, resource: &str) -> Vec<&'a Value> {
    let errors = admin["errors"].as_array().unwrap_or_else(|| panic!("no errors list: {admin}"));
    errors.iter().filter(|e| e["resource"].as_str().is_some_and(|r| r.contains(resource))).collect()
}

/// Asserts each plugin is refused at load with a message containing its
/// expected text, and its route is not served. One gateway for all.
pub async fn assert_configs_rejected(cases: Vec<(Plugin, &str)>) {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let mut docs = Vec::new();
    for (plugin, _) in &cases {
        docs.push(plugin.yaml());
        docs.push(Route::new(plugin.name(), &[plugin.name()], &echo.url()).plugins(&[plugin.name()]).yaml());
    }
    dir.write("config.yaml", &documents(&docs));
    let gateway = Gateway::start(&dir).await;
    let admin = gateway.admin_config().await;
    for (plugin, expected) in &cases {
        let name = plugin.name();
        gateway.chat(name, &[]).await.assert_error(404, "model_not_found");
        let errors = errors_about(&admin, &format!("GatewayPlugin default/{name}"));
        assert_eq!(errors.len(), 1, "{name}: {admin}");
        let message = errors[0]["message"].as_str().unwrap_or_default();
        assert!(message.contains(expected), "{name}: expected {expected:?} in {message:?}");
    }
}
