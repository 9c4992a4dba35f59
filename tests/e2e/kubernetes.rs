//! Sluice on a real Kubernetes API server (kube-apiserver + etcd built from
//! the Go module proxy, see tests/harness/kube.rs), driven with real
//! `kubectl apply`: traffic through applied plugins, status and Events,
//! zero-error swaps, OCI repoints and bad references, Secrets, apiserver
//! validation, deletion, two replicas with one status writer, an apiserver
//! restart, the deploy/ manifests, and what a resource may ask of the
//! gateway (its files and environment, models across namespaces).
//!
//! The tests share one apiserver and isolate by namespace; the restart test
//! has its own.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::Value;
use sluice_oci::{Reference, RegistryOptions};
use sluice_tests::{Echo, Gateway, KubeCluster, Options, Prometheus, Registry, eventually, plugin_wasm};
use tokio::sync::OnceCell;

const WAIT: Duration = Duration::from_secs(60);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().unwrap()
}

fn sha256_of(path: &Path) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(std::fs::read(path).unwrap())))
}

/// The shared cluster with the CRDs installed, and a fresh namespace.
pub(crate) async fn cluster_with_namespace(name: &str) -> (&'static KubeCluster, String) {
    static CRDS: OnceCell<()> = OnceCell::const_new();
    let cluster = KubeCluster::shared().await;
    CRDS.get_or_init(|| install_crds(cluster)).await;
    cluster.kubectl_ok(&["create", "namespace", name]).await;
    (cluster, name.to_string())
}

async fn install_crds(cluster: &KubeCluster) {
    let crds = repo_root().join("crds/sluice.dev.yaml");
    cluster.kubectl_ok(&["apply", "--server-side", "-f", crds.to_str().unwrap()]).await;
    cluster
        .kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/gatewayplugins.sluice.dev",
            "crd/aimodelroutes.sluice.dev",
        ])
        .await;
}

fn plugin_yaml(namespace: &str, name: &str, spec: &str) -> String {
    format!(
        "apiVersion: sluice.dev/v1alpha1\nkind: GatewayPlugin\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n{}",
        indent(spec)
    )
}

fn route_yaml(
    namespace: &str,
    name: &str,
    model: &str,
    upstream: &str,
    plugins: &[&str],
    backend_extra: &str,
) -> String {
    let plugins: String = plugins.iter().map(|p| format!("\n  - name: {p}")).collect();
    format!(
        "apiVersion: sluice.dev/v1alpha1\nkind: AIModelRoute\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n  models: [{model}]\n  backends:\n  - url: {upstream}\n{}  plugins:{}\n",
        indent(&indent(backend_extra)),
        if plugins.is_empty() { " []".to_string() } else { plugins }
    )
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

/// add-header from plugins/dist, pushed to a registry of its own: in a
/// cluster, plugins come from OCI (the gateway reads no host file for a
/// resource unless its operator allows the directory).
struct AddHeader {
    _registry: Registry,
    reference: String,
}

impl AddHeader {
    async fn push() -> AddHeader {
        let registry = Registry::start();
        let reference = registry.reference("plugins/add-header:1");
        push("add-header", &reference).await;
        AddHeader { _registry: registry, reference }
    }

    fn spec(&self, value: &str) -> String {
        format!("source:\n  oci: {}\nconfig:\n  header: x-team\n  value: {value}\n", self.reference)
    }
}

async fn get(cluster: &KubeCluster, namespace: &str, kind: &str, name: &str) -> Value {
    let out = cluster.kubectl_ok(&["get", kind, name, "-n", namespace, "-o", "json"]).await;
    serde_json::from_str(&out).expect("kubectl get -o json")
}

fn condition<'a>(object: &'a Value, type_: &str) -> Option<(&'a str, &'a str)> {
    let conditions = object["status"]["conditions"].as_array()?;
    let c = conditions.iter().find(|c| c["type"] == type_)?;
    Some((c["status"].as_str()?, c["reason"].as_str()?))
}

/// Waits until the object's status is about its current generation and `check` holds.
async fn wait_status(
    cluster: &KubeCluster,
    namespace: &str,
    kind: &str,
    name: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    eventually(what, WAIT, async || {
        let object = get(cluster, namespace, kind, name).await;
        let current = object["status"]["observedGeneration"] == object["metadata"]["generation"];
        (current && check(&object)).then_some(object)
    })
    .await
}

async fn team_header(gateway: &Gateway, model: &str) -> Option<String> {
    let reply = gateway.chat(model, &[]).await;
    if reply.status != 200 {
        return None;
    }
    reply.echoed()["headers"]["x-team"].as_str().map(str::to_string)
}

#[tokio::test]
async fn applied_resources_serve_traffic_report_status_swap_without_errors_and_delete() {
    let (cluster, ns) = cluster_with_namespace("applied").await;
    let echo = Echo::start().await;
    let add_header = AddHeader::push().await;
    let gateway = Gateway::start_kubernetes(cluster.kubeconfig(), &ns, "replica-a", Options::default()).await;

    cluster.apply(&plugin_yaml(&ns, "add-header", &add_header.spec("one"))).await;
    cluster.apply(&route_yaml(&ns, "chat", "gpt-k8s", &echo.url(), &["add-header"], "")).await;
    eventually("traffic through the applied plugin", WAIT, async || {
        (team_header(&gateway, "gpt-k8s").await.as_deref() == Some("one")).then_some(())
    })
    .await;

    let digest = sha256_of(&plugin_wasm("add-header"));
    let plugin = wait_status(cluster, &ns, "gatewayplugin", "add-header", "the plugin to be Ready", |p| {
        condition(p, "Ready") == Some(("True", "Loaded"))
    })
    .await;
    assert_eq!(plugin["status"]["digest"], digest.as_str());
    assert_eq!(plugin["status"]["loaded"], "1/1");
    assert_eq!(plugin["status"]["shortDigest"], &digest["sha256:".len().."sha256:".len() + 12]);
    assert_eq!(condition(&plugin, "Accepted"), Some(("True", "Accepted")));
    assert_eq!(condition(&plugin, "ResolvedRefs"), Some(("True", "ResolvedRefs")));
    assert_eq!(plugin["status"]["replicas"][0]["name"], "replica-a");
    wait_status(cluster, &ns, "aimodelroute", "chat", "the route to be Ready", |r| {
        condition(r, "Ready") == Some(("True", "Loaded")) && r["status"]["loaded"] == "1/1"
    })
    .await;

    // Printer columns, and an Event for the load.
    let table = cluster.kubectl_ok(&["get", "gp", "-n", &ns]).await;
    assert!(table.contains("READY") && table.contains("LOADED") && table.contains(&digest[7..19]), "{table}");
    let table = cluster.kubectl_ok(&["get", "sluice", "-n", &ns]).await;
    assert!(
        table.contains("gatewayplugin.sluice.dev/add-header") && table.contains("aimodelroute.sluice.dev/chat"),
        "{table}"
    );
    let events = cluster.kubectl_ok(&["get", "events.events.k8s.io", "-n", &ns, "-o", "json"]).await;
    let events: Value = serde_json::from_str(&events).unwrap();
    assert!(
        events["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["reason"] == "Loaded" && e["regarding"]["name"] == "add-header"),
        "{events:#}"
    );

    // A config change swaps in under load: every request succeeds.
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let url = gateway.url("/v1/chat/completions");
    let load = tokio::spawn({
        let (stop, sent, failed) = (stop.clone(), sent.clone(), failed.clone());
        async move {
            let client = sluice_tests::Client::http1();
            while !stop.load(Ordering::Relaxed) {
                let reply = client.post(&url, sluice_tests::chat_body("gpt-k8s").to_string(), &[]).await;
                sent.fetch_add(1, Ordering::Relaxed);
                if reply.status != 200 {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    });
    cluster.apply(&plugin_yaml(&ns, "add-header", &add_header.spec("two"))).await;
    eventually("the new config to serve", WAIT, async || {
        (team_header(&gateway, "gpt-k8s").await.as_deref() == Some("two")).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    assert!(sent.load(Ordering::Relaxed) > 10, "the load ran");
    assert_eq!(failed.load(Ordering::Relaxed), 0, "no request failed during the swap");
    wait_status(cluster, &ns, "gatewayplugin", "add-header", "status for generation 2", |p| {
        p["metadata"]["generation"] == 2 && condition(p, "Ready") == Some(("True", "Loaded"))
    })
    .await;

    // The leader's reconciles, as a real Prometheus scrapes them.
    let prometheus = Prometheus::start(&[gateway.admin_addr()]).await;
    for kind in ["GatewayPlugin", "AIModelRoute"] {
        let reconciled = format!(r#"sluice_reconciles_total{{kind="{kind}",result="ok"}} > 0"#);
        prometheus.wait_for(&reconciled, Duration::from_secs(60)).await;
        let timed = prometheus.query(&format!(r#"sluice_reconcile_duration_seconds_count{{kind="{kind}"}}"#)).await;
        assert!(timed.len() == 1 && timed[0].1 > 0.0, "{kind}: {timed:?}");
    }

    // Deleting the route takes it out of the data plane.
    cluster.kubectl_ok(&["delete", "aimodelroute", "chat", "-n", &ns]).await;
    eventually("the deleted route to be gone", WAIT, async || {
        (gateway.chat("gpt-k8s", &[]).await.status == 404).then_some(())
    })
    .await;
}

/// A backend a replica has taken out of rotation shows in the route's
/// status, under that replica, and leaves it when the backend is back.
#[tokio::test]
async fn ejected_backends_show_in_route_status_until_they_return() {
    let (cluster, ns) = cluster_with_namespace("ejected").await;
    let echo = Echo::start().await;
    let gateway = Gateway::start_kubernetes(cluster.kubeconfig(), &ns, "replica-a", Options::default()).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let dead = format!("http://127.0.0.1:{port}/v1");
    let route = format!(
        "apiVersion: sluice.dev/v1alpha1\nkind: AIModelRoute\nmetadata:\n  name: chat\n  namespace: {ns}\nspec:\n  \
         models: [gpt-ejected]\n  backends:\n  - {{url: '{dead}'}}\n  - {{url: '{}', priority: 1}}\n  \
         outlierDetection: {{consecutiveFailures: 1, baseEjectionMs: 5000}}\n",
        echo.url()
    );
    cluster.apply(&route).await;
    // The dead backend fails a connect, is skipped for the live one, and is
    // ejected.
    eventually("traffic", WAIT, async || (gateway.chat("gpt-ejected", &[]).await.status == 200).then_some(())).await;
    let ejected = serde_json::json!([dead]);
    wait_status(cluster, &ns, "aimodelroute", "chat", "the ejected backend in status", |r| {
        r["status"]["replicas"][0]["ejectedBackends"] == ejected
    })
    .await;
    wait_status(cluster, &ns, "aimodelroute", "chat", "the backend back, out of status", |r| {
        r["status"]["replicas"][0]["name"] == "replica-a" && r["status"]["replicas"][0]["ejectedBackends"].is_null()
    })
    .await;
}

#[tokio::test]
async fn secrets_reach_plugin_config_and_backends_and_rotations_are_picked_up() {
    let (cluster, ns) = cluster_with_namespace("secrets").await;
    let echo = Echo::start().await;
    let add_header = AddHeader::push().await;
    let gateway = Gateway::start_kubernetes(cluster.kubeconfig(), &ns, "replica-a", Options::default()).await;

    let spec =
        add_header.spec("placeholder") + "configFrom:\n- path: /value\n  secretKeyRef: {name: team, key: header}\n";
    cluster.apply(&plugin_yaml(&ns, "add-header", &spec)).await;
    let backend_key = "apiKeySecretRef: {name: upstream, key: apiKey}\n";
    cluster.apply(&route_yaml(&ns, "chat", "gpt-secret", &echo.url(), &["add-header"], backend_key)).await;

    // The Secrets do not exist yet: said in status, nothing served.
    let plugin = wait_status(cluster, &ns, "gatewayplugin", "add-header", "SecretNotFound", |p| {
        condition(p, "ResolvedRefs") == Some(("False", "SecretNotFound"))
    })
    .await;
    assert_eq!(condition(&plugin, "Ready").map(|c| c.0), Some("False"));

    let secret = |name: &str, key: &str, value: &str| {
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: {ns}\nstringData:\n  {key}: {value}\n"
        )
    };
    cluster.apply(&secret("team", "header", "s3cret-one")).await;
    cluster.apply(&secret("upstream", "apiKey", "sk-upstream-one")).await;
    eventually("the Secret values to be served", WAIT, async || {
        let reply = gateway.chat("gpt-secret", &[]).await;
        let echoed = (reply.status == 200).then(|| reply.echoed())?;
        (echoed["headers"]["x-team"] == "s3cret-one" && echoed["headers"]["authorization"] == "Bearer sk-upstream-one")
            .then_some(())
    })
    .await;
    let generation = wait_status(cluster, &ns, "gatewayplugin", "add-header", "Ready", |p| {
        condition(p, "Ready") == Some(("True", "Loaded"))
    })
    .await["metadata"]["generation"]
        .clone();

    // Rotation: only the Secrets change.
    cluster.apply(&secret("team", "header", "s3cret-two")).await;
    cluster.apply(&secret("upstream", "apiKey", "sk-upstream-two")).await;
    eventually("the rotated values to be served", WAIT, async || {
        let reply = gateway.chat("gpt-secret", &[]).await;
        let echoed = (reply.status == 200).then(|| reply.echoed())?;
        (echoed["headers"]["x-team"] == "s3cret-two" && echoed["headers"]["authorization"] == "Bearer sk-upstream-two")
            .then_some(())
    })
    .await;
    let plugin = get(cluster, &ns, "gatewayplugin", "add-header").await;
    assert_eq!(plugin["metadata"]["generation"], generation, "the GatewayPlugin itself did not change");

    // Secret values never reach status or the log.
    let route = get(cluster, &ns, "aimodelroute", "chat").await;
    for text in [plugin["status"].to_string(), route["status"].to_string(), gateway.log()] {
        assert!(!text.contains("s3cret") && !text.contains("sk-upstream"), "a Secret value leaked: {text}");
    }
}

/// The gateway holds the data of the Secrets resources name, not of every
/// Secret in the namespaces it watches. 100 Secrets of 1 MB that nothing
/// names must not reach its memory; the one a route names still reaches the
/// backend.
#[tokio::test]
async fn secrets_no_resource_names_are_not_held_in_memory() {
    let (cluster, ns) = cluster_with_namespace("secret-bound").await;
    let echo = Echo::start().await;
    let gateway = Gateway::start_kubernetes(cluster.kubeconfig(), &ns, "replica-a", Options::default()).await;
    let before = gateway.rss_bytes();

    let scratch = tempfile::tempdir().unwrap();
    // 1,000,000 bytes each, under the API server's 1 MiB for a Secret's data.
    let value = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, vec![b'x'; 1_000_000]);
    let count = 100;
    for i in 0..count {
        let yaml = format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: bulk-{i}\n  namespace: {ns}\ndata:\n  blob: {value}\n"
        );
        std::fs::write(scratch.path().join(format!("bulk-{i}.yaml")), yaml).unwrap();
    }
    cluster.kubectl_ok(&["create", "-o", "name", "-f", scratch.path().to_str().unwrap()]).await;
    let named =
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: named\n  namespace: NS\nstringData:\n  apiKey: sk-named\n";
    cluster.apply(&named.replace("NS", &ns)).await;
    let backend_key = "apiKeySecretRef: {name: named, key: apiKey}\n";
    cluster.apply(&route_yaml(&ns, "chat", "gpt-bound", &echo.url(), &[], backend_key)).await;
    // The watch delivers events in order: once the route serves, the gateway has seen every bulk Secret.
    eventually("the named Secret to reach the backend", WAIT, async || {
        let reply = gateway.chat("gpt-bound", &[]).await;
        let echoed = (reply.status == 200).then(|| reply.echoed())?;
        (echoed["headers"]["authorization"] == "Bearer sk-named").then_some(())
    })
    .await;
    let grown = gateway.rss_bytes().saturating_sub(before);
    // Holding them would take at least their 100 MB.
    assert!(grown < 40 << 20, "the gateway grew by {} MiB with {count} MB of Secrets nothing names", grown >> 20);
}

/// Pushes a built plugin to `reference`.
async fn push(module: &str, reference: &str) -> String {
    let scratch = tempfile::tempdir().unwrap();
    let client = sluice_oci::Registry::new(RegistryOptions::new(scratch.path().join("cache"))).unwrap();
    let bytes = std::fs::read(plugin_wasm(module)).unwrap();
    let reference: Reference = reference.parse().unwrap();
    client.push(bytes, &reference, BTreeMap::new(), None).await.expect("pushing");
    sha256_of(&plugin_wasm(module))
}

#[tokio::test]
async fn oci_repoints_show_the_new_digest_and_bad_references_keep_the_old_version() {
    let (cluster, ns) = cluster_with_namespace("oci").await;
    let registry = Registry::start();
    let echo = Echo::start().await;
    let v1 = push("chaos", &registry.reference("plugins/p:v1")).await;
    let v2 = push("probe", &registry.reference("plugins/p:v2")).await;
    let gateway = Gateway::start_kubernetes(cluster.kubeconfig(), &ns, "replica-a", Options::default()).await;

    let oci = |reference: &str, extra: &str| format!("source:\n  oci: {reference}\n{extra}config: {{}}\n");
    cluster.apply(&plugin_yaml(&ns, "p", &oci(&registry.reference("plugins/p:v1"), ""))).await;
    cluster.apply(&route_yaml(&ns, "chat", "gpt-oci", &echo.url(), &["p"], "")).await;
    wait_status(cluster, &ns, "gatewayplugin", "p", "v1 Ready", |p| {
        condition(p, "Ready") == Some(("True", "Loaded")) && p["status"]["digest"] == v1.as_str()
    })
    .await;
    let probed = async || gateway.chat("gpt-oci", &[]).await.header("x-probe-served").is_some();
    assert!(!probed().await, "v1 (chaos) serves");

    // Repoint to another tag: status shows the new digest, and it serves.
    cluster.apply(&plugin_yaml(&ns, "p", &oci(&registry.reference("plugins/p:v2"), ""))).await;
    wait_status(cluster, &ns, "gatewayplugin", "p", "v2 Ready", |p| {
        condition(p, "Ready") == Some(("True", "Loaded")) && p["status"]["digest"] == v2.as_str()
    })
    .await;
    assert!(probed().await, "v2 (probe) serves");
    let events = cluster.kubectl_ok(&["get", "events.events.k8s.io", "-n", &ns, "-o", "json"]).await;
    assert!(events.contains("Swapped") && events.contains(&v2), "{events}");

    // A wrong pin: Ready=False with the reason, v2 still serves.
    let wrong = "0".repeat(64);
    let pinned =
        oci(&registry.reference("plugins/p:v2"), "").replace("config:", &format!("sha256: \"{wrong}\"\nconfig:"));
    cluster.apply(&plugin_yaml(&ns, "p", &pinned)).await;
    let plugin = wait_status(cluster, &ns, "gatewayplugin", "p", "the pin mismatch", |p| {
        condition(p, "Ready").map(|c| c.0) == Some("False")
    })
    .await;
    assert_eq!(condition(&plugin, "Ready"), Some(("False", "DigestMismatch")));
    assert_eq!(plugin["status"]["digest"], v2.as_str(), "the last good module is the one served");
    assert!(probed().await, "the old version still serves");

    // A missing image: the same.
    cluster.apply(&plugin_yaml(&ns, "p", &oci(&registry.reference("plugins/p:missing"), ""))).await;
    let plugin = wait_status(cluster, &ns, "gatewayplugin", "p", "the missing image", |p| {
        condition(p, "Ready").map(|c| c.0) == Some("False")
    })
    .await;
    assert_eq!(condition(&plugin, "Ready"), Some(("False", "PullFailed")));
    let message =
        plugin["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Ready").unwrap()["message"]
            .to_string();
    assert!(message.contains("plugins/p:missing"), "{message}");
    assert!(probed().await, "the old version still serves");
}

#[tokio::test]
async fn invalid_resources_are_rejected_by_the_apiserver() {
    let (cluster, ns) = cluster_with_namespace("invalid").await;
    let wasm = plugin_wasm("add-header");
    let cases = [
        (
            format!("source:\n  oci: r.example/p:1\n  file: {}\n", wasm.display()),
            "set exactly one of source.oci and source.file",
        ),
        ("source: {}\n".to_string(), "set exactly one of source.oci and source.file"),
        ("source:\n  oci: r.example/p:1\nsha256: abc\n".to_string(), "spec.sha256"),
        ("source:\n  oci: r.example/p:1\nphase: Auth\nfailurePolicy: Open\n".to_string(), "must fail closed"),
        ("source:\n  oci: r.example/p:1\nfailurePolicy: Sometimes\n".to_string(), "Unsupported value"),
        (
            "source:\n  oci: r.example/p:1\nconfigFrom:\n- path: nope\n  secretKeyRef: {name: s, key: k}\n".to_string(),
            "JSON Pointer",
        ),
        ("source:\n  file: plugins/p.wasm\n".to_string(), "source.file must be an absolute path"),
    ];
    for (spec, expected) in cases {
        let (ok, _, stderr) = cluster_apply_result(cluster, &plugin_yaml(&ns, "bad", &spec)).await;
        assert!(
            !ok && stderr.contains(expected),
            "expected a rejection mentioning `{expected}` for\n{spec}\ngot: {stderr}"
        );
    }
    let route = route_yaml(&ns, "bad", "m", "ftp://nope", &[], "");
    let (ok, _, stderr) = cluster_apply_result(cluster, &route).await;
    assert!(!ok && stderr.contains("spec.backends[0].url"), "{stderr}");
    let route =
        route_yaml(&ns, "bad", "m", "http://127.0.0.1:1/v1", &[], "apiKeyEnv: A\napiKeySecretRef: {name: s, key: k}\n");
    let (ok, _, stderr) = cluster_apply_result(cluster, &route).await;
    assert!(!ok && stderr.contains("set at most one of apiKeyEnv"), "{stderr}");
    let route = route_yaml(&ns, "bad", "m", "http://127.0.0.1:1/v1", &[], "apiKeyFile: keys/openai\n");
    let (ok, _, stderr) = cluster_apply_result(cluster, &route).await;
    assert!(!ok && stderr.contains("apiKeyFile must be an absolute path"), "{stderr}");
    assert!(!cluster.kubectl_result(&["get", "gp", "bad", "-n", &ns]).await.0, "nothing was stored");

    // The routing fields: enums, ranges and pairings checked on apply.
    for (extra, expected) in [
        ("weight: 0\n", "spec.backends[0].weight"),
        ("provider: bedrock\n", "spec.backends[0].provider"),
        ("priority: 101\n", "spec.backends[0].priority"),
    ] {
        let route = route_yaml(&ns, "bad", "m", "http://127.0.0.1:1/v1", &[], extra);
        let (ok, _, stderr) = cluster_apply_result(cluster, &route).await;
        assert!(!ok && stderr.contains(expected), "{extra}: {stderr}");
    }
    let explained = cluster.kubectl_ok(&["explain", "gatewayplugin.spec.configFrom"]).await;
    assert!(explained.contains("JSON Pointer"), "{explained}");
    // The routing fields are documented where operators look.
    for (field, expected) in [
        ("aimodelroute.spec.retry.retryOn", "ConnectFailure"),
        // Single words: kubectl wraps descriptions.
        ("aimodelroute.spec.retry.budget.percent", "percentage"),
        ("aimodelroute.spec.fallbacks", "namespace"),
        ("aimodelroute.spec.outlierDetection.consecutiveFailures", "ejection"),
        ("aimodelroute.spec.backends.priority", "preferred"),
        ("aimodelroute.spec.backends.tls.serverName", "SNI"),
        ("aimodelroute.spec.backends.timeouts.firstByteMs", "head"),
        ("aimodelroute.spec.backends.provider", "anthropic"),
    ] {
        let explained = cluster.kubectl_ok(&["explain", field]).await;
        assert!(explained.contains(expected), "kubectl explain {field}: {explained}");
    }
}

async fn cluster_apply_result(cluster: &KubeCluster, yaml: &str) -> (bool, String, String) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), yaml).unwrap();
    cluster.kubectl_result(&["apply", "-f", file.path().to_str().unwrap()]).await
}

fn leader_of(lease: &Value) -> String {
    lease["spec"]["holderIdentity"].as_str().unwrap_or_default().to_string()
}

#[tokio::test]
async fn two_replicas_both_serve_and_only_the_leader_writes_status() {
    let (cluster, ns) = cluster_with_namespace("replicas").await;
    let echo = Echo::start().await;
    let add_header = AddHeader::push().await;
    let mut a = Gateway::start_kubernetes(cluster.kubeconfig(), &ns, "replica-a", Options::default()).await;
    let mut b = Gateway::start_kubernetes(cluster.kubeconfig(), &ns, "replica-b", Options::default()).await;

    cluster.apply(&plugin_yaml(&ns, "add-header", &add_header.spec("both"))).await;
    cluster.apply(&route_yaml(&ns, "chat", "gpt-two", &echo.url(), &["add-header"], "")).await;
    for gateway in [&a, &b] {
        eventually("each replica to serve", WAIT, async || {
            (team_header(gateway, "gpt-two").await.as_deref() == Some("both")).then_some(())
        })
        .await;
    }
    let plugin = wait_status(cluster, &ns, "gatewayplugin", "add-header", "loaded 2/2", |p| {
        p["status"]["loaded"] == "2/2" && condition(p, "Ready") == Some(("True", "Loaded"))
    })
    .await;
    let names: Vec<_> = plugin["status"]["replicas"].as_array().unwrap().iter().map(|r| r["name"].clone()).collect();
    assert_eq!(names, ["replica-a", "replica-b"]);

    // One writer of status: the same field manager, whichever replica leads.
    let out = cluster.kubectl_ok(&["get", "gp", "add-header", "-n", &ns, "-o", "json", "--show-managed-fields"]).await;
    let plugin: Value = serde_json::from_str(&out).unwrap();
    let managers: Vec<String> = plugin["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["subresource"] == "status")
        .map(|m| m["manager"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(managers, ["sluice-gateway"]);
    let lease = get(cluster, &ns, "lease", "sluice-gateway-leader").await;
    let leader = leader_of(&lease);
    assert!(leader == "replica-a" || leader == "replica-b", "{lease:#}");

    // The leader goes away (SIGTERM): the other takes over and counts 1/1.
    let (gone, stays, other) =
        if leader == "replica-a" { (&mut a, &b, "replica-b") } else { (&mut b, &a, "replica-a") };
    gone.terminate();
    assert!(gone.wait_exit(Duration::from_secs(20)).await.is_some(), "the leader exits on SIGTERM");
    eventually("the other replica to lead", WAIT, async || {
        (leader_of(&get(cluster, &ns, "lease", "sluice-gateway-leader").await) == other).then_some(())
    })
    .await;
    wait_status(cluster, &ns, "gatewayplugin", "add-header", "loaded 1/1", |p| p["status"]["loaded"] == "1/1").await;
    assert_eq!(team_header(stays, "gpt-two").await.as_deref(), Some("both"));
}

#[tokio::test]
async fn after_an_apiserver_restart_the_watch_resumes_with_no_stale_config() {
    // Its own apiserver: the shared one must stay up for the other tests.
    let cluster = KubeCluster::start().await;
    install_crds(&cluster).await;
    let ns = "restart";
    cluster.kubectl_ok(&["create", "namespace", ns]).await;
    let echo = Echo::start().await;
    let add_header = AddHeader::push().await;
    let gateway = Gateway::start_kubernetes(cluster.kubeconfig(), ns, "replica-a", Options::default()).await;
    cluster.apply(&plugin_yaml(ns, "add-header", &add_header.spec("before"))).await;
    cluster.apply(&route_yaml(ns, "chat", "gpt-restart", &echo.url(), &["add-header"], "")).await;
    eventually("traffic", WAIT, async || {
        (team_header(&gateway, "gpt-restart").await.as_deref() == Some("before")).then_some(())
    })
    .await;

    cluster.stop_apiserver().await;
    // The data plane does not depend on the apiserver being up.
    for _ in 0..10 {
        assert_eq!(team_header(&gateway, "gpt-restart").await.as_deref(), Some("before"));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.start_apiserver().await;

    cluster.apply(&plugin_yaml(ns, "add-header", &add_header.spec("after"))).await;
    eventually("the change made after the restart", WAIT, async || {
        (team_header(&gateway, "gpt-restart").await.as_deref() == Some("after")).then_some(())
    })
    .await;
    cluster.kubectl_ok(&["delete", "aimodelroute", "chat", "-n", ns]).await;
    eventually("the route deleted after the restart to be gone", WAIT, async || {
        (gateway.chat("gpt-restart", &[]).await.status == 404).then_some(())
    })
    .await;
}

#[tokio::test]
async fn deploy_manifests_apply_and_their_rbac_is_enough_to_run_the_gateway() {
    let cluster = KubeCluster::shared().await;
    let deploy = repo_root().join("deploy/kubernetes");
    let deploy = deploy.to_str().unwrap();
    // Server-side dry run of everything; namespaced objects need their
    // namespace to exist, so it alone is created first.
    cluster.kubectl_ok(&["apply", "--server-side", "-f", &format!("{deploy}/namespace.yaml")]).await;
    let dry = cluster.kubectl_ok(&["apply", "--server-side", "--dry-run=server", "-k", deploy]).await;
    for object in [
        "serviceaccount/sluice-gateway",
        "role.rbac.authorization.k8s.io/sluice-gateway",
        "deployment.apps/sluice-gateway",
        "poddisruptionbudget.policy/sluice-gateway",
        "service/sluice-gateway",
        "networkpolicy.networking.k8s.io/sluice-gateway",
    ] {
        assert!(dry.contains(object), "{object} missing from:\n{dry}");
    }
    cluster.kubectl_ok(&["apply", "--server-side", "-k", deploy]).await;

    // Least privilege: what the ServiceAccount may and may not do.
    let sa = "system:serviceaccount:sluice-system:sluice-gateway";
    let can = async |args: &[&str]| {
        let mut all = vec!["auth", "can-i", "--as", sa];
        all.extend_from_slice(args);
        cluster.kubectl_result(&all).await.1.trim() == "yes"
    };
    assert!(can(&["watch", "gatewayplugins.sluice.dev", "-n", "sluice-system"]).await);
    assert!(can(&["patch", "gatewayplugins.sluice.dev", "--subresource=status", "-n", "sluice-system"]).await);
    assert!(can(&["list", "secrets", "-n", "sluice-system"]).await);
    assert!(!can(&["list", "secrets", "-n", "default"]).await, "no Secrets outside its namespace");
    assert!(!can(&["update", "gatewayplugins.sluice.dev", "-n", "sluice-system"]).await, "no writes to specs");
    assert!(!can(&["create", "pods", "-n", "sluice-system"]).await);
    assert!(!can(&["delete", "secrets", "-n", "sluice-system"]).await);

    // A gateway with exactly that ServiceAccount's token serves and writes status.
    let token = cluster.kubectl_ok(&["create", "token", "sluice-gateway", "-n", "sluice-system"]).await;
    let scratch = tempfile::tempdir().unwrap();
    let kubeconfig = scratch.path().join("sa.kubeconfig");
    std::fs::copy(cluster.kubeconfig(), &kubeconfig).unwrap();
    let kc = kubeconfig.to_str().unwrap();
    cluster.kubectl_ok(&["--kubeconfig", kc, "config", "set-credentials", "sa", "--token", token.trim()]).await;
    cluster.kubectl_ok(&["--kubeconfig", kc, "config", "set-context", "--current", "--user", "sa"]).await;
    let echo = Echo::start().await;
    let add_header = AddHeader::push().await;
    let gateway = Gateway::start_kubernetes(&kubeconfig, "sluice-system", "sa-replica", Options::default()).await;
    cluster.apply(&plugin_yaml("sluice-system", "add-header", &add_header.spec("rbac"))).await;
    cluster.apply(&route_yaml("sluice-system", "chat", "gpt-rbac", &echo.url(), &["add-header"], "")).await;
    eventually("traffic under the deploy RBAC", WAIT, async || {
        (team_header(&gateway, "gpt-rbac").await.as_deref() == Some("rbac")).then_some(())
    })
    .await;
    wait_status(cluster, "sluice-system", "gatewayplugin", "add-header", "status under the deploy RBAC", |p| {
        condition(p, "Ready") == Some(("True", "Loaded")) && p["status"]["loaded"] == "1/1"
    })
    .await;
    // On shutdown the replica withdraws its report Lease (which needs `delete`).
    let mut gateway = gateway;
    gateway.terminate();
    gateway.wait_exit(Duration::from_secs(30)).await.expect("the gateway exits on SIGTERM");
    let (found, _, _) =
        cluster.kubectl_result(&["get", "lease", "sluice-replica-sa-replica", "-n", "sluice-system"]).await;
    assert!(!found, "the replica's report Lease outlived it");
    assert!(!gateway.log().contains("forbidden"), "{}", gateway.log());
}

/// A route author chooses the backend URL, so whatever key the gateway sends
/// there is theirs to read; a plugin's file is read whole. In Kubernetes mode
/// the gateway reads no file or environment variable of its own for a
/// resource (unless its operator allows one): the resources are refused and
/// nothing reaches the upstream.
#[tokio::test]
async fn a_route_or_plugin_cannot_read_the_gateways_files_or_environment_in_kubernetes_mode() {
    let (cluster, ns) = cluster_with_namespace("host-refs").await;
    let echo = Echo::start().await;
    let scratch = tempfile::tempdir().unwrap();
    let key_file = scratch.path().join("token");
    std::fs::write(&key_file, "sk-from-a-host-file\n").unwrap();
    let env = vec![("SLUICE_E2E_HOST_KEY".to_string(), "sk-from-the-environment".to_string())];
    let gateway =
        Gateway::start_kubernetes(cluster.kubeconfig(), &ns, "replica-a", Options { env, ..Options::default() }).await;

    let by_file = format!("apiKeyFile: {}\n", key_file.display());
    cluster.apply(&route_yaml(&ns, "by-file", "gpt-by-file", &echo.url(), &[], &by_file)).await;
    let by_env = "apiKeyEnv: SLUICE_E2E_HOST_KEY\n";
    cluster.apply(&route_yaml(&ns, "by-env", "gpt-by-env", &echo.url(), &[], by_env)).await;
    let from_file = format!("source:\n  file: {}\n", plugin_wasm("add-header").display());
    cluster.apply(&plugin_yaml(&ns, "from-file", &from_file)).await;
    // Applied last: once it serves, the gateway has taken in the others.
    cluster.apply(&route_yaml(&ns, "control", "gpt-control", &echo.url(), &[], "")).await;
    eventually("the control route to serve", WAIT, async || {
        (gateway.chat("gpt-control", &[]).await.status == 200).then_some(())
    })
    .await;

    let mut statuses = Vec::new();
    for (kind, name) in [("aimodelroute", "by-file"), ("aimodelroute", "by-env"), ("gatewayplugin", "from-file")] {
        let object = wait_status(cluster, &ns, kind, name, "a status", |o| condition(o, "Accepted").is_some()).await;
        assert_eq!(condition(&object, "Accepted"), Some(("False", "NotPermitted")), "{kind} {name}: {object:#}");
        assert_eq!(condition(&object, "Ready").map(|c| c.0), Some("False"), "{kind} {name}");
        statuses.push(object["status"].to_string());
    }
    for model in ["gpt-by-file", "gpt-by-env"] {
        let reply = gateway.chat(model, &[]).await;
        assert_eq!(reply.status, 404, "{model} must not be served: {}", reply.text());
    }
    for text in statuses.iter().chain([&gateway.log()]) {
        assert!(!text.contains("sk-from"), "the gateway's secret leaked: {text}");
    }
}

/// `sluice run --kubernetes` watching every namespace, its Leases in
/// `lease_namespace`, with `args` (the harness starts gateways on one
/// namespace). On an apiserver of its own, or it would write status on the
/// other tests' resources.
pub(crate) struct AllNamespacesGateway {
    child: std::process::Child,
    listen: std::net::SocketAddr,
    log: PathBuf,
    client: sluice_tests::Client,
    _scratch: tempfile::TempDir,
}

impl AllNamespacesGateway {
    pub(crate) async fn start(cluster: &KubeCluster, lease_namespace: &str, args: &[&str]) -> AllNamespacesGateway {
        let scratch = tempfile::tempdir().unwrap();
        let log = scratch.path().join("gateway.log");
        let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let (listen, admin) = (free(), free());
        let child = std::process::Command::new(sluice_tests::sluice_binary())
            .args(["run", "--kubernetes", "--lease-namespace", lease_namespace, "--replica-name", "all-namespaces"])
            .arg("--kubeconfig")
            .arg(cluster.kubeconfig())
            .args(["--listen", &listen.to_string(), "--admin", &admin.to_string()])
            .arg("--cache-dir")
            .arg(sluice_tests::shared_cache_dir())
            .arg("--oci-cache-dir")
            .arg(scratch.path().join("oci"))
            .args(args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            // The tests' upstreams are on loopback, refused by default on Kubernetes.
            .env("SLUICE_ALLOW_BACKEND_CIDR", "127.0.0.0/8")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting sluice");
        let gateway =
            AllNamespacesGateway { child, listen, log, client: sluice_tests::Client::http1(), _scratch: scratch };
        eventually("the gateway to be ready", WAIT, async || {
            let request = hyper::Request::get(format!("http://{admin}/readyz")).body(sluice_tests::empty()).unwrap();
            gateway.client.try_send(request).await.is_ok_and(|reply| reply.status == 200).then_some(())
        })
        .await;
        gateway
    }

    /// POSTs `body` to `path` on the data plane listener.
    pub(crate) async fn post(&self, path: &str, body: &str, headers: &[(&str, &str)]) -> sluice_tests::Reply {
        self.client.post(&format!("http://{}{path}", self.listen), body.to_string(), headers).await
    }

    /// Which upstream model served `model` (the backends rewrite it), if any did.
    async fn served_by(&self, model: &str) -> Option<String> {
        let url = format!("http://{}/v1/chat/completions", self.listen);
        let reply = self.client.post(&url, sluice_tests::chat_body(model).to_string(), &[]).await;
        (reply.status == 200).then(|| reply.echoed()["body"]["model"].as_str().unwrap_or_default().to_string())
    }
}

impl Drop for AllNamespacesGateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- gateway log ---\n{}--- end ---", std::fs::read_to_string(&self.log).unwrap_or_default());
        }
    }
}

/// Creation time alone cannot decide a model's owner: a squatter's route in
/// another namespace would be the oldest as soon as the owner recreated
/// its own. By default only the gateway's own namespace claims models.
#[tokio::test]
async fn a_model_stays_with_its_namespace_when_another_claims_it_and_the_owner_recreates_its_route() {
    // Its own apiserver: a gateway watching every namespace would write
    // status on the other tests' resources.
    let cluster = KubeCluster::start().await;
    install_crds(&cluster).await;
    let (owner, squatter) = ("models-owner", "models-squatter");
    for ns in [owner, squatter] {
        cluster.kubectl_ok(&["create", "namespace", ns]).await;
    }
    let echo = Echo::start().await;
    let gateway = AllNamespacesGateway::start(&cluster, owner, &[]).await;
    let owner_route = route_yaml(owner, "chat", "gpt-owned", &echo.url(), &[], "model: owner-upstream\n");
    let squatter_route = route_yaml(squatter, "chat", "gpt-owned", &echo.url(), &[], "model: squatter-upstream\n");

    cluster.apply(&owner_route).await;
    eventually("the owner's route to serve", WAIT, async || {
        (gateway.served_by("gpt-owned").await.as_deref() == Some("owner-upstream")).then_some(())
    })
    .await;
    cluster.apply(&squatter_route).await;
    let refused = |r: &Value| condition(r, "Accepted").map(|c| c.0) == Some("False");
    wait_status(&cluster, squatter, "aimodelroute", "chat", "the squatter's route refused", refused).await;
    assert_eq!(gateway.served_by("gpt-owned").await.as_deref(), Some("owner-upstream"));

    // The owner deletes its route: the model is not served meanwhile, by
    // the squatter least of all.
    cluster.kubectl_ok(&["delete", "aimodelroute", "chat", "-n", owner]).await;
    let meanwhile = eventually("the owner's route to be gone", WAIT, async || {
        let served = gateway.served_by("gpt-owned").await;
        (served.as_deref() != Some("owner-upstream")).then_some(served)
    })
    .await;
    assert_eq!(meanwhile, None, "the model went to another namespace");
    cluster.apply(&owner_route).await;
    eventually("the recreated route to serve", WAIT, async || {
        (gateway.served_by("gpt-owned").await.as_deref() == Some("owner-upstream")).then_some(())
    })
    .await;
    for _ in 0..5 {
        assert_eq!(gateway.served_by("gpt-owned").await.as_deref(), Some("owner-upstream"));
    }
    let route = wait_status(&cluster, squatter, "aimodelroute", "chat", "the squatter's route refused", refused).await;
    assert_eq!(condition(&route, "Accepted"), Some(("False", "ModelNotPermitted")), "{route:#}");
    let owners = wait_status(&cluster, owner, "aimodelroute", "chat", "the owner's route Ready", |r| {
        condition(r, "Ready") == Some(("True", "Loaded"))
    })
    .await;
    assert_eq!(condition(&owners, "Accepted"), Some(("True", "Accepted")));
}

/// What the operator allows, and nothing else: a directory mounted for
/// resources and a variable named for routes.
#[tokio::test]
async fn files_and_variables_the_operator_allows_may_be_used_and_no_others() {
    let (cluster, ns) = cluster_with_namespace("host-refs-allowed").await;
    let echo = Echo::start().await;
    let mounted = tempfile::tempdir().unwrap();
    std::fs::write(mounted.path().join("key"), "sk-mounted").unwrap();
    std::fs::copy(plugin_wasm("add-header"), mounted.path().join("add-header.wasm")).unwrap();
    let dir = mounted.path().to_str().unwrap();
    let options = Options {
        env: vec![
            ("SLUICE_E2E_ALLOWED".into(), "sk-allowed-env".into()),
            ("SLUICE_E2E_OTHER".into(), "sk-other".into()),
        ],
        args: ["--allow-host-files-under", dir, "--allow-host-env", "SLUICE_E2E_ALLOWED"].map(String::from).to_vec(),
        ..Options::default()
    };
    let gateway = Gateway::start_kubernetes(cluster.kubeconfig(), &ns, "replica-a", options).await;

    let mounted_plugin =
        format!("source:\n  file: {dir}/add-header.wasm\nconfig:\n  header: x-team\n  value: mounted\n");
    cluster.apply(&plugin_yaml(&ns, "mounted", &mounted_plugin)).await;
    let by_file = format!("apiKeyFile: {dir}/key\n");
    cluster.apply(&route_yaml(&ns, "by-file", "gpt-by-file", &echo.url(), &["mounted"], &by_file)).await;
    cluster.apply(&route_yaml(&ns, "by-env", "gpt-by-env", &echo.url(), &[], "apiKeyEnv: SLUICE_E2E_ALLOWED\n")).await;
    let (file, env) = eventually("the allowed file and variable to be used", WAIT, async || {
        let file = gateway.chat("gpt-by-file", &[]).await;
        let env = gateway.chat("gpt-by-env", &[]).await;
        (file.status == 200 && env.status == 200).then(|| (file.echoed(), env.echoed()))
    })
    .await;
    assert_eq!(file["headers"]["authorization"], "Bearer sk-mounted");
    assert_eq!(file["headers"]["x-team"], "mounted");
    assert_eq!(env["headers"]["authorization"], "Bearer sk-allowed-env");

    // Outside the directory, or another variable: refused.
    let outside = format!("source:\n  file: {}\n", plugin_wasm("add-header").display());
    cluster.apply(&plugin_yaml(&ns, "outside", &outside)).await;
    cluster.apply(&route_yaml(&ns, "other-env", "gpt-other", &echo.url(), &[], "apiKeyEnv: SLUICE_E2E_OTHER\n")).await;
    for (kind, name) in [("gatewayplugin", "outside"), ("aimodelroute", "other-env")] {
        let object = wait_status(cluster, &ns, kind, name, "a status", |o| condition(o, "Accepted").is_some()).await;
        assert_eq!(condition(&object, "Accepted"), Some(("False", "NotPermitted")), "{kind} {name}");
    }
    assert_eq!(gateway.chat("gpt-other", &[]).await.status, 404);
}

/// Grants decide which namespace serves a model, whatever the routes' age.
#[tokio::test]
async fn model_claims_grant_models_to_namespaces_and_survive_a_recreated_route() {
    let cluster = KubeCluster::start().await;
    install_crds(&cluster).await;
    let namespaces = ["claims-gateway", "claims-a", "claims-b"];
    for ns in namespaces {
        cluster.kubectl_ok(&["create", "namespace", ns]).await;
    }
    let echo = Echo::start().await;
    let grants = ["--model-claim", "claims-a=gpt-*", "--model-claim", "claims-b=gpt-b"];
    let gateway = AllNamespacesGateway::start(&cluster, "claims-gateway", &grants).await;
    let route = |ns: &str, model: &str| route_yaml(ns, "chat", model, &echo.url(), &[], &format!("model: {ns}\n"));

    // claims-b's route is the older; the grants still give gpt-a to claims-a.
    cluster.apply(&route("claims-b", "gpt-a")).await;
    cluster.apply(&route("claims-gateway", "gpt-a")).await;
    let refused = |r: &Value| condition(r, "Accepted").map(|c| c.0) == Some("False");
    for ns in ["claims-b", "claims-gateway"] {
        let status = wait_status(&cluster, ns, "aimodelroute", "chat", "refused", refused).await;
        assert_eq!(condition(&status, "Accepted"), Some(("False", "ModelNotPermitted")), "{ns}");
    }
    assert_eq!(gateway.served_by("gpt-a").await, None);
    cluster.apply(&route("claims-a", "gpt-a")).await;
    eventually("claims-a to serve gpt-a", WAIT, async || {
        (gateway.served_by("gpt-a").await.as_deref() == Some("claims-a")).then_some(())
    })
    .await;
    cluster.kubectl_ok(&["delete", "aimodelroute", "chat", "-n", "claims-a"]).await;
    cluster.apply(&route("claims-a", "gpt-a")).await;
    eventually("the recreated route to serve gpt-a", WAIT, async || {
        (gateway.served_by("gpt-a").await.as_deref() == Some("claims-a")).then_some(())
    })
    .await;

    // The exact grant is more specific than claims-a's prefix.
    cluster.apply(&route("claims-b", "gpt-b")).await;
    eventually("claims-b to serve gpt-b", WAIT, async || {
        (gateway.served_by("gpt-b").await.as_deref() == Some("claims-b")).then_some(())
    })
    .await;
}

/// A plugin config that fails with a Secret's value in it must not put that
/// value where others read it: status, Events, the replica Leases, the log
/// or /admin/config. Each Secret-backed field gets a planted value and a
/// plugin of its own that fails on it: one through the SDK's config parsing
/// (a string where an object goes), one through the plugin's own check (a
/// control character in a header value).
#[tokio::test]
async fn secret_values_in_failing_configs_reach_no_status_event_lease_log_or_admin_view() {
    let (cluster, ns) = cluster_with_namespace("secret-errors").await;
    let echo = Echo::start().await;
    let add_header = AddHeader::push().await;
    let gateway = Gateway::start_kubernetes(cluster.kubeconfig(), &ns, "replica-a", Options::default()).await;

    // The printable part of each value is what must not show: an escaped
    // form ("\u{1}") would still carry it.
    let planted = [("wrong-type", "/setBody", "planted-type-5ecret"), ("bad-value", "/value", "planted-ctl-5ecret")];
    let secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: planted\n  namespace: {ns}\nstringData:\n  wrong-type: {}\n  bad-value: \"{}\\x01\"\n  api-key: \"sk-planted-key\\x01\"\n",
        planted[0].2, planted[1].2
    );
    cluster.apply(&secret).await;
    for (name, path, _) in planted {
        let spec = add_header.spec("ok")
            + &format!("configFrom:\n- path: {path}\n  secretKeyRef: {{name: planted, key: {name}}}\n");
        cluster.apply(&plugin_yaml(&ns, name, &spec)).await;
    }
    let backend_key = "apiKeySecretRef: {name: planted, key: api-key}\n";
    cluster
        .apply(&route_yaml(&ns, "chat", "gpt-planted", &echo.url(), &["wrong-type", "bad-value"], backend_key))
        .await;

    for (name, _, _) in planted {
        let plugin = wait_status(cluster, &ns, "gatewayplugin", name, "the config to be rejected", |p| {
            condition(p, "Ready").map(|c| c.0) == Some("False")
        })
        .await;
        assert_eq!(condition(&plugin, "Accepted"), Some(("True", "Accepted")), "{plugin}");
    }
    // Events follow the status write; wait for one per plugin.
    let events = async || cluster.kubectl_ok(&["get", "events", "-A", "-o", "yaml"]).await;
    eventually("a Warning Event per plugin", WAIT, async || {
        let events = events().await;
        planted.iter().all(|(name, _, _)| events.contains(&format!("name: {name}"))).then_some(())
    })
    .await;

    let outputs = [
        ("status", cluster.kubectl_ok(&["get", "gatewayplugins,aimodelroutes", "-n", &ns, "-o", "yaml"]).await),
        ("events", events().await),
        ("leases", cluster.kubectl_ok(&["get", "leases", "-A", "-o", "yaml"]).await),
        ("log", gateway.log()),
        ("admin", gateway.admin_config().await.to_string()),
    ];
    let values = planted.iter().map(|(_, _, value)| *value).chain(["sk-planted-key"]);
    let leaks: Vec<String> = values
        .flat_map(|value| {
            outputs
                .iter()
                .filter(move |(_, text)| text.contains(value))
                .map(move |(place, _)| format!("{value} in {place}"))
        })
        .collect();
    assert!(leaks.is_empty(), "Secret values leaked: {leaks:?}");
}
