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
//! Pushes speak the distribution protocol through `oci-client`; pulls,
//! which read what any registry a plugin names sends, go through this
//! crate's own small client, which reads every body with a limit (manifests
//! 4 MiB, tokens 1 MiB, error bodies 64 KiB, layers the module limit) and
//! unpacks image layers with one too. Credentials are offered only to the
//! registries they are bound to, and the shared cache serves a module only
//! to callers that fetched it or prove access to it again.
//!
//! [`Registry::pull_verified`] also requires a cosign signature (the
//! classic `sha256-<hex>.sig` layout, key-based) that verifies the manifest
//! digest under one of the given [`PublicKeys`], before the module is
//! downloaded or served from the cache; [`Registry::sign`] writes one that
//! `cosign verify --key` accepts (`crate::signature` says what is checked).
//!
//! A pin (`expected_sha256`, a plugin's `sha256`) is the sha256 of the Wasm
//! module itself in every layout: for the CNCF and Istio layouts that is the
//! layer's digest too; for an image tar it is the digest of `plugin.wasm`,
//! not of the (compressed) layer. The plugin runtime checks the same digest
//! when it compiles the module, so a pin that passes the pull passes the
//! load. A manifest digest is pinned in the reference instead
//! (`repo@sha256:…`).

mod auth;
mod cache;
mod component;
mod digest;
mod error;
mod format;
#[doc(hidden)]
pub mod fuzzing;
pub mod media_types;
mod reference;
mod registry;
mod signature;

pub use auth::{Credentials, PullCredentials};
pub use component::{ComponentInfo, inspect_component};
pub use digest::sha256_digest;
pub use error::OciError;
pub use format::{Format, WasmConfig, WasmConfigComponent};
pub use reference::Reference;
pub use registry::{
    DEFAULT_MAX_MODULE_BYTES, Descriptor, Inspection, Origin, Progress, PullPolicy, Pulled, Pushed, Registry,
    RegistryOptions, Signed,
};
pub use signature::{PublicKeys, SigningKey, signature_tag};
