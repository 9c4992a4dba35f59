//! The Kubernetes harness itself: a real etcd and kube-apiserver, driven
//! with kubectl. Needs the binaries `cargo xtask kube` builds.

use serde_json::Value;
use sluice_tests::KubeCluster;

const OBJECTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: harness
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  namespace: harness
data:
  mode: strict
---
apiVersion: v1
kind: Secret
metadata:
  name: api-key
  namespace: harness
stringData:
  key: s3cr3t
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata:
  name: leader
  namespace: harness
spec:
  holderIdentity: gateway-0
  leaseDurationSeconds: 15
"#;

async fn get(cluster: &KubeCluster, kind_and_name: &str) -> Value {
    let json = cluster.kubectl_ok(&["get", "-n", "harness", kind_and_name, "-o", "json"]).await;
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("kubectl get {kind_and_name}: {e}:\n{json}"))
}

/// The objects, with the uid each was created with.
async fn read_back(cluster: &KubeCluster) -> Vec<String> {
    let namespace = cluster.kubectl_ok(&["get", "namespace", "harness", "-o", "json"]).await;
    let namespace: Value = serde_json::from_str(&namespace).unwrap();
    assert_eq!(namespace["status"]["phase"], "Active");
    let config_map = get(cluster, "configmap/settings").await;
    assert_eq!(config_map["data"]["mode"], "strict");
    let secret = get(cluster, "secret/api-key").await;
    // "s3cr3t", base64.
    assert_eq!(secret["data"]["key"], "czNjcjN0");
    let lease = get(cluster, "lease.coordination.k8s.io/leader").await;
    assert_eq!(lease["spec"]["holderIdentity"], "gateway-0");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 15);
    [&namespace, &config_map, &secret, &lease]
        .iter()
        .map(|object| object["metadata"]["uid"].as_str().expect("a uid").to_string())
        .collect()
}

#[tokio::test]
async fn objects_are_stored_and_survive_an_apiserver_restart() {
    let cluster = KubeCluster::start().await;
    assert!(cluster.server().starts_with("https://127.0.0.1:"));
    let applied = cluster.apply(OBJECTS).await;
    assert!(applied.contains("lease.coordination.k8s.io/leader created"), "{applied}");
    let uids = read_back(&cluster).await;

    cluster.restart_apiserver().await;
    assert_eq!(read_back(&cluster).await, uids, "the same objects after a restart");

    cluster.stop_apiserver().await;
    let (ok, _, stderr) = cluster.kubectl_result(&["get", "configmaps", "-A", "--request-timeout=2s"]).await;
    assert!(!ok, "kubectl succeeded with the API server stopped");
    assert!(stderr.contains("refused"), "{stderr}");
    cluster.start_apiserver().await;
    assert_eq!(read_back(&cluster).await, uids);
}

#[tokio::test]
async fn a_user_with_no_groups_may_not_list_secrets() {
    let cluster = KubeCluster::shared().await;
    assert!(std::ptr::eq(cluster, KubeCluster::shared().await), "one shared cluster");
    cluster.kubectl_ok(&["create", "namespace", "least-privilege"]).await;
    cluster.kubectl_ok(&["get", "secrets", "-n", "least-privilege"]).await;

    let gateway = cluster.token_kubeconfig(KubeCluster::GATEWAY);
    let (ok, _, stderr) = cluster
        .kubectl_result(&["--kubeconfig", gateway.to_str().unwrap(), "get", "secrets", "-n", "least-privilege"])
        .await;
    assert!(!ok);
    assert!(
        stderr.contains("Forbidden") && stderr.contains(r#"User "sluice-gateway" cannot list resource "secrets""#),
        "{stderr}"
    );
    // The same by impersonation.
    let (ok, stdout, _) =
        cluster.kubectl_result(&["auth", "can-i", "list", "secrets", "--as", KubeCluster::GATEWAY]).await;
    assert!(!ok);
    assert_eq!(stdout.trim(), "no");
}
