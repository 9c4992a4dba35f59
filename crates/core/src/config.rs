//! The desired state: plugins and routes as declared, before anything is loaded.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::error::{ApiError, ErrorType};
use crate::routing::{BackendTimeouts, BackendTls, Fallback, OutlierPolicy, Provider, RetryPolicy};

/// `namespace/name` of a resource.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ResourceKey {
    pub namespace: String,
    pub name: String,
}

impl ResourceKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), name: name.into() }
    }
}

impl fmt::Display for ResourceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What happens to a request when a plugin fails (traps, runs out of time or
/// memory). A plugin's own decision to reject a request is not a failure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum FailurePolicy {
    /// The request fails with a 500.
    #[default]
    Closed,
    /// The plugin is skipped and the request goes on.
    Open,
}

/// How a plugin's instances map to requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum Isolation {
    /// A fresh instance per request: nothing a request leaves in the
    /// plugin's memory is seen by another. The default.
    #[default]
    PerRequest,
    /// Instances serve requests one after another, for guests whose
    /// instantiation is expensive (Python, JavaScript). State left in memory
    /// carries over between requests; an instance that traps, times out or
    /// is interrupted is discarded. At most `max_idle` are kept between
    /// requests.
    Reused { max_idle: u32 },
}

impl Isolation {
    pub const DEFAULT_MAX_IDLE: u32 = 16;
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum PluginSource {
    File(PathBuf),
    /// An OCI reference: `registry/repo:tag`, `registry/repo@sha256:…` or
    /// `registry/repo:tag@sha256:…`.
    Oci {
        reference: String,
        pull_policy: PullPolicy,
        /// Credentials for this plugin's pulls (a Kubernetes pull Secret),
        /// instead of the gateway's own.
        #[serde(skip)]
        credentials: Option<RegistryCredentials>,
        /// Cosign public keys, any of which must have signed the manifest
        /// the reference resolves to; `None`: no signature is required.
        #[serde(skip_serializing_if = "Option::is_none")]
        verify: Option<VerifyKeys>,
    },
}

/// The cosign public keys (PEM) a plugin's signature must verify under, any
/// of them: files of the gateway's, inline values, or Secrets' values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyKeys {
    pub keys: Vec<crate::Pem>,
}

impl VerifyKeys {
    /// Each key's PEM text, in order.
    pub fn read(&self) -> Result<Vec<Vec<u8>>, String> {
        self.keys.iter().enumerate().map(|(i, key)| key.read(&format!("verify key {}", i + 1))).collect()
    }
}

/// Shown (`/admin/config`) as how many keys, never their text.
impl Serialize for VerifyKeys {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let mut out = serializer.serialize_struct("VerifyKeys", 1)?;
        out.serialize_field("keys", &self.keys.len())?;
        out.end()
    }
}

/// Registry credentials given with a plugin, from a Kubernetes Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistryCredentials {
    Basic {
        username: String,
        password: Secret,
    },
    /// A docker `config.json` (a `kubernetes.io/dockerconfigjson` Secret):
    /// the entry for the plugin's registry host is used.
    DockerConfigJson(Secret),
    /// None at all: a plugin whose namespace may not borrow the operator's
    /// registry credentials pulls anonymously, unless it names its own.
    Anonymous,
}

/// A value from a Secret. It never prints: `Debug` shows a placeholder and
/// there is no `Display`, so a secret cannot reach a log line or a status
/// message by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl PluginSource {
    /// Whether loading it again may give a different module with no change
    /// to the declaration: a tag re-resolved on every load.
    pub fn may_move(&self) -> bool {
        matches!(self, PluginSource::Oci { pull_policy: PullPolicy::Always, reference, .. } if !reference.contains('@'))
    }
}

impl fmt::Display for PluginSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PluginSource::File(path) => write!(f, "file:{}", path.display()),
            PluginSource::Oci { reference, .. } => write!(f, "oci:{reference}"),
        }
    }
}

/// When a tag is resolved against the registry again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum PullPolicy {
    /// Once: a tag resolved before (or a digest) is served from the cache.
    #[default]
    IfNotPresent,
    /// On every load, and periodically while serving, so a moved tag is
    /// picked up.
    Always,
}

/// Where a plugin runs in a route's chain.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Phase {
    /// Before every `Filter` plugin, whatever the route's order; an auth
    /// plugin must fail closed.
    Auth,
    /// In the route's order.
    #[default]
    Filter,
}

/// A set of the forwarded OpenAI endpoints: those a route serves, or a
/// plugin understands. A content policy that does not read an endpoint's
/// shape would pass its requests untouched, so a route serves only the
/// endpoints its whole chain understands.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Endpoints(u8);

impl Endpoints {
    /// The endpoints that carry a `model` and are forwarded, in the order
    /// lists show them.
    pub const FORWARDED: [&'static str; 4] =
        ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"];

    /// Every forwarded endpoint: the default for routes and plugins.
    pub const ALL: Endpoints = Endpoints((1 << Self::FORWARDED.len()) - 1);

    /// The set of `paths`, each one of [`Self::FORWARDED`]; an unknown path
    /// or an empty list is an error (a route or plugin with no endpoint
    /// would serve nothing).
    pub fn parse<S: AsRef<str>>(paths: &[S]) -> Result<Endpoints, String> {
        if paths.is_empty() {
            return Err("`endpoints` is empty: nothing would be served".into());
        }
        let mut set = 0;
        for path in paths {
            let path = path.as_ref();
            let bit = Self::bit(path).ok_or_else(|| {
                format!("unknown endpoint `{path}` in `endpoints` (expected some of {:?})", Self::FORWARDED)
            })?;
            set |= bit;
        }
        Ok(Endpoints(set))
    }

    fn bit(path: &str) -> Option<u8> {
        Self::FORWARDED.iter().position(|p| *p == path).map(|i| 1 << i)
    }

    /// Whether `path` (without its query) is in the set.
    pub fn contains(self, path: &str) -> bool {
        Self::bit(path).is_some_and(|bit| self.0 & bit != 0)
    }

    pub fn intersection(self, other: Endpoints) -> Endpoints {
        Endpoints(self.0 & other.0)
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn paths(self) -> impl Iterator<Item = &'static str> {
        Self::FORWARDED.into_iter().enumerate().filter(move |(i, _)| self.0 & (1 << i) != 0).map(|(_, p)| p)
    }

    /// The answer to a request for `path`, which the route serving `model`
    /// does not serve: a 404 naming the endpoints it does.
    pub fn refusal(self, path: &str, model: &str) -> ApiError {
        let served: Vec<&str> = self.paths().collect();
        ApiError::new(
            404,
            ErrorType::InvalidRequestError,
            "unsupported_endpoint",
            format!("the route serving model `{model}` does not serve {path}; it serves {}", served.join(", ")),
        )
    }
}

impl Default for Endpoints {
    fn default() -> Self {
        Self::ALL
    }
}

impl fmt::Debug for Endpoints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.paths()).finish()
    }
}

impl Serialize for Endpoints {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.paths())
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct PluginDecl {
    pub key: ResourceKey,
    pub source: PluginSource,
    pub phase: Phase,
    /// Expected sha256 of the module, lower-case hex.
    pub sha256: Option<String>,
    pub config: serde_json::Value,
    pub failure_policy: FailurePolicy,
    /// Deadline for each call into the plugin.
    pub timeout: Duration,
    pub max_memory_bytes: usize,
    pub isolation: Isolation,
    /// The endpoints whose requests the plugin understands (all, unless
    /// declared: a plugin that does not read content, like auth or
    /// add-header, understands every endpoint).
    pub endpoints: Endpoints,
    /// Shared state (`sluice:plugin/state`), if granted: a component that
    /// imports it without a grant is refused at load.
    pub state: Option<StateGrant>,
    /// Outbound HTTP (`wasi:http/outgoing-handler`), if granted: the only
    /// destinations the plugin may reach. A component that imports it
    /// without a grant is refused at load.
    pub egress: Option<EgressGrant>,
}

/// A plugin's grant of shared state, with its own caps: each at most the
/// gateway's per-plugin cap, which applies where one is not given.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateGrant {
    /// Keys (counters and entries) the plugin may hold at once.
    pub max_keys: Option<u64>,
    /// Bytes of keys and values the plugin may hold at once.
    pub max_bytes: Option<u64>,
}

/// A plugin's grant of outbound HTTP: where it may call, and its caps, each
/// at most the gateway's (`--egress-*`), which apply where none is given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressGrant {
    pub destinations: Vec<EgressDestination>,
    /// Each call's deadline; the hook's own deadline always applies too.
    pub timeout: Option<Duration>,
    pub max_response_bytes: Option<u64>,
    /// Calls of this plugin in flight at once, over all its instances;
    /// one past it is refused, not queued.
    pub max_concurrent_calls: Option<u32>,
}

/// One destination a plugin may call: a scheme, a host and a port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressDestination {
    pub https: bool,
    /// A lower-case DNS name, or an IP address (IPv6 without brackets).
    pub host: String,
    pub port: u16,
    /// CA certificates trusted for this destination besides the gateway's.
    pub ca: Option<crate::Pem>,
}

impl EgressDestination {
    /// `https://host:port`, as the grant is shown.
    pub fn origin(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        match self.host.contains(':') {
            true => format!("{scheme}://[{}]:{}", self.host, self.port),
            false => format!("{scheme}://{}:{}", self.host, self.port),
        }
    }

    /// Parses `http(s)://host[:port]`: no path (but `/`), query, user info
    /// or fragment, and a host that is a DNS name or an IP address.
    pub fn parse(url: &str) -> Result<Self, String> {
        let (https, rest) = if let Some(rest) = url.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = url.strip_prefix("http://") {
            (false, rest)
        } else {
            return Err(format!("`{url}` is not an http:// or https:// URL"));
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
            return Err(format!("`{url}` must be scheme://host[:port], with no path, query or user"));
        }
        let default_port = if https { 443 } else { 80 };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6.split_once(']').ok_or_else(|| format!("`{url}`: unclosed `[`"))?;
            host.parse::<std::net::Ipv6Addr>().map_err(|_| format!("`{url}`: `{host}` is not an IPv6 address"))?;
            let port = match after.strip_prefix(':') {
                Some(port) => Some(port),
                None if after.is_empty() => None,
                None => return Err(format!("`{url}`: unexpected `{after}` after the address")),
            };
            (host.to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((host, port)) => (host.to_string(), Some(port)),
                None => (authority.to_string(), None),
            }
        };
        let port = match port {
            None => default_port,
            Some(port) => {
                port.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| format!("`{url}`: bad port `{port}`"))?
            }
        };
        let host = host.to_ascii_lowercase();
        let dns = host.len() <= 253
            && host.split('.').all(|label| {
                !label.is_empty() && label.len() <= 63 && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        if !dns && host.parse::<std::net::IpAddr>().is_err() {
            return Err(format!("`{url}`: `{host}` is not a DNS name or an IP address"));
        }
        Ok(Self { https, host, port, ca: None })
    }
}

impl PluginDecl {
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);
    pub const DEFAULT_MAX_MEMORY_MIB: u32 = 64;
}

/// Where a backend's API key comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiKeySource {
    Env(String),
    File(PathBuf),
    /// The key itself, from a Kubernetes Secret.
    Value(Secret),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendDecl {
    /// Base URL, e.g. `http://127.0.0.1:9000/v1`.
    pub url: String,
    /// Its name in the route, if it has one: a plugin may route to it.
    pub name: Option<String>,
    /// Model name to send upstream instead of the client's.
    pub model: Option<String>,
    pub api_key: Option<ApiKeySource>,
    pub provider: Provider,
    /// Share of traffic among the backends of its priority.
    pub weight: u32,
    /// 0 is served first; a higher number takes traffic only while every
    /// backend of lower numbers is ejected or has failed the request.
    pub priority: u32,
    pub timeouts: BackendTimeouts,
    pub tls: Option<BackendTls>,
}

impl BackendDecl {
    pub const DEFAULT_WEIGHT: u32 = 1;

    /// An OpenAI-compatible backend at `url`, with every default.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            name: None,
            model: None,
            api_key: None,
            provider: Provider::OpenAi,
            weight: Self::DEFAULT_WEIGHT,
            priority: 0,
            timeouts: BackendTimeouts::default(),
            tls: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteDecl {
    pub key: ResourceKey,
    pub models: Vec<String>,
    pub backends: Vec<BackendDecl>,
    /// The plugin chain, in order; plugins live in the route's namespace.
    pub plugins: Vec<ResourceKey>,
    /// How long to wait for the upstream's response head, unless a backend
    /// says otherwise.
    pub timeout: Duration,
    pub retry: RetryPolicy,
    pub outlier: OutlierPolicy,
    pub fallbacks: Vec<Fallback>,
    /// The endpoints the route serves, at most: it serves those its every
    /// plugin understands too.
    pub endpoints: Endpoints,
}

impl RouteDecl {
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

    /// A route with every default: no backends, no plugins.
    pub fn new(key: ResourceKey, models: Vec<String>) -> Self {
        Self {
            key,
            models,
            backends: vec![],
            plugins: vec![],
            timeout: Self::DEFAULT_TIMEOUT,
            retry: RetryPolicy::default(),
            outlier: OutlierPolicy::default(),
            fallbacks: vec![],
            endpoints: Endpoints::ALL,
        }
    }
}

/// An MCP route: Model Context Protocol servers behind one path of the
/// gateway, their tools, prompts and resources merged under each server's
/// name, with a plugin chain on every message (docs/mcp.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McpRouteDecl {
    pub key: ResourceKey,
    /// Where the route is served on the data plane listener: an absolute
    /// path, e.g. `/mcp/tools`.
    pub path: String,
    /// The upstream MCP servers, at least one, names unique.
    pub servers: Vec<McpServerDecl>,
    /// Globs over the prefixed names (`github__*`): a tool is listed and
    /// callable if it matches some `allow` (or `allow` is empty) and no
    /// `deny`.
    pub allow: Vec<String>,
    pub deny: Vec<String>,
    /// The plugin chain, in order; plugins live in the route's namespace.
    pub plugins: Vec<ResourceKey>,
    pub limits: McpLimits,
    /// Published as Protected Resource Metadata (RFC 9728), and named in
    /// the `WWW-Authenticate` of a 401, when present.
    pub authorization: Option<McpAuthorization>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McpServerDecl {
    /// A DNS label: it prefixes the server's tools, prompts and resources.
    pub name: String,
    /// The server's Streamable HTTP endpoint, e.g. `http://10.0.0.7:8000/mcp`.
    pub url: String,
    /// Sent as `Authorization: Bearer <key>`.
    pub api_key: Option<ApiKeySource>,
    /// How long a request may wait for the server's response head.
    pub timeout: Duration,
    pub tls: Option<BackendTls>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McpLimits {
    /// The largest JSON-RPC message accepted from a client or a server
    /// (one SSE event's data, or one JSON body).
    pub max_message_bytes: usize,
    /// The most tools (prompts, resources) one merged listing holds; past
    /// it, a server's listing is cut and the cut is logged.
    pub max_tools: usize,
    /// Server-to-client streams one session may hold open at once (GET
    /// streams and POST responses streamed as SSE).
    pub max_streams_per_session: usize,
    /// A stream on which a server sends nothing for this long is ended.
    pub stream_idle_timeout: Duration,
    /// A session id is honoured this long after it was minted.
    pub session_ttl: Duration,
}

impl Default for McpLimits {
    fn default() -> Self {
        Self {
            max_message_bytes: 4 * 1024 * 1024,
            max_tools: 1024,
            max_streams_per_session: 8,
            stream_idle_timeout: Duration::from_secs(300),
            session_ttl: Duration::from_secs(24 * 3600),
        }
    }
}

impl McpLimits {
    /// These limits, none past `caps`: a route's author may lower the
    /// gateway's caps (`--mcp-max-*`), never raise them.
    pub fn within(&self, caps: &McpLimits) -> McpLimits {
        McpLimits {
            max_message_bytes: self.max_message_bytes.min(caps.max_message_bytes),
            max_tools: self.max_tools.min(caps.max_tools),
            max_streams_per_session: self.max_streams_per_session.min(caps.max_streams_per_session),
            stream_idle_timeout: self.stream_idle_timeout.min(caps.stream_idle_timeout),
            session_ttl: self.session_ttl.min(caps.session_ttl),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct McpAuthorization {
    /// The authorization servers' issuer URLs.
    pub authorization_servers: Vec<String>,
    /// The scopes a client may ask for.
    pub scopes: Vec<String>,
    /// The resource identifier clients name in their token requests; the
    /// route's URL on the listener (scheme and host from the request) when
    /// absent.
    pub resource: Option<String>,
}

impl McpRouteDecl {
    pub const DEFAULT_SERVER_TIMEOUT: Duration = Duration::from_secs(60);

    /// A route at `path` with every default and no servers.
    pub fn new(key: ResourceKey, path: impl Into<String>) -> Self {
        Self {
            key,
            path: path.into(),
            servers: vec![],
            allow: vec![],
            deny: vec![],
            plugins: vec![],
            limits: McpLimits::default(),
            authorization: None,
        }
    }

    /// Whether the prefixed tool `name` may be listed and called.
    pub fn allows(&self, name: &str) -> bool {
        (self.allow.is_empty() || self.allow.iter().any(|glob| crate::mcp::glob_match(glob, name)))
            && !self.deny.iter().any(|glob| crate::mcp::glob_match(glob, name))
    }

    /// What is wrong with the declaration, if anything: the checks every
    /// config source makes.
    pub fn check(&self) -> Result<(), String> {
        crate::mcp::check_path(&self.path)?;
        if self.servers.is_empty() {
            return Err("an MCP route needs at least one server".into());
        }
        let mut names = std::collections::HashSet::new();
        for server in &self.servers {
            crate::mcp::check_server_name(&server.name)?;
            if !names.insert(server.name.as_str()) {
                return Err(format!("server name `{}` is used twice", server.name));
            }
            if !(server.url.starts_with("http://") || server.url.starts_with("https://")) {
                return Err(format!("server `{}`: url must be http:// or https://", server.name));
            }
        }
        Ok(())
    }
}

/// A problem with one resource (or one file), reported and not served.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ResourceError {
    pub resource: String,
    pub message: String,
}

impl ResourceError {
    pub fn new(resource: impl fmt::Display, message: impl fmt::Display) -> Self {
        Self { resource: resource.to_string(), message: message.to_string() }
    }
}

/// What a config source publishes.
#[derive(Clone, Debug)]
pub enum ConfigUpdate {
    /// Everything that should be served now.
    Desired(DesiredConfig),
    /// The source could not be read as a whole (e.g. a file does not parse).
    /// Applying the rest could silently drop what the bad part declares, so
    /// the gateway keeps its last good config and reports these.
    Invalid(Vec<ResourceError>),
}

/// Everything a config source currently asks for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DesiredConfig {
    /// Increases with every config a source publishes, so the source can
    /// tell which of its configs a [`crate::LoadReport`] is about.
    pub revision: u64,
    pub plugins: Vec<PluginDecl>,
    pub routes: Vec<RouteDecl>,
    pub mcp_routes: Vec<McpRouteDecl>,
}

impl DesiredConfig {
    /// Problems that make the config unsafe to apply as a whole: the same
    /// resource declared twice, or a model claimed by two routes (which one
    /// wins would depend on file order).
    pub fn conflicts(&self) -> Vec<ResourceError> {
        let mut errors = Vec::new();
        let mut seen_plugins = HashMap::new();
        for plugin in &self.plugins {
            if seen_plugins.insert(&plugin.key, ()).is_some() {
                errors.push(ResourceError::new(format!("GatewayPlugin {}", plugin.key), "declared more than once"));
            }
        }
        let mut seen_routes = HashMap::new();
        let mut unique = Vec::new();
        for route in &self.routes {
            if seen_routes.insert(&route.key, ()).is_some() {
                errors.push(ResourceError::new(format!("AIModelRoute {}", route.key), "declared more than once"));
            } else {
                unique.push(route);
            }
        }
        for ModelConflict { route, model, owner } in model_conflicts(unique) {
            errors.push(ResourceError::new(
                format!("AIModelRoute {route}"),
                format!("model `{model}` is already served by AIModelRoute {owner}"),
            ));
        }
        errors.extend(self.mcp_conflicts());
        errors
    }

    /// MCP routes declared twice, or claiming a path an earlier one serves
    /// (the same rule as models: the order given is the precedence).
    pub fn mcp_conflicts(&self) -> Vec<ResourceError> {
        let mut errors = Vec::new();
        let mut seen = HashMap::new();
        let mut paths: HashMap<&str, &ResourceKey> = HashMap::new();
        for route in &self.mcp_routes {
            let resource = format!("MCPRoute {}", route.key);
            if seen.insert(&route.key, ()).is_some() {
                errors.push(ResourceError::new(resource, "declared more than once"));
            } else if let Some(owner) = paths.get(route.path.as_str()) {
                errors.push(ResourceError::new(
                    resource,
                    format!("path `{}` is already served by MCPRoute {owner}", route.path),
                ));
            } else {
                paths.insert(&route.path, &route.key);
            }
        }
        errors
    }
}

/// A route that claims a model an earlier route already serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelConflict {
    pub route: ResourceKey,
    pub model: String,
    pub owner: ResourceKey,
}

/// Which routes serve their models: the one rule, for every config source.
/// Routes come in the order of precedence their source defines (the
/// controller: oldest first, then by name; a config directory: the order its
/// files declare them); a route that claims any model an earlier route
/// serves serves none of its models. Given the same routes in the same
/// order, every replica decides the same way. The routes not in the result
/// serve all their models.
pub fn model_conflicts<'a>(routes: impl IntoIterator<Item = &'a RouteDecl>) -> Vec<ModelConflict> {
    let mut owner: HashMap<&str, &ResourceKey> = HashMap::new();
    let mut conflicts = Vec::new();
    for route in routes {
        if let Some((model, older)) = route.models.iter().find_map(|m| owner.get(m.as_str()).map(|o| (m, *o))) {
            conflicts.push(ModelConflict { route: route.key.clone(), model: model.clone(), owner: older.clone() });
            continue;
        }
        for model in &route.models {
            owner.insert(model, &route.key);
        }
    }
    conflicts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(name: &str, models: &[&str]) -> RouteDecl {
        RouteDecl::new(ResourceKey::new("default", name), models.iter().map(|m| m.to_string()).collect())
    }

    #[test]
    fn egress_destinations_parse_to_scheme_host_and_port() {
        let parsed = |url: &str| EgressDestination::parse(url).map(|d| d.origin());
        assert_eq!(parsed("https://Api.Example.com").unwrap(), "https://api.example.com:443");
        assert_eq!(parsed("http://10.0.0.7:8080/").unwrap(), "http://10.0.0.7:8080");
        assert_eq!(parsed("http://[fd00:ec2::254]").unwrap(), "http://[fd00:ec2::254]:80");
        for bad in [
            "ftp://x",
            "https://",
            "https://x/path",
            "https://x?q",
            "https://user@x",
            "https://x:0",
            "https://x:99999",
            "https://under_score",
            "http://[::1",
            "https://x:80:80",
        ] {
            assert!(parsed(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn a_model_claimed_twice_is_a_conflict() {
        let desired = DesiredConfig {
            revision: 0,
            plugins: vec![],
            routes: vec![route("a", &["m1", "m2"]), route("b", &["m2"])],
            ..Default::default()
        };
        let conflicts = desired.conflicts();
        assert_eq!(conflicts.len(), 1);
        assert_eq!(conflicts[0].resource, "AIModelRoute default/b");
        assert!(conflicts[0].message.contains("default/a"));
    }

    #[test]
    fn endpoints_parse_intersect_and_refuse_by_name() {
        let chat = Endpoints::parse(&["/v1/chat/completions"]).unwrap();
        let two = Endpoints::parse(&["/v1/responses", "/v1/chat/completions", "/v1/responses"]).unwrap();
        assert_eq!(format!("{two:?}"), r#"["/v1/chat/completions", "/v1/responses"]"#);
        assert_eq!(two.intersection(chat), chat);
        assert!(chat.contains("/v1/chat/completions") && !chat.contains("/v1/responses"));
        assert!(!Endpoints::ALL.contains("/v1/models"));
        assert_eq!(Endpoints::ALL.paths().count(), Endpoints::FORWARDED.len());
        assert!(chat.intersection(Endpoints::parse(&["/v1/embeddings"]).unwrap()).is_empty());
        assert!(Endpoints::parse::<&str>(&[]).unwrap_err().contains("empty"));
        assert!(Endpoints::parse(&["/v1/models"]).unwrap_err().contains("unknown endpoint `/v1/models`"));
        let error = chat.refusal("/v1/responses", "m");
        assert_eq!((error.status, error.code), (404, "unsupported_endpoint"));
        assert!(error.message.contains("/v1/responses") && error.message.ends_with("/v1/chat/completions"));
        assert_eq!(serde_json::to_value(two).unwrap(), serde_json::json!(["/v1/chat/completions", "/v1/responses"]));
    }

    #[test]
    fn a_route_that_loses_one_model_serves_none_and_claims_none() {
        let routes = [route("a", &["m1"]), route("b", &["m1", "m2"]), route("c", &["m2"])];
        let conflicts = model_conflicts(&routes);
        let key = |name| ResourceKey::new("default", name);
        assert_eq!(
            conflicts,
            vec![ModelConflict { route: key("b"), model: "m1".into(), owner: key("a") }],
            "c serves m2: b, which lost m1, claims nothing"
        );
        let reversed: Vec<_> = routes.iter().rev().collect();
        let owners: Vec<_> = model_conflicts(reversed).into_iter().map(|c| (c.route, c.owner)).collect();
        assert_eq!(owners, vec![(key("b"), key("c"))], "the order given is the precedence");
    }

    #[test]
    fn a_routes_mcp_limits_stay_within_the_gateways_caps() {
        let caps = McpLimits { max_tools: 10, session_ttl: Duration::from_secs(60), ..McpLimits::default() };
        let asked = McpLimits { max_tools: 5000, max_streams_per_session: 2, ..McpLimits::default() };
        let allowed = asked.within(&caps);
        assert_eq!((allowed.max_tools, allowed.max_streams_per_session), (10, 2), "raised: capped; lowered: kept");
        assert_eq!(allowed.session_ttl, Duration::from_secs(60));
        assert_eq!(allowed.max_message_bytes, McpLimits::default().max_message_bytes);
    }

    #[test]
    fn distinct_routes_do_not_conflict() {
        let desired = DesiredConfig {
            revision: 0,
            plugins: vec![],
            routes: vec![route("a", &["m1"]), route("b", &["m2"])],
            ..Default::default()
        };
        assert!(desired.conflicts().is_empty());
    }
}
