//! From custom resources and Secrets to the data plane's declarations. Pure
//! functions over what the watches hold, so every replica computes the same
//! desired config, and the leader the same conditions.

use std::collections::HashMap;
use std::path::Path;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use serde_json::Value;
use sluice_api::{AIModelRoute, BackendTlsSpec, GatewayPlugin, MCPRoute, SecretKeySelector, ValueFormat};
use sluice_core::{
    ApiKeySource, BackendTls, DesiredConfig, McpRouteDecl, ModelConflict, Pem, PluginDecl, PluginSource, Redactions,
    RegistryCredentials, ResourceKey, RouteDecl, reason,
};

use crate::Tenancy;

/// Which condition a problem sets to False.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Condition {
    /// The spec itself is wrong, or loses a conflict.
    Accepted,
    /// A referenced object is missing or unusable.
    ResolvedRefs,
}

/// Why a resource's current generation cannot be served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub condition: Condition,
    /// A CamelCase reason, as Kubernetes conditions have.
    pub reason: &'static str,
    /// Never holds a Secret's value.
    pub message: String,
}

impl Problem {
    fn invalid(message: impl Into<String>) -> Self {
        Problem { condition: Condition::Accepted, reason: reason::INVALID, message: message.into() }
    }

    /// The spec asks for something of the gateway's own that it does not lend.
    fn not_permitted(message: impl Into<String>) -> Self {
        Problem { condition: Condition::Accepted, reason: reason::NOT_PERMITTED, message: message.into() }
    }

    fn unresolved(reason: &'static str, message: impl Into<String>) -> Self {
        Problem { condition: Condition::ResolvedRefs, reason, message: message.into() }
    }
}

/// Looks Secrets up by namespace and name.
pub trait Secrets {
    fn get(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<Secret>>;
}

/// The declaration a GatewayPlugin asks for, with its Secret references
/// resolved. The controllers use [`plugin_redacted`].
#[cfg(test)]
pub fn plugin(plugin: &GatewayPlugin, secrets: &impl Secrets, tenancy: &Tenancy) -> Result<PluginDecl, Problem> {
    plugin_redacted(plugin, secrets, tenancy).0
}

/// [`plugin`], and the Secret values it read (even if it then failed).
pub fn plugin_redacted(
    plugin: &GatewayPlugin,
    secrets: &impl Secrets,
    tenancy: &Tenancy,
) -> (Result<PluginDecl, Problem>, Redactions) {
    let mut redactions = Redactions::default();
    (resolve_plugin(plugin, secrets, tenancy, &mut redactions), redactions)
}

fn resolve_plugin(
    plugin: &GatewayPlugin,
    secrets: &impl Secrets,
    tenancy: &Tenancy,
    redactions: &mut Redactions,
) -> Result<PluginDecl, Problem> {
    if let Some(file) = &plugin.spec.source.file {
        host_file(tenancy, "source.file", file)?;
    }
    for destination in plugin.spec.egress.iter().flat_map(|e| &e.destinations) {
        if let Some(file) = &destination.ca_file {
            host_file(tenancy, "egress caFile", file)?;
        }
    }
    for key in plugin.spec.verify.iter().flat_map(|v| &v.keys) {
        if let Some(file) = &key.file {
            host_file(tenancy, "verify key file", file)?;
        }
    }
    let mut decl = plugin.decl(Path::new("/")).map_err(Problem::invalid)?;
    let namespace = decl.key.namespace.clone();
    for from in &plugin.spec.config_from {
        let text = secret_text(secrets, &namespace, &from.secret_key_ref)?;
        redactions.add(&text);
        let value = match from.format.unwrap_or_default() {
            ValueFormat::Text => Value::String(text),
            ValueFormat::Json => serde_json::from_str(&text).map_err(|e| {
                // serde_json's message names a position, never the content.
                Problem::unresolved(
                    reason::INVALID_SECRET_VALUE,
                    format!(
                        "Secret {}/{} key `{}` is not JSON: {e}",
                        namespace, from.secret_key_ref.name, from.secret_key_ref.key
                    ),
                )
            })?,
        };
        redactions.add_strings(&value);
        set_pointer(&mut decl.config, &from.path, value)
            .map_err(|e| Problem::invalid(format!("configFrom path `{}`: {e}", from.path)))?;
    }
    if let Some(reference) = &plugin.spec.source.pull_secret_ref
        && let PluginSource::Oci { credentials, .. } = &mut decl.source
    {
        *credentials = Some(pull_credentials(secrets, &namespace, &reference.name, redactions)?);
    }
    if let (Some(grant), Some(spec)) = (&mut decl.egress, &plugin.spec.egress) {
        for (destination, spec) in grant.destinations.iter_mut().zip(&spec.destinations) {
            let Some(reference) = &spec.ca_secret_ref else { continue };
            let secret = secrets.get(&namespace, &reference.name).ok_or_else(|| {
                Problem::unresolved(
                    reason::SECRET_NOT_FOUND,
                    format!("Secret {namespace}/{} (egress caSecretRef) does not exist", reference.name),
                )
            })?;
            let ca =
                secret_bytes(&secret, "ca.crt").and_then(|bytes| String::from_utf8(bytes).ok()).ok_or_else(|| {
                    Problem::unresolved(
                        reason::SECRET_NOT_FOUND,
                        format!("Secret {namespace}/{} (egress caSecretRef) holds no ca.crt", reference.name),
                    )
                })?;
            destination.ca = Some(sluice_core::Pem::Value(sluice_core::Secret::new(ca)));
        }
    }
    // Each secretRef key replaces its placeholder, in order; one that cannot
    // be read fails the plugin here, never drops a key.
    if let (PluginSource::Oci { verify: Some(keys), .. }, Some(spec)) = (&mut decl.source, &plugin.spec.verify) {
        for (key, spec) in keys.keys.iter_mut().zip(&spec.keys) {
            let Some(selector) = &spec.secret_ref else { continue };
            *key = Pem::Value(sluice_core::Secret::new(secret_text(secrets, &namespace, selector)?));
        }
    }
    // Without a pull Secret of its own, a plugin pulls with the operator's
    // credentials only where the operator lends them.
    if let PluginSource::Oci { credentials: credentials @ None, .. } = &mut decl.source
        && !tenancy.lends_registry_credentials(&namespace)
    {
        *credentials = Some(RegistryCredentials::Anonymous);
    }
    Ok(decl)
}

/// What an upstream (a route's backend, an MCP route's server) may have of
/// the gateway's own: its address, and the files and environment variables
/// its API key (`apiKeyFile`, `apiKeyEnv`) and TLS settings name, each only
/// as the operator allows.
fn lent_to_upstream(
    tenancy: &Tenancy,
    url: &str,
    (key_file, key_env): (Option<&str>, Option<&str>),
    tls: Option<&BackendTlsSpec>,
) -> Result<(), Problem> {
    if let Some(file) = key_file {
        host_file(tenancy, "apiKeyFile", file)?;
    }
    if let Some(tls) = tls {
        for (field, file) in
            [("tls.caFile", &tls.ca_file), ("tls.certFile", &tls.cert_file), ("tls.keyFile", &tls.key_file)]
        {
            if let Some(file) = file {
                host_file(tenancy, field, file)?;
            }
        }
    }
    if let Some(why) = tenancy.backends.refuses_url(url) {
        return Err(Problem::not_permitted(why));
    }
    if let Some(name) = key_env
        && !tenancy.allows_env(name)
    {
        return Err(Problem::not_permitted(format!(
            "apiKeyEnv `{name}`: this gateway lends a resource no environment variable of its own unless its \
             operator allows it (--allow-host-env); use apiKeySecretRef"
        )));
    }
    Ok(())
}

/// The declaration an AIModelRoute asks for. `plugin_exists` tells whether a
/// GatewayPlugin is declared, so a typo is reported here rather than as a
/// load failure.
pub fn route(
    route: &AIModelRoute,
    secrets: &impl Secrets,
    tenancy: &Tenancy,
    plugin_exists: impl Fn(&ResourceKey) -> bool,
) -> Result<RouteDecl, Problem> {
    route_redacted(route, secrets, tenancy, plugin_exists).0
}

/// [`route`], and the Secret values it read (even if it then failed).
pub fn route_redacted(
    route: &AIModelRoute,
    secrets: &impl Secrets,
    tenancy: &Tenancy,
    plugin_exists: impl Fn(&ResourceKey) -> bool,
) -> (Result<RouteDecl, Problem>, Redactions) {
    let mut redactions = Redactions::default();
    (resolve_route(route, secrets, tenancy, plugin_exists, &mut redactions), redactions)
}

fn resolve_route(
    route: &AIModelRoute,
    secrets: &impl Secrets,
    tenancy: &Tenancy,
    plugin_exists: impl Fn(&ResourceKey) -> bool,
    redactions: &mut Redactions,
) -> Result<RouteDecl, Problem> {
    for backend in &route.spec.backends {
        let key = (backend.api_key_file.as_deref(), backend.api_key_env.as_deref());
        lent_to_upstream(tenancy, &backend.url, key, backend.tls.as_ref())?;
    }
    let mut decl = route.decl(Path::new("/")).map_err(Problem::invalid)?;
    let namespace = &decl.key.namespace;
    if let Some(model) = decl.models.iter().find(|model| !tenancy.allows_model(namespace, model)) {
        return Err(Problem {
            condition: Condition::Accepted,
            reason: reason::MODEL_NOT_PERMITTED,
            message: format!(
                "namespace `{namespace}` may not claim model `{model}`: the gateway's operator grants models to \
                 namespaces (--model-claim)"
            ),
        });
    }
    if let Some(missing) = decl.plugins.iter().find(|key| !plugin_exists(key)) {
        return Err(Problem::unresolved(reason::PLUGIN_NOT_FOUND, format!("GatewayPlugin {missing} does not exist")));
    }
    for (backend, spec) in decl.backends.iter_mut().zip(&route.spec.backends) {
        if let Some(selector) = &spec.api_key_secret_ref {
            let key = secret_text(secrets, &decl.key.namespace, selector)?;
            redactions.add(&key);
            backend.api_key = Some(ApiKeySource::Value(sluice_core::Secret::new(key.trim().to_string())));
        }
        if let Some(tls) = &mut backend.tls {
            tls_from_secret(tls, spec.tls.as_ref(), secrets, &decl.key.namespace)?;
        }
    }
    Ok(decl)
}

/// Fills an upstream's TLS PEM from its `tls.secretRef`, if it names one.
fn tls_from_secret(
    tls: &mut BackendTls,
    spec: Option<&BackendTlsSpec>,
    secrets: &impl Secrets,
    namespace: &str,
) -> Result<(), Problem> {
    let Some(reference) = spec.and_then(|t| t.secret_ref.as_ref()) else { return Ok(()) };
    let secret = secrets.get(namespace, &reference.name).ok_or_else(|| {
        Problem::unresolved(
            reason::SECRET_NOT_FOUND,
            format!("Secret {namespace}/{} (tls.secretRef) does not exist", reference.name),
        )
    })?;
    let pem = |key: &str| {
        secret_bytes(&secret, key)
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .map(|text| Pem::Value(sluice_core::Secret::new(text)))
    };
    tls.ca = pem("ca.crt");
    (tls.client_cert, tls.client_key) = (pem("tls.crt"), pem("tls.key"));
    if tls.ca.is_none() && tls.client_cert.is_none() {
        return Err(Problem::unresolved(
            reason::SECRET_NOT_FOUND,
            format!("Secret {namespace}/{} holds neither ca.crt nor tls.crt", reference.name),
        ));
    }
    if tls.client_cert.is_some() != tls.client_key.is_some() {
        return Err(Problem::invalid(format!(
            "Secret {namespace}/{}: tls.crt and tls.key go together",
            reference.name
        )));
    }
    Ok(())
}

/// The declaration an MCPRoute asks for, with its Secrets resolved: what
/// [`route`] does for an AIModelRoute's backends, for its servers.
/// `plugin_exists` as there.
#[cfg(test)]
pub fn mcp_route(
    route: &MCPRoute,
    secrets: &impl Secrets,
    tenancy: &Tenancy,
    plugin_exists: impl Fn(&ResourceKey) -> bool,
) -> Result<McpRouteDecl, Problem> {
    mcp_route_redacted(route, secrets, tenancy, plugin_exists).0
}

/// [`mcp_route`], and the Secret values it read (even if it then failed).
pub fn mcp_route_redacted(
    route: &MCPRoute,
    secrets: &impl Secrets,
    tenancy: &Tenancy,
    plugin_exists: impl Fn(&ResourceKey) -> bool,
) -> (Result<McpRouteDecl, Problem>, Redactions) {
    let mut redactions = Redactions::default();
    (resolve_mcp_route(route, secrets, tenancy, plugin_exists, &mut redactions), redactions)
}

fn resolve_mcp_route(
    route: &MCPRoute,
    secrets: &impl Secrets,
    tenancy: &Tenancy,
    plugin_exists: impl Fn(&ResourceKey) -> bool,
    redactions: &mut Redactions,
) -> Result<McpRouteDecl, Problem> {
    // A server is an upstream like a backend: the same files, variables
    // and addresses are the gateway's own to lend or not.
    for server in &route.spec.servers {
        let key = (server.api_key_file.as_deref(), server.api_key_env.as_deref());
        lent_to_upstream(tenancy, &server.url, key, server.tls.as_ref())?;
    }
    let mut decl = route.decl(Path::new("/")).map_err(Problem::invalid)?;
    let namespace = &decl.key.namespace;
    if !tenancy.allows_mcp_path(namespace, &decl.path) {
        return Err(Problem {
            condition: Condition::Accepted,
            reason: reason::PATH_NOT_PERMITTED,
            message: format!(
                "namespace `{namespace}` may not claim MCP path `{}`: the gateway's operator grants MCP paths to \
                 namespaces (--mcp-path-claim)",
                decl.path
            ),
        });
    }
    if let Some(missing) = decl.plugins.iter().find(|key| !plugin_exists(key)) {
        return Err(Problem::unresolved(reason::PLUGIN_NOT_FOUND, format!("GatewayPlugin {missing} does not exist")));
    }
    let namespace = decl.key.namespace.clone();
    for (server, spec) in decl.servers.iter_mut().zip(&route.spec.servers) {
        if let Some(selector) = &spec.api_key_secret_ref {
            let key = secret_text(secrets, &namespace, selector)?;
            redactions.add(&key);
            server.api_key = Some(ApiKeySource::Value(sluice_core::Secret::new(key.trim().to_string())));
        }
        if let Some(tls) = &mut server.tls {
            tls_from_secret(tls, spec.tls.as_ref(), secrets, &namespace)?;
        }
    }
    Ok(decl)
}

/// A file of the gateway's host may be read for a resource only in a
/// directory its operator allows: a route's author would otherwise have any
/// file the gateway can read (its ServiceAccount token) sent to a backend of
/// their choosing.
fn host_file(tenancy: &Tenancy, field: &str, file: &str) -> Result<(), Problem> {
    let path = Path::new(file);
    if !path.is_absolute() {
        return Err(Problem::invalid(format!(
            "{field} `{file}` must be an absolute path (a volume mounted into the gateway) in Kubernetes"
        )));
    }
    if tenancy.allows_file(path) {
        return Ok(());
    }
    Err(Problem::not_permitted(if tenancy.host_file_dirs.is_empty() {
        format!(
            "{field} `{file}`: this gateway reads no file of its own for a resource \
             (its operator may allow a directory with --allow-host-files-under)"
        )
    } else {
        let dirs: Vec<_> = tenancy.host_file_dirs.iter().map(|d| d.display().to_string()).collect();
        format!("{field} `{file}` is not in a directory this gateway allows ({})", dirs.join(", "))
    }))
}

/// Routes that claim a model an older route already claims lose it: they are
/// not served, and say why. Age is creation time, then name, so every
/// replica decides the same way; the rule itself is core's.
pub fn model_conflicts(routes: &[(&AIModelRoute, &RouteDecl)]) -> HashMap<ResourceKey, Problem> {
    let mut by_age: Vec<_> = routes.iter().collect();
    by_age.sort_by_key(|(route, decl)| (route.creation_timestamp().map(|t| t.0), decl.key.clone()));
    let conflicts = sluice_core::config::model_conflicts(by_age.into_iter().map(|(_, decl)| *decl));
    conflicts
        .into_iter()
        .map(|ModelConflict { route, model, owner }| {
            let problem = Problem {
                condition: Condition::Accepted,
                reason: reason::MODEL_CONFLICT,
                message: format!("model `{model}` is already served by the older AIModelRoute {owner}"),
            };
            (route, problem)
        })
        .collect()
}

/// MCPRoutes that claim a path an older MCPRoute serves lose it, as
/// [`model_conflicts`] for models: age is creation time, then name, and the
/// rule is core's ([`DesiredConfig::mcp_conflicts`]).
pub fn path_conflicts(routes: &[(&MCPRoute, &McpRouteDecl)]) -> HashMap<ResourceKey, Problem> {
    let mut by_age: Vec<_> = routes.iter().collect();
    by_age.sort_by_key(|(route, decl)| (route.creation_timestamp().map(|t| t.0), decl.key.clone()));
    let keys: HashMap<String, &ResourceKey> =
        by_age.iter().map(|(_, decl)| (format!("MCPRoute {}", decl.key), &decl.key)).collect();
    let desired =
        DesiredConfig { mcp_routes: by_age.iter().map(|(_, decl)| (*decl).clone()).collect(), ..Default::default() };
    desired
        .mcp_conflicts()
        .into_iter()
        .filter_map(|error| {
            let key = keys.get(&error.resource)?;
            let problem =
                Problem { condition: Condition::Accepted, reason: reason::PATH_CONFLICT, message: error.message };
            Some(((*key).clone(), problem))
        })
        .collect()
}

fn secret_text(secrets: &impl Secrets, namespace: &str, selector: &SecretKeySelector) -> Result<String, Problem> {
    let secret = secrets.get(namespace, &selector.name).ok_or_else(|| {
        Problem::unresolved(reason::SECRET_NOT_FOUND, format!("Secret {namespace}/{} does not exist", selector.name))
    })?;
    let bytes = secret_bytes(&secret, &selector.key).ok_or_else(|| {
        Problem::unresolved(
            reason::SECRET_KEY_NOT_FOUND,
            format!("Secret {namespace}/{} has no key `{}`", selector.name, selector.key),
        )
    })?;
    String::from_utf8(bytes).map_err(|_| {
        Problem::unresolved(
            reason::INVALID_SECRET_VALUE,
            format!("Secret {namespace}/{} key `{}` is not UTF-8", selector.name, selector.key),
        )
    })
}

fn secret_bytes(secret: &Secret, key: &str) -> Option<Vec<u8>> {
    if let Some(value) = secret.data.as_ref().and_then(|data| data.get(key)) {
        return Some(value.0.clone());
    }
    secret.string_data.as_ref().and_then(|data| data.get(key)).map(|value| value.clone().into_bytes())
}

fn pull_credentials(
    secrets: &impl Secrets,
    namespace: &str,
    name: &str,
    redactions: &mut Redactions,
) -> Result<RegistryCredentials, Problem> {
    let secret = secrets.get(namespace, name).ok_or_else(|| {
        Problem::unresolved(reason::SECRET_NOT_FOUND, format!("Secret {namespace}/{name} does not exist"))
    })?;
    let text = |key: &str| {
        secret_bytes(&secret, key).and_then(|b| String::from_utf8(b).ok()).ok_or_else(|| {
            Problem::unresolved(
                reason::SECRET_KEY_NOT_FOUND,
                format!("Secret {namespace}/{name} has no UTF-8 key `{key}`"),
            )
        })
    };
    match secret.type_.as_deref() {
        Some("kubernetes.io/dockerconfigjson") => {
            let config = text(".dockerconfigjson")?;
            redactions.add_strings(&serde_json::from_str(&config).unwrap_or_default());
            Ok(RegistryCredentials::DockerConfigJson(sluice_core::Secret::new(config)))
        }
        Some("kubernetes.io/basic-auth") => {
            let password = text("password")?;
            redactions.add(&password);
            Ok(RegistryCredentials::Basic { username: text("username")?, password: sluice_core::Secret::new(password) })
        }
        other => Err(Problem::unresolved(
            reason::UNSUPPORTED_SECRET_TYPE,
            format!(
                "pull Secret {namespace}/{name} has type `{}`; use kubernetes.io/dockerconfigjson or kubernetes.io/basic-auth",
                other.unwrap_or("Opaque")
            ),
        )),
    }
}

/// Sets `value` at a JSON Pointer (RFC 6901), creating objects on the way;
/// `-` appends to an array.
pub fn set_pointer(target: &mut Value, pointer: &str, value: Value) -> Result<(), String> {
    let Some(rest) = pointer.strip_prefix('/') else { return Err("a JSON Pointer starts with /".into()) };
    let tokens: Vec<String> = rest.split('/').map(|t| t.replace("~1", "/").replace("~0", "~")).collect();
    let mut here = target;
    for (i, token) in tokens.iter().enumerate() {
        let last = i + 1 == tokens.len();
        if here.is_null() {
            *here = Value::Object(Default::default());
        }
        here = match here {
            Value::Object(map) => {
                if last {
                    map.insert(token.clone(), value);
                    return Ok(());
                }
                map.entry(token.clone()).or_insert(Value::Null)
            }
            Value::Array(items) => {
                let index = if token == "-" {
                    items.push(Value::Null);
                    items.len() - 1
                } else {
                    token
                        .parse::<usize>()
                        .ok()
                        .filter(|i| *i < items.len())
                        .ok_or_else(|| format!("`{token}` is not an index of the array there"))?
                };
                if last {
                    items[index] = value;
                    return Ok(());
                }
                &mut items[index]
            }
            _ => return Err(format!("`{token}` is below a value that is neither an object nor an array")),
        };
    }
    // An empty last token ("/") names the key "" and returns above.
    Err("empty JSON Pointer".into())
}

/// A map of Secrets for tests and for reading from a reflector store.
impl Secrets for HashMap<(String, String), std::sync::Arc<Secret>> {
    fn get(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<Secret>> {
        HashMap::get(self, &(namespace.to_string(), name.to_string())).cloned()
    }
}

impl Secrets for kube::runtime::reflector::Store<Secret> {
    fn get(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<Secret>> {
        kube::runtime::reflector::Store::get(self, &kube::runtime::reflector::ObjectRef::new(name).within(namespace))
    }
}

#[cfg(test)]
mod tests;
