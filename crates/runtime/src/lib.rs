//! Runs Sluice plugins the way `wasmtime serve` runs components: one
//! [`Runtime`] (one `Engine`, pooling allocator, epoch ticks), one
//! `InstancePre` per module digest, and a fresh `Store` per request with a
//! deadline and a memory cap, so a misbehaving plugin fails only the request
//! it is handling. Plugins that are slow to instantiate may opt into
//! reused instances ([`sluice_core::Isolation::Reused`]).

mod bindings;
mod host;
mod plugin;
mod runtime;
pub mod tokens;

pub use bindings::sluice::plugin::types::{
    ChunkAction, DirectResponse, Hooks, Request, RequestAction, RequestEdits, Response, ResponseAction, ResponseEdits,
    ResponseSummary, Usage,
};
pub use plugin::{ConfiguredPlugin, Limits, PluginInstance, PluginModule};
pub use runtime::{Runtime, RuntimeConfig, StartError};

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
    #[error(transparent)]
    Plugin(#[from] PluginError),
}

/// `sha256:<hex>` of a module's bytes.
pub fn digest_of(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}
