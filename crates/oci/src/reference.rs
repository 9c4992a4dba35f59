//! Image references: `registry/repo:tag`, `registry/repo@sha256:…`, or both.

use std::fmt;
use std::str::FromStr;

use crate::digest::check_sha256;
use crate::error::OciError;

/// A reference to an artifact in a registry. The registry host is required:
/// a plugin silently pulled from Docker Hub because a host was left out
/// would be a surprise, so there is no default registry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Reference {
    inner: oci_client::Reference,
}

impl Reference {
    /// The registry host, with its port if any (`127.0.0.1:5000`, `ghcr.io`).
    pub fn registry(&self) -> &str {
        self.inner.registry()
    }

    pub fn repository(&self) -> &str {
        self.inner.repository()
    }

    pub fn tag(&self) -> Option<&str> {
        self.inner.tag()
    }

    /// The pinned manifest digest (`sha256:<hex>`); it wins over the tag.
    pub fn digest(&self) -> Option<&str> {
        self.inner.digest()
    }

    /// The same repository at `digest`, without the tag.
    pub fn with_digest(&self, digest: &str) -> Reference {
        Reference {
            inner: oci_client::Reference::with_digest(
                self.registry().to_string(),
                self.repository().to_string(),
                digest.to_string(),
            ),
        }
    }

    pub(crate) fn as_oci(&self) -> &oci_client::Reference {
        &self.inner
    }
}

impl FromStr for Reference {
    type Err = OciError;

    fn from_str(text: &str) -> Result<Self, OciError> {
        let invalid = |reason: String| OciError::InvalidReference { reference: text.to_string(), reason };
        let (host, _) =
            text.split_once('/').ok_or_else(|| invalid("expected registry/repository[:tag][@sha256:…]".into()))?;
        // The same rule Docker uses to tell a host from a path component.
        if !(host.contains('.') || host.contains(':') || host == "localhost") {
            return Err(invalid(format!(
                "{host:?} is not a registry host; write the registry explicitly, e.g. ghcr.io/{text}"
            )));
        }
        let inner = oci_client::Reference::try_from(text).map_err(|e| invalid(e.to_string()))?;
        if let Some(digest) = inner.digest() {
            check_sha256(digest).map_err(invalid)?;
        }
        Ok(Reference { inner })
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.inner)
    }
}

/// Accepts a pin written as `sha256:<hex>` or bare `<hex>`; returns `sha256:<hex>`.
pub(crate) fn normalize_pin(pin: &str) -> Result<String, OciError> {
    let pin = pin.trim();
    let digest = if pin.starts_with("sha256:") { pin.to_string() } else { format!("sha256:{pin}") };
    check_sha256(&digest).map_err(|reason| OciError::InvalidReference { reference: pin.to_string(), reason })?;
    Ok(digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn parses_tag_digest_and_both() {
        let tagged: Reference = "127.0.0.1:5000/plugins/add-header:v1".parse().unwrap();
        assert_eq!(
            (tagged.registry(), tagged.repository(), tagged.tag(), tagged.digest()),
            ("127.0.0.1:5000", "plugins/add-header", Some("v1"), None)
        );

        let pinned: Reference = format!("ghcr.io/acme/filter@sha256:{HEX}").parse().unwrap();
        assert_eq!(pinned.registry(), "ghcr.io");
        assert_eq!(pinned.repository(), "acme/filter");
        assert_eq!(pinned.tag(), None);
        assert_eq!(pinned.digest(), Some(format!("sha256:{HEX}").as_str()));

        let both: Reference = format!("localhost/filter:v2@sha256:{HEX}").parse().unwrap();
        assert_eq!(both.registry(), "localhost");
        assert_eq!(both.tag(), Some("v2"));
        assert_eq!(both.digest(), Some(format!("sha256:{HEX}").as_str()));
        assert_eq!(both.to_string(), format!("localhost/filter:v2@sha256:{HEX}"));
    }

    #[test]
    fn a_missing_tag_means_latest() {
        let reference: Reference = "registry.example.com/team/plugin".parse().unwrap();
        assert_eq!(reference.tag(), Some("latest"));
    }

    #[test]
    fn refuses_references_without_a_registry_host() {
        for text in ["plugin:v1", "acme/plugin:v1", ""] {
            let err = text.parse::<Reference>().unwrap_err();
            assert!(matches!(err, OciError::InvalidReference { .. }), "{text}: {err}");
        }
    }

    #[test]
    fn refuses_malformed_and_non_sha256_digests() {
        for text in [
            "ghcr.io/a/b@sha256:abc".to_string(),
            format!("ghcr.io/a/b@sha512:{HEX}{HEX}"),
            format!("ghcr.io/a/b@sha256:{}", HEX.to_uppercase()),
            "ghcr.io/A/b:v1".to_string(),
            "ghcr.io/a/b:bad tag".to_string(),
        ] {
            assert!(text.parse::<Reference>().is_err(), "{text} parsed");
        }
    }

    #[test]
    fn with_digest_drops_the_tag() {
        let tagged: Reference = "localhost:5000/p:v1".parse().unwrap();
        let pinned = tagged.with_digest(&format!("sha256:{HEX}"));
        assert_eq!(pinned.to_string(), format!("localhost:5000/p@sha256:{HEX}"));
        assert_eq!(pinned.tag(), None);
    }

    #[test]
    fn pins_are_normalized() {
        assert_eq!(normalize_pin(HEX).unwrap(), format!("sha256:{HEX}"));
        assert_eq!(normalize_pin(&format!(" sha256:{HEX}\n")).unwrap(), format!("sha256:{HEX}"));
        assert!(normalize_pin("sha256:12").is_err());
    }
}
