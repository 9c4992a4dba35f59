//! Sending a reply: whole, as server-sent events paced over time, or cut
//! short where a [`Step`](crate::Step) says.

use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderValue, Response, StatusCode};
use http_body_util::channel::{Channel, Sender};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use serde_json::Value;

use crate::script::Script;
use crate::{Dialect, request_id};

/// The error a scripted response body ends with. Hyper answers a body error
/// by dropping the HTTP/1 connection without the terminating chunk (or by
/// resetting the HTTP/2 stream), so the client sees a broken response rather
/// than a clean end.
#[derive(Debug)]
pub struct Aborted;

impl std::fmt::Display for Aborted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the echo aborted the response, as scripted")
    }
}

impl std::error::Error for Aborted {}

pub(crate) type Body = BoxBody<Bytes, Aborted>;

/// The pause before aborting, after the receiver took the last frame, so
/// that hyper has flushed it: the frames sent must reach the client.
const FLUSH_PAUSE: Duration = Duration::from_millis(20);

/// One piece of a streamed reply, sent after `delay`.
pub(crate) struct Frame {
    pub delay: Duration,
    pub data: Bytes,
    /// Carries generated content (text or tool input): what
    /// `ResetAfterChunks(n)` counts.
    pub content: bool,
}

impl Frame {
    /// An unnamed server-sent event, as OpenAI's chat completions send.
    pub fn data(value: &Value, delay: Duration, content: bool) -> Frame {
        Frame { delay, data: Bytes::from(format!("data: {value}\n\n")), content }
    }

    /// A named server-sent event, as Anthropic's Messages and OpenAI's
    /// Responses APIs send.
    pub fn event(name: &str, value: &Value, delay: Duration, content: bool) -> Frame {
        Frame { delay, data: Bytes::from(format!("event: {name}\ndata: {value}\n\n")), content }
    }
}

/// How the reply to one request is sent.
pub(crate) struct Delivery {
    pub dialect: Dialect,
    pub chunks: usize,
    pub chunk_delay: Duration,
    /// `ResetAfterChunks(n)` from the script.
    pub reset_after: Option<usize>,
    pub script: Script,
}

impl Delivery {
    /// A whole JSON reply; cut after `n` of `n + 1` pieces if the script says
    /// so (the head is sent, the JSON never completes).
    pub fn json(self, value: &Value) -> Response<Body> {
        let text = value.to_string();
        let Some(n) = self.reset_after else {
            self.script.complete();
            return full(self.dialect, StatusCode::OK, "application/json", text);
        };
        let frames = crate::split(&text, n.saturating_add(1))
            .into_iter()
            .map(|piece| Frame {
                delay: self.chunk_delay,
                data: Bytes::copy_from_slice(piece.as_bytes()),
                content: true,
            })
            .collect();
        self.spawn(frames, "application/json")
    }

    /// Server-sent events, sent over time.
    pub fn events(self, frames: Vec<Frame>, content_type: &'static str) -> Response<Body> {
        self.spawn(frames, content_type)
    }

    fn spawn(self, frames: Vec<Frame>, content_type: &'static str) -> Response<Body> {
        let (tx, body) = Channel::new(1);
        let mut response = Response::new(body.boxed());
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        headers.insert(self.dialect.request_id_header(), request_id());
        tokio::spawn(pump(tx, frames, self.reset_after, self.script));
        response
    }
}

/// Sends `frames`, each after its delay. With `reset_after`, stops where
/// [`cut_point`] says and aborts the body; otherwise counts the request as
/// completed once the last frame is out.
async fn pump(mut tx: Sender<Bytes, Aborted>, frames: Vec<Frame>, reset_after: Option<usize>, script: Script) {
    let cut = reset_after.map(|n| cut_point(&frames, n));
    for frame in frames.into_iter().take(cut.unwrap_or(usize::MAX)) {
        if !frame.delay.is_zero() {
            tokio::time::sleep(frame.delay).await;
        }
        if tx.send_data(frame.data).await.is_err() {
            return; // The client went away.
        }
    }
    if cut.is_none() {
        script.complete();
        return;
    }
    // The channel holds one frame: once it is empty, hyper has taken the
    // last one, and writes it out before it polls for more.
    for _ in 0..1000 {
        if tx.capacity() == tx.max_capacity() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(FLUSH_PAUSE).await;
    tx.abort(Aborted);
}

/// How many frames go out before a stream cut after `n` content frames: up
/// to the (n+1)th content frame, or, if there are no more than `n`, up to
/// and including the last one (so the closing events never arrive).
pub(crate) fn cut_point(frames: &[Frame], n: usize) -> usize {
    let mut content = frames.iter().enumerate().filter(|(_, frame)| frame.content).map(|(at, _)| at);
    match content.nth(n) {
        Some(at) => at,
        None => frames.iter().rposition(|frame| frame.content).map_or(0, |last| last + 1),
    }
}

/// A response that never has a head: its body fails at once, before hyper
/// has flushed the head it buffered, so an HTTP/1 connection is dropped
/// with nothing written. (Over HTTP/2 the head goes out in its own frame,
/// then the stream is reset.)
pub(crate) fn closed() -> Response<Body> {
    let (tx, body) = Channel::<Bytes, Aborted>::new(1);
    tx.abort(Aborted);
    Response::new(body.boxed())
}

pub(crate) fn full(
    dialect: Dialect,
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()).map_err(|never| match never {}).boxed());
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(dialect.request_id_header(), request_id());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(content: &[bool]) -> Vec<Frame> {
        content.iter().map(|&content| Frame { delay: Duration::ZERO, data: Bytes::new(), content }).collect()
    }

    #[test]
    fn cut_point_stops_before_the_next_content_or_the_closing_frames() {
        // Preamble, three content frames, two closing frames.
        let stream = frames(&[false, true, true, true, false, false]);
        assert_eq!(cut_point(&stream, 0), 1);
        assert_eq!(cut_point(&stream, 2), 3);
        assert_eq!(cut_point(&stream, 3), 4);
        assert_eq!(cut_point(&stream, 99), 4);
        assert_eq!(cut_point(&frames(&[true, true]), 5), 2);
        assert_eq!(cut_point(&frames(&[false]), 1), 0);
    }
}
