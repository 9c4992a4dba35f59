//! Cosign signatures on the wire: reading and verifying a manifest's
//! `sha256-<hex>.sig` (pulls), and writing one (`sluice push --sign`,
//! `sluice sign`). What a signature is and when it verifies is
//! `crate::signature`'s.

use std::collections::BTreeMap;

use base64::Engine as _;
use bytes::Bytes;
use oci_client::manifest::{OciDescriptor, OciImageManifest, OciManifest};
use serde::Serialize;

use super::client::Registry;
use super::transport::{Session, retrying};
use crate::digest::{check_registry_digest, sha256_digest};
use crate::error::OciError;
use crate::media_types as mt;
use crate::reference::Reference;
use crate::signature::{
    MAX_PAYLOAD_BYTES, MAX_SIGNATURE_LAYERS, MAX_SIGNATURE_MANIFEST_BYTES, PublicKeys, Refusal, SIGNATURE_ANNOTATION,
    SIMPLE_SIGNING, SignedPayload, SigningKey, signature_tag, simple_signing_payload, verify,
};

/// The signature of `manifest_digest` (in `reference`'s repository) that
/// verifies under `keys`, read from its `.sig` manifest. Transient registry
/// errors stay transient; anything else that stops verification is
/// [`OciError::SignatureMissing`] or [`OciError::SignatureInvalid`].
pub(super) async fn fetch_verified(
    session: &Session<'_>,
    reference: &Reference,
    manifest_digest: &str,
    keys: &PublicKeys,
) -> Result<SignedPayload, OciError> {
    let what = format!("manifest {manifest_digest} of {}/{}", reference.registry(), reference.repository());
    let tag = signature_tag(manifest_digest);
    let invalid = |reason: String| OciError::SignatureInvalid { what: what.clone(), reason };
    let layers = match read_signature_manifest(session, reference, &tag).await {
        Ok(Some(manifest)) => manifest.layers,
        Ok(None) => {
            return Err(OciError::SignatureMissing {
                what: what.clone(),
                detail: format!(
                    "the repository has no tag {tag}; sign it with `cosign sign --key` or `sluice push --sign`"
                ),
            });
        }
        Err(error) if error.is_transient() => return Err(error),
        Err(error) => return Err(invalid(format!("reading {tag}: {error}"))),
    };
    if layers.len() > MAX_SIGNATURE_LAYERS {
        return Err(invalid(format!("{tag} has {} layers, more than the {MAX_SIGNATURE_LAYERS} read", layers.len())));
    }
    let mut signatures = Vec::new();
    let mut unreadable = Vec::new();
    for (i, layer) in layers.iter().enumerate() {
        match read_layer(session, layer).await? {
            Ok(signed) => signatures.push(signed),
            Err(why) => unreadable.push(format!("layer {}: {why}", i + 1)),
        }
    }
    match verify(keys, &signatures, manifest_digest) {
        Ok((index, key)) => {
            tracing::debug!(manifest = manifest_digest, signature = index + 1, key = key + 1, "signature verified");
            Ok(signatures.swap_remove(index))
        }
        Err(Refusal::Unreadable(_)) if !unreadable.is_empty() => {
            Err(invalid(format!("no readable cosign signature in {tag}: {}", unreadable.join("; "))))
        }
        Err(refusal) => Err(invalid(refusal.to_string())),
    }
}

/// The `.sig` manifest at `tag`, or `None` if there is none.
async fn read_signature_manifest(
    session: &Session<'_>,
    reference: &Reference,
    tag: &str,
) -> Result<Option<OciImageManifest>, OciError> {
    let signature_reference = reference.with_tag(tag);
    let bytes = match session.manifest_limited(&signature_reference, MAX_SIGNATURE_MANIFEST_BYTES).await {
        Ok((bytes, _)) => bytes,
        Err(OciError::NotFound { .. }) => return Ok(None),
        Err(error) => return Err(error),
    };
    let protocol = |detail: String| OciError::Protocol { registry: reference.registry().to_string(), detail };
    match serde_json::from_slice::<OciManifest>(&bytes) {
        Ok(OciManifest::Image(manifest)) => Ok(Some(manifest)),
        Ok(OciManifest::ImageIndex(_)) => Err(protocol(format!("{tag} is an index, not a signature manifest"))),
        Err(e) => Err(protocol(format!("{tag} is not a manifest: {e}"))),
    }
}

/// One signature layer: its payload (downloaded, checked against its
/// digest) and the signature from its annotation; why it is not one, or a
/// transient error, which fails the whole read.
async fn read_layer(session: &Session<'_>, layer: &OciDescriptor) -> Result<Result<SignedPayload, String>, OciError> {
    if layer.media_type != SIMPLE_SIGNING {
        let media_type: String = layer.media_type.chars().take(100).collect();
        return Ok(Err(format!("media type {media_type:?} is not {SIMPLE_SIGNING}")));
    }
    let Some(annotation) = layer.annotations.as_ref().and_then(|annotations| annotations.get(SIGNATURE_ANNOTATION))
    else {
        return Ok(Err(format!("no {SIGNATURE_ANNOTATION} annotation")));
    };
    if layer.size < 0 || layer.size as u64 > MAX_PAYLOAD_BYTES {
        return Ok(Err(format!("a payload of {} bytes, over the {MAX_PAYLOAD_BYTES} read", layer.size)));
    }
    match session.blob(layer, MAX_PAYLOAD_BYTES).await {
        Ok(payload) => Ok(SignedPayload::from_annotation(payload.to_vec(), annotation)),
        Err(error) if error.is_transient() => Err(error),
        Err(error) => Ok(Err(error.to_string())),
    }
}

/// What [`Registry::sign`] wrote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Signed {
    /// The manifest signed.
    pub manifest_digest: String,
    /// `registry/repository:sha256-<hex>.sig`.
    pub signature_reference: String,
    /// The digest of the signature manifest written.
    pub signature_manifest_digest: String,
}

impl Registry {
    /// Signs the manifest `reference` names (its digest, or what its tag
    /// resolves to now) with `key`, the way `cosign sign --key` does: a
    /// simple signing payload layer, added to the repository's
    /// `sha256-<hex>.sig` manifest (the signatures already there are kept).
    pub async fn sign(&self, reference: &Reference, key: &SigningKey) -> Result<Signed, OciError> {
        let (client, auth) = self.client(reference).await?;
        let session = self.inner.transport.session(reference, auth);
        let session = &session;
        let manifest_digest = match reference.digest() {
            Some(digest) => digest.to_string(),
            None => retrying(reference, move || async move { session.manifest(reference).await }).await?.1,
        };
        let repository = format!("{}/{}", reference.registry(), reference.repository());
        let payload = Bytes::from(simple_signing_payload(&repository, &manifest_digest));
        let signature = base64::engine::general_purpose::STANDARD.encode(key.sign(&payload));
        let tag = signature_tag(&manifest_digest);
        let tag_ref = tag.as_str();
        let existing = retrying(reference, move || read_signature_manifest(session, reference, tag_ref)).await?;
        let mut layers = existing.map(|manifest| manifest.layers).unwrap_or_default();
        let payload_digest = sha256_digest(&payload);
        let layer = OciDescriptor {
            media_type: SIMPLE_SIGNING.into(),
            digest: payload_digest.clone(),
            size: payload.len() as i64,
            annotations: Some(BTreeMap::from([(SIGNATURE_ANNOTATION.to_string(), signature)])),
            ..Default::default()
        };
        // Signing is deterministic (RFC 6979): signing again adds nothing.
        let same = |known: &OciDescriptor| known.digest == layer.digest && known.annotations == layer.annotations;
        if !layers.iter().any(same) {
            layers.push(layer);
        }
        if layers.len() > MAX_SIGNATURE_LAYERS {
            return Err(OciError::SignatureInvalid {
                what: format!("{repository}:{tag}"),
                reason: format!("it would hold more than the {MAX_SIGNATURE_LAYERS} signatures a pull reads"),
            });
        }
        for layer in &layers {
            check_registry_digest(&layer.digest, &format!("a layer of {repository}:{tag}"), reference.registry())?;
        }
        let config = Bytes::from(signature_config(&layers));
        let config_digest = sha256_digest(&config);
        let manifest = OciImageManifest {
            schema_version: 2,
            media_type: Some(mt::OCI_MANIFEST.into()),
            config: OciDescriptor {
                media_type: OCI_IMAGE_CONFIG.into(),
                digest: config_digest.clone(),
                size: config.len() as i64,
                ..Default::default()
            },
            layers,
            subject: None,
            artifact_type: None,
            annotations: None,
        };
        let manifest_bytes = Bytes::from(serde_json::to_vec(&manifest).expect("the manifest serializes"));
        let signature_manifest_digest = sha256_digest(&manifest_bytes);
        let target = reference.with_tag(&tag);
        let registry = reference.registry();
        let fail = |what: &'static str| {
            move |e: oci_client::errors::OciDistributionError| OciError::from_client(e, registry, what)
        };
        let (client, target, payload, config, manifest_bytes) = (&client, &target, &payload, &config, &manifest_bytes);
        let (payload_digest, config_digest) = (&payload_digest, &config_digest);
        retrying(reference, move || async move {
            let oci = target.as_oci();
            if !client.blob_exists(oci, payload_digest).await.map_err(fail("signature payload"))? {
                client
                    .push_blob(oci, payload.clone(), payload_digest)
                    .await
                    .map_err(fail("signature payload upload"))?;
            }
            client.push_blob(oci, config.clone(), config_digest).await.map_err(fail("signature config upload"))?;
            client
                .push_manifest_raw(oci, manifest_bytes.clone(), http::HeaderValue::from_static(mt::OCI_MANIFEST))
                .await
                .map_err(fail("signature manifest upload"))?;
            Ok(())
        })
        .await?;
        Ok(Signed { manifest_digest, signature_reference: format!("{repository}:{tag}"), signature_manifest_digest })
    }
}

const OCI_IMAGE_CONFIG: &str = "application/vnd.oci.image.config.v1+json";

/// The image config cosign gives a signature manifest (go-containerregistry's
/// empty image with the payload layers appended), field for field: the
/// payloads are stored uncompressed, so each diff ID is its layer's digest.
fn signature_config(layers: &[OciDescriptor]) -> Vec<u8> {
    #[derive(Serialize)]
    struct Config<'a> {
        architecture: &'a str,
        created: &'a str,
        history: Vec<History<'a>>,
        os: &'a str,
        rootfs: RootFs<'a>,
        config: Empty,
    }
    #[derive(Serialize)]
    struct History<'a> {
        created: &'a str,
    }
    #[derive(Serialize)]
    struct RootFs<'a> {
        #[serde(rename = "type")]
        kind: &'a str,
        diff_ids: Vec<&'a str>,
    }
    #[derive(Serialize)]
    struct Empty {}
    const ZERO_TIME: &str = "0001-01-01T00:00:00Z";
    let config = Config {
        architecture: "",
        created: ZERO_TIME,
        history: layers.iter().map(|_| History { created: ZERO_TIME }).collect(),
        os: "",
        rootfs: RootFs { kind: "layers", diff_ids: layers.iter().map(|layer| layer.digest.as_str()).collect() },
        config: Empty {},
    };
    serde_json::to_vec(&config).expect("the config serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_config_is_cosigns_byte_for_byte() {
        // What cosign v2.6.5 wrote for a one-signature manifest.
        let cosign = r#"{"architecture":"","created":"0001-01-01T00:00:00Z","history":[{"created":"0001-01-01T00:00:00Z"}],"os":"","rootfs":{"type":"layers","diff_ids":["sha256:12d6aa576b57e8e5fea9bff5c3971bfdef09c982016fbdc338d7f3049d3bddb3"]},"config":{}}"#;
        let layer = OciDescriptor {
            digest: "sha256:12d6aa576b57e8e5fea9bff5c3971bfdef09c982016fbdc338d7f3049d3bddb3".into(),
            ..Default::default()
        };
        assert_eq!(String::from_utf8(signature_config(&[layer])).unwrap(), cosign);
    }
}
