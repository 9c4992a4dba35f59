//! Content digests: computing them, and checking the shape of one before it
//! names a file or a URL.

use crate::error::OciError;

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// `sha256:` followed by 64 lowercase hex digits: the only digest the cache stores.
pub(crate) fn check_sha256(digest: &str) -> Result<(), String> {
    match digest.strip_prefix("sha256:") {
        Some(hex) if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) => Ok(()),
        Some(_) => Err(format!("{digest:?} is not sha256: followed by 64 lowercase hex digits")),
        None => Err(format!("{digest:?}: only sha256 digests are supported")),
    }
}

/// Refuses a digest a registry (or anything else untrusted) handed over
/// unless it has the one shape the cache and URLs are built from: a digest
/// is joined into paths and URLs, so `sha256:../../x` must never get there.
pub(crate) fn check_registry_digest(digest: &str, what: &str, registry: &str) -> Result<(), OciError> {
    check_sha256(digest)
        .map_err(|reason| OciError::Protocol { registry: registry.to_string(), detail: format!("{what}: {reason}") })
}
