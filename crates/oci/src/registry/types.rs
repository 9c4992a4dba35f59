//! The data the registry client takes and hands back, shared by the pull,
//! push and inspect sides.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use oci_client::manifest::OciDescriptor;
use serde::Serialize;

use crate::auth::Credentials;
use crate::component::ComponentInfo;
use crate::format::Format;

/// Large enough for interpreted-language components (Python's are ~20 MB).
pub const DEFAULT_MAX_MODULE_BYTES: u64 = 100 * 1024 * 1024;

#[derive(Clone, Debug)]
pub struct RegistryOptions {
    /// Registries (`host` or `host:port`) reached over plain HTTP. Loopback
    /// hosts always are; everything else is HTTPS.
    pub insecure_registries: Vec<String>,
    /// PEM files of extra CA certificates, trusted besides the Mozilla roots.
    pub ca_bundles: Vec<PathBuf>,
    pub credentials: Credentials,
    /// The largest module accepted on pull.
    pub max_module_bytes: u64,
    /// Where modules and reference→digest mappings are kept.
    pub cache_dir: PathBuf,
}

impl RegistryOptions {
    pub fn new(cache_dir: impl Into<PathBuf>) -> RegistryOptions {
        RegistryOptions {
            insecure_registries: Vec::new(),
            ca_bundles: Vec::new(),
            credentials: Credentials::default(),
            max_module_bytes: DEFAULT_MAX_MODULE_BYTES,
            cache_dir: cache_dir.into(),
        }
    }
}

/// When a tag is resolved against the registry again: the declaration's
/// own enum, so the gateway passes it through. Under `IfNotPresent` a
/// digest reference, or a tag resolved before, is served from the cache
/// without contacting the registry; under `Always` a tag is re-resolved on
/// every pull (content already cached is not downloaded again) and a digest
/// reference, being immutable, is still served from the cache. Either way
/// the cache serves a module without asking only a caller that fetched it
/// with the same credentials from the same repository, or one fetched
/// anonymously; any other caller proves access to the registry first.
pub use sluice_core::PullPolicy;

/// Where a pulled module came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Origin {
    /// The reference was resolved against the registry just now (the bytes
    /// may still come from the cache when the digest was known).
    Registry,
    /// The cache alone; the registry was not contacted.
    Cache,
    /// The registry was unreachable: the last module this reference
    /// resolved to, from the cache.
    StaleCache,
}

#[derive(Clone, Debug)]
pub struct Pulled {
    /// The component's bytes, verified.
    pub module: Bytes,
    /// `sha256:<hex>` of `module`.
    pub module_digest: String,
    /// The digest the reference resolved to (an index's, if it is one).
    pub manifest_digest: String,
    /// The layer the module came from; equal to `module_digest` except for
    /// the image-tar format.
    pub layer_digest: String,
    pub format: Format,
    pub origin: Origin,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Pushed {
    pub manifest_digest: String,
    /// `sha256:<hex>` of the module, which is the layer.
    pub layer_digest: String,
    pub config_digest: String,
    pub size: u64,
}

/// Called with (bytes sent, total bytes) as a push uploads the module.
pub type Progress = Arc<dyn Fn(u64, u64) + Send + Sync>;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: String,
    pub size: i64,
}

impl From<&OciDescriptor> for Descriptor {
    fn from(d: &OciDescriptor) -> Descriptor {
        Descriptor { media_type: d.media_type.clone(), digest: d.digest.clone(), size: d.size }
    }
}

/// What `sluice inspect` shows.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Inspection {
    pub reference: String,
    /// The digest the reference resolves to.
    pub manifest_digest: String,
    pub manifest_media_type: Option<String>,
    /// When the reference names an index: the image manifest chosen from it.
    pub image_manifest_digest: String,
    pub artifact_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
    pub annotations: BTreeMap<String, String>,
    /// The config blob, when it is JSON.
    pub config_json: Option<serde_json::Value>,
    pub format: Format,
    pub module_digest: String,
    pub module_size: u64,
    pub component: ComponentInfo,
}
