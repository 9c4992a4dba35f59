//! Per-replica load reports. Each replica heartbeats a Lease of its own,
//! `sluice-replica-<identity>`, whose annotation says what that replica
//! serves, by resource and generation. The leader reads them all to write
//! `loaded: 2/2`; a replica that stops renewing drops out of the count when
//! its Lease expires. Only the replica writes its own Leases, so reports
//! never conflict or flap.
//!
//! The API server allows 256 KiB of annotations per object, which a report
//! passes at a few thousand resources. So a large report is split by key
//! hash into parts: part 0 rides on the heartbeat Lease with the content
//! hashes of the others, and part `i` is the Lease
//! `sluice-replica-<identity>-<i>`, written only when its content changes
//! (a change to one resource rewrites one part). The leader assembles a
//! report once every part the heartbeat names is there with that content.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sluice_core::{LoadReport, LoadState, ResourceKey};
use tokio::sync::watch;

use crate::feed::Published;
use sluice_core::Redactions;

pub const REPORT_ANNOTATION: &str = "sluice.dev/load-report";
/// Selects replica report Leases (not the leader Lease).
pub const ROLE_LABEL: &str = "sluice.dev/role";
/// The heartbeat Lease, with part 0 of the report.
pub const ROLE_REPLICA: &str = "replica-report";
/// The other parts of a large report.
pub const ROLE_PART: &str = "replica-report-part";
const FIELD_MANAGER: &str = "sluice-replica";
/// A replica that has not renewed for this long is gone.
const LEASE_SECONDS: i32 = 30;
/// Ejected backends listed per route in a report.
const MAX_EJECTED: usize = 64;
const RENEW_EVERY: Duration = Duration::from_secs(10);
/// Load errors can be long (a pull's whole error chain); the annotation stays small.
const MAX_MESSAGE: usize = 300;
/// What a part of the report aims at: enough parts that hashing keys into
/// them leaves each well under [`PART_MAX`].
const PART_TARGET: usize = 64 * 1024;
/// The most one part may hold, under the API server's 256 KiB for all of an
/// object's annotations.
const PART_MAX: usize = 192 * 1024;

/// What one replica serves, by `namespace/name`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaReport {
    #[serde(default)]
    pub plugins: BTreeMap<String, Entry>,
    #[serde(default)]
    pub routes: BTreeMap<String, Entry>,
    /// Left out when empty: the reports of gateways without MCP routes
    /// read as before they had them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mcp_routes: BTreeMap<String, Entry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The generation of the resource this state is about.
    pub generation: i64,
    #[serde(flatten)]
    pub state: LoadState,
    /// For a route: its backends this replica has out of rotation now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ejected_backends: Vec<String>,
}

impl ReplicaReport {
    fn from_load(load: &LoadReport, generations: &crate::feed::Generations) -> ReplicaReport {
        // `ejected`: the report's ejected backends, for AIModelRoutes only
        // (an MCPRoute may share an AIModelRoute's namespace and name).
        let entries = |states: &BTreeMap<ResourceKey, LoadState>,
                       generations: &HashMap<ResourceKey, i64>,
                       redactions: &HashMap<ResourceKey, Redactions>,
                       ejected: Option<&BTreeMap<ResourceKey, Vec<String>>>| {
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
                    // At most the route's backends (64 in a CRD), each a
                    // URL without credentials.
                    let ejected_backends = ejected
                        .and_then(|ejected| ejected.get(key))
                        .map(|out| out.iter().take(MAX_EJECTED).cloned().collect())
                        .unwrap_or_default();
                    Some((key.to_string(), Entry { generation, state, ejected_backends }))
                })
                .collect()
        };
        ReplicaReport {
            plugins: entries(&load.plugins, &generations.plugins, &generations.plugin_redactions, None),
            routes: entries(&load.routes, &generations.routes, &generations.route_redactions, Some(&load.ejected)),
            mcp_routes: entries(&load.mcp_routes, &generations.mcp_routes, &generations.mcp_route_redactions, None),
        }
    }
}

/// One annotation's worth of a report. The heartbeat's part also names the
/// content hashes of parts 1.., in order.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Part {
    #[serde(flatten)]
    report: ReplicaReport,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    parts: Vec<String>,
}

/// The report as annotation texts, part 0 (the heartbeat's) first. Keys are
/// hashed into parts so that a change to one resource changes one part.
fn split(report: &ReplicaReport) -> Vec<String> {
    // Each entry with the map it belongs in, by kind.
    type Map = fn(&mut ReplicaReport) -> &mut BTreeMap<String, Entry>;
    let maps: [Map; 3] = [|r| &mut r.plugins, |r| &mut r.routes, |r| &mut r.mcp_routes];
    let entries = || {
        let plugins = report.plugins.iter().map(|e| (0, e));
        plugins.chain(report.routes.iter().map(|e| (1, e))).chain(report.mcp_routes.iter().map(|e| (2, e)))
    };
    let size: usize =
        entries().map(|(_, (key, entry))| key.len() + serde_json::to_string(entry).map_or(0, |e| e.len()) + 4).sum();
    let count = report.plugins.len() + report.routes.len() + report.mcp_routes.len();
    let mut n = size.div_ceil(PART_TARGET).max(1);
    loop {
        let mut parts: Vec<Part> = (0..n).map(|_| Part::default()).collect();
        for (kind, (key, entry)) in entries() {
            let part = &mut parts[(fnv1a(key.as_bytes()) % n as u64) as usize].report;
            maps[kind](part).insert(key.clone(), entry.clone());
        }
        let mut texts: Vec<String> = parts.iter().map(|p| serde_json::to_string(p).unwrap_or_default()).collect();
        parts[0].parts = texts[1..].iter().map(|t| content_hash(t)).collect();
        texts[0] = serde_json::to_string(&parts[0]).unwrap_or_default();
        // An uneven hash can overfill a part; more parts then. One entry is
        // under 1 KiB, so this ends long before there are more parts than entries.
        if texts.iter().all(|t| t.len() <= PART_MAX) || n >= count {
            return texts;
        }
        n *= 2;
    }
}

/// A stable hash (the same in every replica and version), unlike std's.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3))
}

fn content_hash(text: &str) -> String {
    format!("{:016x}", fnv1a(text.as_bytes()))
}

/// The report in `heartbeat` and the parts it names, looked up by Lease
/// name; `None` while a part is missing or not yet the content named.
pub fn assemble(heartbeat: &Lease, part: impl Fn(&str) -> Option<Arc<Lease>>) -> Option<ReplicaReport> {
    let identity = heartbeat.spec.as_ref()?.holder_identity.as_deref()?;
    let head: Part = serde_json::from_str(annotation(heartbeat)?).ok()?;
    let mut report = head.report;
    for (i, hash) in head.parts.iter().enumerate() {
        let lease = part(&part_name(identity, i + 1))?;
        let text = annotation(&lease)?;
        if content_hash(text) != *hash {
            return None;
        }
        let part: ReplicaReport = serde_json::from_str(text).ok()?;
        report.plugins.extend(part.plugins);
        report.routes.extend(part.routes);
        report.mcp_routes.extend(part.mcp_routes);
    }
    Some(report)
}

fn annotation(lease: &Lease) -> Option<&str> {
    lease.metadata.annotations.as_ref()?.get(REPORT_ANNOTATION).map(String::as_str)
}

/// How many parts besides its own a heartbeat Lease names.
pub fn named_parts(heartbeat: &Lease) -> usize {
    annotation(heartbeat).and_then(|text| serde_json::from_str::<Part>(text).ok()).map_or(0, |head| head.parts.len())
}

/// Keeps this replica's report Leases up to date until `shutdown`, then
/// deletes them so the leader stops counting this replica at once.
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
    // Parts 1.. as the API server has them.
    let mut written: Vec<Option<String>> = Vec::new();
    let mut owner_uid = String::new();
    tokio::pin!(shutdown);
    loop {
        let load = reports.borrow_and_update().clone();
        let generations = published.lock().generations(load.revision);
        if let Some(generations) = generations {
            report = ReplicaReport::from_load(&load, &generations);
        }
        let texts = split(&report);
        // The heartbeat first: it is what keeps this replica counted, and the
        // parts name it as their owner. The leader waits for named parts.
        match renew(&api, &name, &replica, &texts[0]).await {
            Ok(owner) => {
                // A new heartbeat (deleted while this replica was cut off)
                // took its parts with it where a garbage collector runs.
                if owner.uid != owner_uid {
                    owner_uid.clone_from(&owner.uid);
                    written.iter_mut().for_each(|w| *w = None);
                }
                write_parts(&api, &replica, &owner, &texts[1..], &mut written).await;
            }
            Err(error) => tracing::warn!(%error, lease = %name, "could not write this replica's load report"),
        }
        tokio::select! {
            changed = reports.changed() => if changed.is_err() { break },
            () = tokio::time::sleep(RENEW_EVERY) => {}
            () = &mut shutdown => break,
        }
    }
    for i in 1..=written.len() {
        delete(&api, &part_name(&replica, i)).await;
    }
    delete(&api, &name).await;
}

/// Writes the parts whose content changed and deletes those no longer named.
async fn write_parts(
    api: &Api<Lease>,
    replica: &str,
    owner: &OwnerReference,
    texts: &[String],
    written: &mut Vec<Option<String>>,
) {
    for (i, text) in texts.iter().enumerate() {
        if written.get(i).and_then(Option::as_ref) == Some(text) {
            continue;
        }
        let name = part_name(replica, i + 1);
        let lease = report_lease(&name, ROLE_PART, replica, text, Some(owner.clone()), None);
        let result = apply(api, &name, &lease).await;
        if let Err(error) = &result {
            tracing::warn!(%error, lease = %name, "could not write part of this replica's load report");
        }
        if written.len() <= i {
            written.resize(i + 1, None);
        }
        written[i] = result.ok().map(|_| text.clone());
    }
    while written.len() > texts.len() {
        written.pop();
        delete(api, &part_name(replica, written.len() + 1)).await;
    }
}

/// Renews the heartbeat with part 0 of the report; the Lease as owner of the parts.
async fn renew(api: &Api<Lease>, name: &str, replica: &str, text: &str) -> Result<OwnerReference, kube::Error> {
    let spec = LeaseSpec {
        holder_identity: Some(replica.to_string()),
        lease_duration_seconds: Some(LEASE_SECONDS),
        renew_time: Some(MicroTime(Timestamp::now())),
        ..Default::default()
    };
    let lease = apply(api, name, &report_lease(name, ROLE_REPLICA, replica, text, None, Some(spec))).await?;
    Ok(OwnerReference {
        api_version: "coordination.k8s.io/v1".into(),
        kind: "Lease".into(),
        name: name.to_string(),
        uid: lease.metadata.uid.unwrap_or_default(),
        ..Default::default()
    })
}

fn report_lease(
    name: &str,
    role: &str,
    replica: &str,
    text: &str,
    owner: Option<OwnerReference>,
    spec: Option<LeaseSpec>,
) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(
                [(ROLE_LABEL.to_string(), role.to_string()), ("app.kubernetes.io/name".into(), "sluice".into())].into(),
            ),
            annotations: Some([(REPORT_ANNOTATION.to_string(), text.to_string())].into()),
            // Parts go with their heartbeat (where a garbage collector runs).
            owner_references: owner.map(|owner| vec![owner]),
            ..Default::default()
        },
        spec: Some(
            spec.unwrap_or_else(|| LeaseSpec { holder_identity: Some(replica.to_string()), ..Default::default() }),
        ),
    }
}

async fn apply(api: &Api<Lease>, name: &str, lease: &Lease) -> Result<Lease, kube::Error> {
    let mut patch = serde_json::to_value(lease).unwrap_or_default();
    patch["apiVersion"] = "coordination.k8s.io/v1".into();
    patch["kind"] = "Lease".into();
    api.patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(patch)).await
}

async fn delete(api: &Api<Lease>, name: &str) {
    if let Err(error) = api.delete(name, &DeleteParams::default()).await {
        tracing::debug!(%error, lease = %name, "deleting a report Lease");
    }
}

pub fn lease_name(replica: &str) -> String {
    format!("sluice-replica-{replica}")
}

pub fn part_name(replica: &str, part: usize) -> String {
    format!("sluice-replica-{replica}-{part}")
}

/// How long ago a heartbeat Lease expired (negative while it is current);
/// `None` if it is not a heartbeat.
pub fn expired_for(heartbeat: &Lease, now: Timestamp) -> Option<i64> {
    let spec = heartbeat.spec.as_ref()?;
    let renewed = spec.renew_time.as_ref()?.0;
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(LEASE_SECONDS));
    Some(now.as_second() - (renewed.as_second() + duration))
}

/// The leader's view of every replica's report, assembled once per change
/// of its Leases rather than parsed on every reconcile.
pub struct Reports {
    leases: Store<Lease>,
    namespace: String,
    /// By replica identity: the heartbeat text the report was assembled
    /// from (which names every part by content), and the report.
    assembled: Mutex<BTreeMap<String, (String, Arc<ReplicaReport>)>>,
}

impl Reports {
    pub fn new(leases: Store<Lease>, namespace: &str) -> Reports {
        Reports { leases, namespace: namespace.to_string(), assembled: Mutex::default() }
    }

    fn get(&self, name: &str) -> Option<Arc<Lease>> {
        self.leases.get(&ObjectRef::new(name).within(&self.namespace))
    }

    /// After `lease` (a heartbeat or a part) changed: assembles its
    /// replica's report again; whether the report changed.
    pub fn observe(&self, lease: &Lease) -> bool {
        let Some(identity) = lease.spec.as_ref().and_then(|s| s.holder_identity.clone()) else { return false };
        let Some(heartbeat) = self.get(&lease_name(&identity)) else { return false };
        let Some(head) = annotation(&heartbeat) else { return false };
        if self.assembled.lock().get(&identity).is_some_and(|(text, _)| text == head) {
            return false;
        }
        // Until every part is there, the last whole report stands.
        let Some(report) = assemble(&heartbeat, |name| self.get(name)) else { return false };
        let mut assembled = self.assembled.lock();
        let changed = assembled.get(&identity).is_none_or(|(_, old)| **old != report);
        assembled.insert(identity, (head.to_string(), Arc::new(report)));
        changed
    }

    /// [`Reports::observe`] for every heartbeat in the store.
    pub fn observe_all(&self) {
        for lease in self.leases.state() {
            if lease.labels().get(ROLE_LABEL).map(String::as_str) == Some(ROLE_REPLICA) {
                self.observe(&lease);
            }
        }
    }

    /// The reports of replicas whose heartbeat is current, by identity.
    pub fn live(&self, now: Timestamp) -> BTreeMap<String, Arc<ReplicaReport>> {
        let mut assembled = self.assembled.lock();
        assembled.retain(|identity, _| self.get(&lease_name(identity)).is_some());
        assembled
            .iter()
            .filter(|(identity, _)| {
                let heartbeat = self.get(&lease_name(identity));
                heartbeat.and_then(|h| expired_for(&h, now)).is_some_and(|expired| expired <= 0)
            })
            .map(|(identity, (_, report))| (identity.clone(), report.clone()))
            .collect()
    }

    /// Deletes the Leases of replicas gone for longer than `after` (a pod
    /// that crashed never deletes its own), with the parts they name.
    pub async fn collect_expired(&self, api: &Api<Lease>, after: Duration, now: Timestamp) {
        for lease in self.leases.state() {
            let Some(expired) = expired_for(&lease, now) else { continue };
            let Some(identity) = lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) else { continue };
            if expired < after.as_secs() as i64 || lease.metadata.name.as_deref() != Some(&lease_name(identity)) {
                continue;
            }
            tracing::info!(replica = identity, "deleting the report Leases of a replica gone for {expired} s");
            for i in 1..=named_parts(&lease) {
                delete(api, &part_name(identity, i)).await;
            }
            delete(api, &lease_name(identity)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(name: &str, identity: &str, renewed: Option<Timestamp>, text: &str) -> Arc<Lease> {
        Arc::new(Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: Some([(REPORT_ANNOTATION.to_string(), text.to_string())].into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(identity.into()),
                lease_duration_seconds: renewed.map(|_| 30),
                renew_time: renewed.map(MicroTime),
                ..Default::default()
            }),
        })
    }

    /// The Leases `split` makes for replica `a`, by name.
    fn leases(texts: &[String], renewed: Timestamp) -> HashMap<String, Arc<Lease>> {
        let mut leases = HashMap::from([(lease_name("a"), lease(&lease_name("a"), "a", Some(renewed), &texts[0]))]);
        for (i, text) in texts.iter().enumerate().skip(1) {
            leases.insert(part_name("a", i), lease(&part_name("a", i), "a", None, text));
        }
        leases
    }

    /// 10,000 routes with names at the length limit, each failing with a
    /// long error, and 1,000 plugins: far past one annotation.
    fn large_report() -> ReplicaReport {
        let mut report = ReplicaReport::default();
        let namespace = "n".repeat(63);
        for i in 0..10_000 {
            let key = format!("{namespace}/{i:05}{}", "r".repeat(248));
            let state = LoadState::failed("LoadFailed", "é".repeat(MAX_MESSAGE / 2), None);
            report.routes.insert(key, Entry { generation: i, state, ejected_backends: vec![] });
        }
        for i in 0..1_000 {
            let state = LoadState::ready(Some(format!("sha256:{}", "ab".repeat(32))));
            report
                .plugins
                .insert(format!("{namespace}/plugin-{i}"), Entry { generation: 1, state, ejected_backends: vec![] });
        }
        report
    }

    /// A report of any size fits the API server's annotation limit, part by
    /// part, and reads back whole.
    #[test]
    fn a_large_report_is_split_into_parts_under_the_annotation_limit() {
        let report = large_report();
        let texts = split(&report);
        assert!(texts.len() > 10, "{} parts", texts.len());
        // 256 KiB for all of an object's annotations, keys included.
        assert!(texts.iter().all(|t| t.len() + REPORT_ANNOTATION.len() <= 256 * 1024));
        let leases = leases(&texts, Timestamp::now());
        let assembled = assemble(&leases[&lease_name("a")], |name| leases.get(name).cloned());
        assert_eq!(assembled.as_ref(), Some(&report));
        assert_eq!(named_parts(&leases[&lease_name("a")]), texts.len() - 1);

        // A small report stays on the heartbeat alone.
        let mut small = ReplicaReport::default();
        small
            .plugins
            .insert("ns/p".into(), Entry { generation: 3, state: LoadState::ready(None), ejected_backends: vec![] });
        assert_eq!(split(&small).len(), 1);
    }

    #[test]
    fn a_change_to_one_resource_rewrites_one_part() {
        let mut report = large_report();
        let before = split(&report);
        let key = report.routes.keys().nth(4321).unwrap().clone();
        report.routes.get_mut(&key).unwrap().state = LoadState::ready(None);
        let after = split(&report);
        assert_eq!(before.len(), after.len());
        let changed = (1..before.len()).filter(|i| before[*i] != after[*i]).count();
        // Part 0 names the others' hashes, so it changes too unless it holds the key.
        assert!(changed <= 1, "{changed} parts changed");
        assert_ne!(before[0], after[0]);
    }

    #[test]
    fn a_report_with_a_part_missing_or_stale_is_not_assembled() {
        let report = large_report();
        let texts = split(&report);
        let mut leases = leases(&texts, Timestamp::now());
        let heartbeat = leases[&lease_name("a")].clone();
        leases.insert(part_name("a", 2), lease(&part_name("a", 2), "a", None, &texts[3]));
        assert_eq!(assemble(&heartbeat, |name| leases.get(name).cloned()), None);
        leases.remove(&part_name("a", 2));
        assert_eq!(assemble(&heartbeat, |name| leases.get(name).cloned()), None);
    }

    #[test]
    fn expired_replicas_are_told_apart_from_live_ones() {
        let now = Timestamp::now();
        let stale = now.checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(31)).unwrap();
        let live = lease("l", "a", Some(now), "{}");
        let gone = lease("g", "b", Some(stale), "{}");
        assert!(expired_for(&live, now).unwrap() <= 0);
        assert!(expired_for(&gone, now).unwrap() > 0);
        assert_eq!(expired_for(&lease("p", "a", None, "{}"), now), None);
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

    /// MCP routes are reported beside routes, by generation and redacted;
    /// an AIModelRoute's ejected backends stay its own when an MCPRoute has
    /// its name; and they survive the split into parts.
    #[test]
    fn mcp_routes_are_reported_apart_from_routes() {
        let key = ResourceKey::new("ns", "shared-name");
        let mut load = LoadReport { revision: 2, ..Default::default() };
        load.routes.insert(key.clone(), LoadState::ready(None));
        load.ejected.insert(key.clone(), vec!["http://down.example/v1".into()]);
        load.mcp_routes.insert(key.clone(), LoadState::failed("ChainNotReady", "token sk-planted refused", None));
        load.mcp_routes.insert(ResourceKey::new("ns", "unpublished"), LoadState::ready(None));
        let mut generations = crate::feed::Generations::default();
        generations.routes.insert(key.clone(), 1);
        generations.mcp_routes.insert(key.clone(), 6);
        let mut redactions = Redactions::default();
        redactions.add("sk-planted");
        generations.mcp_route_redactions.insert(key, redactions);
        let report = ReplicaReport::from_load(&load, &generations);
        assert_eq!(report.routes["ns/shared-name"].ejected_backends, ["http://down.example/v1"]);
        let entry = &report.mcp_routes["ns/shared-name"];
        assert_eq!((entry.generation, entry.ejected_backends.len()), (6, 0));
        assert_eq!(entry.state.error.as_deref(), Some("token [redacted] refused"));
        assert_eq!(report.mcp_routes.len(), 1, "only what was published is reported");

        let mut large = large_report();
        for i in 0..2_000 {
            let state = LoadState::ready(None);
            large.mcp_routes.insert(format!("ns/mcp-{i}"), Entry { generation: 1, state, ejected_backends: vec![] });
        }
        let texts = split(&large);
        let leases = leases(&texts, Timestamp::now());
        assert_eq!(assemble(&leases[&lease_name("a")], |name| leases.get(name).cloned()).as_ref(), Some(&large));
        // A report without MCP routes reads as it did before they existed.
        assert!(!split(&ReplicaReport::default())[0].contains("mcp"));
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
