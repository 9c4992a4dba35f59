//! The response body type, and the one place errors become HTTP responses.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use sluice_core::ApiError;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
// Not `Sync`: a body may own the plugin instances that rewrite it.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed_unsync()
}

pub fn json_response(status: http::StatusCode, json: Vec<u8>) -> http::Response<Body> {
    let mut response = http::Response::new(full(json));
    *response.status_mut() = status;
    response.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    response
}

/// Every error a client sees goes through here, in OpenAI's shape. The
/// response carries its code for the request's record ([`ErrorCode`]).
pub fn error_response(error: &ApiError) -> http::Response<Body> {
    let status = http::StatusCode::from_u16(error.status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = json_response(status, error.to_json());
    response.extensions_mut().insert(ErrorCode(error.code));
    response
}

/// The code of the error a response carries.
#[derive(Clone, Copy, Debug)]
pub struct ErrorCode(pub &'static str);

/// Reads a whole response body of at most `limit` bytes.
// A loop rather than `Limited`: its `Into<BoxError>` bound on a body that
// already has `BoxError` trips rustc's check that the handler future is Send.
/// Reads a whole body of at most `limit` bytes, each frame within `idle`.
pub async fn collect_limited(mut body: Body, limit: usize, idle: std::time::Duration) -> Result<Bytes, String> {
    let mut collected = bytes::BytesMut::new();
    loop {
        let Ok(frame) = tokio::time::timeout(idle, body.frame()).await else {
            return Err(format!("nothing arrived for {} s", idle.as_secs()));
        };
        let Some(frame) = frame else { break };
        let frame = frame.map_err(|e| e.to_string())?;
        if let Ok(data) = frame.into_data() {
            if collected.len() + data.len() > limit {
                return Err(format!("the body is larger than {limit} bytes"));
            }
            collected.extend_from_slice(&data);
        }
    }
    Ok(collected.freeze())
}
