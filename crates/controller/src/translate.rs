//! From custom resources and Secrets to the data plane's declarations. Pure
//! functions over what the watches hold, so every replica computes the same
//! desired config, and the leader the same conditions.

use std::collections::HashMap;
use std::path::Path;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use serde_json::Value;
use sluice_api::{AIModelRoute, GatewayPlugin, SecretKeySelector, ValueFormat};
use sluice_core::{
    ApiKeySource, ModelConflict, Pem, PluginDecl, PluginSource, Redactions, RegistryCredentials, ResourceKey,
    RouteDecl, reason,
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
    // Without a pull Secret of its own, a plugin pulls with the operator's
    // credentials only where the operator lends them.
    if let PluginSource::Oci { credentials: credentials @ None, .. } = &mut decl.source
        && !tenancy.lends_registry_credentials(&namespace)
    {
        *credentials = Some(RegistryCredentials::Anonymous);
    }
    Ok(decl)
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
        if let Some(file) = &backend.api_key_file {
            host_file(tenancy, "apiKeyFile", file)?;
        }
        if let Some(tls) = &backend.tls {
            for (field, file) in
                [("tls.caFile", &tls.ca_file), ("tls.certFile", &tls.cert_file), ("tls.keyFile", &tls.key_file)]
            {
                if let Some(file) = file {
                    host_file(tenancy, field, file)?;
                }
            }
        }
        if let Some(why) = tenancy.backends.refuses_url(&backend.url) {
            return Err(Problem::not_permitted(why));
        }
        if let Some(name) = &backend.api_key_env
            && !tenancy.allows_env(name)
        {
            return Err(Problem::not_permitted(format!(
                "apiKeyEnv `{name}`: this gateway lends a resource no environment variable of its own unless its \
                 operator allows it (--allow-host-env); use apiKeySecretRef"
            )));
        }
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
        if let (Some(tls), Some(reference)) = (&mut backend.tls, spec.tls.as_ref().and_then(|t| t.secret_ref.as_ref()))
        {
            let secret = secrets.get(&decl.key.namespace, &reference.name).ok_or_else(|| {
                Problem::unresolved(
                    reason::SECRET_NOT_FOUND,
                    format!("Secret {}/{} (tls.secretRef) does not exist", decl.key.namespace, reference.name),
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
                    format!("Secret {}/{} holds neither ca.crt nor tls.crt", decl.key.namespace, reference.name),
                ));
            }
            if tls.client_cert.is_some() != tls.client_key.is_some() {
                return Err(Problem::invalid(format!(
                    "Secret {}/{}: tls.crt and tls.key go together",
                    decl.key.namespace, reference.name
                )));
            }
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
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use k8s_openapi::ByteString;
    use serde_json::json;

    use super::*;

    fn secret(name: &str, type_: Option<&str>, data: &[(&str, &str)]) -> Arc<Secret> {
        Arc::new(Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("team".into()),
                ..Default::default()
            },
            type_: type_.map(str::to_string),
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Default::default()
        })
    }

    fn secrets(list: &[Arc<Secret>]) -> HashMap<(String, String), Arc<Secret>> {
        list.iter().map(|s| (("team".to_string(), s.name_any()), s.clone())).collect()
    }

    /// The default grants of a gateway in namespace `team`.
    fn tenancy() -> Tenancy {
        Tenancy::default().resolved("team")
    }

    fn gateway_plugin(spec: Value) -> GatewayPlugin {
        serde_json::from_value(json!({
            "apiVersion": "sluice.dev/v1alpha1", "kind": "GatewayPlugin",
            "metadata": {"name": "p", "namespace": "team"}, "spec": spec
        }))
        .unwrap()
    }

    #[test]
    fn config_from_sets_secret_values_at_pointers_and_never_prints_them() {
        let plugin = gateway_plugin(json!({
            "source": {"oci": "r.example/p:1", "pullSecretRef": {"name": "pull"}},
            "config": {"jwt": {"issuer": "me"}},
            "configFrom": [
                {"path": "/jwt/secret", "secretKeyRef": {"name": "s", "key": "hmac"}},
                {"path": "/apiKeys", "secretKeyRef": {"name": "s", "key": "keys"}, "format": "Json"},
                {"path": "/new~1key", "secretKeyRef": {"name": "s", "key": "hmac"}}
            ]
        }));
        let store = secrets(&[
            secret("s", None, &[("hmac", "hunter2"), ("keys", r#"["a","b"]"#)]),
            secret("pull", Some("kubernetes.io/basic-auth"), &[("username", "u"), ("password", "pw")]),
        ]);
        let decl = super::plugin(&plugin, &store, &tenancy()).unwrap();
        assert_eq!(
            decl.config,
            json!({"jwt": {"issuer": "me", "secret": "hunter2"}, "apiKeys": ["a", "b"], "new/key": "hunter2"})
        );
        let PluginSource::Oci { credentials: Some(credentials), .. } = &decl.source else {
            panic!("{:?}", decl.source)
        };
        assert!(!format!("{credentials:?}").contains("pw"));
        assert!(
            matches!(credentials, RegistryCredentials::Basic { username, password } if username == "u" && password.expose() == "pw")
        );
    }

    /// A tenant's plugin that names no pull Secret must not pull with the
    /// operator's registry account (a confused deputy: the operator's
    /// private repositories would be every tenant's).
    #[test]
    fn only_namespaces_the_operator_names_pull_with_its_registry_credentials() {
        let source = json!({"source": {"oci": "r.example/p:1"}});
        let in_namespace = |namespace: &str| -> GatewayPlugin {
            serde_json::from_value(json!({
                "apiVersion": "sluice.dev/v1alpha1", "kind": "GatewayPlugin",
                "metadata": {"name": "p", "namespace": namespace}, "spec": source
            }))
            .unwrap()
        };
        let credentials =
            |plugin: &GatewayPlugin, tenancy: &Tenancy| match super::plugin(plugin, &secrets(&[]), tenancy)
                .unwrap()
                .source
            {
                PluginSource::Oci { credentials, .. } => credentials,
                other => panic!("{other:?}"),
            };
        // By default: the gateway's own namespace borrows them, no other.
        assert_eq!(credentials(&in_namespace("team"), &tenancy()), None);
        assert_eq!(credentials(&in_namespace("team-b"), &tenancy()), Some(RegistryCredentials::Anonymous));
        // Named namespaces replace the default.
        let lent =
            Tenancy { registry_credential_namespaces: vec!["team-b".into()], ..Tenancy::default() }.resolved("team");
        assert_eq!(credentials(&in_namespace("team-b"), &lent), None);
        assert_eq!(credentials(&in_namespace("team"), &lent), Some(RegistryCredentials::Anonymous));
        // A plugin's own pull Secret is its own, even where the operator's
        // credentials are not lent.
        let with_secret: GatewayPlugin = serde_json::from_value(json!({
            "apiVersion": "sluice.dev/v1alpha1", "kind": "GatewayPlugin",
            "metadata": {"name": "p", "namespace": "team"},
            "spec": {"source": {"oci": "r.example/p:1", "pullSecretRef": {"name": "pull"}}}
        }))
        .unwrap();
        let store =
            secrets(&[secret("pull", Some("kubernetes.io/basic-auth"), &[("username", "u"), ("password", "pw")])]);
        let decl = super::plugin(&with_secret, &store, &lent).unwrap();
        assert!(matches!(decl.source, PluginSource::Oci { credentials: Some(RegistryCredentials::Basic { .. }), .. }));
    }

    #[test]
    fn the_secret_values_read_are_redacted_in_any_form_a_message_quotes_them() {
        let plugin = gateway_plugin(json!({
            "source": {"oci": "r.example/p:1"},
            "configFrom": [
                {"path": "/value", "secretKeyRef": {"name": "s", "key": "text"}},
                {"path": "/keys", "secretKeyRef": {"name": "s", "key": "json"}, "format": "Json"},
                {"path": "/missing", "secretKeyRef": {"name": "s", "key": "absent"}}
            ]
        }));
        let store = secrets(&[secret("s", None, &[("text", "tab\tsecret\u{1}"), ("json", r#"{"k": ["sk-json-1"]}"#)])]);
        // The lookup fails at the third entry; the values read before it still count.
        let (result, redactions) = super::plugin_redacted(&plugin, &store, &tenancy());
        assert_eq!(result.unwrap_err().reason, reason::SECRET_KEY_NOT_FOUND);
        // As it is, as Rust's `{:?}` quotes it, and as JSON does.
        let text = "tab\tsecret\u{1}";
        let message = format!("value {text} or {text:?} or {}, key sk-json-1", serde_json::to_string(text).unwrap());
        assert_eq!(redactions.apply(&message), r#"value [redacted] or "[redacted]" or "[redacted]", key [redacted]"#);
        assert!(!format!("{redactions:?}").contains("secret"));

        let route =
            route_with_backend(json!({"url": "http://u.example/v1", "apiKeySecretRef": {"name": "k", "key": "v"}}));
        let store = secrets(&[secret("k", None, &[("v", " sk-route \n")])]);
        let (result, redactions) = super::route_redacted(&route, &store, &tenancy(), |_| true);
        assert!(result.is_ok());
        assert_eq!(redactions.apply("Bearer sk-route rejected; a key"), "Bearer [redacted] rejected; a key");
    }

    #[test]
    fn missing_secrets_and_keys_are_unresolved_refs_without_values() {
        let plugin = gateway_plugin(json!({
            "source": {"oci": "r.example/p:1"},
            "configFrom": [{"path": "/k", "secretKeyRef": {"name": "s", "key": "missing"}}]
        }));
        let problem = super::plugin(&plugin, &secrets(&[]), &tenancy()).unwrap_err();
        assert_eq!((problem.condition, problem.reason), (Condition::ResolvedRefs, "SecretNotFound"));
        let problem =
            super::plugin(&plugin, &secrets(&[secret("s", None, &[("other", "v")])]), &tenancy()).unwrap_err();
        assert_eq!(problem.reason, "SecretKeyNotFound");
        let bad_json = gateway_plugin(json!({
            "source": {"oci": "r.example/p:1"},
            "configFrom": [{"path": "/k", "secretKeyRef": {"name": "s", "key": "v"}, "format": "Json"}]
        }));
        let problem =
            super::plugin(&bad_json, &secrets(&[secret("s", None, &[("v", "sup3r-secret")])]), &tenancy()).unwrap_err();
        assert_eq!(problem.reason, "InvalidSecretValue");
        assert!(!problem.message.contains("sup3r"), "{}", problem.message);
    }

    #[test]
    fn pull_secrets_of_other_types_are_refused() {
        let plugin = gateway_plugin(json!({"source": {"oci": "r.example/p:1", "pullSecretRef": {"name": "o"}}}));
        let problem = super::plugin(&plugin, &secrets(&[secret("o", Some("Opaque"), &[])]), &tenancy()).unwrap_err();
        assert_eq!(problem.reason, "UnsupportedSecretType");
    }

    #[test]
    fn plugin_files_are_read_only_under_the_directories_the_gateway_allows() {
        let file = |path: &str| gateway_plugin(json!({"source": {"file": path}}));
        let refused = |path: &str, tenancy: &Tenancy| super::plugin(&file(path), &secrets(&[]), tenancy).unwrap_err();
        let problem = refused("/plugins/p.wasm", &tenancy());
        assert_eq!((problem.condition, problem.reason), (Condition::Accepted, reason::NOT_PERMITTED));
        assert_eq!(refused("/dev/zero", &tenancy()).reason, reason::NOT_PERMITTED);

        let allowed = Tenancy { host_file_dirs: vec!["/plugins".into()], ..tenancy() };
        let decl = super::plugin(&file("/plugins/p.wasm"), &secrets(&[]), &allowed).unwrap();
        assert_eq!(decl.source, PluginSource::File("/plugins/p.wasm".into()));
        assert_eq!(refused("/plugins-2/p.wasm", &allowed).reason, reason::NOT_PERMITTED);
        assert_eq!(refused("/dev/zero", &allowed).reason, reason::NOT_PERMITTED);
        assert_eq!(refused("/plugins/../etc/passwd", &allowed).reason, reason::NOT_PERMITTED);
        assert_eq!(refused("plugins/p.wasm", &allowed).reason, reason::INVALID);
    }

    fn route_with_backend(backend: Value) -> AIModelRoute {
        serde_json::from_value(json!({
            "apiVersion": "sluice.dev/v1alpha1", "kind": "AIModelRoute",
            "metadata": {"name": "r", "namespace": "team"},
            "spec": {"models": ["m"], "backends": [backend]}
        }))
        .unwrap()
    }

    #[test]
    fn api_keys_come_from_host_files_or_variables_only_where_the_gateway_allows() {
        let token = route_with_backend(json!({
            "url": "http://attacker.example/v1",
            "apiKeyFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"
        }));
        let home = route_with_backend(json!({"url": "http://attacker.example/v1", "apiKeyEnv": "HOME"}));
        for route in [&token, &home] {
            let problem = super::route(route, &secrets(&[]), &tenancy(), |_| true).unwrap_err();
            assert_eq!((problem.condition, problem.reason), (Condition::Accepted, reason::NOT_PERMITTED));
        }

        let allowed =
            Tenancy { host_file_dirs: vec!["/keys".into()], host_env_vars: vec!["OPENAI_KEY".into()], ..tenancy() };
        let refused = super::route(&token, &secrets(&[]), &allowed, |_| true).unwrap_err();
        assert_eq!(refused.reason, reason::NOT_PERMITTED);
        assert!(refused.message.contains("/keys"), "{}", refused.message);
        assert_eq!(super::route(&home, &secrets(&[]), &allowed, |_| true).unwrap_err().reason, reason::NOT_PERMITTED);
        let by_file = route_with_backend(json!({"url": "http://u.example/v1", "apiKeyFile": "/keys/openai"}));
        let decl = super::route(&by_file, &secrets(&[]), &allowed, |_| true).unwrap();
        assert_eq!(decl.backends[0].api_key, Some(ApiKeySource::File("/keys/openai".into())));
        let by_env = route_with_backend(json!({"url": "http://u.example/v1", "apiKeyEnv": "OPENAI_KEY"}));
        let decl = super::route(&by_env, &secrets(&[]), &allowed, |_| true).unwrap();
        assert_eq!(decl.backends[0].api_key, Some(ApiKeySource::Env("OPENAI_KEY".into())));
    }

    #[test]
    fn a_route_outside_the_namespaces_granted_a_model_is_refused() {
        let route = ai_route("r", "2026-01-01T00:00:00Z", &["m"]);
        assert!(super::route(&route, &secrets(&[]), &tenancy(), |_| true).is_ok());
        let elsewhere = Tenancy::default().resolved("sluice-system");
        let problem = super::route(&route, &secrets(&[]), &elsewhere, |_| true).unwrap_err();
        assert_eq!((problem.condition, problem.reason), (Condition::Accepted, reason::MODEL_NOT_PERMITTED));
        assert!(problem.message.contains("`team`") && problem.message.contains("`m`"), "{}", problem.message);
    }

    #[test]
    fn pointers_create_objects_append_to_arrays_and_refuse_scalars() {
        let mut value = json!({"list": [1], "n": 3});
        set_pointer(&mut value, "/a/b/c", json!(1)).unwrap();
        set_pointer(&mut value, "/list/-", json!(2)).unwrap();
        set_pointer(&mut value, "/list/0", json!(0)).unwrap();
        assert_eq!(value, json!({"a": {"b": {"c": 1}}, "list": [0, 2], "n": 3}));
        assert!(set_pointer(&mut value, "/n/x", json!(1)).is_err());
        assert!(set_pointer(&mut value, "/list/7", json!(1)).is_err());
        assert!(set_pointer(&mut value, "no-slash", json!(1)).is_err());
    }

    fn ai_route(name: &str, created: &str, models: &[&str]) -> AIModelRoute {
        serde_json::from_value(json!({
            "apiVersion": "sluice.dev/v1alpha1", "kind": "AIModelRoute",
            "metadata": {"name": name, "namespace": "team", "creationTimestamp": created},
            "spec": {"models": models, "backends": [{"url": "http://upstream.example:1/v1"}]}
        }))
        .unwrap()
    }

    /// A route's backend URL may not name the gateway's own loopback (its
    /// admin listener's config view) or the metadata service, unless the
    /// operator allows the range; its own listener ports stay refused even
    /// then.
    #[test]
    fn backends_in_the_gateways_own_network_position_are_not_permitted() {
        let with_url = |url: &str| {
            let mut route = ai_route("r", "2026-01-01T00:00:00Z", &["m"]);
            route.spec.backends[0].url = url.into();
            route
        };
        let tenancy = Tenancy {
            backends: sluice_core::BackendPolicy { restricted: true, own_ports: vec![9901], ..Default::default() },
            ..tenancy()
        };
        for url in ["http://127.0.0.1:9901/admin/config?", "http://169.254.169.254/latest/", "http://localhost:8000/v1"]
        {
            let problem = super::route(&with_url(url), &secrets(&[]), &tenancy, |_| true).unwrap_err();
            assert_eq!(problem.reason, reason::NOT_PERMITTED, "{url}");
            // The gateway's own listener port is refused as such (no range
            // allows it); the others name the flag that would.
            let why = if url.contains(":9901") { "own listeners" } else { "--allow-backend-cidr" };
            assert!(problem.message.contains(why), "{url}: {}", problem.message);
        }
        let allowed = Tenancy {
            backends: sluice_core::BackendPolicy {
                allowed: vec!["127.0.0.0/8".parse().unwrap()],
                ..tenancy.backends.clone()
            },
            ..tenancy.clone()
        };
        assert!(super::route(&with_url("http://127.0.0.1:8000/v1"), &secrets(&[]), &allowed, |_| true).is_ok());
        let own = super::route(&with_url("http://127.0.0.1:9901/admin/config?"), &secrets(&[]), &allowed, |_| true);
        assert!(own.unwrap_err().message.contains("own listeners"));
        assert!(super::route(&with_url("http://upstream.example/v1"), &secrets(&[]), &tenancy, |_| true).is_ok());
    }

    #[test]
    fn the_older_route_keeps_a_contested_model() {
        let older = ai_route("b-older", "2026-01-01T00:00:00Z", &["m1"]);
        let newer = ai_route("a-newer", "2026-02-01T00:00:00Z", &["m2", "m1"]);
        let decls: Vec<_> =
            [&newer, &older].iter().map(|r| super::route(r, &secrets(&[]), &tenancy(), |_| true).unwrap()).collect();
        let pairs = vec![(&newer, &decls[0]), (&older, &decls[1])];
        let conflicts = model_conflicts(&pairs);
        assert_eq!(conflicts.len(), 1);
        let problem = &conflicts[&ResourceKey::new("team", "a-newer")];
        assert_eq!(problem.reason, reason::MODEL_CONFLICT);
        assert!(problem.message.contains("team/b-older"), "{}", problem.message);
    }

    #[test]
    fn a_route_naming_a_missing_plugin_is_unresolved() {
        let mut route = ai_route("r", "2026-01-01T00:00:00Z", &["m"]);
        route.spec.plugins = vec![sluice_api::PluginRefSpec { name: "nope".into() }];
        let problem = super::route(&route, &secrets(&[]), &tenancy(), |_| false).unwrap_err();
        assert_eq!(problem.reason, "PluginNotFound");
    }
}
