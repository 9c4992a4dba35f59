//! One immutable version of everything the data plane serves, and how the
//! next one is built from the desired config and the one before it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Uri};
use serde::Serialize;
use sluice_core::config::Endpoints;
use sluice_core::{
    ApiError, ApiKeySource, BackendPolicy, BackendTimeouts, Condition, DesiredConfig, FailurePolicy, LoadState, Phase,
    PluginDecl, PluginSource, Provider, Redactions, RegistryCredentials, ResourceError, ResourceKey, RouteDecl,
    VerifyKeys, reason,
};
use sluice_oci::{PublicKeys, PullCredentials, PullPolicy, Reference, Registry};
use sluice_runtime::{ConfiguredPlugin, Hooks, Limits, PluginError, PluginInstance, Runtime};
use sluice_telemetry::metrics::ResultLabels;
use sluice_telemetry::{Label, PluginId};

use crate::backend_api::Adapter;
use crate::balance::{Balancer, Budget, Health, now_ms};
use crate::target::Target;
use crate::upstream::UpstreamClient;

#[derive(Default)]
pub struct Snapshot {
    pub generation: u64,
    routes: Vec<Arc<Route>>,
    /// Each model's route, and the model's name as metrics label it.
    by_model: HashMap<String, (Arc<Route>, Label)>,
    plugins: HashMap<ResourceKey, Arc<LoadedPlugin>>,
    /// The MCP routes served, by path.
    mcp: HashMap<String, Arc<McpRoute>>,
}

/// A declared plugin, loaded and configured.
pub struct LoadedPlugin {
    pub decl: PluginDecl,
    pub configured: ConfiguredPlugin,
    /// How metrics, logs and spans name this version.
    pub id: Arc<PluginId>,
}

pub struct Route {
    pub decl: RouteDecl,
    /// `namespace/name`, as metrics and logs name it.
    pub label: Label,
    pub chain: Vec<Arc<LoadedPlugin>>,
    /// The endpoints it serves: those its declaration and every plugin of
    /// its chain name.
    pub endpoints: Endpoints,
    pub backends: Vec<Backend>,
    pub(crate) balancer: Balancer,
    pub(crate) budget: Budget,
}

/// An MCP route, built for serving (`crate::mcp` serves it).
pub struct McpRoute {
    pub decl: sluice_core::McpRouteDecl,
    /// `namespace/name`, as metrics and logs name it.
    pub label: Label,
    pub chain: Vec<Arc<LoadedPlugin>>,
    pub servers: Vec<McpServer>,
}

/// One of an MCP route's servers.
pub struct McpServer {
    pub name: String,
    pub url: String,
    pub uri: Uri,
    /// `Bearer <apiKey>`, if it has one.
    pub credential: Option<HeaderValue>,
    pub timeout: Duration,
    pub client: UpstreamClient,
}

impl McpRoute {
    pub fn server(&self, name: &str) -> Option<&McpServer> {
        self.servers.iter().find(|s| s.name == name)
    }

    /// The largest message read from a client or a server: the route's,
    /// within the gateway's body limit.
    pub fn limit(&self, max_body_bytes: usize) -> usize {
        self.decl.limits.max_message_bytes.min(max_body_bytes)
    }
}

pub struct Backend {
    pub url: String,
    /// The URL, as metrics and logs name the backend.
    pub label: Label,
    pub model: Option<String>,
    pub provider: Provider,
    /// The header carrying the API key (`Authorization: Bearer …`, or
    /// Anthropic's `x-api-key`), already resolved.
    pub credential: Option<(HeaderName, HeaderValue)>,
    pub timeouts: BackendTimeouts,
    /// A client of its own, for its TLS settings or connect timeout; else
    /// the gateway's shared one.
    pub client: Option<UpstreamClient>,
    pub health: Arc<Health>,
    pub target: Target,
}

impl Snapshot {
    pub fn route_for(&self, model: &str) -> Option<&Arc<Route>> {
        self.by_model.get(model).map(|(route, _)| route)
    }

    /// The route serving `model`, and the model's label (one shared value
    /// per model, so telemetry can tell label sets apart by address).
    pub fn routed(&self, model: &str) -> Option<(&Arc<Route>, &Label)> {
        self.by_model.get(model).map(|(route, label)| (route, label))
    }

    pub fn mcp_route(&self, path: &str) -> Option<&Arc<McpRoute>> {
        self.mcp.get(path)
    }

    pub fn routes(&self) -> &[Arc<Route>] {
        &self.routes
    }

    pub fn plugins(&self) -> &HashMap<ResourceKey, Arc<LoadedPlugin>> {
        &self.plugins
    }

    /// Each route's backends out of rotation now, for the load report.
    pub fn ejected(&self) -> BTreeMap<ResourceKey, Vec<String>> {
        let now = now_ms();
        self.routes
            .iter()
            .filter_map(|route| {
                let out: Vec<String> = route
                    .backends
                    .iter()
                    .filter(|b| b.health.ejected_for(now).is_some())
                    .map(|b| b.label.to_string())
                    .collect();
                (!out.is_empty()).then(|| (route.decl.key.clone(), out))
            })
            .collect()
    }
}

impl LoadedPlugin {
    pub fn name(&self) -> &str {
        self.configured.name()
    }

    pub fn digest(&self) -> &str {
        self.configured.digest()
    }

    pub fn hooks(&self) -> Hooks {
        self.configured.hooks()
    }

    pub async fn instance(&self) -> Result<PluginInstance, PluginError> {
        self.configured.instance().await
    }

    /// The failure policy: a failed plugin fails the request (`Closed`) or
    /// is skipped (`Open`).
    pub fn on_failure(&self, error: PluginError) -> Result<(), ApiError> {
        if let PluginError::Overloaded(_) = error {
            // The plugin did not run: a 503, never skipped, whatever the policy.
            return Err(ApiError::overloaded(format!("plugin {} {error}", self.name())));
        }
        match self.decl.failure_policy {
            FailurePolicy::Closed if matches!(error, PluginError::StateUnavailable(_)) => {
                Err(ApiError::state_unavailable(self.name(), error))
            }
            FailurePolicy::Closed => Err(ApiError::plugin_failed(self.name(), error)),
            FailurePolicy::Open => {
                tracing::warn!(plugin = self.name(), %error, "plugin failed; skipped (failurePolicy: Open)");
                Ok(())
            }
        }
    }
}

impl Route {
    /// Whether the chain starts with an auth phase (Auth plugins sort first).
    pub fn has_auth(&self) -> bool {
        self.chain.first().is_some_and(|p| p.decl.phase == Phase::Auth)
    }

    /// Whether the route's retry policy or a fallback names `condition`.
    pub fn wants(&self, condition: Condition) -> bool {
        self.decl.retry.on.contains(condition) || self.decl.fallbacks.iter().any(|f| f.on.contains(condition))
    }

    /// The backends to try for one request, best first (see
    /// [`Balancer::plan`]).
    pub fn plan(&self) -> Vec<usize> {
        let now = now_ms();
        self.balancer.plan(|i| self.backends[i].health.ejected_for(now).is_some())
    }
}

/// A backend URL without credentials in it (`user:password@`), the way
/// metrics and logs show it.
fn url_label(url: &str) -> Label {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]).into(),
        None => url.into(),
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
    /// Each declared MCP route's state.
    #[serde(skip)]
    pub mcp_routes: BTreeMap<ResourceKey, LoadState>,
    /// Some failure may go away by itself (a registry that was
    /// unreachable): the same config is worth building again later.
    #[serde(skip)]
    pub retry: bool,
    /// Some declared plugin is not served at all, for a reason that may
    /// pass: the replica is not ready yet (see `Gateway::apply`).
    #[serde(skip)]
    pub waiting: bool,
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
        Self { message: message.into(), transient: false, reason: reason::LOAD_FAILED }
    }
}

/// Builds the next snapshot. Each resource stands alone: a plugin or route
/// that fails keeps its last good version from `previous` (if it had one)
/// and is reported, and the rest is applied. Each plugin has `load_timeout`
/// to load, so one slow registry or plugin cannot hold up the others.
pub async fn build(
    runtime: &Runtime,
    registry: Option<&Registry>,
    desired: &DesiredConfig,
    previous: &Snapshot,
    load_timeout: Duration,
    backends: &Arc<BackendPolicy>,
) -> (Snapshot, BuildReport) {
    let mut report = BuildReport::default();
    let plugins = build_plugins(runtime, registry, desired, previous, load_timeout, &mut report).await;
    let built = build_routes(desired, previous, &plugins, backends, &mut report);
    let by_model = index_models(&built);
    let routes = built.into_iter().map(|b| b.route).collect();
    let mcp = build_mcp_routes(desired, previous, &plugins, backends, &mut report);
    // Only plugins some route uses need to stay loaded, but all are kept so
    // their last good versions survive a route edit.
    let snapshot = Snapshot { generation: previous.generation + 1, routes, by_model, plugins, mcp };
    (snapshot, report)
}

/// Loads every declared plugin side by side; one that fails keeps its last
/// good version.
async fn build_plugins(
    runtime: &Runtime,
    registry: Option<&Registry>,
    desired: &DesiredConfig,
    previous: &Snapshot,
    load_timeout: Duration,
    report: &mut BuildReport,
) -> HashMap<ResourceKey, Arc<LoadedPlugin>> {
    let loads = desired.plugins.iter().map(|decl| async move {
        match tokio::time::timeout(load_timeout, load_plugin(runtime, registry, decl, previous)).await {
            Ok(result) => result,
            Err(_) => Err(LoadFailure {
                transient: true,
                ..LoadFailure::permanent(format!("loading took longer than {} s", load_timeout.as_secs()))
            }),
        }
    });
    let loaded = futures_util::future::join_all(loads).await;
    let mut plugins = HashMap::new();
    for (decl, result) in desired.plugins.iter().zip(loaded) {
        let failure = match result {
            Ok(plugin) => {
                report.plugins.insert(decl.key.clone(), LoadState::ready(Some(plugin.digest().to_string())));
                plugins.insert(decl.key.clone(), plugin);
                continue;
            }
            Err(failure) => failure,
        };
        let LoadFailure { message, transient, reason } = failure;
        report.retry |= transient;
        let resource = format!("GatewayPlugin {}", decl.key);
        match previous.plugins.get(&decl.key) {
            Some(last_good) => {
                let digest = last_good.digest().to_string();
                let serving = format!("{message}; still serving the last good version {digest}");
                report.errors.push(ResourceError::new(resource, serving));
                report.plugins.insert(decl.key.clone(), LoadState::failed(reason, message, Some(digest)));
                plugins.insert(decl.key.clone(), last_good.clone());
            }
            None => {
                report.waiting |= transient;
                report.plugins.insert(decl.key.clone(), LoadState::failed(reason, &message, None));
                report.errors.push(ResourceError::new(resource, message));
            }
        }
    }
    plugins
}

/// A route of the next snapshot, and whether it is this config's version
/// or the last good one kept because this one failed.
struct Built {
    route: Arc<Route>,
    last_good: bool,
}

/// Builds every declared route whose models are its own; one that fails
/// keeps its last good version.
fn build_routes(
    desired: &DesiredConfig,
    previous: &Snapshot,
    plugins: &HashMap<ResourceKey, Arc<LoadedPlugin>>,
    backends: &Arc<BackendPolicy>,
    report: &mut BuildReport,
) -> Vec<Built> {
    let conflicts = desired.conflicts();
    let previous_routes: HashMap<&ResourceKey, &Arc<Route>> =
        previous.routes.iter().map(|r| (&r.decl.key, r)).collect();
    let mut routes = Vec::new();
    for decl in &desired.routes {
        let resource = format!("AIModelRoute {}", decl.key);
        if let Some(conflict) = conflicts.iter().find(|c| c.resource == resource) {
            report.routes.insert(decl.key.clone(), LoadState::failed(reason::MODEL_CONFLICT, &conflict.message, None));
            continue;
        }
        let message = match build_route(decl, plugins, backends, previous_routes.get(&decl.key).map(|r| &***r)) {
            Ok(route) => {
                report.routes.insert(decl.key.clone(), LoadState::ready(None));
                routes.push(Built { route: Arc::new(route), last_good: false });
                continue;
            }
            Err(message) => message,
        };
        match previous_routes.get(&decl.key) {
            Some(last_good) => {
                let serving = format!("{message}; still serving its last good version");
                report.errors.push(ResourceError::new(resource, serving));
                report.routes.insert(decl.key.clone(), LoadState::failed(reason::CHAIN_NOT_READY, message, None));
                routes.push(Built { route: Arc::clone(last_good), last_good: true });
            }
            None => {
                report.routes.insert(decl.key.clone(), LoadState::failed(reason::CHAIN_NOT_READY, &message, None));
                report.errors.push(ResourceError::new(resource, message));
            }
        }
    }
    report.errors.extend(conflicts);
    routes
}

/// Maps each model to its route. The current config's routes claim their
/// models first (they never conflict: conflicting routes were left out); a
/// last good route keeps only the models no current route claims, so a
/// model moved to another route stays moved when its old route then fails.
fn index_models(routes: &[Built]) -> HashMap<String, (Arc<Route>, Label)> {
    let mut by_model = HashMap::new();
    let (current, last_good): (Vec<&Built>, Vec<&Built>) = routes.iter().partition(|b| !b.last_good);
    for built in current.into_iter().chain(last_good) {
        for model in &built.route.decl.models {
            by_model.entry(model.clone()).or_insert_with(|| (built.route.clone(), Label::from(model.as_str())));
        }
    }
    by_model
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
        PluginSource::Oci { reference, pull_policy, credentials, verify } => {
            pull(registry, reference, *pull_policy, credentials.as_ref(), verify.as_ref(), decl).await?
        }
    };
    let digest = sluice_runtime::digest_of(&bytes);
    // Same declaration, same bytes: the loaded version is still right.
    if let Some(last) = previous.plugins.get(&decl.key)
        && last.decl == *decl
        && last.digest() == digest
    {
        return Ok(last.clone());
    }
    let module = runtime.load(bytes, decl.sha256.as_deref()).await.map_err(|e| {
        let reason = match e {
            sluice_runtime::LoadError::DigestMismatch { .. } => reason::DIGEST_MISMATCH,
            _ => reason::LOAD_FAILED,
        };
        LoadFailure { reason, ..LoadFailure::permanent(e.to_string()) }
    })?;
    let limits = Limits { timeout: decl.timeout, max_memory_bytes: decl.max_memory_bytes };
    let configured = module
        .configure(&decl.key.to_string(), &decl.config, limits, decl.isolation, grants(decl))
        .await
        .map_err(|e| {
            match e {
                sluice_runtime::LoadError::NotGranted(why) => {
                    return LoadFailure { reason: reason::NOT_PERMITTED, ..LoadFailure::permanent(why) };
                }
                sluice_runtime::LoadError::Egress(why) => {
                    return LoadFailure { reason: reason::NOT_PERMITTED, ..LoadFailure::permanent(why) };
                }
                _ => {}
            }
            // A plugin's error may quote its config, whose values may come
            // from Secrets (configFrom): none reaches a log, status or
            // /admin/config.
            let mut config_values = Redactions::default();
            config_values.add_strings(&decl.config);
            let message = config_values.apply(&e.to_string());
            LoadFailure { transient: e.is_transient(), ..LoadFailure::permanent(message) }
        })?;
    if decl.phase == Phase::Auth && !configured.hooks().contains(Hooks::REQUEST) {
        return Err(LoadFailure {
            reason: reason::INVALID,
            ..LoadFailure::permanent(
                "a plugin in the Auth phase needs a request hook, and this module has none: \
                 it would never run, and every request would pass unauthenticated",
            )
        });
    }
    tracing::info!(plugin = %decl.key, source = %decl.source, digest = %module.digest(), "plugin loaded");
    let id = Arc::new(PluginId::new(&decl.key.namespace, &decl.key.name, configured.digest()));
    Ok(Arc::new(LoadedPlugin { decl: decl.clone(), configured, id }))
}

/// Fetches an OCI plugin's module, verified against the pin if there is one.
/// The scope a granted plugin's state lives under, with its own caps.
fn grants(decl: &PluginDecl) -> sluice_runtime::Grants {
    let state = decl.state.map(|grant| {
        let mut scope = sluice_runtime::sluice_state::Scope::new(decl.key.namespace.as_str(), decl.key.name.as_str());
        scope.max_keys = grant.max_keys;
        scope.max_bytes = grant.max_bytes;
        scope
    });
    sluice_runtime::Grants { state, egress: decl.egress.clone() }
}

async fn pull(
    registry: Option<&Registry>,
    reference: &str,
    policy: PullPolicy,
    credentials: Option<&RegistryCredentials>,
    verify: Option<&VerifyKeys>,
    decl: &PluginDecl,
) -> Result<Vec<u8>, LoadFailure> {
    let registry = registry.ok_or_else(|| LoadFailure::permanent("OCI sources need a registry client"))?;
    // The keys are read on every load, so a changed key file or Secret
    // applies to the cached module as much as to a new one.
    let keys = match verify {
        None => None,
        Some(verify) => {
            let pems =
                verify.read().map_err(|e| LoadFailure { reason: reason::INVALID, ..LoadFailure::permanent(e) })?;
            Some(PublicKeys::from_pems(&pems).map_err(|e| LoadFailure {
                reason: reason::INVALID,
                ..LoadFailure::permanent(format!("spec.verify: {e}"))
            })?)
        }
    };
    let parsed: Reference = reference.parse().map_err(|e: sluice_oci::OciError| LoadFailure {
        reason: reason::INVALID_REFERENCE,
        ..LoadFailure::permanent(e.to_string())
    })?;
    let credentials = credentials.map(|c| match c {
        RegistryCredentials::Basic { username, password } => {
            PullCredentials::Basic { username: username.clone(), password: password.expose().to_string() }
        }
        RegistryCredentials::DockerConfigJson(json) => PullCredentials::DockerConfigJson(json.expose().to_string()),
        RegistryCredentials::Anonymous => PullCredentials::Anonymous,
    });
    let pulled =
        registry.pull_verified(&parsed, policy, decl.sha256.as_deref(), credentials.as_ref(), keys.as_ref()).await;
    let result = match &pulled {
        Ok(pulled) => match pulled.origin {
            sluice_oci::Origin::Registry => "pulled",
            sluice_oci::Origin::Cache => "cache_hit",
            sluice_oci::Origin::StaleCache => "stale_cache",
        },
        Err(sluice_oci::OciError::DigestMismatch { .. }) => "digest_mismatch",
        Err(sluice_oci::OciError::SignatureMissing { .. } | sluice_oci::OciError::SignatureInvalid { .. }) => {
            "signature_refused"
        }
        Err(_) => "failed",
    };
    sluice_telemetry::metrics().oci_pulls.get_or_create(&ResultLabels { result }).inc();
    match pulled {
        Ok(pulled) => {
            tracing::debug!(plugin = %decl.key, %reference, manifest = %pulled.manifest_digest, origin = ?pulled.origin, "module pulled");
            Ok(pulled.module.to_vec())
        }
        Err(error) => Err(LoadFailure {
            transient: error.is_transient(),
            reason: match error {
                sluice_oci::OciError::DigestMismatch { .. } => reason::DIGEST_MISMATCH,
                sluice_oci::OciError::SignatureMissing { .. } => reason::SIGNATURE_MISSING,
                sluice_oci::OciError::SignatureInvalid { .. } => reason::SIGNATURE_INVALID,
                _ => reason::PULL_FAILED,
            },
            message: format!("pulling {reference}: {error}"),
        }),
    }
}

fn build_route(
    decl: &RouteDecl,
    plugins: &HashMap<ResourceKey, Arc<LoadedPlugin>>,
    policy: &Arc<BackendPolicy>,
    previous: Option<&Route>,
) -> Result<Route, String> {
    // A backend the gateway may not reach is refused here, with its reason,
    // rather than on every request (names are checked when they resolve).
    if let Some(why) = decl.backends.iter().find_map(|b| policy.refuses_url(&b.url)) {
        return Err(why);
    }
    let mut chain: Vec<Arc<LoadedPlugin>> = decl
        .plugins
        .iter()
        .map(|key| plugins.get(key).cloned().ok_or_else(|| format!("plugin {key} is not loaded")))
        .collect::<Result<_, _>>()?;
    // Auth plugins first; the rest keep the route's order (a stable sort).
    chain.sort_by_key(|plugin| plugin.decl.phase);
    let endpoints = chain.iter().fold(decl.endpoints, |served, plugin| served.intersection(plugin.decl.endpoints));
    if endpoints.is_empty() {
        let understood: Vec<String> =
            chain.iter().map(|plugin| format!("{} understands {:?}", plugin.decl.key, plugin.decl.endpoints)).collect();
        return Err(format!(
            "no endpoint is understood by the whole chain: the route serves {:?}; {}",
            decl.endpoints,
            understood.join("; ")
        ));
    }
    let backends = decl
        .backends
        .iter()
        .map(|b| {
            let key = b.api_key.as_ref().map(resolve_api_key).transpose()?;
            let credential = key.map(|key| Adapter::of(b.provider).credential(&key));
            // What the route learned of a backend, and its pooled
            // connections, outlive a config change.
            let old = previous
                .and_then(|route| route.backends.iter().zip(&route.decl.backends).find(|(old, _)| old.url == b.url));
            let health = old.map_or_else(Arc::default, |(old, _)| old.health.clone());
            let client = match (&b.tls, b.timeouts.connect) {
                (None, None) => None,
                // The same settings: the same client. A PEM file rewritten
                // in place is read when the backend's TLS settings change,
                // or at restart.
                _ if let Some((old, decl)) = old
                    && decl.tls == b.tls
                    && decl.timeouts.connect == b.timeouts.connect =>
                {
                    old.client.clone()
                }
                (tls, connect) => Some(
                    UpstreamClient::for_backend(connect, tls.as_ref(), policy.clone())
                        .map_err(|e| format!("backend {}: {e}", url_label(&b.url)))?,
                ),
            };
            Ok(Backend {
                url: b.url.clone(),
                label: url_label(&b.url),
                model: b.model.clone(),
                provider: b.provider,
                credential: credential.transpose()?,
                timeouts: b.timeouts.clone(),
                client,
                health,
                target: Target::new(&b.url, b.provider),
            })
        })
        .collect::<Result<_, String>>()?;
    let label = decl.key.to_string().into();
    let balancer = Balancer::new(&decl.backends.iter().map(|b| (b.priority, b.weight)).collect::<Vec<_>>());
    Ok(Route { decl: decl.clone(), label, chain, endpoints, backends, balancer, budget: Budget::default() })
}

/// Builds every declared MCP route; one that fails keeps its last good
/// version (at its old path, unless a current route now claims it).
fn build_mcp_routes(
    desired: &DesiredConfig,
    previous: &Snapshot,
    plugins: &HashMap<ResourceKey, Arc<LoadedPlugin>>,
    policy: &Arc<BackendPolicy>,
    report: &mut BuildReport,
) -> HashMap<String, Arc<McpRoute>> {
    let conflicts = desired.mcp_conflicts();
    let previous_routes: HashMap<&ResourceKey, &Arc<McpRoute>> =
        previous.mcp.values().map(|r| (&r.decl.key, r)).collect();
    let mut by_path = HashMap::new();
    let mut last_good = Vec::new();
    for decl in &desired.mcp_routes {
        let resource = format!("MCPRoute {}", decl.key);
        if let Some(conflict) = conflicts.iter().find(|c| c.resource == resource) {
            report
                .mcp_routes
                .insert(decl.key.clone(), LoadState::failed(reason::PATH_CONFLICT, &conflict.message, None));
            continue;
        }
        let old = previous_routes.get(&decl.key).map(|r| &***r);
        let (reason, message) = match build_mcp_route(decl, plugins, policy, old) {
            Ok(route) => {
                report.mcp_routes.insert(decl.key.clone(), LoadState::ready(None));
                by_path.insert(decl.path.clone(), Arc::new(route));
                continue;
            }
            Err(refused) => refused,
        };
        report.mcp_routes.insert(decl.key.clone(), LoadState::failed(reason, &message, None));
        match previous_routes.get(&decl.key) {
            Some(route) => {
                report
                    .errors
                    .push(ResourceError::new(resource, format!("{message}; still serving its last good version")));
                last_good.push(Arc::clone(route));
            }
            None => report.errors.push(ResourceError::new(resource, message)),
        }
    }
    for route in last_good {
        by_path.entry(route.decl.path.clone()).or_insert(route);
    }
    report.errors.extend(conflicts);
    by_path
}

fn build_mcp_route(
    decl: &sluice_core::McpRouteDecl,
    plugins: &HashMap<ResourceKey, Arc<LoadedPlugin>>,
    policy: &Arc<BackendPolicy>,
    previous: Option<&McpRoute>,
) -> Result<McpRoute, (&'static str, String)> {
    decl.check().map_err(|why| (reason::INVALID, why))?;
    if let Some(why) = decl.servers.iter().find_map(|s| policy.refuses_url(&s.url)) {
        return Err((reason::NOT_PERMITTED, why));
    }
    let mut chain: Vec<Arc<LoadedPlugin>> = decl
        .plugins
        .iter()
        .map(|key| {
            plugins.get(key).cloned().ok_or_else(|| (reason::CHAIN_NOT_READY, format!("plugin {key} is not loaded")))
        })
        .collect::<Result<_, _>>()?;
    chain.sort_by_key(|plugin| plugin.decl.phase);
    let servers = decl
        .servers
        .iter()
        .map(|s| {
            let uri: http::Uri = s.url.parse().map_err(|e| format!("server `{}`: url: {e}", s.name))?;
            let credential = match &s.api_key {
                None => None,
                Some(source) => {
                    let key = resolve_api_key(source)?;
                    let value = HeaderValue::from_str(&format!("Bearer {}", key.trim()))
                        .map_err(|_| format!("server `{}`: the API key is not a valid header value", s.name))?;
                    Some(value)
                }
            };
            // A server's pooled connections outlive a config change that
            // keeps its URL and TLS settings.
            let old = previous.and_then(|route| {
                route.servers.iter().zip(&route.decl.servers).find(|(old, d)| old.url == s.url && d.tls == s.tls)
            });
            let client = match old {
                Some((old, _)) => old.client.clone(),
                None => UpstreamClient::for_backend(None, s.tls.as_ref(), policy.clone())
                    .map_err(|e| format!("server `{}`: {e}", s.name))?,
            };
            Ok(McpServer { name: s.name.clone(), url: s.url.clone(), uri, credential, timeout: s.timeout, client })
        })
        .collect::<Result<_, String>>()
        .map_err(|why| (reason::INVALID, why))?;
    Ok(McpRoute { decl: decl.clone(), label: decl.key.to_string().into(), chain, servers })
}

fn resolve_api_key(source: &ApiKeySource) -> Result<String, String> {
    Ok(match source {
        ApiKeySource::Env(var) => std::env::var(var).map_err(|_| format!("environment variable {var} is not set"))?,
        ApiKeySource::File(path) => {
            std::fs::read_to_string(path).map_err(|e| format!("reading API key file {}: {e}", path.display()))?
        }
        ApiKeySource::Value(secret) => secret.expose().to_string(),
    })
}

#[cfg(test)]
mod tests;
