//! The committed CRDs and the YAML under `deploy/` must match the Rust types.
//!
//! Every document under `deploy/` (and in any kustomization those files
//! reach, such as `crds/`) is read by its kind: Sluice kinds into this
//! crate's types, Kubernetes built-ins into their `k8s-openapi` types, and
//! `kustomization.yaml` files are checked for the paths they list. A kind
//! this test does not know fails it. The Helm chart (deploy/helm) is left to
//! tests/e2e/helm.rs, which renders it, but for its copy of the CRDs.

use std::any::TypeId;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::{NamespaceResourceScope, Resource};
use serde::Deserialize;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The CRDs are committed twice: for `kubectl apply` (crds/, which
/// deploy/kubernetes includes) and in the Helm chart's crds/ directory,
/// which Helm installs from. Both must be what crates/api generates.
#[test]
fn committed_crds_match_the_types() {
    let generated = sluice_api::crds_yaml();
    let stale: Vec<String> = CRD_COPIES
        .iter()
        .filter(|copy| std::fs::read_to_string(repo_root().join(copy)).unwrap_or_default() != generated)
        .map(|copy| copy.to_string())
        .collect();
    let [first, second] = CRD_COPIES;
    assert!(
        stale.is_empty(),
        "{} out of date with crates/api; regenerate both copies with\n  \
         cargo run -p sluice -- crds | tee {first} > {second}",
        stale.join(" and "),
    );
}

const CRD_COPIES: [&str; 2] = ["crds/sluice.dev.yaml", "deploy/helm/sluice/crds/sluice.dev.yaml"];

#[test]
fn every_yaml_under_deploy_deserializes() {
    let mut files = Vec::new();
    collect_yaml(&repo_root().join("deploy"), &mut files);
    assert!(!files.is_empty(), "no YAML found under deploy/");
    let mut failures = Vec::new();
    let mut checked = BTreeSet::new();
    while let Some(file) = files.pop() {
        let file = canonical(&file);
        if !checked.insert(file.clone()) {
            continue;
        }
        // A kustomization adds what it lists (files and other kustomizations)
        // to the files to check, so `crds/` is checked through deploy/kubernetes.
        let docs = match read_documents(&file) {
            Ok(docs) => docs,
            Err(e) => {
                failures.push(format!("{}: {e}", file.display()));
                continue;
            }
        };
        for (index, doc) in docs {
            if let Err(e) = check_document(&file, &doc, &mut files) {
                failures.push(format!("{}: document {index}: {e}", file.display()));
            }
        }
    }
    assert!(failures.is_empty(), "{} problem(s):\n{}", failures.len(), failures.join("\n"));
}

/// What `kubectl apply -k deploy/kubernetes` installs must fit together in
/// ways that neither the types nor an API server's dry run check.
#[test]
fn kubernetes_manifests_refer_to_each_other() {
    let root = repo_root().join("deploy/kubernetes");
    let mut objects = Vec::new();
    kustomize(&root, &mut objects);
    let one = |kind: &str| -> &Value {
        let mut all = objects.iter().filter(|o| o["kind"] == kind);
        let first = all.next().unwrap_or_else(|| panic!("no {kind} in deploy/kubernetes"));
        assert!(all.next().is_none(), "more than one {kind} in deploy/kubernetes");
        first
    };
    let namespace: Namespace = read(one("Namespace"));
    let namespace = namespace.metadata.name.unwrap();

    // No `namespace:` transformer: every namespaced object names its namespace.
    for object in &objects {
        let (api_version, kind) = (object["apiVersion"].as_str().unwrap(), object["kind"].as_str().unwrap());
        let entry = BUILTINS.iter().find(|b| b.api_version == api_version && b.kind == kind);
        if entry.is_some_and(|b| (b.namespaced)()) {
            assert_eq!(object["metadata"]["namespace"], namespace.as_str(), "{kind} {}", object["metadata"]["name"]);
        }
    }

    let deployment: Deployment = read(one("Deployment"));
    let spec = deployment.spec.unwrap();
    let pod_metadata = spec.template.metadata.unwrap();
    let pod_labels = pod_metadata.labels.unwrap();
    let selects_pods = |what: &str, selector: &BTreeMap<String, String>| {
        assert!(!selector.is_empty(), "{what} selects nothing");
        for (key, value) in selector {
            assert_eq!(pod_labels.get(key), Some(value), "{what} selects {key}={value}, not on the gateway pods");
        }
    };
    selects_pods("the Deployment", spec.selector.match_labels.as_ref().unwrap());
    let pod = spec.template.spec.unwrap();
    let container = &pod.containers[0];
    let ports: BTreeMap<_, _> =
        container.ports.iter().flatten().map(|p| (p.name.clone().unwrap(), p.container_port)).collect();

    let service: Service = read(one("Service"));
    let service = service.spec.unwrap();
    selects_pods("the Service", service.selector.as_ref().unwrap());
    for port in service.ports.iter().flatten() {
        match port.target_port.as_ref().unwrap() {
            IntOrString::String(name) => assert!(ports.contains_key(name), "Service targets port `{name}`"),
            IntOrString::Int(number) => assert!(ports.values().any(|p| p == number), "Service targets port {number}"),
        }
    }
    let pdb: PodDisruptionBudget = read(one("PodDisruptionBudget"));
    selects_pods("the PodDisruptionBudget", pdb.spec.unwrap().selector.unwrap().match_labels.as_ref().unwrap());

    for probe in [&container.readiness_probe, &container.liveness_probe] {
        let port = &probe.as_ref().unwrap().http_get.as_ref().unwrap().port;
        assert!(matches!(port, IntOrString::String(name) if ports.contains_key(name)), "probe on port {port:?}");
    }
    // The config view (every tenant's routes) stays on loopback, probes get
    // their own port, and the NetworkPolicy admits the API, probe and metrics
    // ports only.
    let arg = |flag: &str| container.args.iter().flatten().find_map(|a| a.strip_prefix(flag)).map(str::to_string);
    let admin = arg("--admin=").unwrap_or_else(|| "127.0.0.1:9901".into());
    assert!(admin.starts_with("127.0.0.1:"), "the admin listener (config view) is on {admin}");
    let probes = arg("--probes=").expect("--probes is set");
    let probe_port: i32 = probes.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(ports.get("probes"), Some(&probe_port));
    assert!(
        service.ports.iter().flatten().all(|p| p.name.as_deref() == Some("http")),
        "the Service publishes only http"
    );
    let policy: NetworkPolicy = read(one("NetworkPolicy"));
    let policy = policy.spec.unwrap();
    selects_pods("the NetworkPolicy", policy.pod_selector.as_ref().unwrap().match_labels.as_ref().unwrap());
    let admitted: BTreeSet<String> = policy
        .ingress
        .iter()
        .flatten()
        .flat_map(|rule| rule.ports.iter().flatten())
        .map(|p| match p.port.as_ref().unwrap() {
            IntOrString::String(name) => name.clone(),
            IntOrString::Int(number) => number.to_string(),
        })
        .collect();
    // Not probes: the kubelet probes from the pod's own node, which a
    // NetworkPolicy cannot block, and no pod has a reason to hold the
    // probes listener's connections.
    assert_eq!(admitted, BTreeSet::from(["http", "metrics"].map(String::from)));
    // The metrics listener has a port of its own, the one the pods' scrape
    // annotations name.
    let metrics = arg("--metrics=").expect("--metrics is set");
    let metrics_port: i32 = metrics.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(ports.get("metrics"), Some(&metrics_port));
    let annotations = pod_metadata.annotations.unwrap_or_default();
    let annotation = |key: &str| annotations.get(key).map(String::as_str);
    assert_eq!(annotation("prometheus.io/scrape"), Some("true"));
    assert_eq!(annotation("prometheus.io/port"), Some(metrics_port.to_string().as_str()));
    assert_eq!(annotation("prometheus.io/path"), Some("/metrics"));

    let account: ServiceAccount = read(one("ServiceAccount"));
    let account = account.metadata.name.unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some(account.as_str()));
    let role: Role = read(one("Role"));
    let binding: RoleBinding = read(one("RoleBinding"));
    assert_eq!(
        (binding.role_ref.kind.as_str(), &binding.role_ref.name),
        ("Role", role.metadata.name.as_ref().unwrap())
    );
    let subjects = binding.subjects.unwrap();
    assert!(
        subjects.iter().any(|s| s.kind == "ServiceAccount"
            && s.name == account
            && s.namespace.as_deref() == Some(namespace.as_str())),
        "the RoleBinding does not bind the ServiceAccount {namespace}/{account}: {subjects:?}"
    );
    // The shutdown delay and the drain must end before the kubelet's SIGKILL.
    let seconds = |flag: &str| -> i64 {
        container.args.iter().flatten().find_map(|a| a.strip_prefix(flag)).map_or(0, |v| v.parse().unwrap())
    };
    let shutdown = seconds("--shutdown-delay-seconds=") + seconds("--drain-seconds=");
    assert!(seconds("--drain-seconds=") > 0, "--drain-seconds is set");
    assert!(pod.termination_grace_period_seconds.unwrap() > shutdown);
}

fn read<T: DeserializeOwned>(value: &Value) -> T {
    serde_json::from_value(value.clone()).unwrap()
}

/// The documents of a YAML file, numbered from 1; empty documents skipped.
fn read_documents(file: &Path) -> Result<Vec<(usize, Value)>, String> {
    let text = std::fs::read_to_string(file).map_err(|e| e.to_string())?;
    let mut docs = Vec::new();
    for (i, de) in serde_yaml_ng::Deserializer::from_str(&text).enumerate() {
        match Value::deserialize(de).map_err(|e| format!("document {}: {e}", i + 1))? {
            Value::Null => {}
            value => docs.push((i + 1, value)),
        }
    }
    if docs.is_empty() {
        return Err("holds no documents".into());
    }
    Ok(docs)
}

fn check_document(file: &Path, doc: &Value, more_files: &mut Vec<PathBuf>) -> Result<(), String> {
    let api_version = doc.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
    let is_kustomization_file = KUSTOMIZATION_FILES.iter().any(|name| file.file_name() == Some(name.as_ref()));
    if is_kustomization_file || kind == "Kustomization" {
        if !is_kustomization_file || api_version != KUSTOMIZE_API_VERSION || kind != "Kustomization" {
            return Err(format!(
                "a Kustomization ({KUSTOMIZE_API_VERSION}) belongs in a file named kustomization.yaml, \
                 and nothing else does; got {api_version} {kind}"
            ));
        }
        return check_kustomization(file, doc, more_files);
    }
    if api_version == sluice_api::API_VERSION {
        return check_sluice(file, doc);
    }
    let Some(builtin) = BUILTINS.iter().find(|b| b.api_version == api_version && b.kind == kind) else {
        return Err(format!(
            "unknown kind `{kind}` of `{api_version}`: this test reads Sluice kinds, Kustomizations and {}; \
             add the k8s-openapi type to BUILTINS",
            BUILTINS.iter().map(|b| format!("{} {}", b.api_version, b.kind)).collect::<Vec<_>>().join(", ")
        ));
    };
    match doc.pointer("/metadata/name").and_then(Value::as_str) {
        Some(name) if !name.is_empty() => {}
        _ => return Err(format!("{kind} has no metadata.name")),
    }
    (builtin.check)(doc).map_err(|e| format!("{kind}: {e}"))
}

/// A Sluice resource, read as the gateway reads YAML files, then turned into
/// its declaration.
fn check_sluice(file: &Path, doc: &Value) -> Result<(), String> {
    let text = serde_yaml_ng::to_string(doc).map_err(|e| e.to_string())?;
    let mut docs = sluice_api::parse_documents(&text);
    assert_eq!(docs.len(), 1);
    let dir = file.parent().unwrap();
    // The specs deny unknown fields, but `metadata` does not: the round trip
    // catches a misspelt field there. Fields left out come back with their
    // defaults, so only the fields given are compared.
    match docs.remove(0).map_err(|e| e.message)? {
        sluice_api::Document::Plugin(p) => {
            p.decl(dir)?;
            compare(doc, &serde_json::to_value(&p).unwrap(), Compare::GivenFieldsOnly)
        }
        sluice_api::Document::Route(r) => {
            r.decl(dir)?;
            compare(doc, &serde_json::to_value(&r).unwrap(), Compare::GivenFieldsOnly)
        }
        sluice_api::Document::McpRoute(r) => {
            r.decl(dir)?;
            compare(doc, &serde_json::to_value(&r).unwrap(), Compare::GivenFieldsOnly)
        }
    }
}

const KUSTOMIZE_API_VERSION: &str = "kustomize.config.k8s.io/v1beta1";
const KUSTOMIZATION_FILES: [&str; 3] = ["kustomization.yaml", "kustomization.yml", "Kustomization"];

/// The fields of a kustomization this test understands; any other is an
/// error, so a new one gets checked here too.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Kustomization {
    #[allow(dead_code)]
    api_version: String,
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    resources: Vec<String>,
}

/// Every listed resource exists: a YAML file, or a directory holding a
/// kustomization. Both are queued to be checked themselves. Next to a
/// kustomization, every YAML file must be listed: one left out would
/// silently not be applied.
fn check_kustomization(file: &Path, doc: &Value, more_files: &mut Vec<PathBuf>) -> Result<(), String> {
    let kustomization: Kustomization =
        serde_json::from_value(doc.clone()).map_err(|e| format!("Kustomization: {e}"))?;
    let dir = file.parent().unwrap();
    let mut problems = Vec::new();
    let mut listed = BTreeSet::new();
    for resource in &kustomization.resources {
        let path = dir.join(resource);
        if resource.contains("://") || Path::new(resource).is_absolute() {
            problems.push(format!("resource `{resource}`: only relative paths are supported"));
        } else if path.is_dir() {
            match KUSTOMIZATION_FILES.iter().map(|name| path.join(name)).find(|p| p.is_file()) {
                Some(nested) => more_files.push(nested),
                None => problems.push(format!("resource `{resource}` is a directory without a kustomization.yaml")),
            }
        } else if path.is_file() && is_yaml(&path) {
            more_files.push(path.clone());
        } else {
            problems.push(format!("resource `{resource}` is not a YAML file or a directory ({})", path.display()));
        }
        if path.exists() && !listed.insert(canonical(&path)) {
            problems.push(format!("resource `{resource}` is listed twice"));
        }
    }
    for entry in std::fs::read_dir(dir).map_err(|e| e.to_string())?.flatten() {
        let path = entry.path();
        if path.is_file()
            && is_yaml(&path)
            && canonical(&path) != canonical(file)
            && !listed.contains(&canonical(&path))
        {
            problems.push(format!("{} is not listed in resources", path.display()));
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) }
}

/// The objects a kustomization produces (resources only: no transformers are
/// supported, see [`Kustomization`]).
fn kustomize(dir: &Path, out: &mut Vec<Value>) {
    let file = dir.join("kustomization.yaml");
    let (_, doc) = read_documents(&file).unwrap().remove(0);
    let kustomization: Kustomization = serde_json::from_value(doc).unwrap();
    for resource in kustomization.resources {
        let path = dir.join(&resource);
        if path.is_dir() {
            kustomize(&path, out);
        } else {
            out.extend(read_documents(&path).unwrap().into_iter().map(|(_, doc)| doc));
        }
    }
}

/// A Kubernetes built-in kind this test reads with its `k8s-openapi` type.
struct Builtin {
    api_version: &'static str,
    kind: &'static str,
    namespaced: fn() -> bool,
    check: fn(&Value) -> Result<(), String>,
}

const fn builtin<T>() -> Builtin
where
    T: Resource + DeserializeOwned + Serialize + 'static,
{
    Builtin { api_version: T::API_VERSION, kind: T::KIND, namespaced: is_namespaced::<T>, check: round_trip::<T> }
}

fn is_namespaced<T: Resource<Scope: 'static>>() -> bool {
    TypeId::of::<T::Scope>() == TypeId::of::<NamespaceResourceScope>()
}

const BUILTINS: &[Builtin] = &[
    builtin::<Namespace>(),
    builtin::<ServiceAccount>(),
    builtin::<Service>(),
    builtin::<ConfigMap>(),
    builtin::<Secret>(),
    builtin::<Role>(),
    builtin::<RoleBinding>(),
    builtin::<ClusterRole>(),
    builtin::<ClusterRoleBinding>(),
    builtin::<Deployment>(),
    builtin::<PodDisruptionBudget>(),
    builtin::<NetworkPolicy>(),
    builtin::<CustomResourceDefinition>(),
];

/// `k8s-openapi` types skip fields they do not know: reading the document
/// into the type and writing it back must give the document again, or some
/// field was dropped (misspelt, misplaced) or read differently.
fn round_trip<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<(), String> {
    let typed: T = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
    compare(doc, &serde_json::to_value(&typed).map_err(|e| e.to_string())?, Compare::Exact)
}

#[derive(Clone, Copy, PartialEq)]
enum Compare {
    Exact,
    /// The typed value may add fields (defaults), but keeps every field given.
    GivenFieldsOnly,
}

fn compare(given: &Value, typed: &Value, mode: Compare) -> Result<(), String> {
    let mut problems = Vec::new();
    difference("", given, typed, mode, &mut problems);
    if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) }
}

fn difference(path: &str, given: &Value, typed: &Value, mode: Compare, out: &mut Vec<String>) {
    match (given, typed) {
        (Value::Object(given), Value::Object(typed)) => {
            for (key, value) in given {
                let at = format!("{path}.{key}");
                match typed.get(key) {
                    Some(back) => difference(&at, value, back, mode, out),
                    None => out.push(format!("`{at}` is not a known field here (misspelt or misplaced?)")),
                }
            }
            if mode == Compare::Exact {
                for key in typed.keys().filter(|k| !given.contains_key(*k)) {
                    out.push(format!("`{path}.{key}` appears when written back"));
                }
            }
        }
        (Value::Array(given), Value::Array(typed)) if given.len() == typed.len() => {
            for (i, (value, back)) in given.iter().zip(typed).enumerate() {
                difference(&format!("{path}[{i}]"), value, back, mode, out);
            }
        }
        _ if given == typed => {}
        _ => out.push(format!("`{path}` is {given} but reads back as {typed}")),
    }
}

fn is_yaml(path: &Path) -> bool {
    matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
}

fn canonical(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}

fn collect_yaml(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        // The Helm chart's templates are not YAML until rendered: the e2e
        // tests (tests/e2e/helm.rs) check what `helm template` makes of
        // them, and its crds/ copy is compared whole above.
        if path.ends_with("deploy/helm") {
            continue;
        }
        if path.is_dir() {
            collect_yaml(&path, out);
        } else if is_yaml(&path) {
            out.push(path);
        }
    }
}
