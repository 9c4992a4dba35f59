//! Leader election on a `coordination.k8s.io/v1` Lease, the way client-go's
//! leaderelection does it: take the Lease when it is free or its holder has
//! not renewed it for a whole lease duration, renew it while leading, and
//! write with the read `resourceVersion` so two candidates cannot both win.
//! [`lead`] runs the leader-only work for as long as this replica holds it.
//!
//! Two properties make it safe, and both are tested in memory
//! (`crate::tests::leader`) and against a real API server (tests/e2e):
//! - expiry is judged by when this process last saw the Lease change (its
//!   `resourceVersion` move), not by the timestamp written in it, so clock
//!   skew between nodes does not matter;
//! - a leader stops its work as soon as a renewal fails, and at the latest
//!   [`Timing::renew_deadline`] after its last successful renewal began,
//!   even when the renewal hangs (a partition): before any other replica
//!   may count the Lease expired.
//!
//! Hand-written (about a hundred lines) rather than kube-lease-manager,
//! which supports kube 5 since 0.13 but keeps neither property (as read in
//! its 0.13.1 source, `state.rs` and `manager.rs`): it takes a Lease as
//! expired once `renewTime + leaseDurationSeconds` is past this node's wall
//! clock, so a candidate whose clock runs ahead of the leader's takes a live
//! Lease; its `watch()` loop, on a failed renewal, logs and retries with
//! backoff while its channel goes on saying "leading", and sets no deadline
//! of its own on a hanging one, so a partitioned leader writes on past the
//! point where another may lead; and it frees an expired Lease with a patch
//! that carries no `resourceVersion`, so a candidate acting on a stale read
//! clears a Lease its holder has just renewed.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::task::JoinHandle;
// Tokio's clock: the real one, or the tests' paused one.
use tokio::time::Instant;

/// How the lead is held: client-go's LeaseDuration, RetryPeriod and RenewDeadline.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// How long the others wait, after they last saw the Lease change, before taking it.
    pub lease_duration: Duration,
    /// How often the Lease is taken or renewed.
    pub renew_every: Duration,
    /// A leader stops writing this long after its last successful renewal
    /// began, whether or not it can reach the API server: well before the
    /// others may see the Lease as expired (client-go: 10 s of 15).
    pub renew_deadline: Duration,
}

impl Timing {
    pub const DEFAULT: Timing = Timing {
        lease_duration: Duration::from_secs(15),
        renew_every: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(10),
    };
}

/// Takes the lead when it can and keeps it while it can, until `shutdown`.
/// `work` is started (spawned afresh) each time this replica takes the lead
/// and aborted as soon as it loses it, fails to renew it, or cannot renew it
/// before its term ends. On `shutdown` the work is stopped and the Lease
/// given up.
pub async fn lead(
    mut elector: Elector,
    timing: Timing,
    mut work: impl FnMut() -> JoinHandle<()>,
    shutdown: impl Future<Output = ()>,
) {
    let mut leading: Option<JoinHandle<()>> = None;
    tokio::pin!(shutdown);
    loop {
        // A renewal that hangs (the API server unreachable, a partition) is
        // given up when the term ends, and so is the lead with it.
        let term_ends = match &leading {
            Some(_) => elector.term_ends(timing.renew_deadline),
            None => None,
        }
        .unwrap_or_else(|| Instant::now() + timing.renew_deadline);
        let lead = match tokio::time::timeout_at(term_ends, elector.try_lead()).await {
            Ok(Ok(lead)) => lead,
            Ok(Err(error)) => {
                // Unable to renew: stop writing status rather than risk two writers.
                tracing::warn!(%error, "leader election failed");
                false
            }
            Err(_) => {
                tracing::warn!("could not renew the leader Lease before the term ended");
                false
            }
        };
        match (lead, &leading) {
            (true, None) => {
                tracing::info!(replica = %elector.identity, "leading: writing status");
                leading = Some(work());
            }
            (false, Some(task)) => {
                tracing::info!(replica = %elector.identity, "no longer leading");
                task.abort();
                leading = None;
            }
            _ => {}
        }
        tokio::select! {
            () = tokio::time::sleep(timing.renew_every) => {}
            () = &mut shutdown => break,
        }
    }
    if let Some(task) = leading {
        task.abort();
        elector.release().await;
    }
}

pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    /// The Lease as last seen (its resourceVersion) and when it was seen to change.
    observed: Option<(String, Instant)>,
    /// When the last successful take or renewal began: the other replicas
    /// count the lease duration from no earlier than that.
    renewed_at: Option<Instant>,
}

impl Elector {
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str, duration: Duration) -> Elector {
        Elector {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: identity.to_string(),
            duration,
            observed: None,
            renewed_at: None,
        }
    }

    /// Until when this replica may act as the leader: `renew_deadline`
    /// (shorter than the lease duration, as client-go's renewDeadline) after
    /// its last successful renewal began. Past it, it must stop writing even
    /// if it cannot reach the API server to learn that another replica has
    /// taken over.
    pub fn term_ends(&self, renew_deadline: Duration) -> Option<Instant> {
        self.renewed_at.map(|at| at + renew_deadline)
    }

    /// Takes or renews the Lease; whether this replica leads now.
    pub async fn try_lead(&mut self) -> Result<bool, kube::Error> {
        let started = Instant::now();
        let now = MicroTime(Timestamp::now());
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.name.clone()), ..Default::default() },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(self.duration.as_secs() as i32),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return self.write(self.api.create(&PostParams::default(), &lease).await, started);
        };
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        let seen_change = match &self.observed {
            Some((known, at)) if *known == version => *at,
            _ => Instant::now(),
        };
        self.observed = Some((version, seen_change));
        let spec = lease.spec.get_or_insert_with(Default::default);
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let mine = holder.as_deref() == Some(self.identity.as_str());
        let expired = seen_change.elapsed() >= self.duration;
        if !(mine || holder.is_none() || expired) {
            return Ok(false);
        }
        if !mine {
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            spec.holder_identity = Some(self.identity.clone());
        }
        spec.lease_duration_seconds = Some(self.duration.as_secs() as i32);
        spec.renew_time = Some(now);
        // `replace` sends the resourceVersion read above: a concurrent writer makes it fail with 409.
        self.write(self.api.replace(&self.name, &PostParams::default(), &lease).await, started)
    }

    fn write(&mut self, result: Result<Lease, kube::Error>, started: Instant) -> Result<bool, kube::Error> {
        match result {
            Ok(lease) => {
                self.observed = Some((lease.metadata.resource_version.unwrap_or_default(), Instant::now()));
                self.renewed_at = Some(started);
                Ok(true)
            }
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Gives the Lease up on shutdown, so another replica takes over without
    /// waiting for it to expire.
    pub async fn release(&mut self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else { return };
        let Some(spec) = lease.spec.as_mut() else { return };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        if let Err(error) = self.api.replace(&self.name, &PostParams::default(), &lease).await {
            tracing::debug!(%error, "releasing the leader Lease");
        }
    }
}
