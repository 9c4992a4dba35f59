//! Runs Sluice plugins the way `wasmtime serve` runs components: one
//! [`Runtime`] (one `Engine`, pooling allocator, epoch ticks), one
//! `InstancePre` per module digest, and a fresh `Store` per request with a
//! deadline and a memory cap, so a misbehaving plugin fails only the request
//! it is handling. Each plugin version is snapshotted right after its
//! `configure`, so a fresh instance costs a copy-on-write instantiation
//! rather than a `configure` call. Plugins that are slow to instantiate may
//! opt into reused instances ([`sluice_core::Isolation::Reused`]).
//!
//! A plugin's reach is bounded: each call into the guest has a deadline
//! (epoch ticks while it runs, a wall-clock timeout while it waits in a host
//! call), host calls that cost CPU run off the async workers and count
//! against that deadline, WASI is granted only as far as language runtimes
//! need it to start, all instances share one memory budget, each plugin has
//! a concurrency limit, and its log lines are escaped and rate-limited.

mod background;
mod bindings;
mod borrowed;
mod compiler;
mod crypto;
mod deadline;
mod egress;
mod epoch;
mod granted;
mod guest_log;
pub mod headers;
mod host;
mod memory;
mod plugin;
mod plugin_metrics;
mod request;
mod runtime;
mod snapshot;
mod state;
pub mod tokens;
mod versions;
mod wasi;

pub use bindings::{
    ChunkAction, Content, ContentPart, DirectResponse, Hooks, Message, RequestAction, Response, ResponseAction,
    ResponseEdits, ResponseSummary, Usage,
};
pub use egress::{EgressConfig, OutboundCall};
pub use granted::{Grants, Settlement, settle_all};
pub use plugin::{ConfiguredPlugin, InstanceStart, Limits, PluginInstance, PluginModule};
pub use request::{McpRequest, PluginRequest};
pub use runtime::{Runtime, RuntimeConfig, StartError, StateStore};
pub use sluice_state;

use std::time::Duration;

/// A plugin failed while handling one request. Its failure policy decides
/// what happens to that request; nothing else is affected.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("exceeded its {}ms deadline", .0.as_millis())]
    Timeout(Duration),
    #[error("hit its memory limit of {} MiB", .0 / (1024 * 1024))]
    MemoryLimit(usize),
    #[error("trapped: {0}")]
    Trap(String),
    #[error("rejected its config: {0}")]
    ConfigRejected(String),
    /// The plugin asked for an edit HTTP cannot carry (e.g. a header name with a space).
    #[error("returned an invalid edit: {0}")]
    InvalidEdit(String),
    /// No instance could be had: the plugin's concurrency limit, the
    /// instance pool or the guest memory budget is used up. The plugin did
    /// not run, so this is not the plugin's failure: the request should get
    /// a 503, whatever the failure policy (an `Open` plugin must not be
    /// skipped because the gateway is busy).
    #[error("is at capacity: {0}")]
    Overloaded(String),
    /// It failed after its state store did not answer (down, or slower
    /// than its deadline): the store's failure, not the plugin's code, so
    /// `Closed` answers 503 rather than 500.
    #[error("failed: its state store is unavailable: {0}")]
    StateUnavailable(String),
}

/// A plugin version could not be made ready to serve.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("sha256 mismatch: expected {expected}, module has {actual}")]
    DigestMismatch { expected: String, actual: String },
    #[error("not a loadable component: {0}")]
    Compile(String),
    #[error("the component does not fit the sluice:plugin world: {0}")]
    Incompatible(String),
    /// Its `configure` needs more memory than one plugin's share of the
    /// guest memory budget: it could never serve.
    #[error(
        "its configure needs more than {} MiB, its share of the memory all plugin instances may hold \
         (--max-guest-memory-plugin-percent of --max-guest-memory-bytes)",
        .0 / (1024 * 1024)
    )]
    OverShare(usize),
    /// It imports a capability its GatewayPlugin does not grant.
    #[error("{0}")]
    NotGranted(&'static str),
    /// Its egress grant cannot be served (a CA bundle that does not parse,
    /// an address the gateway's operator does not allow).
    #[error("{0}")]
    Egress(String),
    #[error(transparent)]
    Plugin(#[from] PluginError),
}

impl LoadError {
    /// Whether loading again later may succeed: the runtime was at capacity.
    pub fn is_transient(&self) -> bool {
        matches!(self, LoadError::Plugin(PluginError::Overloaded(_)))
    }
}

/// `sha256:<hex>` of a module's bytes.
pub fn digest_of(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// A plugin that sluice-test-programs built from plugins/.
#[cfg(test)]
fn built_plugin(name: &str) -> Vec<u8> {
    let path = sluice_test_programs::path(name);
    std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A chat request for `model`, as the gateway would hand it to plugins.
#[cfg(test)]
fn test_request(headers: &[(&str, &str)], body: String) -> PluginRequest {
    let mut request = PluginRequest::chat("gpt-4o-mini", sluice_chat::ChatBody::new(body.into()));
    for (name, value) in headers {
        request.headers.insert(name.parse::<http::HeaderName>().unwrap(), value.parse().unwrap());
    }
    request.max_body_bytes = 1 << 20;
    request
}
