//! What a hook answers: go on, or a response of the plugin's own.

use crate::bindings::sluice::plugin::types::{DirectResponse, RequestAction, ResponseEdits};

/// What the request hook decided. Edits to the request are made through
/// [`crate::Request`] itself, before returning.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Forward the request, with the edits made to it.
    Continue,
    /// Answer the client directly; nothing later in the chain runs.
    Respond(DirectResponse),
}

impl Action {
    /// Answer with `status`, `headers` and `body`. A 4xx/5xx with an empty
    /// body makes the gateway write an OpenAI error naming the plugin.
    pub fn respond(status: u16, headers: &[(&str, &str)], body: impl Into<Vec<u8>>) -> Action {
        let headers = headers.iter().map(|(n, v)| (n.to_ascii_lowercase(), v.to_string())).collect();
        Action::Respond(DirectResponse { status, headers, body: body.into() })
    }

    /// Answer with an OpenAI-shaped error:
    /// `{"error": {"message", "type", "param": null, "code"}}`.
    pub fn respond_error(status: u16, code: &str, message: &str) -> Action {
        ApiError::new(status, code, message).into_action()
    }

    pub(crate) fn into_wit(self) -> RequestAction {
        match self {
            Action::Continue => RequestAction::Continue,
            Action::Respond(response) => RequestAction::Respond(response),
        }
    }
}

/// Edits to a response head.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HeaderEdits {
    pub set_headers: Vec<(String, String)>,
    pub remove_headers: Vec<String>,
}

impl HeaderEdits {
    pub fn new() -> HeaderEdits {
        HeaderEdits::default()
    }

    pub fn set_header(mut self, name: &str, value: &str) -> HeaderEdits {
        self.set_headers.push((name.to_ascii_lowercase(), value.to_string()));
        self
    }

    pub fn remove_header(mut self, name: &str) -> HeaderEdits {
        self.remove_headers.push(name.to_ascii_lowercase());
        self
    }

    pub(crate) fn into_wit(self) -> ResponseEdits {
        ResponseEdits { set_headers: self.set_headers, remove_headers: self.remove_headers }
    }
}

/// An error answered to the client in OpenAI's shape. Hooks return it as
/// `Err`, so plugin code can use `?`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    /// The machine-readable `code`, e.g. `context_length_exceeded`.
    pub code: String,
    pub message: String,
    /// Extra response headers, e.g. `www-authenticate` on a 401.
    pub headers: Vec<(String, String)>,
    /// OpenAI's `type`, when it should not follow from the status.
    pub kind: Option<String>,
}

impl ApiError {
    pub fn new(status: u16, code: &str, message: impl Into<String>) -> ApiError {
        ApiError { status, code: code.to_string(), message: message.into(), headers: Vec::new(), kind: None }
    }

    /// A 400 `invalid_request_error`.
    pub fn bad_request(code: &str, message: impl Into<String>) -> ApiError {
        ApiError::new(400, code, message)
    }

    /// A 400 `unsupported_endpoint`: `plugin` does not read requests to
    /// `path`, only to those in `reads`. A content policy refuses what it
    /// cannot read rather than let it by unchecked.
    pub fn unsupported_endpoint(plugin: &str, path: &str, reads: &[&str]) -> ApiError {
        ApiError::bad_request(
            "unsupported_endpoint",
            format!("{plugin} does not read requests to {path}; it reads only {}", reads.join(", ")),
        )
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(500, "internal_error", message)
    }

    pub(crate) fn not_configured(plugin: &str) -> ApiError {
        ApiError::internal(format!("plugin {plugin} was called before `configure`"))
    }

    pub fn with_header(mut self, name: &str, value: &str) -> ApiError {
        self.headers.push((name.to_ascii_lowercase(), value.to_string()));
        self
    }

    /// Sets OpenAI's `type` instead of deriving it from the status.
    pub fn with_type(mut self, kind: &str) -> ApiError {
        self.kind = Some(kind.to_string());
        self
    }

    /// OpenAI's `type`: as set, or from the status as the gateway maps its
    /// own errors.
    pub fn error_type(&self) -> &str {
        if let Some(kind) = &self.kind {
            return kind;
        }
        match self.status {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        }
    }

    /// The JSON body: `{"error": {"message", "type", "param": null, "code"}}`.
    pub fn to_json(&self) -> Vec<u8> {
        let body = serde_json::json!({
            "error": {"message": self.message, "type": self.error_type(), "param": null, "code": self.code}
        });
        body.to_string().into_bytes()
    }

    pub fn into_action(self) -> Action {
        let mut headers = vec![("content-type".to_string(), "application/json".to_string())];
        let body = self.to_json();
        headers.extend(self.headers);
        Action::Respond(DirectResponse { status: self.status, headers, body })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status, self.code, self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_have_the_openai_shape_and_extra_headers() {
        let Action::Respond(response) =
            ApiError::new(401, "invalid_api_key", "no \"key\"").with_header("WWW-Authenticate", "Bearer").into_action()
        else {
            panic!("an error responds")
        };
        assert_eq!(response.status, 401);
        assert_eq!(
            response.headers,
            vec![
                ("content-type".to_string(), "application/json".to_string()),
                ("www-authenticate".to_string(), "Bearer".to_string())
            ]
        );
        let body: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"error": {"message": "no \"key\"", "type": "authentication_error",
                "param": null, "code": "invalid_api_key"}})
        );
    }

    #[test]
    fn status_maps_to_type() {
        for (status, kind) in [
            (400, "invalid_request_error"),
            (403, "permission_error"),
            (413, "invalid_request_error"),
            (429, "rate_limit_error"),
            (500, "server_error"),
        ] {
            assert_eq!(ApiError::new(status, "c", "m").error_type(), kind);
        }
        assert_eq!(ApiError::new(451, "c", "m").with_type("permission_error").error_type(), "permission_error");
    }

    #[test]
    fn a_direct_response_lower_cases_header_names_and_maps_to_the_wit() {
        let action = Action::respond(200, &[("X-Cache", "HIT")], "{}");
        let RequestAction::Respond(response) = action.into_wit() else { panic!("a response") };
        assert_eq!(response.headers, [("x-cache".to_string(), "HIT".to_string())]);
        assert_eq!(response.body, b"{}");
        assert_eq!(Action::Continue.into_wit(), RequestAction::Continue);
    }
}
