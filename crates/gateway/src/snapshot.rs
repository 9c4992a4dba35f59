//! One immutable version of everything the data plane serves, and how the
//! next one is built from the desired config and the one before it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::HeaderValue;
use serde::Serialize;
use std::collections::BTreeMap;

use sluice_core::{
    ApiKeySource, DesiredConfig, FailurePolicy, LoadState, PluginDecl, PluginSource, PullPolicy, RegistryCredentials,
    ResourceError, ResourceKey, RouteDecl,
};
use sluice_oci::{PullCredentials, Reference, Registry};
use sluice_runtime::{ConfiguredPlugin, Limits, Runtime};

#[derive(Default)]
pub struct Snapshot {
    pub generation: u64,
    routes: Vec<Arc<Route>>,
    by_model: HashMap<String, Arc<Route>>,
    plugins: HashMap<ResourceKey, Arc<LoadedPlugin>>,
}

pub struct LoadedPlugin {
    pub decl: PluginDecl,
    pub plugin: ConfiguredPlugin,
}

pub struct Route {
    pub decl: RouteDecl,
    pub chain: Vec<Arc<LoadedPlugin>>,
    pub backends: Vec<Backend>,
    next_backend: AtomicUsize,
}

pub struct Backend {
    pub url: String,
    pub model: Option<String>,
    /// The `Authorization` value to send, already resolved.
    pub authorization: Option<HeaderValue>,
}

impl Snapshot {
    pub fn route_for(&self, model: &str) -> Option<&Arc<Route>> {
        self.by_model.get(model)
    }

    pub fn routes(&self) -> &[Arc<Route>] {
        &self.routes
    }
}

impl Route {
    /// Backends in the order to try them: round-robin over requests, the
    /// rest in turn as fallbacks.
    pub fn backends_in_order(&self) -> impl Iterator<Item = &Backend> {
        let start = self.next_backend.fetch_add(1, Ordering::Relaxed) % self.backends.len().max(1);
        self.backends.iter().cycle().skip(start).take(self.backends.len())
    }
}

/// What building a snapshot found wrong; everything else was applied.
#[derive(Clone, Debug, Default, Serialize)]
pub struct BuildReport {
    pub errors: Vec<ResourceError>,
    /// Each declared plugin's state, for a config source that reports status.
    #[serde(skip)]
    pub plugins: BTreeMap<ResourceKey, LoadState>,
    /// Each declared route's state.
    #[serde(skip)]
    pub routes: BTreeMap<ResourceKey, LoadState>,
    /// Some failure may go away by itself (a registry that was
    /// unreachable): the same config is worth building again later.
    #[serde(skip)]
    pub retry: bool,
}

/// Why a plugin could not be loaded.
struct LoadFailure {
    message: String,
    transient: bool,
    /// A CamelCase reason for status conditions.
    reason: &'static str,
}

impl LoadFailure {
    fn permanent(message: impl Into<String>) -> Self {
        Self { message: message.into(), transient: false, reason: "LoadFailed" }
    }
}

/// Builds the next snapshot. Each resource stands alone: a plugin or route
/// that fails keeps its last good version from `previous` (if it had one)
/// and is reported, and the rest is applied.
pub async fn build(
    runtime: &Runtime,
    registry: Option<&Registry>,
    desired: &DesiredConfig,
    previous: &Snapshot,
) -> (Snapshot, BuildReport) {
    let mut errors = Vec::new();
    let mut retry = false;

    let loads = desired.plugins.iter().map(|decl| load_plugin(runtime, registry, decl, previous));
    let loaded = futures_util::future::join_all(loads).await;
    let mut plugins = HashMap::new();
    let mut plugin_states = BTreeMap::new();
    for (decl, result) in desired.plugins.iter().zip(loaded) {
        match result {
            Ok(plugin) => {
                plugin_states.insert(decl.key.clone(), LoadState::ready(Some(plugin.plugin.digest().to_string())));
                plugins.insert(decl.key.clone(), plugin);
            }
            Err(LoadFailure { message, transient, reason }) => {
                retry |= transient;
                let resource = format!("GatewayPlugin {}", decl.key);
                match previous.plugins.get(&decl.key) {
                    Some(last_good) => {
                        let digest = last_good.plugin.digest().to_string();
                        errors.push(ResourceError::new(
                            resource,
                            format!("{message}; still serving the last good version {digest}"),
                        ));
                        plugin_states.insert(decl.key.clone(), LoadState::failed(reason, message, Some(digest)));
                        plugins.insert(decl.key.clone(), last_good.clone());
                    }
                    None => {
                        plugin_states.insert(decl.key.clone(), LoadState::failed(reason, &message, None));
                        errors.push(ResourceError::new(resource, message));
                    }
                }
            }
        }
    }

    let conflicts = desired.conflicts();
    let previous_routes: HashMap<&ResourceKey, &Arc<Route>> =
        previous.routes.iter().map(|r| (&r.decl.key, r)).collect();
    let mut routes = Vec::new();
    let mut route_states = BTreeMap::new();
    for decl in &desired.routes {
        let resource = format!("AIModelRoute {}", decl.key);
        if let Some(conflict) = conflicts.iter().find(|c| c.resource == resource) {
            route_states.insert(decl.key.clone(), LoadState::failed("ModelConflict", &conflict.message, None));
            continue;
        }
        match build_route(decl, &plugins) {
            Ok(route) => {
                route_states.insert(decl.key.clone(), LoadState::ready(None));
                routes.push(Arc::new(route));
            }
            Err(message) => match previous_routes.get(&decl.key) {
                Some(last_good) => {
                    errors
                        .push(ResourceError::new(resource, format!("{message}; still serving its last good version")));
                    route_states.insert(decl.key.clone(), LoadState::failed("ChainNotReady", message, None));
                    routes.push(Arc::clone(last_good));
                }
                None => {
                    route_states.insert(decl.key.clone(), LoadState::failed("ChainNotReady", &message, None));
                    errors.push(ResourceError::new(resource, message));
                }
            },
        }
    }
    errors.extend(conflicts);

    let mut by_model = HashMap::new();
    for route in &routes {
        for model in &route.decl.models {
            // A last-good route may claim a model a newer route took over; the newer wins.
            by_model.entry(model.clone()).or_insert_with(|| route.clone());
        }
    }
    // Only plugins some route uses need to stay loaded, but all are kept so
    // their last good versions survive a route edit.
    let snapshot = Snapshot { generation: previous.generation + 1, routes, by_model, plugins };
    (snapshot, BuildReport { errors, plugins: plugin_states, routes: route_states, retry })
}

async fn load_plugin(
    runtime: &Runtime,
    registry: Option<&Registry>,
    decl: &PluginDecl,
    previous: &Snapshot,
) -> Result<Arc<LoadedPlugin>, LoadFailure> {
    let bytes = match &decl.source {
        PluginSource::File(path) => tokio::fs::read(path)
            .await
            .map_err(|e| LoadFailure::permanent(format!("reading {}: {e}", path.display())))?,
        PluginSource::Oci { reference, pull_policy, credentials } => {
            pull(registry, reference, *pull_policy, credentials.as_ref(), decl).await?
        }
    };
    let digest = sluice_runtime::digest_of(&bytes);
    // Same declaration, same bytes: the loaded version is still right.
    if let Some(last) = previous.plugins.get(&decl.key)
        && last.decl == *decl
        && last.plugin.digest() == digest
    {
        return Ok(last.clone());
    }
    let module = runtime.load(bytes, decl.sha256.as_deref()).await.map_err(|e| {
        let reason =
            if matches!(e, sluice_runtime::LoadError::DigestMismatch { .. }) { "DigestMismatch" } else { "LoadFailed" };
        LoadFailure { reason, ..LoadFailure::permanent(e.to_string()) }
    })?;
    let limits = Limits { timeout: decl.timeout, max_memory_bytes: decl.max_memory_bytes };
    let plugin = module
        .configure(&decl.key.to_string(), &decl.config, limits, decl.isolation)
        .await
        .map_err(|e| LoadFailure::permanent(e.to_string()))?;
    tracing::info!(plugin = %decl.key, source = %decl.source, digest = %module.digest(), "plugin loaded");
    Ok(Arc::new(LoadedPlugin { decl: decl.clone(), plugin }))
}

/// Fetches an OCI plugin's module, verified against the pin if there is one.
async fn pull(
    registry: Option<&Registry>,
    reference: &str,
    policy: PullPolicy,
    credentials: Option<&RegistryCredentials>,
    decl: &PluginDecl,
) -> Result<Vec<u8>, LoadFailure> {
    let registry = registry.ok_or_else(|| LoadFailure::permanent("OCI sources need a registry client"))?;
    let parsed: Reference = reference.parse().map_err(|e: sluice_oci::OciError| LoadFailure {
        reason: "InvalidReference",
        ..LoadFailure::permanent(e.to_string())
    })?;
    let policy = match policy {
        PullPolicy::IfNotPresent => sluice_oci::PullPolicy::IfNotPresent,
        PullPolicy::Always => sluice_oci::PullPolicy::Always,
    };
    let credentials = credentials.map(|c| match c {
        RegistryCredentials::Basic { username, password } => {
            PullCredentials::Basic { username: username.clone(), password: password.expose().to_string() }
        }
        RegistryCredentials::DockerConfigJson(json) => PullCredentials::DockerConfigJson(json.expose().to_string()),
    });
    match registry.pull_as(&parsed, policy, decl.sha256.as_deref(), credentials.as_ref()).await {
        Ok(pulled) => {
            tracing::debug!(plugin = %decl.key, %reference, manifest = %pulled.manifest_digest, origin = ?pulled.origin, "module pulled");
            Ok(pulled.module.to_vec())
        }
        Err(error) => Err(LoadFailure {
            transient: error.is_transient(),
            reason: if matches!(error, sluice_oci::OciError::DigestMismatch { .. }) {
                "DigestMismatch"
            } else {
                "PullFailed"
            },
            message: format!("pulling {reference}: {error}"),
        }),
    }
}

fn build_route(decl: &RouteDecl, plugins: &HashMap<ResourceKey, Arc<LoadedPlugin>>) -> Result<Route, String> {
    let mut chain: Vec<Arc<LoadedPlugin>> = decl
        .plugins
        .iter()
        .map(|key| plugins.get(key).cloned().ok_or_else(|| format!("plugin {key} is not loaded")))
        .collect::<Result<_, _>>()?;
    // Auth plugins first; the rest keep the route's order (a stable sort).
    chain.sort_by_key(|plugin| plugin.decl.phase);
    let backends = decl
        .backends
        .iter()
        .map(|b| {
            let authorization = b.api_key.as_ref().map(resolve_api_key).transpose()?;
            Ok(Backend { url: b.url.clone(), model: b.model.clone(), authorization })
        })
        .collect::<Result<_, String>>()?;
    Ok(Route { decl: decl.clone(), chain, backends, next_backend: AtomicUsize::new(0) })
}

fn resolve_api_key(source: &ApiKeySource) -> Result<HeaderValue, String> {
    let key = match source {
        ApiKeySource::Env(var) => std::env::var(var).map_err(|_| format!("environment variable {var} is not set"))?,
        ApiKeySource::File(path) => {
            std::fs::read_to_string(path).map_err(|e| format!("reading API key file {}: {e}", path.display()))?
        }
        ApiKeySource::Value(secret) => secret.expose().to_string(),
    };
    let mut value = HeaderValue::from_str(&format!("Bearer {}", key.trim()))
        .map_err(|_| "the API key holds characters not allowed in a header".to_string())?;
    value.set_sensitive(true);
    Ok(value)
}

/// The admin view of a snapshot.
#[derive(Serialize)]
pub struct SnapshotView {
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
}

#[derive(Serialize)]
struct BackendView {
    url: String,
    model: Option<String>,
    #[serde(rename = "apiKey")]
    api_key: bool,
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
}

impl Snapshot {
    pub fn view(&self) -> SnapshotView {
        let mut plugins: Vec<_> = self
            .plugins
            .values()
            .map(|p| {
                use sluice_runtime::Hooks;
                let hooks = p.plugin.hooks();
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
                    digest: p.plugin.digest().to_string(),
                    failure_policy: p.decl.failure_policy,
                    hooks: names,
                    isolation: p.decl.isolation,
                    timeout_ms: p.decl.timeout.as_millis(),
                    max_memory_mi_b: p.decl.max_memory_bytes / (1024 * 1024),
                }
            })
            .collect();
        plugins.sort_by(|a, b| a.name.cmp(&b.name));
        let routes = self
            .routes
            .iter()
            .map(|r| RouteView {
                name: r.decl.key.to_string(),
                models: r.decl.models.clone(),
                backends: r
                    .backends
                    .iter()
                    .map(|b| BackendView {
                        url: b.url.clone(),
                        model: b.model.clone(),
                        api_key: b.authorization.is_some(),
                    })
                    .collect(),
                plugins: r.chain.iter().map(|p| p.decl.key.to_string()).collect(),
            })
            .collect();
        SnapshotView { generation: self.generation, routes, plugins }
    }
}
