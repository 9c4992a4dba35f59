//! Reading a client's request body: within its size limit, its time, and
//! the memory budget every request in flight shares.

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use sluice_core::ApiError;
use tokio::sync::OwnedSemaphorePermit;

use crate::gateway::Gateway;

/// Reads the whole request body, within the per-request size limit, the
/// body timeout, and the memory budget shared by all requests in flight;
/// returns it with its share of the budget.
pub(crate) async fn read_body(
    gateway: &Gateway,
    body: Incoming,
    headers: &HeaderMap,
) -> Result<(Bytes, OwnedSemaphorePermit), ApiError> {
    read_body_within(gateway, body, headers, gateway.settings.max_body_bytes).await
}

/// [`read_body`] within `limit` bytes.
pub(crate) async fn read_body_within(
    gateway: &Gateway,
    mut body: Incoming,
    headers: &HeaderMap,
    limit: usize,
) -> Result<(Bytes, OwnedSemaphorePermit), ApiError> {
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(ApiError::too_large(limit));
    }
    let over_budget = || ApiError::overloaded("too many request bodies are being buffered");
    let reserve = |bytes: usize| {
        let bytes = u32::try_from(bytes).map_err(|_| ApiError::too_large(limit))?;
        gateway.body_budget.clone().try_acquire_many_owned(bytes).map_err(|_| over_budget())
    };
    // The budget holds what is allocated, taken as bytes arrive: a declared
    // length costs nothing until its bytes come (a client that declares
    // 4 MiB and sends nothing would hold the budget it never uses).
    let mut held = reserve(0)?;
    let read = async {
        let mut buffer = BytesMut::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|error| {
                ApiError::invalid_request("body_read_failed", format!("reading the request body: {error}"))
            })?;
            let Ok(data) = frame.into_data() else { continue };
            let needed = buffer.len() + data.len();
            if needed > limit {
                return Err(ApiError::too_large(limit));
            }
            if needed > buffer.capacity() {
                // Doubling, to the declared length at most: few copies,
                // and never more than the body needs when it says.
                let grown = needed.max((buffer.capacity() * 2).min(declared.unwrap_or(limit).min(limit)));
                let have = held.num_permits();
                if grown > have {
                    held.merge(reserve(grown - have)?);
                }
                let mut larger = BytesMut::with_capacity(grown);
                larger.extend_from_slice(&buffer);
                buffer = larger;
            }
            buffer.extend_from_slice(&data);
        }
        Ok(buffer.freeze())
    };
    let timeout = gateway.settings.request_body_timeout;
    match tokio::time::timeout(timeout, read).await {
        Ok(result) => result.map(|bytes| (bytes, held)),
        Err(_) => Err(ApiError::request_timeout(timeout)),
    }
}
