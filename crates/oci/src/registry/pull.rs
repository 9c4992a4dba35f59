//! Pulling: the cache first when the policy allows, the registry otherwise,
//! the last known module when the registry is unreachable.

use bytes::Bytes;

use super::client::Registry;
use super::resolve::resolve_manifest;
use super::transport::{blocking, download, manifest_raw, retrying};
use super::types::{Origin, PullPolicy, Pulled};
use crate::auth::PullCredentials;
use crate::cache::ManifestRecord;
use crate::component::inspect_component;
use crate::digest::sha256_digest;
use crate::error::OciError;
use crate::format::{self, Format};
use crate::reference::{Reference, normalize_pin};

/// Room for tar headers and neighbouring files around `plugin.wasm`.
const TAR_OVERHEAD_BYTES: u64 = 1024 * 1024;

impl Registry {
    /// Fetches a verified component. `expected_sha256` pins the module
    /// content (`sha256:<hex>` or `<hex>`): the sha256 of the Wasm bytes in
    /// every layout, which for the image-tar format is that of `plugin.wasm`,
    /// not of the layer.
    ///
    /// Cheap when cached: a digest reference, or a tag under
    /// [`PullPolicy::IfNotPresent`] that was resolved before, reads the disk
    /// cache only. When the registry is unreachable, the last module the
    /// reference resolved to is served from the cache ([`Origin::StaleCache`]).
    pub async fn pull(
        &self,
        reference: &Reference,
        policy: PullPolicy,
        expected_sha256: Option<&str>,
    ) -> Result<Pulled, OciError> {
        self.pull_as(reference, policy, expected_sha256, None).await
    }

    /// [`Registry::pull`] with credentials of its own (a plugin's pull
    /// Secret) in place of the configured ones.
    pub async fn pull_as(
        &self,
        reference: &Reference,
        policy: PullPolicy,
        expected_sha256: Option<&str>,
        credentials: Option<&PullCredentials>,
    ) -> Result<Pulled, OciError> {
        let pin = expected_sha256.map(normalize_pin).transpose()?;
        let _same_reference = self.lock(format!("reference {reference}")).await;
        let known = match reference.digest() {
            Some(digest) => Some(digest.to_string()),
            None => self.inner.cache.tag(reference),
        };
        if (policy == PullPolicy::IfNotPresent || reference.digest().is_some())
            && let Some(manifest_digest) = &known
            && let Some(pulled) = self.cached(manifest_digest, Origin::Cache).await
        {
            return check_pin(pulled, pin.as_deref());
        }
        match retrying(reference, move || self.fetch(reference, credentials)).await {
            Ok(pulled) => check_pin(pulled, pin.as_deref()),
            Err(error) if error.is_transient() => {
                let Some(manifest_digest) = &known else { return Err(error) };
                let Some(pulled) = self.cached(manifest_digest, Origin::StaleCache).await else {
                    return Err(error);
                };
                tracing::warn!(%reference, %error, manifest = %manifest_digest, "registry unreachable; serving the cached module");
                check_pin(pulled, pin.as_deref())
            }
            Err(error) => Err(error),
        }
    }

    /// Resolves the reference with the registry and fetches what is not cached.
    async fn fetch(&self, reference: &Reference, credentials: Option<&PullCredentials>) -> Result<Pulled, OciError> {
        let (client, auth) = self.client_as(reference, credentials).await?;
        let (top_bytes, top_digest) = manifest_raw(&client, &auth, reference).await?;
        let cache = &self.inner.cache;
        let tag = reference.digest().is_none().then(|| reference.clone());
        // A tag that still points where it did: nothing to download.
        if let Some(pulled) = self.cached(&top_digest, Origin::Registry).await {
            let (cache, top_digest) = (cache.clone(), top_digest.clone());
            blocking(move || tag.map_or(Ok(()), |tag| cache.put_tag(&tag, &top_digest))).await?;
            return Ok(pulled);
        }
        let (manifest, manifest_digest) = resolve_manifest(&client, &auth, reference, &top_bytes, &top_digest).await?;
        let (format, layer) = format::detect(&manifest)?;
        let max = self.inner.options.max_module_bytes;
        let layer_limit = if format == Format::ImageTar { max + TAR_OVERHEAD_BYTES } else { max };
        if layer.size < 0 || layer.size as u64 > layer_limit {
            return Err(OciError::TooLarge { size: layer.size.max(0) as u64, max: layer_limit });
        }

        // Another reference to the same content may be downloading it now.
        let _same_blob = self.lock(format!("blob {}", layer.digest)).await;
        // A blob read back from the cache was checked against its name.
        let known_digest = match (format, cache.manifest(&manifest_digest)) {
            (_, Some(record)) => Some(record.module_digest),
            (Format::CncfWasm | Format::IstioWasm, None) => Some(layer.digest.clone()),
            (Format::ImageTar, None) => None,
        };
        let cached = match known_digest {
            Some(digest) => self.read_blob(&digest).await.map(|module| (module, digest)),
            None => None,
        };
        let (module, module_digest) = match cached {
            Some(found) => found,
            None => {
                let layer_bytes = download(&client, reference, layer, layer_limit).await?;
                let media_types = format::media_types(&manifest);
                let cache = cache.clone();
                blocking(move || {
                    let module: Bytes = match format {
                        Format::ImageTar => format::extract_plugin_wasm(&layer_bytes, max, &media_types)?.into(),
                        Format::CncfWasm | Format::IstioWasm => layer_bytes,
                    };
                    inspect_component(&module)?;
                    let digest = sha256_digest(&module);
                    cache.write_blob(&digest, &module)?;
                    Ok((module, digest))
                })
                .await?
            }
        };
        let record = ManifestRecord {
            manifest_digest: manifest_digest.clone(),
            layer_digest: layer.digest.clone(),
            module_digest,
            format,
        };
        let (cache, stored, top) = (cache.clone(), record.clone(), top_digest.clone());
        blocking(move || {
            cache.put_manifest(&stored.manifest_digest, &stored)?;
            if top != stored.manifest_digest {
                cache.put_manifest(&top, &stored)?;
            }
            tag.map_or(Ok(()), |tag| cache.put_tag(&tag, &top))
        })
        .await?;
        Ok(Pulled {
            module,
            module_digest: record.module_digest,
            manifest_digest: top_digest.clone(),
            layer_digest: record.layer_digest,
            format,
            origin: Origin::Registry,
        })
    }

    async fn cached(&self, manifest_digest: &str, origin: Origin) -> Option<Pulled> {
        let record = self.inner.cache.manifest(manifest_digest)?;
        let module = self.read_blob(&record.module_digest).await?;
        Some(Pulled {
            module,
            module_digest: record.module_digest,
            manifest_digest: manifest_digest.to_string(),
            layer_digest: record.layer_digest,
            format: record.format,
            origin,
        })
    }

    async fn read_blob(&self, digest: &str) -> Option<Bytes> {
        let (cache, digest) = (self.inner.cache.clone(), digest.to_string());
        tokio::task::spawn_blocking(move || cache.read_blob(&digest)).await.ok().flatten()
    }
}

/// A pin is the sha256 of the module, the bytes that are compiled, in every
/// layout: for the CNCF and Istio layouts that is also the layer's digest;
/// for an image tar it is the digest of `plugin.wasm`, not of the layer.
/// The plugin runtime checks the same digest when it loads the module, so a
/// pin accepted here is accepted there.
fn check_pin(pulled: Pulled, pin: Option<&str>) -> Result<Pulled, OciError> {
    match pin {
        Some(pin) if pin != pulled.module_digest => {
            let what = if pin == pulled.layer_digest {
                format!(
                    "module of manifest {} (pinned sha256: the pin names the image layer, but a pin is the \
                     sha256 of plugin.wasm inside it)",
                    pulled.manifest_digest
                )
            } else {
                format!("module of manifest {} (pinned sha256)", pulled.manifest_digest)
            };
            Err(OciError::DigestMismatch { what, expected: pin.to_string(), actual: pulled.module_digest })
        }
        _ => Ok(pulled),
    }
}

#[cfg(test)]
mod tests {
    use super::super::types::RegistryOptions;
    use super::*;

    #[test]
    fn pins_match_the_module_in_every_layout() {
        let pulled = Pulled {
            module: Bytes::from_static(b"m"),
            module_digest: sha256_digest(b"m"),
            manifest_digest: sha256_digest(b"manifest"),
            layer_digest: sha256_digest(b"layer"),
            format: Format::ImageTar,
            origin: Origin::Cache,
        };
        assert!(check_pin(pulled.clone(), None).is_ok());
        assert!(check_pin(pulled.clone(), Some(&sha256_digest(b"m"))).is_ok());
        let error = check_pin(pulled.clone(), Some(&sha256_digest(b"layer"))).unwrap_err();
        assert!(error.to_string().contains("the pin names the image layer"), "{error}");
        match check_pin(pulled, Some(&sha256_digest(b"other"))) {
            Err(OciError::DigestMismatch { expected, actual, .. }) => {
                assert_eq!((expected, actual), (sha256_digest(b"other"), sha256_digest(b"m")));
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_cached_digest_reference_is_served_without_the_network() {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::new(RegistryOptions::new(dir.path())).unwrap();
        let module = crate::component::tests::tiny_component();
        let module_digest = sha256_digest(&module);
        let manifest_digest = sha256_digest(b"some manifest");
        registry.inner.cache.write_blob(&module_digest, &module).unwrap();
        let record = ManifestRecord {
            manifest_digest: manifest_digest.clone(),
            layer_digest: module_digest.clone(),
            module_digest: module_digest.clone(),
            format: Format::CncfWasm,
        };
        registry.inner.cache.put_manifest(&manifest_digest, &record).unwrap();
        // Port 9 on loopback: nothing listens, so any network use would fail.
        let reference: Reference = format!("127.0.0.1:9/plugins/p@{manifest_digest}").parse().unwrap();
        for policy in [PullPolicy::IfNotPresent, PullPolicy::Always] {
            let pulled = registry.pull(&reference, policy, Some(&module_digest)).await.unwrap();
            assert_eq!((pulled.origin, &pulled.module[..]), (Origin::Cache, &module[..]));
        }
        let error = registry.pull(&reference, PullPolicy::IfNotPresent, Some(&sha256_digest(b"x"))).await.unwrap_err();
        assert!(matches!(error, OciError::DigestMismatch { .. }), "{error}");
    }

    #[tokio::test]
    async fn an_unreachable_registry_with_nothing_cached_is_a_transient_error() {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::new(RegistryOptions::new(dir.path())).unwrap();
        let reference: Reference = "127.0.0.1:9/plugins/p:v1".parse().unwrap();
        let error = registry.pull(&reference, PullPolicy::IfNotPresent, None).await.unwrap_err();
        assert!(error.is_transient(), "{error}");
        assert!(error.to_string().contains("127.0.0.1:9"), "{error}");
    }
}
