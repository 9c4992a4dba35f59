//! Content-addressed module cache on disk.
//!
//! ```text
//! <root>/blobs/sha256/<hex>             module bytes, named by their sha256
//! <root>/manifests/sha256/<hex>.json    manifest digest -> module digest, layer, format
//! <root>/refs/<sha256 of reference>.json  tag reference -> manifest digest (last seen)
//! <root>/access/sha256/<hex>.json       who fetched a module, from which repository
//! <root>/signatures/sha256/<hex>.json   the cosign signature a manifest was verified with
//! <root>/tmp/                           staging for atomic writes
//! ```
//!
//! One cache serves every caller, but not every caller may read every
//! module: a module pulled with one namespace's pull Secret is not another
//! namespace's. So each module lists its [`Grant`]s, the repositories it was
//! fetched from and who fetched it, and the puller serves a cached module
//! only to a caller a grant covers (see `registry/pull.rs`), as kubelet
//! serves an `IfNotPresent` image only to pods whose pull Secret fetched it
//! or that prove access again (KEP-2535).
//!
//! A module whose plugin must be signed is served from here only if the
//! signature kept next to its manifest verifies again, under the keys the
//! plugin lists now: the record is a proof to check, never a verdict to
//! trust (see `registry/pull.rs`).
//!
//! Every file is written to tmp/, fsynced, then renamed into place, so a
//! crash leaves either the old file or the new one, never half of one; and
//! a blob is checked against its name when read, so a corrupted file is a
//! cache miss, not a different plugin.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::digest::{check_sha256, sha256_digest};
use crate::error::OciError;
use crate::format::Format;
use crate::reference::Reference;
use crate::signature::SignedPayload;

#[derive(Clone, Debug)]
pub(crate) struct Cache {
    root: PathBuf,
}

/// What a manifest resolved to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ManifestRecord {
    /// The image manifest's own digest (differs from the key for an index).
    pub manifest_digest: String,
    pub layer_digest: String,
    pub module_digest: String,
    pub format: Format,
}

/// A caller seen to fetch a module: the repository it came from
/// (`registry/repository`) and who asked (`anonymous`, or a hash of the
/// credential).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Grant {
    pub scope: String,
    pub identity: String,
}

/// Grants kept per module, newest last: a rotated password adds one each
/// time, and an old one costs only a new proof of access when it falls off.
const MAX_GRANTS: usize = 64;

/// A signature record is a payload (at most 64 KiB) and a signature, in
/// base64: anything larger was not written by this cache.
const MAX_SIGNATURE_RECORD_BYTES: u64 = 128 * 1024;

#[derive(Serialize, Deserialize)]
struct RefRecord {
    reference: String,
    manifest_digest: String,
}

impl Cache {
    pub(crate) fn open(root: &Path) -> Result<Cache, OciError> {
        for dir in ["blobs/sha256", "manifests/sha256", "refs", "access/sha256", "signatures/sha256", "tmp"] {
            let path = root.join(dir);
            std::fs::create_dir_all(&path).map_err(|source| OciError::Cache { path, source })?;
        }
        Ok(Cache { root: root.to_path_buf() })
    }

    /// `None` unless `digest` is `sha256:<64 hex>`: a digest that came from
    /// a registry or a record on disk never names a path of its choosing.
    fn blob_path(&self, digest: &str) -> Option<PathBuf> {
        check_sha256(digest).ok()?;
        Some(self.root.join("blobs/sha256").join(hex_of(digest)))
    }

    fn manifest_path(&self, digest: &str) -> Option<PathBuf> {
        check_sha256(digest).ok()?;
        Some(self.root.join("manifests/sha256").join(format!("{}.json", hex_of(digest))))
    }

    fn access_path(&self, digest: &str) -> Option<PathBuf> {
        check_sha256(digest).ok()?;
        Some(self.root.join("access/sha256").join(format!("{}.json", hex_of(digest))))
    }

    fn signature_path(&self, digest: &str) -> Option<PathBuf> {
        check_sha256(digest).ok()?;
        Some(self.root.join("signatures/sha256").join(format!("{}.json", hex_of(digest))))
    }

    fn invalid(&self, digest: &str) -> OciError {
        let reason = check_sha256(digest).err().unwrap_or_default();
        OciError::Cache {
            path: self.root.clone(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, reason),
        }
    }

    fn ref_path(&self, reference: &Reference) -> PathBuf {
        let key = sha256_digest(reference.to_string().as_bytes());
        self.root.join("refs").join(format!("{}.json", hex_of(&key)))
    }

    /// The blob named `digest`, if present and intact. Blocking: call from
    /// a blocking context for large blobs.
    pub(crate) fn read_blob(&self, digest: &str) -> Option<Bytes> {
        let path = self.blob_path(digest)?;
        let bytes = std::fs::read(&path).ok()?;
        let actual = sha256_digest(&bytes);
        if actual != digest {
            tracing::warn!(path = %path.display(), expected = digest, %actual, "cached blob is corrupt; discarding it");
            let _ = std::fs::remove_file(&path);
            return None;
        }
        Some(Bytes::from(bytes))
    }

    /// Stores `bytes` under their own sha256 (which the caller has already
    /// checked against what it expected). Blocking.
    pub(crate) fn write_blob(&self, digest: &str, bytes: &[u8]) -> Result<(), OciError> {
        let path = self.blob_path(digest).ok_or_else(|| self.invalid(digest))?;
        if path.is_file() {
            return Ok(());
        }
        self.write_atomically(&path, bytes)
    }

    /// The record for `digest`; a record whose digests are not all well
    /// formed (edited on disk) is a miss.
    pub(crate) fn manifest(&self, digest: &str) -> Option<ManifestRecord> {
        let text = std::fs::read(self.manifest_path(digest)?).ok()?;
        let record: ManifestRecord = serde_json::from_slice(&text).ok()?;
        let digests = [&record.manifest_digest, &record.layer_digest, &record.module_digest];
        if digests.iter().any(|d| check_sha256(d).is_err()) {
            tracing::warn!(manifest = digest, "cached manifest record names a malformed digest; ignoring it");
            return None;
        }
        Some(record)
    }

    pub(crate) fn put_manifest(&self, digest: &str, record: &ManifestRecord) -> Result<(), OciError> {
        let path = self.manifest_path(digest).ok_or_else(|| self.invalid(digest))?;
        let json = serde_json::to_vec_pretty(record).expect("a record serializes");
        self.write_atomically(&path, &json)
    }

    /// The manifest digest `reference` (a tag) pointed to when last resolved.
    pub(crate) fn tag(&self, reference: &Reference) -> Option<String> {
        let text = std::fs::read(self.ref_path(reference)).ok()?;
        let record: RefRecord = serde_json::from_slice(&text).ok()?;
        // The file name is a hash; guard against the (theoretical) collision.
        (record.reference == reference.to_string() && check_sha256(&record.manifest_digest).is_ok())
            .then_some(record.manifest_digest)
    }

    pub(crate) fn put_tag(&self, reference: &Reference, manifest_digest: &str) -> Result<(), OciError> {
        let record = RefRecord { reference: reference.to_string(), manifest_digest: manifest_digest.to_string() };
        let json = serde_json::to_vec_pretty(&record).expect("a record serializes");
        self.write_atomically(&self.ref_path(reference), &json)
    }

    /// Who has fetched the module `digest`, and from where; none if the
    /// record is missing or unreadable (the module must then be fetched).
    pub(crate) fn grants(&self, digest: &str) -> Vec<Grant> {
        let Some(text) = self.access_path(digest).and_then(|path| std::fs::read(path).ok()) else {
            return Vec::new();
        };
        serde_json::from_slice(&text).unwrap_or_default()
    }

    /// Records that `grant`'s caller fetched the module `digest`. Two
    /// callers recording at once may lose one grant: that caller then proves
    /// access once more.
    pub(crate) fn grant(&self, digest: &str, grant: Grant) -> Result<(), OciError> {
        let path = self.access_path(digest).ok_or_else(|| self.invalid(digest))?;
        let mut grants = self.grants(digest);
        if grants.contains(&grant) {
            return Ok(());
        }
        grants.push(grant);
        let excess = grants.len().saturating_sub(MAX_GRANTS);
        grants.drain(..excess);
        let json = serde_json::to_vec_pretty(&grants).expect("grants serialize");
        self.write_atomically(&path, &json)
    }

    /// The signature the manifest `digest` was last verified with; none if
    /// missing, unreadable or oversized (the registry is then asked).
    pub(crate) fn signature(&self, digest: &str) -> Option<SignedPayload> {
        use std::io::Read as _;
        let file = std::fs::File::open(self.signature_path(digest)?).ok()?;
        let mut text = Vec::new();
        file.take(MAX_SIGNATURE_RECORD_BYTES + 1).read_to_end(&mut text).ok()?;
        if text.len() as u64 > MAX_SIGNATURE_RECORD_BYTES {
            return None;
        }
        serde_json::from_slice(&text).ok()
    }

    pub(crate) fn put_signature(&self, digest: &str, signature: &SignedPayload) -> Result<(), OciError> {
        let path = self.signature_path(digest).ok_or_else(|| self.invalid(digest))?;
        let json = serde_json::to_vec_pretty(signature).expect("a signature serializes");
        self.write_atomically(&path, &json)
    }

    fn write_atomically(&self, path: &Path, bytes: &[u8]) -> Result<(), OciError> {
        let error = |source| OciError::Cache { path: path.to_path_buf(), source };
        let mut staged = tempfile::NamedTempFile::new_in(self.root.join("tmp")).map_err(error)?;
        staged.write_all(bytes).map_err(error)?;
        staged.as_file().sync_all().map_err(error)?;
        staged.persist(path).map_err(|e| error(e.error))?;
        // The rename itself is durable only once the directory is synced.
        if let Some(dir) = path.parent()
            && let Ok(dir) = std::fs::File::open(dir)
        {
            let _ = dir.sync_all();
        }
        Ok(())
    }
}

fn hex_of(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_round_trip_and_are_named_by_their_digest() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let bytes = b"module bytes";
        let digest = sha256_digest(bytes);
        assert!(cache.read_blob(&digest).is_none());
        cache.write_blob(&digest, bytes).unwrap();
        assert_eq!(cache.read_blob(&digest).unwrap(), &bytes[..]);
        assert!(dir.path().join("blobs/sha256").join(hex_of(&digest)).is_file());
        // Nothing is left behind in the staging directory.
        assert_eq!(std::fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    }

    #[test]
    fn a_corrupted_blob_is_a_miss_and_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let digest = sha256_digest(b"original");
        cache.write_blob(&digest, b"original").unwrap();
        std::fs::write(cache.blob_path(&digest).unwrap(), b"tampered").unwrap();
        assert!(cache.read_blob(&digest).is_none());
        assert!(!cache.blob_path(&digest).unwrap().exists());
    }

    #[test]
    fn a_malformed_digest_names_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(&dir.path().join("cache")).unwrap();
        let outside = dir.path().join("outside");
        std::fs::write(&outside, b"keep me").unwrap();
        for digest in [format!("sha256:{}", outside.display()), "sha256:../../../outside".into(), "sha512:ab".into()] {
            assert!(cache.read_blob(&digest).is_none(), "{digest}");
            assert!(cache.manifest(&digest).is_none(), "{digest}");
            assert!(cache.write_blob(&digest, b"x").is_err(), "{digest}");
            let record = ManifestRecord {
                manifest_digest: sha256_digest(b"m"),
                layer_digest: sha256_digest(b"l"),
                module_digest: digest.clone(),
                format: Format::CncfWasm,
            };
            let key = sha256_digest(b"m");
            cache.put_manifest(&key, &record).unwrap();
            assert!(cache.manifest(&key).is_none(), "a record naming {digest} was served");
            assert_eq!(std::fs::read(&outside).unwrap(), b"keep me", "{digest}");
        }
    }

    #[test]
    fn grants_accumulate_without_duplicates_and_keep_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let module = sha256_digest(b"module");
        let grant = |i: usize| Grant { scope: "r/p".into(), identity: format!("id-{i}") };
        assert!(cache.grants(&module).is_empty());
        cache.grant(&module, grant(0)).unwrap();
        cache.grant(&module, grant(0)).unwrap();
        assert_eq!(cache.grants(&module), [grant(0)]);
        for i in 1..=MAX_GRANTS {
            cache.grant(&module, grant(i)).unwrap();
        }
        let grants = cache.grants(&module);
        assert_eq!(grants.len(), MAX_GRANTS);
        assert_eq!((grants.first(), grants.last()), (Some(&grant(1)), Some(&grant(MAX_GRANTS))));
        // A damaged record grants nothing.
        std::fs::write(cache.access_path(&module).unwrap(), b"{not json").unwrap();
        assert!(cache.grants(&module).is_empty());
        assert!(cache.grant("sha256:../../x", grant(0)).is_err());
    }

    #[test]
    fn manifests_and_tags_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let reference: Reference = "127.0.0.1:5000/p:v1".parse().unwrap();
        let other: Reference = "127.0.0.1:5000/p:v2".parse().unwrap();
        let manifest = sha256_digest(b"manifest");
        assert_eq!(cache.tag(&reference), None);
        cache.put_tag(&reference, &manifest).unwrap();
        assert_eq!(cache.tag(&reference), Some(manifest.clone()));
        assert_eq!(cache.tag(&other), None);

        let record = ManifestRecord {
            manifest_digest: manifest.clone(),
            layer_digest: sha256_digest(b"layer"),
            module_digest: sha256_digest(b"module"),
            format: Format::ImageTar,
        };
        cache.put_manifest(&manifest, &record).unwrap();
        assert_eq!(cache.manifest(&manifest), Some(record));
        // A moved tag overwrites the old mapping.
        let moved = sha256_digest(b"manifest 2");
        cache.put_tag(&reference, &moved).unwrap();
        assert_eq!(cache.tag(&reference), Some(moved));
    }
}
