//! Outbound HTTP (`wasi:http/outgoing-handler`, WIT 0.3.2): one request, its
//! response read whole into memory, within bounds. The GatewayPlugin must
//! grant the destination (`spec.egress`): the gateway refuses any other, and
//! caps the time, the response's size and the calls in flight. A redirect
//! comes back as it is; a plugin that follows it sends again, and that
//! destination is checked too.
//!
//! On `wasm32` this calls the host. Natively (unit tests) nothing leaves the
//! process: [`crate::testing::on_outbound`] sets what answers, and
//! [`crate::testing::outbound_requests`] shows what was sent.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::HeaderList;
use crate::bindings::wasi::http::types::ErrorCode;

/// The response body a [`Request`] takes unless told otherwise: it is held
/// in the plugin's memory.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 1 << 20;

/// What `InternalError` messages start with when the gateway, rather than
/// the network, refused the call (a concurrency cap, a bad URL).
const REFUSAL: &str = "sluice: ";

/// One outbound call. Build it with [`Request::get`] or
/// [`Request::post_json`] and the methods that follow, or field by field.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// `GET`, `POST`, …; the standard methods in any case.
    pub method: String,
    /// `http://` or `https://`, the host (and port), then the path and query;
    /// a fragment is not sent.
    pub url: String,
    /// Names in lower case; a name may repeat.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Bounds the connection, the wait for the response, and each wait
    /// between its bytes (not the whole call). The gateway's own timeout and
    /// the plugin's deadline apply either way.
    pub timeout_ms: Option<u32>,
    /// A longer response body is [`Error::TooLarge`].
    pub max_response_bytes: usize,
}

impl Request {
    /// `method` to `url`, with no headers and no body.
    pub fn new(method: &str, url: &str) -> Request {
        Request {
            method: method.to_string(),
            url: url.to_string(),
            headers: Vec::new(),
            body: Vec::new(),
            timeout_ms: None,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }

    pub fn get(url: &str) -> Request {
        Request::new("GET", url)
    }

    /// A `POST` of `body` as JSON, with its `content-type`. `Err` only for a
    /// value JSON cannot hold (a map whose keys are not strings).
    pub fn post_json<T: Serialize + ?Sized>(url: &str, body: &T) -> Result<Request, Error> {
        let body =
            serde_json::to_vec(body).map_err(|e| Error::Failed(format!("cannot encode the body as JSON: {e}")))?;
        Ok(Request { body, ..Request::new("POST", url).header("content-type", "application/json") })
    }

    /// Adds a header; a name may repeat.
    pub fn header(mut self, name: &str, value: &str) -> Request {
        self.headers.push((name.to_ascii_lowercase(), value.to_string()));
        self
    }

    pub fn timeout_ms(mut self, ms: u32) -> Request {
        self.timeout_ms = Some(ms);
        self
    }

    pub fn max_response_bytes(mut self, max: usize) -> Request {
        self.max_response_bytes = max;
        self
    }
}

/// A response, its body read whole.
#[derive(Clone, Debug, PartialEq)]
pub struct Response {
    pub status: u16,
    /// Names as the host gives them (lower case); a name may repeat.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name`, ignoring case.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get_header(name)
    }

    /// The body as JSON of type `T`.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_slice(&self.body)
            .map_err(|e| Error::Failed(format!("the response body is not the JSON expected: {e}")))
    }
}

/// Why a call has no response. Each is a value to handle, as a store error
/// is: a plugin that fails on it gets its failure policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// The gateway would not send it: a destination not granted, the
    /// plugin's calls in flight at their cap, a bad URL or header.
    Refused(String),
    /// The destination did not connect or answer in time.
    Timeout,
    /// The response was larger than `max_response_bytes`, or the gateway's cap.
    TooLarge,
    /// The call failed on the way: DNS, the connection, TLS, the protocol.
    Failed(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Refused(why) => write!(f, "refused: {why}"),
            Error::Timeout => f.write_str("timed out"),
            Error::TooLarge => f.write_str("the response is too large"),
            Error::Failed(why) => write!(f, "failed: {why}"),
        }
    }
}

impl std::error::Error for Error {}

/// Sends `request` and reads its response, waiting for it: the plugin's
/// deadline keeps running meanwhile.
pub fn send(request: &Request) -> Result<Response, Error> {
    imp::send(request)
}

/// A URL as `wasi:http` takes it apart. (Natively only checked.)
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
struct Target<'a> {
    https: bool,
    authority: &'a str,
    /// `/` at least.
    path_with_query: String,
}

/// Splits `url`, refusing what no gateway would send. The URL is not
/// quoted in errors: its query may hold a key.
fn target(url: &str) -> Result<Target<'_>, Error> {
    let bad = |why: &str| Error::Refused(format!("bad URL: {why}"));
    let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
    let https = match scheme.to_ascii_lowercase().as_str() {
        "https" => true,
        "http" => false,
        _ => return Err(bad("the scheme is not http or https")),
    };
    let rest = rest.split_once('#').map_or(rest, |(rest, _)| rest);
    let (authority, path) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    if authority.is_empty() {
        return Err(bad("no host"));
    }
    if authority.contains('@') {
        return Err(bad("credentials in the URL (send them in a header)"));
    }
    if rest.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(bad("spaces or control characters"));
    }
    let path_with_query = if path.starts_with('/') { path.to_string() } else { format!("/{path}") };
    Ok(Target { https, authority, path_with_query })
}

/// The error for a `wasi:http` error code. (Natively only the tests call it.)
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
fn from_code(code: ErrorCode) -> Error {
    match code {
        ErrorCode::DnsTimeout
        | ErrorCode::ConnectionTimeout
        | ErrorCode::ConnectionReadTimeout
        | ErrorCode::ConnectionWriteTimeout
        | ErrorCode::HttpResponseTimeout => Error::Timeout,
        ErrorCode::HttpResponseBodySize(_)
        | ErrorCode::HttpResponseHeaderSize(_)
        | ErrorCode::HttpResponseHeaderSectionSize(_) => Error::TooLarge,
        ErrorCode::HttpRequestDenied => Error::Refused("the destination is not granted (spec.egress)".into()),
        // A granted name that resolves where the gateway may not go.
        ErrorCode::DestinationIpProhibited => Error::Refused("the destination's address is not allowed".into()),
        ErrorCode::InternalError(Some(message)) if message.starts_with(REFUSAL) => {
            Error::Refused(message[REFUSAL.len()..].to_string())
        }
        code => {
            let code = format!("{code:?}");
            Error::Failed(code.strip_prefix("ErrorCode::").unwrap_or(&code).to_string())
        }
    }
}

#[cfg(target_arch = "wasm32")]
mod imp {
    use super::{Error, Request, Response, from_code, target};
    use crate::bindings::wasi::http::outgoing_handler;
    use crate::bindings::wasi::http::types::{
        self as http, Fields, FutureIncomingResponse, HeaderError, IncomingResponse, Method, OutgoingBody,
        OutgoingRequest, RequestOptions, Scheme,
    };
    use crate::bindings::wasi::io::error::Error as IoError;
    use crate::bindings::wasi::io::streams::{InputStream, StreamError};

    /// The most `blocking-write-and-flush` takes in one call.
    const WRITE_CHUNK: usize = 4096;
    /// The most one read asks for.
    const READ_CHUNK: usize = 64 * 1024;

    pub fn send(request: &Request) -> Result<Response, Error> {
        let target = target(&request.url)?;
        let headers = Fields::new();
        for (name, value) in &request.headers {
            headers.append(name, value.as_bytes()).map_err(|e| {
                let why = match e {
                    HeaderError::InvalidSyntax => "is not valid",
                    HeaderError::Forbidden => "is not allowed",
                    HeaderError::Immutable => "cannot be set",
                };
                Error::Refused(format!("header `{name}` {why}"))
            })?;
        }
        // The body's length, as a server that does not read chunked
        // requests (Python's http.server) needs: without it, the host sends
        // the body chunked, and such a server leaves it on the connection,
        // which then cannot carry the next request.
        let declared = request.headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("content-length"));
        if !request.body.is_empty() && !declared {
            let length = request.body.len().to_string();
            headers.append("content-length", length.as_bytes()).map_err(|_| Error::Failed("content-length".into()))?;
        }
        let outgoing = OutgoingRequest::new(headers);
        let invalid = |what: &str| Error::Refused(format!("{what} is not valid"));
        outgoing.set_method(&method(&request.method)).map_err(|()| invalid("the method"))?;
        let scheme = if target.https { Scheme::Https } else { Scheme::Http };
        outgoing.set_scheme(Some(&scheme)).map_err(|()| invalid("the scheme"))?;
        outgoing.set_authority(Some(target.authority)).map_err(|()| invalid("the URL's host"))?;
        outgoing.set_path_with_query(Some(&target.path_with_query)).map_err(|()| invalid("the URL's path"))?;
        let body = outgoing.body().map_err(|()| Error::Failed("the request body was taken".into()))?;
        // Sent before the body is written: the host streams it on, holding
        // a chunk or two, so a body written first could wait for ever.
        let future = outgoing_handler::handle(outgoing, options(request.timeout_ms)).map_err(from_code)?;
        let finished = match write_body(&body, &request.body) {
            Ok(()) => OutgoingBody::finish(body, None).map_err(from_code),
            // Dropped unfinished: the host aborts the request.
            Err(error) => Err(error),
        };
        // The response's error (the host's refusal) says more than the body's.
        let response = wait(&future)?;
        finished?;
        read_response(response, request.max_response_bytes)
    }

    fn method(method: &str) -> Method {
        match method.to_ascii_uppercase().as_str() {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "DELETE" => Method::Delete,
            "CONNECT" => Method::Connect,
            "OPTIONS" => Method::Options,
            "TRACE" => Method::Trace,
            "PATCH" => Method::Patch,
            _ => Method::Other(method.to_string()),
        }
    }

    fn options(timeout_ms: Option<u32>) -> Option<RequestOptions> {
        let timeout = Some(u64::from(timeout_ms?) * 1_000_000);
        let options = RequestOptions::new();
        // A host that cannot bound a phase still has its own timeout and
        // the plugin's deadline.
        let _ = options.set_connect_timeout(timeout);
        let _ = options.set_first_byte_timeout(timeout);
        let _ = options.set_between_bytes_timeout(timeout);
        Some(options)
    }

    fn write_body(body: &OutgoingBody, bytes: &[u8]) -> Result<(), Error> {
        if bytes.is_empty() {
            return Ok(());
        }
        // A child of the body: dropped on return, before `finish`.
        let stream = body.write().map_err(|()| Error::Failed("the request body was taken".into()))?;
        for chunk in bytes.chunks(WRITE_CHUNK) {
            stream.blocking_write_and_flush(chunk).map_err(|e| match e {
                StreamError::Closed => Error::Failed("the request body closed early".into()),
                StreamError::LastOperationFailed(error) => from_io(&error),
            })?;
        }
        Ok(())
    }

    fn wait(future: &FutureIncomingResponse) -> Result<IncomingResponse, Error> {
        future.subscribe().block();
        match future.get() {
            Some(Ok(Ok(response))) => Ok(response),
            Some(Ok(Err(code))) => Err(from_code(code)),
            // Ready once `block` returns, and taken only here.
            Some(Err(())) | None => Err(Error::Failed("the response was not ready".into())),
        }
    }

    fn read_response(response: IncomingResponse, max: usize) -> Result<Response, Error> {
        let status = response.status();
        let headers: Vec<(String, String)> = response
            .headers()
            .entries()
            .into_iter()
            .map(|(name, value)| (name, String::from_utf8_lossy(&value).into_owned()))
            .collect();
        let declared = headers.iter().find(|(n, _)| n.eq_ignore_ascii_case("content-length"));
        if declared.and_then(|(_, v)| v.trim().parse::<u64>().ok()).is_some_and(|n| n > max as u64) {
            return Err(Error::TooLarge);
        }
        // Children are dropped before their parents: locals in reverse order.
        let body = response.consume().map_err(|()| Error::Failed("the response body was taken".into()))?;
        let stream = body.stream().map_err(|()| Error::Failed("the response body was taken".into()))?;
        let body = read_all(&stream, max)?;
        Ok(Response { status, headers, body })
    }

    fn read_all(stream: &InputStream, max: usize) -> Result<Vec<u8>, Error> {
        let mut body = Vec::new();
        loop {
            // A byte past the cap tells a body too large from one that fits.
            let want = (max - body.len()).saturating_add(1).min(READ_CHUNK);
            match stream.blocking_read(want as u64) {
                Ok(bytes) => {
                    body.extend_from_slice(&bytes);
                    if body.len() > max {
                        return Err(Error::TooLarge);
                    }
                }
                Err(StreamError::Closed) => return Ok(body),
                Err(StreamError::LastOperationFailed(error)) => return Err(from_io(&error)),
            }
        }
    }

    /// A stream's error, as the `wasi:http` code it carries if any.
    fn from_io(error: &IoError) -> Error {
        http::http_error_code(error).map_or_else(|| Error::Failed(error.to_debug_string()), from_code)
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::{Error, Request, Response, target};

    type Responder = Rc<dyn Fn(&Request) -> Result<Response, Error>>;

    thread_local! {
        static RESPONDER: RefCell<Option<Responder>> = const { RefCell::new(None) };
        static SENT: RefCell<Vec<Request>> = const { RefCell::new(Vec::new()) };
    }

    /// Records the request, checks its URL as the gateway would, and asks
    /// the test's responder, bounding the body as the host does.
    pub fn send(request: &Request) -> Result<Response, Error> {
        SENT.with_borrow_mut(|sent| sent.push(request.clone()));
        target(&request.url)?;
        // Cloned out, so a responder may send too.
        let responder = RESPONDER
            .with_borrow(Clone::clone)
            .ok_or_else(|| Error::Refused("no outbound responder in this test".into()))?;
        let response = responder(request)?;
        if response.body.len() > request.max_response_bytes {
            return Err(Error::TooLarge);
        }
        Ok(response)
    }

    pub fn set_responder(responder: Responder) {
        RESPONDER.set(Some(responder));
    }

    pub fn sent() -> Vec<Request> {
        SENT.with_borrow(Clone::clone)
    }
}

/// What [`crate::testing::on_outbound`] sets.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn set_responder(responder: impl Fn(&Request) -> Result<Response, Error> + 'static) {
    imp::set_responder(std::rc::Rc::new(responder))
}

/// What [`crate::testing::outbound_requests`] reads.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn sent() -> Vec<Request> {
    imp::sent()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{on_outbound, outbound_requests};

    fn ok(body: &str) -> Result<Response, Error> {
        Ok(Response { status: 200, headers: vec![("x-seen".into(), "1".into())], body: body.into() })
    }

    #[test]
    fn without_a_responder_a_call_is_refused_and_still_recorded() {
        let request = Request::get("https://api.example.com/v1?q=1");
        assert_eq!(send(&request), Err(Error::Refused("no outbound responder in this test".into())));
        assert_eq!(outbound_requests(), [request]);
    }

    #[test]
    fn the_responder_answers_with_the_request_it_was_sent() {
        on_outbound(|request| {
            assert_eq!(request.header_pairs(), [("content-type", "application/json"), ("x-key", "k")]);
            ok(&format!("{} {} {}", request.method, request.url, String::from_utf8_lossy(&request.body)))
        });
        let request = Request::post_json("http://svc:8080/check", &serde_json::json!({"a": 1}))
            .unwrap()
            .header("X-Key", "k")
            .timeout_ms(250);
        let response = send(&request).unwrap();
        assert_eq!(response.body, br#"POST http://svc:8080/check {"a":1}"#);
        assert_eq!(response.header("X-SEEN"), Some("1"));
        assert_eq!(outbound_requests()[0].timeout_ms, Some(250));
        assert_eq!(outbound_requests()[0].max_response_bytes, DEFAULT_MAX_RESPONSE_BYTES);
    }

    #[test]
    fn a_body_past_the_cap_is_too_large_and_errors_pass_through() {
        on_outbound(|request| if request.url.ends_with("/slow") { Err(Error::Timeout) } else { ok("12345") });
        assert_eq!(send(&Request::get("http://a/").max_response_bytes(5)).unwrap().body, b"12345");
        assert_eq!(send(&Request::get("http://a/").max_response_bytes(4)), Err(Error::TooLarge));
        assert_eq!(send(&Request::get("http://a/slow")), Err(Error::Timeout));
    }

    #[test]
    fn json_bodies_parse_or_fail_with_the_reason() {
        let response = Response { status: 200, headers: vec![], body: br#"{"allowed": true}"#.to_vec() };
        let parsed: serde_json::Value = response.json().unwrap();
        assert_eq!(parsed["allowed"], true);
        let Err(Error::Failed(why)) = response.json::<Vec<u8>>() else { panic!("not a list") };
        assert!(why.starts_with("the response body is not the JSON expected"), "{why}");
        let map = std::collections::HashMap::from([((1, 2), 3)]);
        assert!(matches!(Request::post_json("http://a/", &map), Err(Error::Failed(_))));
    }

    #[test]
    fn urls_are_split_as_wasi_http_takes_them() {
        let t = target("HTTPS://api.example.com:8443?x=1#frag").unwrap();
        assert_eq!((t.https, t.authority, t.path_with_query.as_str()), (true, "api.example.com:8443", "/?x=1"));
        let t = target("http://[::1]/a/b?c").unwrap();
        assert_eq!((t.https, t.authority, t.path_with_query.as_str()), (false, "[::1]", "/a/b?c"));
        for (url, why) in [
            ("api.example.com/x", "no scheme"),
            ("ftp://host/", "not http or https"),
            ("http:///path", "no host"),
            ("http://user:pw@host/", "credentials"),
            ("http://host/a b", "spaces"),
        ] {
            let Err(Error::Refused(message)) = target(url) else { panic!("{url} is refused") };
            assert!(message.starts_with("bad URL: ") && message.contains(why), "{url}: {message}");
            assert!(!message.contains("host/"), "the URL is not quoted: {message}");
        }
        on_outbound(|_| ok(""));
        assert!(matches!(send(&Request::get("nope")), Err(Error::Refused(_))), "checked natively too");
    }

    #[test]
    fn error_codes_map_to_what_a_plugin_can_act_on() {
        let cases = [
            (ErrorCode::ConnectionTimeout, Error::Timeout),
            (ErrorCode::ConnectionReadTimeout, Error::Timeout),
            (ErrorCode::HttpResponseTimeout, Error::Timeout),
            (ErrorCode::HttpResponseBodySize(Some(9)), Error::TooLarge),
            (
                ErrorCode::HttpResponseHeaderSize(crate::bindings::wasi::http::types::FieldSizePayload {
                    field_name: None,
                    field_size: None,
                }),
                Error::TooLarge,
            ),
            (ErrorCode::HttpRequestDenied, Error::Refused("the destination is not granted (spec.egress)".into())),
            (ErrorCode::DestinationIpProhibited, Error::Refused("the destination's address is not allowed".into())),
            (
                ErrorCode::InternalError(Some("sluice: 4 calls in flight".into())),
                Error::Refused("4 calls in flight".into()),
            ),
            (
                ErrorCode::InternalError(Some("broken pipe".into())),
                Error::Failed("InternalError(Some(\"broken pipe\"))".into()),
            ),
            (ErrorCode::InternalError(None), Error::Failed("InternalError(None)".into())),
            (ErrorCode::ConnectionRefused, Error::Failed("ConnectionRefused".into())),
        ];
        for (code, error) in cases {
            assert_eq!(from_code(code), error);
        }
        assert_eq!(Error::Refused("x".into()).to_string(), "refused: x");
        assert_eq!(Error::TooLarge.to_string(), "the response is too large");
    }

    impl Request {
        fn header_pairs(&self) -> Vec<(&str, &str)> {
            self.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect()
        }
    }
}
