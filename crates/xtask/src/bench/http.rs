//! A bare HTTP/1.1 POST and GET for the readiness probes and the checks: enough
//! without an HTTP client dependency.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{Context, Result, bail};

pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

/// POSTs `body` to `/v1/chat/completions` on `addr` with `headers`, on a
/// connection of its own, and reads the whole response.
pub fn post(addr: SocketAddr, headers: &[(&str, String)], body: &[u8]) -> Result<Response> {
    let mut stream = connect(addr)?;
    stream.write_all(&chat_request(addr, headers, body))?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    parse(&response)
}

fn connect(addr: SocketAddr) -> Result<TcpStream> {
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(stream)
}

/// A `POST /v1/chat/completions` of `body` with `headers`, head and body
/// in one buffer, on a connection closed after it.
fn chat_request(addr: SocketAddr, headers: &[(&str, String)], body: &[u8]) -> Vec<u8> {
    let mut head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut request = head.into_bytes();
    request.extend_from_slice(body);
    request
}

/// Streams timed per system and round, one at a time, and the content
/// chunks of each (the echo upstream sends them 20 ms apart).
pub const STREAMS: usize = 50;
pub const STREAM_CHUNKS: u32 = 3;

/// A streamed response's timing.
pub struct Streamed {
    /// From the request written to the first `data:` of the body.
    pub first_event: Duration,
}

/// POSTs `body` (a streaming chat request) like [`post`], times the first
/// server-sent event, and reads the stream to its `[DONE]`.
pub fn post_streaming(addr: SocketAddr, headers: &[(&str, String)], body: &[u8]) -> Result<Streamed> {
    let mut stream = connect(addr)?;
    stream.set_nodelay(true)?;
    let request = chat_request(addr, headers, body);
    let started = std::time::Instant::now();
    stream.write_all(&request)?;
    let (mut response, mut first_event, mut buf) = (Vec::new(), None, [0u8; 16 << 10]);
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        response.extend_from_slice(&buf[..n]);
        if first_event.is_none()
            && let Some(end) = response.windows(4).position(|w| w == b"\r\n\r\n")
            && response[end..].windows(5).any(|w| w == b"data:")
        {
            first_event = Some(started.elapsed());
        }
    }
    let parsed = parse(&response)?;
    if parsed.status != 200 || !parsed.body.windows(6).any(|w| w == b"[DONE]") {
        bail!("a stream ended with {} and no [DONE]: {}", parsed.status, String::from_utf8_lossy(&parsed.body));
    }
    Ok(Streamed { first_event: first_event.context("a stream with no event")? })
}

/// GETs `path` on `addr`, on a connection of its own.
pub fn get(addr: SocketAddr, path: &str) -> Result<Response> {
    let mut stream = connect(addr)?;
    stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    parse(&response)
}

fn parse(response: &[u8]) -> Result<Response> {
    let end = response.windows(4).position(|w| w == b"\r\n\r\n").context("no end of the response head")?;
    let head = String::from_utf8_lossy(&response[..end]);
    let rest = &response[end + 4..];
    let mut lines = head.lines();
    // "HTTP/1.1 200 OK": the status is the second word.
    let status = lines.next().and_then(|line| line.split_whitespace().nth(1)).context("no status line")?.parse()?;
    let header = |wanted: &str| {
        lines.clone().find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.trim().eq_ignore_ascii_case(wanted).then(|| value.trim().to_ascii_lowercase())
        })
    };
    let body = if header("transfer-encoding").is_some_and(|te| te.contains("chunked")) {
        dechunk(rest)?
    } else if let Some(length) = header("content-length") {
        let length: usize = length.parse()?;
        rest.get(..length).context("the response body is shorter than its content-length")?.to_vec()
    } else {
        rest.to_vec()
    };
    Ok(Response { status, body })
}

/// Decodes a chunked body (no trailers are expected).
fn dechunk(mut data: &[u8]) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n").context("truncated chunk size")?;
        let size_text = String::from_utf8_lossy(&data[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        if data.len() < size + 2 {
            bail!("truncated chunk");
        }
        body.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_chunked_and_sized_bodies() {
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        let response = parse(chunked).unwrap();
        assert_eq!((response.status, response.body.as_slice()), (200, b"abcde".as_slice()));

        let sized = b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 2\r\n\r\nnoEXTRA";
        let response = parse(sized).unwrap();
        assert_eq!((response.status, response.body.as_slice()), (401, b"no".as_slice()));
    }
}
