//! Pull, push and inspect against a registry, with verification, a disk
//! cache and retries around `oci-client`.
//!
//! `types` holds the data shared by every side; `transport` the wire
//! (clients, TLS, manifests and blobs with limits, retries); `client` the
//! [`Registry`] handle; `resolve` manifests and indexes; `signatures`
//! cosign's `.sig` manifests (read and verified, written); then one file
//! per operation: `pull`, `push`, `inspect`. Dependencies run one way, in that
//! order; this file only re-exports.

mod client;
mod inspect;
mod pull;
mod push;
mod resolve;
mod signatures;
mod transport;
mod types;

pub use client::Registry;
pub use signatures::Signed;
pub use types::{
    DEFAULT_MAX_MODULE_BYTES, Descriptor, Inspection, Origin, Progress, PullPolicy, Pulled, Pushed, RegistryOptions,
};
