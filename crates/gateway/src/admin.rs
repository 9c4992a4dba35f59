//! The admin listener: liveness, readiness, metrics, and what is being
//! served.

use http::StatusCode;
use hyper::body::Incoming;
use serde::Serialize;
use sluice_core::FailurePolicy;
use sluice_runtime::Hooks;
use sluice_telemetry::metrics::{BackendLabels, PluginInfoLabels, PluginPoolLabels};

use crate::balance::now_ms;
use crate::body::{Body, error_response, full, json_response};
use crate::gateway::Gateway;
use crate::snapshot::Snapshot;

/// The admin API: the probes, the metrics and the config view.
pub fn handle(gateway: &Gateway, request: http::Request<Incoming>) -> http::Response<Body> {
    match request.uri().path() {
        "/admin/config" => config(gateway),
        "/metrics" => metrics(gateway),
        _ => probes(gateway, request),
    }
}

/// The metrics in Prometheus's text format.
pub fn metrics(gateway: &Gateway) -> http::Response<Body> {
    refresh_metrics(gateway);
    let m = sluice_telemetry::metrics();
    let mut response = http::Response::new(full(m.encode()));
    response
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    response
}

/// Only the probes, for a listener the kubelet reaches over the pod
/// network: nothing there tells what is configured.
pub fn probes(gateway: &Gateway, request: http::Request<Incoming>) -> http::Response<Body> {
    match request.uri().path() {
        "/healthz" => http::Response::new(full("ok\n")),
        "/readyz" if gateway.is_ready() => http::Response::new(full("ready\n")),
        "/readyz" => {
            let mut response = http::Response::new(full("waiting for the first config\n"));
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            response
        }
        path => error_response(&sluice_core::ApiError::not_found(path)),
    }
}

/// Sets what is measured when read (the plugin instances, which versions
/// are loaded) from the snapshot served now: before each scrape, and
/// before each OTLP push.
pub fn refresh_metrics(gateway: &Gateway) {
    let snapshot = gateway.snapshot();
    let m = sluice_telemetry::metrics();
    m.plugin_instances.clear();
    m.plugin_info.clear();
    for plugin in snapshot.plugins().values() {
        let id = &plugin.id;
        let (in_use, idle) = plugin.configured.instances();
        for (state, count) in [("in_use", in_use), ("idle", idle)] {
            let labels = PluginPoolLabels {
                namespace: id.namespace.clone(),
                plugin: id.name.clone(),
                digest: id.digest.clone(),
                state,
            };
            m.plugin_instances.get_or_create(&labels).set(count as i64);
        }
        let labels = PluginInfoLabels {
            namespace: id.namespace.clone(),
            plugin: id.name.clone(),
            digest: id.digest.clone(),
            source: plugin.decl.source.to_string().into(),
            isolation: match plugin.decl.isolation {
                sluice_core::Isolation::PerRequest => "per-request",
                sluice_core::Isolation::Reused { .. } => "reused",
            },
        };
        m.plugin_info.get_or_create(&labels).set(1);
    }
    m.backend_ejected.clear();
    let now = now_ms();
    for route in snapshot.routes() {
        for backend in &route.backends {
            let labels = BackendLabels { route: route.label.clone(), backend: backend.label.clone() };
            m.backend_ejected.get_or_create(&labels).set(i64::from(backend.health.ejected_for(now).is_some()));
        }
    }
}

fn config(gateway: &Gateway) -> http::Response<Body> {
    let snapshot = gateway.snapshot();
    let report = gateway.report.load();
    let mut view = serde_json::to_value(SnapshotView::of(&snapshot)).unwrap_or_default();
    let errors: Vec<_> = report.source_errors.iter().chain(&report.build.errors).collect();
    view["ready"] = gateway.is_ready().into();
    view["errors"] = serde_json::to_value(errors).unwrap_or_default();
    let body = serde_json::to_vec_pretty(&view).unwrap_or_default();
    json_response(StatusCode::OK, body)
}

/// The admin view of a snapshot.
#[derive(Serialize)]
struct SnapshotView {
    generation: u64,
    routes: Vec<RouteView>,
    plugins: Vec<PluginView>,
}

#[derive(Serialize)]
struct RouteView {
    name: String,
    models: Vec<String>,
    backends: Vec<BackendView>,
    plugins: Vec<String>,
    fallbacks: Vec<String>,
    /// Those its declaration and every plugin of its chain name.
    endpoints: sluice_core::config::Endpoints,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BackendView {
    url: String,
    model: Option<String>,
    api_key: bool,
    provider: &'static str,
    weight: u32,
    priority: u32,
    /// Passive health, as this replica learned it.
    health: HealthView,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct HealthView {
    /// How much longer it is out of rotation, if it is.
    ejected_for_ms: Option<u128>,
    consecutive_failures: u32,
    ejections: u64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PluginView {
    name: String,
    source: String,
    digest: String,
    failure_policy: FailurePolicy,
    hooks: Vec<&'static str>,
    isolation: sluice_core::Isolation,
    timeout_ms: u128,
    max_memory_mi_b: usize,
    /// `snapshot`, `configure-until-snapshot` or `configure`.
    instances_start_from: &'static str,
    endpoints: sluice_core::config::Endpoints,
    /// Granted shared state: where it is kept, and the caps it holds under.
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<StateView>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StateView {
    store: &'static str,
    max_keys: usize,
    max_bytes: usize,
}

impl SnapshotView {
    fn of(snapshot: &Snapshot) -> Self {
        let mut plugins: Vec<_> = snapshot
            .plugins()
            .values()
            .map(|p| {
                let hooks = p.hooks();
                let names = [
                    (Hooks::REQUEST, "request"),
                    (Hooks::RESPONSE_HEAD, "response-head"),
                    (Hooks::RESPONSE_CHUNK, "response-chunk"),
                    (Hooks::RESPONSE_BODY, "response-body"),
                    (Hooks::RESPONSE_END, "response-end"),
                ]
                .into_iter()
                .filter_map(|(hook, name)| hooks.contains(hook).then_some(name))
                .collect();
                PluginView {
                    name: p.decl.key.to_string(),
                    source: p.decl.source.to_string(),
                    digest: p.digest().to_string(),
                    failure_policy: p.decl.failure_policy,
                    hooks: names,
                    isolation: p.decl.isolation,
                    timeout_ms: p.decl.timeout.as_millis(),
                    max_memory_mi_b: p.decl.max_memory_bytes / (1024 * 1024),
                    instances_start_from: p.configured.instances_start_from().as_str(),
                    endpoints: p.decl.endpoints,
                    state: p.configured.state().map(|(store, max_keys, max_bytes)| StateView {
                        store,
                        max_keys,
                        max_bytes,
                    }),
                }
            })
            .collect();
        plugins.sort_by(|a, b| a.name.cmp(&b.name));
        let now = now_ms();
        let routes = snapshot
            .routes()
            .iter()
            .map(|r| RouteView {
                name: r.decl.key.to_string(),
                models: r.decl.models.clone(),
                backends: r
                    .backends
                    .iter()
                    .zip(&r.decl.backends)
                    .map(|(b, decl)| BackendView {
                        url: b.url.clone(),
                        model: b.model.clone(),
                        api_key: b.credential.is_some(),
                        provider: b.provider.name(),
                        weight: decl.weight,
                        priority: decl.priority,
                        health: HealthView {
                            ejected_for_ms: b.health.ejected_for(now).map(|d| d.as_millis()),
                            consecutive_failures: b.health.consecutive_failures(),
                            ejections: b.health.total_ejections(),
                        },
                    })
                    .collect(),
                plugins: r.chain.iter().map(|p| p.decl.key.to_string()).collect(),
                fallbacks: r.decl.fallbacks.iter().map(|f| f.model.clone()).collect(),
                endpoints: r.endpoints,
            })
            .collect();
        SnapshotView { generation: snapshot.generation, routes, plugins }
    }
}
