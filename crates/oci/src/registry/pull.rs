//! Pulling: the cache first when the policy allows, the registry otherwise,
//! the last known module when the registry is unreachable.
//!
//! The cache is shared by every caller, so a cached module is served only
//! to a caller that may have it ([`Access`]): one that fetched it before
//! with the same credential from the same repository, or anyone if it was
//! fetched anonymously. Anyone else proves access to the registry again, as
//! kubelet re-checks an `IfNotPresent` image for a pod whose pull Secret did
//! not fetch it (KEP-2535): a manifest the repository serves them, or the
//! module's bytes downloaded from where their manifest names them.

use bytes::Bytes;

use super::client::Registry;
use super::resolve::resolve_manifest;
use super::signatures::fetch_verified;
use super::transport::{blocking, retrying};
use super::types::{Origin, PullPolicy, Pulled};
use crate::auth::{ANONYMOUS, PullCredentials, identity};
use crate::cache::{Grant, ManifestRecord};
use crate::component::inspect_component;
use crate::digest::sha256_digest;
use crate::error::OciError;
use crate::format::{self, Format, TAR_OVERHEAD_BYTES};
use crate::reference::{Reference, normalize_pin};
use crate::signature::{PublicKeys, verify};

/// What the cache may serve a caller of a module, by the module's grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Access {
    /// Fetched only from other repositories, or not recorded: the caller
    /// downloads it from the repository its manifest is in.
    Unproven,
    /// Fetched from this repository by another caller: the repository
    /// decides, and its serving this caller the manifest just now is that
    /// decision.
    SameRepository,
    /// Fetched anonymously (it is public), or by this caller from this
    /// repository: served without asking anyone.
    Granted,
}

fn access(grants: &[Grant], caller: &Grant) -> Access {
    if grants.iter().any(|grant| grant.identity == ANONYMOUS || grant == caller) {
        Access::Granted
    } else if grants.iter().any(|grant| grant.scope == caller.scope) {
        Access::SameRepository
    } else {
        Access::Unproven
    }
}

impl Registry {
    /// Fetches a verified component. `expected_sha256` pins the module
    /// content (`sha256:<hex>` or `<hex>`): the sha256 of the Wasm bytes in
    /// every layout, which for the image-tar format is that of `plugin.wasm`,
    /// not of the layer.
    ///
    /// Cheap when cached: a digest reference, or a tag under
    /// [`PullPolicy::IfNotPresent`] that was resolved before, reads the disk
    /// cache only, for a caller that fetched it before with the same
    /// credentials (or when it was fetched anonymously). When the registry is
    /// unreachable, the last module the reference resolved to is served from
    /// the cache ([`Origin::StaleCache`]) to such a caller.
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
        self.pull_verified(reference, policy, expected_sha256, credentials, None).await
    }

    /// [`Registry::pull_as`], and with `keys` the manifest must carry a
    /// cosign signature that verifies under one of them
    /// ([`OciError::SignatureMissing`], [`OciError::SignatureInvalid`]).
    ///
    /// The signature is checked against the digest the reference resolves
    /// to, before the module is downloaded: from the registry whenever the
    /// registry is asked, so a signature removed there stops the next pull
    /// that asks. The cache serves a module only while the signature it
    /// keeps next to the manifest verifies again under `keys` as they are
    /// now; otherwise the registry is asked, and if it cannot be reached
    /// the pull fails.
    pub async fn pull_verified(
        &self,
        reference: &Reference,
        policy: PullPolicy,
        expected_sha256: Option<&str>,
        credentials: Option<&PullCredentials>,
        keys: Option<&PublicKeys>,
    ) -> Result<Pulled, OciError> {
        let pin = expected_sha256.map(normalize_pin).transpose()?;
        let auth = self.auth(reference, credentials)?;
        let caller = Grant {
            scope: format!("{}/{}", reference.registry(), reference.repository()),
            identity: identity(reference.registry(), &auth),
        };
        let _same_reference = self.lock(format!("reference {reference}")).await;
        let known = match reference.digest() {
            Some(digest) => Some(digest.to_string()),
            None => self.inner.cache.tag(reference),
        };
        if (policy == PullPolicy::IfNotPresent || reference.digest().is_some())
            && let Some(manifest_digest) = &known
            && let Some(pulled) = self.cached(manifest_digest, Origin::Cache, &caller, Access::Granted).await
            && self.verified_in_cache(manifest_digest, keys)
        {
            return check_pin(pulled, pin.as_deref());
        }
        let (auth, caller) = (&auth, &caller);
        match retrying(reference, move || self.fetch(reference, auth, caller, keys)).await {
            Ok(pulled) => check_pin(pulled, pin.as_deref()),
            Err(error) if error.is_transient() => {
                let Some(manifest_digest) = &known else { return Err(error) };
                let Some(pulled) = self.cached(manifest_digest, Origin::StaleCache, caller, Access::Granted).await
                else {
                    return Err(error);
                };
                if !self.verified_in_cache(manifest_digest, keys) {
                    tracing::warn!(%reference, %error, manifest = %manifest_digest, "registry unreachable, and the cached module's signature does not verify under the current keys; not serving it");
                    return Err(error);
                }
                tracing::warn!(%reference, %error, manifest = %manifest_digest, "registry unreachable; serving the cached module");
                check_pin(pulled, pin.as_deref())
            }
            Err(error) => Err(error),
        }
    }

    /// Resolves the reference with the registry and fetches what is not
    /// cached, or not cached for this caller.
    async fn fetch(
        &self,
        reference: &Reference,
        auth: &oci_client::secrets::RegistryAuth,
        caller: &Grant,
        keys: Option<&PublicKeys>,
    ) -> Result<Pulled, OciError> {
        let session = self.inner.transport.session(reference, auth.clone());
        let (top_bytes, top_digest) = session.manifest(reference).await?;
        let cache = &self.inner.cache;
        // Before anything of the artifact is read or served: the digest the
        // reference resolved to is the one that must be signed.
        if let Some(keys) = keys {
            let signature = fetch_verified(&session, reference, &top_digest, keys).await?;
            let (cache, top_digest) = (cache.clone(), top_digest.clone());
            blocking(move || cache.put_signature(&top_digest, &signature)).await?;
        }
        let tag = reference.digest().is_none().then(|| reference.clone());
        // A tag that still points where it did: nothing to download.
        if let Some(pulled) = self.cached(&top_digest, Origin::Registry, caller, Access::SameRepository).await {
            let (cache, top_digest, module, caller) =
                (cache.clone(), top_digest.clone(), pulled.module_digest.clone(), caller.clone());
            blocking(move || {
                cache.grant(&module, caller)?;
                tag.map_or(Ok(()), |tag| cache.put_tag(&tag, &top_digest))
            })
            .await?;
            return Ok(pulled);
        }
        let (manifest, manifest_digest) = resolve_manifest(&session, reference, &top_bytes, &top_digest).await?;
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
        // Knowing a digest is no proof of access: a manifest anywhere can
        // name any layer. Cached bytes are reused only for a caller this
        // repository (or anonymity) vouches for; anyone else downloads them.
        let cached = match known_digest {
            Some(digest) if access(&cache.grants(&digest), caller) >= Access::SameRepository => {
                self.read_blob(&digest).await.map(|module| (module, digest))
            }
            _ => None,
        };
        let (module, module_digest) = match cached {
            Some(found) => found,
            None => {
                let layer_bytes = session.blob(layer, layer_limit).await?;
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
        let (cache, stored, top, caller) = (cache.clone(), record.clone(), top_digest.clone(), caller.clone());
        blocking(move || {
            cache.put_manifest(&stored.manifest_digest, &stored)?;
            if top != stored.manifest_digest {
                cache.put_manifest(&top, &stored)?;
            }
            cache.grant(&stored.module_digest, caller)?;
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

    /// The cached module of a manifest, if the caller has at least `needed`
    /// access to it.
    async fn cached(&self, manifest_digest: &str, origin: Origin, caller: &Grant, needed: Access) -> Option<Pulled> {
        let record = self.inner.cache.manifest(manifest_digest)?;
        if access(&self.inner.cache.grants(&record.module_digest), caller) < needed {
            return None;
        }
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

    /// Whether a module cached for `manifest_digest` may be served under
    /// `keys`: always without keys; with keys, only if the signature kept
    /// for it verifies again under them now.
    fn verified_in_cache(&self, manifest_digest: &str, keys: Option<&PublicKeys>) -> bool {
        let Some(keys) = keys else { return true };
        let Some(signature) = self.inner.cache.signature(manifest_digest) else { return false };
        match verify(keys, std::slice::from_ref(&signature), manifest_digest) {
            Ok(_) => true,
            Err(refusal) => {
                tracing::debug!(manifest = manifest_digest, %refusal, "the cached signature does not verify under the current keys");
                false
            }
        }
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

    #[test]
    fn access_follows_the_grants() {
        let grant = |scope: &str, identity: &str| Grant { scope: scope.into(), identity: identity.into() };
        let caller = grant("r/private", "sha256:me");
        assert_eq!(access(&[], &caller), Access::Unproven);
        assert_eq!(access(&[grant("r/private", "sha256:me")], &caller), Access::Granted);
        assert_eq!(access(&[grant("r/other", ANONYMOUS)], &caller), Access::Granted);
        assert_eq!(access(&[grant("r/private", "sha256:someone")], &caller), Access::SameRepository);
        assert_eq!(
            access(&[grant("r/other", "sha256:me"), grant("s/private", "sha256:me")], &caller),
            Access::Unproven
        );
    }

    #[tokio::test]
    async fn a_cached_digest_reference_is_served_without_the_network_to_a_caller_with_access() {
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
        // Port 9 on loopback: nothing listens, so any network use fails.
        let reference: Reference = format!("127.0.0.1:9/plugins/p@{manifest_digest}").parse().unwrap();
        let scope = "127.0.0.1:9/plugins/p".to_string();
        // Cached, but fetched by someone else: the registry must be asked.
        let secret = Grant { scope: scope.clone(), identity: identity("127.0.0.1:9", &basic("u", "pw")) };
        registry.inner.cache.grant(&module_digest, secret).unwrap();
        let error = registry.pull(&reference, PullPolicy::IfNotPresent, None).await.unwrap_err();
        assert!(error.is_transient(), "{error}");
        let credentials = PullCredentials::Basic { username: "u".into(), password: "pw".into() };
        let pulled = registry.pull_as(&reference, PullPolicy::IfNotPresent, None, Some(&credentials)).await.unwrap();
        assert_eq!((pulled.origin, &pulled.module[..]), (Origin::Cache, &module[..]));

        registry.inner.cache.grant(&module_digest, Grant { scope, identity: ANONYMOUS.into() }).unwrap();
        for policy in [PullPolicy::IfNotPresent, PullPolicy::Always] {
            let pulled = registry.pull(&reference, policy, Some(&module_digest)).await.unwrap();
            assert_eq!((pulled.origin, &pulled.module[..]), (Origin::Cache, &module[..]));
        }
        let error = registry.pull(&reference, PullPolicy::IfNotPresent, Some(&sha256_digest(b"x"))).await.unwrap_err();
        assert!(matches!(error, OciError::DigestMismatch { .. }), "{error}");
    }

    #[tokio::test]
    async fn a_cached_module_is_served_only_while_its_kept_signature_verifies_under_the_current_keys() {
        use crate::signature::tests::{PKCS8, PKCS8_PUB, SEC1_PUB};
        use crate::signature::{SignedPayload, SigningKey, simple_signing_payload};
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::new(RegistryOptions::new(dir.path())).unwrap();
        let module = crate::component::tests::tiny_component();
        let module_digest = sha256_digest(&module);
        let manifest_digest = sha256_digest(b"a signed manifest");
        let cache = &registry.inner.cache;
        cache.write_blob(&module_digest, &module).unwrap();
        let record = ManifestRecord {
            manifest_digest: manifest_digest.clone(),
            layer_digest: module_digest.clone(),
            module_digest: module_digest.clone(),
            format: Format::CncfWasm,
        };
        cache.put_manifest(&manifest_digest, &record).unwrap();
        let scope = "127.0.0.1:9/plugins/p".to_string();
        cache.grant(&module_digest, Grant { scope, identity: ANONYMOUS.into() }).unwrap();
        // Port 9 on loopback: nothing listens, so anything not served from
        // the cache fails as an unreachable registry.
        let reference: Reference = format!("127.0.0.1:9/plugins/p@{manifest_digest}").parse().unwrap();
        let signer = PublicKeys::from_pems(&[PKCS8_PUB]).unwrap();
        let stranger = PublicKeys::from_pems(&[SEC1_PUB]).unwrap();
        let pull = async |keys: Option<&PublicKeys>| {
            registry.pull_verified(&reference, PullPolicy::IfNotPresent, None, None, keys).await
        };
        let (signer, stranger) = (&signer, &stranger);

        // Cached, but no signature kept: only an unverified pull is served.
        assert_eq!(pull(None).await.unwrap().origin, Origin::Cache);
        assert!(pull(Some(signer)).await.unwrap_err().is_transient());

        let payload = simple_signing_payload("127.0.0.1:9/plugins/p", &manifest_digest);
        let key = SigningKey::from_pem(PKCS8.as_bytes(), None).unwrap();
        let signed = SignedPayload { signature: key.sign(&payload), payload };
        cache.put_signature(&manifest_digest, &signed).unwrap();
        let pulled = pull(Some(signer)).await.unwrap();
        assert_eq!((pulled.origin, &pulled.module[..]), (Origin::Cache, &module[..]));
        // Another key: the registry must be asked, and it is unreachable.
        assert!(pull(Some(stranger)).await.unwrap_err().is_transient());

        // A record edited on disk (here: naming another manifest, re-signed
        // by a key not listed) verifies nothing.
        let other = simple_signing_payload("127.0.0.1:9/plugins/p", &sha256_digest(b"another manifest"));
        cache.put_signature(&manifest_digest, &SignedPayload { signature: key.sign(&other), payload: other }).unwrap();
        assert!(pull(Some(signer)).await.unwrap_err().is_transient());
        std::fs::write(dir.path().join("signatures/sha256").join(&manifest_digest[7..]).with_extension("json"), "{")
            .unwrap();
        assert!(pull(Some(signer)).await.unwrap_err().is_transient());
    }

    fn basic(username: &str, password: &str) -> oci_client::secrets::RegistryAuth {
        oci_client::secrets::RegistryAuth::Basic(username.into(), password.into())
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
