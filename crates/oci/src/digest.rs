//! Content digests: computing them, and checking the shape of one before it
//! names a file or a URL.

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
