use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition as StatusCondition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sluice_core::{
    ApiKeySource, BackendDecl, BackendTimeouts, BackendTls, Condition, Conditions, Fallback, OutlierPolicy, Pem,
    Provider, ResourceKey, RetryPolicy, RouteDecl, config::Endpoints,
};

use crate::{LocalObjectReference, ReplicaStatus, SecretKeySelector};

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
    /// Upstreams. Requests are spread over the backends of the lowest
    /// `priority` by `weight`; a request that fails on one is retried on the
    /// next as `retry` allows, and higher priorities take traffic only while
    /// every lower one is ejected or has failed the request.
    #[schemars(length(min = 1, max = 64))]
    pub backends: Vec<BackendSpec>,
    /// The plugin chain, in order: GatewayPlugins in this route's namespace.
    #[serde(default)]
    pub plugins: Vec<PluginRefSpec>,
    /// How long to wait for an upstream's response head, in milliseconds
    /// (default 300000), unless a backend's `timeouts.firstByteMs` says
    /// otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub timeout_ms: Option<u64>,
    /// When a failed attempt is tried again. Without it, a backend that
    /// cannot be connected to is skipped for the next one, and nothing else
    /// is retried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetrySpec>,
    /// Passive health: a backend failing repeatedly is ejected for a while.
    /// On by default (5 consecutive failures, 10 s growing to 300 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outlier_detection: Option<OutlierDetectionSpec>,
    /// Other models to serve the request when this route's backends fail,
    /// in order: the request is routed again as if it had named that model
    /// (its route's plugins and backends), which must be served by a route
    /// in this namespace. At most 3 fallbacks are followed per request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub fallbacks: Vec<FallbackSpec>,
    /// The endpoints this route serves (default: every forwarded one). It
    /// serves only those its every plugin understands too (a plugin's
    /// `endpoints`); a request to any other is answered 404
    /// `unsupported_endpoint` before a plugin runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub endpoints: Option<Vec<EndpointSpec>>,
}

/// A forwarded OpenAI endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum EndpointSpec {
    #[serde(rename = "/v1/chat/completions")]
    ChatCompletions,
    #[serde(rename = "/v1/completions")]
    Completions,
    #[serde(rename = "/v1/embeddings")]
    Embeddings,
    #[serde(rename = "/v1/responses")]
    Responses,
}

impl EndpointSpec {
    pub fn path(self) -> &'static str {
        match self {
            EndpointSpec::ChatCompletions => "/v1/chat/completions",
            EndpointSpec::Completions => "/v1/completions",
            EndpointSpec::Embeddings => "/v1/embeddings",
            EndpointSpec::Responses => "/v1/responses",
        }
    }
}

/// The domain's set of `endpoints`, every forwarded one if absent.
pub(crate) fn endpoints(list: Option<&[EndpointSpec]>) -> Result<Endpoints, String> {
    match list {
        None => Ok(Endpoints::ALL),
        Some(list) => Endpoints::parse(&list.iter().map(|e| e.path()).collect::<Vec<_>>()),
    }
}

/// A failure a retry or fallback policy can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ConditionSpec {
    /// The connection could not be made: nothing reached the backend.
    ConnectFailure,
    /// The connection broke after the request was sent and before a
    /// response head: the backend may have acted on the request.
    Reset,
    /// No response head in time: the backend may have acted on the request.
    Timeout,
    /// 429.
    RateLimited,
    /// 503 or 529.
    Overloaded,
    /// Any other 5xx.
    ServerError,
    /// The prompt is too long for the model (OpenAI's
    /// `context_length_exceeded`, from the backend or a plugin).
    ContextLengthExceeded,
}

impl From<ConditionSpec> for Condition {
    fn from(spec: ConditionSpec) -> Self {
        match spec {
            ConditionSpec::ConnectFailure => Condition::ConnectFailure,
            ConditionSpec::Reset => Condition::Reset,
            ConditionSpec::Timeout => Condition::Timeout,
            ConditionSpec::RateLimited => Condition::RateLimited,
            ConditionSpec::Overloaded => Condition::Overloaded,
            ConditionSpec::ServerError => Condition::ServerError,
            ConditionSpec::ContextLengthExceeded => Condition::ContextLengthExceeded,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetrySpec {
    /// Attempts in all, the first included (default: one per backend, at
    /// least 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10))]
    pub attempts: Option<u32>,
    /// The failures that are retried (default: ConnectFailure, RateLimited
    /// and Overloaded, where the backend did no work). A response already
    /// streaming to the client is never retried.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 7))]
    // Not `on`: YAML 1.1 parsers (kubectl's among them) read that key as
    // `true`. Istio's name for the same list.
    pub retry_on: Vec<ConditionSpec>,
    /// Deadline for each attempt's response head, in milliseconds, when
    /// shorter than the backend's first-byte timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub per_try_timeout_ms: Option<u64>,
    /// Exponential backoff with full jitter between attempts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<BackoffSpec>,
    /// A `retry-after` (or `retry-after-ms`) up to this long is waited for
    /// when the same backend is retried; a longer one takes the backend out
    /// of rotation for that long. Default 10000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retry_after_ms: Option<u64>,
    /// At most this share of the route's requests in flight may be retries,
    /// so retries cannot multiply an outage's load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<RetryBudgetSpec>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackoffSpec {
    /// The first retry waits up to this long, each next one twice as long
    /// (default 25).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_ms: Option<u64>,
    /// The longest wait (default 250).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ms: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetryBudgetSpec {
    /// Retries in flight as a percentage of requests in flight (default 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100))]
    pub percent: Option<u32>,
    /// Retries in flight allowed whatever the percentage (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_concurrency: Option<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OutlierDetectionSpec {
    /// Failures in a row (connect failures, resets, timeouts, 429 and 5xx)
    /// that eject a backend; 0 turns ejection off. Default 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_failures: Option<u32>,
    /// The first ejection lasts this long, each next one longer by as much
    /// (default 10000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub base_ejection_ms: Option<u64>,
    /// The longest ejection (default 300000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_ejection_ms: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FallbackSpec {
    /// A model served by a route in this namespace.
    #[schemars(length(min = 1))]
    pub model: String,
    /// The failures that send the request there (default: all of them but
    /// Reset and Timeout).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 7))]
    pub when: Vec<ConditionSpec>,
}

/// The API a backend speaks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProviderSpec {
    /// OpenAI-compatible: passed through.
    #[default]
    Openai,
    /// Anthropic's Messages API: chat completions are translated to it and
    /// back, streams included.
    Anthropic,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackendTimeoutsSpec {
    /// Connecting, TLS included (default 10000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub connect_ms: Option<u64>,
    /// Sending the request to the response head (default: the route's
    /// `timeoutMs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub first_byte_ms: Option<u64>,
    /// Between two chunks of the response (default: the gateway's
    /// `--upstream-idle-timeout-seconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub idle_ms: Option<u64>,
    /// The whole exchange, the response body included (default: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub total_ms: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackendTlsSpec {
    /// PEM file of the CA certificates to trust for this backend instead of
    /// the public roots. Files are for standalone mode; in Kubernetes only
    /// absolute paths under `--allow-host-files-under` are accepted: use
    /// `secretRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub ca_file: Option<String>,
    /// PEM file of the client certificate chain, for mutual TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub cert_file: Option<String>,
    /// PEM file of the client certificate's private key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub key_file: Option<String>,
    /// A Secret in the route's namespace holding `ca.crt` and/or `tls.crt`
    /// and `tls.key` (a `kubernetes.io/tls` Secret), used instead of files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<LocalObjectReference>,
    /// The name to send in SNI and to verify the certificate against,
    /// instead of the URL's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub server_name: Option<String>,
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
    /// A name for the backend, unique in the route (a DNS label): a plugin
    /// routes a request to it by name (`set-backend`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"))]
    pub name: Option<String>,
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
    /// The API it speaks: `openai` (default) or `anthropic`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ProviderSpec>,
    /// Its share of the traffic among backends of its priority (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub weight: Option<u32>,
    /// Lower is preferred (default 0): a backend takes traffic only while
    /// every backend of a lower priority is ejected or has failed the
    /// request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100))]
    pub priority: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<BackendTimeoutsSpec>,
    /// How the backend's certificate is verified and the gateway's own
    /// presented (HTTPS URLs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<BackendTlsSpec>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PluginRefSpec {
    /// Name of a GatewayPlugin in the route's namespace.
    #[schemars(length(min = 1, max = 253))]
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
    pub conditions: Vec<StatusCondition>,
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
        let keys = self.spec.backends.iter().filter_map(|b| b.api_key_secret_ref.as_ref()).map(|r| r.name.as_str());
        let tls =
            self.spec.backends.iter().filter_map(|b| b.tls.as_ref()?.secret_ref.as_ref()).map(|r| r.name.as_str());
        keys.chain(tls)
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
        let backends: Vec<BackendDecl> =
            spec.backends.iter().map(|b| backend_decl(b, base_dir)).collect::<Result<_, _>>()?;
        let mut names: Vec<&str> = backends.iter().filter_map(|b| b.name.as_deref()).collect();
        names.sort_unstable();
        if let Some(twice) = names.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(format!("spec.backends: two backends are named `{}`", twice[0]));
        }
        let mut route = RouteDecl::new(key, spec.models.clone());
        route.backends = backends;
        route.plugins =
            spec.plugins.iter().map(|p| ResourceKey::new(route.key.namespace.clone(), p.name.clone())).collect();
        route.endpoints = endpoints(spec.endpoints.as_deref()).map_err(|e| format!("spec.{e}"))?;
        route.timeout =
            spec.timeout_ms.map(|ms| Duration::from_millis(ms.max(1))).unwrap_or(RouteDecl::DEFAULT_TIMEOUT);
        if let Some(retry) = &spec.retry {
            route.retry = retry_policy(retry, spec.backends.len())?;
        }
        if let Some(outlier) = &spec.outlier_detection {
            let defaults = OutlierPolicy::default();
            route.outlier = OutlierPolicy {
                consecutive_failures: outlier.consecutive_failures.unwrap_or(defaults.consecutive_failures),
                base_ejection: outlier.base_ejection_ms.map_or(defaults.base_ejection, Duration::from_millis),
                max_ejection: outlier.max_ejection_ms.map_or(defaults.max_ejection, Duration::from_millis),
            };
        }
        for fallback in &spec.fallbacks {
            if spec.models.contains(&fallback.model) {
                return Err(format!("fallback model `{}` is one of this route's own models", fallback.model));
            }
            let on = if fallback.when.is_empty() {
                Condition::ALL.into_iter().filter(|c| !matches!(c, Condition::Reset | Condition::Timeout)).collect()
            } else {
                conditions(&fallback.when)
            };
            route.fallbacks.push(Fallback { model: fallback.model.clone(), on });
        }
        Ok(route)
    }
}

fn conditions(list: &[ConditionSpec]) -> Conditions {
    list.iter().map(|c| Condition::from(*c)).collect()
}

fn retry_policy(spec: &RetrySpec, backends: usize) -> Result<RetryPolicy, String> {
    let defaults = RetryPolicy::default();
    let backoff = spec.backoff.clone().unwrap_or_default();
    let base = backoff.base_ms.map_or(defaults.backoff_base, Duration::from_millis);
    let max = backoff.max_ms.map_or(defaults.backoff_max.max(base), Duration::from_millis);
    if max < base {
        return Err(format!(
            "retry.backoff.maxMs ({} ms) is less than baseMs ({} ms)",
            max.as_millis(),
            base.as_millis()
        ));
    }
    let budget = spec.budget.clone().unwrap_or_default();
    Ok(RetryPolicy {
        attempts: Some(spec.attempts.unwrap_or(backends.max(2) as u32).clamp(1, RetryPolicy::MAX_ATTEMPTS)),
        on: if spec.retry_on.is_empty() { RetryPolicy::default_conditions() } else { conditions(&spec.retry_on) },
        per_try_timeout: spec.per_try_timeout_ms.map(|ms| Duration::from_millis(ms.max(1))),
        backoff_base: base,
        backoff_max: max,
        max_retry_after: spec.max_retry_after_ms.map_or(defaults.max_retry_after, Duration::from_millis),
        budget_percent: budget.percent.unwrap_or(defaults.budget_percent).min(100),
        budget_min_concurrency: budget.min_concurrency.unwrap_or(defaults.budget_min_concurrency),
    })
}

fn backend_decl(b: &BackendSpec, base_dir: &std::path::Path) -> Result<BackendDecl, String> {
    let url = b.url.trim_end_matches('/');
    let https = url.starts_with("https://");
    let host = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
    if host.is_none_or(|host| host.is_empty() || host.starts_with('/')) {
        return Err(format!("backend url `{}` must start with http:// or https:// and a host", b.url));
    }
    let api_key =
        api_key_source(b.api_key_env.as_deref(), b.api_key_file.as_deref(), b.api_key_secret_ref.is_some(), base_dir)
            .map_err(|e| format!("a backend {e}"))?;
    let mut decl = BackendDecl::new(url);
    if let Some(name) = &b.name {
        let label = name.len() <= 63
            && name.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
            && !name.starts_with('-')
            && !name.ends_with('-');
        if !label || name.is_empty() {
            return Err(format!("backend name `{name}` is not a DNS label (lower-case letters, digits, `-`)"));
        }
        decl.name = Some(name.clone());
    }
    decl.model = b.model.clone();
    decl.api_key = api_key;
    decl.provider = match b.provider.unwrap_or_default() {
        ProviderSpec::Openai => Provider::OpenAi,
        ProviderSpec::Anthropic => Provider::Anthropic,
    };
    decl.weight = b.weight.unwrap_or(BackendDecl::DEFAULT_WEIGHT).max(1);
    decl.priority = b.priority.unwrap_or(0);
    if let Some(t) = &b.timeouts {
        let ms = |v: Option<u64>| v.map(|ms| Duration::from_millis(ms.max(1)));
        decl.timeouts = BackendTimeouts {
            connect: ms(t.connect_ms),
            first_byte: ms(t.first_byte_ms),
            idle: ms(t.idle_ms),
            total: ms(t.total_ms),
        };
    }
    if let Some(tls) = &b.tls {
        if !https {
            return Err(format!("backend `{}` sets `tls` but is not an https:// URL", b.url));
        }
        decl.tls = Some(tls_decl(tls, base_dir)?);
    }
    Ok(decl)
}

/// Where an upstream's API key comes from (a backend's or an MCP server's),
/// if anywhere: the error completes "a backend …" or "a server …".
pub(crate) fn api_key_source(
    env: Option<&str>,
    file: Option<&str>,
    secret_ref: bool,
    base_dir: &std::path::Path,
) -> Result<Option<ApiKeySource>, String> {
    // An apiKeySecretRef is resolved by the Kubernetes controller, which has the Secrets.
    match (env, file, secret_ref) {
        (Some(var), None, false) => Ok(Some(ApiKeySource::Env(var.to_string()))),
        (None, Some(file), false) => Ok(Some(ApiKeySource::File(base_dir.join(PathBuf::from(file))))),
        (None, None, _) => Ok(None),
        _ => Err("sets more than one of apiKeyEnv, apiKeyFile and apiKeySecretRef".into()),
    }
}

/// An upstream's TLS settings (a backend's or an MCP server's), files
/// relative to `base_dir`; a `secretRef`'s PEM is the controller's to fill.
pub(crate) fn tls_decl(tls: &BackendTlsSpec, base_dir: &std::path::Path) -> Result<BackendTls, String> {
    let file = |f: &Option<String>| f.as_ref().map(|f| Pem::File(base_dir.join(f)));
    if tls.cert_file.is_some() != tls.key_file.is_some() {
        return Err("tls.certFile and tls.keyFile go together".into());
    }
    if tls.secret_ref.is_some() && (tls.ca_file.is_some() || tls.cert_file.is_some()) {
        return Err("tls.secretRef replaces tls.caFile, certFile and keyFile: set one or the other".into());
    }
    if let Some(name) = &tls.server_name
        && (name.is_empty() || rustls_pki_name(name).is_none())
    {
        return Err(format!("tls.serverName `{name}` is not a DNS name or IP address"));
    }
    Ok(BackendTls {
        ca: file(&tls.ca_file),
        client_cert: file(&tls.cert_file),
        client_key: file(&tls.key_file),
        server_name: tls.server_name.clone(),
    })
}

/// Whether `name` could be a server name: a DNS name's characters or an IP
/// address. The data plane's TLS library has the last word.
fn rustls_pki_name(name: &str) -> Option<()> {
    let dns = name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty() && label.len() <= 63 && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    (dns || name.parse::<std::net::IpAddr>().is_ok()).then_some(())
}
