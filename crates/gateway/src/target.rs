//! Where a forwarded request goes on a backend: its URI and `Host` header,
//! made once when the config loads rather than formatted and parsed on
//! every request.

use http::{HeaderValue, Uri};
use sluice_core::Provider;

use crate::backend_api::Adapter;

/// The OpenAI endpoints that carry a `model` and are forwarded.
pub(crate) const FORWARDED: &[&str] = &sluice_core::config::Endpoints::FORWARDED;

/// A backend's targets for the forwarded endpoints.
pub struct Target {
    url: String,
    api: Adapter,
    /// The URI for each forwarded path that makes a valid one.
    uris: Vec<(&'static str, Uri)>,
    /// A plain-HTTP backend's `Host` header, as hyper's client would write
    /// it for each request (HTTP/1 only; a TLS backend may speak HTTP/2).
    host: Option<HeaderValue>,
}

impl Target {
    pub fn new(url: &str, provider: Provider) -> Self {
        let api = Adapter::of(provider);
        let uris = FORWARDED.iter().filter_map(|path| Some((*path, api.url(url, path).parse().ok()?))).collect();
        let host = url.parse::<Uri>().ok().filter(|uri| uri.scheme_str() == Some("http")).and_then(|uri| {
            let host = uri.host()?;
            match uri.port_u16().filter(|port| *port != 80) {
                Some(port) => HeaderValue::from_str(&format!("{host}:{port}")).ok(),
                None => HeaderValue::from_str(host).ok(),
            }
        });
        Target { url: url.to_owned(), api, uris, host }
    }

    /// The URI a request for `path` (and query) goes to.
    pub fn uri(&self, path: &str) -> Result<Uri, http::uri::InvalidUri> {
        match self.uris.iter().find(|(forwarded, _)| *forwarded == path) {
            Some((_, uri)) => Ok(uri.clone()),
            None => self.api.url(&self.url, path).parse(),
        }
    }

    /// The `Host` header, where it is known ahead.
    pub fn host(&self) -> Option<&HeaderValue> {
        self.host.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_made_ahead_match_those_made_per_request() {
        let urls = [
            "http://127.0.0.1:8080/v1",
            "http://upstream/v1",
            "http://upstream:80/v1",
            "http://user:secret@upstream:8000/api/v1",
            "https://api.openai.com/v1",
            "http://[::1]:9000/v1",
        ];
        let paths = ["/v1/chat/completions", "/v1/embeddings", "/v1/responses", "/v1/chat/completions?x=1", "/other"];
        for url in urls {
            for provider in [Provider::OpenAi, Provider::Anthropic] {
                let target = Target::new(url, provider);
                for path in paths {
                    let expected: Uri = Adapter::of(provider).url(url, path).parse().unwrap();
                    assert_eq!(target.uri(path).unwrap(), expected, "{url} {path}");
                }
            }
        }
        // The Host header hyper's client writes: the host, and the port
        // unless it is the scheme's default; none ahead for TLS backends.
        let host = |url: &str| Target::new(url, Provider::OpenAi).host().map(|h| h.to_str().unwrap().to_owned());
        assert_eq!(host("http://127.0.0.1:8080/v1").as_deref(), Some("127.0.0.1:8080"));
        assert_eq!(host("http://upstream:80/v1").as_deref(), Some("upstream"));
        assert_eq!(host("http://user:secret@upstream:8000/v1").as_deref(), Some("upstream:8000"));
        assert_eq!(host("http://[::1]:9000/v1").as_deref(), Some("[::1]:9000"));
        assert_eq!(host("https://api.openai.com/v1"), None);
        // A URL that makes no URI is refused per request, as before.
        assert!(Target::new("http://bad host/v1", Provider::OpenAi).uri("/v1/chat/completions").is_err());
    }
}
