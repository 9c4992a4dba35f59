//! Wasm plugin components in OCI registries.
//!
//! [`Registry::pull`] resolves a reference to a manifest, accepts three
//! layouts (the CNCF Wasm artifact, Istio/Envoy Gateway's Wasm layer, and an
//! image whose single tar layer holds `plugin.wasm`), verifies every byte
//! against its digest, refuses anything that is not a WebAssembly component,
//! and keeps a content-addressed cache on disk so that a restart with the
//! registry down still serves the last known module. [`Registry::push`]
//! writes the CNCF layout, and [`Registry::inspect`] describes an artifact.
//!
//! The wire protocol is `oci-client`'s; this crate adds the policy around it.

mod auth;
mod cache;
mod component;
mod error;
mod format;
mod reference;
mod registry;

pub use auth::{Credentials, PullCredentials};
pub use component::{ComponentInfo, inspect_component};
pub use error::OciError;
pub use format::{Format, WasmConfig, WasmConfigComponent};
pub use reference::Reference;
pub use registry::{
    DEFAULT_MAX_MODULE_BYTES, Descriptor, Inspection, Origin, Progress, PullPolicy, Pulled, Pushed, Registry,
    RegistryOptions,
};

/// Media types this crate reads and writes.
pub mod media_types {
    /// The OCI image manifest; the CNCF layout uses it with a Wasm config.
    pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
    pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
    pub const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
    /// CNCF "Wasm OCI Artifact layout" config and layer.
    pub const WASM_CONFIG: &str = "application/vnd.wasm.config.v0+json";
    pub const WASM_LAYER: &str = "application/wasm";
    /// Istio / Envoy Gateway Wasm plugin layer.
    pub const ISTIO_WASM_LAYER: &str = "application/vnd.module.wasm.content.layer.v1+wasm";
    /// Image layers that may carry `plugin.wasm` (Istio's "compat" variant).
    pub const OCI_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
    pub const OCI_LAYER_TAR_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
    pub const DOCKER_LAYER_TAR: &str = "application/vnd.docker.image.rootfs.diff.tar";
    pub const DOCKER_LAYER_TAR_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";

    /// Manifest types asked for when resolving a reference.
    pub const MANIFESTS: &[&str] = &[OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX, DOCKER_MANIFEST_LIST];
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}
