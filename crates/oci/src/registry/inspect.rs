//! Describing an artifact for `sluice inspect`.

use oci_client::manifest::OciImageManifest;

use super::client::Registry;
use super::resolve::resolve_manifest;
use super::transport::{Session, blocking, retrying};
use super::types::{Descriptor, Inspection, PullPolicy};
use crate::component::inspect_component;
use crate::error::OciError;
use crate::format;
use crate::reference::Reference;

/// A config blob is a few hundred bytes; refuse to buffer a huge one.
const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

impl Registry {
    /// Describes an artifact: its manifest, config, layers, and the
    /// component inside (which is pulled, through the cache, to read it).
    pub async fn inspect(&self, reference: &Reference) -> Result<Inspection, OciError> {
        let session = self.inner.transport.session(reference, self.auth(reference, None)?);
        let session = &session;
        let (top_media_type, top_digest, manifest, image_digest, config_json) =
            retrying(reference, move || describe(session, reference)).await?;
        let (format, _) = format::detect(&manifest)?;
        let pulled = self.pull(&reference.with_digest(&top_digest), PullPolicy::IfNotPresent, None).await?;
        let module = pulled.module.clone();
        let component = blocking(move || inspect_component(&module)).await?;
        Ok(Inspection {
            reference: reference.to_string(),
            manifest_digest: top_digest,
            manifest_media_type: top_media_type,
            image_manifest_digest: image_digest,
            artifact_type: manifest.artifact_type.clone(),
            config: (&manifest.config).into(),
            layers: manifest.layers.iter().map(Descriptor::from).collect(),
            annotations: manifest.annotations.clone().unwrap_or_default(),
            config_json,
            format,
            module_digest: pulled.module_digest,
            module_size: pulled.module.len() as u64,
            component,
        })
    }
}

/// The manifests and config behind a reference.
async fn describe(
    session: &Session<'_>,
    reference: &Reference,
) -> Result<(Option<String>, String, OciImageManifest, String, Option<serde_json::Value>), OciError> {
    let (top_bytes, top_digest) = session.manifest(reference).await?;
    let top_media_type = serde_json::from_slice::<serde_json::Value>(&top_bytes)
        .ok()
        .and_then(|v| v.get("mediaType").and_then(|m| m.as_str()).map(String::from));
    let (manifest, image_digest) = resolve_manifest(session, reference, &top_bytes, &top_digest).await?;
    let config_json = if manifest.config.size as u64 <= MAX_CONFIG_BYTES {
        let bytes = session.blob(&manifest.config, MAX_CONFIG_BYTES).await?;
        serde_json::from_slice(&bytes).ok()
    } else {
        None
    };
    Ok((top_media_type, top_digest, manifest, image_digest, config_json))
}
