//! Pull, push and inspect against a registry, with verification, a disk
//! cache and retries around `oci-client`.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt as _};
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::{OciDescriptor, OciImageManifest, OciManifest};
use oci_client::secrets::RegistryAuth;
use serde::Serialize;
use sha2::Digest as _;

use crate::cache::{Cache, ManifestRecord};
use crate::component::{ComponentInfo, inspect_component};
use crate::format::{self, Format, WasmConfig, WasmConfigComponent};
use crate::media_types as mt;
use crate::reference::normalize_pin;
use crate::{Credentials, OciError, PullCredentials, Reference, sha256_digest};

/// Large enough for interpreted-language components (Python's are ~20 MB).
pub const DEFAULT_MAX_MODULE_BYTES: u64 = 100 * 1024 * 1024;
/// Room for tar headers and neighbouring files around `plugin.wasm`.
const TAR_OVERHEAD_BYTES: u64 = 1024 * 1024;
/// A config blob is a few hundred bytes; refuse to buffer a huge one.
const MAX_CONFIG_BYTES: u64 = 1024 * 1024;
/// Waits between tries of a transient failure: three tries in all.
const RETRY_DELAYS: [Duration; 2] = [Duration::from_millis(200), Duration::from_secs(1)];
const PUSH_PIECE_BYTES: usize = 256 * 1024;
const USER_AGENT: &str = concat!("sluice/", env!("CARGO_PKG_VERSION"));

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

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PullPolicy {
    /// Use the cache when it has the reference: a digest reference, or a tag
    /// resolved before. The registry is not contacted then.
    #[default]
    IfNotPresent,
    /// Re-resolve a tag on every pull (content already cached is not
    /// downloaded again). A digest reference is immutable, so it is still
    /// served from the cache.
    Always,
}

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

/// A registry client for plugin components. Cheap to clone; clones share
/// connections, the cache and the in-flight pull deduplication.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

struct Inner {
    options: RegistryOptions,
    /// Mozilla's roots plus the configured bundles, DER.
    roots: Vec<Certificate>,
    /// One client per registry host, rebuilt when its credentials change
    /// (oci-client keeps the first credentials it is given).
    clients: Mutex<HashMap<String, (RegistryAuth, oci_client::Client)>>,
    cache: Cache,
    /// Per-key locks: pulls of the same reference, and downloads of the same
    /// blob, run one at a time, so concurrent callers share one download.
    locks: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

impl Registry {
    pub fn new(options: RegistryOptions) -> Result<Registry, OciError> {
        // reqwest is built without a default crypto provider; use ring, as
        // the rest of the workspace does. An already installed one is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut roots: Vec<Certificate> = webpki_root_certs::TLS_SERVER_ROOT_CERTS
            .iter()
            .map(|cert| Certificate { encoding: CertificateEncoding::Der, data: cert.to_vec() })
            .collect();
        for path in &options.ca_bundles {
            roots.extend(read_pem_bundle(path)?);
        }
        let cache = Cache::open(&options.cache_dir)?;
        Ok(Registry {
            inner: Arc::new(Inner {
                options,
                roots,
                clients: Mutex::new(HashMap::new()),
                cache,
                locks: Mutex::new(HashMap::new()),
            }),
        })
    }

    pub fn options(&self) -> &RegistryOptions {
        &self.inner.options
    }

    /// Fetches a verified component. `expected_sha256` pins the module
    /// content (`sha256:<hex>` or `<hex>`; for the image-tar format the
    /// layer digest is accepted too).
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

    /// Describes an artifact: its manifest, config, layers, and the
    /// component inside (which is pulled, through the cache, to read it).
    pub async fn inspect(&self, reference: &Reference) -> Result<Inspection, OciError> {
        let (client, auth) = self.client(reference).await?;
        let (client, auth) = (&client, &auth);
        let (top_media_type, top_digest, manifest, image_digest, config_json) =
            retrying(reference, move || self.describe(client, auth, reference)).await?;
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

    /// The manifests and config behind a reference, for `inspect`.
    async fn describe(
        &self,
        client: &oci_client::Client,
        auth: &RegistryAuth,
        reference: &Reference,
    ) -> Result<(Option<String>, String, OciImageManifest, String, Option<serde_json::Value>), OciError> {
        let (top_bytes, top_digest) = self.manifest_raw(client, auth, reference).await?;
        let top_media_type = serde_json::from_slice::<serde_json::Value>(&top_bytes)
            .ok()
            .and_then(|v| v.get("mediaType").and_then(|m| m.as_str()).map(String::from));
        let (manifest, image_digest) = self.resolve_manifest(client, auth, reference, &top_bytes, &top_digest).await?;
        let config_json = if manifest.config.size as u64 <= MAX_CONFIG_BYTES {
            let bytes = self.download(client, reference, &manifest.config, MAX_CONFIG_BYTES).await?;
            serde_json::from_slice(&bytes).ok()
        } else {
            None
        };
        Ok((top_media_type, top_digest, manifest, image_digest, config_json))
    }

    /// Resolves the reference with the registry and fetches what is not cached.
    async fn fetch(&self, reference: &Reference, credentials: Option<&PullCredentials>) -> Result<Pulled, OciError> {
        let (client, auth) = self.client_as(reference, credentials).await?;
        let (top_bytes, top_digest) = self.manifest_raw(&client, &auth, reference).await?;
        let cache = &self.inner.cache;
        let tag = reference.digest().is_none().then(|| reference.clone());
        // A tag that still points where it did: nothing to download.
        if let Some(pulled) = self.cached(&top_digest, Origin::Registry).await {
            let (cache, top_digest) = (cache.clone(), top_digest.clone());
            blocking(move || tag.map_or(Ok(()), |tag| cache.put_tag(&tag, &top_digest))).await?;
            return Ok(pulled);
        }
        let (manifest, manifest_digest) =
            self.resolve_manifest(&client, &auth, reference, &top_bytes, &top_digest).await?;
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
                let layer_bytes = self.download(&client, reference, layer, layer_limit).await?;
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

    /// The manifest a reference names, verified against the reference's
    /// digest if it has one (oci-client checks the body's hash).
    async fn manifest_raw(
        &self,
        client: &oci_client::Client,
        auth: &RegistryAuth,
        reference: &Reference,
    ) -> Result<(Bytes, String), OciError> {
        client
            .pull_manifest_raw(reference.as_oci(), auth, mt::MANIFESTS)
            .await
            .map_err(|e| OciError::from_client(e, reference.registry(), &reference.to_string()))
    }

    /// Parses a manifest; for an index, fetches the Wasm entry's manifest.
    async fn resolve_manifest(
        &self,
        client: &oci_client::Client,
        auth: &RegistryAuth,
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
            OciManifest::Image(manifest) => Ok((manifest, digest.to_string())),
            OciManifest::ImageIndex(index) => {
                let entry = format::choose_index_entry(&index)?;
                let entry_reference = reference.with_digest(&entry.digest);
                let (bytes, entry_digest) = self.manifest_raw(client, auth, &entry_reference).await?;
                match parse(&bytes)? {
                    OciManifest::Image(manifest) => Ok((manifest, entry_digest)),
                    OciManifest::ImageIndex(_) => Err(OciError::UnsupportedFormat {
                        media_types: vec![entry.media_type.clone()],
                        reason: "an index inside an index".into(),
                    }),
                }
            }
        }
    }

    /// Streams a blob into memory, hashing as it goes and stopping at `limit`.
    async fn download(
        &self,
        client: &oci_client::Client,
        reference: &Reference,
        descriptor: &OciDescriptor,
        limit: u64,
    ) -> Result<Bytes, OciError> {
        let registry = reference.registry();
        let what = format!("blob {} of {reference}", descriptor.digest);
        let mut stream = client
            .pull_blob_stream(reference.as_oci(), descriptor)
            .await
            .map_err(|e| OciError::from_client(e, registry, &what))?;
        if let Some(length) = stream.content_length
            && length > limit
        {
            return Err(OciError::TooLarge { size: length, max: limit });
        }
        let mut buffer = Vec::with_capacity((descriptor.size.max(0) as u64).min(limit) as usize);
        let mut hasher = sha2::Sha256::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| OciError::from_stream(e, registry, &what))?;
            let received = (buffer.len() + chunk.len()) as u64;
            if received > limit {
                return Err(OciError::TooLarge { size: received, max: limit });
            }
            hasher.update(&chunk);
            buffer.extend_from_slice(&chunk);
        }
        // oci-client verifies too; this check does not depend on it.
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        if actual != descriptor.digest {
            return Err(OciError::DigestMismatch { what, expected: descriptor.digest.clone(), actual });
        }
        if buffer.len() as i64 != descriptor.size {
            return Err(OciError::Protocol {
                registry: registry.to_string(),
                detail: format!("{what} is {} bytes, the manifest says {}", buffer.len(), descriptor.size),
            });
        }
        Ok(Bytes::from(buffer))
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

    /// The client for this reference's registry, with its current credentials.
    async fn client(&self, reference: &Reference) -> Result<(oci_client::Client, RegistryAuth), OciError> {
        self.client_as(reference, None).await
    }

    async fn client_as(
        &self,
        reference: &Reference,
        credentials: Option<&PullCredentials>,
    ) -> Result<(oci_client::Client, RegistryAuth), OciError> {
        let registry = reference.registry().to_string();
        let auth = match credentials {
            Some(credentials) => credentials.for_registry(&registry)?,
            None => self.inner.options.credentials.for_registry(&registry)?,
        };
        if let Some((known, client)) = self.inner.clients.lock().expect("clients lock").get(&registry)
            && *known == auth
        {
            return Ok((client.clone(), auth));
        }
        let plain_http = self.plain_http(&registry);
        let config = ClientConfig {
            protocol: if plain_http { ClientProtocol::Http } else { ClientProtocol::Https },
            // Exactly these roots: the same trust on every machine, whatever
            // its OS store holds.
            tls_certs_only: self.inner.roots.clone(),
            // Indexes are resolved here, to the wasm/wasi entry.
            platform_resolver: None,
            connect_timeout: Some(Duration::from_secs(5)),
            read_timeout: Some(Duration::from_secs(60)),
            user_agent: USER_AGENT,
            // Two requests per blob instead of one per 4 MiB chunk; the
            // streamed body still reports progress.
            use_monolithic_push: true,
            ..Default::default()
        };
        let client = oci_client::Client::try_from(config).map_err(|e| OciError::Tls(e.to_string()))?;
        client.store_auth_if_needed(reference.as_oci().resolve_registry(), &auth).await;
        self.inner.clients.lock().expect("clients lock").insert(registry, (auth.clone(), client.clone()));
        Ok((client, auth))
    }

    fn plain_http(&self, registry: &str) -> bool {
        let host = host_of(registry);
        is_loopback(host) || self.inner.options.insecure_registries.iter().any(|r| r == registry || r == host)
    }

    async fn lock(&self, key: String) -> tokio::sync::OwnedMutexGuard<()> {
        let mutex = {
            let mut locks = self.inner.locks.lock().expect("locks lock");
            if locks.len() > 256 {
                locks.retain(|_, lock| lock.strong_count() > 0);
            }
            match locks.get(&key).and_then(Weak::upgrade) {
                Some(mutex) => mutex,
                None => {
                    let mutex = Arc::new(tokio::sync::Mutex::new(()));
                    locks.insert(key, Arc::downgrade(&mutex));
                    mutex
                }
            }
        };
        mutex.lock_owned().await
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

fn check_pin(pulled: Pulled, pin: Option<&str>) -> Result<Pulled, OciError> {
    match pin {
        Some(pin) if pin != pulled.module_digest && pin != pulled.layer_digest => Err(OciError::DigestMismatch {
            what: format!("module of manifest {} (pinned sha256)", pulled.manifest_digest),
            expected: pin.to_string(),
            actual: pulled.module_digest,
        }),
        _ => Ok(pulled),
    }
}

/// Runs `attempt` up to three times while it fails transiently.
async fn retrying<T, F, Fut>(reference: &Reference, mut attempt: F) -> Result<T, OciError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, OciError>>,
{
    let mut delays = RETRY_DELAYS.iter();
    loop {
        match attempt().await {
            Err(error) if error.is_transient() => match delays.next() {
                Some(delay) => {
                    tracing::debug!(%reference, %error, ?delay, "transient registry error; retrying");
                    tokio::time::sleep(*delay).await;
                }
                None => return Err(error),
            },
            result => return result,
        }
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, OciError> + Send + 'static,
) -> Result<T, OciError> {
    tokio::task::spawn_blocking(work).await.expect("blocking task panicked")
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

fn read_pem_bundle(path: &PathBuf) -> Result<Vec<Certificate>, OciError> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject as _;
    let bad = |reason: String| OciError::Tls(format!("CA bundle {}: {reason}", path.display()));
    let certificates: Vec<Certificate> = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .map(|cert| cert.map(|der| Certificate { encoding: CertificateEncoding::Der, data: der.to_vec() }))
        .collect::<Result<_, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certificates.is_empty() {
        return Err(bad("no PEM certificates in it".into()));
    }
    Ok(certificates)
}

/// `host` of `host:port`, `[v6]:port` or a bare host.
fn host_of(registry: &str) -> &str {
    if let Some(rest) = registry.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match registry.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => registry,
    }
}

fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_only_for_loopback_and_listed_registries() {
        let dir = tempfile::tempdir().unwrap();
        let mut options = RegistryOptions::new(dir.path());
        options.insecure_registries = vec!["registry.internal:5000".into(), "plain.example".into()];
        let registry = Registry::new(options).unwrap();
        for plain in [
            "127.0.0.1:5000",
            "127.8.9.10",
            "localhost:1234",
            "LOCALHOST",
            "[::1]:5000",
            "registry.internal:5000",
            "plain.example:443",
        ] {
            assert!(registry.plain_http(plain), "{plain} should be plain HTTP");
        }
        for tls in ["ghcr.io", "registry.internal:6000", "10.0.0.1:5000", "128.0.0.1", "localhost.example.com"] {
            assert!(!registry.plain_http(tls), "{tls} should be HTTPS");
        }
    }

    #[test]
    fn pins_match_the_module_or_for_tar_images_the_layer() {
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
        assert!(check_pin(pulled.clone(), Some(&sha256_digest(b"layer"))).is_ok());
        match check_pin(pulled, Some(&sha256_digest(b"other"))) {
            Err(OciError::DigestMismatch { expected, actual, .. }) => {
                assert_eq!((expected, actual), (sha256_digest(b"other"), sha256_digest(b"m")));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn ca_bundles_must_hold_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let mut options = RegistryOptions::new(dir.path().join("cache"));
        options.ca_bundles = vec![empty];
        let error = Registry::new(options).err().expect("an empty bundle is refused");
        assert!(error.to_string().contains("empty.pem"), "{error}");

        // One of the Mozilla roots, re-encoded as PEM, is a valid bundle.
        let der = webpki_root_certs::TLS_SERVER_ROOT_CERTS[0].to_vec();
        let pem = format!("-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n", {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD.encode(der)
        });
        let bundle = dir.path().join("bundle.pem");
        std::fs::write(&bundle, pem).unwrap();
        let mut options = RegistryOptions::new(dir.path().join("cache"));
        options.ca_bundles = vec![bundle];
        let registry = Registry::new(options).unwrap();
        assert_eq!(registry.inner.roots.len(), webpki_root_certs::TLS_SERVER_ROOT_CERTS.len() + 1);
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
        let progress: Progress = Arc::new(move |sent, total| record.lock().unwrap().push((sent, total)));
        let data = Bytes::from(vec![1u8; PUSH_PIECE_BYTES * 2 + 10]);
        let pieces: Vec<Bytes> = progress_stream(data.clone(), Some(progress)).map(|p| p.unwrap()).collect().await;
        assert_eq!(pieces.concat(), data.to_vec());
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 3);
        assert_eq!(*seen.last().unwrap(), (data.len() as u64, data.len() as u64));
    }
}
