use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sluice_core::{
    EgressDestination, EgressGrant, FailurePolicy, Isolation, Pem, Phase, PluginDecl, PluginSource, PullPolicy,
    ResourceKey, Secret, StateGrant, VerifyKeys,
};

use crate::{LocalObjectReference, ReplicaStatus, SecretKeySelector};

/// A WebAssembly component plugin and how to run it. Routes list plugins by
/// name to build their chain.
#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "sluice.dev",
    version = "v1alpha1",
    kind = "GatewayPlugin",
    doc = "A WebAssembly component plugin and how to run it; AIModelRoutes list plugins by name to build their chain.",
    namespaced,
    status = "GatewayPluginStatus",
    shortname = "gp",
    category = "sluice",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Loaded","type":"string","jsonPath":".status.loaded"}"#,
    printcolumn = r#"{"name":"Digest","type":"string","jsonPath":".status.shortDigest"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new(
    "!(has(self.phase) && self.phase == 'Auth' && has(self.failurePolicy) && self.failurePolicy == 'Open')"
).message("an Auth plugin must fail closed: failurePolicy: Open would let requests through unauthenticated when it fails"))]
#[x_kube(validation = Rule::new("!has(self.verify) || has(self.source.oci)")
    .message("verify applies to oci sources only: a file is trusted as the gateway's own"))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewayPluginSpec {
    /// Where the Wasm component comes from.
    pub source: PluginSourceSpec,
    /// Expected sha256 of the module (64 lower-case hex digits). A module
    /// with any other digest is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = "^[0-9a-f]{64}$"))]
    pub sha256: Option<String>,
    /// Where the plugin runs in a route's chain. `Auth` plugins run before
    /// all others, whatever the route's order, and must fail closed.
    /// `Filter` (the default) plugins run in the route's order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<PhaseSpec>,
    /// Plugin configuration, handed to the plugin's `configure` as JSON. The
    /// plugin validates it once per version; a rejected config is reported
    /// and that version is not served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_json")]
    pub config: Option<serde_json::Value>,
    /// Values from Secrets, each set into `config` at a JSON Pointer
    /// (`/apiKeys/0`, `/jwt/secret`), creating objects on the way. They are
    /// never logged or written to status, and a change to the Secret reaches
    /// the plugin without a change to this resource.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config_from: Vec<ConfigFromSpec>,
    /// What a failing plugin (trap, timeout, memory limit) does to the
    /// request: `Closed` fails it with a 500, `Open` skips the plugin.
    #[serde(default)]
    pub failure_policy: FailurePolicySpec,
    /// Deadline for each call into the plugin, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 60000))]
    pub timeout_ms: Option<u32>,
    /// Cap on the plugin's linear memory, in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4096))]
    pub max_memory_mi_b: Option<u32>,
    /// `PerRequest` (the default) gives every request a fresh instance,
    /// started from a snapshot taken after `configure` (about 10 µs per
    /// plugin for Rust or C): nothing one request leaves in the plugin's
    /// memory can reach another. `Reused` lets an instance serve requests
    /// one after another, as proxy-wasm hosts do, which saves that cost and
    /// suits guests that are slow to instantiate (Python, JavaScript): state
    /// the plugin keeps in memory carries over between requests (the Rust
    /// SDK resets its per-request state, a plugin's own globals are its
    /// business), and an instance that fails is discarded.
    #[serde(default)]
    pub isolation: IsolationSpec,
    /// With `isolation: Reused`, how many idle instances are kept between
    /// requests (default 16). Busier moments instantiate more, and the
    /// extras are dropped afterwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub max_reused_instances: Option<u32>,
    /// The endpoints whose requests this plugin understands (default: every
    /// forwarded one). A plugin that reads or edits content declares the
    /// endpoints whose shape it reads, e.g. `[/v1/chat/completions]`; a
    /// route using it then serves only those. Plugins that do not read the
    /// body (auth, headers) understand every endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub endpoints: Option<Vec<crate::route::EndpointSpec>>,
    /// Grants the plugin shared state (`sluice:plugin/state`): counters in
    /// time windows and entries with a TTL, in the gateway's store (in
    /// process, or Redis shared by every replica), under keys only this
    /// plugin can reach. A component that imports state without this grant
    /// is refused at load. `{}` grants it with the gateway's per-plugin caps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<StateSpec>,
    /// Grants outbound HTTP (`wasi:http/outgoing-handler`, each language's
    /// usual client) to the listed destinations and nowhere else: no other
    /// host, port or scheme, no redirect elsewhere, and no loopback,
    /// link-local or cloud-metadata address unless a destination names it
    /// by address. A component that imports outbound HTTP without this
    /// grant is refused at load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressSpec>,
    /// Requires a cosign signature (key-based, as `cosign sign --key` or
    /// `sluice push --sign` writes it) on the manifest `source.oci`
    /// resolves to, verified under one of `keys` before the module is
    /// loaded. A module without one, or whose signatures verify under no
    /// listed key or name another digest, is not loaded (`SignatureMissing`,
    /// `SignatureInvalid`), and the last good version keeps serving.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<VerifySpec>,
}

/// How a plugin's signature is verified.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VerifySpec {
    /// Cosign public keys (ECDSA P-256, `cosign.pub`); a signature under
    /// any one of them is enough.
    #[schemars(length(min = 1, max = 16))]
    pub keys: Vec<VerifyKeySpec>,
}

/// One public key: exactly one of `pem`, `file` and `secretRef`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new("(has(self.pem) ? 1 : 0) + (has(self.file) ? 1 : 0) + (has(self.secretRef) ? 1 : 0) == 1")
    .message("set exactly one of pem, file and secretRef"))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VerifyKeySpec {
    /// The PEM public key itself (`-----BEGIN PUBLIC KEY-----`, the
    /// contents of `cosign.pub`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536))]
    pub pem: Option<String>,
    /// A PEM file holding the key. In standalone mode a relative path
    /// resolves against the directory of the YAML file that declares it. In
    /// Kubernetes it is a file on a volume mounted into the gateway, by
    /// absolute path, and only in a directory the gateway's operator allows
    /// (`--allow-host-files-under`); otherwise use `pem` or `secretRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// A key of a Secret in the plugin's namespace holding the PEM key
    /// (Kubernetes mode). A change to the Secret reaches the gateway without
    /// a change to this resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretKeySelector>,
}

/// Where a plugin may call, and its caps; each cap is at most the
/// gateway's (`--egress-max-response-bytes`,
/// `--egress-max-concurrent-calls`), which applies where none is given.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EgressSpec {
    /// The destinations, as `https://host[:port]` or `http://host[:port]`.
    #[schemars(length(min = 1, max = 32))]
    pub destinations: Vec<EgressDestinationSpec>,
    /// Each call's deadline in milliseconds (default: what is left of the
    /// plugin's `timeoutMs`, which bounds every call anyway).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 60000))]
    pub timeout_ms: Option<u32>,
    /// The largest response body a call may read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_response_bytes: Option<u64>,
    /// Calls in flight at once over all the plugin's instances; one more
    /// is refused at once, not queued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_concurrent_calls: Option<u32>,
}

/// One destination a plugin may call.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EgressDestinationSpec {
    /// `https://host[:port]` or `http://host[:port]`: no path. The host is
    /// a DNS name or an IP address.
    #[schemars(regex(pattern = "^https?://"))]
    pub url: String,
    /// A PEM file of CA certificates trusted for this destination besides
    /// the public roots (standalone mode; in Kubernetes use `caSecretRef`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// A Secret in the plugin's namespace whose `ca.crt` is trusted for
    /// this destination besides the public roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret_ref: Option<LocalObjectReference>,
}

/// A plugin's shared state and its caps; each cap is at most the gateway's
/// per-plugin one (`--state-max-keys-per-plugin`,
/// `--state-max-bytes-per-plugin`), which applies where none is given.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StateSpec {
    /// Keys (counters and entries) the plugin may hold at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_keys: Option<u64>,
    /// Bytes of keys and values the plugin may hold at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_bytes: Option<u64>,
}

/// A Secret value set into the plugin config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigFromSpec {
    /// JSON Pointer (RFC 6901) into `config` where the value goes, e.g. `/auth/secret`.
    #[x_kube(validation = Rule::new("self.startsWith('/')").message("path is a JSON Pointer, starting with /"))]
    pub path: String,
    /// The Secret key holding the value, in the plugin's namespace.
    pub secret_key_ref: SecretKeySelector,
    /// `Text` (the default) sets the value as a JSON string; `Json` parses it,
    /// so a Secret can hold a list or an object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<ValueFormat>,
}

/// How a Secret value is read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ValueFormat {
    #[default]
    Text,
    Json,
}

/// Where a plugin runs in a route's chain.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PhaseSpec {
    Auth,
    #[default]
    Filter,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum IsolationSpec {
    #[default]
    PerRequest,
    Reused,
}

/// Where to load a component from: exactly one of `oci` and `file`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new("has(self.oci) != has(self.file)").message("set exactly one of source.oci and source.file"))]
#[x_kube(validation = Rule::new("has(self.oci) || !(has(self.pullPolicy) || has(self.pullSecretRef))")
    .message("pullPolicy and pullSecretRef apply to oci sources only"))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PluginSourceSpec {
    /// An OCI reference to the component: `registry/repo:tag`,
    /// `registry/repo@sha256:<hex>`, or `registry/repo:tag@sha256:<hex>`.
    /// A tag is resolved to a digest and the module is loaded by digest.
    /// Accepted layouts: the CNCF Wasm artifact (`application/wasm`),
    /// Istio/Envoy's `application/vnd.module.wasm.content.layer.v1+wasm`,
    /// and an image whose single layer is a tar holding `plugin.wasm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oci: Option<String>,
    /// When `oci` names a tag: `IfNotPresent` (the default) resolves it once
    /// and serves the cached module from then on, even across restarts;
    /// `Always` resolves it on every load and periodically while serving, so
    /// a moved tag is picked up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_policy: Option<PullPolicySpec>,
    /// A Secret in the plugin's namespace with the registry credentials:
    /// `kubernetes.io/dockerconfigjson` (the entry for the registry's host)
    /// or `kubernetes.io/basic-auth` (`username` and `password`). Without
    /// it, the gateway's own credentials are used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_secret_ref: Option<LocalObjectReference>,
    /// A path to a `.wasm` component. In standalone mode a relative path
    /// resolves against the directory of the YAML file that declares it.
    /// In Kubernetes it is a file on a volume mounted into the gateway, by
    /// absolute path, and only in a directory the gateway's operator allows
    /// (`--allow-host-files-under`); otherwise use `oci`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // `..` is the gateway's to refuse: `contains` on a string of unbounded
    // length costs more than a CRD's CEL budget.
    #[x_kube(validation = Rule::new("self.startsWith('/')").message("source.file must be an absolute path in Kubernetes"))]
    pub file: Option<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PullPolicySpec {
    #[default]
    IfNotPresent,
    Always,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum FailurePolicySpec {
    #[default]
    Closed,
    Open,
}

/// Observed state of a GatewayPlugin, written by the gateway replica that
/// holds the leader Lease from every replica's load report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayPluginStatus {
    /// The `metadata.generation` these conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted` (the spec is valid), `ResolvedRefs` (referenced Secrets
    /// exist and hold the keys) and `Ready` (every gateway replica serves
    /// this generation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// `sha256:<hex>` of the module being served (the last good one while a
    /// new version fails).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// The first 12 hex digits of `digest`, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub short_digest: Option<String>,
    /// Gateway replicas serving this generation, out of the live replicas: `2/2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loaded: Option<String>,
    /// Each live gateway replica's view.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<ReplicaStatus>,
}

/// The grant `spec.egress` asks for; a `caSecretRef` is left for the
/// Kubernetes controller to resolve.
fn egress_grant(spec: &EgressSpec, base_dir: &std::path::Path) -> Result<EgressGrant, String> {
    if spec.destinations.is_empty() || spec.destinations.len() > 32 {
        return Err("spec.egress.destinations needs 1 to 32 destinations".into());
    }
    let mut destinations = Vec::with_capacity(spec.destinations.len());
    for (i, d) in spec.destinations.iter().enumerate() {
        let mut destination =
            EgressDestination::parse(d.url.trim()).map_err(|e| format!("spec.egress.destinations[{i}].url: {e}"))?;
        if d.ca_file.is_some() && d.ca_secret_ref.is_some() {
            return Err(format!("spec.egress.destinations[{i}]: set caFile or caSecretRef, not both"));
        }
        if (d.ca_file.is_some() || d.ca_secret_ref.is_some()) && !destination.https {
            return Err(format!("spec.egress.destinations[{i}]: a CA applies to https:// destinations only"));
        }
        destination.ca = d.ca_file.as_ref().map(|f| Pem::File(base_dir.join(f)));
        destinations.push(destination);
    }
    Ok(EgressGrant {
        destinations,
        timeout: spec.timeout_ms.map(|ms| Duration::from_millis(ms.max(1).into())),
        max_response_bytes: spec.max_response_bytes,
        max_concurrent_calls: spec.max_concurrent_calls,
    })
}

/// The keys `spec.verify` lists; a `secretRef` is left for the Kubernetes
/// controller to fill in, as a value that is no key, so a key left
/// unresolved fails verification rather than being skipped.
fn verify_keys(spec: &VerifySpec, base_dir: &std::path::Path) -> Result<VerifyKeys, String> {
    if spec.keys.is_empty() || spec.keys.len() > 16 {
        return Err("spec.verify.keys needs 1 to 16 keys".into());
    }
    let keys = spec
        .keys
        .iter()
        .enumerate()
        .map(|(i, key)| match (&key.pem, &key.file, &key.secret_ref) {
            (Some(pem), None, None) => Ok(Pem::Value(Secret::new(pem.clone()))),
            (None, Some(file), None) if !file.is_empty() => Ok(Pem::File(base_dir.join(file))),
            (None, None, Some(_)) => Ok(Pem::Value(Secret::new(String::new()))),
            _ => Err(format!("spec.verify.keys[{i}]: set exactly one of pem, file and secretRef")),
        })
        .collect::<Result<_, _>>()?;
    Ok(VerifyKeys { keys })
}

fn any_json(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "Plugin configuration, handed to the plugin's `configure` as JSON.",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

impl GatewayPlugin {
    /// Names of the Secrets this plugin reads, in its namespace.
    pub fn secret_names(&self) -> impl Iterator<Item = &str> {
        let config = self.spec.config_from.iter().map(|c| c.secret_key_ref.name.as_str());
        let egress = self.spec.egress.iter().flat_map(|e| &e.destinations);
        config
            .chain(self.spec.source.pull_secret_ref.iter().map(|r| r.name.as_str()))
            .chain(egress.filter_map(|d| d.ca_secret_ref.as_ref()).map(|r| r.name.as_str()))
            .chain(self.verify_secret_refs().map(|r| r.name.as_str()))
    }

    /// The Secret keys `spec.verify` names.
    pub fn verify_secret_refs(&self) -> impl Iterator<Item = &SecretKeySelector> {
        self.spec.verify.iter().flat_map(|v| &v.keys).filter_map(|k| k.secret_ref.as_ref())
    }

    pub fn key(&self) -> ResourceKey {
        ResourceKey::new(crate::namespace_or_default(&self.metadata), self.metadata.name.clone().unwrap_or_default())
    }

    /// The domain declaration, with a relative `source.file` resolved
    /// against `base_dir`. Secret references (`configFrom`,
    /// `source.pullSecretRef`) are left for the caller to resolve.
    pub fn decl(&self, base_dir: &std::path::Path) -> Result<PluginDecl, String> {
        let spec = &self.spec;
        if let Some(pin) = &spec.sha256
            && !(pin.len() == 64 && pin.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
        {
            return Err(format!("spec.sha256 must be 64 lower-case hex digits, got `{pin}`"));
        }
        let source = match (&spec.source.oci, &spec.source.file) {
            (Some(reference), None) if !reference.trim().is_empty() => PluginSource::Oci {
                reference: reference.trim().to_string(),
                pull_policy: match spec.source.pull_policy.unwrap_or_default() {
                    PullPolicySpec::IfNotPresent => PullPolicy::IfNotPresent,
                    PullPolicySpec::Always => PullPolicy::Always,
                },
                // Resolved by the Kubernetes controller, which has the Secrets.
                credentials: None,
                verify: spec.verify.as_ref().map(|verify| verify_keys(verify, base_dir)).transpose()?,
            },
            (None, Some(file)) if !file.is_empty() => {
                if spec.source.pull_policy.is_some() || spec.source.pull_secret_ref.is_some() {
                    return Err("spec.source.pullPolicy and pullSecretRef apply to `oci` sources only".into());
                }
                if spec.verify.is_some() {
                    return Err("spec.verify applies to `oci` sources only".into());
                }
                let path = PathBuf::from(file);
                PluginSource::File(if path.is_absolute() { path } else { base_dir.join(path) })
            }
            (Some(_), Some(_)) => return Err("spec.source needs exactly one of `oci` and `file`, not both".into()),
            _ => return Err("spec.source needs exactly one of `oci` and `file` (non-empty)".into()),
        };
        let phase = match spec.phase.unwrap_or_default() {
            PhaseSpec::Auth => Phase::Auth,
            PhaseSpec::Filter => Phase::Filter,
        };
        if phase == Phase::Auth && spec.failure_policy == FailurePolicySpec::Open {
            return Err("an Auth plugin must fail closed; failurePolicy: Open is refused".into());
        }
        Ok(PluginDecl {
            key: self.key(),
            source,
            phase,
            sha256: spec.sha256.clone(),
            config: spec.config.clone().unwrap_or_else(|| serde_json::json!({})),
            failure_policy: match spec.failure_policy {
                FailurePolicySpec::Closed => FailurePolicy::Closed,
                FailurePolicySpec::Open => FailurePolicy::Open,
            },
            timeout: spec
                .timeout_ms
                .map(|ms| Duration::from_millis(ms.max(1).into()))
                .unwrap_or(PluginDecl::DEFAULT_TIMEOUT),
            max_memory_bytes: spec.max_memory_mi_b.unwrap_or(PluginDecl::DEFAULT_MAX_MEMORY_MIB).max(1) as usize
                * 1024
                * 1024,
            endpoints: crate::route::endpoints(spec.endpoints.as_deref()).map_err(|e| format!("spec.{e}"))?,
            state: spec.state.as_ref().map(|state| StateGrant { max_keys: state.max_keys, max_bytes: state.max_bytes }),
            egress: spec.egress.as_ref().map(|egress| egress_grant(egress, base_dir)).transpose()?,
            isolation: match spec.isolation {
                IsolationSpec::PerRequest => Isolation::PerRequest,
                IsolationSpec::Reused => Isolation::Reused {
                    max_idle: spec.max_reused_instances.unwrap_or(Isolation::DEFAULT_MAX_IDLE).max(1),
                },
            },
        })
    }
}
