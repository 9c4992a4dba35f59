//! Image references: `registry/repo:tag`, `registry/repo@sha256:…`, or both.

use std::fmt;
use std::str::FromStr;

mod grammar;

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

    /// The same repository at `tag`, without a digest.
    pub fn with_tag(&self, tag: &str) -> Reference {
        Reference {
            inner: oci_client::Reference::with_tag(
                self.registry().to_string(),
                self.repository().to_string(),
                tag.to_string(),
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
        let parts = grammar::parse(text).map_err(invalid)?;
        if let Some(digest) = parts.digest {
            check_sha256(digest).map_err(invalid)?;
        }
        // Docker Hub's names, normalised as oci-spec's parser does.
        let registry = if parts.host == "index.docker.io" { "docker.io" } else { parts.host };
        let repository = if registry == "docker.io" && !parts.repository.contains('/') {
            format!("library/{}", parts.repository)
        } else {
            parts.repository.to_string()
        };
        let (registry, tag, digest) =
            (registry.to_string(), parts.tag.map(str::to_string), parts.digest.map(str::to_string));
        let inner = match (tag, digest) {
            (Some(tag), Some(digest)) => oci_client::Reference::with_tag_and_digest(registry, repository, tag, digest),
            (None, Some(digest)) => oci_client::Reference::with_digest(registry, repository, digest),
            (tag, None) => {
                oci_client::Reference::with_tag(registry, repository, tag.unwrap_or_else(|| "latest".into()))
            }
        };
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

    /// The hand-written grammar against oci-spec's regex, over references
    /// built from the pieces that matter: separators, ports, tags, digests.
    /// They agree on every one but the two differences grammar.rs names.
    #[test]
    fn agrees_with_oci_specs_parser() {
        const PIECES: &[&str] = &[
            "a",
            "b0",
            "Z",
            "9",
            ".",
            "-",
            "--",
            "_",
            "__",
            "___",
            ":",
            "/",
            "@",
            "localhost",
            "ex.com",
            ":5000",
            "v1.2",
            "_x",
            "-x",
            ".x",
            "é",
            "sha256:",
            "sha512:",
            "SHA256:",
            "0123456789abcdef0123456789abcdef",
            "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ];
        // xorshift64: reproducible, and no dependency for a test.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let (mut accepted, mut compared) = (0, 0);
        for _ in 0..200_000 {
            let mut text =
                String::from(["localhost/", "ex.com/", "127.0.0.1:5000/", "Reg.io:80/"][next() as usize % 4]);
            for _ in 0..(1 + next() % 6) {
                text.push_str(PIECES[next() as usize % PIECES.len()]);
            }
            let ours = text.parse::<Reference>();
            let theirs = oci_client::Reference::try_from(text.as_str());
            let tag = text.rsplit_once('/').and_then(|(_, last)| last.split('@').next()?.split_once(':').map(|t| t.1));
            if tag.is_some_and(|tag| !tag.is_ascii()) {
                // Difference 1: a non-ASCII tag, which only the regex's Unicode \w takes.
                assert!(ours.is_err(), "{text}");
                continue;
            }
            compared += 1;
            match (&ours, &theirs) {
                (Ok(ours), Ok(theirs)) => {
                    accepted += 1;
                    assert_eq!(
                        (ours.registry(), ours.repository(), ours.tag(), ours.digest()),
                        (theirs.registry(), theirs.repository(), theirs.tag(), theirs.digest()),
                        "{text}"
                    );
                }
                // Only sha256 is supported here, and lower-case hex.
                (Err(_), Ok(theirs)) if theirs.digest().is_some_and(|d| check_sha256(d).is_err()) => {}
                (Err(_), Err(_)) => {}
                (ours, theirs) => panic!("{text}: ours {ours:?}, oci-spec {theirs:?}"),
            }
        }
        assert!(compared > 150_000 && accepted > 10_000, "{compared} compared, {accepted} accepted");
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
