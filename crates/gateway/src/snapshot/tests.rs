use std::path::PathBuf;

use sluice_core::{BackendDecl, Isolation};
use sluice_runtime::RuntimeConfig;

use super::*;

#[test]
fn backend_labels_carry_no_credentials() {
    assert_eq!(&*url_label("https://user:secret@api.example.com/v1"), "https://api.example.com/v1");
    assert_eq!(&*url_label("http://127.0.0.1:9000/v1"), "http://127.0.0.1:9000/v1");
    // An `@` in the path is not userinfo.
    assert_eq!(&*url_label("http://h/v1/@x"), "http://h/v1/@x");
}

/// A plugin that sluice-test-programs built from plugins/.
fn dist(name: &str) -> PathBuf {
    PathBuf::from(sluice_test_programs::path(name))
}

fn plugin(name: &str, path: PathBuf, config: serde_json::Value) -> PluginDecl {
    PluginDecl {
        key: ResourceKey::new("default", name),
        source: PluginSource::File(path),
        phase: Phase::Filter,
        sha256: None,
        config,
        failure_policy: FailurePolicy::Closed,
        timeout: Duration::from_secs(5),
        max_memory_bytes: 64 << 20,
        isolation: Isolation::PerRequest,
        endpoints: Endpoints::ALL,
        state: None,
        egress: None,
    }
}

fn add_header(value: &str) -> PluginDecl {
    plugin("add-header", dist("add-header"), serde_json::json!({"header": "x-team", "value": value}))
}

fn route(name: &str, models: &[&str], plugins: &[&str]) -> RouteDecl {
    RouteDecl {
        backends: vec![BackendDecl::new("http://127.0.0.1:1/v1")],
        plugins: plugins.iter().map(|p| ResourceKey::new("default", *p)).collect(),
        ..RouteDecl::new(ResourceKey::new("default", name), models.iter().map(|m| m.to_string()).collect())
    }
}

fn runtime() -> Runtime {
    Runtime::new(RuntimeConfig { max_instances: 20, ..Default::default() }).unwrap()
}

async fn apply(
    runtime: &Runtime,
    previous: &Snapshot,
    plugins: Vec<PluginDecl>,
    routes: Vec<RouteDecl>,
) -> (Snapshot, BuildReport) {
    let desired = DesiredConfig { revision: 0, plugins, routes, ..Default::default() };
    build(runtime, None, &desired, previous, Duration::from_secs(60), &Arc::default()).await
}

fn served_by(snapshot: &Snapshot, model: &str) -> Option<String> {
    snapshot.route_for(model).map(|r| r.decl.key.name.clone())
}

#[tokio::test]
async fn an_unchanged_plugin_is_not_loaded_again() {
    let runtime = runtime();
    let (first, report) = apply(&runtime, &Snapshot::default(), vec![add_header("a")], vec![]).await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let (second, _) = apply(&runtime, &first, vec![add_header("a")], vec![]).await;
    let key = ResourceKey::new("default", "add-header");
    assert!(Arc::ptr_eq(&first.plugins[&key], &second.plugins[&key]), "same declaration and bytes were reloaded");
    // A config change is a new version of the same module.
    let (third, _) = apply(&runtime, &second, vec![add_header("b")], vec![]).await;
    assert!(!Arc::ptr_eq(&second.plugins[&key], &third.plugins[&key]));
    assert_eq!(second.plugins[&key].digest(), third.plugins[&key].digest());
    assert_eq!(third.generation, 3);
}

#[tokio::test]
async fn a_plugin_that_fails_to_load_keeps_its_last_good_version() {
    let runtime = runtime();
    let routes = vec![route("chat", &["m"], &["add-header"])];
    let (first, _) = apply(&runtime, &Snapshot::default(), vec![add_header("a")], routes.clone()).await;
    let good = first.plugins[&ResourceKey::new("default", "add-header")].digest().to_string();

    let broken = plugin("add-header", PathBuf::from("/nonexistent/no-such-plugin.wasm"), serde_json::json!({}));
    let (second, report) = apply(&runtime, &first, vec![broken], routes.clone()).await;
    let state = &report.plugins[&ResourceKey::new("default", "add-header")];
    assert!(!state.ready);
    assert_eq!(state.reason.as_deref(), Some(reason::LOAD_FAILED));
    assert_eq!(state.digest.as_deref(), Some(good.as_str()), "the state names the version still served");
    assert!(report.errors[0].message.contains("still serving the last good version"), "{:?}", report.errors);
    assert_eq!(served_by(&second, "m").as_deref(), Some("chat"));
    assert_eq!(second.route_for("m").unwrap().chain[0].decl.config["value"], "a");

    // A config the plugin rejects, with no last good version: reported, nothing served.
    let rejected = plugin("fresh", dist("add-header"), serde_json::json!({"header": "bad name"}));
    let (third, report) = apply(&runtime, &Snapshot::default(), vec![rejected], vec![]).await;
    assert!(third.plugins.is_empty());
    assert_eq!(report.plugins[&ResourceKey::new("default", "fresh")].digest, None);
}

#[tokio::test]
async fn a_route_whose_chain_is_missing_keeps_its_last_good_version_or_is_not_served() {
    let runtime = runtime();
    let (first, _) =
        apply(&runtime, &Snapshot::default(), vec![add_header("a")], vec![route("chat", &["m"], &["add-header"])])
            .await;
    // The route now names a plugin that does not exist.
    let (second, report) =
        apply(&runtime, &first, vec![add_header("a")], vec![route("chat", &["m", "n"], &["nope"])]).await;
    let state = &report.routes[&ResourceKey::new("default", "chat")];
    assert_eq!(state.reason.as_deref(), Some(reason::CHAIN_NOT_READY));
    assert_eq!(served_by(&second, "m").as_deref(), Some("chat"), "the last good route serves");
    assert_eq!(served_by(&second, "n"), None, "the failed generation's new model is not served");

    let (third, report) = apply(&runtime, &Snapshot::default(), vec![], vec![route("new", &["x"], &["nope"])]).await;
    assert!(!report.routes[&ResourceKey::new("default", "new")].ready);
    assert_eq!(served_by(&third, "x"), None);
}

#[tokio::test]
async fn a_model_claimed_by_two_routes_goes_to_the_first_and_the_second_is_reported() {
    let runtime = runtime();
    let routes = vec![route("a", &["m1", "m2"], &[]), route("b", &["m2", "m3"], &[])];
    let (snapshot, report) = apply(&runtime, &Snapshot::default(), vec![], routes).await;
    assert_eq!(served_by(&snapshot, "m2").as_deref(), Some("a"));
    assert_eq!(served_by(&snapshot, "m3"), None, "a conflicting route is not served at all");
    let b = &report.routes[&ResourceKey::new("default", "b")];
    assert_eq!(b.reason.as_deref(), Some(reason::MODEL_CONFLICT));
    assert!(report.routes[&ResourceKey::new("default", "a")].ready);
}

/// A route gives a model up to a newer route, and its own new generation
/// fails to build; its last good version still claims the model, but the
/// newer route's claim wins.
#[tokio::test]
async fn a_model_moved_to_another_route_is_not_won_back_by_a_stale_last_good_route() {
    let runtime = runtime();
    let (first, _) = apply(&runtime, &Snapshot::default(), vec![], vec![route("old", &["m"], &[])]).await;
    assert_eq!(served_by(&first, "m").as_deref(), Some("old"));
    let routes = vec![route("old", &["other"], &["missing"]), route("new", &["m"], &[])];
    let (second, report) = apply(&runtime, &first, vec![], routes).await;
    assert!(!report.routes[&ResourceKey::new("default", "old")].ready);
    assert_eq!(served_by(&second, "m").as_deref(), Some("new"), "the stale route won the model back");
}

/// An Auth-phase plugin that declares no request hook would be skipped
/// on every request, letting everything through.
#[tokio::test]
async fn an_auth_plugin_without_a_request_hook_is_refused() {
    let runtime = runtime();
    let response_only = serde_json::json!({"requestHook": false, "responseHooks": true});
    let mut guard = plugin("guard", dist("hostile"), response_only);
    guard.phase = Phase::Auth;
    let routes = vec![route("chat", &["m"], &["guard"])];
    let (snapshot, report) = apply(&runtime, &Snapshot::default(), vec![guard], routes).await;
    let state = &report.plugins[&ResourceKey::new("default", "guard")];
    assert!(!state.ready, "an Auth plugin with no request hook was loaded");
    assert!(state.error.as_deref().unwrap_or_default().contains("request hook"), "{state:?}");
    assert_eq!(served_by(&snapshot, "m"), None);
}

/// A route serves only the endpoints its whole chain understands, so no
/// plugin is handed a body it cannot read; one whose chain understands
/// none of its own is not served.
#[tokio::test]
async fn a_route_serves_the_endpoints_its_whole_chain_understands() {
    let runtime = runtime();
    let chat = Endpoints::parse(&["/v1/chat/completions"]).unwrap();
    let mut chat_only = add_header("a");
    chat_only.endpoints = Endpoints::parse(&["/v1/chat/completions", "/v1/embeddings"]).unwrap();
    let mut limited = route("limited", &["m"], &["add-header"]);
    limited.endpoints = Endpoints::parse(&["/v1/chat/completions", "/v1/responses"]).unwrap();
    let mut disjoint = route("disjoint", &["n"], &["add-header"]);
    disjoint.endpoints = Endpoints::parse(&["/v1/responses"]).unwrap();
    let routes = vec![limited, disjoint, route("open", &["o"], &[])];
    let (snapshot, report) = apply(&runtime, &Snapshot::default(), vec![chat_only], routes).await;
    assert_eq!(snapshot.route_for("m").unwrap().endpoints, chat);
    assert_eq!(snapshot.route_for("o").unwrap().endpoints, Endpoints::ALL);
    assert_eq!(served_by(&snapshot, "n"), None);
    let state = &report.routes[&ResourceKey::new("default", "disjoint")];
    assert!(state.error.as_deref().unwrap_or_default().contains("no endpoint is understood"), "{state:?}");
}

#[tokio::test]
async fn auth_plugins_run_first_whatever_the_route_order() {
    let runtime = runtime();
    let mut auth = plugin("deny", dist("deny"), serde_json::json!({"header": "x-t", "values": ["b"]}));
    auth.phase = Phase::Auth;
    let routes = vec![route("chat", &["m"], &["add-header", "deny"])];
    let (snapshot, _) = apply(&runtime, &Snapshot::default(), vec![add_header("a"), auth], routes).await;
    let chain: Vec<_> = snapshot.route_for("m").unwrap().chain.iter().map(|p| p.decl.key.name.clone()).collect();
    assert_eq!(chain, ["deny", "add-header"]);
}

/// MC5: an MCP route's servers are held to the backend policy, as a
/// route's backends are: under `--restrict-backends`, a server on loopback
/// or the metadata service is refused before the route is served.
#[tokio::test]
async fn an_mcp_server_the_backend_policy_refuses_is_not_served() {
    let runtime = runtime();
    let restricted = Arc::new(sluice_core::BackendPolicy { restricted: true, ..Default::default() });
    for url in ["http://127.0.0.1:8000/mcp", "http://169.254.169.254/mcp", "http://[::1]:8000/mcp"] {
        let mut decl = sluice_core::McpRouteDecl::new(ResourceKey::new("team", "tools"), "/mcp");
        decl.servers.push(sluice_core::McpServerDecl {
            name: "inside".into(),
            url: url.into(),
            api_key: None,
            timeout: Duration::from_secs(1),
            tls: None,
        });
        let desired = DesiredConfig { mcp_routes: vec![decl.clone()], ..Default::default() };
        let (open, report) =
            build(&runtime, None, &desired, &Snapshot::default(), Duration::from_secs(60), &Arc::default()).await;
        assert!(open.mcp_route("/mcp").is_some(), "{url}: {:?}", report.errors);
        let (closed, report) =
            build(&runtime, None, &desired, &Snapshot::default(), Duration::from_secs(60), &restricted).await;
        assert!(closed.mcp_route("/mcp").is_none(), "{url} was served under --restrict-backends");
        let state = &report.mcp_routes[&decl.key];
        assert_eq!((state.ready, state.reason.as_deref()), (false, Some(reason::NOT_PERMITTED)), "{url}: {state:?}");
    }
}
