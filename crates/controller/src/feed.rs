//! The data plane's feed: watches GatewayPlugins, AIModelRoutes, MCPRoutes
//! and Secrets, and publishes the whole desired config whenever any of them
//! changes.
//!
//! Every replica runs this. The desired config is a function of what the
//! watches hold, so a restarted watch (a re-list after the apiserver comes
//! back) converges on the truth, deletions included, with no finalizers: the
//! only state outside the objects is this process's memory.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::stream::{self, BoxStream};
use futures_util::{FutureExt as _, Stream, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use sluice_api::{AIModelRoute, GatewayPlugin, MCPRoute};
use sluice_core::{ConfigUpdate, DesiredConfig, McpRouteDecl, PluginDecl, ResourceKey, RouteDecl};
use tokio::sync::watch;

use crate::secrets::{self, ReferencedSecrets};
use crate::{Tenancy, translate};
use sluice_core::Redactions;

/// What the watches hold, shared with the status controllers.
#[derive(Clone)]
pub struct Stores {
    pub plugins: Store<GatewayPlugin>,
    pub routes: Store<AIModelRoute>,
    pub mcp_routes: Store<MCPRoute>,
    pub secrets: Arc<ReferencedSecrets>,
    /// Events seen per watch (by [`Kind`]): what changed since a result
    /// computed from the stores, without looking at every object.
    versions: Arc<[AtomicU64; KINDS]>,
}

impl Stores {
    pub(crate) fn new(
        plugins: Store<GatewayPlugin>,
        routes: Store<AIModelRoute>,
        mcp_routes: Store<MCPRoute>,
        secrets: Arc<ReferencedSecrets>,
        versions: Arc<[AtomicU64; KINDS]>,
    ) -> Stores {
        Stores { plugins, routes, mcp_routes, secrets, versions }
    }

    /// Moves on whenever any store changes (after the store has).
    pub fn version(&self) -> u64 {
        self.versions.iter().map(|v| v.load(Ordering::Acquire)).sum::<u64>() + self.secrets.version()
    }

    /// Every Secret the resources name, by namespace and name.
    fn referenced_secrets(&self) -> HashSet<(String, String)> {
        let plugins = self.plugins.state();
        let routes = self.routes.state();
        let mcp_routes = self.mcp_routes.state();
        let from_plugins =
            plugins.iter().flat_map(|p| secrets::keys(&p.key().namespace, p.secret_names()).collect::<Vec<_>>());
        let from_routes =
            routes.iter().flat_map(|r| secrets::keys(&r.key().namespace, r.secret_names()).collect::<Vec<_>>());
        let from_mcp_routes =
            mcp_routes.iter().flat_map(|r| secrets::keys(&r.key().namespace, r.secret_names()).collect::<Vec<_>>());
        from_plugins.chain(from_routes).chain(from_mcp_routes).collect()
    }
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
    pub mcp_routes: HashMap<ResourceKey, i64>,
    pub mcp_route_redactions: HashMap<ResourceKey, Redactions>,
}

impl Published {
    /// The generations in `revision`. Older revisions are forgotten: the
    /// data plane only ever applies the newest config it has seen.
    pub fn generations(&mut self, revision: u64) -> Option<Arc<Generations>> {
        self.by_revision.retain(|r, _| *r >= revision);
        self.by_revision.get(&revision).cloned()
    }
}

/// How soon a Secret that could not be fetched is asked for again.
const SECRET_RETRY: Duration = Duration::from_secs(5);

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Which watch an event came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Plugins = 0,
    Routes = 1,
    Secrets = 2,
    McpRoutes = 3,
}

/// How many watches there are: one per [`Kind`].
pub(crate) const KINDS: usize = 4;

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
        let fields: Vec<String> = UNUSED_SECRET_TYPES.iter().map(|t| format!("type!={t}")).collect();
        // Every other Secret in scope, by metadata alone and only name and
        // version of that: [`ReferencedSecrets`] fetches the data of those
        // resources name.
        let secrets = watcher::Config::default().fields(&fields.join(","));
        Feed::from_watches(
            client,
            tenancy,
            watcher::watcher(api(client, namespace), all.clone()).default_backoff(),
            watcher::watcher(api(client, namespace), all.clone()).default_backoff(),
            watcher::watcher(api(client, namespace), all).default_backoff(),
            watcher::watcher(api::<PartialObjectMeta<Secret>>(client, namespace), secrets).default_backoff(),
        )
    }

    /// The feed over these watch streams (the tests' own, or the API
    /// server's); `client` fetches the data of the Secrets resources name.
    pub(crate) fn from_watches(
        client: &Client,
        tenancy: Arc<Tenancy>,
        plugins: impl Stream<Item = Result<Event<GatewayPlugin>, watcher::Error>> + Send + 'static,
        routes: impl Stream<Item = Result<Event<AIModelRoute>, watcher::Error>> + Send + 'static,
        mcp_routes: impl Stream<Item = Result<Event<MCPRoute>, watcher::Error>> + Send + 'static,
        secrets: impl Stream<Item = Result<Event<PartialObjectMeta<Secret>>, watcher::Error>> + Send + 'static,
    ) -> Feed {
        let versions = Arc::new([const { AtomicU64::new(0) }; KINDS]);
        let (plugins, plugin_changes) = reflect(plugins, Kind::Plugins, versions.clone());
        let (routes, route_changes) = reflect(routes, Kind::Routes, versions.clone());
        let (mcp_routes, mcp_route_changes) = reflect(mcp_routes, Kind::McpRoutes, versions.clone());
        let (secret_metadata, secret_changes) = reflect(secrets.modify(slim_metadata), Kind::Secrets, versions.clone());
        let secrets = Arc::new(ReferencedSecrets::new(client.clone(), secret_metadata));
        let changes = stream::select_all([plugin_changes, route_changes, mcp_route_changes, secret_changes]).boxed();
        Feed { stores: Stores::new(plugins, routes, mcp_routes, secrets, versions), changes, tenancy }
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
        let mut listed = [false; KINDS];
        let mut retry_secrets = None;
        let mut translator = Translator::new(self.tenancy.clone());
        loop {
            let change = tokio::select! {
                change = self.changes.next() => change,
                () = updates.closed() => return,
                // A Secret that could not be fetched is asked for again.
                () = sleep_until(retry_secrets) => Some(Change { kind: Kind::Secrets, listed: false }),
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
            let fetched = self.stores.secrets.sync(&self.stores.referenced_secrets(), true).await;
            retry_secrets = (!fetched).then(|| tokio::time::Instant::now() + SECRET_RETRY);
            let Some((desired, generations)) = translator.next(&self.stores) else { continue };
            tracing::info!(
                revision = desired.revision,
                plugins = desired.plugins.len(),
                routes = desired.routes.len(),
                mcp_routes = desired.mcp_routes.len(),
                "publishing desired config"
            );
            published.lock().by_revision.insert(desired.revision, Arc::new(generations));
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

/// A store of what `events` hold, and the changes they make to it.
fn reflect<K>(
    events: impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    kind: Kind,
    versions: Arc<[AtomicU64; KINDS]>,
) -> (Store<K>, BoxStream<'static, Change>)
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    <K as Resource>::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store();
    (reader, changes(events.reflect(writer), kind, versions).boxed())
}

/// Secret types no GatewayPlugin, AIModelRoute or MCPRoute can use, and the
/// largest in a typical cluster (Helm keeps every release of a chart in
/// one): the API server leaves them out of the watch.
const UNUSED_SECRET_TYPES: &[&str] = &["helm.sh/release.v1", "kubernetes.io/service-account-token"];

fn slim_metadata(secret: &mut PartialObjectMeta<Secret>) {
    secret.metadata.managed_fields = None;
    secret.metadata.annotations = None;
    secret.metadata.labels = None;
}

fn changes<K: Resource>(
    events: impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    kind: Kind,
    versions: Arc<[AtomicU64; KINDS]>,
) -> impl Stream<Item = Change> + Send + 'static {
    let mut seen: HashMap<(String, String), String> = HashMap::new();
    let mut unavailable = false;
    events.filter_map(move |event| {
        let change = match event {
            // Our own status writes come back as events too: one per route,
            // 10,000 at a time. Only a new spec (or object) is a change.
            Ok(Event::Apply(object)) => {
                let signature = signature(object.meta());
                (seen.insert(ref_key(object.meta()), signature.clone()) != Some(signature))
                    .then_some(Change { kind, listed: false })
            }
            Ok(Event::InitApply(object)) => {
                seen.insert(ref_key(object.meta()), signature(object.meta()));
                None
            }
            Ok(Event::Delete(object)) => {
                seen.remove(&ref_key(object.meta()));
                Some(Change { kind, listed: false })
            }
            // The store swaps in a whole new list at InitDone; nothing before it counts.
            Ok(Event::InitDone) => {
                unavailable = false;
                Some(Change { kind, listed: true })
            }
            Ok(Event::Init) => None,
            // MCPRoute is newer than the other kinds: a cluster upgraded
            // without its CRD (Helm leaves CRDs alone on upgrade) or RBAC
            // would otherwise never complete the first list, and the gateway
            // serve nothing. It serves the rest, with no MCP routes, until
            // the list succeeds (the backoff keeps trying).
            Err(error) if kind == Kind::McpRoutes && kind_unavailable(&error) => {
                if unavailable {
                    None
                } else {
                    unavailable = true;
                    tracing::warn!(%error, "cannot list MCPRoutes (is the CRD installed, and the RBAC granted?); \
                        serving without MCP routes");
                    Some(Change { kind, listed: true })
                }
            }
            Err(error) => {
                // The backoff retries; the store keeps the last list meanwhile.
                tracing::warn!(%error, "watch failed; retrying");
                None
            }
        };
        if change.is_some() {
            // The store already holds this event: it is written as events pass.
            versions[kind as usize].fetch_add(1, Ordering::AcqRel);
        }
        std::future::ready(change)
    })
}

/// Whether a watch failed because the kind is not there (no CRD) or not
/// ours to read (no RBAC), rather than for a moment.
fn kind_unavailable(error: &watcher::Error) -> bool {
    matches!(error, watcher::Error::InitialListFailed(kube::Error::Api(status)) if matches!(status.code, 403 | 404))
}

fn ref_key(meta: &kube::api::ObjectMeta) -> (String, String) {
    (meta.namespace.clone().unwrap_or_default(), meta.name.clone().unwrap_or_default())
}

/// What a translation reads of an object's identity and version: its uid,
/// and its generation (which only the spec moves), or its resourceVersion
/// for kinds without one (Secrets, whose data is their spec).
fn signature(meta: &kube::api::ObjectMeta) -> String {
    let uid = meta.uid.as_deref().unwrap_or_default();
    match meta.generation {
        Some(generation) => format!("{uid}/{generation}"),
        None => format!("{uid}/{}", meta.resource_version.as_deref().unwrap_or_default()),
    }
}

/// Turns the watches' contents into desired configs, keeping each
/// resource's last good declaration: a resource whose new generation is
/// invalid or refers to something missing goes on being served as it was.
///
/// Only what changed is translated again: an object whose [`signature`]
/// is the one last translated, with the same Secrets (and, for a route, the
/// same set of plugins), would translate the same way. So a change to one
/// of 10,000 routes costs one translation, not 10,000.
struct Translator {
    tenancy: Arc<Tenancy>,
    revision: u64,
    plugins: HashMap<ResourceKey, (i64, PluginDecl, Redactions)>,
    routes: HashMap<ResourceKey, (i64, RouteDecl, Redactions)>,
    mcp_routes: HashMap<ResourceKey, (i64, McpRouteDecl, Redactions)>,
    /// The [`signature`] last translated, per object.
    translated_plugins: HashMap<ResourceKey, String>,
    translated_routes: HashMap<ResourceKey, String>,
    translated_mcp_routes: HashMap<ResourceKey, String>,
    /// The Secrets store's version at the last translation.
    secrets_version: Option<u64>,
    last: Option<(Vec<PluginDecl>, Vec<RouteDecl>, Vec<McpRouteDecl>)>,
    /// Translations done, for the tests.
    translations: usize,
}

impl Translator {
    fn new(tenancy: Arc<Tenancy>) -> Translator {
        Translator {
            tenancy,
            revision: 0,
            plugins: HashMap::new(),
            routes: HashMap::new(),
            mcp_routes: HashMap::new(),
            translated_plugins: HashMap::new(),
            translated_routes: HashMap::new(),
            translated_mcp_routes: HashMap::new(),
            secrets_version: None,
            last: None,
            translations: 0,
        }
    }

    /// The next desired config, or `None` if nothing the data plane sees has changed.
    fn next(&mut self, stores: &Stores) -> Option<(DesiredConfig, Generations)> {
        let secrets_version = stores.secrets.version();
        let secrets_changed = self.secrets_version.replace(secrets_version) != Some(secrets_version);
        let mut generations = Generations::default();
        let plugin_objects = stores.plugins.state();
        let mut present = HashMap::new();
        let plugin_keys_before = self.plugins.len();
        let mut plugins_added = false;
        for object in &plugin_objects {
            let key = object.key();
            present.insert(key.clone(), ());
            let version = signature(&object.metadata);
            if !secrets_changed && self.translated_plugins.get(&key) == Some(&version) {
                continue;
            }
            self.translations += 1;
            self.translated_plugins.insert(key.clone(), version);
            if let (Ok(decl), redactions) = translate::plugin_redacted(object, &*stores.secrets, &self.tenancy) {
                let old = self.plugins.insert(key, (generation(object.meta()), decl, redactions));
                plugins_added |= old.is_none();
            }
        }
        self.plugins.retain(|key, _| present.contains_key(key));
        self.translated_plugins.retain(|key, _| present.contains_key(key));
        // Routes refer to plugins by key: a plugin come or gone changes them.
        let plugin_set_changed = plugins_added || self.plugins.len() != plugin_keys_before;
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
            let version = signature(&object.metadata);
            if !secrets_changed && !plugin_set_changed && self.translated_routes.get(&key) == Some(&version) {
                continue;
            }
            self.translations += 1;
            self.translated_routes.insert(key.clone(), version);
            let exists = |plugin: &ResourceKey| self.plugins.contains_key(plugin);
            if let (Ok(decl), redactions) = translate::route_redacted(object, &*stores.secrets, &self.tenancy, exists) {
                self.routes.insert(key, (generation(object.meta()), decl, redactions));
            }
        }
        self.routes.retain(|key, _| present.contains_key(key));
        self.translated_routes.retain(|key, _| present.contains_key(key));
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

        let mcp_routes = self.next_mcp_routes(stores, secrets_changed || plugin_set_changed, &mut generations);

        let next = (plugins, routes, mcp_routes);
        if self.last.as_ref() == Some(&next) {
            return None;
        }
        self.last = Some(next.clone());
        self.revision += 1;
        let (plugins, routes, mcp_routes) = next;
        Some((DesiredConfig { revision: self.revision, plugins, routes, mcp_routes }, generations))
    }

    /// The MCP routes to serve, as [`Translator::next`] does routes: each
    /// translated again only when it, the Secrets or the set of plugins
    /// changed; the last good declaration kept; those that lose their path
    /// to an older route left out (their status says why).
    fn next_mcp_routes(
        &mut self,
        stores: &Stores,
        everything_changed: bool,
        generations: &mut Generations,
    ) -> Vec<McpRouteDecl> {
        let objects = stores.mcp_routes.state();
        let mut present = HashMap::new();
        for object in &objects {
            let key = object.key();
            present.insert(key.clone(), object.clone());
            let version = signature(&object.metadata);
            if !everything_changed && self.translated_mcp_routes.get(&key) == Some(&version) {
                continue;
            }
            self.translations += 1;
            self.translated_mcp_routes.insert(key.clone(), version);
            let exists = |plugin: &ResourceKey| self.plugins.contains_key(plugin);
            if let (Ok(decl), redactions) =
                translate::mcp_route_redacted(object, &*stores.secrets, &self.tenancy, exists)
            {
                self.mcp_routes.insert(key, (generation(object.meta()), decl, redactions));
            }
        }
        self.mcp_routes.retain(|key, _| present.contains_key(key));
        self.translated_mcp_routes.retain(|key, _| present.contains_key(key));
        let candidates: Vec<(&MCPRoute, &McpRouteDecl)> =
            self.mcp_routes.iter().map(|(key, (_, decl, _))| (present[key].as_ref(), decl)).collect();
        let conflicts = translate::path_conflicts(&candidates);
        let mut routes: Vec<McpRouteDecl> = self
            .mcp_routes
            .values()
            .filter(|(_, d, _)| !conflicts.contains_key(&d.key))
            .map(|(_, d, _)| d.clone())
            .collect();
        routes.sort_by(|a, b| a.key.cmp(&b.key));
        for (key, (generation, _, redactions)) in &self.mcp_routes {
            if !conflicts.contains_key(key) {
                generations.mcp_routes.insert(key.clone(), *generation);
                generations.mcp_route_redactions.insert(key.clone(), redactions.clone());
            }
        }
        routes
    }
}

pub fn generation(meta: &kube::api::ObjectMeta) -> i64 {
    meta.generation.unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(i: usize, generation: i64, model: &str) -> AIModelRoute {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "sluice.dev/v1alpha1", "kind": "AIModelRoute",
            "metadata": {"name": format!("r{i}"), "namespace": "team", "generation": generation,
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"models": [model], "backends": [{"url": "http://upstream.example:1/v1"}]}
        }))
        .unwrap()
    }

    /// A change to one of many routes translates that route, not all of
    /// them, so the work grows with the number of routes, not with its
    /// square; a Secret change translates everything again.
    #[tokio::test]
    async fn only_changed_objects_are_translated_again() {
        let (plugins, _plugin_writer) = reflector::store::<GatewayPlugin>();
        let (routes, mut route_writer) = reflector::store::<AIModelRoute>();
        let (secret_metadata, _secret_writer) = reflector::store();
        // Never connected: these routes name no Secret.
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let secrets = Arc::new(ReferencedSecrets::new(Client::try_from(config).unwrap(), secret_metadata));
        let (mcp_routes, _mcp_route_writer) = reflector::store::<MCPRoute>();
        let versions = Arc::new([const { AtomicU64::new(0) }; KINDS]);
        let stores = Stores { plugins, routes, mcp_routes, secrets: secrets.clone(), versions };
        let count = 2_000;
        for i in 0..count {
            route_writer.apply_watcher_event(&Event::Apply(route(i, 1, &format!("m{i}"))));
        }
        let mut translator = Translator::new(Arc::new(Tenancy::default().resolved("team")));
        let (first, _) = translator.next(&stores).unwrap();
        assert_eq!((first.routes.len(), translator.translations), (count, count));

        route_writer.apply_watcher_event(&Event::Apply(route(7, 2, "renamed")));
        let (second, generations) = translator.next(&stores).unwrap();
        assert_eq!(translator.translations, count + 1);
        assert!(second.routes.iter().any(|r| r.models == ["renamed"]));
        assert_eq!(generations.routes.len(), count);
        // Nothing changed: nothing translated, nothing published.
        assert!(translator.next(&stores).is_none());
        assert_eq!(translator.translations, count + 1);

        secrets.touch();
        assert!(translator.next(&stores).is_none());
        assert_eq!(translator.translations, 2 * count + 1);
    }

    fn mcp_route(namespace: &str, created: &str, path: &str) -> MCPRoute {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "sluice.dev/v1alpha1", "kind": "MCPRoute",
            "metadata": {"name": "tools", "namespace": namespace, "generation": 1, "creationTimestamp": created},
            "spec": {"path": path, "servers": [{"name": "tools", "url": "http://tools.example:1/mcp"}]}
        }))
        .unwrap()
    }

    /// An MCPRoute whose namespace may not claim its path is not served,
    /// and does not take the path from the namespace that may, older
    /// though it is.
    #[tokio::test]
    async fn an_mcp_path_goes_to_the_namespace_granted_it_whatever_the_age() {
        let (plugins, _plugin_writer) = reflector::store::<GatewayPlugin>();
        let (routes, _route_writer) = reflector::store::<AIModelRoute>();
        let (secret_metadata, _secret_writer) = reflector::store();
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let secrets = Arc::new(ReferencedSecrets::new(Client::try_from(config).unwrap(), secret_metadata));
        let (mcp_routes, mut mcp_route_writer) = reflector::store::<MCPRoute>();
        let versions = Arc::new([const { AtomicU64::new(0) }; KINDS]);
        let stores = Stores { plugins, routes, mcp_routes, secrets, versions };
        mcp_route_writer.apply_watcher_event(&Event::Apply(mcp_route("squatter", "2026-01-01T00:00:00Z", "/mcp/a")));
        mcp_route_writer.apply_watcher_event(&Event::Apply(mcp_route("owner", "2026-02-01T00:00:00Z", "/mcp/a/x")));
        let tenancy = Tenancy { mcp_path_claims: vec!["owner=/mcp/a".parse().unwrap()], ..Tenancy::default() };
        let mut translator = Translator::new(Arc::new(tenancy.resolved("gateway")));
        let (desired, generations) = translator.next(&stores).unwrap();
        let served: Vec<_> = desired.mcp_routes.iter().map(|r| r.key.to_string()).collect();
        assert_eq!(served, ["owner/tools"]);
        assert_eq!(generations.mcp_routes.keys().map(ToString::to_string).collect::<Vec<_>>(), ["owner/tools"]);

        // Once the squatter's route is on the owner's very path it is still not served.
        mcp_route_writer.apply_watcher_event(&Event::Apply(mcp_route("squatter", "2026-01-01T00:00:00Z", "/mcp/a/x")));
        let served: Vec<_> = match translator.next(&stores) {
            Some((desired, _)) => desired.mcp_routes.iter().map(|r| r.key.to_string()).collect(),
            None => served,
        };
        assert_eq!(served, ["owner/tools"]);
    }

    /// The leader's status writes come back to every replica's watch; only
    /// a new generation (or object) makes a pass, or every write would make
    /// another.
    #[tokio::test]
    async fn status_writes_are_not_changes() {
        let with_status = |generation: i64, version: &str, loaded: &str| {
            let mut route = route(1, generation, "m");
            route.metadata.resource_version = Some(version.into());
            route.metadata.uid = Some("u1".into());
            route.status = Some(sluice_api::AIModelRouteStatus { loaded: Some(loaded.into()), ..Default::default() });
            route
        };
        let events = vec![
            Ok(Event::Init),
            Ok(Event::InitApply(with_status(1, "10", "0/1"))),
            Ok(Event::InitDone),
            Ok(Event::Apply(with_status(1, "11", "1/1"))),
            Ok(Event::Apply(with_status(2, "12", "1/1"))),
            Ok(Event::Apply(with_status(2, "13", "0/1"))),
            Ok(Event::Delete(with_status(2, "14", "0/1"))),
        ];
        let versions = Arc::new([const { AtomicU64::new(0) }; KINDS]);
        let changes: Vec<Change> = changes(stream::iter(events), Kind::Routes, versions.clone()).collect().await;
        let listed: Vec<bool> = changes.iter().map(|c| c.listed).collect();
        assert_eq!(listed, [true, false, false], "the list, generation 2, the deletion");
        assert_eq!(versions[Kind::Routes as usize].load(Ordering::Acquire), 3);
    }
}
