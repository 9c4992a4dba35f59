//! Per-replica load reports. Each replica heartbeats a Lease of its own,
//! `sluice-replica-<identity>`, whose annotation says what that replica
//! serves, by resource and generation. The leader reads them all to write
//! `loaded: 2/2`; a replica that stops renewing drops out of the count when
//! its Lease expires. Only the replica writes its own Lease, so reports never
//! conflict or flap.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams};
use kube::{Api, Client};
use serde::{Deserialize, Serialize};
use sluice_core::{LoadReport, LoadState, ResourceKey};
use tokio::sync::watch;

use crate::feed::Published;
use sluice_core::Redactions;

pub const REPORT_ANNOTATION: &str = "sluice.dev/load-report";
/// Selects replica report Leases (not the leader Lease).
pub const ROLE_LABEL: &str = "sluice.dev/role";
pub const ROLE_REPLICA: &str = "replica-report";
const FIELD_MANAGER: &str = "sluice-replica";
/// A replica that has not renewed for this long is gone.
const LEASE_SECONDS: i32 = 30;
const RENEW_EVERY: Duration = Duration::from_secs(10);
/// Load errors can be long (a pull's whole error chain); the annotation stays small.
const MAX_MESSAGE: usize = 300;

/// What one replica serves, by `namespace/name`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaReport {
    #[serde(default)]
    pub plugins: BTreeMap<String, Entry>,
    #[serde(default)]
    pub routes: BTreeMap<String, Entry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The generation of the resource this state is about.
    pub generation: i64,
    #[serde(flatten)]
    pub state: LoadState,
}

impl ReplicaReport {
    fn from_load(load: &LoadReport, generations: &crate::feed::Generations) -> ReplicaReport {
        let entries = |states: &BTreeMap<ResourceKey, LoadState>,
                       generations: &HashMap<ResourceKey, i64>,
                       redactions: &HashMap<ResourceKey, Redactions>| {
            states
                .iter()
                .filter_map(|(key, state)| {
                    let generation = *generations.get(key)?;
                    let mut state = state.clone();
                    // Before cutting: a cut value would leave its start.
                    if let (Some(error), Some(redactions)) = (&mut state.error, redactions.get(key)) {
                        *error = redactions.apply(error);
                    }
                    if let Some(error) = &mut state.error
                        && error.len() > MAX_MESSAGE
                    {
                        let cut = (0..=MAX_MESSAGE).rev().find(|i| error.is_char_boundary(*i)).unwrap_or(0);
                        error.truncate(cut);
                        error.push('…');
                    }
                    Some((key.to_string(), Entry { generation, state }))
                })
                .collect()
        };
        ReplicaReport {
            plugins: entries(&load.plugins, &generations.plugins, &generations.plugin_redactions),
            routes: entries(&load.routes, &generations.routes, &generations.route_redactions),
        }
    }
}

/// Keeps this replica's report Lease up to date until `shutdown`, then
/// deletes it so the leader stops counting this replica at once.
pub async fn heartbeat(
    client: Client,
    namespace: String,
    replica: String,
    mut reports: watch::Receiver<Arc<LoadReport>>,
    published: Arc<Mutex<Published>>,
    shutdown: impl Future<Output = ()>,
) {
    let api: Api<Lease> = Api::namespaced(client, &namespace);
    let name = lease_name(&replica);
    let mut report = ReplicaReport::default();
    tokio::pin!(shutdown);
    loop {
        let load = reports.borrow_and_update().clone();
        let generations = published.lock().expect("published lock").generations(load.revision);
        if let Some(generations) = generations {
            report = ReplicaReport::from_load(&load, &generations);
        }
        if let Err(error) = renew(&api, &name, &replica, &report).await {
            tracing::warn!(%error, lease = %name, "could not write this replica's load report");
        }
        tokio::select! {
            changed = reports.changed() => if changed.is_err() { break },
            () = tokio::time::sleep(RENEW_EVERY) => {}
            () = &mut shutdown => break,
        }
    }
    if let Err(error) = api.delete(&name, &DeleteParams::default()).await {
        tracing::debug!(%error, "deleting this replica's report Lease");
    }
}

async fn renew(api: &Api<Lease>, name: &str, replica: &str, report: &ReplicaReport) -> Result<(), kube::Error> {
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(
                [
                    (ROLE_LABEL.to_string(), ROLE_REPLICA.to_string()),
                    ("app.kubernetes.io/name".into(), "sluice".into()),
                ]
                .into(),
            ),
            annotations: Some(
                [(REPORT_ANNOTATION.to_string(), serde_json::to_string(report).unwrap_or_default())].into(),
            ),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(replica.to_string()),
            lease_duration_seconds: Some(LEASE_SECONDS),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        }),
    };
    let mut patch = serde_json::to_value(&lease).unwrap_or_default();
    patch["apiVersion"] = "coordination.k8s.io/v1".into();
    patch["kind"] = "Lease".into();
    api.patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(patch)).await?;
    Ok(())
}

pub fn lease_name(replica: &str) -> String {
    format!("sluice-replica-{replica}")
}

/// The reports of replicas whose Lease is current, by replica identity.
pub fn live_reports(leases: &[Arc<Lease>], now: Timestamp) -> BTreeMap<String, ReplicaReport> {
    leases
        .iter()
        .filter_map(|lease| {
            let spec = lease.spec.as_ref()?;
            let renewed = spec.renew_time.as_ref()?.0;
            let duration = i64::from(spec.lease_duration_seconds.unwrap_or(LEASE_SECONDS));
            if renewed.as_second() + duration < now.as_second() {
                return None;
            }
            let identity = spec.holder_identity.clone()?;
            let text = lease.metadata.annotations.as_ref()?.get(REPORT_ANNOTATION)?;
            Some((identity, serde_json::from_str(text).ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(identity: &str, renewed: Timestamp, report: &ReplicaReport) -> Arc<Lease> {
        Arc::new(Lease {
            metadata: ObjectMeta {
                annotations: Some([(REPORT_ANNOTATION.to_string(), serde_json::to_string(report).unwrap())].into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(identity.into()),
                lease_duration_seconds: Some(30),
                renew_time: Some(MicroTime(renewed)),
                ..Default::default()
            }),
        })
    }

    #[test]
    fn expired_replicas_drop_out_and_reports_round_trip() {
        let now = Timestamp::now();
        let mut report = ReplicaReport::default();
        report
            .plugins
            .insert("ns/p".into(), Entry { generation: 3, state: LoadState::ready(Some("sha256:ab".into())) });
        let stale = now.checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(31)).unwrap();
        let leases = vec![lease("a", now, &report), lease("b", stale, &report)];
        let live = live_reports(&leases, now);
        assert_eq!(live.keys().collect::<Vec<_>>(), ["a"]);
        assert_eq!(live["a"], report);
    }

    #[test]
    fn secret_values_are_redacted_before_the_error_is_cut() {
        let key = ResourceKey::new("ns", "p");
        let secret = "sk-planted-0123456789";
        // The value straddles the cut: cutting first would leave its start.
        let error = format!("{}header value {secret:?} is invalid", "x".repeat(MAX_MESSAGE - 20));
        let mut load = LoadReport { revision: 1, ..Default::default() };
        load.plugins.insert(key.clone(), LoadState::failed("LoadFailed", error, None));
        let mut generations = crate::feed::Generations::default();
        generations.plugins.insert(key.clone(), 1);
        let mut redactions = Redactions::default();
        redactions.add(secret);
        generations.plugin_redactions.insert(key, redactions);
        let report = ReplicaReport::from_load(&load, &generations);
        let error = report.plugins["ns/p"].state.error.clone().unwrap();
        assert!(!error.contains("sk-pl"), "{error}");
        assert!(error.ends_with("header value \"[redac…"), "{error}");
    }

    #[test]
    fn reports_carry_generations_and_cut_long_errors() {
        let key = ResourceKey::new("ns", "p");
        let mut load = LoadReport { revision: 4, ..Default::default() };
        load.plugins.insert(key.clone(), LoadState::failed("PullFailed", "é".repeat(400), Some("sha256:old".into())));
        load.plugins.insert(ResourceKey::new("ns", "unpublished"), LoadState::ready(None));
        let mut generations = crate::feed::Generations::default();
        generations.plugins.insert(key, 7);
        let report = ReplicaReport::from_load(&load, &generations);
        assert_eq!(report.plugins.len(), 1);
        let entry = &report.plugins["ns/p"];
        assert_eq!(entry.generation, 7);
        assert!(entry.state.error.as_ref().unwrap().len() <= MAX_MESSAGE + '…'.len_utf8());
        assert_eq!(entry.state.digest.as_deref(), Some("sha256:old"));
    }
}
