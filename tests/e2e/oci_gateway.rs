//! The gateway serving plugins from a real OCI registry (`spec.source.oci`):
//! tags resolved to digests, a moved tag followed under `Always`, a pin
//! mismatch refused while the old version serves, registry failures kept to
//! the plugin they concern, and a restart served from the cache alone.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use sluice_oci::{Credentials, Reference, RegistryOptions};
use sluice_tests::{ConfigDir, Echo, Gateway, Options, Plugin, Registry, Route, eventually, plugin_wasm};

fn module(name: &str) -> Vec<u8> {
    std::fs::read(plugin_wasm(name)).expect("reading a built plugin")
}

fn hex_sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// Pushes `module` to `reference` with the library client.
async fn push(module: &[u8], reference: &str, credentials: Option<&Path>) {
    let scratch = tempfile::tempdir().unwrap();
    let reference: Reference = reference.parse().expect("a valid reference");
    let mut options = RegistryOptions::new(scratch.path().join("cache"));
    // A username:password file names no registry: bind it to this one.
    options.credentials = Credentials {
        credentials_file: credentials.map(Path::to_path_buf),
        registries: vec![reference.registry().to_string()],
        ..Credentials::default()
    };
    let client = sluice_oci::Registry::new(options).expect("an OCI client");
    client.push(module.to_vec(), &reference, BTreeMap::new(), None).await.expect("pushing");
}

fn probe_route(echo: &Echo, plugins: &[&str]) -> String {
    Route::new("chat", &["gpt-test"], &echo.url()).plugins(plugins).yaml()
}

/// The admin view of one plugin.
async fn admin_plugin(gateway: &Gateway, name: &str) -> Value {
    let config = gateway.admin_config().await;
    let plugins = config["plugins"].as_array().cloned().unwrap_or_default();
    plugins.into_iter().find(|p| p["name"] == format!("default/{name}")).unwrap_or(Value::Null)
}

async fn admin_error(gateway: &Gateway, resource: &str) -> Option<String> {
    let config = gateway.admin_config().await;
    config["errors"]
        .as_array()?
        .iter()
        .find(|e| e["resource"] == resource)
        .and_then(|e| e["message"].as_str().map(str::to_string))
}

async fn probe_served(gateway: &Gateway) -> bool {
    let reply = gateway.chat("gpt-test", &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.header("x-probe-served").is_some()
}

#[tokio::test]
async fn a_tag_is_served_by_digest_and_a_moved_tag_is_followed_under_always() {
    let registry = Registry::start();
    let echo = Echo::start().await;
    let reference = registry.reference("plugins/probe:v1");
    let (probe, chaos) = (module("probe"), module("chaos"));
    push(&probe, &reference, None).await;

    let dir = ConfigDir::new();
    dir.write("plugin.yaml", &Plugin::oci("probe", &reference).pull_policy("Always").config(json!({})).yaml());
    dir.write("route.yaml", &probe_route(&echo, &["probe"]));
    let options = Options { args: vec!["--oci-resync-seconds".into(), "1".into()], ..Options::default() };
    let gateway = Gateway::start_with(&dir, options).await;

    let view = admin_plugin(&gateway, "probe").await;
    assert_eq!(view["source"], format!("oci:{reference}"));
    assert_eq!(view["digest"], format!("sha256:{}", hex_sha256(&probe)));
    assert!(probe_served(&gateway).await, "the plugin from the registry runs");

    // The tag moves to another module; with `Always` the gateway follows it.
    push(&chaos, &reference, None).await;
    let chaos_digest = format!("sha256:{}", hex_sha256(&chaos));
    eventually("the moved tag to be served", Duration::from_secs(20), async || {
        (admin_plugin(&gateway, "probe").await["digest"] == chaos_digest).then_some(())
    })
    .await;
    assert!(!probe_served(&gateway).await, "the new module serves");
}

#[tokio::test]
async fn a_pin_mismatch_is_refused_and_the_old_version_keeps_serving() {
    let registry = Registry::start();
    let echo = Echo::start().await;
    let reference = registry.reference("plugins/probe:stable");
    let probe = module("probe");
    push(&probe, &reference, None).await;

    let dir = ConfigDir::new();
    let plugin = Plugin::oci("probe", &reference).config(json!({}));
    dir.write("plugin.yaml", &plugin.clone().sha256(&hex_sha256(&probe)).yaml());
    dir.write("route.yaml", &probe_route(&echo, &["probe"]));
    let gateway = Gateway::start_with(&dir, Options::default()).await;
    assert!(probe_served(&gateway).await);

    let wrong = "0".repeat(64);
    dir.write("plugin.yaml", &plugin.sha256(&wrong).yaml());
    let message = eventually("the pin mismatch to be reported", Duration::from_secs(20), async || {
        admin_error(&gateway, "GatewayPlugin default/probe").await
    })
    .await;
    assert!(message.contains(&wrong) && message.contains(&hex_sha256(&probe)), "{message}");
    assert!(message.contains("still serving the last good version"), "{message}");
    assert!(probe_served(&gateway).await, "the pinned old version still serves");
}

#[tokio::test]
async fn registry_failures_stay_with_the_plugin_they_concern() {
    let open = Registry::start();
    let locked = Registry::start_with_basic_auth("ci", "secret");
    let echo = Echo::start().await;
    let good = open.reference("plugins/probe:v1");
    push(&module("probe"), &good, None).await;
    let credentials = tempfile::tempdir().unwrap();
    let credentials_file = credentials.path().join("credentials");
    std::fs::write(&credentials_file, "ci:secret").unwrap();
    let private = locked.reference("plugins/chaos:v1");
    push(&module("chaos"), &private, Some(&credentials_file)).await;

    let dir = ConfigDir::new();
    dir.write(
        "plugins.yaml",
        &sluice_tests::documents(&[
            Plugin::oci("probe", &good).config(json!({})).yaml(),
            // No credentials for the locked registry: 401.
            Plugin::oci("private", &private).config(json!({})).yaml(),
            Plugin::oci("missing", &open.reference("plugins/nothing:v1")).config(json!({})).yaml(),
        ]),
    );
    dir.write("route.yaml", &probe_route(&echo, &["probe"]));
    dir.write("other.yaml", &Route::new("other", &["gpt-other"], &echo.url()).plugins(&["private"]).yaml());
    let gateway = Gateway::start_with(&dir, Options::default()).await;

    assert!(probe_served(&gateway).await, "the good plugin's route serves");
    let unauthorized = admin_error(&gateway, "GatewayPlugin default/private").await.expect("an error for it");
    assert!(unauthorized.contains("not authorized"), "{unauthorized}");
    let missing = admin_error(&gateway, "GatewayPlugin default/missing").await.expect("an error for it");
    assert!(missing.contains("not found"), "{missing}");
    gateway.chat("gpt-other", &[]).await.assert_error(404, "model_not_found");
    assert_eq!(admin_error(&gateway, "GatewayPlugin default/probe").await, None);
    drop(gateway);

    // With the credentials, the private plugin loads too.
    let options = Options {
        args: vec![
            "--credentials-file".into(),
            credentials_file.display().to_string(),
            "--credentials-registry".into(),
            locked.host(),
        ],
        ..Options::default()
    };
    let dir2 = ConfigDir::new();
    dir2.write("plugin.yaml", &Plugin::oci("private", &private).config(json!({})).yaml());
    dir2.write("route.yaml", &Route::new("other", &["gpt-other"], &echo.url()).plugins(&["private"]).yaml());
    let gateway = Gateway::start_with(&dir2, options).await;
    assert_eq!(admin_error(&gateway, "GatewayPlugin default/private").await, None);
    assert_eq!(gateway.chat("gpt-other", &[]).await.status, 200);
}

#[tokio::test]
async fn a_dead_registry_does_not_disturb_traffic_and_a_restart_serves_from_the_cache() {
    let mut registry = Registry::start();
    let echo = Echo::start().await;
    let reference = registry.reference("plugins/probe:v1");
    push(&module("probe"), &reference, None).await;
    let oci_cache = tempfile::tempdir().unwrap();

    let dir = ConfigDir::new();
    dir.write("plugin.yaml", &Plugin::oci("probe", &reference).pull_policy("Always").config(json!({})).yaml());
    dir.write("route.yaml", &probe_route(&echo, &["probe"]));
    let options = Options {
        oci_cache_dir: Some(oci_cache.path().to_path_buf()),
        args: vec!["--oci-resync-seconds".into(), "1".into()],
        ..Options::default()
    };
    let gateway = Gateway::start_with(&dir, options.clone()).await;
    assert!(probe_served(&gateway).await);

    // The registry dies while the gateway keeps re-resolving the tag.
    registry.kill();
    let resyncs = gateway.log().matches("config applied").count();
    for _ in 0..30 {
        assert!(probe_served(&gateway).await, "a request failed while the registry was down");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        gateway.log().matches("config applied").count() > resyncs,
        "the tag was re-resolved meanwhile: {}",
        gateway.log()
    );
    drop(gateway);

    // A restart with the registry still down serves the cached module.
    let gateway = Gateway::start_with(&dir, options).await;
    assert!(probe_served(&gateway).await, "served from the cache alone");
    // Log lines reach the file in batches (every 50 ms): wait for it.
    assert!(gateway.wait_for_log("serving the cached module").await, "{}", gateway.log());
}
