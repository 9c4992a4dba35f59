//! The data plane's feed: watches GatewayPlugins, AIModelRoutes and Secrets,
//! and publishes the whole desired config whenever any of them changes.
//!
//! Every replica runs this. The desired config is a function of what the
//! watches hold, so a restarted watch (a re-list after the apiserver comes
//! back) converges on the truth, deletions included, with no finalizers: the
//! only state outside the objects is this process's memory.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use futures_util::stream::{self, BoxStream};
use futures_util::{FutureExt as _, Stream, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use sluice_api::{AIModelRoute, GatewayPlugin};
use sluice_core::{ConfigUpdate, DesiredConfig, PluginDecl, ResourceKey, RouteDecl};
use tokio::sync::watch;

use crate::{Tenancy, translate};
use sluice_core::Redactions;

/// What the watches hold, shared with the status controllers.
#[derive(Clone)]
pub struct Stores {
    pub plugins: Store<GatewayPlugin>,
    pub routes: Store<AIModelRoute>,
    pub secrets: Store<Secret>,
}

/// Which generation of each resource went into which published revision,
/// so a load report (about a revision) can be told per generation.
#[derive(Default)]
pub struct Published {
    by_revision: BTreeMap<u64, Arc<Generations>>,
}

#[derive(Debug, Default)]
pub struct Generations {
    pub plugins: HashMap<ResourceKey, i64>,
    pub routes: HashMap<ResourceKey, i64>,
    /// The Secret values in each declaration, cut out of its load errors.
    pub plugin_redactions: HashMap<ResourceKey, Redactions>,
    pub route_redactions: HashMap<ResourceKey, Redactions>,
}

impl Published {
    /// The generations in `revision`. Older revisions are forgotten: the
    /// data plane only ever applies the newest config it has seen.
    pub fn generations(&mut self, revision: u64) -> Option<Arc<Generations>> {
        self.by_revision.retain(|r, _| *r >= revision);
        self.by_revision.get(&revision).cloned()
    }
}

/// Which watch an event came from.
#[derive(Clone, Copy)]
enum Kind {
    Plugins = 0,
    Routes = 1,
    Secrets = 2,
}

/// A watch saw a change (`ready` once its first list is complete).
struct Change {
    kind: Kind,
    listed: bool,
}

pub struct Feed {
    pub stores: Stores,
    changes: BoxStream<'static, Change>,
    tenancy: Arc<Tenancy>,
}

impl Feed {
    /// Starts nothing yet: the watches run while [`Feed::run`] polls them.
    pub fn new(client: &Client, namespace: Option<&str>, tenancy: Arc<Tenancy>) -> Feed {
        let all = watcher::Config::default();
        let (plugins, plugin_changes) = reflect::<GatewayPlugin>(api(client, namespace), all.clone(), Kind::Plugins);
        let (routes, route_changes) = reflect::<AIModelRoute>(api(client, namespace), all, Kind::Routes);
        let (secrets, secret_changes) = reflect_secrets(api(client, namespace));
        let changes = stream::select_all([plugin_changes, route_changes, secret_changes]).boxed();
        Feed { stores: Stores { plugins, routes, secrets }, changes, tenancy }
    }

    /// Publishes the desired config once every watch has listed, then after
    /// every change that alters it. `changed` ticks on each publish, for
    /// the status controllers (a Secret may have appeared). Runs until the
    /// data plane goes away.
    pub async fn run(
        mut self,
        updates: watch::Sender<Option<ConfigUpdate>>,
        published: Arc<Mutex<Published>>,
        changed: watch::Sender<u64>,
    ) {
        let mut listed = [false; 3];
        let mut translator = Translator::new(self.tenancy.clone());
        loop {
            let change = tokio::select! {
                change = self.changes.next() => change,
                () = updates.closed() => return,
            };
            let Some(change) = change else { return };
            listed[change.kind as usize] |= change.listed;
            // A partial view would serve a config with routes missing.
            if !listed.iter().all(|l| *l) {
                continue;
            }
            // Take every change already waiting: one publish for a burst.
            while let Some(Some(change)) = self.changes.next().now_or_never() {
                listed[change.kind as usize] |= change.listed;
            }
            let Some((desired, generations)) = translator.next(&self.stores) else { continue };
            tracing::info!(
                revision = desired.revision,
                plugins = desired.plugins.len(),
                routes = desired.routes.len(),
                "publishing desired config"
            );
            published.lock().expect("published lock").by_revision.insert(desired.revision, Arc::new(generations));
            if updates.send(Some(ConfigUpdate::Desired(desired))).is_err() {
                return;
            }
            changed.send_modify(|n| *n += 1);
        }
    }
}

/// The API for `K` in one namespace, or in all.
pub(crate) fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as Resource>::DynamicType: Default,
{
    match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    }
}

fn reflect<K>(api: Api<K>, config: watcher::Config, kind: Kind) -> (Store<K>, BoxStream<'static, Change>)
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    <K as Resource>::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store();
    let events = watcher::watcher(api, config).default_backoff().reflect(writer);
    (reader, changes(events, kind).boxed())
}

/// Secret types no GatewayPlugin or AIModelRoute can use, and the largest in
/// a typical cluster (Helm keeps every release of a chart in one): the API
/// server leaves them out of the watch.
const UNUSED_SECRET_TYPES: &[&str] = &["helm.sh/release.v1", "kubernetes.io/service-account-token"];

/// The Secrets the feed may resolve references to, kept small: unused types
/// are not watched, and what is kept of each is its type and data (no
/// managed fields, no annotations, which for `kubectl apply` repeat the
/// data).
fn reflect_secrets(api: Api<Secret>) -> (Store<Secret>, BoxStream<'static, Change>) {
    let fields: Vec<String> = UNUSED_SECRET_TYPES.iter().map(|t| format!("type!={t}")).collect();
    let config = watcher::Config::default().fields(&fields.join(","));
    let (reader, writer) = reflector::store();
    let events = watcher::watcher(api, config).default_backoff().modify(slim_secret).reflect(writer);
    (reader, changes(events, Kind::Secrets).boxed())
}

fn slim_secret(secret: &mut Secret) {
    secret.metadata.managed_fields = None;
    secret.metadata.annotations = None;
    secret.metadata.labels = None;
}

fn changes<K: Resource>(
    events: impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    kind: Kind,
) -> impl Stream<Item = Change> + Send + 'static {
    events.filter_map(move |event| {
        let change = match event {
            Ok(Event::Apply(_) | Event::Delete(_)) => Some(Change { kind, listed: false }),
            // The store swaps in a whole new list at InitDone; nothing before it counts.
            Ok(Event::InitDone) => Some(Change { kind, listed: true }),
            Ok(Event::Init | Event::InitApply(_)) => None,
            Err(error) => {
                // The backoff retries; the store keeps the last list meanwhile.
                tracing::warn!(%error, "watch failed; retrying");
                None
            }
        };
        std::future::ready(change)
    })
}

/// Turns the watches' contents into desired configs, keeping each
/// resource's last good declaration: a resource whose new generation is
/// invalid or refers to something missing goes on being served as it was.
struct Translator {
    tenancy: Arc<Tenancy>,
    revision: u64,
    plugins: HashMap<ResourceKey, (i64, PluginDecl, Redactions)>,
    routes: HashMap<ResourceKey, (i64, RouteDecl, Redactions)>,
    last: Option<(Vec<PluginDecl>, Vec<RouteDecl>)>,
}

impl Translator {
    fn new(tenancy: Arc<Tenancy>) -> Translator {
        Translator { tenancy, revision: 0, plugins: HashMap::new(), routes: HashMap::new(), last: None }
    }

    /// The next desired config, or `None` if nothing the data plane sees has changed.
    fn next(&mut self, stores: &Stores) -> Option<(DesiredConfig, Generations)> {
        let mut generations = Generations::default();
        let plugin_objects = stores.plugins.state();
        let mut present = HashMap::new();
        for object in &plugin_objects {
            let key = object.key();
            present.insert(key.clone(), ());
            if let (Ok(decl), redactions) = translate::plugin_redacted(object, &stores.secrets, &self.tenancy) {
                self.plugins.insert(key, (generation(object.meta()), decl, redactions));
            }
        }
        self.plugins.retain(|key, _| present.contains_key(key));
        let mut plugins: Vec<PluginDecl> = self.plugins.values().map(|(_, d, _)| d.clone()).collect();
        plugins.sort_by(|a, b| a.key.cmp(&b.key));
        for (key, (generation, _, redactions)) in &self.plugins {
            generations.plugins.insert(key.clone(), *generation);
            generations.plugin_redactions.insert(key.clone(), redactions.clone());
        }

        let route_objects = stores.routes.state();
        let mut present = HashMap::new();
        for object in &route_objects {
            let key = object.key();
            present.insert(key.clone(), object.clone());
            let exists = |plugin: &ResourceKey| self.plugins.contains_key(plugin);
            if let (Ok(decl), redactions) = translate::route_redacted(object, &stores.secrets, &self.tenancy, exists) {
                self.routes.insert(key, (generation(object.meta()), decl, redactions));
            }
        }
        self.routes.retain(|key, _| present.contains_key(key));
        let candidates: Vec<(&AIModelRoute, &RouteDecl)> =
            self.routes.iter().map(|(key, (_, decl, _))| (present[key].as_ref(), decl)).collect();
        let conflicts = translate::model_conflicts(&candidates);
        let mut routes: Vec<RouteDecl> = self
            .routes
            .values()
            .filter(|(_, d, _)| !conflicts.contains_key(&d.key))
            .map(|(_, d, _)| d.clone())
            .collect();
        routes.sort_by(|a, b| a.key.cmp(&b.key));
        for (key, (generation, _, redactions)) in &self.routes {
            if !conflicts.contains_key(key) {
                generations.routes.insert(key.clone(), *generation);
                generations.route_redactions.insert(key.clone(), redactions.clone());
            }
        }

        if self.last.as_ref() == Some(&(plugins.clone(), routes.clone())) {
            return None;
        }
        self.last = Some((plugins.clone(), routes.clone()));
        self.revision += 1;
        Some((DesiredConfig { revision: self.revision, plugins, routes }, generations))
    }
}

pub fn generation(meta: &kube::api::ObjectMeta) -> i64 {
    meta.generation.unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};

    use super::*;

    /// Issue 11, finding 15: what the Secret cache keeps of each Secret.
    #[test]
    fn a_cached_secret_keeps_its_name_type_and_data_only() {
        let data = std::collections::BTreeMap::from([("key".to_string(), k8s_openapi::ByteString(b"v".to_vec()))]);
        let mut secret = Secret {
            metadata: ObjectMeta {
                name: Some("s".into()),
                namespace: Some("ns".into()),
                annotations: Some(
                    [("kubectl.kubernetes.io/last-applied-configuration".to_string(), "x".repeat(1 << 20))].into(),
                ),
                labels: Some([("a".to_string(), "b".to_string())].into()),
                managed_fields: Some(vec![ManagedFieldsEntry::default()]),
                ..Default::default()
            },
            type_: Some("Opaque".into()),
            data: Some(data.clone()),
            ..Default::default()
        };
        slim_secret(&mut secret);
        assert_eq!((secret.metadata.name.as_deref(), secret.metadata.namespace.as_deref()), (Some("s"), Some("ns")));
        assert_eq!((secret.type_.as_deref(), secret.data.as_ref()), (Some("Opaque"), Some(&data)));
        assert!(secret.metadata.annotations.is_none() && secret.metadata.labels.is_none());
        assert!(secret.metadata.managed_fields.is_none());
    }
}
