//! Time from `kubectl apply` of a changed GatewayPlugin config to the new
//! behaviour serving, over 20 applies with the module already compiled, and
//! to the status saying so. A real kube-apiserver (tests/harness/kube.rs).
//!
//! `cargo bench -p sluice-tests --bench kube_apply` after `cargo xtask test`
//! has built the Kubernetes binaries and `cargo build --release -p sluice`.
//! Prints a table.

use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_tests::{Echo, Gateway, KubeCluster, Options, plugin_wasm};

const APPLIES: usize = 20;

fn main() {
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime");
    tokio.block_on(measure());
}

fn plugin(value: &str) -> String {
    format!(
        "apiVersion: sluice.dev/v1alpha1\nkind: GatewayPlugin\nmetadata: {{name: add-header, namespace: bench}}\nspec:\n  source: {{file: {}}}\n  config: {{header: x-team, value: {value}}}\n",
        plugin_wasm("add-header").display()
    )
}

async fn served(gateway: &Gateway) -> Option<String> {
    let reply = gateway.chat("gpt-bench", &[]).await;
    (reply.status == 200).then(|| reply.echoed()["headers"]["x-team"].as_str().map(str::to_string)).flatten()
}

async fn ready_generation(cluster: &KubeCluster) -> Option<i64> {
    let out = cluster.kubectl_ok(&["get", "gp", "add-header", "-n", "bench", "-o", "json"]).await;
    let object: Value = serde_json::from_str(&out).ok()?;
    let ready =
        object["status"]["conditions"].as_array()?.iter().any(|c| c["type"] == "Ready" && c["status"] == "True");
    ready.then(|| object["status"]["observedGeneration"].as_i64()).flatten()
}

async fn measure() {
    let started = Instant::now();
    let cluster = KubeCluster::start().await;
    let cluster_start = started.elapsed();
    let crds = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds/sluice.dev.yaml");
    cluster.kubectl_ok(&["apply", "--server-side", "-f", crds]).await;
    cluster
        .kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "crd/gatewayplugins.sluice.dev",
            "crd/aimodelroutes.sluice.dev",
        ])
        .await;
    cluster.kubectl_ok(&["create", "namespace", "bench"]).await;
    let echo = Echo::start().await;
    let gateway = Gateway::start_kubernetes(cluster.kubeconfig(), "bench", "bench-replica", Options::default()).await;
    cluster.apply(&plugin("v0")).await;
    cluster
        .apply(&format!(
            "apiVersion: sluice.dev/v1alpha1\nkind: AIModelRoute\nmetadata: {{name: chat, namespace: bench}}\nspec:\n  models: [gpt-bench]\n  backends: [{{url: {}}}]\n  plugins: [{{name: add-header}}]\n",
            echo.url()
        ))
        .await;
    while served(&gateway).await.as_deref() != Some("v0") {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let (mut serving, mut status) = (Vec::new(), Vec::new());
    for i in 1..=APPLIES {
        let value = format!("v{i}");
        let start = Instant::now();
        cluster.apply(&plugin(&value)).await;
        while served(&gateway).await.as_deref() != Some(value.as_str()) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        serving.push(start.elapsed());
        // Generation i + 1: the first apply was generation 1.
        while ready_generation(&cluster).await != Some(i as i64 + 1) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        status.push(start.elapsed());
    }
    let pct = |samples: &mut Vec<Duration>, p: f64| {
        samples.sort();
        let index = ((samples.len() as f64 * p).ceil() as usize).clamp(1, samples.len()) - 1;
        samples[index].as_secs_f64() * 1000.0
    };
    println!("kube-apiserver + etcd start-up: {:.1} s", cluster_start.as_secs_f64());
    println!("| from `kubectl apply` (includes kubectl's own start, {APPLIES} applies) | p50 | p95 |");
    println!("|---|---:|---:|");
    println!("| new config serving | {:.0} ms | {:.0} ms |", pct(&mut serving, 0.5), pct(&mut serving, 0.95));
    println!(
        "| status Ready for the new generation | {:.0} ms | {:.0} ms |",
        pct(&mut status, 0.5),
        pct(&mut status, 0.95)
    );
}
