//! Pushing a component in the CNCF Wasm layout.

use std::collections::BTreeMap;

use bytes::Bytes;
use futures_util::{Stream, StreamExt as _};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::{OciDescriptor, OciImageManifest};

use super::client::Registry;
use super::transport::{blocking, retrying};
use super::types::{Progress, Pushed};
use crate::component::inspect_component;
use crate::digest::sha256_digest;
use crate::error::OciError;
use crate::format::{WasmConfig, WasmConfigComponent};
use crate::media_types as mt;
use crate::reference::Reference;

const PUSH_PIECE_BYTES: usize = 256 * 1024;

impl Registry {
    /// Pushes a component in the CNCF Wasm layout under `reference` (a tag).
    pub async fn push(
        &self,
        module: impl Into<Bytes>,
        reference: &Reference,
        annotations: BTreeMap<String, String>,
        progress: Option<Progress>,
    ) -> Result<Pushed, OciError> {
        if reference.digest().is_some() {
            return Err(OciError::InvalidReference {
                reference: reference.to_string(),
                reason: "push to a tag; the digest is computed from the content".into(),
            });
        }
        let module: Bytes = module.into();
        let checked = module.clone();
        let (info, layer_digest) =
            blocking(move || inspect_component(&checked).map(|info| (info, sha256_digest(&checked)))).await?;

        let config = WasmConfig {
            created: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            author: None,
            architecture: "wasm".into(),
            os: "wasip2".into(),
            layer_digests: vec![layer_digest.clone()],
            component: Some(WasmConfigComponent { exports: info.exports, imports: info.imports, target: None }),
        };
        let config_bytes = Bytes::from(serde_json::to_vec(&config).expect("the config serializes"));
        let config_digest = sha256_digest(&config_bytes);
        let manifest = OciImageManifest {
            schema_version: 2,
            // oci-client's builder leaves this unset; the distribution spec
            // wants it, and some registries refuse a manifest without it.
            media_type: Some(mt::OCI_MANIFEST.into()),
            config: OciDescriptor {
                media_type: mt::WASM_CONFIG.into(),
                digest: config_digest.clone(),
                size: config_bytes.len() as i64,
                ..Default::default()
            },
            layers: vec![OciDescriptor {
                media_type: mt::WASM_LAYER.into(),
                digest: layer_digest.clone(),
                size: module.len() as i64,
                ..Default::default()
            }],
            subject: None,
            artifact_type: None,
            annotations: (!annotations.is_empty()).then_some(annotations),
        };
        // We send these exact bytes, so their hash is the manifest digest.
        let manifest_bytes = Bytes::from(serde_json::to_vec(&manifest).expect("the manifest serializes"));
        let manifest_digest = sha256_digest(&manifest_bytes);

        let (client, _auth) = self.client(reference).await?;
        let upload = Upload {
            client: &client,
            reference,
            module: &module,
            layer_digest: &layer_digest,
            config: &config_bytes,
            config_digest: &config_digest,
            manifest: &manifest_bytes,
            progress: progress.as_ref(),
        };
        retrying(reference, move || upload.run()).await?;
        Ok(Pushed { manifest_digest, layer_digest, config_digest, size: module.len() as u64 })
    }
}

/// One push of the CNCF layout; retried as a whole on transient errors.
#[derive(Clone, Copy)]
struct Upload<'a> {
    client: &'a oci_client::Client,
    reference: &'a Reference,
    module: &'a Bytes,
    layer_digest: &'a str,
    config: &'a Bytes,
    config_digest: &'a str,
    manifest: &'a Bytes,
    progress: Option<&'a Progress>,
}

impl Upload<'_> {
    async fn run(self) -> Result<(), OciError> {
        let registry = self.reference.registry();
        let target = self.reference.as_oci();
        let fail = |what: &'static str| move |e: OciDistributionError| OciError::from_client(e, registry, what);
        let total = self.module.len() as u64;
        // Registries deduplicate blobs; re-pushing the same module is a HEAD.
        if self.client.blob_exists(target, self.layer_digest).await.map_err(fail("module blob"))? {
            if let Some(progress) = self.progress {
                progress(total, total);
            }
        } else {
            let pieces = progress_stream(self.module.clone(), self.progress.cloned());
            self.client
                .push_blob_stream(target, pieces, self.layer_digest, Some(total))
                .await
                .map_err(fail("module blob upload"))?;
        }
        self.client.push_blob(target, self.config.clone(), self.config_digest).await.map_err(fail("config upload"))?;
        self.client
            .push_manifest_raw(target, self.manifest.clone(), http::HeaderValue::from_static(mt::OCI_MANIFEST))
            .await
            .map_err(fail("manifest upload"))?;
        Ok(())
    }
}

/// The module in pieces, reporting progress as the HTTP body takes each.
fn progress_stream(
    data: Bytes,
    progress: Option<Progress>,
) -> impl Stream<Item = Result<Bytes, OciDistributionError>> + Send + 'static {
    let total = data.len() as u64;
    let pieces: Vec<Bytes> = (0..data.len())
        .step_by(PUSH_PIECE_BYTES)
        .map(|start| data.slice(start..(start + PUSH_PIECE_BYTES).min(data.len())))
        .collect();
    let mut sent = 0u64;
    futures_util::stream::iter(pieces).map(move |piece| {
        sent += piece.len() as u64;
        if let Some(progress) = &progress {
            progress(sent, total);
        }
        Ok(piece)
    })
}

#[cfg(test)]
mod tests {
    use parking_lot::Mutex;
    use std::sync::Arc;

    use super::super::types::RegistryOptions;
    use super::*;

    #[tokio::test]
    async fn push_refuses_a_core_module_before_any_network_use() {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::new(RegistryOptions::new(dir.path())).unwrap();
        let reference: Reference = "127.0.0.1:9/plugins/p:v1".parse().unwrap();
        let core = wasm_encoder::Module::new().finish();
        let error = registry.push(core, &reference, BTreeMap::new(), None).await.unwrap_err();
        assert!(matches!(error, OciError::NotAComponent(_)), "{error}");
    }

    #[tokio::test]
    async fn progress_pieces_cover_the_module_and_end_at_the_total() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let progress: Progress = Arc::new(move |sent, total| record.lock().push((sent, total)));
        let data = Bytes::from(vec![1u8; PUSH_PIECE_BYTES * 2 + 10]);
        let pieces: Vec<Bytes> = progress_stream(data.clone(), Some(progress)).map(|p| p.unwrap()).collect().await;
        assert_eq!(pieces.concat(), data.to_vec());
        let seen = seen.lock();
        assert_eq!(seen.len(), 3);
        assert_eq!(*seen.last().unwrap(), (data.len() as u64, data.len() as u64));
    }
}
