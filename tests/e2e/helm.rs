//! The Helm chart, deploy/helm/sluice, with the real `helm` (built from the
//! Go module proxy, see tests/harness/helm.rs): `helm lint` and its values
//! schema; `helm template` with value sets, read back as objects; and an
//! install, upgrade and uninstall on a real kube-apiserver, whose
//! ServiceAccount token then runs the real gateway.
//!
//! The apiserver harness has no kubelet, scheduler or controller manager:
//! the chart's Deployment is stored but its pods never exist, so the
//! gateway runs here as a process with the Deployment's own arguments and
//! the ServiceAccount's token, which is what a pod would have.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use sluice_oci::{Reference, RegistryOptions};
use sluice_tests::{Echo, Gateway, Helm, KubeCluster, Options, Registry, eventually, helm_chart, plugin_wasm};
use tokio::io::AsyncWriteExt as _;

const WAIT: Duration = Duration::from_secs(60);
const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().unwrap()
}

/// The documents of a YAML stream (`helm template`'s, or a manifest file),
/// empty ones skipped. Helm separates documents with a `---` line.
fn documents(yaml: &str) -> Vec<Value> {
    let mut docs = Vec::new();
    let mut current = String::new();
    for line in yaml.lines().chain(["---"]) {
        if line.trim_end() == "---" {
            let doc: Value = serde_yaml_ng::from_str(&current)
                .unwrap_or_else(|e| panic!("not YAML: {e}\n--- document ---\n{current}"));
            if !doc.is_null() {
                docs.push(doc);
            }
            current.clear();
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    docs
}

/// What `helm template` rendered, as objects.
struct Rendered(Vec<Value>);

impl Rendered {
    fn kinds(&self, kind: &str) -> Vec<&Value> {
        self.0.iter().filter(|o| o["kind"] == kind).collect()
    }

    fn one(&self, kind: &str) -> &Value {
        let all = self.kinds(kind);
        assert_eq!(all.len(), 1, "one {kind} expected, got {}", all.len());
        all[0]
    }

    fn find(&self, kind: &str, namespace: &str, name: &str) -> Option<&Value> {
        self.0.iter().find(|o| {
            o["kind"] == kind && o["metadata"]["name"] == name && o["metadata"]["namespace"].as_str() == Some(namespace)
        })
    }

    fn pod(&self) -> &Value {
        &self.one("Deployment")["spec"]["template"]
    }

    fn container(&self) -> &Value {
        let containers = self.pod()["spec"]["containers"].as_array().unwrap();
        assert_eq!(containers.len(), 1);
        &containers[0]
    }

    fn args(&self) -> Vec<String> {
        strings(&self.container()["args"])
    }

    /// The value of `--flag=VALUE` in the container's arguments, each time given.
    fn flag(&self, flag: &str) -> Vec<String> {
        let prefix = format!("{flag}=");
        self.args().iter().filter_map(|a| a.strip_prefix(&prefix).map(str::to_string)).collect()
    }

    fn port(&self, name: &str) -> Option<i64> {
        let ports = self.container()["ports"].as_array().unwrap();
        ports.iter().find(|p| p["name"] == name).map(|p| p["containerPort"].as_i64().unwrap())
    }

    fn env(&self, name: &str) -> Option<&Value> {
        self.container()["env"].as_array().unwrap().iter().find(|e| e["name"] == name)
    }

    /// The ConfigMap or Secret key a file at `path` in the container comes
    /// from, following its volume mount to the volume and that volume's
    /// items: ("configMap" | "secret", name, key).
    fn file_source(&self, path: &str) -> (String, String, String) {
        let mounts = self.container()["volumeMounts"].as_array().unwrap();
        let (mount, rest) = mounts
            .iter()
            .find_map(|m| {
                let dir = m["mountPath"].as_str().unwrap();
                path.strip_prefix(dir).and_then(|r| r.strip_prefix('/')).map(|rest| (m, rest))
            })
            .unwrap_or_else(|| panic!("no volume is mounted above {path}: {mounts:#?}"));
        assert_eq!(mount["readOnly"], true, "{mount}");
        let volumes = self.pod()["spec"]["volumes"].as_array().unwrap();
        let volume = volumes.iter().find(|v| v["name"] == mount["name"]).expect("the mounted volume");
        let (kind, source, name) = if volume["configMap"].is_object() {
            ("configMap", &volume["configMap"], volume["configMap"]["name"].as_str())
        } else {
            ("secret", &volume["secret"], volume["secret"]["secretName"].as_str())
        };
        let items = source["items"].as_array().unwrap_or_else(|| panic!("{volume} names no items"));
        let item = items.iter().find(|i| i["path"] == rest).unwrap_or_else(|| panic!("{volume} holds no {rest}"));
        (kind.to_string(), name.unwrap().to_string(), item["key"].as_str().unwrap().to_string())
    }
}

/// A [`Rendered::file_source`]: ("configMap" | "secret", name, key).
fn src(kind: &str, name: &str, key: &str) -> (String, String, String) {
    (kind.to_string(), name.to_string(), key.to_string())
}

fn strings(value: &Value) -> Vec<String> {
    value.as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect()
}

/// `helm template` of the chart as release `sluice` in `sluice-system`
/// with `values`; panics if Helm refuses them.
async fn render(helm: &Helm, values: &str) -> Rendered {
    let out = helm.template("sluice", "sluice-system", values, &[]).await;
    assert!(out.success, "helm template refused\n{values}\n--- stderr ---\n{}", out.stderr);
    Rendered(documents(&out.stdout))
}

/// Helm's complaint about `values` (from `helm template`); panics if it
/// renders them.
async fn refused(helm: &Helm, values: &str) -> String {
    let out = helm.template("sluice", "sluice-system", values, &[]).await;
    assert!(!out.success, "helm template accepted\n{values}\n--- stdout ---\n{}", out.stdout);
    out.stderr
}

fn manifests(file: &str) -> Vec<Value> {
    documents(&std::fs::read_to_string(repo_root().join("deploy/kubernetes").join(file)).unwrap())
}

#[tokio::test]
async fn helm_lint_passes_and_the_schema_refuses_typos_and_wrong_types() {
    let helm = Helm::new();
    let chart = helm_chart();
    let chart = chart.to_str().unwrap();
    let out = helm.ok(&["lint", "--strict", chart]).await;
    assert!(out.contains("1 chart(s) linted, 0 chart(s) failed"), "{out}");

    // Each value set breaks the schema once; lint and template both refuse
    // it, naming the key.
    for (values, names) in [
        ("imag:\n  tag: v1\n", "imag"),
        ("image:\n  tagg: v1\n", "tagg"),
        ("replicas: two\n", "replicas"),
        ("image:\n  digest: latest\n", "digest"),
        ("metrics:\n  enabled: \"no\"\n", "enabled"),
        ("metrics:\n  port: 99999\n", "port"),
        ("modelClaims:\n  - namespace: team-a\n", "models"),
        ("mcpPathClaims:\n  - namespace: team-a\n", "path"),
        ("mcpPathClaims:\n  - namespace: team-a\n    path: mcp/team-a\n", "path"),
        ("hostAccess:\n  filesUnder: [plugins]\n", "filesUnder"),
        ("networkPolicy:\n  enable: false\n", "enable"),
    ] {
        let lint = helm.run(&["lint", chart, "-f", "-"], Some(values)).await;
        assert!(!lint.success, "helm lint accepted\n{values}\n{}", lint.stdout);
        let said = format!("{}{}", lint.stdout, lint.stderr);
        assert!(said.contains("values don't meet the specifications of the schema"), "{said}");
        assert!(said.contains(names), "lint does not name `{names}`:\n{said}");
        let template = refused(&helm, values).await;
        assert!(template.contains(names), "template does not name `{names}`:\n{template}");
    }
}

/// With fullnameOverride sluice-gateway, in sluice-system, the defaults
/// give what deploy/kubernetes applies: the same arguments, hardening,
/// probes, ports, RBAC rules, Service, PDB and NetworkPolicy (the chart adds
/// its own labels).
#[tokio::test]
async fn default_values_render_what_deploy_kubernetes_applies() {
    let helm = Helm::new();
    let chart = render(&helm, "fullnameOverride: sluice-gateway\n").await;
    let plain = Rendered(
        ["serviceaccount.yaml", "rbac.yaml", "deployment.yaml", "service.yaml", "pdb.yaml", "networkpolicy.yaml"]
            .into_iter()
            .flat_map(manifests)
            .collect(),
    );
    let kinds = |r: &Rendered| {
        let mut kinds: Vec<String> = r.0.iter().map(|o| o["kind"].as_str().unwrap().to_string()).collect();
        kinds.sort();
        kinds
    };
    assert_eq!(kinds(&chart), kinds(&plain));
    for object in &chart.0 {
        assert_eq!(object["metadata"]["name"], "sluice-gateway", "{object}");
        assert_eq!(object["metadata"]["namespace"], "sluice-system", "{object}");
    }

    // The image is the one the plain manifests name: appVersion, the crate's version.
    let cargo = std::fs::read_to_string(repo_root().join("Cargo.toml")).unwrap();
    let version = cargo.lines().find_map(|l| l.strip_prefix("version = ")).unwrap().trim_matches('"');
    let chart_yaml: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(helm_chart().join("Chart.yaml")).unwrap())
        .expect("Chart.yaml");
    assert_eq!(chart_yaml["appVersion"], version, "Chart.yaml's appVersion is not the workspace's version");
    assert_eq!(chart_yaml["apiVersion"], "v2");
    assert_eq!(chart.container()["image"], plain.container()["image"]);
    assert_eq!(chart.container()["image"], format!("ghcr.io/sluice-dev/sluice:{version}"));

    // The pod: its arguments, environment, ports, probes, resources and
    // hardening (non-root 65532, read-only root, seccomp, no capabilities).
    for key in
        ["args", "env", "ports", "readinessProbe", "livenessProbe", "resources", "securityContext", "volumeMounts"]
    {
        assert_eq!(chart.container()[key], plain.container()[key], "container {key}");
    }
    for key in ["securityContext", "terminationGracePeriodSeconds", "volumes"] {
        assert_eq!(chart.pod()["spec"][key], plain.pod()["spec"][key], "pod {key}");
    }
    assert_eq!(chart.pod()["spec"]["securityContext"]["runAsUser"], 65532);
    assert_eq!(chart.container()["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(chart.pod()["metadata"]["annotations"], plain.pod()["metadata"]["annotations"]);
    // Spread alike; each selects its own pods (the chart's carry the release too).
    let pod_labels = chart.pod()["metadata"]["labels"].as_object().unwrap();
    let spread = |r: &Rendered| {
        let mut constraint = r.pod()["spec"]["topologySpreadConstraints"][0].clone();
        constraint.as_object_mut().unwrap().remove("labelSelector").expect("a labelSelector");
        constraint
    };
    assert_eq!(spread(&chart), spread(&plain));
    let selects_pods = |what: &str, selector: &Value| {
        let selector = selector.as_object().unwrap_or_else(|| panic!("{what} selects nothing"));
        assert!(selector.contains_key("app.kubernetes.io/instance"), "{what} selects other releases' pods");
        for (key, value) in selector {
            assert_eq!(pod_labels.get(key), Some(value), "{what} selects {key}={value}, not on the pods");
        }
    };
    let deployment = chart.one("Deployment");
    selects_pods("the Deployment", &deployment["spec"]["selector"]["matchLabels"]);
    selects_pods("the spread", &chart.pod()["spec"]["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"]);
    selects_pods("the Service", &chart.one("Service")["spec"]["selector"]);
    selects_pods("the PDB", &chart.one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"]);
    selects_pods("the NetworkPolicy", &chart.one("NetworkPolicy")["spec"]["podSelector"]["matchLabels"]);
    assert_eq!(deployment["spec"]["replicas"], 2);

    // Least privilege: the very rules of rbac.yaml, bound to the ServiceAccount.
    assert_eq!(chart.one("Role")["rules"], plain.one("Role")["rules"]);
    assert_eq!(chart.one("RoleBinding")["roleRef"], plain.one("RoleBinding")["roleRef"]);
    assert_eq!(chart.one("RoleBinding")["subjects"], plain.one("RoleBinding")["subjects"]);
    assert_eq!(chart.pod()["spec"]["serviceAccountName"], "sluice-gateway");
    assert!(chart.kinds("ClusterRole").is_empty() && chart.kinds("ClusterRoleBinding").is_empty());

    assert_eq!(chart.one("Service")["spec"]["ports"], plain.one("Service")["spec"]["ports"]);
    let without_selector = |object: &Value, selector: &str| {
        let mut spec = object["spec"].clone();
        spec.as_object_mut().unwrap().remove(selector);
        spec
    };
    assert_eq!(
        without_selector(chart.one("PodDisruptionBudget"), "selector"),
        without_selector(plain.one("PodDisruptionBudget"), "selector")
    );
    assert_eq!(
        without_selector(chart.one("NetworkPolicy"), "podSelector"),
        without_selector(plain.one("NetworkPolicy"), "podSelector")
    );
}

#[tokio::test]
async fn the_image_is_pinned_by_digest_when_one_is_given() {
    let helm = Helm::new();
    let tagged = render(&helm, "image:\n  repository: registry.example.com/sluice\n  tag: dev\n").await;
    assert_eq!(tagged.container()["image"], "registry.example.com/sluice:dev");
    assert_eq!(tagged.container()["imagePullPolicy"], "IfNotPresent");
    assert!(tagged.pod()["spec"]["imagePullSecrets"].is_null());

    let values = format!(
        "image:\n  repository: registry.example.com/sluice\n  tag: dev\n  digest: {DIGEST}\n  pullPolicy: Always\n\
         imagePullSecrets:\n  - name: regcred\n"
    );
    let pinned = render(&helm, &values).await;
    // The digest wins over the tag.
    assert_eq!(pinned.container()["image"], format!("registry.example.com/sluice@{DIGEST}"));
    assert_eq!(pinned.container()["imagePullPolicy"], "Always");
    assert_eq!(pinned.pod()["spec"]["imagePullSecrets"], json!([{"name": "regcred"}]));
}

#[tokio::test]
async fn watched_namespaces_get_their_roles_and_the_leases_stay_home() {
    let helm = Helm::new();
    let rules = |r: &Rendered, namespace: &str| -> Vec<String> {
        let role = r.find("Role", namespace, "sluice").unwrap_or_else(|| panic!("no Role in {namespace}"));
        let binding = r.find("RoleBinding", namespace, "sluice").unwrap_or_else(|| panic!("no binding in {namespace}"));
        assert_eq!(binding["roleRef"]["name"], "sluice");
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": "sluice", "namespace": "sluice-system"}])
        );
        let rules = role["rules"].as_array().unwrap();
        rules.iter().flat_map(|r| strings(&r["resources"])).collect()
    };

    // Another namespace: its configuration and Secrets there, the Leases here.
    let one = render(&helm, "watchNamespaces: [team-a]\n").await;
    assert_eq!(one.flag("--watch-namespace"), ["team-a"]);
    assert_eq!(one.flag("--lease-namespace"), ["$(POD_NAMESPACE)"]);
    let team = rules(&one, "team-a");
    assert!(team.contains(&"secrets".into()) && team.contains(&"gatewayplugins".into()), "{team:?}");
    assert!(!team.contains(&"leases".into()), "{team:?}");
    assert_eq!(rules(&one, "sluice-system"), ["leases"]);
    assert_eq!(one.kinds("Role").len(), 2);

    // Its own namespace, named: one Role, as by default.
    let own = render(&helm, "watchNamespaces: [sluice-system]\n").await;
    assert_eq!(own.flag("--watch-namespace"), ["$(POD_NAMESPACE)"]);
    assert_eq!(own.kinds("Role").len(), 1);
    assert!(rules(&own, "sluice-system").contains(&"leases".into()));

    // The gateway watches one namespace or all: more is refused, saying what to do.
    let several = refused(&helm, "watchNamespaces: [team-a, team-b]\n").await;
    assert!(several.contains("team-a, team-b") && several.contains("watchAllNamespaces"), "{several}");

    // All of them: a ClusterRole for the configuration, the Leases still in a Role.
    let all = render(&helm, "watchAllNamespaces: true\n").await;
    assert!(all.flag("--watch-namespace").is_empty(), "{:?}", all.args());
    let cluster_role = all.one("ClusterRole");
    assert_eq!(cluster_role["metadata"]["name"], "sluice-sluice-system");
    let resources: Vec<String> =
        cluster_role["rules"].as_array().unwrap().iter().flat_map(|r| strings(&r["resources"])).collect();
    assert!(resources.contains(&"secrets".into()) && !resources.contains(&"leases".into()), "{resources:?}");
    assert_eq!(all.one("ClusterRoleBinding")["roleRef"]["name"], "sluice-sluice-system");
    assert_eq!(rules(&all, "sluice-system"), ["leases"]);
    refused(&helm, "watchAllNamespaces: true\nwatchNamespaces: [team-a]\n").await;

    let none = render(&helm, "rbac:\n  create: false\n").await;
    assert!(none.kinds("Role").is_empty() && none.kinds("RoleBinding").is_empty());
}

/// The MCP session keys: a Secret every replica mounts, named by file, so
/// any replica continues any session.
#[tokio::test]
async fn mcp_session_keys_come_from_a_secret_every_replica_mounts() {
    let helm = Helm::new();
    let chart = render(&helm, "mcp:\n  sessionKeysSecret:\n    name: mcp-keys\n").await;
    let keys = chart.flag("--mcp-session-keys");
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert_eq!(chart.file_source(&keys[0]), src("secret", "mcp-keys", "keys"));
    let other_key = render(&helm, "mcp:\n  sessionKeysSecret:\n    name: mcp-keys\n    key: ring\n").await;
    assert_eq!(other_key.file_source(&other_key.flag("--mcp-session-keys")[0]), src("secret", "mcp-keys", "ring"));
    // None by default: each replica makes up its own key.
    assert!(render(&helm, "{}\n").await.flag("--mcp-session-keys").is_empty());
    refused(&helm, "mcp:\n  sessionKeysSecret:\n    name: k\n    key: ../x\n").await;
    refused(&helm, "mcp:\n  keys: k\n").await;
}

#[tokio::test]
async fn redis_comes_from_a_secret_without_showing_in_the_arguments() {
    let helm = Helm::new();
    let values = "redis:\n  urlSecret:\n    name: redis\n    key: url\n  username: sluice\n  passwordSecret:\n    \
                  name: redis\n    key: password\n  ca:\n    secret: redis-tls\n    key: ca.crt\n  \
                  clientCertSecret: redis-client\n  timeoutMs: 250\n";
    let chart = render(&helm, values).await;
    // The URL (it may hold a password) from the Secret, by environment.
    assert_eq!(
        chart.env("SLUICE_STATE_REDIS_URL").unwrap()["valueFrom"],
        json!({"secretKeyRef": {"name": "redis", "key": "url"}})
    );
    assert!(chart.flag("--state-redis-url").is_empty());
    assert_eq!(chart.flag("--state-redis-username"), ["sluice"]);
    assert_eq!(chart.flag("--state-redis-timeout-ms"), ["250"]);
    // The password is a file from the Secret, never a flag's value.
    let password = chart.flag("--state-redis-password-file");
    assert_eq!(chart.file_source(&password[0]), src("secret", "redis", "password"));
    let ca = chart.flag("--state-redis-ca-file");
    assert_eq!(chart.file_source(&ca[0]), src("secret", "redis-tls", "ca.crt"));
    let cert = chart.flag("--state-redis-client-cert-file");
    assert_eq!(chart.file_source(&cert[0]), src("secret", "redis-client", "tls.crt"));
    let key = chart.flag("--state-redis-client-key-file");
    assert_eq!(chart.file_source(&key[0]), src("secret", "redis-client", "tls.key"));

    let by_url = render(&helm, "redis:\n  url: redis://redis.cache:6379/0\n").await;
    assert_eq!(by_url.flag("--state-redis-url"), ["redis://redis.cache:6379/0"]);
    assert!(by_url.env("SLUICE_STATE_REDIS_URL").is_none());

    // Not both; no password without a Redis; a URL must be one.
    refused(&helm, "redis:\n  url: redis://a:6379\n  urlSecret:\n    name: redis\n").await;
    refused(&helm, "redis:\n  passwordSecret:\n    name: redis\n").await;
    refused(&helm, "redis:\n  url: http://a:6379\n").await;
    // By default: state in each replica's memory.
    let none = render(&helm, "{}\n").await;
    assert!(none.args().iter().all(|a| !a.starts_with("--state-redis")), "{:?}", none.args());
}

#[tokio::test]
async fn metrics_network_policy_and_disruption_budget_can_be_turned_off() {
    let helm = Helm::new();
    let off = render(&helm, "metrics:\n  enabled: false\n").await;
    assert!(off.flag("--metrics").is_empty());
    assert_eq!(off.port("metrics"), None);
    assert!(off.pod()["metadata"]["annotations"].is_null(), "{}", off.pod()["metadata"]);
    let policy = off.one("NetworkPolicy");
    assert_eq!(policy["spec"]["ingress"], json!([{"ports": [{"port": "http", "protocol": "TCP"}]}]));

    let moved = render(&helm, "metrics:\n  port: 9100\n  scrapeAnnotations: false\n").await;
    assert_eq!(moved.flag("--metrics"), ["0.0.0.0:9100"]);
    assert_eq!(moved.port("metrics"), Some(9100));
    assert!(moved.pod()["metadata"]["annotations"].is_null());
    let annotated = render(&helm, "metrics:\n  port: 9100\n").await;
    assert_eq!(annotated.pod()["metadata"]["annotations"]["prometheus.io/port"], "9100");

    let ports = render(&helm, "ports:\n  http: 8000\n  admin: 9000\n  probes: 9001\n").await;
    assert_eq!(ports.flag("--listen"), ["0.0.0.0:8000"]);
    // The config view stays on loopback whatever the port.
    assert_eq!(ports.flag("--admin"), ["127.0.0.1:9000"]);
    assert_eq!(ports.flag("--probes"), ["0.0.0.0:9001"]);
    assert_eq!((ports.port("http"), ports.port("probes")), (Some(8000), Some(9001)));
    refused(&helm, "ports:\n  probes: 9903\n").await;

    let bare = render(&helm, "networkPolicy:\n  enabled: false\npdb:\n  enabled: false\n").await;
    assert!(bare.kinds("NetworkPolicy").is_empty() && bare.kinds("PodDisruptionBudget").is_empty());
    // One replica: a budget of one would block every drain.
    let single = render(&helm, "replicas: 1\n").await;
    assert!(single.kinds("PodDisruptionBudget").is_empty());
    assert_eq!(single.one("Deployment")["spec"]["replicas"], 1);

    let narrowed = "networkPolicy:\n  httpFrom:\n    - namespaceSelector:\n        matchLabels:\n          \
                    team: a\n  metricsFrom:\n    - namespaceSelector:\n        matchLabels:\n          \
                    kubernetes.io/metadata.name: monitoring\n";
    let narrowed = render(&helm, narrowed).await;
    let ingress = &narrowed.one("NetworkPolicy")["spec"]["ingress"];
    assert_eq!(ingress[0]["from"][0]["namespaceSelector"]["matchLabels"]["team"], "a");
    assert_eq!(ingress[1]["ports"][0]["port"], "metrics");
    assert_eq!(ingress[1]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"], "monitoring");

    let unspread = render(&helm, "topologySpread:\n  enabled: false\n").await;
    assert!(unspread.pod()["spec"]["topologySpreadConstraints"].is_null());
}

#[tokio::test]
async fn ca_bundles_and_registry_credentials_are_mounted_files_passed_to_their_flags() {
    let helm = Helm::new();
    let values = "caBundles:\n  - configMap: corp-ca\n    key: ca.crt\n  - secret: partner-ca\n    key: bundle.pem\n\
                  registry:\n  credentials:\n    secretName: regcred\n    namespaces: [team-a, team-b]\n  \
                  insecure: [registry.internal:5000]\n";
    let chart = render(&helm, values).await;
    let bundles = chart.flag("--ca-bundle");
    assert_eq!(bundles.len(), 2, "{:?}", chart.args());
    assert_eq!(chart.file_source(&bundles[0]), src("configMap", "corp-ca", "ca.crt"));
    assert_eq!(chart.file_source(&bundles[1]), src("secret", "partner-ca", "bundle.pem"));
    let docker = chart.flag("--docker-config");
    assert_eq!(chart.file_source(&docker[0]), src("secret", "regcred", ".dockerconfigjson"));
    assert_eq!(chart.flag("--registry-credentials-namespace"), ["team-a", "team-b"]);
    assert_eq!(chart.flag("--insecure-registry"), ["registry.internal:5000"]);
    // Still the only writable path: the cache.
    assert_eq!(chart.container()["securityContext"]["readOnlyRootFilesystem"], true);
    let writable: Vec<&Value> =
        chart.container()["volumeMounts"].as_array().unwrap().iter().filter(|m| m["readOnly"] != true).collect();
    assert_eq!(writable, [&json!({"name": "cache", "mountPath": "/var/cache/sluice"})]);

    refused(&helm, "caBundles:\n  - key: ca.crt\n").await;
    refused(&helm, "caBundles:\n  - configMap: a\n    secret: b\n    key: ca.crt\n").await;
}

#[tokio::test]
async fn tenancy_shutdown_cache_and_extra_values_reach_the_pod() {
    let helm = Helm::new();
    let values = "modelClaims:\n  - namespace: team-a\n    models: gpt-4o*\n  - namespace: team-b\n    \
                  models: gpt-4o-mini\nmcpPathClaims:\n  - namespace: team-a\n    path: /mcp/team-a\n  \
                  - namespace: platform\n    path: \"*\"\nhostAccess:\n  filesUnder: [/plugins]\n  env: [OPENAI_API_KEY]\n\
                  allowBackendCidrs: [10.0.0.0/8]\nextraArgs: [--max-body-bytes=4194304]\n\
                  extraEnv:\n  - name: OPENAI_API_KEY\n    valueFrom:\n      secretKeyRef: {name: openai, key: api-key}\n\
                  extraVolumes:\n  - name: plugins\n    configMap: {name: plugins}\n\
                  extraVolumeMounts:\n  - name: plugins\n    mountPath: /plugins\n    readOnly: true\n\
                  shutdown:\n  delaySeconds: 10\n  drainSeconds: 60\nterminationGracePeriodSeconds: 80\n\
                  cache:\n  volume:\n    persistentVolumeClaim:\n      claimName: sluice-cache\n\
                  logLevel: debug\nresources:\n  requests:\n    cpu: 1\n";
    let chart = render(&helm, values).await;
    assert_eq!(chart.flag("--model-claim"), ["team-a=gpt-4o*", "team-b=gpt-4o-mini"]);
    assert_eq!(chart.flag("--mcp-path-claim"), ["team-a=/mcp/team-a", "platform=*"]);
    assert_eq!(chart.flag("--allow-host-files-under"), ["/plugins"]);
    assert_eq!(chart.flag("--allow-host-env"), ["OPENAI_API_KEY"]);
    assert_eq!(chart.flag("--allow-backend-cidr"), ["10.0.0.0/8"]);
    assert_eq!(chart.args().last().unwrap(), "--max-body-bytes=4194304");
    assert!(chart.env("OPENAI_API_KEY").is_some());
    assert_eq!(chart.env("RUST_LOG").unwrap()["value"], "debug");
    assert_eq!(chart.flag("--shutdown-delay-seconds"), ["10"]);
    assert_eq!(chart.flag("--drain-seconds"), ["60"]);
    assert_eq!(chart.pod()["spec"]["terminationGracePeriodSeconds"], 80);
    let volumes = chart.pod()["spec"]["volumes"].as_array().unwrap();
    let cache = volumes.iter().find(|v| v["name"] == "cache").unwrap();
    assert_eq!(cache["persistentVolumeClaim"]["claimName"], "sluice-cache");
    assert!(cache["emptyDir"].is_null());
    assert!(volumes.iter().any(|v| v["name"] == "plugins"));
    // Helm merges maps with the defaults: the other requests and the limit stay.
    assert_eq!(
        chart.container()["resources"],
        json!({"requests": {"cpu": 1, "memory": "256Mi"}, "limits": {"memory": "1Gi"}})
    );

    // The kubelet's SIGKILL must come after the delay and the drain.
    let short = refused(&helm, "terminationGracePeriodSeconds: 35\n").await;
    assert!(short.contains("terminationGracePeriodSeconds (35)"), "{short}");
}

/// `helm template` of every value set above at once, applied with
/// `kubectl apply --dry-run=server --validate=strict`: the apiserver itself
/// refuses a field it does not know, which `helm install` only warns about.
#[tokio::test]
async fn every_value_set_is_valid_to_the_apiserver_strictly() {
    let cluster = KubeCluster::shared().await;
    let (ns, team) = ("helm-strict", "helm-strict-team");
    for namespace in [ns, team] {
        cluster.kubectl_ok(&["create", "namespace", namespace]).await;
    }
    let helm = Helm::new();
    let everything = format!(
        "image:\n  digest: {DIGEST}\nimagePullSecrets: [{{name: regcred}}]\nwatchNamespaces: [{team}]\n\
         modelClaims: [{{namespace: {team}, models: gpt-*}}]\nhostAccess: {{filesUnder: [/plugins], env: [KEY]}}\n\
         mcpPathClaims: [{{namespace: {team}, path: /mcp}}]\nmcp: {{sessionKeysSecret: {{name: mcp-keys}}}}\n\
         caBundles: [{{configMap: corp-ca, key: ca.crt}}]\nregistry: {{credentials: {{secretName: regcred}}}}\n\
         redis: {{urlSecret: {{name: redis}}, passwordSecret: {{name: redis}}, ca: {{secret: r, key: ca.crt}}, \
         clientCertSecret: rc}}\nnetworkPolicy: {{httpFrom: [{{podSelector: {{}}}}]}}\n\
         podAnnotations: {{a: b}}\npodLabels: {{c: d}}\nnodeSelector: {{kubernetes.io/os: linux}}\n\
         tolerations: [{{key: k, operator: Exists}}]\nserviceAccount: {{annotations: {{e: f}}}}\n\
         service: {{annotations: {{g: h}}}}\n"
    );
    for values in [everything.as_str(), "{}\n", "watchAllNamespaces: true\nmetrics: {enabled: false}\n"] {
        let out = helm.template("strict", ns, values, &[]).await;
        assert!(out.success, "{}", out.stderr);
        let mut child = cluster
            .kubectl()
            .args(["apply", "--dry-run=server", "--validate=strict", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(out.stdout.as_bytes()).await.unwrap();
        let result = child.wait_with_output().await.unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&result.stdout), String::from_utf8_lossy(&result.stderr));
        assert!(result.status.success(), "the apiserver refused\n{values}\n{stdout}\n{stderr}");
        assert!(stdout.contains("deployment.apps/strict-sluice created (server dry run)"), "{stdout}");
    }
}

/// Every flag the chart renders is one `sluice run` takes: the binary,
/// given a value set's arguments (the pod's fields filled in, listeners on
/// loopback) and a kubeconfig that does not exist, gets past parsing them
/// and stops at the first file it cannot read, not at a usage error.
#[tokio::test]
async fn the_rendered_arguments_are_ones_sluice_run_takes() {
    let helm = Helm::new();
    let scratch = tempfile::tempdir().unwrap();
    let everything = format!(
        "watchNamespaces: [team-a]\nmodelClaims: [{{namespace: team-a, models: gpt-4o*}}]\n\
         mcpPathClaims: [{{namespace: team-a, path: /mcp/team-a}}, {{namespace: team-b, path: '*'}}]\n\
         hostAccess: {{filesUnder: [/plugins], env: [KEY]}}\nallowBackendCidrs: [10.0.0.0/8]\n\
         caBundles: [{{configMap: corp-ca, key: ca.crt}}]\n\
         registry: {{credentials: {{secretName: regcred, namespaces: [team-a]}}, insecure: [r.internal:5000]}}\n\
         redis: {{url: 'rediss://redis:6379', username: u, passwordSecret: {{name: r}}, \
         ca: {{secret: r, key: ca.crt}}, clientCertSecret: rc, timeoutMs: 250}}\n\
         extraArgs: [--max-body-bytes=4194304]\nimage: {{digest: {DIGEST}}}\n"
    );
    for values in ["{}\n", everything.as_str(), "watchAllNamespaces: true\nmetrics: {enabled: false}\n"] {
        let chart = render(&helm, values).await;
        let args: Vec<String> = chart
            .args()
            .into_iter()
            .map(|arg| {
                let arg = arg.replace("$(POD_NAMESPACE)", "sluice-system").replace("$(POD_NAME)", "pod-0");
                match arg.split_once('=') {
                    Some((flag @ ("--listen" | "--admin" | "--probes" | "--metrics"), _)) => {
                        format!("{flag}=127.0.0.1:0")
                    }
                    Some((flag @ ("--cache-dir" | "--oci-cache-dir"), _)) => {
                        format!("{flag}={}", scratch.path().join(&flag[2..]).display())
                    }
                    _ => arg,
                }
            })
            .collect();
        let run = tokio::process::Command::new(sluice_tests::sluice_binary())
            .args(&args)
            .arg("--kubeconfig")
            .arg(scratch.path().join("no-kubeconfig"))
            .env("RUST_BACKTRACE", "0")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(30), run).await.expect("sluice run to stop").unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        // clap exits 2 with a usage message on an argument it does not take.
        assert_eq!(out.status.code(), Some(1), "{args:?}\n{stderr}");
        assert!(stderr.starts_with("Error: ") && !stderr.contains("Usage:"), "{args:?}\n{stderr}");
    }
}

/// add-header from plugins/dist, pushed to a registry of its own (in a
/// cluster plugins come from OCI).
async fn push_add_header(registry: &Registry) -> String {
    let reference = registry.reference("plugins/add-header:1");
    let scratch = tempfile::tempdir().unwrap();
    let client = sluice_oci::Registry::new(RegistryOptions::new(scratch.path().join("cache"))).unwrap();
    let parsed: Reference = reference.parse().unwrap();
    let bytes = std::fs::read(plugin_wasm("add-header")).unwrap();
    client.push(bytes, &parsed, BTreeMap::new(), None).await.expect("pushing add-header");
    reference
}

async fn get_json(cluster: &KubeCluster, args: &[&str]) -> Value {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", "json"]);
    serde_json::from_str(&cluster.kubectl_ok(&all).await).unwrap()
}

fn condition<'a>(object: &'a Value, type_: &str) -> Option<(&'a str, &'a str)> {
    let conditions = object["status"]["conditions"].as_array()?;
    let c = conditions.iter().find(|c| c["type"] == type_)?;
    Some((c["status"].as_str()?, c["reason"].as_str()?))
}

async fn wait_condition(cluster: &KubeCluster, ns: &str, kind: &str, name: &str, type_: &str, want: (&str, &str)) {
    let what = format!("{kind} {name}: {type_}={want:?}");
    eventually(&what, WAIT, async || {
        let object = get_json(cluster, &[kind, name, "-n", ns]).await;
        let current = object["status"]["observedGeneration"] == object["metadata"]["generation"];
        (current && condition(&object, type_) == Some(want)).then_some(())
    })
    .await;
}

/// The Deployment's arguments a process on this machine can take: the
/// listeners, caches, namespaces and replica name are the harness's own
/// (the pod's fixed ports would collide between tests), the rest are the
/// chart's as rendered.
fn runnable_args(deployment: &Value) -> Vec<String> {
    const HARNESS_SETS: [&str; 9] = [
        "--watch-namespace=",
        "--lease-namespace=",
        "--replica-name=",
        "--listen=",
        "--admin=",
        "--probes=",
        "--metrics=",
        "--cache-dir=",
        "--oci-cache-dir=",
    ];
    let args = strings(&deployment["spec"]["template"]["spec"]["containers"][0]["args"]);
    assert_eq!(args[..2], ["run", "--kubernetes"]);
    args[2..].iter().filter(|a| !HARNESS_SETS.iter().any(|flag| a.starts_with(flag))).cloned().collect()
}

#[tokio::test]
async fn the_chart_installs_upgrades_and_uninstalls_on_a_real_apiserver_and_its_rbac_runs_the_gateway() {
    // Its own apiserver: the CRDs must come from the chart's crds/, not
    // from another test.
    let cluster = KubeCluster::start().await;
    let helm = Helm::new();
    let chart = helm_chart();
    let chart = chart.to_str().unwrap();
    let kubeconfig = cluster.kubeconfig().to_str().unwrap();
    let (ns, team, release) = ("sluice-helm", "sluice-helm-team", "edge");
    let helm_args = |verb: &'static str, extra: &[&'static str]| -> Vec<String> {
        let mut args: Vec<String> =
            [verb, release, chart, "--namespace", ns, "--kubeconfig", kubeconfig].map(String::from).to_vec();
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    };
    let run = async |args: Vec<String>, values: &str| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        helm.ok_with_stdin(&args, Some(values)).await
    };
    let crd_exists = async || cluster.kubectl_result(&["get", "crd", "gatewayplugins.sluice.dev"]).await.0;
    let install_values = format!("modelClaims:\n  - namespace: {ns}\n    models: gpt-helm*\n");

    // A server dry run renders against the apiserver and creates nothing.
    let dry = run(helm_args("install", &["--create-namespace", "--dry-run=server", "-f", "-"]), &install_values).await;
    assert!(dry.contains("STATUS: pending-install"), "{dry}");
    assert!(dry.contains("kind: Deployment"), "{dry}");
    assert!(!crd_exists().await, "a dry run installed the CRDs");
    let (deployed, _, _) = cluster.kubectl_result(&["get", "deployment", "edge-sluice", "-n", ns]).await;
    assert!(!deployed, "a dry run created the Deployment");

    let installed = run(helm_args("install", &["--create-namespace", "-f", "-"]), &install_values).await;
    assert!(installed.contains("STATUS: deployed"), "{installed}");
    // NOTES.txt, rendered.
    assert!(installed.contains("port-forward service/edge-sluice 8080:80"), "{installed}");
    cluster
        .kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/gatewayplugins.sluice.dev",
            "crd/aimodelroutes.sluice.dev",
        ])
        .await;
    // Helm made them (this apiserver is the test's own).
    let crd = get_json(&cluster, &["crd", "gatewayplugins.sluice.dev", "--show-managed-fields"]).await;
    let managers: Vec<&str> =
        crd["metadata"]["managedFields"].as_array().unwrap().iter().filter_map(|f| f["manager"].as_str()).collect();
    assert!(managers.contains(&"helm"), "{managers:?}");
    // A typo is refused, and no release made. (Helm installs crds/ before
    // it reads the values: a refused first install leaves the CRDs.)
    let typo =
        helm.run(&["install", "typo", chart, "-n", ns, "--kubeconfig", kubeconfig, "--set", "replicass=3"], None).await;
    assert!(!typo.success && typo.stderr.contains("replicass"), "{typo:?}");
    let releases: Value =
        serde_json::from_str(&helm.ok(&["list", "-n", ns, "--kubeconfig", kubeconfig, "-o", "json"]).await).unwrap();
    assert_eq!(releases.as_array().unwrap().len(), 1, "{releases}");
    assert_eq!(releases[0]["name"], release);
    assert_eq!(releases[0]["status"], "deployed");
    assert_eq!(releases[0]["revision"], "1");
    let deployment = get_json(&cluster, &["deployment", "edge-sluice", "-n", ns]).await;
    assert_eq!(deployment["spec"]["replicas"], 2);
    // Stored, never run: there is no scheduler or kubelet here.
    assert_eq!(deployment["status"]["readyReplicas"], Value::Null);
    for object in ["serviceaccount/edge-sluice", "role/edge-sluice", "rolebinding/edge-sluice", "service/edge-sluice"] {
        cluster.kubectl_ok(&["get", object, "-n", ns]).await;
    }
    cluster.kubectl_ok(&["get", "poddisruptionbudget/edge-sluice", "networkpolicy/edge-sluice", "-n", ns]).await;

    // Least privilege: what the chart's ServiceAccount may and may not do.
    let sa = format!("system:serviceaccount:{ns}:edge-sluice");
    let can = async |args: &[&str]| {
        let mut all = vec!["auth", "can-i", "--as", sa.as_str()];
        all.extend_from_slice(args);
        cluster.kubectl_result(&all).await.1.trim() == "yes"
    };
    assert!(can(&["watch", "gatewayplugins.sluice.dev", "-n", ns]).await);
    assert!(can(&["patch", "aimodelroutes.sluice.dev", "--subresource=status", "-n", ns]).await);
    assert!(can(&["list", "secrets", "-n", ns]).await);
    assert!(can(&["delete", "leases.coordination.k8s.io", "-n", ns]).await);
    assert!(!can(&["list", "secrets", "-n", "default"]).await, "no Secrets outside its namespace");
    assert!(!can(&["list", "gatewayplugins.sluice.dev", "--all-namespaces"]).await);
    assert!(!can(&["update", "gatewayplugins.sluice.dev", "-n", ns]).await, "no writes to specs");
    assert!(!can(&["create", "pods", "-n", ns]).await);
    assert!(!can(&["delete", "secrets", "-n", ns]).await);
    assert!(!can(&["patch", "deployments.apps", "-n", ns]).await);

    // The gateway with that ServiceAccount's token and the Deployment's own
    // arguments: it serves through a plugin, writes status, and enforces
    // the chart's --model-claim.
    let token = cluster.kubectl_ok(&["create", "token", "edge-sluice", "-n", ns]).await;
    let scratch = tempfile::tempdir().unwrap();
    let sa_kubeconfig = scratch.path().join("sa.kubeconfig");
    std::fs::copy(cluster.kubeconfig(), &sa_kubeconfig).unwrap();
    let kc = sa_kubeconfig.to_str().unwrap();
    cluster.kubectl_ok(&["--kubeconfig", kc, "config", "set-credentials", "sa", "--token", token.trim()]).await;
    cluster.kubectl_ok(&["--kubeconfig", kc, "config", "set-context", "--current", "--user", "sa"]).await;
    let args = runnable_args(&deployment);
    assert!(args.contains(&format!("--model-claim={ns}=gpt-helm*")), "{args:?}");
    assert!(args.contains(&"--drain-seconds=30".to_string()), "{args:?}");
    let registry = Registry::start();
    let reference = push_add_header(&registry).await;
    let echo = Echo::start().await;
    let mut gateway =
        Gateway::start_kubernetes(&sa_kubeconfig, ns, "helm-replica", Options { args, ..Options::default() }).await;
    let plugin = format!(
        "apiVersion: sluice.dev/v1alpha1\nkind: GatewayPlugin\nmetadata:\n  name: add-header\n  namespace: {ns}\n\
         spec:\n  source:\n    oci: {reference}\n  config:\n    header: x-team\n    value: helm\n"
    );
    let route = |name: &str, model: &str| {
        format!(
            "apiVersion: sluice.dev/v1alpha1\nkind: AIModelRoute\nmetadata:\n  name: {name}\n  namespace: {ns}\n\
             spec:\n  models: [{model}]\n  backends:\n  - url: {}\n  plugins:\n  - name: add-header\n",
            echo.url()
        )
    };
    cluster.apply(&plugin).await;
    cluster.apply(&route("chat", "gpt-helm-mini")).await;
    cluster.apply(&route("unclaimed", "gpt-elsewhere")).await;
    eventually("traffic through the plugin under the chart's RBAC", WAIT, async || {
        let reply = gateway.chat("gpt-helm-mini", &[]).await;
        (reply.status == 200 && reply.echoed()["headers"]["x-team"] == "helm").then_some(())
    })
    .await;
    wait_condition(&cluster, ns, "gatewayplugin", "add-header", "Ready", ("True", "Loaded")).await;
    wait_condition(&cluster, ns, "aimodelroute", "chat", "Ready", ("True", "Loaded")).await;
    wait_condition(&cluster, ns, "aimodelroute", "unclaimed", "Accepted", ("False", "ModelNotPermitted")).await;
    assert_eq!(gateway.chat("gpt-elsewhere", &[]).await.status, 404);
    gateway.terminate();
    gateway.wait_exit(Duration::from_secs(30)).await.expect("the gateway exits on SIGTERM");
    assert!(!gateway.log().contains("forbidden"), "{}", gateway.log());
    drop(gateway);

    // An upgrade: another namespace watched, three replicas, no metrics.
    cluster.kubectl_ok(&["create", "namespace", team]).await;
    let upgrade_values = format!("replicas: 3\nwatchNamespaces: [{team}]\nmetrics:\n  enabled: false\n");
    let upgraded = run(helm_args("upgrade", &["-f", "-"]), &upgrade_values).await;
    assert!(upgraded.contains("REVISION: 2"), "{upgraded}");
    let deployment = get_json(&cluster, &["deployment", "edge-sluice", "-n", ns]).await;
    assert_eq!(deployment["spec"]["replicas"], 3);
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let args = strings(&container["args"]);
    assert!(args.contains(&format!("--watch-namespace={team}")), "{args:?}");
    assert!(!args.iter().any(|a| a.starts_with("--metrics") || a.starts_with("--model-claim")), "{args:?}");
    assert!(container["ports"].as_array().unwrap().iter().all(|p| p["name"] != "metrics"));
    assert!(deployment["spec"]["template"]["metadata"]["annotations"].is_null());
    // The configuration's rights moved to the watched namespace; the
    // Leases stayed.
    assert!(can(&["list", "secrets", "-n", team]).await);
    assert!(can(&["watch", "aimodelroutes.sluice.dev", "-n", team]).await);
    assert!(!can(&["list", "secrets", "-n", ns]).await, "the release namespace's Secrets after the move");
    assert!(!can(&["watch", "gatewayplugins.sluice.dev", "-n", ns]).await);
    assert!(can(&["update", "leases.coordination.k8s.io", "-n", ns]).await);
    let history: Value =
        serde_json::from_str(&helm.ok(&["history", release, "-n", ns, "--kubeconfig", kubeconfig, "-o", "json"]).await)
            .unwrap();
    assert_eq!(history.as_array().unwrap().len(), 2, "{history}");

    // Uninstalled: every object of the release is gone but the CRDs (and
    // so the resources), which Helm never deletes.
    let uninstalled = helm.ok(&["uninstall", release, "-n", ns, "--kubeconfig", kubeconfig]).await;
    assert!(uninstalled.contains("uninstalled"), "{uninstalled}");
    for (namespace, object) in [
        (ns, "deployment/edge-sluice"),
        (ns, "serviceaccount/edge-sluice"),
        (ns, "role/edge-sluice"),
        (ns, "rolebinding/edge-sluice"),
        (ns, "service/edge-sluice"),
        (ns, "poddisruptionbudget/edge-sluice"),
        (ns, "networkpolicy/edge-sluice"),
        (team, "role/edge-sluice"),
        (team, "rolebinding/edge-sluice"),
    ] {
        let (found, _, _) = cluster.kubectl_result(&["get", object, "-n", namespace]).await;
        assert!(!found, "{namespace}/{object} outlived the release");
    }
    assert!(crd_exists().await, "uninstall deleted the CRDs");
    cluster.kubectl_ok(&["get", "aimodelroute", "chat", "-n", ns]).await;
}
