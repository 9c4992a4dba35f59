//! What the data plane reports back after applying a desired config: for
//! each resource, whether it is served and which version.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ResourceKey;

/// The outcome of applying one [`crate::DesiredConfig`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// The `revision` of the desired config this is about.
    pub revision: u64,
    pub plugins: BTreeMap<ResourceKey, LoadState>,
    pub routes: BTreeMap<ResourceKey, LoadState>,
    pub mcp_routes: BTreeMap<ResourceKey, LoadState>,
    /// Each route's backends this replica has out of rotation now (passive
    /// health), by label; routes with none are left out. Refreshed as
    /// ejections start and end, between configs.
    pub ejected: BTreeMap<ResourceKey, Vec<String>>,
}

/// One resource's state in the data plane.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadState {
    /// The declared version is being served.
    pub ready: bool,
    /// For a plugin: `sha256:<hex>` of the module being served, which is the
    /// last good one when `ready` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Why the declared version is not served: a CamelCase reason
    /// (`PullFailed`, `DigestMismatch`, `LoadFailed`, …) and a message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl LoadState {
    pub fn ready(digest: Option<String>) -> Self {
        Self { ready: true, digest, reason: None, error: None }
    }

    pub fn failed(reason: &str, error: impl Into<String>, serving: Option<String>) -> Self {
        Self { ready: false, digest: serving, reason: Some(reason.to_string()), error: Some(error.into()) }
    }
}
