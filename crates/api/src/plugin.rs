use std::path::PathBuf;
use std::time::Duration;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sluice_core::{FailurePolicy, Isolation, PluginDecl, PluginSource, PullPolicy, ResourceKey};

/// A WebAssembly component plugin and how to run it. Routes list plugins by
/// name to build their chain.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "sluice.dev",
    version = "v1alpha1",
    kind = "GatewayPlugin",
    doc = "A WebAssembly component plugin and how to run it; AIModelRoutes list plugins by name to build their chain.",
    namespaced,
    status = "GatewayPluginStatus",
    shortname = "gp",
    category = "sluice",
    printcolumn = r#"{"name":"Digest","type":"string","jsonPath":".status.digest"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewayPluginSpec {
    /// Where the Wasm component comes from.
    pub source: PluginSourceSpec,
    /// Expected sha256 of the module (64 lower-case hex digits). A module
    /// with any other digest is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Plugin configuration, handed to the plugin's `configure` as JSON. The
    /// plugin validates it once per version; a rejected config is reported
    /// and that version is not served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_json")]
    pub config: Option<serde_json::Value>,
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
    /// `PerRequest` (the default) gives every request a fresh instance.
    /// `Reused` lets an instance serve requests one after another, for
    /// guests that are slow to instantiate (Python): state the plugin keeps
    /// in memory carries over between requests, and an instance that fails
    /// is discarded.
    #[serde(default)]
    pub isolation: IsolationSpec,
    /// With `isolation: Reused`, how many idle instances are kept between
    /// requests (default 16). Busier moments instantiate more, and the
    /// extras are dropped afterwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub max_reused_instances: Option<u32>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum IsolationSpec {
    #[default]
    PerRequest,
    Reused,
}

/// Where to load a component from: exactly one of `oci` and `file`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
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
    /// A path to a `.wasm` component. In standalone mode a relative path
    /// resolves against the directory of the YAML file that declares it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
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

/// Observed state of a GatewayPlugin.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayPluginStatus {
    /// `sha256:<hex>` of the module being served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

fn any_json(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "Plugin configuration, handed to the plugin's `configure` as JSON.",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

impl GatewayPlugin {
    pub fn key(&self) -> ResourceKey {
        ResourceKey::new(crate::namespace_or_default(&self.metadata), self.metadata.name.clone().unwrap_or_default())
    }

    /// The domain declaration, with a relative `source.file` resolved
    /// against `base_dir`.
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
            },
            (None, Some(file)) if !file.is_empty() => {
                if spec.source.pull_policy.is_some() {
                    return Err("spec.source.pullPolicy applies to `oci` sources only".into());
                }
                let path = PathBuf::from(file);
                PluginSource::File(if path.is_absolute() { path } else { base_dir.join(path) })
            }
            (Some(_), Some(_)) => return Err("spec.source needs exactly one of `oci` and `file`, not both".into()),
            _ => return Err("spec.source needs exactly one of `oci` and `file` (non-empty)".into()),
        };
        Ok(PluginDecl {
            key: self.key(),
            source,
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
            isolation: match spec.isolation {
                IsolationSpec::PerRequest => Isolation::PerRequest,
                IsolationSpec::Reused => Isolation::Reused {
                    max_idle: spec.max_reused_instances.unwrap_or(Isolation::DEFAULT_MAX_IDLE).max(1),
                },
            },
        })
    }
}
