//! One error type whose variants are the decisions a caller makes: retry,
//! fix credentials, fix the reference, or refuse the artifact.

use std::path::PathBuf;

use oci_client::errors::{DigestError, OciDistributionError, OciEnvelope, OciErrorCode};

#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("invalid reference {reference:?}: {reason}")]
    InvalidReference { reference: String, reason: String },

    /// 401 or 403: missing or wrong credentials, or no access to the repository.
    #[error("{registry}: not authorized ({detail}); check the registry credentials")]
    Unauthorized { registry: String, detail: String },

    /// The repository, tag, manifest or blob does not exist.
    #[error("{what}: not found ({detail})")]
    NotFound { what: String, detail: String },

    /// Connection failures, timeouts, 5xx and 429: worth retrying.
    #[error("registry {registry} unreachable: {detail}")]
    Unreachable { registry: String, detail: String },

    #[error("unsupported artifact ({reason}); media types seen: {}", media_types.join(", "))]
    UnsupportedFormat { media_types: Vec<String>, reason: String },

    #[error("digest mismatch for {what}: expected {expected}, got {actual}")]
    DigestMismatch { what: String, expected: String, actual: String },

    /// A plugin that must be signed has no cosign signature.
    #[error("{what}: no cosign signature ({detail})")]
    SignatureMissing { what: String, detail: String },

    /// Its cosign signatures do not verify it under the configured keys.
    #[error("{what}: signature refused: {reason}")]
    SignatureInvalid { what: String, reason: String },

    #[error("module is {size} bytes, over the limit of {max} bytes")]
    TooLarge { size: u64, max: u64 },

    /// A manifest, token or unpacked layer larger than this client reads;
    /// it was not read further than its limit.
    #[error("{what} is over the limit of {max} bytes")]
    OverLimit { what: String, max: u64 },

    #[error("not a WebAssembly component: {0}")]
    NotAComponent(String),

    /// The registry answered, but not in a way this client can use.
    #[error("registry {registry}: {detail}")]
    Protocol { registry: String, detail: String },

    #[error("credentials {}: {reason}", path.display())]
    Credentials { path: PathBuf, reason: String },

    #[error("TLS setup: {0}")]
    Tls(String),

    #[error("cache {}: {source}", path.display())]
    Cache {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl OciError {
    /// Whether trying again later may succeed without anyone changing anything.
    pub fn is_transient(&self) -> bool {
        matches!(self, OciError::Unreachable { .. })
    }

    /// Classifies an `oci-client` error; `what` names the object asked for.
    pub(crate) fn from_client(error: OciDistributionError, registry: &str, what: &str) -> OciError {
        let registry = registry.to_string();
        match error {
            OciDistributionError::UnauthorizedError { url } => OciError::Unauthorized { registry, detail: url },
            OciDistributionError::AuthenticationFailure(detail) => OciError::Unauthorized { registry, detail },
            OciDistributionError::RegistryError { envelope, url } => {
                let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
                let detail = format!("{envelope} ({url})");
                if codes.iter().any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied)) {
                    OciError::Unauthorized { registry, detail }
                } else if codes.iter().any(|c| {
                    matches!(
                        c,
                        OciErrorCode::ManifestUnknown
                            | OciErrorCode::NameUnknown
                            | OciErrorCode::BlobUnknown
                            | OciErrorCode::NotFound
                    )
                }) {
                    OciError::NotFound { what: what.to_string(), detail }
                } else if codes.iter().any(|c| matches!(c, OciErrorCode::Toomanyrequests)) {
                    OciError::Unreachable { registry, detail }
                } else {
                    OciError::Protocol { registry, detail }
                }
            }
            OciDistributionError::ServerError { code, url, message } => {
                by_status(code, format!("HTTP {code} from {url}: {}", message.trim()), registry, what)
            }
            // Some calls (blob_exists) turn a status into a reqwest error.
            OciDistributionError::RequestError(e) if e.status().is_some() => {
                let code = e.status().map_or(0, |s| s.as_u16());
                by_status(code, error_chain(&e), registry, what)
            }
            OciDistributionError::ImageManifestNotFoundError(detail) => {
                OciError::NotFound { what: what.to_string(), detail }
            }
            OciDistributionError::DigestError(DigestError::VerificationError { expected, actual }) => {
                OciError::DigestMismatch { what: what.to_string(), expected, actual }
            }
            OciDistributionError::RequestError(e) if !e.is_builder() => {
                OciError::Unreachable { registry, detail: error_chain(&e) }
            }
            OciDistributionError::IoError(e) => OciError::from_stream(e, &registry, what),
            other => OciError::Protocol { registry, detail: other.to_string() },
        }
    }

    /// Classifies a registry's answer with an error status: by the error
    /// codes of its body when that is the distribution's error envelope and
    /// the status is not one worth retrying, by the status otherwise.
    pub(crate) fn from_status(status: u16, body: &[u8], url: &str, registry: &str, what: &str) -> OciError {
        let url = url.to_string();
        let error = match serde_json::from_slice::<OciEnvelope>(body) {
            Ok(envelope) if !envelope.errors.is_empty() && !matches!(status, 408 | 429 | 500..=599) => {
                OciDistributionError::RegistryError { envelope, url }
            }
            _ => {
                // Enough of the body to say what went wrong, not all of it.
                let message: String = String::from_utf8_lossy(body).chars().take(300).collect();
                OciDistributionError::ServerError { code: status, url, message }
            }
        };
        OciError::from_client(error, registry, what)
    }

    /// Classifies an error from a blob stream: a digest failure reported at
    /// its end, or a connection that broke part way.
    pub(crate) fn from_stream(error: std::io::Error, registry: &str, what: &str) -> OciError {
        if let Some(DigestError::VerificationError { expected, actual }) =
            error.get_ref().and_then(|inner| inner.downcast_ref::<DigestError>())
        {
            return OciError::DigestMismatch {
                what: what.to_string(),
                expected: expected.clone(),
                actual: actual.clone(),
            };
        }
        OciError::Unreachable { registry: registry.to_string(), detail: error_chain(&error) }
    }
}

fn by_status(code: u16, detail: String, registry: String, what: &str) -> OciError {
    match code {
        401 | 403 => OciError::Unauthorized { registry, detail },
        404 => OciError::NotFound { what: what.to_string(), detail },
        408 | 429 | 500..=599 => OciError::Unreachable { registry, detail },
        _ => OciError::Protocol { registry, detail },
    }
}

/// "connection refused" lives a few `source()`s down a reqwest error.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        let part = inner.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: u16) -> OciDistributionError {
        OciDistributionError::ServerError { code, url: "http://r/v2/x".into(), message: "m".into() }
    }

    #[test]
    fn http_statuses_map_to_kinds() {
        assert!(matches!(OciError::from_client(server(401), "r", "x"), OciError::Unauthorized { .. }));
        assert!(matches!(OciError::from_client(server(403), "r", "x"), OciError::Unauthorized { .. }));
        assert!(matches!(OciError::from_client(server(404), "r", "x"), OciError::NotFound { .. }));
        for code in [429, 500, 502, 503] {
            let error = OciError::from_client(server(code), "r", "x");
            assert!(error.is_transient(), "{code}: {error}");
        }
        assert!(!OciError::from_client(server(400), "r", "x").is_transient());
    }

    #[test]
    fn registry_error_codes_map_to_kinds() {
        let envelope = |code: &str| {
            let json = format!(r#"{{"errors":[{{"code":"{code}","message":"m"}}]}}"#);
            OciDistributionError::RegistryError { envelope: serde_json::from_str(&json).unwrap(), url: "u".into() }
        };
        assert!(matches!(OciError::from_client(envelope("MANIFEST_UNKNOWN"), "r", "x"), OciError::NotFound { .. }));
        assert!(matches!(OciError::from_client(envelope("NAME_UNKNOWN"), "r", "x"), OciError::NotFound { .. }));
        assert!(matches!(OciError::from_client(envelope("DENIED"), "r", "x"), OciError::Unauthorized { .. }));
        assert!(matches!(OciError::from_client(envelope("MANIFEST_INVALID"), "r", "x"), OciError::Protocol { .. }));
    }

    #[test]
    fn error_answers_are_classified_by_envelope_then_status() {
        let envelope = |code: &str| format!(r#"{{"errors":[{{"code":"{code}","message":"m"}}]}}"#).into_bytes();
        let classify = |status, body: &[u8]| OciError::from_status(status, body, "http://r/v2/x", "r", "x");
        assert!(matches!(classify(404, &envelope("MANIFEST_UNKNOWN")), OciError::NotFound { .. }));
        assert!(matches!(classify(401, &envelope("UNAUTHORIZED")), OciError::Unauthorized { .. }));
        assert!(matches!(classify(401, b"<html>login</html>"), OciError::Unauthorized { .. }));
        assert!(matches!(classify(404, b""), OciError::NotFound { .. }));
        // A retryable status stays retryable whatever the body says.
        assert!(classify(503, &envelope("UNKNOWN")).is_transient());
        assert!(classify(429, &envelope("TOOMANYREQUESTS")).is_transient());
        let long = classify(400, &[b'x'; 10_000]).to_string();
        assert!(long.len() < 1000, "{long}");
    }

    #[test]
    fn a_digest_failure_at_the_end_of_a_stream_is_a_mismatch_not_a_network_error() {
        let inner = DigestError::VerificationError { expected: "sha256:aa".into(), actual: "sha256:bb".into() };
        let error = OciError::from_stream(std::io::Error::other(inner), "r", "blob");
        match error {
            OciError::DigestMismatch { expected, actual, .. } => {
                assert_eq!((expected.as_str(), actual.as_str()), ("sha256:aa", "sha256:bb"))
            }
            other => panic!("{other}"),
        }
        let broken = OciError::from_stream(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset"), "r", "b");
        assert!(broken.is_transient());
    }

    #[test]
    fn unsupported_format_names_the_media_types() {
        let error = OciError::UnsupportedFormat {
            media_types: vec!["application/vnd.oci.image.config.v1+json".into(), "text/plain".into()],
            reason: "no Wasm layer".into(),
        };
        let text = error.to_string();
        assert!(text.contains("text/plain") && text.contains("application/vnd.oci.image.config.v1+json"), "{text}");
    }
}
