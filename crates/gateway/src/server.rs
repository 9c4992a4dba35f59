//! The gateway's listeners: the OpenAI API, the admin API, and optionally
//! the probes and the metrics on listeners of their own.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::gateway::Gateway;

/// Serves the OpenAI API until `shutdown` resolves, then waits up to
/// `drain` for in-flight requests to finish.
pub async fn serve_data_plane(
    gateway: Arc<Gateway>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) {
    let limits = gateway.settings.connections.clone();
    sluice_serve::serve(listener, limits, shutdown, drain, move |request| {
        crate::proxy::handle(gateway.clone(), request)
    })
    .await
}

/// Serves /healthz and /readyz only: the listener for the kubelet's probes,
/// which may face the pod network while the admin listener stays on
/// loopback. Whoever holds its connections, a probe's new one is served:
/// a full listener closes the oldest connection of the busiest address,
/// and a connection must ask within a second.
pub async fn serve_probes(gateway: Arc<Gateway>, listener: TcpListener, shutdown: impl Future<Output = ()>) {
    sluice_serve::serve(listener, sluice_serve::Limits::probes(), shutdown, Duration::from_secs(1), move |request| {
        let gateway = gateway.clone();
        async move { crate::admin::probes(&gateway, request) }
    })
    .await
}

/// Serves health, readiness and the config view. On loopback, but other
/// containers of the pod share it: a full listener closes the oldest
/// connection of the busiest address ([`sluice_serve::Limits::admin`]).
pub async fn serve_admin(gateway: Arc<Gateway>, listener: TcpListener, shutdown: impl Future<Output = ()>) {
    sluice_serve::serve(listener, sluice_serve::Limits::admin(), shutdown, Duration::from_secs(1), move |request| {
        let gateway = gateway.clone();
        async move { crate::admin::handle(&gateway, request) }
    })
    .await
}

/// Serves /metrics (and nothing else): the address Prometheus scrapes, which
/// may face the pod network while the admin listener stays on loopback. As
/// on the admin listener, holding its connections does not lock Prometheus
/// out.
pub async fn serve_metrics(gateway: Arc<Gateway>, listener: TcpListener, shutdown: impl Future<Output = ()>) {
    sluice_serve::serve(listener, sluice_serve::Limits::admin(), shutdown, Duration::from_secs(1), move |request| {
        let gateway = gateway.clone();
        async move {
            match request.uri().path() {
                "/metrics" => crate::admin::metrics(&gateway),
                path => crate::body::error_response(&sluice_core::ApiError::not_found(path)),
            }
        }
    })
    .await
}
