//! Media types this crate reads and writes.

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
