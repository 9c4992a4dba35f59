//! Components built for every earlier version of the plugin world (kept
//! byte for byte in tests/fixtures/plugins-v<version>) load and serve
//! unchanged on this runtime, on chat requests and on MCP messages, whose
//! fields (WIT 0.3.3) they cannot see.

use std::path::PathBuf;

use serde_json::{Value, json};

use super::*;
use crate::{Grants, McpRequest, Runtime, RuntimeConfig, test_request};

fn fixture(version: &str, name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(format!("plugins-v{version}"))
        .join(format!("{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

async fn configured(runtime: &Runtime, bytes: Vec<u8>, config: Value, grants: Grants) -> ConfiguredPlugin {
    let module = runtime.load(bytes, None).await.unwrap();
    let limits = Limits { timeout: Duration::from_secs(5), max_memory_bytes: 64 << 20 };
    module.configure("default/old", &config, limits, Isolation::PerRequest, grants).await.unwrap()
}

fn chat(headers: &[(&str, &str)]) -> PluginRequest {
    test_request(headers, json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}).to_string())
}

/// A `tools/call` as the gateway hands it to plugins.
fn mcp_call(headers: &[(&str, &str)]) -> PluginRequest {
    let arguments = json!({"city": "Oslo"});
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "weather__forecast", "arguments": arguments}});
    let mut request = test_request(headers, body.to_string());
    (request.path, request.model, request.route) = ("/mcp".into(), "weather__forecast".into(), "default/tools".into());
    request.mcp = Some(McpRequest {
        method: "tools/call".into(),
        tool: Some("weather__forecast".into()),
        arguments: Some(arguments.to_string()),
        arguments_edited: false,
    });
    request
}

/// Serves `request` and says what the plugin set in its headers: `name`'s
/// value.
async fn header_after(plugin: &ConfiguredPlugin, mut request: PluginRequest, name: &str) -> Option<String> {
    let action = plugin.instance().await.unwrap().request_filter(&mut request).await.unwrap();
    assert!(matches!(action, RequestAction::Continue), "{action:?}");
    if let Some(mcp) = &request.mcp {
        assert!(!mcp.arguments_edited, "an older component cannot edit the arguments");
    }
    request.headers.get(name).map(|value| value.to_str().unwrap().to_owned())
}

/// The add-header plugin of each version sets its header on a chat request
/// and on an MCP call alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_header_built_for_every_version_serves_chat_and_mcp() {
    let runtime = Runtime::new(RuntimeConfig { max_instances: 10, ..Default::default() }).unwrap();
    for version in ["0.2", "0.3.0", "0.3.1", "0.3.2"] {
        let config = json!({"header": "x-old", "value": version});
        let plugin = configured(&runtime, fixture(version, "add-header"), config, Grants::default()).await;
        for request in [chat(&[]), mcp_call(&[])] {
            assert_eq!(header_after(&plugin, request, "x-old").await.as_deref(), Some(version), "{version}");
        }
    }
}

/// The C example of 0.2, 0.3.0 and 0.3.2 (wit-bindgen C, another
/// toolchain's bindings) serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_c_example_built_for_earlier_versions_serves() {
    let runtime = Runtime::new(RuntimeConfig { max_instances: 10, ..Default::default() }).unwrap();
    for version in ["0.2", "0.3.0", "0.3.2"] {
        let config = json!({"system": "be brief", "header": "x-team", "value": "search"});
        let plugin = configured(&runtime, fixture(version, "example-c"), config, Grants::default()).await;
        assert_eq!(header_after(&plugin, chat(&[]), "x-team").await.as_deref(), Some("search"), "{version}");
    }
}

/// 0.3.2's imports beyond the request, in components built for it: state
/// (the stateful test plugin), and metrics, outbound HTTP and routing (the
/// caller test plugin) link and serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn components_built_for_0_3_2_with_state_metrics_outbound_and_routing_serve() {
    let runtime = Runtime::new(RuntimeConfig { max_instances: 10, ..Default::default() }).unwrap();
    let state = Grants { state: Some(sluice_state::Scope::new("default", "old")), ..Grants::default() };
    let config = json!({"limit": 5, "window": "fixed:3600"});
    let stateful = configured(&runtime, fixture("0.3.2", "stateful"), config, state).await;
    let mut request = chat(&[("x-state-reserve", "requests=2")]);
    let action = stateful.instance().await.unwrap().request_filter(&mut request).await.unwrap();
    assert!(matches!(action, RequestAction::Continue), "{action:?}");
    assert_eq!(request.response_headers.get("x-state-remaining").unwrap(), "3");

    let destination = sluice_core::EgressDestination { https: false, host: "127.0.0.1".into(), port: 9, ca: None };
    let egress = sluice_core::EgressGrant {
        destinations: vec![destination],
        timeout: None,
        max_response_bytes: None,
        max_concurrent_calls: None,
    };
    let grants = Grants { egress: Some(egress), ..Grants::default() };
    let caller = configured(&runtime, fixture("0.3.2", "caller"), json!({}), grants).await;
    for mut request in [chat(&[("x-route-model", "gpt-alt")]), mcp_call(&[("x-route-model", "gpt-alt")])] {
        let action = caller.instance().await.unwrap().request_filter(&mut request).await.unwrap();
        assert!(matches!(action, RequestAction::Continue), "{action:?}");
        assert_eq!((request.model.as_str(), request.rerouted), ("gpt-alt", true));
    }
}
