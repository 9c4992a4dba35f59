//! From a reference's manifest to the image manifest that holds the plugin:
//! parsing, and choosing an index's Wasm entry.

use oci_client::manifest::{OciImageManifest, OciManifest};

use super::transport::Session;
use crate::digest::check_registry_digest;
use crate::error::OciError;
use crate::format;
use crate::reference::Reference;

/// Parses a manifest; for an index, fetches the Wasm entry's manifest.
pub(super) async fn resolve_manifest(
    session: &Session<'_>,
    reference: &Reference,
    bytes: &[u8],
    digest: &str,
) -> Result<(OciImageManifest, String), OciError> {
    let parse = |bytes: &[u8]| {
        serde_json::from_slice::<OciManifest>(bytes).map_err(|e| OciError::Protocol {
            registry: reference.registry().to_string(),
            detail: format!("unreadable manifest for {reference}: {e}"),
        })
    };
    match parse(bytes)? {
        OciManifest::Image(manifest) => {
            check_descriptors(&manifest, reference)?;
            Ok((manifest, digest.to_string()))
        }
        OciManifest::ImageIndex(index) => {
            for entry in &index.manifests {
                check_registry_digest(
                    &entry.digest,
                    &format!("an entry of the index {reference}"),
                    reference.registry(),
                )?;
            }
            let entry = format::choose_index_entry(&index)?;
            let entry_reference = reference.with_digest(&entry.digest);
            let (bytes, entry_digest) = session.manifest(&entry_reference).await?;
            match parse(&bytes)? {
                OciManifest::Image(manifest) => {
                    check_descriptors(&manifest, &entry_reference)?;
                    Ok((manifest, entry_digest))
                }
                OciManifest::ImageIndex(_) => Err(OciError::UnsupportedFormat {
                    media_types: vec![entry.media_type.clone()],
                    reason: "an index inside an index".into(),
                }),
            }
        }
    }
}

/// The config and layer digests become cache paths and blob URLs: refuse
/// the manifest unless every one is well formed.
fn check_descriptors(manifest: &OciImageManifest, reference: &Reference) -> Result<(), OciError> {
    check_registry_digest(&manifest.config.digest, &format!("the config digest of {reference}"), reference.registry())?;
    for layer in &manifest.layers {
        check_registry_digest(&layer.digest, &format!("a layer digest of {reference}"), reference.registry())?;
    }
    Ok(())
}
