//! The response body type, and the one place errors become HTTP responses.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use sluice_core::ApiError;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Body = BoxBody<Bytes, BoxError>;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

pub fn json_response(status: http::StatusCode, json: Vec<u8>) -> http::Response<Body> {
    let mut response = http::Response::new(full(json));
    *response.status_mut() = status;
    response.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    response
}

/// Every error a client sees goes through here, in OpenAI's shape.
pub fn error_response(error: &ApiError) -> http::Response<Body> {
    let status = http::StatusCode::from_u16(error.status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    json_response(status, error.to_json())
}
