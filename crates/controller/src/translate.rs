//! From custom resources and Secrets to the data plane's declarations. Pure
//! functions over what the watches hold, so every replica computes the same
//! desired config, and the leader the same conditions.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use serde_json::Value;
use sluice_api::{AIModelRoute, GatewayPlugin, SecretKeySelector, ValueFormat};
use sluice_core::{ApiKeySource, PluginDecl, PluginSource, RegistryCredentials, ResourceKey, RouteDecl};

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
        Problem { condition: Condition::Accepted, reason: "Invalid", message: message.into() }
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
/// resolved.
pub fn plugin(plugin: &GatewayPlugin, secrets: &impl Secrets) -> Result<PluginDecl, Problem> {
    if let Some(file) = &plugin.spec.source.file
        && !Path::new(file).is_absolute()
    {
        return Err(Problem::invalid(format!(
            "source.file `{file}` must be an absolute path (a volume mounted into the gateway) in Kubernetes"
        )));
    }
    let mut decl = plugin.decl(Path::new("/")).map_err(Problem::invalid)?;
    let namespace = decl.key.namespace.clone();
    for from in &plugin.spec.config_from {
        let text = secret_text(secrets, &namespace, &from.secret_key_ref)?;
        let value = match from.format.unwrap_or_default() {
            ValueFormat::Text => Value::String(text),
            ValueFormat::Json => serde_json::from_str(&text).map_err(|e| {
                // serde_json's message names a position, never the content.
                Problem::unresolved(
                    "InvalidSecretValue",
                    format!(
                        "Secret {}/{} key `{}` is not JSON: {e}",
                        namespace, from.secret_key_ref.name, from.secret_key_ref.key
                    ),
                )
            })?,
        };
        set_pointer(&mut decl.config, &from.path, value)
            .map_err(|e| Problem::invalid(format!("configFrom path `{}`: {e}", from.path)))?;
    }
    if let Some(reference) = &plugin.spec.source.pull_secret_ref
        && let PluginSource::Oci { credentials, .. } = &mut decl.source
    {
        *credentials = Some(pull_credentials(secrets, &namespace, &reference.name)?);
    }
    Ok(decl)
}

/// The declaration an AIModelRoute asks for. `plugin_exists` tells whether a
/// GatewayPlugin is declared, so a typo is reported here rather than as a
/// load failure.
pub fn route(
    route: &AIModelRoute,
    secrets: &impl Secrets,
    plugin_exists: impl Fn(&ResourceKey) -> bool,
) -> Result<RouteDecl, Problem> {
    let mut decl = route.decl(Path::new("/")).map_err(Problem::invalid)?;
    if let Some(missing) = decl.plugins.iter().find(|key| !plugin_exists(key)) {
        return Err(Problem::unresolved("PluginNotFound", format!("GatewayPlugin {missing} does not exist")));
    }
    for (backend, spec) in decl.backends.iter_mut().zip(&route.spec.backends) {
        if let Some(selector) = &spec.api_key_secret_ref {
            let key = secret_text(secrets, &decl.key.namespace, selector)?;
            backend.api_key = Some(ApiKeySource::Value(sluice_core::Secret::new(key.trim().to_string())));
        }
    }
    Ok(decl)
}

/// Routes that claim a model an older route already claims lose it: they are
/// not served, and say why. Age is creation time, then name, so every
/// replica decides the same way.
pub fn model_conflicts(routes: &[(&AIModelRoute, &RouteDecl)]) -> HashMap<ResourceKey, Problem> {
    let mut by_age: Vec<_> = routes.iter().collect();
    by_age.sort_by_key(|(route, decl)| (route.creation_timestamp().map(|t| t.0), decl.key.clone()));
    let mut owner: BTreeMap<&str, &ResourceKey> = BTreeMap::new();
    let mut conflicts = HashMap::new();
    for (_, decl) in by_age {
        if let Some((model, older)) = decl.models.iter().find_map(|m| owner.get(m.as_str()).map(|o| (m, *o))) {
            conflicts.insert(
                decl.key.clone(),
                Problem {
                    condition: Condition::Accepted,
                    reason: "ModelConflict",
                    message: format!("model `{model}` is already served by the older AIModelRoute {older}"),
                },
            );
            continue;
        }
        for model in &decl.models {
            owner.insert(model, &decl.key);
        }
    }
    conflicts
}

fn secret_text(secrets: &impl Secrets, namespace: &str, selector: &SecretKeySelector) -> Result<String, Problem> {
    let secret = secrets.get(namespace, &selector.name).ok_or_else(|| {
        Problem::unresolved("SecretNotFound", format!("Secret {namespace}/{} does not exist", selector.name))
    })?;
    let bytes = secret_bytes(&secret, &selector.key).ok_or_else(|| {
        Problem::unresolved(
            "SecretKeyNotFound",
            format!("Secret {namespace}/{} has no key `{}`", selector.name, selector.key),
        )
    })?;
    String::from_utf8(bytes).map_err(|_| {
        Problem::unresolved(
            "InvalidSecretValue",
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

fn pull_credentials(secrets: &impl Secrets, namespace: &str, name: &str) -> Result<RegistryCredentials, Problem> {
    let secret = secrets
        .get(namespace, name)
        .ok_or_else(|| Problem::unresolved("SecretNotFound", format!("Secret {namespace}/{name} does not exist")))?;
    let text = |key: &str| {
        secret_bytes(&secret, key).and_then(|b| String::from_utf8(b).ok()).ok_or_else(|| {
            Problem::unresolved("SecretKeyNotFound", format!("Secret {namespace}/{name} has no UTF-8 key `{key}`"))
        })
    };
    match secret.type_.as_deref() {
        Some("kubernetes.io/dockerconfigjson") => {
            Ok(RegistryCredentials::DockerConfigJson(sluice_core::Secret::new(text(".dockerconfigjson")?)))
        }
        Some("kubernetes.io/basic-auth") => Ok(RegistryCredentials::Basic {
            username: text("username")?,
            password: sluice_core::Secret::new(text("password")?),
        }),
        other => Err(Problem::unresolved(
            "UnsupportedSecretType",
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
        let decl = super::plugin(&plugin, &store).unwrap();
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

    #[test]
    fn missing_secrets_and_keys_are_unresolved_refs_without_values() {
        let plugin = gateway_plugin(json!({
            "source": {"oci": "r.example/p:1"},
            "configFrom": [{"path": "/k", "secretKeyRef": {"name": "s", "key": "missing"}}]
        }));
        let problem = super::plugin(&plugin, &secrets(&[])).unwrap_err();
        assert_eq!((problem.condition, problem.reason), (Condition::ResolvedRefs, "SecretNotFound"));
        let problem = super::plugin(&plugin, &secrets(&[secret("s", None, &[("other", "v")])])).unwrap_err();
        assert_eq!(problem.reason, "SecretKeyNotFound");
        let bad_json = gateway_plugin(json!({
            "source": {"oci": "r.example/p:1"},
            "configFrom": [{"path": "/k", "secretKeyRef": {"name": "s", "key": "v"}, "format": "Json"}]
        }));
        let problem = super::plugin(&bad_json, &secrets(&[secret("s", None, &[("v", "sup3r-secret")])])).unwrap_err();
        assert_eq!(problem.reason, "InvalidSecretValue");
        assert!(!problem.message.contains("sup3r"), "{}", problem.message);
    }

    #[test]
    fn pull_secrets_of_other_types_are_refused() {
        let plugin = gateway_plugin(json!({"source": {"oci": "r.example/p:1", "pullSecretRef": {"name": "o"}}}));
        let problem = super::plugin(&plugin, &secrets(&[secret("o", Some("Opaque"), &[])])).unwrap_err();
        assert_eq!(problem.reason, "UnsupportedSecretType");
    }

    #[test]
    fn relative_files_are_refused_in_kubernetes() {
        let plugin = gateway_plugin(json!({"source": {"file": "p.wasm"}}));
        assert_eq!(super::plugin(&plugin, &secrets(&[])).unwrap_err().condition, Condition::Accepted);
        let plugin = gateway_plugin(json!({"source": {"file": "/plugins/p.wasm"}}));
        assert!(super::plugin(&plugin, &secrets(&[])).is_ok());
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
            "spec": {"models": models, "backends": [{"url": "http://127.0.0.1:1/v1"}]}
        }))
        .unwrap()
    }

    #[test]
    fn the_older_route_keeps_a_contested_model() {
        let older = ai_route("b-older", "2026-01-01T00:00:00Z", &["m1"]);
        let newer = ai_route("a-newer", "2026-02-01T00:00:00Z", &["m2", "m1"]);
        let decls: Vec<_> =
            [&newer, &older].iter().map(|r| super::route(r, &secrets(&[]), |_| true).unwrap()).collect();
        let pairs = vec![(&newer, &decls[0]), (&older, &decls[1])];
        let conflicts = model_conflicts(&pairs);
        assert_eq!(conflicts.len(), 1);
        let problem = &conflicts[&ResourceKey::new("team", "a-newer")];
        assert_eq!(problem.reason, "ModelConflict");
        assert!(problem.message.contains("team/b-older"), "{}", problem.message);
    }

    #[test]
    fn a_route_naming_a_missing_plugin_is_unresolved() {
        let mut route = ai_route("r", "2026-01-01T00:00:00Z", &["m"]);
        route.spec.plugins = vec![sluice_api::PluginRefSpec { name: "nope".into() }];
        let problem = super::route(&route, &secrets(&[]), |_| false).unwrap_err();
        assert_eq!(problem.reason, "PluginNotFound");
    }
}
