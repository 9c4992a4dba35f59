//! MCPRoute on the real apiserver (tests/harness/kube.rs), driven with
//! `kubectl apply`: the status the leader writes from the replicas' load
//! reports (Ready for the generation applied, a Secret that appears), what
//! the CRD's schema and CEL rules refuse before the gateway sees it, two
//! routes claiming one path (the older serves it), and paths the operator
//! grants to namespaces (`--mcp-path-claim`), whatever the routes' age.
//!
//! Whether a replica serves an MCP route is the gateway's to say
//! (`LoadReport.mcp_routes`): ready once its chain's plugins are loaded. No
//! MCP server is reached here: the server URLs name a closed loopback port.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use sluice_tests::{Gateway, KubeCluster, Options, eventually};

use crate::kubernetes::{AllNamespacesGateway, cluster_with_namespace};

const WAIT: Duration = Duration::from_secs(60);
/// Nothing listens there: the gateway does not call a server to serve a route.
const SERVER: &str = "http://127.0.0.1:9/mcp";

/// The shared cluster with the CRDs, MCPRoute's among them, and a fresh namespace.
async fn cluster(namespace: &str) -> (&'static KubeCluster, String) {
    let (cluster, ns) = cluster_with_namespace(namespace).await;
    cluster.kubectl_ok(&["wait", "--for=condition=Established", "--timeout=60s", "crd/mcproutes.sluice.dev"]).await;
    (cluster, ns)
}

/// An MCPRoute; `spec` goes under `spec:` as written (indented by 2).
fn mcp_route(namespace: &str, name: &str, spec: &str) -> String {
    let spec: String = spec.lines().map(|l| format!("  {l}\n")).collect();
    format!(
        "apiVersion: sluice.dev/v1alpha1\nkind: MCPRoute\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n{spec}"
    )
}

fn simple_spec(path: &str) -> String {
    format!("path: {path}\nservers:\n- name: tools\n  url: {SERVER}\n")
}

async fn get(cluster: &KubeCluster, namespace: &str, name: &str) -> Value {
    let out = cluster.kubectl_ok(&["get", "mcproute", name, "-n", namespace, "-o", "json"]).await;
    serde_json::from_str(&out).expect("kubectl get -o json")
}

fn condition<'a>(object: &'a Value, type_: &str) -> Option<(&'a str, &'a str)> {
    let c = object["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)?;
    Some((c["status"].as_str()?, c["reason"].as_str()?))
}

fn message<'a>(object: &'a Value, type_: &str) -> &'a str {
    let conditions = object["status"]["conditions"].as_array();
    let c = conditions.and_then(|all| all.iter().find(|c| c["type"] == type_));
    c.and_then(|c| c["message"].as_str()).unwrap_or_default()
}

/// Waits until the route's status is about its current generation and
/// `check` holds; the status last seen is in the failure message.
async fn wait_status(
    cluster: &KubeCluster,
    namespace: &str,
    name: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let mut last = Value::Null;
    let outcome = tokio::time::timeout(
        WAIT,
        eventually(what, WAIT + Duration::from_secs(5), async || {
            let object = get(cluster, namespace, name).await;
            let current = object["status"]["observedGeneration"] == object["metadata"]["generation"];
            let done = current && check(&object);
            last = object["status"].clone();
            done.then_some(object)
        }),
    )
    .await;
    outcome.unwrap_or_else(|_| panic!("timed out waiting for {what}; MCPRoute {namespace}/{name}'s status: {last:#}"))
}

fn ready(object: &Value) -> bool {
    condition(object, "Ready") == Some(("True", "Loaded"))
}

/// `kubectl apply` of `yaml`, expected to be refused: its stderr.
async fn refused(cluster: &KubeCluster, yaml: &str) -> String {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), yaml).unwrap();
    let (ok, stdout, stderr) = cluster.kubectl_result(&["apply", "-f", file.path().to_str().unwrap()]).await;
    assert!(!ok, "the API server accepted\n{yaml}\n{stdout}");
    stderr
}

/// An applied MCPRoute is served and its status says so for the generation
/// applied; a new spec is a new generation, Ready again; the printer
/// columns and the `sluice` category show it.
#[tokio::test]
async fn an_applied_mcp_route_becomes_ready_for_each_generation() {
    let (cluster, ns) = cluster("mcp-ready").await;
    let _gateway = Gateway::start_kubernetes(cluster.kubeconfig(), &ns, "replica-a", Options::default()).await;

    cluster.apply(&mcp_route(&ns, "tools", &simple_spec("/mcp/tools"))).await;
    let route = wait_status(cluster, &ns, "tools", "the MCPRoute to be Ready", ready).await;
    assert_eq!(route["status"]["observedGeneration"], 1);
    assert_eq!(route["status"]["loaded"], "1/1");
    assert_eq!(condition(&route, "Accepted"), Some(("True", "Accepted")));
    assert_eq!(condition(&route, "ResolvedRefs"), Some(("True", "ResolvedRefs")));
    let replica = &route["status"]["replicas"][0];
    assert_eq!(
        (&replica["name"], &replica["generation"], &replica["ready"]),
        (&"replica-a".into(), &1.into(), &true.into())
    );

    let spec = simple_spec("/mcp/tools") + "tools:\n  deny: [\"*__delete_*\"]\nlimits: {maxTools: 100}\n";
    cluster.apply(&mcp_route(&ns, "tools", &spec)).await;
    let route = wait_status(cluster, &ns, "tools", "generation 2 to be Ready", |r| {
        r["metadata"]["generation"] == 2 && ready(r)
    })
    .await;
    assert_eq!(route["status"]["conditions"][2]["observedGeneration"], 2);

    let table = cluster.kubectl_ok(&["get", "mcpr", "-n", &ns]).await;
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAME", "READY", "PATH", "SERVERS", "AGE"], "{table}");
    assert!(table.contains("/mcp/tools") && table.contains("True"), "{table}");
    let all = cluster.kubectl_ok(&["get", "sluice", "-n", &ns]).await;
    assert!(all.contains("mcproute.sluice.dev/tools"), "{all}");
}

/// A server's API key from a Secret: missing, the route is not resolved
/// (and not served); created, the gateway picks it up and serves the route.
#[tokio::test]
async fn an_mcp_route_waits_for_its_secret() {
    let (cluster, ns) = cluster("mcp-secret").await;
    let _gateway = Gateway::start_kubernetes(cluster.kubeconfig(), &ns, "replica-a", Options::default()).await;
    let spec = format!(
        "path: /mcp/keyed\nservers:\n- name: tools\n  url: {SERVER}\n  apiKeySecretRef: {{name: mcp-key, key: token}}\n"
    );
    cluster.apply(&mcp_route(&ns, "keyed", &spec)).await;
    let route = wait_status(cluster, &ns, "keyed", "the missing Secret in status", |r| {
        condition(r, "ResolvedRefs") == Some(("False", "SecretNotFound"))
    })
    .await;
    assert_eq!(condition(&route, "Ready"), Some(("False", "SecretNotFound")));
    assert!(message(&route, "ResolvedRefs").contains("mcp-key"), "{route:#}");

    cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: mcp-key\n  namespace: {ns}\nstringData:\n  token: sk-mcp-e2e\n"
        ))
        .await;
    let route = wait_status(cluster, &ns, "keyed", "the route to be Ready with its key", ready).await;
    assert!(!route.to_string().contains("sk-mcp-e2e"), "the key is in the status: {route:#}");
}

/// What the schema and its CEL rules refuse never reaches a gateway: a
/// server name that is no DNS label, two servers of one name, a path the
/// gateway serves itself or with a `..` segment, `tls` on plain HTTP, and
/// two API key sources.
#[tokio::test]
async fn the_api_server_refuses_what_the_schema_forbids() {
    let (cluster, ns) = cluster("mcp-schema").await;
    let server = |extra: &str| format!("- name: tools\n  url: {SERVER}\n{extra}");
    let cases = [
        ("path: /mcp\nservers:\n- name: GitHub\n  url: http://127.0.0.1:9/mcp\n".to_string(), "servers[0].name"),
        (format!("path: /mcp\nservers:\n{}{}", server(""), server("")), "two servers have the same name"),
        (format!("path: /v1/mcp\nservers:\n{}", server("")), "the gateway's own"),
        (format!("path: /mcp/../x\nservers:\n{}", server("")), "`..` segment"),
        (format!("path: /mcp/\nservers:\n{}", server("")), "spec.path"),
        (format!("path: /mcp\nservers:\n{}", server("  tls: {serverName: tools.example}\n")), "https:// servers only"),
        (
            format!("path: /mcp\nservers:\n{}", server("  apiKeyEnv: KEY\n  apiKeySecretRef: {name: k, key: t}\n")),
            "at most one of apiKeyEnv",
        ),
        ("path: /mcp\nservers: []\n".to_string(), "spec.servers"),
        (format!("path: /mcp\nservers:\n{}tools: {{allow: [\"\"]}}\n", server("")), "spec.tools.allow[0]"),
    ];
    for (spec, expected) in cases {
        let stderr = refused(cluster, &mcp_route(&ns, "bad", &spec)).await;
        assert!(stderr.contains(expected), "expected `{expected}` for\n{spec}\nkubectl said: {stderr}");
    }
    // None of them was stored.
    let (found, _, _) = cluster.kubectl_result(&["get", "mcproute", "bad", "-n", &ns]).await;
    assert!(!found);
    // The same route, valid, is accepted.
    cluster.apply(&mcp_route(&ns, "good", &simple_spec("/mcp"))).await;
}

/// Of two MCPRoutes on one path the older serves it: the younger is told
/// which route holds it (Accepted and Ready False, PathConflict) while the
/// older stays Ready; once the older is gone the younger takes the path.
#[tokio::test]
async fn the_younger_of_two_mcp_routes_on_one_path_has_a_path_conflict() {
    let (cluster, ns) = cluster("mcp-conflict").await;
    let _gateway = Gateway::start_kubernetes(cluster.kubeconfig(), &ns, "replica-a", Options::default()).await;

    cluster.apply(&mcp_route(&ns, "older", &simple_spec("/mcp/shared"))).await;
    wait_status(cluster, &ns, "older", "the older route to be Ready", ready).await;
    // Creation times have whole seconds: a second apart, age alone decides
    // (a tie would go to the first name, `older` too).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    cluster.apply(&mcp_route(&ns, "younger", &simple_spec("/mcp/shared"))).await;
    let younger = wait_status(cluster, &ns, "younger", "the path conflict in status", |r| {
        condition(r, "Ready") == Some(("False", "PathConflict"))
    })
    .await;
    assert_eq!(condition(&younger, "Accepted"), Some(("False", "PathConflict")));
    let why = message(&younger, "Accepted");
    assert!(why.contains("/mcp/shared") && why.contains(&format!("{ns}/older")), "{why}");
    let older = get(cluster, &ns, "older").await;
    assert!(ready(&older), "the older route stays Ready: {:#}", older["status"]);

    let events = cluster.kubectl_ok(&["get", "events.events.k8s.io", "-n", &ns, "-o", "json"]).await;
    let events: Value = serde_json::from_str(&events).unwrap();
    let warned = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["reason"] == "PathConflict" && e["type"] == "Warning" && e["regarding"]["name"] == "younger");
    assert!(warned, "no PathConflict Event: {events:#}");

    cluster.kubectl_ok(&["delete", "mcproute", "older", "-n", &ns]).await;
    wait_status(cluster, &ns, "younger", "the younger route to take the path", ready).await;
}

/// Whether an MCP route serves `path`: a `ping` there is answered by the
/// gateway itself, never a 404 (which a path no route serves gets).
async fn serves(gateway: &AllNamespacesGateway, path: &str) -> bool {
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    gateway.post(path, ping, &[("accept", "application/json, text/event-stream")]).await.status != 404
}

/// Age alone cannot decide whose an MCP path is: a squatter's route is the
/// oldest as soon as the owner recreates theirs. The operator grants paths
/// to namespaces (`--mcp-path-claim`): a route elsewhere is refused
/// (Accepted and Ready False, PathNotPermitted) and not served, older
/// though it is, while the owner's is Ready and served. A grant replaces
/// the default (the gateway's own namespace then claims no other path) and
/// covers the paths below its prefix, not those that merely begin with it.
#[tokio::test]
async fn mcp_path_claims_grant_paths_to_namespaces_whatever_the_routes_age() {
    let cluster = KubeCluster::start().await;
    let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds/sluice.dev.yaml");
    cluster.kubectl_ok(&["apply", "--server-side", "-f", crds.to_str().unwrap()]).await;
    cluster.kubectl_ok(&["wait", "--for=condition=Established", "--timeout=60s", "crd/mcproutes.sluice.dev"]).await;
    let (own, owner, squatter) = ("paths-gateway", "paths-owner", "paths-squatter");
    for ns in [own, owner, squatter] {
        cluster.kubectl_ok(&["create", "namespace", ns]).await;
    }
    let gateway = AllNamespacesGateway::start(&cluster, own, &["--mcp-path-claim", "paths-owner=/mcp/owner"]).await;
    let not_permitted = |r: &Value| condition(r, "Accepted") == Some(("False", "PathNotPermitted"));

    // The squatter's route comes first: the oldest on the path.
    cluster.apply(&mcp_route(squatter, "tools", &simple_spec("/mcp/owner/tools"))).await;
    let squatters = wait_status(&cluster, squatter, "tools", "the squatter's route refused", not_permitted).await;
    assert_eq!(condition(&squatters, "Ready"), Some(("False", "PathNotPermitted")), "{squatters:#}");
    let why = message(&squatters, "Accepted");
    assert!(
        why.contains(&format!("`{squatter}`"))
            && why.contains("`/mcp/owner/tools`")
            && why.contains("--mcp-path-claim"),
        "{why}"
    );
    assert!(!serves(&gateway, "/mcp/owner/tools").await, "the squatter's route is served");

    // Creation times have whole seconds: a second apart, the squatter's is the older.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let owners_route = mcp_route(owner, "tools", &simple_spec("/mcp/owner/tools"));
    cluster.apply(&owners_route).await;
    let owners = wait_status(&cluster, owner, "tools", "the owner's route to be Ready", ready).await;
    assert_eq!(condition(&owners, "Accepted"), Some(("True", "Accepted")), "{owners:#}");
    eventually("the owner's path to be served", WAIT, async || {
        serves(&gateway, "/mcp/owner/tools").await.then_some(())
    })
    .await;
    // The squatter's route stays refused for its namespace, not for a conflict.
    let squatters = get(&cluster, squatter, "tools").await;
    assert!(not_permitted(&squatters), "{:#}", squatters["status"]);

    // The owner recreates its route: the squatter's is the oldest now, and
    // still gets nothing.
    cluster.kubectl_ok(&["delete", "mcproute", "tools", "-n", owner]).await;
    cluster.apply(&owners_route).await;
    wait_status(&cluster, owner, "tools", "the recreated route to be Ready", ready).await;
    assert!(serves(&gateway, "/mcp/owner/tools").await);
    let squatters = get(&cluster, squatter, "tools").await;
    assert!(not_permitted(&squatters), "{:#}", squatters["status"]);

    // The grant replaced the default: the gateway's own namespace claims
    // nothing else; and `/mcp/ownerx` is not below `/mcp/owner`.
    cluster.apply(&mcp_route(own, "own", &simple_spec("/mcp/own"))).await;
    cluster.apply(&mcp_route(owner, "beside", &simple_spec("/mcp/ownerx"))).await;
    for (ns, name) in [(own, "own"), (owner, "beside")] {
        wait_status(&cluster, ns, name, "the route outside the grants refused", not_permitted).await;
    }
    assert!(!serves(&gateway, "/mcp/own").await && !serves(&gateway, "/mcp/ownerx").await);

    let events = cluster.kubectl_ok(&["get", "events.events.k8s.io", "-n", squatter, "-o", "json"]).await;
    let events: Value = serde_json::from_str(&events).unwrap();
    let warned = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["reason"] == "PathNotPermitted" && e["type"] == "Warning" && e["regarding"]["name"] == "tools");
    assert!(warned, "no PathNotPermitted Event: {events:#}");
}
