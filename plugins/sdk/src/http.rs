//! Header lookups and request-body helpers.

use serde::de::DeserializeOwned;

use crate::chat::ChatRequest;
use crate::{ApiError, Request, Response};

/// Case-insensitive lookups in a `(name, value)` header list. The gateway
/// hands names over in lower case, but a plugin's own config may not be.
pub trait HeaderList {
    /// The first value of `name`.
    fn get_header(&self, name: &str) -> Option<&str>;
    /// Every value of `name`, in order.
    fn get_all_headers<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str>;
}

impl HeaderList for [(String, String)] {
    fn get_header(&self, name: &str) -> Option<&str> {
        self.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn get_all_headers<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> {
        self.iter().filter(move |(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// The first value of `name` in `headers`, ignoring case.
pub fn header_value<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.get_header(name)
}

impl Request {
    /// The first value of header `name`, ignoring case.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get_header(name)
    }

    /// The path without its query string.
    pub fn path_only(&self) -> &str {
        self.path.split('?').next().unwrap_or_default()
    }

    /// Whether this is `POST /v1/chat/completions`.
    pub fn is_chat_completion(&self) -> bool {
        self.path_only() == "/v1/chat/completions"
    }

    /// The body as JSON of type `T`; a 400 `invalid_json` otherwise.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        serde_json::from_slice(&self.body)
            .map_err(|e| ApiError::bad_request("invalid_json", format!("request body is not valid JSON: {e}")))
    }

    /// The body as a chat completion request; a 400 otherwise.
    pub fn chat(&self) -> Result<ChatRequest, ApiError> {
        ChatRequest::from_slice(&self.body)
    }
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get_header(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    #[test]
    fn header_lookup_ignores_case_and_keeps_repeats() {
        let req = testing::request_with_headers("m", &[("x-api-key", "a"), ("X-Api-Key", "b"), ("other", "c")]);
        assert_eq!(req.header("X-API-KEY"), Some("a"));
        assert_eq!(req.headers.get_all_headers("x-api-key").collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(req.header("missing"), None);
    }

    #[test]
    fn paths_and_bodies() {
        let mut req = testing::chat_request("m", &serde_json::json!({"messages": []}));
        assert!(req.is_chat_completion());
        req.path = "/v1/chat/completions?x=1".into();
        assert!(req.is_chat_completion());
        req.path = "/v1/embeddings".into();
        assert!(!req.is_chat_completion());
        req.body = b"{not json".to_vec();
        assert_eq!(req.json::<serde_json::Value>().unwrap_err().code, "invalid_json");
    }
}
