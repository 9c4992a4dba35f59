//! Client-facing errors in OpenAI's JSON shape:
//! `{"error": {"message": …, "type": …, "code": …}}`.

use serde::Serialize;

/// The `type` field of an OpenAI error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorType {
    InvalidRequestError,
    AuthenticationError,
    PermissionError,
    NotFoundError,
    RateLimitError,
    ServerError,
}

/// An error answered to the client. Everything that fails a request ends up
/// as one of these, so status, type and code stay consistent.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{status} {code}: {message}")]
pub struct ApiError {
    pub status: u16,
    pub kind: ErrorType,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: u16, kind: ErrorType, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, kind, code, message: message.into() }
    }

    pub fn invalid_json(detail: impl std::fmt::Display) -> Self {
        Self::new(
            400,
            ErrorType::InvalidRequestError,
            "invalid_json",
            format!("request body is not valid JSON: {detail}"),
        )
    }

    pub fn invalid_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(400, ErrorType::InvalidRequestError, code, message)
    }

    pub fn model_not_found(model: &str) -> Self {
        Self::new(
            404,
            ErrorType::InvalidRequestError,
            "model_not_found",
            format!("the model `{model}` does not exist or no route serves it"),
        )
    }

    pub fn not_found(path: &str) -> Self {
        Self::new(404, ErrorType::NotFoundError, "not_found", format!("no such endpoint: {path}"))
    }

    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self::new(
            405,
            ErrorType::InvalidRequestError,
            "method_not_allowed",
            format!("{method} is not allowed on {path}"),
        )
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(
            413,
            ErrorType::InvalidRequestError,
            "request_too_large",
            format!("request body exceeds the limit of {limit} bytes"),
        )
    }

    pub fn plugin_failed(plugin: &str, why: impl std::fmt::Display) -> Self {
        Self::new(500, ErrorType::ServerError, "plugin_failed", format!("plugin {plugin} failed: {why}"))
    }

    /// A plugin failed because its state store did not answer: retryable,
    /// as the store may be back.
    pub fn state_unavailable(plugin: &str, why: impl std::fmt::Display) -> Self {
        Self::new(503, ErrorType::ServerError, "state_unavailable", format!("plugin {plugin} {why}; retry later"))
    }

    /// A plugin answered with an error status and no body of its own.
    pub fn plugin_rejected(plugin: &str, status: u16) -> Self {
        let kind = match status {
            401 => ErrorType::AuthenticationError,
            403 => ErrorType::PermissionError,
            404 => ErrorType::NotFoundError,
            429 => ErrorType::RateLimitError,
            400..=499 => ErrorType::InvalidRequestError,
            _ => ErrorType::ServerError,
        };
        Self::new(status, kind, "rejected_by_plugin", format!("request rejected by plugin {plugin}"))
    }

    pub fn upstream_unavailable(why: impl std::fmt::Display) -> Self {
        Self::new(502, ErrorType::ServerError, "upstream_unavailable", format!("upstream unavailable: {why}"))
    }

    /// The backend's address is one this gateway's backends may not reach
    /// (its own loopback, the metadata service): never connected to.
    pub fn backend_not_permitted(why: impl std::fmt::Display) -> Self {
        Self::new(502, ErrorType::ServerError, "backend_not_permitted", format!("backend not permitted: {why}"))
    }

    /// The request has come round to this gateway again (a route whose
    /// backend is the gateway itself), or through too many gateways.
    pub fn loop_detected(why: impl std::fmt::Display) -> Self {
        Self::new(508, ErrorType::ServerError, "loop_detected", format!("request loop: {why}"))
    }

    pub fn upstream_timeout(after_ms: u64) -> Self {
        Self::new(
            504,
            ErrorType::ServerError,
            "upstream_timeout",
            format!("upstream sent no response within {after_ms} ms"),
        )
    }

    /// Over a capacity limit: the client may retry later.
    pub fn overloaded(why: impl std::fmt::Display) -> Self {
        Self::new(503, ErrorType::ServerError, "overloaded", format!("the gateway is overloaded: {why}; retry later"))
    }

    pub fn request_timeout(after: std::time::Duration) -> Self {
        Self::new(
            408,
            ErrorType::InvalidRequestError,
            "request_timeout",
            format!("the request body did not arrive within {} s", after.as_secs_f64()),
        )
    }

    pub fn internal(why: impl std::fmt::Display) -> Self {
        Self::new(500, ErrorType::ServerError, "internal_error", why.to_string())
    }

    /// The JSON body, in OpenAI's shape.
    pub fn to_json(&self) -> Vec<u8> {
        #[derive(Serialize)]
        struct Body<'a> {
            error: Inner<'a>,
        }
        #[derive(Serialize)]
        struct Inner<'a> {
            message: &'a str,
            #[serde(rename = "type")]
            kind: ErrorType,
            code: &'a str,
        }
        let body = Body { error: Inner { message: &self.message, kind: self.kind, code: self.code } };
        // Serialising plain strings into a Vec cannot fail.
        serde_json::to_vec(&body).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_openai_shape() {
        let json: serde_json::Value = serde_json::from_slice(&ApiError::model_not_found("gpt-9").to_json()).unwrap();
        assert_eq!(json["error"]["type"], "invalid_request_error");
        assert_eq!(json["error"]["code"], "model_not_found");
        assert!(json["error"]["message"].as_str().unwrap().contains("gpt-9"));
    }

    #[test]
    fn plugin_rejections_map_status_to_type() {
        assert_eq!(ApiError::plugin_rejected("p", 401).kind, ErrorType::AuthenticationError);
        assert_eq!(ApiError::plugin_rejected("p", 403).kind, ErrorType::PermissionError);
        assert_eq!(ApiError::plugin_rejected("p", 422).kind, ErrorType::InvalidRequestError);
        assert_eq!(ApiError::plugin_rejected("p", 503).kind, ErrorType::ServerError);
    }
}
