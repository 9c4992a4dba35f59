//! Many resources on a real API server: a replica's load report must reach
//! the leader however many resources it serves (one Lease annotation stops
//! at 256 KiB), and the leader's status work must grow linearly with the
//! number of routes, not with its square.
//!
//! The test command runs it with 1,200 routes with long names, which is past
//! what one annotation holds;
//! `SLUICE_SCALE_ROUTES=10000` runs the same test at 10,000.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sluice_tests::{Echo, Gateway, KubeCluster, Options, eventually};

const DEFAULT_ROUTES: usize = 1_200;
const NAMESPACE: &str = "scale";
/// Objects per `kubectl create` process, several run at once.
const BATCH: usize = 250;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().unwrap()
}

fn route_count() -> usize {
    std::env::var("SLUICE_SCALE_ROUTES").ok().and_then(|n| n.parse().ok()).unwrap_or(DEFAULT_ROUTES)
}

/// A name of 200 characters: long names make each report entry large.
/// (Not longer: an Event's name is the object's and 17 more characters.)
fn route_name(i: usize) -> String {
    format!("route-{i:05}-{}", "n".repeat(188))
}

fn route_yaml(i: usize, upstream: &str, model_suffix: &str) -> String {
    format!(
        "apiVersion: sluice.dev/v1alpha1\nkind: AIModelRoute\nmetadata:\n  name: {}\n  namespace: {NAMESPACE}\nspec:\n  models: [model-{i}{model_suffix}]\n  backends:\n  - url: {upstream}\n",
        route_name(i)
    )
}

/// How many routes are listed, and how many say `loaded: 1/1` and Ready;
/// `None` when the API server is too busy to answer (at 10,000 routes on two
/// cores it may time out a TLS handshake while the leader writes statuses).
async fn ready_routes(cluster: &KubeCluster) -> Option<(usize, usize)> {
    let template =
        r#"{range .items[*]}{.status.loaded}{" "}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}"#;
    let jsonpath = format!("jsonpath={template}");
    let (ok, out, _) = cluster.kubectl_result(&["get", "aimodelroutes", "-n", NAMESPACE, "-o", &jsonpath]).await;
    ok.then(|| (out.lines().count(), out.lines().filter(|l| *l == "1/1 True").count()))
}

#[tokio::test(flavor = "multi_thread")]
async fn every_route_is_reported_and_ready_past_the_annotation_limit() {
    let routes = route_count();
    let cluster = KubeCluster::shared().await;
    let crds = repo_root().join("crds/sluice.dev.yaml");
    cluster.kubectl_ok(&["apply", "--server-side", "-f", crds.to_str().unwrap()]).await;
    cluster.kubectl_ok(&["wait", "--for=condition=Established", "--timeout=60s", "crd/aimodelroutes.sluice.dev"]).await;
    cluster.kubectl_ok(&["create", "namespace", NAMESPACE]).await;
    let echo = Echo::start().await;
    let upstream = echo.url();

    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let mut creates = Vec::new();
    for (n, chunk) in (0..routes).collect::<Vec<_>>().chunks(BATCH).enumerate() {
        let file = dir.path().join(format!("routes-{n}.yaml"));
        let yaml: Vec<String> = chunk.iter().map(|i| route_yaml(*i, &upstream, "")).collect();
        std::fs::write(&file, yaml.join("---\n")).unwrap();
        let mut kubectl = cluster.kubectl();
        kubectl.args(["create", "-o", "name", "-f"]).arg(&file);
        creates.push(kubectl.output());
    }
    for out in futures_util::future::join_all(creates).await {
        let out = out.expect("running kubectl create");
        assert!(out.status.success(), "kubectl create: {}", String::from_utf8_lossy(&out.stderr));
    }
    println!("created {routes} routes in {:?}", started.elapsed());

    let started = Instant::now();
    let gateway = Gateway::start_kubernetes(cluster.kubeconfig(), NAMESPACE, "replica-a", Options::default()).await;
    println!("gateway ready in {:?}", started.elapsed());
    let reply = gateway.chat(&format!("model-{}", routes - 1), &[]).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);

    // Every route's status counts this replica: its whole report reached the leader.
    let within = Duration::from_secs(60 + routes as u64 / 10);
    eventually("every route Ready with loaded 1/1", within, async || {
        // Listing every route is itself load: not too often.
        tokio::time::sleep(Duration::from_secs(1 + routes as u64 / 2_000)).await;
        (ready_routes(cluster).await? == (routes, routes)).then_some(())
    })
    .await;
    println!("every status ready {:?} after the gateway", started.elapsed());
    println!("gateway RSS {} MiB", gateway.rss_bytes() >> 20);
    let log = gateway.log();
    assert!(!log.contains("could not write this replica's load report"), "{log}");
    // At this size the report is past one annotation: it came in parts.
    let selector = "sluice.dev/role=replica-report-part";
    let parts = cluster.kubectl_ok(&["get", "leases", "-n", NAMESPACE, "-l", selector, "-o", "name"]).await;
    println!("the report is in {} Leases", parts.lines().count() + 1);
    assert!(parts.lines().count() >= 1, "one Lease holds {routes} routes' report?");

    // A change to one route still comes through at this size: new model, new generation, Ready.
    let started = Instant::now();
    cluster.apply(&route_yaml(0, &upstream, "-renamed")).await;
    eventually("the changed route served", Duration::from_secs(60), async || {
        (gateway.chat("model-0-renamed", &[]).await.status == 200).then_some(())
    })
    .await;
    println!("one change served in {:?}", started.elapsed());
    let name = route_name(0);
    eventually("the changed route Ready at generation 2", Duration::from_secs(60), async || {
        let jsonpath = r#"jsonpath={.status.observedGeneration} {.status.conditions[?(@.type=="Ready")].status}"#;
        let (ok, out, _) =
            cluster.kubectl_result(&["get", "aimodelroute", &name, "-n", NAMESPACE, "-o", jsonpath]).await;
        (ok && out == "2 True").then_some(())
    })
    .await;
    println!("one change served and Ready in {:?}", started.elapsed());
}
