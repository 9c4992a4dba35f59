//! Status, written only by the leader: `Controller::new(..).run(reconcile,
//! error_policy, ctx)` per kind, in the controller-rs style. A reconcile
//! computes the conditions from the object, the Secrets and every live
//! replica's load report, applies the status with one field manager when it
//! differs, and records an Event on each transition.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use parking_lot::Mutex;
use sluice_api::{
    AIModelRoute, AIModelRouteStatus, GatewayPlugin, GatewayPluginStatus, MCPRoute, MCPRouteStatus, ReplicaStatus,
};
use sluice_core::{ResourceKey, reason};
use tokio::sync::watch;

use crate::feed::{Stores, api, generation};
use crate::replica::{self, Entry, ReplicaReport, Reports};
use crate::secrets;
use sluice_core::Redactions;

use crate::translate::{self, Problem};
use crate::{Error, Tenancy};

pub const FIELD_MANAGER: &str = "sluice-gateway";
/// Re-check even with no event: a replica whose Lease expires changes `loaded`.
const RESYNC: Duration = Duration::from_secs(30);
/// Status reconciles at once, per kind. Unbounded, a pass over 10,000
/// routes (a new report, a republished config) sends 10,000 requests at
/// once and the API server times out everyone's handshakes.
const CONCURRENCY: u16 = 16;
/// A replica's report Leases are deleted this long after it stopped renewing.
const GONE_AFTER: Duration = Duration::from_secs(600);

pub struct Context {
    pub client: Client,
    pub stores: Stores,
    pub reports: Arc<Reports>,
    pub recorder: Recorder,
    pub tenancy: Arc<Tenancy>,
    /// Consecutive failures per object, for the error backoff.
    pub failures: Mutex<HashMap<String, u32>>,
    /// Model conflicts over every valid route, computed once per change of
    /// the watched objects rather than once per reconcile (which would make
    /// a pass over all routes quadratic).
    conflicts: Mutex<Option<(u64, Conflicts)>>,
    /// The same for MCPRoutes and their paths.
    path_conflicts: Mutex<Option<(u64, Conflicts)>>,
}

/// The routes that lose a model (or a path) to an older route, and why.
type Conflicts = Arc<HashMap<ResourceKey, Problem>>;

/// Runs the status controllers, one per kind, until dropped (on losing the lead).
/// `changed` ticks when the desired config is republished, so conditions
/// that depend on other objects (a Secret appearing) are recomputed.
pub async fn run(
    client: Client,
    namespace: Option<String>,
    lease_namespace: String,
    stores: Stores,
    recorder: Recorder,
    tenancy: Arc<Tenancy>,
    changed: watch::Receiver<u64>,
) {
    // Replica reports: every change to one re-reconciles everything.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &lease_namespace);
    let selector = format!("{} in ({},{})", replica::ROLE_LABEL, replica::ROLE_REPLICA, replica::ROLE_PART);
    let (replicas, writer) = kube::runtime::reflector::store();
    let reports = Arc::new(Reports::new(replicas.clone(), &lease_namespace));
    let (reports_tx, reports_rx) = watch::channel(0u64);
    let report_watch = watcher::watcher(leases.clone(), watcher::Config::default().labels(&selector))
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .for_each({
            let reports = reports.clone();
            move |lease| {
                // Renewals alone change nothing the leader writes.
                if let Ok(lease) = lease
                    && reports.observe(&lease)
                {
                    reports_tx.send_modify(|n| *n += 1);
                }
                std::future::ready(())
            }
        });
    let collect_expired = {
        let reports = reports.clone();
        async move {
            loop {
                tokio::time::sleep(RESYNC).await;
                reports.collect_expired(&leases, GONE_AFTER, Timestamp::now()).await;
            }
        }
    };

    // A new leader's first statuses must not count replicas or Secrets it has not listed yet.
    let listed = {
        let (replicas, stores, reports) = (replicas.clone(), stores.clone(), reports.clone());
        async move {
            let _ = replicas.wait_until_ready().await;
            // The list came in before the store had it: assemble what it holds now.
            reports.observe_all();
            let _ = stores.plugins.wait_until_ready().await;
            let _ = stores.routes.wait_until_ready().await;
            stores.secrets.wait_until_ready().await;
        }
    };
    let ctx = Arc::new(Context::new(client.clone(), stores, reports, recorder, tenancy));
    let config = kube::runtime::controller::Config::default().concurrency(CONCURRENCY);
    let plugins = Controller::new(api::<GatewayPlugin>(&client, namespace.as_deref()), watcher::Config::default())
        .with_config(config.clone())
        .reconcile_all_on(ticks(changed.clone()))
        .reconcile_all_on(ticks(reports_rx.clone()))
        .run(|plugin, ctx| measured("GatewayPlugin", reconcile_plugin(plugin, ctx)), error_policy, ctx.clone())
        .for_each(log_outcome);
    let routes = Controller::new(api::<AIModelRoute>(&client, namespace.as_deref()), watcher::Config::default())
        .with_config(config.clone())
        .reconcile_all_on(ticks(changed.clone()))
        .reconcile_all_on(ticks(reports_rx.clone()))
        .run(|route, ctx| measured("AIModelRoute", reconcile_route(route, ctx)), error_policy, ctx.clone())
        .for_each(log_outcome);
    let mcp_routes = Controller::new(api::<MCPRoute>(&client, namespace.as_deref()), watcher::Config::default())
        .with_config(config)
        .reconcile_all_on(ticks(changed))
        .reconcile_all_on(ticks(reports_rx))
        .run(|route, ctx| measured("MCPRoute", reconcile_mcp_route(route, ctx)), error_policy, ctx.clone())
        .for_each(log_outcome);
    // Path conflicts are computed from the feed's store: not before it has
    // listed. Waited for apart from the other kinds, which a cluster without
    // the MCPRoute CRD must not hold up (the store then never lists, and
    // there is no MCPRoute to write status to).
    let mcp_routes = async move {
        let _ = ctx.stores.mcp_routes.wait_until_ready().await;
        mcp_routes.await;
    };
    let controllers = async move {
        listed.await;
        tokio::join!(plugins, routes, mcp_routes);
    };
    tokio::join!(report_watch, collect_expired, controllers);
}

fn ticks(rx: watch::Receiver<u64>) -> impl futures_util::Stream<Item = ()> + Send + 'static {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.changed().await.ok().map(|()| ((), rx)) })
}

async fn log_outcome<K: Resource + std::fmt::Debug, E: std::fmt::Display>(
    outcome: Result<(ObjectRef<K>, Action), kube::runtime::controller::Error<E, kube::runtime::watcher::Error>>,
) {
    match outcome {
        Ok((object, _)) => tracing::debug!(%object, "status reconciled"),
        // A deleted object has nothing left to report on.
        Err(kube::runtime::controller::Error::ObjectNotFound(_)) => {}
        Err(error) => tracing::warn!(%error, "status reconcile failed"),
    }
}

/// A reconcile, counted by kind and result (`ok` or the error's metric
/// label) and timed.
async fn measured(kind: &'static str, reconcile: impl Future<Output = Result<Action, Error>>) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let result = reconcile.await;
    let metrics = sluice_telemetry::metrics();
    let labels = sluice_telemetry::metrics::KindLabels { kind };
    metrics.reconcile_duration.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
    let outcome = match &result {
        Ok(_) => "ok",
        Err(error) => error.metric_label(),
    };
    metrics.reconciles.get_or_create(&sluice_telemetry::metrics::ReconcileLabels { kind, result: outcome }).inc();
    result
}

pub(crate) fn error_policy<K: Resource<DynamicType = ()>>(object: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action {
    let key = format!(
        "{}/{}",
        object.meta().namespace.clone().unwrap_or_default(),
        object.meta().name.clone().unwrap_or_default()
    );
    let mut failures = ctx.failures.lock();
    let count = failures.entry(key.clone()).or_insert(0);
    *count = (*count + 1).min(8);
    // 1 s doubling to about 4 minutes.
    let delay = Duration::from_secs(1 << (*count - 1).min(8));
    tracing::warn!(object = %key, %error, kind = error.metric_label(), retry_in = ?delay, "writing status failed");
    Action::requeue(delay)
}

pub(crate) async fn reconcile_plugin(plugin: Arc<GatewayPlugin>, ctx: Arc<Context>) -> Result<Action, Error> {
    let key = plugin.key();
    let generation = generation(&plugin.metadata);
    // A Secret named since the feed last looked is fetched here, not reported missing.
    let wanted = secrets::keys(&key.namespace, plugin.secret_names()).collect();
    ctx.stores.secrets.sync(&wanted, false).await;
    let (translated, redactions) = translate::plugin_redacted(&plugin, &*ctx.stores.secrets, &ctx.tenancy);
    let problem = translated.err();
    let replicas = ctx.live_reports();
    let views = views(&replicas, |report| report.plugins.get(&key.to_string()), generation, &redactions);
    let (conditions, loaded) =
        conditions(problem.as_ref(), &views, generation, plugin.status.as_ref().map(|s| &s.conditions[..]));
    // The module served for this generation, or else the last good one.
    let digest = views
        .iter()
        .find(|v| v.ready)
        .or_else(|| views.iter().find(|v| v.digest.is_some()))
        .and_then(|v| v.digest.clone())
        .or_else(|| plugin.status.as_ref().and_then(|s| s.digest.clone()));
    let status = GatewayPluginStatus {
        observed_generation: Some(generation),
        conditions,
        short_digest: digest.as_deref().map(|d| d.trim_start_matches("sha256:").chars().take(12).collect()),
        digest,
        loaded: Some(loaded),
        replicas: views,
    };
    let old = plugin.status.clone().unwrap_or_default();
    if old != status {
        let api: Api<GatewayPlugin> = Api::namespaced(ctx.client.clone(), &key.namespace);
        apply_status(&api, &key.name, "GatewayPlugin", &status).await?;
        let swapped = match (&old.digest, &status.digest) {
            (Some(before), Some(after)) if before != after && ready(&status.conditions) == Some(true) => {
                Some(format!("now serving {after} (was {before}) on {}", status.loaded.as_deref().unwrap_or("?")))
            }
            _ => None,
        };
        ctx.transition_events(&*plugin, &old.conditions, &status.conditions, swapped).await;
    }
    ctx.succeeded(&key.to_string());
    Ok(Action::requeue(RESYNC))
}

pub(crate) async fn reconcile_route(route: Arc<AIModelRoute>, ctx: Arc<Context>) -> Result<Action, Error> {
    let key = route.key();
    let generation = generation(&route.metadata);
    let plugin_exists = |plugin: &sluice_core::ResourceKey| {
        ctx.stores.plugins.get(&ObjectRef::new(&plugin.name).within(&plugin.namespace)).is_some()
    };
    let wanted = secrets::keys(&key.namespace, route.secret_names()).collect();
    ctx.stores.secrets.sync(&wanted, false).await;
    let (translated, redactions) = translate::route_redacted(&route, &*ctx.stores.secrets, &ctx.tenancy, plugin_exists);
    let problem = match translated {
        Err(problem) => Some(problem),
        Ok(_) => ctx.conflicts().get(&key).cloned(),
    };
    let replicas = ctx.live_reports();
    let views = views(&replicas, |report| report.routes.get(&key.to_string()), generation, &redactions);
    let (conditions, loaded) =
        conditions(problem.as_ref(), &views, generation, route.status.as_ref().map(|s| &s.conditions[..]));
    let status =
        AIModelRouteStatus { observed_generation: Some(generation), conditions, loaded: Some(loaded), replicas: views };
    let old = route.status.clone().unwrap_or_default();
    if old != status {
        let api: Api<AIModelRoute> = Api::namespaced(ctx.client.clone(), &key.namespace);
        apply_status(&api, &key.name, "AIModelRoute", &status).await?;
        ctx.transition_events(&*route, &old.conditions, &status.conditions, None).await;
    }
    ctx.succeeded(&key.to_string());
    Ok(Action::requeue(RESYNC))
}

pub(crate) async fn reconcile_mcp_route(route: Arc<MCPRoute>, ctx: Arc<Context>) -> Result<Action, Error> {
    let key = route.key();
    let generation = generation(&route.metadata);
    let plugin_exists = |plugin: &sluice_core::ResourceKey| {
        ctx.stores.plugins.get(&ObjectRef::new(&plugin.name).within(&plugin.namespace)).is_some()
    };
    let wanted = secrets::keys(&key.namespace, route.secret_names()).collect();
    ctx.stores.secrets.sync(&wanted, false).await;
    let (translated, redactions) =
        translate::mcp_route_redacted(&route, &*ctx.stores.secrets, &ctx.tenancy, plugin_exists);
    let problem = match translated {
        Err(problem) => Some(problem),
        Ok(_) => ctx.path_conflicts().get(&key).cloned(),
    };
    let replicas = ctx.live_reports();
    let views = views(&replicas, |report| report.mcp_routes.get(&key.to_string()), generation, &redactions);
    let (conditions, loaded) =
        conditions(problem.as_ref(), &views, generation, route.status.as_ref().map(|s| &s.conditions[..]));
    let status =
        MCPRouteStatus { observed_generation: Some(generation), conditions, loaded: Some(loaded), replicas: views };
    let old = route.status.clone().unwrap_or_default();
    if old != status {
        let api: Api<MCPRoute> = Api::namespaced(ctx.client.clone(), &key.namespace);
        apply_status(&api, &key.name, "MCPRoute", &status).await?;
        ctx.transition_events(&*route, &old.conditions, &status.conditions, None).await;
    }
    ctx.succeeded(&key.to_string());
    Ok(Action::requeue(RESYNC))
}

async fn apply_status<K, S>(api: &Api<K>, name: &str, kind: &str, status: &S) -> Result<(), Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    S: serde::Serialize,
{
    let patch = serde_json::json!({ "apiVersion": sluice_api::API_VERSION, "kind": kind, "status": status });
    api.patch_status(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await?;
    Ok(())
}

impl Context {
    pub fn new(
        client: Client,
        stores: Stores,
        reports: Arc<Reports>,
        recorder: Recorder,
        tenancy: Arc<Tenancy>,
    ) -> Context {
        Context {
            client,
            stores,
            reports,
            recorder,
            tenancy,
            failures: Mutex::default(),
            conflicts: Mutex::default(),
            path_conflicts: Mutex::default(),
        }
    }

    fn live_reports(&self) -> BTreeMap<String, Arc<ReplicaReport>> {
        self.reports.live(Timestamp::now())
    }

    /// The model conflicts among the routes as the stores hold them now.
    fn conflicts(&self) -> Conflicts {
        // Read before the stores: a change that lands meanwhile moves it on,
        // so what is cached under it is never older than it says.
        let version = self.stores.version();
        if let Some((cached, conflicts)) = &*self.conflicts.lock()
            && *cached == version
        {
            return conflicts.clone();
        }
        let plugin_exists = |plugin: &ResourceKey| {
            self.stores.plugins.get(&ObjectRef::new(&plugin.name).within(&plugin.namespace)).is_some()
        };
        let routes = self.stores.routes.state();
        let decls: Vec<_> = routes
            .iter()
            .filter_map(|r| {
                let decl = translate::route(r, &*self.stores.secrets, &self.tenancy, plugin_exists).ok()?;
                Some((r.as_ref(), decl))
            })
            .collect();
        let pairs: Vec<_> = decls.iter().map(|(r, d)| (*r, d)).collect();
        let conflicts = Arc::new(translate::model_conflicts(&pairs));
        *self.conflicts.lock() = Some((version, conflicts.clone()));
        conflicts
    }

    /// The path conflicts among the MCPRoutes as the stores hold them now,
    /// cached as [`Context::conflicts`] is.
    fn path_conflicts(&self) -> Conflicts {
        let version = self.stores.version();
        if let Some((cached, conflicts)) = &*self.path_conflicts.lock()
            && *cached == version
        {
            return conflicts.clone();
        }
        let plugin_exists = |plugin: &ResourceKey| {
            self.stores.plugins.get(&ObjectRef::new(&plugin.name).within(&plugin.namespace)).is_some()
        };
        let routes = self.stores.mcp_routes.state();
        let decls: Vec<_> = routes
            .iter()
            .filter_map(|r| {
                let (decl, _) = translate::mcp_route_redacted(r, &*self.stores.secrets, &self.tenancy, plugin_exists);
                Some((r.as_ref(), decl.ok()?))
            })
            .collect();
        let pairs: Vec<_> = decls.iter().map(|(r, d)| (*r, d)).collect();
        let conflicts = Arc::new(translate::path_conflicts(&pairs));
        *self.path_conflicts.lock() = Some((version, conflicts.clone()));
        conflicts
    }

    fn succeeded(&self, key: &str) {
        self.failures.lock().remove(key);
    }

    /// Events on the transitions of `Ready`, and on a module swap.
    async fn transition_events<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        before: &[Condition],
        after: &[Condition],
        swapped: Option<String>,
    ) {
        let mut events = Vec::new();
        let old = before.iter().find(|c| c.type_ == "Ready");
        if let Some(new) = after.iter().find(|c| c.type_ == "Ready")
            && old.map(|c| (&c.status, &c.reason)) != Some((&new.status, &new.reason))
        {
            let type_ = if new.status == "False" { EventType::Warning } else { EventType::Normal };
            if new.status != "Unknown" {
                events.push((type_, new.reason.clone(), new.message.clone()));
            }
        }
        if let Some(note) = swapped {
            events.push((EventType::Normal, reason::SWAPPED.to_string(), note));
        }
        let reference = object.object_ref(&());
        for (type_, reason, note) in events {
            let event = Event { type_, reason, note: Some(note), action: "Reconcile".into(), secondary: None };
            if let Err(error) = self.recorder.publish(&event, &reference).await {
                tracing::warn!(%error, "recording an Event");
            }
        }
    }
}

/// Each live replica's view of one resource at `generation`. Replicas
/// redact their own reports; the values this leader reads are cut again, in
/// case a replica did not.
fn views<'a>(
    replicas: &'a BTreeMap<String, Arc<ReplicaReport>>,
    entry: impl Fn(&'a ReplicaReport) -> Option<&'a Entry>,
    generation: i64,
    redactions: &Redactions,
) -> Vec<ReplicaStatus> {
    replicas
        .iter()
        .map(|(name, report)| match entry(report) {
            Some(entry) => ReplicaStatus {
                name: name.clone(),
                generation: Some(entry.generation),
                ready: entry.state.ready && entry.generation == generation,
                digest: entry.state.digest.clone(),
                reason: entry.state.reason.clone(),
                message: entry.state.error.as_deref().map(|error| redactions.apply(error)),
                ejected_backends: entry.ejected_backends.clone(),
            },
            None => ReplicaStatus {
                name: name.clone(),
                reason: Some(reason::PENDING.into()),
                message: Some("not loaded yet".into()),
                ..Default::default()
            },
        })
        .collect()
}

fn ready(conditions: &[Condition]) -> Option<bool> {
    conditions.iter().find(|c| c.type_ == "Ready").map(|c| c.status == "True")
}

/// `Accepted`, `ResolvedRefs` and `Ready`, and the `loaded` count.
fn conditions(
    problem: Option<&Problem>,
    views: &[ReplicaStatus],
    generation: i64,
    old: Option<&[Condition]>,
) -> (Vec<Condition>, String) {
    let loaded_count = views.iter().filter(|v| v.ready).count();
    let loaded = format!("{loaded_count}/{}", views.len());
    let accepted = match problem {
        Some(p) if p.condition == translate::Condition::Accepted => ("False", p.reason, p.message.clone()),
        _ => ("True", reason::ACCEPTED, "the spec is valid".to_string()),
    };
    let resolved = match problem {
        Some(p) if p.condition == translate::Condition::ResolvedRefs => ("False", p.reason, p.message.clone()),
        Some(_) => ("Unknown", reason::NOT_CHECKED, "references are checked once the spec is accepted".to_string()),
        None => ("True", reason::RESOLVED_REFS, "every referenced object exists".to_string()),
    };
    let failing = views.iter().find(|v| v.generation == Some(generation) && !v.ready);
    let ready: (&str, &str, String) = if let Some(problem) = problem {
        ("False", problem.reason, format!("{}; the last good version (if any) is still served", problem.message))
    } else if let Some(failing) = failing {
        let message = failing.message.clone().unwrap_or_default();
        let reason = failing.reason.as_deref().unwrap_or(reason::LOAD_FAILED);
        ("False", reason, format!("replica {}: {message}", failing.name))
    } else if views.is_empty() {
        ("Unknown", reason::NO_REPLICAS, "no gateway replica is reporting".to_string())
    } else if loaded_count == views.len() {
        ("True", reason::LOADED, format!("served by {loaded} replicas"))
    } else {
        ("Unknown", reason::PROGRESSING, format!("served by {loaded} replicas"))
    };
    let now = Time(Timestamp::now());
    let condition = |type_: &str, (status, reason, message): (&str, &str, String)| {
        // The transition time moves only when the status does.
        let since = old
            .and_then(|old| old.iter().find(|c| c.type_ == type_ && c.status == status))
            .map(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| now.clone());
        Condition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message,
            observed_generation: Some(generation),
            last_transition_time: since,
        }
    };
    (vec![condition("Accepted", accepted), condition("ResolvedRefs", resolved), condition("Ready", ready)], loaded)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(name: &str, generation: i64, ready: bool, message: Option<&str>) -> ReplicaStatus {
        ReplicaStatus {
            name: name.into(),
            generation: Some(generation),
            ready,
            digest: None,
            reason: message.map(|_| "PullFailed".to_string()),
            message: message.map(str::to_string),
            ejected_backends: vec![],
        }
    }

    fn status_of<'a>(conditions: &'a [Condition], type_: &str) -> (&'a str, &'a str) {
        let c = conditions.iter().find(|c| c.type_ == type_).unwrap();
        (&c.status, &c.reason)
    }

    #[test]
    fn ready_needs_every_live_replica_on_this_generation() {
        let (conds, loaded) = conditions(None, &[view("a", 2, true, None), view("b", 1, false, None)], 2, None);
        assert_eq!(loaded, "1/2");
        assert_eq!(status_of(&conds, "Ready"), ("Unknown", "Progressing"));
        let (conds, loaded) = conditions(None, &[view("a", 2, true, None), view("b", 2, true, None)], 2, None);
        assert_eq!(loaded, "2/2");
        assert_eq!(status_of(&conds, "Ready"), ("True", "Loaded"));
    }

    #[test]
    fn a_failing_replica_or_a_problem_makes_it_not_ready() {
        let views = [view("a", 3, false, Some("pulling r/p:2: manifest unknown")), view("b", 3, true, None)];
        let (conds, _) = conditions(None, &views, 3, None);
        assert_eq!(status_of(&conds, "Ready"), ("False", "PullFailed"));
        let problem =
            Problem { condition: translate::Condition::ResolvedRefs, reason: "SecretNotFound", message: "x".into() };
        let (conds, _) = conditions(Some(&problem), &views, 3, None);
        assert_eq!(status_of(&conds, "ResolvedRefs"), ("False", "SecretNotFound"));
        assert_eq!(status_of(&conds, "Accepted"), ("True", "Accepted"));
        assert_eq!(status_of(&conds, "Ready"), ("False", "SecretNotFound"));
    }

    #[test]
    fn secret_values_in_replica_reports_reach_no_condition() {
        let mut report = ReplicaReport::default();
        let state = sluice_core::LoadState::failed("LoadFailed", "p: header value \"sk-planted\" is invalid", None);
        report.plugins.insert("ns/p".into(), Entry { generation: 2, state, ejected_backends: vec![] });
        let replicas = BTreeMap::from([("a".to_string(), Arc::new(report))]);
        let mut redactions = Redactions::default();
        redactions.add("sk-planted");
        let views = views(&replicas, |r| r.plugins.get("ns/p"), 2, &redactions);
        let (conds, _) = conditions(None, &views, 2, None);
        let ready = conds.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.message, "replica a: p: header value \"[redacted]\" is invalid");
        assert!(!format!("{views:?}").contains("sk-planted"));
    }

    #[test]
    fn transition_times_move_only_with_the_status() {
        let views = [view("a", 1, true, None)];
        let (first, _) = conditions(None, &views, 1, None);
        let mut old = first.clone();
        for c in &mut old {
            c.last_transition_time = Time(Timestamp::UNIX_EPOCH);
        }
        let (again, _) = conditions(None, &views, 1, Some(&old));
        assert!(again.iter().all(|c| c.last_transition_time.0 == Timestamp::UNIX_EPOCH));
        let (changed, _) = conditions(None, &[view("a", 1, false, Some("trap"))], 1, Some(&old));
        let ready = changed.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_ne!(ready.last_transition_time.0, Timestamp::UNIX_EPOCH);
    }
}
