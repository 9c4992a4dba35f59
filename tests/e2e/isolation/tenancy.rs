//! Isolation: tenancy (docs/security.md). Tenants share the gateway's
//! models, its network position and its listeners: one tenant's plugins
//! must never see another's traffic, and one tenant's route must not turn
//! the gateway against itself (its admin view, the metadata service, a
//! loop through its own listener).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_tests::{
    ConfigDir, Echo, Gateway, KubeCluster, Options, Plugin, Reply, Route, documents, empty, eventually,
};

/// `yaml` (one GatewayPlugin or AIModelRoute) in `namespace`.
fn in_namespace(namespace: &str, yaml: &str) -> String {
    let (head, rest) = yaml.split_once("metadata:\n").expect("a resource has metadata");
    format!("{head}metadata:\n  namespace: {namespace}\n{rest}")
}

fn listed(reply: &Reply) -> Vec<String> {
    assert_eq!(reply.status, 200, "{}", reply.text());
    let mut ids: Vec<String> =
        reply.json()["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_string()).collect();
    ids.sort();
    ids
}

/// Before, `/v1/models` and requests for unknown models ran every route's
/// auth chain, across namespaces, on the caller's request: a `Reused`
/// plugin in team-b recorded team-a's `Authorization` and could hand it
/// back to team-b. A listing or an unknown model names no route's model, so
/// it is addressed to no namespace: no plugin may see it (docs/security.md,
/// T1). Here team-b's plugin records every `authorization` it sees, logs it
/// and returns it to team-b's own client; team-a's key must reach neither,
/// while team-a's client is still served.
#[tokio::test]
async fn no_plugin_sees_a_listing_or_an_unknown_model_request() {
    use sha2::Digest;
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let team_a_key = "sk-team-a-credential-7c1f";
    let hash = hex::encode(sha2::Sha256::digest(team_a_key));
    let auth =
        Plugin::new("auth", "auth").auth_phase().config(json!({"apiKeys": [{"consumer": "svc", "sha256": hash}]}));
    let harvester =
        Plugin::new("harvester", "probe").auth_phase().reused(1).config(json!({"recordHeader": "authorization"}));
    dir.write(
        "plugins.yaml",
        &documents(&[in_namespace("team-a", &auth.yaml()), in_namespace("team-b", &harvester.yaml())]),
    );
    let routes = [
        in_namespace("team-a", &Route::new("private", &["a-model"], &echo.url()).plugins(&["auth"]).yaml()),
        in_namespace("team-a", &Route::new("public", &["a-open"], &echo.url()).yaml()),
        in_namespace("team-b", &Route::new("b", &["b-model"], &echo.url()).plugins(&["harvester"]).yaml()),
    ];
    dir.write("routes.yaml", &documents(&routes));
    let gateway = Gateway::start(&dir).await;

    // team-a's client, with its key: a listing, unknown models, its own model.
    let bearer = format!("Bearer {team_a_key}");
    let with_key = [("authorization", bearer.as_str())];
    let listing = gateway
        .client()
        .send(hyper::Request::get(gateway.url("/v1/models")).header("authorization", &bearer).body(empty()).unwrap())
        .await;
    let mut unknown = Vec::new();
    for model in ["no-such-model", "gpt-4o", "a-modell"] {
        unknown.push(gateway.chat(model, &with_key).await);
    }
    let served = gateway.chat("a-model", &with_key).await;

    // team-b's client asks its own plugin what it has seen.
    let reply = gateway.chat("b-model", &[("authorization", "Bearer team-b-own")]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let recorded = reply.header("x-probe-recorded").expect("the harvester answers its own client").to_string();
    assert!(recorded.contains("team-b-own"), "the harvester records what reaches it: {recorded}");
    assert!(!recorded.contains(team_a_key), "team-a's credential reached team-b's plugin: {recorded}");
    assert!(gateway.wait_for_log("probe: recorded").await);
    assert!(!gateway.log().contains(team_a_key), "team-a's credential reached team-b's plugin (its log)");

    // Only models with no auth plugin are listed (a listing runs none);
    // the others are usable, not listed. An unknown model is a plain 404.
    assert_eq!(listed(&listing), ["a-open"]);
    for reply in unknown {
        reply.assert_error(404, "model_not_found");
    }
    // Without credentials: the same.
    gateway.chat("no-such-model", &[]).await.assert_error(404, "model_not_found");
    assert_eq!(listed(&gateway.get("/v1/models").await), ["a-open"]);
    // team-a is served as before, and its auth still guards its model.
    assert_eq!(served.echoed()["model"], "a-model");
    gateway.chat("a-model", &[]).await.assert_error(401, "missing_credentials");
}

/// The sum of `sluice_requests_total` on the admin listener's /metrics.
async fn requests_counted(gateway: &Gateway) -> f64 {
    let metrics = gateway.client().get(&gateway.admin_url("/metrics")).await.text();
    metrics
        .lines()
        .filter(|line| line.starts_with("sluice_requests_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Before, a route whose backend is the gateway itself turned one request
/// into about 1,000 (and 100x the CPU) before a 503. Forwarded requests
/// carry the gateway's mark; one that comes back with it is refused with a
/// 508 before any plugin runs: one request costs two (docs/security.md,
/// T5).
#[tokio::test]
async fn a_route_back_to_the_gateway_itself_is_refused_as_a_loop() {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    dir.write("chat.yaml", &Route::new("chat", &["m"], &echo.url()).yaml());
    // A small in-flight limit bounds the loop before the fix.
    let options = Options { args: vec!["--max-in-flight-requests".into(), "64".into()], ..Default::default() };
    let gateway = Gateway::start_with(&dir, options).await;
    // Its own listener is known once it runs.
    dir.write("loop.yaml", &Route::new("loop", &["loop-model"], &gateway.url("/v1")).timeout_ms(5_000).yaml());
    eventually("the loop route to be served", Duration::from_secs(10), async || {
        gateway.admin_config().await.to_string().contains("default/loop").then_some(())
    })
    .await;

    let before = requests_counted(&gateway).await;
    let started = Instant::now();
    let reply = gateway.chat("loop-model", &[]).await;
    let took = started.elapsed();
    let counted = eventually("the requests to be counted", Duration::from_secs(5), async || {
        let counted = requests_counted(&gateway).await - before;
        (counted >= 1.0).then_some(counted)
    })
    .await;
    assert!(counted <= 3.0, "one request became {counted} (answered {}: {})", reply.status, reply.text());
    let error = reply.assert_error(508, "loop_detected");
    assert!(error["message"].as_str().unwrap().contains("backend leads back"), "{error}");
    assert!(took < Duration::from_secs(2), "the loop took {took:?} to refuse");
    // Everyone else is served.
    assert_eq!(gateway.chat("m", &[]).await.echoed()["model"], "m");
    assert_eq!(gateway.readyz().await, 200);
}

/// A chain of two different gateways is not a loop: the second forwards
/// what the first marked.
#[tokio::test]
async fn a_chain_of_two_gateways_is_served() {
    let echo = Echo::start().await;
    let inner_dir = ConfigDir::new();
    inner_dir.write("chat.yaml", &Route::new("chat", &["m"], &echo.url()).yaml());
    let inner = Gateway::start(&inner_dir).await;
    let outer_dir = ConfigDir::new();
    outer_dir.write("chat.yaml", &Route::new("chat", &["m"], &inner.url("/v1")).yaml());
    let outer = Gateway::start(&outer_dir).await;
    let echoed = outer.chat("m", &[]).await.echoed();
    let via = echoed["headers"]["via"].as_str().unwrap_or_default().to_string();
    assert_eq!(via.matches("sluice-").count(), 2, "both gateways mark the request: {via}");
    // Past --max-gateway-hops, refused.
    let hops = "1.1 sluice-a, 1.1 sluice-b, 1.1 sluice-c";
    let strict_dir = ConfigDir::new();
    strict_dir.write("chat.yaml", &Route::new("chat", &["m"], &echo.url()).yaml());
    let options = Options { args: vec!["--max-gateway-hops".into(), "2".into()], ..Default::default() };
    let strict = Gateway::start_with(&strict_dir, options).await;
    strict.chat("m", &[("via", hops)]).await.assert_error(508, "loop_detected");
    assert_eq!(strict.chat("m", &[("via", "1.1 sluice-a, 1.1 proxy")]).await.status, 200);
}

fn k8s_route(namespace: &str, name: &str, model: &str, url: &str) -> String {
    format!(
        "apiVersion: sluice.dev/v1alpha1\nkind: AIModelRoute\nmetadata:\n  name: {name}\n  namespace: {namespace}\n\
         spec:\n  models: [{model}]\n  backends:\n  - url: {}\n",
        Value::from(url)
    )
}

/// The Accepted condition's status, reason and message.
async fn accepted(cluster: &KubeCluster, namespace: &str, name: &str) -> Option<(String, String, String)> {
    let out = cluster.kubectl_ok(&["get", "aimodelroute", name, "-n", namespace, "-o", "json"]).await;
    let route: Value = serde_json::from_str(&out).ok()?;
    if route["status"]["observedGeneration"] != route["metadata"]["generation"] {
        return None;
    }
    let conditions = route["status"]["conditions"].as_array()?;
    let c = conditions.iter().find(|c| c["type"] == "Accepted")?;
    Some((c["status"].as_str()?.into(), c["reason"].as_str()?.into(), c["message"].as_str()?.into()))
}

/// Before, `url: http://127.0.0.1:9901/admin/config?` returned the
/// loopback-only admin view (every tenant's routes and backend URLs) to a
/// tenant's client (docs/security.md, T4). On Kubernetes, backends on the
/// gateway's loopback, its own listeners and addresses, and the metadata
/// service are refused (the route is not accepted, and its status says why)
/// unless the operator allows a range; even then the gateway's own listener
/// ports stay refused.
/// The harness allows 127.0.0.0/8 for its echo upstream, as an operator
/// would for a sidecar.
#[tokio::test]
async fn on_kubernetes_a_backend_cannot_reach_the_gateways_own_network_position() {
    let ns = "iso-ssrf";
    let (cluster, _) = crate::kubernetes::cluster_with_namespace(ns).await;
    let echo = Echo::start().await;
    let gateway = Gateway::start_kubernetes(cluster.kubeconfig(), ns, "replica-a", Options::default()).await;
    let admin = gateway.admin_addr();
    let attacks = [
        ("admin", "admin-model", format!("http://127.0.0.1:{}/admin/config?", admin.port())),
        ("admin-by-name", "admin-name-model", format!("http://localhost:{}/admin/config?", admin.port())),
        ("metadata", "metadata-model", "http://169.254.169.254/latest/meta-data/?".to_string()),
    ];
    let mut yaml = vec![k8s_route(ns, "good", "ok-model", &echo.url())];
    yaml.extend(attacks.iter().map(|(name, model, url)| k8s_route(ns, name, model, url)));
    cluster.apply(&documents(&yaml)).await;

    eventually("the good route to be served", Duration::from_secs(60), async || {
        (gateway.chat("ok-model", &[]).await.status == 200).then_some(())
    })
    .await;
    for (name, model, url) in &attacks {
        let reply = gateway.chat(model, &[]).await;
        let text = reply.text();
        assert!(!text.contains(&echo.url()) && !text.contains("\"routes\""), "{url} returned the admin view: {text}");
        assert_ne!(reply.status, 200, "{url}: {}", reply.text());
        let (status, reason, message) =
            eventually(&format!("{name}'s Accepted condition"), Duration::from_secs(60), async || {
                accepted(cluster, ns, name).await
            })
            .await;
        assert_eq!((status.as_str(), reason.as_str()), ("False", "NotPermitted"), "{name}: {message}");
        assert!(message.contains("--allow-backend-cidr") || message.contains("own listeners"), "{name}: {message}");
    }
    // The tenant with a proper backend is served, the gateway is healthy.
    assert_eq!(gateway.chat("ok-model", &[]).await.echoed()["model"], "ok-model");
    assert_eq!(gateway.readyz().await, 200);
}

/// The same in standalone mode with --restrict-backends (docs/security.md,
/// T4; the echo upstream's address allowed, as an operator would allow a
/// sidecar): a literal address is refused when the config loads (the admin
/// view says why), and a name that resolves into a refused range
/// (`2130706433` is 127.0.0.1 to the system resolver) is refused when
/// connecting, with a 502: nothing is sent. The gateway's own listener
/// ports stay refused in the allowed range.
#[tokio::test]
async fn a_restricted_standalone_gateway_refuses_backends_on_its_own_listeners() {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    dir.write("chat.yaml", &Route::new("chat", &["m"], &echo.url()).yaml());
    let args = ["--restrict-backends", "--allow-backend-cidr", "127.0.0.1/32"];
    let options = Options { args: args.map(String::from).to_vec(), ..Default::default() };
    let gateway = Gateway::start_with(&dir, options).await;
    let admin = gateway.admin_addr().port();
    let routes = [
        Route::new("admin", &["admin-model"], &format!("http://127.0.0.1:{admin}/admin/config?")).yaml(),
        Route::new("metadata", &["metadata-model"], "http://169.254.169.254/latest/meta-data/?").yaml(),
        Route::new("decimal", &["decimal-model"], &format!("http://2130706433:{admin}/admin/config?")).yaml(),
    ];
    dir.write("attacks.yaml", &documents(&routes));
    eventually("the attacks to load", Duration::from_secs(10), async || {
        gateway.admin_config().await.to_string().contains("default/decimal").then_some(())
    })
    .await;
    let mut answers = Vec::new();
    for model in ["admin-model", "metadata-model", "decimal-model"] {
        let reply = gateway.chat(model, &[]).await;
        assert!(!reply.text().contains("\"routes\""), "{model} returned the admin view: {}", reply.text());
        assert_ne!(reply.status, 200, "{model}: {}", reply.text());
        answers.push(reply);
    }
    let view = gateway.admin_config().await.to_string();
    assert!(view.contains("own listeners") && view.contains("--allow-backend-cidr"), "no reason given: {view}");
    answers[0].assert_error(404, "model_not_found");
    answers[1].assert_error(404, "model_not_found");
    let error = answers[2].assert_error(502, "backend_not_permitted");
    assert!(error["message"].as_str().unwrap().contains("2130706433"), "{error}");
    // The allowed backend is served; the gateway is healthy.
    assert_eq!(gateway.chat("m", &[]).await.echoed()["model"], "m");
    assert_eq!(gateway.readyz().await, 200);
}
