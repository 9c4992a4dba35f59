use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sluice_core::{ApiKeySource, BackendDecl, ResourceKey, RouteDecl};

use crate::{ReplicaStatus, SecretKeySelector};

/// Which model names go to which OpenAI-compatible upstreams, and which
/// plugins run on the way.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "sluice.dev",
    version = "v1alpha1",
    kind = "AIModelRoute",
    doc = "Which model names go to which OpenAI-compatible upstreams, and which plugins run on the way.",
    namespaced,
    status = "AIModelRouteStatus",
    shortname = "amr",
    category = "sluice",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Models","type":"string","jsonPath":".spec.models"}"#,
    printcolumn = r#"{"name":"Plugins","type":"string","jsonPath":".spec.plugins[*].name"}"#,
    printcolumn = r#"{"name":"Loaded","type":"string","jsonPath":".status.loaded"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AIModelRouteSpec {
    /// Model names this route serves, matched exactly against the request's
    /// `model`. A namespace may claim only the models the gateway grants it
    /// (`--model-claim`; by default the gateway's own namespace claims every
    /// model, and no other namespace any), and of two routes claiming one
    /// model the older serves it.
    #[schemars(length(min = 1))]
    pub models: Vec<String>,
    /// OpenAI-compatible upstreams, tried in turn; a backend that cannot be
    /// connected to is skipped for the next one.
    #[schemars(length(min = 1))]
    pub backends: Vec<BackendSpec>,
    /// The plugin chain, in order: GatewayPlugins in this route's namespace.
    #[serde(default)]
    pub plugins: Vec<PluginRefSpec>,
    /// How long to wait for an upstream's response head, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub timeout_ms: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new(
    "(has(self.apiKeyEnv) ? 1 : 0) + (has(self.apiKeyFile) ? 1 : 0) + (has(self.apiKeySecretRef) ? 1 : 0) <= 1"
).message("set at most one of apiKeyEnv, apiKeyFile and apiKeySecretRef"))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackendSpec {
    /// Base URL, e.g. `https://api.openai.com/v1`; `/chat/completions` etc. are appended.
    #[schemars(regex(pattern = "^https?://"))]
    pub url: String,
    /// Model name sent upstream in place of the client's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Environment variable of the gateway holding the backend's API key,
    /// sent as `Authorization: Bearer`. For standalone mode: in Kubernetes
    /// only the variables the gateway's operator allows
    /// (`--allow-host-env`) are accepted; use `apiKeySecretRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// File holding the backend's API key, relative to the YAML file. For
    /// standalone mode: in Kubernetes only an absolute path in a directory
    /// the gateway's operator allows (`--allow-host-files-under`) is
    /// accepted; use `apiKeySecretRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // `..` is the gateway's to refuse: `contains` on a string of unbounded
    // length costs more than a CRD's CEL budget.
    #[x_kube(validation = Rule::new("self.startsWith('/')").message("apiKeyFile must be an absolute path in Kubernetes"))]
    pub api_key_file: Option<String>,
    /// Secret key holding the backend's API key (Kubernetes), in the
    /// route's namespace. A rotated Secret is picked up without a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_secret_ref: Option<SecretKeySelector>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PluginRefSpec {
    /// Name of a GatewayPlugin in the route's namespace.
    pub name: String,
}

/// Observed state of an AIModelRoute, written by the gateway replica that
/// holds the leader Lease from every replica's load report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AIModelRouteStatus {
    /// The `metadata.generation` these conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted` (valid, its models granted to its namespace, and none
    /// taken by an older route),
    /// `ResolvedRefs` (its plugins and Secrets exist) and `Ready` (every
    /// gateway replica serves this generation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Gateway replicas serving this generation, out of the live replicas: `2/2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loaded: Option<String>,
    /// Each live gateway replica's view.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<ReplicaStatus>,
}

impl AIModelRoute {
    /// Names of the Secrets this route reads, in its namespace.
    pub fn secret_names(&self) -> impl Iterator<Item = &str> {
        self.spec.backends.iter().filter_map(|b| b.api_key_secret_ref.as_ref()).map(|r| r.name.as_str())
    }

    pub fn key(&self) -> ResourceKey {
        ResourceKey::new(crate::namespace_or_default(&self.metadata), self.metadata.name.clone().unwrap_or_default())
    }

    pub fn decl(&self, base_dir: &std::path::Path) -> Result<RouteDecl, String> {
        let spec = &self.spec;
        if spec.models.is_empty() {
            return Err("spec.models is empty".into());
        }
        if spec.backends.is_empty() {
            return Err("spec.backends is empty".into());
        }
        let key = self.key();
        let backends = spec
            .backends
            .iter()
            .map(|b| {
                let url = b.url.trim_end_matches('/');
                let host = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
                if host.is_none_or(|host| host.is_empty() || host.starts_with('/')) {
                    return Err(format!("backend url `{}` must start with http:// or https:// and a host", b.url));
                }
                // An apiKeySecretRef is resolved by the Kubernetes controller, which has the Secrets.
                let api_key = match (&b.api_key_env, &b.api_key_file, &b.api_key_secret_ref) {
                    (Some(var), None, None) => Some(ApiKeySource::Env(var.clone())),
                    (None, Some(file), None) => Some(ApiKeySource::File(base_dir.join(PathBuf::from(file)))),
                    (None, None, _) => None,
                    _ => return Err("a backend sets more than one of apiKeyEnv, apiKeyFile and apiKeySecretRef".into()),
                };
                Ok(BackendDecl { url: b.url.trim_end_matches('/').to_string(), model: b.model.clone(), api_key })
            })
            .collect::<Result<_, _>>()?;
        Ok(RouteDecl {
            plugins: spec.plugins.iter().map(|p| ResourceKey::new(key.namespace.clone(), p.name.clone())).collect(),
            key,
            models: spec.models.clone(),
            backends,
            timeout: spec.timeout_ms.map(|ms| Duration::from_millis(ms.max(1))).unwrap_or(RouteDecl::DEFAULT_TIMEOUT),
        })
    }
}
