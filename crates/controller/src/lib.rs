//! Sluice on Kubernetes. Every replica:
//! - watches GatewayPlugins, AIModelRoutes, MCPRoutes and Secrets, and
//!   feeds the data plane the whole desired config ([`feed`]);
//! - reports what it serves in a Lease of its own ([`replica`]).
//!
//! The replica holding the leader Lease ([`leader`]) also runs the status
//! controllers ([`status`]): conditions, the served digest, the per-replica
//! load count, and Events. The data plane is reached only through channels
//! of domain types, so this crate knows nothing of wasmtime or hyper.

mod feed;
#[cfg(test)]
mod fixtures;
mod leader;
mod replica;
mod secrets;
mod status;
mod tenancy;
#[cfg(test)]
mod tests;
mod translate;

use std::future::Future;
use std::sync::Arc;

use kube::Client;
use kube::runtime::events::{Recorder, Reporter};
use parking_lot::Mutex;
use sluice_core::{ConfigUpdate, LoadReport};
use tokio::sync::watch;

pub use tenancy::{McpPathClaim, ModelClaim, Tenancy};
pub use translate::set_pointer;

/// The leader Lease's name, in the lease namespace.
pub const LEADER_LEASE: &str = "sluice-gateway-leader";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

impl Error {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(_)) => "api_error",
            Error::Kube(_) => "client_error",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Options {
    /// Watch this namespace only; `None` watches all.
    pub namespace: Option<String>,
    /// Where the leader Lease and the replicas' report Leases live.
    pub lease_namespace: String,
    /// This replica's identity (its pod name).
    pub replica: String,
    /// What resources may ask of the gateway beyond their namespace's own
    /// objects: its files and environment variables, and model names. The
    /// default lends nothing and lets only the gateway's own namespace
    /// claim models: safe for a cluster shared by tenants.
    pub tenancy: Tenancy,
}

/// Runs until `shutdown`, then gives up the lead and withdraws this
/// replica's report.
pub async fn run(
    client: Client,
    options: Options,
    updates: watch::Sender<Option<ConfigUpdate>>,
    reports: watch::Receiver<Arc<LoadReport>>,
    shutdown: impl Future<Output = ()> + Send,
) {
    // The gateway's own namespace claims every model unless the operator grants otherwise.
    let own_namespace = options.namespace.as_deref().unwrap_or(&options.lease_namespace);
    let tenancy = Arc::new(options.tenancy.clone().resolved(own_namespace));
    let feed = feed::Feed::new(&client, options.namespace.as_deref(), tenancy.clone());
    let stores = feed.stores.clone();
    let published = Arc::new(Mutex::new(feed::Published::default()));
    let (changed_tx, changed_rx) = watch::channel(0u64);
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };

    let feed_task = tokio::spawn(feed.run(updates, published.clone(), changed_tx));
    let heartbeat = tokio::spawn(replica::heartbeat(
        client.clone(),
        options.lease_namespace.clone(),
        options.replica.clone(),
        reports,
        published,
        stopped(stop_rx.clone()),
    ));

    let timing = leader::Timing::DEFAULT;
    let elector = leader::Elector::new(
        client.clone(),
        &options.lease_namespace,
        LEADER_LEASE,
        &options.replica,
        timing.lease_duration,
    );
    let recorder = Recorder::new(
        client.clone(),
        Reporter { controller: "sluice-gateway".into(), instance: Some(options.replica.clone()) },
    );
    let write_status = move || {
        tokio::spawn(status::run(
            client.clone(),
            options.namespace.clone(),
            options.lease_namespace.clone(),
            stores.clone(),
            recorder.clone(),
            tenancy.clone(),
            changed_rx.clone(),
        ))
    };
    leader::lead(elector, timing, write_status, shutdown).await;
    let _ = stop_tx.send(true);
    let _ = heartbeat.await;
    feed_task.abort();
}
