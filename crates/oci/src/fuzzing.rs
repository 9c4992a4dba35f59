//! The pull path's parsers, reachable from the fuzz targets in crates/fuzz:
//! everything a pull does with a registry's manifest and layer bytes short
//! of the network. Nothing outside the fuzz crate uses this module.

use oci_client::manifest::OciManifest;

use crate::digest::check_registry_digest;
use crate::error::OciError;
use crate::format::{self, Format};

/// The room an image layer has beyond the module limit.
pub const TAR_OVERHEAD_BYTES: u64 = format::TAR_OVERHEAD_BYTES;

/// What a pull makes of a manifest.
#[derive(Debug)]
pub enum Resolved {
    /// An image manifest: the layout and the one layer holding the module.
    Image { format: Format, layer_digest: String, layer_size: i64, media_types: Vec<String> },
    /// An image index: the entry whose manifest is fetched next.
    Index { entry_digest: String },
}

/// Parses a manifest and takes the steps `resolve_manifest` and `fetch`
/// take with it before any further request, calling the same functions:
/// the digest checks, then `detect` for an image or `choose_index_entry`
/// for an index.
pub fn resolve(bytes: &[u8]) -> Result<Resolved, OciError> {
    let registry = "fuzz.example";
    let manifest = serde_json::from_slice::<OciManifest>(bytes)
        .map_err(|e| OciError::Protocol { registry: registry.into(), detail: e.to_string() })?;
    match manifest {
        OciManifest::Image(manifest) => {
            check_registry_digest(&manifest.config.digest, "the config digest", registry)?;
            for layer in &manifest.layers {
                check_registry_digest(&layer.digest, "a layer digest", registry)?;
            }
            let (format, layer) = format::detect(&manifest)?;
            Ok(Resolved::Image {
                format,
                layer_digest: layer.digest.clone(),
                layer_size: layer.size,
                media_types: format::media_types(&manifest),
            })
        }
        OciManifest::ImageIndex(index) => {
            for entry in &index.manifests {
                check_registry_digest(&entry.digest, "an entry of the index", registry)?;
            }
            Ok(Resolved::Index { entry_digest: format::choose_index_entry(&index)?.digest.clone() })
        }
    }
}

/// Takes `plugin.wasm` out of an image layer, as a pull does.
pub fn extract_plugin_wasm(layer: &[u8], max: u64, media_types: &[String]) -> Result<Vec<u8>, OciError> {
    format::extract_plugin_wasm(layer, max, media_types)
}
